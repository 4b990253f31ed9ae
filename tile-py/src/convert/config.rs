//! The launch configuration: grid, block, cluster and shared-memory arguments.

use super::*;

/// CUDA's architectural limits, the same on every GPU tile supports; the device's own limits
/// are checked again by tile-launch.
pub(crate) const GRID_MAX: [u64; 3] = [(1 << 31) - 1, 65_535, 65_535];
pub(crate) const BLOCK_MAX: [u64; 3] = [1024, 1024, 64];
pub(crate) const BLOCK_THREADS_MAX: u64 = 1024;

/// Whether the Python int `v` is below zero (for values beyond `i128`). Error path only.
pub(crate) fn is_negative(v: &Bound<'_, PyAny>) -> bool {
    v.lt(0).unwrap_or(false)
}

/// The decimal text of the Python int `v` (its `str`). Error path only.
pub(crate) fn int_text(v: &Bound<'_, PyAny>) -> String {
    v.str().map(|s| s.to_string()).unwrap_or_else(|_| show(v))
}

pub(crate) fn parse_dims(what: &str, obj: &Bound<'_, PyAny>, max: [u64; 3]) -> PyResult<Dim3> {
    // The common case, an exact int in range: no tuple, no allocation.
    if obj.is_exact_instance_of::<PyInt>()
        && let Ok(v) = obj.extract::<u64>()
        && (1..=max[0]).contains(&v)
    {
        return Ok(Dim3::new(v as u32, 1, 1));
    }
    let one;
    let tuple;
    let items: &[Bound<'_, PyAny>] = if obj.cast::<PyInt>().is_ok() && obj.cast::<PyBool>().is_err()
    {
        one = [obj.clone()];
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
        if item.cast::<PyInt>().is_err() || item.cast::<PyBool>().is_ok() {
            return Err(err(
                Kind::Type,
                format!("{what}[{i}] must be an int, got {}", show(item)),
            ));
        }
        // Beyond i128, only the sign matters; the message quotes the Python value itself.
        let v: i128 = item.extract().unwrap_or_else(|_| {
            if is_negative(item) {
                i128::MIN
            } else {
                i128::MAX
            }
        });
        if v < 1 {
            return Err(err(
                Kind::Value,
                format!(
                    "{what}[{i}] is {}; every dimension must be at least 1",
                    int_text(item)
                ),
            ));
        }
        if v > i128::from(max[i]) {
            return Err(err(
                Kind::Value,
                format!(
                    "{what}[{i}] is {}, above the limit {}",
                    int_text(item),
                    max[i]
                ),
            ));
        }
        dims[i] = v as u32;
    }
    Ok(Dim3::new(dims[0], dims[1], dims[2]))
}

/// Parses and checks the launch configuration against CUDA's architectural limits.
pub(crate) fn parse_config(
    grid: &Bound<'_, PyAny>,
    block: &Bound<'_, PyAny>,
    shared_mem: Option<&Bound<'_, PyAny>>,
    cluster: Option<&Bound<'_, PyAny>>,
    cooperative: bool,
    programmatic_dependent_launch: bool,
) -> PyResult<LaunchConfig> {
    let grid = parse_dims("grid", grid, GRID_MAX)?;
    let block = parse_dims("block", block, BLOCK_MAX)?;
    if block.volume() > BLOCK_THREADS_MAX {
        return Err(err(
            Kind::Value,
            format!(
                "block has {} threads ({} x {} x {}), above the limit {BLOCK_THREADS_MAX}",
                block.volume(),
                block.x,
                block.y,
                block.z
            ),
        ));
    }
    let sm: i128 = match shared_mem {
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
            let sm: i128 = shared_mem.extract().unwrap_or_else(|_| {
                if is_negative(shared_mem) {
                    i128::MIN
                } else {
                    i128::MAX
                }
            });
            if sm < 0 || sm > i128::from(u32::MAX) {
                let side = if sm < 0 {
                    "below the minimum 0"
                } else {
                    "above the limit"
                };
                return Err(err(
                    Kind::Value,
                    format!(
                        "shared_mem is {} bytes, {side} (0..={})",
                        int_text(shared_mem),
                        u32::MAX
                    ),
                ));
            }
            sm
        }
    };
    let cluster = match cluster {
        Some(c) if !c.is_none() => Some(parse_dims("cluster", c, [u64::from(u32::MAX); 3])?),
        _ => None,
    };
    let mut cfg = LaunchConfig::new(grid, block);
    cfg.shared_mem_bytes = sm as u32;
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
