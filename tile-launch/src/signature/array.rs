//! Array parameters: one tensor passed as `1 + 2 * ndim` kernel parameters (data pointer, extents,
//! strides in elements) in a declared index type, the calling convention of cuTile's arrays.

use std::fmt;

use smallvec::SmallVec;
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

    /// The index type named `name`, by tile-dlpack's dtype names (`i32` or `int32`, `u32` or
    /// `uint32`, `i64` or `int64`; see [`DType::from_name`](tile_dlpack::DType::from_name)).
    pub fn from_name(name: &str) -> Option<IndexType> {
        use tile_dlpack::DType;
        match tile_dlpack::DType::from_name(name)? {
            DType::I32 => Some(IndexType::I32),
            DType::U32 => Some(IndexType::U32),
            DType::I64 => Some(IndexType::I64),
            _ => None,
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
    // `ok_or_else`: the error is built (and dropped) only for a value that does not fit.
    #[allow(clippy::unnecessary_lazy_evaluations)]
    let fit = |field: ArrayField, dim: usize, value: i64| {
        index_type
            .encode(value)
            .ok_or_else(|| Error::IndexOverflow {
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

/// How many leading dimensions [`ArrayAssumptions`] can speak of.
pub const MAX_ASSUMED_DIMS: usize = 8;

/// What a kernel was compiled to assume about a tensor passed to an array parameter (cuTile's
/// specialisation constraints). tile checks every assumption on each launch, before anything is
/// consumed, and refuses a tensor that breaks one ([`Error::AssumptionBroken`]): code compiled
/// under an assumption is undefined on arguments that break it. The default assumes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub struct ArrayAssumptions {
    /// The data pointer (`data + byte_offset`) is a multiple of this many bytes (0 and 1: no
    /// assumption).
    pub base_addr_divisible_by: u32,
    /// Per dimension, its stride in elements is a multiple of this (0 and 1: none).
    pub stride_divisible_by: [u32; MAX_ASSUMED_DIMS],
    /// Per dimension, its extent is a multiple of this (0 and 1: none).
    pub shape_divisible_by: [u32; MAX_ASSUMED_DIMS],
    /// Bit `d`: the stride of dimension `d` is 1 element.
    pub unit_stride: u8,
    /// Bit `d`: the extent of dimension `d` is 1.
    pub unit_shape: u8,
    /// Every stride is at least 0.
    pub nonnegative_strides: bool,
    /// No two in-bounds indices address the same element: sorted by stride, the smallest stride
    /// is positive and each next stride is at least the previous stride times its extent.
    pub disjoint: bool,
}

impl ArrayAssumptions {
    /// No assumption.
    pub fn none() -> ArrayAssumptions {
        ArrayAssumptions::default()
    }

    /// Whether nothing is assumed.
    pub fn is_none(&self) -> bool {
        *self == ArrayAssumptions::default()
    }

    /// Whether no two in-bounds indices of a layout (extents and strides in elements) share an
    /// element: the rule of [`ArrayAssumptions::disjoint`], checked on every launch that assumes
    /// it, and the one a caller that specialises kernels on it (`tile_py.cutile`'s key) applies.
    pub fn is_disjoint(shape: &[i64], strides: &[i64]) -> bool {
        if let [s] = strides {
            return *s > 0;
        }
        // No allocation for up to 8 dimensions.
        let mut dims: SmallVec<[(i64, i64); 8]> =
            strides.iter().copied().zip(shape.iter().copied()).collect();
        dims.sort_unstable();
        match dims.first() {
            None => true,
            Some(&(s, _)) if s <= 0 => false,
            Some(_) => dims.windows(2).all(|w| {
                w[1].0 > 0 && i128::from(w[1].0) >= i128::from(w[0].0) * i128::from(w[0].1)
            }),
        }
    }

    /// The first assumption `view` breaks, as a sentence, or `None` when it keeps them all.
    fn broken(&self, view: &TensorView<'_>) -> Option<String> {
        let (shape, strides) = (view.shape(), view.strides());
        let ptr = view.data_ptr();
        let base = u64::from(self.base_addr_divisible_by);
        if base > 1 && !ptr.is_multiple_of(base) {
            return Some(format!(
                "its data pointer {ptr:#x} is not a multiple of {base} bytes"
            ));
        }
        for d in 0..shape.len().min(MAX_ASSUMED_DIMS) {
            let (n, s) = (shape[d], strides[d]);
            let sd = i64::from(self.stride_divisible_by[d]);
            if sd > 1 && s % sd != 0 {
                return Some(format!(
                    "the stride {s} of dimension {d} is not a multiple of {sd} elements"
                ));
            }
            let nd = i64::from(self.shape_divisible_by[d]);
            if nd > 1 && n % nd != 0 {
                return Some(format!(
                    "the extent {n} of dimension {d} is not a multiple of {nd}"
                ));
            }
            if self.unit_stride >> d & 1 == 1 && s != 1 {
                return Some(format!("the stride {s} of dimension {d} is not 1"));
            }
            if self.unit_shape >> d & 1 == 1 && n != 1 {
                return Some(format!("the extent {n} of dimension {d} is not 1"));
            }
        }
        let masks_beyond = (u32::from(self.unit_stride) | u32::from(self.unit_shape))
            >> shape.len().min(MAX_ASSUMED_DIMS);
        if masks_beyond != 0 {
            return Some(format!(
                "it has {} dimensions, fewer than the assumptions name",
                shape.len()
            ));
        }
        if self.nonnegative_strides
            && let Some((d, s)) = strides.iter().enumerate().find(|(_, s)| **s < 0)
        {
            return Some(format!("the stride {s} of dimension {d} is negative"));
        }
        if self.disjoint && !Self::is_disjoint(shape, strides) {
            return Some("two of its indices address the same element".to_owned());
        }
        None
    }
}

/// Checks `assume` against argument `index`'s tensor.
pub(crate) fn check_assumptions(
    index: usize,
    view: &TensorView<'_>,
    assume: &ArrayAssumptions,
) -> Result<()> {
    if assume.is_none() {
        return Ok(());
    }
    match assume.broken(view) {
        None => Ok(()),
        Some(rule) => Err(Error::AssumptionBroken { index, rule }),
    }
}
