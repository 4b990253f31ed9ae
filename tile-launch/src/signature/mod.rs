//! What a kernel takes: its declared parameters ([`Signature`]), checked against the compiled
//! kernel when it is loaded and against every launch's arguments before anything is consumed.

use std::fmt;

use tile_dlpack::DType;

mod array;

pub use array::{ArrayAssumptions, ArrayField, IndexType, MAX_ASSUMED_DIMS};
pub(crate) use array::{check_assumptions, pack};

/// How a kernel uses a tensor parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Intent {
    /// The kernel only reads the tensor.
    Read,
    /// The kernel only writes the tensor. A read-only or self-overlapping tensor is refused.
    Write,
    /// The kernel reads and writes the tensor. Checked as [`Intent::Write`].
    ReadWrite,
}

impl Intent {
    /// Whether the kernel writes through this parameter.
    pub fn writes(self) -> bool {
        matches!(self, Intent::Write | Intent::ReadWrite)
    }
}

/// The C type of a scalar kernel parameter, passed by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ScalarType {
    /// `bool` (one byte).
    Bool,
    /// `int8_t`.
    I8,
    /// `int16_t`.
    I16,
    /// `int32_t` / `int`.
    I32,
    /// `int64_t` / `long long`.
    I64,
    /// `uint8_t`.
    U8,
    /// `uint16_t`.
    U16,
    /// `uint32_t` / `unsigned`.
    U32,
    /// `uint64_t`.
    U64,
    /// `float`.
    F32,
    /// `double`.
    F64,
}

impl ScalarType {
    /// Size in bytes of the parameter.
    pub fn size(self) -> usize {
        match self {
            ScalarType::Bool | ScalarType::I8 | ScalarType::U8 => 1,
            ScalarType::I16 | ScalarType::U16 => 2,
            ScalarType::I32 | ScalarType::U32 | ScalarType::F32 => 4,
            ScalarType::I64 | ScalarType::U64 | ScalarType::F64 => 8,
        }
    }

    /// Every scalar type.
    pub const ALL: [ScalarType; 11] = [
        ScalarType::Bool,
        ScalarType::I8,
        ScalarType::I16,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::U8,
        ScalarType::U16,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::F32,
        ScalarType::F64,
    ];

    /// The DLPack dtype of the same values (`bool` is one byte).
    pub fn dtype(self) -> DType {
        match self {
            ScalarType::Bool => DType::BOOL,
            ScalarType::I8 => DType::I8,
            ScalarType::I16 => DType::I16,
            ScalarType::I32 => DType::I32,
            ScalarType::I64 => DType::I64,
            ScalarType::U8 => DType::U8,
            ScalarType::U16 => DType::U16,
            ScalarType::U32 => DType::U32,
            ScalarType::U64 => DType::U64,
            ScalarType::F32 => DType::F32,
            ScalarType::F64 => DType::F64,
        }
    }

    /// The scalar type named `name`, by tile-dlpack's dtype names (`int32` or `i32`,
    /// `float64` or `f64`, `bool`; see [`DType::from_name`]); `None` for any other name.
    pub fn from_name(name: &str) -> Option<ScalarType> {
        let dtype = DType::from_name(name)?;
        Self::ALL.into_iter().find(|t| t.dtype() == dtype)
    }

    /// The C-like name, e.g. `i32`.
    pub fn name(self) -> &'static str {
        match self {
            ScalarType::Bool => "bool",
            ScalarType::I8 => "i8",
            ScalarType::I16 => "i16",
            ScalarType::I32 => "i32",
            ScalarType::I64 => "i64",
            ScalarType::U8 => "u8",
            ScalarType::U16 => "u16",
            ScalarType::U32 => "u32",
            ScalarType::U64 => "u64",
            ScalarType::F32 => "f32",
            ScalarType::F64 => "f64",
        }
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One declared kernel parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Param {
    /// A tensor, passed to the kernel as a pointer to its first element (`data + byte_offset`).
    /// Strides and shape, if the kernel needs them, are separate scalar parameters.
    Tensor {
        /// Element type the kernel expects.
        dtype: DType,
        /// Whether the kernel reads, writes or does both.
        intent: Intent,
        /// Whether the kernel takes the tensor's layout into account (it is passed the strides
        /// as separate parameters). When `false` (the default), the kernel indexes the pointer
        /// densely, and a tensor that is not dense row-major
        /// ([`TensorView::is_contiguous`](tile_dlpack::TensorView::is_contiguous)) is refused
        /// with [`Error::NotContiguous`](crate::Error::NotContiguous).
        strided: bool,
    },
    /// A scalar passed by value.
    Scalar(ScalarType),
    /// A tensor passed as `1 + 2 * ndim` consecutive kernel parameters: the pointer to its first
    /// element (`data + byte_offset`), then its `ndim` extents, then its `ndim` strides in
    /// elements, each extent and stride in the declared [`IndexType`]. Any layout is accepted
    /// (negative, zero and non-unit strides included); an extent or stride that does not fit the
    /// index type is refused before anything is consumed. This is cuTile's calling convention
    /// for arrays.
    Array {
        /// Element type the kernel expects.
        dtype: DType,
        /// Whether the kernel reads, writes or does both.
        intent: Intent,
        /// The number of dimensions the tensor must have.
        ndim: u8,
        /// The integer type of the extents and strides.
        index: IndexType,
        /// What the kernel assumes about the tensor, checked at each launch.
        assume: ArrayAssumptions,
    },
}

impl Param {
    /// A tensor the kernel reads.
    pub fn input(dtype: DType) -> Param {
        Param::Tensor {
            dtype,
            intent: Intent::Read,
            strided: false,
        }
    }
    /// A tensor the kernel writes.
    pub fn output(dtype: DType) -> Param {
        Param::Tensor {
            dtype,
            intent: Intent::Write,
            strided: false,
        }
    }
    /// A tensor the kernel reads and writes.
    pub fn inout(dtype: DType) -> Param {
        Param::Tensor {
            dtype,
            intent: Intent::ReadWrite,
            strided: false,
        }
    }
    /// A scalar passed by value.
    pub fn scalar(ty: ScalarType) -> Param {
        Param::Scalar(ty)
    }

    /// This tensor parameter, declared strided: any layout is accepted (the kernel is passed
    /// the strides separately). A scalar is returned unchanged.
    pub fn strided(self) -> Param {
        match self {
            Param::Tensor { dtype, intent, .. } => Param::Tensor {
                dtype,
                intent,
                strided: true,
            },
            p => p,
        }
    }

    /// An array parameter ([`Param::Array`]): `ndim` dimensions, extents and strides in `index`.
    pub fn array(dtype: DType, intent: Intent, ndim: u8, index: IndexType) -> Param {
        Param::Array {
            dtype,
            intent,
            ndim,
            index,
            assume: ArrayAssumptions::none(),
        }
    }

    /// This array parameter with `assume` checked at each launch; other parameters unchanged.
    pub fn assuming(self, assume: ArrayAssumptions) -> Param {
        match self {
            Param::Array {
                dtype,
                intent,
                ndim,
                index,
                ..
            } => Param::Array {
                dtype,
                intent,
                ndim,
                index,
                assume,
            },
            other => other,
        }
    }

    /// Size in bytes of the parameter as the kernel receives it; for a [`Param::Array`], the
    /// size of its first kernel parameter (the pointer).
    pub fn size(&self) -> usize {
        match self {
            Param::Tensor { .. } | Param::Array { .. } => std::mem::size_of::<u64>(),
            Param::Scalar(t) => t.size(),
        }
    }

    /// The number of kernel parameters this declaration stands for: 1, or `1 + 2 * ndim` for a
    /// [`Param::Array`].
    pub fn slots(&self) -> usize {
        match self {
            Param::Array { ndim, .. } => 1 + 2 * usize::from(*ndim),
            _ => 1,
        }
    }

    /// The size in bytes of kernel parameter `k` of this declaration (`k < self.slots()`).
    pub fn slot_size(&self, k: usize) -> usize {
        match self {
            Param::Array { index, .. } if k > 0 => index.size(),
            _ => self.size(),
        }
    }
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Param::Tensor {
                dtype,
                intent,
                strided,
            } => {
                let how = match intent {
                    Intent::Read => "input",
                    Intent::Write => "output",
                    Intent::ReadWrite => "in-out",
                };
                let layout = if *strided { "strided " } else { "" };
                write!(f, "{how} {layout}tensor of {dtype}")
            }
            Param::Scalar(t) => write!(f, "scalar {t}"),
            Param::Array {
                dtype,
                intent,
                ndim,
                index,
                assume,
            } => {
                let how = match intent {
                    Intent::Read => "input",
                    Intent::Write => "output",
                    Intent::ReadWrite => "in-out",
                };
                write!(f, "{how} array of {dtype} (ndim {ndim}, index {index}")?;
                if !assume.is_none() {
                    f.write_str(", with layout assumptions")?;
                }
                f.write_str(")")
            }
        }
    }
}

/// The declared parameter list of a kernel, checked against the compiled kernel when it is
/// loaded and against every launch's arguments before anything is consumed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Signature {
    params: Vec<Param>,
}

impl Signature {
    /// A signature from its parameters, in order.
    pub fn new(params: impl IntoIterator<Item = Param>) -> Signature {
        Signature {
            params: params.into_iter().collect(),
        }
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// The number of kernel parameters the declarations stand for (an array counts
    /// `1 + 2 * ndim`).
    pub fn slot_count(&self) -> usize {
        self.params.iter().map(Param::slots).sum()
    }
}
