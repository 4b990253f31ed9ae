//! A `loom` model of the release queue: two threads launch, defer and poll while a third
//! completes the fake's work; every guard is released exactly once, never before its work has
//! completed, whatever the interleaving.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p tile-launch --release --test release_loom`.

#![cfg(loom)]

use std::sync::Arc;

use loom::sync::Mutex;
use loom::sync::atomic::{AtomicU64, Ordering};
use tile_launch::release::fake::FakeTimeline;
use tile_launch::release::{ReleaseConfig, Tracker};

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

fn launch(
    tracker: &Arc<Tr>,
    fake: &FakeTimeline,
    log: &Arc<Mutex<Vec<(usize, bool)>>>,
    id: usize,
) -> tile_launch::release::Pending<FakeTimeline, Guard> {
    let work = Arc::new(AtomicU64::new(0));
    let guard = Guard {
        id,
        work: Arc::clone(&work),
        fake: fake.clone(),
        log: Arc::clone(log),
    };
    let fake = fake.clone();
    tracker
        .launch(vec![guard], 1, move || {
            work.store(fake.enqueue(), Ordering::SeqCst);
            Ok::<(), ()>(())
        })
        .unwrap()
}

#[test]
fn concurrent_launch_defer_poll_complete() {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    static ITERATIONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    builder.check(|| {
        ITERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
                launch(&tracker, &fake, &log, 0).defer();
                tracker.poll();
            })
        };
        let completer = {
            let fake = fake.clone();
            loom::thread::spawn(move || fake.complete_all())
        };
        let handle = launch(&tracker, &fake, &log, 1);
        handle.defer();
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
            (stats.released, stats.leaked, stats.pending_guards),
            (2, 0, 0)
        );
    });
    let explored = ITERATIONS.load(std::sync::atomic::Ordering::Relaxed);
    println!("loom explored {explored} interleavings");
    assert!(explored > 1);
}
