//! Faults injected into the release path on the CPU (no GPU): deleters that block, deleters that
//! call back into the tracker to synchronise or shut it down, a deleter whose panic payload
//! panics again when dropped, and real DLPack tensors (`tile_dlpack::Used`, counting deleter)
//! as guards. `release_queue.rs` covers the plain panicking deleter and a deleter that polls and
//! launches from inside its drop; these are the cases it does not.
//!
//! Every wait here is bounded: a test that would deadlock fails on a timeout instead.

use std::convert::Infallible;
use std::panic;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread;
use std::time::Duration;

use tile_dlpack::testing::{DeleterCount, TensorSpec, counted_tensor};
use tile_dlpack::{DType, Used};
use tile_launch::release::fake::FakeTimeline;
use tile_launch::release::{Pending, ReleaseConfig, Tracker};

/// How long a test waits for something that must happen promptly before declaring a deadlock.
const BOUND: Duration = Duration::from_secs(20);

type OnDrop = Box<dyn FnOnce() + Send>;

/// A guard whose drop records whether its launch's work had completed, then runs `on_drop`.
struct Guard {
    id: u32,
    work: Arc<OnceLock<u64>>,
    fake: FakeTimeline,
    log: Arc<Mutex<Vec<(u32, bool)>>>,
    on_drop: Option<OnDrop>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let complete = self
            .work
            .get()
            .is_some_and(|&w| self.fake.is_work_complete(w));
        self.log.lock().unwrap().push((self.id, complete));
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

type Tr = Tracker<FakeTimeline, Guard>;

struct Harness {
    fake: FakeTimeline,
    tracker: Arc<Tr>,
    log: Arc<Mutex<Vec<(u32, bool)>>>,
}

impl Harness {
    fn new() -> Self {
        let fake = FakeTimeline::new();
        let config = ReleaseConfig {
            marker_every: 1,
            ..ReleaseConfig::default()
        };
        Self {
            tracker: Tracker::new(fake.clone(), config),
            fake,
            log: Arc::default(),
        }
    }

    fn launch_with(&self, id: u32, on_drop: Option<OnDrop>) -> Pending<FakeTimeline, Guard> {
        launch_on(&self.tracker, &self.fake, &self.log, id, on_drop)
    }

    /// Every guard dropped once, after its work, and exactly the guards `ids`.
    fn assert_dropped(&self, ids: &[u32]) {
        let mut drops = self.log.lock().unwrap().clone();
        assert!(drops.iter().all(|&(_, c)| c), "released early: {drops:?}");
        drops.sort_unstable();
        let want: Vec<_> = ids.iter().map(|&id| (id, true)).collect();
        assert_eq!(drops, want);
    }
}

fn launch_on(
    tracker: &Arc<Tr>,
    fake: &FakeTimeline,
    log: &Arc<Mutex<Vec<(u32, bool)>>>,
    id: u32,
    on_drop: Option<OnDrop>,
) -> Pending<FakeTimeline, Guard> {
    let work = Arc::new(OnceLock::new());
    let guard = Guard {
        id,
        work: Arc::clone(&work),
        fake: fake.clone(),
        log: Arc::clone(log),
        on_drop,
    };
    let fake = fake.clone();
    tracker
        .launch(vec![guard], 8, move || {
            work.set(fake.enqueue()).unwrap();
            Ok::<(), Infallible>(())
        })
        .unwrap()
}

/// A deleter that blocks until `release` is sent; tells `entered` when it starts blocking.
fn blocking_deleter(entered: Sender<()>, release: Receiver<()>) -> OnDrop {
    Box::new(move || {
        entered.send(()).unwrap();
        release
            .recv_timeout(BOUND)
            .expect("the test never unblocked the deleter");
    })
}

/// A deleter blocks inside `retire` on one thread. The tracker's lock is not held while guards
/// are dropped, so another thread can still launch, defer, poll, retire, synchronise and read
/// the counters on the same stream, and the blocked release completes once the deleter returns.
#[test]
fn a_blocking_deleter_does_not_stop_other_launches() {
    let h = Arc::new(Harness::new());
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let slow = h.launch_with(0, Some(blocking_deleter(entered_tx, release_rx)));
    let retirer = thread::spawn(move || slow.retire().unwrap());
    entered_rx
        .recv_timeout(BOUND)
        .expect("the blocking deleter never ran");

    // The deleter is blocked inside the release; everything else on the tracker proceeds.
    let (done_tx, done_rx) = mpsc::channel();
    let other = {
        let h = Arc::clone(&h);
        thread::spawn(move || {
            for id in 1..=20 {
                let handle = h.launch_with(id, None);
                if id % 2 == 0 {
                    handle.retire().unwrap();
                } else {
                    handle.defer();
                }
                h.tracker.poll();
            }
            h.tracker.synchronize().unwrap();
            let stats = h.tracker.stats();
            done_tx.send(stats).unwrap();
        })
    };
    let stats = match done_rx.recv_timeout(BOUND) {
        Ok(stats) => stats,
        Err(RecvTimeoutError::Disconnected) => panic!("launcher failed: {:?}", other.join()),
        Err(RecvTimeoutError::Timeout) => panic!("launches stalled behind a blocking deleter"),
    };
    other.join().unwrap();
    assert_eq!(stats.pending_guards, 0);
    // The blocked guard is out of every count but `released`, which it joins when it returns.
    assert_eq!(stats.guards_released, 20);

    release_tx.send(()).unwrap();
    let retired = retirer.join().unwrap();
    assert_eq!(retired.released, 1);
    h.assert_dropped(&(0..=20).collect::<Vec<_>>());
    assert_eq!(h.tracker.stats().guards_released, 21);
}

/// A deleter that blocks while the queue is drained by `poll` on the caller's thread: a second
/// thread's `poll` and `launch` are not held up by it, and the guard released by the second
/// thread is still released exactly once.
#[test]
fn a_blocking_deleter_in_poll_does_not_hold_the_queue() {
    let h = Arc::new(Harness::new());
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    h.launch_with(0, Some(blocking_deleter(entered_tx, release_rx)))
        .defer();
    h.fake.complete_all();
    let poller = {
        let h = Arc::clone(&h);
        thread::spawn(move || h.tracker.poll())
    };
    entered_rx.recv_timeout(BOUND).expect("deleter never ran");

    let (done_tx, done_rx) = mpsc::channel();
    let other = {
        let h = Arc::clone(&h);
        thread::spawn(move || {
            h.launch_with(1, None).defer();
            h.fake.complete_all();
            let released = h.tracker.poll();
            done_tx.send(released).unwrap();
        })
    };
    let released = done_rx
        .recv_timeout(BOUND)
        .expect("poll stalled behind a blocking deleter");
    other.join().unwrap();
    assert_eq!(
        released, 1,
        "the second launch is released by the second poll"
    );
    release_tx.send(()).unwrap();
    assert_eq!(poller.join().unwrap(), 1);
    h.assert_dropped(&[0, 1]);
}

/// Deleters that call back into the tracker with the blocking entry points: one synchronises
/// (which releases the queued launch from inside the first release), one shuts the tracker
/// down, one retires another launch's handle. Nothing deadlocks, and every guard is released
/// exactly once, after its work.
#[test]
fn deleters_that_synchronize_shut_down_and_retire_from_inside_a_release() {
    let (done_tx, done_rx) = mpsc::channel();
    let worker = thread::spawn(move || {
        let h = Harness::new();
        let weak: Weak<Tr> = Arc::downgrade(&h.tracker);

        // Launch 3 is queued; the deleter of launch 0 synchronises, which releases it.
        let sync_inside: OnDrop = {
            let weak = weak.clone();
            Box::new(move || {
                let tracker = weak.upgrade().unwrap();
                tracker.synchronize().unwrap();
            })
        };
        // The deleter of launch 1 shuts the tracker down.
        let shutdown_inside: OnDrop = {
            let weak = weak.clone();
            Box::new(move || weak.upgrade().unwrap().shutdown())
        };
        // The deleter of launch 2 retires launch 4's handle, which it owns.
        let handle4 = Arc::new(Mutex::new(None::<Pending<FakeTimeline, Guard>>));
        let retire_inside: OnDrop = {
            let handle4 = Arc::clone(&handle4);
            Box::new(move || {
                let handle = handle4.lock().unwrap().take().unwrap();
                assert_eq!(handle.retire().unwrap().released, 1);
            })
        };

        let h0 = h.launch_with(0, Some(sync_inside));
        let h1 = h.launch_with(1, Some(shutdown_inside));
        let h2 = h.launch_with(2, Some(retire_inside));
        h.launch_with(3, None).defer();
        *handle4.lock().unwrap() = Some(h.launch_with(4, None));
        h.launch_with(5, None).defer();

        h0.retire().unwrap();
        h1.defer();
        h2.retire().unwrap();
        h.tracker.synchronize().unwrap();
        h.assert_dropped(&[0, 1, 2, 3, 4, 5]);
        let stats = h.tracker.stats();
        done_tx
            .send((
                stats.guards_released,
                stats.guards_leaked,
                stats.pending_guards,
                stats.held_guards,
            ))
            .unwrap();
    });
    let counts = match done_rx.recv_timeout(BOUND) {
        Ok(counts) => counts,
        Err(RecvTimeoutError::Disconnected) => panic!("worker failed: {:?}", worker.join()),
        Err(RecvTimeoutError::Timeout) => {
            panic!("deadlock: a deleter called back into the tracker")
        }
    };
    worker.join().unwrap();
    assert_eq!(counts, (6, 0, 0, 0));
}

/// A value that panics when dropped, used as a panic payload.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("the panic payload panicked on drop");
    }
}

/// A deleter panics with a payload whose own drop panics: the release queue catches both
/// (the second payload is forgotten), counts one release panic, and goes on releasing.
#[test]
fn a_panic_payload_that_panics_on_drop_is_contained() {
    let h = Harness::new();
    let handle = h.launch_with(0, Some(Box::new(|| panic::panic_any(PanicsOnDrop))));
    h.launch_with(1, None).defer();
    let retired = handle.retire().unwrap();
    assert_eq!((retired.released, retired.deferred_released), (1, 1));
    let stats = h.tracker.stats();
    assert_eq!(
        (
            stats.guards_released,
            stats.release_panics,
            stats.guards_leaked
        ),
        (2, 1, 0)
    );
    h.launch_with(2, None).retire().unwrap();
    h.assert_dropped(&[0, 1, 2]);
}

/// Real DLPack tensors as guards: a consumed `tile_dlpack::Used` with a counting deleter. Its
/// deleter has not run while the launch is pending (however often the queue is polled), and
/// has run exactly once after completion; on a launch whose enqueue fails, exactly once before
/// `launch` returns.
#[test]
fn dlpack_deleters_run_once_after_completion() {
    let fake = FakeTimeline::new();
    let tracker: Arc<Tracker<FakeTimeline, Used>> =
        Tracker::new(fake.clone(), ReleaseConfig::default());
    let consume = |shape: &[i64]| -> (Used, DeleterCount) {
        let (unused, count) = counted_tensor(&TensorSpec::new(shape, DType::F32));
        (unused.consume().unwrap(), count)
    };

    let (a, count_a) = consume(&[4, 4]);
    let (b, count_b) = consume(&[16]);
    let bytes = a.view().nbytes_spanned() + b.view().nbytes_spanned();
    let enqueuer = fake.clone();
    tracker
        .launch(vec![a, b], bytes, move || {
            enqueuer.enqueue();
            Ok::<(), Infallible>(())
        })
        .unwrap()
        .defer();
    for _ in 0..1000 {
        tracker.poll();
    }
    assert_eq!((count_a.get(), count_b.get()), (0, 0));

    let (c, count_c) = consume(&[2]);
    let refused = tracker.launch(vec![c], 8, || Err("invalid configuration"));
    assert!(refused.is_err());
    assert_eq!(count_c.get(), 1, "a refused launch releases at once");
    assert_eq!((count_a.get(), count_b.get()), (0, 0));

    fake.complete_all();
    assert_eq!(tracker.poll(), 2);
    assert_eq!((count_a.get(), count_b.get(), count_c.get()), (1, 1, 1));
    tracker.synchronize().unwrap();
    assert_eq!((count_a.get(), count_b.get(), count_c.get()), (1, 1, 1));
}
