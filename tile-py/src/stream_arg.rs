//! The `stream` argument and the tile-launch [`Stream`] it names.
//!
//! - **Reading it**: Python stream objects (torch, CuPy, cuda.core, `torch.Stream`) and int
//!   handles, with per-thread caches that answer a repeated stream object without a Python call
//!   ([`StreamArg`]).
//! - **The stream numbers** of the DLPack `stream=` convention (which the
//!   `__cuda_array_interface__` `stream` entry follows) and their raw `CUstream` handles: every
//!   conversion between the two goes through [`to_raw`] and [`to_number`].
//! - **The cache**: one tile-launch [`Stream`] (with its release queue) per `(device, handle)`,
//!   made on a stream's first launch and forgotten once its work is released
//!   ([`get_with_owner`], [`forget_idle_streams`]).

use std::cell::{Cell, RefCell};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_sys::CUstream;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple, PyType};
use rustc_hash::FxHashMap;
use tile_launch::{Context, Stats, Stream, WeakStream};

use crate::exceptions::{Kind, err, launch_err, show};
use crate::pytypes::{TypeCache, in_package, mro_any};

/// A stream as the caller gave it.
pub(crate) struct StreamSpec {
    /// Raw handle: 0 for the legacy default stream, 2 for the per-thread default stream.
    pub raw: usize,
    /// The device, when the stream object says (`.device.index`, `.device_id`).
    pub device: Option<i32>,
    /// The stream object, kept alive while its cached [`Stream`] lives.
    pub owner: Option<Py<PyAny>>,
}

impl StreamSpec {
    /// The value passed to producers as `__dlpack__(stream=...)`: the handle, 1 for the legacy
    /// default stream (never 0), 2 for the per-thread default stream.
    pub(crate) fn dlpack_value(&self) -> i64 {
        // `raw` is at most `i64::MAX` (checked in `handle_from_int` and `torch_read`).
        to_number(self.raw).unwrap_or(i64::MAX)
    }
}

const HOW: &str = "pass the stream to launch on, e.g. torch.cuda.current_stream(), \
                   cupy.cuda.get_current_stream(), a cuda.core Stream, or an int handle (1 for the \
                   legacy default stream)";

fn handle_from_int(v: &Bound<'_, PyAny>, what: &str, zero_is_legacy: bool) -> PyResult<usize> {
    // `True` is an int to Python, but never a stream handle (it would read as 1, the legacy
    // default stream).
    if v.cast::<PyBool>().is_ok() {
        return Err(err(
            Kind::Type,
            format!("{what} must be an int stream handle, got {}", show(v)),
        ));
    }
    let n: i128 = crate::convert::int_value(v).map_err(|_| {
        err(
            Kind::Type,
            format!("{what} must be an int, got {}", show(v)),
        )
    })?;
    if n == 0 && !zero_is_legacy {
        return Err(err(
            Kind::Value,
            format!("stream 0 is ambiguous (DLPack disallows it); {HOW}"),
        ));
    }
    // Handles go to producers as a signed 64-bit `stream=` value, where -1 means "no
    // synchronisation": a handle of 2**63 or more would arrive negative, so it is refused.
    if n < 0 || n > i128::from(i64::MAX) {
        return Err(err(
            Kind::Value,
            format!("stream handle {n} is not a valid CUstream (0 to 2**63-1 expected); {HOW}"),
        ));
    }
    Ok(to_raw(n as u64))
}

/// The stream object this thread launched on last, what it resolved to, and its cached
/// [`Stream`], held weakly. Only an object that is the cached `Stream`'s owner is remembered:
/// the `Stream` keeps its owner alive, so while the weak reference upgrades the object lives
/// and its address cannot belong to another object, and a hit (same address) is the same
/// object. Once the `Stream` is forgotten (its work released, see [`forget_idle`]) the entry
/// misses, and nothing here keeps the object alive. A stream object is taken to name one
/// stream for its whole life (its `__cuda_stream__` handle and device do not change), as torch,
/// CuPy and cuda.core streams do.
struct LastStream {
    obj: usize,
    raw: usize,
    device: Option<i32>,
    stream: WeakStream,
}

thread_local! {
    static LAST: RefCell<Option<LastStream>> = const { RefCell::new(None) };
}

/// A stream type whose handle and device can be read without the full parse.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fast {
    /// Parse every new object in full.
    No,
    /// PyTorch's CUDA streams (`torch.cuda.Stream`, `ExternalStream`, subclasses that keep
    /// torch's `__cuda_stream__`): the handle is the `cuda_stream` attribute (what torch's
    /// `__cuda_stream__()` returns, without the Python call and the tuple) and the device the
    /// `device_index` attribute (what `.device.index` says, without making a `torch.device`).
    /// Both are C attributes of `torch._C._CudaStreamBase`.
    Torch,
}

/// Per stream type: whether it is [`Fast`], once a full parse has told.
static STREAM_TYPES: TypeCache<Fast> = TypeCache::new(&LAST_TYPE);

thread_local! {
    /// The last stream type this thread looked up in [`STREAM_TYPES`], and its answer.
    static LAST_TYPE: Cell<(usize, Option<Fast>)> = const { Cell::new((0, None)) };
    /// The last `(device, raw handle)` this thread resolved through the [`Fast`] path and its
    /// cached [`Stream`], held weakly (the `Stream` [`STREAMS`] holds for that key until it is
    /// forgotten): a second-level cache for stream objects that are new each call, as
    /// `torch.cuda.current_stream()` returns. The key is read from the object each time, so a
    /// handle that was freed and reused by a stream of another device misses, and a forgotten
    /// `Stream` misses, so a reused handle gets fresh state.
    static LAST_RESOLVED: RefCell<Option<((i32, usize), WeakStream)>> = const { RefCell::new(None) };
}

/// Whether `ty` is known, and if so whether it is [`Fast`].
fn fast_kind(ty: &Bound<'_, PyType>) -> Option<Fast> {
    STREAM_TYPES.get(ty)
}

/// Whether `ty` is one of PyTorch's CUDA stream types: `torch._C._CudaStreamBase` is in its
/// MRO, and its `__cuda_stream__`, if any, is torch's own (not overridden outside torch).
fn is_torch_stream_type(ty: &Bound<'_, PyType>) -> bool {
    let py = ty.py();
    if !mro_any(ty, |m, n| m == "torch._C" && n == "_CudaStreamBase") {
        return false;
    }
    match ty.getattr_opt(intern!(py, "__cuda_stream__")) {
        Ok(None) => true,
        Ok(Some(f)) => f
            .getattr(intern!(py, "__module__"))
            .is_ok_and(|m| m.extract::<String>().is_ok_and(|m| m.starts_with("torch."))),
        Err(_) => false,
    }
}

/// The handle and device of a [`Fast::Torch`] stream object, from its `cuda_stream` and
/// `device_index` attributes; `None` when either is missing or out of range (then the object
/// is parsed in full).
fn torch_read(obj: &Bound<'_, PyAny>) -> Option<(usize, i32)> {
    let py = obj.py();
    let h = crate::convert::int_value(&obj.getattr(intern!(py, "cuda_stream")).ok()?).ok()?;
    let d = crate::convert::int_value(&obj.getattr(intern!(py, "device_index")).ok()?).ok()?;
    if !(0..=i128::from(i64::MAX)).contains(&h) || !(0..=i128::from(i32::MAX)).contains(&d) {
        return None;
    }
    let raw = to_raw(h as u64);
    Some((raw, d as i32))
}

/// Records whether the type of `obj` (just parsed in full into `spec`) is [`Fast`]: only when
/// its type says so and the fast read of this object agrees with the full parse.
fn learn_type(obj: &Bound<'_, PyAny>, spec: &StreamSpec) {
    let ty = obj.get_type();
    let fast = if is_torch_stream_type(&ty)
        && spec.device.is_some()
        && torch_read(obj) == spec.device.map(|d| (spec.raw, d))
    {
        Fast::Torch
    } else {
        Fast::No
    };
    STREAM_TYPES.insert(&ty, fast);
}

/// A `stream` argument read, not yet resolved to its [`Stream`]: resolving may load the
/// driver, so a request reads its other values between [`StreamArg::parse`] and
/// [`StreamArg::resolve`], and a bad value is reported before the driver is needed.
pub(crate) struct StreamArg<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
    pub(crate) spec: StreamSpec,
    /// The stream, when a per-thread cache knew it.
    cached: Option<Stream>,
}

impl<'a, 'py> StreamArg<'a, 'py> {
    /// Reads `obj` ([`parse_stream`]), answered from the per-thread caches where they know it:
    /// when `obj` is the stream object this thread used last (no Python call, no attribute
    /// lookup), or, for a [`Fast`] stream type, from two attribute reads, with the cached
    /// [`Stream`] when they name the `(device, handle)` this thread resolved last. Int streams
    /// are not cached (parsing one is cheap).
    pub(crate) fn parse(obj: &'a Bound<'py, PyAny>) -> PyResult<Self> {
        let hit = LAST.with(|l| {
            let l = l.borrow();
            let e = l.as_ref().filter(|e| e.obj == obj.as_ptr() as usize)?;
            Some((e.raw, e.device, e.stream.upgrade()?))
        });
        if let Some((raw, device, stream)) = hit {
            let spec = StreamSpec {
                raw,
                device,
                // Needed only to make the `Stream`, which the hit knows.
                owner: None,
            };
            return Ok(StreamArg {
                obj,
                spec,
                cached: Some(stream),
            });
        }
        let known = if obj.cast::<PyInt>().is_ok() {
            Some(Fast::No)
        } else {
            fast_kind(&obj.get_type())
        };
        if known == Some(Fast::Torch)
            && let Some((raw, device)) = torch_read(obj)
        {
            let stream = LAST_RESOLVED.with(|r| {
                r.borrow()
                    .as_ref()
                    .filter(|(key, _)| *key == (device, raw))
                    .and_then(|(_, s)| s.upgrade())
            });
            let spec = StreamSpec {
                raw,
                device: Some(device),
                owner: Some(obj.clone().unbind()),
            };
            return Ok(StreamArg {
                obj,
                spec,
                cached: stream,
            });
        }
        let spec = parse_stream(obj)?;
        if spec.owner.is_some() && known.is_none() {
            learn_type(obj, &spec);
        }
        Ok(StreamArg {
            obj,
            spec,
            cached: None,
        })
    }

    /// The cached [`Stream`] the argument names: the one a per-thread cache found, else made
    /// or found in [`get_with_owner`] (which may load the driver).
    #[inline]
    pub(crate) fn resolve(self, py: Python<'py>) -> PyResult<Stream> {
        match self.cached {
            Some(s) => Ok(s),
            None => get_and_cache(py, self.obj, self.spec),
        }
    }
}

/// [`get_with_owner`], remembering the stream in the per-thread caches:
/// for `obj` when it is the object [`StreamArg::parse`] cached, and by `(device, handle)` for a
/// [`Fast`] stream type.
fn get_and_cache(py: Python<'_>, obj: &Bound<'_, PyAny>, spec: StreamSpec) -> PyResult<Stream> {
    let cacheable = spec.owner.is_some();
    let (raw, device) = (spec.raw, spec.device);
    let (s, owner) = get_with_owner(py, spec)?;
    if cacheable {
        if owner == obj.as_ptr() as usize {
            let entry = LastStream {
                obj: owner,
                raw,
                device,
                stream: s.downgrade(),
            };
            LAST.with(|l| *l.borrow_mut() = Some(entry));
        }
        if let Some(d) = device
            && fast_kind(&obj.get_type()) == Some(Fast::Torch)
        {
            LAST_RESOLVED.with(|r| *r.borrow_mut() = Some(((d, raw), s.downgrade())));
        }
    }
    Ok(s)
}

/// The launch stream `obj` names: its cached [`Stream`] (made on first use) and the value
/// producers are told (`__dlpack__(stream=...)`, [`StreamSpec::dlpack_value`]).
pub(crate) fn launch_stream(py: Python<'_>, obj: &Bound<'_, PyAny>) -> PyResult<(Stream, i64)> {
    let arg = StreamArg::parse(obj)?;
    let value = arg.spec.dlpack_value();
    Ok((arg.resolve(py)?, value))
}

/// Parses the `stream` argument of `launch`.
pub(crate) fn parse_stream(obj: &Bound<'_, PyAny>) -> PyResult<StreamSpec> {
    let py = obj.py();
    if obj.is_none() {
        return Err(err(
            Kind::Type,
            format!("stream is required (got None): {HOW}"),
        ));
    }
    if obj.cast::<PyBool>().is_ok() {
        return Err(err(
            Kind::Type,
            format!("unsupported stream {}: {HOW}", show(obj)),
        ));
    }
    if obj.cast::<PyInt>().is_ok() {
        return Ok(StreamSpec {
            raw: handle_from_int(obj, "stream", false)?,
            device: None,
            owner: None,
        });
    }
    let attr = obj
        .getattr_opt(intern!(py, "__cuda_stream__"))
        .map_err(|e| {
            let r = err(
                Kind::Type,
                format!("reading __cuda_stream__ of stream {} raised", show(obj)),
            );
            r.set_cause(py, Some(e));
            r
        })?;
    let raw = if let Some(attr) = attr {
        let v = if attr.is_callable() {
            attr.call0()?
        } else {
            attr
        };
        let t = v.cast::<PyTuple>().map_err(|_| {
            err(
                Kind::Type,
                format!(
                    "__cuda_stream__ returned {}, expected (version, handle)",
                    show(&v)
                ),
            )
        })?;
        if t.len() != 2 {
            return Err(err(
                Kind::Type,
                format!(
                    "__cuda_stream__ returned {}, expected (version, handle)",
                    show(&v)
                ),
            ));
        }
        check_cuda_stream_protocol(t, &v)?;
        handle_from_int(&t.get_item(1)?, "__cuda_stream__()[1]", true)?
    } else if is_stream_of(obj, "cupy")
        && let Ok(ptr) = obj.getattr(intern!(py, "ptr"))
    {
        // CuPy streams; `ptr == 0` is CuPy's null (legacy default) stream. Only CuPy's stream
        // types: other objects with a `ptr` (a CuPy event, a memory pointer) are no stream.
        handle_from_int(&ptr, "stream.ptr", true)?
    } else if is_stream_of(obj, "torch")
        && let Ok(h) = obj.getattr(intern!(py, "cuda_stream"))
    {
        handle_from_int(&h, "stream.cuda_stream", true)?
    } else if is_stream_of(obj, "numba")
        && let Some(handle) = obj.getattr_opt(intern!(py, "handle"))?
    {
        // numba-cuda streams without `__cuda_stream__`: a ctypes handle (`.value`, None for the
        // legacy default stream). Kept alive like any stream object: numba destroys a stream it
        // drops, work pending or not, and its handle may then name another stream.
        let value = handle.getattr_opt(intern!(py, "value"))?.unwrap_or(handle);
        if value.is_none() {
            LEGACY_RAW
        } else {
            handle_from_int(
                &value.call_method0(intern!(py, "__int__"))?,
                "stream.handle",
                true,
            )?
        }
    } else if let Some(cuda) = torch_generic_to_cuda(obj)? {
        // A device-generic `torch.Stream` of a CUDA device: parsed as the `torch.cuda.Stream`
        // that names the same stream, which is also what the cached stream keeps alive.
        return parse_stream(&cuda);
    } else {
        return Err(err(
            Kind::Type,
            format!("unsupported stream type {}: {HOW}", show(obj)),
        ));
    };
    let device = device_of(obj);
    Ok(StreamSpec {
        raw,
        device,
        owner: Some(obj.clone().unbind()),
    })
}

/// Whether a class of `obj`'s type named `...Stream` comes from package `package` (`cupy`,
/// `torch`, `numba`).
fn is_stream_of(obj: &Bound<'_, PyAny>, package: &str) -> bool {
    mro_any(&obj.get_type(), |m, n| {
        in_package(m, package) && n.ends_with("Stream")
    })
}

/// For a device-generic `torch.Stream` (what `torch.accelerator.current_stream()` returns, and
/// `torch.cuda.current_stream()` inside `torch.compile`), the `torch.cuda.Stream` naming the
/// same stream (`torch.cuda.Stream(stream_id=, device_index=, device_type=)`); `None` for other
/// objects. A `torch.Stream` of another device type is refused.
fn torch_generic_to_cuda<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    if !mro_any(&obj.get_type(), |m, n| m == "torch" && n == "Stream") {
        return Ok(None);
    }
    let device_type = obj
        .getattr(intern!(py, "device"))
        .and_then(|d| d.getattr(intern!(py, "type")))
        .and_then(|t| t.extract::<String>())
        .unwrap_or_default();
    if device_type != "cuda" {
        return Err(err(
            Kind::Value,
            format!(
                "stream {} is a torch.Stream of device type {device_type:?}; tile_py launches on CUDA streams only",
                show(obj)
            ),
        ));
    }
    let kwargs = pyo3::types::PyDict::new(py);
    for name in ["stream_id", "device_index", "device_type"] {
        kwargs.set_item(name, obj.getattr(name)?)?;
    }
    let torch_cuda = py.import(intern!(py, "torch.cuda"))?;
    let cuda = torch_cuda
        .getattr(intern!(py, "Stream"))?
        .call((), Some(&kwargs))
        .map_err(|e| {
            let r = err(
                Kind::Type,
                format!(
                    "could not turn torch.Stream {} into a torch.cuda.Stream",
                    show(obj)
                ),
            );
            r.set_cause(py, Some(e));
            r
        })?;
    Ok(Some(cuda))
}

/// The `__cuda_stream__` protocol (version 0): a `(0, handle)` tuple of Python ints. A bool
/// (an `int` subclass) is neither: `(0, True)` would otherwise read as stream 1.
fn check_cuda_stream_protocol(t: &Bound<'_, PyTuple>, v: &Bound<'_, PyAny>) -> PyResult<()> {
    let (version, handle) = (t.get_item(0)?, t.get_item(1)?);
    let is_int = |x: &Bound<'_, PyAny>| x.cast::<PyInt>().is_ok() && x.cast::<PyBool>().is_err();
    if !is_int(&version) || !version.eq(0)? {
        return Err(err(
            Kind::Value,
            format!(
                "__cuda_stream__ returned {}: protocol version {} is not supported (0 expected)",
                show(v),
                show(&version)
            ),
        ));
    }
    if !is_int(&handle) {
        return Err(err(
            Kind::Type,
            format!(
                "__cuda_stream__ returned {}: the handle must be an int, got {}",
                show(v),
                show(&handle)
            ),
        ));
    }
    Ok(())
}

fn device_of(obj: &Bound<'_, PyAny>) -> Option<i32> {
    let py = obj.py();
    if let Ok(d) = obj.getattr(intern!(py, "device"))
        && let Ok(i) = d.getattr(intern!(py, "index"))
        && let Ok(i) = i.extract::<i32>()
        && i >= 0
    {
        return Some(i);
    }
    // CuPy streams say -1 when they do not know their device (e.g. `ExternalStream(handle)`):
    // then the driver is asked.
    if let Ok(d) = obj.getattr(intern!(py, "device_id"))
        && let Ok(i) = d.extract::<i32>()
        && i >= 0
    {
        return Some(i);
    }
    None
}

/// A cached stream and the address of the Python object it keeps alive (0 for an int handle).
struct Entry {
    stream: Stream,
    owner: usize,
}

static STREAMS: Mutex<Option<FxHashMap<(i32, usize), Entry>>> = Mutex::new(None);
/// `STREAMS`' length, updated under its lock, read without it ([`any_held`]).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Whether tile_py holds a stream (one with work whose tensors are not all released). Takes no
/// lock: read by the release thread ([`release`](crate::release)) to skip attaching when idle.
pub(crate) fn any_held() -> bool {
    HELD.load(Ordering::Acquire) > 0
}
/// The counters of the streams [`forget_idle`] dropped, so that totals stay totals.
static GONE: Mutex<Option<Stats>> = Mutex::new(None);

/// Drops the cached streams whose work has been released and that nothing else refers to
/// ([`Stream::is_forgettable`]: no queued or held guard, no other `Stream` value): their
/// stream objects are no longer kept alive, their handles (which may be destroyed and reused)
/// are never touched again, and a later launch on the same handle starts with fresh state.
/// No driver call. Their counters are kept in [`GONE`].
fn forget_idle(map: &mut FxHashMap<(i32, usize), Entry>) -> Vec<Stream> {
    let mut dropped = Vec::new();
    map.retain(|_, e| {
        let forget = e.stream.is_forgettable();
        if forget {
            dropped.push(e.stream.clone());
        }
        !forget
    });
    HELD.store(map.len(), Ordering::Release);
    if !dropped.is_empty() {
        let mut gone = GONE.lock().unwrap_or_else(|p| p.into_inner());
        let sum = dropped
            .iter()
            .fold(gone.unwrap_or_default(), |sum, s| sum.plus(&s.stats()));
        *gone = Some(sum);
    }
    dropped
}

/// [`forget_idle`] on the cache. The forgotten streams (and the stream objects they keep
/// alive) are dropped after the lock is released: a `__del__` may call into tile_py.
pub(crate) fn forget_idle_streams() {
    let dropped = {
        let mut g = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
        g.as_mut().map(forget_idle).unwrap_or_default()
    };
    drop(dropped);
}

/// The counters of the streams already forgotten.
pub(crate) fn forgotten_stats() -> Stats {
    GONE.lock()
        .unwrap_or_else(|p| p.into_inner())
        .unwrap_or_default()
}

/// In a child made by `os.fork()`: the counters of every stream inherited from the parent (the
/// cached ones and those already forgotten), read without waiting for a lock (one held at the
/// fork is never let go in the child) and without dropping or forgetting a stream (a stream's
/// drop makes driver calls, which fail in the child). `None` when a lock was held at the fork.
pub(crate) fn inherited_stats() -> Option<Stats> {
    use std::sync::TryLockError;
    fn taken<T>(r: Result<T, TryLockError<T>>) -> Option<T> {
        match r {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
    let gone = taken(GONE.try_lock())?.unwrap_or_default();
    let g = taken(STREAMS.try_lock())?;
    Some(
        g.as_ref()
            .map(|m| m.values().fold(gone, |sum, e| sum.plus(&e.stream.stats())))
            .unwrap_or(gone),
    )
}

/// The device a raw stream belongs to, or, for the default streams, the current context's
/// device (0 if none is current).
fn device_of_raw(raw: usize) -> tile_launch::Result<i32> {
    // SAFETY: the caller vouches that `raw` is a live stream handle (the launch contract), or it
    // is one of the default-stream handles.
    Ok(unsafe { Context::device_of_stream(raw as CUstream) }?.unwrap_or(0))
}

/// The cached [`Stream`] for `spec`, created on first use, and the address of the object it
/// keeps alive (0 for none).
pub(crate) fn get_with_owner(py: Python<'_>, spec: StreamSpec) -> PyResult<(Stream, usize)> {
    let to_py = |e| launch_err(py, e, |_| None);
    let device = match spec.device {
        Some(d) => d,
        None => device_of_raw(spec.raw).map_err(to_py)?,
    };
    let key = (device, spec.raw);
    if let Some(hit) = STREAMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(&key))
        .map(|e| (e.stream.clone(), e.owner))
    {
        return Ok(hit);
    }
    // A new key: a good time to forget streams whose work is done (stream objects made and
    // dropped in a loop must not pile up).
    forget_idle_streams();
    let owner = spec.owner.as_ref().map_or(0, |o| o.as_ptr() as usize);
    let ctx = crate::device_contexts::context(device).map_err(to_py)?;
    let raw = spec.raw as CUstream;
    let stream = match spec.owner {
        // SAFETY: `raw` is the handle of the stream object `owner`, a stream of the device's
        // primary context (PyTorch, CuPy and cuda.core use primary contexts), which stays
        // valid while `owner` lives; the cached `Stream` holds `owner`.
        Some(owner) => unsafe { Stream::from_raw_keeping(&ctx, raw, Box::new(owner)) },
        // SAFETY: an int handle: the caller promises a live stream of this device while it
        // launches on it, naming that stream until the work launched finished (documented on
        // `tile_py.launch`); 0 and 2 are the default streams, always valid. Nothing keeps the
        // stream alive, so it is named only inside launch calls: its release queue is answered
        // from markers recorded at each launch, and a stream destroyed once its work is done
        // is never touched again.
        None => unsafe { Stream::from_raw_launch_only(&ctx, raw) },
    }
    .map_err(to_py)?;
    let mut g = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(FxHashMap::default);
    let e = map.entry(key).or_insert(Entry { stream, owner });
    let found = (e.stream.clone(), e.owner);
    HELD.store(map.len(), Ordering::Release);
    drop(g);
    Ok(found)
}

/// Every cached stream with work tile_py still holds, after forgetting the others
/// ([`forget_idle`]): callers (`synchronize`, `stats`, exit) never touch a stream with nothing
/// pending.
pub(crate) fn all() -> Vec<Stream> {
    let (busy, dropped) = {
        let mut g = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
        let Some(map) = g.as_mut() else {
            return Vec::new();
        };
        let dropped = forget_idle(map);
        (
            map.values().map(|e| e.stream.clone()).collect::<Vec<_>>(),
            dropped,
        )
    };
    drop(dropped);
    busy
}

/// Synchronises every stream with work tile_py still holds (detached from the interpreter),
/// each even after another failed: a failed wait is counted in that stream's
/// [`Stats::errors`], and a stream found lost (destroyed, reset, poisoned) has leaked and
/// counted what it held ([`Stream::synchronize`]), so that [`all`] forgets it next. Never fails.
pub(crate) fn synchronize_all(py: Python<'_>) {
    let streams = all();
    py.detach(move || {
        for s in &streams {
            // Counted by the stream's release queue; nothing to report to the caller.
            let _ = s.synchronize();
        }
    });
}

/// `stream=1`: the legacy default stream.
pub(crate) const LEGACY: i64 = 1;
/// `stream=2`: the per-thread default stream (its raw handle is `CU_STREAM_PER_THREAD`, 2).
pub(crate) const PER_THREAD: i64 = 2;
/// `stream=-1`: no synchronisation (`sync=False`).
pub(crate) const NO_SYNC: i64 = -1;
/// The raw handle of the legacy default stream as tile_py keeps it (the null stream; the handle
/// `CU_STREAM_LEGACY`, 1, names the same stream).
pub(crate) const LEGACY_RAW: usize = 0;

/// The raw handle of stream number `n` (1 is the legacy default stream, the null handle; any
/// other number is the handle itself, 2 the per-thread default stream).
pub(crate) fn to_raw(n: u64) -> usize {
    if n == LEGACY as u64 {
        LEGACY_RAW
    } else {
        n as usize
    }
}

/// The stream number of the raw handle `raw` (the null handle and `CU_STREAM_LEGACY` are the
/// legacy default stream's 1), or `None` for a handle no `stream=` value can carry (2**63 and
/// above, which would arrive negative).
pub(crate) fn to_number(raw: usize) -> Option<i64> {
    match raw {
        0 | 1 => Some(LEGACY),
        r => i64::try_from(r).ok(),
    }
}
