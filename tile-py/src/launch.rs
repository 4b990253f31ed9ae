//! The launch path: `tile_py.launch`, and `launch_on`, which it shares with `BoundLaunch`:
//! convert the arguments (the DLPack handshake), have tile-launch check the launch once
//! (`Stream::check`), decide from the checked launch whether to detach from the interpreter,
//! enqueue, and roll every claim back on a refusal.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use smallvec::SmallVec;
use tile_launch::{Guard, Param, Stream};

use crate::convert::{Converted, Handshake, convert_args_into, parse_config};
use crate::errors::{Kind, err, launch_err, show};
use crate::handle::LaunchHandle;
use crate::kernel::Kernel;
use crate::pytypes::SameThread;
use crate::release::{COUNTERS, FINALIZING, FORKED, PyGuard, drain};
use crate::{release, streams};

/// Arguments (and per-argument state) held inline by a launch; more spill to the heap.
pub(crate) const INLINE: usize = 8;

/// The launch's arguments, a snapshot of the caller's tuple or list (no allocation for up to
/// [`INLINE`] arguments).
pub(crate) type ArgList<'py> = SmallVec<[Bound<'py, PyAny>; INLINE]>;

pub(crate) fn arg_list<'py>(args: &Bound<'py, PyAny>) -> PyResult<ArgList<'py>> {
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

pub(crate) fn check_count(name: &str, params: &[Param], given: usize) -> PyResult<()> {
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

pub(crate) fn expected(params: &[Param]) -> impl Fn(usize) -> Option<String> + '_ {
    |i| params.get(i).map(|p| p.to_string())
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
                    cooperative = None, programmatic_dependent_launch = None, sync = None),
       text_signature = "(stream, grid, kernel, args, *, block, shared_mem=None, cluster=None, \
                         cooperative=False, programmatic_dependent_launch=False, sync=True)")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch(
    py: Python<'_>,
    stream: &Bound<'_, PyAny>,
    grid: &Bound<'_, PyAny>,
    kernel: &Bound<'_, PyAny>,
    args: &Bound<'_, PyAny>,
    block: &Bound<'_, PyAny>,
    shared_mem: Option<&Bound<'_, PyAny>>,
    cluster: Option<&Bound<'_, PyAny>>,
    cooperative: Option<&Bound<'_, PyAny>>,
    programmatic_dependent_launch: Option<&Bound<'_, PyAny>>,
    sync: Option<&Bound<'_, PyAny>>,
) -> PyResult<LaunchHandle> {
    use crate::kernel::flag_arg;
    let cooperative = flag_arg(cooperative, "launch", "cooperative", false)?;
    let programmatic_dependent_launch = flag_arg(
        programmatic_dependent_launch,
        "launch",
        "programmatic_dependent_launch",
        false,
    )?;
    let sync = flag_arg(sync, "launch", "sync", true)?;
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
pub(crate) fn check_usable() -> PyResult<()> {
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
pub(crate) fn as_kernel<'a, 'py>(
    kernel: &'a Bound<'py, PyAny>,
) -> PyResult<&'a Bound<'py, Kernel>> {
    kernel.cast::<Kernel>().map_err(|_| {
        err(
            Kind::Type,
            format!("kernel must be a tile_py.Kernel, got {}", show(kernel)),
        )
    })
}

/// Where and what a launch launches: the stream (and the value producers are told), the kernel
/// and its configuration, and, for a bound launch, what `Kernel.bind` prepared.
pub(crate) struct Target<'a> {
    pub(crate) stream: &'a Stream,
    pub(crate) stream_value: i64,
    pub(crate) kernel: &'a Kernel,
    pub(crate) config: &'a tile_launch::LaunchConfig,
    pub(crate) bound: Option<&'a tile_launch::BoundLaunch>,
}

/// The launch path shared by `tile_py.launch` and `BoundLaunch.__call__`, once the stream,
/// the configuration and the argument count are known good: converts the arguments (the
/// DLPack handshake), has tile-launch check them all, consume and launch, and rolls back on an
/// error.
pub(crate) fn launch_on(
    py: Python<'_>,
    t: &Target<'_>,
    args: &ArgList<'_>,
    sync: bool,
) -> PyResult<LaunchHandle> {
    let hs = Handshake::new(t.stream_value, sync, t.stream.context().ordinal());
    COUNTERS.launches_attempted.fetch_add(1, Ordering::Relaxed);
    // Converted in place and handed over as a draining iterator: the arguments (about a
    // kilobyte inline) are moved once each, never as a whole buffer.
    let mut conv = Converted::new();
    convert_args_into(py, &t.kernel.params, args, &hs, &mut conv)?;
    launch_converted(py, t, &mut conv)
}

/// The rest of [`launch_on`], once every argument is converted (and claimed) into `conv`:
/// tile-launch checks the launch once, it is enqueued, and on a refusal every claim is rolled
/// back. Shared with `tile_py.cutile`'s cached launch (`cutile`), which converts its
/// arguments before it knows which kernel they select.
pub(crate) fn launch_converted(
    py: Python<'_>,
    t: &Target<'_>,
    conv: &mut Converted,
) -> PyResult<LaunchHandle> {
    let (s, kernel) = (t.stream, t.kernel);
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
                &[], // nothing consumed
            );
            let e = launch_err(py, e, expected(&kernel.params));
            drain(py);
            return Err(e);
        }
    };
    // Options of the checked launch: the owners (Python objects a tensor's memory depends on)
    // are held with the tensors; each consumed tensor is handed to `release_tensor` (no
    // allocation per tensor); the guards go straight to the release queue (one lock of it per
    // launch), and the handle only waits or asks.
    let mut checked = checked;
    checked
        .hold(
            conv.owners
                .iter()
                .map(|o| Guard::Owner(Box::new(PyGuard::object(o.clone_ref(py))))),
        )
        .release_with(release::release_tensor)
        .queue_guards();
    let taken = checked.tensors();
    // The launch is a few microseconds of non-blocking driver calls: made attached, since
    // detaching and re-attaching costs about as much and hands the interpreter to any waiting
    // thread. It can block only when the release queue is near its bound (it then waits for the
    // oldest queued work first), which the checked launch tells: then it is made detached. The
    // common, attached case calls it in place: the checked launch (about a kilobyte of inline
    // arguments) is not moved into a closure.
    let r = if checked.may_wait() {
        let work = SameThread(checked);
        py.detach(move || {
            let work = work;
            work.0.launch()
        })
    } else {
        checked.launch()
    };
    // Whatever the outcome, every tensor the launch held was consumed once it was launched
    // (`Checked::launch`): counted once per launch rather than once per tensor (one atomic add).
    if taken > 0 {
        COUNTERS.consumed.fetch_add(taken as u64, Ordering::Relaxed);
    }
    let r = match r {
        Ok(h) => {
            COUNTERS.launches_issued.fetch_add(1, Ordering::Relaxed);
            // Releases of this launch's work must not wait for a later call into tile_py.
            crate::worker::start();
            // The owners are now held by the launch's guards; `conv` drops our references.
            Ok(LaunchHandle {
                inner: Mutex::new(Some(h)),
            })
        }
        Err(e) => {
            // A launch refused after its check has consumed (and released) every tensor: no
            // claim is handed back, only our references to the owners are dropped.
            let all: SmallVec<[bool; INLINE]> = smallvec::smallvec![true; conv.claims.len()];
            Converted::rollback(
                std::mem::take(&mut conv.claims),
                std::mem::take(&mut conv.owners),
                &all,
            );
            Err(launch_err(py, e, expected(&kernel.params)))
        }
    };
    drain(py);
    r
}

pub(crate) fn forked_err() -> PyErr {
    err(
        Kind::Value,
        "tile_py cannot launch in a process made by os.fork() after CUDA may have been used in \
         the parent (CUDA does not survive fork); use the 'spawn' or 'forkserver' start method",
    )
}
