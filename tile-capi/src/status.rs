//! What every call returns ([`tile_status`]), the message of the last error on each thread
//! ([`tile_last_error_message`]), and the boundary every entry point runs its body through
//! ([`boundary`]): no panic crosses into C.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{self, AssertUnwindSafe};

/// What a call of this library returns. `TILE_OK` is 0; every other value is an error, whose
/// description `tile_last_error_message` returns on the same thread.
// A Rust enum is sound here because only this library produces the values; a code that comes
// from C (`tile_error_string`'s argument) is taken as a plain integer.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum tile_status {
    /// Success.
    TILE_OK = 0,
    /// A NULL pointer where one is not allowed. Nothing was taken over: a tensor or owner
    /// passed to the call is still the caller's.
    TILE_ERROR_INVALID_ARGUMENT = 1,
    /// The CUDA driver (`libcuda.so.1`, or the library `TILE_LIBCUDA` names) could not be
    /// loaded or initialised.
    TILE_ERROR_NO_DRIVER = 2,
    /// A CUDA driver call failed; the message names the call and the driver's name for the
    /// code. What a hold was given is then leaked, never released early.
    TILE_ERROR_CUDA = 3,
    /// The stream was detached by `tile_shutdown`: only `tile_stream_release` is left to call
    /// on it.
    TILE_ERROR_SHUT_DOWN = 4,
    /// A bug in this library (a Rust panic, caught before it reached C). What the call was
    /// given is in an unknown state (taken over or not, released or not): report the message.
    TILE_ERROR_INTERNAL = 5,
}

use tile_status::*;

/// Each status with its name and description: the one table `tile_error_string` reads.
const STATUSES: [(tile_status, &std::ffi::CStr); 6] = [
    (TILE_OK, c"TILE_OK: success"),
    (
        TILE_ERROR_INVALID_ARGUMENT,
        c"TILE_ERROR_INVALID_ARGUMENT: a NULL pointer (nothing was taken over)",
    ),
    (
        TILE_ERROR_NO_DRIVER,
        c"TILE_ERROR_NO_DRIVER: the CUDA driver could not be loaded",
    ),
    (
        TILE_ERROR_CUDA,
        c"TILE_ERROR_CUDA: a CUDA driver call failed",
    ),
    (
        TILE_ERROR_SHUT_DOWN,
        c"TILE_ERROR_SHUT_DOWN: the stream was detached by tile_shutdown",
    ),
    (
        TILE_ERROR_INTERNAL,
        c"TILE_ERROR_INTERNAL: a bug in tile (a panic caught at the C boundary)",
    ),
];

/// The name and a one-line description of a status code (`"TILE_ERROR_CUDA: a CUDA driver
/// call failed"`), or `"unknown tile_status"` for a value that is not one. The string is
/// static: never freed, valid for the life of the process. Any thread may call it at any time;
/// it does not change the last error message.
#[unsafe(no_mangle)]
pub extern "C" fn tile_error_string(code: i32) -> *const c_char {
    STATUSES
        .iter()
        .find(|(status, _)| *status as i32 == code)
        .map_or(c"unknown tile_status".as_ptr(), |(_, text)| text.as_ptr())
}

thread_local! {
    /// The message of the last call on this thread (empty after a success).
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// The description of the error the last call on this thread returned (what failed and why),
/// or `""` after a call that returned `TILE_OK`. Never NULL.
///
/// The string belongs to the library and stays valid until the next call of a `tile_`
/// function on the same thread (other than `tile_last_error_message` and `tile_error_string`,
/// which change nothing). Copy it to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn tile_last_error_message() -> *const c_char {
    // The string's buffer lives in the thread-local until the next call replaces it.
    LAST_ERROR
        .try_with(|m| Some(m.try_borrow().ok()?.as_ref()?.as_ptr()))
        .ok()
        .flatten()
        .unwrap_or(c"".as_ptr())
}

/// An error a call returns: its status and what failed.
#[derive(Debug)]
pub(crate) struct Failure {
    status: tile_status,
    message: String,
}

impl Failure {
    pub(crate) fn new(status: tile_status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    /// A NULL argument named `what`.
    pub(crate) fn null(what: &str) -> Failure {
        Failure::new(TILE_ERROR_INVALID_ARGUMENT, format!("{what} is NULL"))
    }
}

impl From<tile_launch::Error> for Failure {
    fn from(e: tile_launch::Error) -> Failure {
        let status = match &e {
            tile_launch::Error::Driver(_) => TILE_ERROR_NO_DRIVER,
            tile_launch::Error::Cuda(_) => TILE_ERROR_CUDA,
            // No other error is returned by the calls this library makes.
            _ => TILE_ERROR_INTERNAL,
        };
        Failure::new(status, e.to_string())
    }
}

/// Runs an entry point's body: returns its status, sets this thread's last error message, and
/// catches a panic (a bug), which becomes [`TILE_ERROR_INTERNAL`] instead of unwinding into C.
/// Nothing here panics outside the `catch_unwind`.
pub(crate) fn boundary(body: impl FnOnce() -> Result<(), Failure>) -> tile_status {
    let (status, message) = match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => (TILE_OK, None),
        Ok(Err(failure)) => (failure.status, Some(failure.message)),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with a non-string payload".to_string());
            // A payload may itself panic when dropped: it is then forgotten (leaked).
            if let Err(again) = panic::catch_unwind(AssertUnwindSafe(|| drop(payload))) {
                std::mem::forget(again);
            }
            log::error!("tile-capi: a panic was caught at the C boundary: {what}");
            (
                TILE_ERROR_INTERNAL,
                Some(format!(
                    "internal error in tile (a panic, caught at the C boundary): {what}"
                )),
            )
        }
    };
    set_last_error(message);
    status
}

/// Stores `message` (`None`: success, an empty message) as this thread's last error. Never
/// panics: at thread exit, or re-entered from a callback, the message is dropped instead.
fn set_last_error(message: Option<String>) {
    let _ = LAST_ERROR.try_with(|slot| {
        let Ok(mut slot) = slot.try_borrow_mut() else {
            return;
        };
        // An interior NUL would cut the message: it is shown as U+FFFD.
        *slot = message.and_then(|text| CString::new(text.replace('\0', "\u{fffd}")).ok());
    });
}
