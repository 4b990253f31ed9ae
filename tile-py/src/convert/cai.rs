//! `__cuda_array_interface__` objects: the dict parsed into a DLPack descriptor tile owns.

use super::*;

/// A `DLManagedTensorVersioned` we build for a `__cuda_array_interface__` object, with the
/// shape and strides it points to. The object itself is held by the launch as an owner.
#[repr(C)]
pub(crate) struct CaiTensor {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn cai_deleter(t: *mut DLManagedTensorVersioned) {
    if !t.is_null() {
        // SAFETY: `t` is the first field of a `CaiTensor` made by `Box::into_raw` in `from_cai`,
        // and the deleter runs once.
        drop(unsafe { Box::from_raw(t.cast::<CaiTensor>()) });
    }
}

/// The dtype of an array-interface typestr (`"<f4"`), `what` naming where it came from in
/// errors (`__cuda_array_interface__ typestr`).
pub(crate) fn parse_typestr(index: usize, s: &str, what: &str) -> PyResult<DType> {
    let bad = || arg_err(Kind::Type, index, format!("unsupported {what} {s:?}"));
    // Byte-wise: a typestr is ASCII; anything else (a multi-byte character included) is refused
    // here rather than sliced.
    let b = s.as_bytes();
    if b.len() < 3 || !b.is_ascii() {
        return Err(bad());
    }
    let size: u32 = std::str::from_utf8(&b[2..])
        .ok()
        .filter(|d| d.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .ok_or_else(bad)?;
    // The byte order, as NumPy's array interface defines it: '<' little-endian, '>'
    // big-endian, '=' native, '|' not applicable (one-byte items only). Kernels read
    // little-endian data, so '<' and, on a little-endian machine, '=' are accepted for any item
    // size, '|' for one-byte items only, and anything else is refused.
    let order_ok = match b[0] {
        b'<' => true,
        b'=' => cfg!(target_endian = "little"),
        b'|' => size == 1,
        _ => false,
    };
    if !order_ok {
        return Err(arg_err(
            Kind::Type,
            index,
            format!(
                "unsupported {what} {s:?}: byte order {:?} for {size}-byte items (accepted: \
                 '<', '=' on a little-endian machine, '|' for one-byte items)",
                b[0] as char
            ),
        ));
    }
    Ok(match (b[1], size) {
        (b'b', 1) => DType::BOOL,
        (b'i', 1) => DType::I8,
        (b'i', 2) => DType::I16,
        (b'i', 4) => DType::I32,
        (b'i', 8) => DType::I64,
        (b'u', 1) => DType::U8,
        (b'u', 2) => DType::U16,
        (b'u', 4) => DType::U32,
        (b'u', 8) => DType::U64,
        (b'f', 2) => DType::F16,
        (b'f', 4) => DType::F32,
        (b'f', 8) => DType::F64,
        (b'c', 8) => DType::C64,
        (b'c', 16) => DType::C128,
        _ => return Err(bad()),
    })
}

/// A field of an array description (`what`, e.g. `__cuda_array_interface__: 'shape' ...`) that
/// did not extract: a `TypeError` or `ValueError` becomes `kind` with `what` (the extraction
/// error its cause), an `OverflowError` (an integer that does not fit) stays an
/// `OverflowError` with `what`; anything else (`KeyboardInterrupt`, `MemoryError`, ...) is
/// returned as it was raised.
fn field_err(py: Python<'_>, index: usize, kind: Kind, what: String, e: PyErr) -> PyErr {
    let kind = if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
        Kind::Overflow
    } else if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py)
        || e.is_instance_of::<pyo3::exceptions::PyValueError>(py)
    {
        kind
    } else {
        return e;
    };
    let r = arg_err(kind, index, what);
    r.set_cause(py, Some(e));
    r
}

/// Refuses a bool (Python's bools are ints) where an array description holds an int or a
/// tuple of ints: no extent, stride, pointer, device or stream is a bool.
fn no_bool(index: usize, what: &str, v: &Bound<'_, PyAny>) -> PyResult<()> {
    let is_bool = |x: &Bound<'_, PyAny>| x.cast::<PyBool>().is_ok();
    let inner = v
        .cast::<PyTuple>()
        .is_ok_and(|t| t.iter().any(|x| is_bool(&x)));
    if is_bool(v) || inner {
        return Err(arg_err(
            Kind::Value,
            index,
            format!("{what} holds a bool ({}); ints expected", show(v)),
        ));
    }
    Ok(())
}

pub(crate) fn cai_device(ptr: u64, fallback: i32) -> i32 {
    tile_launch::Context::device_of_pointer(ptr).unwrap_or(fallback)
}

pub(crate) fn from_cai(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    hs: &Handshake,
) -> PyResult<Tensor> {
    let bad = |what: String| {
        arg_err(
            Kind::Value,
            index,
            format!("__cuda_array_interface__: {what}"),
        )
    };
    let bad_field = |kind: Kind, what: String, e: PyErr| {
        field_err(
            py,
            index,
            kind,
            format!("__cuda_array_interface__: {what}"),
            e,
        )
    };
    let cai = obj.getattr(intern!(py, "__cuda_array_interface__"))?;
    let cai = cai
        .cast::<PyDict>()
        .map_err(|_| bad(format!("expected a dict, got {}", show(&cai))))?;
    let get = |k: &str| cai.get_item(k);
    let version: i64 = match get("version")? {
        Some(v) => v.extract().map_err(|e| {
            let r = bad(format!(
                "unsupported version {} (2 or 3 expected)",
                show(&v)
            ));
            r.set_cause(py, Some(e));
            r
        })?,
        None => return Err(bad("no 'version' entry".into())),
    };
    if !(2..=3).contains(&version) {
        return Err(bad(format!(
            "unsupported version {version} (2 or 3 expected)"
        )));
    }
    // Python's bools are ints, but no extent, stride, pointer or stream of the protocol.
    let no_bool = |field: &str, v: &Bound<'_, PyAny>| {
        no_bool(index, &format!("__cuda_array_interface__: '{field}'"), v)
    };
    let shape_obj = get("shape")?.ok_or_else(|| bad("no 'shape' entry".into()))?;
    no_bool("shape", &shape_obj)?;
    let shape: Vec<i64> = shape_obj.extract().map_err(|e| {
        bad_field(
            Kind::Value,
            "'shape' must be a tuple of ints, each below 2**63".into(),
            e,
        )
    })?;
    let typestr = get("typestr")?.ok_or_else(|| bad("no 'typestr' entry".into()))?;
    let typestr: String = typestr.extract().map_err(|e| {
        bad_field(
            Kind::Type,
            format!("'typestr' must be a str, got {}", show(&typestr)),
            e,
        )
    })?;
    let dtype = parse_typestr(index, &typestr, "__cuda_array_interface__ typestr")?;
    let data_obj = get("data")?.ok_or_else(|| bad("no 'data' entry".into()))?;
    if let Ok(t) = data_obj.cast::<PyTuple>()
        && let Ok(first) = t.get_item(0)
    {
        no_bool("data[0]", &first)?;
    }
    let (data, readonly): (u64, bool) = data_obj.extract().map_err(|e: PyErr| {
        let what = if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
            format!("'data' pointer of {} is outside 0..2**64", show(&data_obj))
        } else {
            "'data' must be a (pointer, read_only) tuple".into()
        };
        bad_field(Kind::Value, what, e)
    })?;
    if let Some(mask) = get("mask")?
        && !mask.is_none()
    {
        return Err(bad("masked arrays are not supported".into()));
    }
    let itemsize = dtype.itemsize() as i64;
    let strides: Vec<i64> = match get("strides")? {
        Some(s) if !s.is_none() => {
            no_bool("strides", &s)?;
            let bytes: Vec<i64> = s.extract().map_err(|e| {
                bad_field(
                    Kind::Value,
                    "'strides' must be None or a tuple of ints, each in -2**63..2**63".into(),
                    e,
                )
            })?;
            if bytes.len() != shape.len() {
                return Err(bad(format!(
                    "{} strides for {} dimensions",
                    bytes.len(),
                    shape.len()
                )));
            }
            let mut elems = Vec::with_capacity(bytes.len());
            for (axis, b) in bytes.iter().enumerate() {
                if b % itemsize != 0 {
                    return Err(bad(format!(
                        "strides[{axis}] = {b} bytes is not a multiple of the item size {itemsize}"
                    )));
                }
                elems.push(b / itemsize);
            }
            elems
        }
        _ => Vec::new(),
    };
    let ready_on = match get("stream")? {
        Some(s) if !s.is_none() && version >= 3 => {
            no_bool("stream", &s)?;
            let n: i64 = s.extract().map_err(|e: PyErr| {
                let what = if e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py) {
                    format!(
                        "'stream' is {}, outside what a stream handle can be",
                        show(&s)
                    )
                } else {
                    format!("'stream' must be an int, got {}", show(&s))
                };
                bad_field(Kind::Value, what, e)
            })?;
            if n == 0 {
                return Err(bad("'stream' is 0, which the protocol disallows".into()));
            }
            if n < 0 {
                return Err(bad(format!("'stream' is {n}")));
            }
            hs.sync.then_some(crate::stream_numbers::to_raw(n as u64))
        }
        _ => None,
    };
    let ndim = shape.len() as i32;
    let mut boxed = Box::new(CaiTensor {
        // SAFETY: all-zero bytes are a valid `DLManagedTensorVersioned` (null pointers, zero
        // integers, `None` deleter); every field is set below.
        managed: unsafe { std::mem::zeroed() },
        shape,
        strides,
    });
    let flags = if readonly {
        dlpark::DlpackFlags::READ_ONLY
    } else {
        dlpark::DlpackFlags::empty()
    };
    let dl_dtype: DLDataType = dtype.into();
    let shape_ptr = boxed.shape.as_mut_ptr();
    let strides_ptr = if boxed.strides.is_empty() {
        std::ptr::null_mut()
    } else {
        boxed.strides.as_mut_ptr()
    };
    boxed.managed.version = DLPackVersion { major: 1, minor: 3 };
    boxed.managed.deleter = Some(cai_deleter);
    boxed.managed.flags = flags;
    boxed.managed.dl_tensor = DLTensor {
        data: data as *mut c_void,
        device: DLDevice {
            device_type: DLDeviceType::CUDA,
            device_id: cai_device(data, hs.device),
        },
        ndim,
        dtype: dl_dtype,
        shape: shape_ptr,
        strides: strides_ptr,
        byte_offset: 0,
    };
    let ptr = Box::into_raw(boxed).cast::<DLManagedTensorVersioned>();
    // SAFETY: `ptr` is our own descriptor, valid until `cai_deleter` frees it, which its
    // `Used` (or a rollback) calls once.
    let unused = unsafe { Unused::from_versioned(ptr) };
    Ok(Tensor {
        unused,
        claim: Claim::Owned(ptr),
        ready_on,
        owner: Some(obj.clone().unbind()),
        memory_trusted: false,
    })
}
