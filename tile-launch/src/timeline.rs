//! The CUDA side of a stream's release queue ([`CudaTimeline`]): completion markers
//! ([`Event`]) recorded on the stream, queried and waited on.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cuda_sys::{
    CUevent, CUevent_flags, CUresult, CUstream, CUstreamCaptureMode, CuResultExt, CudaError, Driver,
};

use crate::context::{Context, ContextGuard, HandleKind};
use crate::release::Timeline;

thread_local! {
    /// What the launch call in progress on this thread knows ([`LaunchInProgress`]).
    static IN_LAUNCH: Cell<InLaunch> = const {
        Cell::new(InLaunch {
            known: std::ptr::null(),
            relaxed_from: NOT_RELAXED,
        })
    };
}

/// The state behind [`LaunchInProgress`], per thread.
#[derive(Clone, Copy)]
struct InLaunch {
    /// The timeline (stream and context) of the launch call in progress, past its check; null
    /// outside one, and from the moment foreign code runs in it. Kept alive by the launch.
    known: *const CudaTimeline,
    /// The stream-capture mode this thread had before the launch call relaxed it (for its
    /// release queue's queries and releases), put back when the call ends; [`NOT_RELAXED`]
    /// while the call has not relaxed it.
    relaxed_from: u32,
}

/// [`InLaunch::relaxed_from`] of a launch call that has not relaxed the capture mode.
const NOT_RELAXED: u32 = u32::MAX;

/// What a launch call knows of its stream from its own check, for the release queue's calls
/// that follow in the same call (the amortised marker, the poll, the release of completed
/// work): the stream's context is current on this thread, and the stream is not capturing.
/// While it is known, [`CudaTimeline`] asks neither again: no `cuCtxGetCurrent` (nor push and
/// pop) around its marker, query and release, no `cuStreamIsCapturing` before recording. And
/// the thread's stream-capture mode, relaxed for the first query of the call, stays relaxed
/// until the call ends: one `cuThreadExchangeStreamCaptureMode` pair per launch call instead of
/// one per query and one per release.
///
/// Why that is sound. The check bound the context ([`ContextGuard`], held until the launch
/// call returns) and asked `cuStreamGetCaptureInfo` once; the launch went on only because the
/// stream was not capturing. From the check to the end of the call only tile's own code runs
/// on this thread, until a deleter does: every deleter runs inside
/// [`releasing_in`](crate::context::releasing_in), which ends what is known for the rest of
/// the call ([`LaunchInProgress::forget`]), so that a deleter that changes the current context,
/// the capture mode or begins a capture is asked about again. Another thread cannot change this
/// thread's current context or capture mode. Another thread can begin a capture on the stream
/// meanwhile, but then the launch itself (enqueued, or about to be, with its tensors in the
/// release queue) was taken for an uncaptured one: asking again before the marker would not
/// make that race sound, so it buys nothing; the race is the caller's (CUDA does not order a
/// capture begun on one thread against work enqueued on the same stream from another). What
/// the check found must hold until the launch, which [`Checked`](crate::Checked) states.
#[must_use = "what the launch knows lasts only while this value lives"]
pub(crate) struct LaunchInProgress {
    d: &'static Driver,
    previous: InLaunch,
    // Tied to this thread, where the knowledge holds.
    _thread: PhantomData<*const ()>,
}

impl LaunchInProgress {
    /// Records, until the value is dropped, that the stream of `timeline` is known not to be
    /// capturing and its context current on this thread. Call it only in a launch call past
    /// its check that found the stream not capturing, with the check's binding of the context
    /// (`_bound`) alive, and `timeline` kept alive, for as long as this value.
    #[inline]
    pub(crate) fn enter(timeline: &CudaTimeline, _bound: &ContextGuard<'_>) -> Self {
        let previous = IN_LAUNCH.with(|k| {
            k.replace(InLaunch {
                known: timeline,
                relaxed_from: NOT_RELAXED,
            })
        });
        LaunchInProgress {
            d: timeline.d,
            previous,
            _thread: PhantomData,
        }
    }

    /// Whether a launch in progress on this thread knows the stream of `timeline`.
    #[inline]
    fn knows(timeline: &CudaTimeline) -> bool {
        std::ptr::eq(IN_LAUNCH.with(|k| k.get()).known, timeline)
    }

    /// Whether the launch in progress on this thread relaxed its capture mode, and no foreign
    /// code ran since (the mode is still relaxed).
    fn knows_relaxed() -> bool {
        let now = IN_LAUNCH.with(|k| k.get());
        !now.known.is_null() && now.relaxed_from != NOT_RELAXED
    }

    /// Relaxes the thread's capture mode for the rest of the launch call in progress
    /// (`cuThreadExchangeStreamCaptureMode`, the first time only; put back when the call ends).
    fn relax(d: &Driver) -> Result<(), CudaError> {
        let now = IN_LAUNCH.with(|k| k.get());
        if now.relaxed_from != NOT_RELAXED {
            return Ok(());
        }
        let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let previous = crate::capture::exchange_mode(d, relaxed)?;
        IN_LAUNCH.with(|k| {
            k.set(InLaunch {
                relaxed_from: previous.0,
                ..now
            })
        });
        Ok(())
    }

    /// Forgets what the launch in progress on this thread knows, for the rest of the call:
    /// foreign code (a deleter) is about to run. A relaxed capture mode is still put back
    /// when the call ends.
    pub(crate) fn forget() {
        IN_LAUNCH.with(|k| {
            let now = k.get();
            k.set(InLaunch {
                known: std::ptr::null(),
                ..now
            })
        });
    }
}

impl Drop for LaunchInProgress {
    #[inline]
    fn drop(&mut self) {
        let relaxed_from = IN_LAUNCH.with(|k| k.replace(self.previous)).relaxed_from;
        // A launch made from inside a deleter leaves its caller's state as it found it
        // (forgotten, since the deleter runs); its own relaxed mode goes back first.
        if relaxed_from != NOT_RELAXED {
            let mode = CUstreamCaptureMode(relaxed_from);
            if let Err(e) = crate::capture::exchange_mode(self.d, mode) {
                log::error!("restoring the caller's stream-capture mode: {e}");
            }
        }
    }
}

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
    pub(crate) fn new(
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
        crate::capture::relaxed(d, || {
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
        self.recording(reachable, || {
            let ev = self.event()?;
            match self.record_event(&ev) {
                Ok(()) => Ok(ev),
                Err(e) => {
                    self.recycle(ev);
                    Err(e)
                }
            }
        })
    }

    /// `rerecord`: as [`record_if`](CudaTimeline::record_if), into an event of this timeline's.
    fn rerecord_if(&self, reachable: bool, ev: &Event) -> Result<(), CudaError> {
        self.recording(reachable, || self.record_event(ev))
    }

    /// Runs `record` where an event may be recorded on the stream: refuses (without a driver
    /// call) where the handle may not be named; outside a launch call, binds the context and
    /// refuses while the stream is capturing.
    fn recording<R>(
        &self,
        reachable: bool,
        record: impl FnOnce() -> Result<R, CudaError>,
    ) -> Result<R, CudaError> {
        if !reachable {
            return Err(CudaError::new(
                CUresult::CUDA_ERROR_INVALID_HANDLE,
                RECORD_REFUSED,
            ));
        }
        // Inside a launch call, its check bound the context and found the stream not capturing
        // ([`LaunchInProgress`]): neither is asked again.
        let _bound = if self.known_in_launch() {
            None
        } else {
            let bound = self.ctx.bind_with(self.d)?;
            self.refuse_if_capturing("cuEventRecord")?;
            Some(bound)
        };
        record()
    }

    /// `cuEventRecord` of `ev` on the stream, whose context is current.
    fn record_event(&self, ev: &Event) -> Result<(), CudaError> {
        // SAFETY: `ev` is a live event and `self.raw` a live stream of the same context.
        unsafe { (self.d.cuEventRecord)(ev.0, self.raw) }.check("cuEventRecord")
    }

    /// Whether the launch call in progress on this thread knows this stream not capturing and
    /// its context current ([`LaunchInProgress`]).
    fn known_in_launch(&self) -> bool {
        LaunchInProgress::knows(self)
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

    /// The context of the stream.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Whether this is the timeline of a per-thread default stream (on one thread).
    pub(crate) fn is_per_thread(&self) -> bool {
        self.thread.is_some()
    }

    /// A timeline of the same stream for the calling thread, borrowing the handle.
    pub(crate) fn for_this_thread(&self) -> CudaTimeline {
        CudaTimeline::new(self.d, &self.ctx, self.raw, false, false, None)
    }

    /// Refuses, without calling `function`, while the stream captures a graph: recording an
    /// event there would add a node to the graph, and synchronising would invalidate the capture.
    /// One `cuStreamIsCapturing`, never asked inside a launch call, whose check asked already
    /// ([`LaunchInProgress`]). The stream's context must be current (a default-stream handle
    /// names that context's stream).
    fn refuse_if_capturing(&self, function: &'static str) -> Result<(), CudaError> {
        if crate::capture::is_capturing(self.d, self.raw)? {
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

    fn rerecord(&self, marker: &mut Event) -> Result<(), Self::Error> {
        self.rerecord_if(self.reachable(), marker)
    }

    fn rerecord_at_launch(&self, marker: &mut Event) -> Result<(), Self::Error> {
        self.rerecord_if(self.reachable_in_launch(), marker)
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
        let query = || {
            // SAFETY: `marker` is a live event.
            let r = unsafe { (d.cuEventQuery)(marker.0) };
            if r == CUresult::CUDA_ERROR_NOT_READY {
                return Ok(false);
            }
            r.check("cuEventQuery").map(|()| true)
        };
        // Inside a launch call the context is bound already, and the capture mode stays
        // relaxed until the call ends ([`LaunchInProgress`]).
        if self.known_in_launch() {
            LaunchInProgress::relax(d)?;
            return query();
        }
        let _bound = self.ctx.bind_with(d)?;
        crate::capture::relaxed(d, query)
    }

    fn wait(&self, marker: &Event) -> Result<(), Self::Error> {
        let d = self.d;
        let _bound = self.ctx.bind_with(d)?;
        crate::capture::relaxed(d, || {
            // SAFETY: `marker` is a live event.
            unsafe { (d.cuEventSynchronize)(marker.0) }.check("cuEventSynchronize")
        })
    }

    fn synchronize(&self) -> Result<(), Self::Error> {
        let d = self.d;
        self.refuse_if_unreachable(SYNCHRONIZE_REFUSED)?;
        let _bound = self.ctx.bind_with(d)?;
        self.refuse_if_capturing("cuStreamSynchronize")?;
        crate::capture::relaxed(d, || {
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
        if self.known_in_launch() {
            return true; // the launch's own check found it not capturing
        }
        let Ok(_bound) = self.ctx.bind_with(self.d) else {
            return true;
        };
        // On a query error, `record` is tried and reports.
        !crate::capture::is_capturing(self.d, self.raw).unwrap_or(false)
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
        let in_launch = self.known_in_launch().then(LaunchInProgress::knows_relaxed);
        crate::context::releasing_in(self.d, self.ctx.raw(), in_launch, release);
    }
}

impl Drop for CudaTimeline {
    fn drop(&mut self) {
        let d = self.d;
        let _bound = self.ctx.bind_with(d);
        let mut events = std::mem::take(self.pool.get_mut().unwrap_or_else(|p| p.into_inner()));
        events.append(self.waits.get_mut().unwrap_or_else(|p| p.into_inner()));
        for ev in events {
            let destroyed = crate::capture::relaxed(d, || {
                // SAFETY: the event is ours and no longer used.
                unsafe { (d.cuEventDestroy)(ev.0) }.check("cuEventDestroy")
            });
            if let Err(e) = destroyed {
                log::error!("{e}");
            }
        }
        if self.owned {
            let destroyed = crate::capture::relaxed(d, || {
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
