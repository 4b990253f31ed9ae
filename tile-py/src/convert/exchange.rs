//! The DLPack C exchange API (`__dlpack_c_exchange_api__`): exports without a Python call, ordered after the producer's current stream.

use super::*;

#[derive(Clone, Copy)]
pub(crate) struct ApiPtr(*const DLPackExchangeAPI);
// SAFETY: the exchange API table is immutable and lives for the whole process (DLPack 1.3).
unsafe impl Send for ApiPtr {}

impl ApiPtr {
    /// The table's export and current-work-stream entries, read now (a producer may have
    /// cleared one since the table was first read and checked).
    #[inline]
    pub(crate) fn entries(
        self,
    ) -> (
        tile_dlpack::ffi::DLPackManagedTensorFromPyObjectNoSync,
        tile_dlpack::ffi::DLPackCurrentWorkStream,
    ) {
        // SAFETY: an `ApiPtr` is only made by `lookup_exchange_api`, for a major-version-1
        // table that lives as long as the process (DLPack 1.3); the layout is that version's.
        unsafe {
            (
                (*self.0).managed_tensor_from_py_object_no_sync,
                (*self.0).current_work_stream,
            )
        }
    }
}

pub(crate) fn lookup_exchange_api(py: Python<'_>, ty: &Bound<'_, PyType>) -> Option<ApiPtr> {
    let attr = ty
        .getattr_opt(intern!(py, "__dlpack_c_exchange_api__"))
        .ok()
        .flatten()?;
    let cap = attr.cast::<PyCapsule>().ok()?;
    // SAFETY: `cap` is a capsule; a wrong name makes `PyCapsule_GetPointer` fail with an
    // exception, which we clear.
    let ptr = unsafe { ffi::PyCapsule_GetPointer(cap.as_ptr(), c"dlpack_exchange_api".as_ptr()) };
    if ptr.is_null() {
        let _ = PyErr::take(py);
        return None;
    }
    let api = ptr.cast::<DLPackExchangeAPI>();
    // SAFETY: a capsule named `dlpack_exchange_api` holds a `DLPackExchangeAPI*` valid for the
    // whole process; the header (version) is ABI-stable across versions.
    let version: DLPackVersion = unsafe { (*api).header.version };
    // SAFETY: as above; the layout is that of major version 1, checked first.
    let complete = version.major == 1
        && unsafe {
            (*api).managed_tensor_from_py_object_no_sync.is_some()
                && (*api).current_work_stream.is_some()
        };
    complete.then_some(ApiPtr(api))
}

pub(crate) fn from_exchange_api(
    py: Python<'_>,
    index: usize,
    obj: &Bound<'_, PyAny>,
    api: ApiPtr,
    hs: &Handshake,
) -> PyResult<Tensor> {
    let note = |e: PyErr| with_note(py, e, argument_note(index));
    let (from_obj, current_stream) = api.entries();
    // Checked when the table was cached; a producer that cleared an entry since gets an error
    // (before anything is exported), not a panic.
    let (Some(from_obj), Some(current_stream)) = (from_obj, current_stream) else {
        return Err(arg_err(
            Kind::Buffer,
            index,
            "the producer's DLPack exchange API table lost an entry after it was first read \
             (managed_tensor_from_py_object_no_sync or current_work_stream is now null)",
        ));
    };
    let mut out: *mut DLManagedTensorVersioned = std::ptr::null_mut();
    // SAFETY: `obj` is an instance of the type the table came from; `out` is a valid out
    // pointer. The function returns an owning tensor or sets a Python exception.
    let rc = unsafe { from_obj(obj.as_ptr().cast(), &mut out) };
    if rc != 0 || out.is_null() {
        let e = PyErr::take(py).unwrap_or_else(|| {
            arg_err(
                Kind::Buffer,
                index,
                "the producer's DLPack exchange API export failed",
            )
        });
        return Err(note(e));
    }
    let mut ready_on = None;
    // SAFETY: `out` is a live managed tensor we own; the version field is ABI-stable.
    let major = unsafe { (*out).version.major };
    if hs.sync && major == 1 {
        // SAFETY: major version 1: the layout is `DLManagedTensorVersioned`.
        let dev: DLDevice = unsafe { (*out).dl_tensor.device };
        // The producer's current stream, which its pending writes are ordered on: for device
        // memory, on the tensor's device; for managed and pinned host memory (which a kernel
        // of any device reads, and whose DLPack device id is 0 whatever GPU wrote it), the
        // producer's CUDA stream on the launch device. Host memory has none (and is refused).
        let asked = match dev.device_type {
            DLDeviceType::CUDA | DLDeviceType::ROCM => Some((dev.device_type, dev.device_id)),
            DLDeviceType::CUDAMANAGED | DLDeviceType::CUDAHOST => {
                Some((DLDeviceType::CUDA, hs.device))
            }
            _ => None,
        };
        if let Some((device_type, device_id)) = asked {
            let mut s: *mut c_void = std::ptr::null_mut();
            // SAFETY: plain values and a valid out pointer.
            let rc = unsafe { current_stream(device_type, device_id, &mut s) };
            if rc != 0 {
                let e = PyErr::take(py).unwrap_or_else(|| {
                    arg_err(
                        Kind::Buffer,
                        index,
                        "the producer's current_work_stream failed",
                    )
                });
                release_owned(out);
                return Err(note(e));
            }
            ready_on = Some(s as usize);
        }
    }
    // SAFETY: `out` is an owning export from the producer, valid until its deleter runs, and
    // nobody else holds it.
    let unused = unsafe { Unused::from_versioned(out) };
    Ok(Tensor {
        unused,
        claim: Claim::Owned(out),
        ready_on,
        owner: None,
        memory_trusted: false,
    })
}
