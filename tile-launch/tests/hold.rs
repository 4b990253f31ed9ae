//! `Stream::hold`: what another launcher's work uses is kept until the stream's work up to the
//! hold has completed, then released once; under capture the graph owns it. Run against the
//! stub driver of `bench/profile/cuda_stub.c` (`stub_set_busy`: the work has not finished;
//! `stub_set_capturing`: every stream captures), each test in a child process.

mod stub;

use stub::Switches;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tile_launch::tile_dlpack::DType;
use tile_launch::tile_dlpack::Taken;
use tile_launch::tile_dlpack::testing::{RawTensor, TensorSpec, counted_tensor};
use tile_launch::{Context, Guard, Stream};

/// Counts its drops.
struct Dropped(Arc<AtomicUsize>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Runs test `name` in a child process on the stub driver; the child asserts.
fn in_child(name: &str) {
    let stub = stub::build();
    let out = stub::run_child(name, Some(&stub));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}{stderr}");
}

/// A consumed tensor (what a launcher read the pointer of) and its deleter count.
fn used() -> (
    tile_launch::tile_dlpack::Used,
    tile_launch::tile_dlpack::testing::DeleterCount,
) {
    let (t, count) = counted_tensor(&TensorSpec::new(&[1024], DType::F32));
    (t.consume().unwrap(), count)
}

#[test]
fn held_tensors_and_owners_are_released_once_after_the_work_completes_not_before() {
    if !stub::in_child() {
        return in_child(
            "held_tensors_and_owners_are_released_once_after_the_work_completes_not_before",
        );
    }
    let stub = Switches::open();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let dropped = Arc::new(AtomicUsize::new(0));
    let (a, a_count) = used();
    let (b, b_count) = used();
    stub.busy(true); // the launcher's kernel is still running
    stream
        .hold([
            Guard::from(a),
            b.into(),
            Guard::owner(Dropped(Arc::clone(&dropped))),
        ])
        .unwrap();
    assert_eq!(stream.stats().pending_guards, 3);
    for _ in 0..4 {
        stream.poll();
    }
    assert_eq!(
        (a_count.get(), b_count.get()),
        (0, 0),
        "released while busy"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 0);
    stub.busy(false); // the kernel finished
    assert_eq!(stream.poll(), 3);
    assert_eq!((a_count.get(), b_count.get()), (1, 1));
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
    stream.synchronize().unwrap();
    drop(stream);
    assert_eq!(
        (a_count.get(), b_count.get()),
        (1, 1),
        "a deleter ran twice"
    );
    assert_eq!(dropped.load(Ordering::SeqCst), 1);
}

/// A stream on the stub, one tensor held on it while the device is busy, not released yet.
fn one_held_while_busy() -> (
    Switches,
    Stream,
    tile_launch::tile_dlpack::testing::DeleterCount,
) {
    let stub = Switches::open();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (a, count) = used();
    stub.busy(true);
    stream.hold([Guard::from(a)]).unwrap();
    assert_eq!(count.get(), 0);
    (stub, stream, count)
}

#[test]
fn a_taken_tensor_whose_descriptor_does_not_validate_is_held_until_completion() {
    if !stub::in_child() {
        return in_child(
            "a_taken_tensor_whose_descriptor_does_not_validate_is_held_until_completion",
        );
    }
    let stub = Switches::open();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    // A major version tile does not read: `consume` would run the deleter at once.
    let spec = TensorSpec::new(&[1024], DType::F32).version(2, 0);
    let (raw, count) = tile_launch::tile_dlpack::testing::counted_raw(&spec);
    let RawTensor::Versioned(ptr) = raw else {
        unreachable!("a versioned spec")
    };
    // SAFETY: a fresh export, its deleter duty handed over here.
    let taken = unsafe { Taken::versioned(ptr) }.unwrap();
    stub.busy(true);
    stream.hold([Guard::from(taken)]).unwrap();
    stream.poll();
    assert_eq!(count.get(), 0, "released while busy");
    stub.busy(false);
    stream.synchronize().unwrap();
    assert_eq!(count.get(), 1);
}

#[test]
fn synchronize_waits_for_held_work_and_then_releases() {
    if !stub::in_child() {
        return in_child("synchronize_waits_for_held_work_and_then_releases");
    }
    let (_stub, stream, count) = one_held_while_busy();
    stream.synchronize().unwrap(); // waits (the stub finishes the work) and releases
    assert_eq!(count.get(), 1);
    assert_eq!(stream.stats().pending_guards, 0);
}

#[test]
fn dropping_the_stream_waits_for_held_work_then_releases_once() {
    if !stub::in_child() {
        return in_child("dropping_the_stream_waits_for_held_work_then_releases_once");
    }
    let (_stub, stream, count) = one_held_while_busy();
    drop(stream);
    assert_eq!(count.get(), 1);
}

#[test]
fn holds_from_many_threads_each_release_once() {
    if !stub::in_child() {
        return in_child("holds_from_many_threads_each_release_once");
    }
    let stub = Switches::open();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    stub.busy(true);
    let counts: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let stream = stream.clone();
                s.spawn(move || {
                    (0..100)
                        .map(|_| {
                            let (a, count) = used();
                            stream.hold([Guard::from(a)]).unwrap();
                            count
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(counts.len(), 400);
    assert!(counts.iter().all(|c| c.get() == 0), "released while busy");
    stub.busy(false);
    stream.synchronize().unwrap();
    assert!(counts.iter().all(|c| c.get() == 1));
}

#[test]
fn under_capture_the_graph_owns_what_is_held() {
    if !stub::in_child() {
        return in_child("under_capture_the_graph_owns_what_is_held");
    }
    let stub = Switches::open();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (a, count) = used();
    stub.capturing(true);
    stream.hold([Guard::from(a)]).unwrap();
    assert_eq!(stub.calls(c"cuUserObjectCreate"), 1);
    assert_eq!(stub.calls(c"cuGraphRetainUserObject"), 1);
    // Not in the release queue: completing the stream's work does not release it.
    assert_eq!(stream.stats().pending_guards, 0);
    stub.capturing(false); // the capture ended; the graph lives on
    stream.synchronize().unwrap();
    assert_eq!(count.get(), 0, "released while the graph may still run");
    stub.destroy_graphs(); // the graph's release thread runs the deleter
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while count.get() == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(count.get(), 1);
}

#[test]
fn under_capture_what_the_graph_refuses_is_leaked_not_released() {
    if !stub::in_child() {
        return in_child("under_capture_what_the_graph_refuses_is_leaked_not_released");
    }
    let stub = Switches::open();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (a, count) = used();
    stub.capturing(true);
    stub.refuse_user_objects(true);
    // The other launcher's kernel is in the graph already: its tensor must outlive any replay.
    let err = stream.hold([Guard::from(a)]).unwrap_err();
    assert!(err.to_string().contains("cuUserObjectCreate"), "{err}");
    assert_eq!(stream.stats().guards_leaked, 1, "the leak is counted");
    stub.refuse_user_objects(false);
    stub.capturing(false);
    stream.synchronize().unwrap();
    stub.destroy_graphs();
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        count.get(),
        0,
        "released although the graph may run the work"
    );
}

#[test]
fn holding_nothing_calls_no_driver_function() {
    if !stub::in_child() {
        return in_child("holding_nothing_calls_no_driver_function");
    }
    let stub = Switches::open();
    let ctx = Context::new(0).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let before = stub.calls(c"cuStreamGetCaptureInfo");
    stream.hold(std::iter::empty()).unwrap();
    assert_eq!(stub.calls(c"cuStreamGetCaptureInfo"), before);
}
