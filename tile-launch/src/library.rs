//! Loaded device code ([`Library`]: cubin, fatbin, PTX, CUDA C++) and its kernels ([`Kernel`]).

use std::ffi::{CString, c_void};
use std::fmt;
use std::sync::{Arc, Mutex};

use cuda_sys::{
    CUfunction, CUfunction_attribute, CUkernel, CUlibrary, CUresult, CuResultExt, Driver, driver,
};

use crate::config::LaunchConfig;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::signature::{Param, Signature};

struct LibraryInner {
    d: &'static Driver,
    raw: CUlibrary,
    /// The ordinal of the device whose context was current when the library was loaded, if one
    /// was: where [`Library::kernel`] checks a signature, and loads the kernel, when no context
    /// is current then.
    home: Option<i32>,
    /// The primary context [`Library::kernel`] loaded kernels into when no context was current
    /// (the home device's, else device 0's), retained while the library lives so that what was
    /// loaded into it stays loaded.
    loaded_into: Mutex<Option<Arc<crate::Context>>>,
}

impl LibraryInner {
    /// The primary context of the home device (device 0 when the library has none), retained
    /// once and kept for the library's life.
    fn loading_context(&self) -> Result<Arc<crate::Context>> {
        let mut slot = self.loaded_into.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ctx) = slot.as_ref() {
            return Ok(Arc::clone(ctx));
        }
        let ctx = crate::Context::new(self.home.unwrap_or(0))?;
        *slot = Some(Arc::clone(&ctx));
        Ok(ctx)
    }
}

// SAFETY: library handles are context-independent and usable from any thread.
unsafe impl Send for LibraryInner {}
// SAFETY: as above.
unsafe impl Sync for LibraryInner {}

impl Drop for LibraryInner {
    fn drop(&mut self) {
        let (d, raw) = (self.d, self.raw);
        let r = crate::capture::relaxed(d, || {
            // SAFETY: every kernel of this library holds an `Arc` to it, so none is alive.
            unsafe { (d.cuLibraryUnload)(raw) }.check("cuLibraryUnload")
        });
        if let Err(e) = r {
            log::error!("{e}");
        }
    }
}

/// The ordinal of the device of the calling thread's current context, or `None` when no context
/// is current (`cuCtxGetCurrent`, `cuCtxGetDevice`, then `cuDeviceGet` per ordinal until one
/// names that device).
fn current_ordinal(d: &Driver) -> Result<Option<i32>, cuda_sys::CudaError> {
    let mut current: cuda_sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a local.
    unsafe { (d.cuCtxGetCurrent)(&mut current) }.check("cuCtxGetCurrent")?;
    if current.is_null() {
        return Ok(None);
    }
    let mut device: cuda_sys::CUdevice = 0;
    // SAFETY: out-pointer to a local; a context is current.
    unsafe { (d.cuCtxGetDevice)(&mut device) }.check("cuCtxGetDevice")?;
    let mut count: std::ffi::c_int = 0;
    // SAFETY: out-pointer to a local.
    unsafe { (d.cuDeviceGetCount)(&mut count) }.check("cuDeviceGetCount")?;
    for ordinal in 0..count {
        let mut dev: cuda_sys::CUdevice = 0;
        // SAFETY: out-pointer to a local; `ordinal` is below the device count.
        unsafe { (d.cuDeviceGet)(&mut dev, ordinal) }.check("cuDeviceGet")?;
        if dev == device {
            return Ok(Some(ordinal));
        }
    }
    Ok(None)
}

/// Loaded device code (`cuLibraryLoadData`): a cubin, a fatbin or PTX text. Libraries are not
/// tied to a context; a kernel from one can be launched on any device the code was built for.
#[derive(Clone)]
pub struct Library {
    inner: Arc<LibraryInner>,
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library")
            .field("raw", &self.inner.raw)
            .finish()
    }
}

impl Library {
    /// Loads a cubin or fatbin image, or PTX text (`cuLibraryLoadData`); the driver tells them
    /// apart by their headers. PTX is compiled for the current device by the driver.
    ///
    /// The load runs with the calling thread's stream-capture mode relaxed
    /// (`cuThreadExchangeStreamCaptureMode`), so that it cannot invalidate a graph capture
    /// another thread is making in global mode. The device of the context current now, if any,
    /// is remembered for [`Library::kernel`].
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] without a driver; [`Error::Cuda`] when the driver rejects the image
    /// (e.g. `CUDA_ERROR_INVALID_IMAGE`, `CUDA_ERROR_INVALID_PTX`,
    /// `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`).
    #[doc(alias = "cuLibraryLoadData")]
    pub fn from_image(image: &[u8]) -> Result<Library> {
        let d = driver()?;
        // The driver reads text images up to a NUL, so make sure there is one.
        let mut owned;
        let bytes = if image.last() == Some(&0) {
            image
        } else {
            owned = Vec::with_capacity(image.len() + 1);
            owned.extend_from_slice(image);
            owned.push(0);
            &owned
        };
        let (raw, home) = crate::capture::relaxed(d, || {
            let home = current_ordinal(d)?;
            let mut raw: CUlibrary = std::ptr::null_mut();
            // SAFETY: `bytes` outlives the call and is NUL-terminated; no JIT or library
            // options.
            unsafe {
                (d.cuLibraryLoadData)(
                    &mut raw,
                    bytes.as_ptr().cast::<c_void>(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                )
            }
            .check("cuLibraryLoadData")?;
            Ok((raw, home))
        })?;
        Ok(Library {
            inner: Arc::new(LibraryInner {
                d,
                raw,
                home,
                loaded_into: Mutex::new(None),
            }),
        })
    }

    /// Loads PTX text. See [`Library::from_image`].
    ///
    /// # Errors
    ///
    /// As [`Library::from_image`].
    pub fn from_ptx(ptx: &str) -> Result<Library> {
        Self::from_image(ptx.as_bytes())
    }

    /// Reads a cubin, fatbin or PTX file and loads it. See [`Library::from_image`].
    ///
    /// # Errors
    ///
    /// [`Error::ReadFile`] if the file cannot be read; otherwise as [`Library::from_image`].
    pub fn from_file(path: impl AsRef<std::path::Path>) -> Result<Library> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        Self::from_image(&bytes)
    }

    /// Compiles CUDA C++ source to PTX with NVRTC and loads it. Kernels should be declared
    /// `extern "C"` so their names are not mangled. `options` are passed to NVRTC as given
    /// (e.g. `-arch=compute_90`, `-std=c++17`).
    ///
    /// # Errors
    ///
    /// [`Error::NvrtcUnavailable`] if NVRTC cannot be loaded; [`Error::Compile`] with NVRTC's
    /// log if compilation fails; otherwise as [`Library::from_image`].
    #[cfg(feature = "nvrtc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "nvrtc")))]
    pub fn from_cuda_source(source: &str, options: &[&str]) -> Result<Library> {
        // Probe the driver first, then NVRTC: cudarc panics when a CUDA library is absent, and
        // even a caught panic prints through the panic hook.
        driver()?;
        crate::probe::require_nvrtc()?;
        let options: Vec<String> = options.iter().map(|s| s.to_string()).collect();
        let opts = cudarc::nvrtc::CompileOptions {
            options: options.clone(),
            ..Default::default()
        };
        // NVRTC was found above; a panic left here (an NVRTC too old for an entry point cudarc
        // asks for) is still turned into the error rather than unwound into the caller.
        let ptx = std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(source, opts))
            .map_err(|_| Error::NvrtcUnavailable {
                searched: crate::probe::candidates("nvrtc"),
            })?
            .map_err(|e| {
                let log = match e {
                    cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                        log.to_string_lossy().into_owned()
                    }
                    // No log yet (creating the program) or none to read: NVRTC's error code.
                    other => format!("{other:?}"),
                };
                Error::Compile { log, options }
            })?;
        Self::from_ptx(&ptx.to_src())
    }

    /// Looks up kernel `name` (`cuLibraryGetKernel`) and checks `signature` against the
    /// parameters the compiled kernel declares (`cuKernelGetParamInfo`): same count, and each
    /// parameter of the declared size.
    ///
    /// The kernel is loaded now (`cuKernelGetFunction`, best effort), so that no launch loads
    /// it (CUDA's lazy loading) and waits for work queued by then: into the calling thread's
    /// current context, or, when none is current, into the primary context of the device whose
    /// context was current when the library was loaded, and when there was none either, device
    /// 0's. That primary context is retained (created if need be) for as long as the library
    /// lives, so a context another library makes current later for that device (PyTorch, CuPy)
    /// is the one holding the kernel. A launch in another context loads the kernel at its first
    /// launch there: look kernels up with that context current
    /// ([`Context::bind`](crate::Context::bind)) to avoid it, and to keep device 0 out of it.
    /// The signature check uses the same context (without one, the driver is asked first).
    ///
    /// # Errors
    ///
    /// [`Error::KernelName`] if `name` contains a NUL byte; [`Error::KernelNotFound`] if there
    /// is no such kernel; [`Error::Signature`] if the declared
    /// parameters do not match the compiled ones.
    #[doc(alias = "cuLibraryGetKernel")]
    #[doc(alias = "cuKernelGetParamInfo")]
    pub fn kernel(&self, name: &str, signature: Signature) -> Result<Kernel> {
        let d = self.inner.d;
        let cname = CString::new(name).map_err(|_| Error::KernelName { name: name.into() })?;
        let raw = crate::capture::relaxed_with(d, || -> Result<CUkernel> {
            let mut raw: CUkernel = std::ptr::null_mut();
            // SAFETY: `cname` is NUL-terminated and outlives the call; the library is loaded.
            unsafe { (d.cuLibraryGetKernel)(&mut raw, self.inner.raw, cname.as_ptr()) }
                .check("cuLibraryGetKernel")
                .map_err(|e| not_found(name, e))?;
            let mut current: cuda_sys::CUcontext = std::ptr::null_mut();
            // SAFETY: out-pointer to a local.
            unsafe { (d.cuCtxGetCurrent)(&mut current) }.check("cuCtxGetCurrent")?;
            if !current.is_null() {
                check_param_info(d, raw, name, &signature)?;
                load_into_current(d, raw, name);
                return Ok(raw);
            }
            // No context current. A driver that answers without one settles the check; trust
            // only a full match that read at least one parameter (an error may just mean "no
            // context").
            let checked = !signature.params().is_empty()
                && check_param_info(d, raw, name, &signature).is_ok();
            // Left alone, the kernel would be loaded at its first launch, into whatever context
            // exists by then, and (CUDA's lazy loading) that load may wait for the work already
            // queued there. Load it now into the primary context it will most likely launch in
            // (the home device's, else device 0's), which the library keeps retained, so that
            // the context others create or retain later is that one, with the kernel loaded.
            match self.inner.loading_context() {
                Ok(ctx) => {
                    let _bound = ctx.bind_with(d)?;
                    if !checked {
                        check_param_info(d, raw, name, &signature)?;
                    }
                    load_into_current(d, raw, name);
                }
                // The primary context cannot be had now (a device in exclusive use, say), but
                // the check was made: the kernel loads at its first launch.
                Err(e) if checked => log::debug!(
                    "tile-launch: kernel `{name}` not loaded ahead of its first launch: {e}"
                ),
                Err(e) => return Err(e),
            }
            Ok(raw)
        })?;
        Ok(Kernel {
            raw,
            name: name.to_owned(),
            signature: Arc::new(signature),
            per_device: Arc::new(Mutex::new(Vec::new())),
            _library: self.clone(),
        })
    }
}

/// The error of a failed `cuLibraryGetKernel` for `name`: [`Error::KernelNotFound`] when the
/// library has no such kernel.
fn not_found(name: &str, e: cuda_sys::CudaError) -> Error {
    if e.code == CUresult::CUDA_ERROR_NOT_FOUND {
        Error::KernelNotFound {
            name: name.to_owned(),
            source: e,
        }
    } else {
        e.into()
    }
}

/// Loads the kernel into the current context now (`cuKernelGetFunction`), while the caller looks
/// it up, rather than at its first launch: with CUDA's lazy loading, the first launch of a
/// kernel while other work runs on the device can block until that work is done. Best effort:
/// a failure is logged and the kernel is loaded at its first launch as before.
fn load_into_current(d: &Driver, raw: CUkernel, name: &str) {
    let mut func: cuda_sys::CUfunction = std::ptr::null_mut();
    // SAFETY: out-pointer to a local; `raw` is a kernel of a loaded library; a context is
    // current (the caller checked).
    let r = unsafe { (d.cuKernelGetFunction)(&mut func, raw) }.check("cuKernelGetFunction");
    if let Err(e) = r {
        log::debug!("tile-launch: kernel `{name}` not loaded ahead of its first launch: {e}");
    }
}

fn check_param_info(d: &Driver, raw: CUkernel, name: &str, sig: &Signature) -> Result<()> {
    let mismatch = |reason: String| Error::Signature {
        kernel: name.to_owned(),
        reason,
    };
    let n = sig.slot_count();
    let mut slot = 0usize;
    for (i, p) in sig.params().iter().enumerate() {
        for k in 0..p.slots() {
            let (mut offset, mut size) = (0usize, 0usize);
            // SAFETY: out-pointers to locals; `raw` is a kernel of a loaded library.
            let r = unsafe { (d.cuKernelGetParamInfo)(raw, slot, &mut offset, &mut size) };
            if r == CUresult::CUDA_ERROR_INVALID_VALUE {
                return Err(mismatch(count_mismatch(n, slot)));
            }
            r.check("cuKernelGetParamInfo")?;
            let want = p.slot_size(k);
            if size != want {
                let what = if p.slots() == 1 {
                    format!("parameter {i}")
                } else {
                    format!(
                        "kernel parameter {slot} ({} of parameter {i})",
                        slot_name(p, k)
                    )
                };
                return Err(mismatch(format!(
                    "{what} is declared as {p} ({want} bytes) but the kernel's is {size} bytes"
                )));
            }
            slot += 1;
        }
    }
    let mut takes = n;
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: as above.
        let r = unsafe { (d.cuKernelGetParamInfo)(raw, takes, &mut offset, &mut size) };
        if r != CUresult::CUDA_SUCCESS {
            break;
        }
        takes += 1;
    }
    if takes > n {
        return Err(mismatch(count_mismatch(n, takes)));
    }
    Ok(())
}

/// "the signature declares 1 parameter but the kernel takes 3", in the plural where it is one.
fn count_mismatch(declared: usize, takes: usize) -> String {
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    format!(
        "the signature declares {declared} parameter{} but the kernel takes {takes}",
        plural(declared)
    )
}

/// What kernel parameter `k` of an array declaration is: `pointer`, `extent d` or `stride d`.
fn slot_name(p: &Param, k: usize) -> String {
    let n = (p.slots() - 1) / 2;
    match k {
        0 => "pointer".to_owned(),
        k if k <= n => format!("extent {}", k - 1),
        k => format!("stride {}", k - 1 - n),
    }
}

/// What a kernel knows about itself on one device, learnt at its first launch there that needs
/// it. Only what survives a reset of the device's primary context (`cuDevicePrimaryCtxReset`)
/// is kept here: the compiled code's static shared memory. Whether the dynamic shared memory
/// opt-in is in effect is context state, read from the context's function at each launch that
/// needs it.
#[derive(Clone, Debug)]
struct OnDevice {
    ordinal: i32,
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`: static shared memory per block, in bytes.
    static_shared: u32,
    /// Contexts (by `cuCtxGetId`, unique for each context the driver creates, a primary context
    /// re-created after a reset included) in which the kernel's dynamic shared memory limit is
    /// known to be raised to the opt-in maximum.
    opted_in: Vec<u64>,
}

/// A kernel of a loaded [`Library`] with its declared [`Signature`]. Cheap to clone; keeps the
/// library loaded.
#[derive(Clone)]
pub struct Kernel {
    raw: CUkernel,
    name: String,
    signature: Arc<Signature>,
    per_device: Arc<Mutex<Vec<OnDevice>>>,
    _library: Library,
}

// SAFETY: `CUkernel` handles are context-independent and usable from any thread.
unsafe impl Send for Kernel {}
// SAFETY: as above.
unsafe impl Sync for Kernel {}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("signature", &self.signature)
            .finish()
    }
}

impl Kernel {
    /// The kernel's name in the library.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The declared parameters.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// The raw `CUkernel` handle.
    pub fn raw(&self) -> CUkernel {
        self.raw
    }
}

impl Kernel {
    /// The kernel-specific checks and set-up of a launch on `ctx`'s device, made before anything
    /// is consumed. `ctx` must be current. Its driver calls run in relaxed capture mode, which
    /// also keeps them from invalidating this thread's own capture when the launch is captured.
    ///
    /// - Dynamic shared memory: at most the device's opt-in limit minus the kernel's static
    ///   shared memory; above the default limit, the kernel opts in once per context (a context
    ///   reset since, which drops the opt-in, has a new `cuCtxGetId` and is asked again).
    /// - Cooperative launches: the grid must fit co-resident on the device (the kernel's
    ///   occupancy times the number of SMs).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the limit and the value; [`Error::Cuda`] if a driver call
    /// fails.
    pub(crate) fn prepare_launch(
        &self,
        d: &Driver,
        ctx: &Context,
        config: &LaunchConfig,
    ) -> Result<()> {
        if config.shared_mem_bytes > 0 {
            self.prepare_shared_memory(d, ctx, config.shared_mem_bytes)?;
        }
        if config.cooperative {
            self.check_cooperative(d, ctx, config)?;
        }
        Ok(())
    }

    /// The kernel's static shared memory on `ctx`'s device, read once per device.
    fn static_shared(&self, d: &Driver, ctx: &Context) -> Result<u32> {
        let mut st = self.per_device.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = st.iter().find(|k| k.ordinal == ctx.ordinal()) {
            return Ok(k.static_shared);
        }
        let mut v: std::ffi::c_int = 0;
        crate::capture::relaxed(d, || {
            // SAFETY: out-pointer to a local; `self.raw` is a kernel of a loaded library and
            // `ctx.device()` a valid device.
            unsafe {
                (d.cuKernelGetAttribute)(
                    &mut v,
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                    self.raw,
                    ctx.device(),
                )
            }
            .check("cuKernelGetAttribute")
        })?;
        let static_shared = u32::try_from(v).unwrap_or(0);
        st.push(OnDevice {
            ordinal: ctx.ordinal(),
            static_shared,
            opted_in: Vec::new(),
        });
        Ok(static_shared)
    }

    /// The kernel's function in the current context (`cuKernelGetFunction`).
    fn function(&self, d: &Driver) -> Result<CUfunction> {
        let mut func: CUfunction = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; a context is current (the caller's contract).
        unsafe { (d.cuKernelGetFunction)(&mut func, self.raw) }.check("cuKernelGetFunction")?;
        Ok(func)
    }

    /// The dynamic shared memory part of [`prepare_launch`](Kernel::prepare_launch); a launch
    /// whose opt-in is already known makes one `cuCtxGetId` and no other call.
    fn prepare_shared_memory(&self, d: &Driver, ctx: &Context, dynamic: u32) -> Result<()> {
        let limits = ctx.limits();
        let static_shared = self.static_shared(d, ctx)?;
        let limit = limits
            .max_shared_mem_per_block_optin
            .saturating_sub(static_shared);
        if dynamic > limit {
            return Err(Error::InvalidConfig {
                what: "shared_mem_bytes (the device's opt-in limit per block minus the \
                       kernel's static shared memory)",
                value: dynamic.into(),
                limit: limit.into(),
            });
        }
        let default = limits
            .max_shared_mem_per_block
            .saturating_sub(static_shared);
        if dynamic <= default {
            return Ok(());
        }
        let mut id = 0u64;
        // SAFETY: out-pointer to a local; `ctx.raw()` is a retained context.
        unsafe { (d.cuCtxGetId)(ctx.raw(), &mut id) }.check("cuCtxGetId")?;
        if self.opted_in(ctx.ordinal(), id) {
            return Ok(());
        }
        crate::capture::relaxed_with(d, || -> Result<()> {
            let func = self.function(d)?;
            let mut now: std::ffi::c_int = 0;
            // SAFETY: out-pointer to a local; `func` is the kernel's function in the current
            // context.
            unsafe {
                (d.cuFuncGetAttribute)(
                    &mut now,
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    func,
                )
            }
            .check("cuFuncGetAttribute")?;
            if u32::try_from(now).unwrap_or(0) < dynamic {
                // SAFETY: a valid attribute and value (at most the opt-in limit minus the
                // static part) for a kernel of a loaded library on a valid device.
                unsafe {
                    (d.cuKernelSetAttribute)(
                        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        std::ffi::c_int::try_from(limit).unwrap_or(std::ffi::c_int::MAX),
                        self.raw,
                        ctx.device(),
                    )
                }
                .check("cuKernelSetAttribute")?;
            }
            Ok(())
        })?;
        self.note_opted_in(ctx.ordinal(), id);
        Ok(())
    }

    /// Whether the dynamic shared memory limit is known raised in context `id` of `ordinal`.
    fn opted_in(&self, ordinal: i32, id: u64) -> bool {
        let st = self.per_device.lock().unwrap_or_else(|p| p.into_inner());
        st.iter()
            .any(|k| k.ordinal == ordinal && k.opted_in.contains(&id))
    }

    fn note_opted_in(&self, ordinal: i32, id: u64) {
        let mut st = self.per_device.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = st.iter_mut().find(|k| k.ordinal == ordinal)
            && !k.opted_in.contains(&id)
        {
            k.opted_in.push(id);
        }
    }

    /// A cooperative launch's grid against the kernel's occupancy on this device.
    fn check_cooperative(&self, d: &Driver, ctx: &Context, config: &LaunchConfig) -> Result<()> {
        let block = std::ffi::c_int::try_from(config.block.volume()).unwrap_or(0);
        let mut per_sm: std::ffi::c_int = 0;
        crate::capture::relaxed_with(d, || -> Result<()> {
            let func = self.function(d)?;
            // SAFETY: out-pointer to a local; `func` is the kernel's function in the current
            // context; block size and shared memory were validated against the device's limits.
            unsafe {
                (d.cuOccupancyMaxActiveBlocksPerMultiprocessor)(
                    &mut per_sm,
                    func,
                    block,
                    config.shared_mem_bytes as usize,
                )
            }
            .check("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
            Ok(())
        })?;
        let limit =
            u64::try_from(per_sm).unwrap_or(0) * u64::from(ctx.limits().multiprocessor_count);
        if config.grid.volume() > limit {
            return Err(Error::InvalidConfig {
                what: "grid size (x*y*z) of a cooperative launch (co-resident blocks: blocks per \
                       SM for this block size and shared memory, times the SM count)",
                value: config.grid.volume(),
                limit,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use cuda_sys::{CUresult, CudaError};

    use super::{Error, not_found};

    #[test]
    fn a_missing_kernel_is_named_and_other_lookup_errors_stay_driver_errors() {
        let missing = CudaError::new(CUresult::CUDA_ERROR_NOT_FOUND, "cuLibraryGetKernel");
        let e = not_found("_Z10vector_addPfS_", missing);
        assert!(
            matches!(&e, Error::KernelNotFound { name, .. } if name == "_Z10vector_addPfS_"),
            "{e:?}"
        );
        assert!(e.to_string().contains("extern \"C\""), "{e}");
        let dead = CudaError::new(CUresult::CUDA_ERROR_INVALID_CONTEXT, "cuLibraryGetKernel");
        let e = not_found("k", dead);
        assert!(matches!(e, Error::Cuda(c) if c == dead), "{e:?}");
    }
}
