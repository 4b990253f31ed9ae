//! The launch path's argument checks, on the CPU: every check runs before anything is
//! consumed, so a refused launch leaves every producer's tensor unconsumed (deleter count 0)
//! and releases an already-owned tensor exactly once.

use tile_dlpack::dlpark::ffi::DLDataTypeCode;
use tile_dlpack::testing::{RawTensor, TensorSpec, counted_raw, counted_tensor};
use tile_dlpack::{DType, Device};
use tile_launch::{Arg, Error, Param, ScalarType, Signature, check_args};

fn add_signature() -> Signature {
    Signature::new([
        Param::input(DType::F32),
        Param::input(DType::F32),
        Param::output(DType::F32),
        Param::scalar(ScalarType::U32),
    ])
}

#[test]
fn valid_arguments_pass_and_consume_nothing() {
    let spec = TensorSpec::new(&[1024], DType::F32);
    let (a, ca) = counted_tensor(&spec);
    let (b, cb) = counted_tensor(&spec);
    let (c, cc) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 1024u32.into()];
    check_args("add", &add_signature(), &args, 0).unwrap();
    drop(args);
    // Checking only peeks: the producer still owns all three.
    assert_eq!((ca.get(), cb.get(), cc.get()), (0, 0, 0));
}

/// Sets the dtype code of a versioned export to one no table knows, as a producer that changed
/// its descriptor after handing it over would: a later validation would refuse it.
fn corrupt_dtype(raw: RawTensor) {
    let RawTensor::Versioned(ptr) = raw else {
        panic!("a versioned export")
    };
    // SAFETY: a live, unconsumed export; no reference into it is held across the write.
    unsafe { (*ptr).dl_tensor.dtype.code = DLDataTypeCode(200) };
}

#[test]
fn each_descriptor_is_validated_once_however_often_it_is_checked_and_read() {
    let spec = TensorSpec::new(&[1024], DType::F32);
    let raws = [(); 3].map(|()| counted_raw(&spec));
    // SAFETY: fresh exports, consumed below and deleted by nobody else.
    let [a, b, c] = raws.each_ref().map(|(raw, _)| unsafe { raw.unused() });
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 1024u32.into()];
    check_args("add", &add_signature(), &args, 0).unwrap();
    for (raw, _) in &raws {
        corrupt_dtype(*raw);
    }
    // A second check, the byte count the launch path reads, and consuming reuse the first
    // validation's finding: none reads the changed descriptor again.
    check_args("add", &add_signature(), &args, 0).unwrap();
    let mut used = Vec::new();
    for a in args {
        if let Arg::Tensor(t) = a {
            assert_eq!(t.queue_bytes(), 0);
            match t.into_source() {
                tile_launch::TensorSource::Unused(u) => used.push(u.consume().unwrap()),
                _ => unreachable!("made unused"),
            }
        }
    }
    assert!(used.iter().all(|u| u.view().dtype() == DType::F32));
    drop(used);
    assert!(raws.iter().all(|(_, deleted)| deleted.get() == 1));

    // Negative control: a descriptor changed before its first validation is refused.
    let (raw, deleted) = counted_raw(&spec);
    corrupt_dtype(raw);
    // SAFETY: as above.
    let args: Vec<Arg<'_>> = vec![unsafe { raw.unused() }.into()];
    let sig = Signature::new([Param::input(DType::F32)]);
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(matches!(e, Error::Descriptor { index: 0, .. }), "{e:?}");
    drop(args);
    assert_eq!(deleted.get(), 0);
    // SAFETY: never consumed; this is its only deletion.
    unsafe { raw.delete() };
    assert_eq!(deleted.get(), 1);
}

#[test]
fn wrong_count_names_both_numbers() {
    let (a, ca) = counted_tensor(&TensorSpec::new(&[4], DType::F32));
    let args: Vec<Arg<'_>> = vec![a.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ArgumentCount {
                expected: 4,
                got: 1,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "kernel `add` expects 4 arguments but 1 were given"
    );
    drop(args);
    assert_eq!(ca.get(), 0);
}

#[test]
fn dtype_mismatch_names_index_and_both_dtypes() {
    let (a, ca) = counted_tensor(&TensorSpec::new(&[4], DType::F32));
    let (b, cb) = counted_tensor(&TensorSpec::new(&[4], DType::BF16));
    let (c, cc) = counted_tensor(&TensorSpec::new(&[4], DType::F32));
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DtypeMismatch {
                index: 1,
                expected: DType::F32,
                got: DType::BF16
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("argument 1"), "{e}");
    assert!(e.to_string().contains("bfloat16"), "{e}");
    drop(args);
    assert_eq!((ca.get(), cb.get(), cc.get()), (0, 0, 0));
}

#[test]
fn read_only_output_is_refused_before_consuming() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, ca) = counted_tensor(&spec);
    let (b, cb) = counted_tensor(&spec);
    let (c, cc) = counted_tensor(&spec.clone().read_only());
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Descriptor {
                index: 2,
                source: tile_dlpack::DescriptorError::ReadOnly
            }
        ),
        "{e}"
    );
    drop(args);
    assert_eq!((ca.get(), cb.get(), cc.get()), (0, 0, 0));
}

#[test]
fn read_only_input_is_accepted() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, _) = counted_tensor(&spec.clone().read_only());
    let (b, _) = counted_tensor(&spec);
    let (c, _) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    check_args("add", &add_signature(), &args, 0).unwrap();
}

#[test]
fn broadcast_output_is_refused() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, _) = counted_tensor(&spec);
    let (b, _) = counted_tensor(&spec);
    let (c, cc) = counted_tensor(&spec.clone().strides(&[0]));
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Descriptor {
                index: 2,
                source: tile_dlpack::DescriptorError::InternalOverlap { .. }
            }
        ),
        "{e}"
    );
    drop(args);
    assert_eq!(cc.get(), 0);
}

#[test]
fn tensor_on_another_device_is_refused() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, _) = counted_tensor(&spec.clone().device(Device::cuda(1)));
    let (b, _) = counted_tensor(&spec);
    let (c, _) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DeviceMismatch {
                index: 0,
                stream_device: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("cuda:1"), "{e}");
}

#[test]
fn host_tensor_is_refused() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, ca) = counted_tensor(&spec.clone().device(Device::CPU));
    let (b, _) = counted_tensor(&spec);
    let (c, _) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { index: 0, .. }), "{e}");
    drop(args);
    assert_eq!(ca.get(), 0);
}

#[test]
fn scalar_out_of_range_is_refused() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, _) = counted_tensor(&spec);
    let (b, _) = counted_tensor(&spec);
    let (c, _) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), (1u64 << 32).into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(matches!(e, Error::ArgumentKind { index: 3, .. }), "{e}");
    assert!(e.to_string().contains("4294967296"), "{e}");
}

#[test]
fn float_beyond_f32_range_is_refused_for_an_f32_parameter() {
    let sig = Signature::new([Param::scalar(ScalarType::F32)]);
    // f32::MAX plus half its last step (2^103) is where rounding gives an infinity.
    let halfway = f64::from(f32::MAX) + 2f64.powi(103);
    for x in [
        1e300,
        -1e39,
        3.5e38,
        f64::MAX,
        halfway,
        -halfway,
        3.4028236e38,
    ] {
        let e = check_args("k", &sig, &[x.into()], 0).unwrap_err();
        assert!(
            matches!(e, Error::ArgumentKind { index: 0, .. }),
            "{x}: {e}"
        );
        assert!(e.to_string().contains("out of range"), "{e}");
    }
    // In range (rounded), the largest finite f32, values that round to it (as NumPy's float32
    // rounds them: the literal 3.4028235e38 is a double just above f32::MAX), and the
    // non-finite values are passed on.
    let below_halfway = f64::from_bits(halfway.to_bits() - 1);
    for x in [
        1.5,
        f64::from(f32::MAX),
        -f64::from(f32::MAX),
        3.4028235e38,
        below_halfway,
        -below_halfway,
        1e-50,
        f64::INFINITY,
        f64::NAN,
    ] {
        check_args("k", &sig, &[x.into()], 0).unwrap();
    }
    // An f64 parameter takes any f64.
    let sig = Signature::new([Param::scalar(ScalarType::F64)]);
    check_args("k", &sig, &[f64::MAX.into()], 0).unwrap();
}

#[test]
fn tensor_for_scalar_and_scalar_for_tensor_are_refused() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, _) = counted_tensor(&spec);
    let (b, _) = counted_tensor(&spec);
    let (c, _) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![1.5f32.into(), a.into(), b.into(), c.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(matches!(e, Error::ArgumentKind { index: 0, .. }), "{e}");
}

#[test]
fn malformed_descriptor_is_refused_with_its_index() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, ca) = counted_tensor(&spec);
    let (b, cb) = counted_tensor(&spec.clone().data(0));
    let (c, _) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Descriptor {
                index: 1,
                source: tile_dlpack::DescriptorError::NullData { numel: 4 }
            }
        ),
        "{e}"
    );
    drop(args);
    assert_eq!((ca.get(), cb.get()), (0, 0));
}

#[test]
fn owned_tensor_is_released_once_when_the_launch_is_refused() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let (a, ca) = counted_tensor(&spec);
    let used = a.consume().unwrap();
    let (b, cb) = counted_tensor(&TensorSpec::new(&[4], DType::I32));
    let args: Vec<Arg<'_>> = vec![used.into(), b.into()];
    let sig = Signature::new([Param::input(DType::F32), Param::input(DType::F32)]);
    let e = check_args("k", &sig, &args, 0).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { index: 1, .. }), "{e}");
    drop(args);
    // We owned argument 0 (nothing was launched): released exactly once; argument 1 never
    // consumed.
    assert_eq!((ca.get(), cb.get()), (1, 0));
}

fn h200_like_limits() -> tile_launch::DeviceLimits {
    let mut l = tile_launch::DeviceLimits::default();
    l.max_block = [1024, 1024, 64];
    l.max_threads_per_block = 1024;
    l.max_grid = [2_147_483_647, 65535, 65535];
    l.max_shared_mem_per_block = 49152;
    l.max_shared_mem_per_block_optin = 232_448;
    l.cluster_launch = true;
    l.cooperative_launch = true;
    l.compute_capability = (9, 0);
    l.multiprocessor_count = 132;
    l.max_blocks_per_multiprocessor = 32;
    l
}

#[test]
fn launch_config_limits_name_the_value_and_the_limit() {
    use tile_launch::{Dim3, LaunchConfig};
    let l = h200_like_limits();
    LaunchConfig::new((65535, 65535), (32, 32))
        .validate(&l)
        .unwrap();
    let cases: [(LaunchConfig, &str); 5] = [
        (
            LaunchConfig::new(0, 1),
            "grid.x is 0; it must be at least 1",
        ),
        (
            LaunchConfig::new((1, 65536), 1),
            "grid.y is 65536, limit 65535",
        ),
        (LaunchConfig::new(1, 1025), "block.x is 1025, limit 1024"),
        (
            LaunchConfig::new(1, (64, 32)),
            "block size (x*y*z) is 2048, limit 1024",
        ),
        (
            LaunchConfig {
                shared_mem_bytes: 232_449,
                ..LaunchConfig::new(1, 1)
            },
            "shared_mem_bytes (the device's opt-in limit per block) is 232449, limit 232448",
        ),
    ];
    for (cfg, want) in cases {
        let e = cfg.validate(&l).unwrap_err();
        assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
        assert!(e.to_string().contains(want), "{e} (wanted {want})");
    }
    let cluster = LaunchConfig {
        cluster: Some(Dim3::new(2, 1, 1)),
        ..LaunchConfig::new(15, 128)
    };
    let e = cluster.validate(&l).unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("grid.x = 15 is not a multiple of cluster.x = 2"),
        "{e}"
    );
    let too_big = LaunchConfig {
        cluster: Some(Dim3::new(16, 1, 1)),
        ..LaunchConfig::new(32, 128)
    };
    assert!(
        too_big
            .validate(&l)
            .unwrap_err()
            .to_string()
            .contains("cluster size")
    );
    let mut no_coop = l;
    no_coop.cooperative_launch = false;
    let coop = LaunchConfig {
        cooperative: true,
        ..LaunchConfig::new(1, 1)
    };
    assert!(coop.validate(&no_coop).is_err());
    coop.validate(&l).unwrap();
}

#[test]
fn shared_memory_above_the_default_limit_is_accepted_up_to_the_opt_in_limit() {
    use tile_launch::LaunchConfig;
    let l = h200_like_limits();
    for bytes in [49_153, 100_000, 232_448] {
        LaunchConfig {
            shared_mem_bytes: bytes,
            ..LaunchConfig::new(1, 1)
        }
        .validate(&l)
        .unwrap();
    }
}

#[test]
fn cooperative_grid_is_bounded_by_resident_blocks() {
    use tile_launch::LaunchConfig;
    let l = h200_like_limits();
    // 32 blocks per SM x 132 SMs.
    LaunchConfig {
        cooperative: true,
        ..LaunchConfig::new(4224, 32)
    }
    .validate(&l)
    .unwrap();
    let e = LaunchConfig {
        cooperative: true,
        ..LaunchConfig::new((4225, 1), 32)
    }
    .validate(&l)
    .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(text.contains("cooperative launch"), "{text}");
    assert!(text.contains("is 4225, limit 4224"), "{text}");
    // Unknown SM count: no kernel-independent bound (the occupancy check at launch remains).
    let mut unknown = l;
    unknown.multiprocessor_count = 0;
    LaunchConfig {
        cooperative: true,
        ..LaunchConfig::new(1 << 20, 32)
    }
    .validate(&unknown)
    .unwrap();
}

#[test]
fn programmatic_dependent_launch_needs_compute_capability_9() {
    use tile_launch::LaunchConfig;
    let pdl = LaunchConfig {
        programmatic_dependent_launch: true,
        ..LaunchConfig::new(1, 1)
    };
    pdl.validate(&h200_like_limits()).unwrap();
    let mut ampere = h200_like_limits();
    ampere.compute_capability = (8, 0);
    let e = pdl.validate(&ampere).unwrap_err();
    assert!(
        e.to_string()
            .contains("programmatic_dependent_launch (needs compute capability 9.0"),
        "{e}"
    );
    assert!(e.to_string().contains("is 8; it must be at least 9"), "{e}");
}

#[test]
fn cluster_limits_name_the_value_and_the_limit() {
    use tile_launch::{Dim3, LaunchConfig};
    let l = h200_like_limits();
    LaunchConfig {
        cluster: Some(Dim3::new(2, 2, 2)),
        ..LaunchConfig::new((4, 4, 2), 64)
    }
    .validate(&l)
    .unwrap();
    let e = LaunchConfig {
        cluster: Some(Dim3::new(4, 4, 1)),
        ..LaunchConfig::new((8, 8), 64)
    }
    .validate(&l)
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("cluster size (x*y*z, portable limit) is 16, limit 8"),
        "{e}"
    );
    let mut no_cluster = l;
    no_cluster.cluster_launch = false;
    let e = LaunchConfig {
        cluster: Some(Dim3::new(2, 1, 1)),
        ..LaunchConfig::new(2, 64)
    }
    .validate(&no_cluster)
    .unwrap_err();
    assert!(
        e.to_string().contains("device has no cluster launch"),
        "{e}"
    );
}

#[test]
fn pointer_device_mismatch_names_both_devices() {
    let e = Error::PointerDeviceMismatch {
        index: 2,
        tensor: tile_dlpack::Device::cuda(0),
        pointer_device: 1,
        stream_device: 0,
    };
    let text = e.to_string();
    assert!(text.starts_with("argument 2:"), "{text}");
    assert!(text.contains("cuda:1") && text.contains("cuda:0"), "{text}");
}

#[test]
fn copied_output_is_refused_before_consuming_and_copied_input_accepted() {
    let spec = TensorSpec::new(&[4], DType::F32);
    let copied = spec
        .clone()
        .flags(tile_dlpack::dlpark::DlpackFlags::IS_COPIED.bits());
    let (a, ca) = counted_tensor(&copied);
    let (b, cb) = counted_tensor(&spec);
    let (c, cc) = counted_tensor(&copied);
    let args: Vec<Arg<'_>> = vec![a.into(), b.into(), c.into(), 4u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Descriptor {
                index: 2,
                source: tile_dlpack::DescriptorError::Copied
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("IS_COPIED"), "{e}");
    drop(args);
    assert_eq!((ca.get(), cb.get(), cc.get()), (0, 0, 0));
}

#[test]
fn non_contiguous_tensor_is_refused_for_a_plain_pointer_and_accepted_when_strided() {
    // A transposed 64 x 64 view: strides (1, 64) in elements.
    let t = TensorSpec::new(&[64, 64], DType::F32).strides(&[1, 64]);
    for (index, sig) in [
        (
            0,
            Signature::new([Param::input(DType::F32), Param::output(DType::F32)]),
        ),
        (
            1,
            Signature::new([Param::input(DType::F32).strided(), Param::inout(DType::F32)]),
        ),
    ] {
        let (a, ca) = counted_tensor(&t);
        let (b, cb) = counted_tensor(&t);
        let args: Vec<Arg<'_>> = vec![a.into(), b.into()];
        let e = check_args("k", &sig, &args, 0).unwrap_err();
        match &e {
            Error::NotContiguous {
                index: i,
                shape,
                strides,
            } => {
                assert_eq!(
                    (*i, shape.as_slice(), strides.as_slice()),
                    (index, &[64i64, 64][..], &[1i64, 64][..])
                );
            }
            other => panic!("expected NotContiguous, got {other}"),
        }
        assert!(e.to_string().contains("strides [1, 64]"), "{e}");
        drop(args);
        assert_eq!((ca.get(), cb.get()), (0, 0));
    }
    let sig = Signature::new([
        Param::input(DType::F32).strided(),
        Param::output(DType::F32).strided(),
    ]);
    let (a, _) = counted_tensor(&t);
    let (b, _) = counted_tensor(&t);
    check_args("k", &sig, &[a.into(), b.into()], 0).unwrap();
    // Dimensions of size 1 and empty tensors count as dense whatever their strides.
    let ones = TensorSpec::new(&[1, 8], DType::F32).strides(&[999, 1]);
    let empty = TensorSpec::new(&[0, 8], DType::F32).strides(&[1, 5]);
    let (a, _) = counted_tensor(&ones);
    let (b, _) = counted_tensor(&empty);
    let sig = Signature::new([Param::input(DType::F32), Param::output(DType::F32)]);
    check_args("k", &sig, &[a.into(), b.into()], 0).unwrap();
    assert_eq!(
        Param::input(DType::F32).strided().to_string(),
        "input strided tensor of float32"
    );
    assert_eq!(
        Param::scalar(ScalarType::U32).strided(),
        Param::scalar(ScalarType::U32)
    );
}

#[test]
fn a_borrowed_tensor_is_checked_like_any_other_and_never_held_or_released() {
    use tile_launch::TensorArg;
    const IS_COPIED: u64 = 1 << 1; // DLPACK_FLAG_BITMASK_IS_COPIED
    // Copied inputs (an output may not be a copy).
    let spec = TensorSpec::new(&[1024], DType::F32);
    let copied = TensorSpec::new(&[1024], DType::F32).flags(IS_COPIED);
    let (a, ca) = counted_tensor(&copied);
    let (b, cb) = counted_tensor(&copied);
    let (c, cc) = counted_tensor(&spec);
    // SAFETY: the descriptors' data is never dereferenced (no launch), and each outlives the
    // check.
    let lend = |u| Arg::Tensor(unsafe { TensorArg::borrowed(u) });
    let args: Vec<Arg<'_>> = vec![lend(a), lend(b), lend(c), 1024u32.into()];
    for a in &args[..2] {
        let Arg::Tensor(t) = a else { unreachable!() };
        // A copied export held by the launch would count its bytes; a borrowed one is never
        // queued, so it costs the queue nothing.
        assert_eq!(t.queue_bytes(), 0);
    }
    let values = tile_launch::pack_args("add", &add_signature(), &args, 0).unwrap();
    assert_eq!(values.len(), 4);
    assert_eq!(values[3], 1024);
    drop(args);
    assert_eq!(
        (ca.get(), cb.get(), cc.get()),
        (0, 0, 0),
        "a borrowed tensor's deleter ran"
    );

    // Refused for the same reasons as a consumed tensor, naming the argument.
    let wrong = TensorSpec::new(&[1024], DType::F16);
    let (a, _ca) = counted_tensor(&spec);
    let (b, cb) = counted_tensor(&wrong);
    let (c, _cc) = counted_tensor(&spec);
    let args: Vec<Arg<'_>> = vec![lend(a), lend(b), lend(c), 1024u32.into()];
    let e = check_args("add", &add_signature(), &args, 0).unwrap_err();
    assert!(matches!(e, Error::DtypeMismatch { index: 1, .. }), "{e}");
    drop(args);
    assert_eq!(cb.get(), 0);
}
