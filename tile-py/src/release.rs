//! Releasing Python-made tensors with the interpreter attached.
//!
//! tile-launch drops a launch's guards wherever it learns that the work is done: inside a
//! launch, a wait, a poll or a synchronisation — and tile-py makes the blocking ones with the
//! interpreter *detached*. A deleter of a Python-made tensor must not run there (it may touch
//! Python objects, and on a CUDA callback thread it could deadlock). So every tensor tile-py
//! consumes is held as a [`PyGuard`], whose `Drop` only moves the tensor onto the global
//! [`RELEASES`] queue, never calling a deleter and never taking the GIL. [`drain`] runs the
//! queued deleters; it takes a [`Python`] token, so it runs attached by construction. Every
//! entry point of the module drains before returning, the release thread (below) drains
//! every [`PERIOD`] without a call, and `atexit` drains one last time. Deleters run with the
//! context of the tensor's device current and the thread's capture mode relaxed
//! ([`tile_launch::Context::releasing`]), as tile-launch's own releases do.
//!
//! Once the interpreter is finalising ([`FINALIZING`](crate::process::FINALIZING), set by the
//! `atexit` hook), nothing is drained any more: queued and later tensors are counted as leaked
//! instead.
//!
//! **Barriers.** A drain takes the whole queue as one batch and runs it; a deleter may let the
//! interpreter switch threads (I/O, a lock, any Python code), so another thread may find the
//! queue empty while a batch is still running. Every batch is therefore registered, under the
//! queue's lock as it is taken, until its last deleter has run (`stats()["releasing"]` counts
//! its releases), and the barriers — `synchronize`, `LaunchHandle.wait`, the `atexit` hook —
//! call [`settle`], which drains and then waits, detached, for every batch taken before it on
//! any thread. The one exception: [`settle`] on a thread that is itself running a batch (from
//! inside a deleter, on a user thread or the release thread) does not wait for the others: its
//! own batch cannot finish before it returns, and two deleters each waiting for the other's
//! batch would deadlock. A barrier called from a deleter thus releases what is queued but not
//! what other threads are releasing at that moment. Nor does a forked child wait (batches
//! inherited from the parent's other threads never finish there; they are leaked).
//!
//! **The release thread.** tile-launch releases a queued launch's tensors when something asks
//! its stream's release queue (a launch, a poll, a wait); their deleters then run at the next
//! [`drain`]. So that a program making no tile_py call for a while does not keep memory only
//! tile keeps alive (an export the producer copied), one thread, started at tile_py's first
//! launch or hold ([`start_thread`]), wakes every [`PERIOD`] and, when tile_py holds a stream or
//! a release is queued, attaches, polls every held stream (one `cuEventQuery` per marker) and
//! drains: such memory is released within [`PERIOD`] of its work finishing, plus the wait for
//! the interpreter. Its batches are batches like any other: counted in `stats()["releasing"]`,
//! waited for by [`settle`].
//!
//! - **Fork.** The thread takes tile-py's and tile-launch's locks only while attached, and a
//!   fork happens on a thread holding the interpreter, so none of them is held by this thread
//!   when a child is made (its own state lock may be; the child never takes it). The child has
//!   no such thread and starts none (it never releases anything it inherited, see
//!   [`crate::process::FORKED`]).
//! - **Exit.** The thread is not a Python thread: the interpreter neither waits for it nor
//!   joins it. It stops once the `atexit` hook has run ([`crate::process::FINALIZING`]), and it
//!   attaches only through [`Python::try_attach`], never while the interpreter is finalising;
//!   the hook waits, detached, for an attach in progress to end before it returns
//!   ([`stop_thread`]), up to its deadline: past it (a deleter here that blocks) the hook
//!   returns and counts the batch as leaked, and the thread is left to the interpreter's
//!   finalisation (why that is sound: [`stop_thread`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use tile_dlpack::dlpark::ffi::DLDeviceType;
use tile_dlpack::{Taken, Used};

use crate::process::leaking;

/// The `os.register_at_fork(after_in_child=...)` hook's part here: leaks every queued release
/// (never runs the parent's deleters); the child has no release thread.
pub(crate) fn after_fork_in_child() {
    thread_after_fork_in_child();
    let queued = QUEUED.swap(0, Ordering::AcqRel);
    // A thread of the parent may have held the queue's lock at the fork (a launch made
    // detached releases into it): the lock is then held for good here, and the child never
    // waits for it ([`lock_unless_lost`]). What that queue held is counted as leaked from its
    // mirrored length.
    let Some(mut q) = lock_unless_lost() else {
        let in_flight = RELEASING.swap(0, Ordering::Relaxed);
        COUNTERS
            .leaked_at_exit
            .fetch_add((queued + in_flight) as u64, Ordering::Relaxed);
        return;
    };
    let batch = std::mem::take(&mut q.items);
    // Batches in flight: other threads' of the parent (those threads do not exist here), and
    // this thread's own when one of their deleters forked. What they had left is counted as
    // leaked here, once: a batch this thread goes on running leaks the rest without counting
    // it again, and without counting it down from `RELEASING` ([`Landing::one_done`]).
    q.flights.clear();
    let in_flight = RELEASING.swap(0, Ordering::Relaxed);
    drop(q);
    COUNTERS
        .leaked_at_exit
        .fetch_add((batch.len() + in_flight) as u64, Ordering::Relaxed);
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
    /// A tensor taken over unread (`tile_py.hold` of a capsule a launcher consumed): dropping it
    /// runs its deleter.
    Taken(Taken),
}

/// The queue, and the batches taken off it whose deleters are running.
struct Queue {
    /// Tensors and objects whose work is done, waiting for an attached thread to release them.
    items: Vec<Release>,
    /// Batches taken off `items` by a drain (on any thread) whose deleters have not all run.
    flights: Vec<Flight>,
    /// A run batch's emptied vector, the next `items` (so that the queue does not grow a new
    /// vector from nothing for every batch).
    spare: Vec<Release>,
    /// The ticket of the next batch: batches are numbered in the order they are taken.
    next_ticket: u64,
    /// Threads waiting in [`settle`]: a finished batch wakes them only when there are any.
    waiters: usize,
}

/// A batch in flight.
struct Flight {
    ticket: u64,
}

static RELEASES: Mutex<Queue> = Mutex::new(Queue {
    items: Vec::new(),
    flights: Vec::new(),
    spare: Vec::new(),
    next_ticket: 0,
    waiters: 0,
});
/// Signalled when a batch finishes while a [`settle`] waits.
static LANDED: Condvar = Condvar::new();

thread_local! {
    /// How many batches this thread is running, nested (a deleter that drains in turn).
    static DRAINING: Cell<u32> = const { Cell::new(0) };
}

fn lock() -> MutexGuard<'static, Queue> {
    RELEASES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Holds the queue's lock on a thread of its own for `seconds`, as a thread releasing into it
/// does (`tile_py._testing.hold_release_queue_lock`); returns once the lock is held.
pub(crate) fn hold_lock_for(seconds: f64) {
    let (held, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let q = lock();
        let _ = held.send(());
        std::thread::sleep(Duration::from_secs_f64(seconds));
        drop(q);
    });
    let _ = wait.recv();
}

/// The queue's lock, except in a forked child where it is held (by a thread of the parent,
/// which does not exist here: it would never be let go). A child queues nothing (its releases
/// are leaked, [`push`]) and drains nothing ([`QUEUED`] is 0 from the fork on), so only what
/// reads or ends a batch taken before the fork needs the lock there, and does without it.
fn lock_unless_lost() -> Option<MutexGuard<'static, Queue>> {
    if !crate::process::forked() {
        return Some(lock());
    }
    match RELEASES.try_lock() {
        Ok(q) => Some(q),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

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
    let mut q = lock();
    q.items.extend(items);
    QUEUED.store(q.items.len(), Ordering::Release);
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

/// Number of releases queued, not yet drained (0 in a forked child whose queue's lock a
/// thread of the parent held at the fork).
pub(crate) fn queued() -> usize {
    lock_unless_lost().map_or(0, |q| q.items.len())
}

/// Number of releases a drain has taken off the queue, on some thread, that have not run yet
/// (one running, or waiting its turn in its batch; `stats()["releasing"]`).
pub(crate) fn releasing() -> usize {
    RELEASING.load(Ordering::Relaxed)
}

/// The releases of the batches in flight that have not run yet (`stats()["releasing"]`): added
/// when a batch is taken (under the queue's lock), less one as each release runs (without the
/// lock: one atomic operation per release), less what is left when the batch ends.
static RELEASING: AtomicUsize = AtomicUsize::new(0);

/// Takes the queue as one batch, registered as in flight (with its ticket, which the returned
/// [`Landing`] ends); `None` when the queue is empty.
fn take_queued() -> Option<(Vec<Release>, Landing)> {
    let mut q = lock();
    QUEUED.store(0, Ordering::Release);
    if q.items.is_empty() {
        return None;
    }
    let spare = std::mem::take(&mut q.spare);
    let batch = std::mem::replace(&mut q.items, spare);
    let ticket = q.next_ticket;
    q.next_ticket += 1;
    q.flights.push(Flight { ticket });
    RELEASING.fetch_add(batch.len(), Ordering::Relaxed);
    let landing = Landing {
        ticket,
        left: Cell::new(batch.len()),
        emptied: Cell::new(Vec::new()),
    };
    Some((batch, landing))
}

/// Marks the batch `ticket` finished however its run ends, waking the barriers waiting.
struct Landing {
    ticket: u64,
    /// Its releases that have not run yet.
    left: Cell<usize>,
    /// The batch's vector once run, kept as the queue's spare when the batch ends.
    emptied: Cell<Vec<Release>>,
}

/// The largest emptied batch vector kept for reuse (releases); a larger one is freed.
const SPARE_RELEASES: usize = 4096;

impl Landing {
    /// One release of the batch has run: it no longer counts in `releasing`. In a forked child
    /// only a batch taken before the fork runs (a child's drain leaks what it takes), and what
    /// it had left was taken out of `RELEASING` at the fork ([`after_fork_in_child`]).
    fn one_done(&self) {
        self.left.set(self.left.get() - 1);
        if !crate::process::forked() {
            RELEASING.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        let emptied = self.emptied.take();
        // A batch the forking thread goes on running in the child, whose queue's lock a thread
        // of the parent held at the fork: nobody waits for it there.
        let Some(mut q) = lock_unless_lost() else {
            return;
        };
        if emptied.capacity() <= SPARE_RELEASES && emptied.capacity() > q.spare.capacity() {
            debug_assert!(emptied.is_empty());
            q.spare = emptied;
        }
        if let Some(i) = q.flights.iter().position(|f| f.ticket == self.ticket) {
            q.flights.swap_remove(i);
            // What did not run (a batch leaked at exit, or a panic): no longer under way.
            RELEASING.fetch_sub(self.left.get(), Ordering::Relaxed);
        }
        if q.waiters > 0 {
            LANDED.notify_all();
        }
    }
}

/// Counts this thread as running a batch while it lives.
struct Draining;

impl Draining {
    fn enter() -> Draining {
        DRAINING.with(|d| d.set(d.get() + 1));
        Draining
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        DRAINING.with(|d| d.set(d.get() - 1));
    }
}

/// The barrier of tile_py's releases: [`drain`]s, then waits (detached) until every batch that
/// a drain on any thread took before this call has run, then drains what those batches queued.
/// Returns at once after the drain on a thread running a batch itself (from inside a deleter)
/// and in a forked child (see the module docs).
pub(crate) fn settle(py: Python<'_>) {
    drain(py);
    if DRAINING.with(Cell::get) > 0 || crate::process::forked() {
        return;
    }
    let before = {
        let q = lock();
        if q.flights.is_empty() {
            return;
        }
        q.next_ticket
    };
    py.detach(|| {
        let mut q = lock();
        while q.flights.iter().any(|f| f.ticket < before) {
            q.waiters += 1;
            q = LANDED.wait(q).unwrap_or_else(|p| p.into_inner());
            q.waiters -= 1;
        }
    });
    drain(py);
}

/// Runs every queued deleter, attached, in queue order. A deleter that raises is reported
/// through `sys.unraisablehook` and the others still run; an exception pending in the caller
/// is preserved.
pub(crate) fn drain(py: Python<'_>) {
    loop {
        if QUEUED.load(Ordering::Acquire) == 0 {
            return;
        }
        let Some((batch, landing)) = take_queued() else {
            return;
        };
        if leaking() {
            push(batch);
            return;
        }
        let _draining = Draining::enter();
        let saved = take_pending(py);
        release_batch(py, batch, &landing);
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
        // Unread: its device is not known (the release runs in tile_py's first context).
        Release::Object(_) | Release::Taken(_) => None,
    }
}

/// Releases `batch` in order, in groups of consecutive releases of one device, each group with
/// that device's context current and the thread's stream-capture mode relaxed
/// ([`tile_launch::Context::releasing`], the context tile_py launched on for that device: the
/// launch stream's, since a launch's tensors are on its stream's device). A release of no
/// particular device (pinned host memory, an object kept alive) joins the group before it, or,
/// first in the batch, runs in the first device's context tile_py made, as does a group of a
/// device tile_py made no context for. No context is ever made here: without one (no launch
/// yet, or no driver) the batch runs as it is.
fn release_batch(py: Python<'_>, mut batch: Vec<Release>, landing: &Landing) {
    // Each group is released straight from the batch's iterator, without a vector of its own.
    let mut items = batch.drain(..).peekable();
    let mut device = None;
    while let Some(first) = items.peek() {
        device = device_of(first).or(device);
        // A device tile_py made no context for (managed memory, whatever its DLPack device id,
        // is launched on any device): the first one, so that the release still runs relaxed.
        let ctx = device
            .and_then(crate::device_contexts::cached_context)
            .or_else(crate::device_contexts::first_cached_context);
        let mut group = || {
            while let Some(item) = items.next_if(|i| device_of(i).is_none_or(|d| Some(d) == device))
            {
                if leaking() {
                    // The `atexit` hook gave up waiting for this batch (a deleter outlasted its
                    // timeout), or one of its deleters forked and this is the child (which
                    // counted the rest as leaked at the fork): never run them once it has.
                    if !crate::process::forked() {
                        COUNTERS.leaked_at_exit.fetch_add(1, Ordering::Relaxed);
                    }
                    std::mem::forget(item);
                } else {
                    release_one(py, item);
                }
                landing.one_done();
            }
        };
        match ctx {
            Some(ctx) => ctx.releasing(group),
            None => group(),
        }
    }
    drop(items);
    landing.emptied.set(batch);
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
    let is_tensor = matches!(item, Release::Tensor(_) | Release::Taken(_));
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
    pub(crate) fn taken(tensor: Taken) -> PyGuard {
        PyGuard(Some(Release::Taken(tensor)))
    }
}

impl Drop for PyGuard {
    fn drop(&mut self) {
        if let Some(item) = self.0.take() {
            defer_release(item);
        }
    }
}

/// How often the release thread wakes. Memory only tile keeps alive is released within this
/// time of its work finishing, plus the wait for the interpreter (the README states the bound).
pub(crate) const PERIOD: Duration = Duration::from_millis(50);

struct ThreadState {
    /// Whether the thread was started (and has not stopped).
    running: bool,
    /// Whether the thread is between its check for exit and the end of its attach.
    attaching: bool,
}

static THREAD: Mutex<ThreadState> = Mutex::new(ThreadState {
    running: false,
    attaching: false,
});
static CHANGED: Condvar = Condvar::new();
/// Whether the thread was ever started: a lock-free fast path for [`start_thread`].
static STARTED: AtomicBool = AtomicBool::new(false);
/// Completed wake-ups that attached (for `tile_py._testing.release_thread()`).
static CYCLES: AtomicU64 = AtomicU64::new(0);

fn thread_state() -> MutexGuard<'static, ThreadState> {
    THREAD.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts the release thread, once per process (not in a forked child, nor once the
/// interpreter exits). If the thread cannot be spawned, releases happen at calls into tile_py
/// as before.
pub(crate) fn start_thread() {
    if STARTED.load(Ordering::Acquire) || leaking() {
        return;
    }
    let mut st = thread_state();
    if STARTED.load(Ordering::Acquire) {
        return;
    }
    STARTED.store(true, Ordering::Release);
    let spawned = std::thread::Builder::new()
        .name("tile_py-release".into())
        .spawn(run_thread);
    st.running = spawned.is_ok();
}

/// The thread's loop: sleep, then, attached, poll the held streams and drain.
fn run_thread() {
    loop {
        std::thread::sleep(PERIOD);
        {
            let mut st = thread_state();
            if leaking() {
                st.running = false;
                CHANGED.notify_all();
                return;
            }
            if !crate::stream_arg::any_held() && !any_queued() {
                continue;
            }
            st.attaching = true;
        }
        // `try_attach` declines while the interpreter is finalising; the `atexit` hook waits
        // for this attach to end before finalisation begins (`stop_thread`).
        let attached = Python::try_attach(|py| {
            if leaking() {
                return;
            }
            for s in crate::stream_arg::all() {
                s.poll();
            }
            drain(py);
        });
        if attached.is_some() {
            CYCLES.fetch_add(1, Ordering::Relaxed);
        }
        let mut st = thread_state();
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
pub(crate) fn stop_thread(py: Python<'_>, deadline: Option<Instant>) -> bool {
    if crate::process::FORKED.load(Ordering::Acquire) {
        // A forked child has no release thread (and may have inherited the lock held).
        return true;
    }
    py.detach(|| {
        let mut st = thread_state();
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
fn thread_after_fork_in_child() {
    // The parent's thread held this lock only while not attached, and the fork happened on an
    // attached thread: but it may have been between its check and its attach. A fresh state,
    // without taking the lock, is what the child's (single) thread sees.
    STARTED.store(true, Ordering::Release);
    if let Ok(mut st) = THREAD.try_lock() {
        st.running = false;
        st.attaching = false;
    }
}

/// `tile_py._testing.release_thread()`: `{"running": bool, "period_ms": int, "cycles": int}`.
pub(crate) fn describe_thread(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let d = pyo3::types::PyDict::new(py);
    // A forked child has no release thread (and may have inherited the lock held); elsewhere
    // the lock is only ever held briefly.
    let running = !crate::process::FORKED.load(Ordering::Acquire)
        && THREAD.try_lock().map(|st| st.running).unwrap_or(true);
    d.set_item("running", running)?;
    d.set_item("period_ms", PERIOD.as_millis() as u64)?;
    d.set_item("cycles", CYCLES.load(Ordering::Relaxed))?;
    Ok(d)
}
