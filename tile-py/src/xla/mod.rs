//! JAX inside `jax.jit`: tile's XLA FFI handler and what `tile_py.jax` (Python) asks of it at
//! trace time.
//!
//! - [`frame`] reads XLA's call frame (the C ABI bound in [`crate::xla_ffi_sys`]) and hands
//!   errors back through XLA's error API.
//! - [`handler`] is the one handler for every tile kernel: it finds the kernel by the id in the
//!   call's attributes (registered here, at trace time, so that the handler never needs the
//!   interpreter), binds XLA's buffers and scalar attributes to its parameters by the call
//!   site's roles ([`roles`]), describes the buffers as DLPack tensors tile does not own, and
//!   launches through tile-launch's checked launch on XLA's stream.
//! - [`roles`] says which operand, result or scalar attribute each parameter takes, checked once
//!   at registration: from a `tile_py.Kernel`'s intents, or given per call site (cuTile kernels,
//!   whose arrays are all declared `In`).
//!
//! Lifetimes belong to XLA: a buffer lives until the work XLA enqueued for the call on its
//! stream has finished, so tile holds only its descriptors (on the stream's release queue, or
//! on the graph while XLA captures a command buffer).
//!
//! Python-facing functions (private, used by `tile_py/jax.py`): `_xla_handler`,
//! `_xla_register`, `_xla_roles`, `_xla_config`, `_xla_scalars`.

pub(crate) mod frame;
pub(crate) mod handler;
pub(crate) mod roles;

use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};
use tile_launch::{Param, Scalar};

use crate::convert::convert_scalar;
use crate::exceptions::{Kind, err, show};
use crate::kernel::parse_params;
use crate::launch::{as_kernel, parse_config};
use roles::{Role, Roles};

/// The handler as a PyCapsule without a name, as `jax.ffi.register_ffi_target` takes handlers
/// (`api_version=1`).
#[pyfunction]
pub(crate) fn _xla_handler(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let f: unsafe extern "C" fn(*mut crate::xla_ffi_sys::XLA_FFI_CallFrame) -> _ = handler::handler;
    // SAFETY: a non-null function pointer, named by no capsule name (XLA reads the pointer
    // whatever the name) and without a destructor; the returned object is a new reference.
    unsafe {
        let raw = pyo3::ffi::PyCapsule_New(f as *mut std::ffi::c_void, std::ptr::null(), None);
        Bound::from_owned_ptr_or_err(py, raw).map(|c| c.cast_into_unchecked())
    }
}

/// Registers `kernel` (a `tile_py.Kernel`) for calls from XLA and returns its id, the `kernel`
/// attribute of those calls. The kernel stays loaded for the life of the process. `roles` (one
/// per parameter, as [`_xla_roles`] reads them) says which operand, result or scalar attribute
/// each parameter takes; without it the declared intents say it. Every call registers a new
/// entry: `tile_py.jax` registers each kernel and role list once.
///
/// # Errors
///
/// `TypeError` for an object that is not a `tile_py.Kernel`, a parameter that cannot be passed
/// from JAX, or roles that break a rule of [`Roles`] (`ValueError`).
#[pyfunction]
#[pyo3(signature = (kernel, roles = None))]
pub(crate) fn _xla_register(
    kernel: &Bound<'_, PyAny>,
    roles: Option<&Bound<'_, PyAny>>,
) -> PyResult<i64> {
    let k = as_kernel(kernel)?.get();
    let roles = checked_roles(&k.params, roles, k.inner.name())?;
    Ok(handler::register(handler::Entry {
        kernel: k.inner.clone(),
        roles,
    }))
}

/// `roles` checked against `params` (tile_py parameter declarations), as `_xla_register` checks
/// them, and returned as `(operands, results, scalars, roles)`, each role as a tuple
/// (`("operand", j)`, `("result", k)`, `("inout", j, k)`, `("scalar", s)`); with `roles`
/// None, those of the declared intents.
///
/// # Errors
///
/// As `_xla_register`.
#[pyfunction]
#[pyo3(signature = (params, roles = None))]
#[allow(clippy::type_complexity)]
pub(crate) fn xla_roles(
    params: &Bound<'_, PyAny>,
    roles: Option<&Bound<'_, PyAny>>,
) -> PyResult<(
    usize,
    usize,
    usize,
    Vec<(&'static str, usize, Option<usize>)>,
)> {
    let params = parse_params(params)?;
    let r = checked_roles(&params, roles, "(declared)")?;
    let (j, k, s) = r.counts();
    Ok((j, k, s, r.roles().iter().map(|r| r.to_tuple()).collect()))
}

fn checked_roles(
    params: &[Param],
    roles: Option<&Bound<'_, PyAny>>,
    name: &str,
) -> PyResult<Roles> {
    let r = match roles {
        None => Roles::from_intents(params).map_err(|m| (Kind::Type, m)),
        Some(list) => {
            parse_roles(list).and_then(|r| Roles::new(params, r).map_err(|m| (Kind::Value, m)))
        }
    };
    r.map_err(|(kind, m)| err(kind, format!("kernel `{name}`: {m}")))
}

/// A Python role list: a sequence of tuples, `("operand", j)`, `("result", k)`,
/// `("inout", j, k)` or `("scalar", s)`.
fn parse_roles(list: &Bound<'_, PyAny>) -> Result<Vec<Role>, (Kind, String)> {
    let bad = |i: usize, r: &Bound<'_, PyAny>| {
        (
            Kind::Type,
            format!(
                "role {i} must be (\"operand\", j), (\"result\", k), (\"inout\", j, k) or \
                 (\"scalar\", s) with indices >= 0, got {}",
                show(r)
            ),
        )
    };
    let iter = list.try_iter().map_err(|_| {
        (
            Kind::Type,
            format!("roles must be a sequence, got {}", show(list)),
        )
    })?;
    let mut out = Vec::new();
    for (i, r) in iter.enumerate() {
        let r = r.map_err(|e| (Kind::Type, e.to_string()))?;
        let t = r.cast::<PyTuple>().map_err(|_| bad(i, &r))?;
        let what: String = t
            .get_item(0)
            .and_then(|w| w.extract())
            .map_err(|_| bad(i, &r))?;
        let index = |at: usize| -> Result<usize, (Kind, String)> {
            t.get_item(at)
                .and_then(|v| v.extract::<usize>())
                .map_err(|_| bad(i, &r))
        };
        let role = match (what.as_str(), t.len()) {
            ("operand", 2) => Role::Operand(index(1)?),
            ("result", 2) => Role::Result(index(1)?),
            ("inout", 3) => Role::Aliased {
                operand: index(1)?,
                result: index(2)?,
            },
            ("scalar", 2) => Role::Scalar(index(1)?),
            _ => return Err(bad(i, &r)),
        };
        out.push(role);
    }
    Ok(out)
}

/// `grid`, `block` and `shared_mem` as `tile_py.launch` reads them, as the attributes XLA
/// passes: `((gx, gy, gz), (bx, by, bz), shared_mem)`.
#[pyfunction]
#[pyo3(signature = (grid, block, shared_mem = None))]
#[allow(clippy::type_complexity)]
pub(crate) fn _xla_config(
    grid: &Bound<'_, PyAny>,
    block: &Bound<'_, PyAny>,
    shared_mem: Option<&Bound<'_, PyAny>>,
) -> PyResult<((i64, i64, i64), (i64, i64, i64), i64)> {
    let c = parse_config(grid, block, shared_mem, None)?;
    let d = |d: tile_launch::Dim3| (i64::from(d.x), i64::from(d.y), i64::from(d.z));
    Ok((d(c.grid), d(c.block), i64::from(c.shared_mem_bytes)))
}

/// The values of `kernel`'s scalar parameters, one per `Scalar` in declaration order, converted
/// as `tile_py.launch` converts scalars, as the `scalar_bits` and `scalar_kinds` attributes.
#[pyfunction]
pub(crate) fn _xla_scalars(
    kernel: &Bound<'_, PyAny>,
    values: Vec<Bound<'_, PyAny>>,
) -> PyResult<(Vec<i64>, Vec<i64>)> {
    let k = as_kernel(kernel)?.get();
    let scalars: Vec<(usize, tile_launch::ScalarType)> = k
        .params
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Param::Scalar(t) => Some((i, *t)),
            _ => None,
        })
        .collect();
    if scalars.len() != values.len() {
        return Err(err(
            Kind::Type,
            format!(
                "kernel `{}` has {} scalar parameters, {} values were given",
                k.inner.name(),
                scalars.len(),
                values.len()
            ),
        ));
    }
    let (mut bits, mut kinds) = (Vec::new(), Vec::new());
    for ((index, ty), v) in scalars.into_iter().zip(&values) {
        let (b, kind) = match convert_scalar(index, v, ty)? {
            Scalar::Bool(b) => (i64::from(b), handler::KIND_BOOL),
            Scalar::Float(x) => (x.to_bits() as i64, handler::KIND_FLOAT),
            Scalar::Int(i) => match (i64::try_from(i), u64::try_from(i)) {
                (Ok(s), _) => (s, handler::KIND_INT),
                (_, Ok(u)) => (u as i64, handler::KIND_UINT),
                _ => {
                    return Err(err(
                        Kind::Overflow,
                        format!("argument {index}: {} does not fit 64 bits", show(v)),
                    ));
                }
            },
            other => {
                return Err(err(
                    Kind::Type,
                    format!("argument {index}: unsupported scalar {other}"),
                ));
            }
        };
        bits.push(b);
        kinds.push(kind);
    }
    Ok((bits, kinds))
}
