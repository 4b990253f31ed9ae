//! [`DescriptorError`]: everything that can be wrong with a DLPack descriptor.

use crate::DType;
#[cfg(doc)]
use crate::MAX_NDIM;

/// A malformed, unsupported or (for outputs) unwritable DLPack tensor.
///
/// Each variant carries the offending field and value. The row numbers refer to the bad-input
/// table of the reliability and test plan (section 6).
///
/// When [`Unused::peek`](crate::Unused::peek) returns one of these, nothing was taken over; when
/// [`Unused::consume`](crate::Unused::consume) or a `Used::from_managed_*` constructor returns
/// one, the producer's deleter has already run, exactly once.
#[non_exhaustive]
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum DescriptorError {
    /// Row 3: a versioned tensor declares a major version other than 1. No field past the
    /// version was read.
    #[error(
        "unsupported DLPack version {major}.{minor}: only major version 1 is supported \
         (no other field was read)"
    )]
    UnsupportedVersion {
        /// Declared major version.
        major: u32,
        /// Declared minor version.
        minor: u32,
    },

    /// Row 4: the data pointer is null although the tensor has elements.
    #[error(
        "data pointer is null but the tensor has {numel} elements (null is allowed only when empty)"
    )]
    NullData {
        /// Element count of the tensor (never 0).
        numel: u64,
    },

    /// Row 5: `ndim` is negative or above [`MAX_NDIM`].
    #[error("ndim {ndim} is out of range 0..={limit}")]
    NdimOutOfRange {
        /// The descriptor's `ndim`.
        ndim: i32,
        /// [`MAX_NDIM`].
        limit: i32,
    },

    /// Row 6: the shape pointer is null although `ndim > 0`.
    #[error("shape pointer is null with ndim {ndim}")]
    NullShape {
        /// The descriptor's `ndim`.
        ndim: i32,
    },

    /// Row 6: a dimension is negative.
    #[error("shape[{axis}] is negative: {value}")]
    NegativeDimension {
        /// Axis of the dimension.
        axis: usize,
        /// Its value.
        value: i64,
    },

    /// Row 7: a size or address computation does not fit its type. `what` is one of
    /// `"element count"` (the product of the shape, in `u64`), `"compact strides"` (strides
    /// computed for a null strides pointer, in `i64`), `"byte extent"` (the byte range the
    /// strides reach, in `i64`), `"data pointer + byte_offset"` (in `u64`) and
    /// `"address range"` (the data pointer plus the byte extent, in `u64`).
    #[error("{what} overflows")]
    Overflow {
        /// The computation that overflowed.
        what: &'static str,
    },

    /// Row 8: `data + byte_offset` of a non-empty tensor is not a multiple of the dtype's
    /// [`alignment`](DType::alignment).
    #[error(
        "data pointer {address:#x} (data + byte_offset) is not aligned to {alignment} bytes for {dtype}"
    )]
    Misaligned {
        /// `data + byte_offset`.
        address: u64,
        /// Required alignment in bytes.
        alignment: u64,
        /// The tensor's dtype.
        dtype: DType,
    },

    /// Row 9: the dtype is not in the [supported table](DType).
    #[error("unsupported dtype (code {code}, bits {bits}, lanes {lanes})")]
    UnsupportedDtype {
        /// `DLDataType::code`.
        code: u8,
        /// `DLDataType::bits`.
        bits: u8,
        /// `DLDataType::lanes`.
        lanes: u16,
    },

    /// Row 9: a packed sub-byte dtype flagged `IS_SUBBYTE_TYPE_PADDED`; only packed data is
    /// supported.
    #[error(
        "dtype {dtype} is flagged IS_SUBBYTE_TYPE_PADDED; only packed sub-byte data is supported"
    )]
    PaddedSubByte {
        /// The tensor's dtype.
        dtype: DType,
    },

    /// Row 10 (in part): an unknown device type or a negative device ordinal. Matching the
    /// device against the launch stream is the launcher's job.
    #[error("invalid device (device_type {device_type}, device_id {device_id})")]
    InvalidDevice {
        /// `DLDevice::device_type`.
        device_type: u32,
        /// `DLDevice::device_id`.
        device_id: i32,
    },

    /// Row 11: an output tensor is flagged read-only.
    #[error("tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY) and cannot be written")]
    ReadOnly,

    /// An output tensor is flagged `IS_COPIED`: the producer made a copy for this consumer
    /// alone, so the kernel's writes would land in memory the caller never sees.
    #[error(
        "tensor is a copy made for this export (DLPACK_FLAG_BITMASK_IS_COPIED): a kernel's \
         writes to it would never reach the caller's tensor; export the tensor itself \
         (without copy=True or a device change) to write it"
    )]
    Copied,

    /// Row 12: an output tensor may reach one memory location through two indices: a stride
    /// of 0 on a dimension of size > 1, or a layout whose disjointness the conservative check
    /// of [`TensorView::check_writable`](crate::TensorView::check_writable) cannot prove.
    #[error(
        "tensor has internal overlap at axis {axis}: more than one element may refer to the \
         same memory location"
    )]
    InternalOverlap {
        /// The axis at which disjointness fails.
        axis: usize,
    },

    /// The managed-tensor pointer is null.
    #[error("managed tensor pointer is null")]
    NullPointer,
}
