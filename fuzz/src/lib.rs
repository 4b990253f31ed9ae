//! Shared parts of the fuzz targets: the fuzzer's description of a DLPack export ([`Input`]),
//! its translation into a `tile_dlpack::testing::TensorSpec` (a real heap-allocated
//! `DLManagedTensor[Versioned]` with a counting deleter), and an independent reference model of
//! validation ([`expect`]) computed in `i128`, which the targets compare `tile-dlpack` against.

use arbitrary::Arbitrary;
use tile_dlpack::dlpark::DlpackFlags;
use tile_dlpack::ffi::DLDeviceType;
use tile_dlpack::testing::{Abi, TensorSpec};
use tile_dlpack::{DType, DescriptorError, Device, MAX_NDIM};

/// A value biased towards the boundaries that matter, with the full range still reachable.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Num {
    /// `-4..=251`: ordinary dimensions and strides, including 0, 1 and small negatives.
    Small(u8),
    /// An entry of [`EDGES`].
    Edge(u8),
    /// Any value.
    Any(i64),
}

/// Values at which `i64`/`u64` arithmetic on shapes, strides and addresses turns over.
const EDGES: [i64; 16] = [
    0,
    1,
    -1,
    2,
    i64::MAX,
    i64::MIN,
    i64::MAX - 1,
    i64::MIN + 1,
    1 << 31,
    1 << 32,
    (1 << 32) + 1,
    1 << 62,
    -(1 << 62),
    3_037_000_500, // ~ sqrt(i64::MAX): two of them overflow when multiplied
    4_294_967_296 * 3,
    -(1 << 31),
];

impl Num {
    /// The value.
    pub fn get(self) -> i64 {
        match self {
            Self::Small(v) => i64::from(v) - 4,
            Self::Edge(i) => EDGES[usize::from(i) % EDGES.len()],
            Self::Any(v) => v,
        }
    }
}

/// `ndim`: the shape's length, a value near the limit, or anything (negative, huge).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Ndim {
    /// `shape.len()`.
    Len,
    /// `0..=69` (around [`MAX_NDIM`]).
    Small(u8),
    /// Any `i32`.
    Any(i32),
}

/// The element type: one from the supported table, or any `(code, bits, lanes)`.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Dtype {
    /// An entry of [`SUPPORTED`].
    Known(u8),
    /// Any triple.
    Any(u8, u8, u16),
}

const SUPPORTED: [DType; 12] = [
    DType::BOOL,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::F32,
    DType::F64,
    DType::BF16,
    DType::C128,
    DType::F6_E2M3FN_X4,
    DType::F4_E2M1FN_X2,
];

/// An address or byte offset: a multiple of 16 (aligned for every dtype), a small value, or
/// anything.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Addr {
    /// `0x7f00_0000_0000 + 16 * n` (0 stays 0 for the byte offset).
    Aligned(u16),
    /// `0..=255`.
    Small(u8),
    /// Any value (near `u64::MAX` included).
    Any(u64),
}

impl Addr {
    fn get(self, base: u64) -> u64 {
        match self {
            Self::Aligned(n) => base + 16 * u64::from(n),
            Self::Small(v) => u64::from(v),
            Self::Any(v) => v,
        }
    }
}

/// The DLPack version of the export.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Version {
    /// A legacy `DLManagedTensor`.
    Legacy,
    /// `DLManagedTensorVersioned` 1.minor.
    V1(u32),
    /// Any declared version (the 1.x layout is used whatever it says).
    Any(u32, u32),
}

/// The fuzzer's description of one export. Every field of the descriptor is reachable,
/// including invalid ones.
#[derive(Arbitrary, Debug, Clone)]
pub struct Input {
    /// Legacy or versioned, and the version.
    pub version: Version,
    /// `ndim`.
    pub ndim: Ndim,
    /// Dimensions (entries past their count up to `ndim` read as 1).
    pub shape: Vec<Num>,
    /// Strides in elements; `None` is a null strides pointer.
    pub strides: Option<Vec<Num>>,
    /// A null shape pointer.
    pub null_shape: bool,
    /// The element type.
    pub dtype: Dtype,
    /// `Some((device_type, device_id))`, or `None` for `cuda:0`.
    pub device: Option<(u32, i32)>,
    /// The data address; `Small(0)` is a null data pointer.
    pub data: Addr,
    /// `byte_offset`.
    pub byte_offset: Addr,
    /// Raw flag bits: a combination of the defined ones, or anything.
    pub flags: Result<u8, u64>,
}

impl Input {
    /// The descriptor as a [`TensorSpec`].
    pub fn spec(&self) -> TensorSpec {
        let dtype = match self.dtype {
            Dtype::Known(i) => SUPPORTED[usize::from(i) % SUPPORTED.len()],
            Dtype::Any(code, bits, lanes) => DType { code, bits, lanes },
        };
        let mut spec = TensorSpec::new(
            &self.shape.iter().map(|n| n.get()).collect::<Vec<_>>(),
            dtype,
        );
        spec.strides = self
            .strides
            .as_ref()
            .map(|s| s.iter().map(|n| n.get()).collect());
        spec.ndim = match self.ndim {
            Ndim::Len => None,
            Ndim::Small(n) => Some(i32::from(n % 70)),
            Ndim::Any(n) => Some(n),
        };
        spec.null_shape = self.null_shape;
        if let Some((device_type, device_id)) = self.device {
            spec.device = Device {
                device_type: DLDeviceType(device_type),
                device_id,
            };
        }
        spec.data = self.data.get(0x7f00_0000_0000);
        spec.byte_offset = self.byte_offset.get(0);
        spec.abi = match self.version {
            Version::Legacy => Abi::Legacy,
            Version::V1(minor) => Abi::Versioned { major: 1, minor },
            Version::Any(major, minor) => Abi::Versioned { major, minor },
        };
        spec.flags = match self.flags {
            // READ_ONLY (1), IS_COPIED (2), IS_SUBBYTE_TYPE_PADDED (4).
            Ok(bits) => u64::from(bits & 7),
            Err(bits) => bits,
        };
        spec
    }
}

/// What validation must conclude, by the reference model.
#[derive(Debug, PartialEq, Eq)]
pub struct Expected {
    /// The shape, `ndim` entries.
    pub shape: Vec<i64>,
    /// The strides (explicit, or compact row-major), `ndim` entries.
    pub strides: Vec<i64>,
    /// Element count.
    pub numel: u64,
    /// `data + byte_offset`.
    pub data_ptr: u64,
    /// Byte extent `(start, end)` relative to `data_ptr`.
    pub extent: (i64, i64),
    /// The `READ_ONLY` flag (versioned only).
    pub read_only: bool,
    /// The `IS_COPIED` flag (versioned only).
    pub copied: bool,
    /// Versioned.
    pub versioned: bool,
}

/// The shape or strides array as `tile_dlpack::testing` lays it out: `ndim` entries, padded
/// with 1.
fn padded(values: &[i64], ndim: usize) -> Vec<i64> {
    let mut v: Vec<i64> = values.iter().copied().take(ndim).collect();
    v.resize(ndim, 1);
    v
}

fn fits_i64(v: Option<i128>) -> Option<i64> {
    v.and_then(|v| i64::try_from(v).ok())
}

/// The reference model of `tile-dlpack`'s validation, written from its documentation (the
/// checks and their order, in `Meta::validate`'s docs and `DescriptorError`'s) with every size
/// in `i128`, independently of the crate's own checked `i64`/`u64` arithmetic.
pub fn expect(spec: &TensorSpec) -> Result<Expected, DescriptorError> {
    let flags = match spec.abi {
        Abi::Legacy => None,
        Abi::Versioned { major, minor } => {
            if major != 1 {
                return Err(DescriptorError::UnsupportedVersion { major, minor });
            }
            Some(spec.flags)
        }
    };
    let ndim_i32 = spec
        .ndim
        .unwrap_or_else(|| i32::try_from(spec.shape.len()).unwrap_or(i32::MAX));
    if !(0..=MAX_NDIM).contains(&ndim_i32) {
        return Err(DescriptorError::NdimOutOfRange {
            ndim: ndim_i32,
            limit: MAX_NDIM,
        });
    }
    let ndim = ndim_i32 as usize;
    if ndim > 0 && spec.null_shape {
        return Err(DescriptorError::NullShape { ndim: ndim_i32 });
    }
    let shape = padded(&spec.shape, ndim);
    if let Some(axis) = shape.iter().position(|&d| d < 0) {
        return Err(DescriptorError::NegativeDimension {
            axis,
            value: shape[axis],
        });
    }
    let dtype = spec.dtype;
    if !dtype.is_supported() {
        return Err(DescriptorError::UnsupportedDtype {
            code: dtype.code,
            bits: dtype.bits,
            lanes: dtype.lanes,
        });
    }
    let bits = flags.unwrap_or(0);
    if dtype.bits < 8 && bits & DlpackFlags::IS_SUBBYTE_TYPE_PADDED.bits() != 0 {
        return Err(DescriptorError::PaddedSubByte { dtype });
    }
    if !spec.device.device_type.is_known() || spec.device.device_id < 0 {
        return Err(DescriptorError::InvalidDevice {
            device_type: spec.device.device_type.0,
            device_id: spec.device.device_id,
        });
    }
    // Element count: the exact product, saturated far above u64::MAX.
    let numel_exact = shape
        .iter()
        .fold(1i128, |acc, &d| acc.saturating_mul(i128::from(d)));
    let numel = u64::try_from(numel_exact).map_err(|_| DescriptorError::Overflow {
        what: "element count",
    })?;
    if spec.data == 0 && numel > 0 {
        return Err(DescriptorError::NullData { numel });
    }
    let data_ptr =
        u64::try_from(i128::from(spec.data) + i128::from(spec.byte_offset)).map_err(|_| {
            DescriptorError::Overflow {
                what: "data pointer + byte_offset",
            }
        })?;
    let strides = match &spec.strides {
        Some(strides) => padded(strides, ndim),
        None => {
            let mut out = Vec::with_capacity(ndim);
            for axis in 0..ndim {
                let exact = shape[axis + 1..]
                    .iter()
                    .fold(1i128, |acc, &d| acc.saturating_mul(i128::from(d)));
                out.push(fits_i64(Some(exact)).ok_or(DescriptorError::Overflow {
                    what: "compact strides",
                })?);
            }
            out
        }
    };
    let extent = if numel == 0 {
        (0, 0)
    } else {
        let itemsize = i128::from(dtype.itemsize());
        let (mut low, mut high) = (Some(0i128), Some(0i128));
        for (&d, &s) in shape.iter().zip(&strides) {
            let reach = i128::from(d - 1) * i128::from(s); // |.| < 2^126: no overflow
            if reach < 0 {
                low = low.and_then(|l| l.checked_add(reach));
            } else {
                high = high.and_then(|h| h.checked_add(reach));
            }
        }
        let start = fits_i64(low.and_then(|l| l.checked_mul(itemsize)));
        let end = fits_i64(high.and_then(|h| h.checked_add(1)?.checked_mul(itemsize)));
        let (Some(start), Some(end)) = (start, end) else {
            return Err(DescriptorError::Overflow {
                what: "byte extent",
            });
        };
        let lowest = i128::from(data_ptr) + i128::from(start);
        let highest = i128::from(data_ptr) + i128::from(end);
        if lowest < 0 || highest > i128::from(u64::MAX) {
            return Err(DescriptorError::Overflow {
                what: "address range",
            });
        }
        let alignment = dtype.alignment();
        if data_ptr % alignment != 0 {
            return Err(DescriptorError::Misaligned {
                address: data_ptr,
                alignment,
                dtype,
            });
        }
        (start, end)
    };
    Ok(Expected {
        shape,
        strides,
        numel,
        data_ptr,
        extent,
        read_only: bits & DlpackFlags::READ_ONLY.bits() != 0,
        copied: bits & DlpackFlags::IS_COPIED.bits() != 0,
        versioned: flags.is_some(),
    })
}

/// The element offsets (in elements, relative to the data pointer) of a tensor, in row-major
/// index order, or `None` when it has more than `limit` elements.
pub fn offsets(shape: &[i64], strides: &[i64], limit: u64) -> Option<Vec<i128>> {
    let numel = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(u64::try_from(d).ok()?))?;
    if numel > limit {
        return None;
    }
    let mut out = Vec::with_capacity(numel as usize);
    let mut index = vec![0i64; shape.len()];
    for _ in 0..numel {
        out.push(
            index
                .iter()
                .zip(strides)
                .map(|(&i, &s)| i128::from(i) * i128::from(s))
                .sum(),
        );
        for axis in (0..shape.len()).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    Some(out)
}
