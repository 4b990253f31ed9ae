//! The synchronisation primitives of the crate, in one place so that `loom` can swap them.
//!
//! Built normally, these are `std::sync`'s. Built with `RUSTFLAGS="--cfg loom"`, they are
//! `loom::sync`'s, so that a `loom` model explores the interleavings of the release queue's
//! lock and counters.
//!
//! `Arc` is deliberately not swapped: [`Tracker`](crate::release::Tracker) hands out
//! `std::sync::Arc<Tracker>` and takes `self: &Arc<Self>`, which only the standard library's
//! `Arc` can be used for on stable Rust; reference counting is not where the queue's
//! interleavings are.

#![allow(unused_imports)] // not every item is used in every configuration

#[cfg(loom)]
pub(crate) use loom::sync::{
    Condvar, Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    mpsc::{Receiver, Sender, channel},
};

#[cfg(not(loom))]
pub(crate) use std::sync::{
    Condvar, Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    mpsc::{Receiver, Sender, channel},
};

/// Locks `mutex`, recovering the data if a thread panicked while holding it.
///
/// The release queue keeps its state consistent at every point where user code (a
/// [`Timeline`](crate::release::Timeline) method) may panic, so a poisoned lock carries no
/// broken invariant; refusing to continue would only turn one panic into leaks everywhere.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
