//! `loom` models of the release queue. In each, threads launch, defer, retire, poll, drop handles
//! and shut down while another thread plays the GPU and completes the fake's work; whatever the
//! interleaving, every guard is released at most once, never before its work has completed,
//! and, once the model has quiesced, exactly once (or counted as leaked where completion could
//! not be confirmed).
//!
//! Run with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p tile-launch --release --test release_loom -- --nocapture`;
//! each model prints how many interleavings it explored. `LOOM_MAX_PREEMPTIONS` (default here:
//! 3) bounds the preemptions per interleaving.
//!
//! The graph-capture hand-off is modelled too: user-object destructors (run by CUDA on its own
//! threads) hand parcels of guards to the release thread while the releaser goes away. loom's
//! channel models neither a disconnected channel nor a message left unreceived, so the case of a
//! parcel arriving after the release thread is gone is tested on the CPU instead
//! (`tests/capture_handoff.rs`).

#![cfg(loom)]

use std::sync::Arc;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;

use loom::sync::Mutex;
use loom::sync::atomic::{AtomicU64, Ordering};
use tile_launch::release::fake::{FakeOp, FakeTimeline};
use tile_launch::release::{ReleaseConfig, Tracker};

/// Runs `model` under loom (preemption bound 3 unless `LOOM_MAX_PREEMPTIONS` says otherwise),
/// prints how many interleavings were explored, and returns that number.
fn explore(name: &str, model: impl Fn() + Sync + Send + 'static) -> usize {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    let iterations = Arc::new(StdAtomicUsize::new(0));
    let counter = Arc::clone(&iterations);
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        model();
    });
    let explored = iterations.load(std::sync::atomic::Ordering::Relaxed);
    println!("loom: {name}: explored {explored} interleavings");
    assert!(explored > 1, "{name}: loom explored a single interleaving");
    explored
}

type Log = Arc<Mutex<Vec<(usize, bool)>>>;

/// Checks the drop log: no guard dropped before its work completed, none twice, and exactly the
/// guards `ids` dropped.
fn assert_dropped(log: &Log, ids: &[usize]) {
    let mut drops = log.lock().unwrap().clone();
    assert!(
        drops.iter().all(|&(_, complete)| complete),
        "released early: {drops:?}"
    );
    drops.sort_unstable();
    let want: Vec<(usize, bool)> = ids.iter().map(|&id| (id, true)).collect();
    assert_eq!(drops, want, "released other than exactly once");
}

/// Plays the GPU: waits (yielding to loom) until `launches` units of work were enqueued, then
/// completes them all.
fn complete_after(fake: &FakeTimeline, launches: u64) {
    while fake.enqueued() < launches {
        loom::thread::yield_now();
    }
    fake.complete_all();
}

struct Guard {
    id: usize,
    /// The fake's unit of work of the launch; 0 until enqueued.
    work: Arc<AtomicU64>,
    fake: FakeTimeline,
    log: Arc<Mutex<Vec<(usize, bool)>>>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let work = self.work.load(Ordering::SeqCst);
        let complete = work == 0 || self.fake.is_work_complete(work);
        self.log.lock().unwrap().push((self.id, complete));
    }
}

type Tr = Tracker<FakeTimeline, Guard>;

/// A guard for launch `id` and the `enqueue` that records its unit of work on the fake.
fn guard_and_enqueue(
    fake: &FakeTimeline,
    log: &Arc<Mutex<Vec<(usize, bool)>>>,
    id: usize,
) -> (Guard, impl FnOnce() -> Result<(), ()> + use<>) {
    let work = Arc::new(AtomicU64::new(0));
    let guard = Guard {
        id,
        work: Arc::clone(&work),
        fake: fake.clone(),
        log: Arc::clone(log),
    };
    let fake = fake.clone();
    (guard, move || {
        work.store(fake.enqueue(), Ordering::SeqCst);
        Ok(())
    })
}

fn launch(
    tracker: &Arc<Tr>,
    fake: &FakeTimeline,
    log: &Arc<Mutex<Vec<(usize, bool)>>>,
    id: usize,
) -> tile_launch::release::Pending<FakeTimeline, Guard> {
    let (guard, enqueue) = guard_and_enqueue(fake, log, id);
    tracker.launch(vec![guard], 1, enqueue).unwrap()
}

/// As [`launch`], straight into the queue (`Tracker::launch_deferred`).
fn launch_deferred(
    tracker: &Arc<Tr>,
    fake: &FakeTimeline,
    log: &Arc<Mutex<Vec<(usize, bool)>>>,
    id: usize,
) {
    let (guard, enqueue) = guard_and_enqueue(fake, log, id);
    tracker.launch_deferred(vec![guard], 1, enqueue).unwrap();
}

/// Two launches deferred from two threads (the other thread's with `launch_deferred` when
/// `one_step`, else with a handle's `defer`), a poll on each, and the work completing at any
/// point: both released exactly once, after completion.
fn launch_defer_poll_complete(name: &str, one_step: bool) {
    explore(name, move || {
        let fake = FakeTimeline::new();
        let config = ReleaseConfig {
            marker_every: 1,
            max_pending_guards: 1,
            ..ReleaseConfig::default()
        };
        let tracker: Arc<Tr> = Tracker::new(fake.clone(), config);
        let log = Arc::new(Mutex::new(Vec::new()));

        let other = {
            let (tracker, fake, log) = (Arc::clone(&tracker), fake.clone(), Arc::clone(&log));
            loom::thread::spawn(move || {
                if one_step {
                    launch_deferred(&tracker, &fake, &log, 0);
                } else {
                    launch(&tracker, &fake, &log, 0).defer();
                }
                tracker.poll();
            })
        };
        let completer = {
            let fake = fake.clone();
            loom::thread::spawn(move || fake.complete_all())
        };
        launch(&tracker, &fake, &log, 1).defer();
        tracker.poll();

        other.join().unwrap();
        completer.join().unwrap();
        tracker.synchronize().unwrap();

        let mut drops = log.lock().unwrap().clone();
        assert!(
            drops.iter().all(|&(_, complete)| complete),
            "released early: {drops:?}"
        );
        drops.sort_unstable();
        assert_eq!(drops, vec![(0, true), (1, true)]);
        let stats = tracker.stats();
        assert_eq!(
            (
                stats.guards_released,
                stats.guards_leaked,
                stats.pending_guards,
                stats.held_guards
            ),
            (2, 0, 0, 0)
        );
    });
}

#[test]
fn launch_deferred_races_a_launch_poll_and_completion() {
    launch_defer_poll_complete("launch_deferred_races_a_launch_poll_and_completion", true);
}

#[test]
fn concurrent_launch_defer_poll_complete() {
    launch_defer_poll_complete("concurrent_launch_defer_poll_complete", false);
}

fn new_tracker(fake: &FakeTimeline, marker_every: u32) -> (Arc<Tr>, Log) {
    let config = ReleaseConfig {
        marker_every,
        ..ReleaseConfig::default()
    };
    (
        Tracker::new(fake.clone(), config),
        Arc::new(Mutex::new(Vec::new())),
    )
}

/// `retire` blocks in a wait (the fake completes only when the "GPU" thread says so) while a
/// second launch's handle is dropped unretired (its `Drop` waits too) and the GPU completes the
/// work concurrently.
#[test]
fn retire_and_handle_drop_race_completion() {
    explore("retire_and_handle_drop_race_completion", || {
        let fake = FakeTimeline::new();
        fake.set_blocking(true);
        let (tracker, log) = new_tracker(&fake, 1);
        let gpu = {
            let fake = fake.clone();
            loom::thread::spawn(move || complete_after(&fake, 2))
        };
        let dropper = {
            let (tracker, fake, log) = (Arc::clone(&tracker), fake.clone(), Arc::clone(&log));
            loom::thread::spawn(move || drop(launch(&tracker, &fake, &log, 1)))
        };
        let retired = launch(&tracker, &fake, &log, 0).retire().unwrap();
        assert_eq!(retired.released, 1);
        dropper.join().unwrap();
        gpu.join().unwrap();
        assert_dropped(&log, &[0, 1]);
        let stats = tracker.stats();
        assert_eq!(
            (
                stats.guards_released,
                stats.guards_leaked,
                stats.held_guards
            ),
            (2, 0, 0)
        );
    });
}

/// `try_retire` races the GPU's completion: it either releases (the work was complete) or hands
/// the launch back, which is then deferred and released by a later `poll` or `synchronize`.
#[test]
fn try_retire_then_defer_races_completion() {
    explore("try_retire_then_defer_races_completion", || {
        let fake = FakeTimeline::new();
        let (tracker, log) = new_tracker(&fake, 1);
        let gpu = {
            let fake = fake.clone();
            loom::thread::spawn(move || fake.complete_all())
        };
        match launch(&tracker, &fake, &log, 0).try_retire() {
            Ok(retired) => assert_eq!(retired.released, 1),
            Err(handle) => handle.defer(),
        }
        tracker.poll();
        gpu.join().unwrap();
        tracker.synchronize().unwrap();
        assert_dropped(&log, &[0]);
        assert_eq!(tracker.stats().pending_guards, 0);
    });
}

/// `shutdown` races a launch that is deferred on another thread: the launch is either drained
/// by the shutdown or stays queued (shutdown is meant for quiescence) and is drained by the
/// next synchronisation; never released early, never twice.
#[test]
fn shutdown_races_a_launch() {
    explore("shutdown_races_a_launch", || {
        let fake = FakeTimeline::new();
        let (tracker, log) = new_tracker(&fake, 64);
        let launcher = {
            let (tracker, fake, log) = (Arc::clone(&tracker), fake.clone(), Arc::clone(&log));
            loom::thread::spawn(move || launch(&tracker, &fake, &log, 0).defer())
        };
        tracker.shutdown();
        {
            let drops = log.lock().unwrap();
            assert!(drops.iter().all(|&(_, complete)| complete), "{drops:?}");
        }
        launcher.join().unwrap();
        tracker.synchronize().unwrap();
        assert_dropped(&log, &[0]);
        assert_eq!(tracker.stats().guards_leaked, 0);
    });
}

/// A shutdown whose wait fails leaks what is queued (never releases it: its work may still be
/// running) while a launch races it. Nothing completes, so nothing may be released; each guard
/// ends up leaked or still queued, and a later, successful synchronisation releases the queued
/// ones.
#[test]
fn failed_shutdown_leaks_and_never_releases() {
    explore("failed_shutdown_leaks_and_never_releases", || {
        let fake = FakeTimeline::new();
        fake.fail_always(FakeOp::Wait);
        let (tracker, log) = new_tracker(&fake, 1);
        let launcher = {
            let (tracker, fake, log) = (Arc::clone(&tracker), fake.clone(), Arc::clone(&log));
            loom::thread::spawn(move || launch(&tracker, &fake, &log, 0).defer())
        };
        tracker.shutdown();
        launcher.join().unwrap();
        assert_dropped(&log, &[]);
        let stats = tracker.stats();
        assert_eq!(
            stats.guards_leaked + stats.pending_guards as u64,
            1,
            "{stats:?}"
        );
        let leaked = stats.guards_leaked;

        fake.clear_failures();
        tracker.synchronize().unwrap();
        let stats = tracker.stats();
        assert_eq!((stats.guards_leaked, stats.pending_guards), (leaked, 0));
        assert_eq!(stats.guards_released, 1 - leaked);
        assert_dropped(&log, if leaked == 0 { &[0] } else { &[] });
    });
}

/// The last reference to the tracker goes on either thread, racing a deferred launch and the
/// GPU: the tracker's `Drop` drains the queue, so every guard is released exactly once, after
/// its work.
#[test]
fn tracker_drop_races_a_deferred_launch() {
    explore("tracker_drop_races_a_deferred_launch", || {
        let fake = FakeTimeline::new();
        let (tracker, log) = new_tracker(&fake, 1);
        let launcher = {
            let (tracker, fake, log) = (Arc::clone(&tracker), fake.clone(), Arc::clone(&log));
            loom::thread::spawn(move || {
                launch(&tracker, &fake, &log, 0).defer();
                drop(tracker);
            })
        };
        let gpu = {
            let fake = fake.clone();
            loom::thread::spawn(move || fake.complete_all())
        };
        launch(&tracker, &fake, &log, 1).defer();
        drop(tracker);
        launcher.join().unwrap();
        gpu.join().unwrap();
        assert_dropped(&log, &[0, 1]);
    });
}

/// A guard of a captured launch: counts its drop. The count is a plain `std` atomic (not a loom
/// object), since the hand-off deliberately leaks a guard it cannot deliver, and loom reports
/// any of its own objects that are leaked.
struct Captured(Arc<std::sync::atomic::AtomicU64>);

impl Drop for Captured {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn graph_destructors_hand_off_to_the_release_thread() {
    use tile_launch::capture::{GraphReleaser, release_parcel};
    explore("graph_destructors_hand_off_to_the_release_thread", || {
        let drops = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (releaser, receiver) = GraphReleaser::<Captured>::unstarted();
        let guard = || Captured(Arc::clone(&drops));
        // Two captured launches: their parcels, as two user objects would own them.
        let p1 = releaser.parcel(vec![guard(), guard()]) as usize;
        let p2 = releaser.parcel(vec![guard()]) as usize;
        // The release thread, receiving the two parcels (loom's channel does not model a
        // disconnected sender, so the thread takes exactly the parcels it is owed rather than
        // looping until the releaser is gone); the releaser is dropped while the destructors run.
        let release = loom::thread::spawn(move || {
            assert!(receiver.release_next());
            assert!(receiver.release_next());
        });
        let d1 = loom::thread::spawn(move || {
            // SAFETY: `p1` came from `parcel` and is passed to the destructor once.
            unsafe { release_parcel::<Captured>(p1 as *mut std::ffi::c_void) }
        });
        let d2 = loom::thread::spawn(move || {
            // SAFETY: as above, for `p2`.
            unsafe { release_parcel::<Captured>(p2 as *mut std::ffi::c_void) }
        });
        let counters = releaser.counters();
        drop(releaser);
        d1.join().unwrap();
        d2.join().unwrap();
        release.join().unwrap();
        // Every guard dropped exactly once, on the release thread, none leaked.
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 3);
        let stats = counters();
        assert_eq!(
            (
                stats.attached,
                stats.handed_off,
                stats.guards_released,
                stats.guards_leaked
            ),
            (3, 3, 3, 0)
        );
    });
}

/// A barrier races a release in flight on another thread: whichever thread takes the completed
/// launch off the queue, `synchronize` (and a `Queued::wait` on a third thread) return only once
/// its guard has been dropped, and the stats never lose it from view.
#[test]
fn barriers_wait_for_a_release_in_flight() {
    explore("barriers_wait_for_a_release_in_flight", || {
        let fake = FakeTimeline::new();
        let (tracker, log) = new_tracker(&fake, 1);
        let (guard, enqueue) = guard_and_enqueue(&fake, &log, 0);
        let queued = tracker.launch_queued(vec![guard], 1, enqueue).unwrap();
        fake.complete_all();
        let releaser = {
            let tracker = Arc::clone(&tracker);
            loom::thread::spawn(move || {
                tracker.poll();
            })
        };
        let waiter = {
            let log = Arc::clone(&log);
            loom::thread::spawn(move || {
                queued.wait().unwrap();
                assert_dropped(&log, &[0]);
            })
        };
        let st = tracker.stats();
        assert_eq!(
            st.pending_guards + st.releasing_guards + st.guards_released as usize,
            1,
            "a guard lost from view: {st:?}"
        );
        tracker.synchronize().unwrap();
        assert_dropped(&log, &[0]);
        releaser.join().unwrap();
        waiter.join().unwrap();
        assert_eq!(tracker.stats().releasing_guards, 0);
    });
}

/// Three queued launches, a marker each, while the "GPU" completes their work one unit at a
/// time (in stream order) and two threads poll: a poll asks the newest marker first and, when
/// it is complete, retires every older one with it; when it is not, the oldest are asked. At no
/// interleaving is a guard released before its own work has completed, and once everything
/// has completed each is released exactly once.
#[test]
fn newest_first_polls_race_in_order_completion() {
    explore("newest_first_polls_race_in_order_completion", || {
        let fake = FakeTimeline::new();
        let (tracker, log) = new_tracker(&fake, 1);
        for id in 0..3 {
            launch_deferred(&tracker, &fake, &log, id);
        }
        assert_eq!(fake.markers_recorded(), 3);
        let gpu = {
            let fake = fake.clone();
            loom::thread::spawn(move || {
                for work in 1..=3 {
                    fake.complete_work(work);
                }
            })
        };
        let poller = {
            let tracker = Arc::clone(&tracker);
            loom::thread::spawn(move || {
                tracker.poll();
                tracker.poll();
            })
        };
        tracker.poll();
        gpu.join().unwrap();
        poller.join().unwrap();
        tracker.poll();
        assert_dropped(&log, &[0, 1, 2]);
        let stats = tracker.stats();
        assert_eq!(
            (
                stats.guards_released,
                stats.guards_leaked,
                stats.pending_guards
            ),
            (3, 0, 0)
        );
    });
}

/// A handle's retire waits on the marker covering its launch while another thread's poll
/// retires that marker and its later launches take completed markers to record again, and the
/// "GPU" completes the work at any point: a marker is recorded again only once nothing refers to
/// it (a shared one would make the re-record panic), every guard is released once, after
/// completion, and every marker goes back to the timeline once when the tracker is dropped.
#[test]
fn a_waited_marker_races_its_retirement_and_reuse() {
    /// Interleavings in which a marker was recorded again.
    static REUSED: StdAtomicUsize = StdAtomicUsize::new(0);
    explore("a_waited_marker_races_its_retirement_and_reuse", || {
        let fake = FakeTimeline::new();
        fake.set_blocking(true);
        let (tracker, log) = new_tracker(&fake, 1);
        let handle = launch(&tracker, &fake, &log, 0);
        launch_deferred(&tracker, &fake, &log, 1);
        assert_eq!(fake.markers_recorded(), 1);
        let waiter = loom::thread::spawn(move || handle.retire().unwrap().released);
        let poller = {
            let (tracker, fake, log) = (Arc::clone(&tracker), fake.clone(), Arc::clone(&log));
            loom::thread::spawn(move || {
                launch_deferred(&tracker, &fake, &log, 2);
                tracker.poll();
                launch_deferred(&tracker, &fake, &log, 3);
                tracker.poll();
                launch_deferred(&tracker, &fake, &log, 4);
            })
        };
        // The first three launches complete while the waiter may still be waiting.
        complete_after(&fake, 3);
        assert_eq!(waiter.join().unwrap(), 1);
        poller.join().unwrap();
        fake.complete_all();
        tracker.synchronize().unwrap();
        assert_dropped(&log, &[0, 1, 2, 3, 4]);
        let stats = tracker.stats();
        assert_eq!(
            (
                stats.guards_released,
                stats.guards_leaked,
                stats.pending_guards
            ),
            (5, 0, 0)
        );
        drop(tracker);
        let calls = fake.calls();
        assert_eq!(calls.recycle + calls.rerecord, fake.markers_recorded());
        if calls.rerecord > 0 {
            REUSED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    assert!(REUSED.load(std::sync::atomic::Ordering::Relaxed) > 0);
}
