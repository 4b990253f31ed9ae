//! The one mapping from tile's errors to Python exceptions.
//!
//! | tile error | Python exception |
//! |---|---|
//! | wrong kind, dtype, argument count, scalar type, capsule name, stream type, kernel signature | `TypeError` |
//! | bad value: device, host memory labelled as device memory, grid/block, read-only, copied (`IS_COPIED`) or overlapping output, a tensor that is not dense row-major for a plain pointer parameter, an output that requires grad or is an immutable (JAX) array, a lazy conjugate / negative view, null data, ndim, consumed capsule, NUL in a kernel name; (`cudarc` only, not reachable from Python) layout, context | `ValueError` |
//! | unsupported DLPack major version | `BufferError` |
//! | size, address or scalar overflow | `OverflowError` |
//! | a library file that cannot be read (`Library.from_file`) | `OSError`, as `open()` raises it (`FileNotFoundError`, `PermissionError`, ...; `.errno`, `.filename`) |
//! | NVRTC missing or compilation failed, tensor memory on another device than its descriptor says, a captured launch asked about completion, a producer outside the capture, the graph release thread not started | `RuntimeError` |
//! | a CUDA driver call failed, or the driver is too old or failed to initialise | `tile_py.CudaError` (`.name`: the driver's error name, `.function`: the call) |
//! | no driver: `libcuda.so.1` (or `TILE_LIBCUDA`) could not be opened | `tile_py.DriverNotFoundError`, a `CudaError` with `.name` and `.function` None |
//!
//! Messages start with `argument {i}: ` when one argument is at fault and quote the offending
//! value.

use pyo3::create_exception;
use pyo3::exceptions::{
    PyBufferError, PyOSError, PyOverflowError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::prelude::*;
use tile_dlpack::DescriptorError;
use tile_dlpack::ffi::DLDeviceType;
use tile_launch::Error;

create_exception!(
    tile_py,
    CudaError,
    PyRuntimeError,
    "A CUDA driver call failed, or the driver could not be loaded. `.name` is the driver's \
     name for the error (e.g. `CUDA_ERROR_INVALID_VALUE`) and `.function` the driver call that \
     returned it (e.g. `cuLaunchKernel`); both are None when no driver call was made."
);

create_exception!(
    tile_py,
    DriverNotFoundError,
    CudaError,
    "The CUDA driver library could not be opened: no NVIDIA driver is installed, or \
     `TILE_LIBCUDA` names a missing file. A `CudaError` whose `.name` and `.function` are None; \
     the message names the library and the loader's reason."
);

/// How to fix an argument in host memory, which a kernel cannot read.
pub(crate) const HOST_MEMORY_FIX: &str = "move it to the device first, e.g. \
     torch.from_numpy(x).cuda() or cupy.asarray(x)";

/// An error of tile-py's own argument conversion: the exception class and the message.
#[derive(Debug)]
pub(crate) enum Kind {
    Type,
    Value,
    Overflow,
    Buffer,
    /// An internal error (a caught panic): `RuntimeError`.
    Runtime,
}

/// Whether `e`, raised while reading a user's object (its `__index__`, `__float__`, an
/// attribute), must reach the caller as it was raised rather than be reported as a bad
/// argument: anything that is not an ordinary `Exception` (`KeyboardInterrupt`, `SystemExit`),
/// and `MemoryError` and `RecursionError`, which say nothing about the argument.
pub(crate) fn raised_as_is(py: Python<'_>, e: &PyErr) -> bool {
    !e.is_instance_of::<pyo3::exceptions::PyException>(py)
        || e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py)
        || e.is_instance_of::<pyo3::exceptions::PyRecursionError>(py)
}

/// `e` itself when it must propagate as raised ([`raised_as_is`]), else the argument error
/// `bad()`, with `e` as its cause.
pub(crate) fn reraise_or(py: Python<'_>, e: PyErr, bad: impl FnOnce() -> PyErr) -> PyErr {
    if raised_as_is(py, &e) {
        return e;
    }
    let b = bad();
    b.set_cause(py, Some(e));
    b
}

/// Builds the exception for one of tile-py's own checks.
pub(crate) fn err(kind: Kind, msg: impl Into<String>) -> PyErr {
    let msg = msg.into();
    match kind {
        Kind::Type => PyTypeError::new_err(msg),
        Kind::Value => PyValueError::new_err(msg),
        Kind::Overflow => PyOverflowError::new_err(msg),
        Kind::Buffer => PyBufferError::new_err(msg),
        Kind::Runtime => PyRuntimeError::new_err(msg),
    }
}

/// `argument {index}: {msg}` as the given exception.
pub(crate) fn arg_err(kind: Kind, index: usize, msg: impl std::fmt::Display) -> PyErr {
    err(kind, format!("argument {index}: {msg}"))
}

fn descriptor_kind(e: &DescriptorError) -> Kind {
    match e {
        DescriptorError::UnsupportedVersion { .. } => Kind::Buffer,
        DescriptorError::Overflow { .. } => Kind::Overflow,
        DescriptorError::UnsupportedDtype { .. } | DescriptorError::PaddedSubByte { .. } => {
            Kind::Type
        }
        _ => Kind::Value,
    }
}

/// Maps a tile-launch error. `expected` names, per argument index, what the kernel declares
/// (used to complete dtype errors).
pub(crate) fn launch_err(
    py: Python<'_>,
    e: Error,
    expected: impl Fn(usize) -> Option<String>,
) -> PyErr {
    match e {
        Error::Cuda(c) => cuda_err(py, &c.to_string(), Some(&c)),
        // The driver's NOT_FOUND, told with the kernel's name and the `extern "C"` hint.
        Error::KernelNotFound { .. } => cuda_err(py, &e.to_string(), e.cuda()),
        Error::Driver(l) => driver_err(py, &l),
        Error::Descriptor { index, source } => {
            let kind = descriptor_kind(&source);
            let mut msg = format!("argument {index}: {source}");
            if matches!(kind, Kind::Type)
                && let Some(exp) = expected(index)
            {
                msg.push_str(&format!("; the kernel expects {exp}"));
            }
            err(kind, msg)
        }
        Error::ArgumentCount { .. }
        | Error::ArgumentKind { .. }
        | Error::DtypeMismatch { .. }
        | Error::NdimMismatch { .. } => PyTypeError::new_err(e.to_string()),
        Error::DeviceMismatch { tensor, .. } if tensor.device_type == DLDeviceType::CPU => {
            PyValueError::new_err(format!("{e}; {HOST_MEMORY_FIX}"))
        }
        // The Python keyword, not tile-launch's field.
        Error::InvalidConfig { what, .. } if what.starts_with("shared_mem_bytes") => {
            PyValueError::new_err(e.to_string().replacen("shared_mem_bytes", "shared_mem", 1))
        }
        Error::DeviceMismatch { .. }
        | Error::NotDeviceMemory { .. }
        | Error::NotContiguous { .. }
        | Error::InvalidConfig { .. }
        | Error::KernelName { .. }
        | Error::Layout(_)
        | Error::NonPrimaryContext { .. }
        | Error::WrongContext { .. }
        | Error::AssumptionBroken { .. } => PyValueError::new_err(e.to_string()),
        Error::DeviceOrdinal { .. } | Error::IndexOverflow { .. } => {
            PyOverflowError::new_err(e.to_string())
        }
        Error::Signature { .. } => PyTypeError::new_err(e.to_string()),
        Error::ReadFile { path, source, .. } => os_err(&path, &source),
        Error::PointerDeviceMismatch { .. }
        | Error::CapturedLaunch
        | Error::ProducerOutsideCapture { .. }
        | Error::NvrtcUnavailable { .. }
        | Error::Compile { .. }
        | Error::ReleaseThread(_)
        | Error::CaptureInProgress { .. }
        | Error::ThreadRelativeStream { .. } => PyRuntimeError::new_err(e.to_string()),
        // `Error` is `#[non_exhaustive]`: a variant added to tile-launch later, until it is
        // mapped above.
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// An `OSError` as Python's own file functions raise it: `OSError(errno, strerror, filename)`,
/// which Python turns into the subclass for the errno (`FileNotFoundError`,
/// `PermissionError`, ...), with `.errno`, `.strerror` and `.filename` set.
fn os_err(path: &std::path::Path, source: &std::io::Error) -> PyErr {
    match source.raw_os_error() {
        Some(errno) => {
            let text = source.to_string();
            let suffix = format!(" (os error {errno})");
            let strerror = text.strip_suffix(&suffix).unwrap_or(&text).to_owned();
            PyOSError::new_err((errno, strerror, path.to_path_buf()))
        }
        None => PyOSError::new_err(format!("cannot read {}: {source}", path.display())),
    }
}

/// A `tile_py.CudaError` with `.name` (the driver's error name) and `.function` (the driver
/// call that returned it) set from `call`, both None when no driver call was made.
pub(crate) fn cuda_err(py: Python<'_>, msg: &str, call: Option<&cuda_sys::CudaError>) -> PyErr {
    with_cuda_attrs(py, CudaError::new_err(msg.to_owned()), call)
}

/// Maps a failure to load the driver: `DriverNotFoundError` when the library could not be
/// opened, else a `CudaError` (`.name` and `.function` set when `cuInit` failed, None for a
/// missing entry point, i.e. a driver too old or a library that is not the driver).
fn driver_err(py: Python<'_>, e: &cuda_sys::LoadError) -> PyErr {
    match e {
        cuda_sys::LoadError::LibraryNotFound { .. } => {
            with_cuda_attrs(py, DriverNotFoundError::new_err(e.to_string()), None)
        }
        cuda_sys::LoadError::Init(c) => cuda_err(py, &e.to_string(), Some(c)),
        _ => cuda_err(py, &e.to_string(), None),
    }
}

/// Sets `.name` and `.function` on a fresh `CudaError` (or subclass) from `call`.
fn with_cuda_attrs(py: Python<'_>, e: PyErr, call: Option<&cuda_sys::CudaError>) -> PyErr {
    let value = e.value(py);
    // Setting an attribute on a fresh exception instance cannot fail short of memory
    // exhaustion; if it does, the exception still carries the message.
    let _ = value.setattr("name", call.map(|c| c.name().into_owned()));
    let _ = value.setattr("function", call.map(|c| c.function));
    e
}

/// The message a panic carried (`panic!` with a literal or a formatted string), or `default`.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send), default: &str) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| default.to_owned())
}

/// `text` on one line: each line break, with the indentation around it, becomes one space.
fn one_line(text: &str) -> String {
    if !text.contains('\n') {
        return text.to_owned();
    }
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines.join(" ")
}

/// A short `repr` of an offending value for messages: on one line (a multi-line `repr`, such as
/// a NumPy array's, is folded onto one) and at most 80 characters.
pub(crate) fn show(obj: &Bound<'_, PyAny>) -> String {
    let r = obj
        .repr()
        .map(|r| one_line(&r.to_string()))
        .unwrap_or_else(|_| "<unprintable>".into());
    let ty = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into());
    let r = if r.chars().count() > 80 {
        let cut: String = r.chars().take(77).collect();
        format!("{cut}...")
    } else {
        r
    };
    format!("{r} ({ty})")
}

/// Adds `note` to a Python exception raised by a producer, keeping its type (PEP 678 notes:
/// `add_note`, Python 3.11+; on Python 3.10 the note is appended to `__notes__` by hand, where
/// code can read it though the interpreter does not print it).
pub(crate) fn with_note(py: Python<'_>, e: PyErr, note: String) -> PyErr {
    let value = e.value(py);
    if value.hasattr("add_note").unwrap_or(false) {
        let _ = value.call_method1("add_note", (note,));
    } else {
        let notes = value
            .getattr("__notes__")
            .ok()
            .and_then(|n| n.extract::<Vec<String>>().ok())
            .unwrap_or_default();
        let mut notes = notes;
        notes.push(note);
        let _ = value.setattr("__notes__", notes);
    }
    e
}

/// The note added to an exception that a producer raised while its argument was converted:
/// `argument {index}: ...`, as tile_py's own messages begin.
pub(crate) fn argument_note(index: usize) -> String {
    format!("argument {index}: raised while converting this argument")
}
