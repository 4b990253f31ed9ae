//! Turning Python arguments into tile-launch arguments: the DLPack stream handshake, capsule
//! consumption, the DLPack C exchange API, `__cuda_array_interface__`, scalars, and the launch
//! configuration.
//!
//! Everything here runs before anything is launched. A tensor argument is *claimed* when it is
//! converted: a capsule is renamed `used_dltensor[_versioned]` at once (inside a critical section,
//! so that two threads cannot both take it), an exchange-API or `__cuda_array_interface__`
//! tensor is owned outright. When the launch does not go ahead, [`Converted::rollback`] undoes
//! every claim that tile-launch did not consume: a capsule gets its name back (so a caller's
//! capsule can be used again, and a capsule made by `__dlpack__` for us runs its deleter through
//! its destructor when we drop it), an owned tensor is released.

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::sync::Mutex;
use std::sync::atomic::Ordering;

use cuda_sys::CUstream;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::critical_section::with_critical_section;
use pyo3::types::{PyBool, PyCapsule, PyDict, PyFloat, PyInt, PyList, PyTuple, PyType};
use smallvec::SmallVec;
use tile_dlpack::ffi::{
    DLDataType, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPackExchangeAPI, DLPackVersion,
    DLTensor,
};
use tile_dlpack::{DType, Unused};
use tile_launch::{Arg, Dim3, LaunchConfig, Param, Scalar, ScalarType, TensorArg};

use crate::errors::{Kind, arg_err, err, show, with_note};
use crate::producers::{self, Checked, Family};
use crate::release::{COUNTERS, PyGuard, defer_release};

/// What the launch tells producers and the stream it launches on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Handshake {
    /// The value passed as `__dlpack__(stream=...)` to CUDA producers: the launch stream's
    /// handle, 1 for the legacy default stream, 2 for the per-thread default stream, or -1 when
    /// the caller opted out of synchronisation (`sync=False`).
    pub dlpack_stream: i64,
    /// Whether to order the launch after the producers' pending work.
    pub sync: bool,
    /// The launch stream's device ordinal.
    pub device: i32,
}

/// How one tensor argument was taken.
pub(crate) enum Claim {
    /// A capsule we renamed; on rollback its name is restored.
    Capsule {
        capsule: Py<PyAny>,
        restore: &'static CStr,
    },
    /// A tensor we own outright (exchange API, or built from `__cuda_array_interface__`);
    /// on rollback it is released.
    Owned(*mut DLManagedTensorVersioned),
}

// SAFETY: `Owned` holds a managed tensor we own exclusively; DLPack deleters may be called from
// any thread. The capsule is a `Py`, which is `Send`.
unsafe impl Send for Claim {}

/// Per-argument state held inline (no allocation) for up to this many arguments.
const INLINE: usize = 8;

/// Per-argument claims of one launch.
pub(crate) type Claims = SmallVec<[Option<Claim>; INLINE]>;

/// The converted argument list of one launch.
pub(crate) struct Converted {
    pub args: SmallVec<[Arg<'static>; INLINE]>,
    /// Per argument: how a tensor was claimed (`None` for scalars).
    pub claims: Claims,
    /// Python objects the launch must keep alive (`__cuda_array_interface__` exporters).
    pub owners: Vec<Py<PyAny>>,
}

impl Converted {
    /// Undoes every claim whose tensor was not consumed (`consumed[i]` is false), after the
    /// `Unused` values have been dropped. Owners are released through the release queue.
    pub(crate) fn rollback(claims: Claims, owners: Vec<Py<PyAny>>, consumed: &[bool]) {
        for (i, claim) in claims.into_iter().enumerate() {
            if consumed.get(i).copied().unwrap_or(false) {
                continue;
            }
            match claim {
                None => {}
                Some(Claim::Capsule { capsule, restore }) => {
                    Python::attach(|py| unclaim_capsule(py, capsule.bind(py), restore));
                }
                Some(Claim::Owned(ptr)) => release_owned(ptr),
            }
        }
        for o in owners {
            defer_release(crate::release::Release::Object(o));
        }
    }
}

/// Takes over and releases (through the queue) a tensor we own outright.
fn release_owned(ptr: *mut DLManagedTensorVersioned) {
    // SAFETY: `ptr` is a managed tensor we own exclusively (exchange API export or our own
    // `__cuda_array_interface__` descriptor), not consumed yet, valid until its deleter runs.
    let unused = unsafe { Unused::from_versioned(ptr) };
    // On `Err` the deleter has already run (tile-dlpack's contract); on `Ok` it runs when the
    // queue is drained.
    if let Ok(used) = unused.consume() {
        COUNTERS.consumed.fetch_add(1, Ordering::Relaxed);
        drop(PyGuard::tensor(used));
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
    let mut out = Converted {
        args: SmallVec::new(),
        claims: SmallVec::new(),
        owners: Vec::new(),
    };
    // A panic while converting (a bug in tile-py or a dependency) must not skip the rollback:
    // it would leave earlier capsules renamed `used_*` forever and leak owned tensors. It is
    // caught here, everything claimed so far is rolled back, and it becomes a `RuntimeError`.
    // `catch_unwind` costs nothing unless a panic happens.
    let mut at = 0usize;
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        convert_each(py, params, args, hs, &mut out, &mut at)
    }));
    let e = match r {
        Ok(Ok(())) => return Ok(out),
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
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            arg_err(
                Kind::Runtime,
                at,
                format!("internal error in tile_py while converting it (a bug): {what}"),
            )
        }
    };
    let Converted {
        args,
        claims,
        owners,
    } = out;
    drop(args);
    Converted::rollback(claims, owners, &[]);
    crate::release::drain(py);
    Err(e)
}

/// The earlier argument that is the very capsule object `args[at]`, if any. Error path only.
fn same_capsule_as(args: &[Bound<'_, PyAny>], at: usize) -> Option<usize> {
    let obj = args.get(at)?;
    if obj.cast::<PyCapsule>().is_err() {
        return None;
    }
    args[..at].iter().position(|earlier| earlier.is(obj))
}

/// `e` with the note `while converting argument {index}`, unless it already names the argument
/// (its message starts with `argument {index}:`, or it has that note). Error path only.
fn noted(py: Python<'_>, e: PyErr, index: usize) -> PyErr {
    let note = format!("while converting argument {index}");
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
            Param::Scalar(ty) => convert_scalar(index, obj, *ty).map(|s| {
                out.args.push(Arg::Scalar(s));
                out.claims.push(None);
            }),
            _ => convert_tensor(py, index, obj, param, hs).map(|t| {
                let mut arg = TensorArg::from(t.unused);
                if let Some(s) = t.ready_on {
                    // SAFETY: `s` is a stream handle the producer reported (its current stream,
                    // or the `__cuda_array_interface__` `stream` entry) for memory on the launch
                    // stream's device; producers' streams live in the device's primary context.
                    arg = unsafe { arg.ready_on(s as CUstream) };
                }
                if t.memory_trusted {
                    // SAFETY: set only for PyTorch's C exchange API, whose exports describe
                    // memory of torch's own allocators as it is.
                    arg = unsafe { arg.trust_memory() };
                }
                out.args.push(Arg::Tensor(arg));
                out.claims.push(Some(t.claim));
                if let Some(o) = t.owner {
                    out.owners.push(o);
                }
            }),
        };
        r?;
    }
    Ok(())
}

struct Tensor {
    unused: Unused<'static>,
    claim: Claim,
    ready_on: Option<usize>,
    owner: Option<Py<PyAny>>,
    /// Whether the producer is trusted to describe its memory (see
    /// [`TensorArg::trust_memory`](tile_launch::TensorArg::trust_memory)).
    memory_trusted: bool,
}

fn expected_tensor(param: &Param) -> String {
    format!("a tensor ({param})")
}

fn convert_tensor(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    param: &Param,
    hs: &Handshake,
) -> PyResult<Tensor> {
    if let Ok(cap) = obj.cast::<PyCapsule>() {
        return claim_capsule(py, index, cap.as_any());
    }
    let family = producers::family(obj);
    let api = exchange_api(py, obj);
    let detached;
    let obj = match producers::check(index, obj, family, param, api.is_none())? {
        Checked::AsIs => obj,
        Checked::Detached(d) => {
            detached = d;
            &detached
        }
    };
    if let Some(api) = api {
        let mut t = from_exchange_api(py, index, obj, api, hs)?;
        // PyTorch's exchange API exports its own allocator's memory, described as it is: the
        // launch's pointer-memory query (one driver call per tensor) is skipped for it.
        t.memory_trusted = family == Family::Torch;
        return Ok(t);
    }
    if let Some(method) = obj.getattr_opt(intern!(py, "__dlpack__"))? {
        let (cap, ready_on) = call_dlpack(py, index, obj, &method, hs)?;
        let mut t = claim_capsule(py, index, &cap)?;
        t.ready_on = ready_on;
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

// ---- capsules -------------------------------------------------------------------------------

/// Checks the capsule's name, takes its pointer and renames it `used_*`, atomically with
/// respect to other threads doing the same.
fn claim_capsule(py: Python<'_>, index: usize, cap: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    let claimed = with_critical_section(
        cap,
        || -> PyResult<(bool, *mut c_void, &'static CStr)> {
            // SAFETY: `cap` is a capsule (checked by the caller); the name pointer stays valid
            // while the capsule keeps this name, and we are inside the capsule's critical section.
            let name_ptr = unsafe { ffi::PyCapsule_GetName(cap.as_ptr()) };
            if name_ptr.is_null() {
                let _ = PyErr::take(py);
                return Err(arg_err(
                    Kind::Type,
                    index,
                    "expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', got a \
                 capsule with no name",
                ));
            }
            // SAFETY: non-null capsule names are NUL-terminated C strings.
            let name = unsafe { CStr::from_ptr(name_ptr) };
            let (versioned, used, restore): (bool, &'static CStr, &'static CStr) = match name
                .to_bytes()
            {
                b"dltensor" => (false, c"used_dltensor", c"dltensor"),
                b"dltensor_versioned" => (true, c"used_dltensor_versioned", c"dltensor_versioned"),
                b"used_dltensor" | b"used_dltensor_versioned" => {
                    return Err(arg_err(
                        Kind::Value,
                        index,
                        format!(
                            "DLPack capsule already consumed (its name is {:?})",
                            name.to_string_lossy()
                        ),
                    ));
                }
                other => {
                    return Err(arg_err(
                        Kind::Type,
                        index,
                        format!(
                            "expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', got \
                         a capsule named {:?}",
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
            // SAFETY: `used` is a 'static C string, as `PyCapsule_SetName` keeps the pointer.
            if unsafe { ffi::PyCapsule_SetName(cap.as_ptr(), used.as_ptr()) } != 0 {
                return Err(PyErr::fetch(py));
            }
            Ok((versioned, ptr, restore))
        },
    )?;
    let (versioned, ptr, restore) = claimed;
    let unused = if versioned {
        // SAFETY: the capsule was named `dltensor_versioned`, so it holds a
        // `DLManagedTensorVersioned` the producer keeps valid until its deleter runs; we renamed
        // it, so nobody else consumes it while we hold the claim.
        unsafe { Unused::from_versioned(ptr.cast()) }
    } else {
        // SAFETY: as above, for a legacy `DLManagedTensor` (`dltensor`).
        unsafe { Unused::from_legacy(ptr.cast()) }
    };
    Ok(Tensor {
        unused,
        claim: Claim::Capsule {
            capsule: cap.clone().unbind(),
            restore,
        },
        ready_on: None,
        owner: None,
        memory_trusted: false,
    })
}

/// Gives a claimed capsule its original name back (the tensor was not consumed).
fn unclaim_capsule(py: Python<'_>, cap: &Bound<'_, PyAny>, restore: &'static CStr) {
    with_critical_section(cap, || {
        // SAFETY: `cap` is a capsule we renamed; `restore` is a 'static C string.
        if unsafe { ffi::PyCapsule_SetName(cap.as_ptr(), restore.as_ptr()) } != 0 {
            // Cannot fail for a valid capsule; if it did, the capsule stays marked consumed
            // and its tensor leaks rather than being freed twice.
            let _ = PyErr::take(py);
        }
    });
}

// ---- __dlpack__ handshake -----------------------------------------------------------------

/// The keywords tile_py passes to `__dlpack__`; the only ones whose rejection is retried.
const OUR_KEYWORDS: [&str; 4] = ["max_version", "dl_device", "copy", "stream"];

/// What a `TypeError` raised by a `__dlpack__` call says about the call's own arguments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rejection {
    /// The call did not bind because of `max_version` (a producer older than DLPack 1.0).
    MaxVersion,
    /// The call did not bind because of a keyword `stream` (a method that takes no keywords,
    /// or a positional-only `stream`).
    StreamKeyword,
    /// The call did not bind at all: too many positional arguments (`__dlpack__(self)`).
    Positional,
    /// The call did not bind, without saying which argument: pybind11's and nanobind's
    /// "incompatible function arguments".
    Binding,
    /// Anything else, the producer's own error: never retried.
    Producer,
}

/// The number of frames in `e`'s traceback. An argument-binding `TypeError` is raised before
/// the called function's frame runs: none for a call from here into a Python function, one
/// when a wrapper's `__dlpack__(*args, **kwargs)` forwards to the real one, or for the frame
/// Cython adds to its own binding errors.
fn traceback_depth(py: Python<'_>, e: &PyErr) -> usize {
    let mut depth = 0;
    let mut tb = e.traceback(py).map(Bound::into_any);
    while let Some(t) = tb {
        depth += 1;
        tb = t
            .getattr(intern!(py, "tb_next"))
            .ok()
            .filter(|n| !n.is_none());
    }
    depth
}

/// Classifies a `__dlpack__` call's exception. Only a `TypeError` raised at the call boundary
/// (traceback at most one frame deep: see [`traceback_depth`]) whose message is CPython's /
/// Cython's / PyO3's binding error about a keyword tile_py passed (`... got an unexpected
/// keyword argument 'max_version'`, `... takes no keyword arguments`, `... positional-only
/// arguments passed as keyword arguments: 'stream'`, pybind11's / nanobind's `incompatible
/// function arguments`) is a rejection of our call; a `TypeError` from deeper in the producer,
/// or naming another keyword, is the producer's own.
fn rejection(py: Python<'_>, e: &PyErr) -> Rejection {
    if !e.is_instance_of::<PyTypeError>(py) || traceback_depth(py, e) > 1 {
        return Rejection::Producer;
    }
    let m = e.value(py).to_string();
    let names = |k: &str| m.contains(&format!("'{k}'")) || m.contains(&format!("\"{k}\""));
    let about_keyword = m.contains("unexpected keyword argument")
        || m.contains("positional-only arguments passed as keyword");
    if about_keyword {
        return match OUR_KEYWORDS.iter().find(|k| names(k)) {
            Some(&"stream") => Rejection::StreamKeyword,
            Some(_) => Rejection::MaxVersion,
            None => Rejection::Producer,
        };
    }
    if m.contains("takes no keyword arguments") {
        return Rejection::StreamKeyword;
    }
    if m.contains("positional argument") && m.contains("were given") {
        return Rejection::Positional;
    }
    if m.contains("incompatible function arguments") {
        return Rejection::Binding;
    }
    Rejection::Producer
}

/// The ways `__dlpack__` is called, most keywords first. Each passes the stream: a call
/// without it would export with no ordering after the producer's pending work.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keywords {
    /// `stream=..., max_version=(1, 3)`.
    StreamAndVersion,
    /// `stream=...` only (DLPack before 1.0).
    Stream,
    /// `__dlpack__(stream)`, for a method that takes no keywords or a positional-only `stream`.
    Positional,
}

impl Keywords {
    /// The next way to call after `rejection`, if any.
    fn after(self, rejection: Rejection) -> Option<Keywords> {
        match (self, rejection) {
            (Keywords::StreamAndVersion, Rejection::MaxVersion | Rejection::Binding) => {
                Some(Keywords::Stream)
            }
            (Keywords::StreamAndVersion | Keywords::Stream, Rejection::StreamKeyword)
            | (Keywords::Stream, Rejection::Binding) => Some(Keywords::Positional),
            _ => None,
        }
    }
}

/// The `stream=` value offered to a `__dlpack__` producer for the launch, and the stream the
/// export is then ordered on (`ready_on`, a raw handle), when that is not the launch stream.
///
/// The per-thread default stream (2) is optional for producers, and PyTorch refuses it
/// (`BufferError`): the export is asked for on the legacy default stream (1) instead, which
/// every CUDA producer supports, and the launch stream waits for the legacy stream on the
/// device (an event, through [`TensorArg::ready_on`](tile_launch::TensorArg::ready_on)).
fn offered_stream(hs: &Handshake) -> (i64, Option<usize>) {
    if hs.sync && hs.dlpack_stream == 2 {
        (1, Some(0))
    } else {
        (hs.dlpack_stream, None)
    }
}

/// `obj.__dlpack__(stream=..., max_version=(1, 3))` (`method` is `obj.__dlpack__`), retried
/// only when the producer rejected a keyword tile_py passed (see [`rejection`]): without
/// `max_version` for a producer older than DLPack 1.0, then with the stream positionally for a
/// method that takes no keywords. The stream is never dropped: a `__dlpack__` that takes no
/// stream is refused (`TypeError`), since its export could not be ordered after the producer's
/// work. Any other exception (a `TypeError` of the producer's own included) propagates after
/// that one call, with nothing exported. Every call starts with all keywords: what one
/// instance accepted says nothing about the next (a wrapper type forwards to objects of any
/// age), and a producer never offered `max_version` returns a legacy capsule without the
/// read-only flag. The common case, a producer that takes all keywords, is one call.
///
/// The launch stream is offered first (see [`offered_stream`] for the per-thread default
/// stream), without asking `__dlpack_device__()` (a Python call per tensor on the hot path):
/// the consumer reads the device from the returned tensor anyway. A host (CPU) producer must
/// refuse a stream (DLPack allows only `stream=None` there; NumPy raises `RuntimeError`), so
/// only when `__dlpack__` raises is `__dlpack_device__()` asked: if it says CPU the argument
/// is refused as host memory (tile_py passes no host-visible parameters) without calling
/// `__dlpack__` again, the producer's exception as the cause; otherwise the producer's
/// exception propagates. A CPU producer that accepts the stream returns a capsule that the
/// device check refuses and the rollback gives back, unconsumed.
///
/// Returns the capsule and the stream its export is ordered on, when that is not the launch
/// stream.
fn call_dlpack<'py>(
    py: Python<'py>,
    index: usize,
    obj: &Bound<'py, PyAny>,
    method: &Bound<'py, PyAny>,
    hs: &Handshake,
) -> PyResult<(Bound<'py, PyAny>, Option<usize>)> {
    static MAX_VERSION: pyo3::sync::PyOnceLock<Py<PyTuple>> = pyo3::sync::PyOnceLock::new();
    let (stream, ready_on) = offered_stream(hs);
    let mut kw = Keywords::StreamAndVersion;
    let r = loop {
        let r = match kw {
            Keywords::Positional => method.call1((stream,)),
            _ => {
                let kwargs = PyDict::new(py);
                kwargs.set_item(intern!(py, "stream"), stream)?;
                if kw == Keywords::StreamAndVersion {
                    let v = MAX_VERSION.get_or_try_init(py, || {
                        PyTuple::new(py, [1u32, 3u32]).map(Bound::unbind)
                    })?;
                    kwargs.set_item(intern!(py, "max_version"), v.bind(py))?;
                }
                method.call((), Some(&kwargs))
            }
        };
        match r {
            Err(e) => {
                let why = rejection(py, &e);
                match kw.after(why) {
                    Some(next) => kw = next,
                    None if kw == Keywords::Positional
                        && matches!(why, Rejection::Positional | Rejection::Binding) =>
                    {
                        let refused = arg_err(
                            Kind::Type,
                            index,
                            format!(
                                "{}.__dlpack__ takes no stream argument, so its export could not \
                                 be ordered after the producer's pending work (tile_py always \
                                 passes the launch stream); synchronize the producer and pass \
                                 the capsule of its __dlpack__() instead",
                                show(obj)
                            ),
                        );
                        refused.set_cause(py, Some(e));
                        return Err(refused);
                    }
                    None => break Err(e),
                }
            }
            ok => break ok,
        }
    };
    let cap = match r {
        Ok(cap) => cap,
        Err(e) => return Err(host_or(py, index, obj, hs, e)),
    };
    if cap.cast::<PyCapsule>().is_err() {
        return Err(arg_err(
            Kind::Type,
            index,
            format!(
                "__dlpack__() returned {}, expected a DLPack capsule",
                show(&cap)
            ),
        ));
    }
    Ok((cap, ready_on))
}

/// The error for a `__dlpack__` call that raised `e`: when the producer's `__dlpack_device__()`
/// says host memory (`kDLCPU`), the host-memory refusal (the same `ValueError` as for a CPU
/// tensor that was exported), with `e` as its cause; otherwise `e` itself, with a note naming
/// the argument. A `__dlpack_device__` that is missing or raises leaves `e` as it is.
fn host_or(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    hs: &Handshake,
    e: PyErr,
) -> PyErr {
    // Only an ordinary exception can be a host producer refusing the stream: an interrupt, an
    // exit or a memory error propagates as it is.
    if !e.is_instance_of::<pyo3::exceptions::PyException>(py)
        || e.is_instance_of::<pyo3::exceptions::PyMemoryError>(py)
    {
        return e;
    }
    let device = match obj.call_method0(intern!(py, "__dlpack_device__")) {
        Ok(d) => Some(d),
        Err(d) if !d.is_instance_of::<pyo3::exceptions::PyException>(py) => return d,
        Err(_) => None,
    };
    let cpu = device
        .and_then(|d| d.extract::<(i64, i64)>().ok())
        .is_some_and(|(t, _)| t == i64::from(DLDeviceType::CPU.0));
    if !cpu {
        return with_note(py, e, format!("while converting argument {index}"));
    }
    let mismatch = tile_launch::Error::DeviceMismatch {
        index,
        tensor: tile_dlpack::Device::CPU,
        stream_device: hs.device,
    };
    let refused = err(
        Kind::Value,
        format!(
            "{mismatch}; {} is host memory (its __dlpack__ refused the launch stream): tile_py \
             accepts device, managed or pinned memory only",
            show(obj)
        ),
    );
    refused.set_cause(py, Some(e));
    refused
}

// ---- DLPack C exchange API ----------------------------------------------------------------

#[derive(Clone, Copy)]
struct ApiPtr(*const DLPackExchangeAPI);
// SAFETY: the exchange API table is immutable and lives for the whole process (DLPack 1.3).
unsafe impl Send for ApiPtr {}

/// Per producer type: its exchange API, if any. Holds the type so its address is not reused.
type ApiCache = HashMap<usize, (Py<PyType>, Option<ApiPtr>)>;
static EXCHANGE_APIS: Mutex<Option<ApiCache>> = Mutex::new(None);

thread_local! {
    /// The last producer type this thread converted and its exchange API: a pointer compare
    /// answers the common case (every argument of the same type) without a lock or a hash.
    /// The type's address cannot be reused while it is cached: [`EXCHANGE_APIS`] holds it.
    static LAST_API: Cell<(usize, Option<ApiPtr>)> = const { Cell::new((0, None)) };
}

/// The exchange API of `obj`'s type; the common case (the same type as this thread's last) is
/// a pointer compare, without touching the type's reference count.
fn exchange_api(py: Python<'_>, obj: &Bound<'_, PyAny>) -> Option<ApiPtr> {
    let key = obj.get_type_ptr() as usize;
    let (last, api) = LAST_API.with(Cell::get);
    if last == key {
        return api;
    }
    let api = exchange_api_slow(py, &obj.get_type());
    LAST_API.with(|c| c.set((key, api)));
    api
}

fn exchange_api_slow(py: Python<'_>, ty: &Bound<'_, PyType>) -> Option<ApiPtr> {
    let key = ty.as_ptr() as usize;
    if let Some(map) = EXCHANGE_APIS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        && let Some((_, api)) = map.get(&key)
    {
        return *api;
    }
    let api = lookup_exchange_api(py, ty);
    EXCHANGE_APIS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, (ty.clone().unbind(), api));
    api
}

fn lookup_exchange_api(py: Python<'_>, ty: &Bound<'_, PyType>) -> Option<ApiPtr> {
    let attr = ty
        .getattr_opt(intern!(py, "__dlpack_c_exchange_api__"))
        .ok()
        .flatten()?;
    let cap = attr.cast::<PyCapsule>().ok()?;
    // SAFETY: `cap` is a capsule; a wrong name makes `PyCapsule_GetPointer` fail with an
    // exception, which we clear.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
    if ptr.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    let api = ptr.cast::<DLPackExchangeAPI>();
    // SAFETY: a capsule named `dlpack_exchange_api` holds a `DLPackExchangeAPI*` valid for the
    // whole process; the header (version) is ABI-stable across versions.
    let version: DLPackVersion = unsafe { (*api).header.version };
    // SAFETY: as above; the layout is that of major version 1, checked first.
    let complete = version.major == 1
        && unsafe {
            (*api).managed_tensor_from_py_object_no_sync.is_some()
                && (*api).current_work_stream.is_some()
        };
    complete.then_some(ApiPtr(api))
}

fn from_exchange_api(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    api: ApiPtr,
    hs: &Handshake,
) -> PyResult<Tensor> {
    let note = |e: PyErr| with_note(py, e, format!("while converting argument {index}"));
    // SAFETY: `api` was checked to be a major-version-1 table with these entries non-null.
    let (from_obj, current_stream) = unsafe {
        (
            (*api.0).managed_tensor_from_py_object_no_sync,
            (*api.0).current_work_stream,
        )
    };
    // Checked when the table was cached; a producer that cleared an entry since gets an error
    // (before anything is exported), not a panic.
    let (Some(from_obj), Some(current_stream)) = (from_obj, current_stream) else {
        return Err(arg_err(
            Kind::Buffer,
            index,
            "the producer's DLPack exchange API table lost an entry after it was first read \
             (managed_tensor_from_py_object_no_sync or current_work_stream is now null)",
        ));
    };
    let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: `obj` is an instance of the type the table came from; `out` is a valid out
    // pointer. The function returns an owning tensor or sets a Python exception.
    let rc = unsafe { from_obj(obj.as_ptr().cast(), &mut out) };
    if rc != 0 || out.is_null() {
        let e = PyErr::take(py).unwrap_or_else(|| {
            arg_err(
                Kind::Buffer,
                index,
                "the producer's DLPack exchange API export failed",
            )
        });
        return Err(note(e));
    }
    let mut ready_on = None;
    // SAFETY: `out` is a live managed tensor we own; the version field is ABI-stable.
    let major = unsafe { (*out).version.major };
    if hs.sync && major == 1 {
        // SAFETY: major version 1: the layout is `DLManagedTensorVersioned`.
        let dev: DLDevice = unsafe { (*out).dl_tensor.device };
        if dev.device_type == DLDeviceType::CUDA || dev.device_type == DLDeviceType::ROCM {
            let mut s: *mut c_void = std::ptr::null_mut();
            // SAFETY: plain values and a valid out pointer.
            let rc = unsafe { current_stream(dev.device_type, dev.device_id, &mut s) };
            if rc != 0 {
                let e = PyErr::take(py).unwrap_or_else(|| {
                    arg_err(
                        Kind::Buffer,
                        index,
                        "the producer's current_work_stream failed",
                    )
                });
                release_owned(out);
                return Err(note(e));
            }
            ready_on = Some(s as usize);
        }
    }
    // SAFETY: `out` is an owning export from the producer, valid until its deleter runs, and
    // nobody else holds it.
    let unused = unsafe { Unused::from_versioned(out) };
    Ok(Tensor {
        unused,
        claim: Claim::Owned(out),
        ready_on,
        owner: None,
        memory_trusted: false,
    })
}

// ---- __cuda_array_interface__ -------------------------------------------------------------

/// A `DLManagedTensorVersioned` we build for a `__cuda_array_interface__` object, with the
/// shape and strides it points to. The object itself is held by the launch as an owner.
#[repr(C)]
struct CaiTensor {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn cai_deleter(t: *mut DLManagedTensorVersioned) {
    if !t.is_null() {
        // SAFETY: `t` is the first field of a `CaiTensor` made by `Box::into_raw` in `from_cai`,
        // and the deleter runs once.
        drop(unsafe { Box::from_raw(t.cast::<CaiTensor>()) });
    }
}

fn parse_typestr(index: usize, s: &str) -> PyResult<DType> {
    let bad = || {
        arg_err(
            Kind::Type,
            index,
            format!("unsupported __cuda_array_interface__ typestr {s:?}"),
        )
    };
    // Byte-wise: a typestr is ASCII; anything else (a multi-byte character included) is refused
    // here rather than sliced.
    let b = s.as_bytes();
    if b.len() < 3 || !b.is_ascii() {
        return Err(bad());
    }
    let size: u32 = std::str::from_utf8(&b[2..])
        .ok()
        .filter(|d| d.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .ok_or_else(bad)?;
    // The byte order, as NumPy's array interface defines it: '<' little-endian, '>'
    // big-endian, '=' native, '|' not applicable (one-byte items only). Kernels read
    // little-endian data, so '<' and, on a little-endian machine, '=' are accepted for any item
    // size, '|' for one-byte items only, and anything else is refused.
    let order_ok = match b[0] {
        b'<' => true,
        b'=' => cfg!(target_endian = "little"),
        b'|' => size == 1,
        _ => false,
    };
    if !order_ok {
        return Err(arg_err(
            Kind::Type,
            index,
            format!(
                "unsupported __cuda_array_interface__ typestr {s:?}: byte order {:?} for \
                 {size}-byte items (accepted: '<', '=' on a little-endian machine, '|' for \
                 one-byte items)",
                b[0] as char
            ),
        ));
    }
    Ok(match (b[1], size) {
        (b'b', 1) => DType::BOOL,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'c', 8) => DType::C64,
        (b'c', 16) => DType::C128,
        _ => return Err(bad()),
    })
}

/// Maps a DLPack / CAI stream number to a raw handle: 1 is the legacy default stream (null),
/// 2 the per-thread default stream.
fn stream_number_to_raw(n: usize) -> usize {
    if n == 1 { 0 } else { n }
}

fn cai_device(ptr: u64, fallback: i32) -> i32 {
    tile_launch::Context::device_of_pointer(ptr).unwrap_or(fallback)
}

fn from_cai(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    hs: &Handshake,
) -> PyResult<Tensor> {
    let bad = |what: String| {
        arg_err(
            Kind::Value,
            index,
            format!("__cuda_array_interface__: {what}"),
        )
    };
    // A field that does not extract: `kind` with `what`, or OverflowError when the cause is an
    // integer that does not fit (row 7); the extraction error is the cause.
    let bad_field = |kind: Kind, what: String, e: PyErr| {
        let kind = if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
            Kind::Overflow
        } else {
            kind
        };
        let r = arg_err(kind, index, format!("__cuda_array_interface__: {what}"));
        r.set_cause(py, Some(e));
        r
    };
    let cai = obj.getattr(intern!(py, "__cuda_array_interface__"))?;
    let cai = cai
        .cast::<PyDict>()
        .map_err(|_| bad(format!("expected a dict, got {}", show(&cai))))?;
    let get = |k: &str| cai.get_item(k);
    let version: i64 = match get("version")? {
        Some(v) => v.extract().map_err(|e| {
            let r = bad(format!(
                "unsupported version {} (2 or 3 expected)",
                show(&v)
            ));
            r.set_cause(py, Some(e));
            r
        })?,
        None => return Err(bad("no 'version' entry".into())),
    };
    if !(2..=3).contains(&version) {
        return Err(bad(format!(
            "unsupported version {version} (2 or 3 expected)"
        )));
    }
    // Python's bools are ints, but no extent, stride, pointer or stream of the protocol.
    let no_bool = |field: &str, v: &Bound<'_, PyAny>| -> PyResult<()> {
        let is_bool = |x: &Bound<'_, PyAny>| x.cast::<PyBool>().is_ok();
        let inner = v
            .cast::<PyTuple>()
            .is_ok_and(|t| t.iter().any(|x| is_bool(&x)));
        if is_bool(v) || inner {
            return Err(bad(format!(
                "'{field}' holds a bool ({}); ints expected",
                show(v)
            )));
        }
        Ok(())
    };
    let shape_obj = get("shape")?.ok_or_else(|| bad("no 'shape' entry".into()))?;
    no_bool("shape", &shape_obj)?;
    let shape: Vec<i64> = shape_obj.extract().map_err(|e| {
        bad_field(
            Kind::Value,
            "'shape' must be a tuple of ints, each below 2**63".into(),
            e,
        )
    })?;
    let typestr = get("typestr")?.ok_or_else(|| bad("no 'typestr' entry".into()))?;
    let typestr: String = typestr.extract().map_err(|e| {
        bad_field(
            Kind::Type,
            format!("'typestr' must be a str, got {}", show(&typestr)),
            e,
        )
    })?;
    let dtype = parse_typestr(index, &typestr)?;
    let data_obj = get("data")?.ok_or_else(|| bad("no 'data' entry".into()))?;
    if let Ok(t) = data_obj.cast::<PyTuple>()
        && let Ok(first) = t.get_item(0)
    {
        no_bool("data[0]", &first)?;
    }
    let (data, readonly): (u64, bool) = data_obj.extract().map_err(|e| {
        bad_field(
            Kind::Value,
            "'data' must be a (pointer, read_only) tuple".into(),
            e,
        )
    })?;
    if let Some(mask) = get("mask")?
        && !mask.is_none()
    {
        return Err(bad("masked arrays are not supported".into()));
    }
    let itemsize = dtype.itemsize() as i64;
    let strides: Vec<i64> = match get("strides")? {
        Some(s) if !s.is_none() => {
            no_bool("strides", &s)?;
            let bytes: Vec<i64> = s.extract().map_err(|e| {
                bad_field(
                    Kind::Value,
                    "'strides' must be None or a tuple of ints, each in -2**63..2**63".into(),
                    e,
                )
            })?;
            if bytes.len() != shape.len() {
                return Err(bad(format!(
                    "{} strides for {} dimensions",
                    bytes.len(),
                    shape.len()
                )));
            }
            let mut elems = Vec::with_capacity(bytes.len());
            for (axis, b) in bytes.iter().enumerate() {
                if b % itemsize != 0 {
                    return Err(bad(format!(
                        "strides[{axis}] = {b} bytes is not a multiple of the item size {itemsize}"
                    )));
                }
                elems.push(b / itemsize);
            }
            elems
        }
        _ => Vec::new(),
    };
    let ready_on = match get("stream")? {
        Some(s) if !s.is_none() && version >= 3 => {
            no_bool("stream", &s)?;
            let n: i64 = s
                .extract()
                .map_err(|_| bad(format!("'stream' must be an int, got {}", show(&s))))?;
            if n == 0 {
                return Err(bad("'stream' is 0, which the protocol disallows".into()));
            }
            if n < 0 {
                return Err(bad(format!("'stream' is {n}")));
            }
            hs.sync.then_some(stream_number_to_raw(n as usize))
        }
        _ => None,
    };
    let ndim = shape.len() as i32;
    let mut boxed = Box::new(CaiTensor {
        // SAFETY: all-zero bytes are a valid `DLManagedTensorVersioned` (null pointers, zero
        // integers, `None` deleter); every field is set below.
        managed: unsafe { std::mem::zeroed() },
        shape,
        strides,
    });
    let flags = if readonly {
        dlpark::DlpackFlags::READ_ONLY
    } else {
        dlpark::DlpackFlags::empty()
    };
    let dl_dtype: DLDataType = dtype.into();
    let shape_ptr = boxed.shape.as_mut_ptr();
    let strides_ptr = if boxed.strides.is_empty() {
        std::ptr::null_mut()
    } else {
        boxed.strides.as_mut_ptr()
    };
    boxed.managed.version = DLPackVersion { major: 1, minor: 3 };
    boxed.managed.deleter = Some(cai_deleter);
    boxed.managed.flags = flags;
    boxed.managed.dl_tensor = DLTensor {
        data: data as *mut c_void,
        device: DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: cai_device(data, hs.device),
        },
        ndim,
        dtype: dl_dtype,
        shape: shape_ptr,
        strides: strides_ptr,
        byte_offset: 0,
    };
    let ptr = Box::into_raw(boxed).cast::<DLManagedTensorVersioned>();
    // SAFETY: `ptr` is our own descriptor, valid until `cai_deleter` frees it, which its
    // `Used` (or a rollback) calls once.
    let unused = unsafe { Unused::from_versioned(ptr) };
    Ok(Tensor {
        unused,
        claim: Claim::Owned(ptr),
        ready_on,
        owner: Some(obj.clone().unbind()),
        memory_trusted: false,
    })
}

// ---- scalars ------------------------------------------------------------------------------

/// An `int`'s value. Values that fit `i64` (all but the largest `u64` handles and scalars) are
/// read with one `PyLong_AsLongLongAndOverflow` call; the others by pyo3's `i128` extraction,
/// which under the stable ABI costs a shift and a temporary `int`.
pub(crate) fn int_value(obj: &Bound<'_, PyAny>) -> PyResult<i128> {
    if obj.cast::<PyInt>().is_ok() {
        let mut overflow: std::os::raw::c_int = 0;
        // SAFETY: `obj` is an `int`; `overflow` is a valid out-pointer. -1 with `overflow == 0`
        // and an exception set is an error; with no exception it is the value -1.
        let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(obj.as_ptr(), &mut overflow) };
        if overflow == 0 {
            if v == -1
                && let Some(e) = PyErr::take(obj.py())
            {
                return Err(e);
            }
            return Ok(i128::from(v));
        }
    }
    obj.extract()
}

fn int_range(ty: ScalarType) -> (i128, i128) {
    match ty {
        ScalarType::I8 => (i8::MIN.into(), i8::MAX.into()),
        ScalarType::I16 => (i16::MIN.into(), i16::MAX.into()),
        ScalarType::I32 => (i32::MIN.into(), i32::MAX.into()),
        ScalarType::I64 => (i64::MIN.into(), i64::MAX.into()),
        ScalarType::U8 => (0, u8::MAX.into()),
        ScalarType::U16 => (0, u16::MAX.into()),
        ScalarType::U32 => (0, u32::MAX.into()),
        _ => (0, u64::MAX.into()),
    }
}

/// Exact Python `int`s and `float`s (the common case) without the probes of
/// [`convert_scalar`]: the same result, no attribute lookup and no exception.
fn exact_scalar(obj: &Bound<'_, PyAny>, ty: ScalarType) -> Option<Scalar> {
    match ty {
        ScalarType::Bool => None,
        ScalarType::F32 | ScalarType::F64 => {
            if !obj.is_exact_instance_of::<PyFloat>() {
                return None;
            }
            let x = obj.cast::<PyFloat>().ok()?.value();
            if ty == ScalarType::F32 && x.is_finite() && x.abs() > f64::from(f32::MAX) {
                return None; // the error comes from the general path
            }
            Some(Scalar::Float(x))
        }
        _ => {
            if !obj.is_exact_instance_of::<PyInt>() {
                return None;
            }
            let v = int_value(obj).ok()?;
            let (lo, hi) = int_range(ty);
            if v < lo || v > hi {
                return None;
            }
            Some(Scalar::Int(v))
        }
    }
}

fn convert_scalar(index: usize, obj: &Bound<'_, PyAny>, ty: ScalarType) -> PyResult<Scalar> {
    if let Some(v) = exact_scalar(obj, ty) {
        return Ok(v);
    }
    let py = obj.py();
    let wrong = |what: &str| {
        arg_err(
            Kind::Type,
            index,
            format!("expected {what} for scalar {ty}, got {}", show(obj)),
        )
    };
    if obj.hasattr(intern!(py, "__dlpack__"))? || obj.cast::<PyCapsule>().is_ok() {
        return Err(wrong("a number"));
    }
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    let is_bool = obj.cast::<PyBool>().is_ok() || type_name == "bool_" || type_name == "bool";
    match ty {
        ScalarType::Bool => {
            if is_bool {
                Ok(Scalar::Bool(obj.is_truthy()?))
            } else {
                Err(wrong("a bool"))
            }
        }
        ScalarType::F32 | ScalarType::F64 => {
            if is_bool || obj.cast::<pyo3::types::PyString>().is_ok() {
                return Err(wrong("a float"));
            }
            let is_number = obj.cast::<PyFloat>().is_ok()
                || obj.cast::<PyInt>().is_ok()
                || obj.hasattr(intern!(py, "__float__"))?;
            if !is_number || is_complex(obj)? {
                return Err(wrong("a float"));
            }
            let x: f64 = obj.extract().map_err(|e: PyErr| {
                if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
                    arg_err(
                        Kind::Overflow,
                        index,
                        format!("{} does not fit scalar {ty}", show(obj)),
                    )
                } else {
                    e
                }
            })?;
            // A finite value too large for a double (`Decimal("1e400")`, a NumPy long double)
            // converts to infinity: refused, as an int too large is. An infinity compares equal
            // to the infinite double it converts to.
            if x.is_infinite() && obj.cast::<PyFloat>().is_err() && !obj.eq(x).unwrap_or(false) {
                return Err(arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty}", show(obj)),
                ));
            }
            // A finite value too large for a double (`Decimal("1e400")`, a NumPy long double)
            // converts to infinity: refused, as an int too large is. An infinity compares equal
            // to the infinite double it converts to.
            if x.is_infinite() && obj.cast::<PyFloat>().is_err() && !obj.eq(x).unwrap_or(false) {
                return Err(arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty}", show(obj)),
                ));
            }
            if ty == ScalarType::F32 && x.is_finite() && x.abs() > f64::from(f32::MAX) {
                return Err(arg_err(
                    Kind::Overflow,
                    index,
                    format!(
                        "{} does not fit scalar f32 (largest finite {:e})",
                        show(obj),
                        f32::MAX
                    ),
                ));
            }
            Ok(Scalar::Float(x))
        }
        _ => {
            if is_bool || obj.cast::<PyFloat>().is_ok() {
                return Err(wrong("an integer"));
            }
            let i = match obj.cast::<PyInt>() {
                Ok(i) => i.clone().into_any(),
                // `operator.index`: refuses an `__index__` that returns a non-int (TypeError).
                // SAFETY: `obj` is a live object; a new reference or null with an exception.
                Err(_) => match unsafe {
                    Bound::from_owned_ptr_or_err(py, ffi::PyNumber_Index(obj.as_ptr()))
                } {
                    Ok(i) => i,
                    Err(e) => {
                        let w = wrong("an integer");
                        w.set_cause(py, Some(e));
                        return Err(w);
                    }
                },
            };
            let (lo, hi) = int_range(ty);
            let v: i128 = i.extract().map_err(|_| {
                arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty} (range {lo}..={hi})", show(obj)),
                )
            })?;
            if v < lo || v > hi {
                return Err(arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty} (range {lo}..={hi})", show(obj)),
                ));
            }
            Ok(Scalar::Int(v))
        }
    }
}

// ---- launch configuration -----------------------------------------------------------------

/// CUDA's architectural limits, the same on every GPU tile supports; the device's own limits
/// are checked again by tile-launch.
const GRID_MAX: [u64; 3] = [(1 << 31) - 1, 65_535, 65_535];
const BLOCK_MAX: [u64; 3] = [1024, 1024, 64];
const BLOCK_THREADS_MAX: u64 = 1024;

/// Whether the Python int `v` is below zero (for values beyond `i128`). Error path only.
fn is_negative(v: &Bound<'_, PyAny>) -> bool {
    v.lt(0).unwrap_or(false)
}

/// The decimal text of the Python int `v` (its `str`). Error path only.
fn int_text(v: &Bound<'_, PyAny>) -> String {
    v.str().map(|s| s.to_string()).unwrap_or_else(|_| show(v))
}

fn parse_dims(what: &str, obj: &Bound<'_, PyAny>, max: [u64; 3]) -> PyResult<Dim3> {
    // The common case, an exact int in range: no tuple, no allocation.
    if obj.is_exact_instance_of::<PyInt>()
        && let Ok(v) = obj.extract::<u64>()
        && (1..=max[0]).contains(&v)
    {
        return Ok(Dim3::new(v as u32, 1, 1));
    }
    let one;
    let tuple;
    let items: &[Bound<'_, PyAny>] = if obj.cast::<PyInt>().is_ok() && obj.cast::<PyBool>().is_err()
    {
        one = [obj.clone()];
        &one
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        tuple = t.iter().collect::<SmallVec<[Bound<'_, PyAny>; 3]>>();
        &tuple
    } else {
        let hint = if obj.cast::<PyList>().is_ok() {
            " (use a tuple, not a list)"
        } else {
            ""
        };
        return Err(err(
            Kind::Type,
            format!(
                "{what} must be an int or a tuple of 1 to 3 ints{hint}, got {}",
                show(obj)
            ),
        ));
    };
    if items.is_empty() || items.len() > 3 {
        return Err(err(
            Kind::Value,
            format!(
                "{what} has {} dimensions, {}; 1 to 3 are allowed",
                items.len(),
                show(obj)
            ),
        ));
    }
    let mut dims = [1u32; 3];
    for (i, item) in items.iter().enumerate() {
        if item.cast::<PyInt>().is_err() || item.cast::<PyBool>().is_ok() {
            return Err(err(
                Kind::Type,
                format!("{what}[{i}] must be an int, got {}", show(item)),
            ));
        }
        // Beyond i128, only the sign matters; the message quotes the Python value itself.
        let v: i128 = item.extract().unwrap_or_else(|_| {
            if is_negative(item) {
                i128::MIN
            } else {
                i128::MAX
            }
        });
        if v < 1 {
            return Err(err(
                Kind::Value,
                format!(
                    "{what}[{i}] is {}; every dimension must be at least 1",
                    int_text(item)
                ),
            ));
        }
        if v > i128::from(max[i]) {
            return Err(err(
                Kind::Value,
                format!(
                    "{what}[{i}] is {}, above the limit {}",
                    int_text(item),
                    max[i]
                ),
            ));
        }
        dims[i] = v as u32;
    }
    Ok(Dim3::new(dims[0], dims[1], dims[2]))
}

/// Parses and checks the launch configuration against CUDA's architectural limits.
pub(crate) fn parse_config(
    grid: &Bound<'_, PyAny>,
    block: &Bound<'_, PyAny>,
    shared_mem: Option<&Bound<'_, PyAny>>,
    cluster: Option<&Bound<'_, PyAny>>,
    cooperative: bool,
    programmatic_dependent_launch: bool,
) -> PyResult<LaunchConfig> {
    let grid = parse_dims("grid", grid, GRID_MAX)?;
    let block = parse_dims("block", block, BLOCK_MAX)?;
    if block.volume() > BLOCK_THREADS_MAX {
        return Err(err(
            Kind::Value,
            format!(
                "block has {} threads ({} x {} x {}), above the limit {BLOCK_THREADS_MAX}",
                block.volume(),
                block.x,
                block.y,
                block.z
            ),
        ));
    }
    let sm: i128 = match shared_mem {
        None => 0,
        Some(shared_mem) => {
            if shared_mem.cast::<PyInt>().is_err() || shared_mem.cast::<PyBool>().is_ok() {
                return Err(err(
                    Kind::Type,
                    format!(
                        "shared_mem must be an int (bytes), got {}",
                        show(shared_mem)
                    ),
                ));
            }
            let sm: i128 = shared_mem.extract().unwrap_or_else(|_| {
                if is_negative(shared_mem) {
                    i128::MIN
                } else {
                    i128::MAX
                }
            });
            if sm < 0 || sm > i128::from(u32::MAX) {
                let side = if sm < 0 {
                    "below the minimum 0"
                } else {
                    "above the limit"
                };
                return Err(err(
                    Kind::Value,
                    format!(
                        "shared_mem is {} bytes, {side} (0..={})",
                        int_text(shared_mem),
                        u32::MAX
                    ),
                ));
            }
            sm
        }
    };
    let cluster = match cluster {
        Some(c) if !c.is_none() => Some(parse_dims("cluster", c, [u64::from(u32::MAX); 3])?),
        _ => None,
    };
    let mut cfg = LaunchConfig::new(grid, block);
    cfg.shared_mem_bytes = sm as u32;
    cfg.cluster = cluster;
    cfg.cooperative = cooperative;
    cfg.programmatic_dependent_launch = programmatic_dependent_launch;
    Ok(cfg)
}

/// Whether `obj` is a complex number: Python's `complex` (and its subclasses, such as NumPy's
/// `complex128`), or a NumPy complex scalar (`dtype.kind == 'c'`), whose `__float__` would drop
/// the imaginary part.
fn is_complex(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    if obj.cast::<pyo3::types::PyComplex>().is_ok() {
        return Ok(true);
    }
    match obj.getattr_opt(intern!(py, "dtype"))? {
        Some(dtype) => Ok(dtype
            .getattr_opt(intern!(py, "kind"))?
            .is_some_and(|k| k.extract::<String>().is_ok_and(|k| k == "c"))),
        None => Ok(false),
    }
}
