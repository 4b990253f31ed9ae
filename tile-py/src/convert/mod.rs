//! Turning Python arguments into tile-launch arguments: the DLPack stream handshake, capsule
//! consumption, the DLPack C exchange API, `__cuda_array_interface__`, scalars, and the launch
//! configuration.
//!
//! Everything here runs before anything is launched. A tensor argument is *claimed* when it is
//! converted: a capsule is renamed `used_dltensor[_versioned]` at once (inside a critical section,
//! so that two threads cannot both take it), an exchange-API or `__cuda_array_interface__`
//! tensor is owned outright. When the launch does not go ahead, dropping the [`Converted`]
//! undoes every claim that tile-launch did not consume: a capsule gets its name back (so a caller's
//! capsule can be used again, and a capsule made by `__dlpack__` for us runs its deleter through
//! its destructor when we drop it), an owned tensor is released.

use std::cell::Cell;
use std::ffi::{CStr, c_void};
use std::sync::atomic::Ordering;

use cuda_sys::CUstream;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::critical_section::with_critical_section;
use pyo3::types::{PyBool, PyCapsule, PyDict, PyFloat, PyInt, PyTuple, PyType};
use smallvec::SmallVec;
use tile_dlpack::ffi::{
    DLDataType, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackVersion,
    DLTensor,
};
use tile_dlpack::{DType, Taken, Unused};
use tile_launch::{Arg, Param, Scalar, ScalarType, TensorArg};

use crate::exceptions::{Kind, arg_err, argument_note, err, show, with_note};
use crate::producers::{self, Family, Screened};
use crate::pytypes::TypeCache;
use crate::release::{COUNTERS, PyGuard, defer_release};

mod cai;
mod capsule;
mod exchange;
mod handshake;
mod scalar;

pub(crate) use cai::*;
pub(crate) use capsule::*;
pub(crate) use exchange::*;
pub(crate) use handshake::*;
pub(crate) use scalar::*;

/// What the launch tells producers and the stream it launches on.
#[derive(Debug)]
pub(crate) struct Handshake {
    /// The value passed as `__dlpack__(stream=...)` to CUDA producers: the launch stream's
    /// handle, 1 for the legacy default stream, 2 for the per-thread default stream, or -1 when
    /// the caller opted out of synchronisation (`sync=False`).
    pub dlpack_stream: i64,
    /// Whether to order the launch after the producers' pending work.
    pub sync: bool,
    /// The launch stream's device ordinal.
    pub device: i32,
    /// CuPy's current stream on `device`, read at the launch's first CuPy array (see
    /// [`family_offer`]).
    pub cupy: Cell<FamilyStream>,
    /// The `stream=` value last offered to a `__dlpack__`, as a Python int: made once per
    /// launch rather than once per tensor ([`Handshake::stream_object`]).
    offered: std::cell::RefCell<Option<(i64, Py<PyAny>)>>,
}

impl Handshake {
    /// The handshake of a launch on a stream whose `__dlpack__` value is `dlpack_stream` (-1
    /// when `sync` is false), on device `device`.
    pub(crate) fn new(dlpack_stream: i64, sync: bool, device: i32) -> Handshake {
        Handshake {
            dlpack_stream: if sync {
                dlpack_stream
            } else {
                crate::stream_arg::NO_SYNC
            },
            sync,
            device,
            cupy: Cell::new(FamilyStream::Unread),
            offered: std::cell::RefCell::new(None),
        }
    }

    /// `value` as a Python int, the one made for this launch's last offer when it is the same.
    pub(crate) fn stream_object<'py>(
        &self,
        py: Python<'py>,
        value: i64,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Ok(last) = self.offered.try_borrow()
            && let Some((v, obj)) = &*last
            && *v == value
        {
            return Ok(obj.bind(py).clone());
        }
        let obj = value.into_pyobject(py)?.into_any();
        if let Ok(mut last) = self.offered.try_borrow_mut() {
            *last = Some((value, obj.clone().unbind()));
        }
        Ok(obj)
    }
}

/// How one tensor argument was taken.
pub(crate) enum Claim {
    /// A capsule we renamed and whose destructor we cleared; on rollback both are restored.
    Capsule {
        capsule: Py<PyAny>,
        restore: &'static CStr,
        destructor: Option<ffi::PyCapsule_Destructor>,
    },
    /// A tensor we own outright (exchange API, or built from `__cuda_array_interface__`);
    /// on rollback it is released.
    Owned(*mut DLManagedTensorVersioned),
}

// SAFETY: `Owned` holds a managed tensor we own exclusively; DLPack deleters may be called from
// any thread. The capsule is a `Py`, which is `Send`.
unsafe impl Send for Claim {}

/// Arguments (and per-argument state) held inline by a launch; more spill to the heap.
pub(crate) const INLINE: usize = tile_launch::INLINE_ARGS;

/// Per-argument claims of one launch.
pub(crate) type Claims = SmallVec<[Option<Claim>; INLINE]>;

/// The converted argument list of one launch and what converting it claimed. It rolls back
/// when dropped: every claim still held is undone (a capsule gets its name back, an owned
/// tensor is released) and the owners are released through the release queue — unless
/// [`Converted::commit`] said tile-launch consumed the tensors. A claim whose tensor was
/// consumed alone is taken out of [`Converted::claims`].
pub(crate) struct Converted {
    pub args: tile_launch::Args<'static>,
    /// Per argument: how a tensor was claimed (`None` for scalars and consumed tensors).
    pub claims: Claims,
    /// Python objects the launch must keep alive (`__cuda_array_interface__` exporters).
    pub owners: Vec<Py<PyAny>>,
    /// Set by [`Converted::commit`].
    committed: bool,
}

impl Converted {
    /// Nothing converted yet.
    #[inline]
    pub(crate) fn new() -> Converted {
        Converted {
            args: tile_launch::Args::new(),
            claims: SmallVec::new(),
            owners: Vec::new(),
            committed: false,
        }
    }

    /// Every tensor was consumed by tile-launch (launched, or released by a launch refused
    /// after its check): nothing is handed back when it drops; its claims and our references to
    /// the owners (the launch's guards hold their own) are then only dropped.
    #[inline]
    pub(crate) fn commit(&mut self) {
        self.committed = true;
    }

    /// Rolls back now, then runs the queued releases, as a refused launch does.
    pub(crate) fn abandon(&mut self, py: Python<'_>) {
        self.roll_back();
        crate::release::drain(py);
    }

    #[cold]
    #[inline(never)]
    fn roll_back(&mut self) {
        // The `Unused` values first (dropping one does nothing), then their claims.
        self.args.clear();
        for claim in self.claims.drain(..).flatten() {
            match claim {
                Claim::Capsule {
                    capsule,
                    restore,
                    destructor,
                } => {
                    Python::attach(|py| unclaim_capsule(py, capsule.bind(py), restore, destructor));
                }
                Claim::Owned(ptr) => release_owned(ptr),
            }
        }
        for o in self.owners.drain(..) {
            defer_release(crate::release::Release::Object(o));
        }
    }
}

impl Drop for Converted {
    fn drop(&mut self) {
        let nothing_held = self.claims.is_empty() && self.owners.is_empty();
        if !(self.committed || nothing_held) {
            self.roll_back();
        }
    }
}

/// Takes over and releases (through the queue) a tensor we own outright.
fn release_owned(ptr: *mut DLManagedTensorVersioned) {
    // SAFETY: `ptr` is a managed tensor we own exclusively (exchange API export or our own
    // `__cuda_array_interface__` descriptor), not consumed yet, valid until its deleter runs.
    let unused = unsafe { Unused::from_versioned(ptr) };
    // On `Err` the deleter has already run (tile-dlpack's contract): counted as taken and
    // released, as every export tile_py releases is; on `Ok` it runs when the queue is drained.
    COUNTERS.consumed.fetch_add(1, Ordering::Relaxed);
    match unused.consume() {
        Ok(used) => drop(PyGuard::tensor(used)),
        Err(_) => {
            COUNTERS.released.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Converts `args` against the declared `params`. On error, everything claimed so far is
/// rolled back before returning.
pub(crate) fn convert_args(
    py: Python<'_>,
    params: &[Param],
    args: &[Bound<'_, PyAny>],
    hs: &Handshake,
) -> PyResult<Converted> {
    let mut out = Converted::new();
    convert_args_into(py, params, args, hs, &mut out)?;
    Ok(out)
}

/// As [`convert_args`], into `out` (empty), whose arguments (a `tile_launch::Args`) the launch
/// path hands to the check as they are. On error, `out` is left
/// empty, everything claimed rolled back.
pub(crate) fn convert_args_into(
    py: Python<'_>,
    params: &[Param],
    args: &[Bound<'_, PyAny>],
    hs: &Handshake,
    out: &mut Converted,
) -> PyResult<()> {
    converting(py, args, out, |out, at| {
        convert_each(py, params, args, hs, out, at)
    })
}

/// Runs `each`, which converts `args` into `out` one by one and sets `at` to the index it is
/// converting; on error, or a panic, rolls `out` back and returns the error, naming the
/// argument. Shared by the launch's conversion and `tile_py.hold`'s.
pub(crate) fn converting(
    py: Python<'_>,
    args: &[Bound<'_, PyAny>],
    out: &mut Converted,
    each: impl FnOnce(&mut Converted, &mut usize) -> PyResult<()>,
) -> PyResult<()> {
    // A panic while converting (a bug in tile-py or a dependency) must not skip the rollback:
    // it would leave earlier capsules renamed `used_*` forever and leak owned tensors. It is
    // caught here, everything claimed so far is rolled back, and it becomes a `RuntimeError`.
    // `catch_unwind` costs nothing unless a panic happens.
    let mut at = 0usize;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| each(out, &mut at)));
    let e = match r {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(e)) => match same_capsule_as(args, at) {
            // Claimed by an earlier argument of this call, which is rolled back below: say so,
            // rather than "already consumed".
            Some(earlier) => arg_err(
                Kind::Value,
                at,
                format!(
                    "the same DLPack capsule as argument {earlier}; a capsule can be consumed \
                     only once, so pass a tensor once per launch or export it again"
                ),
            ),
            None => noted(py, e, at),
        },
        Err(payload) => {
            let what = crate::exceptions::panic_text(&*payload, "unknown panic");
            arg_err(
                Kind::Runtime,
                at,
                format!("internal error in tile_py while converting it (a bug): {what}"),
            )
        }
    };
    out.abandon(py);
    Err(e)
}

/// The earlier argument that is the very capsule object `args[at]`, if any. Error path only.
pub(crate) fn same_capsule_as(args: &[Bound<'_, PyAny>], at: usize) -> Option<usize> {
    let obj = args.get(at)?;
    if obj.cast::<PyCapsule>().is_err() {
        return None;
    }
    args[..at].iter().position(|earlier| earlier.is(obj))
}

/// `e` with the note [`argument_note`], unless it already names the argument
/// (its message starts with `argument {index}:`, or it has that note). Error path only.
fn noted(py: Python<'_>, e: PyErr, index: usize) -> PyErr {
    let note = argument_note(index);
    let value = e.value(py);
    let named = value
        .str()
        .is_ok_and(|m| m.to_string().starts_with(&format!("argument {index}:")))
        || value
            .getattr("__notes__")
            .ok()
            .and_then(|n| n.extract::<Vec<String>>().ok())
            .is_some_and(|n| n.contains(&note));
    if named { e } else { with_note(py, e, note) }
}

/// The loop of [`convert_args`]: converts each argument into `out`; `at` is the index being
/// converted (for the error). Returns at the first error, leaving the rollback to the caller.
fn convert_each(
    py: Python<'_>,
    params: &[Param],
    args: &[Bound<'_, PyAny>],
    hs: &Handshake,
    out: &mut Converted,
    at: &mut usize,
) -> PyResult<()> {
    for (index, (obj, param)) in args.iter().zip(params).enumerate() {
        *at = index;
        let r = match param {
            Param::Scalar(ty) => convert_scalar(index, obj, *ty).map(|s| out.push_scalar(s)),
            _ => convert_tensor(py, index, obj, param, hs).map(|t| out.push_tensor(t)),
        };
        r?;
    }
    Ok(())
}

impl Converted {
    /// Appends a converted tensor: its argument (ordered after the stream the producer named,
    /// if any), its claim and its owner.
    pub(crate) fn push_tensor(&mut self, t: Tensor) {
        let mut arg = TensorArg::from(t.unused);
        if let Some(s) = t.ready_on {
            // SAFETY: `s` is a stream handle the producer reported (its current stream, or the
            // `__cuda_array_interface__` `stream` entry) for memory on the launch stream's
            // device; producers' streams live in the device's primary context.
            arg = unsafe { arg.ready_on(s as CUstream) };
        }
        if t.memory_trusted {
            // SAFETY: set only for PyTorch's C exchange API, whose exports describe memory of
            // torch's own allocators as it is.
            arg = unsafe { arg.trust_memory() };
        }
        self.args.push(Arg::Tensor(arg));
        self.claims.push(Some(t.claim));
        if let Some(o) = t.owner {
            self.owners.push(o);
        }
    }

    /// Appends the claim and the owner of a tensor that is held rather than launched
    /// (`tile_py.hold`), and returns its export, for the caller to consume once every object is
    /// converted: until then a rollback gives the claim back as a launch's.
    pub(crate) fn push_held(&mut self, t: Tensor) -> Unused<'static> {
        self.claims.push(Some(t.claim));
        if let Some(o) = t.owner {
            self.owners.push(o);
        }
        t.unused
    }

    /// Appends a converted scalar.
    pub(crate) fn push_scalar(&mut self, s: Scalar) {
        self.args.push(Arg::Scalar(s));
        self.claims.push(None);
    }
}

/// The parameter a tensor is converted for when its kernel is not known yet (`tile_py.cutile`
/// picks the kernel from the exported layout): an input, as every cuTile array is declared.
/// Its dtype is not looked at while converting (tile-launch checks it against the kernel's).
/// The launch path converts against the declared parameter instead; `tile_py.hold`, which
/// launches nothing, against this one (only what reading a tensor needs is checked).
pub(crate) static ANY_INPUT: Param = Param::Tensor {
    dtype: DType::F32,
    intent: tile_launch::Intent::Read,
    strided: true,
};

/// What a producer type is: its family, its DLPack C exchange API, if any, and whether the
/// type defines `__dlpack__` (then called by name, [`DlpackMethod::OnType`]).
type ProducerType = (Family, Option<ApiPtr>, bool);

thread_local! {
    static LAST_PRODUCER: Cell<(usize, Option<ProducerType>)> = const { Cell::new((0, None)) };
}

/// Per producer type: what it is.
static PRODUCER_TYPES: TypeCache<ProducerType> = TypeCache::new(&LAST_PRODUCER);

/// The family and the exchange API of `obj`'s type, found once per type; the common case, the
/// same type as this thread's last, is a pointer compare.
fn producer_type(py: Python<'_>, obj: &Bound<'_, PyAny>) -> ProducerType {
    PRODUCER_TYPES.of(obj, |ty| {
        (
            producers::classify(ty),
            lookup_exchange_api(py, ty),
            crate::pytypes::defined_on_type(ty, intern!(py, "__dlpack__")),
        )
    })
}

pub(crate) struct Tensor {
    unused: Unused<'static>,
    claim: Claim,
    ready_on: Option<usize>,
    owner: Option<Py<PyAny>>,
    /// Whether the producer is trusted to describe its memory (see
    /// [`TensorArg::trust_memory`](tile_launch::TensorArg::trust_memory)).
    memory_trusted: bool,
}

impl Tensor {
    /// The validated view of the exported descriptor (validated once: the launch's check
    /// reuses it).
    pub(crate) fn view(&self) -> Result<tile_dlpack::TensorView<'_>, tile_dlpack::DescriptorError> {
        self.unused.peek()
    }

    /// Whether the tensor's dtype is complex, read through tile-dlpack's validation (which the
    /// launch's check then reuses: the descriptor is validated once). A descriptor that does
    /// not validate counts as complex here (the producer is asked); the launch refuses it.
    fn is_complex(&self) -> bool {
        match self.unused.peek() {
            Ok(view) => view.dtype().code == tile_dlpack::ffi::DLDataTypeCode::COMPLEX.0,
            Err(_) => true,
        }
    }

    /// Releases an owned export that will not be launched (a capsule is given back by the
    /// caller's rollback instead).
    pub(crate) fn release(self) {
        let Tensor { unused, claim, .. } = self;
        drop(unused);
        if let Claim::Owned(ptr) = claim {
            release_owned(ptr);
        }
    }
}

fn expected_tensor(param: &Param) -> String {
    format!("a tensor ({param})")
}

/// Converts and claims the tensor argument `obj` (argument `index`) for `param`: a capsule, a
/// producer's export (its exchange API or `__dlpack__`), or a `__cuda_array_interface__`.
pub(crate) fn convert_tensor(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    param: &Param,
    hs: &Handshake,
) -> PyResult<Tensor> {
    if let Ok(cap) = obj.cast::<PyCapsule>() {
        return claim_capsule(py, index, cap.as_any());
    }
    if let Some(t) = export_producer(py, index, obj, param, hs)? {
        return Ok(t);
    }
    if obj.hasattr(intern!(py, "__cuda_array_interface__"))? {
        return from_cai(py, index, obj, hs);
    }
    Err(arg_err(
        Kind::Type,
        index,
        format!(
            "expected {} (an object with __dlpack__ or __cuda_array_interface__, or a DLPack \
             capsule), got {}",
            expected_tensor(param),
            show(obj)
        ),
    ))
}

/// The claimed export of `obj` (argument `index`, not a capsule) for `param`, when it is a
/// DLPack producer: through its type's C exchange API, else its `__dlpack__` with the stream
/// handshake (after the checks of [`producers::check`]). `None` for an object with neither (a
/// launch then reads its `__cuda_array_interface__`; `tile_py.hold` holds it by reference).
pub(crate) fn export_producer(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    param: &Param,
    hs: &Handshake,
) -> PyResult<Option<Tensor>> {
    let (family, api, on_type) = producer_type(py, obj);
    if let Some(api) = api {
        // Exported first, then checked: the export tells the dtype, which spares the
        // conjugate-bit query for real tensors. A refused tensor's export is released.
        let mut t = from_exchange_api(py, index, obj, api, hs)?;
        if family != Family::Plain {
            let complex = t.is_complex();
            if let Err(e) = producers::check(index, obj, family, param, false, Some(complex)) {
                t.release();
                return Err(e);
            }
        }
        // PyTorch's exchange API exports its own allocator's memory, described as it is: the
        // launch's pointer-memory query (one driver call per tensor) is skipped for it.
        t.memory_trusted = family == Family::Torch;
        return Ok(Some(t));
    }
    let detached;
    let (obj, on_type) = match producers::check(index, obj, family, param, true, None)? {
        Screened::AsIs => (obj, on_type),
        // Another object (a detached torch tensor): its own type decides.
        Screened::Detached(d) => {
            detached = d;
            (&detached, producer_type(py, &detached).2)
        }
    };
    let method = if on_type {
        Some(DlpackMethod::OnType)
    } else {
        obj.getattr_opt(intern!(py, "__dlpack__"))?
            .map(DlpackMethod::Attr)
    };
    if let Some(method) = method {
        let offer = match family {
            Family::Cupy => family_offer(py, hs),
            _ => offered_stream(hs),
        };
        // `None`: the class lost `__dlpack__` since its type was first seen; as an object
        // without one.
        if let Some((cap, ready_on)) = call_dlpack(py, index, obj, &method, hs, offer)? {
            let mut t = claim_capsule(py, index, &cap)?;
            t.ready_on = ready_on;
            return Ok(Some(t));
        }
    }
    Ok(None)
}
