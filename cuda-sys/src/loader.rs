//! Run-time loading of `libcuda.so.1` and resolution of every entry point through
//! `cuGetProcAddress_v2`.

use std::ffi::{CString, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libloading::Library;

use crate::error::SymbolStatus;
use crate::*;

/// Environment variable that overrides the path [`driver()`] opens (default [`DEFAULT_LIBCUDA`]).
///
/// Read once, by the first call to [`driver()`]. An empty value counts as unset.
pub const LIBCUDA_ENV: &str = "TILE_LIBCUDA";

/// The library [`driver()`] opens unless [`LIBCUDA_ENV`] says otherwise; found through the
/// dynamic loader's search path.
#[cfg(not(windows))]
pub const DEFAULT_LIBCUDA: &str = "libcuda.so.1";
/// The library [`driver()`] opens unless [`LIBCUDA_ENV`] says otherwise; found through the
/// dynamic loader's search path.
#[cfg(windows)]
pub const DEFAULT_LIBCUDA: &str = "nvcuda.dll";

/// The plain function-pointer type inside a bindgen `PFN_*` typedef.
///
/// bindgen declares `typedef CUresult (*PFN_cuInit_v2000)(unsigned int)` as
/// `Option<unsafe extern "C" fn(c_uint) -> CUresult>`; `<PFN_cuInit_v2000 as FnPtr>::Inner` is the
/// `unsafe extern "C" fn(c_uint) -> CUresult` itself. [`Driver`]'s fields have these types: a
/// loaded driver has every entry point, so none is optional.
pub trait FnPtr {
    /// The type inside the `Option`.
    type Inner;
}

impl<F> FnPtr for Option<F> {
    type Inner = F;
}

/// One row of the entry-point table; see [`Driver::ENTRY_POINTS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntryPoint {
    /// The [`Driver`] field, named as `cuda.h` 13.0 names the function (`"cuGraphInstantiate"`).
    pub field: &'static str,
    /// The name passed to `cuGetProcAddress_v2` (`"cuGraphInstantiateWithFlags"`); usually
    /// `field`.
    pub symbol: &'static str,
    /// The bindgen typedef that gives the field's signature (`"PFN_cuGraphInstantiateWithFlags_v11040"`).
    pub pfn: &'static str,
    /// The CUDA version whose ABI is asked for, `1000 * major + 10 * minor` (`11040`).
    pub version: i32,
}

/// The ABI version a `PFN_<name>_v<version>` typedef name ends with; a build error otherwise.
const fn pfn_version(pfn: &str) -> i32 {
    let bytes = pfn.as_bytes();
    let (mut i, mut version, mut scale) = (bytes.len(), 0, 1);
    while i > 0 && bytes[i - 1].is_ascii_digit() {
        version += (bytes[i - 1] - b'0') as i32 * scale;
        scale *= 10;
        i -= 1;
    }
    assert!(
        i >= 2 && bytes[i - 1] == b'v' && bytes[i - 2] == b'_',
        "PFN name must end in _v<N>"
    );
    version
}

type GetProcAddress = <PFN_cuGetProcAddress_v12000 as FnPtr>::Inner;

/// The symbol [`Driver::load`] looks up with `dlsym`; every other entry point comes from it.
const GET_PROC_ADDRESS: &str = "cuGetProcAddress_v2";
/// The ABI version of [`GET_PROC_ADDRESS`] (`PFN_cuGetProcAddress_v12000`).
const GET_PROC_ADDRESS_VERSION: i32 = 12000;

/// Resolve `symbol` at the ABI of CUDA `version`.
///
/// # Safety
///
/// `get` must be the driver's `cuGetProcAddress_v2`.
unsafe fn resolve(
    get: GetProcAddress,
    symbol: &'static str,
    version: i32,
) -> Result<*mut c_void, LoadError> {
    let name = CString::new(symbol).expect("entry point names contain no NUL");
    let mut pointer: *mut c_void = std::ptr::null_mut();
    let mut query = CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS;
    let flags = cuuint64_t::from(CUdriverProcAddress_flags::CU_GET_PROC_ADDRESS_DEFAULT.0);
    // SAFETY: `get` is `cuGetProcAddress_v2` (caller's contract); the name is NUL-terminated and
    // both out pointers are valid for writes for the duration of the call.
    let result = unsafe {
        get(
            name.as_ptr(),
            &mut pointer,
            version as c_int,
            flags,
            &mut query,
        )
    };
    if result == CUresult::CUDA_SUCCESS && !pointer.is_null() {
        Ok(pointer)
    } else {
        Err(LoadError::MissingSymbol {
            symbol,
            version,
            status: SymbolStatus::Driver { result, query },
        })
    }
}

macro_rules! entry_points {
    ($(
        $(#[doc = $doc:literal])*
        $field:ident $(as $symbol:literal)? : $pfn:ident @ $version:literal;
    )*) => {
        /// The CUDA driver's entry points, resolved from one library.
        ///
        /// Each field is named as `cuda.h` 13.0 names the function and has the plain
        /// `unsafe extern "C" fn` type of the `PFN_*` typedef named in its docs, which is the ABI
        /// it was resolved at (`PFN_cuStreamGetCaptureInfo_v12030`: asked for at version 12030).
        /// Every version is at most 13000, so a CUDA 13.0 driver (R580) has them all. The
        /// legacy-default-stream variants are used, never `_ptsz`/`_ptds`.
        ///
        /// Calling a field is `unsafe`: the caller upholds the CUDA driver API's contract for
        /// that function (valid handles, pointers valid for the sizes given, a current context
        /// where one is needed). The function pointers are valid while this `Driver` lives; the
        /// one [`driver()`] returns lives for the rest of the process.
        #[allow(non_snake_case)]
        pub struct Driver {
            $(
                $(#[doc = $doc])*
                #[doc = concat!(
                    "\n\n`", entry_points!(@symbol $field $($symbol)?), "` at the ABI of CUDA ",
                    stringify!($version), " (`", stringify!($pfn), "`)."
                )]
                pub $field: <$pfn as FnPtr>::Inner,
            )*
            version: i32,
            path: PathBuf,
            _library: Library,
        }

        impl Driver {
            /// Every entry point [`Driver`] resolves, in field order.
            pub const ENTRY_POINTS: &'static [EntryPoint] = &[$(
                EntryPoint {
                    field: stringify!($field),
                    symbol: entry_points!(@symbol $field $($symbol)?),
                    pfn: stringify!($pfn),
                    version: $version,
                },
            )*];

            /// Resolve every entry point through `get`.
            ///
            /// # Safety
            ///
            /// `get` must be the `cuGetProcAddress_v2` of `library`.
            #[allow(non_snake_case)]
            unsafe fn resolve_all(
                get: GetProcAddress,
                library: Library,
                path: PathBuf,
            ) -> Result<Self, LoadError> {
                $(
                    const _: () = assert!(
                        pfn_version(stringify!($pfn)) == $version && $version <= CUDA_VERSION as i32,
                        concat!(stringify!($field), ": version must match the PFN and be <= 13000"),
                    );
                    let symbol = entry_points!(@symbol $field $($symbol)?);
                    // SAFETY: `get` is the driver's `cuGetProcAddress_v2` (caller's contract).
                    let pointer = unsafe { resolve(get, symbol, $version) }?;
                    // SAFETY: the driver returned the entry point of `symbol` at the ABI of CUDA
                    // `$version`, whose signature is the `$pfn` typedef of the pinned
                    // cudaTypedefs.h; a non-null data pointer and an `Option<fn>` have the same
                    // size and representation.
                    let $field = unsafe { std::mem::transmute::<*mut c_void, $pfn>(pointer) }
                        .ok_or(LoadError::MissingSymbol {
                            symbol,
                            version: $version,
                            status: SymbolStatus::NotExported { reason: "null".into() },
                        })?;
                )*
                Ok(Self { $($field,)* version: 0, path, _library: library })
            }
        }
    };
    (@symbol $field:ident) => { stringify!($field) };
    (@symbol $field:ident $symbol:literal) => { $symbol };
}

entry_points! {
    // Initialisation, version, errors.
    cuInit: PFN_cuInit_v2000 @ 2000;
    cuDriverGetVersion: PFN_cuDriverGetVersion_v2020 @ 2020;
    cuGetErrorName: PFN_cuGetErrorName_v6000 @ 6000;
    cuGetErrorString: PFN_cuGetErrorString_v6000 @ 6000;
    // Devices.
    cuDeviceGet: PFN_cuDeviceGet_v2000 @ 2000;
    cuDeviceGetCount: PFN_cuDeviceGetCount_v2000 @ 2000;
    cuDeviceGetName: PFN_cuDeviceGetName_v2000 @ 2000;
    cuDeviceGetAttribute: PFN_cuDeviceGetAttribute_v2000 @ 2000;
    /// `cuDeviceTotalMem_v2`, as cuda.h maps the name.
    cuDeviceTotalMem: PFN_cuDeviceTotalMem_v3020 @ 3020;
    // Contexts.
    cuDevicePrimaryCtxRetain: PFN_cuDevicePrimaryCtxRetain_v7000 @ 7000;
    /// `cuDevicePrimaryCtxRelease_v2`, as cuda.h maps the name.
    cuDevicePrimaryCtxRelease: PFN_cuDevicePrimaryCtxRelease_v11000 @ 11000;
    cuCtxGetCurrent: PFN_cuCtxGetCurrent_v4000 @ 4000;
    cuCtxSetCurrent: PFN_cuCtxSetCurrent_v4000 @ 4000;
    cuCtxGetId: PFN_cuCtxGetId_v12000 @ 12000;
    /// `cuCtxPushCurrent_v2`, as cuda.h maps the name.
    cuCtxPushCurrent: PFN_cuCtxPushCurrent_v4000 @ 4000;
    /// `cuCtxPopCurrent_v2`, as cuda.h maps the name.
    cuCtxPopCurrent: PFN_cuCtxPopCurrent_v4000 @ 4000;
    /// The one-argument form (current context) that cuda.h 13.0 declares under this name, not
    /// the 13.0 form taking a context (`cuCtxGetDevice_v2`, `PFN_cuCtxGetDevice_v13000`).
    cuCtxGetDevice: PFN_cuCtxGetDevice_v2000 @ 2000;
    /// The no-argument form (current context), not `cuCtxSynchronize_v2` (13.0, takes a context).
    cuCtxSynchronize: PFN_cuCtxSynchronize_v2000 @ 2000;
    // Streams.
    cuStreamCreate: PFN_cuStreamCreate_v2000 @ 2000;
    cuStreamCreateWithPriority: PFN_cuStreamCreateWithPriority_v5050 @ 5050;
    /// `cuStreamDestroy_v2`, as cuda.h maps the name.
    cuStreamDestroy: PFN_cuStreamDestroy_v4000 @ 4000;
    cuStreamQuery: PFN_cuStreamQuery_v2000 @ 2000;
    cuStreamSynchronize: PFN_cuStreamSynchronize_v2000 @ 2000;
    /// The two-argument form cuda.h 13.0 declares under this name, not `cuStreamGetCtx_v2`
    /// (12.5, also returns a green context).
    cuStreamGetCtx: PFN_cuStreamGetCtx_v9020 @ 9020;
    cuStreamGetId: PFN_cuStreamGetId_v12000 @ 12000;
    cuStreamIsCapturing: PFN_cuStreamIsCapturing_v10000 @ 10000;
    /// `cuStreamGetCaptureInfo_v3` (with edge data), as cuda.h 13.0 maps the name.
    cuStreamGetCaptureInfo: PFN_cuStreamGetCaptureInfo_v12030 @ 12030;
    /// `cuStreamBeginCapture_v2` (with a capture mode), as cuda.h maps the name.
    cuStreamBeginCapture: PFN_cuStreamBeginCapture_v10010 @ 10010;
    cuStreamEndCapture: PFN_cuStreamEndCapture_v10000 @ 10000;
    cuThreadExchangeStreamCaptureMode: PFN_cuThreadExchangeStreamCaptureMode_v10010 @ 10010;
    cuStreamWaitEvent: PFN_cuStreamWaitEvent_v3020 @ 3020;
    // Events.
    cuEventCreate: PFN_cuEventCreate_v2000 @ 2000;
    /// `cuEventDestroy_v2`, as cuda.h maps the name.
    cuEventDestroy: PFN_cuEventDestroy_v4000 @ 4000;
    cuEventRecord: PFN_cuEventRecord_v2000 @ 2000;
    cuEventQuery: PFN_cuEventQuery_v2000 @ 2000;
    cuEventSynchronize: PFN_cuEventSynchronize_v2000 @ 2000;
    /// `cuEventElapsedTime_v2`, as cuda.h 13.0 maps the name (same signature as the original).
    cuEventElapsedTime: PFN_cuEventElapsedTime_v12080 @ 12080;
    // Libraries and kernels.
    cuLibraryLoadData: PFN_cuLibraryLoadData_v12000 @ 12000;
    cuLibraryUnload: PFN_cuLibraryUnload_v12000 @ 12000;
    cuLibraryGetKernel: PFN_cuLibraryGetKernel_v12000 @ 12000;
    cuKernelGetAttribute: PFN_cuKernelGetAttribute_v12000 @ 12000;
    cuKernelSetAttribute: PFN_cuKernelSetAttribute_v12000 @ 12000;
    cuKernelGetFunction: PFN_cuKernelGetFunction_v12000 @ 12000;
    cuOccupancyMaxActiveBlocksPerMultiprocessor:
        PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050 @ 6050;
    cuKernelGetParamInfo: PFN_cuKernelGetParamInfo_v12040 @ 12040;
    cuFuncGetAttribute: PFN_cuFuncGetAttribute_v2020 @ 2020;
    // Launches.
    cuLaunchKernel: PFN_cuLaunchKernel_v4000 @ 4000;
    cuLaunchKernelEx: PFN_cuLaunchKernelEx_v11060 @ 11060;
    cuLaunchHostFunc: PFN_cuLaunchHostFunc_v10000 @ 10000;
    // Memory.
    cuPointerGetAttribute: PFN_cuPointerGetAttribute_v4000 @ 4000;
    cuPointerGetAttributes: PFN_cuPointerGetAttributes_v7000 @ 7000;
    /// `cuMemAlloc_v2`, as cuda.h maps the name.
    cuMemAlloc: PFN_cuMemAlloc_v3020 @ 3020;
    /// `cuMemFree_v2`, as cuda.h maps the name.
    cuMemFree: PFN_cuMemFree_v3020 @ 3020;
    cuMemAllocAsync: PFN_cuMemAllocAsync_v11020 @ 11020;
    cuMemFreeAsync: PFN_cuMemFreeAsync_v11020 @ 11020;
    /// `cuMemcpyHtoD_v2`, as cuda.h maps the name.
    cuMemcpyHtoD: PFN_cuMemcpyHtoD_v3020 @ 3020;
    /// `cuMemcpyDtoH_v2`, as cuda.h maps the name.
    cuMemcpyDtoH: PFN_cuMemcpyDtoH_v3020 @ 3020;
    /// `cuMemcpyHtoDAsync_v2`, as cuda.h maps the name.
    cuMemcpyHtoDAsync: PFN_cuMemcpyHtoDAsync_v3020 @ 3020;
    /// `cuMemcpyDtoHAsync_v2`, as cuda.h maps the name.
    cuMemcpyDtoHAsync: PFN_cuMemcpyDtoHAsync_v3020 @ 3020;
    /// `cuMemcpyDtoDAsync_v2`, as cuda.h maps the name.
    cuMemcpyDtoDAsync: PFN_cuMemcpyDtoDAsync_v3020 @ 3020;
    /// `cuMemsetD8_v2`, as cuda.h maps the name.
    cuMemsetD8: PFN_cuMemsetD8_v3020 @ 3020;
    cuMemsetD32Async: PFN_cuMemsetD32Async_v3020 @ 3020;
    // User objects and graphs.
    cuUserObjectCreate: PFN_cuUserObjectCreate_v11030 @ 11030;
    cuUserObjectRelease: PFN_cuUserObjectRelease_v11030 @ 11030;
    cuGraphRetainUserObject: PFN_cuGraphRetainUserObject_v11030 @ 11030;
    cuGraphCreate: PFN_cuGraphCreate_v10000 @ 10000;
    cuGraphDestroy: PFN_cuGraphDestroy_v10000 @ 10000;
    cuGraphClone: PFN_cuGraphClone_v10000 @ 10000;
    cuGraphGetNodes: PFN_cuGraphGetNodes_v10000 @ 10000;
    cuGraphNodeGetType: PFN_cuGraphNodeGetType_v10000 @ 10000;
    cuGraphMemAllocNodeGetParams: PFN_cuGraphMemAllocNodeGetParams_v11040 @ 11040;
    cuGraphChildGraphNodeGetGraph: PFN_cuGraphChildGraphNodeGetGraph_v10000 @ 10000;
    /// The flags form `cuGraphInstantiate(CUgraphExec *, CUgraph, unsigned long long flags)`
    /// that cuda.h 12.0+ declares: cuda.h maps the name to `cuGraphInstantiateWithFlags`, which is
    /// the symbol resolved.
    cuGraphInstantiate as "cuGraphInstantiateWithFlags": PFN_cuGraphInstantiateWithFlags_v11040 @ 11040;
    cuGraphLaunch: PFN_cuGraphLaunch_v10000 @ 10000;
    cuGraphExecDestroy: PFN_cuGraphExecDestroy_v10000 @ 10000;
}

impl Driver {
    /// Open the driver library at `path` and resolve every entry point; uncached, and does not
    /// call `cuInit` (use [`driver()`] for that).
    ///
    /// `path` is handed to the dynamic loader: a bare file name (`"libcuda.so.1"`) is searched
    /// for on the loader's path. `cuGetProcAddress_v2` is found with `dlsym`; every other entry
    /// point comes from it at the ABI version listed in [`Driver::ENTRY_POINTS`]. Then
    /// `cuDriverGetVersion` is called (it needs no `cuInit`).
    ///
    /// `path` is trusted like `LD_LIBRARY_PATH`: the library runs its initialisers when opened,
    /// and a library that is not the CUDA driver but exports `cuGetProcAddress_v2` with another
    /// meaning would be called as if it were.
    ///
    /// # Errors
    ///
    /// - [`LoadError::LibraryNotFound`] if the library cannot be opened;
    /// - [`LoadError::MissingSymbol`] if it does not export `cuGetProcAddress_v2` (not the CUDA
    ///   driver, or one older than 12.0) or the driver does not have an entry point at the ABI
    ///   version asked for;
    /// - [`LoadError::Init`] if `cuDriverGetVersion` fails.
    pub fn load(path: &Path) -> Result<Driver, LoadError> {
        // SAFETY: opening a library runs its initialisers; the path names the CUDA driver, whose
        // initialisers are sound to run from any thread (documented contract of this function).
        let library = unsafe { Library::new(path.as_os_str()) }.map_err(|error| {
            LoadError::LibraryNotFound {
                path: path.to_path_buf(),
                reason: loader_message(&error),
            }
        })?;
        let missing = |reason: String| LoadError::MissingSymbol {
            symbol: GET_PROC_ADDRESS,
            version: GET_PROC_ADDRESS_VERSION,
            status: SymbolStatus::NotExported { reason },
        };
        // SAFETY: in the CUDA driver, `cuGetProcAddress_v2` has the signature of
        // `PFN_cuGetProcAddress_v12000`; the pointer is copied out of the `Symbol` and stays valid
        // while `library` is loaded, which `Driver` keeps it.
        let get = unsafe { library.get::<PFN_cuGetProcAddress_v12000>(GET_PROC_ADDRESS) }
            .map_err(|error| missing(loader_message(&error)))
            .map(|symbol| *symbol)?
            .ok_or_else(|| missing("the symbol is null".into()))?;
        // SAFETY: `get` is this library's `cuGetProcAddress_v2`.
        let mut driver = unsafe { Self::resolve_all(get, library, path.to_path_buf()) }?;
        let mut version: c_int = 0;
        // SAFETY: `cuDriverGetVersion` writes one int through a pointer valid for the write; it
        // may be called before `cuInit`.
        unsafe { (driver.cuDriverGetVersion)(&mut version) }
            .check("cuDriverGetVersion")
            .map_err(LoadError::Init)?;
        driver.version = version;
        Ok(driver)
    }

    /// The driver's CUDA version, `1000 * major + 10 * minor` (`13000` for a CUDA 13.0 driver),
    /// as `cuDriverGetVersion` reported it when the driver was loaded.
    #[doc(alias = "cuDriverGetVersion")]
    pub fn version(&self) -> i32 {
        self.version
    }

    /// The path or file name the library was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// A `libloading` error with its `dlerror` text (the error's source), which its own `Display`
/// leaves out.
fn loader_message(error: &libloading::Error) -> String {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// What the first call to [`driver()`] found; kept for the life of the process.
struct State {
    /// The library with its entry points resolved, kept even when `cuInit` failed so that error
    /// descriptions still work.
    loaded: Result<Driver, LoadError>,
    /// The outcome of `cuInit(0)`.
    init: Result<(), LoadError>,
}

static STATE: OnceLock<State> = OnceLock::new();

/// The process-wide CUDA driver: loaded, resolved and initialised (`cuInit(0)`) on the first
/// call; later calls return the same driver, or a clone of the same error.
///
/// Opens the library named by the environment variable `TILE_LIBCUDA` ([`LIBCUDA_ENV`]) if set,
/// else `libcuda.so.1` ([`DEFAULT_LIBCUDA`]) from the loader's search path, then proceeds as
/// [`Driver::load`].
///
/// # Errors
///
/// Those of [`Driver::load`], and [`LoadError::Init`] if `cuInit(0)` fails (for example
/// `CUDA_ERROR_NO_DEVICE` on a machine with a driver but no GPU). A machine without a driver gets
/// [`LoadError::LibraryNotFound`]; nothing panics.
#[doc(alias = "cuInit")]
pub fn driver() -> Result<&'static Driver, LoadError> {
    let state = STATE.get_or_init(|| {
        let path = std::env::var_os(LIBCUDA_ENV)
            .filter(|path| !path.is_empty())
            .map_or_else(|| PathBuf::from(DEFAULT_LIBCUDA), PathBuf::from);
        let loaded = Driver::load(&path);
        if let Ok(driver) = &loaded {
            // The process-wide driver is never unloaded: its entry points stay valid.
            crate::error::describe_with(driver.cuGetErrorString);
        }
        let init = match &loaded {
            // SAFETY: `cuInit` takes a flags word that must be 0; it is safe to call at any time
            // from any thread.
            Ok(driver) => unsafe { (driver.cuInit)(0) }
                .check("cuInit")
                .map_err(LoadError::Init),
            Err(error) => Err(error.clone()),
        };
        State { loaded, init }
    });
    match (&state.loaded, &state.init) {
        (Ok(driver), Ok(())) => Ok(driver),
        (Err(error), _) | (_, Err(error)) => Err(error.clone()),
    }
}
