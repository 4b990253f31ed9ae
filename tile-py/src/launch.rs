//! `tile_py.launch`, from the Python call to tile-launch: the request is read
//! ([`LaunchRequest::parse`]: flags, stream, configuration, kernel, argument count), the
//! arguments converted and claimed ([`crate::convert`]), tile-launch checks the launch once
//! (`Stream::check`) and enqueues it, and the caller gets a [`LaunchHandle`]. `BoundLaunch` and
//! the cached cuTile launch share the reader ([`RequestArgs`], [`arg_list`]) and the submission
//! ([`submit`], [`submit_converted`]).
//!
//! Only what a value cannot be is refused while reading (not an int, a dimension above
//! `u32::MAX`, an unusable process, a stream object tile_py cannot read); every limit of a
//! configuration is tile-launch's to check, once, with the launch (`Stream::check`,
//! `Stream::bind`).

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyTuple};
use smallvec::SmallVec;
use tile_launch::{Dim3, Guard, LaunchConfig, Param, Stream};

use crate::convert::{Converted, Handshake, INLINE, convert_args_into, int_text, is_negative};
use crate::exceptions::{Kind, err, launch_err, raised_as_is, show};
use crate::kernel::Kernel;
use crate::release::{self, COUNTERS, PyGuard, drain};
use crate::stream_arg::StreamArg;

/// Launches `kernel` on `stream` with `args`, and returns a handle to wait on or poll
/// (the consumed tensors are on the stream's release queue until the kernel has finished).
///
/// - `stream`: an object with `__cuda_stream__` (torch, cuda.core), a CuPy or numba-cuda
///   stream, a CUDA `torch.Stream` (`torch.accelerator.current_stream()`, and streams inside
///   `torch.compile`), or an int handle (1: legacy default stream, 2: per-thread default
///   stream, which producers are asked to order their work before through the legacy default
///   stream; 0 and None are refused).
///   An int handle must name a live stream during the call and keep naming that stream until
///   the work launched on it has finished (it may be destroyed after that).
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
/// and the argument count known good: converts the arguments (the DLPack handshake) into a
/// `tile_launch::Args`, then [`submit_converted`].
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
    // Handed over as it is: the check takes the vector rather than moving each argument.
    let args = std::mem::take(&mut conv.args);
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
            crate::release::start_thread();
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

/// The keywords of a launch request as the caller passed them (`None`: not given).
pub(crate) struct RequestArgs<'a, 'py> {
    /// The Python call, named in flag errors (`launch`, `Kernel.bind`).
    pub func: &'static str,
    pub stream: &'a Bound<'py, PyAny>,
    pub grid: &'a Bound<'py, PyAny>,
    pub block: &'a Bound<'py, PyAny>,
    pub shared_mem: Option<&'a Bound<'py, PyAny>>,
    pub cluster: Option<&'a Bound<'py, PyAny>>,
    pub cooperative: Option<&'a Bound<'py, PyAny>>,
    pub programmatic_dependent_launch: Option<&'a Bound<'py, PyAny>>,
    pub sync: Option<&'a Bound<'py, PyAny>>,
    /// The kernel (checked to be a `tile_py.Kernel`).
    pub kernel: &'a Bound<'py, PyAny>,
    /// The arguments, for a request that launches (a tuple or list, one per parameter of
    /// `kernel`).
    pub args: Option<&'a Bound<'py, PyAny>>,
}

/// A parsed launch request.
pub(crate) struct LaunchRequest<'a, 'py> {
    /// The launch stream (cached per `(device, handle)`).
    pub stream: Stream,
    /// The value producers are told (`__dlpack__(stream=...)`).
    pub stream_value: i64,
    pub config: LaunchConfig,
    /// Whether producers are asked to order their work before the launch (`sync=True`).
    pub sync: bool,
    pub kernel: &'a Bound<'py, Kernel>,
    /// A snapshot of the arguments, when `RequestArgs::args` was given (empty otherwise).
    pub args: ArgList<'py>,
}

impl<'a, 'py> LaunchRequest<'a, 'py> {
    /// Reads a request: runs queued releases, refuses an unusable process, then reads the
    /// flags, the stream argument, the configuration, the kernel and the argument count, in
    /// that order (an error names the first bad value), and last resolves the stream (which
    /// may load the driver).
    ///
    /// # Errors
    ///
    /// `TypeError` / `ValueError` / `OverflowError` for a value of the wrong kind or range,
    /// `ValueError` in a forked child or during interpreter exit, and, resolving the stream,
    /// `tile_py.CudaError` / `tile_py.DriverNotFoundError`.
    #[inline]
    pub(crate) fn parse(
        py: Python<'py>,
        a: &RequestArgs<'a, 'py>,
    ) -> PyResult<LaunchRequest<'a, 'py>> {
        let cooperative = flag(a.cooperative, a.func, "cooperative", false)?;
        let pdl = flag(
            a.programmatic_dependent_launch,
            a.func,
            "programmatic_dependent_launch",
            false,
        )?;
        let sync = flag(a.sync, a.func, "sync", true)?;
        crate::process::begin_launch(py)?;
        let stream = StreamArg::parse(a.stream)?;
        let mut config = parse_config(a.grid, a.block, a.shared_mem, a.cluster)?;
        config.cooperative = cooperative;
        config.programmatic_dependent_launch = pdl;
        let kernel = as_kernel(a.kernel)?;
        let args = match a.args {
            Some(args) => arg_list(args)?,
            None => ArgList::new(),
        };
        if a.args.is_some() {
            let k = kernel.get();
            check_count(k.inner.name(), &k.params, args.len())?;
        }
        let stream_value = stream.spec.dlpack_value();
        let stream = stream.resolve(py)?;
        Ok(LaunchRequest {
            stream,
            stream_value,
            config,
            sync,
            kernel,
            args,
        })
    }
}

/// The arguments of a call of a bound launch (whose request was read at bind time): runs queued
/// releases, refuses an unusable process, and checks the argument count.
pub(crate) fn call_args<'py>(
    py: Python<'py>,
    kernel: &Kernel,
    args: &Bound<'py, PyAny>,
) -> PyResult<ArgList<'py>> {
    crate::process::begin_launch(py)?;
    let args = arg_list(args)?;
    check_count(kernel.inner.name(), &kernel.params, args.len())?;
    Ok(args)
}

/// The optional bool keyword `name` of `func`: `default` when not given; a bool (NumPy's
/// included); anything else a `TypeError` naming `func: name`.
#[inline]
fn flag(v: Option<&Bound<'_, PyAny>>, func: &str, name: &str, default: bool) -> PyResult<bool> {
    match v {
        None => Ok(default),
        Some(v) => v.extract::<bool>().map_err(|_| {
            err(
                Kind::Type,
                format!("{func}: {name} must be True or False, got {}", show(v)),
            )
        }),
    }
}

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

/// Refuses an argument count other than the kernel's before any argument is converted.
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

/// `v` as a Python int when it is one (not a bool), or when it converts through `__index__`
/// (NumPy's integer scalars, for dimensions computed with NumPy); `None` for anything else (a
/// float, a bool, an `__index__` that returns something other than an int), which the caller
/// refuses with its own `TypeError`. What the user's `__index__` raises keeps its object and
/// type, with the note `{label}: raised while converting this argument` (an interrupt, a
/// `MemoryError` or a `RecursionError` as it is), as a scalar argument's does.
fn dimension_int<'py>(
    v: &Bound<'py, PyAny>,
    label: impl FnOnce() -> String,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    if v.cast::<PyBool>().is_ok() {
        return Ok(None);
    }
    if v.cast::<PyInt>().is_ok() {
        return Ok(Some(v.clone()));
    }
    // SAFETY: `v` is a live object; `PyIndex_Check` only reads its type.
    if v.cast::<PyFloat>().is_ok() || unsafe { ffi::PyIndex_Check(v.as_ptr()) } == 0 {
        return Ok(None);
    }
    // NumPy's bool is not an int, although NumPy before 2.3 still converts it through
    // `__index__` (with a DeprecationWarning).
    let ty = v.get_type();
    if ty.name().is_ok_and(|n| n == "bool" || n == "bool_")
        && ty.module().is_ok_and(|m| m == "numpy")
    {
        return Ok(None);
    }
    // Looked up on the type and called, as `PyNumber_Index` does through the type's slot, so
    // that what `__index__` raises is told apart from a result that is not an int.
    let py = v.py();
    let i = ty
        .getattr(pyo3::intern!(py, "__index__"))?
        .call1((v,))
        .map_err(|e| {
            if raised_as_is(py, &e) {
                e
            } else {
                crate::exceptions::with_note(
                    py,
                    e,
                    format!("{}: raised while converting this argument", label()),
                )
            }
        })?;
    Ok(i.cast::<PyInt>().is_ok().then_some(i))
}

/// Converts a `grid`, `block` or `cluster` argument (an int, or a tuple or list of 1 to 3 ints;
/// missing dimensions are 1; NumPy integer scalars count as ints) into a [`Dim3`]. Only what a
/// `Dim3` cannot hold is refused here (not an int, below 0, above `u32::MAX`): every limit a
/// dimension has (at least 1, the device's maxima, the block's thread count) is tile-launch's
/// to check, once, when the launch is checked (`Stream::check`, `Stream::bind`).
#[inline]
pub(crate) fn parse_dims(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<Dim3> {
    // The common case, an exact int: no tuple, no allocation.
    if obj.is_exact_instance_of::<PyInt>()
        && let Ok(v) = obj.extract::<u32>()
    {
        return Ok(Dim3::new(v, 1, 1));
    }
    parse_dims_other(what, obj)
}

/// [`parse_dims`] for anything but an exact int that fits (tuples, NumPy integers, errors);
/// out of line, so that the exact-int case stays small where it is inlined.
#[inline(never)]
fn parse_dims_other(what: &str, obj: &Bound<'_, PyAny>) -> PyResult<Dim3> {
    let one;
    let tuple;
    let items: &[Bound<'_, PyAny>] = if obj.cast::<PyTuple>().is_err()
        && obj.cast::<PyList>().is_err()
        && let Some(i) = dimension_int(obj, || what.to_string())?
    {
        one = [i];
        &one
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        tuple = t.iter().collect::<SmallVec<[Bound<'_, PyAny>; 3]>>();
        &tuple
    } else if let Ok(l) = obj.cast::<PyList>() {
        tuple = l.iter().collect::<SmallVec<[Bound<'_, PyAny>; 3]>>();
        &tuple
    } else {
        return Err(err(
            Kind::Type,
            format!(
                "{what} must be an int or a tuple or list of 1 to 3 ints, got {}",
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
        let Some(item) = dimension_int(item, || format!("{what}[{i}]"))? else {
            return Err(err(
                Kind::Type,
                format!("{what}[{i}] must be an int, got {}", show(item)),
            ));
        };
        let item = &item;
        dims[i] = item.extract::<u32>().map_err(|_| {
            err(
                Kind::Value,
                format!(
                    "{what}[{i}] is {}, outside 0..={}, what a 32-bit unsigned CUDA dimension \
                     can hold (a dimension of 0 and the device's limits are refused when the \
                     launch is checked)",
                    int_text(item),
                    u32::MAX
                ),
            )
        })?;
    }
    Ok(Dim3::new(dims[0], dims[1], dims[2]))
}

/// Converts the launch configuration's arguments into a [`LaunchConfig`] (see [`parse_dims`]:
/// tile-launch checks it against the device).
pub(crate) fn parse_config(
    grid: &Bound<'_, PyAny>,
    block: &Bound<'_, PyAny>,
    shared_mem: Option<&Bound<'_, PyAny>>,
    cluster: Option<&Bound<'_, PyAny>>,
) -> PyResult<LaunchConfig> {
    let grid = parse_dims("grid", grid)?;
    let block = parse_dims("block", block)?;
    let sm: u32 = match shared_mem {
        None => 0,
        Some(shared_mem) => {
            // The same integers as a dimension: ints and what converts through `__index__`
            // (NumPy's integer scalars), never a bool.
            let Some(v) = dimension_int(shared_mem, || "shared_mem".to_string())? else {
                return Err(err(
                    Kind::Type,
                    format!(
                        "shared_mem must be an int (bytes), got {}",
                        show(shared_mem)
                    ),
                ));
            };
            v.extract::<u32>().map_err(|_| {
                let side = if is_negative(&v) {
                    "below the minimum 0"
                } else {
                    "above the limit"
                };
                err(
                    Kind::Value,
                    format!(
                        "shared_mem is {} bytes, {side} (0..={})",
                        int_text(&v),
                        u32::MAX
                    ),
                )
            })?
        }
    };
    let cluster = match cluster {
        Some(c) if !c.is_none() => Some(parse_dims("cluster", c)?),
        _ => None,
    };
    let mut cfg = LaunchConfig::new(grid, block);
    cfg.shared_mem_bytes = sm;
    cfg.cluster = cluster;
    Ok(cfg)
}

/// The result of `tile_py.launch`: waits for the launch, or asks whether it is done. The
/// launch's tensors are on its stream's release queue from the moment it is enqueued (released
/// once a later call sees the work done), so the handle owns nothing and dropping it does
/// nothing.
#[pyclass(module = "tile_py", freelist = 64)]
pub(crate) struct LaunchHandle {
    /// The launch; gone once retired.
    pub(crate) inner: Mutex<Option<tile_launch::LaunchHandle>>,
}

impl LaunchHandle {
    fn take(&self) -> Option<tile_launch::LaunchHandle> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// In a forked child: retires the handle without a driver call, never dropping what it
    /// holds (a drop could make one).
    fn forget_inherited(&self) {
        if let Ok(mut g) = self.inner.try_lock() {
            std::mem::forget(g.take());
        }
    }

    fn put_back(&self, h: tile_launch::LaunchHandle) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = Some(h);
    }
}

#[pymethods]
impl LaunchHandle {
    /// Blocks until the launched work is done (the GIL is released meanwhile), then runs the
    /// deleters of its tensors (and of every other queued launch known done). Idempotent. In a
    /// child made by `os.fork()`, a handle inherited from the parent returns at once: the work
    /// is the parent's, its tensors are leaked (counted at the fork). Raises `tile_py.CudaError`
    /// when the driver reports the wait failed.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        if crate::process::forked() {
            self.forget_inherited();
            return Ok(());
        }
        if let Some(h) = self.take() {
            let r = py.detach(move || h.retire().map(drop));
            // A barrier: waits for this launch's tensors if another thread is releasing them.
            crate::release::settle(py);
            crate::stream_arg::forget_idle_streams();
            r.map_err(|e| launch_err(py, e, |_| None))?;
        }
        Ok(())
    }

    /// Whether the launched work is done (non-blocking). When it is, the tensors are released.
    /// In a child made by `os.fork()`: True, the inherited handle retired as in `wait`. Raises
    /// `tile_py.CudaError` as `wait` does.
    fn done(&self, py: Python<'_>) -> PyResult<bool> {
        if crate::process::forked() {
            self.forget_inherited();
            return Ok(true);
        }
        let Some(h) = self.take() else {
            return Ok(true);
        };
        let r = match h.is_complete() {
            Ok(true) => match h.try_retire() {
                Ok(_) => {
                    crate::stream_arg::forget_idle_streams();
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
