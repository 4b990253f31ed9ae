//! `tile_py.launch` and the launch path it shares with `BoundLaunch` and the cached cuTile
//! launch: the request is read ([`crate::request`]), the arguments converted and claimed
//! ([`crate::convert`]), tile-launch checks the launch once (`Stream::check`) and enqueues it;
//! the checked launch decides whether to detach from the interpreter.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use pyo3::prelude::*;
use tile_launch::{Guard, Param, Stream};

use crate::completion::LaunchHandle;
use crate::convert::{Converted, Handshake, convert_args_into};
use crate::exceptions::launch_err;
use crate::kernel::Kernel;
use crate::release::{self, COUNTERS, PyGuard, drain};
use crate::request::{ArgList, LaunchRequest, RequestArgs};

/// Launches `kernel` on `stream` with `args`, and returns a handle to wait on or poll
/// (the consumed tensors are on the stream's release queue until the kernel has finished).
///
/// - `stream`: an object with `__cuda_stream__` (torch, cuda.core), a CuPy stream, a CUDA
///   `torch.Stream` (`torch.accelerator.current_stream()`, and streams inside `torch.compile`), or
///   an int handle (1: legacy default stream, 2: per-thread default stream, which producers are
///   asked to order their work before through the legacy default stream; 0 and None are refused).
/// - `grid`, `block`: blocks per grid and threads per block, an int or a tuple or list of 1 to 3
///   ints (x, y, z).
/// - `args`: one per declared parameter: DLPack producers, capsules,
///   `__cuda_array_interface__` objects, Python or NumPy scalars.
/// - `shared_mem`: dynamic shared memory per block, in bytes: an int, NumPy integer scalars
///   included, never a bool (above 48 KiB is opted into).
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
/// `ValueError` (devices, host memory, host memory labelled as device memory, read-only,
/// copied or self-overlapping outputs, tensors that are not dense row-major for plain pointer
/// parameters, lazy conjugate / negative torch views, outputs that require grad or are JAX
/// arrays, grid/block/cluster/shared memory limits; a launch in a child made by `os.fork()`
/// or during interpreter exit), `BufferError` (DLPack version), `OverflowError` (sizes,
/// scalar ranges), `RuntimeError` (tensor memory on another device than its descriptor says,
/// a producer outside a graph capture in progress), `tile_py.CudaError` (a failed driver
/// call), and its subclass `tile_py.DriverNotFoundError` (no CUDA driver could be loaded).
/// An exception a producer raises (its `__dlpack__`, `__index__`, `__float__`, ...) keeps its
/// object and type, with a note naming the argument (`argument i: raised while converting this
/// argument`; `grid[0]: ...` for a configuration value's `__index__`); only a value that
/// converts but does not fit is tile_py's own error.
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
    let r = LaunchRequest::parse(
        py,
        &RequestArgs {
            func: "launch",
            stream,
            grid,
            block,
            shared_mem,
            cluster,
            cooperative,
            programmatic_dependent_launch,
            sync,
            kernel,
            args: Some(args),
        },
    )?;
    let kernel = r.kernel.get();
    submit(
        py,
        &Target {
            stream: &r.stream,
            stream_value: r.stream_value,
            kernel,
            config: &r.config,
            bound: None,
        },
        &r.args,
        r.sync,
    )
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

/// `expected(params)(i)`: what the kernel declares for argument `i`, completing dtype errors.
pub(crate) fn expected(params: &[Param]) -> impl Fn(usize) -> Option<String> + '_ {
    |i| params.get(i).map(|p| p.to_string())
}

/// The launch path of `tile_py.launch` and `BoundLaunch.__call__`, once the request is read
/// and the argument count known good: converts the arguments (the DLPack handshake) in place
/// (about a kilobyte inline, never moved as a whole), then [`submit_converted`].
pub(crate) fn submit(
    py: Python<'_>,
    t: &Target<'_>,
    args: &ArgList<'_>,
    sync: bool,
) -> PyResult<LaunchHandle> {
    let hs = Handshake::new(t.stream_value, sync, t.stream.context().ordinal());
    COUNTERS.launches_attempted.fetch_add(1, Ordering::Relaxed);
    let mut conv = Converted::new();
    convert_args_into(py, &t.kernel.params, args, &hs, &mut conv)?;
    submit_converted(py, t, &mut conv)
}

/// Launches `conv` (every argument converted and claimed): tile-launch checks the launch
/// once, it is enqueued, and `conv` is committed; a refused check rolls `conv` back. Shared
/// with the cached cuTile launch, which converts its arguments before it knows the kernel.
pub(crate) fn submit_converted(
    py: Python<'_>,
    t: &Target<'_>,
    conv: &mut Converted,
) -> PyResult<LaunchHandle> {
    let args = conv.args.drain(..);
    let checked = match t.bound {
        Some(b) => b.check(args),
        None => t.stream.check(&t.kernel.inner, t.config, args),
    };
    let mut checked = match checked {
        Ok(c) => c,
        Err(e) => {
            conv.abandon(py);
            return Err(launch_err(py, e, expected(&t.kernel.params)));
        }
    };
    // The guards go straight to the release queue (one lock of it per launch), and each
    // consumed tensor to `release_tensor` (no allocation per tensor): the handle owns nothing.
    checked
        .hold(
            conv.owners
                .iter()
                .map(|o| Guard::Owner(Box::new(PyGuard::object(o.clone_ref(py))))),
        )
        .release_with(release::release_tensor)
        .queue_guards();
    let taken = checked.tensors();
    // Made attached: a launch is a few microseconds of non-blocking driver calls, and detaching
    // costs about as much and hands the interpreter to a waiting thread. Only a launch that may
    // wait for older work (the release queue near its bound) is made detached.
    let r = if checked.may_wait() {
        // SAFETY: `detach` runs the closure on this thread, where the checked launch's context
        // is bound; what the launch drops there needs no interpreter: its owners are
        // `PyGuard`s and its consumed tensors go to `release_tensor` (both queue the release
        // for a thread that holds the GIL), and an `Unused` never runs its deleter.
        let work = unsafe { SameThread::new(checked) };
        py.detach(move || work.into_inner().launch())
    } else {
        checked.launch()
    };
    // Launched or refused by the driver, every checked tensor was consumed (and a refused
    // launch's released): counted once per launch, not per tensor.
    conv.commit();
    if taken > 0 {
        COUNTERS.consumed.fetch_add(taken as u64, Ordering::Relaxed);
    }
    let r = match r {
        Ok(h) => {
            COUNTERS.launches_issued.fetch_add(1, Ordering::Relaxed);
            // Releases of this launch's work must not wait for a later call into tile_py.
            crate::worker::start();
            Ok(LaunchHandle {
                inner: Mutex::new(Some(h)),
            })
        }
        Err(e) => Err(launch_err(py, e, expected(&t.kernel.params))),
    };
    drain(py);
    r
}

/// A value that is not `Send`, moved into a [`Python::detach`] closure: `detach` runs the
/// closure on the calling thread, so the value never changes threads.
struct SameThread<T>(T);

impl<T> SameThread<T> {
    /// Wraps `value` for a `detach` closure.
    ///
    /// # Safety
    ///
    /// The wrapper must not leave the calling thread: it may only be moved into a closure that
    /// runs on this thread (as `Python::detach` runs its closure), and there `value` is used
    /// and dropped without the interpreter lock, so nothing in it may need that lock.
    unsafe fn new(value: T) -> Self {
        SameThread(value)
    }

    fn into_inner(self) -> T {
        self.0
    }
}

// SAFETY: `SameThread::new`'s caller promises that the value stays on the thread that wrapped
// it and needs no interpreter lock there; the bound is only what `detach` asks of a closure.
unsafe impl<T> Send for SameThread<T> {}
