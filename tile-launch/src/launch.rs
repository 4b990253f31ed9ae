//! Launch configuration, arguments, and the launch itself.

use std::ffi::c_void;
use std::fmt;

use cuda_sys::{
    CUfunction, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
    CUstream, CUstreamCaptureStatus, CuResultExt, CudaError,
};
use smallvec::SmallVec;
use tile_dlpack::{Unused, Used};

use crate::context::DeviceLimits;
use crate::error::{Error, Result};
use crate::module::{Kernel, Param, ScalarType, Signature};
use crate::release::{Pending, Retired};
use crate::stream::{CudaTimeline, Stream};

/// Grid, block or cluster dimensions `(x, y, z)`, each at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dim3 {
    /// Extent along x.
    pub x: u32,
    /// Extent along y.
    pub y: u32,
    /// Extent along z.
    pub z: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }
    /// The product `x * y * z`.
    pub fn volume(&self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Dim3 {
        Dim3::new(x, 1, 1)
    }
}
impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Dim3 {
        Dim3::new(x, y, 1)
    }
}
impl From<(u32, u32, u32)> for Dim3 {
    fn from((x, y, z): (u32, u32, u32)) -> Dim3 {
        Dim3::new(x, y, z)
    }
}

/// How to launch: grid and block dimensions, dynamic shared memory and launch attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Number of blocks along each axis.
    pub grid: Dim3,
    /// Number of threads per block along each axis.
    pub block: Dim3,
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
    /// Thread block cluster dimensions, in blocks (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`).
    /// Each grid dimension must be a multiple of the cluster's.
    pub cluster: Option<Dim3>,
    /// A cooperative launch, whose blocks may synchronise across the grid
    /// (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`).
    pub cooperative: bool,
    /// Programmatic dependent launch: this kernel may start before the previous kernel on the
    /// stream finishes, up to its `griddepcontrol.wait`
    /// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`).
    pub programmatic_dependent_launch: bool,
}

impl LaunchConfig {
    /// A plain launch of `grid` blocks of `block` threads.
    pub fn new(grid: impl Into<Dim3>, block: impl Into<Dim3>) -> LaunchConfig {
        LaunchConfig {
            grid: grid.into(),
            block: block.into(),
            shared_mem_bytes: 0,
            cluster: None,
            cooperative: false,
            programmatic_dependent_launch: false,
        }
    }

    /// One thread per element for `n` elements in blocks of `block` threads (grid rounded up).
    pub fn for_elements(n: u64, block: u32) -> LaunchConfig {
        let blocks = n.div_ceil(u64::from(block.max(1))).max(1);
        LaunchConfig::new(u32::try_from(blocks).unwrap_or(u32::MAX), block)
    }

    /// Checks the configuration against CUDA's rules and the device's limits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the value and the limit it breaks.
    pub fn validate(&self, limits: &DeviceLimits) -> Result<()> {
        let check = |what, value: u64, limit: u64| {
            if value == 0 {
                Err(Error::InvalidConfig {
                    what,
                    value,
                    limit: 1,
                })
            } else if value > limit {
                Err(Error::InvalidConfig { what, value, limit })
            } else {
                Ok(())
            }
        };
        let g = self.grid;
        let b = self.block;
        check("grid.x", g.x.into(), limits.max_grid[0].into())?;
        check("grid.y", g.y.into(), limits.max_grid[1].into())?;
        check("grid.z", g.z.into(), limits.max_grid[2].into())?;
        check("block.x", b.x.into(), limits.max_block[0].into())?;
        check("block.y", b.y.into(), limits.max_block[1].into())?;
        check("block.z", b.z.into(), limits.max_block[2].into())?;
        check(
            "block size (x*y*z)",
            b.volume(),
            limits.max_threads_per_block.into(),
        )?;
        // Above `max_shared_mem_per_block` the kernel opts in at launch; the kernel's static
        // shared memory is subtracted there too (`Kernel::prepare_launch`).
        if self.shared_mem_bytes > limits.max_shared_mem_per_block_optin {
            return Err(Error::InvalidConfig {
                what: "shared_mem_bytes (the device's opt-in limit per block)",
                value: self.shared_mem_bytes.into(),
                limit: limits.max_shared_mem_per_block_optin.into(),
            });
        }
        if let Some(c) = self.cluster {
            if !limits.cluster_launch {
                return Err(Error::InvalidConfig {
                    what: "cluster (device has no cluster launch)",
                    value: c.volume(),
                    limit: 0,
                });
            }
            check("cluster.x", c.x.into(), g.x.into())?;
            check("cluster.y", c.y.into(), g.y.into())?;
            check("cluster.z", c.z.into(), g.z.into())?;
            check("cluster size (x*y*z, portable limit)", c.volume(), 8)?;
            for (what, gd, cd) in [
                ("grid.x % cluster.x", g.x, c.x),
                ("grid.y % cluster.y", g.y, c.y),
                ("grid.z % cluster.z", g.z, c.z),
            ] {
                if gd % cd != 0 {
                    return Err(Error::InvalidConfig {
                        what,
                        value: (gd % cd).into(),
                        limit: 0,
                    });
                }
            }
        }
        if self.cooperative && !limits.cooperative_launch {
            return Err(Error::InvalidConfig {
                what: "cooperative (device has no cooperative launch)",
                value: 1,
                limit: 0,
            });
        }
        if self.cooperative && self.grid.volume() > limits.max_cooperative_grid() {
            return Err(Error::InvalidConfig {
                what: "grid size (x*y*z) of a cooperative launch (the device's most resident \
                       blocks per SM times its SM count)",
                value: self.grid.volume(),
                limit: limits.max_cooperative_grid(),
            });
        }
        let (major, _) = limits.compute_capability;
        if self.programmatic_dependent_launch && major < 9 {
            return Err(Error::InvalidConfig {
                what: "programmatic_dependent_launch (needs compute capability 9.0; the device's \
                       major version is the value)",
                value: major.into(),
                limit: 9,
            });
        }
        Ok(())
    }
}

/// A scalar kernel argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Scalar {
    /// `bool`.
    Bool(bool),
    /// Any integer, converted to the parameter's integer type if it fits.
    Int(i128),
    /// Any float, converted to the parameter's float type (`f64` → `f32` rounds; a finite value
    /// beyond f32's range is refused).
    Float(f64),
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Scalar {
            fn from(x: $t) -> Scalar { Scalar::$v(x.into()) }
        }
        impl From<$t> for Arg<'_> {
            fn from(x: $t) -> Self { Arg::Scalar(Scalar::$v(x.into())) }
        }
    )*};
}
scalar_from!(bool => Bool, i8 => Int, i16 => Int, i32 => Int, i64 => Int, u8 => Int, u16 => Int,
    u32 => Int, u64 => Int, f32 => Float, f64 => Float);

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "bool {b}"),
            Scalar::Int(i) => write!(f, "integer {i}"),
            Scalar::Float(x) => write!(f, "float {x}"),
        }
    }
}

impl Scalar {
    /// The value's bytes as the kernel receives it (little-endian, in the low bytes of a `u64`).
    fn encode(&self, ty: ScalarType) -> Option<u64> {
        use ScalarType as T;
        Some(match (*self, ty) {
            (Scalar::Bool(b), T::Bool) => u64::from(b),
            (Scalar::Int(i), T::I8) => i8::try_from(i).ok()? as u8 as u64,
            (Scalar::Int(i), T::I16) => i16::try_from(i).ok()? as u16 as u64,
            (Scalar::Int(i), T::I32) => i32::try_from(i).ok()? as u32 as u64,
            (Scalar::Int(i), T::I64) => i64::try_from(i).ok()? as u64,
            (Scalar::Int(i), T::U8) => u8::try_from(i).ok()?.into(),
            (Scalar::Int(i), T::U16) => u16::try_from(i).ok()?.into(),
            (Scalar::Int(i), T::U32) => u32::try_from(i).ok()?.into(),
            (Scalar::Int(i), T::U64) => u64::try_from(i).ok()?,
            // Rounds to the nearest f32; a finite value beyond f32's range is refused rather
            // than turned into an infinity. NaN and the infinities pass through.
            (Scalar::Float(x), T::F32) if x.is_finite() && x.abs() > f64::from(f32::MAX) => {
                return None;
            }
            (Scalar::Float(x), T::F32) => u64::from((x as f32).to_bits()),
            (Scalar::Float(x), T::F64) => x.to_bits(),
            _ => return None,
        })
    }
}

/// Where a tensor argument comes from.
#[derive(Debug)]
pub enum TensorSource<'a> {
    /// A producer's tensor that is not consumed yet; it is consumed only once every argument of
    /// the launch has been checked.
    Unused(Unused<'a>),
    /// A tensor already owned by the caller (e.g. exported from `cudarc`).
    Used(Used),
}

/// A tensor argument, with the stream on which its data becomes ready (if any).
#[derive(Debug)]
pub struct TensorArg<'a> {
    source: TensorSource<'a>,
    ready_on: Option<CUstream>,
}

impl<'a> TensorArg<'a> {
    /// Declares that the tensor's data is written by work enqueued on `producer`: the launch
    /// stream then waits for that work on the device (`cuStreamWaitEvent`) before the kernel
    /// runs. Nothing is inserted when `producer` is the launch stream.
    ///
    /// # Safety
    ///
    /// `producer` must be a valid stream of the launch stream's context (null means the legacy
    /// default stream) until the launch returns.
    pub unsafe fn ready_on(mut self, producer: CUstream) -> Self {
        self.ready_on = Some(producer);
        self
    }

    /// The tensor, without its readiness stream (e.g. to consume it outside a launch).
    pub fn into_source(self) -> TensorSource<'a> {
        self.source
    }
}

/// One kernel argument: a tensor or a scalar.
#[derive(Debug)]
pub enum Arg<'a> {
    /// A tensor, passed as a pointer to its first element.
    Tensor(TensorArg<'a>),
    /// A scalar, passed by value.
    Scalar(Scalar),
}

impl<'a> From<Unused<'a>> for TensorArg<'a> {
    fn from(t: Unused<'a>) -> Self {
        TensorArg {
            source: TensorSource::Unused(t),
            ready_on: None,
        }
    }
}
impl From<Used> for TensorArg<'_> {
    fn from(t: Used) -> Self {
        TensorArg {
            source: TensorSource::Used(t),
            ready_on: None,
        }
    }
}
impl<'a> From<TensorArg<'a>> for Arg<'a> {
    fn from(t: TensorArg<'a>) -> Self {
        Arg::Tensor(t)
    }
}
impl<'a> From<Unused<'a>> for Arg<'a> {
    fn from(t: Unused<'a>) -> Self {
        Arg::Tensor(t.into())
    }
}
impl From<Used> for Arg<'_> {
    fn from(t: Used) -> Self {
        Arg::Tensor(t.into())
    }
}
impl From<Scalar> for Arg<'_> {
    fn from(s: Scalar) -> Self {
        Arg::Scalar(s)
    }
}

/// What a launch keeps alive until its work is done: a consumed tensor, or any other owner
/// (e.g. a Python object) whose lifetime the kernel's memory depends on.
pub enum Guard {
    /// A consumed DLPack tensor; releasing it runs its deleter.
    Tensor(Used),
    /// Any value whose drop releases memory the kernel uses.
    Owner(Box<dyn Send>),
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Guard::Tensor(t) => f.debug_tuple("Tensor").field(&t.view().data_ptr()).finish(),
            Guard::Owner(_) => f.write_str("Owner(..)"),
        }
    }
}

/// The work of one launch and everything it keeps alive.
///
/// It must be retired: [`retire`](LaunchHandle::retire) waits and releases,
/// [`try_retire`](LaunchHandle::try_retire) releases only if the work is done,
/// [`defer`](LaunchHandle::defer) hands the tensors to the stream's release queue (released
/// at later launches, [`Stream::poll`], [`Stream::synchronize`] or when the stream is dropped).
/// Dropping an unretired handle blocks until the work is done, then releases: never earlier.
/// `mem::forget` leaks the tensors; it never frees them early.
///
/// A launch made while the stream was capturing a CUDA graph ([`is_captured`](Self::is_captured))
/// owns nothing: its tensors belong to the graph (through a CUDA user object) and are released
/// when the last graph, clone or executable graph holding them is destroyed. For such a handle
/// `retire`, `try_retire` and `defer` return at once having released nothing, dropping it does
/// not block, and [`is_complete`](Self::is_complete) is an error ([`Error::CapturedLaunch`]).
#[must_use = "the launch's tensors stay alive until the handle is retired, deferred or dropped \
              (dropping blocks until the GPU work is done)"]
pub struct LaunchHandle {
    inner: HandleInner,
}

enum HandleInner {
    /// On the stream's release queue.
    Tracked(Pending<CudaTimeline, Guard>),
    /// Captured into a graph, which owns this many guards.
    Captured { guards: usize },
}

impl fmt::Debug for LaunchHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LaunchHandle");
        match &self.inner {
            HandleInner::Tracked(p) => d.field("seq", &p.seq()),
            HandleInner::Captured { guards } => d.field("captured_guards", guards),
        }
        .finish()
    }
}

impl LaunchHandle {
    /// Whether the launch was captured into a CUDA graph (its tensors then belong to the graph).
    pub fn is_captured(&self) -> bool {
        matches!(self.inner, HandleInner::Captured { .. })
    }

    /// Whether the launched work has completed (`cuEventQuery`; records an event if none covers
    /// this launch yet).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the query fails (e.g. the context is poisoned by a kernel fault, or
    /// the stream captures a graph now, so that no event can be recorded on it:
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); [`Error::CapturedLaunch`] for a captured
    /// launch, which has no single completion.
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool> {
        match &self.inner {
            HandleInner::Tracked(p) => Ok(p.is_complete()?),
            HandleInner::Captured { .. } => Err(Error::CapturedLaunch),
        }
    }

    /// Blocks until the work is done (`cuEventSynchronize`), then releases this launch's
    /// tensors, and any deferred tensors of earlier launches, in launch order. A captured
    /// launch returns at once, having released nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the wait fails. The tensors are then leaked, never released, since
    /// their work may still be running; the stream's [`stats`](Stream::stats) count them. While
    /// the stream captures a graph no event can be recorded on it, so waiting for a launch that
    /// no earlier event covers fails (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and leaks: defer
    /// handles during capture instead.
    #[doc(alias = "cuEventSynchronize")]
    pub fn retire(self) -> Result<Retired> {
        match self.inner {
            HandleInner::Tracked(p) => p.retire().map_err(|e| Error::Cuda(e.into_error())),
            HandleInner::Captured { .. } => Ok(Retired::nothing()),
        }
    }

    /// Releases the tensors if the work is done, else gives the handle back. A captured launch
    /// returns `Ok` at once, having released nothing.
    pub fn try_retire(self) -> Result<Retired, LaunchHandle> {
        match self.inner {
            HandleInner::Tracked(p) => p.try_retire().map_err(|pending| LaunchHandle {
                inner: HandleInner::Tracked(pending),
            }),
            HandleInner::Captured { .. } => Ok(Retired::nothing()),
        }
    }

    /// Hands the tensors to the stream's release queue and returns at once (a captured launch
    /// has nothing to hand over).
    pub fn defer(self) {
        match self.inner {
            HandleInner::Tracked(p) => p.defer(),
            HandleInner::Captured { .. } => {}
        }
    }
}

/// Arguments held inline (no allocation) by a launch; more spill to the heap. Each argument is
/// about 100 bytes, so the inline buffer is kept small enough to stay cheap to build.
const INLINE_ARGS: usize = 8;

/// The 8-byte parameter slots of a launch, one per argument, in order.
type ParamValues = SmallVec<[u64; INLINE_ARGS]>;

impl Stream {
    /// Launches `kernel` on this stream (`cuLaunchKernelEx`).
    ///
    /// Every argument is checked against the kernel's [`Signature`](crate::Signature) (count,
    /// kind, dtype, device, writability of outputs, scalar range) and the configuration against
    /// the device's limits before any tensor is consumed; nothing is consumed or launched when a
    /// check fails. Then the tensors are consumed, the stream is made to wait for the streams
    /// their data is ready on, and the kernel is launched. The returned handle owns the tensors
    /// until the work is done.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`], [`Error::ArgumentCount`], [`Error::ArgumentKind`],
    /// [`Error::DtypeMismatch`], [`Error::DeviceMismatch`], [`Error::PointerDeviceMismatch`],
    /// [`Error::Descriptor`] from the checks (nothing consumed, nothing launched);
    /// [`Error::Cuda`] from a driver call made by the checks (e.g.
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when the stream's capture was invalidated: nothing
    /// consumed), or if a wait or the launch fails (the consumed tensors are released before the
    /// error returns, since nothing was enqueued that uses them; for a capturing stream, they are
    /// released with the graph).
    ///
    /// # Capture
    ///
    /// One `cuStreamGetCaptureInfo` per launch tells whether the stream is capturing a graph.
    /// If it is, the tensors are handed to the graph (see [`capture`](crate::capture)) and the
    /// handle owns nothing ([`LaunchHandle::is_captured`]).
    #[doc(alias = "cuLaunchKernelEx")]
    #[doc(alias = "cuStreamGetCaptureInfo")]
    pub fn launch<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<LaunchHandle> {
        self.launch_with(kernel, config, args, |_, used| Guard::Tensor(used), [])
    }

    /// As [`Stream::launch`] followed by [`LaunchHandle::defer`], in one step: the tensors go
    /// straight to the stream's release queue (one lock round trip instead of two, and no
    /// handle). For a caller that never waits for this launch in particular; the tensors are
    /// released once a later launch, [`Stream::poll`], [`Stream::synchronize`] or the stream's
    /// drop sees the work complete.
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`].
    #[doc(alias = "cuLaunchKernel")]
    pub fn launch_deferred<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<()> {
        self.launch_core(
            kernel,
            config,
            args,
            |_, used| Guard::Tensor(used),
            [],
            true,
        )
        .map(drop)
    }

    /// As [`Stream::launch`], for callers that must control how each consumed tensor is held
    /// and released (e.g. a Python binding whose deleters must run with the interpreter
    /// attached), or that must keep more values alive until the work is done.
    ///
    /// `guard(index, used)` is called once for each tensor argument, in argument order, at the
    /// moment it is consumed (after every check has passed), and returns what the launch holds
    /// for it; a caller can tell from these calls which arguments were consumed when an error
    /// comes back. `owners` are held, like the tensors' guards, until the launched work has
    /// completed (dropped at once on an error before the launch was enqueued).
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`].
    #[doc(alias = "cuLaunchKernelEx")]
    pub fn launch_with<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
        guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
    ) -> Result<LaunchHandle> {
        self.launch_core(kernel, config, args, guard, owners, false)
            .map(|handle| handle.expect("a launch that is not deferred returns its handle"))
    }

    /// The launch path: with `defer`, the guards go to the release queue and no handle is
    /// returned; otherwise the handle is.
    fn launch_core<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
        mut guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
        defer: bool,
    ) -> Result<Option<LaunchHandle>> {
        let ctx = self.context();
        config.validate(ctx.limits())?;
        let mut args: SmallVec<[Arg<'a>; INLINE_ARGS]> = args.into_iter().collect();
        // 1. Check everything without consuming anything: the arguments, the kernel's own
        //    limits on this device, the tensors' memory, and whether the stream is capturing.
        let mut values = check_all(kernel.name(), kernel.signature(), &args, ctx.ordinal())?;
        let d = cuda_sys::driver()?;
        let _bound = ctx.bind_with(d)?;
        if config.shared_mem_bytes > 0 || config.cooperative {
            kernel.prepare_launch(d, ctx, config)?;
        }
        if self.checks_pointer_devices() {
            check_pointer_devices(d, &args, ctx.ordinal())?;
        }
        let capture = crate::capture::capturing_graph(d, self.raw())?;
        if capture.is_some()
            && let Err(e) = check_capture_joins(d, self.raw(), &args)
        {
            // Tensors handed over already consumed are released here (nothing uses them); their
            // deleters must not disturb the capture in progress on this thread.
            let _ = crate::capture::relaxed(d, || {
                drop(std::mem::take(&mut args));
                Ok(())
            });
            return Err(e);
        }
        // 2. Consume. A failure here releases what was consumed so far (nothing is launched).
        let tensors = args.iter().filter(|a| matches!(a, Arg::Tensor(_))).count();
        let mut guards = Vec::new();
        if tensors > 0 {
            guards.reserve_exact(tensors);
        }
        let mut waits: SmallVec<[CUstream; 4]> = SmallVec::new();
        let mut bytes = 0u64;
        // `drain` moves one argument at a time out of the inline buffer instead of moving the
        // whole buffer into an iterator (arguments are about 100 bytes each).
        for (index, arg) in args.drain(..).enumerate() {
            let Arg::Tensor(t) = arg else { continue };
            let used = match t.source {
                TensorSource::Unused(u) => u
                    .consume()
                    .map_err(|source| Error::Descriptor { index, source })?,
                TensorSource::Used(u) => u,
            };
            bytes = bytes.saturating_add(used.view().nbytes_spanned());
            guards.push(guard(index, used));
            if let Some(s) = t.ready_on.filter(|s| *s != self.raw())
                && !waits.contains(&s)
            {
                waits.push(s);
            }
        }
        guards.extend(owners);
        // 3. Parameters: one 8-byte slot per argument, pointed to by the parameter array.
        let mut ptrs: SmallVec<[*mut c_void; INLINE_ARGS]> = values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        // 4. Order after the producers, then launch.
        // The context is bound and `waits` holds only other streams: wait directly rather than
        // through `wait_for_raw`, which would check and bind both again.
        if !waits.is_empty() {
            self.with_tracker(|t| {
                for s in waits {
                    // SAFETY: `TensorArg::ready_on`'s contract: `s` is a valid stream of this
                    // context, which is bound.
                    unsafe { t.timeline().wait_for(s) }?;
                }
                Ok::<(), CudaError>(())
            })?;
        }
        let mut attrs = launch_attributes(config);
        let cfg = CUlaunchConfig {
            gridDimX: config.grid.x,
            gridDimY: config.grid.y,
            gridDimZ: config.grid.z,
            blockDimX: config.block.x,
            blockDimY: config.block.y,
            blockDimZ: config.block.z,
            sharedMemBytes: config.shared_mem_bytes,
            hStream: self.raw(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        let mut enqueue = || {
            if cfg.numAttrs == 0 {
                // No launch attributes: the plain entry point, measurably cheaper than the Ex
                // one.
                // SAFETY: as for `cuLaunchKernelEx` below; a `CUkernel` may be passed where a
                // `CUfunction` is expected (CUDA 12.0 and later).
                unsafe {
                    (d.cuLaunchKernel)(
                        kernel.raw() as CUfunction,
                        config.grid.x,
                        config.grid.y,
                        config.grid.z,
                        config.block.x,
                        config.block.y,
                        config.block.z,
                        config.shared_mem_bytes,
                        self.raw(),
                        ptrs.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
                .check("cuLaunchKernel")
            } else {
                // SAFETY: `cfg` points at live attributes; `ptrs` has one pointer per declared
                // parameter, each to an 8-byte slot holding a value of the declared size
                // (checked against `cuKernelGetParamInfo` when the kernel was loaded); the
                // tensors the pointers address are owned by `guards` (or by the graph being
                // captured) until the launched work completes.
                unsafe {
                    (d.cuLaunchKernelEx)(
                        &cfg,
                        kernel.raw() as CUfunction,
                        ptrs.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
                .check("cuLaunchKernelEx")
            }
        };
        if let Some(graph) = capture {
            // The graph owns the guards before the kernel node exists. If the launch then fails,
            // they are released with the graph (a failed launch invalidates the capture, and
            // ending it destroys the graph).
            let guards = crate::capture::attach(d, graph, ctx, guards)?;
            enqueue()?;
            return Ok((!defer).then_some(LaunchHandle {
                inner: HandleInner::Captured { guards },
            }));
        }
        if defer {
            self.with_tracker(|t| t.launch_deferred(guards, bytes, enqueue))?;
            return Ok(None);
        }
        let pending = self.with_tracker(|t| t.launch(guards, bytes, enqueue))?;
        Ok(Some(LaunchHandle {
            inner: HandleInner::Tracked(pending),
        }))
    }
}

/// The capture sequence `stream` belongs to: `Some(id)` while it captures (active or
/// invalidated), `None` otherwise (`cuStreamGetCaptureInfo`).
fn capture_id(
    d: &cuda_sys::Driver,
    stream: CUstream,
) -> std::result::Result<Option<u64>, CudaError> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0u64;
    // SAFETY: out-pointers to locals; the optional outputs are null (not wanted); `stream` is a
    // stream of the bound context (the caller's contract for `ready_on`).
    unsafe {
        (d.cuStreamGetCaptureInfo)(
            stream,
            &mut status,
            &mut id,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    }
    .check("cuStreamGetCaptureInfo")?;
    Ok((status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE).then_some(id))
}

/// While `stream` captures a graph, a tensor whose data is ready on another stream can be
/// ordered only if that stream takes part in the same capture (the wait then joins it into the
/// graph). Waiting on work outside the capture fails (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`)
/// and invalidates the capture; it would also order the graph's replays after nothing. Such a
/// launch is refused here, before anything is consumed, and the capture is left as it was.
fn check_capture_joins(d: &cuda_sys::Driver, stream: CUstream, args: &[Arg<'_>]) -> Result<()> {
    let Some(ours) = capture_id(d, stream)? else {
        return Ok(());
    };
    for (index, arg) in args.iter().enumerate() {
        let Arg::Tensor(t) = arg else { continue };
        let Some(producer) = t.ready_on.filter(|s| *s != stream) else {
            continue;
        };
        let theirs = match capture_id(d, producer) {
            Ok(id) => id,
            // The legacy stream asked about while a blocking stream captures: not part of it.
            Err(e) if e.code == cuda_sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => None,
            Err(e) => return Err(e.into()),
        };
        if theirs != Some(ours) {
            return Err(Error::ProducerOutsideCapture { index });
        }
    }
    Ok(())
}

/// Checks that the memory of every non-empty device tensor (`kDLCUDA`) is on device `ordinal`
/// (`cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`, one call per tensor).
/// A pointer the driver does not know is let through: the descriptor's device was checked.
/// Pinned host memory (`kDLCUDAHost`) is usable from every device and managed memory
/// (`kDLCUDAManaged`) migrates, so neither is asked about.
fn check_pointer_devices(d: &cuda_sys::Driver, args: &[Arg<'_>], ordinal: i32) -> Result<()> {
    for (index, arg) in args.iter().enumerate() {
        let Arg::Tensor(t) = arg else { continue };
        let view = match &t.source {
            TensorSource::Unused(u) => u
                .peek()
                .map_err(|source| Error::Descriptor { index, source })?,
            TensorSource::Used(u) => u.view(),
        };
        let tensor = view.device();
        if tensor.device_type != tile_dlpack::ffi::DLDeviceType::CUDA || view.nbytes_spanned() == 0
        {
            continue;
        }
        let mut on: std::ffi::c_int = -1;
        // SAFETY: the out-pointer is a local `int`, the size this attribute writes; the driver
        // answers for any address.
        let r = unsafe {
            (d.cuPointerGetAttribute)(
                (&raw mut on).cast::<c_void>(),
                cuda_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                view.data_ptr(),
            )
        };
        if r != cuda_sys::CUresult::CUDA_SUCCESS {
            log::debug!(
                "argument {index}: cuPointerGetAttribute(DEVICE_ORDINAL) returned {r:?}; the \
                 descriptor's device is trusted"
            );
            continue;
        }
        if on != ordinal {
            return Err(Error::PointerDeviceMismatch {
                index,
                tensor,
                pointer_device: on,
                stream_device: ordinal,
            });
        }
    }
    Ok(())
}

/// Checks `args` against `signature` exactly as [`Stream::launch`] does before consuming
/// anything (count, kind, dtype, device `device_ordinal`, writability of outputs, scalar range),
/// without a stream or a driver. Nothing is consumed; `Unused` tensors are only peeked at.
///
/// # Errors
///
/// [`Error::ArgumentCount`], [`Error::ArgumentKind`], [`Error::DtypeMismatch`],
/// [`Error::DeviceMismatch`], [`Error::Descriptor`], each naming the argument index.
pub fn check_args(
    kernel_name: &str,
    signature: &Signature,
    args: &[Arg<'_>],
    device_ordinal: i32,
) -> Result<()> {
    check_all(kernel_name, signature, args, device_ordinal).map(drop)
}

fn check_all(
    kernel_name: &str,
    signature: &Signature,
    args: &[Arg<'_>],
    ordinal: i32,
) -> Result<ParamValues> {
    let params = signature.params();
    if args.len() != params.len() {
        return Err(Error::ArgumentCount {
            kernel: kernel_name.to_owned(),
            expected: params.len(),
            got: args.len(),
        });
    }
    let mut values = ParamValues::with_capacity(args.len());
    for (index, (arg, param)) in args.iter().zip(params).enumerate() {
        values.push(check_arg(index, arg, param, ordinal)?);
    }
    Ok(values)
}

fn check_arg(index: usize, arg: &Arg<'_>, param: &Param, ordinal: i32) -> Result<u64> {
    match (arg, param) {
        (Arg::Tensor(t), Param::Tensor { dtype, intent }) => {
            let view = match &t.source {
                TensorSource::Unused(u) => u
                    .peek()
                    .map_err(|source| Error::Descriptor { index, source })?,
                TensorSource::Used(u) => u.view(),
            };
            if view.dtype() != *dtype {
                return Err(Error::DtypeMismatch {
                    index,
                    expected: *dtype,
                    got: view.dtype(),
                });
            }
            let dev = view.device();
            let device_ok = if dev.device_type == tile_dlpack::ffi::DLDeviceType::CUDAHOST {
                true
            } else {
                (dev.device_type == tile_dlpack::ffi::DLDeviceType::CUDA
                    || dev.device_type == tile_dlpack::ffi::DLDeviceType::CUDAMANAGED)
                    && dev.device_id == ordinal
            };
            if !device_ok {
                return Err(Error::DeviceMismatch {
                    index,
                    tensor: dev,
                    stream_device: ordinal,
                });
            }
            if intent.writes() {
                view.check_writable()
                    .map_err(|source| Error::Descriptor { index, source })?;
            }
            Ok(view.data_ptr())
        }
        (Arg::Scalar(s), Param::Scalar(ty)) => match s.encode(*ty) {
            Some(value) => Ok(value),
            None => Err(Error::ArgumentKind {
                index,
                expected: param.to_string(),
                got: format!("{s} (wrong type or out of range)"),
            }),
        },
        (Arg::Tensor(_), p) => Err(Error::ArgumentKind {
            index,
            expected: p.to_string(),
            got: "a tensor".into(),
        }),
        (Arg::Scalar(s), p) => Err(Error::ArgumentKind {
            index,
            expected: p.to_string(),
            got: s.to_string(),
        }),
    }
}

fn launch_attributes(config: &LaunchConfig) -> SmallVec<[CUlaunchAttribute; 3]> {
    let mut attrs = SmallVec::new();
    let mut push = |id: CUlaunchAttributeID, set: &dyn Fn(&mut CUlaunchAttributeValue)| {
        // SAFETY: `CUlaunchAttribute` is a plain C struct for which all-zero bytes are valid.
        let mut a: CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = id;
        set(&mut a.value);
        attrs.push(a);
    };
    if let Some(c) = config.cluster {
        push(
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            &|v| {
                // Assigning to a union field is safe; this selects the member the id names.
                v.clusterDim.x = c.x;
                v.clusterDim.y = c.y;
                v.clusterDim.z = c.z;
            },
        );
    }
    if config.cooperative {
        push(CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &|v| {
            v.cooperative = 1
        });
    }
    if config.programmatic_dependent_launch {
        push(
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            &|v| v.programmaticStreamSerializationAllowed = 1,
        );
    }
    attrs
}
