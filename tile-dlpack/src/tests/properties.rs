//! Property tests: the byte extent against an arbitrary-precision reference, no panic on any
//! descriptor, and the layout predicates against brute force.

use num_bigint::BigInt;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use crate::ffi::DLDeviceType;
use crate::testing::{Abi, TensorSpec, counted_raw, counted_tensor};
use crate::{ByteExtent, DType, DescriptorError, Device, TensorView};

const SUPPORTED: [DType; 14] = [
    DType::BOOL,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U64,
    DType::F16,
    DType::BF16,
    DType::F32,
    DType::F64,
    DType::C128,
    DType::F8_E5M2,
    DType::F6_E2M3FN_X4,
    DType::F4_E2M1FN_X2,
];

fn supported_dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(SUPPORTED.to_vec())
}

/// Mostly small dimensions (0 and 1 included), some huge.
fn dim() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => 0i64..5,
        1 => 0i64..=i64::MAX,
        1 => (1i64 << 30)..(1i64 << 34),
        1 => Just(1i64 << 62),
    ]
}

/// Mostly small strides (negative and zero included), some huge.
fn stride() -> impl Strategy<Value = i64> {
    prop_oneof![
        6 => -5i64..6,
        1 => any::<i64>(),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
        1 => (1i64 << 40)..(1i64 << 62),
        1 => -(1i64 << 62)..-(1i64 << 40),
    ]
}

fn overflow(what: &'static str) -> DescriptorError {
    DescriptorError::Overflow { what }
}

fn fits_i64(value: &BigInt) -> bool {
    *value >= BigInt::from(i64::MIN) && *value <= BigInt::from(i64::MAX)
}

/// What validation must conclude about a descriptor with a valid ndim, shape pointer, dtype
/// and device and non-negative dimensions, computed in arbitrary precision.
fn reference(
    shape: &[i64],
    strides: Option<&[i64]>,
    dtype: DType,
    data: u64,
    byte_offset: u64,
) -> Result<ByteExtent, DescriptorError> {
    let u64_max = BigInt::from(u64::MAX);
    let numel: BigInt = shape.iter().map(|&d| BigInt::from(d)).product();
    if numel > u64_max {
        return Err(overflow("element count"));
    }
    let zero = BigInt::from(0);
    if data == 0 && numel > zero {
        return Err(DescriptorError::NullData {
            numel: u64::try_from(&numel).unwrap(),
        });
    }
    let data_ptr = BigInt::from(data) + BigInt::from(byte_offset);
    if data_ptr > u64_max {
        return Err(overflow("data pointer + byte_offset"));
    }
    let strides: Vec<BigInt> = match strides {
        Some(strides) => strides.iter().map(|&s| BigInt::from(s)).collect(),
        None => {
            let compact: Vec<BigInt> = (0..shape.len())
                .map(|i| shape[i + 1..].iter().map(|&d| BigInt::from(d)).product())
                .collect();
            if !compact.iter().all(fits_i64) {
                return Err(overflow("compact strides"));
            }
            compact
        }
    };
    if numel == zero {
        return Ok(ByteExtent { start: 0, end: 0 });
    }
    let (mut low, mut high) = (BigInt::from(0), BigInt::from(0));
    for (&dim, stride) in shape.iter().zip(&strides) {
        let reach = BigInt::from(dim - 1) * stride;
        if reach < zero {
            low += reach;
        } else {
            high += reach;
        }
    }
    let itemsize = BigInt::from(dtype.itemsize());
    let start = low * &itemsize;
    let end = (high + 1) * &itemsize;
    if !fits_i64(&start) || !fits_i64(&end) {
        return Err(overflow("byte extent"));
    }
    if &data_ptr + &start < zero || &data_ptr + &end > u64_max {
        return Err(overflow("address range"));
    }
    let data_ptr = u64::try_from(&data_ptr).unwrap();
    if data_ptr % dtype.alignment() != 0 {
        return Err(DescriptorError::Misaligned {
            address: data_ptr,
            alignment: dtype.alignment(),
            dtype,
        });
    }
    Ok(ByteExtent {
        start: i64::try_from(&start).unwrap(),
        end: i64::try_from(&end).unwrap(),
    })
}

/// Everything a view says, owned, to compare peek with consume.
#[derive(Debug, PartialEq)]
struct Snapshot {
    device: Device,
    dtype: DType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    data_ptr: u64,
    numel: u64,
    extent: ByteExtent,
    flags: (bool, bool, bool),
    contiguous: bool,
    writable: Result<(), DescriptorError>,
}

fn snapshot(view: TensorView<'_>) -> Snapshot {
    Snapshot {
        device: view.device(),
        dtype: view.dtype(),
        shape: view.shape().to_vec(),
        strides: view.strides().to_vec(),
        data_ptr: view.data_ptr(),
        numel: view.numel(),
        extent: view.byte_extent(),
        flags: (view.is_read_only(), view.is_copied(), view.is_versioned()),
        contiguous: view.is_contiguous(),
        writable: view.check_writable(),
    }
}

/// Any descriptor the raw-pointer contract allows: every field arbitrary, shape and strides
/// arrays long enough for the `ndim` they claim.
fn any_spec() -> impl Strategy<Value = TensorSpec> {
    let dtype = prop_oneof![
        supported_dtype(),
        (any::<u8>(), any::<u8>(), any::<u16>()).prop_map(|(code, bits, lanes)| DType {
            code,
            bits,
            lanes
        }),
    ];
    let device = prop_oneof![
        Just(Device::cuda(0)),
        (any::<u32>(), any::<i32>()).prop_map(|(t, id)| Device {
            device_type: DLDeviceType(t),
            device_id: id,
        }),
    ];
    let data = prop_oneof![
        Just(0u64),
        Just(0x7f00_0000_0000u64),
        any::<u64>(),
        (0u64..1 << 56).prop_map(|a| a << 8),
    ];
    let abi = prop_oneof![
        Just(Abi::Legacy),
        (0u32..3, any::<u32>()).prop_map(|(major, minor)| Abi::Versioned { major, minor }),
    ];
    (
        (
            vec(prop_oneof![dim(), any::<i64>()], 0..8),
            option::of(vec(stride(), 0..8)),
            option::weighted(0.2, -3i32..70),
            proptest::bool::weighted(0.1),
        ),
        (dtype, device, data, prop_oneof![0u64..64, any::<u64>()]),
        (abi, any::<u64>()),
    )
        .prop_map(
            |(
                (shape, strides, ndim, null_shape),
                (dtype, device, data, byte_offset),
                (abi, flags),
            )| {
                TensorSpec {
                    shape,
                    strides,
                    ndim,
                    null_shape,
                    dtype,
                    device,
                    data,
                    byte_offset,
                    abi,
                    flags,
                }
            },
        )
}

proptest! {
    #[test]
    fn byte_extent_matches_bigint_reference(
        dims in vec((dim(), stride()), 0..6),
        null_strides in proptest::bool::weighted(0.25),
        dtype in supported_dtype(),
        data in prop_oneof![
            Just(0x7f00_0000_0000u64),
            Just(0u64),
            (1u64..1 << 56).prop_map(|a| a << 8),
            Just(!0xffu64),
        ],
        byte_offset in prop_oneof![0u64..64, any::<u64>()],
    ) {
        let shape: Vec<i64> = dims.iter().map(|&(d, _)| d).collect();
        let strides: Vec<i64> = dims.iter().map(|&(_, s)| s).collect();
        let mut spec = TensorSpec::new(&shape, dtype).data(data).byte_offset(byte_offset);
        if !null_strides {
            spec = spec.strides(&strides);
        }
        let expected = reference(&shape, (!null_strides).then_some(&strides[..]), dtype, data, byte_offset);

        let (unused, deleted) = counted_tensor(&spec);
        prop_assert_eq!(unused.peek().map(|v| v.byte_extent()), expected.clone());
        let consumed = unused.consume().map(|used| used.view().byte_extent());
        prop_assert_eq!(consumed, expected);
        prop_assert_eq!(deleted.get(), 1);
    }

    #[test]
    fn any_descriptor_is_handled_without_panic(spec in any_spec()) {
        let (raw, deleted) = counted_raw(&spec);
        // SAFETY: a fresh export; consumed below, never deleted otherwise.
        let unused = unsafe { raw.unused() };
        let peeked = unused.peek().map(snapshot);
        prop_assert_eq!(deleted.get(), 0);
        if let Ok(view) = &peeked {
            prop_assert_eq!(view.shape.len(), view.strides.len());
            prop_assert!(view.dtype.is_supported());
            prop_assert!(view.extent.start <= 0 && view.extent.end >= 0);
            let numel = if view.shape.contains(&0) {
                Some(0)
            } else {
                view.shape.iter().try_fold(1u128, |acc, &d| acc.checked_mul(u128::try_from(d).ok()?))
            };
            prop_assert_eq!(Some(u128::from(view.numel)), numel);
            if view.numel == 0 {
                prop_assert_eq!(view.extent, ByteExtent { start: 0, end: 0 });
            } else {
                prop_assert_eq!(view.data_ptr % view.dtype.alignment(), 0);
            }
        }
        let consumed = unused.consume().map(|used| snapshot(used.view()));
        prop_assert_eq!(deleted.get(), 1);
        prop_assert_eq!(consumed, peeked);
    }

    #[test]
    fn layout_predicates_agree_with_brute_force(
        dims in vec((0i64..4, -6i64..7), 0..5),
        itemsize_dtype in supported_dtype(),
    ) {
        let shape: Vec<i64> = dims.iter().map(|&(d, _)| d).collect();
        let strides: Vec<i64> = dims.iter().map(|&(_, s)| s).collect();
        // Data high enough that negative strides stay in the address space.
        let spec = TensorSpec::new(&shape, itemsize_dtype).strides(&strides);
        let (unused, deleted) = counted_tensor(&spec);
        let used = unused.consume().unwrap();
        let view = used.view();

        // Every element offset, in row-major order.
        let mut offsets = vec![0i64];
        for (&d, &s) in shape.iter().zip(&strides) {
            offsets = offsets
                .iter()
                .flat_map(|&base| (0..d).map(move |i| base + i * s))
                .collect();
        }
        let numel = offsets.len() as u64;
        prop_assert_eq!(view.numel(), numel);

        let row_major: Vec<i64> = (0..numel as i64).collect();
        prop_assert_eq!(view.is_contiguous(), numel == 0 || offsets == row_major);

        let itemsize = itemsize_dtype.itemsize() as i64;
        if let (Some(&low), Some(&high)) = (offsets.iter().min(), offsets.iter().max()) {
            prop_assert_eq!(view.byte_extent(), ByteExtent { start: low * itemsize, end: (high + 1) * itemsize });
        }

        let mut sorted = offsets.clone();
        sorted.sort_unstable();
        sorted.dedup();
        let disjoint = sorted.len() == offsets.len();
        if view.check_writable().is_ok() {
            prop_assert!(disjoint, "check_writable passed an overlapping layout");
        }
        let broadcast = numel > 0 && shape.iter().zip(&strides).any(|(&d, &s)| d > 1 && s == 0);
        if broadcast {
            prop_assert!(view.check_writable().is_err());
        }
        drop(used);
        prop_assert_eq!(deleted.get(), 1);
    }
}
