//! Scalars: Python and NumPy numbers checked against the declared scalar type and range.

use super::*;

/// An `int`'s value. Values that fit `i64` (all but the largest `u64` handles and scalars) are
/// read with one `PyLong_AsLongLongAndOverflow` call; the others by pyo3's `i128` extraction,
/// which under the stable ABI costs a shift and a temporary `int`.
pub(crate) fn int_value(obj: &Bound<'_, PyAny>) -> PyResult<i128> {
    if obj.cast::<PyInt>().is_ok() {
        let mut overflow: std::os::raw::c_int = 0;
        // SAFETY: `obj` is an `int`; `overflow` is a valid out-pointer. -1 with `overflow == 0`
        // and an exception set is an error; with no exception it is the value -1.
        let v = unsafe { ffi::PyLong_AsLongLongAndOverflow(obj.as_ptr(), &mut overflow) };
        if overflow == 0 {
            if v == -1
                && let Some(e) = PyErr::take(obj.py())
            {
                return Err(e);
            }
            return Ok(i128::from(v));
        }
    }
    obj.extract()
}

pub(crate) fn int_range(ty: ScalarType) -> (i128, i128) {
    match ty {
        ScalarType::I8 => (i8::MIN.into(), i8::MAX.into()),
        ScalarType::I16 => (i16::MIN.into(), i16::MAX.into()),
        ScalarType::I32 => (i32::MIN.into(), i32::MAX.into()),
        ScalarType::I64 => (i64::MIN.into(), i64::MAX.into()),
        ScalarType::U8 => (0, u8::MAX.into()),
        ScalarType::U16 => (0, u16::MAX.into()),
        ScalarType::U32 => (0, u32::MAX.into()),
        _ => (0, u64::MAX.into()),
    }
}

/// Exact Python `int`s and `float`s (the common case) without the probes of
/// [`convert_scalar`]: the same result, no attribute lookup and no exception.
pub(crate) fn exact_scalar(obj: &Bound<'_, PyAny>, ty: ScalarType) -> Option<Scalar> {
    match ty {
        ScalarType::Bool => None,
        ScalarType::F32 | ScalarType::F64 => {
            if !obj.is_exact_instance_of::<PyFloat>() {
                return None;
            }
            let x = obj.cast::<PyFloat>().ok()?.value();
            if ty == ScalarType::F32 && x.is_finite() && x.abs() > f64::from(f32::MAX) {
                return None; // the error comes from the general path
            }
            Some(Scalar::Float(x))
        }
        _ => {
            if !obj.is_exact_instance_of::<PyInt>() {
                return None;
            }
            int_scalar(int_value(obj).ok()?, ty)
        }
    }
}

/// An int's value `v` as a scalar of type `ty`, when `ty` is an integer type whose range holds
/// it (else `None`: [`convert_scalar`] says what it does with the value).
pub(crate) fn int_scalar(v: i128, ty: ScalarType) -> Option<Scalar> {
    if matches!(ty, ScalarType::Bool | ScalarType::F32 | ScalarType::F64) {
        return None;
    }
    let (lo, hi) = int_range(ty);
    (lo..=hi).contains(&v).then_some(Scalar::Int(v))
}

/// What the user's code raised while converting argument `index`: its own type, with the note
/// `argument i: raised while converting this argument`, as for a producer's exception; an
/// interrupt, `MemoryError` or `RecursionError` as it is ([`crate::exceptions::raised_as_is`]).
fn raised_by_user(py: Python<'_>, e: PyErr, index: usize) -> PyErr {
    if crate::exceptions::raised_as_is(py, &e) {
        e
    } else {
        with_note(py, e, argument_note(index))
    }
}

/// `operator.index(obj)` for an object that is not an int, telling apart what its `__index__`
/// raises (kept, [`raised_by_user`]) from tile_py's refusal (`wrong()`): no `__index__`, or one
/// that returns something other than an int (then with a `TypeError` saying so as the cause).
fn index_of<'py>(
    obj: &Bound<'py, PyAny>,
    index: usize,
    wrong: impl FnOnce() -> PyErr,
) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    // SAFETY: `obj` is a live object; `PyIndex_Check` only reads its type.
    if unsafe { ffi::PyIndex_Check(obj.as_ptr()) } == 0 {
        return Err(wrong());
    }
    // Looked up on the type and called, as `PyNumber_Index` does through the type's slot.
    let method = obj.get_type().getattr(intern!(py, "__index__"))?;
    let i = method
        .call1((obj,))
        .map_err(|e| raised_by_user(py, e, index))?;
    if i.cast::<PyInt>().is_err() {
        let refused = wrong();
        let why = PyTypeError::new_err(format!("__index__ returned non-int ({})", show(&i)));
        refused.set_cause(py, Some(why));
        return Err(refused);
    }
    Ok(i)
}

pub(crate) fn convert_scalar(
    index: usize,
    obj: &Bound<'_, PyAny>,
    ty: ScalarType,
) -> PyResult<Scalar> {
    if let Some(v) = exact_scalar(obj, ty) {
        return Ok(v);
    }
    let py = obj.py();
    let wrong = |what: &str| {
        arg_err(
            Kind::Type,
            index,
            format!("expected {what} for scalar {ty}, got {}", show(obj)),
        )
    };
    if obj.hasattr(intern!(py, "__dlpack__"))? || obj.cast::<PyCapsule>().is_ok() {
        return Err(wrong("a number"));
    }
    let type_name = obj
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default();
    let is_bool = obj.cast::<PyBool>().is_ok() || type_name == "bool_" || type_name == "bool";
    match ty {
        ScalarType::Bool => {
            if is_bool {
                Ok(Scalar::Bool(obj.is_truthy()?))
            } else {
                Err(wrong("a bool"))
            }
        }
        ScalarType::F32 | ScalarType::F64 => {
            if is_bool || obj.cast::<pyo3::types::PyString>().is_ok() {
                return Err(wrong("a float"));
            }
            let is_number = obj.cast::<PyFloat>().is_ok()
                || obj.cast::<PyInt>().is_ok()
                || obj.hasattr(intern!(py, "__float__"))?;
            if !is_number || is_complex(obj)? {
                return Err(wrong("a float"));
            }
            // One rule for every conversion hook: what the user's `__float__` raises keeps its
            // object and type (even an `OverflowError`), with the argument's note; only a value
            // that converts but does not fit gets tile_py's own `OverflowError`.
            let too_big = || {
                arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty}", show(obj)),
                )
            };
            let x: f64 = if let Ok(f) = obj.cast::<PyFloat>() {
                f.value()
            } else if let Ok(i) = obj.cast::<PyInt>() {
                // Only an int beyond a double's range fails here.
                i.extract().map_err(|_| too_big())?
            } else {
                // `__float__` looked up on the type and called, as `PyFloat_AsDouble` does.
                let method = obj.get_type().getattr(intern!(py, "__float__"))?;
                let f = method
                    .call1((obj,))
                    .map_err(|e| raised_by_user(py, e, index))?;
                match f.cast::<PyFloat>() {
                    Ok(f) => f.value(),
                    Err(_) => {
                        let refused = wrong("a float");
                        let why = PyTypeError::new_err(format!(
                            "__float__ returned non-float ({})",
                            show(&f)
                        ));
                        refused.set_cause(py, Some(why));
                        return Err(refused);
                    }
                }
            };
            // A finite value too large for a double (`Decimal("1e400")`, a NumPy long double)
            // converts to infinity: refused, as an int too large is. An infinity compares equal
            // to the infinite double it converts to.
            if x.is_infinite() && obj.cast::<PyFloat>().is_err() && !obj.eq(x).unwrap_or(false) {
                return Err(arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty}", show(obj)),
                ));
            }
            // Rounded to the nearest f32 as tile-launch packs it: refused only when that is an
            // infinity (the value is at or beyond f32::MAX plus half its last step).
            if ty == ScalarType::F32 && x.is_finite() && !(x as f32).is_finite() {
                return Err(arg_err(
                    Kind::Overflow,
                    index,
                    format!(
                        "{} does not fit scalar f32: it rounds beyond the largest finite f32 \
                         ({:e})",
                        show(obj),
                        f32::MAX
                    ),
                ));
            }
            Ok(Scalar::Float(x))
        }
        _ => {
            if is_bool || obj.cast::<PyFloat>().is_ok() {
                return Err(wrong("an integer"));
            }
            let i = match obj.cast::<PyInt>() {
                Ok(i) => i.clone().into_any(),
                Err(_) => index_of(obj, index, || wrong("an integer"))?,
            };
            let (lo, hi) = int_range(ty);
            let v: i128 = i.extract().map_err(|_| {
                arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty} (range {lo}..={hi})", show(obj)),
                )
            })?;
            if v < lo || v > hi {
                return Err(arg_err(
                    Kind::Overflow,
                    index,
                    format!("{} does not fit scalar {ty} (range {lo}..={hi})", show(obj)),
                ));
            }
            Ok(Scalar::Int(v))
        }
    }
}

/// Whether the Python int `v` is below zero (for values beyond `i128`). Error path only.
pub(crate) fn is_negative(v: &Bound<'_, PyAny>) -> bool {
    v.lt(0).unwrap_or(false)
}

/// The decimal text of the Python int `v` (its `str`). Error path only.
pub(crate) fn int_text(v: &Bound<'_, PyAny>) -> String {
    v.str().map(|s| s.to_string()).unwrap_or_else(|_| show(v))
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
