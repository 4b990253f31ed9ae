//! A managed tensor taken over without being read ([`Taken`]): for code that must keep a tensor
//! alive until other work has finished, and then call its deleter, whatever its descriptor says.

use std::fmt;

use crate::ffi::{DLManagedTensor, DLManagedTensorVersioned};

/// A DLPack managed tensor whose deleter duty was handed over, taken as it is: nothing of it is
/// read or validated but its deleter, which runs exactly once, when this value is dropped.
///
/// This is what a launcher that read a tensor's data pointer and launched work on it keeps
/// until that work has finished (`tile_launch::Stream::hold`). Unlike
/// [`Unused::consume`](crate::Unused::consume), which validates the descriptor and runs the deleter at once when
/// it does not validate (nothing was launched then), a `Taken` never runs the deleter early:
/// work already launched may read the memory, whatever the descriptor holds. A versioned tensor
/// of any major version is taken: DLPack keeps the version, `manager_ctx` and `deleter` fields
/// at the same place in every version, so that a deleter can always be called.
///
/// `Taken` is `Send` and `Sync`: DLPack requires a deleter to be callable from any thread.
/// [`std::mem::forget`] leaks the tensor.
pub struct Taken {
    raw: Raw,
}

#[derive(Clone, Copy, Debug)]
enum Raw {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

// SAFETY: a `Taken` only ever calls the deleter, once; DLPack requires the deleter to be callable
// from any thread, and nothing else of the tensor is touched.
unsafe impl Send for Taken {}
// SAFETY: `&Taken` gives access to nothing of the tensor.
unsafe impl Sync for Taken {}

impl Taken {
    /// Takes over a legacy `DLManagedTensor`; `None` for a null pointer.
    ///
    /// # Safety
    ///
    /// A non-null `ptr` points to a `DLManagedTensor` whose deleter duty the caller hands over
    /// (nobody else calls the deleter, or frees the tensor, from now on), whose `deleter` field
    /// stays readable until it is called, and whose deleter is null or may be called once, from
    /// any thread, and does not unwind.
    pub unsafe fn legacy(ptr: *mut DLManagedTensor) -> Option<Taken> {
        // `then`, not `then_some`: a `Taken` of null must never exist, even to be dropped.
        (!ptr.is_null()).then(|| Taken {
            raw: Raw::Legacy(ptr),
        })
    }

    /// Takes over a `DLManagedTensorVersioned` of any version; `None` for a null pointer.
    ///
    /// # Safety
    ///
    /// As for [`Taken::legacy`], for a `DLManagedTensorVersioned` (its ABI-stable prefix:
    /// `version`, `manager_ctx`, `deleter`).
    pub unsafe fn versioned(ptr: *mut DLManagedTensorVersioned) -> Option<Taken> {
        (!ptr.is_null()).then(|| Taken {
            raw: Raw::Versioned(ptr),
        })
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        match self.raw {
            // SAFETY: the constructor's contract: the deleter field is readable, and the
            // deleter ours to call once (now), from this thread.
            Raw::Legacy(ptr) => unsafe {
                if let Some(deleter) = (*ptr).deleter {
                    deleter(ptr);
                }
            },
            // SAFETY: as above; `deleter` lies in the prefix every DLPack version keeps.
            Raw::Versioned(ptr) => unsafe {
                if let Some(deleter) = (*ptr).deleter {
                    deleter(ptr);
                }
            },
        }
    }
}

impl fmt::Debug for Taken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Taken").field(&self.raw).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;
    use crate::testing::{RawTensor, TensorSpec, counted_raw};

    /// Takes `raw` over as a `Taken`.
    fn take(raw: RawTensor) -> Taken {
        // SAFETY: a fresh export of `counted_raw`, handed over here and deleted by nothing else.
        unsafe {
            match raw {
                RawTensor::Legacy(ptr) => Taken::legacy(ptr),
                RawTensor::Versioned(ptr) => Taken::versioned(ptr),
            }
        }
        .expect("not null")
    }

    #[test]
    fn the_deleter_runs_once_when_dropped_and_not_before() {
        for spec in [
            TensorSpec::new(&[4], DType::F32),
            TensorSpec::new(&[4], DType::F32).legacy(),
        ] {
            let (raw, count) = counted_raw(&spec);
            let taken = take(raw);
            assert_eq!(count.get(), 0);
            drop(taken);
            assert_eq!(count.get(), 1);
        }
    }

    #[test]
    fn a_descriptor_that_does_not_validate_is_still_kept_until_dropped() {
        // Each would be refused by `consume`, which then runs the deleter at once.
        for spec in [
            TensorSpec::new(&[4], DType::F32).version(2, 0),
            TensorSpec::new(&[4], DType::F32).ndim(-1),
            TensorSpec::new(&[4], DType::F32).ndim(200),
            TensorSpec::new(&[4], DType::F32).null_shape(),
        ] {
            let (raw, count) = counted_raw(&spec);
            let taken = take(raw);
            assert_eq!(count.get(), 0, "{spec:?}");
            // Dropped on another thread, as a release thread would.
            std::thread::spawn(move || drop(taken)).join().unwrap();
            assert_eq!(count.get(), 1, "{spec:?}");
        }
    }

    #[test]
    fn a_null_pointer_is_none() {
        // SAFETY: null is accepted and taken over as nothing.
        assert!(unsafe { Taken::versioned(std::ptr::null_mut()) }.is_none());
        // SAFETY: as above.
        assert!(unsafe { Taken::legacy(std::ptr::null_mut()) }.is_none());
    }
}
