//! What a launch keeps alive until its work is done ([`Guard`]), and the vectors that hold a
//! launch's guards, reused per thread.

use std::fmt;

use tile_dlpack::Used;

/// What a launch keeps alive until its work is done: a consumed tensor, or any other owner
/// (e.g. a Python object) whose lifetime the kernel's memory depends on.
pub enum Guard {
    /// A consumed DLPack tensor; releasing it runs its deleter.
    Tensor(Used),
    /// A consumed DLPack tensor that is released through a function of the caller's rather
    /// than dropped where the release queue drops it (e.g. handed to a thread that may run its
    /// deleter), with no allocation per tensor.
    HandedOff(HandOff),
    /// Any value whose drop releases memory the kernel uses.
    Owner(Box<dyn Send>),
}

/// A consumed tensor and the function that releases it ([`Guard::HandedOff`]): dropping a
/// `HandOff` calls `release(tensor)` once, on whatever thread drops it.
pub struct HandOff {
    /// `None` once released.
    tensor: Option<Used>,
    release: fn(Used),
}

impl HandOff {
    /// `tensor`, to be released by `release` (which then owns it and must drop it, or keep it
    /// alive longer, never less).
    pub fn new(tensor: Used, release: fn(Used)) -> HandOff {
        HandOff {
            tensor: Some(tensor),
            release,
        }
    }

    /// The tensor.
    pub fn tensor(&self) -> &Used {
        self.tensor
            .as_ref()
            .expect("a HandOff holds its tensor until dropped")
    }
}

impl Drop for HandOff {
    fn drop(&mut self) {
        if let Some(t) = self.tensor.take() {
            (self.release)(t);
        }
    }
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Guard::Tensor(t) => f.debug_tuple("Tensor").field(&t.view().data_ptr()).finish(),
            Guard::HandedOff(h) => f
                .debug_tuple("HandedOff")
                .field(&h.tensor().view().data_ptr())
                .finish(),
            Guard::Owner(_) => f.write_str("Owner(..)"),
        }
    }
}

/// Guard vectors kept for reuse on this thread: a released launch's emptied vector
/// ([`recycle_guards`]), taken by a later launch ([`spare_guards`]) instead of an allocation
/// per launch and a free per release. At most [`SPARES`] vectors of at most [`SPARE_CAPACITY`]
/// guards each are kept per thread; the rest are freed.
const SPARES: usize = 64;
const SPARE_CAPACITY: usize = 8;

thread_local! {
    static SPARE_GUARDS: std::cell::RefCell<Vec<Vec<Guard>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty guard vector with room for `n` guards: a spare of this thread's when one is
/// large enough, else a new one (no allocation for `n == 0`).
#[inline(always)]
pub(crate) fn spare_guards(n: usize) -> Vec<Guard> {
    if n == 0 {
        return Vec::new();
    }
    // A spare too small for this launch is freed, and a vector of the size asked for is made.
    if n <= SPARE_CAPACITY
        && let Ok(Some(spare)) = SPARE_GUARDS.try_with(|s| s.try_borrow_mut().ok()?.pop())
        && spare.capacity() >= n
    {
        return spare;
    }
    Vec::with_capacity(n)
}

/// Keeps an emptied guard vector for a later launch on this thread ([`spare_guards`]), or
/// frees it. The release queue's recycle hook ([`Tracker::recycle_with`]); never panics.
///
/// [`Tracker::recycle_with`]: crate::release::Tracker::recycle_with
pub(crate) fn recycle_guards(mut guards: Vec<Guard>) {
    debug_assert!(guards.is_empty());
    if guards.capacity() > SPARE_CAPACITY || !guards.is_empty() {
        return;
    }
    // `try_with`: at thread exit the spares may be gone already; then it is freed.
    let _ = SPARE_GUARDS.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut()
            && s.len() < SPARES
        {
            s.push(std::mem::take(&mut guards));
        }
    });
}
