//! Descriptors that must be accepted, and what their views say.

use super::with_used;
use crate::ffi::DLDeviceType;
use crate::testing::TensorSpec;
use crate::{ByteExtent, DType, Device, TensorView};

const DATA: u64 = 0x7f00_0000_0000;

fn extent(start: i64, end: i64) -> ByteExtent {
    ByteExtent { start, end }
}

/// [`with_used`], handing `check` the consumed tensor's view.
#[track_caller]
fn with_view(spec: &TensorSpec, check: impl FnOnce(&TensorView<'_>)) {
    with_used(spec, |used| check(&used.view()));
}

#[test]
fn compact() {
    with_view(
        &TensorSpec::new(&[2, 3], DType::F32).strides(&[3, 1]),
        |view| {
            assert_eq!(view.device(), Device::cuda(0));
            assert_eq!(view.dtype(), DType::F32);
            assert_eq!(view.ndim(), 2);
            assert_eq!(view.shape(), &[2, 3]);
            assert_eq!(view.strides(), &[3, 1]);
            assert_eq!(view.data_ptr(), DATA);
            assert_eq!(view.numel(), 6);
            assert_eq!(view.byte_extent(), extent(0, 24));
            assert_eq!(view.nbytes_spanned(), 24);
            assert!(view.is_contiguous());
            assert!(view.is_versioned());
            assert!(!view.is_read_only());
            assert!(!view.is_copied());
            assert_eq!(view.check_writable(), Ok(()));
        },
    );
}

#[test]
fn strided() {
    // Column-major 2 x 3 inside a padded buffer: offsets i + 4j.
    with_view(
        &TensorSpec::new(&[2, 3], DType::I64).strides(&[1, 4]),
        |view| {
            assert_eq!(view.strides(), &[1, 4]);
            assert!(!view.is_contiguous());
            // Highest offset 1 + 8 = 9, so 10 elements of 8 bytes.
            assert_eq!(view.byte_extent(), extent(0, 80));
            assert_eq!(view.check_writable(), Ok(()));
        },
    );
}

#[test]
fn negative_strides() {
    with_view(
        &TensorSpec::new(&[3, 2], DType::F32).strides(&[-2, 1]),
        |view| {
            assert_eq!(view.byte_extent(), extent(-16, 8));
            assert!(view.byte_extent().start < 0);
            assert_eq!(view.nbytes_spanned(), 24);
            assert!(!view.is_contiguous());
        },
    );
}

#[test]
fn byte_offset_is_applied_to_data_ptr() {
    with_used(&TensorSpec::new(&[4], DType::F32).byte_offset(64), |used| {
        assert_eq!(used.view().data_ptr(), DATA + 64);
        assert_eq!(used.view().byte_extent(), extent(0, 16));
    });
}

#[test]
fn null_strides_become_compact_strides() {
    with_view(&TensorSpec::new(&[2, 3, 4], DType::F16), |view| {
        assert_eq!(view.strides(), &[12, 4, 1]);
        assert!(view.is_contiguous());
        assert_eq!(view.byte_extent(), extent(0, 48));
    });
}

#[test]
fn null_strides_accepted_for_every_version() {
    for spec in [
        TensorSpec::new(&[2, 3], DType::F32).legacy(),
        TensorSpec::new(&[2, 3], DType::F32).version(1, 0),
        TensorSpec::new(&[2, 3], DType::F32).version(1, 2),
        TensorSpec::new(&[2, 3], DType::F32).version(1, 3),
        TensorSpec::new(&[2, 3], DType::F32).version(1, 99),
    ] {
        with_used(&spec, |used| assert_eq!(used.view().strides(), &[3, 1]));
    }
}

#[test]
fn zero_dimensional() {
    with_view(&TensorSpec::new(&[], DType::F64), |view| {
        assert_eq!(view.ndim(), 0);
        assert_eq!(view.shape(), &[] as &[i64]);
        assert_eq!(view.strides(), &[] as &[i64]);
        assert_eq!(view.numel(), 1);
        assert_eq!(view.byte_extent(), extent(0, 8));
        assert!(view.is_contiguous());
        assert_eq!(view.check_writable(), Ok(()));
    });
}

#[test]
fn empty_with_null_data() {
    with_view(
        &TensorSpec::new(&[0, 3], DType::F32)
            .data(0)
            .strides(&[3, 1]),
        |view| {
            assert_eq!(view.numel(), 0);
            assert_eq!(view.data_ptr(), 0);
            assert_eq!(view.byte_extent(), extent(0, 0));
            assert_eq!(view.nbytes_spanned(), 0);
            assert!(view.is_contiguous());
            assert_eq!(view.check_writable(), Ok(()));
        },
    );
}

#[test]
fn empty_ignores_huge_strides() {
    with_used(
        &TensorSpec::new(&[0, 5], DType::F64).strides(&[i64::MAX, i64::MIN]),
        |used| assert_eq!(used.view().byte_extent(), extent(0, 0)),
    );
}

#[test]
fn fp4_x2() {
    with_view(&TensorSpec::new(&[4, 8], DType::F4_E2M1FN_X2), |view| {
        assert_eq!(view.dtype().itemsize(), 1);
        assert_eq!(view.dtype().to_string(), "float4_e2m1fn x2");
        assert_eq!(view.byte_extent(), extent(0, 32));
    });
}

#[test]
fn fp4_x2_needs_only_byte_alignment() {
    with_used(
        &TensorSpec::new(&[4], DType::F4_E2M1FN_X2).byte_offset(3),
        |used| assert_eq!(used.view().data_ptr(), DATA + 3),
    );
}

#[test]
fn fp6_x4() {
    with_view(
        &TensorSpec::new(&[5], DType::F6_E3M2FN_X4).byte_offset(1),
        |view| {
            assert_eq!(view.dtype().itemsize(), 3);
            assert_eq!(view.byte_extent(), extent(0, 15));
        },
    );
}

#[test]
fn bf16() {
    with_view(&TensorSpec::new(&[3], DType::BF16).byte_offset(2), |view| {
        assert_eq!(view.dtype().to_string(), "bfloat16");
        assert_eq!(view.dtype().itemsize(), 2);
        assert_eq!(view.byte_extent(), extent(0, 6));
    });
}

#[test]
fn every_supported_dtype_is_accepted() {
    let all = [
        DType::BOOL,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::C64,
        DType::C128,
        DType::F8_E3M4,
        DType::F8_E4M3,
        DType::F8_E4M3B11FNUZ,
        DType::F8_E4M3FN,
        DType::F8_E4M3FNUZ,
        DType::F8_E5M2,
        DType::F8_E5M2FNUZ,
        DType::F8_E8M0FNU,
        DType::F6_E2M3FN_X4,
        DType::F6_E3M2FN_X4,
        DType::F4_E2M1FN_X2,
    ];
    for dtype in all {
        assert!(dtype.is_supported(), "{dtype}");
        with_used(&TensorSpec::new(&[2], dtype), |used| {
            assert_eq!(used.view().dtype(), dtype);
            let itemsize = i64::try_from(dtype.itemsize()).unwrap();
            assert_eq!(used.view().byte_extent(), extent(0, 2 * itemsize));
        });
    }
}

#[test]
fn dtype_itemsize_alignment_and_names() {
    let table = [
        (DType::BOOL, 1, 1, "bool"),
        (DType::I8, 1, 1, "int8"),
        (DType::U16, 2, 2, "uint16"),
        (DType::I64, 8, 8, "int64"),
        (DType::F16, 2, 2, "float16"),
        (DType::F32, 4, 4, "float32"),
        (DType::C64, 8, 8, "complex64"),
        (DType::C128, 16, 16, "complex128"),
        (DType::F8_E4M3FN, 1, 1, "float8_e4m3fn"),
        (DType::F8_E5M2, 1, 1, "float8_e5m2"),
        (DType::F6_E2M3FN_X4, 3, 1, "float6_e2m3fn x4"),
        (DType::F4_E2M1FN_X2, 1, 1, "float4_e2m1fn x2"),
    ];
    for (dtype, itemsize, alignment, name) in table {
        assert_eq!(dtype.itemsize(), itemsize, "{name}");
        assert_eq!(dtype.alignment(), alignment, "{name}");
        assert_eq!(dtype.to_string(), name);
    }
    let odd = [
        (
            DType {
                code: 2,
                bits: 24,
                lanes: 1,
            },
            "float24",
        ),
        (
            DType {
                code: 2,
                bits: 32,
                lanes: 4,
            },
            "float32 x4",
        ),
        (
            DType {
                code: 6,
                bits: 1,
                lanes: 1,
            },
            "bool (1 bits)",
        ),
        (
            DType {
                code: 17,
                bits: 8,
                lanes: 1,
            },
            "float4_e2m1fn (8 bits)",
        ),
        (
            DType {
                code: 3,
                bits: 64,
                lanes: 1,
            },
            "opaque_handle",
        ),
        (
            DType {
                code: 200,
                bits: 8,
                lanes: 1,
            },
            "dtype code 200 (8 bits)",
        ),
    ];
    for (dtype, name) in odd {
        assert!(!dtype.is_supported(), "{name}");
        assert_eq!(dtype.to_string(), name);
    }
}

#[test]
fn device_display_and_classes() {
    let device = |device_type, device_id| Device {
        device_type: DLDeviceType(device_type),
        device_id,
    };
    let table = [
        (Device::cuda(0), "cuda:0", true, true),
        (Device::cuda(3), "cuda:3", true, true),
        (Device::CPU, "cpu", false, false),
        (device(1, 2), "cpu:2", false, false),
        (device(3, 0), "cuda_host:0", false, true),
        (device(13, 0), "cuda_managed:0", false, true),
        (device(9, 0), "device_type 9:0", false, false),
    ];
    for (device, name, cuda, accessible) in table {
        assert_eq!(device.to_string(), name);
        assert_eq!(device.is_cuda(), cuda, "{name}");
        assert_eq!(device.is_cuda_accessible(), accessible, "{name}");
    }
}

#[test]
fn cuda_accessible_devices_pass_validation() {
    for device_type in [DLDeviceType::CUDAHOST, DLDeviceType::CUDAMANAGED] {
        let device = Device {
            device_type,
            device_id: 0,
        };
        with_used(&TensorSpec::new(&[2], DType::F32).device(device), |used| {
            assert_eq!(used.view().device(), device);
            assert!(used.view().device().is_cuda_accessible());
        });
    }
}

#[test]
fn flags_are_reported() {
    with_used(&TensorSpec::new(&[2], DType::F32).flags(0b11), |used| {
        assert!(used.view().is_read_only());
        assert!(used.view().is_copied());
    });
    // Unknown flag bits are ignored; the padded flag only matters for sub-byte dtypes.
    with_used(
        &TensorSpec::new(&[2], DType::F32).flags(0b100 | 1 << 40),
        |used| assert!(!used.view().is_read_only()),
    );
}

#[test]
fn legacy_tensor() {
    let (unused, deleted) =
        crate::testing::counted_tensor(&TensorSpec::new(&[2], DType::F32).legacy());
    assert!(!unused.is_versioned());
    assert_eq!(unused.version(), None);
    let used = unused.consume().unwrap();
    assert!(!used.view().is_versioned());
    assert!(!used.view().is_copied());
    drop(used);
    assert_eq!(deleted.get(), 1);
}

#[test]
fn size_1_dimensions_do_not_affect_contiguity() {
    with_used(
        &TensorSpec::new(&[1, 3, 1, 2], DType::F32).strides(&[99, 2, -7, 1]),
        |used| {
            assert!(used.view().is_contiguous());
            assert_eq!(used.view().check_writable(), Ok(()));
        },
    );
}

#[test]
fn view_debug_lists_the_fields() {
    with_used(&TensorSpec::new(&[2], DType::BF16), |used| {
        let debug = format!("{:?}", used.view());
        assert!(debug.contains("dtype: bfloat16"), "{debug}");
        assert!(debug.contains("device: cuda:0"), "{debug}");
        assert!(debug.contains("data_ptr: 0x7f0000000000"), "{debug}");
    });
}

#[test]
fn every_supported_dtype_is_found_by_its_name_and_short_name() {
    let cases: [(&str, Option<&str>, DType); 8] = [
        ("bool", None, DType::BOOL),
        ("int64", Some("i64"), DType::I64),
        ("uint8", Some("u8"), DType::U8),
        ("bfloat16", Some("bf16"), DType::BF16),
        ("float32", Some("f32"), DType::F32),
        ("complex128", Some("c128"), DType::C128),
        ("float8_e4m3fn", None, DType::F8_E4M3FN),
        ("float4_e2m1fn_x2", None, DType::F4_E2M1FN_X2),
    ];
    for (name, short, dtype) in cases {
        assert_eq!(DType::from_name(name), Some(dtype), "{name}");
        if let Some(short) = short {
            assert_eq!(DType::from_name(short), Some(dtype), "{short}");
        }
        assert!(dtype.is_supported());
    }
    // Names print back as they are parsed (one lane: the name is the display).
    for dtype in [
        DType::I16,
        DType::F16,
        DType::F64,
        DType::C64,
        DType::F8_E8M0FNU,
    ] {
        assert_eq!(DType::from_name(&dtype.to_string()), Some(dtype), "{dtype}");
    }
    // Framework aliases are not dtype names: `float` is float32 to PyTorch, float64 to NumPy.
    for name in [
        "float", "double", "half", "long", "int", "float33", "", "F32",
    ] {
        assert_eq!(DType::from_name(name), None, "{name:?}");
    }
}
