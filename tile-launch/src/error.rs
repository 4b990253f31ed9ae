//! The one error type of `tile-launch`.

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
    #[error("invalid launch configuration: {what} is {value}, limit {limit}")]
    InvalidConfig {
        /// Which value, e.g. `block.x` or `block size (x*y*z)`.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The limit it violates (an upper bound, or 1 for "must be at least 1").
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

    /// Loading code or compiling CUDA C++ failed before reaching the driver.
    #[error("{0}")]
    Module(String),
}

impl Error {
    /// The CUDA error inside, if this error came from a driver call.
    pub fn cuda(&self) -> Option<&CudaError> {
        match self {
            Error::Cuda(e) => Some(e),
            Error::Driver(LoadError::Init(e)) => Some(e),
            _ => None,
        }
    }
}

/// Shorthand for `Result<T, tile_launch::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
