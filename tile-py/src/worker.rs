//! The release thread: releases tensors whose work has finished without waiting for a call into
//! tile_py.
//!
//! tile-launch releases a queued launch's tensors when something asks its stream's release queue
//! (a launch, a poll, a wait); tile-py's deleters then run at the next [`drain`]. A program that
//! launches and then makes no tile_py call for a while would keep memory that only tile keeps
//! alive (an export the producer copied) for that long. So one thread, started when tile_py
//! first holds a stream, wakes every [`PERIOD`] and, when tile_py holds a stream or a release
//! is queued, attaches to the interpreter, polls every held stream (non-blocking: one
//! `cuEventQuery` per marker, as `tile_py.stats()` does) and drains. Memory only tile keeps
//! alive is thus released within [`PERIOD`] of its work finishing, plus the time the thread
//! waits for the interpreter.
//!
//! - **Deleters** run as at any other drain: attached (the GIL held), on this thread, which is
//!   never a CUDA callback thread, with the tensor's context current and the capture mode
//!   relaxed ([`crate::release`]). A batch this thread is running counts in
//!   `stats()["releasing"]` until its last deleter has run, and `synchronize`,
//!   `LaunchHandle.wait` and the `atexit` hook wait for it ([`crate::release::settle`]), even
//!   while a deleter here lets the interpreter go to another thread.
//! - **Fork.** The thread takes tile-py's and tile-launch's locks only while attached, and a
//!   fork happens on a thread holding the interpreter, so none of them is held by this thread
//!   when a child is made (its own state lock may be; the child never takes it). The child has
//!   no such thread and starts none (it never releases anything it inherited, see
//!   [`crate::process::FORKED`]).
//! - **Exit.** The thread is not a Python thread: the interpreter neither waits for it nor
//!   joins it. It stops once the `atexit` hook has run ([`crate::process::FINALIZING`]), and it
//!   attaches only through [`Python::try_attach`], never while the interpreter is finalising;
//!   the hook waits, detached, for an attach in progress to end before it returns
//!   ([`stop`]), up to its deadline: past it (a deleter here that blocks) the hook returns and
//!   counts the batch as leaked, and the thread is left to the interpreter's finalisation (why
//!   that is sound: [`stop`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use crate::process::leaking;
use crate::release::{any_queued, drain};

/// How often the release thread wakes. Memory only tile keeps alive is released within this
/// time of its work finishing, plus the wait for the interpreter (the README states the bound).
pub(crate) const PERIOD: Duration = Duration::from_millis(50);

struct State {
    /// Whether the thread was started (and has not stopped).
    running: bool,
    /// Whether the thread is between its check for exit and the end of its attach.
    attaching: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    running: false,
    attaching: false,
});
static CHANGED: Condvar = Condvar::new();
/// Whether the thread was ever started: a lock-free fast path for [`start`].
static STARTED: AtomicBool = AtomicBool::new(false);
/// Completed wake-ups that attached (for `tile_py._testing.release_thread()`).
static CYCLES: AtomicU64 = AtomicU64::new(0);

fn lock() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the release thread, once per process (not in a forked child, nor once the
/// interpreter exits). If the thread cannot be spawned, releases happen at calls into tile_py
/// as before.
pub(crate) fn start() {
    if STARTED.load(Ordering::Acquire) || leaking() {
        return;
    }
    let mut st = lock();
    if STARTED.load(Ordering::Acquire) {
        return;
    }
    STARTED.store(true, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("tile_py-release".into())
        .spawn(run);
    st.running = spawned.is_ok();
}

/// The thread's loop: sleep, then, attached, poll the held streams and drain.
fn run() {
    loop {
        std::thread::sleep(PERIOD);
        {
            let mut st = lock();
            if leaking() {
                st.running = false;
                CHANGED.notify_all();
                return;
            }
            if !crate::stream_cache::any_held() && !any_queued() {
                continue;
            }
            st.attaching = true;
        }
        // `try_attach` declines while the interpreter is finalising; the `atexit` hook waits
        // for this attach to end before finalisation begins (`stop`).
        let attached = Python::try_attach(|py| {
            if leaking() {
                return;
            }
            for s in crate::stream_cache::all() {
                s.poll();
            }
            drain(py);
        });
        if attached.is_some() {
            CYCLES.fetch_add(1, Ordering::Relaxed);
        }
        let mut st = lock();
        st.attaching = false;
        CHANGED.notify_all();
    }
}

/// Called by the `atexit` hook once [`crate::process::FINALIZING`] is set: waits (detached, so
/// that the thread can take the interpreter and see the flag) until the thread is not inside
/// an attach, or until `deadline` (`None`: no deadline), whichever comes first; the thread
/// stops at its next wake-up. Returns whether the thread left its attach (or was not in one).
///
/// Past the deadline the thread is still inside a deleter of the batch it is running (one that
/// blocks, or lets the interpreter go to another thread and waits): the hook returns anyway,
/// and the batch counts as leaked in its warning (`release::releasing()`). Leaving that thread
/// to the interpreter's finalisation is sound:
/// - it is not a Python thread (the interpreter neither joins nor waits for it), attached through
///   pyo3's `Python::try_attach` (`PyGILState_Ensure`), and it holds no lock of tile-py or
///   tile-launch that the main thread needs to finish exiting: while a deleter runs it holds
///   only its batch's bookkeeping, which nothing at exit waits for any longer;
/// - while its deleter keeps blocking, finalisation and process exit proceed without it and the
///   exit ends it, as with any daemon thread;
/// - if the deleter returns before finalisation begins, the thread takes the interpreter like
///   any daemon thread and runs nothing more of tile_py's: the rest of its batch is leaked, not
///   run ([`crate::release`] checks [`crate::process::leaking`] between releases), and it never
///   attaches again;
/// - if it returns once finalisation has begun, CPython does not let it run Python code: a
///   thread re-taking the interpreter then never gets it (`take_gil` sees the interpreter
///   finalising): CPython 3.14 blocks it forever, and process exit ends it; CPython up to 3.13
///   ends it with `PyThread_exit_thread` (`pthread_exit`), whose forced unwind through the
///   release thread's Rust frames may abort the process at that point instead of a clean exit
///   (`try_attach`'s own finalisation check, `Py_IsFinalizing`, only guards a new attach, and
///   only on 3.13+). That needs a deleter that outlasts the timeout and returns within the few
///   milliseconds finalisation takes; the alternative, waiting for the deleter, is the unbounded
///   exit this deadline exists to prevent.
pub(crate) fn stop(py: Python<'_>, deadline: Option<Instant>) -> bool {
    if crate::process::FORKED.load(Ordering::Acquire) {
        // A forked child has no release thread (and may have inherited the lock held).
        return true;
    }
    py.detach(|| {
        let mut st = lock();
        while st.attaching {
            st = match deadline {
                None => CHANGED.wait(st).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let Some(left) = d.checked_duration_since(Instant::now()) else {
                        return false;
                    };
                    CHANGED
                        .wait_timeout(st, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
            };
        }
        true
    })
}

/// In a child made by `os.fork()`: the thread does not exist there (and none is started).
pub(crate) fn after_fork_in_child() {
    // The parent's thread held this lock only while not attached, and the fork happened on an
    // attached thread: but it may have been between its check and its attach. A fresh state,
    // without taking the lock, is what the child's (single) thread sees.
    STARTED.store(true, Ordering::Release);
    if let Ok(mut st) = STATE.try_lock() {
        st.running = false;
        st.attaching = false;
    }
}

/// `tile_py._testing.release_thread()`: `{"running": bool, "period_ms": int, "cycles": int}`.
pub(crate) fn describe(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let d = pyo3::types::PyDict::new(py);
    // A forked child has no release thread (and may have inherited the lock held); elsewhere
    // the lock is only ever held briefly.
    let running = !crate::process::FORKED.load(Ordering::Acquire)
        && STATE.try_lock().map(|st| st.running).unwrap_or(true);
    d.set_item("running", running)?;
    d.set_item("period_ms", PERIOD.as_millis() as u64)?;
    d.set_item("cycles", CYCLES.load(Ordering::Relaxed))?;
    Ok(d)
}
