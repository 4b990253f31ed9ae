//! Array parameters on the CPU: the `1 + 2 * ndim` kernel parameters a tensor is packed into
//! (data pointer with `byte_offset`, extents, strides in elements) against a reference, and the
//! refusals (ndim, index-type overflow) made before anything is consumed.

use proptest::prelude::*;
use tile_dlpack::testing::{TensorSpec, counted_tensor};
use tile_dlpack::{DType, Device};
use tile_launch::{
    Arg, ArrayAssumptions, ArrayField, Error, IndexType, Intent, Param, ScalarType, Signature,
    check_args, pack_args,
};

const BASE: u64 = 0x7f00_0000_0000;

/// The reference: what the calling convention says a kernel receives, each value reduced to the
/// index type's width (two's complement), in an 8-byte slot.
fn reference(
    data: u64,
    byte_offset: u64,
    shape: &[i64],
    strides: &[i64],
    ty: IndexType,
) -> Vec<u64> {
    let narrow = |v: i64| match ty {
        IndexType::I32 | IndexType::U32 => u64::from(v as u32),
        _ => v as u64,
    };
    let mut out = vec![data + byte_offset];
    out.extend(shape.iter().map(|&v| narrow(v)));
    out.extend(strides.iter().map(|&v| narrow(v)));
    out
}

fn array(ndim: u8, index: IndexType) -> Param {
    Param::array(DType::F32, Intent::Read, ndim, index)
}

#[test]
fn slots_and_sizes_follow_the_declaration() {
    let p = array(2, IndexType::I32);
    assert_eq!(p.slots(), 5);
    assert_eq!(
        (0..5).map(|k| p.slot_size(k)).collect::<Vec<_>>(),
        [8, 4, 4, 4, 4]
    );
    let q = array(3, IndexType::I64);
    assert_eq!((0..7).map(|k| q.slot_size(k)).collect::<Vec<_>>(), [8; 7]);
    let sig = Signature::new([p, Param::scalar(ScalarType::F32), q]);
    assert_eq!(sig.slot_count(), 5 + 1 + 7);
    assert_eq!(p.to_string(), "input array of float32 (ndim 2, index i32)");
}

#[test]
fn packs_pointer_extents_and_strides_around_scalars() {
    // A transposed 3x4 view of a 4x3 row-major buffer, with a byte offset.
    let spec = TensorSpec::new(&[3, 4], DType::F32)
        .strides(&[1, 3])
        .byte_offset(64);
    let (a, ca) = counted_tensor(&spec);
    let (b, cb) = counted_tensor(&TensorSpec::new(&[5], DType::F32));
    let sig = Signature::new([
        array(2, IndexType::I32),
        Param::scalar(ScalarType::I32),
        array(1, IndexType::I64),
    ]);
    let args: Vec<Arg<'_>> = vec![a.into(), (-7i32).into(), b.into()];
    let packed = pack_args("k", &sig, &args, 0).unwrap();
    let mut want = reference(BASE, 64, &[3, 4], &[1, 3], IndexType::I32);
    want.push(u64::from((-7i32) as u32));
    want.extend(reference(BASE, 0, &[5], &[1], IndexType::I64));
    assert_eq!(packed, want);
    drop(args);
    assert_eq!((ca.get(), cb.get()), (0, 0));
}

#[test]
fn negative_and_zero_strides_pass_as_given() {
    // A reversed row (stride -1, data pointing at the last element) broadcast over 4 rows
    // (stride 0).
    let spec = TensorSpec::new(&[4, 6], DType::F32)
        .strides(&[0, -1])
        .byte_offset(20);
    let (a, ca) = counted_tensor(&spec);
    for ty in [IndexType::I32, IndexType::I64] {
        let sig = Signature::new([array(2, ty)]);
        let args: Vec<Arg<'_>> = vec![counted_tensor(&spec).0.into()];
        let packed = pack_args("k", &sig, &args, 0).unwrap();
        assert_eq!(packed, reference(BASE, 20, &[4, 6], &[0, -1], ty), "{ty}");
        assert_eq!(packed[4] as u32 as i32, -1);
    }
    drop(a);
    assert_eq!(ca.get(), 0);
}

#[test]
fn compact_strides_are_filled_in_when_absent() {
    let (a, _) = counted_tensor(&TensorSpec::new(&[2, 3, 4], DType::F32));
    let sig = Signature::new([array(3, IndexType::U32)]);
    let args: Vec<Arg<'_>> = vec![a.into()];
    assert_eq!(
        pack_args("k", &sig, &args, 0).unwrap(),
        reference(BASE, 0, &[2, 3, 4], &[12, 4, 1], IndexType::U32)
    );
}

#[test]
fn negative_stride_does_not_fit_u32() {
    let spec = TensorSpec::new(&[6], DType::F32)
        .strides(&[-1])
        .byte_offset(20);
    let (a, ca) = counted_tensor(&spec);
    let sig = Signature::new([Param::scalar(ScalarType::U8), array(1, IndexType::U32)]);
    let args: Vec<Arg<'_>> = vec![1u8.into(), a.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOverflow {
                index: 1,
                field: ArrayField::Stride,
                dim: 0,
                value: -1,
                index_type: IndexType::U32
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "argument 1: stride -1 of dimension 0 does not fit the array parameter's index type u32"
    );
    drop(args);
    assert_eq!(ca.get(), 0);
}

#[test]
fn extent_beyond_i32_is_refused_and_fits_i64() {
    // 2^31 elements of one byte: no memory behind it, the descriptor alone is checked.
    let spec = TensorSpec::new(&[1 << 31], DType::U8);
    let (a, ca) = counted_tensor(&spec);
    let sig = Signature::new([Param::array(DType::U8, Intent::Read, 1, IndexType::I32)]);
    let args: Vec<Arg<'_>> = vec![a.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOverflow {
                index: 0,
                field: ArrayField::Extent,
                dim: 0,
                value: 2_147_483_648,
                index_type: IndexType::I32
            }
        ),
        "{e}"
    );
    drop(args);
    assert_eq!(ca.get(), 0);
    for (ty, ok) in [(IndexType::U32, true), (IndexType::I64, true)] {
        let (a, _) = counted_tensor(&spec);
        let sig = Signature::new([Param::array(DType::U8, Intent::Read, 1, ty)]);
        let args: Vec<Arg<'_>> = vec![a.into()];
        assert_eq!(pack_args("k", &sig, &args, 0).is_ok(), ok, "{ty}");
    }
}

#[test]
fn stride_beyond_i32_is_refused() {
    let spec = TensorSpec::new(&[2, 2], DType::U8).strides(&[1 << 32, 1]);
    let (a, ca) = counted_tensor(&spec);
    let sig = Signature::new([Param::array(DType::U8, Intent::Read, 2, IndexType::I32)]);
    let args: Vec<Arg<'_>> = vec![a.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::IndexOverflow {
                index: 0,
                field: ArrayField::Stride,
                dim: 0,
                value: 4_294_967_296,
                ..
            }
        ),
        "{e}"
    );
    drop(args);
    assert_eq!(ca.get(), 0);
}

#[test]
fn wrong_ndim_and_dtype_are_refused_before_consuming() {
    let (a, ca) = counted_tensor(&TensorSpec::new(&[4, 4], DType::F32));
    let (b, cb) = counted_tensor(&TensorSpec::new(&[4], DType::F32));
    let sig = Signature::new([array(2, IndexType::I32), array(2, IndexType::I32)]);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NdimMismatch {
                index: 1,
                expected: 2,
                got: 1
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "argument 1: expected an array of 2 dimensions, got 1"
    );
    drop(args);
    let (c, cc) = counted_tensor(&TensorSpec::new(&[4, 4], DType::F16));
    let args: Vec<Arg<'_>> = vec![c.into(), 1i32.into()];
    let sig1 = Signature::new([array(2, IndexType::I32), Param::scalar(ScalarType::I32)]);
    let e = check_args("k", &sig1, &args, 0).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { index: 0, .. }), "{e}");
    drop(args);
    assert_eq!((ca.get(), cb.get(), cc.get()), (0, 0, 0));
}

#[test]
fn output_arrays_keep_the_output_checks() {
    let spec = TensorSpec::new(&[4], DType::F32).read_only();
    let (a, ca) = counted_tensor(&spec);
    let sig = Signature::new([Param::array(DType::F32, Intent::Write, 1, IndexType::I32)]);
    let args: Vec<Arg<'_>> = vec![a.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(matches!(e, Error::Descriptor { index: 0, .. }), "{e}");
    drop(args);
    assert_eq!(ca.get(), 0);
    // A broadcast (stride 0) output overlaps itself: refused as for a pointer parameter.
    let spec = TensorSpec::new(&[4], DType::F32).strides(&[0]);
    let (b, cb) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![b.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(matches!(e, Error::Descriptor { index: 0, .. }), "{e}");
    drop(args);
    assert_eq!(cb.get(), 0);
}

#[test]
fn a_scalar_for_an_array_names_the_declaration() {
    let sig = Signature::new([array(1, IndexType::I32)]);
    let args: Vec<Arg<'_>> = vec![3i32.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "argument 0: expected input array of float32 (ndim 1, index i32), got integer 3"
    );
    let (a, _) = counted_tensor(&TensorSpec::new(&[1], DType::F32).device(Device::cuda(1)));
    let args: Vec<Arg<'_>> = vec![a.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { index: 0, .. }), "{e}");
}

proptest! {
    #[test]
    fn packing_matches_the_reference(
        shape in prop::collection::vec(0i64..6, 1..4),
        raw_strides in prop::collection::vec(-40i64..40, 4),
        offset_elems in 0u64..512,
        ty in prop::sample::select(vec![IndexType::I32, IndexType::U32, IndexType::I64]),
    ) {
        let strides: Vec<i64> = raw_strides[..shape.len()].to_vec();
        let spec = TensorSpec::new(&shape, DType::F32)
            .strides(&strides)
            .byte_offset(offset_elems * 4);
        let (a, count) = counted_tensor(&spec);
        let ndim = u8::try_from(shape.len()).unwrap();
        let sig = Signature::new([array(ndim, ty)]);
        let args: Vec<Arg<'_>> = vec![a.into()];
        let r = pack_args("k", &sig, &args, 0);
        let refused = ty == IndexType::U32 && strides.iter().any(|&s| s < 0);
        match r {
            Ok(packed) => {
                prop_assert!(!refused);
                prop_assert_eq!(packed, reference(BASE, offset_elems * 4, &shape, &strides, ty));
            }
            Err(Error::IndexOverflow { index: 0, field: ArrayField::Stride, value, .. }) => {
                prop_assert!(refused);
                prop_assert!(value < 0);
            }
            // A negative stride may reach below the data pointer: a descriptor refusal is the
            // tensor's own rule, not the packing's.
            Err(Error::Descriptor { index: 0, .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
        drop(args);
        prop_assert_eq!(count.get(), 0);
    }
}

fn cutile_like(ndim: u8) -> ArrayAssumptions {
    // What cuTile assumes for a dense, 16-byte aligned float32 tensor whose extents are
    // multiples of 16: base address and strides 16-byte divisible, unit innermost stride.
    let mut a = ArrayAssumptions::none();
    a.base_addr_divisible_by = 16;
    for d in 0..usize::from(ndim) {
        a.shape_divisible_by[d] = 16;
        a.stride_divisible_by[d] = 4;
    }
    a.stride_divisible_by[usize::from(ndim) - 1] = 1;
    a.unit_stride = 1 << (ndim - 1);
    a.nonnegative_strides = true;
    a.disjoint = true;
    a
}

fn assumed(ndim: u8) -> Signature {
    Signature::new([array(ndim, IndexType::I32).assuming(cutile_like(ndim))])
}

#[test]
fn arguments_that_keep_the_assumptions_pack_as_usual() {
    let (a, ca) = counted_tensor(&TensorSpec::new(&[32, 64], DType::F32));
    let args: Vec<Arg<'_>> = vec![a.into()];
    assert_eq!(
        pack_args("k", &assumed(2), &args, 0).unwrap(),
        reference(BASE, 0, &[32, 64], &[64, 1], IndexType::I32)
    );
    drop(args);
    assert_eq!(ca.get(), 0);
}

/// Each way to break one assumption, refused before consuming, naming the argument and rule.
#[test]
fn each_broken_assumption_is_refused_before_consuming() {
    let cases: Vec<(TensorSpec, &str)> = vec![
        (
            TensorSpec::new(&[32, 64], DType::F32).byte_offset(4),
            "argument 0: its data pointer 0x7f0000000004 is not a multiple of 16 bytes, which \
             the kernel was compiled to assume",
        ),
        (
            // The transposed view: the outer stride (1) is not a multiple of 16 bytes.
            TensorSpec::new(&[32, 64], DType::F32).strides(&[1, 32]),
            "argument 0: the stride 1 of dimension 0 is not a multiple of 4 elements, which the \
             kernel was compiled to assume",
        ),
        (
            // Inner stride 2: a multiple of nothing assumed there, but not the assumed unit.
            TensorSpec::new(&[32, 64], DType::F32).strides(&[128, 2]),
            "argument 0: the stride 2 of dimension 1 is not 1, which the kernel was compiled to \
             assume",
        ),
        (
            TensorSpec::new(&[32, 62], DType::F32),
            "argument 0: the stride 62 of dimension 0 is not a multiple of 4 elements, which \
             the kernel was compiled to assume",
        ),
        (
            TensorSpec::new(&[32, 64], DType::F32).strides(&[66, 1]),
            "argument 0: the stride 66 of dimension 0 is not a multiple of 4 elements, which \
             the kernel was compiled to assume",
        ),
        (
            TensorSpec::new(&[24, 64], DType::F32),
            "argument 0: the extent 24 of dimension 0 is not a multiple of 16, which the kernel \
             was compiled to assume",
        ),
        (
            TensorSpec::new(&[32, 64], DType::F32)
                .strides(&[-64, 1])
                .byte_offset(31 * 64 * 4),
            "argument 0: the stride -64 of dimension 0 is negative, which the kernel was \
             compiled to assume",
        ),
        (
            TensorSpec::new(&[32, 64], DType::F32).strides(&[16, 1]),
            "argument 0: two of its indices address the same element, which the kernel was \
             compiled to assume",
        ),
    ];
    for (spec, want) in cases {
        let (a, ca) = counted_tensor(&spec);
        let args: Vec<Arg<'_>> = vec![a.into()];
        let e = pack_args("k", &assumed(2), &args, 0).unwrap_err();
        assert!(matches!(e, Error::AssumptionBroken { index: 0, .. }), "{e}");
        assert_eq!(e.to_string(), want);
        drop(args);
        assert_eq!(ca.get(), 0);
    }
}

#[test]
fn unit_shape_assumption_is_checked() {
    let mut a = ArrayAssumptions::none();
    a.unit_shape = 0b01;
    let sig = Signature::new([array(2, IndexType::I64).assuming(a)]);
    let (ok, _) = counted_tensor(&TensorSpec::new(&[1, 8], DType::F32));
    assert!(pack_args("k", &sig, &[ok.into()], 0).is_ok());
    let (bad, cb) = counted_tensor(&TensorSpec::new(&[2, 8], DType::F32));
    let args: Vec<Arg<'_>> = vec![bad.into()];
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "argument 0: the extent 2 of dimension 0 is not 1, which the kernel was compiled to assume"
    );
    drop(args);
    assert_eq!(cb.get(), 0);
    assert_eq!(
        array(2, IndexType::I64).assuming(a).to_string(),
        "input array of float32 (ndim 2, index i64, with layout assumptions)"
    );
}
