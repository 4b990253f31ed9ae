//! Ownership and validation of an arbitrary DLPack export.
//!
//! The input becomes a real heap-allocated `DLManagedTensor` or `DLManagedTensorVersioned`
//! with a counting deleter (`tile_dlpack::testing::counted_raw`). Then, by the fuzzer's
//! choice of path:
//!
//! - `peek` (never panics; the result equals the `i128` reference model's), then `consume`,
//!   or the producer deletes the export (the deleter is never ours to run then);
//! - `consume` without a `peek`;
//! - dlpark's `Managed::from_raw` then `Used::from_managed_*` (a Rust producer's path).
//!
//! Invariants: the outcome (`Ok` view or the exact error) equals the reference model's; the
//! deleter has not run while we hold the tensor; it has run exactly once at the end, whatever
//! the path.

#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tile_dlpack::dlpark::Managed;
use tile_dlpack::testing::{DeleterCount, RawTensor, counted_raw};
use tile_dlpack::{DescriptorError, TensorView, Unused, Used};
use tile_fuzz::{Expected, Input, expect};

#[derive(Arbitrary, Debug)]
enum Path {
    PeekThenConsume { release: bool },
    PeekThenProducerDeletes,
    ConsumeOnly,
    FromManaged,
}

#[derive(Arbitrary, Debug)]
struct Case {
    input: Input,
    path: Path,
}

fn check_view(view: &TensorView<'_>, want: &Expected) {
    assert_eq!(view.ndim(), want.shape.len());
    assert_eq!(view.shape(), &want.shape[..]);
    assert_eq!(view.strides(), &want.strides[..]);
    assert_eq!(view.numel(), want.numel);
    assert_eq!(view.data_ptr(), want.data_ptr);
    let extent = view.byte_extent();
    assert_eq!((extent.start, extent.end), want.extent);
    assert_eq!(
        view.nbytes_spanned(),
        (i128::from(want.extent.1) - i128::from(want.extent.0)) as u64
    );
    assert_eq!(view.is_read_only(), want.read_only);
    assert_eq!(view.is_copied(), want.copied);
    assert_eq!(view.is_versioned(), want.versioned);
    assert!(view.dtype().is_supported());
    match view.check_writable() {
        Ok(()) => assert!(!want.read_only && !want.copied),
        Err(DescriptorError::ReadOnly) => assert!(want.read_only),
        Err(DescriptorError::Copied) => assert!(want.copied && !want.read_only),
        Err(DescriptorError::InternalOverlap { axis }) => {
            assert!(!want.read_only && !want.copied);
            assert!(axis < want.shape.len());
        }
        Err(other) => panic!("check_writable: unexpected {other:?}"),
    }
    let _ = view.is_contiguous();
    let _ = format!("{view:?} {} {}", view.device(), view.dtype());
}

fn check_outcome(
    got: Result<&TensorView<'_>, &DescriptorError>,
    want: &Result<Expected, DescriptorError>,
) {
    match (got, want) {
        (Ok(view), Ok(want)) => check_view(view, want),
        (Err(got), Err(want)) => {
            assert_eq!(got, want);
            let _ = got.to_string();
        }
        (got, want) => panic!("tile-dlpack says {got:?}, the reference model {want:?}"),
    }
}

fn check_used(
    used: Result<Used, DescriptorError>,
    want: &Result<Expected, DescriptorError>,
    count: &DeleterCount,
    release: bool,
) {
    match used {
        Ok(used) => {
            check_outcome(Ok(&used.view()), want);
            assert_eq!(count.get(), 0, "deleter ran while the tensor is ours");
            if release {
                let _released = used.release();
            } else {
                drop(used);
            }
        }
        Err(error) => check_outcome(Err(&error), want),
    }
    assert_eq!(
        count.get(),
        1,
        "deleter must run exactly once once consumed"
    );
}

fuzz_target!(|case: Case| {
    let spec = case.input.spec();
    let want = expect(&spec);
    let (raw, count) = counted_raw(&spec);
    match case.path {
        Path::PeekThenConsume { release } => {
            // SAFETY: a fresh export, consumed only through this `Unused`.
            let unused: Unused<'_> = unsafe { raw.unused() };
            check_outcome(unused.peek().as_ref(), &want);
            // A second peek returns the same (remembered) outcome.
            check_outcome(unused.peek().as_ref(), &want);
            assert_eq!(count.get(), 0, "peek must not release");
            check_used(unused.consume(), &want, &count, release);
        }
        Path::PeekThenProducerDeletes => {
            {
                // SAFETY: a fresh export; the `Unused` is gone before the producer deletes it.
                let unused: Unused<'_> = unsafe { raw.unused() };
                check_outcome(unused.peek().as_ref(), &want);
            }
            assert_eq!(count.get(), 0, "an unconsumed export is the producer's");
            // SAFETY: never consumed; this is its only deletion.
            unsafe { raw.delete() };
            assert_eq!(count.get(), 1);
        }
        Path::ConsumeOnly => {
            // SAFETY: a fresh export, consumed only through this `Unused`.
            let unused: Unused<'_> = unsafe { raw.unused() };
            check_used(unused.consume(), &want, &count, false);
        }
        Path::FromManaged => {
            let used = match raw {
                // SAFETY: a fresh export whose shape and strides stay readable until its
                // deleter runs; the deleter may be called once from any thread.
                RawTensor::Legacy(ptr) => match unsafe { Managed::from_raw(ptr) } {
                    Ok(managed) => Used::from_managed_legacy(managed),
                    Err(e) => panic!("legacy from_raw refused a non-null pointer: {e}"),
                },
                // SAFETY: as above.
                RawTensor::Versioned(ptr) => match unsafe { Managed::from_raw(ptr) } {
                    Ok(managed) => Used::from_managed_versioned(managed),
                    // dlpark released it (another major version).
                    Err(_) => {
                        assert!(matches!(
                            want,
                            Err(DescriptorError::UnsupportedVersion { .. })
                        ));
                        assert_eq!(count.get(), 1);
                        return;
                    }
                },
            };
            check_used(used, &want, &count, true);
        }
    }
});
