//! Tests through the public API, on hand-built descriptors (`crate::testing`).

mod bad_input;
mod good_input;
mod ownership;
mod properties;

use crate::testing::{TensorSpec, counted_raw};
use crate::{DescriptorError, Used};

/// Peeks at `spec`: returns the error, after checking that neither peeking nor dropping the
/// `Unused` ran the deleter (the producer's destructor then does, once).
fn peek_error(spec: &TensorSpec) -> DescriptorError {
    let (raw, deleted) = counted_raw(spec);
    // SAFETY: fresh export, deleted below only after the `Unused` is gone.
    let unused = unsafe { raw.unused() };
    let error = unused
        .peek()
        .expect_err("peek should reject the descriptor");
    drop(unused);
    assert_eq!(
        deleted.get(),
        0,
        "peek or dropping an Unused ran the deleter"
    );
    // SAFETY: never consumed; this is its only deletion.
    unsafe { raw.delete() };
    assert_eq!(deleted.get(), 1);
    error
}

/// Consumes `spec`: returns the error, after checking that the deleter ran exactly once.
fn consume_error(spec: &TensorSpec) -> DescriptorError {
    let (unused, deleted) = crate::testing::counted_tensor(spec);
    let error = unused
        .consume()
        .expect_err("consume should reject the descriptor");
    assert_eq!(
        deleted.get(),
        1,
        "a rejected consume must run the deleter exactly once"
    );
    error
}

/// Both `peek` and `consume` reject `spec` with exactly `expected`, with the right deleter
/// counts.
#[track_caller]
fn assert_rejected(spec: &TensorSpec, expected: DescriptorError) {
    assert_eq!(peek_error(spec), expected, "peek");
    assert_eq!(consume_error(spec), expected, "consume");
}

/// Consumes `spec`, which must be valid, and runs `check` on the result; then checks that
/// the deleter ran once, when the `Used` was dropped.
#[track_caller]
fn with_used(spec: &TensorSpec, check: impl FnOnce(&Used)) {
    let (unused, deleted) = crate::testing::counted_tensor(spec);
    let used = unused
        .consume()
        .expect("consume should accept the descriptor");
    check(&used);
    assert_eq!(deleted.get(), 0);
    drop(used);
    assert_eq!(deleted.get(), 1);
}
