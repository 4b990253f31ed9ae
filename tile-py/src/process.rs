//! The process tile_py runs in: whether the interpreter is exiting, whether this is a child
//! made by `os.fork()`, the one refusal both give, and the hooks that set them (registered at
//! module initialisation: `atexit` runs [`crate::lifecycle::_shutdown`], `os.fork` runs
//! [`after_fork_in_child`] in the child).
//!
//! **In a child made by `os.fork()`** CUDA cannot be used (the driver's state does not survive
//! the fork: its calls fail with `CUDA_ERROR_NOT_INITIALIZED`), so no public call makes a
//! driver call there, and none waits for a lock another thread of the parent may have held at
//! the fork: launches, holds, prepared launches, library loads and kernel lookups, and
//! `compute_capability` raise `ValueError` ([`refuse_in_fork`]); `synchronize` returns at
//! once; `stats` answers without polling, from the counters inherited at the fork
//! ([`inherited_stats`]), with every tensor the parent's streams held counted in `leaked`; a
//! `LaunchHandle` inherited from the parent is retired at once (`wait` returns, `done` is
//! True), its tensors leaked; releases queued in the parent are leaked, never run; there is no
//! release thread; the `atexit` hook returns at once.
//!
//! **At exit**, once the `atexit` hook has waited for pending work, [`FINALIZING`] is set:
//! launches are refused and releases are leaked (counted), never run while the interpreter
//! finalises.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use pyo3::prelude::*;

use crate::exceptions::{Kind, err};
use crate::release::COUNTERS;

/// Set by the `atexit` hook: from then on launches are refused and releases are leaked.
pub(crate) static FINALIZING: AtomicBool = AtomicBool::new(false);

/// Set in a child process made by `os.fork()`: the child refuses CUDA work, and never runs a
/// deleter it inherited from the parent (the tensors belong to the parent's GPU work, so they
/// are leaked and counted in `leaked_at_exit`, as at interpreter exit).
pub(crate) static FORKED: AtomicBool = AtomicBool::new(false);

/// The process tile_py was loaded in, or last forked into.
static PROCESS: AtomicU32 = AtomicU32::new(0);

/// In a forked child: the counters of the streams inherited from the parent, read once at the
/// fork, with what they held moved to `leaked`.
static INHERITED: Mutex<Option<tile_launch::Stats>> = Mutex::new(None);

/// Whether releases are leaked instead of run (interpreter exit, or a forked child).
#[inline]
pub(crate) fn leaking() -> bool {
    FINALIZING.load(Ordering::Acquire) || FORKED.load(Ordering::Acquire)
}

/// Whether this process is a child made by `os.fork()`.
#[inline]
pub(crate) fn forked() -> bool {
    FORKED.load(Ordering::Acquire)
}

/// `ValueError` in a child made by `os.fork()`: `what` needs CUDA, which does not survive the
/// fork.
#[inline]
pub(crate) fn refuse_in_fork(what: &str) -> PyResult<()> {
    if forked() {
        return Err(err(
            Kind::Value,
            format!(
                "tile_py cannot {what} in a process made by os.fork() after CUDA may have been \
                 used in the parent (CUDA does not survive fork); use the 'spawn' or \
                 'forkserver' start method"
            ),
        ));
    }
    Ok(())
}

/// What every call that launches or holds does first: runs the queued releases
/// ([`crate::release::drain`]), then refuses work on a stream (`what`, e.g. "launch") in a
/// forked child or during interpreter exit ([`refuse_work`]).
#[inline]
pub(crate) fn begin_work(py: Python<'_>, what: &str, plural: &str) -> PyResult<()> {
    crate::release::drain(py);
    refuse_work(what, plural)
}

/// [`begin_work`] for a launch.
#[inline]
pub(crate) fn begin_launch(py: Python<'_>) -> PyResult<()> {
    begin_work(py, "launch", "launches")
}

/// [`refuse_in_fork`] for work on a stream (`what`, e.g. "launch"), which is refused during
/// interpreter exit too ("no more `plural`").
#[inline]
pub(crate) fn refuse_work(what: &str, plural: &str) -> PyResult<()> {
    if FINALIZING.load(Ordering::Acquire) {
        return Err(err(
            Kind::Value,
            format!("tile_py is shutting down (interpreter exit): no more {plural}"),
        ));
    }
    refuse_in_fork(what)
}

/// The counters of the parent's streams as inherited at the fork (`None` outside a child).
pub(crate) fn inherited_stats() -> Option<tile_launch::Stats> {
    *INHERITED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers the process hooks: the exit hook with `atexit`, [`after_fork_in_child`] with
/// `os.register_at_fork`, and records the process tile_py is loaded in.
pub(crate) fn register(py: Python<'_>) -> PyResult<()> {
    PROCESS.store(std::process::id(), Ordering::Release);
    let shutdown = wrap_pyfunction!(crate::lifecycle::_shutdown, py)?;
    py.import("atexit")?.call_method1("register", (shutdown,))?;
    let os = py.import("os")?;
    if os.hasattr("register_at_fork")? {
        let hook = wrap_pyfunction!(after_fork_in_child, py)?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("after_in_child", hook)?;
        os.call_method("register_at_fork", (), Some(&kwargs))?;
    }
    Ok(())
}

/// `os.register_at_fork(after_in_child=...)`: marks the process forked, leaks every queued
/// release, and counts what the inherited streams held (their pending and held guards) as
/// leaked, keeping their other counters for `stats`; the streams themselves are never touched
/// again.
#[pyfunction]
pub(crate) fn after_fork_in_child() {
    // Only in a process other than the one tile_py was loaded in (or last forked into): a call
    // in that process itself is not a fork and must not disable it.
    let me = std::process::id();
    if PROCESS.swap(me, Ordering::AcqRel) == me {
        return;
    }
    FORKED.store(true, Ordering::Release);
    crate::release::after_fork_in_child();
    // Read without waiting: `None` when another thread of the parent held the stream cache at
    // the fork (its counters are then not reported).
    let mut inherited = crate::stream_arg::inherited_stats().unwrap_or_default();
    let held = inherited.pending_guards + inherited.held_guards;
    COUNTERS
        .leaked_at_exit
        .fetch_add(held as u64, Ordering::Relaxed);
    inherited.pending_guards = 0;
    inherited.pending_bytes = 0;
    inherited.held_guards = 0;
    inherited.held_bytes = 0;
    *INHERITED.lock().unwrap_or_else(|p| p.into_inner()) = Some(inherited);
}
