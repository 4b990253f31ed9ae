//! Element types: [`DType`] and the table of dtypes we accept.

use std::fmt;

use crate::DescriptorError;
use crate::ffi::{DLDataType, DLDataTypeCode};

/// A DLPack element type: `(code, bits, lanes)` exactly as `DLDataType` carries them.
///
/// The fields are public so that any descriptor, valid or not, can be represented (and
/// reported in an error). [`DType::is_supported`] says whether tile accepts it.
///
/// # Supported dtypes
///
/// | code (`DLDataTypeCode`)                 | bits            | lanes | itemsize (bytes) |
/// |-----------------------------------------|-----------------|-------|------------------|
/// | `BOOL` (6)                              | 8               | 1     | 1                |
/// | `INT` (0), `UINT` (1)                   | 8, 16, 32, 64   | 1     | bits / 8         |
/// | `FLOAT` (2)                             | 16, 32, 64      | 1     | bits / 8         |
/// | `BFLOAT` (4)                            | 16              | 1     | 2                |
/// | `COMPLEX` (5)                           | 64, 128         | 1     | bits / 8         |
/// | `FLOAT8_*` (7 ..= 14)                   | 8               | 1     | 1                |
/// | `FLOAT6_E2M3FN` (15), `FLOAT6_E3M2FN` (16) | 6            | 4     | 3 (four packed)  |
/// | `FLOAT4_E2M1FN` (17)                    | 4               | 2     | 1 (two packed)   |
///
/// Everything else is rejected with [`DescriptorError::UnsupportedDtype`]: vector types
/// (`lanes != 1` outside the packed sub-byte rows), the opaque-handle code (3), unknown codes,
/// zero lanes, and sub-byte codes with any other `bits` (the DLPack header tells consumers to
/// stop importing on unexpected sub-byte bits). Packed sub-byte types are accepted only with
/// enough lanes to fill whole bytes, so every supported dtype has a whole-byte
/// [`itemsize`](DType::itemsize) and strides (in elements) are whole bytes apart. A sub-byte
/// tensor flagged `IS_SUBBYTE_TYPE_PADDED` is rejected separately
/// ([`DescriptorError::PaddedSubByte`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DType {
    /// `DLDataTypeCode` value.
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes per element.
    pub lanes: u16,
}

const INT: u8 = DLDataTypeCode::INT.0;
const UINT: u8 = DLDataTypeCode::UINT.0;
const FLOAT: u8 = DLDataTypeCode::FLOAT.0;
const BFLOAT: u8 = DLDataTypeCode::BFLOAT.0;
const COMPLEX: u8 = DLDataTypeCode::COMPLEX.0;
const BOOL: u8 = DLDataTypeCode::BOOL.0;
const FP8_FIRST: u8 = DLDataTypeCode::FLOAT8_E3M4.0;
const FP8_LAST: u8 = DLDataTypeCode::FLOAT8_E8M0FNU.0;
const FP6_E2M3: u8 = DLDataTypeCode::FLOAT6_E2M3FN.0;
const FP6_E3M2: u8 = DLDataTypeCode::FLOAT6_E3M2FN.0;
const FP4: u8 = DLDataTypeCode::FLOAT4_E2M1FN.0;

impl DType {
    const fn of(code: DLDataTypeCode, bits: u8, lanes: u16) -> Self {
        Self {
            code: code.0,
            bits,
            lanes,
        }
    }

    /// `bool`, one byte per element.
    pub const BOOL: Self = Self::of(DLDataTypeCode::BOOL, 8, 1);
    /// `int8`.
    pub const I8: Self = Self::of(DLDataTypeCode::INT, 8, 1);
    /// `int16`.
    pub const I16: Self = Self::of(DLDataTypeCode::INT, 16, 1);
    /// `int32`.
    pub const I32: Self = Self::of(DLDataTypeCode::INT, 32, 1);
    /// `int64`.
    pub const I64: Self = Self::of(DLDataTypeCode::INT, 64, 1);
    /// `uint8`.
    pub const U8: Self = Self::of(DLDataTypeCode::UINT, 8, 1);
    /// `uint16`.
    pub const U16: Self = Self::of(DLDataTypeCode::UINT, 16, 1);
    /// `uint32`.
    pub const U32: Self = Self::of(DLDataTypeCode::UINT, 32, 1);
    /// `uint64`.
    pub const U64: Self = Self::of(DLDataTypeCode::UINT, 64, 1);
    /// IEEE `float16`.
    pub const F16: Self = Self::of(DLDataTypeCode::FLOAT, 16, 1);
    /// `bfloat16`.
    pub const BF16: Self = Self::of(DLDataTypeCode::BFLOAT, 16, 1);
    /// IEEE `float32`.
    pub const F32: Self = Self::of(DLDataTypeCode::FLOAT, 32, 1);
    /// IEEE `float64`.
    pub const F64: Self = Self::of(DLDataTypeCode::FLOAT, 64, 1);
    /// `complex64` (two `float32`).
    pub const C64: Self = Self::of(DLDataTypeCode::COMPLEX, 64, 1);
    /// `complex128` (two `float64`).
    pub const C128: Self = Self::of(DLDataTypeCode::COMPLEX, 128, 1);
    /// `float8_e3m4`.
    pub const F8_E3M4: Self = Self::of(DLDataTypeCode::FLOAT8_E3M4, 8, 1);
    /// `float8_e4m3`.
    pub const F8_E4M3: Self = Self::of(DLDataTypeCode::FLOAT8_E4M3, 8, 1);
    /// `float8_e4m3b11fnuz`.
    pub const F8_E4M3B11FNUZ: Self = Self::of(DLDataTypeCode::FLOAT8_E4M3B11FNUZ, 8, 1);
    /// `float8_e4m3fn`.
    pub const F8_E4M3FN: Self = Self::of(DLDataTypeCode::FLOAT8_E4M3FN, 8, 1);
    /// `float8_e4m3fnuz`.
    pub const F8_E4M3FNUZ: Self = Self::of(DLDataTypeCode::FLOAT8_E4M3FNUZ, 8, 1);
    /// `float8_e5m2`.
    pub const F8_E5M2: Self = Self::of(DLDataTypeCode::FLOAT8_E5M2, 8, 1);
    /// `float8_e5m2fnuz`.
    pub const F8_E5M2FNUZ: Self = Self::of(DLDataTypeCode::FLOAT8_E5M2FNUZ, 8, 1);
    /// `float8_e8m0fnu`.
    pub const F8_E8M0FNU: Self = Self::of(DLDataTypeCode::FLOAT8_E8M0FNU, 8, 1);
    /// Four packed `float6_e2m3fn` values in three bytes.
    pub const F6_E2M3FN_X4: Self = Self::of(DLDataTypeCode::FLOAT6_E2M3FN, 6, 4);
    /// Four packed `float6_e3m2fn` values in three bytes.
    pub const F6_E3M2FN_X4: Self = Self::of(DLDataTypeCode::FLOAT6_E3M2FN, 6, 4);
    /// Two packed `float4_e2m1fn` values in one byte (PyTorch's `float4_e2m1fn_x2`).
    pub const F4_E2M1FN_X2: Self = Self::of(DLDataTypeCode::FLOAT4_E2M1FN, 4, 2);

    /// The dtype named `name`: the name it prints as (`float32`, `bfloat16`, `bool`,
    /// `float8_e4m3fn`, PyTorch's `float4_e2m1fn_x2`, ...) or its short form (`f32`, `bf16`,
    /// `i64`, `u8`, `c64`), for the dtypes of the supported table; `None` for any other name.
    /// The one table of dtype names of the Rust crates (tile-py parses its declarations with it).
    pub fn from_name(name: &str) -> Option<DType> {
        NAMES
            .iter()
            .find(|(_, long, short)| *long == name || short.is_some_and(|s| s == name))
            .map(|&(dtype, _, _)| dtype)
    }

    /// Whether this dtype is in the table of supported dtypes (see the type docs).
    pub const fn is_supported(self) -> bool {
        matches!(
            (self.code, self.bits, self.lanes),
            (BOOL, 8, 1)
                | (INT | UINT, 8 | 16 | 32 | 64, 1)
                | (FLOAT, 16 | 32 | 64, 1)
                | (BFLOAT, 16, 1)
                | (COMPLEX, 64 | 128, 1)
                | (FP8_FIRST..=FP8_LAST, 8, 1)
                | (FP6_E2M3 | FP6_E3M2, 6, 4)
                | (FP4, 4, 2)
        )
    }

    /// Bytes per element: `bits * lanes / 8`, rounded down.
    ///
    /// Exact for every supported dtype; for an unsupported one it is only indicative.
    pub const fn itemsize(self) -> u64 {
        (self.bits as u64 * self.lanes as u64) / 8
    }

    /// Whether the lanes of this dtype are sub-byte values packed together (`bits < 8`).
    pub const fn is_sub_byte(self) -> bool {
        self.bits < 8
    }

    /// The alignment, in bytes, that a non-empty tensor's data pointer
    /// (`data + byte_offset`) must have for this dtype.
    ///
    /// The itemsize rounded down to a power of two and capped at 16 (so `complex128` needs 16,
    /// not its 16-byte size rounded to anything larger); 1 for packed sub-byte dtypes, which
    /// are byte streams. An unsupported dtype with a zero itemsize also gives 1.
    pub const fn alignment(self) -> u64 {
        let size = self.itemsize();
        if self.is_sub_byte() || size == 0 {
            1
        } else if size >= 16 {
            16
        } else {
            1 << size.ilog2()
        }
    }

    /// `Ok` when [`is_supported`](Self::is_supported), else
    /// [`DescriptorError::UnsupportedDtype`] with the three fields.
    pub(crate) fn check(self) -> Result<(), DescriptorError> {
        if self.is_supported() {
            Ok(())
        } else {
            Err(DescriptorError::UnsupportedDtype {
                code: self.code,
                bits: self.bits,
                lanes: self.lanes,
            })
        }
    }
}

impl From<DLDataType> for DType {
    fn from(dtype: DLDataType) -> Self {
        Self {
            code: dtype.code.0,
            bits: dtype.bits,
            lanes: dtype.lanes,
        }
    }
}

impl From<DType> for DLDataType {
    fn from(dtype: DType) -> Self {
        Self {
            code: DLDataTypeCode(dtype.code),
            bits: dtype.bits,
            lanes: dtype.lanes,
        }
    }
}

/// Every supported dtype with its name and short name ([`DType::from_name`]).
const NAMES: [(DType, &str, Option<&str>); 26] = [
    (DType::BOOL, "bool", None),
    (DType::I8, "int8", Some("i8")),
    (DType::I16, "int16", Some("i16")),
    (DType::I32, "int32", Some("i32")),
    (DType::I64, "int64", Some("i64")),
    (DType::U8, "uint8", Some("u8")),
    (DType::U16, "uint16", Some("u16")),
    (DType::U32, "uint32", Some("u32")),
    (DType::U64, "uint64", Some("u64")),
    (DType::F16, "float16", Some("f16")),
    (DType::BF16, "bfloat16", Some("bf16")),
    (DType::F32, "float32", Some("f32")),
    (DType::F64, "float64", Some("f64")),
    (DType::C64, "complex64", Some("c64")),
    (DType::C128, "complex128", Some("c128")),
    (DType::F8_E3M4, "float8_e3m4", None),
    (DType::F8_E4M3, "float8_e4m3", None),
    (DType::F8_E4M3B11FNUZ, "float8_e4m3b11fnuz", None),
    (DType::F8_E4M3FN, "float8_e4m3fn", None),
    (DType::F8_E4M3FNUZ, "float8_e4m3fnuz", None),
    (DType::F8_E5M2, "float8_e5m2", None),
    (DType::F8_E5M2FNUZ, "float8_e5m2fnuz", None),
    (DType::F8_E8M0FNU, "float8_e8m0fnu", None),
    (DType::F6_E2M3FN_X4, "float6_e2m3fn_x4", None),
    (DType::F6_E3M2FN_X4, "float6_e3m2fn_x4", None),
    (DType::F4_E2M1FN_X2, "float4_e2m1fn_x2", None),
];

/// Named codes that no single-lane entry of [`NAMES`] names, with the bit width the name
/// implies.
const OTHER_NAMES: [(DLDataTypeCode, &str, u8); 4] = [
    (DLDataTypeCode::OPAQUEHANDLE, "opaque_handle", 64),
    (DLDataTypeCode::FLOAT6_E2M3FN, "float6_e2m3fn", 6),
    (DLDataTypeCode::FLOAT6_E3M2FN, "float6_e3m2fn", 6),
    (DLDataTypeCode::FLOAT4_E2M1FN, "float4_e2m1fn", 4),
];

/// `float32`, `bfloat16`, `bool`, `float8_e4m3fn`, `float4_e2m1fn x2`, ...
///
/// Numeric families print their bit width (`int24` for an unsupported width too); named
/// low-precision floats print their name, with `(N bits)` when `bits` is not the width the
/// name implies; unknown codes print `dtype code C (N bits)`. A lane count other than 1 adds
/// ` xL`.
impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = match self.code {
            INT => Some("int"),
            UINT => Some("uint"),
            FLOAT => Some("float"),
            BFLOAT => Some("bfloat"),
            COMPLEX => Some("complex"),
            _ => None,
        };
        let named = NAMES
            .iter()
            .find(|(d, _, _)| d.code == self.code && d.lanes == 1)
            .map(|&(d, name, _)| (name, d.bits))
            .or_else(|| {
                OTHER_NAMES
                    .iter()
                    .find(|(code, _, _)| code.0 == self.code)
                    .map(|&(_, name, bits)| (name, bits))
            });
        match (family, named) {
            (Some(family), _) => write!(f, "{family}{}", self.bits)?,
            (None, Some((name, bits))) if bits == self.bits => f.write_str(name)?,
            (None, Some((name, _))) => write!(f, "{name} ({} bits)", self.bits)?,
            (None, None) => write!(f, "dtype code {} ({} bits)", self.code, self.bits)?,
        }
        if self.lanes != 1 {
            write!(f, " x{}", self.lanes)?;
        }
        Ok(())
    }
}
