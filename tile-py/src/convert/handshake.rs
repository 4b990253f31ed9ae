//! The `__dlpack__` handshake: asking a producer for an export ordered on the launch stream, the keyword retries, and host producers refusing the stream.

use super::*;

/// The keywords tile_py passes to `__dlpack__`; the only ones whose rejection is retried.
pub(crate) const OUR_KEYWORDS: [&str; 4] = ["max_version", "dl_device", "copy", "stream"];

/// What a `TypeError` raised by a `__dlpack__` call says about the call's own arguments.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Rejection {
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
pub(crate) fn traceback_depth(py: Python<'_>, e: &PyErr) -> usize {
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
pub(crate) fn rejection(py: Python<'_>, e: &PyErr) -> Rejection {
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
    // "takes 0 positional arguments but 1 was given", "takes 1 ... but 2 were given".
    if m.contains("positional argument") && (m.contains("were given") || m.contains("was given")) {
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
pub(crate) enum Keywords {
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
pub(crate) fn offered_stream(hs: &Handshake) -> (i64, Option<usize>) {
    use crate::stream_arg::{LEGACY, LEGACY_RAW, PER_THREAD};
    if hs.sync && hs.dlpack_stream == PER_THREAD {
        (LEGACY, Some(LEGACY_RAW))
    } else {
        (hs.dlpack_stream, None)
    }
}

/// The current stream of a producer family that tile_py can read (CuPy's), as read once per
/// launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FamilyStream {
    /// Not read yet in this launch.
    Unread,
    /// Read: the `stream=` value to offer the family's `__dlpack__` (the family's own current
    /// stream, so that its export needs no synchronisation of its own) and the stream the export
    /// is then ready on, when that is not the launch stream.
    Known { offer: i64, ready_on: Option<usize> },
    /// Could not be read (no such function, an error): each array gets the launch stream.
    Unknown,
}

/// The `stream=` value and the ready-on stream for a CuPy array of this launch.
///
/// CuPy's `__dlpack__(stream=s)` records an event on CuPy's current stream and makes `s` wait
/// on it whenever `s` is another stream: about 5 us per array. tile_py instead reads CuPy's
/// current stream once per launch, offers exactly that stream to every CuPy array (so CuPy has
/// nothing to order), and has the launch stream wait once for it on the device (tile-launch
/// makes one wait per distinct ready-on stream). The ordering is the one CuPy would have made:
/// the launch stream runs after the work queued on CuPy's current stream. Were the stream read
/// wrongly, CuPy would still order its work before the offered stream, and the launch waits for
/// that one: never weaker. When the current stream cannot be read, the launch stream is
/// offered, as for any producer ([`offered_stream`]).
pub(crate) fn family_offer(py: Python<'_>, hs: &Handshake) -> (i64, Option<usize>) {
    if !hs.sync {
        return offered_stream(hs);
    }
    let known = match hs.cupy.get() {
        FamilyStream::Unread => {
            let read = read_cupy_stream(py, hs);
            hs.cupy.set(read);
            read
        }
        known => known,
    };
    match known {
        FamilyStream::Known { offer, ready_on } => (offer, ready_on),
        _ => offered_stream(hs),
    }
}

/// CuPy's current stream on the launch device (`cupy.cuda.get_current_stream(device).ptr`),
/// as a [`FamilyStream`].
fn read_cupy_stream(py: Python<'_>, hs: &Handshake) -> FamilyStream {
    static GET: pyo3::sync::PyOnceLock<Option<Py<PyAny>>> = pyo3::sync::PyOnceLock::new();
    let get = GET.get_or_init(py, || {
        py.import(intern!(py, "cupy.cuda"))
            .and_then(|m| m.getattr(intern!(py, "get_current_stream")))
            .map(Bound::unbind)
            .ok()
    });
    let Some(get) = get else {
        let _ = PyErr::take(py);
        return FamilyStream::Unknown;
    };
    let ptr = get
        .bind(py)
        .call1((hs.device,))
        .and_then(|s| s.getattr(intern!(py, "ptr")))
        .and_then(|p| p.extract::<usize>());
    match ptr {
        Ok(ptr) => family_stream(ptr, hs),
        Err(_) => FamilyStream::Unknown,
    }
}

/// The [`FamilyStream`] of a producer whose current stream has the raw handle `ptr` (0: the
/// legacy default stream; 2: the per-thread default stream), for a launch with handshake `hs`.
pub(crate) fn family_stream(ptr: usize, hs: &Handshake) -> FamilyStream {
    // The stream's number in DLPack's `stream=` convention (1: legacy default stream).
    let Some(offer) = crate::stream_arg::to_number(ptr) else {
        return FamilyStream::Unknown;
    };
    if offer == hs.dlpack_stream {
        return FamilyStream::Known {
            offer,
            ready_on: None,
        };
    }
    FamilyStream::Known {
        offer,
        ready_on: Some(crate::stream_arg::to_raw(offer as u64)),
    }
}

/// How `__dlpack__` is reached.
pub(crate) enum DlpackMethod<'py> {
    /// The object's type defines it ([`crate::pytypes::defined_on_type`]): called by name on the
    /// object (`PyObject_VectorcallMethod`), without making a bound method. The lookup is the
    /// object's own (an instance attribute of the same name still comes first).
    OnType,
    /// The attribute the object's lookup returned (an instance attribute, `__getattr__`).
    Attr(Bound<'py, PyAny>),
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
/// `offer` is the `stream=` value and the stream the export is then ready on
/// ([`offered_stream`], or [`family_offer`] for a family whose current stream is read). Returns
/// the capsule and that ready-on stream; `None` when the object turned out to have no
/// `__dlpack__` ([`DlpackMethod::OnType`] for a class that lost it since its type was first
/// seen): the caller treats it as an object without one, and no `__dlpack_device__` is asked.
pub(crate) fn call_dlpack<'py>(
    py: Python<'py>,
    index: usize,
    obj: &Bound<'py, PyAny>,
    method: &DlpackMethod<'py>,
    hs: &Handshake,
    offer: (i64, Option<usize>),
) -> PyResult<Option<(Bound<'py, PyAny>, Option<usize>)>> {
    static MAX_VERSION: pyo3::sync::PyOnceLock<Py<PyTuple>> = pyo3::sync::PyOnceLock::new();
    let (stream, ready_on) = offer;
    let mut kw = Keywords::StreamAndVersion;
    // What the first call raised, when it was taken for a rejection and retried: named in the
    // refusal if every way fails, so that a producer's own error is not lost behind it.
    let mut first: Option<String> = None;
    let r = loop {
        let r = match kw {
            Keywords::Positional => match method {
                DlpackMethod::OnType => obj.call_method1(intern!(py, "__dlpack__"), (stream,)),
                DlpackMethod::Attr(m) => m.call1((stream,)),
            },
            _ => {
                let v = MAX_VERSION
                    .get_or_try_init(py, || PyTuple::new(py, [1u32, 3u32]).map(Bound::unbind))?
                    .bind(py);
                let s = hs.stream_object(py, stream)?;
                let with_version = kw == Keywords::StreamAndVersion;
                match keyword_call(py, obj, method, &s, with_version.then_some(v.as_any()))? {
                    Some(r) => r,
                    None => {
                        let kwargs = PyDict::new(py);
                        kwargs.set_item(intern!(py, "stream"), &s)?;
                        if with_version {
                            kwargs.set_item(intern!(py, "max_version"), v)?;
                        }
                        match method {
                            DlpackMethod::OnType => {
                                obj.call_method(intern!(py, "__dlpack__"), (), Some(&kwargs))
                            }
                            DlpackMethod::Attr(m) => m.call((), Some(&kwargs)),
                        }
                    }
                }
            }
        };
        match r {
            Err(e) => {
                let why = rejection(py, &e);
                match kw.after(why) {
                    Some(next) => {
                        if first.is_none() {
                            first = Some(e.value(py).to_string());
                        }
                        kw = next
                    }
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
                                 the capsule of its __dlpack__() instead{}",
                                show(obj),
                                first
                                    .as_deref()
                                    .map(|f| format!(
                                        " (the first call, with keywords, raised: {f})"
                                    ))
                                    .unwrap_or_default()
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
        // The type defined `__dlpack__` when first seen and no longer does.
        Err(e)
            if matches!(method, DlpackMethod::OnType)
                && e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py)
                && !obj.hasattr(intern!(py, "__dlpack__")).unwrap_or(true) =>
        {
            return Ok(None);
        }
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
    Ok(Some((cap, ready_on)))
}

/// `obj.__dlpack__(stream=stream)`, or with `max_version=version` too, by name and with no
/// keyword dict ([`crate::pytypes::call_method_keywords`]; the keyword names are made once), for
/// [`DlpackMethod::OnType`]. `Ok(None)` for an attribute (an instance attribute, `__getattr__`:
/// rare) and where the interpreter cannot call so: the caller passes a dict.
fn keyword_call<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    method: &DlpackMethod<'py>,
    stream: &Bound<'py, PyAny>,
    version: Option<&Bound<'py, PyAny>>,
) -> PyResult<Option<PyResult<Bound<'py, PyAny>>>> {
    use crate::pytypes::call_method_keywords;
    static STREAM_AND_VERSION: pyo3::sync::PyOnceLock<Py<PyTuple>> = pyo3::sync::PyOnceLock::new();
    static STREAM: pyo3::sync::PyOnceLock<Py<PyTuple>> = pyo3::sync::PyOnceLock::new();
    if !matches!(method, DlpackMethod::OnType) {
        return Ok(None);
    }
    let name = intern!(py, "__dlpack__");
    Ok(match version {
        Some(v) => {
            let names = STREAM_AND_VERSION.get_or_try_init(py, || {
                PyTuple::new(py, [intern!(py, "stream"), intern!(py, "max_version")])
                    .map(Bound::unbind)
            })?;
            call_method_keywords(obj, name, [stream, v], names.bind(py))
        }
        None => {
            let names = STREAM.get_or_try_init(py, || {
                PyTuple::new(py, [intern!(py, "stream")]).map(Bound::unbind)
            })?;
            call_method_keywords(obj, name, [stream], names.bind(py))
        }
    })
}

/// Whether the producer `obj` says its memory is host memory: its `__dlpack_device__()` is
/// `kDLCPU`. A `__dlpack_device__` that is missing, raises an ordinary exception or returns
/// something else says no; an interrupt, an exit or a memory error it raises is returned.
pub(crate) fn says_host(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let device = match obj.call_method0(intern!(py, "__dlpack_device__")) {
        Ok(d) => d,
        Err(d) if !d.is_instance_of::<pyo3::exceptions::PyException>(py) => return Err(d),
        Err(_) => return Ok(false),
    };
    Ok(device
        .extract::<(i64, i64)>()
        .is_ok_and(|(t, _)| t == i64::from(DLDeviceType::CPU.0)))
}

/// The error for a `__dlpack__` call that raised `e`: when the producer's `__dlpack_device__()`
/// says host memory (`kDLCPU`), the host-memory refusal (the same `ValueError` as for a CPU
/// tensor that was exported), with `e` as its cause; otherwise `e` itself, with a note naming
/// the argument. A `__dlpack_device__` that is missing or raises leaves `e` as it is.
pub(crate) fn host_or(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    hs: &Handshake,
    e: PyErr,
) -> PyErr {
    // Only an ordinary exception can be a host producer refusing the stream: an interrupt, an
    // exit or a memory error propagates as it is.
    if crate::exceptions::raised_as_is(py, &e) {
        return e;
    }
    match says_host(py, obj) {
        Err(d) => return d,
        Ok(false) => return with_note(py, e, argument_note(index)),
        Ok(true) => {}
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
             accepts device, managed or pinned memory only; {}",
            show(obj),
            crate::exceptions::HOST_MEMORY_FIX
        ),
    );
    refused.set_cause(py, Some(e));
    refused
}
