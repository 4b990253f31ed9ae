//! Array parameters: one tensor passed as `1 + 2 * ndim` kernel parameters (data pointer, extents,
//! strides in elements) in a declared index type, the calling convention of cuTile's arrays.

use std::fmt;

use tile_dlpack::TensorView;

use crate::error::{Error, Result};

/// The integer type in which an array parameter's extents and strides are passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IndexType {
    /// `int32_t`.
    I32,
    /// `uint32_t` (a negative stride does not fit).
    U32,
    /// `int64_t`.
    I64,
}

impl IndexType {
    /// Size in bytes of one extent or stride.
    pub fn size(self) -> usize {
        match self {
            IndexType::I32 | IndexType::U32 => 4,
            IndexType::I64 => 8,
        }
    }

    /// The C-like name: `i32`, `u32` or `i64`.
    pub fn name(self) -> &'static str {
        match self {
            IndexType::I32 => "i32",
            IndexType::U32 => "u32",
            IndexType::I64 => "i64",
        }
    }

    /// The smallest and largest value the type holds.
    pub fn range(self) -> (i64, i64) {
        match self {
            IndexType::I32 => (i32::MIN.into(), i32::MAX.into()),
            IndexType::U32 => (0, u32::MAX.into()),
            IndexType::I64 => (i64::MIN, i64::MAX),
        }
    }

    /// `v` as the kernel receives it (little-endian, in the low bytes of a `u64`), or `None`
    /// when it does not fit.
    fn encode(self, v: i64) -> Option<u64> {
        Some(match self {
            IndexType::I32 => i32::try_from(v).ok()? as u32 as u64,
            IndexType::U32 => u32::try_from(v).ok()?.into(),
            IndexType::I64 => v as u64,
        })
    }
}

impl fmt::Display for IndexType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which part of an array's layout a refused value is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArrayField {
    /// The extent (size) of a dimension, in elements.
    Extent,
    /// The stride of a dimension, in elements.
    Stride,
}

impl fmt::Display for ArrayField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ArrayField::Extent => "extent",
            ArrayField::Stride => "stride",
        })
    }
}

/// Appends the `1 + 2 * ndim` kernel parameters of argument `index` (a tensor whose dtype and
/// device were checked): the data pointer with `byte_offset` applied, the extents, the strides
/// in elements. Checks the tensor's `ndim` and that every extent and stride fits `index_type`;
/// on an error nothing is appended.
pub(crate) fn pack(
    index: usize,
    view: &TensorView<'_>,
    ndim: u8,
    index_type: IndexType,
    out: &mut impl Extend<u64>,
) -> Result<()> {
    if view.ndim() != usize::from(ndim) {
        return Err(Error::NdimMismatch {
            index,
            expected: ndim,
            got: view.ndim(),
        });
    }
    let fit = |field: ArrayField, dim: usize, value: i64| {
        index_type.encode(value).ok_or(Error::IndexOverflow {
            index,
            field,
            dim,
            value,
            index_type,
        })
    };
    // Check every value before appending any.
    for (dim, &v) in view.shape().iter().enumerate() {
        fit(ArrayField::Extent, dim, v)?;
    }
    for (dim, &v) in view.strides().iter().enumerate() {
        fit(ArrayField::Stride, dim, v)?;
    }
    out.extend(std::iter::once(view.data_ptr()));
    out.extend(view.shape().iter().filter_map(|&v| index_type.encode(v)));
    out.extend(view.strides().iter().filter_map(|&v| index_type.encode(v)));
    Ok(())
}
