//! The ownership states of a DLPack tensor: [`Unused`], [`Used`], [`Released`].

use std::cell::OnceCell;
use std::fmt;
use std::marker::PhantomData;

use dlpark::{DlpackFlags, Managed};

use crate::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLPackVersion, DLTensor};
use crate::view::Meta;
use crate::{DescriptorError, TensorView};

/// The only DLPack major version whose layout we read.
const SUPPORTED_MAJOR: u32 = 1;

fn check_version(version: DLPackVersion) -> Result<(), DescriptorError> {
    if version.major == SUPPORTED_MAJOR {
        Ok(())
    } else {
        Err(DescriptorError::UnsupportedVersion {
            major: version.major,
            minor: version.minor,
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum Raw {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

/// A producer's tensor that has been exported but not consumed: the producer still owns it.
///
/// Dropping an `Unused` never calls the deleter; that stays with whoever holds the export
/// (for a Python capsule, its destructor, as long as the capsule is not marked consumed).
/// [`peek`](Self::peek) validates and inspects it without taking it over, so a caller can
/// check dtype, device and intent before committing; [`consume`](Self::consume) takes it
/// over as a [`Used`].
///
/// A successful `peek` is remembered, so a following `consume` does not validate again.
///
/// `Unused` is neither `Send` nor `Sync`: it is a borrowed raw pointer whose producer may be
/// tied to a thread (a Python capsule, under the GIL). [`Used`] is both.
#[must_use = "an Unused tensor does nothing unless it is peeked at or consumed"]
pub struct Unused<'a> {
    raw: Raw,
    meta: OnceCell<Meta>,
    producer: PhantomData<&'a DLTensor>,
}

impl<'a> Unused<'a> {
    /// Wraps a legacy (unversioned) `DLManagedTensor`. A null `ptr` is accepted here and
    /// reported as [`DescriptorError::NullPointer`] by `peek` and `consume`.
    ///
    /// # Safety
    ///
    /// A non-null `ptr` must point to a `DLManagedTensor` that:
    /// - stays valid and unchanged for `'a` and, once consumed, until its deleter runs — the
    ///   descriptor and the shape and strides arrays it points to (for `0 < ndim <= 64`, each
    ///   of them null or valid for `ndim` values; validation reads nothing beyond that);
    /// - nobody else consumes or deletes while this value or the [`Used`] made from it exists
    ///   (the caller marks the export consumed when [`consume`](Self::consume) is called);
    /// - has a deleter that is null or may be called once, from any thread, and does not
    ///   unwind.
    pub unsafe fn from_legacy(ptr: *mut DLManagedTensor) -> Self {
        Self::new(Raw::Legacy(ptr))
    }

    /// Wraps a `DLManagedTensorVersioned`. A null `ptr` is accepted here and reported as
    /// [`DescriptorError::NullPointer`] by `peek` and `consume`.
    ///
    /// # Safety
    ///
    /// As for [`from_legacy`](Self::from_legacy). In addition, only the fields the DLPack ABI
    /// keeps stable across major versions (version, manager context, deleter, flags) are
    /// read before the major version is known to be 1, so only those need to be valid when
    /// it is not.
    pub unsafe fn from_versioned(ptr: *mut DLManagedTensorVersioned) -> Self {
        Self::new(Raw::Versioned(ptr))
    }

    fn new(raw: Raw) -> Self {
        Self {
            raw,
            meta: OnceCell::new(),
            producer: PhantomData,
        }
    }

    /// Whether this is a `DLManagedTensorVersioned`.
    pub fn is_versioned(&self) -> bool {
        matches!(self.raw, Raw::Versioned(_))
    }

    /// The declared `(major, minor)` DLPack version; `None` for a legacy tensor or a null
    /// pointer.
    pub fn version(&self) -> Option<(u32, u32)> {
        self.raw_version().map(|v| (v.major, v.minor))
    }

    fn raw_version(&self) -> Option<DLPackVersion> {
        match self.raw {
            Raw::Versioned(ptr) if !ptr.is_null() => {
                // SAFETY: non-null, so valid for 'a (`from_versioned`'s contract), and the
                // version is the first field in every major version of the ABI. Only that
                // field is read.
                Some(unsafe { (*ptr).version })
            }
            _ => None,
        }
    }

    /// The descriptor and, for a versioned tensor, its flags, once the pointer is known to be
    /// non-null and (for a versioned tensor) of major version 1.
    fn descriptor(&self) -> Result<(&DLTensor, Option<DlpackFlags>), DescriptorError> {
        match self.raw {
            Raw::Legacy(ptr) if !ptr.is_null() => {
                // SAFETY: non-null, so valid and unchanged for 'a (`from_legacy`'s contract).
                Ok((unsafe { &(*ptr).dl_tensor }, None))
            }
            Raw::Versioned(ptr) => {
                // `None` exactly when the pointer is null.
                let version = self.raw_version().ok_or(DescriptorError::NullPointer)?;
                check_version(version)?;
                // SAFETY: non-null and of major version 1, so it has the layout of
                // `DLManagedTensorVersioned` and is valid and unchanged for 'a
                // (`from_versioned`'s contract).
                let managed = unsafe { &*ptr };
                Ok((&managed.dl_tensor, Some(managed.flags)))
            }
            Raw::Legacy(_) => Err(DescriptorError::NullPointer),
        }
    }

    /// Validates the tensor and returns a view of it, without taking it over.
    ///
    /// Reads nothing past the version of a versioned tensor whose major version is not 1.
    ///
    /// # Errors
    ///
    /// [`DescriptorError::NullPointer`], [`DescriptorError::UnsupportedVersion`], or whatever
    /// validation finds (see [`DescriptorError`]). Nothing is released either way.
    pub fn peek(&self) -> Result<TensorView<'_>, DescriptorError> {
        let (tensor, flags) = self.descriptor()?;
        let meta = match self.meta.get() {
            Some(meta) => meta,
            None => {
                // SAFETY: `from_*`'s contract: shape and strides are null or valid for `ndim`
                // values when `0 < ndim <= 64`.
                let meta = unsafe { Meta::validate(tensor, flags) }?;
                self.meta.get_or_init(|| meta)
            }
        };
        // SAFETY: `meta` was validated from `tensor`, which stays unchanged and readable for
        // 'a, longer than this borrow of `self`.
        Ok(unsafe { meta.view(tensor) })
    }

    /// Takes the tensor over. From here its deleter runs exactly once, by us.
    ///
    /// The caller must mark the export consumed (for a capsule: rename it `used_dltensor`)
    /// whatever this returns, except for [`DescriptorError::NullPointer`]: the tensor is ours
    /// on every other path.
    ///
    /// # Errors
    ///
    /// - [`DescriptorError::NullPointer`]: nothing to take over, nothing released.
    /// - [`DescriptorError::UnsupportedVersion`]: the deleter has run (the DLPack spec makes
    ///   calling it the consumer's duty, and the only safe thing to do with the tensor).
    /// - any validation error: nothing was launched, so the deleter has run before the error
    ///   is returned.
    pub fn consume(self) -> Result<Used, DescriptorError> {
        let version = self.raw_version();
        let meta = self.meta.into_inner();
        match self.raw {
            Raw::Legacy(ptr) => {
                // SAFETY: `from_legacy`'s contract: `ptr` is null or a tensor that is ours to
                // take over, valid until its deleter runs, with a deleter callable once from
                // any thread. `from_raw` rejects null and checks nothing else for legacy.
                let managed =
                    unsafe { Managed::from_raw(ptr) }.map_err(|_| DescriptorError::NullPointer)?;
                Used::with_meta(Owned::Legacy(managed), meta)
            }
            Raw::Versioned(ptr) => {
                // `None` exactly when the pointer is null.
                let version = version.ok_or(DescriptorError::NullPointer)?;
                // SAFETY: as for the legacy case. For a major version other than dlpark's,
                // `from_raw` calls the deleter (through the ABI-stable prefix) and returns
                // an error.
                let managed = unsafe { Managed::from_raw(ptr) };
                match managed {
                    Ok(managed) if version.major == SUPPORTED_MAJOR => {
                        Used::with_meta(Owned::Versioned(managed), meta)
                    }
                    refused => {
                        // Released here, once: an `Ok` handle is dropped (deleter), an `Err`
                        // was released inside `from_raw`.
                        drop(refused);
                        Err(DescriptorError::UnsupportedVersion {
                            major: version.major,
                            minor: version.minor,
                        })
                    }
                }
            }
        }
    }
}

impl fmt::Debug for Unused<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Unused").field("raw", &self.raw).finish()
    }
}

enum Owned {
    Legacy(Managed<DLManagedTensor>),
    Versioned(Managed<DLManagedTensorVersioned>),
}

impl Owned {
    fn tensor(&self) -> &DLTensor {
        match self {
            // SAFETY: a `Managed` keeps its descriptor readable and unchanged while it exists
            // (`Managed::from_raw`'s contract), and this borrow does not outlive it.
            Self::Legacy(managed) => unsafe { managed.tensor() },
            // SAFETY: as above.
            Self::Versioned(managed) => unsafe { managed.tensor() },
        }
    }

    fn flags(&self) -> Option<DlpackFlags> {
        match self {
            Self::Legacy(_) => None,
            Self::Versioned(managed) => Some(managed.flags()),
        }
    }
}

/// A consumed tensor: we own it, and its deleter runs exactly once, when this value is
/// released or dropped.
///
/// Its metadata was validated once, at construction; [`view`](Self::view) hands it out.
/// `Used` is `Send` and `Sync`, so it can be released on another thread (the DLPack deleter
/// must be callable from any thread). [`std::mem::forget`] on it leaks the tensor and never
/// frees it early.
///
/// A null deleter (the producer keeps ownership, per DLPack) means releasing runs nothing.
#[must_use = "dropping a Used runs the producer's deleter at once: keep it until the GPU work \
              that uses the tensor has finished"]
pub struct Used {
    owned: Owned,
    meta: Meta,
}

impl Used {
    /// Validates `owned` (or takes `meta` from an earlier peek) into a `Used`. On a
    /// validation error `owned` is dropped, running the deleter, before the error returns.
    fn with_meta(owned: Owned, meta: Option<Meta>) -> Result<Self, DescriptorError> {
        let meta = match meta {
            Some(meta) => meta,
            // SAFETY: a `Managed` keeps its shape and strides readable while it exists; they
            // hold `ndim` values each when non-null (DLPack, and the contract of the `Managed`
            // or `Unused` constructor the tensor came through).
            None => match unsafe { Meta::validate(owned.tensor(), owned.flags()) } {
                Ok(meta) => meta,
                Err(error) => {
                    drop(owned);
                    return Err(error);
                }
            },
        };
        Ok(Self { owned, meta })
    }

    /// Takes over a legacy tensor from a Rust producer (for instance dlpark's `cudarc`
    /// export).
    ///
    /// # Errors
    ///
    /// Any validation error (see [`DescriptorError`]); the deleter has run before it returns.
    pub fn from_managed_legacy(managed: Managed<DLManagedTensor>) -> Result<Self, DescriptorError> {
        Self::with_meta(Owned::Legacy(managed), None)
    }

    /// Takes over a versioned tensor from a Rust producer.
    ///
    /// # Errors
    ///
    /// [`DescriptorError::UnsupportedVersion`] or any validation error; the deleter has run
    /// before it returns.
    pub fn from_managed_versioned(
        managed: Managed<DLManagedTensorVersioned>,
    ) -> Result<Self, DescriptorError> {
        if let Err(error) = check_version(managed.version()) {
            drop(managed);
            return Err(error);
        }
        Self::with_meta(Owned::Versioned(managed), None)
    }

    /// The validated metadata. Cheap: nothing is recomputed.
    pub fn view(&self) -> TensorView<'_> {
        // SAFETY: `self.meta` was validated from this descriptor, which the `Managed` keeps
        // readable and unchanged for as long as `self` is borrowed.
        unsafe { self.meta.view(self.owned.tensor()) }
    }

    /// Runs the deleter now and returns the proof that it ran.
    pub fn release(self) -> Released {
        drop(self);
        Released { _private: () }
    }
}

impl fmt::Debug for Used {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Used").field(&self.view()).finish()
    }
}

/// Proof that a consumed tensor's deleter has run.
///
/// It carries no pointer and no metadata: nothing about the tensor can be reached through
/// it. Only [`Used::release`] makes one.
#[derive(Debug)]
pub struct Released {
    _private: (),
}
