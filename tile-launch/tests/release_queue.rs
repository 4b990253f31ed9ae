//! The release queue against a manual-completion fake (no GPU): every guard is released exactly
//! once, never before the work of its launch has completed, on every path.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::{Duration, Instant};

use tile_launch::release::fake::{FakeError, FakeOp, FakeTimeline};
use tile_launch::release::{
    CompletionError, Pending, PendingBytes, Queued, ReleaseConfig, RetireError, Stats, Tracker,
};

type Tr = Tracker<FakeTimeline, Guard>;
type Handle = Pending<FakeTimeline, Guard>;

/// What a guard saw when it was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DropRecord {
    /// The test's number of the launch the guard belongs to (0, 1, ... in launch-call order).
    launch: u64,
    /// The guard's argument index.
    arg: usize,
    /// The fake's unit of work of the launch (`None` when `enqueue` never ran to completion).
    work: Option<u64>,
    /// Whether that work had completed when the guard was dropped.
    complete: bool,
}

type OnDrop = Box<dyn FnOnce() + Send>;

/// Stands for a consumed tensor: dropping it is running its deleter.
struct Guard {
    launch: u64,
    arg: usize,
    work: Arc<OnceLock<u64>>,
    fake: FakeTimeline,
    log: Arc<Mutex<Vec<DropRecord>>>,
    on_drop: Option<OnDrop>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let work = self.work.get().copied();
        let complete = work.is_none_or(|w| self.fake.is_work_complete(w));
        self.log.lock().unwrap().push(DropRecord {
            launch: self.launch,
            arg: self.arg,
            work,
            complete,
        });
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

struct Harness {
    fake: FakeTimeline,
    tracker: Arc<Tr>,
    log: Arc<Mutex<Vec<DropRecord>>>,
    next_launch: AtomicU64,
}

/// A configuration that polls at every launch, so that a test sees releases at the first launch
/// after a completion (`poll_every` has its own test).
fn config(marker_every: u32) -> ReleaseConfig {
    ReleaseConfig {
        marker_every,
        poll_every: 1,
        ..ReleaseConfig::default()
    }
}

impl Harness {
    fn new(config: ReleaseConfig) -> Self {
        Self::with_fake(FakeTimeline::new(), config)
    }

    fn with_fake(fake: FakeTimeline, config: ReleaseConfig) -> Self {
        Self {
            tracker: Tracker::new(fake.clone(), config),
            fake,
            log: Arc::default(),
            next_launch: AtomicU64::new(0),
        }
    }

    fn guards(&self, n: usize) -> (u64, Arc<OnceLock<u64>>, Vec<Guard>) {
        let launch = self.next_launch.fetch_add(1, Ordering::Relaxed);
        let work = Arc::new(OnceLock::new());
        let guards = (0..n)
            .map(|arg| Guard {
                launch,
                arg,
                work: Arc::clone(&work),
                fake: self.fake.clone(),
                log: Arc::clone(&self.log),
                on_drop: None,
            })
            .collect();
        (launch, work, guards)
    }

    fn launch_guards(&self, guards: Vec<Guard>, work: Arc<OnceLock<u64>>, bytes: u64) -> Handle {
        let fake = self.fake.clone();
        self.tracker
            .launch(guards, bytes, move || {
                work.set(fake.enqueue()).expect("enqueue runs once");
                Ok::<(), Infallible>(())
            })
            .unwrap()
    }

    /// Launches `n` guards, `bytes` bytes.
    fn launch_bytes(&self, n: usize, bytes: u64) -> Handle {
        let (_, work, guards) = self.guards(n);
        self.launch_guards(guards, work, bytes)
    }

    fn launch(&self, n: usize) -> Handle {
        self.launch_bytes(n, 100 * n as u64)
    }

    /// Launches `n` guards, `100 * n` bytes, straight into the queue (`launch_deferred`).
    /// Returns the sequence number.
    fn launch_deferred(&self, n: usize) -> u64 {
        self.launch_deferred_bytes(n, 100 * n as u64)
    }

    /// Launches `n` guards, `bytes` bytes, straight into the queue (`launch_deferred`).
    fn launch_deferred_bytes(&self, n: usize, bytes: u64) -> u64 {
        let (_, work, guards) = self.guards(n);
        let fake = self.fake.clone();
        self.tracker
            .launch_deferred(guards, bytes, move || {
                work.set(fake.enqueue()).expect("enqueue runs once");
                Ok::<(), Infallible>(())
            })
            .unwrap()
    }

    /// Launches `n` guards, `100 * n` bytes, straight into the queue, keeping a `Queued`.
    fn launch_queued(&self, n: usize) -> Queued<FakeTimeline, Guard> {
        let (_, work, guards) = self.guards(n);
        let fake = self.fake.clone();
        self.tracker
            .launch_queued(guards, 100 * n as u64, move || {
                work.set(fake.enqueue()).expect("enqueue runs once");
                Ok::<(), Infallible>(())
            })
            .unwrap()
    }

    fn drops(&self) -> Vec<DropRecord> {
        self.log.lock().unwrap().clone()
    }

    fn dropped(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    fn stats(&self) -> Stats {
        self.tracker.stats()
    }

    /// Every guard dropped so far was dropped once, after its work completed.
    fn assert_sound(&self) {
        let drops = self.drops();
        let mut seen = std::collections::HashSet::new();
        for d in &drops {
            assert!(seen.insert((d.launch, d.arg)), "guard {d:?} dropped twice");
            assert!(d.complete, "guard {d:?} dropped before its work completed");
        }
    }
}

fn order(drops: &[DropRecord]) -> Vec<(u64, usize)> {
    drops.iter().map(|d| (d.launch, d.arg)).collect()
}

#[test]
fn retire_waits_then_releases_exactly_once() {
    let h = Harness::new(config(64));
    let handle = h.launch(3);
    assert_eq!(handle.seq(), 0);
    assert_eq!(h.dropped(), 0);
    assert_eq!(h.stats().held_guards, 3);
    let retired = handle.retire().unwrap();
    assert_eq!((retired.released, retired.deferred_released), (3, 0));
    assert_eq!(order(&h.drops()), vec![(0, 0), (0, 1), (0, 2)]);
    h.assert_sound();
    let calls = h.fake.calls();
    assert_eq!((calls.record, calls.wait, calls.synchronize), (1, 1, 0));
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.guards_leaked,
            stats.held_guards,
            stats.pending_guards
        ),
        (3, 0, 0, 0)
    );
    // Nothing else ever releases them again.
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 0);
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 3);
}

#[test]
fn released_in_launch_order_across_deferred_and_retired() {
    let h = Harness::new(config(1000));
    let a = h.launch(2);
    let b = h.launch(2);
    let c = h.launch(2);
    let d = h.launch(2);
    // Deferred out of launch order.
    d.defer();
    a.defer();
    b.defer();
    assert_eq!(h.dropped(), 0);
    assert_eq!(h.stats().pending_guards, 6);
    let retired = c.retire().unwrap();
    assert_eq!((retired.released, retired.deferred_released), (2, 6));
    assert_eq!(
        order(&h.drops()),
        vec![
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
            (2, 0),
            (2, 1),
            (3, 0),
            (3, 1)
        ]
    );
    h.assert_sound();
    assert_eq!(h.fake.calls().wait, 1);
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.pending_guards,
            stats.pending_bytes
        ),
        (8, 0, 0)
    );
}

#[test]
fn no_release_before_completion() {
    let h = Harness::new(config(64));
    h.launch(2).defer();
    for _ in 0..1000 {
        assert_eq!(h.tracker.poll(), 0);
    }
    assert_eq!(h.dropped(), 0);
    // The first poll recorded one marker for the uncovered deferred launch; the others reused it.
    assert_eq!(h.fake.markers_recorded(), 1);
    assert_eq!(h.fake.calls().wait, 0);
    assert_eq!(h.stats().pending_guards, 2);
    h.fake.complete_through(1);
    assert_eq!(h.tracker.poll(), 2);
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
    assert_eq!(h.tracker.poll(), 0);
    assert_eq!(h.dropped(), 2);
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.pending_guards,
            stats.pending_bytes
        ),
        (2, 0, 0)
    );
    // The completed marker is kept, to be recorded again for the next launch that needs one.
    assert_eq!(h.fake.calls().recycle, 0);
    h.launch(1).defer();
    assert_eq!(h.tracker.poll(), 0);
    assert_eq!(h.fake.markers_recorded(), 2);
    assert_eq!((h.fake.calls().rerecord, h.fake.calls().recycle), (1, 0));
}

#[test]
fn try_retire_gives_the_handle_back_while_pending() {
    let h = Harness::new(config(64));
    let handle = h.launch(2);
    let handle = match handle.try_retire() {
        Ok(_) => panic!("released before completion"),
        Err(handle) => handle,
    };
    assert_eq!(h.dropped(), 0);
    let handle = handle.try_retire().expect_err("still pending");
    assert_eq!(h.dropped(), 0);
    h.fake.complete_all();
    let retired = handle.try_retire().expect("complete now");
    assert_eq!((retired.released, retired.deferred_released), (2, 0));
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
    // One marker for the three attempts, and no blocking wait.
    assert_eq!(h.fake.markers_recorded(), 1);
    assert_eq!(h.fake.calls().wait, 0);
    assert_eq!(h.tracker.last_error(), None);
}

#[test]
fn is_complete_records_a_marker_only_when_none_covers_the_launch() {
    let h = Harness::new(config(64));
    let a = h.launch(1);
    assert!(!a.is_complete().unwrap());
    assert_eq!(h.fake.markers_recorded(), 1);
    assert!(!a.is_complete().unwrap());
    assert_eq!(h.fake.markers_recorded(), 1);
    let b = h.launch(1);
    assert!(!b.is_complete().unwrap());
    assert_eq!(h.fake.markers_recorded(), 2);
    assert!(!a.is_complete().unwrap());
    assert_eq!(h.fake.markers_recorded(), 2);
    h.fake.complete_through(1);
    assert!(a.is_complete().unwrap());
    assert!(!b.is_complete().unwrap());
    h.fake.complete_through(2);
    assert!(b.is_complete().unwrap());
    assert_eq!(h.fake.markers_recorded(), 2);
    // Both are known complete: retiring waits for nothing.
    a.retire().unwrap();
    b.retire().unwrap();
    assert_eq!(h.fake.calls().wait, 0);
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
}

#[test]
fn markers_are_amortised_over_deferred_launches() {
    let every = 64u32;
    let h = Harness::new(config(every));
    for _ in 0..200 {
        h.launch(1).defer();
    }
    let bound = 200u64.div_ceil(u64::from(every)) + 1;
    let during = h.fake.markers_recorded();
    assert!(
        during >= 2 && during <= bound,
        "{during} markers during 200 launches"
    );
    assert_eq!(h.dropped(), 0);
    assert_eq!(h.stats().pending_guards, 200);
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 200);
    assert_eq!(h.dropped(), 200);
    h.assert_sound();
    let markers = h.fake.markers_recorded();
    assert!(
        markers <= bound,
        "{markers} markers for 200 launches, marker_every {every}"
    );
    assert_eq!(h.stats().markers_recorded, markers);
    assert_eq!(h.fake.calls().wait, 0);
    // Launch order.
    let launches: Vec<u64> = h.drops().iter().map(|d| d.launch).collect();
    assert_eq!(launches, (0..200).collect::<Vec<_>>());
}

#[test]
fn launches_release_completed_deferred_work() {
    let h = Harness::new(config(4));
    for _ in 0..5 {
        h.launch(1).defer();
    }
    // Launch #3 (the fourth) was the fourth since the start and found uncovered deferred
    // launches (0..=2): it recorded a marker covering launches 0..=3. Launch #4 did not.
    assert_eq!(h.fake.markers_recorded(), 1);
    h.fake.complete_through(1);
    assert_eq!(h.dropped(), 0);
    // The next launch polls and releases what marker 1 covers, and nothing more.
    let handle = h.launch(1);
    assert_eq!(order(&h.drops()), vec![(0, 0), (1, 0), (2, 0), (3, 0)]);
    assert_eq!(h.stats().pending_guards, 1);
    h.assert_sound();
    assert_eq!(h.fake.calls().wait, 0);
    let retired = handle.retire().unwrap();
    assert_eq!((retired.released, retired.deferred_released), (1, 1));
    assert_eq!(h.dropped(), 6);
    h.assert_sound();
}

#[test]
fn drop_of_an_unretired_handle_blocks_until_completion() {
    let h = Harness::new(config(64));
    h.fake.set_blocking(true);
    let handle = h.launch(2);
    let completed = Arc::new(AtomicBool::new(false));
    // Timed from before the completer starts: under a serialising scheduler (valgrind) the
    // completer may sleep and complete before this thread runs again, and the drop must then
    // still have come after that completion.
    let started = Instant::now();
    let completer = {
        let fake = h.fake.clone();
        let completed = Arc::clone(&completed);
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(150));
            completed.store(true, Ordering::SeqCst);
            fake.complete_all();
        })
    };
    drop(handle);
    let waited = started.elapsed();
    assert!(
        completed.load(Ordering::SeqCst),
        "drop returned before the work was completed"
    );
    assert!(
        waited >= Duration::from_millis(100),
        "drop returned after {waited:?}"
    );
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
    completer.join().unwrap();
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.guards_leaked,
            stats.held_guards
        ),
        (2, 0, 0)
    );
}

#[test]
fn retire_blocks_until_completion() {
    let h = Harness::new(config(64));
    h.fake.set_blocking(true);
    let handle = h.launch(1);
    let completer = {
        let fake = h.fake.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_millis(100));
            fake.complete_all();
        })
    };
    let retired = handle.retire().unwrap();
    assert_eq!(retired.released, 1);
    assert_eq!(h.dropped(), 1);
    h.assert_sound();
    completer.join().unwrap();
}

#[test]
fn forgotten_handle_leaks_and_never_releases() {
    let h = Harness::new(config(64));
    let handle = h.launch(3);
    std::mem::forget(handle);
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 0);
    h.tracker.synchronize().unwrap();
    h.tracker.shutdown();
    assert_eq!(h.dropped(), 0);
    let stats = h.stats();
    // Invisible to the tracker: still "held", neither released nor counted as leaked.
    assert_eq!(
        (
            stats.guards_released,
            stats.guards_leaked,
            stats.held_guards
        ),
        (0, 0, 3)
    );
    // Other launches are unaffected.
    h.launch(1).retire().unwrap();
    assert_eq!(h.dropped(), 1);
    assert_eq!(h.drops()[0].launch, 1);
}

#[test]
fn guard_bound_forces_a_wait_on_the_oldest() {
    let h = Harness::new(ReleaseConfig {
        max_pending_guards: 4,
        ..config(1000)
    });
    for _ in 0..4 {
        h.launch(1).defer();
        assert!(h.stats().pending_guards <= 4);
    }
    assert_eq!(h.fake.calls().wait, 0);
    assert_eq!(h.dropped(), 0);
    // 4 queued + 1 new > 4: the launch waits for the oldest first (before enqueueing).
    let handle = h.launch(1);
    assert_eq!(h.fake.calls().wait, 1);
    assert_eq!(h.dropped(), 4);
    assert_eq!(h.stats().pending_guards, 0);
    // The wait happened before the new launch was enqueued: its own work is not complete.
    assert!(!h.fake.is_work_complete(5));
    handle.defer();
    for _ in 0..15 {
        h.launch(1).defer();
        let stats = h.stats();
        assert!(stats.pending_guards <= 4, "{stats:?}");
    }
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 20);
    h.assert_sound();
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.guards_leaked,
            stats.pending_guards
        ),
        (20, 0, 0)
    );
}

#[test]
fn byte_bound_forces_a_wait_on_the_oldest() {
    let h = Harness::new(ReleaseConfig {
        max_pending_bytes: 1000.into(),
        ..config(1000)
    });
    for i in 0..3 {
        h.launch_bytes(1, 300).defer();
        assert_eq!(h.stats().pending_bytes, 300 * (i + 1));
    }
    assert_eq!(h.fake.calls().wait, 0);
    h.launch_bytes(1, 300).defer();
    assert_eq!(h.fake.calls().wait, 1);
    assert_eq!(h.dropped(), 3);
    assert_eq!(h.stats().pending_bytes, 300);
    for _ in 0..20 {
        h.launch_bytes(2, 300).defer();
        assert!(h.stats().pending_bytes <= 1000);
    }
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 4 + 40);
    h.assert_sound();
    assert_eq!(h.stats().pending_bytes, 0);
}

#[test]
fn a_launch_whose_bytes_exceed_the_bound_is_queued_not_waited_for() {
    let h = Harness::new(ReleaseConfig {
        max_pending_bytes: 1000.into(),
        ..config(1000)
    });
    // 5000 bytes against a bound of 1000: neither the launch nor its defer waits.
    h.launch_bytes(2, 5000).defer();
    assert_eq!((h.fake.calls().wait, h.dropped()), (0, 0));
    assert_eq!(h.stats().pending_bytes, 5000);
    // Launches that add no bytes never wait because of bytes, however full the queue.
    for _ in 0..10 {
        h.launch_bytes(1, 0).defer();
        h.launch_deferred_bytes(1, 0);
    }
    assert_eq!((h.fake.calls().wait, h.dropped()), (0, 0));
    assert_eq!(h.stats().pending_guards, 22);
    // One that adds bytes waits until the bytes queued before it are released (oldest work
    // first: here the first launch), and is then queued although it exceeds the bound alone.
    h.launch_deferred_bytes(1, 7000);
    assert_eq!(h.fake.calls().wait, 1);
    assert!(h.dropped() >= 2, "the launch holding bytes was released");
    assert!(h.drops().iter().all(|d| d.complete));
    assert_eq!(h.stats().pending_bytes, 7000);
    let waits = h.fake.calls().wait;
    h.launch_bytes(1, 0).defer();
    assert_eq!(h.fake.calls().wait, waits, "adds no bytes: no wait");
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 24);
    h.assert_sound();
    let stats = h.stats();
    assert_eq!(
        (
            stats.pending_guards,
            stats.pending_bytes,
            stats.guards_released
        ),
        (0, 0, 24)
    );
}

#[test]
fn near_bound_says_when_half_of_a_bound_is_queued() {
    let h = Harness::new(ReleaseConfig {
        max_pending_guards: 8,
        max_pending_bytes: 1000.into(),
        ..config(1000)
    });
    assert!(!h.tracker.near_bound());
    h.launch_bytes(3, 0).defer();
    assert!(!h.tracker.near_bound(), "3 of 8 guards");
    let held = h.launch_bytes(5, 0);
    assert!(
        !h.tracker.near_bound(),
        "a live handle's guards are not queued"
    );
    held.defer();
    assert!(h.tracker.near_bound(), "8 of 8 guards");
    h.tracker.synchronize().unwrap();
    assert!(!h.tracker.near_bound());
    h.launch_bytes(1, 499).defer();
    assert!(!h.tracker.near_bound(), "499 of 1000 bytes");
    h.launch_bytes(1, 1).defer();
    assert!(h.tracker.near_bound(), "500 of 1000 bytes");
    h.tracker.synchronize().unwrap();
    assert!(!h.tracker.near_bound());
    assert_eq!(h.fake.calls().wait, 2, "asking never waits");
    h.assert_sound();
}

#[test]
fn would_wait_says_when_the_queue_plus_a_launch_is_over_a_bound() {
    let h = Harness::new(ReleaseConfig {
        max_pending_guards: 8,
        max_pending_bytes: 1000.into(),
        ..config(1000)
    });
    // An empty queue: only guards over the bound on their own wait (for their own work).
    assert!(!h.tracker.would_wait(8, 5000));
    assert!(h.tracker.would_wait(9, 0));
    h.launch_deferred_bytes(1, 1);
    // Far from half of either bound, yet a launch adding 1000 copied bytes must first wait for
    // the queued byte: `would_wait` says so where `near_bound` cannot.
    assert!(!h.tracker.near_bound());
    assert!(h.tracker.would_wait(1, 1000));
    assert!(!h.tracker.would_wait(1, 999));
    assert!(!h.tracker.would_wait(7, 0));
    assert!(h.tracker.would_wait(8, 0));
    // Bytes never make a launch that adds none wait.
    assert!(!h.tracker.would_wait(1, 0));
    // What the hint says is what the launch does.
    h.fake.complete_all();
    let waits = h.fake.calls().wait;
    h.launch_deferred_bytes(1, 1000);
    assert_eq!(
        h.fake.calls().wait,
        waits + 1,
        "the launch waited for the queued byte"
    );
    h.tracker.synchronize().unwrap();
    assert!(!h.tracker.would_wait(1, 1000));
    h.assert_sound();
}

#[test]
fn byte_bound_share_of_device_resolves_once_against_the_timeline() {
    let fake = FakeTimeline::new();
    fake.set_device_memory(141_000_000_000);
    let h = Harness::with_fake(fake.clone(), config(64));
    // The default: a quarter of the device.
    assert_eq!(h.tracker.max_pending_bytes(), 35_250_000_000);
    // Read once: a later change of the device's answer does not move the bound.
    fake.set_device_memory(1000);
    assert_eq!(h.tracker.max_pending_bytes(), 35_250_000_000);
    let share = |percent| ReleaseConfig {
        max_pending_bytes: PendingBytes::ShareOfDevice { percent },
        ..config(64)
    };
    let with_memory = |bytes: Option<u64>, percent| {
        let f = FakeTimeline::new();
        if let Some(b) = bytes {
            f.set_device_memory(b);
        }
        Harness::with_fake(f, share(percent))
            .tracker
            .max_pending_bytes()
    };
    assert_eq!(with_memory(Some(80 << 30), 10), (80u64 << 30) / 100 * 10);
    assert_eq!(
        with_memory(Some(1_000_000), 0),
        10_000,
        "0 % is taken as 1 %"
    );
    assert_eq!(
        with_memory(Some(1_000_000), 250),
        1_000_000,
        "capped at 100 %"
    );
    // A timeline that does not know its device's memory: the fallback.
    assert_eq!(with_memory(None, 25), PendingBytes::FALLBACK);
    assert_eq!(PendingBytes::FALLBACK, 4 << 30);
    // A fixed bound ignores the device.
    let f = FakeTimeline::new();
    f.set_device_memory(1 << 40);
    let fixed = Harness::with_fake(
        f,
        ReleaseConfig {
            max_pending_bytes: PendingBytes::Bytes(123),
            ..config(64)
        },
    );
    assert_eq!(fixed.tracker.max_pending_bytes(), 123);
    assert_eq!(
        ReleaseConfig::default().max_pending_bytes,
        PendingBytes::ShareOfDevice { percent: 25 }
    );
}

#[test]
fn a_launch_larger_than_the_bound_is_waited_for_when_deferred() {
    let h = Harness::new(ReleaseConfig {
        max_pending_guards: 4,
        ..config(1000)
    });
    h.launch(1).defer();
    let big = h.launch(6);
    assert_eq!(
        h.dropped(),
        1,
        "the queued launch was waited for to make room"
    );
    big.defer();
    assert_eq!(h.dropped(), 7);
    h.assert_sound();
    let stats = h.stats();
    assert_eq!(
        (
            stats.pending_guards,
            stats.held_guards,
            stats.guards_released
        ),
        (0, 0, 7)
    );
}

#[test]
fn launch_deferred_queues_without_a_handle_in_launch_order() {
    let h = Harness::new(config(1000));
    assert_eq!(h.launch_deferred(2), 0);
    let b = h.launch(2);
    assert_eq!(h.launch_deferred(1), 2);
    assert_eq!(h.launch_deferred(0), 3);
    let stats = h.stats();
    assert_eq!(
        (
            stats.pending_guards,
            stats.pending_bytes,
            stats.held_guards,
            stats.held_bytes,
            stats.launches
        ),
        (3, 300, 2, 200, 4)
    );
    assert_eq!(h.dropped(), 0);
    // Retiring the handle waits for a marker covering every launch so far: it releases the
    // queued launches before and after it too, in launch order.
    let retired = b.retire().unwrap();
    assert_eq!((retired.released, retired.deferred_released), (2, 3));
    assert_eq!(
        order(&h.drops()),
        vec![(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    );
    h.assert_sound();
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.pending_guards,
            stats.held_guards,
            stats.held_bytes
        ),
        (5, 0, 0, 0)
    );
}

#[test]
fn launch_deferred_keeps_the_bounds() {
    let h = Harness::new(ReleaseConfig {
        max_pending_guards: 4,
        ..config(1000)
    });
    for _ in 0..4 {
        h.launch_deferred(1);
    }
    assert_eq!((h.fake.calls().wait, h.dropped()), (0, 0));
    // 4 queued + 1 new > 4: waits for the oldest before enqueueing.
    h.launch_deferred(1);
    assert_eq!((h.fake.calls().wait, h.dropped()), (1, 4));
    assert_eq!(h.stats().pending_guards, 1);
    // Over the bound on its own: waited for and released before it returns, like `defer`.
    h.launch_deferred(5);
    assert_eq!(h.dropped(), 10);
    assert_eq!(h.stats().pending_guards, 0);
    for _ in 0..15 {
        h.launch_deferred(2);
        let stats = h.stats();
        assert!(stats.pending_guards <= 4, "{stats:?}");
    }
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 40);
    h.assert_sound();
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.guards_leaked,
            stats.held_guards
        ),
        (40, 0, 0)
    );
}

#[test]
fn launch_deferred_enqueue_failure_releases_at_once() {
    let h = Harness::new(config(64));
    let (_, _, guards) = h.guards(2);
    let result = h
        .tracker
        .launch_deferred(guards, 200, || Err::<(), _>("cuLaunchKernel failed"));
    assert_eq!(result.err(), Some("cuLaunchKernel failed"));
    assert_eq!(order(&h.drops()), vec![(0, 0), (0, 1)]);
    let stats = h.stats();
    assert_eq!(
        (stats.launches, stats.guards_released, stats.pending_guards),
        (0, 2, 0)
    );
    // The sequence number was not used.
    assert_eq!(h.launch_deferred(1), 0);
}

#[test]
fn enqueue_failure_releases_at_once_and_uses_no_sequence_number() {
    let h = Harness::new(config(64));
    let (_, _, guards) = h.guards(2);
    let result = h
        .tracker
        .launch(guards, 200, || Err::<(), _>("cuLaunchKernelEx failed"));
    assert_eq!(result.err(), Some("cuLaunchKernelEx failed"));
    let drops = h.drops();
    assert_eq!(order(&drops), vec![(0, 0), (0, 1)]);
    assert!(drops.iter().all(|d| d.work.is_none()));
    let stats = h.stats();
    assert_eq!(
        (
            stats.launches,
            stats.guards_released,
            stats.held_guards,
            stats.held_bytes
        ),
        (0, 2, 0, 0)
    );
    assert_eq!(h.fake.calls(), Default::default());
    // The next launch gets sequence number 0.
    let handle = h.launch(1);
    assert_eq!(handle.seq(), 0);
    handle.retire().unwrap();
    assert_eq!(h.dropped(), 3);
}

#[test]
fn enqueue_panic_queues_the_guards_and_resumes_the_panic() {
    let h = Harness::new(config(64));
    let (_, _, guards) = h.guards(2);
    let tracker = Arc::clone(&h.tracker);
    let fake = h.fake.clone();
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _ = tracker.launch(guards, 0, || -> Result<(), Infallible> {
            fake.enqueue();
            panic!("enqueue panicked after enqueueing");
        });
    }));
    assert!(caught.is_err());
    assert_eq!(
        h.dropped(),
        0,
        "the work may have been enqueued: no release yet"
    );
    assert_eq!(h.stats().pending_guards, 2);
    assert_eq!(h.tracker.poll(), 0);
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 2);
    assert_eq!(h.dropped(), 2);
    // Sequence number 0 was used by the panicked launch.
    assert_eq!(h.launch(1).seq(), 1);
}

#[test]
fn record_failure_falls_back_to_synchronize() {
    let h = Harness::new(config(64));
    let handle = h.launch(2);
    h.fake.fail_next(FakeOp::Record, 1);
    let retired = handle.retire().unwrap();
    assert_eq!(retired.released, 2);
    let calls = h.fake.calls();
    assert_eq!((calls.record, calls.synchronize, calls.wait), (1, 1, 0));
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
    assert_eq!(h.stats().guards_leaked, 0);
}

#[test]
fn record_and_synchronize_failure_leaks_in_retire() {
    let h = Harness::new(config(64));
    let handle = h.launch(2);
    h.fake.fail_always(FakeOp::Record);
    h.fake.fail_always(FakeOp::Synchronize);
    let err: RetireError<FakeError> = handle.retire().unwrap_err();
    assert_eq!((err.seq, err.leaked), (0, 2));
    assert!(matches!(
        err.source,
        CompletionError::Synchronize {
            record: FakeError {
                op: FakeOp::Record,
                ..
            },
            source: FakeError {
                op: FakeOp::Synchronize,
                ..
            },
        }
    ));
    assert_eq!(err.into_error().op, FakeOp::Synchronize);
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_leaked,
            stats.guards_released,
            stats.held_guards
        ),
        (2, 0, 0)
    );
    // Even once everything completes, leaked guards are never released.
    h.fake.clear_failures();
    h.fake.complete_all();
    h.tracker.synchronize().unwrap();
    h.tracker.poll();
    assert_eq!(h.dropped(), 0);
}

#[test]
fn record_and_synchronize_failure_leaks_in_drop_and_sets_the_sticky_error() {
    let h = Harness::new(config(64));
    let handle = h.launch(3);
    h.fake.fail_always(FakeOp::Record);
    h.fake.fail_always(FakeOp::Synchronize);
    drop(handle);
    assert_eq!(h.dropped(), 0);
    let stats = h.stats();
    assert_eq!(
        (stats.guards_leaked, stats.guards_released, stats.errors),
        (3, 0, 1)
    );
    assert_eq!(
        h.tracker.last_error().map(|e| e.op),
        Some(FakeOp::Synchronize)
    );
    // Sticky until taken.
    assert_eq!(
        h.tracker.last_error().map(|e| e.op),
        Some(FakeOp::Synchronize)
    );
    assert_eq!(
        h.tracker.take_error().map(|e| e.op),
        Some(FakeOp::Synchronize)
    );
    assert_eq!(h.tracker.last_error(), None);
    h.fake.clear_failures();
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 0);
}

#[test]
fn query_failure_in_poll_releases_nothing_and_is_sticky() {
    let h = Harness::new(config(64));
    h.launch(2).defer();
    h.fake.complete_all();
    h.fake.fail_next(FakeOp::Query, 1);
    assert_eq!(h.tracker.poll(), 0);
    assert_eq!(h.dropped(), 0);
    assert_eq!(h.tracker.last_error().map(|e| e.op), Some(FakeOp::Query));
    assert_eq!(h.stats().pending_guards, 2);
    // The next query succeeds.
    assert_eq!(h.tracker.poll(), 2);
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
    assert_eq!(h.fake.markers_recorded(), 1);
}

#[test]
fn query_failure_in_try_retire_gives_the_handle_back() {
    let h = Harness::new(config(64));
    let handle = h.launch(1);
    h.fake.complete_all();
    h.fake.fail_next(FakeOp::Query, 1);
    let handle = handle.try_retire().expect_err("query failed: handle back");
    assert_eq!(h.dropped(), 0);
    assert_eq!(h.tracker.last_error().map(|e| e.op), Some(FakeOp::Query));
    assert!(handle.is_complete().unwrap());
    assert!(handle.try_retire().is_ok());
    assert_eq!(h.dropped(), 1);
}

#[test]
fn wait_failure_in_retire_leaks() {
    let h = Harness::new(config(64));
    let handle = h.launch(2);
    h.fake.fail_next(FakeOp::Wait, 1);
    let err = handle.retire().unwrap_err();
    assert_eq!(err.leaked, 2);
    assert!(matches!(
        err.source,
        CompletionError::Wait(FakeError {
            op: FakeOp::Wait,
            ..
        })
    ));
    assert_eq!(
        h.fake.calls().synchronize,
        0,
        "a failed wait is not retried by a stream sync"
    );
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_leaked,
            stats.guards_released,
            stats.held_guards
        ),
        (2, 0, 0)
    );
    // Retire's caller received the error: the sticky slot is for errors nobody received.
    assert_eq!(h.tracker.last_error(), None);
    h.fake.complete_all();
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 0);
}

#[test]
fn wait_failure_in_drop_leaks_and_sets_the_sticky_error() {
    let h = Harness::new(config(64));
    let handle = h.launch(2);
    h.fake.fail_next(FakeOp::Wait, 1);
    drop(handle);
    assert_eq!(h.dropped(), 0);
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_leaked,
            stats.guards_released,
            stats.held_guards
        ),
        (2, 0, 0)
    );
    assert_eq!(h.tracker.last_error().map(|e| e.op), Some(FakeOp::Wait));
    h.fake.complete_all();
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 0);
}

#[test]
fn wait_failure_while_making_room_leaks_the_oldest_entry() {
    let h = Harness::new(ReleaseConfig {
        max_pending_guards: 2,
        ..config(1000)
    });
    h.launch(1).defer();
    h.launch(1).defer();
    h.fake.fail_next(FakeOp::Wait, 1);
    let handle = h.launch(1);
    // The wait for launch 0 failed: launch 0 is leaked, which makes room (1 queued + 1 new);
    // launch 1 stays queued.
    assert_eq!(h.dropped(), 0);
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_leaked,
            stats.guards_released,
            stats.pending_guards
        ),
        (1, 0, 1)
    );
    assert_eq!(h.tracker.last_error().map(|e| e.op), Some(FakeOp::Wait));
    handle.retire().unwrap();
    h.tracker.synchronize().unwrap();
    assert_eq!(order(&h.drops()), vec![(1, 0), (2, 0)]);
    h.assert_sound();
}

#[test]
fn shutdown_releases_the_queue_after_synchronizing() {
    let h = Harness::new(config(1000));
    for _ in 0..3 {
        h.launch(2).defer();
    }
    assert_eq!(h.dropped(), 0);
    h.tracker.shutdown();
    assert_eq!(h.dropped(), 6);
    h.assert_sound();
    assert_eq!(h.fake.calls().wait, 1);
    let stats = h.stats();
    assert_eq!(
        (
            stats.pending_guards,
            stats.guards_released,
            stats.guards_leaked
        ),
        (0, 6, 0)
    );
    assert_eq!(h.tracker.last_error(), None);
}

/// While the stream captures a graph, a poll records no marker and stores no error (an event
/// recorded then would become part of the graph); once the capture has ended the queued work
/// is covered and released as usual.
#[test]
fn poll_during_a_capture_records_nothing_and_reports_nothing() {
    let h = Harness::new(config(1000));
    for _ in 0..3 {
        h.launch(2).defer();
    }
    h.fake.set_capturing(true);
    let records = h.fake.calls().record;
    assert_eq!(h.tracker.poll(), 0);
    assert_eq!(h.fake.calls().record, records);
    assert_eq!(h.tracker.last_error(), None);
    assert_eq!(h.stats().errors, 0);
    assert_eq!(h.dropped(), 0);
    h.fake.set_capturing(false);
    h.tracker.poll(); // records the marker covering the three launches
    h.fake.complete_all();
    h.tracker.poll();
    assert_eq!(h.dropped(), 6);
    assert_eq!(h.stats().errors, 0);
    h.assert_sound();
}

/// A queue with nothing deferred makes no call on its stream at shutdown (the stream may have
/// been destroyed once its work was released), even after launches that were all retired.
#[test]
fn shutdown_of_an_empty_queue_touches_nothing() {
    let h = Harness::new(config(1000));
    let handle = h.launch(2);
    h.fake.complete_all();
    handle.retire().unwrap();
    let before = h.fake.calls();
    h.fake.fail_always(FakeOp::Record);
    h.fake.fail_always(FakeOp::Wait);
    h.fake.fail_always(FakeOp::Synchronize);
    h.tracker.shutdown();
    let after = h.fake.calls();
    assert_eq!(
        (after.record, after.wait, after.synchronize, after.query),
        (before.record, before.wait, before.synchronize, before.query)
    );
    assert_eq!(h.tracker.last_error(), None);
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
}

#[test]
fn shutdown_leaks_the_queue_when_synchronize_fails() {
    let h = Harness::new(config(1000));
    for _ in 0..3 {
        h.launch(2).defer();
    }
    let pending = h.stats().pending_guards as u64;
    assert_eq!(pending, 6);
    h.fake.fail_always(FakeOp::Wait);
    h.tracker.shutdown();
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_leaked,
            stats.guards_released,
            stats.pending_guards
        ),
        (pending, 0, 0)
    );
    assert_eq!(h.tracker.last_error().map(|e| e.op), Some(FakeOp::Wait));
    assert_eq!(h.dropped(), 0);
    h.fake.clear_failures();
    h.fake.complete_all();
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 0);
}

#[test]
fn dropping_the_tracker_drains_the_queue() {
    let h = Harness::new(config(1000));
    for _ in 0..3 {
        h.launch(1).defer();
    }
    let Harness {
        fake, tracker, log, ..
    } = h;
    assert_eq!(log.lock().unwrap().len(), 0);
    drop(tracker);
    let drops = log.lock().unwrap().clone();
    assert_eq!(drops.len(), 3);
    assert!(drops.iter().all(|d| d.complete));
    assert_eq!(fake.calls().wait, 1);
}

#[test]
fn a_panicking_guard_does_not_stop_the_others() {
    let h = Harness::new(config(64));
    let (_, work, mut guards) = h.guards(3);
    guards[1].on_drop = Some(Box::new(|| panic!("deleter panicked")));
    let handle = h.launch_guards(guards, work, 300);
    h.launch(1).defer();
    let retired = handle.retire().unwrap();
    assert_eq!((retired.released, retired.deferred_released), (3, 1));
    assert_eq!(order(&h.drops()), vec![(0, 0), (0, 1), (0, 2), (1, 0)]);
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.release_panics,
            stats.guards_leaked
        ),
        (4, 1, 0)
    );
    // The tracker keeps working.
    h.launch(1).retire().unwrap();
    assert_eq!(h.dropped(), 5);
}

#[test]
fn a_guard_calling_back_into_the_tracker_does_not_deadlock() {
    let (done_tx, done_rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let h = Harness::new(config(1));
        let weak: Weak<Tr> = Arc::downgrade(&h.tracker);
        let (_, work, mut guards) = h.guards(1);
        let inner = h.guards(1);
        let observed = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&observed);
        let fake = h.fake.clone();
        guards[0].on_drop = Some(Box::new(move || {
            let tracker = weak.upgrade().expect("tracker alive");
            let stats = tracker.stats();
            tracker.poll();
            // Even a launch from inside a deleter.
            let (_, inner_work, inner_guards) = inner;
            let handle = tracker
                .launch(inner_guards, 1, move || {
                    inner_work.set(fake.enqueue()).unwrap();
                    Ok::<(), Infallible>(())
                })
                .unwrap();
            handle.defer();
            *seen.lock().unwrap() = Some(stats);
        }));
        h.launch_guards(guards, work, 1).defer();
        h.fake.complete_all();
        let released = h.tracker.poll();
        let inner_stats = observed
            .lock()
            .unwrap()
            .expect("the guard ran its callback");
        h.tracker.synchronize().unwrap();
        done_tx
            .send((released, inner_stats.pending_guards, h.dropped()))
            .unwrap();
        h.assert_sound();
    });
    let (released, pending_seen_inside, dropped) = done_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("deadlock: guard called back into the tracker");
    worker.join().unwrap();
    assert_eq!(released, 1);
    // The guard was already out of the queue when it was dropped.
    assert_eq!(pending_seen_inside, 0);
    assert_eq!(dropped, 2);
}

/// xorshift64*: a small deterministic generator, enough to shuffle the operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn concurrency_smoke(config: ReleaseConfig, threads: u64, launches: u64) {
    // Under Miri (a thousand times slower) the same mix, shorter: Miri checks each access of
    // every interleaving it runs, not how many it runs.
    let launches = if cfg!(miri) { launches / 25 } else { launches };
    let h = Arc::new(Harness::new(config));
    h.fake.set_blocking(true);
    let stop = Arc::new(AtomicBool::new(false));
    let completer = {
        let fake = h.fake.clone();
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            while !stop.load(Ordering::SeqCst) {
                let target = fake.completed() + rng.next() % 8;
                fake.complete_work(target);
                if rng.next().is_multiple_of(4) {
                    thread::sleep(Duration::from_micros(50));
                } else {
                    thread::yield_now();
                }
            }
        })
    };
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let h = Arc::clone(&h);
            thread::spawn(move || {
                let mut rng = Rng(0x1234_5678 + t * 0x1_0000_0001);
                let mut kept = Vec::new();
                for _ in 0..launches {
                    let n = 1 + (rng.next() % 3) as usize;
                    let choice = rng.next() % 10;
                    if choice == 3 {
                        h.launch_deferred(n);
                        continue;
                    }
                    let handle = h.launch(n);
                    match choice {
                        0..=2 => handle.defer(),
                        4 => handle.retire().map(drop).unwrap(),
                        5 => drop(handle),
                        6 => match handle.try_retire() {
                            Ok(_) => {}
                            Err(handle) => kept.push(handle),
                        },
                        7 => {
                            h.tracker.poll();
                            handle.defer();
                        }
                        _ => kept.push(handle),
                    }
                    if kept.len() > 8 {
                        let i = (rng.next() % kept.len() as u64) as usize;
                        let old = kept.swap_remove(i);
                        if rng.next().is_multiple_of(2) {
                            old.defer()
                        } else {
                            drop(old)
                        }
                    }
                    let stats = h.stats();
                    assert!(
                        stats.pending_guards <= config.max_pending_guards,
                        "{stats:?}"
                    );
                    assert!(
                        stats.pending_bytes <= h.tracker.max_pending_bytes(),
                        "{stats:?}"
                    );
                }
                for handle in kept {
                    handle.defer();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    h.tracker.synchronize().unwrap();
    stop.store(true, Ordering::SeqCst);
    completer.join().unwrap();

    h.assert_sound();
    let stats = h.stats();
    assert_eq!(stats.launches, threads * launches);
    assert_eq!(stats.pending_guards, 0, "{stats:?}");
    assert_eq!(stats.held_guards, 0, "{stats:?}");
    assert_eq!((stats.guards_leaked, stats.release_panics), (0, 0));
    assert_eq!(stats.guards_released, h.dropped() as u64);
    // Every guard of every launch was dropped exactly once.
    let mut per_launch = std::collections::HashMap::<u64, usize>::new();
    for d in h.drops() {
        *per_launch.entry(d.launch).or_default() += 1;
    }
    assert_eq!(per_launch.len() as u64, threads * launches);
    assert_eq!(h.tracker.last_error(), None);
    let calls = h.fake.calls();
    assert!(calls.wait > 0 && calls.query > 0, "{calls:?}");
    // Every marker goes back to the timeline exactly once.
    let h = Arc::into_inner(h).expect("no handle left");
    let Harness { fake, tracker, .. } = h;
    drop(tracker);
    let calls = fake.calls();
    assert_eq!(calls.recycle + calls.rerecord, fake.markers_recorded());
}

#[test]
fn concurrency_smoke_default_bounds() {
    concurrency_smoke(config(16), 4, 1000);
}

#[test]
fn concurrency_smoke_tight_bounds() {
    concurrency_smoke(
        ReleaseConfig {
            marker_every: 4,
            poll_every: 2,
            max_pending_guards: 24,
            max_pending_bytes: 2_000.into(),
        },
        4,
        1000,
    );
}

#[test]
fn synchronize_waits_for_all_work_on_the_stream() {
    let h = Harness::new(config(64));
    h.launch(1).retire().unwrap();
    // Work enqueued on the stream without the tracker.
    h.fake.enqueue();
    h.fake.enqueue();
    let before = h.fake.calls();
    h.tracker.synchronize().unwrap();
    let after = h.fake.calls();
    assert_eq!(
        (after.record - before.record, after.wait - before.wait),
        (1, 1)
    );
    assert_eq!(h.fake.completed(), 3);
    assert_eq!(h.dropped(), 1);
}

#[test]
fn every_marker_is_recycled_exactly_once() {
    let h = Harness::new(config(2));
    let a = h.launch(1);
    assert!(!a.is_complete().unwrap());
    for _ in 0..10 {
        h.launch(1).defer();
    }
    h.fake.complete_through(1);
    a.retire().unwrap();
    // A marker recorded and never completed.
    let b = h.launch(1);
    assert!(!b.is_complete().unwrap());
    std::mem::forget(b);
    let recorded = h.fake.markers_recorded();
    assert!(recorded >= 3, "{recorded}");
    assert!(h.fake.calls().recycle < recorded);
    let Harness {
        fake, tracker, log, ..
    } = h;
    // The forgotten handle keeps the tracker alive: shut it down, then drop our reference...
    tracker.shutdown();
    assert_eq!(log.lock().unwrap().len(), 11);
    // None went back yet: each completed marker is kept, to be recorded again (the tracker
    // gives them back when it is dropped, below and in `concurrency_smoke`).
    let calls = fake.calls();
    assert!(calls.rerecord > 0, "{calls:?}");
    assert_eq!(calls.recycle, 0);
    // ...and a tracker dropped with a marker outstanding gives it back too.
    let fake2 = FakeTimeline::new();
    let t2: Arc<Tr> = Tracker::new(fake2.clone(), config(64));
    let work = Arc::new(OnceLock::new());
    let f = fake2.clone();
    let w = Arc::clone(&work);
    let handle = t2
        .launch(Vec::new(), 0, move || {
            w.set(f.enqueue()).unwrap();
            Ok::<(), Infallible>(())
        })
        .unwrap();
    assert!(!handle.is_complete().unwrap());
    drop(handle); // no guards: no wait
    assert_eq!(fake2.calls().wait, 0);
    drop(t2);
    assert_eq!((fake2.markers_recorded(), fake2.calls().recycle), (1, 1));
}

#[test]
fn handles_and_trackers_cross_threads() {
    fn send<T: Send>() {}
    fn send_sync<T: Send + Sync>() {}
    send::<Handle>();
    send_sync::<Tr>();
    send_sync::<Arc<Tr>>();
    let h = Harness::new(config(64));
    let handle = h.launch(2);
    assert_eq!((handle.guards().len(), handle.bytes()), (2, 200));
    let stats = h.stats();
    assert_eq!(
        (stats.held_guards, stats.held_bytes, stats.launches),
        (2, 200, 1)
    );
    thread::spawn(move || handle.retire().unwrap())
        .join()
        .unwrap();
    assert_eq!(h.dropped(), 2);
    let stats = h.stats();
    assert_eq!((stats.held_guards, stats.held_bytes), (0, 0));
}

#[test]
fn launches_poll_only_every_poll_every_launches() {
    let h = Harness::new(ReleaseConfig {
        marker_every: 1,
        poll_every: 4,
        ..ReleaseConfig::default()
    });
    // Launch 1 (poll counter 1): deferred, a marker covers it.
    h.launch(2).defer();
    h.fake.complete_all();
    // Launches 2 and 3 do not poll: the completed launch stays queued.
    for _ in 0..2 {
        h.launch(1).defer();
    }
    assert_eq!(h.dropped(), 0, "released before a poll was due");
    let queries_before = h.fake.calls().query;
    // Launch 4 polls and releases what completed.
    h.launch(1).defer();
    assert!(
        h.fake.calls().query > queries_before,
        "the 4th launch queries"
    );
    assert!(
        h.dropped() >= 2,
        "the first launch's guards are released at the 4th launch"
    );
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 5);
    h.assert_sound();
}

/// A thread-bound timeline (CUDA's per-thread default stream): every launch records its marker
/// on the launching thread, and retire, poll and synchronize from another thread never record
/// or synchronise there (which would name that thread's own, idle stream), yet release nothing
/// before completion and everything after.
#[test]
fn thread_bound_timeline_is_answered_from_launch_time_markers() {
    let fake = FakeTimeline::new();
    fake.bind_to_current_thread();
    let h = Arc::new(Harness::with_fake(fake, config(64)));
    let handle = h.launch(2);
    h.launch_deferred(1);
    h.launch_deferred(3);
    assert_eq!(
        h.fake.markers_recorded(),
        3,
        "one marker per launch, at launch time"
    );
    let other = {
        let h = Arc::clone(&h);
        std::thread::spawn(move || {
            assert_eq!(h.tracker.poll(), 0, "nothing completed yet");
            let Err(handle) = handle.try_retire() else {
                panic!("retired before its work completed");
            };
            assert_eq!(h.dropped(), 0);
            handle
                .retire()
                .expect("answered from the launch-time marker");
            h.tracker
                .synchronize()
                .expect("answered from the newest marker");
            h.assert_sound();
            assert_eq!(h.dropped(), 6);
        })
    };
    other.join().unwrap();
    let calls = h.fake.calls();
    assert_eq!(
        calls.foreign, 0,
        "no record or synchronize attempted off the owning thread"
    );
    assert_eq!(calls.synchronize, 0);
    assert_eq!(calls.record, 3);
    assert_eq!(h.stats().guards_leaked, 0);
}

#[test]
fn queued_launch_owns_nothing_and_waits_then_releases_in_launch_order() {
    let h = Harness::new(config(1000));
    let a = h.launch_queued(2);
    let b = h.launch_queued(1);
    assert_eq!((a.seq(), b.seq(), a.guards()), (0, 1, 2));
    // The guards are queued at once: pending, not held.
    let stats = h.stats();
    assert_eq!(
        (stats.pending_guards, stats.pending_bytes, stats.held_guards),
        (3, 300, 0)
    );
    // Asking does not block and releases nothing while the work runs.
    assert_eq!(a.is_complete(), Ok(false));
    assert_eq!(b.try_release(), Ok(None));
    assert_eq!(h.dropped(), 0);
    // Dropping a queued handle releases nothing: the queue keeps the guards.
    drop(a);
    assert_eq!((h.dropped(), h.stats().pending_guards), (0, 3));
    // Waiting for the later launch blocks until it completes, then releases both launches in
    // launch order, once.
    h.fake.set_blocking(true);
    let fake = h.fake.clone();
    let done = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        fake.complete_all();
    });
    assert_eq!(b.wait().unwrap(), 3);
    done.join().unwrap();
    assert_eq!(order(&h.drops()), vec![(0, 0), (0, 1), (1, 0)]);
    h.assert_sound();
    // Waiting again, or asking, releases nothing twice.
    assert_eq!(b.wait().unwrap(), 0);
    assert_eq!(b.try_release(), Ok(Some(0)));
    assert_eq!(h.dropped(), 3);
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.pending_guards,
            stats.guards_leaked
        ),
        (3, 0, 0)
    );
}

#[test]
fn queued_launch_whose_wait_fails_leaks_its_own_guards_and_releases_nothing() {
    let h = Harness::new(config(1000));
    let other = h.launch_queued(1);
    let q = h.launch_queued(2);
    h.fake.fail_always(FakeOp::Wait);
    h.fake.fail_always(FakeOp::Synchronize);
    let e = q.wait().unwrap_err();
    // As a handle's failed retire: this launch's guards are leaked and counted, never
    // released; the other queued launch stays queued.
    assert_eq!((e.seq, e.leaked), (1, 2));
    assert_eq!(h.dropped(), 0);
    let stats = h.stats();
    assert_eq!((stats.guards_leaked, stats.pending_guards), (2, 1));
    h.fake.clear_failures();
    h.fake.complete_all();
    // Once the work is seen complete, only the other launch is released; the leaked guards
    // never are, and waiting again leaks nothing more.
    assert_eq!(other.try_release(), Ok(Some(1)));
    assert_eq!(q.wait().unwrap(), 0);
    h.assert_sound();
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.guards_leaked,
            stats.pending_guards
        ),
        (1, 2, 0)
    );
}

/// A stream that is lost (its context destroyed or reset, the stream gone, a fault poisoning the
/// context) can never confirm completion: the first poll that finds out leaks what the queue
/// holds (counted), counts the error once, and leaves the queue empty, so that later polls make
/// no driver call, add no error and the tracker can be forgotten.
#[test]
fn a_lost_stream_is_abandoned_once_by_poll_and_leaks_counted() {
    let h = Harness::new(config(1));
    h.launch_deferred(2);
    h.launch_deferred(1);
    assert!(h.fake.markers_recorded() >= 1);
    h.fake.lose();
    assert_eq!(h.tracker.poll(), 0);
    let stats = h.stats();
    assert_eq!(
        (
            stats.pending_guards,
            stats.pending_bytes,
            stats.guards_leaked,
            stats.guards_released,
            stats.errors
        ),
        (0, 0, 3, 0, 1)
    );
    assert!(h.tracker.last_error().is_some_and(|e| e.lost));
    assert!(h.tracker.is_quiescent(), "nothing left to wait for");
    let calls = h.fake.calls();
    for _ in 0..5 {
        assert_eq!(h.tracker.poll(), 0);
    }
    assert_eq!(h.stats().errors, 1, "no error more on every later poll");
    assert_eq!(h.fake.calls(), calls, "no driver call after abandoning");
    // Every marker went back to the timeline (no event kept for a lost stream, no spare either).
    assert_eq!(calls.recycle + calls.rerecord, h.fake.markers_recorded());
    assert_eq!(h.dropped(), 0, "leaked guards are never released");
}

/// A failed query that does not say the stream is lost leaves the queue as it was (the next
/// poll may succeed): only lost errors abandon.
#[test]
fn a_passing_query_error_keeps_the_queue() {
    let h = Harness::new(config(1));
    h.launch_deferred(2);
    h.fake.fail_next(FakeOp::Query, 1);
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 0);
    assert_eq!((h.stats().pending_guards, h.stats().guards_leaked), (2, 0));
    assert_eq!(h.tracker.poll(), 2);
    h.assert_sound();
}

/// `synchronize` on a lost stream returns the error, counts it, leaks what was queued and
/// leaves the queue empty; a later launch on the same tracker is queued and released as usual
/// once the timeline works again (a new stream under the same handle, say).
#[test]
fn synchronize_on_a_lost_stream_leaks_the_queue_and_counts_the_error() {
    let h = Harness::new(config(64));
    h.launch_deferred(2);
    h.fake.lose();
    let e = h.tracker.synchronize().unwrap_err();
    assert!(e.lost);
    let stats = h.stats();
    assert_eq!(
        (stats.pending_guards, stats.guards_leaked, stats.errors),
        (0, 2, 1)
    );
    assert!(h.tracker.is_quiescent());
    assert_eq!(h.dropped(), 0);
}

/// A failed `synchronize` that does not lose the stream is counted in `errors` and keeps the
/// queue (nothing released, nothing leaked).
#[test]
fn a_failed_synchronize_is_counted_and_keeps_the_queue() {
    let h = Harness::new(config(64));
    h.launch_deferred(2);
    h.fake.fail_next(FakeOp::Record, 1);
    h.fake.fail_next(FakeOp::Synchronize, 1);
    assert!(h.tracker.synchronize().is_err());
    let stats = h.stats();
    assert_eq!(
        (stats.pending_guards, stats.guards_leaked, stats.errors),
        (2, 0, 1)
    );
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped(), 2);
    h.assert_sound();
}

/// A handle vouched for only inside launch calls (an int stream handle its owner may destroy
/// once the work is done): every launch records its marker at launch time, and polls, waits,
/// synchronisations and releases never name the stream afterwards — so a stream destroyed after
/// its work is never touched again, and its guards are released from the launch-time markers.
#[test]
fn a_launch_only_timeline_is_never_named_after_the_launch() {
    let fake = FakeTimeline::new();
    fake.set_launch_only(true);
    let h = Harness::with_fake(fake, config(64));
    let handle = h.launch(1);
    h.launch_deferred(2);
    h.launch_deferred(3);
    assert_eq!(
        h.fake.markers_recorded(),
        3,
        "one marker per launch, at launch time"
    );
    let calls = h.fake.calls();
    assert_eq!(calls.foreign, 0);
    assert_eq!(h.tracker.poll(), 0, "nothing completed yet");
    h.fake.complete_work(2);
    assert_eq!(
        h.tracker.poll(),
        2,
        "the second launch, from its own marker"
    );
    let Ok(_) = handle.try_retire() else {
        panic!("the first launch's work is complete");
    };
    h.tracker
        .synchronize()
        .expect("answered from the newest marker");
    assert_eq!(h.dropped(), 6);
    h.assert_sound();
    let calls = h.fake.calls();
    assert_eq!(
        (calls.record, calls.synchronize, calls.foreign),
        (3, 0, 0),
        "the stream was named only by the three launches"
    );
    assert!(h.tracker.is_quiescent());
}

/// A stream with a marker at every launch retires a period's markers at once; later launches
/// record those again ([`Timeline::rerecord_at_launch`]) instead of taking new ones, and every
/// marker goes back to the timeline once, when the tracker is dropped.
#[test]
fn completed_markers_are_recorded_again_by_later_launches() {
    markers_kept_then_recorded_again(10, 15, 10);
}

/// `first` launches with a marker each (a launch-only timeline), all completed; then `second`
/// more. The tracker keeps `kept` of the first markers (the rest go back at once) and records
/// them again for the second launches; each marker made goes back once, when the tracker is
/// dropped.
fn markers_kept_then_recorded_again(first: u64, second: u64, kept: u64) {
    let fake = FakeTimeline::new();
    fake.set_launch_only(true);
    let h = Harness::with_fake(fake, config(64));
    for _ in 0..first {
        h.launch_deferred(1);
    }
    let calls = h.fake.calls();
    assert_eq!(
        (calls.record, calls.rerecord),
        (first, 0),
        "nothing to reuse yet"
    );
    h.fake.complete_through(first);
    h.tracker.synchronize().unwrap();
    assert_eq!(h.dropped() as u64, first);
    assert_eq!(
        h.fake.calls().recycle,
        first - kept,
        "all but the spares go back"
    );
    for _ in 0..second {
        h.launch_deferred(1);
    }
    let reused = kept.min(second);
    let calls = h.fake.calls();
    assert_eq!(
        (calls.record, calls.rerecord),
        (first + second, reused),
        "the spares first, then new markers"
    );
    h.fake.complete_through(first + second);
    h.tracker.synchronize().unwrap();
    h.assert_sound();
    let Harness { fake, tracker, .. } = h;
    drop(tracker);
    let calls = fake.calls();
    assert_eq!(
        calls.recycle,
        first + second - reused,
        "each marker made, back once"
    );
    assert_eq!(calls.recycle + calls.rerecord, fake.markers_recorded());
}

/// What the recycle hook of [`recycled_vectors_come_back_empty_after_their_guards`] received:
/// each vector's capacity and length, and how many guards had been dropped by then.
static RECYCLED: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());
static RECYCLE_LOG: OnceLock<Arc<Mutex<Vec<DropRecord>>>> = OnceLock::new();

fn recycle_hook(v: Vec<Guard>) {
    let dropped = RECYCLE_LOG.get().map_or(0, |l| l.lock().unwrap().len());
    RECYCLED
        .lock()
        .unwrap()
        .push((v.capacity(), v.len(), dropped));
}

#[test]
fn recycled_vectors_come_back_empty_after_their_guards() {
    let fake = FakeTimeline::new();
    let h = Harness {
        tracker: Tracker::recycle_with(fake.clone(), config(1), recycle_hook),
        fake,
        log: Arc::default(),
        next_launch: AtomicU64::new(0),
    };
    RECYCLE_LOG.set(Arc::clone(&h.log)).unwrap();
    // A retired handle, then two deferred launches released by a poll.
    let handle = h.launch(3);
    assert!(
        RECYCLED.lock().unwrap().is_empty(),
        "nothing recycled before release"
    );
    handle.retire().unwrap();
    assert_eq!(*RECYCLED.lock().unwrap(), vec![(3, 0, 3)]);
    h.launch_deferred(2);
    h.launch_deferred(4);
    assert_eq!(
        RECYCLED.lock().unwrap().len(),
        1,
        "deferred launches are still pending"
    );
    h.fake.complete_all();
    h.tracker.poll();
    // Each vector reaches the hook empty, with its buffer, once every guard it held (in launch
    // order) was dropped.
    assert_eq!(
        *RECYCLED.lock().unwrap(),
        vec![(3, 0, 3), (2, 0, 5), (4, 0, 9)]
    );
    // A failed enqueue releases its guards at once and recycles their vector too.
    let (_, _, guards) = h.guards(2);
    let err = h
        .tracker
        .launch_deferred(guards, 200, || Err::<(), &str>("refused"))
        .unwrap_err();
    assert_eq!(err, "refused");
    assert_eq!(RECYCLED.lock().unwrap().last(), Some(&(2, 0, 11)));
    // A launch of no guards has no buffer: nothing to recycle.
    h.launch_deferred(0);
    h.fake.complete_all();
    h.tracker.poll();
    assert_eq!(RECYCLED.lock().unwrap().len(), 4);
    h.assert_sound();
    assert_eq!(h.stats().guards_released, 11);
}

// ---- Barriers and releases in flight on another thread ----

/// A deleter that, once dropped, says so and blocks until the test lets it go: holds a release
/// batch in flight on the thread that dropped it.
struct Gate {
    entered: mpsc::Receiver<()>,
    go: mpsc::Sender<()>,
}

fn gate() -> (Gate, OnDrop) {
    let (entered_tx, entered) = mpsc::channel();
    let (go, go_rx) = mpsc::channel::<()>();
    let on_drop: OnDrop = Box::new(move || {
        entered_tx.send(()).unwrap();
        // Returns when the test says go, or when it gives up (the sender dropped).
        let _ = go_rx.recv();
    });
    (Gate { entered, go }, on_drop)
}

/// Queues one launch of `n` guards whose first guard blocks in its drop, completes it, and
/// starts a thread that polls (taking the launch's guards off the queue and blocking in the
/// first drop). Returns when that thread is inside the drop.
fn release_blocked_on_another_thread(
    h: &Arc<Harness>,
    n: usize,
) -> (Gate, thread::JoinHandle<usize>) {
    let (_, work, mut guards) = h.guards(n);
    let (gate, on_drop) = gate();
    guards[0].on_drop = Some(on_drop);
    let fake = h.fake.clone();
    h.tracker
        .launch_deferred(guards, 100, move || {
            work.set(fake.enqueue()).unwrap();
            Ok::<(), Infallible>(())
        })
        .unwrap();
    h.fake.complete_all();
    let releaser = {
        let h = Arc::clone(h);
        thread::spawn(move || h.tracker.poll())
    };
    gate.entered
        .recv_timeout(Duration::from_secs(20))
        .expect("the releasing thread never reached the deleter");
    (gate, releaser)
}

/// Runs `barrier` on a thread of its own; returns a receiver of how many guards had been dropped
/// when it returned.
fn barrier_on_a_thread(
    h: &Arc<Harness>,
    barrier: impl FnOnce(&Harness) + Send + 'static,
) -> (mpsc::Receiver<usize>, thread::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let h = Arc::clone(h);
    let t = thread::spawn(move || {
        barrier(&h);
        tx.send(h.dropped()).unwrap();
    });
    (rx, t)
}

/// With a launch of `n` guards released on another thread, blocked in its first deleter, and
/// `total` guards in that thread's batch: the barrier must still be waiting while the deleter
/// is held, and return once it is let go, with every guard of the batch dropped.
fn assert_barrier_waits(
    h: &Arc<Harness>,
    n: usize,
    total: usize,
    barrier: impl FnOnce(&Harness) + Send + 'static,
) {
    let (gate, releaser) = release_blocked_on_another_thread(h, n);
    let (done, barrier) = barrier_on_a_thread(h, barrier);
    match done.recv_timeout(Duration::from_millis(300)) {
        Err(mpsc::RecvTimeoutError::Timeout) => {}
        Ok(dropped) => panic!(
            "the barrier returned while another thread was still releasing: {dropped} of {total} \
             guards dropped"
        ),
        Err(e) => panic!("the barrier's thread died: {e}"),
    }
    gate.go.send(()).unwrap();
    let dropped = done
        .recv_timeout(Duration::from_secs(20))
        .expect("the barrier did not return once the release finished");
    assert_eq!(dropped, total, "guards dropped when the barrier returned");
    barrier.join().unwrap();
    assert_eq!(releaser.join().unwrap(), total);
    h.assert_sound();
    let stats = h.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.releasing_guards,
            stats.pending_guards
        ),
        (total as u64, 0, 0)
    );
}

#[test]
fn synchronize_waits_for_a_release_in_flight_on_another_thread() {
    let h = Arc::new(Harness::new(config(64)));
    assert_barrier_waits(&h, 4, 4, |h| h.tracker.synchronize().unwrap());
}

#[test]
fn shutdown_with_nothing_queued_waits_for_a_release_in_flight() {
    let h = Arc::new(Harness::new(config(64)));
    assert_barrier_waits(&h, 3, 3, |h| h.tracker.shutdown());
}

#[test]
fn queued_wait_waits_for_its_guards_released_on_another_thread() {
    let h = Arc::new(Harness::new(config(64)));
    let queued = h.launch_queued(2);
    let seq = queued.seq();
    // Taken off the queue by the blocked release below, with its own launch.
    assert_barrier_waits(&h, 3, 5, move |_| {
        let released_here = queued.wait().unwrap();
        assert_eq!(
            released_here, 0,
            "launch #{seq} was released by the other thread"
        );
    });
    assert_eq!(h.dropped(), 5);
}

#[test]
fn stats_count_guards_being_released_on_another_thread() {
    let h = Arc::new(Harness::new(config(64)));
    let (gate, releaser) = release_blocked_on_another_thread(&h, 5);
    let stats = h.stats();
    // Off the queue, not yet released: counted as being released, not lost from view.
    assert_eq!(
        (
            stats.pending_guards,
            stats.held_guards,
            stats.releasing_guards,
            stats.guards_released
        ),
        (0, 0, 5, 0)
    );
    assert!(!h.tracker.is_quiescent(), "quiescent while releasing");
    gate.go.send(()).unwrap();
    assert_eq!(releaser.join().unwrap(), 5);
    let stats = h.stats();
    assert_eq!((stats.releasing_guards, stats.guards_released), (0, 5));
    assert!(h.tracker.is_quiescent());
}

#[test]
fn try_release_says_not_yet_while_another_thread_releases_its_guards() {
    let h = Arc::new(Harness::new(config(64)));
    let queued = h.launch_queued(1);
    let (gate, releaser) = release_blocked_on_another_thread(&h, 2);
    assert_eq!(queued.try_release().unwrap(), None);
    gate.go.send(()).unwrap();
    releaser.join().unwrap();
    assert_eq!(queued.try_release().unwrap(), Some(0));
    assert_eq!(h.dropped(), 3);
}

/// A barrier called from inside a deleter returns (it does not wait for its own batch), even
/// when two threads are each inside a deleter of a batch of queued launches and each calls a
/// barrier: waiting for each other's batch would deadlock.
#[test]
fn a_barrier_inside_a_deleter_does_not_wait_for_itself_or_a_crossing_one() {
    let (done_tx, done_rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let h = Arc::new(Harness::new(config(1)));
        let weak: Weak<Tr> = Arc::downgrade(&h.tracker);
        // Two batches, each with a deleter that waits until both are inside, then synchronizes.
        let both_inside = Arc::new(std::sync::Barrier::new(2));
        let mut pollers = Vec::new();
        for _ in 0..2 {
            let (_, work, mut guards) = h.guards(2);
            let (weak, both_inside) = (weak.clone(), Arc::clone(&both_inside));
            guards[0].on_drop = Some(Box::new(move || {
                both_inside.wait();
                let tracker = weak.upgrade().expect("tracker alive");
                tracker.synchronize().unwrap();
                tracker.shutdown();
            }));
            let fake = h.fake.clone();
            h.tracker
                .launch_deferred(guards, 1, move || {
                    work.set(fake.enqueue()).unwrap();
                    Ok::<(), Infallible>(())
                })
                .unwrap();
            h.fake.complete_all();
            // Each batch taken off the queue by a poll on a thread of its own: the first is
            // blocked in its deleter (waiting for the second) when the second poll runs.
            let h2 = Arc::clone(&h);
            pollers.push(thread::spawn(move || h2.tracker.poll()));
            while h.stats().pending_guards > 0 {
                thread::yield_now();
            }
        }
        let released: Vec<usize> = pollers.into_iter().map(|p| p.join().unwrap()).collect();
        h.tracker.synchronize().unwrap();
        done_tx.send((released, h.dropped())).unwrap();
        h.assert_sound();
    });
    let (released, dropped) = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("deadlock: a barrier inside a deleter waited for a release in flight");
    worker.join().unwrap();
    assert_eq!(released, vec![2, 2]);
    assert_eq!(dropped, 4);
}

#[test]
fn a_poll_asks_the_newest_marker_first_and_the_oldest_only_when_it_is_not_complete() {
    // A marker per launch (as on a launch-only handle): markers complete in stream order, so the
    // newest complete answers for every older one with one query.
    let h = Harness::new(ReleaseConfig {
        marker_every: 1,
        poll_every: 1_000,
        ..ReleaseConfig::default()
    });
    for _ in 0..16 {
        h.launch(1).defer();
    }
    assert_eq!(h.fake.markers_recorded(), 16);
    h.fake.complete_all();
    let before = h.fake.calls().query;
    assert_eq!(h.tracker.poll(), 16);
    assert_eq!(h.fake.calls().query - before, 1, "one query for 16 markers");
    assert_eq!(h.dropped(), 16);
    h.assert_sound();

    // The newest not complete: the oldest are asked, in order, and what they cover released,
    // never what comes after the first one still running.
    for _ in 0..8 {
        h.launch(1).defer();
    }
    h.fake.complete_through(h.fake.markers_recorded() - 5);
    let before = h.fake.calls().query;
    assert_eq!(h.tracker.poll(), 3);
    assert_eq!(
        h.fake.calls().query - before,
        1 + 4,
        "the newest, then the oldest four"
    );
    assert_eq!(h.stats().pending_guards, 5);
    h.assert_sound();
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 5);
    assert_eq!(h.dropped(), 24);
    h.assert_sound();
}

/// The tracker keeps at most 256 retired markers to record again; the rest go back to the
/// timeline at once, and the spares go back when the tracker is dropped.
#[test]
fn at_most_256_completed_markers_are_kept_as_spares() {
    markers_kept_then_recorded_again(300, 300, 256);
}

/// A spare whose re-record fails (here an injected failure) stays a spare: the next marker
/// records it again, no marker is made or given back for the failure, and the error is counted.
#[test]
fn a_failed_rerecord_keeps_the_spare() {
    let h = Harness::new(config(1));
    h.launch_deferred(1);
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 1);
    assert_eq!(h.fake.markers_recorded(), 1);
    h.fake.fail_next(FakeOp::Record, 1);
    h.launch_deferred(1);
    let calls = h.fake.calls();
    assert_eq!(
        (calls.record, calls.rerecord, calls.recycle),
        (2, 0, 0),
        "one failed attempt on the spare"
    );
    assert_eq!(h.stats().errors, 1);
    assert_eq!(h.fake.markers_recorded(), 1);
    h.launch_deferred(1);
    let calls = h.fake.calls();
    assert_eq!((calls.record, calls.rerecord, calls.recycle), (3, 1, 0));
    assert_eq!(h.fake.markers_recorded(), 2);
    // The re-recorded marker covers both queued launches: the second's work alone does not
    // complete it.
    h.fake.complete_work(2);
    assert_eq!(
        h.tracker.poll(),
        0,
        "the marker covers the third launch's work"
    );
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 2);
    h.assert_sound();
    let Harness { fake, tracker, .. } = h;
    drop(tracker);
    let calls = fake.calls();
    assert_eq!(calls.recycle, 1, "one marker made, back once");
    assert_eq!(calls.recycle + calls.rerecord, fake.markers_recorded());
}

/// A lost stream gives its spares back with its outstanding markers, at once (not only when the
/// tracker is dropped), and none is given back twice.
#[test]
fn a_lost_stream_gives_its_spares_back_at_once() {
    let h = Harness::new(config(1));
    for _ in 0..3 {
        h.launch_deferred(1);
    }
    h.fake.complete_all();
    assert_eq!(h.tracker.poll(), 3);
    assert_eq!(h.fake.markers_recorded(), 3);
    assert_eq!(h.fake.calls().recycle, 0, "three spares");
    h.launch_deferred(1);
    assert_eq!(
        h.fake.calls().rerecord,
        1,
        "one spare recorded again, two left"
    );
    h.fake.lose();
    assert_eq!(h.tracker.poll(), 0);
    assert_eq!(h.stats().guards_leaked, 1);
    let calls = h.fake.calls();
    assert_eq!(
        calls.recycle, 3,
        "the outstanding marker and the two spares"
    );
    assert_eq!(calls.recycle + calls.rerecord, h.fake.markers_recorded());
    let Harness { fake, tracker, .. } = h;
    drop(tracker);
    assert_eq!(fake.calls().recycle, 3, "nothing given back twice");
}

/// A [`FakeTimeline`] that sees which markers are being waited for, can hold a wait until the
/// test lets it go, and notes every marker recorded again that was waited on or not complete.
#[derive(Clone)]
struct Watched {
    fake: FakeTimeline,
    watch: Arc<Watch>,
}

#[derive(Default)]
struct Watch {
    /// Ids of the markers inside `wait` now.
    waiting: Mutex<Vec<u64>>,
    /// When set, `wait` says so on the first sender and blocks on the receiver.
    gate: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
    /// Ids of the markers recorded again, in order (before they were).
    rerecorded: Mutex<Vec<u64>>,
    /// Markers recorded again while waited on, or before they completed.
    misused: AtomicU64,
}

impl Watched {
    fn check(&self, marker: &tile_launch::release::fake::FakeMarker) {
        let id = marker.id();
        if self.watch.waiting.lock().unwrap().contains(&id) || !self.fake.is_marker_complete(id) {
            self.watch.misused.fetch_add(1, Ordering::SeqCst);
        }
        self.watch.rerecorded.lock().unwrap().push(id);
    }
}

impl tile_launch::release::Timeline for Watched {
    type Marker = tile_launch::release::fake::FakeMarker;
    type Error = FakeError;

    fn record(&self) -> Result<Self::Marker, FakeError> {
        self.fake.record()
    }

    fn record_at_launch(&self) -> Result<Self::Marker, FakeError> {
        self.fake.record_at_launch()
    }

    fn rerecord(&self, marker: &mut Self::Marker) -> Result<(), FakeError> {
        self.check(marker);
        self.fake.rerecord(marker)
    }

    fn rerecord_at_launch(&self, marker: &mut Self::Marker) -> Result<(), FakeError> {
        self.check(marker);
        self.fake.rerecord_at_launch(marker)
    }

    fn query(&self, marker: &Self::Marker) -> Result<bool, FakeError> {
        self.fake.query(marker)
    }

    fn wait(&self, marker: &Self::Marker) -> Result<(), FakeError> {
        self.watch.waiting.lock().unwrap().push(marker.id());
        if let Some((entered, gate)) = self.watch.gate.lock().unwrap().take() {
            entered.send(()).unwrap();
            gate.recv().unwrap();
        }
        let r = self.fake.wait(marker);
        let mut waiting = self.watch.waiting.lock().unwrap();
        let i = waiting.iter().position(|&id| id == marker.id()).unwrap();
        waiting.swap_remove(i);
        r
    }

    fn synchronize(&self) -> Result<(), FakeError> {
        self.fake.synchronize()
    }

    fn recycle(&self, marker: Self::Marker) {
        self.fake.recycle(marker);
    }

    fn is_lost(&self, error: &FakeError) -> bool {
        self.fake.is_lost(error)
    }
}

/// A marker that a waiter (a handle's retire on another thread) refers to is retired by another
/// thread's poll: it is not recorded again while the waiter waits on it, only once the waiter
/// has let go of it; every marker recorded again had completed.
#[test]
fn a_marker_being_waited_on_is_not_recorded_again_until_the_waiter_lets_go() {
    let fake = FakeTimeline::new();
    let watched = Watched {
        fake: fake.clone(),
        watch: Arc::default(),
    };
    let tracker: Arc<Tracker<Watched, u32>> = Tracker::new(watched.clone(), config(1));
    let launch = |defer: bool| {
        let f = fake.clone();
        let enqueue = move || {
            f.enqueue();
            Ok::<(), Infallible>(())
        };
        if defer {
            tracker.launch_deferred(vec![1], 100, enqueue).unwrap();
            None
        } else {
            Some(tracker.launch(vec![0], 100, enqueue).unwrap())
        }
    };
    let handle = launch(false).unwrap();
    launch(true);
    launch(true);
    assert_eq!(
        fake.markers_recorded(),
        2,
        "marker 1 covers the handle's launch"
    );
    let (entered_tx, entered) = mpsc::channel();
    let (open, gate) = mpsc::channel();
    *watched.watch.gate.lock().unwrap() = Some((entered_tx, gate));
    let waiter = thread::spawn(move || handle.retire().map(|r| r.released));
    entered.recv().unwrap();
    assert_eq!(*watched.watch.waiting.lock().unwrap(), vec![1]);
    // Another thread's poll finds everything complete and retires both markers.
    fake.complete_all();
    assert_eq!(tracker.poll(), 2);
    // Later launches take the free spare (marker 2), then make new ones: never marker 1.
    for _ in 0..4 {
        launch(true);
        fake.complete_all();
        assert_eq!(tracker.poll(), 1);
    }
    assert!(!watched.watch.rerecorded.lock().unwrap().contains(&1));
    assert!(fake.calls().rerecord >= 1);
    open.send(()).unwrap();
    assert_eq!(waiter.join().unwrap().unwrap(), 1);
    // Let go of, marker 1 is a spare now, and recorded again by a later launch.
    for _ in 0..4 {
        launch(true);
        fake.complete_all();
        assert_eq!(tracker.poll(), 1);
    }
    assert!(watched.watch.rerecorded.lock().unwrap().contains(&1));
    assert_eq!(watched.watch.misused.load(Ordering::SeqCst), 0);
    assert_eq!(tracker.last_error(), None);
    drop(tracker);
    let calls = fake.calls();
    assert_eq!(calls.recycle + calls.rerecord, fake.markers_recorded());
}

/// A [`FakeTimeline`] that keeps [`Timeline::rerecord`](tile_launch::release::Timeline)'s
/// default: a fresh marker, the old one recycled.
struct Plain(FakeTimeline);

impl tile_launch::release::Timeline for Plain {
    type Marker = tile_launch::release::fake::FakeMarker;
    type Error = FakeError;

    fn record(&self) -> Result<Self::Marker, FakeError> {
        self.0.record()
    }

    fn query(&self, marker: &Self::Marker) -> Result<bool, FakeError> {
        self.0.query(marker)
    }

    fn wait(&self, marker: &Self::Marker) -> Result<(), FakeError> {
        self.0.wait(marker)
    }

    fn synchronize(&self) -> Result<(), FakeError> {
        self.0.synchronize()
    }

    fn recycle(&self, marker: Self::Marker) {
        self.0.recycle(marker);
    }
}

/// A timeline that does not record a marker again itself gets the default: the tracker's spare
/// is replaced by a fresh marker and the old one recycled at once (a failed record recycles
/// nothing and keeps the spare), so every marker still goes back to the timeline once.
#[test]
fn the_default_rerecord_records_afresh_and_recycles_the_spare() {
    let fake = FakeTimeline::new();
    let tracker: Arc<Tracker<Plain, u32>> = Tracker::new(Plain(fake.clone()), config(1));
    let launch = || {
        let f = fake.clone();
        tracker
            .launch_deferred(vec![0], 100, move || {
                f.enqueue();
                Ok::<(), Infallible>(())
            })
            .unwrap();
    };
    launch();
    fake.complete_all();
    assert_eq!(tracker.poll(), 1);
    assert_eq!(fake.calls().recycle, 0, "kept as a spare");
    fake.fail_next(FakeOp::Record, 1);
    launch();
    assert_eq!((fake.calls().record, fake.calls().recycle), (2, 0));
    launch();
    let calls = fake.calls();
    assert_eq!(
        (calls.record, calls.rerecord, calls.recycle),
        (3, 0, 1),
        "a fresh marker, the spare recycled"
    );
    assert_eq!(fake.markers_recorded(), 2);
    fake.complete_all();
    assert_eq!(tracker.poll(), 2);
    drop(tracker);
    assert_eq!(fake.calls().recycle, fake.markers_recorded());
}
