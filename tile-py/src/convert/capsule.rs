//! Capsules: claiming a DLPack capsule (renamed `used_dltensor[_versioned]` at once) and giving a claim back.

use super::*;

/// The names tile_py gives the capsules it claims. A capsule whose name is one of these very
/// strings (the same pointer, not only the same text: `PyCapsule_SetName` keeps the pointer)
/// was consumed by tile_py itself, and its deleter is tile_py's already; another consumer's
/// `used_*` name is its own string.
static CLAIMED_VERSIONED: &CStr = c"used_dltensor_versioned";
static CLAIMED_LEGACY: &CStr = c"used_dltensor";

/// What a DLPack capsule's name says: whether its tensor is versioned
/// (`dltensor_versioned`), whether it was consumed already (`used_*`), and whether by tile_py.
#[derive(Clone, Copy)]
struct Named {
    versioned: bool,
    consumed: bool,
    by_tile_py: bool,
}

/// The name and pointer of a DLPack capsule: refuses a capsule without a name and one of
/// another kind. The caller holds the capsule's critical section, so that the name read here
/// is still the capsule's when it acts on it.
fn capsule_contents(
    py: Python<'_>,
    index: usize,
    cap: &Bound<'_, PyAny>,
) -> PyResult<(Named, *mut c_void)> {
    // SAFETY: `cap` is a capsule (checked by the caller); the name pointer stays valid while the
    // capsule keeps this name, and the caller holds the capsule's critical section.
    let name_ptr = unsafe { ffi::PyCapsule_GetName(cap.as_ptr()) };
    if name_ptr.is_null() {
        let _ = PyErr::take(py);
        return Err(arg_err(
            Kind::Type,
            index,
            "expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', got a capsule \
             with no name",
        ));
    }
    // SAFETY: non-null capsule names are NUL-terminated C strings.
    let name = unsafe { CStr::from_ptr(name_ptr) };
    let by_tile_py = std::ptr::eq(name_ptr, CLAIMED_VERSIONED.as_ptr())
        || std::ptr::eq(name_ptr, CLAIMED_LEGACY.as_ptr());
    let named = |versioned, consumed| Named {
        versioned,
        consumed,
        by_tile_py,
    };
    let named = match name.to_bytes() {
        b"dltensor" => named(false, false),
        b"dltensor_versioned" => named(true, false),
        b"used_dltensor" => named(false, true),
        b"used_dltensor_versioned" => named(true, true),
        other => {
            return Err(arg_err(
                Kind::Type,
                index,
                format!(
                    "expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', got a \
                     capsule named {:?}",
                    String::from_utf8_lossy(other)
                ),
            ));
        }
    };
    // SAFETY: `cap` is a capsule whose name is `name_ptr`.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), name_ptr) };
    if ptr.is_null() {
        return Err(PyErr::take(py).unwrap_or_else(|| {
            arg_err(Kind::Value, index, "DLPack capsule holds a null pointer")
        }));
    }
    Ok((named, ptr))
}

/// The refusal of a capsule consumed already, by its name.
fn consumed_err(index: usize, versioned: bool) -> PyErr {
    let name = if versioned {
        "used_dltensor_versioned"
    } else {
        "used_dltensor"
    };
    arg_err(
        Kind::Value,
        index,
        format!("DLPack capsule already consumed (its name is {name:?})"),
    )
}

/// The tensor of an unconsumed DLPack capsule: whether it is versioned (`dltensor_versioned`)
/// and its pointer. Refuses a capsule without a name, one already consumed (`used_*`) and one
/// of another kind. The caller holds the capsule's critical section, so that the name read here
/// is still the capsule's when it acts on it.
pub(crate) fn capsule_tensor(
    py: Python<'_>,
    index: usize,
    cap: &Bound<'_, PyAny>,
) -> PyResult<(bool, *mut c_void)> {
    let (named, ptr) = capsule_contents(py, index, cap)?;
    if named.consumed {
        return Err(consumed_err(index, named.versioned));
    }
    Ok((named.versioned, ptr))
}

/// The [`Unused`] over a capsule's tensor, as [`capsule_tensor`] found it.
///
/// # Safety
///
/// `ptr` is the pointer of a capsule named `dltensor_versioned` (`versioned`) or `dltensor`
/// (or, for `tile_py.hold`, `used_dltensor[_versioned]`, whose deleter its caller hands over),
/// whose tensor stays valid and unconsumed by anyone else for the `Unused`'s life.
pub(crate) unsafe fn capsule_unused(versioned: bool, ptr: *mut c_void) -> Unused<'static> {
    if versioned {
        // SAFETY: this function's contract: a `DLManagedTensorVersioned`, valid meanwhile.
        unsafe { Unused::from_versioned(ptr.cast()) }
    } else {
        // SAFETY: as above, for a legacy `DLManagedTensor` (`dltensor`).
        unsafe { Unused::from_legacy(ptr.cast()) }
    }
}

/// Checks the capsule's name, takes its pointer, renames it `used_*` and clears its
/// destructor, atomically with respect to other threads doing the same.
///
/// The destructor is cleared as JAX and nanobind clear it: a producer's destructor that calls
/// the deleter whatever the name (CuPy's before dmlc/dlpack#51, pytorch/pytorch#9260) would
/// otherwise delete the tensor when the capsule dies, while the launch still uses it, and tile_py
/// would delete it a second time. A rollback puts both the name and the destructor back.
pub(crate) fn claim_capsule(
    py: Python<'_>,
    index: usize,
    cap: &Bound<'_, PyAny>,
) -> PyResult<Tensor> {
    let (versioned, ptr, destructor) = with_critical_section(cap, || {
        let (versioned, ptr) = capsule_tensor(py, index, cap)?;
        let used = if versioned {
            CLAIMED_VERSIONED
        } else {
            CLAIMED_LEGACY
        };
        // SAFETY: `cap` is a valid capsule (its pointer was just read), so a null result means
        // no destructor, not an error.
        let destructor = unsafe { ffi::PyCapsule_GetDestructor(cap.as_ptr()) };
        // SAFETY: `used` is a 'static C string, as `PyCapsule_SetName` keeps the pointer.
        if unsafe { ffi::PyCapsule_SetName(cap.as_ptr(), used.as_ptr()) } != 0 {
            return Err(PyErr::fetch(py));
        }
        // SAFETY: `cap` is a valid capsule; clearing its destructor cannot fail then.
        unsafe { ffi::PyCapsule_SetDestructor(cap.as_ptr(), None) };
        Ok((versioned, ptr, destructor))
    })?;
    let restore = if versioned {
        c"dltensor_versioned"
    } else {
        c"dltensor"
    };
    // SAFETY: the capsule was named `dltensor[_versioned]`, so it holds that tensor, which the
    // producer keeps valid until its deleter runs; we renamed it, so nobody else consumes it
    // while we hold the claim.
    let unused = unsafe { capsule_unused(versioned, ptr) };
    Ok(Tensor {
        unused,
        claim: Claim::Capsule {
            capsule: cap.clone().unbind(),
            restore,
            destructor,
        },
        ready_on: None,
        owner: None,
        memory_trusted: false,
    })
}

impl Claim {
    /// Runs `f` on the validated view of the claimed tensor, read again through its claim (the
    /// capsule's pointer, or the export owned outright), for a caller that handed the first
    /// view's `Unused` to the launch's arguments (`tile_py.cutile`, which reads an export's
    /// layout again only to show it to cuTile's compiler on a miss). Nothing is released;
    /// argument `index` is named in errors.
    pub(crate) fn peek<R>(
        &self,
        py: Python<'_>,
        index: usize,
        f: impl FnOnce(&tile_dlpack::TensorView<'_>) -> R,
    ) -> PyResult<R> {
        let read = |unused: Unused<'static>| {
            let view = unused.peek().map_err(|source| {
                crate::exceptions::launch_err(
                    py,
                    tile_launch::Error::Descriptor { index, source },
                    |_| None,
                )
            })?;
            Ok(f(&view))
        };
        match self {
            Claim::Capsule {
                capsule, restore, ..
            } => {
                let cap = capsule.bind(py);
                let ptr = with_critical_section(cap, || {
                    // SAFETY: `cap` is a capsule we renamed (`used_*`) when we claimed it; only a
                    // rollback renames it again, and it is read under its name of now.
                    unsafe {
                        ffi::PyCapsule_GetPointer(
                            cap.as_ptr(),
                            ffi::PyCapsule_GetName(cap.as_ptr()),
                        )
                    }
                });
                if ptr.is_null() {
                    return Err(PyErr::fetch(py));
                }
                // SAFETY: the capsule held a `dltensor[_versioned]` (`restore`) when we claimed
                // it, and nobody but the holder of the claim consumes it or runs its deleter:
                // the tensor is valid, and this `Unused` is only peeked at and dropped (which
                // runs nothing).
                read(unsafe { capsule_unused(*restore == c"dltensor_versioned", ptr) })
            }
            // SAFETY: a tensor we own outright, not consumed (the claim is still held), valid
            // until its deleter runs; this `Unused` is only peeked at and dropped.
            Claim::Owned(ptr) => read(unsafe { Unused::from_versioned(*ptr) }),
        }
    }
}

/// Gives a claimed capsule its original name and destructor back (the tensor was not
/// consumed).
pub(crate) fn unclaim_capsule(
    py: Python<'_>,
    cap: &Bound<'_, PyAny>,
    restore: &'static CStr,
    destructor: Option<ffi::PyCapsule_Destructor>,
) {
    with_critical_section(cap, || {
        // SAFETY: `cap` is a capsule we renamed; `restore` is a 'static C string.
        if unsafe { ffi::PyCapsule_SetName(cap.as_ptr(), restore.as_ptr()) } != 0 {
            // Cannot fail for a valid capsule; if it did, the capsule stays marked consumed
            // and its tensor leaks rather than being freed twice.
            let _ = PyErr::take(py);
            return;
        }
        // SAFETY: `cap` is a valid capsule; `destructor` is the one it had when claimed.
        if unsafe { ffi::PyCapsule_SetDestructor(cap.as_ptr(), destructor) } != 0 {
            let _ = PyErr::take(py);
        }
    });
}

/// A capsule handed to `tile_py.hold`: claimed as a launch claims it ([`claim_capsule`]) when
/// it is not consumed yet; when it is (`used_dltensor[_versioned]`: a launcher consumed it),
/// its tensor, whose deleter the caller hands over to tile_py.
pub(crate) enum HeldCapsule {
    Claimed(Tensor),
    /// The tensor of a consumed capsule, taken over unread (its descriptor may be one tile
    /// would not launch on: the launcher's work uses its memory all the same, so it is never
    /// refused, and never released early). The capsule keeps its name (it is `used_*` already)
    /// and its destructor is cleared, as [`claim_capsule`] clears it.
    TakenOver(TakenCapsule),
}

/// A consumed capsule's tensor taken over by `tile_py.hold`, with what is needed to give it
/// back: the capsule and the destructor it had (cleared while tile_py holds the tensor, since
/// one that calls the deleter whatever the name would delete it when the capsule dies).
pub(crate) struct TakenCapsule {
    taken: Taken,
    capsule: Py<PyAny>,
    destructor: Option<ffi::PyCapsule_Destructor>,
}

impl TakenCapsule {
    /// The tensor, whose deleter tile_py now runs once.
    pub(crate) fn into_taken(self) -> Taken {
        self.taken
    }

    /// Gives the duty back to the caller (a refused hold): the deleter is not run, and the
    /// capsule gets its destructor back.
    pub(crate) fn give_back(self, py: Python<'_>) {
        let TakenCapsule {
            taken,
            capsule,
            destructor,
        } = self;
        std::mem::forget(taken);
        let cap = capsule.bind(py);
        with_critical_section(cap, || {
            // SAFETY: `cap` is a valid capsule; `destructor` is the one it had when taken.
            if unsafe { ffi::PyCapsule_SetDestructor(cap.as_ptr(), destructor) } != 0 {
                let _ = PyErr::take(py);
            }
        });
    }
}

/// Reads a capsule for `tile_py.hold` (see [`HeldCapsule`]); refuses what [`claim_capsule`]
/// refuses but a consumed capsule.
///
/// # Safety
///
/// When the capsule is named `used_*`, the caller hands over the duty to call its tensor's
/// deleter, which nobody has called yet and nobody else calls: the `Taken` runs it once, when
/// dropped (a caller that gives it back calls [`TakenCapsule::give_back`] instead).
pub(crate) unsafe fn hold_capsule(
    py: Python<'_>,
    index: usize,
    cap: &Bound<'_, PyAny>,
) -> PyResult<HeldCapsule> {
    let consumed = with_critical_section(cap, || {
        let (named, ptr) = capsule_contents(py, index, cap)?;
        let mut destructor = None;
        if named.by_tile_py {
            // Its deleter is tile_py's already (a launch or hold holds it, or one in progress
            // has claimed it): taking it over again would run that deleter twice.
            return Err(arg_err(
                Kind::Value,
                index,
                "DLPack capsule already consumed by tile_py (passed to launch or hold before, or \
                 claimed through another argument of this call): tile_py releases it once; pass \
                 each capsule to tile_py once",
            ));
        }
        if named.consumed {
            // SAFETY: `cap` is a valid capsule (its pointer was just read): a null result means
            // no destructor; clearing it cannot fail.
            destructor = unsafe { ffi::PyCapsule_GetDestructor(cap.as_ptr()) };
            // SAFETY: as above.
            unsafe { ffi::PyCapsule_SetDestructor(cap.as_ptr(), None) };
        }
        Ok::<_, PyErr>(named.consumed.then_some((named.versioned, ptr, destructor)))
    })?;
    match consumed {
        // SAFETY: the capsule is named `used_dltensor[_versioned]`, so its pointer (not null:
        // `capsule_contents` refuses null) is that kind of tensor, valid until its deleter
        // runs: this function's contract says that nobody has run it or will, but the `Taken`.
        Some((versioned, ptr, destructor)) => {
            let taken = if versioned {
                // SAFETY: as above.
                unsafe { Taken::versioned(ptr.cast()) }
            } else {
                // SAFETY: as above, for a legacy tensor.
                unsafe { Taken::legacy(ptr.cast()) }
            };
            Ok(HeldCapsule::TakenOver(TakenCapsule {
                taken: taken.expect("capsule_contents refuses null"),
                capsule: cap.clone().unbind(),
                destructor,
            }))
        }
        None => claim_capsule(py, index, cap).map(HeldCapsule::Claimed),
    }
}
