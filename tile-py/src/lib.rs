//! `tile_py`: the Python extension of tile. Launches CUDA kernels on tensors from PyTorch, CuPy,
//! JAX, cuda.core or any DLPack / `__cuda_array_interface__` producer, and keeps every consumed
//! tensor alive until the GPU work that uses it has finished.
//!
//! # Contract
//!
//! - **Checks before consuming.** `tile_py.launch` checks the stream, the launch configuration
//!   and the argument count before touching any argument, then converts every argument (the
//!   DLPack handshake, see [`convert`]) and has tile-launch check them all (dtype, device,
//!   writability, dense row-major layout for plain pointer parameters, the memory behind each
//!   data pointer, scalar ranges) before any tensor is consumed; torch's lazy views, torch
//!   outputs that require grad and JAX outputs are refused before anything is exported (see
//!   [`producers`]). When a check fails, every
//!   claimed capsule gets its name back and every tensor tile-py already owned is released:
//!   nothing is lost, nothing is launched.
//! - **The stream handshake.** Producers are always told the launch stream:
//!   `__dlpack__(stream=<handle>, max_version=(1, 3))`, retried (per call, never cached per
//!   type) only when the call did not bind because of a keyword tile_py passed: without
//!   `max_version`, then with the stream positionally; never without the stream (a producer's
//!   own `TypeError` propagates after one call). Handles must be below 2**63. The legacy
//!   default stream is sent as 1, never 0; the per-thread default stream (2) is sent as 1 and
//!   the launch stream waits for the legacy stream; -1 only when the caller passes `sync=False`. Producers whose type has the DLPack C
//!   exchange API (`__dlpack_c_exchange_api__`) are converted through it, and the launch stream
//!   waits on the producer's current stream when the two differ.
//! - **Releasing.** A consumed tensor belongs to the launch's handle until the work is done;
//!   then its deleter runs exactly once, with the interpreter attached, on a thread that called
//!   into tile_py or on the release thread ([`worker`], within 50 ms of the work finishing,
//!   without a call), with the tensor's context current and the capture mode relaxed — never on
//!   a CUDA callback thread and never while a CUDA wait holds the GIL (waits are made
//!   detached). See [`release`].
//! - **Errors** map to Python exceptions in one place, [`errors`].
//!
//! # Layering
//!
//! Depends on `tile-launch` (streams, kernels, the release queue), `tile-dlpack` (ownership
//! states, validation), `cuda-sys` (a few driver queries), `dlpark` (DLPack flags), `smallvec`
//! (inline argument buffers) and `pyo3`.
//! Nothing depends on it. `pyo3` appears in this crate alone.

mod bound;
mod convert;
mod errors;
mod export;
mod kernel;
mod producers;
mod pytypes;
mod release;
mod streams;
mod worker;

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use smallvec::SmallVec;
use tile_launch::{Arg, Guard, Param, Stream};

use crate::convert::{Converted, Handshake, convert_args, convert_args_into, parse_config};
use crate::errors::{Kind, err, launch_err, show};
use crate::kernel::Kernel;
use crate::release::{COUNTERS, FINALIZING, FORKED, PyGuard, drain};

/// Moves a value into a `py.detach` closure, which runs on the same thread.
struct SameThread<T>(T);
// SAFETY: `Python::detach` runs its closure on the calling thread, so the value never changes
// threads; the bound only keeps GIL-bound references out, and none is inside.
unsafe impl<T> Send for SameThread<T> {}

/// Arguments (and per-argument state) held inline by a launch; more spill to the heap.
const INLINE: usize = 8;

/// The launch's arguments, a snapshot of the caller's tuple or list (no allocation for up to
/// [`INLINE`] arguments).
type ArgList<'py> = SmallVec<[Bound<'py, PyAny>; INLINE]>;

fn arg_list<'py>(args: &Bound<'py, PyAny>) -> PyResult<ArgList<'py>> {
    if let Ok(t) = args.cast::<PyTuple>() {
        Ok(t.iter().collect())
    } else if let Ok(l) = args.cast::<PyList>() {
        Ok(l.iter().collect())
    } else {
        Err(err(
            Kind::Type,
            format!("args must be a tuple or a list, got {}", show(args)),
        ))
    }
}

fn check_count(name: &str, params: &[Param], given: usize) -> PyResult<()> {
    if params.len() != given {
        return Err(err(
            Kind::Type,
            format!(
                "kernel `{name}` expects {} arguments but {given} were given",
                params.len(),
            ),
        ));
    }
    Ok(())
}

fn expected(params: &[Param]) -> impl Fn(usize) -> Option<String> + '_ {
    |i| params.get(i).map(|p| p.to_string())
}

/// The result of `tile_py.launch`: waits for the launch, or asks whether it is done. The
/// launch's tensors are on its stream's release queue from the moment it is enqueued (released
/// once a later call sees the work done), so the handle owns nothing and dropping it does
/// nothing.
#[pyclass(module = "tile_py")]
struct LaunchHandle {
    /// The launch; gone once retired.
    inner: Mutex<Option<tile_launch::LaunchHandle>>,
}

impl LaunchHandle {
    fn take(&self) -> Option<tile_launch::LaunchHandle> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn put_back(&self, h: tile_launch::LaunchHandle) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
    }
}

#[pymethods]
impl LaunchHandle {
    /// Blocks until the launched work is done (the GIL is released meanwhile), then runs the
    /// deleters of its tensors (and of every other queued launch known done). Idempotent.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        if let Some(h) = self.take() {
            let h = SameThread(h);
            let r = py.detach(move || {
                let h = h;
                h.0.retire().map(drop)
            });
            drain(py);
            streams::forget_idle_streams();
            r.map_err(|e| launch_err(py, e, |_| None))?;
        }
        Ok(())
    }

    /// Whether the launched work is done (non-blocking). When it is, the tensors are released.
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        let Some(h) = self.take() else {
            return Ok(true);
        };
        let r = match h.is_complete() {
            Ok(true) => match h.try_retire() {
                Ok(_) => {
                    streams::forget_idle_streams();
                    Ok(true)
                }
                Err(h) => {
                    self.put_back(h);
                    Ok(false)
                }
            },
            Ok(false) => {
                self.put_back(h);
                Ok(false)
            }
            Err(e) => {
                self.put_back(h);
                Err(launch_err(py, e, |_| None))
            }
        };
        drain(py);
        r
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.wait(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let state = if self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            "pending"
        } else {
            "retired"
        };
        format!("<tile_py.LaunchHandle {state}>")
    }
}

/// Launches `kernel` on `stream` with `args`, and returns a handle to wait on or poll
/// (the consumed tensors are on the stream's release queue until the kernel has finished).
///
/// - `stream`: an object with `__cuda_stream__` (torch, cuda.core), a CuPy stream, a CUDA
///   `torch.Stream` (`torch.accelerator.current_stream()`, and streams inside `torch.compile`), or
///   an int handle (1: legacy default stream, 2: per-thread default stream, which producers are
///   asked to order their work before through the legacy default stream; 0 and None are refused).
/// - `grid`, `block`: blocks per grid and threads per block, an int or a 1-3 tuple (x, y, z).
/// - `args`: one per declared parameter: DLPack producers, capsules,
///   `__cuda_array_interface__` objects, Python or NumPy scalars.
/// - `shared_mem`: dynamic shared memory per block, in bytes (above 48 KiB is opted into).
/// - `cluster`: thread-block cluster dimensions, in blocks (compute capability 9.0+).
/// - `cooperative`: a cooperative launch (grid-wide sync); the grid must fit on the device at once.
/// - `programmatic_dependent_launch`: may start before the previous kernel on the stream ends.
/// - `sync`: False sends stream=-1 to producers and inserts no stream waits.
///
/// Every argument is checked before any tensor is consumed; producers are asked to order their
/// pending work before `stream` (`__dlpack__(stream=...)` or the DLPack C exchange API). The launch
/// is one `cuLaunchKernel` (`cuLaunchKernelEx` when launch attributes are set). Tensors are
/// released (their deleters run) only after an event shows the work has finished: at
/// `LaunchHandle.wait()` or `done()`, at a later call into tile_py, or by the release thread
/// within 50 ms (the handle owns nothing: dropping it does nothing).
///
/// Raises `TypeError` (parameter kinds, dtypes, counts, a `__dlpack__` that takes no stream),
/// `ValueError` (devices, host memory labelled as device memory, read-only, copied or
/// overlapping outputs, tensors that are not dense row-major for plain pointer parameters,
/// lazy conjugate / negative torch views, outputs that require grad or are JAX arrays,
/// grid/block limits), `BufferError` (DLPack version), `OverflowError`
/// (sizes, scalar ranges), `tile_py.CudaError` (a failed driver call), and its subclass
/// `tile_py.DriverNotFoundError` (no CUDA driver could be loaded).
#[pyfunction]
#[pyo3(signature = (stream, grid, kernel, args, *, block, shared_mem = None, cluster = None,
                    cooperative = false, programmatic_dependent_launch = false, sync = true))]
#[allow(clippy::too_many_arguments)]
fn launch(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    grid: &Bound<'_, PyAny>,
    kernel: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    block: &Bound<'_, PyAny>,
    shared_mem: Option<&Bound<'_, PyAny>>,
    cluster: Option<&Bound<'_, PyAny>>,
    cooperative: bool,
    programmatic_dependent_launch: bool,
    sync: bool,
) -> PyResult<LaunchHandle> {
    let (spec, cached) = prelude(py, stream)?;
    let config = parse_config(
        grid,
        block,
        shared_mem,
        cluster,
        cooperative,
        programmatic_dependent_launch,
    )?;
    let kernel = as_kernel(kernel)?;
    let kernel = kernel.get();
    let args = arg_list(args)?;
    check_count(kernel.inner.name(), &kernel.params, args.len())?;
    let stream_value = spec.dlpack_value();
    let s = streams::resolve(py, stream, spec, cached)?;
    launch_on(
        py,
        &Target {
            stream: &s,
            stream_value,
            kernel,
            config: &config,
            bound: None,
        },
        &args,
        sync,
    )
}

/// What `tile_py.launch` and `Kernel.bind` do first: drain queued releases, refuse an
/// unusable process, and read the stream argument (with the stream the per-thread caches know
/// for it). Each then parses its launch configuration (`parse_config`).
pub(crate) fn prelude(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
) -> PyResult<(streams::StreamSpec, Option<Stream>)> {
    drain(py);
    check_usable()?;
    streams::parse_stream_cached(stream)
}

/// Refuses a launch while the interpreter exits or in a forked child.
fn check_usable() -> PyResult<()> {
    if FINALIZING.load(Ordering::Acquire) {
        return Err(err(
            Kind::Value,
            "tile_py is shutting down (interpreter exit): no more launches",
        ));
    }
    if FORKED.load(Ordering::Acquire) {
        return Err(forked_err());
    }
    Ok(())
}

/// `kernel` as a `tile_py.Kernel`, or a `TypeError`.
fn as_kernel<'a, 'py>(kernel: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, Kernel>> {
    kernel.cast::<Kernel>().map_err(|_| {
        err(
            Kind::Type,
            format!("kernel must be a tile_py.Kernel, got {}", show(kernel)),
        )
    })
}

/// Where and what a launch launches: the stream (and the value producers are told), the kernel
/// and its configuration, and, for a bound launch, what `Kernel.bind` prepared.
struct Target<'a> {
    stream: &'a Stream,
    stream_value: i64,
    kernel: &'a Kernel,
    config: &'a tile_launch::LaunchConfig,
    bound: Option<&'a tile_launch::BoundLaunch>,
}

/// The launch path shared by `tile_py.launch` and `BoundLaunch.__call__`, once the stream,
/// the configuration and the argument count are known good: converts the arguments (the
/// DLPack handshake), has tile-launch check them all, consume and launch, and rolls back on an
/// error.
fn launch_on(
    py: Python<'_>,
    t: &Target<'_>,
    args: &ArgList<'_>,
    sync: bool,
) -> PyResult<LaunchHandle> {
    let (s, kernel) = (t.stream, t.kernel);
    let hs = Handshake::new(t.stream_value, sync, s.context().ordinal());
    COUNTERS.launches_attempted.fetch_add(1, Ordering::Relaxed);
    // Converted in place and handed over as a draining iterator: the arguments (about a
    // kilobyte inline) are moved once each, never as a whole buffer.
    let mut conv = Converted::new();
    convert_args_into(py, &kernel.params, args, &hs, &mut conv)?;
    let mut consumed: SmallVec<[bool; INLINE]> = smallvec::smallvec![false; conv.claims.len()];
    // 1. tile-launch checks everything once (nothing consumed); a refusal hands every claim
    //    back.
    let args = conv.args.drain(..);
    let checked = match t.bound {
        Some(b) => b.check(args),
        None => s.check(&kernel.inner, t.config, args),
    };
    let checked = match checked {
        Ok(c) => c,
        Err(e) => {
            Converted::rollback(
                std::mem::take(&mut conv.claims),
                std::mem::take(&mut conv.owners),
                &consumed,
            );
            let e = launch_err(py, e, expected(&kernel.params));
            drain(py);
            return Err(e);
        }
    };
    let owner_guards: SmallVec<[Guard; 2]> = conv
        .owners
        .iter()
        .map(|o| Guard::Owner(Box::new(PyGuard::object(o.clone_ref(py)))))
        .collect();
    // The launch is a few microseconds of non-blocking driver calls: made attached, since
    // detaching and re-attaching costs about as much and hands the interpreter to any waiting
    // thread. It can block only when the release queue is near its bound (it then waits for the
    // oldest queued work first), which the checked launch tells: then it is made detached.
    let blocking = checked.may_wait(owner_guards.len());
    let go = |consumed: &mut [bool]| {
        let guard = |index: usize, used| {
            consumed[index] = true;
            // No allocation per tensor: the release queue hands it to `release_tensor`.
            Guard::HandedOff(tile_launch::HandOff::new(used, release::release_tensor))
        };
        // Queued: the guards go straight to the release queue (one lock of it per launch),
        // and the handle only waits or asks.
        checked.launch_queued_with(guard, owner_guards)
    };
    let r = if blocking {
        let work = SameThread((go, consumed.as_mut_slice()));
        py.detach(move || {
            let work = work;
            let (go, consumed) = work.0;
            go(consumed)
        })
    } else {
        go(consumed.as_mut_slice())
    };
    // Counted once per launch rather than once per tensor (one atomic add).
    let taken = consumed.iter().filter(|&&c| c).count() as u64;
    if taken > 0 {
        COUNTERS.consumed.fetch_add(taken, Ordering::Relaxed);
    }
    let r = match r {
        Ok(h) => {
            COUNTERS.launches_issued.fetch_add(1, Ordering::Relaxed);
            // The owners are now held by the launch's guards; `conv` drops our references.
            Ok(LaunchHandle {
                inner: Mutex::new(Some(h)),
            })
        }
        Err(e) => {
            Converted::rollback(
                std::mem::take(&mut conv.claims),
                std::mem::take(&mut conv.owners),
                &consumed,
            );
            Err(launch_err(py, e, expected(&kernel.params)))
        }
    };
    drain(py);
    r
}

fn forked_err() -> PyErr {
    err(
        Kind::Value,
        "tile_py cannot launch in a process made by os.fork() after CUDA may have been used in \
         the parent (CUDA does not survive fork); use the 'spawn' or 'forkserver' start method",
    )
}

/// `os.register_at_fork(after_in_child=...)`: see [`release::FORKED`].
#[pyfunction]
fn _after_fork_in_child() {
    release::after_fork_in_child();
    worker::after_fork_in_child();
}

/// Runs the conversion and the checks of `launch` against `params`, without a device: the
/// DLPack handshake (producers see `stream`), capsule claims, tile-launch's argument checks
/// (device `device`), then consumes and releases every tensor (`consume=True`) or rolls back
/// as a failed launch does (`consume=False`). For tests on machines without a GPU.
#[pyfunction]
#[pyo3(signature = (params, args, *, stream = None, device = 0, sync = true, consume = true,
                    grid = None, block = None))]
#[allow(clippy::too_many_arguments)]
fn _check_args(
    py: Python<'_>,
    params: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    device: i32,
    sync: bool,
    consume: bool,
    grid: Option<&Bound<'_, PyAny>>,
    block: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    drain(py);
    if FORKED.load(Ordering::Acquire) {
        return Err(forked_err());
    }
    let none = py.None().into_bound(py);
    let (spec, _) = streams::parse_stream_cached(stream.unwrap_or(&none))?;
    let one = 1i32.into_pyobject(py)?.into_any();
    parse_config(
        grid.unwrap_or(&one),
        block.unwrap_or(&one),
        None,
        None,
        false,
        false,
    )?;
    let (params, hs, converted) =
        convert_declared(py, "_check_args", &spec, params, args, device, sync, true)?;
    let Converted {
        args,
        claims,
        owners,
    } = converted;
    let sig = tile_launch::Signature::new(params.iter().copied());
    let checked = tile_launch::check_args("_check_args", &sig, &args, hs.device);
    let mut consumed: SmallVec<[bool; INLINE]> = smallvec::smallvec![false; claims.len()];
    let r = match checked {
        Err(e) => {
            drop(args);
            Err(launch_err(py, e, expected(&params)))
        }
        Ok(()) if !consume => {
            drop(args);
            Ok(())
        }
        Ok(()) => {
            let mut r = Ok(());
            for (index, arg) in args.into_iter().enumerate() {
                let Arg::Tensor(t) = arg else { continue };
                // Same consumption as tile-launch's: `Unused::consume` into a guard.
                match tile_launch::TensorArg::into_source(t) {
                    tile_launch::TensorSource::Unused(u) => {
                        consumed[index] = true;
                        match u.consume() {
                            Ok(used) => {
                                COUNTERS.consumed.fetch_add(1, Ordering::Relaxed);
                                drop(PyGuard::tensor(used));
                            }
                            Err(source) if r.is_ok() => {
                                r = Err(launch_err(
                                    py,
                                    tile_launch::Error::Descriptor { index, source },
                                    expected(&params),
                                ));
                            }
                            Err(_) => {}
                        }
                    }
                    tile_launch::TensorSource::Used(used) => drop(PyGuard::tensor(used)),
                }
            }
            r
        }
    };
    let all_consumed = consume && r.is_ok();
    if !all_consumed {
        Converted::rollback(claims, owners, &consumed);
    } else {
        drop(claims);
        for o in owners {
            drop(PyGuard::object(o));
        }
    }
    drain(py);
    r
}

/// What `_check_args` and `_pack_args` share: the declared parameters parsed, the argument
/// count checked, and the arguments converted with the handshake a launch on `spec` (device
/// `device` when the stream does not say) would make; with `count`, the attempt is counted as
/// a launch's is.
#[allow(clippy::too_many_arguments)]
fn convert_declared(
    py: Python<'_>,
    what: &str,
    spec: &streams::StreamSpec,
    params: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    device: i32,
    sync: bool,
    count: bool,
) -> PyResult<(Vec<Param>, Handshake, Converted)> {
    let params = kernel::parse_params(params)?;
    let args = arg_list(args)?;
    check_count(what, &params, args.len())?;
    let hs = Handshake::new(spec.dlpack_value(), sync, spec.device.unwrap_or(device));
    if count {
        COUNTERS.launches_attempted.fetch_add(1, Ordering::Relaxed);
    }
    let converted = convert_args(py, &params, &args, &hs)?;
    Ok((params, hs, converted))
}

/// The kernel parameter values a launch with `params` and `args` would pass, one int per
/// kernel parameter (an array parameter gives its pointer, extents and strides), after the
/// conversion and checks of `_check_args` (device `device`); nothing is consumed (every claim is
/// rolled back). For tests on machines without a GPU.
#[pyfunction]
#[pyo3(signature = (params, args, *, stream = None, device = 0))]
fn _pack_args(
    py: Python<'_>,
    params: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
    device: i32,
) -> PyResult<Vec<u64>> {
    drain(py);
    let none = py.None().into_bound(py);
    let (spec, _) = streams::parse_stream_cached(stream.unwrap_or(&none))?;
    let (params, hs, converted) =
        convert_declared(py, "_pack_args", &spec, params, args, device, true, false)?;
    let Converted {
        args,
        claims,
        owners,
    } = converted;
    let sig = tile_launch::Signature::new(params.iter().copied());
    let packed = tile_launch::pack_args("_pack_args", &sig, &args, hs.device);
    drop(args);
    Converted::rollback(claims, owners, &[]);
    drain(py);
    packed.map_err(|e| launch_err(py, e, expected(&params)))
}

/// The compute capability `(major, minor)` of `stream`'s device (read once per device with
/// `cuDeviceGetAttribute` when tile_py first uses it). `stream` as for `launch`.
#[pyfunction]
fn compute_capability(py: Python<'_>, stream: &Bound<'_, PyAny>) -> PyResult<(u32, u32)> {
    let (spec, cached) = streams::parse_stream_cached(stream)?;
    let s = streams::resolve(py, stream, spec, cached)?;
    Ok(s.context().limits().compute_capability)
}

/// Waits for the work of every stream that holds tensors not yet released (the GIL is
/// released meanwhile), then releases every deferred tensor. Streams with nothing pending are
/// not touched: their handles may have been destroyed since. Never raises for one stream's
/// trouble: a stream whose wait fails is counted in `stats()["errors"]` and the others are
/// still waited for; when the stream or its context is gone or poisoned (destroyed, reset, a
/// kernel fault), what it held is leaked and counted (`stats()["leaked"]`) and it is forgotten.
#[pyfunction]
fn synchronize(py: Python<'_>) -> PyResult<()> {
    streams::synchronize_all(py);
    drain(py);
    Ok(())
}

fn totals(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let streams = streams::all();
    // Streams already forgotten (their work released) keep their totals.
    let st = streams
        .iter()
        .fold(streams::forgotten_stats(), |sum, s| sum.plus(&s.stats()));
    let (pg, pb, hg, hb) = (
        st.pending_guards,
        st.pending_bytes,
        st.held_guards,
        st.held_bytes,
    );
    let (rel, leak, launches, errs) =
        (st.guards_released, st.guards_leaked, st.launches, st.errors);
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
///   `__cuda_array_interface__` object kept alive) of launches, queued on the streams'
///   release queues until an event shows their work finished, and the bytes among them that
///   only the queue keeps alive (exports the producer copied for the launch, DLPack
///   `IS_COPIED`; a tensor the caller still holds counts 0). The bytes are bounded by a quarter
///   of the device's memory: past it, a launch that adds such bytes first waits for older work.
/// - `held_guards`, `held_bytes`: always 0 in tile_py, whose launches put their tensors straight on
///   the release queue (kept for parity with Rust's `Stream::stats`).
/// - `released`: DLPack deleters tile_py has run (tensors released), on every path:
///   `wait()` / `done()`, release queues, CUDA graphs, and exports dropped by a failed check.
/// - `guards_released`: guards the streams' release queues dropped, once the work was done (or
///   at once when the driver refused the launch). Dropping a guard only queues its release for
///   a thread that holds the GIL; this count includes `__cuda_array_interface__` objects and
///   leaves out captured launches and failed checks, so it differs from `released`.
/// - `guards_leaked`: guards the streams' release queues leaked because their completion could
///   not be confirmed (a failed wait); part of `leaked`.
/// - `leaked`: tensors never released: their completion could not be confirmed (a failed
///   wait), the interpreter was exiting, or they were inherited by a child of `os.fork()`.
/// - `launches`: launches the driver accepted on those streams (launches captured into a CUDA
///   graph are not counted).
/// - `errors`: completion events the release queues failed to record, query or wait for.
/// - `queued_releases`: releases whose work is done but whose deleter has not run yet (they run
///   at the next call into tile_py, or on the release thread within 50 ms).
#[pyfunction]
fn stats(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    for s in streams::all() {
        s.poll();
    }
    drain(py);
    totals(py)
}

/// Debug counters of this process: launches attempted and issued, tensors consumed, released
/// (deleters run), leaked at exit, deleter errors, releases queued.
#[pyfunction]
fn _debug_counters(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let c = &COUNTERS;
    d.set_item(
        "launches_attempted",
        c.launches_attempted.load(Ordering::Relaxed),
    )?;
    d.set_item("launches_issued", c.launches_issued.load(Ordering::Relaxed))?;
    d.set_item("consumed", c.consumed.load(Ordering::Relaxed))?;
    d.set_item("released", c.released.load(Ordering::Relaxed))?;
    d.set_item("leaked_at_exit", c.leaked_at_exit.load(Ordering::Relaxed))?;
    d.set_item("deleter_errors", c.deleter_errors.load(Ordering::Relaxed))?;
    d.set_item("queued_releases", release::queued())?;
    Ok(d)
}

/// The `atexit` hook: waits up to `timeout` seconds for pending work (polling, detached),
/// releases what completed, then stops releasing: whatever is still pending is leaked and
/// counted, with one warning on stderr.
#[pyfunction]
#[pyo3(signature = (timeout = 5.0))]
fn _shutdown(py: Python<'_>, timeout: f64) -> PyResult<u64> {
    if timeout.is_nan() {
        return Err(err(Kind::Value, "timeout is nan; seconds expected"));
    }
    // Negative is 0; a timeout too large for `Duration` / `Instant` (inf included) has no
    // deadline: wait until the work is done.
    let deadline = std::time::Duration::try_from_secs_f64(timeout.max(0.0))
        .ok()
        .and_then(|d| std::time::Instant::now().checked_add(d));
    loop {
        let streams = SameThread(streams::all());
        let busy = py.detach(move || {
            let streams = streams;
            streams
                .0
                .iter()
                .map(|s| {
                    s.poll();
                    let st = s.stats();
                    st.pending_guards + st.held_guards
                })
                .sum::<usize>()
        });
        drain(py);
        if busy == 0 || deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            break;
        }
        py.detach(|| std::thread::sleep(std::time::Duration::from_millis(1)));
    }
    FINALIZING.store(true, Ordering::Release);
    worker::stop(py);
    let pending: u64 = streams::all()
        .iter()
        .map(|s| {
            let st = s.stats();
            (st.pending_guards + st.held_guards) as u64
        })
        .sum::<u64>()
        + release::queued() as u64;
    if pending > 0 {
        eprintln!(
            "tile_py: {pending} DLPack tensor(s) leaked at exit (their GPU work had not finished)"
        );
    }
    Ok(pending)
}

#[pymodule]
fn _tile_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    // The crate version, which maturin also writes into the wheel's metadata.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CudaError", errors::cuda_error_type(py))?;
    m.add(
        "DriverNotFoundError",
        errors::driver_not_found_error_type(py),
    )?;
    m.add_class::<kernel::Library>()?;
    m.add_class::<kernel::Kernel>()?;
    m.add_class::<kernel::PyParam>()?;
    m.add_class::<LaunchHandle>()?;
    m.add_class::<bound::BoundLaunch>()?;
    m.add_function(wrap_pyfunction!(kernel::input, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::output, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::inout, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::scalar, m)?)?;
    m.add_function(wrap_pyfunction!(launch, m)?)?;
    m.add_function(wrap_pyfunction!(synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(_check_args, m)?)?;
    m.add_function(wrap_pyfunction!(_pack_args, m)?)?;
    m.add_function(wrap_pyfunction!(export::_export, m)?)?;
    m.add_function(wrap_pyfunction!(compute_capability, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_counters, m)?)?;
    m.add_function(wrap_pyfunction!(_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(worker::_release_thread, m)?)?;
    m.add_function(wrap_pyfunction!(worker::_queue_release, m)?)?;
    Ok(())
}
