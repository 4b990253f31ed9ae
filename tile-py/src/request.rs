//! A launch request: what `tile_py.launch` and `Kernel.bind` / `BoundLaunch` are asked besides
//! the kernel's arguments — the stream, the launch configuration (grid, block, cluster, dynamic
//! shared memory, cooperative, programmatic dependent launch) and `sync` — read once, in one
//! order, by [`LaunchRequest::parse`]. The cached cuTile launch reads its own (cuTile's rules
//! and messages come first there) and shares the argument snapshot ([`arg_list`]).
//!
//! Only what a value cannot be is refused here (not an int, a dimension above `u32::MAX`, an
//! unusable process, a stream object tile_py cannot read); every limit of a configuration is
//! tile-launch's to check, once, with the launch (`Stream::check`, `Stream::bind`).

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyList, PyTuple};
use smallvec::SmallVec;
use tile_launch::{Dim3, LaunchConfig, Param, Stream};

use crate::convert::{INLINE, int_text, is_negative};
use crate::exceptions::{Kind, err, raised_as_is, show};
use crate::kernel::Kernel;
use crate::stream_arg::StreamArg;

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
        crate::release::drain(py);
        crate::process::refuse_launch()?;
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
    crate::release::drain(py);
    crate::process::refuse_launch()?;
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
