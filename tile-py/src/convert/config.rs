//! The launch configuration: grid, block, cluster and shared-memory arguments.

use super::*;

/// Whether the Python int `v` is below zero (for values beyond `i128`). Error path only.
pub(crate) fn is_negative(v: &Bound<'_, PyAny>) -> bool {
    v.lt(0).unwrap_or(false)
}

/// The decimal text of the Python int `v` (its `str`). Error path only.
pub(crate) fn int_text(v: &Bound<'_, PyAny>) -> String {
    v.str().map(|s| s.to_string()).unwrap_or_else(|_| show(v))
}

/// `v` as a Python int when it is one (not a bool), or when it converts through `__index__`
/// (NumPy's integer scalars, for dimensions computed with NumPy); `None` for anything else (a
/// float, a bool, an `__index__` that refuses). An interrupt or a memory error raised by
/// `__index__` propagates.
fn dimension_int<'py>(v: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyAny>>> {
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
    // SAFETY: as above; a new reference, or null with an exception set.
    match unsafe { Bound::from_owned_ptr_or_err(v.py(), ffi::PyNumber_Index(v.as_ptr())) } {
        Ok(i) => Ok(Some(i)),
        Err(e) if crate::errors::raised_as_is(v.py(), &e) => Err(e),
        Err(_) => Ok(None),
    }
}

/// Converts a `grid`, `block` or `cluster` argument (an int, or a tuple of 1 to 3 ints; missing
/// dimensions are 1; NumPy integer scalars count as ints) into a [`Dim3`]. Only what a `Dim3` cannot hold is refused here (not an
/// int, below 0, above `u32::MAX`): every limit a dimension has (at least 1, the device's
/// maxima, the block's thread count) is tile-launch's to check, once, when the launch is
/// checked (`Stream::check`, `Stream::bind`).
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
        && let Some(i) = dimension_int(obj)?
    {
        one = [i];
        &one
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        tuple = t.iter().collect::<SmallVec<[Bound<'_, PyAny>; 3]>>();
        &tuple
    } else {
        let hint = if obj.cast::<PyList>().is_ok() {
            " (use a tuple, not a list)"
        } else {
            ""
        };
        return Err(err(
            Kind::Type,
            format!(
                "{what} must be an int or a tuple of 1 to 3 ints{hint}, got {}",
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
        let Some(item) = dimension_int(item)? else {
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
    cooperative: bool,
    programmatic_dependent_launch: bool,
) -> PyResult<LaunchConfig> {
    let grid = parse_dims("grid", grid)?;
    let block = parse_dims("block", block)?;
    let sm: u32 = match shared_mem {
        None => 0,
        Some(shared_mem) => {
            if shared_mem.cast::<PyInt>().is_err() || shared_mem.cast::<PyBool>().is_ok() {
                return Err(err(
                    Kind::Type,
                    format!(
                        "shared_mem must be an int (bytes), got {}",
                        show(shared_mem)
                    ),
                ));
            }
            shared_mem.extract::<u32>().map_err(|_| {
                let side = if is_negative(shared_mem) {
                    "below the minimum 0"
                } else {
                    "above the limit"
                };
                err(
                    Kind::Value,
                    format!(
                        "shared_mem is {} bytes, {side} (0..={})",
                        int_text(shared_mem),
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
    cfg.cooperative = cooperative;
    cfg.programmatic_dependent_launch = programmatic_dependent_launch;
    Ok(cfg)
}

/// Whether `obj` is a complex number: Python's `complex` (and its subclasses, such as NumPy's
/// `complex128`), or a NumPy complex scalar (`dtype.kind == 'c'`), whose `__float__` would drop
/// the imaginary part.
pub(crate) fn is_complex(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let py = obj.py();
    if obj.cast::<pyo3::types::PyComplex>().is_ok() {
        return Ok(true);
    }
    match obj.getattr_opt(intern!(py, "dtype"))? {
        Some(dtype) => Ok(dtype
            .getattr_opt(intern!(py, "kind"))?
            .is_some_and(|k| k.extract::<String>().is_ok_and(|k| k == "c"))),
        None => Ok(false),
    }
}
