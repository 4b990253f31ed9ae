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

/// The `__cuda_array_interface__` dict of argument `index`, read entry by entry; every error
/// names the argument and the protocol.
struct Entries<'a, 'py> {
    dict: &'a Bound<'py, PyDict>,
    index: usize,
}

impl<'py> Entries<'_, 'py> {
    /// A `ValueError`: `__cuda_array_interface__: {what}`.
    fn bad(&self, what: impl std::fmt::Display) -> PyErr {
        arg_err(
            Kind::Value,
            self.index,
            format!("__cuda_array_interface__: {what}"),
        )
    }

    /// The entry `key`, which the protocol requires.
    fn required(&self, key: &str) -> PyResult<Bound<'py, PyAny>> {
        self.dict
            .get_item(key)?
            .ok_or_else(|| self.bad(format_args!("no '{key}' entry")))
    }

    /// The entry `key`, unless it is missing or None.
    fn optional(&self, key: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
        Ok(self.dict.get_item(key)?.filter(|v| !v.is_none()))
    }

    /// Refuses a bool (Python's bools are ints) in `v`, the entry `key`, or among its items: no
    /// extent, stride, pointer or stream of the protocol is a bool.
    fn no_bool(&self, key: &str, v: &Bound<'_, PyAny>) -> PyResult<()> {
        let is_bool = |x: &Bound<'_, PyAny>| x.cast::<PyBool>().is_ok();
        let inner = v
            .cast::<PyTuple>()
            .is_ok_and(|t| t.iter().any(|x| is_bool(&x)));
        if is_bool(v) || inner {
            return Err(self.bad(format_args!(
                "'{key}' holds a bool ({}); ints expected",
                show(v)
            )));
        }
        Ok(())
    }

    /// An entry's value `v` as `T`. One that does not extract is a `kind` error saying what the
    /// entry must be, `what(overflowed)`, with the extraction error as its cause; an int that
    /// does not fit (an `OverflowError`) stays an `OverflowError`, and anything else
    /// (`KeyboardInterrupt`, `MemoryError`, ...) is returned as it was raised.
    fn extract<T: pyo3::conversion::FromPyObjectOwned<'py>>(
        &self,
        v: &Bound<'py, PyAny>,
        kind: Kind,
        what: impl FnOnce(bool) -> String,
    ) -> PyResult<T> {
        let py = v.py();
        v.extract::<T>().map_err(|e| {
            let e: PyErr = e.into();
            let overflowed = e.is_instance_of::<pyo3::exceptions::PyOverflowError>(py);
            let kind = if overflowed {
                Kind::Overflow
            } else if e.is_instance_of::<pyo3::exceptions::PyTypeError>(py)
                || e.is_instance_of::<pyo3::exceptions::PyValueError>(py)
            {
                kind
            } else {
                return e;
            };
            let r = arg_err(
                kind,
                self.index,
                format!("__cuda_array_interface__: {}", what(overflowed)),
            );
            r.set_cause(py, Some(e));
            r
        })
    }
}

/// The DLPack device of `__cuda_array_interface__` memory at `ptr`, which the dict does not
/// name: as the driver knows the pointer (one `cuPointerGetAttributes`), managed memory
/// (`kDLCUDAManaged`) and page-locked host memory (`kDLCUDAHost`), both usable from every
/// device, or device memory on its device; memory the driver does not know (or no driver) is
/// labelled device memory on `fallback` (the launch device), which the launch's pointer check
/// then refuses as not device memory.
pub(crate) fn cai_device(ptr: u64, fallback: i32) -> DLDevice {
    use tile_launch::MemoryKind;
    let memory = tile_launch::Context::memory_of_pointer(ptr);
    let device_type = match memory.map(|m| m.kind) {
        Some(MemoryKind::Managed) => DLDeviceType::CUDAMANAGED,
        Some(MemoryKind::Host) => DLDeviceType::CUDAHOST,
        _ => DLDeviceType::CUDA,
    };
    DLDevice {
        device_type,
        device_id: memory.and_then(|m| m.device).unwrap_or(fallback),
    }
}

pub(crate) fn from_cai(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    hs: &Handshake,
) -> PyResult<Tensor> {
    let cai = obj.getattr(intern!(py, "__cuda_array_interface__"))?;
    let cai = Entries {
        dict: cai.cast::<PyDict>().map_err(|_| {
            arg_err(
                Kind::Value,
                index,
                format!(
                    "__cuda_array_interface__: expected a dict, got {}",
                    show(&cai)
                ),
            )
        })?,
        index,
    };
    // Versions 0 and 1 are read as 2 is (RMM's `DeviceBuffer` and cuDF's buffers say 0, and
    // numba's and CuPy's consumers take every version up to 3): what 2 changed is that a
    // zero-size array's pointer may be 0, which is read so for every version, and 3 added
    // `stream`, read from version 3 on.
    let version = cai.required("version")?;
    let version = match version.extract::<i64>() {
        Ok(v) if (0..=3).contains(&v) => v,
        Ok(v) => return Err(cai.bad(format_args!("unsupported version {v} (0 to 3 expected)"))),
        Err(e) => {
            let r = cai.bad(format_args!(
                "unsupported version {} (0 to 3 expected)",
                show(&version)
            ));
            r.set_cause(py, Some(e));
            return Err(r);
        }
    };
    let shape = cai.required("shape")?;
    cai.no_bool("shape", &shape)?;
    let shape: Vec<i64> = cai.extract(&shape, Kind::Value, |_| {
        "'shape' must be a tuple of ints, each below 2**63".into()
    })?;
    let typestr = cai.required("typestr")?;
    let typestr: String = cai.extract(&typestr, Kind::Type, |_| {
        format!("'typestr' must be a str, got {}", show(&typestr))
    })?;
    let dtype = parse_typestr(index, &typestr, "__cuda_array_interface__ typestr")?;
    let data_obj = cai.required("data")?;
    // Any sequence of two items, as numba's and CuPy's consumers index it: cuDF's spillable
    // buffers give a `collections.abc.Sequence` that reads the pointer when indexed (and
    // pins the buffer on the device), a list is no tuple either.
    let data_obj = match data_obj.cast::<PyTuple>() {
        Ok(_) => data_obj,
        Err(_) => match data_obj.cast::<pyo3::types::PySequence>() {
            Ok(seq)
                if !data_obj.is_instance_of::<pyo3::types::PyString>()
                    && seq.len().ok() == Some(2) =>
            {
                PyTuple::new(py, [seq.get_item(0)?, seq.get_item(1)?])?.into_any()
            }
            _ => data_obj,
        },
    };
    if let Ok(t) = data_obj.cast::<PyTuple>()
        && let Ok(first) = t.get_item(0)
    {
        cai.no_bool("data[0]", &first)?;
    }
    let (data, readonly): (u64, bool) = cai.extract(&data_obj, Kind::Value, |overflowed| {
        if overflowed {
            format!("'data' pointer of {} is outside 0..2**64", show(&data_obj))
        } else {
            "'data' must be a (pointer, read_only) pair".into()
        }
    })?;
    if cai.optional("mask")?.is_some() {
        return Err(cai.bad("masked arrays are not supported"));
    }
    let itemsize = dtype.itemsize() as i64;
    let strides: Vec<i64> = match cai.optional("strides")? {
        Some(s) => {
            cai.no_bool("strides", &s)?;
            let bytes: Vec<i64> = cai.extract(&s, Kind::Value, |_| {
                "'strides' must be None or a tuple of ints, each in -2**63..2**63".into()
            })?;
            if bytes.len() != shape.len() {
                return Err(cai.bad(format_args!(
                    "{} strides for {} dimensions",
                    bytes.len(),
                    shape.len()
                )));
            }
            let mut elems = Vec::with_capacity(bytes.len());
            for (axis, b) in bytes.iter().enumerate() {
                if b % itemsize != 0 {
                    return Err(cai.bad(format_args!(
                        "strides[{axis}] = {b} bytes is not a multiple of the item size {itemsize}"
                    )));
                }
                elems.push(b / itemsize);
            }
            elems
        }
        None => Vec::new(),
    };
    let ready_on = match cai.optional("stream")? {
        Some(s) if version >= 3 => {
            cai.no_bool("stream", &s)?;
            let n: i64 = cai.extract(&s, Kind::Value, |overflowed| {
                if overflowed {
                    format!(
                        "'stream' is {}, outside what a stream handle can be",
                        show(&s)
                    )
                } else {
                    format!("'stream' must be an int, got {}", show(&s))
                }
            })?;
            // 0 is the null handle, which the driver reads as the legacy default stream: the
            // protocol's text disallows it as ambiguous, but numba-cuda gives it for an array of
            // its default stream (`int(cuda.default_stream())` is 0), and numba's and CuPy's
            // consumers take it as that stream, as tile_py takes `__cuda_stream__`'s `(0, 0)`.
            // A producer whose null handle meant its per-thread default stream (numba under
            // NUMBA_CUDA_PER_THREAD_DEFAULT_STREAM) is ordered too: that stream is a blocking
            // stream, whose work the legacy default stream waits for before its event.
            if n < 0 {
                return Err(cai.bad(format_args!("'stream' is {n}")));
            }
            hs.sync.then_some(crate::stream_arg::to_raw(n as u64))
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
        device: cai_device(data, hs.device),
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
