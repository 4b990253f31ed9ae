//! Holding what a launcher's work uses: DLPack tensors whose deleter tile takes over
//! ([`tile_hold_dlpack`], [`tile_hold_dlpack_legacy`]) and any other owner
//! ([`tile_hold_owner`]), through `tile_launch::Stream::hold`.

use std::ffi::c_void;

use tile_dlpack::Taken;
use tile_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use tile_launch::Guard;

use crate::status::{Failure, boundary, tile_status};
use crate::stream::{stream_ref, tile_stream};

/// Holds the tensor `tensor` checked to be non-null: `take` takes it over as it is (nothing of
/// it is read but its deleter: a descriptor tile would not launch on is still the memory of
/// work already launched, so it is never refused, and never released early).
fn hold_tensor(
    stream: *const tile_stream,
    null: bool,
    take: impl FnOnce() -> Option<Taken>,
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
            let taken = take().ok_or_else(|| Failure::null("tensor"))?;
            Ok(s.hold([Guard::from(taken)])?)
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
/// Nothing of the tensor is read but its deleter (in the fields every DLPack version keeps at
/// the same place): whatever its descriptor says (a version tile does not read, a shape tile
/// would not launch on), the work already launched may use its memory, so it is taken over.
///
/// Returns:
/// - `TILE_OK`: the tensor is tile's.
/// - `TILE_ERROR_INVALID_ARGUMENT`: `stream` or `tensor` is NULL; nothing was taken over.
/// - `TILE_ERROR_SHUT_DOWN`: the stream was detached; the tensor was not taken over.
/// - `TILE_ERROR_CUDA`: a driver call failed (reading the capture status, recording the
///   completion marker); the tensor was taken over and is leaked, never released early.
///
/// Thread-safe: any number of threads may hold on the same stream at once.
///
/// # Safety
///
/// `stream` is NULL or a live handle from `tile_stream_borrow`. A non-null `tensor` is a live
/// `DLManagedTensorVersioned` (of any version) that nobody else consumes or deletes from this
/// call on (a capsule holding it is marked consumed: renamed `"used_dltensor_versioned"`),
/// whose `deleter` field stays readable until it is called, and whose deleter is NULL or may be
/// called once from any thread (including a thread of tile's, for a graph), calls neither
/// `tile_shutdown` nor a tile function on the same stream, and does not unwind (no C++
/// exception, no `longjmp`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_hold_dlpack(
    stream: *const tile_stream,
    tensor: *mut DLManagedTensorVersioned,
) -> tile_status {
    hold_tensor(stream, tensor.is_null(), || {
        // SAFETY: this function's contract: a tensor whose deleter duty is handed over here,
        // its deleter field readable until called, callable once from any thread.
        unsafe { Taken::versioned(tensor) }
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
        unsafe { Taken::legacy(tensor) }
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
