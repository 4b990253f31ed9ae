//! Holding what a launcher's work uses: DLPack tensors whose deleter tile takes over
//! ([`tile_hold_dlpack`], [`tile_hold_dlpack_legacy`]) and any other owner
//! ([`tile_hold_owner`]), through `tile_launch::Stream::hold`.

use std::ffi::c_void;

use tile_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use tile_dlpack::{Unused, Used};
use tile_launch::Guard;

use crate::status::{Failure, boundary, tile_status};
use crate::stream::{stream_ref, tile_stream};

/// Takes `tensor` over if its descriptor is valid; otherwise leaves it with the caller
/// ([`TILE_ERROR_INVALID_ARGUMENT`](tile_status::TILE_ERROR_INVALID_ARGUMENT)). `peek`
/// validates without taking over, so an invalid tensor's deleter is not run while the work
/// that uses it may still be running.
fn take_over(tensor: Unused<'_>) -> Result<Used, Failure> {
    if let Err(e) = tensor.peek() {
        return Err(Failure::new(
            tile_status::TILE_ERROR_INVALID_ARGUMENT,
            format!("the DLPack tensor was not taken over: {e}"),
        ));
    }
    // Validated above (remembered by the `Unused`): consuming cannot fail any more.
    tensor.consume().map_err(|e| {
        Failure::new(
            tile_status::TILE_ERROR_INTERNAL,
            format!("a DLPack tensor that passed validation could not be consumed: {e}"),
        )
    })
}

/// Holds the tensor `tensor` checked to be non-null: `wrap` makes the `Unused` of it.
fn hold_tensor(
    stream: *const tile_stream,
    null: bool,
    wrap: impl FnOnce() -> Unused<'static>,
) -> tile_status {
    boundary(|| {
        // SAFETY: the calling entry point's contract: NULL or a live handle.
        let stream = unsafe { stream_ref(stream) }?;
        if null {
            return Err(Failure::null("tensor"));
        }
        // Under the stream's read lock from before the take-over to after the hold: a
        // detached stream takes nothing over, and `tile_shutdown` waits for this hold.
        stream.with(|s| {
            let used = take_over(wrap())?;
            Ok(s.hold([Guard::from(used)])?)
        })
    })
}

/// Hands a `DLManagedTensorVersioned` to tile instead of calling its deleter: tile calls the
/// deleter once, after all the work enqueued on `stream` up to this call has completed (found
/// by a later hold, `tile_stream_poll`, `tile_stream_synchronize`, `tile_stream_release` or
/// `tile_shutdown`, on whichever thread makes that call). Under a CUDA graph capture the graph
/// owns the tensor instead, and its deleter runs once the graph, its clones and executable
/// graphs are destroyed (on a thread of tile's). A NULL deleter is fine (nothing is called).
///
/// Call it right after enqueuing the work that uses the tensor (`cuLaunchKernel`), where a
/// launcher would otherwise call the deleter. It does not block, except where the release
/// queue is over its bounds (bytes of copied exports, count of pending holds): then it first
/// waits for earlier work, as a tile launch does.
///
/// Returns:
/// - `TILE_OK`: the tensor is tile's.
/// - `TILE_ERROR_INVALID_ARGUMENT`: `stream` or `tensor` is NULL, or the descriptor is invalid
///   (a major version other than 1, a negative dimension, ...; the message says what). The
///   tensor was **not** taken over: it is still the caller's, who must keep it until the
///   work completes (`tile_stream_synchronize`) and then call its deleter.
/// - `TILE_ERROR_SHUT_DOWN`: the stream was detached; the tensor was not taken over.
/// - `TILE_ERROR_CUDA`: a driver call failed (reading the capture status, recording the
///   completion marker); the tensor was taken over and is leaked, never released early.
///
/// Thread-safe: any number of threads may hold on the same stream at once.
///
/// # Safety
///
/// `stream` is NULL or a live handle from `tile_stream_borrow`. A non-null `tensor` is a live
/// `DLManagedTensorVersioned` that nobody else consumes or deletes from this call on (a
/// capsule holding it is marked consumed: renamed `"used_dltensor_versioned"`), whose
/// descriptor, shape and strides stay valid and unchanged until its deleter runs, and whose
/// deleter may be called once from any thread (including a thread of tile's, for a graph),
/// calls neither `tile_shutdown` nor a tile function on the same stream, and does not unwind
/// (no C++ exception, no `longjmp`). Only the version, manager context, deleter and flags are read before the
/// major version is known to be 1.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_hold_dlpack(
    stream: *const tile_stream,
    tensor: *mut DLManagedTensorVersioned,
) -> tile_status {
    hold_tensor(stream, tensor.is_null(), || {
        // SAFETY: this function's contract: a live tensor that only tile consumes from here
        // on, valid until its deleter runs (so for `'static` as far as the `Unused` goes:
        // only consuming it, here, leads to the deleter).
        unsafe { Unused::from_versioned(tensor) }
    })
}

/// As `tile_hold_dlpack`, for a legacy (unversioned) `DLManagedTensor` (a capsule named
/// `"dltensor"`, renamed `"used_dltensor"` when consumed).
///
/// # Safety
///
/// As for `tile_hold_dlpack`, for a `DLManagedTensor`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_hold_dlpack_legacy(
    stream: *const tile_stream,
    tensor: *mut DLManagedTensor,
) -> tile_status {
    hold_tensor(stream, tensor.is_null(), || {
        // SAFETY: as in `tile_hold_dlpack`, for a legacy tensor.
        unsafe { Unused::from_legacy(tensor) }
    })
}

/// An owner handed over from C: `release(data)` is called once, when dropped.
struct ForeignOwner {
    data: *mut c_void,
    release: unsafe extern "C" fn(*mut c_void),
}

// SAFETY: `tile_hold_owner`'s contract: `release(data)` may be called from any thread, and
// nothing else touches `data` through this value.
unsafe impl Send for ForeignOwner {}

impl Drop for ForeignOwner {
    fn drop(&mut self) {
        // SAFETY: `tile_hold_owner`'s contract: called once, from any thread, never unwinds.
        unsafe { (self.release)(self.data) }
    }
}

/// Holds any other owner of memory the stream's work uses (a host staging buffer, a
/// reference count of another library, ...): tile calls `release(data)` once, after all the
/// work enqueued on `stream` up to this call has completed, as `tile_hold_dlpack` calls a
/// deleter (under a CUDA graph capture, once the graph is destroyed). `data` may be NULL; it
/// is passed to `release` as given.
///
/// Returns `TILE_ERROR_INVALID_ARGUMENT` if `stream` or `release` is NULL, and
/// `TILE_ERROR_SHUT_DOWN` after `tile_shutdown` (in both cases `release` is not called: the
/// owner is still the caller's); `TILE_ERROR_CUDA` if a driver call failed (the owner is then
/// leaked: `release` is never called). Thread-safe, as `tile_hold_dlpack`.
///
/// # Safety
///
/// `stream` is NULL or a live handle. `release(data)` may be called once from any thread
/// (including a thread of tile's, for a graph), must call neither `tile_shutdown` nor a tile
/// function on the same stream, and must not unwind (no C++ exception, no `longjmp`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_hold_owner(
    stream: *const tile_stream,
    data: *mut c_void,
    release: Option<unsafe extern "C" fn(*mut c_void)>,
) -> tile_status {
    boundary(|| {
        // SAFETY: this function's contract: NULL or a live handle.
        let stream = unsafe { stream_ref(stream) }?;
        let release = release.ok_or_else(|| Failure::null("release"))?;
        stream.with(|s| Ok(s.hold([Guard::owner(ForeignOwner { data, release })])?))
    })
}
