//! What a launch keeps alive until its work is done ([`Guard`]).

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
