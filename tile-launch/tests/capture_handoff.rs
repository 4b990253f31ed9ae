//! The release path of captured launches, without CUDA: a parcel made by `GraphReleaser`,
//! destroyed by calling the user-object destructor (`release_parcel`) as a CUDA internal
//! thread would, and the guards dropped on the release thread — exactly once, never on the
//! destructor's thread.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tile_launch::capture::{GraphReleaser, release_parcel};

/// Records the name of the thread its drop runs on, and counts drops.
struct Probe {
    drops: Arc<AtomicUsize>,
    threads: Arc<Mutex<Vec<String>>>,
    panic: bool,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let name = thread::current().name().unwrap_or("?").to_owned();
        self.threads.lock().unwrap().push(name);
        self.drops.fetch_add(1, Ordering::SeqCst);
        if self.panic {
            panic!("deleter panics");
        }
    }
}

fn probes(n: usize, drops: &Arc<AtomicUsize>, threads: &Arc<Mutex<Vec<String>>>) -> Vec<Probe> {
    (0..n)
        .map(|i| Probe {
            drops: Arc::clone(drops),
            threads: Arc::clone(threads),
            panic: i == 1,
        })
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn destructor_hands_guards_to_the_release_thread_which_drops_them_once() {
    let releaser = GraphReleaser::<Probe>::new("test-graph-release").unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let threads = Arc::new(Mutex::new(Vec::new()));
    let parcel = releaser.parcel(probes(3, &drops, &threads));
    let stats = releaser.stats();
    assert_eq!(
        (stats.attached, stats.handed_off, stats.guards_released),
        (3, 0, 0)
    );
    // Held by the "graph": nothing dropped until the destructor runs.
    thread::sleep(Duration::from_millis(20));
    assert_eq!(drops.load(Ordering::SeqCst), 0);

    // The destructor runs on a thread that is not ours (CUDA's internal thread).
    let p = parcel as usize;
    thread::Builder::new()
        .name("fake-cuda-callback".into())
        .spawn(move || {
            // SAFETY: a parcel of `Probe`s, destroyed once.
            unsafe { release_parcel::<Probe>(p as *mut std::ffi::c_void) }
        })
        .unwrap()
        .join()
        .unwrap();
    wait_until("the release thread", || {
        releaser.stats().guards_released == 3
    });
    assert_eq!(
        drops.load(Ordering::SeqCst),
        3,
        "each guard dropped exactly once"
    );
    let names = threads.lock().unwrap().clone();
    assert_eq!(
        names,
        vec!["test-graph-release"; 3],
        "dropped on the release thread"
    );
    let stats = releaser.stats();
    assert_eq!(stats.handed_off, 3);
    assert_eq!(stats.release_panics, 1, "the panicking deleter is counted");
    assert_eq!(stats.guards_leaked, 0);

    // The release thread survived the panic: another parcel is released too.
    let more = releaser.parcel(probes(1, &drops, &threads));
    // SAFETY: a parcel of `Probe`s, destroyed once.
    unsafe { release_parcel::<Probe>(more) };
    wait_until("the second parcel", || {
        releaser.stats().guards_released == 4
    });
    thread::sleep(Duration::from_millis(20));
    assert_eq!(drops.load(Ordering::SeqCst), 4);
}

#[test]
fn reclaimed_parcel_gives_the_guards_back_and_drops_nothing() {
    let releaser = GraphReleaser::<Probe>::new("test-graph-release-2").unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let threads = Arc::new(Mutex::new(Vec::new()));
    let mut guards = probes(2, &drops, &threads);
    guards.iter_mut().for_each(|g| g.panic = false);
    let parcel = releaser.parcel(guards);
    // SAFETY: a parcel of `Probe`s that no user object owns, reclaimed once.
    let back = unsafe { GraphReleaser::<Probe>::reclaim(parcel) };
    assert_eq!(back.len(), 2);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    assert_eq!(releaser.stats().attached, 0);
    drop(back);
    assert_eq!(drops.load(Ordering::SeqCst), 2);
    assert_eq!(releaser.stats().guards_released, 0);
}

#[test]
fn parcels_outlive_their_releaser_and_are_still_released() {
    let drops = Arc::new(AtomicUsize::new(0));
    let threads = Arc::new(Mutex::new(Vec::new()));
    let releaser = GraphReleaser::<Probe>::new("test-graph-release-3").unwrap();
    let mut guards = probes(2, &drops, &threads);
    guards.iter_mut().for_each(|g| g.panic = false);
    let parcel = releaser.parcel(guards) as usize;
    drop(releaser);
    // Many destructors at once, from several threads: each parcel exactly once.
    let releaser = Arc::new(GraphReleaser::<Probe>::new("test-graph-release-4").unwrap());
    let mut parcels = vec![parcel];
    for _ in 0..64 {
        let mut g = probes(2, &drops, &threads);
        g.iter_mut().for_each(|g| g.panic = false);
        parcels.push(releaser.parcel(g) as usize);
    }
    let handles: Vec<_> = parcels
        .chunks(8)
        .map(|chunk| {
            let chunk = chunk.to_vec();
            thread::spawn(move || {
                for p in chunk {
                    // SAFETY: parcels of `Probe`s, each destroyed once.
                    unsafe { release_parcel::<Probe>(p as *mut std::ffi::c_void) }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    wait_until("all parcels", || drops.load(Ordering::SeqCst) == 130);
    thread::sleep(Duration::from_millis(20));
    assert_eq!(drops.load(Ordering::SeqCst), 130);
    assert!(
        threads
            .lock()
            .unwrap()
            .iter()
            .all(|n| n.starts_with("test-graph-release-")),
        "never dropped on a destructor thread"
    );
}

#[test]
fn a_parcel_arriving_after_the_release_side_is_gone_is_leaked_never_dropped() {
    let drops = Arc::new(AtomicUsize::new(0));
    let threads = Arc::new(Mutex::new(Vec::new()));
    let (releaser, receiver) = GraphReleaser::<Probe>::unstarted();
    let p = releaser.parcel(probes(2, &drops, &threads));
    drop(receiver); // the release thread is gone
    // SAFETY: `p` came from `parcel` and reaches the destructor once.
    unsafe { release_parcel::<Probe>(p) };
    let stats = releaser.stats();
    assert_eq!(
        (stats.attached, stats.handed_off, stats.guards_leaked),
        (2, 2, 2)
    );
    assert_eq!(stats.guards_released, 0);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        0,
        "never dropped on the destructor's thread"
    );
}
