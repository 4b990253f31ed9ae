//! What a launch keeps alive until its work is done ([`Guard`]).

use std::fmt;

use tile_dlpack::Used;

/// What a launch keeps alive until its work is done: a consumed tensor, or any other owner
/// (e.g. a Python object) whose lifetime the kernel's memory depends on.
pub enum Guard {
    /// A consumed DLPack tensor; releasing it runs its deleter.
    Tensor(Used),
    /// Any value whose drop releases memory the kernel uses.
    Owner(Box<dyn Send>),
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Guard::Tensor(t) => f.debug_tuple("Tensor").field(&t.view().data_ptr()).finish(),
            Guard::Owner(_) => f.write_str("Owner(..)"),
        }
    }
}
