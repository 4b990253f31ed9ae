//! Who runs the deleter, and how often.

use dlpark::Managed;

use crate::testing::{RawTensor, TensorSpec, counted_raw, counted_tensor};
use crate::{DType, DescriptorError, Released, Unused, Used};

fn spec() -> TensorSpec {
    TensorSpec::new(&[2, 3], DType::F32)
}

#[test]
fn release_runs_the_deleter_exactly_once() {
    let (unused, deleted) = counted_tensor(&spec());
    let used = unused.consume().unwrap();
    assert_eq!(deleted.get(), 0);
    let _released: Released = used.release();
    assert_eq!(deleted.get(), 1);
}

#[test]
fn dropping_used_runs_the_deleter_once() {
    let (unused, deleted) = counted_tensor(&spec().legacy());
    let used = unused.consume().unwrap();
    assert_eq!(deleted.get(), 0);
    drop(used);
    assert_eq!(deleted.get(), 1);
}

#[test]
fn forgetting_used_never_runs_the_deleter() {
    // Explicit strides: the forgotten `Used` then owns no allocation of its own to leak.
    let (raw, deleted) = counted_raw(&spec().strides(&[3, 1]));
    // SAFETY: fresh export; deleted below only once the `Used` is forgotten.
    let used = unsafe { raw.unused() }.consume().unwrap();
    std::mem::forget(used);
    assert_eq!(deleted.get(), 0);
    // The forgotten tensor is leaked, never freed early. Let the producer reclaim it so the
    // test itself does not leak: nothing else can run its deleter any more.
    // SAFETY: the only `Used` was forgotten; this is the only deletion.
    unsafe { raw.delete() };
    assert_eq!(deleted.get(), 1);
}

#[test]
fn dropping_unused_never_runs_the_deleter() {
    let (raw, deleted) = counted_raw(&spec());
    // SAFETY: fresh export, deleted below after the `Unused` is gone.
    let unused = unsafe { raw.unused() };
    assert_eq!(unused.peek().unwrap().shape(), &[2, 3]);
    drop(unused);
    assert_eq!(deleted.get(), 0);
    // SAFETY: never consumed; the only deletion.
    unsafe { raw.delete() };
    assert_eq!(deleted.get(), 1);
}

#[test]
fn peek_then_consume_gives_the_same_view() {
    let (unused, deleted) = counted_tensor(&spec().strides(&[1, 2]).byte_offset(16));
    let (shape, strides, data_ptr, extent) = {
        let view = unused.peek().unwrap();
        (
            view.shape().to_vec(),
            view.strides().to_vec(),
            view.data_ptr(),
            view.byte_extent(),
        )
    };
    // Peeking twice is fine and changes nothing.
    assert_eq!(unused.peek().unwrap().data_ptr(), data_ptr);
    let used = unused.consume().unwrap();
    let view = used.view();
    assert_eq!(view.shape(), shape);
    assert_eq!(view.strides(), strides);
    assert_eq!(view.data_ptr(), data_ptr);
    assert_eq!(view.byte_extent(), extent);
    drop(used);
    assert_eq!(deleted.get(), 1);
}

/// Sets the dtype code of a versioned export to one no table knows, as a producer that
/// changed its descriptor after handing it over would.
fn corrupt_dtype(raw: RawTensor) {
    let RawTensor::Versioned(ptr) = raw else {
        panic!("a versioned export")
    };
    // SAFETY: a live export of `counted_raw`; no reference into it is held across the write.
    unsafe { (*ptr).dl_tensor.dtype.code = dlpark::ffi::DLDataTypeCode(200) };
}

/// A descriptor is validated once: consuming a peeked tensor uses what the peek found, so a
/// descriptor changed since is not read again (a second validation would refuse it).
#[test]
fn consume_after_peek_does_not_validate_again() {
    let (raw, deleted) = counted_raw(&spec());
    // SAFETY: fresh, consumed below, deleted by nobody else.
    let unused = unsafe { raw.unused() };
    assert_eq!(unused.peek().unwrap().dtype(), DType::F32);
    corrupt_dtype(raw);
    let used = unused.consume().unwrap();
    assert_eq!(used.view().dtype(), DType::F32);
    drop(used);
    assert_eq!(deleted.get(), 1);

    // Negative control: without the peek, consuming validates, and refuses the change.
    let (raw, deleted) = counted_raw(&spec());
    corrupt_dtype(raw);
    // SAFETY: as above.
    let refused = unsafe { raw.unused() }.consume().unwrap_err();
    assert!(
        matches!(refused, DescriptorError::UnsupportedDtype { .. }),
        "{refused:?}"
    );
    assert_eq!(deleted.get(), 1);
}

#[test]
fn computed_strides_survive_the_move_into_used() {
    let (unused, deleted) = counted_tensor(&TensorSpec::new(&[4, 5, 6], DType::U8));
    assert_eq!(unused.peek().unwrap().strides(), &[30, 6, 1]);
    let used = unused.consume().unwrap();
    let moved = Box::new(used);
    assert_eq!(moved.view().strides(), &[30, 6, 1]);
    drop(moved);
    assert_eq!(deleted.get(), 1);
}

#[test]
fn version_is_reported_before_consuming() {
    let (raw, deleted) = counted_raw(&spec().version(1, 1));
    // SAFETY: fresh export, deleted below after the `Unused` is gone.
    let unused = unsafe { raw.unused() };
    assert!(unused.is_versioned());
    assert_eq!(unused.version(), Some((1, 1)));
    drop(unused);
    // SAFETY: never consumed; the only deletion.
    unsafe { raw.delete() };
    assert_eq!(deleted.get(), 1);
}

#[test]
fn used_is_send_and_sync_and_releases_on_another_thread() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Used>();
    send_sync::<Released>();

    let (unused, deleted) = counted_tensor(&spec());
    let used = unused.consume().unwrap();
    let _released = std::thread::spawn(move || used.release()).join().unwrap();
    assert_eq!(deleted.get(), 1);
}

fn managed_legacy(
    spec: &TensorSpec,
) -> (
    Managed<crate::ffi::DLManagedTensor>,
    crate::testing::DeleterCount,
) {
    let (raw, deleted) = counted_raw(&spec.clone().legacy());
    let RawTensor::Legacy(ptr) = raw else {
        unreachable!("legacy spec")
    };
    // SAFETY: a fresh export handed to exactly one owner.
    (unsafe { Managed::from_raw(ptr) }.unwrap(), deleted)
}

fn managed_versioned(
    spec: &TensorSpec,
) -> (
    Managed<crate::ffi::DLManagedTensorVersioned>,
    crate::testing::DeleterCount,
) {
    let (raw, deleted) = counted_raw(spec);
    let RawTensor::Versioned(ptr) = raw else {
        unreachable!("versioned spec")
    };
    // SAFETY: a fresh export handed to exactly one owner.
    (unsafe { Managed::from_raw(ptr) }.unwrap(), deleted)
}

#[test]
fn from_managed_legacy() {
    let (managed, deleted) = managed_legacy(&spec());
    let used = Used::from_managed_legacy(managed).unwrap();
    assert_eq!(used.view().shape(), &[2, 3]);
    assert!(!used.view().is_versioned());
    let _released = used.release();
    assert_eq!(deleted.get(), 1);
}

#[test]
fn from_managed_versioned() {
    let (managed, deleted) = managed_versioned(&spec().read_only());
    let used = Used::from_managed_versioned(managed).unwrap();
    assert!(used.view().is_read_only());
    assert!(used.view().is_versioned());
    drop(used);
    assert_eq!(deleted.get(), 1);
}

#[test]
fn from_managed_rejects_and_deletes_once() {
    let (managed, deleted) = managed_legacy(&spec().data(0));
    assert_eq!(
        Used::from_managed_legacy(managed).unwrap_err(),
        DescriptorError::NullData { numel: 6 }
    );
    assert_eq!(deleted.get(), 1);

    let (managed, deleted) = managed_versioned(&spec().ndim(70));
    assert_eq!(
        Used::from_managed_versioned(managed).unwrap_err(),
        DescriptorError::NdimOutOfRange {
            ndim: 70,
            limit: 64
        }
    );
    assert_eq!(deleted.get(), 1);
}

#[test]
fn dlpark_refuses_other_major_versions_and_deletes_once() {
    // `Managed::from_raw` is where a Rust producer's tensor comes in; it already applies row
    // 3, so `from_managed_versioned` never sees another major version from it.
    let (raw, deleted) = counted_raw(&spec().version(2, 0));
    let RawTensor::Versioned(ptr) = raw else {
        unreachable!("versioned spec")
    };
    // SAFETY: a fresh export handed to exactly one owner.
    assert!(unsafe { Managed::from_raw(ptr) }.is_err());
    assert_eq!(deleted.get(), 1);
}

#[test]
fn debug_output() {
    let (unused, deleted) = counted_tensor(&spec());
    assert!(format!("{unused:?}").starts_with("Unused"));
    let used = unused.consume().unwrap();
    assert!(format!("{used:?}").starts_with("Used(TensorView"));
    let released = used.release();
    assert_eq!(format!("{released:?}"), "Released { _private: () }");
    assert_eq!(deleted.get(), 1);
}

#[test]
fn a_deleter_that_ran_twice_would_be_counted() {
    // The counting helper itself: a second deleter call shows up as 2, so "exactly once"
    // assertions can fail rather than corrupt memory.
    let (raw, deleted) = counted_raw(&spec());
    // SAFETY: the helper tolerates a second deletion while `deleted` is alive; this checks it.
    unsafe {
        raw.delete();
        raw.delete();
    }
    assert_eq!(deleted.get(), 2);
}

/// A legacy descriptor of a 1-d tensor on the caller's stack, with no deleter (its producer
/// keeps ownership), over `shape`.
fn on_stack(shape: &[i64; 1], device: crate::Device, dtype: DType) -> crate::ffi::DLManagedTensor {
    crate::ffi::DLManagedTensor {
        dl_tensor: crate::ffi::DLTensor {
            data: std::ptr::without_provenance_mut(0x1000),
            device: device.into(),
            ndim: 1,
            dtype: dtype.into(),
            shape: shape.as_ptr().cast_mut(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        },
        manager_ctx: std::ptr::null_mut(),
        deleter: None,
    }
}

#[test]
fn unused_is_borrowed_for_its_lifetime() {
    // An `Unused` made from a descriptor on the stack cannot outlive it (the lifetime is the
    // caller's promise); here it is only peeked at and never consumed.
    let shape = [3i64];
    let mut managed = on_stack(&shape, crate::Device::cuda(1), DType::I32);
    // SAFETY: `managed` and `shape` outlive the `Unused`, which is never consumed.
    let unused: Unused<'_> = unsafe { Unused::from_legacy(&mut managed) };
    let view = unused.peek().unwrap();
    assert_eq!(view.shape(), &[3]);
    assert_eq!(view.device(), crate::Device::cuda(1));
}

#[test]
fn null_deleter_means_nothing_to_run() {
    // A producer that keeps ownership exports a null deleter; consuming and releasing it
    // runs nothing and frees nothing.
    let shape = [2i64];
    let mut managed = on_stack(&shape, crate::Device::cuda(0), DType::F32);
    // SAFETY: `managed` and `shape` outlive the `Used`, released below; the deleter is null.
    let used = unsafe { Unused::from_legacy(&mut managed) }
        .consume()
        .unwrap();
    assert_eq!(used.view().numel(), 2);
    let _released = used.release();
    assert_eq!(managed.dl_tensor.ndim, 1);
}
