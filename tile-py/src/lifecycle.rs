//! The calls around launches: `synchronize`, `stats`, `compute_capability`, and the `atexit`
//! hook `_shutdown`. What each does in a child made by `os.fork()` is [`crate::process`]'s
//! rule.

use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::exceptions::{Kind, err};
use crate::process::{FINALIZING, forked, refuse_in_fork};
use crate::release::{COUNTERS, drain};
use crate::{release, stream_arg};

/// The compute capability `(major, minor)` of `stream`'s device (read once per device with
/// `cuDeviceGetAttribute` when tile_py first uses it). `stream` as for `launch`. Raises
/// `ValueError` in a child made by `os.fork()`.
#[pyfunction]
pub(crate) fn compute_capability(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
) -> PyResult<(u32, u32)> {
    refuse_in_fork("read a device's compute capability")?;
    let (s, _) = crate::stream_arg::launch_stream(py, stream)?;
    Ok(s.context().limits().compute_capability)
}

/// Waits for the work of every stream that holds tensors not yet released (the GIL is
/// released meanwhile), then releases every deferred tensor: on return, every deleter of
/// work launched before the call has run, including those another thread (the release thread,
/// or a thread inside a tile_py call) had taken and was still running; it waits for them, with
/// the GIL released. Called from inside a deleter, it does not wait for releases under way on
/// other threads (that could deadlock; see `stats()["releasing"]`). The streams whose tensors
/// are all released are then forgotten (their stream objects no longer kept alive). Streams
/// with nothing pending are not touched: their handles may have been destroyed since. Never raises for one stream's
/// trouble: a stream whose wait fails is counted in `stats()["errors"]` and the others are
/// still waited for; when the stream or its context is gone or poisoned (destroyed, reset, a
/// kernel fault), what it held is leaked and counted (`stats()["leaked"]`) and it is forgotten.
/// In a child made by `os.fork()` it returns at once: the child has launched nothing, and what
/// the parent's streams held is leaked.
#[pyfunction]
pub(crate) fn synchronize(py: Python<'_>) -> PyResult<()> {
    if forked() {
        drain(py);
        return Ok(());
    }
    stream_arg::synchronize_all(py);
    release::settle(py);
    // What the wait released leaves its stream idle: forget it now, not at the next call.
    stream_arg::forget_idle_streams();
    Ok(())
}

fn totals(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let (streams, base) = if forked() {
        // The child holds no stream of its own; the parent's counted once, at the fork.
        (
            Vec::new(),
            crate::process::inherited_stats().unwrap_or_default(),
        )
    } else {
        // Streams already forgotten (their work released) keep their totals.
        (stream_arg::all(), stream_arg::forgotten_stats())
    };
    let st = streams.iter().fold(base, |sum, s| sum.plus(&s.stats()));
    let (pg, pb, hg, hb) = (
        st.pending_guards,
        st.pending_bytes,
        st.held_guards,
        st.held_bytes,
    );
    let (rel, leak, launches, errs) =
        (st.guards_released, st.guards_leaked, st.launches, st.errors);
    let releasing = st.releasing_guards + release::releasing();
    d.set_item("streams", streams.len())?;
    d.set_item("pending_guards", pg)?;
    d.set_item("pending_bytes", pb)?;
    d.set_item("held_guards", hg)?;
    d.set_item("held_bytes", hb)?;
    d.set_item("released", COUNTERS.released.load(Ordering::Relaxed))?;
    d.set_item(
        "leaked",
        leak + COUNTERS.leaked_at_exit.load(Ordering::Relaxed),
    )?;
    d.set_item("guards_released", rel)?;
    d.set_item("guards_leaked", leak)?;
    d.set_item("launches", launches)?;
    d.set_item("errors", errs)?;
    d.set_item("queued_releases", release::queued())?;
    d.set_item("releasing", releasing)?;
    Ok(d)
}

/// Counters of tile_py's streams and release queues, as a dict of ints. Polls the streams first
/// (non-blocking) and runs the queued releases, so tensors whose work has finished are released.
/// Never raises for one stream's trouble (see `synchronize`).
///
/// - `streams`: streams tile_py holds: one per device and stream handle with launches whose tensors are
///   not all released yet. Once its work is released a stream is forgotten: its stream object is
///   no longer kept alive and its handle is never touched again (it may be destroyed and reused).
/// - `pending_guards`, `pending_bytes`: guards (one per tensor, and one per
///   `__cuda_array_interface__` object kept alive) of launches, and one per object of `hold`,
///   queued on the streams' release queues until an event shows their work finished, and the
///   bytes among them that only the queue keeps alive (exports the producer copied for the
///   launch, DLPack `IS_COPIED`; a tensor the caller still holds counts 0). The bytes are
///   bounded by a quarter of the device's memory: past it, a launch that adds such bytes first
///   waits for older work.
/// - `held_guards`, `held_bytes`: always 0 in tile_py, whose launches put their tensors straight on
///   the release queue (kept for parity with Rust's `Stream::stats`).
/// - `released`: DLPack deleters tile_py has run (tensors released, and the descriptors it
///   makes for `__cuda_array_interface__` objects), on every path: `wait()` / `done()`,
///   release queues, CUDA graphs, and exports dropped by a failed check.
/// - `guards_released`: guards the streams' release queues dropped, once the work was done (or
///   at once when the driver refused the launch). Dropping a guard only queues its release for
///   a thread that holds the GIL; this count includes `__cuda_array_interface__` objects and
///   leaves out captured launches and failed checks, so it differs from `released`.
/// - `guards_leaked`: guards the streams' release queues leaked because their completion could
///   not be confirmed (a failed wait); part of `leaked`.
/// - `leaked`: tensors never released: their completion could not be confirmed (a failed
///   wait), the interpreter was exiting, or they were inherited by a child of `os.fork()`.
/// - `launches`: launches the driver accepted on those streams, and `hold` calls (those captured
///   into a CUDA graph are not counted).
/// - `errors`: completion events the release queues failed to record, query or wait for.
/// - `queued_releases`: releases whose work is done but whose deleter has not run yet (they run
///   at the next call into tile_py, or on the release thread within 50 ms).
/// - `releasing`: releases under way on some thread: taken off `pending_guards` or
///   `queued_releases` by a thread that has not finished them yet (a deleter running, or
///   waiting its turn in the same batch). `synchronize()` and `LaunchHandle.wait()` wait for
///   them.
///
/// In a child made by `os.fork()`: no poll; the parent's counters as inherited at the fork, with
/// `streams` 0 and what the parent's streams held counted in `leaked`.
#[pyfunction]
pub(crate) fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    if !forked() {
        for s in stream_arg::all() {
            s.poll();
        }
    }
    drain(py);
    totals(py)
}

/// The `atexit` hook: waits up to `timeout` seconds in all for pending work (polling, detached)
/// and for releases other threads are running (the release thread's included, even one whose
/// deleter blocks), releases what completed, then stops releasing: whatever is still pending
/// or still being released is leaked and counted, with one warning on stderr. A second call
/// returns 0 at once.
#[pyfunction]
#[pyo3(signature = (timeout = 5.0))]
pub(crate) fn _shutdown(py: Python<'_>, timeout: f64) -> PyResult<u64> {
    if timeout.is_nan() {
        return Err(err(Kind::Value, "timeout is nan; seconds expected"));
    }
    if FINALIZING.load(Ordering::Acquire) {
        // Run already (by hand, then at exit): what was left then is leaked and counted, and
        // nothing is released any more; no second wait, no second warning.
        return Ok(0);
    }
    if forked() {
        // Nothing of the child's own is pending; the parent's was counted at the fork.
        FINALIZING.store(true, Ordering::Release);
        return Ok(0);
    }
    // Negative is 0; a timeout too large for `Duration` / `Instant` (inf included) has no
    // deadline: wait until the work is done.
    let deadline = std::time::Duration::try_from_secs_f64(timeout.max(0.0))
        .ok()
        .and_then(|d| std::time::Instant::now().checked_add(d));
    loop {
        let streams = stream_arg::all();
        let busy = py.detach(move || {
            streams
                .iter()
                .map(|s| {
                    s.poll();
                    let st = s.stats();
                    st.pending_guards + st.held_guards + st.releasing_guards
                })
                .sum::<usize>()
        });
        drain(py);
        // Releases another thread is running count as pending work: waited for, up to the
        // deadline (detached: they need the interpreter to finish).
        let busy = busy + release::releasing();
        if busy == 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        py.detach(|| std::thread::sleep(std::time::Duration::from_millis(1)));
    }
    FINALIZING.store(true, Ordering::Release);
    // The same deadline: a deleter blocking on the release thread does not hold exit up; its
    // batch is counted below (`release::releasing()`) as leaked.
    release::stop_thread(py, deadline);
    let pending: u64 = stream_arg::all()
        .iter()
        .map(|s| {
            let st = s.stats();
            (st.pending_guards + st.held_guards + st.releasing_guards) as u64
        })
        .sum::<u64>()
        + (release::queued() + release::releasing()) as u64;
    if pending > 0 {
        eprintln!(
            "tile_py: {pending} tensor(s) or object(s) kept for GPU work leaked at exit (their GPU work or their release had not finished)"
        );
    }
    Ok(pending)
}
