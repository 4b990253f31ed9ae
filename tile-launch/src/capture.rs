//! CUDA graph capture: launches on a capturing stream, the user objects that keep their tensors
//! alive, the release thread, and a minimal capture API ([`Capture`], [`Graph`], [`GraphExec`]).
//!
//! # Launching while a stream captures
//!
//! A launch on a stream that is capturing a CUDA graph does not run; it becomes a kernel node of
//! the graph and runs each time an executable instance of the graph is launched. Recording or
//! querying a completion event there would break the capture, and no event could tell when the
//! tensors are free anyway: the graph may be replayed any number of times. So
//! [`Stream::launch`](crate::Stream::launch) detects capture (`cuStreamGetCaptureInfo`, one driver
//! call per launch) and, when the stream captures, bypasses the release queue:
//!
//! 1. the launch's guards are boxed into a *parcel* and owned by a CUDA user object
//!    (`cuUserObjectCreate` with `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`);
//! 2. the graph being captured takes over the user object's only reference
//!    (`cuGraphRetainUserObject` with `CU_GRAPH_USER_OBJECT_MOVE`). Every executable graph
//!    instantiated from it, and every clone, holds its own reference;
//! 3. the kernel is launched (captured).
//!
//! When the last graph, clone or executable graph holding the user object is destroyed (for an
//! executable graph: once its launches in flight have completed), CUDA calls the destructor on one
//! of its internal threads. The destructor ([`release_parcel`]) only moves the guards into a
//! channel; a dedicated release thread (`tile-graph-release`) drops them, each inside
//! `catch_unwind`. The destructor calls neither CUDA nor Python, never blocks on anything but the
//! channel's short internal lock, and never unwinds into C.
//!
//! A capture that is aborted or invalidated destroys its graph, which runs the destructor: the
//! guards are released then, exactly once.
//!
//! The returned [`LaunchHandle`](crate::LaunchHandle) owns nothing: `retire`, `try_retire` and
//! `defer` return at once, and `is_complete` is an error ([`Error::CapturedLaunch`]).
//!
//! # The release queue during capture
//!
//! A stream's release queue never records an event on its stream while the stream captures
//! (recording fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` without calling the driver; the
//! queue keeps its entries, or leaks a handle's tensors if a caller insisted on waiting). Its
//! events are recorded outside capture only, so querying them is legal.
//!
//! # The release thread
//!
//! Each parcel carries (and retains) the context of the stream whose capture it was attached
//! to; the release thread makes it current while it drops that parcel's guards, so that
//! deleters that free memory run in the right context. The thread's capture mode is relaxed for
//! its whole life.
//!
//! # Graphs with allocation nodes
//!
//! A temporary allocated inside the capture (`cuMemAllocAsync` on a capturing stream, e.g.
//! `cudarc`'s `alloc`) is a graph allocation: its address is fixed, and each launch of the
//! executable graph allocates it again. tile holds it like any other tensor until the graph, its
//! clones and executable graphs are gone; its producer's free then runs after the last launch has
//! completed and frees that launch's allocation (a free outside the graph, which CUDA allows).
//! [`Graph::instantiate`] passes `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`, so that each
//! relaunch first frees the previous launch's allocation and the graph can be replayed.
//!
//! Why not release such a guard inside the capture, so that its producer's free becomes a free
//! node after tile's kernel node? Only a guard whose memory is *known* to be an allocation of
//! this capture could be, and only if its deleter frees stream-ordered on a stream of the same
//! capture; a deleter run early that frees otherwise (another stream, `cuMemFree`) would free
//! memory the kernel node uses at every replay. tile does tell a graph allocation apart (the
//! capture graph's allocation nodes: `cuGraphGetNodes`, `cuGraphNodeGetType`,
//! `cuGraphMemAllocNodeGetParams`; pointer attributes do not say it), but only to accept it
//! where the driver knows no memory at the pointer (host memory labelled as device memory is
//! refused inside captures as outside), not to know how its deleter frees. So tile takes the
//! safe side: it never runs a deleter before the graph is gone, and costs at most one graph allocation
//! kept between the last launch and the graph's destruction. A graph that is destroyed without
//! ever being launched never made the allocation; its producer's late free may then fail (and
//! `cudarc` records that error).
//!
//! # Capture status and capture mode
//!
//! The queries of a stream's capture status (`capturing_graph`, `capture_id`, `is_capturing`)
//! and the calling thread's capture-mode switch (`relaxed`) live here too, for the launch path,
//! the release queue, streams, contexts and kernels alike.
//!
//! # Shutdown
//!
//! The release thread lives for the rest of the process. Parcels whose graphs are still alive at
//! exit are never released (their deleters do not run): a documented leak, counted by nobody.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::{self, ManuallyDrop};
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cuda_sys::{
    CUgraph, CUgraphExec, CUgraphInstantiate_flags, CUresult, CUstream, CUstreamCaptureMode,
    CUstreamCaptureStatus, CUuserObject, CUuserObject_flags, CUuserObjectRetain_flags, CuResultExt,
    CudaError, Driver,
};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::stream::Stream;
use crate::sync::{AtomicU64, Ordering, Receiver, Sender, channel};

/// Counters of a [`GraphReleaser`]. Totals count since it was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct CaptureStats {
    /// Guards attached to graphs (parcels made).
    pub attached: u64,
    /// Guards whose parcel's destructor has run (handed to the release thread).
    pub handed_off: u64,
    /// Guards dropped by the release thread (including those whose drop panicked); named as
    /// [`Stats::guards_released`](crate::release::Stats::guards_released).
    pub guards_released: u64,
    /// Guards whose drop panicked (also counted in `released`).
    pub release_panics: u64,
    /// Guards never dropped because the release thread was gone when their parcel was
    /// destroyed; named as [`Stats::guards_leaked`](crate::release::Stats::guards_leaked).
    pub guards_leaked: u64,
}

#[derive(Default)]
struct Counters {
    attached: AtomicU64,
    handed_off: AtomicU64,
    released: AtomicU64,
    release_panics: AtomicU64,
    leaked: AtomicU64,
}

/// Hands the guards of captured launches from user-object destructors (CUDA's internal threads)
/// to a release thread that drops them.
///
/// Independent of CUDA: [`parcel`](GraphReleaser::parcel) packs guards into the pointer a user
/// object carries, and [`release_parcel`] is the destructor CUDA calls with it. Tests drive the
/// two directly. The process-wide releaser of [`Guard`]s is [`graph_releaser`].
pub struct GraphReleaser<G: Send + 'static> {
    tx: Sender<Handoff<G>>,
    counters: Arc<Counters>,
}

impl<G: Send + 'static> std::fmt::Debug for GraphReleaser<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphReleaser")
            .field("stats", &self.stats())
            .finish()
    }
}

/// What a user object owns: the guards, the context to release them in, and the way to the
/// release thread.
struct Parcel<G: Send + 'static> {
    guards: ManuallyDrop<Vec<G>>,
    ctx: Option<Arc<Context>>,
    tx: Sender<Handoff<G>>,
    counters: Arc<Counters>,
}

/// What travels from a destructor to the release thread: a parcel's guards and the context that
/// is made current while they are dropped (`None`: whatever is current, for CPU-only users).
struct Handoff<G> {
    guards: Vec<G>,
    ctx: Option<Arc<Context>>,
}

impl<G: Send + 'static> GraphReleaser<G> {
    /// Starts a release thread named `name`. The thread ends once this releaser and every parcel
    /// it made are gone.
    ///
    /// The thread's stream-capture mode is relaxed for its whole life (once, at its start;
    /// skipped without a driver), since the deleters it runs may free memory while another
    /// thread captures in global mode.
    ///
    /// # Errors
    ///
    /// [`Error::ReleaseThread`] if the thread cannot be spawned.
    #[doc(alias = "cuThreadExchangeStreamCaptureMode")]
    pub fn new(name: &str) -> Result<Self> {
        let (releaser, receiver) = Self::unstarted();
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                relax_this_thread();
                while receiver.release_next() {}
            })
            .map_err(Error::ReleaseThread)?;
        Ok(releaser)
    }

    /// A releaser whose release-thread side is returned instead of run on a thread of its own:
    /// whoever holds the [`ReleaseReceiver`] releases the handed-off guards by calling
    /// [`ReleaseReceiver::release_next`]. [`GraphReleaser::new`] runs it on a thread; models and
    /// tests drive it themselves.
    pub fn unstarted() -> (Self, ReleaseReceiver<G>) {
        let (tx, rx) = channel::<Handoff<G>>();
        let counters = Arc::new(Counters::default());
        let receiver = ReleaseReceiver {
            rx,
            counters: Arc::clone(&counters),
        };
        (Self { tx, counters }, receiver)
    }

    /// Packs `guards` into a parcel for a user object. The pointer must reach
    /// [`release_parcel::<G>`] exactly once (CUDA's destructor call does that), or be given to
    /// [`GraphReleaser::reclaim`]; until then the guards are alive. The release thread drops
    /// them with whatever context is current on it (none); see
    /// [`parcel_in`](GraphReleaser::parcel_in).
    pub fn parcel(&self, guards: Vec<G>) -> *mut c_void {
        self.parcel_in(guards, None)
    }

    /// As [`parcel`](GraphReleaser::parcel), and the release thread makes `ctx` current while it
    /// drops these guards (`cuCtxPushCurrent` / `cuCtxPopCurrent`), so that deleters freeing
    /// memory of that context find it current. The parcel keeps `ctx` retained until then.
    #[doc(alias = "cuCtxPushCurrent")]
    pub fn parcel_in(&self, guards: Vec<G>, ctx: Option<Arc<Context>>) -> *mut c_void {
        self.counters
            .attached
            .fetch_add(guards.len() as u64, Ordering::SeqCst);
        let parcel = Box::new(Parcel {
            guards: ManuallyDrop::new(guards),
            ctx,
            tx: self.tx.clone(),
            counters: Arc::clone(&self.counters),
        });
        Box::into_raw(parcel).cast()
    }

    /// Takes the guards back out of a parcel that no user object owns (creating the user object
    /// failed).
    ///
    /// # Safety
    ///
    /// `p` came from [`parcel`](GraphReleaser::parcel) of a releaser of the same `G` and was
    /// neither reclaimed nor passed to [`release_parcel`].
    pub unsafe fn reclaim(p: *mut c_void) -> Vec<G> {
        // SAFETY: the caller's contract: `p` is an unconsumed `Box<Parcel<G>>`.
        let parcel = unsafe { Box::from_raw(p.cast::<Parcel<G>>()) };
        let n = parcel.guards.len() as u64;
        parcel.counters.attached.fetch_sub(n, Ordering::SeqCst);
        let mut parcel = ManuallyDrop::new(parcel);
        // SAFETY: taken once; the parcel's remaining fields are dropped below.
        let guards = unsafe { ManuallyDrop::take(&mut parcel.guards) };
        drop(ManuallyDrop::into_inner(parcel));
        guards
    }

    /// A function reading the counters, usable after this releaser is gone. The counters are
    /// read one at a time, so a snapshot taken while parcels move is not a single instant.
    pub fn counters(&self) -> impl Fn() -> CaptureStats + Send + 'static {
        let counters = Arc::clone(&self.counters);
        move || counters.snapshot()
    }

    /// A snapshot of the counters (read one at a time: while parcels move, not one instant).
    pub fn stats(&self) -> CaptureStats {
        self.counters.snapshot()
    }
}

impl Counters {
    fn snapshot(&self) -> CaptureStats {
        CaptureStats {
            attached: self.attached.load(Ordering::SeqCst),
            handed_off: self.handed_off.load(Ordering::SeqCst),
            guards_released: self.released.load(Ordering::SeqCst),
            release_panics: self.release_panics.load(Ordering::SeqCst),
            guards_leaked: self.leaked.load(Ordering::SeqCst),
        }
    }
}

/// The release-thread side of a [`GraphReleaser`]: receives the guards that user-object
/// destructors hand off, and drops them.
pub struct ReleaseReceiver<G: Send + 'static> {
    rx: Receiver<Handoff<G>>,
    counters: Arc<Counters>,
}

impl<G: Send + 'static> ReleaseReceiver<G> {
    /// Waits for the next handed-off parcel and drops its guards in order, each inside
    /// `catch_unwind` (a panicking deleter is counted and logged), with the parcel's context
    /// current when it has one (pushed, then popped: the thread's current context is the same
    /// after). If that context cannot be made current the guards are dropped anyway and the
    /// error is logged. Returns `false`, releasing nothing, once the releaser and every parcel
    /// it made are gone.
    pub fn release_next(&self) -> bool {
        let Ok(Handoff { guards, ctx }) = self.rx.recv() else {
            return false;
        };
        let bound = ctx.as_deref().map(Context::bind);
        if let Some(Err(e)) = &bound {
            log::error!(
                "tile-launch graph release: cannot make the graph's context current; \
                 its tensors' deleters run without it: {e}"
            );
        }
        let mut panics = 0u64;
        let n = guards.len() as u64;
        for guard in guards {
            if panic::catch_unwind(AssertUnwindSafe(move || drop(guard))).is_err() {
                panics += 1;
                log::error!(
                    "tile-launch graph release: a guard's drop (a tensor's deleter) panicked"
                );
            }
        }
        // Pop the context before counting, so a watcher that sees the count finds it restored.
        drop(bound);
        drop(ctx);
        self.counters.released.fetch_add(n, Ordering::SeqCst);
        self.counters
            .release_panics
            .fetch_add(panics, Ordering::SeqCst);
        true
    }
}

/// Sets the calling thread's stream-capture mode to relaxed for good
/// (`cuThreadExchangeStreamCaptureMode`); without a driver, or if the call fails, it logs and
/// leaves the mode as it is.
fn relax_this_thread() {
    let Ok(d) = cuda_sys::driver() else { return };
    // The previous mode is discarded on purpose: this thread stays relaxed.
    let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    if let Err(e) = exchange_mode(d, relaxed) {
        log::warn!("tile-launch graph release thread stays in its default capture mode: {e}");
    }
}

/// The user-object destructor: moves a parcel's guards into the release thread's channel.
///
/// Runs on a CUDA internal thread. It calls no CUDA function and no Python, drops no guard
/// (if the channel is closed the guards are leaked and counted), and catches every panic.
///
/// # Safety
///
/// `p` came from [`GraphReleaser::parcel`] of a releaser of the same `G`, and this is the only
/// call made with it (CUDA calls a user object's destructor once).
pub unsafe extern "C" fn release_parcel<G: Send + 'static>(p: *mut c_void) {
    let result = panic::catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the caller's contract: `p` is an unconsumed `Box<Parcel<G>>`.
        let parcel = unsafe { Box::from_raw(p.cast::<Parcel<G>>()) };
        let mut parcel = ManuallyDrop::new(parcel);
        // SAFETY: taken once; the guards are never dropped on this thread.
        let guards = unsafe { ManuallyDrop::take(&mut parcel.guards) };
        let n = guards.len() as u64;
        // The context goes with the guards: dropping its last `Arc` here would call CUDA.
        let ctx = parcel.ctx.take();
        let counters = Arc::clone(&parcel.counters);
        counters.handed_off.fetch_add(n, Ordering::SeqCst);
        if let Err(back) = parcel.tx.send(Handoff { guards, ctx }) {
            counters.leaked.fetch_add(n, Ordering::SeqCst);
            mem::forget(back.0);
        }
        // Drops the sender clone and the counters' `Arc`: no guard, no CUDA, no Python.
        drop(ManuallyDrop::into_inner(parcel));
    }));
    if let Err(payload) = result {
        // Never unwind into C; never drop a payload whose drop could panic again.
        mem::forget(payload);
    }
}

/// The process-wide release thread of captured launches' guards, started on first use.
///
/// # Errors
///
/// [`Error::ReleaseThread`] if the thread cannot be spawned.
pub fn graph_releaser() -> Result<&'static GraphReleaser<Guard>> {
    static RELEASER: OnceLock<GraphReleaser<Guard>> = OnceLock::new();
    if let Some(r) = RELEASER.get() {
        return Ok(r);
    }
    let r = GraphReleaser::new("tile-graph-release")?;
    // Another thread may have won the race; its releaser is used and ours ends with it.
    Ok(RELEASER.get_or_init(|| r))
}

/// Counters of the process-wide release of captured launches' guards ([`graph_releaser`]);
/// all zero before the first captured launch.
pub fn capture_stats() -> CaptureStats {
    graph_releaser().map(|r| r.stats()).unwrap_or_default()
}

/// Attaches `guards` to `graph` (being captured on a stream of `ctx`) with a user object the
/// graph owns. Returns how many guards were attached. The release thread drops them with `ctx`
/// current, which the parcel keeps retained until then.
///
/// Every guard is held until the graph, its clones and executable graphs are gone, graph
/// allocations included (see the module docs, "Graphs with allocation nodes").
///
/// On error, `refused` says what becomes of the guards. For a launch ([`Refused::Release`])
/// nothing was captured that uses them: if the user object could not be created they are
/// dropped here at once; if the graph refused the reference, releasing the user object hands
/// them to the release thread. For a hold ([`Refused::Leak`]) the work that uses them is in the
/// graph already: they are leaked (logged), never released while the graph may still run it.
pub(crate) fn attach(
    d: &Driver,
    graph: CUgraph,
    ctx: &Arc<Context>,
    guards: Vec<Guard>,
    refused: Refused<'_>,
) -> Result<usize> {
    let leak = |guards: Vec<Guard>, e: &dyn std::fmt::Display, count: &dyn Fn(usize)| {
        log::error!(
            "tile-launch capture: {e}; {} guard(s) of work already captured are leaked",
            guards.len()
        );
        count(guards.len());
        std::mem::forget(guards);
    };
    let releaser = match graph_releaser() {
        Ok(r) => r,
        Err(e) => {
            if let Refused::Leak(count) = refused {
                leak(guards, &e, count);
            }
            return Err(e);
        }
    };
    let n = guards.len();
    let p = releaser.parcel_in(guards, Some(Arc::clone(ctx)));
    let mut object: CUuserObject = std::ptr::null_mut();
    // SAFETY: `p` is a parcel of `Guard`s and `release_parcel::<Guard>` its matching destructor,
    // which CUDA calls exactly once when the last reference goes; one initial reference (ours).
    let created = unsafe {
        (d.cuUserObjectCreate)(
            &mut object,
            p,
            Some(release_parcel::<Guard>),
            1,
            CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
        )
    }
    .check("cuUserObjectCreate");
    if let Err(e) = created {
        // SAFETY: no user object owns `p`; it is reclaimed once.
        let parcel = unsafe { GraphReleaser::<Guard>::reclaim(p) };
        match refused {
            Refused::Release => ctx.releasing(|| drop(parcel)),
            Refused::Leak(count) => leak(parcel, &e, count),
        }
        return Err(e.into());
    }
    // SAFETY: `graph` is the graph the stream is capturing into; `object` is live with our one
    // reference, which MOVE transfers to the graph.
    let retained = unsafe {
        (d.cuGraphRetainUserObject)(
            graph,
            object,
            1,
            CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0,
        )
    }
    .check("cuGraphRetainUserObject");
    if let Err(e) = retained {
        if let Refused::Leak(count) = refused {
            // Our one reference is never released: the destructor never runs.
            log::error!(
                "tile-launch capture: {e}; {n} guard(s) of work already captured are leaked"
            );
            count(n);
            return Err(e.into());
        }
        // SAFETY: we still hold the one reference; releasing it runs the destructor (hand-off).
        if let Err(e2) = unsafe { (d.cuUserObjectRelease)(object, 1) }.check("cuUserObjectRelease")
        {
            log::error!("tile-launch capture: {e2}; the launch's tensors are leaked");
        }
        return Err(e.into());
    }
    Ok(n)
}

/// What [`attach`] does with guards the graph did not take.
#[derive(Clone, Copy)]
pub(crate) enum Refused<'a> {
    /// Release them: nothing captured uses them (a launch not enqueued yet).
    Release,
    /// Leak them, and count how many: work already captured uses them (a hold).
    Leak(&'a dyn Fn(usize)),
}

/// How a capture interacts with potentially unsafe CUDA calls made by other code while it runs
/// (`CUstreamCaptureMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureMode {
    /// Unsafe calls from any thread in global mode fail and invalidate the capture
    /// (`CU_STREAM_CAPTURE_MODE_GLOBAL`, PyTorch's default).
    Global,
    /// Only unsafe calls from the capturing thread are prohibited
    /// (`CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`).
    ThreadLocal,
    /// Nothing is prohibited (`CU_STREAM_CAPTURE_MODE_RELAXED`).
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> CUstreamCaptureMode {
        match self {
            CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// A capture in progress on a stream, begun by [`Stream::begin_capture`]. End it with
/// [`end`](Capture::end) to get the [`Graph`]; dropping it aborts the capture (ends it and
/// destroys the graph, which releases the tensors of the launches captured so far).
///
/// Not `Send`: a capture not begun in relaxed mode must end on the thread that began it.
#[must_use = "dropping a capture aborts it"]
#[derive(Debug)]
pub struct Capture<'s> {
    stream: &'s Stream,
    ended: bool,
    _thread: PhantomData<*const ()>,
}

impl Stream {
    /// Begins capturing the work enqueued on this stream into a CUDA graph
    /// (`cuStreamBeginCapture`). Launches on the stream until [`Capture::end`] are captured:
    /// they run when the graph is launched, and the graph owns their tensors.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the driver refuses, e.g. on the legacy default stream
    /// (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) or a stream already capturing
    /// (`CUDA_ERROR_ILLEGAL_STATE`).
    #[doc(alias = "cuStreamBeginCapture")]
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<Capture<'_>> {
        let d = cuda_sys::driver()?;
        let _bound = self.context().bind_with(d)?;
        // SAFETY: `self.raw()` is a live stream of the current context.
        unsafe { (d.cuStreamBeginCapture)(self.raw(), mode.raw()) }
            .check("cuStreamBeginCapture")?;
        Ok(Capture {
            stream: self,
            ended: false,
            _thread: PhantomData,
        })
    }
}

impl Capture<'_> {
    fn end_raw(&mut self) -> Result<CUgraph> {
        self.ended = true;
        let d = cuda_sys::driver()?;
        let _bound = self.stream.context().bind_with(d)?;
        let mut graph: CUgraph = std::ptr::null_mut();
        // SAFETY: the stream captures (begun by us, on this thread); out-pointer to a local.
        unsafe { (d.cuStreamEndCapture)(self.stream.raw(), &mut graph) }
            .check("cuStreamEndCapture")?;
        Ok(graph)
    }

    /// Ends the capture and returns the captured graph (`cuStreamEndCapture`).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] with `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` if the capture was
    /// invalidated (e.g. by a synchronising call during capture); CUDA has then destroyed the
    /// partial graph, and the captured launches' tensors are released.
    #[doc(alias = "cuStreamEndCapture")]
    pub fn end(mut self) -> Result<Graph> {
        let raw = self.end_raw()?;
        Ok(Graph {
            raw,
            ctx: Arc::clone(self.stream.context()),
        })
    }
}

impl Drop for Capture<'_> {
    /// Aborts: ends the capture and destroys the graph (`cuStreamEndCapture` +
    /// `cuGraphDestroy`).
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        match self.end_raw() {
            Ok(raw) if !raw.is_null() => drop(Graph {
                raw,
                ctx: Arc::clone(self.stream.context()),
            }),
            Ok(_) => {}
            Err(e) => log::debug!("tile-launch: aborting a capture: {e}"),
        }
    }
}

/// A CUDA graph (`CUgraph`), destroyed when dropped (`cuGraphDestroy`). Destroying it drops its
/// references to the user objects of captured launches; their tensors are released once no
/// clone or executable graph holds them either.
///
/// `Send` but not `Sync`: CUDA graphs are not internally synchronised.
#[derive(Debug)]
pub struct Graph {
    raw: CUgraph,
    ctx: Arc<Context>,
}

// SAFETY: a graph handle may be used from any thread, one at a time (`Graph` is not `Sync`).
unsafe impl Send for Graph {}

impl Graph {
    /// The raw `CUgraph` handle; still owned by this value.
    pub fn raw(&self) -> CUgraph {
        self.raw
    }

    /// A copy of the graph (`cuGraphClone`); it holds its own references to the user objects.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the driver refuses.
    #[doc(alias = "cuGraphClone")]
    pub fn try_clone(&self) -> Result<Graph> {
        let d = cuda_sys::driver()?;
        let _bound = self.ctx.bind_with(d)?;
        let mut raw: CUgraph = std::ptr::null_mut();
        // SAFETY: `self.raw` is a live graph; out-pointer to a local.
        unsafe { (d.cuGraphClone)(&mut raw, self.raw) }.check("cuGraphClone")?;
        Ok(Graph {
            raw,
            ctx: Arc::clone(&self.ctx),
        })
    }

    /// Instantiates an executable graph (`cuGraphInstantiateWithFlags` with
    /// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`); it holds its own references to the
    /// user objects.
    ///
    /// With that flag, a graph allocation the graph does not free itself (a temporary allocated
    /// during capture, e.g. with `cuMemAllocAsync`, whose free tile holds back until the graph
    /// is gone) is freed before each relaunch, so the graph can be replayed; without it the
    /// second launch fails with `CUDA_ERROR_INVALID_VALUE`. Graphs without allocation nodes are
    /// unaffected. A graph with allocation or free nodes may have only one executable graph at
    /// a time (a CUDA rule).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the driver refuses (e.g. a second executable graph of a graph with
    /// memory nodes).
    #[doc(alias = "cuGraphInstantiate")]
    #[doc(alias = "cuGraphInstantiateWithFlags")]
    pub fn instantiate(&self) -> Result<GraphExec> {
        let d = cuda_sys::driver()?;
        let _bound = self.ctx.bind_with(d)?;
        let mut raw: CUgraphExec = std::ptr::null_mut();
        let flags =
            u64::from(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH.0);
        // SAFETY: `self.raw` is a live graph of the current context; out-pointer to a local; a
        // valid instantiation flag.
        unsafe { (d.cuGraphInstantiate)(&mut raw, self.raw, flags) }
            .check("cuGraphInstantiateWithFlags")?;
        Ok(GraphExec {
            raw,
            ctx: Arc::clone(&self.ctx),
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let Ok(d) = cuda_sys::driver() else { return };
        // SAFETY: the graph is ours and nothing else refers to it.
        if let Err(e) = unsafe { (d.cuGraphDestroy)(self.raw) }.check("cuGraphDestroy") {
            log::error!("{e}");
        }
    }
}

/// An executable graph (`CUgraphExec`), destroyed when dropped (`cuGraphExecDestroy`; launches
/// still in flight finish first, and the user objects they hold are released after them).
///
/// `Send` but not `Sync`: executable graphs are not internally synchronised.
#[derive(Debug)]
pub struct GraphExec {
    raw: CUgraphExec,
    ctx: Arc<Context>,
}

// SAFETY: an executable graph handle may be used from any thread, one at a time (not `Sync`).
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// The raw `CUgraphExec` handle; still owned by this value.
    pub fn raw(&self) -> CUgraphExec {
        self.raw
    }

    /// Launches the graph on `stream` (`cuGraphLaunch`); returns at once. The stream must belong
    /// to the graph's device.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the launch fails (e.g. a stream of another device).
    #[doc(alias = "cuGraphLaunch")]
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let d = cuda_sys::driver()?;
        let _bound = self.ctx.bind_with(d)?;
        // SAFETY: `self.raw` is a live executable graph; `stream.raw()` a live stream.
        unsafe { (d.cuGraphLaunch)(self.raw, stream.raw()) }.check("cuGraphLaunch")?;
        Ok(())
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let Ok(d) = cuda_sys::driver() else { return };
        // SAFETY: the executable graph is ours and nothing else refers to it; CUDA frees it
        // after its launches in flight.
        if let Err(e) = unsafe { (d.cuGraphExecDestroy)(self.raw) }.check("cuGraphExecDestroy") {
            log::error!("{e}");
        }
    }
}

/// A stream's capture status, the id of its capture sequence and the graph being captured
/// (`cuStreamGetCaptureInfo`, one call).
fn capture_info(
    d: &Driver,
    stream: CUstream,
) -> Result<(CUstreamCaptureStatus, u64, CUgraph), CudaError> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    let mut graph: CUgraph = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; the optional dependency outputs are null (not wanted).
    unsafe {
        (d.cuStreamGetCaptureInfo)(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .check("cuStreamGetCaptureInfo")?;
    Ok((status, id, graph))
}

/// The graph `stream` is capturing into and the capture's id, or `None` when it is not
/// capturing (`cuStreamGetCaptureInfo`, one call).
///
/// An invalidated capture is an error (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`): a launch into
/// it would fail anyway.
pub(crate) fn capturing_graph(
    d: &Driver,
    stream: CUstream,
) -> Result<Option<(CUgraph, u64)>, CudaError> {
    match capture_info(d, stream)? {
        (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, ..) => Ok(None),
        (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, id, graph) => {
            Ok(Some((graph, id)))
        }
        _ => Err(CudaError::new(
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            "cuStreamGetCaptureInfo",
        )),
    }
}

/// Whether `ptr` lies in memory that an allocation node of `graph` (or of a graph nested in it,
/// `depth` levels down so far) allocates: `cuGraphGetNodes`, then per node `cuGraphNodeGetType`
/// and `cuGraphMemAllocNodeGetParams` (or `cuGraphChildGraphNodeGetGraph`). Only asked for a
/// pointer the driver does not know while its stream captures, to tell a graph allocation (no
/// backing until the graph runs) from host memory labelled as device memory. Queries only: the
/// capture is not disturbed.
#[doc(alias = "cuGraphMemAllocNodeGetParams")]
pub(crate) fn graph_allocates(
    d: &Driver,
    graph: CUgraph,
    ptr: u64,
    depth: u32,
) -> Result<bool, CudaError> {
    use cuda_sys::{CUDA_MEM_ALLOC_NODE_PARAMS, CUgraphNode, CUgraphNodeType};
    // Graphs nest as deep as their makers nest them; past this, nothing is assumed allocated.
    const MAX_DEPTH: u32 = 16;
    if depth > MAX_DEPTH {
        return Ok(false);
    }
    let mut n: usize = 0;
    // SAFETY: a null node array asks for the count only; `graph` is the live graph of a capture
    // in progress (or a child of it), which may be queried.
    unsafe { (d.cuGraphGetNodes)(graph, std::ptr::null_mut(), &mut n) }.check("cuGraphGetNodes")?;
    if n == 0 {
        return Ok(false);
    }
    let mut nodes: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `nodes` has room for `n` handles; the driver writes at most `n`.
    unsafe { (d.cuGraphGetNodes)(graph, nodes.as_mut_ptr(), &mut n) }.check("cuGraphGetNodes")?;
    nodes.truncate(n);
    for node in nodes {
        let mut ty = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: `node` is a node of `graph`; out-pointer to a local.
        unsafe { (d.cuGraphNodeGetType)(node, &mut ty) }.check("cuGraphNodeGetType")?;
        if ty == CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEM_ALLOC {
            // SAFETY: a plain C struct of integers and pointers, for which all-zero is valid.
            let mut p: CUDA_MEM_ALLOC_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: an allocation node; the driver fills the whole parameter struct (its
            // access descriptors stay owned by the node).
            unsafe { (d.cuGraphMemAllocNodeGetParams)(node, &mut p) }
                .check("cuGraphMemAllocNodeGetParams")?;
            let start = p.dptr;
            if ptr >= start && ptr - start < p.bytesize as u64 {
                return Ok(true);
            }
        } else if ty == CUgraphNodeType::CU_GRAPH_NODE_TYPE_GRAPH {
            let mut child: CUgraph = std::ptr::null_mut();
            // SAFETY: a child-graph node; the handle returned is owned by the node.
            unsafe { (d.cuGraphChildGraphNodeGetGraph)(node, &mut child) }
                .check("cuGraphChildGraphNodeGetGraph")?;
            if graph_allocates(d, child, ptr, depth + 1)? {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// Whether `stream` is capturing (active or invalidated), with `cuStreamIsCapturing`.
pub(crate) fn is_capturing(d: &Driver, stream: CUstream) -> Result<bool, CudaError> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: out-pointer to a local.
    unsafe { (d.cuStreamIsCapturing)(stream, &mut status) }.check("cuStreamIsCapturing")?;
    Ok(status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Runs `f` with the calling thread's stream-capture mode set to relaxed, then restores it
/// (`cuThreadExchangeStreamCaptureMode`, twice). Every "potentially unsafe" call tile makes
/// outside a launch (creating and destroying streams and events, querying and waiting on
/// events, retaining and releasing contexts, loading libraries and kernels, setting kernel
/// attributes, running deleters) goes through it: in global mode such a call, from any
/// thread, fails and invalidates the capture another thread has in progress.
pub(crate) fn relaxed<R>(
    d: &Driver,
    f: impl FnOnce() -> Result<R, CudaError>,
) -> Result<R, CudaError> {
    relaxed_with(d, f)
}

/// [`relaxed`] for a closure with any error type a [`CudaError`] converts into (tile's own
/// first-use calls: loading a library, looking up a kernel, setting its attributes, occupancy).
pub(crate) fn relaxed_with<R, E: From<CudaError>>(
    d: &Driver,
    f: impl FnOnce() -> Result<R, E>,
) -> Result<R, E> {
    let previous = exchange_mode(d, CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    // Restore even if `f` panics.
    struct Restore<'a>(&'a Driver, CUstreamCaptureMode);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            if let Err(e) = exchange_mode(self.0, self.1) {
                log::error!("{e}");
            }
        }
    }
    let _restore = Restore(d, previous);
    f()
}

/// Sets the calling thread's stream-capture mode to `mode` and returns the one it replaces
/// (`cuThreadExchangeStreamCaptureMode`). [`relaxed`] for a scope; the graph release thread
/// calls it once, to stay relaxed for its whole life.
pub(crate) fn exchange_mode(
    d: &Driver,
    mode: CUstreamCaptureMode,
) -> Result<CUstreamCaptureMode, CudaError> {
    let mut mode = mode;
    // SAFETY: in/out pointer to a local holding a valid mode.
    unsafe { (d.cuThreadExchangeStreamCaptureMode)(&mut mode) }
        .check("cuThreadExchangeStreamCaptureMode")?;
    Ok(mode)
}

/// The capture sequence `stream` belongs to: `Some(id)` while it captures (active or
/// invalidated), `None` otherwise (`cuStreamGetCaptureInfo`).
pub(crate) fn capture_id(d: &Driver, stream: CUstream) -> Result<Option<u64>, CudaError> {
    let (status, id, _) = capture_info(d, stream)?;
    Ok((status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
}
