//! `cudarc` interop: launch on `cudarc` streams, and pass `CudaSlice` buffers as DLPack tensors.
//!
//! A `CudaSlice` handed to [`tensor`] is moved into a DLPack tensor (through `dlpark`'s
//! `cudarc` export). Its memory is freed, stream-ordered, when the launch that consumed it
//! releases the tensor, i.e. only after the kernel has finished. The launch stream is made to
//! wait for the slice's own stream, so work still pending there (an upload, a previous kernel)
//! is finished before the kernel reads the data.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use tile_dlpack::Used;
use tile_dlpack::dlpark::ffi::{DLDevice, DLManagedTensorVersioned};
use tile_dlpack::dlpark::metadata::Dynamic;
use tile_dlpack::dlpark::{DlpackElement, interop::cudarc as dl};

use crate::error::{Error, Result};
use crate::launch::TensorArg;
use crate::{Context, Stream};

/// Moves `slice` into a DLPack tensor of the given `shape` and `strides` (in elements) and
/// returns it with the stream its data becomes ready on (the slice's stream).
///
/// # Errors
///
/// [`Error::Module`] if the layout does not fit in the slice; [`Error::Descriptor`] (index 0)
/// if the resulting descriptor is refused.
pub fn export<T: DlpackElement>(
    slice: CudaSlice<T>,
    shape: &[i64],
    strides: &[i64],
) -> Result<(Used, Arc<CudaStream>)> {
    let export =
        dl::from_cuda_slice::<T, DLManagedTensorVersioned>(Box::new(slice), shape, strides)
            .map_err(|e| Error::Module(format!("cannot export CudaSlice as DLPack: {e}")))?;
    let (initialized, ready_on) = export.into_parts();
    // SAFETY: dlpark's export filled in every descriptor field from the slice it now owns; the
    // data stays valid until the tensor's deleter runs.
    let managed = unsafe { initialized.finish() };
    let used = Used::from_managed_versioned(managed)
        .map_err(|source| Error::Descriptor { index: 0, source })?;
    Ok((used, ready_on))
}

/// A tensor argument from `slice` (shape `[len]`, stride 1), ordered after the slice's stream.
///
/// # Errors
///
/// As [`export`].
pub fn tensor<T: DlpackElement>(slice: CudaSlice<T>) -> Result<TensorArg<'static>> {
    let n = i64::try_from(slice.len())
        .map_err(|_| Error::Module("CudaSlice length does not fit in i64".into()))?;
    strided_tensor(slice, &[n], &[1])
}

/// A tensor argument from `slice` with an explicit layout, ordered after the slice's stream.
///
/// # Errors
///
/// As [`export`].
pub fn strided_tensor<T: DlpackElement>(
    slice: CudaSlice<T>,
    shape: &[i64],
    strides: &[i64],
) -> Result<TensorArg<'static>> {
    let (used, ready_on) = export(slice, shape, strides)?;
    let raw = ready_on.cu_stream() as cuda_sys::CUstream;
    // SAFETY: the slice, now owned by `used`'s deleter context, holds an `Arc` to its stream,
    // so the stream outlives the launch that consumes this argument.
    Ok(unsafe { TensorArg::from(used).ready_on(raw) })
}

/// A tensor argument that borrows `slice` instead of taking it: releasing it frees nothing.
/// Use it for outputs that the caller reads back after the launch is retired.
///
/// # Safety
///
/// `slice` must not be dropped, freed or reused until the launch that consumes this argument is
/// retired (or its stream synchronised): the GPU may still be writing to it.
///
/// # Errors
///
/// As [`export`].
pub unsafe fn borrowed<T: DlpackElement>(slice: &CudaSlice<T>) -> Result<TensorArg<'static>> {
    let n = i64::try_from(slice.len())
        .map_err(|_| Error::Module("CudaSlice length does not fit in i64".into()))?;
    let stream = slice.stream();
    let (ptr, sync) = slice.device_ptr(stream);
    drop(sync);
    let device = i32::try_from(stream.context().ordinal())
        .map_err(|_| Error::Module("device ordinal does not fit in i32".into()))?;
    let mut init = Dynamic::new([n], [1i64])
        .prepare_as::<DLManagedTensorVersioned>()
        .map_err(|e| Error::Module(format!("cannot describe CudaSlice as DLPack: {e}")))?
        .initialize(Box::new(()));
    init.set_data(ptr as usize as *mut std::ffi::c_void)
        .set_device(DLDevice::cuda(device))
        .set_dtype(T::DTYPE);
    // SAFETY: every field is set; the caller keeps the memory alive (this function's contract).
    let managed = unsafe { init.finish() };
    let used = Used::from_managed_versioned(managed)
        .map_err(|source| Error::Descriptor { index: 0, source })?;
    let raw = stream.cu_stream() as cuda_sys::CUstream;
    // SAFETY: the caller keeps the slice, and so its stream, alive until the launch is retired.
    Ok(unsafe { TensorArg::from(used).ready_on(raw) })
}

impl Stream {
    /// Launches on a `cudarc` stream. The stream is kept alive (its `Arc` is held) for as long
    /// as this value or any launch on it lives.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] without a driver; [`Error::Module`] if `ctx` is not the stream's
    /// device.
    pub fn from_cudarc(ctx: &Arc<Context>, stream: &Arc<CudaStream>) -> Result<Stream> {
        if stream.context().ordinal() as i32 != ctx.ordinal() {
            return Err(Error::Module(format!(
                "cudarc stream is on cuda:{}, context on cuda:{}",
                stream.context().ordinal(),
                ctx.ordinal()
            )));
        }
        let raw = stream.cu_stream() as cuda_sys::CUstream;
        // SAFETY: `raw` belongs to the primary context of the same device (cudarc uses primary
        // contexts); the `Arc` kept by the stream keeps it valid.
        unsafe { Stream::from_raw_keeping(ctx, raw, Box::new(Arc::clone(stream))) }
    }
}
