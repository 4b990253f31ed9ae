//! Devices and their primary contexts.

use std::ffi::c_int;
use std::marker::PhantomData;
use std::sync::Arc;

use cuda_sys::{CUcontext, CUdevice, CUdevice_attribute, CuResultExt, CudaError, Driver, driver};

use crate::error::Result;
use crate::timeline::LaunchInProgress;

/// Limits of a device that launch configurations are checked against, read once with
/// `cuDeviceGetAttribute` (and its memory with `cuDeviceTotalMem`) when the context is created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct DeviceLimits {
    /// Largest `block.x`, `block.y`, `block.z` (threads).
    pub max_block: [u32; 3],
    /// Largest number of threads in one block.
    pub max_threads_per_block: u32,
    /// Largest `grid.x`, `grid.y`, `grid.z` (blocks).
    pub max_grid: [u32; 3],
    /// Dynamic shared memory a block may use without opting in, in bytes.
    pub max_shared_mem_per_block: u32,
    /// Dynamic shared memory a block may use after opting in, in bytes.
    pub max_shared_mem_per_block_optin: u32,
    /// Compute capability as `(major, minor)`.
    pub compute_capability: (u32, u32),
    /// Number of streaming multiprocessors.
    pub multiprocessor_count: u32,
    /// Most resident blocks per streaming multiprocessor, whatever the kernel.
    pub max_blocks_per_multiprocessor: u32,
    /// Whether the device supports cooperative launches.
    pub cooperative_launch: bool,
    /// Whether the device supports thread block clusters.
    pub cluster_launch: bool,
    /// The device's total memory, in bytes (`cuDeviceTotalMem`).
    pub total_memory: u64,
}

impl DeviceLimits {
    /// The largest grid (in blocks) a cooperative launch could have on this device, whatever the
    /// kernel: [`max_blocks_per_multiprocessor`](DeviceLimits::max_blocks_per_multiprocessor)
    /// times [`multiprocessor_count`](DeviceLimits::multiprocessor_count), or `u64::MAX` when
    /// either is unknown (0). The kernel's own bound (its occupancy) is checked at launch.
    pub fn max_cooperative_grid(&self) -> u64 {
        if self.multiprocessor_count == 0 || self.max_blocks_per_multiprocessor == 0 {
            return u64::MAX;
        }
        u64::from(self.max_blocks_per_multiprocessor) * u64::from(self.multiprocessor_count)
    }
}

/// How the driver resolves a stream handle.
///
/// The default-stream handles are relative: the legacy default stream (null, or
/// `CU_STREAM_LEGACY`) names the legacy stream of whichever context is current on the calling
/// thread, and the per-thread default stream (`CU_STREAM_PER_THREAD`) names a different stream on
/// every thread (and in every context). Any other handle names one stream wherever it is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HandleKind {
    /// A stream created by `cuStreamCreate` (ours or another library's).
    Explicit,
    /// The legacy default stream of the stream's context.
    Legacy,
    /// The per-thread default stream of one thread, in the stream's context.
    PerThread,
}

impl HandleKind {
    pub(crate) fn of(raw: cuda_sys::CUstream) -> HandleKind {
        if raw.is_null() || raw == cuda_sys::CU_STREAM_LEGACY {
            HandleKind::Legacy
        } else if raw == cuda_sys::CU_STREAM_PER_THREAD {
            HandleKind::PerThread
        } else {
            HandleKind::Explicit
        }
    }
}

/// A device's primary context, retained for as long as this value (and every stream, library
/// and launch that uses it) lives.
///
/// This is the same context the CUDA runtime, PyTorch, CuPy and `cudarc` use for the device, so
/// pointers and streams from those libraries are valid in it.
#[derive(Debug)]
pub struct Context {
    ordinal: i32,
    device: CUdevice,
    raw: CUcontext,
    limits: DeviceLimits,
}

// SAFETY: a CUDA context handle may be used from any thread (the driver API is thread-safe);
// `Context` holds no thread-affine state.
unsafe impl Send for Context {}
// SAFETY: as above; all methods take `&self` and call thread-safe driver functions.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal` (`cuDevicePrimaryCtxRetain`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) when no driver is installed, and
    /// [`Error::Cuda`](crate::Error::Cuda) for an invalid ordinal (`CUDA_ERROR_INVALID_DEVICE`).
    #[doc(alias = "cuDevicePrimaryCtxRetain")]
    pub fn new(ordinal: i32) -> Result<Arc<Context>> {
        let d = driver()?;
        let mut device: CUdevice = 0;
        // SAFETY: out-pointer to a local; the driver is initialised by `driver()`.
        unsafe { (d.cuDeviceGet)(&mut device, ordinal) }.check("cuDeviceGet")?;
        let mut raw: CUcontext = std::ptr::null_mut();
        crate::capture::relaxed(d, || {
            // SAFETY: out-pointer to a local; `device` came from `cuDeviceGet`.
            unsafe { (d.cuDevicePrimaryCtxRetain)(&mut raw, device) }
                .check("cuDevicePrimaryCtxRetain")
        })?;
        // From here on `Context`'s Drop balances the retain (and the registration), on the
        // error path too.
        retained::register(d, raw, ordinal);
        let mut ctx = Context {
            ordinal,
            device,
            raw,
            limits: DeviceLimits::default(),
        };
        ctx.limits = ctx.read_limits(d)?;
        Ok(Arc::new(ctx))
    }

    fn read_limits(&self, d: &Driver) -> Result<DeviceLimits> {
        use CUdevice_attribute as A;
        let get = |a: CUdevice_attribute| -> Result<u32> {
            let mut v: c_int = 0;
            // SAFETY: out-pointer to a local; `self.device` is a valid device handle.
            unsafe { (d.cuDeviceGetAttribute)(&mut v, a, self.device) }
                .check("cuDeviceGetAttribute")?;
            Ok(u32::try_from(v).unwrap_or(0))
        };
        let xyz = |x, y, z| -> Result<[u32; 3]> { Ok([get(x)?, get(y)?, get(z)?]) };
        let mut total_memory: usize = 0;
        // SAFETY: out-pointer to a local; `self.device` is a valid device handle.
        unsafe { (d.cuDeviceTotalMem)(&mut total_memory, self.device) }
            .check("cuDeviceTotalMem")?;
        Ok(DeviceLimits {
            total_memory: total_memory as u64,
            max_block: xyz(
                A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
                A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
                A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z,
            )?,
            max_threads_per_block: get(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            max_grid: xyz(
                A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
                A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
                A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z,
            )?,
            max_shared_mem_per_block: get(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK)?,
            max_shared_mem_per_block_optin: get(
                A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
            compute_capability: (
                get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                get(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            multiprocessor_count: get(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            max_blocks_per_multiprocessor: get(
                A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR,
            )?,
            cooperative_launch: get(A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)? != 0,
            cluster_launch: get(A::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)? != 0,
        })
    }

    /// Number of CUDA devices (`cuDeviceGetCount`).
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) when no driver is installed.
    #[doc(alias = "cuDeviceGetCount")]
    pub fn device_count() -> Result<i32> {
        let d = driver()?;
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a local.
        unsafe { (d.cuDeviceGetCount)(&mut n) }.check("cuDeviceGetCount")?;
        Ok(n)
    }

    /// Whether the process sees more than one CUDA device (`cuDeviceGetCount`, asked once per
    /// process); `false` if the driver cannot tell.
    pub(crate) fn several_devices() -> bool {
        static SEVERAL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *SEVERAL.get_or_init(|| Self::device_count().is_ok_and(|n| n > 1))
    }

    /// The device of the context that owns `stream`: `cuStreamGetCtx`, then `cuCtxGetId` when
    /// that is a primary context a [`Context`] of this process holds, whose device is known, or
    /// `cuCtxGetDevice` with it pushed and popped. Every one of these is allowed on a stream
    /// that is capturing a graph (XLA hands its FFI calls such streams); `cuStreamGetId` is not
    /// asked, since some drivers refuse it for a capturing stream, and a refused call
    /// invalidates the capture. For the default-stream handles (null, `CU_STREAM_LEGACY`,
    /// `CU_STREAM_PER_THREAD`), which name a stream of whichever context is current, the device
    /// of the calling thread's current context, or `None` when no context is current. The
    /// calling thread's current context is the same afterwards.
    ///
    /// # Safety
    ///
    /// `stream` must be a live stream handle or one of the default-stream handles.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`](crate::Error::Driver) without a driver; [`Error::Cuda`](crate::Error::Cuda)
    /// if a driver call fails (e.g. `CUDA_ERROR_INVALID_HANDLE` for a destroyed stream).
    #[doc(alias = "cuStreamGetCtx")]
    pub unsafe fn device_of_stream(stream: cuda_sys::CUstream) -> Result<Option<i32>> {
        let d = driver()?;
        let mut ctx: CUcontext = std::ptr::null_mut();
        if HandleKind::of(stream) == HandleKind::Explicit {
            // SAFETY: the caller vouches that `stream` is a live stream; out-pointer to a local.
            unsafe { (d.cuStreamGetCtx)(stream, &mut ctx) }.check("cuStreamGetCtx")?;
            // SAFETY: `ctx` owns a live stream.
            return unsafe { device_of_context(d, ctx) }.map(Some);
        }
        // SAFETY: out-pointer to a local.
        unsafe { (d.cuCtxGetCurrent)(&mut ctx) }.check("cuCtxGetCurrent")?;
        if ctx.is_null() {
            return Ok(None);
        }
        // SAFETY: `ctx` is the current context.
        unsafe { device_of_context(d, ctx) }.map(Some)
    }

    /// The device that the memory at `ptr` belongs to, or `None` when there is no driver or the
    /// driver does not know the address as device or managed memory (plain host memory, say).
    /// Pinned host memory answers with the device of the context that registered it. The
    /// [`PointerMemory::device`] of [`Context::memory_of_pointer`].
    #[doc(alias = "cuPointerGetAttributes")]
    pub fn device_of_pointer(ptr: u64) -> Option<i32> {
        Self::memory_of_pointer(ptr).and_then(|m| m.device)
    }

    /// What the driver knows about the memory at `ptr`: its [`MemoryKind`] and device. One
    /// `cuPointerGetAttributes` call (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`, `IS_MANAGED`,
    /// `DEVICE_ORDINAL`), which answers for any address without a current context and does
    /// not fail for an address it does not know. `None` when there is no driver, the call
    /// fails, or the driver does not know the address (memory that is neither device, managed
    /// nor page-locked host memory, e.g. a NumPy array's).
    #[doc(alias = "cuPointerGetAttributes")]
    pub fn memory_of_pointer(ptr: u64) -> Option<PointerMemory> {
        let d = driver().ok()?;
        memory_of_pointer_with(d, ptr)
    }

    /// The device ordinal this context belongs to.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The raw `CUdevice` handle of this context's device.
    pub(crate) fn device(&self) -> CUdevice {
        self.device
    }

    /// The raw `CUcontext` handle.
    pub fn raw(&self) -> CUcontext {
        self.raw
    }

    /// The device's limits, read when the context was created.
    pub fn limits(&self) -> &DeviceLimits {
        &self.limits
    }

    /// The device's name, e.g. `NVIDIA H200` (`cuDeviceGetName`).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`](crate::Error::Cuda) if the driver call fails.
    #[doc(alias = "cuDeviceGetName")]
    pub fn name(&self) -> Result<String> {
        let d = driver()?;
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer is 256 bytes long and the length passed says so.
        unsafe { (d.cuDeviceGetName)(buf.as_mut_ptr(), buf.len() as c_int, self.device) }
            .check("cuDeviceGetName")?;
        // SAFETY: the driver writes a NUL-terminated string into the buffer.
        let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }

    /// Runs `release` (code that drops consumed tensors, i.e. runs their deleters) as tile's own
    /// release paths do: with this context current and the calling thread's stream-capture
    /// mode relaxed (`cuThreadExchangeStreamCaptureMode`), so that a deleter's synchronous free
    /// neither fails for want of a context nor invalidates a global-mode capture another
    /// thread (or this one) has in progress. The caller's current context and capture mode are
    /// put back afterwards, also when a deleter changed the current context. For bindings that
    /// run deleters later than the release queue hands them over (tile-py, on a thread holding
    /// the interpreter). Each step that fails is logged and `release` still runs (without the
    /// context switch, or without relaxing), exactly once.
    #[doc(alias = "cuThreadExchangeStreamCaptureMode")]
    pub fn releasing<R>(&self, release: impl FnOnce() -> R) -> R {
        let Ok(d) = driver() else {
            return release();
        };
        releasing_in(d, self.raw, None, release)
    }

    /// Whether the context is still usable: not destroyed since it was retained, as a reset of
    /// the primary context (`cuDevicePrimaryCtxReset`, e.g. `cudaDeviceReset` in another
    /// library) destroys it. One `cuCtxGetId`; no context is made current. A cache of contexts
    /// asks before handing one out for new work, and retains the device's primary context
    /// afresh ([`Context::new`]) when this says `false`.
    #[doc(alias = "cuCtxGetId")]
    pub fn is_alive(&self) -> bool {
        let Ok(d) = driver() else {
            return false;
        };
        let mut id = 0u64;
        // SAFETY: out-pointer to a local; `self.raw` was retained (the driver reports an error,
        // not undefined behaviour, for a destroyed context handle).
        unsafe { (d.cuCtxGetId)(self.raw, &mut id) }
            .check("cuCtxGetId")
            .is_ok()
    }

    /// Makes this context current on the calling thread until the guard is dropped, restoring
    /// the previous one then. Costs one `cuCtxGetCurrent` when this context is already current.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`](crate::Error::Cuda) if the context cannot be made current.
    #[doc(alias = "cuCtxPushCurrent")]
    pub fn bind(&self) -> Result<ContextGuard<'_>> {
        Ok(self.bind_with(driver()?)?)
    }

    pub(crate) fn bind_with(&self, d: &'static Driver) -> Result<ContextGuard<'_>, CudaError> {
        let mut current: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        unsafe { (d.cuCtxGetCurrent)(&mut current) }.check("cuCtxGetCurrent")?;
        let pushed = current != self.raw;
        if pushed {
            // SAFETY: `self.raw` is a retained primary context.
            unsafe { (d.cuCtxPushCurrent)(self.raw) }.check("cuCtxPushCurrent")?;
        }
        Ok(ContextGuard {
            d,
            pushed,
            _ctx: PhantomData,
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        retained::unregister(self.raw);
        if let Ok(d) = driver() {
            let r = crate::capture::relaxed(d, || {
                // SAFETY: balances the retain in `new`; nothing uses `self.raw` after this.
                unsafe { (d.cuDevicePrimaryCtxRelease)(self.device) }
                    .check("cuDevicePrimaryCtxRelease")
            });
            if let Err(e) = r {
                log::error!("{e}");
            }
        }
    }
}

/// The device of context `ctx`: for a primary context a `Context` holds, the one [`retained`]
/// knows (one `cuCtxGetId`); any other context is pushed, asked (`cuCtxGetDevice`) and popped.
///
/// # Safety
///
/// `ctx` must be a live context (one that owns a live stream, or the current one).
unsafe fn device_of_context(d: &Driver, ctx: CUcontext) -> Result<i32> {
    if let Some(ordinal) = retained::ordinal_of(d, ctx) {
        return Ok(ordinal);
    }
    // SAFETY: `ctx` is live (the caller's promise); popped below.
    unsafe { (d.cuCtxPushCurrent)(ctx) }.check("cuCtxPushCurrent")?;
    let mut device: CUdevice = 0;
    // SAFETY: out-pointer to a local; a context is current.
    let got = unsafe { (d.cuCtxGetDevice)(&mut device) }.check("cuCtxGetDevice");
    let mut popped: CUcontext = std::ptr::null_mut();
    // SAFETY: pops the context pushed above, on this thread.
    unsafe { (d.cuCtxPopCurrent)(&mut popped) }.check("cuCtxPopCurrent")?;
    got?;
    Ok(device)
}

/// The primary contexts that [`Context`] values hold (retained, not yet released), with their
/// devices and their unique ids (`cuCtxGetId`): a context handle found here whose id is still
/// the one registered is that device's primary context, so its device is known without making
/// it current. The id is compared because a primary context can be destroyed while retained
/// (`cuDevicePrimaryCtxReset` in other code), and its handle then reused; ids are never reused.
mod retained {
    use std::sync::Mutex;

    use cuda_sys::{CUcontext, CuResultExt, Driver};

    /// One held primary context.
    struct Held {
        raw: usize,
        id: u64,
        ordinal: i32,
        /// How many `Context` values hold it.
        holders: usize,
    }

    static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

    fn held() -> std::sync::MutexGuard<'static, Vec<Held>> {
        HELD.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The unique id of context `raw`, or `None` if the driver has none for it.
    fn id_of(d: &Driver, raw: CUcontext) -> Option<u64> {
        let mut id = 0u64;
        // SAFETY: out-pointer to a local; the driver reports an error, not undefined behaviour,
        // for a destroyed context handle.
        unsafe { (d.cuCtxGetId)(raw, &mut id) }
            .check("cuCtxGetId")
            .ok()
            .map(|()| id)
    }

    /// A `Context` of device `ordinal` now holds `raw` (not registered if its id is unknown).
    pub(super) fn register(d: &Driver, raw: CUcontext, ordinal: i32) {
        let Some(id) = id_of(d, raw) else { return };
        let mut held = held();
        match held
            .iter_mut()
            .find(|h| h.raw == raw as usize && h.id == id)
        {
            Some(h) => h.holders += 1,
            None => held.push(Held {
                raw: raw as usize,
                id,
                ordinal,
                holders: 1,
            }),
        }
    }

    /// A `Context` holding `raw` is dropped (before it releases the retain).
    pub(super) fn unregister(raw: CUcontext) {
        let mut held = held();
        if let Some(i) = held.iter().position(|h| h.raw == raw as usize) {
            held[i].holders -= 1;
            if held[i].holders == 0 {
                held.swap_remove(i);
            }
        }
    }

    /// The device of `raw`, if it is a primary context a `Context` holds (one `cuCtxGetId`).
    pub(super) fn ordinal_of(d: &Driver, raw: CUcontext) -> Option<i32> {
        let (id, ordinal) = held()
            .iter()
            .find(|h| h.raw == raw as usize)
            .map(|h| (h.id, h.ordinal))?;
        (id_of(d, raw)? == id).then_some(ordinal)
    }
}

/// The calling thread's current context, saved and made current again when dropped, if
/// something made another one current meanwhile (a deleter, or `cudarc`, which sets its own with
/// `cuCtxSetCurrent`). Unlike [`ContextGuard`] it does not push: it replaces the top of the
/// thread's context stack and puts the saved context back there.
pub(crate) struct SavedContext {
    d: &'static Driver,
    saved: CUcontext,
}

impl SavedContext {
    /// Saves `ctx`, which the caller knows to be the calling thread's current context, without
    /// asking the driver.
    fn known(d: &'static Driver, ctx: CUcontext) -> Self {
        Self { d, saved: ctx }
    }

    /// Saves the calling thread's current context (`cuCtxGetCurrent`; null if none).
    pub(crate) fn save(d: &'static Driver) -> Result<Self, CudaError> {
        let mut saved: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        unsafe { (d.cuCtxGetCurrent)(&mut saved) }.check("cuCtxGetCurrent")?;
        Ok(Self { d, saved })
    }

    /// The context that was current when this was saved (null if none).
    pub(crate) fn saved(&self) -> CUcontext {
        self.saved
    }

    /// Makes `ctx` current until this value is dropped (`cuCtxSetCurrent`).
    ///
    /// # Safety
    ///
    /// `ctx` must be a live context, kept alive by the caller while it is current.
    pub(crate) unsafe fn switch_to(&self, ctx: CUcontext) -> Result<(), CudaError> {
        // SAFETY: the caller's contract; the drop puts the saved context back.
        unsafe { (self.d.cuCtxSetCurrent)(ctx) }.check("cuCtxSetCurrent")
    }
}

impl Drop for SavedContext {
    fn drop(&mut self) {
        let mut now: CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let r = unsafe { (self.d.cuCtxGetCurrent)(&mut now) }.check("cuCtxGetCurrent");
        let r = r.and_then(|()| {
            if now == self.saved {
                return Ok(());
            }
            // SAFETY: `saved` was current on this thread when it was saved (or null).
            unsafe { (self.d.cuCtxSetCurrent)(self.saved) }.check("cuCtxSetCurrent")
        });
        if let Err(e) = r {
            log::error!("restoring the caller's current context: {e}");
        }
    }
}

/// [`Context::releasing`] for context `ctx` (kept alive by the caller). `in_launch` is
/// `Some(relaxed)` inside a launch call that bound `ctx` and knows it current
/// ([`LaunchInProgress`]), `relaxed` when that call has relaxed the capture mode already.
pub(crate) fn releasing_in<R>(
    d: &'static Driver,
    ctx: CUcontext,
    in_launch: Option<bool>,
    release: impl FnOnce() -> R,
) -> R {
    // Inside a launch call that bound `ctx`, it is current: no need to ask. The deleters about
    // to run are foreign code, so the launch forgets what it knew; whatever they change is
    // asked about afterwards (the context right after them, below).
    let saved = if in_launch.is_some() {
        Ok(SavedContext::known(d, ctx))
    } else {
        SavedContext::save(d)
    };
    // A launch that relaxed the capture mode puts it back when it ends, after these deleters.
    let relaxed_by_launch = in_launch == Some(true);
    LaunchInProgress::forget();
    let saved = match saved {
        Ok(saved) => Some(saved),
        Err(e) => {
            log::warn!("releasing without saving the current context: {e}");
            None
        }
    };
    if let Some(saved) = saved.as_ref().filter(|s| s.saved() != ctx) {
        // SAFETY: the caller keeps `ctx` alive; dropping `saved` makes the caller's context
        // current again afterwards.
        if let Err(e) = unsafe { saved.switch_to(ctx) } {
            log::warn!("releasing without the stream's context current: {e}");
        }
    }
    if relaxed_by_launch {
        let out = release();
        drop(saved);
        return out;
    }
    let mut release = Some(release);
    let mut out = None;
    let relaxed = crate::capture::relaxed(d, || {
        if let Some(f) = release.take() {
            out = Some(f());
        }
        Ok(())
    });
    if let Some(f) = release.take() {
        if let Err(e) = relaxed {
            log::warn!("releasing without relaxing the stream-capture mode: {e}");
        }
        out = Some(f());
    }
    drop(saved);
    match out {
        Some(out) => out,
        None => unreachable!("`release` runs exactly once"),
    }
}

/// Keeps a context current on this thread; restores the previous one when dropped.
#[must_use = "the context is current only while the guard lives"]
pub struct ContextGuard<'a> {
    d: &'static Driver,
    pushed: bool,
    // Borrows the context and is tied to this thread (the context stack is per thread).
    _ctx: PhantomData<(&'a Context, *const ())>,
}

impl Drop for ContextGuard<'_> {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: CUcontext = std::ptr::null_mut();
            // SAFETY: pops the context this guard pushed on this thread.
            let r = unsafe { (self.d.cuCtxPopCurrent)(&mut popped) };
            if let Err(e) = r.check("cuCtxPopCurrent") {
                log::error!("{e}");
            }
        }
    }
}

/// The kind of memory an address belongs to, as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Device memory (`CU_MEMORYTYPE_DEVICE`, not managed).
    Device,
    /// Managed (unified) memory (`CU_POINTER_ATTRIBUTE_IS_MANAGED`).
    Managed,
    /// Page-locked host memory allocated or registered with CUDA (`CU_MEMORYTYPE_HOST`),
    /// which kernels can address.
    Host,
}

/// What [`Context::memory_of_pointer`] found out about an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PointerMemory {
    /// The kind of memory.
    pub kind: MemoryKind,
    /// The device ordinal the driver reports (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`): the
    /// memory's device for device memory, the device of the registering context for host
    /// memory; `None` when the driver reports none.
    pub device: Option<i32>,
}

/// [`Context::memory_of_pointer`] with the driver at hand.
pub(crate) fn memory_of_pointer_with(d: &Driver, ptr: u64) -> Option<PointerMemory> {
    let mut memory_type: u32 = 0;
    // `IS_MANAGED` writes a C `bool` (one byte); a zeroed wider slot reads the same.
    let mut managed: u64 = 0;
    let mut ordinal: c_int = -1;
    let mut attributes = [
        cuda_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        cuda_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        cuda_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    ];
    let mut data: [*mut std::ffi::c_void; 3] = [
        (&raw mut memory_type).cast(),
        (&raw mut managed).cast(),
        (&raw mut ordinal).cast(),
    ];
    // SAFETY: three attributes, each with an out-pointer to a local at least as large as what
    // the driver writes for it (a `CUmemorytype`, a `bool`, an `int`). For an address the driver
    // does not know, it writes null values and returns success.
    let r = unsafe {
        (d.cuPointerGetAttributes)(
            attributes.len() as u32,
            attributes.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr as cuda_sys::CUdeviceptr,
        )
    };
    if r != cuda_sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    let kind = if managed != 0 {
        MemoryKind::Managed
    } else if memory_type == cuda_sys::CUmemorytype::CU_MEMORYTYPE_DEVICE.0 {
        MemoryKind::Device
    } else if memory_type == cuda_sys::CUmemorytype::CU_MEMORYTYPE_HOST.0 {
        MemoryKind::Host
    } else {
        return None;
    };
    Some(PointerMemory {
        kind,
        device: (ordinal >= 0).then_some(ordinal),
    })
}
