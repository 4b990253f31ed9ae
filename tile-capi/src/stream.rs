//! Borrowed streams ([`tile_stream`]): borrowing a `CUstream`, polling, synchronising, counting,
//! releasing, and [`tile_shutdown`], which detaches every stream still borrowed.

use std::sync::{Arc, Mutex, RwLock, Weak};

use tile_launch::cuda_sys::CUstream;
use tile_launch::{Context, Stream};

use crate::status::{Failure, boundary, tile_status};

/// A `CUstream` borrowed by tile, with its release queue. Opaque to C: made by
/// `tile_stream_borrow`, freed by `tile_stream_release`.
#[allow(non_camel_case_types)]
pub struct tile_stream {
    /// `None` once `tile_shutdown` has detached it. Calls that use the stream hold the read
    /// lock for their duration, so that a shutdown never detaches a stream in the middle of a
    /// hold; only a detach takes the write lock.
    stream: RwLock<Option<Stream>>,
}

// Handles are shared by C threads: the calls that take `*const tile_stream` run concurrently.
const _: () = {
    const fn shared_across_threads<T: Send + Sync>() {}
    shared_across_threads::<tile_stream>();
};

/// Every stream borrowed and not yet released, for `tile_shutdown`.
static BORROWED: Mutex<Vec<Weak<tile_stream>>> = Mutex::new(Vec::new());

impl tile_stream {
    /// Runs `f` on the stream, under the read lock.
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(&Stream) -> Result<T, Failure>,
    ) -> Result<T, Failure> {
        let stream = self.stream.read().unwrap_or_else(|p| p.into_inner());
        let stream = stream.as_ref().ok_or_else(|| {
            Failure::new(
                tile_status::TILE_ERROR_SHUT_DOWN,
                "the stream was detached by tile_shutdown",
            )
        })?;
        f(stream)
    }

    /// Detaches the stream: waits for its work and releases what its release queue holds, then
    /// drops it (tile does not name the `CUstream` again). `Ok` if it was detached already.
    fn detach(&self) -> Result<(), Failure> {
        let taken = self
            .stream
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let Some(stream) = taken else {
            return Ok(());
        };
        // On an error nothing more is released: what is held is leaked, never freed early
        // (dropping the stream then waits and releases only what is known complete).
        let synchronized = stream.synchronize();
        drop(stream);
        Ok(synchronized?)
    }
}

/// The stream behind a C pointer, or [`TILE_ERROR_INVALID_ARGUMENT`] for NULL.
///
/// # Safety
///
/// A non-null `stream` is a live handle from `tile_stream_borrow`, not released during the
/// returned borrow.
///
/// [`TILE_ERROR_INVALID_ARGUMENT`]: tile_status::TILE_ERROR_INVALID_ARGUMENT
pub(crate) unsafe fn stream_ref<'a>(
    stream: *const tile_stream,
) -> Result<&'a tile_stream, Failure> {
    // SAFETY: this function's contract.
    unsafe { stream.as_ref() }.ok_or_else(|| Failure::null("stream"))
}

/// Borrows the stream `stream` of device `device`'s primary context (the context of the CUDA
/// runtime, PyTorch, CuPy and cuda.core), and stores a handle to it in `*out`.
///
/// `stream` may be NULL (the legacy default stream) or `CU_STREAM_PER_THREAD` (`(CUstream)0x2`,
/// the calling thread's per-thread default stream). tile never destroys the stream.
///
/// Returns `TILE_ERROR_INVALID_ARGUMENT` if `out` is NULL; `TILE_ERROR_NO_DRIVER` without a
/// driver; `TILE_ERROR_CUDA` for an invalid device ordinal (`cuDeviceGet`) or if the primary
/// context cannot be retained (`cuDevicePrimaryCtxRetain`). `*out` is set only on success.
///
/// # Safety
///
/// `out` is NULL or writable. `stream` is a valid stream of that context (or one of the two
/// default-stream handles above) and stays valid until `tile_stream_release` or `tile_shutdown`
/// has returned for this handle: both wait for the stream's work.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_stream_borrow(
    device: i32,
    stream: CUstream,
    out: *mut *mut tile_stream,
) -> tile_status {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let ctx = Context::new(device)?;
        // SAFETY: this function's contract: `stream` is a stream of `ctx` (or a default-stream
        // handle) and stays valid until the handle is released or detached, which drops the
        // `Stream` (and waits for its work) before returning.
        let borrowed = unsafe { Stream::from_raw(&ctx, stream) }?;
        let handle = Arc::new(tile_stream {
            stream: RwLock::new(Some(borrowed)),
        });
        {
            let mut all = BORROWED.lock().unwrap_or_else(|p| p.into_inner());
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&handle));
        }
        // SAFETY: `out` is non-null and writable (this function's contract).
        unsafe { out.write(Arc::into_raw(handle).cast_mut()) };
        Ok(())
    })
}

/// Releases a handle from `tile_stream_borrow`: waits for all the stream's work
/// (`cuStreamSynchronize`), releases everything held on it (each deleter or release function
/// runs once, on this thread), and frees the handle. The `CUstream` itself is not destroyed.
/// Under a CUDA graph capture, what the graph owns stays with the graph.
///
/// Returns `TILE_ERROR_INVALID_ARGUMENT` for NULL; `TILE_ERROR_CUDA` if the wait failed (then
/// what was held is leaked, never released early); the handle is freed either way. A handle
/// detached by `tile_shutdown` is just freed (`TILE_OK`).
///
/// # Safety
///
/// `stream` is NULL or a live handle from `tile_stream_borrow`; no other call on it runs at the
/// same time or after this one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_stream_release(stream: *mut tile_stream) -> tile_status {
    boundary(|| {
        if stream.is_null() {
            return Err(Failure::null("stream"));
        }
        // SAFETY: a live handle made by `Arc::into_raw` in `tile_stream_borrow`, released
        // once (this function's contract): this takes back its reference.
        let handle = unsafe { Arc::from_raw(stream.cast_const()) };
        let detached = handle.detach();
        BORROWED
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(&handle)));
        detached
    })
}

/// Releases what the stream's completed work held (each deleter or release function runs once,
/// on this thread), without blocking; `*released` (if not NULL) is set to how many were
/// released. Nothing fails here that a later call would not report: a driver error is counted
/// in `tile_stats.errors`.
///
/// Returns `TILE_ERROR_INVALID_ARGUMENT` if `stream` is NULL, `TILE_ERROR_SHUT_DOWN` after
/// `tile_shutdown`.
///
/// # Safety
///
/// `stream` is NULL or a live handle; `released` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_stream_poll(
    stream: *const tile_stream,
    released: *mut usize,
) -> tile_status {
    boundary(|| {
        // SAFETY: this function's contract.
        let n = unsafe { stream_ref(stream) }?.with(|s| Ok(s.poll()))?;
        if !released.is_null() {
            // SAFETY: non-null and writable (this function's contract).
            unsafe { released.write(n) };
        }
        Ok(())
    })
}

/// Blocks until all the stream's work is done (`cuStreamSynchronize`), then releases
/// everything held on it (each deleter or release function runs once, on this thread).
///
/// Returns `TILE_ERROR_INVALID_ARGUMENT` if `stream` is NULL, `TILE_ERROR_SHUT_DOWN` after
/// `tile_shutdown`, `TILE_ERROR_CUDA` if the wait failed (nothing is released then; what was
/// held is leaked if the stream or its context is lost).
///
/// # Safety
///
/// `stream` is NULL or a live handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_stream_synchronize(stream: *const tile_stream) -> tile_status {
    boundary(|| {
        // SAFETY: this function's contract.
        unsafe { stream_ref(stream) }?.with(|s| Ok(s.synchronize()?))
    })
}

/// Counters of a stream's release queue, from `tile_stream_stats`. Counts are of guards: a
/// held tensor or owner is one guard.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct tile_stats {
    /// Guards waiting for their work to complete (held, not yet released). Under a graph
    /// capture the graph owns what is held, which is not counted here.
    pub pending_guards: u64,
    /// Bytes only the release queue keeps alive (tensors whose producer flagged them as
    /// copies, DLPack `IS_COPIED`), in bytes.
    pub pending_bytes: u64,
    /// Guards released so far (deleters and release functions run).
    pub guards_released: u64,
    /// Guards leaked because their work could not be known complete (a failed driver call).
    pub guards_leaked: u64,
    /// Completion markers recorded (`cuEventRecord`).
    pub markers_recorded: u64,
    /// Driver errors met by the release queue.
    pub errors: u64,
}

/// Writes the stream's release-queue counters to `*out`. Makes no driver call.
///
/// Returns `TILE_ERROR_INVALID_ARGUMENT` if `stream` or `out` is NULL, `TILE_ERROR_SHUT_DOWN`
/// after `tile_shutdown`.
///
/// # Safety
///
/// `stream` is NULL or a live handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn tile_stream_stats(
    stream: *const tile_stream,
    out: *mut tile_stats,
) -> tile_status {
    boundary(|| {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        // SAFETY: this function's contract.
        let s = unsafe { stream_ref(stream) }?.with(|s| Ok(s.stats()))?;
        let stats = tile_stats {
            pending_guards: s.pending_guards as u64,
            pending_bytes: s.pending_bytes,
            guards_released: s.guards_released,
            guards_leaked: s.guards_leaked,
            markers_recorded: s.markers_recorded,
            errors: s.errors,
        };
        // SAFETY: non-null and writable (this function's contract).
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Detaches every stream still borrowed: for each, waits for its work (`cuStreamSynchronize`),
/// releases everything held on it (each deleter or release function runs once, on this
/// thread), and stops naming its `CUstream`, which the caller may then destroy. Call it before
/// the streams or the process's CUDA state go away (at exit, say): held tensors are not
/// released by the process's exit.
///
/// The handles stay allocated: `tile_stream_release` frees each (`TILE_OK`); every other call
/// on a detached handle returns `TILE_ERROR_SHUT_DOWN`. Streams borrowed after this call work
/// as usual. What a CUDA graph owns (holds made under capture) is released when the graph, its
/// clones and executable graphs are destroyed, not here.
///
/// Returns the first error (`TILE_ERROR_CUDA` if a wait failed; that stream's held guards are
/// then leaked); every stream is detached either way. May be called from any thread, at the
/// same time as any other call; a hold that runs concurrently completes on its stream first.
#[unsafe(no_mangle)]
pub extern "C" fn tile_shutdown() -> tile_status {
    boundary(|| {
        let all: Vec<Arc<tile_stream>> =
            std::mem::take(&mut *BORROWED.lock().unwrap_or_else(|p| p.into_inner()))
                .iter()
                .filter_map(Weak::upgrade)
                .collect();
        let mut first = Ok(());
        for handle in all {
            if let Err(e) = handle.detach()
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    })
}
