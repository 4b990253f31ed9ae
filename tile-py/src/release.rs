//! Releasing Python-made tensors with the interpreter attached.
//!
//! tile-launch drops a launch's guards wherever it learns that the work is done: inside a
//! launch, a wait, a poll or a synchronisation — and tile-py makes the blocking ones with the
//! interpreter *detached*. A deleter of a Python-made tensor must not run there (it may touch
//! Python objects, and on a CUDA callback thread it could deadlock). So every tensor tile-py
//! consumes is held as a [`PyGuard`], whose `Drop` only moves the tensor onto the global
//! [`RELEASES`] queue, never calling a deleter and never taking the GIL. [`drain`] runs the
//! queued deleters; it takes a [`Python`] token, so it runs attached by construction. Every
//! entry point of the module drains before returning, the release thread ([`crate::worker`])
//! drains every 50 ms without a call, and `atexit` drains one last time. Deleters run with the
//! context of the tensor's device current and the thread's capture mode relaxed
//! ([`tile_launch::Context::releasing`]), as tile-launch's own releases do.
//!
//! Once the interpreter is finalising ([`FINALIZING`], set by the `atexit` hook), nothing is
//! drained any more: queued and later tensors are counted as leaked instead.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pyo3::prelude::*;
use tile_dlpack::Used;
use tile_dlpack::dlpark::ffi::DLDeviceType;

use crate::process::leaking;

/// The `os.register_at_fork(after_in_child=...)` hook's part here: leaks every queued release
/// (never runs the parent's deleters).
pub(crate) fn after_fork_in_child() {
    let batch = take_queued();
    COUNTERS
        .leaked_at_exit
        .fetch_add(batch.len() as u64, Ordering::Relaxed);
    std::mem::forget(batch);
}

/// Debug counters, exposed as `tile_py._testing.debug_counters()`.
pub(crate) struct Counters {
    /// `launch` calls that got as far as converting arguments.
    pub launches_attempted: AtomicU64,
    /// Launches the driver accepted.
    pub launches_issued: AtomicU64,
    /// Tensors taken over (capsules renamed and consumed, exchange-API and CAI tensors).
    pub consumed: AtomicU64,
    /// Deleters run by [`drain`].
    pub released: AtomicU64,
    /// Tensors never released because the interpreter was finalising.
    pub leaked_at_exit: AtomicU64,
    /// Deleters that raised (reported through `sys.unraisablehook`).
    pub deleter_errors: AtomicU64,
}

pub(crate) static COUNTERS: Counters = Counters {
    launches_attempted: AtomicU64::new(0),
    launches_issued: AtomicU64::new(0),
    consumed: AtomicU64::new(0),
    released: AtomicU64::new(0),
    leaked_at_exit: AtomicU64::new(0),
    deleter_errors: AtomicU64::new(0),
};

/// What a guard hands over when tile-launch drops it. The fields are never read: dropping them
/// is the release.
#[allow(dead_code)]
pub(crate) enum Release {
    /// A consumed tensor: dropping it runs the producer's deleter.
    Tensor(Used),
    /// A Python object kept alive for the launch (a `__cuda_array_interface__` exporter).
    Object(Py<PyAny>),
}

/// Tensors and objects whose work is done, waiting for an attached thread to release them.
static RELEASES: Mutex<Vec<Release>> = Mutex::new(Vec::new());

/// `RELEASES.len()`, updated under its lock, read without it: [`drain`] skips the lock when it
/// reads 0 (every entry point drains twice per call, and the queue is usually empty). A push
/// racing with that read is drained by the next call; nothing is lost, only delayed.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

fn push(items: impl IntoIterator<Item = Release>) {
    if leaking() {
        for item in items {
            COUNTERS.leaked_at_exit.fetch_add(1, Ordering::Relaxed);
            // Never run a deleter or a decref during finalisation: leak it.
            std::mem::forget(item);
        }
        return;
    }
    let mut q = RELEASES.lock().unwrap_or_else(|p| p.into_inner());
    q.extend(items);
    QUEUED.store(q.len(), Ordering::Release);
}

/// Queues a release; the deleter runs at the next [`drain`].
/// Releases a consumed tensor from wherever a launch's guard is dropped: queues it for a thread
/// that holds the GIL ([`tile_launch::HandOff`]'s release function).
pub(crate) fn release_tensor(used: Used) {
    defer_release(Release::Tensor(used));
}

pub(crate) fn defer_release(item: Release) {
    push([item]);
}

/// Number of releases queued, not yet drained.
pub(crate) fn queued() -> usize {
    RELEASES.lock().unwrap_or_else(|p| p.into_inner()).len()
}

fn take_queued() -> Vec<Release> {
    let mut q = RELEASES.lock().unwrap_or_else(|p| p.into_inner());
    QUEUED.store(0, Ordering::Release);
    std::mem::take(&mut *q)
}

/// Runs every queued deleter, attached, in queue order. A deleter that raises is reported
/// through `sys.unraisablehook` and the others still run; an exception pending in the caller
/// is preserved.
pub(crate) fn drain(py: Python<'_>) {
    loop {
        if QUEUED.load(Ordering::Acquire) == 0 {
            return;
        }
        let batch = take_queued();
        if batch.is_empty() {
            return;
        }
        if leaking() {
            push(batch);
            return;
        }
        let saved = take_pending(py);
        release_batch(py, batch);
        if let Some(err) = saved {
            err.restore(py);
        }
    }
}

/// The device whose context a release runs in: a tensor's device for device and managed
/// memory; `None` (any) for pinned host memory and for objects.
fn device_of(item: &Release) -> Option<i32> {
    match item {
        Release::Tensor(used) => {
            let device = used.view().device();
            (device.is_cuda() || device.device_type == DLDeviceType::CUDAMANAGED)
                .then_some(device.device_id)
        }
        Release::Object(_) => None,
    }
}

/// Releases `batch` in order, in groups of consecutive releases of one device, each group with
/// that device's context current and the thread's stream-capture mode relaxed
/// ([`tile_launch::Context::releasing`], the context tile_py launched on for that device: the
/// launch stream's, since a launch's tensors are on its stream's device). A release of no
/// particular device (pinned host memory, an object kept alive) joins the group before it, or,
/// first in the batch, runs in the first device's context tile_py made. No context is ever
/// made here: without one (no launch yet, or no driver) the batch runs as it is.
fn release_batch(py: Python<'_>, batch: Vec<Release>) {
    // Each group is released straight from the batch's iterator, without a vector of its own.
    let mut items = batch.into_iter().peekable();
    let mut device = None;
    while let Some(first) = items.peek() {
        device = device_of(first).or(device);
        let ctx = match device {
            Some(d) => crate::device_contexts::cached_context(d),
            None => crate::device_contexts::first_cached_context(),
        };
        let mut group = || {
            while let Some(item) = items.next_if(|i| device_of(i).is_none_or(|d| Some(d) == device))
            {
                release_one(py, item);
            }
        };
        match ctx {
            Some(ctx) => ctx.releasing(group),
            None => group(),
        }
    }
}

/// The exception pending on this thread, taken; the indicator is read first, so that the
/// common case, none, costs no more than that read.
fn take_pending(py: Python<'_>) -> Option<PyErr> {
    // SAFETY: attached (`py`); only reads the thread's exception indicator.
    if unsafe { pyo3::ffi::PyErr_Occurred() }.is_null() {
        None
    } else {
        PyErr::take(py)
    }
}

/// Runs one release (attached), counting it and reporting a deleter's exception through
/// `sys.unraisablehook`.
fn release_one(py: Python<'_>, item: Release) {
    let is_tensor = matches!(item, Release::Tensor(_));
    // A panic cannot come from a C deleter (it would abort), only from Rust code around it;
    // catch it so that the remaining releases still run.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(item)));
    if is_tensor {
        COUNTERS.released.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(err) = take_pending(py) {
        COUNTERS.deleter_errors.fetch_add(1, Ordering::Relaxed);
        err.write_unraisable(py, None);
    }
    if r.is_err() {
        COUNTERS.deleter_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether releases are queued (read without the lock; a push racing with it is seen next
/// time).
pub(crate) fn any_queued() -> bool {
    QUEUED.load(Ordering::Acquire) > 0
}

/// What a launch holds for one Python-made tensor (or object): on drop, whatever thread it is
/// on and whether or not the interpreter is attached, it only queues the release.
pub(crate) struct PyGuard(Option<Release>);

impl PyGuard {
    pub(crate) fn tensor(used: Used) -> PyGuard {
        PyGuard(Some(Release::Tensor(used)))
    }
    pub(crate) fn object(obj: Py<PyAny>) -> PyGuard {
        PyGuard(Some(Release::Object(obj)))
    }
}

impl Drop for PyGuard {
    fn drop(&mut self) {
        if let Some(item) = self.0.take() {
            defer_release(item);
        }
    }
}
