//! The C API, called through its `extern "C"` functions: each deleter or release function runs
//! once, never before the stream's work up to the hold has completed, across threads and under
//! a graph capture (the graph owns it); NULL arguments are error codes that take nothing over,
//! and a tensor tile would not launch on is held all the same (never released early); a panic stops at the boundary; `tile_shutdown` detaches every stream. The
//! tests that need a driver run in a child process on the stub driver of
//! `bench/profile/cuda_stub.c` (`stub_set_busy`: the work has not finished;
//! `stub_set_capturing`: every stream captures).

#[path = "../../tile-launch/tests/stub/mod.rs"]
mod stub;

use stub::Switches;

use std::ffi::{CStr, c_void};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};

use tile_capi::tile_status::*;
use tile_capi::*;
use tile_dlpack::DType;
use tile_dlpack::dlpark::ManagedTensorBase;
use tile_dlpack::ffi::{DLManagedTensorVersioned, DLTensor};
use tile_dlpack::testing::{DeleterCount, RawTensor, TensorSpec, counted_raw};
use tile_launch::cuda_sys::CUstream;

/// Runs test `name` in a child process on the stub driver; the child asserts.
fn in_child(name: &str) {
    let stub = stub::build();
    let out = stub::run_child(name, Some(&stub));
    check_child(&out);
}

fn check_child(out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}{stderr}");
}

/// This thread's last error message.
fn message() -> String {
    // SAFETY: never NULL; valid until the next call on this thread, copied here.
    unsafe { CStr::from_ptr(tile_last_error_message()) }
        .to_string_lossy()
        .into_owned()
}

/// A stream of device 0 to borrow: any non-null handle is a stream to the stub.
fn raw_stream() -> CUstream {
    std::ptr::without_provenance_mut(0x5000)
}

/// Borrows [`raw_stream`].
fn borrow() -> *mut tile_stream {
    let mut s = null_mut();
    // SAFETY: the stub takes any handle as a stream of device 0; `s` is writable.
    let status = unsafe { tile_stream_borrow(0, raw_stream(), &mut s) };
    assert_eq!(status, TILE_OK);
    assert!(!s.is_null());
    s
}

/// A 1024-element float32 export with a counting deleter.
fn export(spec: TensorSpec) -> (RawTensor, DeleterCount) {
    counted_raw(&spec)
}

fn f32_tensor() -> TensorSpec {
    TensorSpec::new(&[1024], DType::F32)
}

/// Hands `tensor` to `tile_hold_dlpack` or `tile_hold_dlpack_legacy`.
fn hold(stream: *const tile_stream, tensor: RawTensor) -> tile_status {
    // SAFETY: a live handle (or NULL); a fresh export that nobody else consumes or deletes.
    unsafe {
        match tensor {
            RawTensor::Versioned(t) => tile_hold_dlpack(stream, t),
            RawTensor::Legacy(t) => tile_hold_dlpack_legacy(stream, t),
        }
    }
}

/// An owner for `tile_hold_owner`: a counter whose release function counts calls.
struct Counter(AtomicUsize);

impl Counter {
    fn new() -> &'static Counter {
        Box::leak(Box::new(Counter(AtomicUsize::new(0))))
    }

    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    fn data(&'static self) -> *mut c_void {
        std::ptr::from_ref(self).cast_mut().cast()
    }
}

unsafe extern "C" fn count_release(data: *mut c_void) {
    // SAFETY: `data` is a leaked `Counter` (`Counter::data`).
    unsafe { &*data.cast::<Counter>() }
        .0
        .fetch_add(1, Ordering::SeqCst);
}

fn hold_owner(stream: *const tile_stream, counter: &'static Counter) -> tile_status {
    // SAFETY: a live handle; `count_release` may be called once from any thread.
    unsafe { tile_hold_owner(stream, counter.data(), Some(count_release)) }
}

fn stats(stream: *const tile_stream) -> tile_stats {
    let mut out = tile_stats::default();
    // SAFETY: a live handle; `out` is writable.
    assert_eq!(unsafe { tile_stream_stats(stream, &mut out) }, TILE_OK);
    out
}

fn poll(stream: *const tile_stream) -> usize {
    let mut n = usize::MAX;
    // SAFETY: a live handle; `n` is writable.
    assert_eq!(unsafe { tile_stream_poll(stream, &mut n) }, TILE_OK);
    n
}

#[test]
fn held_tensors_and_owners_are_released_once_after_the_work_completes_not_before() {
    if !stub::in_child() {
        return in_child(
            "held_tensors_and_owners_are_released_once_after_the_work_completes_not_before",
        );
    }
    let stub = Switches::open();
    let s = borrow();
    let (versioned, v_count) = export(f32_tensor());
    let (legacy, l_count) = export(f32_tensor().legacy());
    let owner = Counter::new();
    stub.busy(true); // the launcher's kernel is still running
    assert_eq!(hold(s, versioned), TILE_OK);
    assert_eq!(hold(s, legacy), TILE_OK);
    assert_eq!(hold_owner(s, owner), TILE_OK);
    assert_eq!(message(), "");
    assert_eq!(stats(s).pending_guards, 3);
    for _ in 0..4 {
        assert_eq!(poll(s), 0);
    }
    assert_eq!((v_count.get(), l_count.get(), owner.get()), (0, 0, 0));
    stub.busy(false); // the kernel finished
    assert_eq!(poll(s), 3);
    assert_eq!((v_count.get(), l_count.get(), owner.get()), (1, 1, 1));
    let after = stats(s);
    assert_eq!((after.pending_guards, after.guards_released), (0, 3));
    assert!(after.markers_recorded >= 1);
    // SAFETY: a live handle, released once.
    assert_eq!(unsafe { tile_stream_synchronize(s) }, TILE_OK);
    // SAFETY: as above.
    assert_eq!(unsafe { tile_stream_release(s) }, TILE_OK);
    assert_eq!((v_count.get(), l_count.get(), owner.get()), (1, 1, 1));
}

#[test]
fn synchronize_and_release_wait_for_the_work_then_release_once() {
    if !stub::in_child() {
        return in_child("synchronize_and_release_wait_for_the_work_then_release_once");
    }
    let stub = Switches::open();
    let s = borrow();
    let (a, a_count) = export(f32_tensor());
    stub.busy(true);
    assert_eq!(hold(s, a), TILE_OK);
    // SAFETY: a live handle.
    assert_eq!(unsafe { tile_stream_synchronize(s) }, TILE_OK); // the stub finishes the work
    assert_eq!(a_count.get(), 1);

    let (b, b_count) = export(f32_tensor().legacy());
    let owner = Counter::new();
    stub.busy(true);
    assert_eq!(hold(s, b), TILE_OK);
    assert_eq!(hold_owner(s, owner), TILE_OK);
    assert_eq!((b_count.get(), owner.get()), (0, 0));
    // SAFETY: a live handle, released once: waits, then releases.
    assert_eq!(unsafe { tile_stream_release(s) }, TILE_OK);
    assert_eq!((a_count.get(), b_count.get(), owner.get()), (1, 1, 1));
}

#[test]
fn holds_from_many_threads_each_release_once() {
    if !stub::in_child() {
        return in_child("holds_from_many_threads_each_release_once");
    }
    let stub = Switches::open();
    let s = borrow();
    // The handle is shared across threads, as the header allows.
    let shared = s as usize;
    stub.busy(true);
    let (tensors, owners): (Vec<_>, Vec<_>) = std::thread::scope(|scope| {
        let holders: Vec<_> = (0..4)
            .map(|t| {
                scope.spawn(move || {
                    let s = shared as *const tile_stream;
                    let mut tensors = Vec::new();
                    let mut owners = Vec::new();
                    for i in 0..100 {
                        let spec = if (t + i) % 2 == 0 {
                            f32_tensor()
                        } else {
                            f32_tensor().legacy()
                        };
                        let (tensor, count) = export(spec);
                        assert_eq!(hold(s, tensor), TILE_OK);
                        tensors.push(count);
                        let owner = Counter::new();
                        assert_eq!(hold_owner(s, owner), TILE_OK);
                        owners.push(owner);
                    }
                    (tensors, owners)
                })
            })
            .collect();
        // Polls and counts from another thread meanwhile: nothing is complete, nothing goes.
        let poller = scope.spawn(move || {
            for _ in 0..200 {
                assert_eq!(poll(shared as *const tile_stream), 0);
                stats(shared as *const tile_stream);
            }
        });
        poller.join().unwrap();
        holders.into_iter().map(|h| h.join().unwrap()).fold(
            (Vec::new(), Vec::new()),
            |(mut t, mut o), (t2, o2)| {
                t.extend(t2);
                o.extend(o2);
                (t, o)
            },
        )
    });
    assert_eq!((tensors.len(), owners.len()), (400, 400));
    assert!(tensors.iter().all(|c| c.get() == 0), "released while busy");
    assert!(owners.iter().all(|c| c.get() == 0), "released while busy");
    assert_eq!(stats(s).pending_guards, 800);
    stub.busy(false);
    // SAFETY: a live handle.
    assert_eq!(unsafe { tile_stream_synchronize(s) }, TILE_OK);
    assert!(tensors.iter().all(|c| c.get() == 1));
    assert!(owners.iter().all(|c| c.get() == 1));
    // SAFETY: a live handle, released once.
    assert_eq!(unsafe { tile_stream_release(s) }, TILE_OK);
    assert!(tensors.iter().all(|c| c.get() == 1));
    assert_eq!(stats_released(&owners), 400);
}

fn stats_released(owners: &[&'static Counter]) -> usize {
    owners.iter().map(|c| c.get()).sum()
}

#[test]
fn under_capture_the_graph_owns_what_is_held() {
    if !stub::in_child() {
        return in_child("under_capture_the_graph_owns_what_is_held");
    }
    let stub = Switches::open();
    let s = borrow();
    let (a, count) = export(f32_tensor());
    let owner = Counter::new();
    stub.capturing(true);
    assert_eq!(hold(s, a), TILE_OK);
    assert_eq!(hold_owner(s, owner), TILE_OK);
    assert_eq!(stub.calls(c"cuUserObjectCreate"), 2);
    assert_eq!(stub.calls(c"cuGraphRetainUserObject"), 2);
    // Not in the release queue: completing the stream's work does not release them.
    assert_eq!(stats(s).pending_guards, 0);
    stub.capturing(false); // the capture ended; the graph lives on
    // SAFETY: a live handle.
    assert_eq!(unsafe { tile_stream_synchronize(s) }, TILE_OK);
    // SAFETY: a live handle, released once.
    assert_eq!(unsafe { tile_stream_release(s) }, TILE_OK);
    assert_eq!(tile_shutdown(), TILE_OK);
    assert_eq!(
        (count.get(), owner.get()),
        (0, 0),
        "released while the graph may still run"
    );
    stub.destroy_graphs(); // the graph's release thread runs the deleter and release function
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while (count.get(), owner.get()) != (1, 1) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!((count.get(), owner.get()), (1, 1));
}

#[test]
fn null_arguments_are_errors_that_take_nothing_over() {
    // No driver is needed: each NULL is refused before anything else.
    let (tensor, count) = export(f32_tensor());
    let (legacy, legacy_count) = export(f32_tensor().legacy());
    let owner = Counter::new();
    assert_eq!(hold(null(), tensor), TILE_ERROR_INVALID_ARGUMENT);
    assert_eq!(message(), "stream is NULL");
    assert_eq!(hold(null(), legacy), TILE_ERROR_INVALID_ARGUMENT);
    assert_eq!(hold_owner(null(), owner), TILE_ERROR_INVALID_ARGUMENT);
    // SAFETY: NULL arguments only.
    unsafe {
        assert_eq!(
            tile_stream_borrow(0, raw_stream(), null_mut()),
            TILE_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(message(), "out is NULL");
        assert_eq!(tile_stream_release(null_mut()), TILE_ERROR_INVALID_ARGUMENT);
        assert_eq!(
            tile_stream_poll(null(), null_mut()),
            TILE_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(tile_stream_synchronize(null()), TILE_ERROR_INVALID_ARGUMENT);
        assert_eq!(
            tile_stream_stats(null(), null_mut()),
            TILE_ERROR_INVALID_ARGUMENT
        );
    }
    // Nothing was taken over: the exports are still ours to delete, the owner to release.
    assert_eq!((count.get(), legacy_count.get(), owner.get()), (0, 0, 0));
    // SAFETY: not consumed (the holds refused them); deleted once each.
    unsafe {
        tensor.delete();
        legacy.delete();
    }
    assert_eq!((count.get(), legacy_count.get()), (1, 1));
}

#[test]
fn null_tensors_are_refused_and_invalid_ones_held_until_the_work_completes() {
    if !stub::in_child() {
        return in_child("null_tensors_are_refused_and_invalid_ones_held_until_the_work_completes");
    }
    let s = borrow();
    // SAFETY: a live handle; NULL tensors.
    unsafe {
        assert_eq!(tile_hold_dlpack(s, null_mut()), TILE_ERROR_INVALID_ARGUMENT);
        assert_eq!(message(), "tensor is NULL");
        assert_eq!(
            tile_hold_dlpack_legacy(s, null_mut()),
            TILE_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(
            tile_hold_owner(s, null_mut(), None),
            TILE_ERROR_INVALID_ARGUMENT
        );
        assert_eq!(message(), "release is NULL");
        assert_eq!(
            tile_stream_stats(s, null_mut()),
            TILE_ERROR_INVALID_ARGUMENT
        );
    }
    // Descriptors tile would not launch on are still the memory of work already launched:
    // taken over as they are, their deleter run once, after the work, never before.
    let stub = Switches::open();
    stub.busy(true);
    let mut counts = Vec::new();
    for spec in [
        f32_tensor().version(2, 0),
        TensorSpec::new(&[4, -1], DType::F32),
        f32_tensor().ndim(-1).legacy(),
    ] {
        let (tensor, count) = export(spec);
        assert_eq!(hold(s, tensor), TILE_OK);
        counts.push(count);
    }
    poll(s);
    assert!(counts.iter().all(|c| c.get() == 0), "released while busy");
    stub.busy(false);
    // SAFETY: a live handle.
    assert_eq!(unsafe { tile_stream_synchronize(s) }, TILE_OK);
    assert!(counts.iter().all(|c| c.get() == 1));
    // A NULL deleter is fine: the producer keeps ownership, nothing is called.
    let mut shape = [8_i64];
    let mut data = [0.0_f32; 8];
    let mut managed = Box::new(DLManagedTensorVersioned::from_parts(
        DLTensor {
            data: data.as_mut_ptr().cast(),
            device: tile_dlpack::Device::CPU.into(),
            ndim: 1,
            dtype: DType::F32.into(),
            shape: shape.as_mut_ptr(),
            strides: null_mut(),
            byte_offset: 0,
        },
        null_mut(),
        None,
    ));
    // SAFETY: a live handle; the tensor and its shape outlive the hold (synchronised below).
    assert_eq!(unsafe { tile_hold_dlpack(s, &mut *managed) }, TILE_OK);
    assert_eq!(stats(s).pending_guards, 1);
    // SAFETY: a live handle, released once (waits, then releases the held tensor).
    assert_eq!(unsafe { tile_stream_release(s) }, TILE_OK);
    drop(managed);
}

#[test]
fn shutdown_detaches_every_stream_after_releasing_what_it_held() {
    if !stub::in_child() {
        return in_child("shutdown_detaches_every_stream_after_releasing_what_it_held");
    }
    let stub = Switches::open();
    let (s1, s2) = (borrow(), borrow());
    let (a, a_count) = export(f32_tensor());
    let (b, b_count) = export(f32_tensor().legacy());
    let owner = Counter::new();
    stub.busy(true);
    assert_eq!(hold(s1, a), TILE_OK);
    assert_eq!(hold(s2, b), TILE_OK);
    assert_eq!(hold_owner(s2, owner), TILE_OK);
    assert_eq!((a_count.get(), b_count.get(), owner.get()), (0, 0, 0));
    let syncs = stub.calls(c"cuEventSynchronize") + stub.calls(c"cuStreamSynchronize");
    assert_eq!(tile_shutdown(), TILE_OK);
    assert!(stub.calls(c"cuEventSynchronize") + stub.calls(c"cuStreamSynchronize") > syncs);
    assert_eq!((a_count.get(), b_count.get(), owner.get()), (1, 1, 1));

    // A detached handle takes nothing over; only releasing it is left.
    let (c, c_count) = export(f32_tensor());
    assert_eq!(hold(s1, c), TILE_ERROR_SHUT_DOWN);
    assert_eq!(message(), "the stream was detached by tile_shutdown");
    assert_eq!(c_count.get(), 0);
    // SAFETY: not consumed; deleted once.
    unsafe { c.delete() };
    // SAFETY: detached handles, each released once.
    unsafe {
        assert_eq!(tile_stream_poll(s1, null_mut()), TILE_ERROR_SHUT_DOWN);
        assert_eq!(tile_stream_synchronize(s2), TILE_ERROR_SHUT_DOWN);
        assert_eq!(tile_stream_release(s1), TILE_OK);
        assert_eq!(tile_stream_release(s2), TILE_OK);
    }
    assert_eq!(tile_shutdown(), TILE_OK); // nothing left to detach

    // Streams borrowed afterwards work as usual.
    let s3 = borrow();
    let (d, d_count) = export(f32_tensor());
    assert_eq!(hold(s3, d), TILE_OK);
    // SAFETY: a live handle, released once.
    assert_eq!(unsafe { tile_stream_release(s3) }, TILE_OK);
    assert_eq!(d_count.get(), 1);
}

#[test]
fn an_invalid_device_is_a_cuda_error_naming_the_call() {
    if !stub::in_child() {
        return in_child("an_invalid_device_is_a_cuda_error_naming_the_call");
    }
    let mut s = null_mut();
    // SAFETY: `s` is writable; the stub has device 0 only.
    let status = unsafe { tile_stream_borrow(1, raw_stream(), &mut s) };
    assert_eq!(status, TILE_ERROR_CUDA);
    assert!(s.is_null(), "*out is set only on success");
    let m = message();
    assert!(m.contains("cuDeviceGet"), "{m}");
}

#[test]
fn without_a_driver_borrowing_is_no_driver() {
    if !stub::in_child() {
        // A driver path that does not exist, in a folder of its own (`run_child` removes it).
        let dir = std::env::temp_dir().join(format!("tile-capi-no-driver-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("libcuda.so.1");
        let out = stub::run_child("without_a_driver_borrowing_is_no_driver", Some(&missing));
        return check_child(&out);
    }
    let mut s = null_mut();
    // SAFETY: `s` is writable.
    let status = unsafe { tile_stream_borrow(0, raw_stream(), &mut s) };
    assert_eq!(status, TILE_ERROR_NO_DRIVER);
    assert!(s.is_null());
    let m = message();
    assert!(m.contains("no NVIDIA driver found"), "{m}");
}

#[test]
fn a_panic_stops_at_the_boundary() {
    let status = tile_capi::testing::through_boundary(|| panic!("boom in the body"));
    assert_eq!(status, TILE_ERROR_INTERNAL);
    let m = message();
    assert!(
        m.starts_with(
            "internal error in tile (a panic, caught at the C boundary): boom in the body"
        ),
        "{m}"
    );
    // A payload that panics again when dropped is forgotten, not re-raised.
    struct PanicsOnDrop;
    impl Drop for PanicsOnDrop {
        fn drop(&mut self) {
            panic!("dropping the payload");
        }
    }
    let status = tile_capi::testing::through_boundary(|| std::panic::panic_any(PanicsOnDrop));
    assert_eq!(status, TILE_ERROR_INTERNAL);
    assert!(message().contains("a panic with a non-string payload"));
    // An error returned by a body is its status and message; a success clears the message.
    let status = tile_capi::testing::through_boundary(|| Err("it failed".into()));
    assert_eq!((status, message().as_str()), (TILE_ERROR_CUDA, "it failed"));
    assert_eq!(tile_capi::testing::through_boundary(|| Ok(())), TILE_OK);
    assert_eq!(message(), "");
}

#[test]
fn the_last_error_message_is_per_thread() {
    assert_eq!(
        hold_owner(null(), Counter::new()),
        TILE_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(message(), "stream is NULL");
    let other = std::thread::spawn(message).join().unwrap();
    assert_eq!(other, "");
    // Reading it, or a status's name, changes nothing.
    // SAFETY: a static string.
    let name = unsafe { CStr::from_ptr(tile_error_string(TILE_ERROR_CUDA as i32)) };
    assert_eq!(name, c"TILE_ERROR_CUDA: a CUDA driver call failed");
    assert_eq!(message(), "stream is NULL");
}

#[test]
fn every_status_has_a_name_and_unknown_codes_are_said_to_be() {
    let name = |code: i32| {
        // SAFETY: `tile_error_string` returns a static string.
        unsafe { CStr::from_ptr(tile_error_string(code)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    let all = [
        (TILE_OK, "TILE_OK"),
        (TILE_ERROR_INVALID_ARGUMENT, "TILE_ERROR_INVALID_ARGUMENT"),
        (TILE_ERROR_NO_DRIVER, "TILE_ERROR_NO_DRIVER"),
        (TILE_ERROR_CUDA, "TILE_ERROR_CUDA"),
        (TILE_ERROR_SHUT_DOWN, "TILE_ERROR_SHUT_DOWN"),
        (TILE_ERROR_INTERNAL, "TILE_ERROR_INTERNAL"),
    ];
    for (i, (status, expected)) in all.iter().enumerate() {
        assert_eq!(*status as i32, i as i32);
        assert!(name(*status as i32).starts_with(&format!("{expected}: ")));
    }
    assert_eq!(name(6), "unknown tile_status");
    assert_eq!(name(-1), "unknown tile_status");
}
