//! One cached tile-launch [`Stream`] (with its release queue) per `(device, handle)`, made on a
//! stream's first launch and forgotten once its work is released.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_sys::CUstream;
use pyo3::prelude::*;
use tile_launch::{Context, Stats, Stream};

use crate::exceptions::launch_err;
use crate::stream_arg::StreamSpec;

/// A cached stream and the address of the Python object it keeps alive (0 for an int handle).
struct Entry {
    stream: Stream,
    owner: usize,
}

static STREAMS: Mutex<Option<HashMap<(i32, usize), Entry>>> = Mutex::new(None);
/// `STREAMS`' length, updated under its lock, read without it ([`any_held`]).
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Whether tile_py holds a stream (one with work whose tensors are not all released). Takes no
/// lock: read by the release thread ([`crate::worker`]) to skip attaching when idle.
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
fn forget_idle(map: &mut HashMap<(i32, usize), Entry>) -> Vec<Stream> {
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
    let map = g.get_or_insert_with(HashMap::new);
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
