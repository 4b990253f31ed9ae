//! The driver calls a launch makes, counted one launch at a time by the stub driver of
//! `bench/profile/cuda_stub.c` (built here with `cc`), which answers every call (one device, no
//! stream ever capturing, every address device memory, every event complete) and counts the
//! calls per entry point. Each test runs in a child process (this test binary, re-run) whose
//! `TILE_LIBCUDA` names the stub, on a machine with a GPU too.
//!
//! The steady state of a launch on a stream that is not capturing: `cuCtxGetCurrent` (the
//! stream's context current on this thread: no push, no pop), `cuStreamGetCaptureInfo` (once)
//! and `cuLaunchKernel`, plus one `cuPointerGetAttributes` per tensor whose memory is not
//! [trusted](tile_launch::TensorArg::trust_memory). Amortised over the release queue's periods
//! (a marker every 64 launches, a poll every 16): the marker's `cuEventRecord`, the poll's
//! `cuEventQuery` in relaxed capture mode, and the release of completed work.

mod stub;

use std::collections::BTreeMap;

use tile_launch::tile_dlpack::DType;
use tile_launch::tile_dlpack::testing::{DeleterCount, TensorSpec, counted_tensor};
use tile_launch::{
    Arg, Context, Kernel, LaunchConfig, Library, Param, ReleaseConfig, ScalarType, Signature,
    Stream, TensorArg,
};

/// Calls per entry point (only those called).
type Calls = BTreeMap<String, u64>;

/// The stub driver's counters, in the library `TILE_LIBCUDA` names.
struct Counter {
    lib: libloading::Library,
}

impl Counter {
    fn open() -> Counter {
        Counter {
            lib: stub::loaded(),
        }
    }

    /// Every entry point's count since the last call, then zero.
    fn take(&self) -> Calls {
        type Count = unsafe extern "C" fn(*const std::ffi::c_char) -> u64;
        type Name = unsafe extern "C" fn(std::ffi::c_int) -> *const std::ffi::c_char;
        // SAFETY: the stub's `stub_driver_calls`, `stub_driver_call_name` and
        // `stub_driver_calls_reset`, with their C signatures.
        unsafe {
            let count = self.lib.get::<Count>(b"stub_driver_calls\0").unwrap();
            let name = self.lib.get::<Name>(b"stub_driver_call_name\0").unwrap();
            let reset = self
                .lib
                .get::<unsafe extern "C" fn()>(b"stub_driver_calls_reset\0")
                .unwrap();
            let mut calls = Calls::new();
            for i in 0.. {
                let p = name(i);
                if p.is_null() {
                    break;
                }
                let n = count(p);
                if n > 0 {
                    let name = std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned();
                    calls.insert(name, n);
                }
            }
            reset();
            calls
        }
    }
}

fn calls(list: &[(&str, u64)]) -> Calls {
    list.iter().map(|(n, c)| (n.to_string(), *c)).collect()
}

/// The stub's kernel (seven 8-byte parameters) declared as three float32 tensors and four
/// `u64`.
fn kernel(lib: &Library) -> Kernel {
    let u64 = || Param::scalar(ScalarType::U64);
    let sig = Signature::new([
        Param::input(DType::F32),
        Param::input(DType::F32),
        Param::output(DType::F32),
        u64(),
        u64(),
        u64(),
        u64(),
    ]);
    lib.kernel("k", sig).unwrap()
}

/// Three tensors (memory trusted or not) and four scalars, with the tensors' deleter counts.
fn args(trusted: bool) -> (Vec<Arg<'static>>, Vec<DeleterCount>) {
    let mut args = Vec::new();
    let mut counts = Vec::new();
    for _ in 0..3 {
        let (t, count) = counted_tensor(&TensorSpec::new(&[4096], DType::F32));
        let mut t = TensorArg::from(t);
        if trusted {
            // SAFETY: the stub driver answers every address as device memory of device 0.
            t = unsafe { t.trust_memory() };
        }
        args.push(t.into());
        counts.push(count);
    }
    args.extend((1..=4u64).map(Arg::from));
    (args, counts)
}

/// `launches` launches (`launch_queued`) after 256 warm-up ones, each one's driver calls.
fn each_launch(stream: &Stream, kernel: &Kernel, trusted: bool, launches: usize) -> Vec<Calls> {
    each_launch_after(stream, kernel, trusted, 256, launches)
}

/// `launches` launches (`launch_queued`) after `warm_up` ones, each one's driver calls; then a
/// synchronize, after which every tensor has been released once.
fn each_launch_after(
    stream: &Stream,
    kernel: &Kernel,
    trusted: bool,
    warm_up: usize,
    launches: usize,
) -> Vec<Calls> {
    let counter = Counter::open();
    let config = LaunchConfig::for_elements(4096, 256);
    let mut deleters = Vec::new();
    for _ in 0..warm_up {
        let (a, d) = args(trusted);
        stream.launch_queued(kernel, &config, a).unwrap();
        deleters.extend(d);
    }
    let mut per_launch = Vec::new();
    counter.take();
    for _ in 0..launches {
        let (a, d) = args(trusted);
        stream.launch_queued(kernel, &config, a).unwrap();
        per_launch.push(counter.take());
        deleters.extend(d);
    }
    stream.synchronize().unwrap();
    // Every tensor released, once (the stub's events are complete at once).
    assert!(deleters.iter().all(|d| d.get() == 1));
    per_launch
}

/// The sum of `per_launch`.
fn total(per_launch: &[Calls]) -> Calls {
    let mut sum = Calls::new();
    for calls in per_launch {
        for (name, n) in calls {
            *sum.entry(name.clone()).or_default() += n;
        }
    }
    sum
}

/// Checks that every launch of `per_launch` makes at least the calls of `every_launch`, and
/// returns how many make exactly those.
fn steady(per_launch: &[Calls], every_launch: &Calls) -> usize {
    for (i, calls) in per_launch.iter().enumerate() {
        for (name, n) in every_launch {
            let made = calls.get(name).copied().unwrap_or(0);
            assert!(made >= *n, "launch {i} {name}: {calls:?}");
        }
    }
    per_launch.iter().filter(|c| *c == every_launch).count()
}

fn child_setup() -> (std::sync::Arc<Context>, Library) {
    let ctx = Context::new(0).unwrap();
    // The stub accepts any image.
    let lib = Library::from_image(b"\x7fELF stub image\0").unwrap();
    (ctx, lib)
}

/// Runs test `name` in a child process on the stub driver; the child asserts.
fn in_child(name: &str) {
    let stub = stub::build();
    let out = stub::run_child(name, Some(&stub));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    // The child ran the test (a name that matches nothing passes with "0 passed").
    assert!(stdout.contains("1 passed"), "{stdout}{stderr}");
}

#[test]
fn a_steady_state_launch_with_its_context_current_makes_three_driver_calls() {
    if !stub::in_child() {
        return in_child("a_steady_state_launch_with_its_context_current_makes_three_driver_calls");
    }
    let (ctx, lib) = child_setup();
    let k = kernel(&lib);
    let _current = ctx.bind().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let per_launch = each_launch(&stream, &k, true, 128);
    let every = calls(&[
        ("cuCtxGetCurrent", 1),
        ("cuStreamGetCaptureInfo", 1),
        ("cuLaunchKernel", 1),
    ]);
    // Every 64th launch records the amortised marker, finds it complete (the poll, every 16
    // launches, has something to ask only then) and releases what it covers.
    assert_eq!(steady(&per_launch, &every), 128 - 2);
    let marker_launch = calls(&[
        // ... and after the release, whether a deleter changed the current context
        ("cuCtxGetCurrent", 2),
        ("cuStreamGetCaptureInfo", 1),
        ("cuLaunchKernel", 1),
        // the marker: no capture query, no binding (the launch's check did both)
        ("cuEventRecord", 1),
        // the query, then the release, in the relaxed capture mode set once for both and put
        // back when the launch returns
        ("cuEventQuery", 1),
        ("cuThreadExchangeStreamCaptureMode", 2),
    ]);
    assert_eq!(per_launch[63], marker_launch);
    assert_eq!(per_launch[127], marker_launch);
}

#[test]
fn without_its_context_current_a_launch_pushes_and_pops_it() {
    if !stub::in_child() {
        return in_child("without_its_context_current_a_launch_pushes_and_pops_it");
    }
    let (ctx, lib) = child_setup();
    let k = kernel(&lib);
    // No context is current on this thread (the stub starts with none, and nothing bound one).
    let stream = Stream::new(&ctx).unwrap();
    let per_launch = each_launch(&stream, &k, true, 128);
    let every = calls(&[
        ("cuCtxGetCurrent", 1),
        ("cuCtxPushCurrent", 1),
        ("cuStreamGetCaptureInfo", 1),
        ("cuLaunchKernel", 1),
        ("cuCtxPopCurrent", 1),
    ]);
    assert_eq!(steady(&per_launch, &every), 128 - 2);
    let total = total(&per_launch);
    assert_eq!(total["cuCtxPushCurrent"], 128);
    assert_eq!(total["cuCtxPopCurrent"], 128);
    assert_eq!(total.get("cuStreamIsCapturing"), None);
}

#[test]
fn memory_not_trusted_is_asked_about_once_per_tensor() {
    if !stub::in_child() {
        return in_child("memory_not_trusted_is_asked_about_once_per_tensor");
    }
    let (ctx, lib) = child_setup();
    let k = kernel(&lib);
    let _current = ctx.bind().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let per_launch = each_launch(&stream, &k, false, 64);
    let every = calls(&[
        ("cuCtxGetCurrent", 1),
        ("cuStreamGetCaptureInfo", 1),
        ("cuPointerGetAttributes", 3),
        ("cuLaunchKernel", 1),
    ]);
    assert_eq!(steady(&per_launch, &every), 64 - 1);
    // Trusted memory on one device is not asked about at all (checked by the first test's
    // exact totals); the pointer-device check, on by default with several devices, asks one
    // `cuPointerGetAttribute` per trusted tensor when turned on.
    stream.set_check_pointer_devices(true);
    let per_launch = each_launch(&stream, &k, true, 64);
    let every = calls(&[
        ("cuCtxGetCurrent", 1),
        ("cuStreamGetCaptureInfo", 1),
        ("cuPointerGetAttribute", 3),
        ("cuLaunchKernel", 1),
    ]);
    assert_eq!(steady(&per_launch, &every), 64 - 1);
}

#[test]
fn a_launch_only_stream_records_its_marker_in_the_launch_without_asking_again() {
    if !stub::in_child() {
        return in_child(
            "a_launch_only_stream_records_its_marker_in_the_launch_without_asking_again",
        );
    }
    let (ctx, lib) = child_setup();
    let k = kernel(&lib);
    let _current = ctx.bind().unwrap();
    // A handle named only inside launch calls (an int handle from another library): a marker
    // at every launch, recorded inside the launch call.
    // SAFETY: the stub answers any handle as a live stream of its one context.
    let stream =
        unsafe { Stream::from_raw_launch_only(&ctx, 0x5000 as tile_launch::cuda_sys::CUstream) }
            .unwrap();
    let per_launch = each_launch(&stream, &k, true, 128);
    let every = calls(&[
        ("cuCtxGetCurrent", 1),
        ("cuStreamGetCaptureInfo", 1),
        ("cuLaunchKernel", 1),
        ("cuEventRecord", 1),
    ]);
    // Every 64th launch (`marker_every`, not `poll_every`: every launch has a marker, so each
    // poll finds one complete) polls: the newest of the 64 markers since the last poll,
    // complete, answers for all (markers complete in stream order), and what they cover is
    // released in one relaxed scope.
    assert_eq!(steady(&per_launch, &every), 128 - 2);
    let poll_launch = calls(&[
        ("cuCtxGetCurrent", 2),
        ("cuStreamGetCaptureInfo", 1),
        ("cuLaunchKernel", 1),
        ("cuEventRecord", 1),
        ("cuEventQuery", 1),
        ("cuThreadExchangeStreamCaptureMode", 2),
    ]);
    for i in [63, 127] {
        assert_eq!(per_launch[i], poll_launch, "launch {i}");
    }
}

#[test]
fn a_deleter_run_inside_a_launch_makes_the_launch_ask_again() {
    if !stub::in_child() {
        return in_child("a_deleter_run_inside_a_launch_makes_the_launch_ask_again");
    }
    let (ctx, lib) = child_setup();
    let k = kernel(&lib);
    let _current = ctx.bind().unwrap();
    // A marker at every launch, recorded inside the launch call: asked about nothing.
    let config = ReleaseConfig {
        marker_every: 1,
        ..ReleaseConfig::default()
    };
    let stream = Stream::with_config(&ctx, config).unwrap();
    let per_launch = each_launch(&stream, &k, true, 16);
    let every = calls(&[
        ("cuCtxGetCurrent", 1),
        ("cuStreamGetCaptureInfo", 1),
        ("cuLaunchKernel", 1),
        ("cuEventRecord", 1),
    ]);
    assert_eq!(steady(&per_launch, &every), 16 - 1);
    // The same with a queue of at most 3 guards: every launch first waits for the previous
    // one's tensors and runs their deleters, inside the launch call, before its marker. The
    // marker then binds the context and asks about capture again (twice: the tracker asks
    // whether a marker can be recorded, then records).
    let config = ReleaseConfig {
        max_pending_guards: 3,
        marker_every: 1,
        ..ReleaseConfig::default()
    };
    let stream = Stream::with_config(&ctx, config).unwrap();
    let per_launch = each_launch(&stream, &k, true, 8);
    let after_deleters = calls(&[
        // the check, the wait, after the deleters, whether a marker can be recorded, the marker
        ("cuCtxGetCurrent", 5),
        ("cuStreamGetCaptureInfo", 1),
        ("cuEventSynchronize", 1),
        ("cuStreamIsCapturing", 2),
        ("cuLaunchKernel", 1),
        ("cuEventRecord", 1),
        // the wait and the deleters, each in its own relaxed scope
        ("cuThreadExchangeStreamCaptureMode", 4),
    ]);
    for (i, calls) in per_launch.iter().enumerate().skip(1) {
        assert_eq!(calls, &after_deleters, "launch {i}");
    }
}

#[test]
fn the_device_of_a_stream_is_asked_of_its_context_with_calls_a_capture_allows() {
    if !stub::in_child() {
        return in_child(
            "the_device_of_a_stream_is_asked_of_its_context_with_calls_a_capture_allows",
        );
    }
    let counter = Counter::open();
    let stream = {
        let ctx = Context::new(0).unwrap();
        let stream = Stream::new(&ctx).unwrap();
        counter.take();
        stream
    };
    // A stream of a primary context a `Context` holds: its context's id is asked (a reset may
    // have left its handle to another context), no push, no pop; never `cuStreamGetId`, which
    // some drivers refuse for a capturing stream (and the refusal invalidates the capture).
    for _ in 0..3 {
        // SAFETY: a live stream (it keeps its context alive).
        let device = unsafe { Context::device_of_stream(stream.raw()) };
        assert_eq!(device.unwrap(), Some(0));
        assert_eq!(
            counter.take(),
            calls(&[("cuStreamGetCtx", 1), ("cuCtxGetId", 1)])
        );
    }
    drop(stream);
    counter.take();
    // Another stream, of a primary context no `Context` holds any more: the driver is asked.
    let raw = 0x5000 as tile_launch::cuda_sys::CUstream; // any handle: the stub answers
    // SAFETY: the stub accepts any handle.
    let device = unsafe { Context::device_of_stream(raw) };
    assert_eq!(device.unwrap(), Some(0));
    assert_eq!(
        counter.take(),
        calls(&[
            ("cuStreamGetCtx", 1),
            ("cuCtxPushCurrent", 1),
            ("cuCtxGetDevice", 1),
            ("cuCtxPopCurrent", 1),
        ])
    );
}

#[test]
fn arguments_gathered_in_args_launch_and_are_refused_as_any_collection_is() {
    if !stub::in_child() {
        return in_child("arguments_gathered_in_args_launch_and_are_refused_as_any_collection_is");
    }
    let (ctx, lib) = child_setup();
    let k = kernel(&lib);
    let _current = ctx.bind().unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let config = LaunchConfig::for_elements(4096, 256);
    let counter = Counter::open();
    let mut deleters = Vec::new();
    for _ in 0..100 {
        let (a, d) = args(true);
        let mut gathered = tile_launch::Args::new();
        for arg in a {
            gathered.push(arg);
        }
        assert_eq!(gathered.len(), 7);
        stream.launch_queued(&k, &config, gathered).unwrap();
        deleters.extend(d);
    }
    // A refused launch (one argument short) consumes nothing: no deleter runs, the exports stay
    // their producer's.
    let (mut a, d) = args(true);
    let last = a.pop().unwrap();
    let short: tile_launch::Args<'_> = a.into_iter().collect();
    let err = stream.launch_queued(&k, &config, short).unwrap_err();
    assert!(
        matches!(err, tile_launch::Error::ArgumentCount { .. }),
        "{err}"
    );
    assert!(d.iter().all(|d| d.get() == 0));
    let total_before = total(&[counter.take()]);
    assert_eq!(total_before["cuLaunchKernel"], 100);
    drop(last);
    stream.synchronize().unwrap();
    // Every launched tensor released, once.
    assert!(deleters.iter().all(|d| d.get() == 1));
}

#[test]
fn a_stream_with_a_marker_per_launch_reuses_its_events_and_destroys_each_once() {
    if !stub::in_child() {
        return in_child(
            "a_stream_with_a_marker_per_launch_reuses_its_events_and_destroys_each_once",
        );
    }
    let (ctx, lib) = child_setup();
    let k = kernel(&lib);
    let _current = ctx.bind().unwrap();
    // SAFETY: the stub answers any handle as a live stream of its one context.
    let stream =
        unsafe { Stream::from_raw_launch_only(&ctx, 0x5000 as tile_launch::cuda_sys::CUstream) }
            .unwrap();
    let per_launch = each_launch_after(&stream, &k, true, 0, 256);
    let made = total(&per_launch);
    // A marker at every launch; the poll every 64 launches retires the 64 since the last, and
    // the next 64 launches record those events again: only the first period creates any.
    assert_eq!(made["cuEventRecord"], 256);
    assert_eq!(made["cuEventCreate"], 64);
    assert_eq!(made.get("cuEventDestroy"), None);
    let counter = Counter::open();
    counter.take();
    drop(stream);
    // The stream's end destroys every event it created, the kept ones included, once.
    assert_eq!(counter.take().get("cuEventDestroy"), Some(&64));
}
