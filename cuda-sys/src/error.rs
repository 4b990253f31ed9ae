//! Errors: a failed driver call ([`CudaError`]) and a driver that could not be loaded
//! ([`LoadError`]).

use std::borrow::Cow;
use std::ffi::CStr;
use std::fmt;
use std::path::PathBuf;

use crate::{CUdriverProcAddressQueryResult, CUresult, result_name};

/// A driver API call that returned something other than `CUDA_SUCCESS`.
///
/// Carries the code and the name of the call that returned it. Displays as
/// `cuLaunchKernelEx failed: CUDA_ERROR_INVALID_VALUE (invalid argument)`; the part in
/// parentheses is the driver's own description and appears only once [`driver()`](crate::driver)
/// has loaded the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[error("{function} failed: {}", Described(*.code))]
pub struct CudaError {
    /// The code the call returned.
    pub code: CUresult,
    /// The driver API function that returned it, e.g. `"cuLaunchKernelEx"`.
    pub function: &'static str,
}

impl CudaError {
    /// An error for `code` returned by `function`.
    pub const fn new(code: CUresult, function: &'static str) -> Self {
        Self { code, function }
    }

    /// The name `cuda.h` gives the code (`"CUDA_ERROR_INVALID_VALUE"`), or
    /// `"CUDA_ERROR_UNKNOWN_<code>"` for a code the pinned `cuda.h` does not define (a newer driver
    /// may return one). Needs no driver.
    pub fn name(&self) -> Cow<'static, str> {
        code_name(self.code)
    }

    /// The driver's description of the code (`cuGetErrorString`, e.g. `"invalid argument"`), or
    /// `None` when [`driver()`](crate::driver) has not loaded a driver or the driver does not know
    /// the code. Never loads the driver itself.
    #[doc(alias = "cuGetErrorString")]
    pub fn description(&self) -> Option<&'static str> {
        let error_string = ERROR_STRING.get()?;
        let mut text: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `cuGetErrorString` takes any code and writes through the out pointer, which is
        // valid for a write; it needs no initialised driver.
        let result = unsafe { error_string(self.code, &mut text) };
        if result != CUresult::CUDA_SUCCESS || text.is_null() {
            return None;
        }
        // SAFETY: on success the driver points `text` at a NUL-terminated string in its own
        // static storage, which lives as long as the library; the loaded driver is never unloaded
        // (it sits in a process-wide static).
        unsafe { CStr::from_ptr(text) }.to_str().ok()
    }
}

/// `cuGetErrorString` of the loaded driver.
pub(crate) type ErrorString =
    unsafe extern "C" fn(CUresult, *mut *const std::ffi::c_char) -> CUresult;

/// The process-wide driver's `cuGetErrorString` (see [`driver()`](crate::driver)), set by the
/// loader once it has resolved the entry points, so that this module needs nothing of the
/// loader's. That driver is never unloaded.
static ERROR_STRING: std::sync::OnceLock<ErrorString> = std::sync::OnceLock::new();

/// Called by the loader with the process-wide driver's `cuGetErrorString`, once it is loaded.
pub(crate) fn describe_with(error_string: ErrorString) {
    let _ = ERROR_STRING.set(error_string);
}

fn code_name(code: CUresult) -> Cow<'static, str> {
    match result_name(code.0) {
        Some(name) => Cow::Borrowed(name),
        None => Cow::Owned(format!("CUDA_ERROR_UNKNOWN_{}", code.0)),
    }
}

/// Formats a code as `NAME (description)`, or `NAME` when no description is available.
struct Described(CUresult);

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let error = CudaError::new(self.0, "");
        match error.description() {
            Some(text) => write!(f, "{} ({text})", error.name()),
            None => f.write_str(&error.name()),
        }
    }
}

/// Turns a [`CUresult`] into a `Result`.
pub trait CuResultExt {
    /// `Ok(())` for `CUDA_SUCCESS`, else a [`CudaError`] naming `function`, the call that returned
    /// the code.
    ///
    /// # Errors
    ///
    /// [`CudaError`] for any code other than `CUDA_SUCCESS`.
    fn check(self, function: &'static str) -> Result<(), CudaError>;
}

impl CuResultExt for CUresult {
    #[inline]
    fn check(self, function: &'static str) -> Result<(), CudaError> {
        if self == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CudaError::new(self, function))
        }
    }
}

/// Why [`driver()`](crate::driver) or [`Driver::load`](crate::Driver::load) produced no driver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The driver library could not be opened: no NVIDIA driver is installed, or the path (from
    /// `TILE_LIBCUDA` or the caller) is wrong.
    #[error(
        "no NVIDIA driver found: could not load {} ({reason}); install the NVIDIA driver or set \
         TILE_LIBCUDA to the path of libcuda.so.1",
        path.display()
    )]
    LibraryNotFound {
        /// The path or file name that was opened.
        path: PathBuf,
        /// The loader's explanation (`dlerror`).
        reason: String,
    },
    /// A driver entry point could not be resolved: the library is not the CUDA driver, or the
    /// driver is too old for the ABI version asked for.
    #[error("CUDA driver entry point {symbol} (ABI of CUDA {}) not found: {status}", CudaVersion(*version))]
    MissingSymbol {
        /// The symbol asked for, e.g. `"cuLaunchKernelEx"` or `"cuGetProcAddress_v2"`.
        symbol: &'static str,
        /// The CUDA version whose ABI was asked for, as `1000 * major + 10 * minor`.
        version: i32,
        /// What the library or the driver said.
        status: SymbolStatus,
    },
    /// The driver was loaded but failed to initialise (`cuInit` or `cuDriverGetVersion` failed,
    /// e.g. with `CUDA_ERROR_NO_DEVICE`).
    #[error("the CUDA driver failed to initialise: {0}")]
    Init(CudaError),
}

/// Why a symbol was not resolved; part of [`LoadError::MissingSymbol`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SymbolStatus {
    /// The library does not export the symbol (`dlsym` failed): it is not the CUDA driver, or
    /// one older than CUDA 12.0.
    NotExported {
        /// The loader's explanation (`dlerror`).
        reason: String,
    },
    /// `cuGetProcAddress_v2` did not return the entry point.
    Driver {
        /// What `cuGetProcAddress_v2` returned.
        result: CUresult,
        /// Its `symbolStatus` out-parameter: not found, or the driver's version is too old.
        query: CUdriverProcAddressQueryResult,
    },
}

impl fmt::Display for SymbolStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotExported { reason } => {
                write!(
                    f,
                    "the library does not export it (is it libcuda.so.1?): {reason}"
                )
            }
            Self::Driver { result, query } => {
                let query = match *query {
                    CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SUCCESS => {
                        "found, but null"
                    }
                    CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND => {
                        "the driver does not have it"
                    }
                    CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT => {
                        "the installed driver is older than this ABI version"
                    }
                    _ => "unknown query status",
                };
                write!(
                    f,
                    "cuGetProcAddress_v2 returned {}: {query}",
                    code_name(*result)
                )
            }
        }
    }
}

/// Formats `12030` as `12.3`.
struct CudaVersion(i32);

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.0 / 1000, self.0 % 1000 / 10)
    }
}
