//! The bad-input table (reliability and test plan, section 6), rows 3 to 12: one test per
//! row and sub-case, each asserting the exact error and the deleter count.

use super::{assert_rejected, consume_error, peek_error, with_used};
use crate::DescriptorError::{self, *};
use crate::ffi::DLDeviceType;
use crate::testing::TensorSpec;
use crate::{DType, Device, Unused};

const DATA: u64 = 0x7f00_0000_0000;

fn f32s(shape: &[i64]) -> TensorSpec {
    TensorSpec::new(shape, DType::F32)
}

// Row 3: major version other than 1.

#[test]
fn row3_major_version_2_is_rejected_and_deleted_once() {
    let spec = f32s(&[2, 3]).version(2, 0);
    assert_rejected(&spec, UnsupportedVersion { major: 2, minor: 0 });
}

#[test]
fn row3_major_version_0_is_rejected() {
    let spec = f32s(&[2, 3]).version(0, 8);
    assert_rejected(&spec, UnsupportedVersion { major: 0, minor: 8 });
}

#[test]
fn row3_no_other_field_is_read() {
    // Every other field is bad too; only the version may be reported.
    let spec = f32s(&[-1])
        .ndim(-5)
        .null_shape()
        .data(0)
        .version(7, 1)
        .device(Device {
            device_type: DLDeviceType(999),
            device_id: -1,
        });
    assert_rejected(&spec, UnsupportedVersion { major: 7, minor: 1 });
}

// Row 4: null data with elements.

#[test]
fn row4_null_data_with_elements() {
    assert_rejected(&f32s(&[2, 3]).data(0), NullData { numel: 6 });
}

#[test]
fn row4_null_data_with_elements_legacy() {
    assert_rejected(&f32s(&[5]).data(0).legacy(), NullData { numel: 5 });
}

#[test]
fn row4_null_data_of_0d_tensor() {
    // A 0-d tensor has one element.
    assert_rejected(&f32s(&[]).data(0), NullData { numel: 1 });
}

// Row 5: ndim out of range.

#[test]
fn row5_negative_ndim() {
    assert_rejected(
        &f32s(&[2]).ndim(-1),
        NdimOutOfRange {
            ndim: -1,
            limit: 64,
        },
    );
}

#[test]
fn row5_ndim_65() {
    assert_rejected(
        &f32s(&[2]).ndim(65),
        NdimOutOfRange {
            ndim: 65,
            limit: 64,
        },
    );
}

#[test]
fn row5_ndim_extremes() {
    assert_rejected(
        &f32s(&[]).ndim(i32::MIN),
        NdimOutOfRange {
            ndim: i32::MIN,
            limit: 64,
        },
    );
    assert_rejected(
        &f32s(&[]).ndim(i32::MAX),
        NdimOutOfRange {
            ndim: i32::MAX,
            limit: 64,
        },
    );
}

#[test]
fn row5_ndim_64_is_accepted() {
    with_used(&f32s(&[1; 64]), |used| assert_eq!(used.view().ndim(), 64));
}

// Row 6: null shape, negative dimension (null strides are accepted: see good_input).

#[test]
fn row6_null_shape() {
    assert_rejected(&f32s(&[2, 3]).null_shape(), NullShape { ndim: 2 });
}

#[test]
fn row6_null_shape_is_fine_for_0d() {
    with_used(&f32s(&[]).null_shape(), |used| {
        assert_eq!(used.view().shape(), &[] as &[i64]);
        assert_eq!(used.view().numel(), 1);
    });
}

#[test]
fn row6_negative_dimension() {
    assert_rejected(&f32s(&[2, -3, 4]), NegativeDimension { axis: 1, value: -3 });
}

#[test]
fn row6_negative_dimension_reported_even_beside_a_zero() {
    // A zero dimension does not make a negative one acceptable.
    assert_rejected(
        &f32s(&[0, i64::MIN]),
        NegativeDimension {
            axis: 1,
            value: i64::MIN,
        },
    );
}

// Row 7: overflow.

#[test]
fn row7_element_count_overflow() {
    assert_rejected(
        &f32s(&[1 << 62, 4]).strides(&[1, 1]),
        Overflow {
            what: "element count",
        },
    );
}

#[test]
fn row7_byte_extent_overflow() {
    let spec = TensorSpec::new(&[2], DType::F64).strides(&[1 << 62]);
    assert_rejected(
        &spec,
        Overflow {
            what: "byte extent",
        },
    );
}

#[test]
fn row7_negative_byte_extent_overflow() {
    let spec = TensorSpec::new(&[3], DType::F64).strides(&[-(1 << 61)]);
    assert_rejected(
        &spec,
        Overflow {
            what: "byte extent",
        },
    );
}

#[test]
fn row7_data_plus_byte_offset_wraps() {
    let spec = f32s(&[4]).byte_offset(u64::MAX - 0xff);
    assert_rejected(
        &spec,
        Overflow {
            what: "data pointer + byte_offset",
        },
    );
}

#[test]
fn row7_compact_strides_overflow() {
    // Empty, so the element count is 0, but the strides a null pointer stands for do not fit.
    assert_rejected(
        &f32s(&[0, 1 << 62, 4]),
        Overflow {
            what: "compact strides",
        },
    );
}

#[test]
fn row7_address_range_past_the_top() {
    let spec = f32s(&[128]).data(u64::MAX - 0xff);
    assert_rejected(
        &spec,
        Overflow {
            what: "address range",
        },
    );
}

#[test]
fn row7_address_range_below_zero() {
    let spec = f32s(&[2]).data(0x100).strides(&[-1000]);
    assert_rejected(
        &spec,
        Overflow {
            what: "address range",
        },
    );
}

// Row 8: misaligned data pointer.

#[test]
fn row8_f32_misaligned() {
    assert_rejected(
        &f32s(&[4]).byte_offset(2),
        Misaligned {
            address: DATA + 2,
            alignment: 4,
            dtype: DType::F32,
        },
    );
}

#[test]
fn row8_misaligned_base_pointer() {
    assert_rejected(
        &TensorSpec::new(&[4], DType::F64).data(DATA + 4),
        Misaligned {
            address: DATA + 4,
            alignment: 8,
            dtype: DType::F64,
        },
    );
}

#[test]
fn row8_complex128_needs_16_bytes() {
    assert_rejected(
        &TensorSpec::new(&[4], DType::C128).byte_offset(8),
        Misaligned {
            address: DATA + 8,
            alignment: 16,
            dtype: DType::C128,
        },
    );
}

#[test]
fn row8_empty_tensor_is_not_checked() {
    with_used(&f32s(&[0]).byte_offset(1), |used| {
        assert_eq!(used.view().data_ptr(), DATA + 1);
    });
}

// Row 9: unsupported dtype.

fn assert_unsupported(code: u8, bits: u8, lanes: u16) {
    let dtype = DType { code, bits, lanes };
    assert_rejected(
        &TensorSpec::new(&[4], dtype),
        UnsupportedDtype { code, bits, lanes },
    );
}

#[test]
fn row9_unsupported_dtypes() {
    for (code, bits, lanes) in [
        (2, 32, 4),  // four lanes
        (2, 24, 1),  // a float of 24 bits
        (6, 1, 1),   // a bool of 1 bit
        (200, 8, 1), // an unknown code
        (17, 8, 1),  // fp4 with 8 bits
        (17, 8, 2),  // fp4 with 8 bits, paired
        (17, 4, 1),  // fp4 unpaired: one 4-bit value per element has no whole-byte stride
        (15, 8, 1),  // fp6 with wrong bits or lanes
        (15, 6, 1),
        (15, 6, 2),
        (15, 6, 8),
        (2, 32, 0), // zero lanes
        (3, 64, 1), // an opaque handle
    ] {
        assert_unsupported(code, bits, lanes);
    }
}

#[test]
fn row9_padded_sub_byte() {
    let spec = TensorSpec::new(&[4], DType::F4_E2M1FN_X2).flags(0b100);
    assert_rejected(
        &spec,
        PaddedSubByte {
            dtype: DType::F4_E2M1FN_X2,
        },
    );
}

// Row 10 (in part): device.

#[test]
fn row10_negative_device_id() {
    assert_rejected(
        &f32s(&[4]).device(Device::cuda(-1)),
        InvalidDevice {
            device_type: 2,
            device_id: -1,
        },
    );
}

#[test]
fn row10_unknown_device_types() {
    for device_type in [0, 5, 6, 19, u32::MAX] {
        let device = Device {
            device_type: DLDeviceType(device_type),
            device_id: 0,
        };
        assert_rejected(
            &f32s(&[4]).device(device),
            InvalidDevice {
                device_type,
                device_id: 0,
            },
        );
    }
}

#[test]
fn row10_non_cuda_devices_pass_validation() {
    // Matching the device to the stream is the launcher's job; here it is only reported.
    with_used(&f32s(&[4]).device(Device::CPU), |used| {
        let device = used.view().device();
        assert!(!device.is_cuda());
        assert!(!device.is_cuda_accessible());
    });
}

// Row 11: read-only output.

#[test]
fn row11_read_only_output() {
    with_used(&f32s(&[4]).read_only(), |used| {
        let view = used.view();
        assert!(view.is_read_only());
        assert_eq!(view.check_writable(), Err(ReadOnly));
    });
}

#[test]
fn row11_read_only_is_caught_before_consuming() {
    let (unused, deleted) = crate::testing::counted_tensor(&f32s(&[4]).read_only());
    assert_eq!(unused.peek().unwrap().check_writable(), Err(ReadOnly));
    drop(unused.consume());
    assert_eq!(deleted.get(), 1);
}

#[test]
fn row11_legacy_tensors_are_writable() {
    with_used(&f32s(&[4]).legacy(), |used| {
        assert!(!used.view().is_read_only());
        assert_eq!(used.view().check_writable(), Ok(()));
    });
}

// Row 18: a private copy (IS_COPIED) bound to an output.

#[test]
fn row18_copied_output_is_refused_before_consuming() {
    let copied = f32s(&[4]).flags(dlpark::DlpackFlags::IS_COPIED.bits());
    let (unused, deleted) = crate::testing::counted_tensor(&copied);
    let view = unused.peek().unwrap();
    assert!(view.is_copied());
    assert_eq!(view.check_writable(), Err(DescriptorError::Copied));
    assert_eq!(deleted.get(), 0);
    drop(unused.consume());
    assert_eq!(deleted.get(), 1);
    assert!(
        DescriptorError::Copied
            .to_string()
            .contains("DLPACK_FLAG_BITMASK_IS_COPIED")
    );
}

// Row 12: internal overlap.

/// `check_writable` of a consumed `float32` tensor of `shape` and `strides`.
#[track_caller]
fn writability(shape: &[i64], strides: &[i64]) -> Result<(), DescriptorError> {
    let mut result = Ok(());
    with_used(&f32s(shape).strides(strides), |used| {
        result = used.view().check_writable();
    });
    result
}

#[test]
fn row12_overlapping_outputs_are_refused() {
    for (shape, strides, axis) in [
        // Stride 0 on a dimension of more than one element.
        ([4, 3], [0, 1], 0),
        // Offsets i * 2 + j for i < 3, j < 3: 2 is reached as (1, 0) and (0, 2).
        ([3, 3], [2, 1], 0),
        // Offsets 3i + 4j (i, j < 3) are all distinct, but not provably by sorted strides: a
        // conservative rejection, documented behaviour.
        ([3, 3], [3, 4], 1),
    ] {
        let got = writability(&shape, &strides);
        assert_eq!(got, Err(InternalOverlap { axis }), "strides {strides:?}");
    }
}

#[test]
fn row12_disjoint_layouts_are_writable() {
    // Stride 0 on a size-1 dimension is fine.
    assert_eq!(writability(&[1, 3], &[0, 1]), Ok(()));
    for strides in [[1, 3], [-2, 1], [2, -1], [-2, -1], [4, 1], [1, 4]] {
        assert_eq!(
            writability(&[3, 2], &strides),
            Ok(()),
            "strides {strides:?}"
        );
    }
}

// A null managed-tensor pointer.

#[test]
fn null_pointer_legacy_and_versioned() {
    // SAFETY: a null pointer is allowed; it is never dereferenced.
    let legacy = unsafe { Unused::from_legacy(std::ptr::null_mut()) };
    assert_eq!(legacy.peek().unwrap_err(), NullPointer);
    assert_eq!(legacy.version(), None);
    assert!(!legacy.is_versioned());
    assert_eq!(legacy.consume().unwrap_err(), NullPointer);

    // SAFETY: as above.
    let versioned = unsafe { Unused::from_versioned(std::ptr::null_mut()) };
    assert_eq!(versioned.peek().unwrap_err(), NullPointer);
    assert_eq!(versioned.version(), None);
    assert!(versioned.is_versioned());
    assert_eq!(versioned.consume().unwrap_err(), NullPointer);
}

// Messages name the field and the value.

#[test]
fn messages_name_field_and_value() {
    let cases = [
        (
            peek_error(&f32s(&[2]).ndim(65)),
            "ndim 65 is out of range 0..=64",
        ),
        (
            consume_error(&f32s(&[2]).version(2, 1)),
            "unsupported DLPack version 2.1: only major version 1 is supported (no other field was read)",
        ),
        (
            peek_error(&f32s(&[2, 3]).data(0)),
            "data pointer is null but the tensor has 6 elements (null is allowed only when empty)",
        ),
        (peek_error(&f32s(&[2, -3])), "shape[1] is negative: -3"),
        (
            peek_error(&f32s(&[2]).null_shape()),
            "shape pointer is null with ndim 1",
        ),
        (peek_error(&f32s(&[1 << 62, 4])), "element count overflows"),
        (
            peek_error(&f32s(&[4]).byte_offset(2)),
            "data pointer 0x7f0000000002 (data + byte_offset) is not aligned to 4 bytes for float32",
        ),
        (
            peek_error(&TensorSpec::new(
                &[4],
                DType {
                    code: 2,
                    bits: 24,
                    lanes: 1,
                },
            )),
            "unsupported dtype (code 2, bits 24, lanes 1)",
        ),
        (
            peek_error(&f32s(&[4]).device(Device::cuda(-1))),
            "invalid device (device_type 2, device_id -1)",
        ),
    ];
    for (error, message) in cases {
        assert_eq!(error.to_string(), message);
    }
    assert_eq!(
        ReadOnly.to_string(),
        "tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY) and cannot be written"
    );
    assert!(
        InternalOverlap { axis: 2 }
            .to_string()
            .starts_with("tensor has internal overlap at axis 2")
    );
}
