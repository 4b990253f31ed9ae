//! Streams, the events that mark progress on them, and their release queues.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cuda_sys::{
    CUevent, CUevent_flags, CUresult, CUstream, CUstream_flags, CuResultExt, CudaError, Driver,
    driver,
};

use crate::args::Arg;
use crate::bound::BoundLaunch;
use crate::capture::{Capture, CaptureMode};
use crate::check::Checked;
use crate::config::LaunchConfig;
use crate::context::{Context, HandleKind};
use crate::error::Result;
use crate::guard::Guard;
use crate::handle::LaunchHandle;
use crate::module::Kernel;
use crate::release::{ReleaseConfig, Stats, Timeline, Tracker};

/// A CUDA event used as a completion marker (`CU_EVENT_DISABLE_TIMING`).
#[derive(Debug)]
pub struct Event(CUevent);

// SAFETY: an event handle may be recorded, queried and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: every operation on the handle is a thread-safe driver call; `Event` has no interior
// state of its own.
unsafe impl Sync for Event {}

/// The `function` of the error `CudaTimeline::record` returns, without a driver call, where the
/// handle may not be named (see [`CudaTimeline::reachable`]).
const RECORD_REFUSED: &str = "cuEventRecord (a stream named only inside launch calls, or another \
                              thread's per-thread default stream)";
/// As [`RECORD_REFUSED`], for `CudaTimeline::synchronize`.
const SYNCHRONIZE_REFUSED: &str = "cuStreamSynchronize (a stream named only inside launch calls, \
                                   or another thread's per-thread default stream)";

/// The CUDA side of a stream's release queue: records events on the stream, queries and waits
/// on them, and keeps finished events in a pool for reuse.
///
/// Every driver call it makes runs with the stream's context current (pushed when another one,
/// or none, is current, and popped after), whichever thread makes it: a release, a poll or a
/// wait may come from a thread that never used CUDA. For the per-thread default stream, the
/// timeline belongs to one thread ([`Timeline::thread_bound`]): it records and synchronises only
/// there, and answers every other thread from the markers recorded at launch time.
pub struct CudaTimeline {
    d: &'static Driver,
    raw: CUstream,
    kind: HandleKind,
    /// For [`HandleKind::PerThread`]: the thread whose per-thread default stream this is.
    thread: Option<ThreadId>,
    owned: bool,
    /// The handle is vouched for only inside launch calls ([`Stream::from_raw_launch_only`]):
    /// a marker is recorded at every launch, and nothing else ever names the stream.
    launch_only: bool,
    ctx: Arc<Context>,
    pool: Mutex<Vec<Event>>,
    /// Events of [`wait_for`](CudaTimeline::wait_for), kept apart from the markers': an event a
    /// stream was just made to wait on is never re-recorded as that stream's completion marker.
    waits: Mutex<Vec<Event>>,
    // Whatever keeps a borrowed stream alive (e.g. another library's stream object); dropped
    // after the events are destroyed.
    _keep: Option<Box<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: the stream handle is used only through thread-safe driver calls; the pool is behind a
// mutex.
unsafe impl Send for CudaTimeline {}
// SAFETY: as above.
unsafe impl Sync for CudaTimeline {}

impl CudaTimeline {
    /// The timeline of stream `raw` of `ctx`; for the per-thread default stream, the calling
    /// thread's.
    fn new(
        d: &'static Driver,
        ctx: &Arc<Context>,
        raw: CUstream,
        owned: bool,
        launch_only: bool,
        keep: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> CudaTimeline {
        let kind = HandleKind::of(raw);
        CudaTimeline {
            d,
            raw,
            kind,
            thread: (kind == HandleKind::PerThread).then(|| std::thread::current().id()),
            owned,
            launch_only,
            ctx: Arc::clone(ctx),
            pool: Mutex::new(Vec::new()),
            waits: Mutex::new(Vec::new()),
            _keep: keep,
        }
    }

    fn event(&self) -> Result<Event, CudaError> {
        self.event_from(&self.pool)
    }

    fn event_from(&self, pool: &Mutex<Vec<Event>>) -> Result<Event, CudaError> {
        if let Some(e) = pool.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok(e);
        }
        let d = self.d;
        let _bound = self.ctx.bind_with(d)?;
        let mut ev: CUevent = std::ptr::null_mut();
        // Creating an event is harmless to a capture, but relaxed mode keeps it from failing, or
        // invalidating another thread's global-mode capture, on drivers that think otherwise.
        crate::capture_state::relaxed(d, || {
            // SAFETY: out-pointer to a local; the stream's context is current.
            unsafe { (d.cuEventCreate)(&mut ev, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) }
                .check("cuEventCreate")
        })?;
        Ok(Event(ev))
    }

    /// Whether the calling thread is one where this timeline's stream handle names its stream,
    /// outside a launch call: always, except for a per-thread default stream on a thread other
    /// than its own, and a handle vouched for only inside launch calls (`launch_only`).
    fn reachable(&self) -> bool {
        !self.launch_only && self.reachable_in_launch()
    }

    /// As [`reachable`](CudaTimeline::reachable), from inside a launch call.
    fn reachable_in_launch(&self) -> bool {
        self.thread
            .is_none_or(|owner| owner == std::thread::current().id())
    }

    /// `record`, refusing (without a driver call) where the handle may not be named.
    fn record_if(&self, reachable: bool) -> Result<Event, CudaError> {
        let d = self.d;
        if !reachable {
            return Err(CudaError::new(
                CUresult::CUDA_ERROR_INVALID_HANDLE,
                RECORD_REFUSED,
            ));
        }
        let _bound = self.ctx.bind_with(d)?;
        self.refuse_if_capturing("cuEventRecord")?;
        let ev = self.event()?;
        // SAFETY: `ev` is a live event and `self.raw` a live stream of the same context.
        match unsafe { (d.cuEventRecord)(ev.0, self.raw) }.check("cuEventRecord") {
            Ok(()) => Ok(ev),
            Err(e) => {
                self.recycle(ev);
                Err(e)
            }
        }
    }

    /// Refuses, without making the call `call` names, on a thread where the handle names
    /// another stream.
    fn refuse_if_unreachable(&self, call: &'static str) -> Result<(), CudaError> {
        if self.reachable() {
            return Ok(());
        }
        Err(CudaError::new(CUresult::CUDA_ERROR_INVALID_HANDLE, call))
    }

    /// The raw stream handle.
    pub fn raw(&self) -> CUstream {
        self.raw
    }

    /// Refuses, without calling `function`, while the stream captures a graph: recording an
    /// event there would add a node to the graph, and synchronising would invalidate the capture.
    /// One `cuStreamIsCapturing`; the release queue records markers sparingly, so this stays off
    /// the per-launch path.
    /// The stream's context must be current (a default-stream handle names that context's
    /// stream).
    fn refuse_if_capturing(&self, function: &'static str) -> Result<(), CudaError> {
        if crate::capture_state::is_capturing(self.d, self.raw)? {
            return Err(CudaError::new(
                CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                function,
            ));
        }
        Ok(())
    }

    /// Makes this stream wait, on the device, for all work enqueued so far on `producer`
    /// (`cuEventRecord` on `producer`, then `cuStreamWaitEvent`). The host does not block.
    ///
    /// # Safety
    ///
    /// `producer` must be a valid stream of this stream's context (null: the legacy default
    /// stream), and that context should be current.
    pub(crate) unsafe fn wait_for(&self, producer: CUstream) -> Result<(), CudaError> {
        let d = self.d;
        let ev = self.event_from(&self.waits)?;
        // SAFETY: `ev` is a live event of this stream's context; `producer` is a stream handle the
        // caller vouched for.
        let r = unsafe { (d.cuEventRecord)(ev.0, producer) }.check("cuEventRecord");
        let r = r.and_then(|()| {
            // SAFETY: as above; the wait captures the event's state now, so the event may be
            // reused right after.
            unsafe { (d.cuStreamWaitEvent)(self.raw, ev.0, 0) }.check("cuStreamWaitEvent")
        });
        self.waits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ev);
        r
    }
}

impl Timeline for CudaTimeline {
    type Marker = Event;
    type Error = CudaError;

    fn record(&self) -> Result<Event, Self::Error> {
        self.record_if(self.reachable())
    }

    fn record_at_launch(&self) -> Result<Event, Self::Error> {
        self.record_if(self.reachable_in_launch())
    }

    fn is_lost(&self, error: &CudaError) -> bool {
        use CUresult as R;
        match error.code {
            // Our own refusal on a thread (or outside a launch) where the handle names nothing
            // usable says nothing about the stream; the driver's says the handle is dead.
            R::CUDA_ERROR_INVALID_HANDLE => {
                error.function != RECORD_REFUSED && error.function != SYNCHRONIZE_REFUSED
            }
            // The stream or its context is gone (destroyed, reset, the driver shut down or not
            // usable in this process), or the context is poisoned by a fault: every later call
            // on it fails the same way.
            R::CUDA_ERROR_CONTEXT_IS_DESTROYED
            | R::CUDA_ERROR_INVALID_CONTEXT
            | R::CUDA_ERROR_DEINITIALIZED
            | R::CUDA_ERROR_NOT_INITIALIZED
            | R::CUDA_ERROR_DEVICE_UNAVAILABLE
            | R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_ECC_UNCORRECTABLE => true,
            _ => false,
        }
    }

    fn query(&self, marker: &Event) -> Result<bool, Self::Error> {
        let d = self.d;
        let _bound = self.ctx.bind_with(d)?;
        // Our events are recorded outside capture only; relaxed mode keeps the query from
        // failing, or invalidating another thread's global-mode capture.
        crate::capture_state::relaxed(d, || {
            // SAFETY: `marker` is a live event.
            let r = unsafe { (d.cuEventQuery)(marker.0) };
            if r == CUresult::CUDA_ERROR_NOT_READY {
                return Ok(false);
            }
            r.check("cuEventQuery").map(|()| true)
        })
    }

    fn wait(&self, marker: &Event) -> Result<(), Self::Error> {
        let d = self.d;
        let _bound = self.ctx.bind_with(d)?;
        crate::capture_state::relaxed(d, || {
            // SAFETY: `marker` is a live event.
            unsafe { (d.cuEventSynchronize)(marker.0) }.check("cuEventSynchronize")
        })
    }

    fn synchronize(&self) -> Result<(), Self::Error> {
        let d = self.d;
        self.refuse_if_unreachable(SYNCHRONIZE_REFUSED)?;
        let _bound = self.ctx.bind_with(d)?;
        self.refuse_if_capturing("cuStreamSynchronize")?;
        crate::capture_state::relaxed(d, || {
            // SAFETY: `self.raw` is a live stream.
            unsafe { (d.cuStreamSynchronize)(self.raw) }.check("cuStreamSynchronize")
        })
    }

    fn recycle(&self, marker: Event) {
        self.pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(marker);
    }

    fn can_record_now(&self) -> bool {
        if !self.reachable_here() {
            return true; // `record` reports that itself
        }
        let Ok(_bound) = self.ctx.bind_with(self.d) else {
            return true;
        };
        // On a query error, `record` is tried and reports.
        !crate::capture_state::is_capturing(self.d, self.raw).unwrap_or(false)
    }

    fn thread_bound(&self) -> bool {
        self.kind == HandleKind::PerThread || self.launch_only
    }

    fn reachable_here(&self) -> bool {
        self.reachable()
    }

    fn device_memory(&self) -> Option<u64> {
        Some(self.ctx.limits().total_memory).filter(|&m| m > 0)
    }

    fn releasing(&self, release: &mut dyn FnMut()) {
        // Deleters run with the stream's context current (a `cudarc` buffer's free, for one,
        // needs its context, and the releasing thread may never have used CUDA), and may change
        // the calling thread's current context themselves (`cudarc` binds its own): the caller's
        // is put back afterwards.
        crate::context::releasing_in(self.d, self.ctx.raw(), release);
    }
}

impl Drop for CudaTimeline {
    fn drop(&mut self) {
        let d = self.d;
        let _bound = self.ctx.bind_with(d);
        let mut events = std::mem::take(self.pool.get_mut().unwrap_or_else(|p| p.into_inner()));
        events.append(self.waits.get_mut().unwrap_or_else(|p| p.into_inner()));
        for ev in events {
            let destroyed = crate::capture_state::relaxed(d, || {
                // SAFETY: the event is ours and no longer used.
                unsafe { (d.cuEventDestroy)(ev.0) }.check("cuEventDestroy")
            });
            if let Err(e) = destroyed {
                log::error!("{e}");
            }
        }
        if self.owned {
            // Relaxed capture mode: destroying a stream must not invalidate another thread's
            // global-mode capture.
            let destroyed = crate::capture_state::relaxed(d, || {
                // SAFETY: we created this stream and nothing refers to it any more (every
                // tracker handle that could record on it is gone).
                unsafe { (d.cuStreamDestroy)(self.raw) }.check("cuStreamDestroy")
            });
            if let Err(e) = destroyed {
                log::error!("{e}");
            }
        }
    }
}

type StreamTracker = Tracker<CudaTimeline, Guard>;

/// The release queues of the per-thread default stream, one per launching thread.
type ThreadTrackers = Vec<(ThreadId, Arc<StreamTracker>)>;

/// A CUDA stream together with its release queue.
///
/// Cloning is cheap and shares the stream. A stream created by [`Stream::new`] is destroyed
/// when the last clone, and the last launch handle on it, is gone; a borrowed stream
/// ([`Stream::from_raw`]) is never destroyed by us. Dropping the last clone drains the release
/// queue: it waits for the stream's work and releases every deferred tensor.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

struct StreamInner {
    /// The release queue of the stream; for the per-thread default stream, that of the thread
    /// that made this `Stream`.
    tracker: Arc<StreamTracker>,
    /// For the per-thread default stream: one release queue per thread that launched on it
    /// (each thread's per-thread default stream is a stream of its own, with its own order).
    per_thread: Option<Mutex<ThreadTrackers>>,
    /// The thread that made this value (its queue is `tracker`, never dropped).
    creator: ThreadId,
    /// Totals of per-thread queues dropped once idle (see [`Stream::stats`]).
    gone: Mutex<Stats>,
    config: ReleaseConfig,
    check_pointer_devices: AtomicBool,
}

impl StreamInner {
    /// Every release queue of the stream.
    fn trackers(&self) -> Vec<Arc<StreamTracker>> {
        match &self.per_thread {
            None => vec![Arc::clone(&self.tracker)],
            Some(map) => map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(_, t)| Arc::clone(t))
                .collect(),
        }
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        for tracker in self.trackers() {
            tracker.shutdown();
        }
    }
}

/// A non-owning reference to a [`Stream`] (from [`Stream::downgrade`]): it does not keep the
/// stream's state, nor what keeps a borrowed stream alive, from being dropped.
#[derive(Clone, Debug)]
pub struct WeakStream {
    inner: std::sync::Weak<StreamInner>,
}

impl WeakStream {
    /// The stream, if a [`Stream`] value of it still exists.
    pub fn upgrade(&self) -> Option<Stream> {
        self.inner.upgrade().map(|inner| Stream { inner })
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &self.raw())
            .field("device", &self.context().ordinal())
            .finish()
    }
}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream
    /// (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) without a driver; [`Error::Cuda`](crate::Error::Cuda)
    /// if the driver refuses.
    #[doc(alias = "cuStreamCreate")]
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        Self::with_config(ctx, ReleaseConfig::default())
    }

    /// As [`Stream::new`], with explicit release-queue bounds.
    ///
    /// # Errors
    ///
    /// As [`Stream::new`].
    pub fn with_config(ctx: &Arc<Context>, config: ReleaseConfig) -> Result<Stream> {
        let d = driver()?;
        let _bound = ctx.bind()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // Relaxed capture mode: creating a stream is a "potentially unsafe" call that would
        // invalidate another thread's global-mode capture.
        crate::capture_state::relaxed(d, || {
            // SAFETY: out-pointer to a local; the context is current.
            unsafe { (d.cuStreamCreate)(&mut raw, CUstream_flags::CU_STREAM_NON_BLOCKING.0) }
                .check("cuStreamCreate")
        })?;
        Ok(Self::wrap(d, ctx, raw, true, false, None, config))
    }

    /// Wraps a stream created by another library (PyTorch, CuPy, `cudarc`, ...). The stream is
    /// not destroyed by us; the caller keeps it alive for as long as this value and any launch on
    /// it lives. A null handle means the legacy default stream.
    ///
    /// `CU_STREAM_PER_THREAD` (`0x2`) names the calling thread's per-thread default stream at each
    /// launch: each launching thread gets its own release queue, and launches from a thread are
    /// known complete from markers recorded on that thread at launch time, so they may be waited
    /// for, polled and released from any thread, after the launching thread has exited too.
    /// Known driver behaviour (driver 580, CUDA 13.0): a thread whose per-thread default stream
    /// holds a `cuStreamWaitEvent` (a tensor ordered after another stream) behind work still
    /// running never finishes exiting (the driver's thread-exit handler spins); it happens with
    /// plain driver calls too. Wait for such launches on the launching thread before it exits,
    /// or use an explicit stream.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid stream of `ctx` (or null) and stay valid while this `Stream`, its
    /// clones, or any [`LaunchHandle`](crate::LaunchHandle) from it exist.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) without a driver.
    pub unsafe fn from_raw(ctx: &Arc<Context>, raw: CUstream) -> Result<Stream> {
        Ok(Self::wrap(
            driver()?,
            ctx,
            raw,
            false,
            false,
            None,
            ReleaseConfig::default(),
        ))
    }

    /// As [`Stream::from_raw`], for a handle that its owner may destroy once the work launched
    /// on it has finished, without telling tile (an int handle from another library, say): the
    /// handle is named only inside the calls that launch on it (and
    /// [`wait_for_raw`](Stream::wait_for_raw)). Each launch records a completion marker on the
    /// stream, inside the launch call (one `cuEventRecord` per launch); waits, polls,
    /// synchronisations and releases are answered from those markers and never name the
    /// stream. [`synchronize`](Stream::synchronize) then waits for the launches made through
    /// this value, not for the stream's other work.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid stream of `ctx` (or a default-stream handle) during every call
    /// that launches on this value or its clones, and must keep naming that stream until the
    /// work so launched has finished (destroying it after that is fine; a handle destroyed
    /// while the work runs may be reused by a new stream).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) without a driver.
    pub unsafe fn from_raw_launch_only(ctx: &Arc<Context>, raw: CUstream) -> Result<Stream> {
        let d = driver()?;
        // The default streams are always valid: those are wrapped as by `from_raw`.
        let launch_only = HandleKind::of(raw) == HandleKind::Explicit;
        Ok(Self::wrap(
            d,
            ctx,
            raw,
            false,
            launch_only,
            None,
            ReleaseConfig::default(),
        ))
    }

    /// As [`Stream::from_raw`], holding `owner` (the other library's stream object) until the
    /// stream is no longer used.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid stream of `ctx` (or null) for as long as `owner` lives.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) without a driver.
    pub unsafe fn from_raw_keeping(
        ctx: &Arc<Context>,
        raw: CUstream,
        owner: Box<dyn std::any::Any + Send + Sync>,
    ) -> Result<Stream> {
        Ok(Self::wrap(
            driver()?,
            ctx,
            raw,
            false,
            false,
            Some(owner),
            ReleaseConfig::default(),
        ))
    }

    fn wrap(
        d: &'static Driver,
        ctx: &Arc<Context>,
        raw: CUstream,
        owned: bool,
        launch_only: bool,
        keep: Option<Box<dyn std::any::Any + Send + Sync>>,
        config: ReleaseConfig,
    ) -> Stream {
        let timeline = CudaTimeline::new(d, ctx, raw, owned, launch_only, keep);
        let per_thread = timeline.thread.is_some();
        let tracker = Tracker::recycle_with(timeline, config, crate::launch::recycle_guards);
        let per_thread = per_thread
            .then(|| Mutex::new(vec![(std::thread::current().id(), Arc::clone(&tracker))]));
        Stream {
            inner: Arc::new(StreamInner {
                tracker,
                per_thread,
                creator: std::thread::current().id(),
                gone: Mutex::new(Stats::default()),
                config,
                check_pointer_devices: AtomicBool::new(Context::several_devices()),
            }),
        }
    }

    /// The release queue that launches from the calling thread go to: the stream's one queue,
    /// or, for the per-thread default stream, the calling thread's (made on first use).
    pub(crate) fn tracker_here(&self) -> Cow<'_, Arc<StreamTracker>> {
        let Some(map) = &self.inner.per_thread else {
            return Cow::Borrowed(&self.inner.tracker);
        };
        let me = std::thread::current().id();
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, tracker)) = map.iter().find(|(t, _)| *t == me) {
            return Cow::Owned(Arc::clone(tracker));
        }
        // Threads come and go (a thread pool, say): drop the queues of other threads that
        // nobody refers to any more (no handle holds them) and that queue nothing, keeping
        // their totals.
        map.retain(|(t, tracker)| {
            let keep = *t == self.inner.creator
                || Arc::strong_count(tracker) > 1
                || tracker.stats().pending_guards > 0;
            if !keep {
                let mut gone = self.inner.gone.lock().unwrap_or_else(|p| p.into_inner());
                *gone = gone.plus(&tracker.stats());
            }
            keep
        });
        let first = self.inner.tracker.timeline();
        let timeline = CudaTimeline::new(first.d, &first.ctx, first.raw, false, false, None);
        let tracker =
            Tracker::recycle_with(timeline, self.inner.config, crate::launch::recycle_guards);
        map.push((me, Arc::clone(&tracker)));
        Cow::Owned(tracker)
    }

    /// Whether the stream's handle, used on the calling thread, names the stream of every
    /// launch made through this value: always, except for the per-thread default stream once
    /// another thread has launched on it.
    #[cfg(feature = "cudarc")]
    pub(crate) fn names_every_launch_here(&self) -> bool {
        let Some(map) = &self.inner.per_thread else {
            return true;
        };
        let me = std::thread::current().id();
        map.lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .all(|(t, tracker)| *t == me || tracker.stats().launches == 0)
    }

    /// The raw `CUstream` handle.
    pub fn raw(&self) -> CUstream {
        self.inner.tracker.timeline().raw
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &Arc<Context> {
        &self.inner.tracker.timeline().ctx
    }

    /// Makes this stream wait, on the device, for all work enqueued so far on `producer`
    /// (`cuEventRecord` + `cuStreamWaitEvent`); the host does not block. Use it when a tensor's
    /// data is still being written on the stream that produced it.
    ///
    /// # Safety
    ///
    /// `producer` must be a valid stream of this stream's context (or null for the legacy
    /// default stream).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`](crate::Error::Cuda) if recording or waiting fails.
    #[doc(alias = "cuStreamWaitEvent")]
    pub unsafe fn wait_for_raw(&self, producer: CUstream) -> Result<()> {
        if producer == self.raw() {
            return Ok(());
        }
        let _bound = self.context().bind()?;
        // SAFETY: this function's contract; the context is bound above. A default-stream handle
        // names the calling thread's stream here, as it does for the launches made from it.
        Ok(unsafe { self.tracker_here().timeline().wait_for(producer) }?)
    }

    /// Blocks until all work on the stream is done, then releases every deferred tensor
    /// (`cuEventRecord` + `cuEventSynchronize`, or `cuStreamSynchronize`).
    ///
    /// For the per-thread default stream, "the stream" is every thread's that launched through
    /// this value: the calling thread's is synchronised as a whole, another thread's up to the
    /// last launch made through tile (its marker, recorded at launch time on that thread), since
    /// the handle cannot name another thread's stream.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`](crate::Error::Cuda) if the wait fails (counted in
    /// [`Stats::errors`]); nothing is released then, and when the error says the stream or its
    /// context is gone or poisoned (destroyed, reset, a kernel fault), what the release queue
    /// held is leaked and counted ([`Stats::guards_leaked`]) and the queue is left empty.
    #[doc(alias = "cuStreamSynchronize")]
    pub fn synchronize(&self) -> Result<()> {
        // Every queue is synchronised, even after one failed; the first error is returned.
        let mut first = Ok(());
        for tracker in self.inner.trackers() {
            if let Err(e) = tracker.synchronize()
                && first.is_ok()
            {
                first = Err(e.into());
            }
        }
        first
    }

    /// Releases deferred tensors whose work has completed, without blocking. Returns how many
    /// were released. Never fails: errors are counted in [`Stats::errors`], and a stream found
    /// lost (destroyed, its context destroyed or reset, a kernel fault) leaks and counts what its
    /// release queue held, once (see [`Stream::synchronize`]).
    pub fn poll(&self) -> usize {
        self.inner.trackers().iter().map(|t| t.poll()).sum()
    }

    /// Whether launches on this stream check the data pointer of each device tensor whose
    /// memory is [trusted](crate::TensorArg::trust_memory) against the stream's device
    /// (`cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, one driver call per
    /// non-empty `kDLCUDA` tensor per launch, before anything is consumed). Tensors that are not
    /// trusted are always asked about (their memory kind and device, in one call).
    ///
    /// On by default when the process sees more than one CUDA device, off with a single device
    /// (where a device pointer cannot be on another device). Pinned host and managed memory are
    /// never checked (usable from every device); a pointer the driver does not know is let
    /// through. A mismatch is [`Error::PointerDeviceMismatch`](crate::Error::PointerDeviceMismatch).
    pub fn checks_pointer_devices(&self) -> bool {
        self.inner.check_pointer_devices.load(Ordering::Relaxed)
    }

    /// Turns the pointer-device check of [`checks_pointer_devices`](Stream::checks_pointer_devices)
    /// on or off for this stream and its clones (e.g. off on a hot path whose producers are
    /// trusted to describe their devices correctly).
    #[doc(alias = "cuPointerGetAttribute")]
    pub fn set_check_pointer_devices(&self, on: bool) {
        self.inner
            .check_pointer_devices
            .store(on, Ordering::Relaxed);
    }

    /// A [`WeakStream`] of this stream, for caches that must not keep it alive.
    pub fn downgrade(&self) -> WeakStream {
        WeakStream {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Whether dropping this value would drop the stream's state with nothing lost: no guard is
    /// queued or held by a handle on any of its release queues, no launch is deferred, and this
    /// is the only [`Stream`] value of it (clones included; [`WeakStream`]s do not count).
    /// Makes no driver call. A cache of streams uses it to forget streams whose work has been
    /// released, so that it neither keeps their owners alive nor touches their handles later
    /// (a handle may be destroyed and reused for a new stream).
    pub fn is_forgettable(&self) -> bool {
        if Arc::strong_count(&self.inner) != 1 {
            return false;
        }
        self.inner.trackers().iter().all(|t| t.is_quiescent())
    }

    /// The release queue's bound on the bytes it alone keeps alive, in bytes
    /// ([`ReleaseConfig::max_pending_bytes`](crate::ReleaseConfig::max_pending_bytes) resolved
    /// against the device's memory when the stream was made).
    pub fn max_pending_bytes(&self) -> u64 {
        self.inner.tracker.max_pending_bytes()
    }

    /// Whether a release queue of this stream holds at least half of one of its bounds, so that
    /// a launch or a `defer` on it may wait for queued work first (e.g. to decide whether to
    /// release an interpreter lock around the call). Takes no lock of the queue (for the
    /// per-thread default stream, the map of per-thread queues is locked, and no queue is
    /// made); racy by nature (another thread may fill or drain a queue meanwhile).
    pub fn near_release_bound(&self) -> bool {
        self.any_queue(|t| t.near_bound())
    }

    /// Whether a launch on this stream keeping `guards` guards alive, `bytes` of them bytes
    /// that only the release queue would keep alive (exports the producer copied, DLPack
    /// `IS_COPIED`), may wait for queued work before it is enqueued: the queue near its bounds
    /// ([`near_release_bound`](Stream::near_release_bound)), or the queue plus this launch over
    /// one. Takes no lock of the queue; as racy as `near_release_bound`.
    pub fn launch_may_wait(&self, guards: usize, bytes: u64) -> bool {
        self.any_queue(|t| t.near_bound() || t.would_wait(guards, bytes))
    }

    /// Whether `pred` holds for a release queue of this stream (for the per-thread default
    /// stream, for any thread's queue, without making one).
    fn any_queue(&self, pred: impl Fn(&StreamTracker) -> bool) -> bool {
        match &self.inner.per_thread {
            None => pred(&self.inner.tracker),
            Some(map) => map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|(_, t)| pred(t)),
        }
    }

    /// Counters of the release queue: pending guards and bytes, released and leaked totals.
    pub fn stats(&self) -> Stats {
        let gone = *self.inner.gone.lock().unwrap_or_else(|p| p.into_inner());
        self.inner
            .trackers()
            .iter()
            .fold(gone, |sum, t| sum.plus(&t.stats()))
    }

    // The launch: checked once (`check.rs`), then enqueued (`launch.rs`).

    /// Checks a launch of `kernel` with `config` and `args` on this stream, consuming nothing,
    /// and returns it [`Checked`], ready to be launched.
    ///
    /// Checks, in this order: the configuration against the device's limits, every argument
    /// against the kernel's [`Signature`](crate::Signature) (count, kind, dtype, device,
    /// writability of outputs, dense row-major layout for plain pointer parameters, scalar
    /// range), the kernel's own limits for the configuration (dynamic shared memory, cooperative
    /// occupancy), the memory of each tensor (unless [trusted](crate::TensorArg::trust_memory),
    /// the driver must know its data pointer as device, managed or page-locked host memory: one
    /// `cuPointerGetAttributes` per tensor), whether the stream is capturing a graph (one
    /// `cuStreamGetCaptureInfo`), and then that each producer stream joins that capture.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig), [`Error::ArgumentCount`](crate::Error::ArgumentCount), [`Error::ArgumentKind`](crate::Error::ArgumentKind),
    /// [`Error::DtypeMismatch`](crate::Error::DtypeMismatch), [`Error::DeviceMismatch`](crate::Error::DeviceMismatch), [`Error::PointerDeviceMismatch`](crate::Error::PointerDeviceMismatch),
    /// [`Error::NotDeviceMemory`](crate::Error::NotDeviceMemory), [`Error::NotContiguous`](crate::Error::NotContiguous), [`Error::Descriptor`](crate::Error::Descriptor),
    /// [`Error::NdimMismatch`](crate::Error::NdimMismatch), [`Error::IndexOverflow`](crate::Error::IndexOverflow), [`Error::ProducerOutsideCapture`](crate::Error::ProducerOutsideCapture),
    /// and [`Error::Cuda`](crate::Error::Cuda) from a driver call the checks make (e.g.
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`). Nothing is consumed: tensors handed over
    /// already consumed are released (with the capture mode relaxed), `Unused` ones are left to
    /// their producers.
    #[doc(alias = "cuStreamGetCaptureInfo")]
    #[doc(alias = "cuPointerGetAttributes")]
    #[inline]
    pub fn check<'s, 'a>(
        &'s self,
        kernel: &'s Kernel,
        config: &'s LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<Checked<'s, 'a>> {
        crate::check::check(self, kernel, config, args, false)
    }

    /// Launches `kernel` on this stream (`cuLaunchKernel`, or `cuLaunchKernelEx` when the
    /// configuration needs launch attributes): [`Stream::check`], then [`Checked::launch`]. The
    /// returned handle owns the consumed tensors until the work is done. Nothing is consumed or
    /// launched when a check fails.
    ///
    /// # Errors
    ///
    /// Those of [`Stream::check`] (nothing consumed, nothing launched) and of
    /// [`Checked::launch`] (every tensor consumed and released).
    ///
    /// # Capture
    ///
    /// If the stream is capturing a graph (one `cuStreamGetCaptureInfo` per launch tells), the
    /// tensors are handed to the graph (see [`capture`](crate::capture)) and the handle owns
    /// nothing ([`LaunchHandle::is_captured`]).
    #[doc(alias = "cuLaunchKernel")]
    #[doc(alias = "cuLaunchKernelEx")]
    #[inline]
    pub fn launch<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<LaunchHandle> {
        self.check(kernel, config, args)?.launch()
    }

    /// As [`Stream::launch`], with no handle: the tensors go straight to the stream's release
    /// queue ([`Checked::launch_queued`]), for a caller that never waits for this launch in
    /// particular; they are released once a later launch, [`Stream::poll`],
    /// [`Stream::synchronize`] or the stream's drop sees the work complete.
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`].
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch_queued<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<()> {
        self.check(kernel, config, args)?.launch_queued()
    }

    /// Binds `kernel` and `config` to this stream for repeated launches: checks the
    /// configuration against the device's limits and prepares the kernel for it once (the
    /// shared-memory opt-in, `cuKernelSetAttribute`; the cooperative grid bound,
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessor`), so that [`BoundLaunch::launch`] makes
    /// none of those checks again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the limit and the value;
    /// [`Error::Cuda`](crate::Error::Cuda) when a driver call fails;
    /// [`Error::Driver`](crate::Error::Driver) when no driver is installed. Nothing is bound
    /// then.
    #[doc(alias = "cuKernelSetAttribute")]
    pub fn bind(&self, kernel: &Kernel, config: &LaunchConfig) -> Result<BoundLaunch> {
        crate::bound::bind(self, kernel, config)
    }

    /// Begins capturing the work enqueued on this stream into a CUDA graph
    /// (`cuStreamBeginCapture`). Launches on the stream until [`Capture::end`] are captured:
    /// they run when the graph is launched, and the graph owns their tensors.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`](crate::Error::Cuda) if the driver refuses, e.g. on the legacy default stream
    /// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) or a stream already capturing
    /// (`CUDA_ERROR_ILLEGAL_STATE`).
    #[doc(alias = "cuStreamBeginCapture")]
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<Capture<'_>> {
        crate::capture::begin(self, mode)
    }

    /// Launches on a `cudarc` stream. The stream is kept alive (its `Arc` is held) for as long
    /// as this value or any launch on it lives.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) without a driver; [`Error::WrongContext`](crate::Error::WrongContext) if `ctx` is not the stream's
    /// device; [`Error::NonPrimaryContext`](crate::Error::NonPrimaryContext) if the stream's `cudarc` context is not that
    /// device's primary context (`ctx`): tile launches only in primary contexts.
    #[cfg(feature = "cudarc")]
    pub fn from_cudarc(
        ctx: &Arc<Context>,
        stream: &Arc<cudarc::driver::CudaStream>,
    ) -> Result<Stream> {
        crate::cudarc_interop::stream_from_cudarc(ctx, stream)
    }
}
