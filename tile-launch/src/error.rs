//! The one error type of `tile-launch`.

use std::path::PathBuf;

use cuda_sys::{CudaError, LoadError};
use tile_dlpack::{DType, DescriptorError, Device};

/// Everything that can go wrong while loading code, configuring a launch, checking its arguments,
/// launching, or waiting for the launched work.
///
/// Argument errors carry the zero-based index of the argument (`index`) so that a caller with many
/// tensors can tell which one was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The CUDA driver (`libcuda.so.1`) could not be loaded or initialised.
    #[error(transparent)]
    Driver(#[from] LoadError),

    /// A CUDA driver call failed; the error names the call and the driver's name for the code.
    #[error(transparent)]
    Cuda(#[from] CudaError),

    /// A DLPack descriptor is malformed, or cannot be bound to its parameter (read-only or
    /// self-overlapping output).
    #[error("argument {index}: {source}")]
    Descriptor {
        /// Zero-based argument index.
        index: usize,
        /// What is wrong with the descriptor.
        #[source]
        source: DescriptorError,
    },

    /// The number of arguments differs from the kernel's declared parameter list.
    #[error("kernel `{kernel}` expects {expected} arguments but {got} were given")]
    ArgumentCount {
        /// The kernel's name.
        kernel: String,
        /// Parameters declared by the kernel's signature.
        expected: usize,
        /// Arguments passed.
        got: usize,
    },

    /// An argument is of the wrong kind (a tensor where a scalar is declared, or a scalar of
    /// another type).
    #[error("argument {index}: expected {expected}, got {got}")]
    ArgumentKind {
        /// Zero-based argument index.
        index: usize,
        /// What the signature declares, e.g. `tensor of float32` or `scalar i64`.
        expected: String,
        /// What was passed.
        got: String,
    },

    /// A tensor's element type differs from the parameter's.
    #[error("argument {index}: expected a tensor of {expected}, got {got}")]
    DtypeMismatch {
        /// Zero-based argument index.
        index: usize,
        /// The parameter's element type.
        expected: DType,
        /// The tensor's element type.
        got: DType,
    },

    /// A tensor passed to an array parameter ([`Param::Array`](crate::Param::Array)) has another
    /// number of dimensions than declared.
    #[error("argument {index}: expected an array of {expected} dimensions, got {got}")]
    NdimMismatch {
        /// Zero-based argument index.
        index: usize,
        /// The declared number of dimensions.
        expected: u8,
        /// The tensor's number of dimensions.
        got: usize,
    },

    /// An extent or stride (in elements) of a tensor passed to an array parameter does not fit
    /// the parameter's index type.
    #[error(
        "argument {index}: {field} {value} of dimension {dim} does not fit the array \
         parameter's index type {index_type}"
    )]
    IndexOverflow {
        /// Zero-based argument index.
        index: usize,
        /// Whether an extent or a stride was refused.
        field: crate::ArrayField,
        /// The dimension.
        dim: usize,
        /// The refused value, in elements.
        value: i64,
        /// The declared index type.
        index_type: crate::IndexType,
    },

    /// A tensor passed to an array parameter breaks an assumption the kernel was compiled under
    /// ([`ArrayAssumptions`](crate::ArrayAssumptions)); running it would be undefined.
    #[error("argument {index}: {rule}, which the kernel was compiled to assume")]
    AssumptionBroken {
        /// Zero-based argument index.
        index: usize,
        /// The broken assumption and the tensor's value, as a sentence.
        rule: String,
    },

    /// A tensor bound to a plain (not strided) pointer parameter is not dense row-major: the
    /// kernel indexes the pointer densely and would read or write the wrong elements. Declare
    /// the parameter strided ([`Param::strided`](crate::Param::strided)) to pass any layout.
    #[error(
        "argument {index}: tensor is not dense row-major (shape {shape:?}, strides {strides:?} \
         in elements), but its parameter is a plain pointer the kernel indexes densely; pass a \
         contiguous tensor (e.g. `.contiguous()`), or declare the parameter strided and pass \
         the strides to the kernel"
    )]
    NotContiguous {
        /// Zero-based argument index.
        index: usize,
        /// The tensor's shape.
        shape: Vec<i64>,
        /// The tensor's strides, in elements.
        strides: Vec<i64>,
    },

    /// A tensor lives on a device the launch stream cannot use.
    #[error(
        "argument {index}: tensor is on {tensor}, but the launch stream is on cuda:{stream_device}"
    )]
    DeviceMismatch {
        /// Zero-based argument index.
        index: usize,
        /// The tensor's DLPack device.
        tensor: Device,
        /// The device ordinal of the launch stream.
        stream_device: i32,
    },

    /// A tensor's memory is on another device than the one its DLPack descriptor names (the
    /// pointer's `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`), and so not on the launch stream's.
    #[error(
        "argument {index}: tensor says it is on {tensor}, but its memory is on \
         cuda:{pointer_device}; the launch stream is on cuda:{stream_device}"
    )]
    PointerDeviceMismatch {
        /// Zero-based argument index.
        index: usize,
        /// The tensor's DLPack device.
        tensor: Device,
        /// The device ordinal the driver reports for the tensor's data pointer.
        pointer_device: i32,
        /// The device ordinal of the launch stream.
        stream_device: i32,
    },

    /// A tensor's data pointer is not memory the driver knows as device, managed or page-locked
    /// host memory (`cuPointerGetAttributes`): plain host memory labelled as device memory,
    /// which a kernel cannot address (it would fault and poison the context). While the stream
    /// captures, a pointer into an allocation node of the capture's graph (memory without a
    /// backing until the graph runs) is accepted; any other unknown pointer is refused.
    #[error(
        "argument {index}: tensor says it is on {tensor}, but the driver does not know its data \
         pointer {address:#x} as device, managed or page-locked host memory (host memory \
         labelled as device memory?); a kernel would fault on it"
    )]
    NotDeviceMemory {
        /// Zero-based argument index.
        index: usize,
        /// The tensor's DLPack device.
        tensor: Device,
        /// The tensor's data pointer (`data + byte_offset`).
        address: u64,
    },

    /// The launch was captured into a CUDA graph: it runs each time the graph is launched, and
    /// the graph owns its tensors, so there is no single completion to ask about.
    #[error(
        "the launch was captured into a CUDA graph; it runs when the graph is launched, and the \
         graph owns its tensors until it is destroyed"
    )]
    CapturedLaunch,

    /// The launch stream is capturing a CUDA graph, and a tensor's data is ready on a stream
    /// that is not part of that capture ([`TensorArg::ready_on`](crate::TensorArg::ready_on)):
    /// the graph cannot be ordered after work outside it (`cuStreamWaitEvent` would fail with
    /// `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` and invalidate the capture). Nothing was consumed
    /// and the capture is unchanged. Make the data ready before the capture begins (and pass the
    /// tensor without `ready_on`), or fork the producer's stream into the capture.
    #[error(
        "argument {index}: its data is ready on a stream outside the graph capture in progress on \
         the launch stream; the launch was refused and the capture left as it was"
    )]
    ProducerOutsideCapture {
        /// The argument's position.
        index: usize,
    },

    /// A launch configuration value is outside what the device or CUDA allows.
    #[error("invalid launch configuration: {}", ConfigRule { what, value: *value, limit: *limit })]
    InvalidConfig {
        /// Which value, e.g. `block.x` or `block size (x*y*z)`; for a divisibility rule, both
        /// values, `grid.x % cluster.x`.
        what: &'static str,
        /// The value given (for `a % b`: `a`).
        value: u64,
        /// The bound it breaks: an upper bound, a lower bound when above the value (1: "must be
        /// at least 1"), or for `a % b` the divisor `b`.
        limit: u64,
    },

    /// A kernel's declared signature does not match the parameters the compiled kernel takes
    /// (`cuKernelGetParamInfo`).
    #[error("kernel `{kernel}`: {reason}")]
    Signature {
        /// The kernel's name.
        kernel: String,
        /// What does not match.
        reason: String,
    },

    /// [`Library::from_file`](crate::Library::from_file) could not read the file.
    #[error("cannot read {}: {source}", path.display())]
    #[non_exhaustive]
    ReadFile {
        /// The file's path as given.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },

    /// `Library::from_cuda_source` (feature `nvrtc`) could
    /// not load NVRTC (`libnvrtc.so`): it is not installed or not on the loader's path.
    #[error(
        "NVRTC (libnvrtc.so) could not be loaded (searched {}): put the directory that holds \
         libnvrtc.so (the CUDA toolkit's lib64, or the lib folder of the nvidia-cuda-nvrtc \
         wheel) on LD_LIBRARY_PATH, or load PTX or a cubin instead of CUDA source",
        FirstNames(searched)
    )]
    #[non_exhaustive]
    NvrtcUnavailable {
        /// The file names the dynamic loader was asked for, in order.
        searched: Vec<String>,
    },

    /// [`cudarc_interop::context`](crate::cudarc_interop::context) (feature `cudarc`): tile
    /// found the CUDA driver, but `cudarc`, which looks for it under its own names only (not
    /// `TILE_LIBCUDA`), would not; it would panic.
    #[cfg(feature = "cudarc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
    #[error(
        "cudarc cannot load the CUDA driver (searched {}): it does not honour TILE_LIBCUDA; put \
         the directory of the driver's libcuda.so on LD_LIBRARY_PATH",
        FirstNames(searched)
    )]
    #[non_exhaustive]
    CudarcDriverUnavailable {
        /// The file names the dynamic loader was asked for, in order.
        searched: Vec<String>,
    },

    /// `Library::from_cuda_source` (feature `nvrtc`): NVRTC
    /// refused the source or its options.
    #[error("NVRTC compilation failed (options {options:?}):\n{log}")]
    #[non_exhaustive]
    Compile {
        /// NVRTC's program log (the compiler's diagnostics); when NVRTC failed before it could
        /// produce one (creating the program, reading the log or the PTX), NVRTC's error code.
        log: String,
        /// The options passed to NVRTC.
        options: Vec<String>,
    },

    /// A kernel name contains a NUL byte, which the driver's C string cannot carry
    /// ([`Library::kernel`](crate::Library::kernel)).
    #[error("kernel name {name:?} contains a NUL byte")]
    #[non_exhaustive]
    KernelName {
        /// The name as given.
        name: String,
    },

    /// The library has no kernel of the name asked for (`cuLibraryGetKernel` returned
    /// `CUDA_ERROR_NOT_FOUND`, which [`Error::cuda`] gives).
    #[error(
        "no kernel named `{name}` in the library ({source}); a kernel is found by its symbol \
         name: declare it `extern \"C\"` in CUDA C++, or ask for its C++-mangled name"
    )]
    #[non_exhaustive]
    KernelNotFound {
        /// The name asked for.
        name: String,
        /// The driver's answer.
        source: CudaError,
    },

    /// The thread that releases the tensors of launches captured into CUDA graphs could not be
    /// started (`std::thread::Builder::spawn`): at the first launch into a capture.
    #[error("cannot start the graph release thread: {0}")]
    ReleaseThread(#[source] std::io::Error),

    /// A `cudarc` buffer's shape and strides (in elements) do not describe a tensor inside it
    /// (feature `cudarc`). The slice is handed back. (Boxed: it carries the layout, and keeps
    /// every `Result` of this crate small.)
    #[error("CudaSlice layout refused: {0}")]
    Layout(#[source] Box<LayoutError>),

    /// A `cudarc` object belongs to a non-primary context (feature `cudarc`): tile launches only
    /// in a device's primary context.
    #[error(
        "the {what} belongs to a non-primary cudarc context on cuda:{device}; tile launches in \
         the device's primary context"
    )]
    #[non_exhaustive]
    NonPrimaryContext {
        /// What was refused: `CudaSlice` or `cudarc stream`.
        what: &'static str,
        /// The `cudarc` context's device ordinal.
        device: usize,
    },

    /// A `cudarc` object is on another device than the tile [`Context`](crate::Context) or
    /// [`Stream`](crate::Stream) it is used with (feature `cudarc`).
    #[error("the {what} is on cuda:{device}, but the tile context is on cuda:{context_device}")]
    #[non_exhaustive]
    WrongContext {
        /// What was refused: `CudaSlice` or `cudarc stream`.
        what: &'static str,
        /// The device ordinal of the `cudarc` object's context.
        device: usize,
        /// The device ordinal of tile's context (the stream's, for
        /// `cudarc_interop::order_after`).
        context_device: i32,
    },

    /// A `cudarc` context's device ordinal does not fit DLPack's `device_id` (`i32`): the
    /// context was made (`CudaContext::new`) with an ordinal past `i32::MAX` (feature
    /// `cudarc`). The slice is handed back.
    #[error("device ordinal {ordinal} does not fit in DLPack's device_id (i32)")]
    #[non_exhaustive]
    DeviceOrdinal {
        /// The ordinal the `cudarc` context reports.
        ordinal: usize,
    },

    /// A stream the call would wait on or record into is capturing a CUDA graph while `cudarc`
    /// tracks the slice with events (feature `cudarc`): `cudarc`'s event waits and records would
    /// go into the capture and invalidate it. Refused before anything is enqueued; the capture
    /// is unchanged (and an exported slice handed back). Call it before the capture begins or
    /// after it ends, or allocate the slices used in captures with `cudarc`'s event tracking
    /// off.
    #[error(
        "{call} refused: a stream on cuda:{device} it would use is capturing a CUDA graph, and \
         cudarc tracks the slice with events, whose waits and records would go into the capture \
         and invalidate it; call it before the capture begins or after it ends, or allocate the \
         slices used in captures with cudarc's event tracking off"
    )]
    #[non_exhaustive]
    CaptureInProgress {
        /// The refused function, e.g. `cudarc_interop::export`.
        call: &'static str,
        /// The device ordinal of the slice's context.
        device: usize,
    },

    /// The stream is the per-thread default stream (`CU_STREAM_PER_THREAD`), and launches were
    /// made on it from another thread, whose per-thread stream this thread cannot name, so it
    /// cannot order work after them
    /// (`cudarc_interop::order_after`). Retire the launch, or synchronise
    /// the stream, instead.
    #[error(
        "cannot order work after the per-thread default stream from this thread: launches were \
         made on it from another thread, whose per-thread stream this thread cannot name; \
         retire the launch (or synchronise the stream) instead"
    )]
    #[non_exhaustive]
    ThreadRelativeStream,

    /// A moved-in `CudaSlice` was not exported (`cudarc_interop::ExportError` converted with
    /// `?`): why, and the slice itself, which this error holds for the caller
    /// ([`Error::take_slice`]). Dropped with the error, the slice is freed as a released
    /// tensor's is: with its context current, or leaked (logged) while its stream captures, so
    /// that the free cannot disturb that capture.
    #[cfg(feature = "cudarc")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
    #[error("{source}")]
    #[non_exhaustive]
    ExportRefused {
        /// Why the export was refused.
        source: Box<Error>,
        /// The slice handed back.
        slice: HeldSlice,
    },
}

/// The value an [`Error::ExportRefused`] hands back (the caller's slice, of any element type):
/// opaque here, taken out by `Error::take_slice` (feature `cudarc`), and released as its owner
/// defines when dropped unclaimed.
#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub struct HeldSlice(pub(crate) Box<dyn std::any::Any + Send + Sync>);

#[cfg(feature = "cudarc")]
impl std::fmt::Debug for HeldSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeldSlice { .. }")
    }
}

/// Why a shape and strides (in elements) do not describe a tensor inside a buffer
/// ([`Error::Layout`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LayoutError {
    /// `shape` and `strides` have different lengths.
    #[error("shape has {shape} dimensions but strides has {strides}")]
    #[non_exhaustive]
    RankMismatch {
        /// `shape.len()`.
        shape: usize,
        /// `strides.len()`.
        strides: usize,
    },

    /// The elements the layout reaches lie (in part) outside the buffer.
    #[error(
        "shape {shape:?} strides {strides:?} reaches elements {lowest}..={highest}, outside the \
         buffer's {len} elements"
    )]
    #[non_exhaustive]
    OutOfBounds {
        /// The shape, in elements.
        shape: Vec<i64>,
        /// The strides, in elements.
        strides: Vec<i64>,
        /// The lowest element offset reached, relative to the buffer's start.
        lowest: i128,
        /// The highest element offset reached.
        highest: i128,
        /// The buffer's length in elements.
        len: usize,
    },

    /// The range of element offsets the layout reaches overflows.
    #[error("the element range of shape {shape:?} strides {strides:?} overflows")]
    #[non_exhaustive]
    Overflow {
        /// The shape, in elements.
        shape: Vec<i64>,
        /// The strides, in elements.
        strides: Vec<i64>,
    },

    /// The buffer's length in elements does not fit in a DLPack dimension (`i64`).
    #[error("the buffer's length, {len} elements, does not fit in i64")]
    #[non_exhaustive]
    LengthOverflow {
        /// The buffer's length in elements.
        len: usize,
    },

    /// `dlpark` could not build the descriptor's shape and strides (more than `i32::MAX`
    /// dimensions, or its allocation failed).
    #[error("cannot describe the buffer as DLPack: {0}")]
    Metadata(#[source] tile_dlpack::dlpark::metadata::Error),
}

impl From<LayoutError> for Error {
    fn from(e: LayoutError) -> Self {
        Error::Layout(Box::new(e))
    }
}

impl Error {
    /// The CUDA error inside, if this error came from a driver call.
    pub fn cuda(&self) -> Option<&CudaError> {
        match self {
            Error::Cuda(e) | Error::KernelNotFound { source: e, .. } => Some(e),
            Error::Driver(LoadError::Init(e)) => Some(e),
            _ => None,
        }
    }
}

/// Shorthand for `Result<T, tile_launch::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The rule an [`Error::InvalidConfig`] breaks, in words.
struct ConfigRule<'a> {
    what: &'a str,
    value: u64,
    limit: u64,
}

impl std::fmt::Display for ConfigRule<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { what, value, limit } = *self;
        if let Some((a, b)) = what.split_once(" % ") {
            write!(f, "{a} = {value} is not a multiple of {b} = {limit}")
        } else if value < limit {
            write!(f, "{what} is {value}; it must be at least {limit}")
        } else {
            write!(f, "{what} is {value}, limit {limit}")
        }
    }
}

/// The first two of a list of file names and how many more: `a.so, b.so and 15 other names`.
struct FirstNames<'a>(&'a [String]);

impl std::fmt::Display for FirstNames<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.0.len().min(2);
        f.write_str(&self.0[..shown].join(", "))?;
        match self.0.len() - shown {
            0 => Ok(()),
            1 => write!(f, " and 1 other name"),
            n => write!(f, " and {n} other names"),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The message of each variant that replaced the catch-all string variant: every variant's
    //! fields are in its text. (Public-API paths that produce them without a GPU are in
    //! `tests/errors.rs`.)

    use std::io;

    use super::{Error, LayoutError};

    fn text(e: impl Into<Error>) -> String {
        e.into().to_string()
    }

    #[test]
    fn each_variant_says_what_happened_and_names_its_fields() {
        let cases: Vec<(Error, &[&str])> = vec![
            (
                Error::ReadFile {
                    path: "/no/such/kernel.cubin".into(),
                    source: io::Error::from(io::ErrorKind::NotFound),
                },
                &["cannot read /no/such/kernel.cubin", "not found"],
            ),
            (
                Error::NvrtcUnavailable {
                    searched: vec!["libnvrtc.so".into(), "libnvrtc.so.13".into()],
                },
                &[
                    "NVRTC (libnvrtc.so) could not be loaded",
                    "(searched libnvrtc.so, libnvrtc.so.13):",
                    "LD_LIBRARY_PATH",
                ],
            ),
            (
                Error::NvrtcUnavailable {
                    searched: [
                        "libnvrtc.so",
                        "libnvrtc64.so",
                        "libnvrtc.so.13",
                        "libnvrtc.so.12",
                    ]
                    .map(String::from)
                    .to_vec(),
                },
                &["(searched libnvrtc.so, libnvrtc64.so and 2 other names):"],
            ),
            (
                Error::Compile {
                    log: "kernel.cu(3): error: identifier \"x\" is undefined".into(),
                    options: vec!["-arch=compute_90".into()],
                },
                &[
                    "NVRTC compilation failed",
                    "-arch=compute_90",
                    "\nkernel.cu(3): error: identifier \"x\" is undefined",
                ],
            ),
            (
                Error::KernelName {
                    name: "add\0".into(),
                },
                &["kernel name \"add\\0\" contains a NUL byte"],
            ),
            (
                Error::KernelNotFound {
                    name: "vector_add".into(),
                    source: cuda_sys::CudaError::new(
                        cuda_sys::CUresult::CUDA_ERROR_NOT_FOUND,
                        "cuLibraryGetKernel",
                    ),
                },
                &[
                    "no kernel named `vector_add` in the library",
                    "CUDA_ERROR_NOT_FOUND",
                    "extern \"C\"",
                    "mangled",
                ],
            ),
            (
                Error::InvalidConfig {
                    what: "grid.x",
                    value: 0,
                    limit: 1,
                },
                &["invalid launch configuration: grid.x is 0; it must be at least 1"],
            ),
            (
                Error::InvalidConfig {
                    what: "grid.x % cluster.x",
                    value: 15,
                    limit: 2,
                },
                &["invalid launch configuration: grid.x = 15 is not a multiple of cluster.x = 2"],
            ),
            (
                Error::InvalidConfig {
                    what: "block.x",
                    value: 1025,
                    limit: 1024,
                },
                &["invalid launch configuration: block.x is 1025, limit 1024"],
            ),
            (
                Error::ReleaseThread(io::Error::from(io::ErrorKind::OutOfMemory)),
                &["cannot start the graph release thread: out of memory"],
            ),
            (
                Error::NonPrimaryContext {
                    what: "CudaSlice",
                    device: 1,
                },
                &["CudaSlice", "non-primary", "cuda:1", "primary context"],
            ),
            (
                Error::WrongContext {
                    what: "cudarc stream",
                    device: 1,
                    context_device: 0,
                },
                &["cudarc stream is on cuda:1", "tile context is on cuda:0"],
            ),
            (
                Error::DeviceOrdinal { ordinal: 1 << 32 },
                &["device ordinal 4294967296", "i32"],
            ),
            (
                Error::CaptureInProgress {
                    call: "cudarc_interop::export",
                    device: 0,
                },
                &[
                    "cudarc_interop::export refused",
                    "cuda:0",
                    "capturing a CUDA graph",
                    "event tracking off",
                ],
            ),
            (
                Error::ThreadRelativeStream,
                &["per-thread default stream", "another thread"],
            ),
        ];
        for (e, wanted) in cases {
            let t = e.to_string();
            for w in wanted {
                assert!(t.contains(w), "{t:?} lacks {w:?}");
            }
        }
    }

    #[test]
    fn layout_errors_name_the_layout_and_the_buffer() {
        let t = text(LayoutError::OutOfBounds {
            shape: vec![2, 3],
            strides: vec![3, 1],
            lowest: 0,
            highest: 5,
            len: 4,
        });
        assert_eq!(
            t,
            "CudaSlice layout refused: shape [2, 3] strides [3, 1] reaches elements 0..=5, \
             outside the buffer's 4 elements"
        );
        let t = text(LayoutError::RankMismatch {
            shape: 1,
            strides: 2,
        });
        assert!(
            t.contains("shape has 1 dimensions but strides has 2"),
            "{t}"
        );
        let t = text(LayoutError::Overflow {
            shape: vec![i64::MAX],
            strides: vec![i64::MAX],
        });
        assert!(
            t.contains("overflows") && t.contains(&i64::MAX.to_string()),
            "{t}"
        );
        let t = text(LayoutError::LengthOverflow { len: usize::MAX });
        assert!(
            t.contains(&usize::MAX.to_string()) && t.contains("i64"),
            "{t}"
        );
    }

    /// Every `Result` of the crate carries an `Error`: the layout is boxed to keep it small.
    #[test]
    fn the_error_stays_small() {
        assert!(
            std::mem::size_of::<Error>() <= 64,
            "{}",
            std::mem::size_of::<Error>()
        );
    }

    #[test]
    fn sources_are_kept() {
        use std::error::Error as _;
        let e = Error::ReleaseThread(io::Error::from(io::ErrorKind::OutOfMemory));
        assert!(e.source().is_some());
        let not_found = cuda_sys::CUresult::CUDA_ERROR_NOT_FOUND;
        let e = Error::KernelNotFound {
            name: "k".into(),
            source: cuda_sys::CudaError::new(not_found, "cuLibraryGetKernel"),
        };
        assert_eq!(e.cuda().map(|c| c.code), Some(not_found));
        let e = Error::ReadFile {
            path: "x".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        let io = e.source().and_then(|s| s.downcast_ref::<io::Error>());
        assert_eq!(
            io.map(io::Error::kind),
            Some(io::ErrorKind::PermissionDenied)
        );
    }
}
