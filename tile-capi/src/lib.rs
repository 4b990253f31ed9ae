//! The C API of tile's release queue: a C or C++ launcher hands the DLPack tensors (or any other
//! owner) its GPU work uses to tile right after enqueuing the work, instead of calling their
//! deleters, and tile calls each deleter once, after that work has completed.
//!
//! The calls, in `include/tile.h` (generated from this crate by `cargo xtask codegen`):
//! `tile_stream_borrow` / `tile_stream_release` (a `CUstream` and its release queue),
//! `tile_hold_dlpack`, `tile_hold_dlpack_legacy`, `tile_hold_owner`, `tile_stream_poll`,
//! `tile_stream_synchronize`, `tile_stream_stats`, `tile_shutdown`, and the error reporting of
//! `tile_status`, `tile_last_error_message` and `tile_error_string`. `README.md` shows the fix
//! for a launcher in a few lines and how to build and link.
//!
//! # Contract
//!
//! - What is held is released once, never before the stream's work enqueued up to the hold has
//!   completed; under a CUDA graph capture the graph owns it (`tile_launch::Stream::hold`,
//!   which this crate calls and does not re-check).
//! - No panic crosses into C: every entry point runs its body through one boundary
//!   (`src/status.rs`) that turns a panic into `TILE_ERROR_INTERNAL`.
//! - Errors are a status code and a thread-local message. A tensor or owner is taken over
//!   when the call returns `TILE_OK` or `TILE_ERROR_CUDA` (leaked then, never released early);
//!   on `TILE_ERROR_INVALID_ARGUMENT` and `TILE_ERROR_SHUT_DOWN` it is still the caller's;
//!   `TILE_ERROR_INTERNAL` is a bug, after which its state is unknown.
//! - Thread-safe: every call may be made from any thread, concurrently with any other, except
//!   `tile_stream_release`, which must not run concurrently with, or before, another call on
//!   the same handle.
//!
//! # Layering
//!
//! Depends on `tile-launch` (streams, the release queue, the driver through `cuda-sys`),
//! `tile-dlpack` (taking a tensor over) and `log`. It validates nothing that those crates
//! validate; it adds the C types, the handles' lifetimes and the error mapping.

// In this order in `include/tile.h`: status codes and messages, streams, holds.
mod status;

mod stream;

mod hold;

pub use hold::{tile_hold_dlpack, tile_hold_dlpack_legacy, tile_hold_owner};
pub use status::{tile_error_string, tile_last_error_message, tile_status};
pub use stream::{
    tile_shutdown, tile_stats, tile_stream, tile_stream_borrow, tile_stream_poll,
    tile_stream_release, tile_stream_stats, tile_stream_synchronize,
};

/// Test hooks (feature `testing`), for this crate's tests only.
#[cfg(feature = "testing")]
pub mod testing {
    use crate::status::{Failure, boundary};

    /// Runs `body` through the boundary every entry point uses, as an entry point would, and
    /// returns the status C would get (a panic in `body` becomes `TILE_ERROR_INTERNAL`, with
    /// its message as the last error). `Err(message)` becomes `TILE_ERROR_CUDA`.
    pub fn through_boundary(body: impl FnOnce() -> Result<(), String>) -> crate::tile_status {
        boundary(|| body().map_err(|m| Failure::new(crate::tile_status::TILE_ERROR_CUDA, m)))
    }
}
