//! Streams ([`Stream`]) and their release queues: making and wrapping streams, the queue a
//! launch from the calling thread goes to, polling, synchronising and counting.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cuda_sys::{CUstream, CUstream_flags, CuResultExt, driver};

use crate::context::{Context, HandleKind};
use crate::error::Result;
use crate::guard::{Guard, recycle_guards};
use crate::release::{ReleaseConfig, Stats, Tracker};
use crate::timeline::CudaTimeline;

pub(crate) type StreamTracker = Tracker<CudaTimeline, Guard>;

/// The release queues of the per-thread default stream, one per launching thread.
type ThreadTrackers = Vec<(ThreadId, Arc<StreamTracker>)>;

/// What a launch needs of its stream ([`Stream::launch_site`]).
pub(crate) struct LaunchSite<'s> {
    pub(crate) ctx: &'s Arc<Context>,
    pub(crate) raw: CUstream,
    /// [`Stream::checks_pointer_devices`].
    pub(crate) check_pointer_devices: bool,
    /// The release queue of the calling thread.
    pub(crate) tracker: Cow<'s, Arc<StreamTracker>>,
}

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
        crate::capture::relaxed(d, || {
            // SAFETY: out-pointer to a local; the context is current.
            unsafe { (d.cuStreamCreate)(&mut raw, CUstream_flags::CU_STREAM_NON_BLOCKING.0) }
                .check("cuStreamCreate")
        })?;
        Ok(Self::wrap(
            CudaTimeline::new(d, ctx, raw, true, false, None),
            config,
        ))
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
        Self::borrowed(ctx, raw, false, None)
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
        // The default streams are always valid: those are wrapped as by `from_raw`.
        let launch_only = HandleKind::of(raw) == HandleKind::Explicit;
        Self::borrowed(ctx, raw, launch_only, None)
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
        Self::borrowed(ctx, raw, false, Some(owner))
    }

    /// Another library's stream, never destroyed by us.
    fn borrowed(
        ctx: &Arc<Context>,
        raw: CUstream,
        launch_only: bool,
        keep: Option<Box<dyn std::any::Any + Send + Sync>>,
    ) -> Result<Stream> {
        let timeline = CudaTimeline::new(driver()?, ctx, raw, false, launch_only, keep);
        Ok(Self::wrap(timeline, ReleaseConfig::default()))
    }

    fn wrap(timeline: CudaTimeline, config: ReleaseConfig) -> Stream {
        let per_thread = timeline.is_per_thread();
        let tracker = Tracker::recycle_with(timeline, config, recycle_guards);
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

    /// What a launch from the calling thread needs of this stream, looked up once.
    pub(crate) fn launch_site(&self) -> LaunchSite<'_> {
        let timeline = self.inner.tracker.timeline();
        LaunchSite {
            ctx: timeline.context(),
            raw: timeline.raw(),
            check_pointer_devices: self.checks_pointer_devices(),
            tracker: self.tracker_here(),
        }
    }

    /// The release queue that launches from the calling thread go to: the stream's one queue,
    /// or, for the per-thread default stream, the calling thread's (made on first use).
    fn tracker_here(&self) -> Cow<'_, Arc<StreamTracker>> {
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
        let timeline = self.inner.tracker.timeline().for_this_thread();
        let tracker = Tracker::recycle_with(timeline, self.inner.config, recycle_guards);
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
        self.inner.tracker.timeline().raw()
    }

    /// The context this stream belongs to.
    pub fn context(&self) -> &Arc<Context> {
        self.inner.tracker.timeline().context()
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

    /// Whether launches on this stream check the device of each
    /// [trusted](crate::TensorArg::trust_memory) `kDLCUDA` tensor's data pointer against the
    /// stream's (one `cuPointerGetAttribute` per non-empty tensor per launch; a mismatch is
    /// [`Error::PointerDeviceMismatch`](crate::Error::PointerDeviceMismatch)). On by default when
    /// the process sees more than one CUDA device, where a device pointer can be on another.
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
}
