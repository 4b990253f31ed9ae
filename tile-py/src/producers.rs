//! Producers whose tensors carry state that a DLPack descriptor does not describe, and the
//! checks that state needs before a tensor is taken:
//!
//! - **PyTorch** tensors can be lazy views: the conjugate bit (`x.conj()` of a complex tensor)
//!   and the negative bit (`x.conj().imag`) change what the values are without touching the
//!   memory, so a kernel reading the memory sees un-conjugated or un-negated values. torch's
//!   `__dlpack__` refuses the conjugate bit; its C exchange API checks neither. Both are
//!   refused here for every parameter.
//! - A torch tensor that **requires grad** (a leaf, or a non-leaf that autograd may have saved
//!   for backward) written by a kernel is changed behind autograd's back: its version counter
//!   does not move, and `backward()` silently computes gradients from overwritten values. It is
//!   refused for `Out` / `InOut`; reading it is harmless, so for `In` it is accepted (on the
//!   `__dlpack__` path, which refuses tensors that require grad, through `detach()`, a view of
//!   the same memory).
//! - **JAX** arrays are immutable and their buffers may be shared between arrays, so they are
//!   refused for `Out` / `InOut`.
//!
//! A producer type is classified once (its MRO is read) and cached with its exchange API by the
//! conversion (`convert::producer_type`); a tensor of a known type costs a thread-local pointer
//! compare. The checks run on every path, before
//! anything is consumed: before the export on the `__dlpack__` path, right after it on the C
//! exchange API path (the export's dtype tells whether the conjugate bit can be set at all; a
//! refused export is released at once).

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyType;
use tile_launch::Param;

use crate::exceptions::{Kind, arg_err, show};
use crate::pytypes::{in_package, mro_any};

/// The family of a producer type.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Family {
    /// Nothing beyond the DLPack descriptor to check.
    Plain,
    /// A PyTorch tensor (`torch._C.TensorBase` in its MRO).
    Torch,
    /// A JAX array (a class from the `jax` or `jaxlib` packages in its MRO).
    Jax,
    /// A CuPy array (a class from the `cupy` package in its MRO): nothing beyond the descriptor
    /// to check, but its current stream can be read once per launch (see
    /// [`convert::family_offer`](crate::convert::family_offer)).
    Cupy,
}

/// The family of a producer type, from its MRO (the conversion caches it per type).
pub(crate) fn classify(ty: &Bound<'_, PyType>) -> Family {
    let torch = |m: &str, n: &str| m == "torch._C" && (n == "TensorBase" || n == "_TensorBase");
    let jax = |m: &str, _: &str| in_package(m, "jax") || m.starts_with("jaxlib");
    let cupy = |m: &str, _: &str| in_package(m, "cupy");
    // The first class of either family in MRO order decides, as a walk would.
    let mut found = Family::Plain;
    mro_any(ty, |m, n| {
        if torch(m, n) {
            found = Family::Torch;
        } else if jax(m, n) {
            found = Family::Jax;
        } else if cupy(m, n) {
            found = Family::Cupy;
        }
        found != Family::Plain
    });
    found
}

/// What the conversion does with a tensor that passed [`check`].
#[derive(Debug)]
pub(crate) enum Screened<'py> {
    /// Convert the object as it is.
    AsIs,
    /// Convert this object instead: a torch tensor that requires grad, bound to an input and
    /// exported through `__dlpack__` (which refuses it), replaced by its `detach()`.
    Detached(Bound<'py, PyAny>),
}

/// Checks a tensor of family `f` against its parameter before anything is exported: refuses
/// lazy conjugate / negative torch views, torch tensors that require grad bound to an output,
/// and JAX arrays bound to an output (`ValueError`, naming the argument). `via_dlpack` says the
/// tensor will be exported through `__dlpack__`.
///
/// `complex` is whether the tensor's dtype is complex, when it is already known (the exchange
/// API exports before checking): only a complex tensor can carry the conjugate bit, so for a
/// known real dtype the conjugate query (a Python method call, about 0.1 us) is skipped. `None`
/// asks.
pub(crate) fn check<'py>(
    index: usize,
    obj: &Bound<'py, PyAny>,
    f: Family,
    param: &Param,
    via_dlpack: bool,
    complex: Option<bool>,
) -> PyResult<Screened<'py>> {
    let writes = matches!(
        param,
        Param::Tensor { intent, .. } | Param::Array { intent, .. } if intent.writes()
    );
    match f {
        Family::Plain | Family::Cupy => Ok(Screened::AsIs),
        Family::Jax if writes => Err(arg_err(
            Kind::Value,
            index,
            format!(
                "{} is a JAX array, and JAX arrays are immutable (their buffers may be shared \
                 with other arrays), so a kernel must not write it. Allocate the output with a \
                 producer whose tensors are mutable (e.g. torch.empty or cupy.empty), launch, \
                 then hand it to JAX with jax.dlpack.from_dlpack; or call the kernel from JAX \
                 as a foreign function (jax.ffi.ffi_call), which lets JAX allocate the result",
                show(obj)
            ),
        )),
        Family::Jax => Ok(Screened::AsIs),
        Family::Torch => torch_check(index, obj, writes, via_dlpack, complex),
    }
}

fn torch_check<'py>(
    index: usize,
    obj: &Bound<'py, PyAny>,
    writes: bool,
    via_dlpack: bool,
    complex: Option<bool>,
) -> PyResult<Screened<'py>> {
    let py = obj.py();
    // torch sets the conjugate bit on complex tensors only (`conj()` of a real tensor returns
    // it unchanged). The negative bit can be set on real tensors too (`x.conj().imag`), so it
    // is always asked.
    if complex != Some(false)
        && crate::pytypes::call_method0(obj, intern!(py, "is_conj"))?.is_truthy()?
    {
        return Err(arg_err(
            Kind::Value,
            index,
            format!(
                "{} has its conjugate bit set (a lazy view such as x.conj()): its memory holds \
                 the un-conjugated values, which the kernel would read as they are; pass \
                 x.resolve_conj() (a conjugated copy) instead",
                show(obj)
            ),
        ));
    }
    if crate::pytypes::call_method0(obj, intern!(py, "is_neg"))?.is_truthy()? {
        return Err(arg_err(
            Kind::Value,
            index,
            format!(
                "{} has its negative bit set (a lazy view such as x.conj().imag): its memory \
                 holds the un-negated values, which the kernel would read as they are; pass \
                 x.resolve_neg() (a negated copy) instead",
                show(obj)
            ),
        ));
    }
    let needs_grad =
        || -> PyResult<bool> { obj.getattr(intern!(py, "requires_grad"))?.is_truthy() };
    if writes {
        if needs_grad()? {
            return Err(arg_err(
                Kind::Value,
                index,
                format!(
                    "{} requires grad, and a kernel writing it would change it behind \
                     autograd's back (its version counter does not move, so backward() would \
                     silently use the overwritten values); write into a tensor that does not \
                     require grad, or pass t.detach() to write this one on purpose",
                    show(obj)
                ),
            ));
        }
    } else if via_dlpack && needs_grad()? {
        // Reading does not disturb autograd; torch's `__dlpack__` refuses such tensors, so its
        // detached view (the same memory, no autograd) is exported instead.
        return Ok(Screened::Detached(obj.call_method0(intern!(py, "detach"))?));
    }
    Ok(Screened::AsIs)
}
