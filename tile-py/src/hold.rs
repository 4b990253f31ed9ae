//! `tile_py.hold(stream, *objects)`: the release queue of tile_py's launches, offered to any
//! launcher (cuda.core, CuPy, Triton, a C extension, ...) that enqueued work on `stream` using
//! `objects`. Each object is kept alive until the stream's work up to the call has completed,
//! then released as a launch's tensors are ([`crate::release`]: deleters and decrefs attached,
//! never on a driver thread); under a CUDA graph capture the graph owns them
//! ([`tile_launch::Stream::hold`]).
//!
//! An object is read as a launch reads an argument ([`crate::convert`]) and committed only when
//! every object was read: a DLPack producer is exported with the stream handshake, a capsule
//! not consumed yet is claimed (renamed `used_*`), a capsule a launcher consumed already is
//! taken over (its deleter becomes tile_py's), any other object is held by a strong reference.
//! A refusal part-way rolls back what was read before it as a refused launch does: nothing is
//! held, nothing released early, nothing taken over.

use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};
use smallvec::SmallVec;
use tile_dlpack::Unused;
use tile_launch::{Guard, HandOff};

use crate::convert::{
    ANY_INPUT, Converted, Handshake, HeldCapsule, INLINE, TakenCapsule, converting,
    export_producer, hold_capsule, same_capsule_as, says_host,
};
use crate::exceptions::{Kind, arg_err, launch_err};
use crate::launch::ArgList;
use crate::release::{self, COUNTERS, PyGuard, drain};
use crate::stream_arg::StreamArg;

/// Keeps each of `objects` alive until all the work enqueued on `stream` up to this call has
/// completed, then releases it; returns None without waiting for that work (but see below).
///
/// This is what a launcher that is not tile_py calls right after enqueueing work that uses
/// `objects`, instead of dropping them (or calling a DLPack deleter) when its launch call
/// returns: the objects join `stream`'s release queue as the tensors of a `tile_py.launch`
/// do, and are released once an event recorded after this call shows the work done (at a later
/// call into tile_py, or by tile_py's release thread within 50 ms). Inside a CUDA graph capture
/// of `stream`, the graph owns them instead, until it and every executable graph made from it
/// are destroyed.
///
/// - `stream`: as for `launch`: an object with `__cuda_stream__` (torch, cuda.core), a CuPy or
///   numba-cuda stream, a CUDA `torch.Stream`, or an int handle (1: legacy default stream, 2:
///   per-thread default stream; 0 and None are refused). An int handle must name a live stream
///   during the call and keep naming that stream until the work this call holds the objects for has
///   finished (as for `launch`: tile_py names it only inside the calls that launch or hold on it,
///   and reads completion from the events those calls record there, newest first, so a handle
///   destroyed while that work runs and reused by a new stream would let them go early).
/// - `objects`, each one of:
///   - a DLPack producer (an object with `__dlpack__`, or PyTorch's C exchange API): exported
///     as `launch` exports an argument for `stream` (`__dlpack__(stream=...)`, so the producer
///     orders its pending work before later work on `stream`), and that export is held: its
///     deleter runs once the work is done, and it keeps the producer's memory alive until
///     then, even if the producer object is deleted. No stream wait is inserted. A host producer
///     whose `__dlpack__` refuses the stream, as DLPack asks of host memory (a NumPy array, a CPU
///     tensor: a host staging buffer of an async copy), is held as any other object is.
///   - a DLPack capsule named `dltensor` or `dltensor_versioned`: consumed (renamed
///     `used_dltensor[_versioned]`) and held; its deleter runs once the work is done.
///   - a DLPack capsule named `used_dltensor` or `used_dltensor_versioned`, which a launcher
///     consumed (it read the pointer and renamed the capsule): the caller hands over the duty
///     to call the tensor's deleter, which tile_py runs once the work is done. Nothing of it is
///     read but its deleter: whatever its descriptor says, it is held, never refused. The
///     caller must not call that deleter itself afterwards, nor pass a capsule whose deleter
///     was called already (tile_py cannot tell). A capsule tile_py consumed itself (passed to
///     `launch` or `hold` before, or claimed through another object of the call) is refused
///     (`ValueError`): its deleter is tile_py's already.
///   - any other object (including `__cuda_array_interface__` objects without `__dlpack__`): a
///     strong reference, dropped once the work is done (with the GIL, on a thread that calls
///     into tile_py or on tile_py's release thread).
///
/// Every object is read before anything is held: when one is refused, the capsules claimed before
/// it get their names back, the exports made for the call are released, and nothing is taken over
/// or held. The driver calls, per call whatever the number of objects: the stream's context made
/// current, one `cuStreamGetCaptureInfo`, then, as for a launch, an amortised `cuEventRecord` and
/// `cuEventQuery`, or under capture `cuUserObjectCreate` and `cuGraphRetainUserObject`. It does not
/// wait for the work it holds, with one exception: a call of more objects than the release queue's
/// guard bound (65,536) waits for that work before returning, as a launch of that many tensors
/// does; like a launch, it waits for older work (with the GIL released) when `stream`'s release
/// queue is at its bound. Each hold counts as one of `stats()["launches"]`, and each object as one
/// of `pending_guards` until the work is done.
///
/// Raises `TypeError` (a stream of an unsupported type; a capsule with another name or none, a
/// `__dlpack__` that returns something else than a capsule or takes no stream), `ValueError`
/// (stream 0 or another bad stream value; the same capsule twice; a DLPack capsule of a null
/// pointer; an export or unconsumed capsule whose descriptor does not validate; a lazy
/// conjugate / negative torch view; a call in a child made by
/// `os.fork()` or during interpreter exit), `BufferError` (DLPack version), `OverflowError`
/// (descriptor sizes), `tile_py.CudaError` (a failed driver call: resolving the stream; reading its
/// capture state, when what was read is leaked rather than released early; attaching it to the
/// graph being captured) and its subclass `tile_py.DriverNotFoundError` (no CUDA driver). An error
/// names the object at fault as `argument i` (`i` counting from 0 among `objects`); an
/// exception a producer raises keeps its type, with that note.
#[pyfunction]
#[pyo3(signature = (stream, *objects))]
pub(crate) fn hold(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    objects: &Bound<'_, PyTuple>,
) -> PyResult<()> {
    crate::process::begin_work(py, "hold objects", "holds")?;
    let arg = StreamArg::parse(stream)?;
    let stream_value = arg.spec.dlpack_value();
    let stream = arg.resolve(py)?;
    if objects.is_empty() {
        return Ok(());
    }
    let hs = Handshake::new(stream_value, true, stream.context().ordinal());
    let objects: ArgList<'_> = objects.iter().collect();
    let mut conv = Converted::new();
    let mut exports = SmallVec::<[Unused<'static>; INLINE]>::new();
    let mut taken = SmallVec::<[TakenCapsule; 2]>::new();
    let read = converting(py, &objects, &mut conv, |conv, at| {
        read_each(py, &objects, &hs, conv, &mut exports, &mut taken, at)
    });
    if let Err(e) = read {
        // Given back: the caller keeps the duty to call their deleters (never called here).
        taken.drain(..).for_each(|t| t.give_back(py));
        return Err(e);
    }
    // Every object read: commit. A validated export's `consume` cannot fail (its descriptor was
    // validated by `peek`, and only a null or unsupported one is refused again).
    let copied = exports
        .iter()
        .any(|u| u.peek().is_ok_and(|v| v.is_copied()));
    let mut guards = SmallVec::<[Guard; INLINE]>::new();
    for u in exports {
        if let Ok(used) = u.consume() {
            guards.push(Guard::HandedOff(HandOff::new(
                used,
                release::release_tensor,
            )));
        }
    }
    guards.extend(
        taken
            .drain(..)
            .map(|t| Guard::Owner(Box::new(PyGuard::taken(t.into_taken())))),
    );
    let tensors = guards.len();
    guards.extend(
        conv.owners
            .drain(..)
            .map(|o| Guard::Owner(Box::new(PyGuard::object(o)))),
    );
    conv.commit();
    drop(conv);
    if tensors > 0 {
        COUNTERS
            .consumed
            .fetch_add(tensors as u64, Ordering::Relaxed);
    }
    // Held attached, as a launch is made, unless the queue may wait for older work first (it
    // is near its bound, or this hold adds exports the producer copied, whose bytes count
    // against it): then detached. What is dropped there needs no interpreter: tensors go to
    // `release_tensor`, owners are `PyGuard`s (both queue the release for an attached thread).
    let r = if copied || stream.launch_may_wait(guards.len(), 0) {
        py.detach(|| stream.hold(guards))
    } else {
        stream.hold(guards)
    };
    // Releases of the held objects must not wait for a later call into tile_py.
    crate::release::start_thread();
    drain(py);
    r.map_err(|e| launch_err(py, e, |_| None))
}

/// Reads each of `objects` into `conv` (claims and owners) and `exports` (the tensors to
/// consume); `at` is the index being read. Stops at the first refusal, leaving the rollback to
/// [`converting`].
fn read_each(
    py: Python<'_>,
    objects: &[Bound<'_, PyAny>],
    hs: &Handshake,
    conv: &mut Converted,
    exports: &mut SmallVec<[Unused<'static>; INLINE]>,
    taken: &mut SmallVec<[TakenCapsule; 2]>,
    at: &mut usize,
) -> PyResult<()> {
    for (index, obj) in objects.iter().enumerate() {
        *at = index;
        let export = if obj.cast::<PyCapsule>().is_ok() {
            // SAFETY: `hold`'s documented contract: a consumed capsule's deleter duty is handed
            // over, uncalled, once. The same capsule twice in this call (which the first
            // occurrence may have just renamed `used_*`) is refused before it is taken over.
            match unsafe { hold_capsule(py, index, obj) }? {
                HeldCapsule::Claimed(t) => conv.push_held(t),
                // Refused as a launch refuses a capsule passed twice ([`converting`] says so).
                HeldCapsule::TakenOver(t) if same_capsule_as(objects, index).is_some() => {
                    t.give_back(py); // the first occurrence holds it
                    return Err(arg_err(Kind::Value, index, "DLPack capsule passed twice"));
                }
                // Held unread: never refused, never released early.
                HeldCapsule::TakenOver(t) => {
                    taken.push(t);
                    continue;
                }
            }
        } else if let Some(t) = match export_producer(py, index, obj, &ANY_INPUT, hs) {
            Ok(t) => t,
            // A host producer (NumPy, a CPU tensor) refuses a CUDA stream, as DLPack asks of
            // host memory: there is no GPU work of its to order. Its memory is kept alive as
            // any other object's is, by a reference (a host staging buffer of an async copy).
            Err(e) if !crate::exceptions::raised_as_is(py, &e) && says_host(py, obj)? => {
                conv.owners.push(obj.clone().unbind());
                continue;
            }
            Err(e) => return Err(e),
        } {
            conv.push_held(t)
        } else {
            conv.owners.push(obj.clone().unbind());
            continue;
        };
        // Validated now, so that the commit cannot fail: a tensor whose descriptor does not
        // validate is refused (its claim given back by the rollback), never released early.
        if let Err(source) = export.peek() {
            return Err(launch_err(
                py,
                tile_launch::Error::Descriptor { index, source },
                |_| None,
            ));
        }
        exports.push(export);
    }
    Ok(())
}
