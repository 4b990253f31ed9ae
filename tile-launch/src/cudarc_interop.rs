//! `cudarc` interop: launch on `cudarc` streams, and pass `CudaSlice` buffers as DLPack tensors.
//!
//! # Contract
//!
//! - **Moved in** ([`tensor`], [`strided_tensor`], [`export`]): the `CudaSlice` becomes a DLPack
//!   tensor whose deleter frees it, stream-ordered on the slice's own stream, when the launch
//!   that consumed it releases the tensor, i.e. only after the kernel has finished.
//! - **Borrowed** ([`borrowed`]): the tensor points into a slice the caller keeps; releasing it
//!   frees nothing. See its `# Safety` section, and [`order_after`], for the other direction.
//! - **Write access, always.** A tensor made here may be bound to an input, an output or an
//!   in-out parameter; which one is not known when it is made. So every export asks `cudarc`
//!   for *write* access (`DevicePtrMut::device_ptr_mut` on the slice's own stream): that stream
//!   waits for the slice's pending reads as well as its pending writes on any other `cudarc`
//!   stream, and the tensor is declared ready on it ([`TensorArg::ready_on`]), so the launch
//!   stream waits for both on the device. An input waits for reads it did not need to wait for;
//!   that is the price of never racing a pending read with a write.
//! - **Captures are never disturbed.** When `cudarc` tracks the slice with events (several
//!   streams in its context, event tracking on) and the slice's stream is capturing a CUDA
//!   graph (`cuStreamIsCapturing`), the events would be waited on and recorded inside the
//!   capture, which invalidates it. The export is then refused, before anything is moved or
//!   recorded, and the slice is handed back. Export before the capture begins, or allocate the
//!   slices used in captures with `cudarc`'s event tracking off
//!   (`CudaContext::disable_event_tracking`). A deleter that finds the slice's stream capturing
//!   leaks the slice (logged) rather than free it into the capture.
//! - **The caller's current context is kept.** `cudarc` makes its own context current
//!   (`cuCtxSetCurrent`); every function here saves the calling thread's current context
//!   (`cuCtxGetCurrent`) first and restores it before returning, on every path, and so does a
//!   moved-in tensor's deleter, which runs with the slice's context current.
//! - **Primary contexts only.** tile launches in a device's primary context; a slice or stream
//!   of a non-primary `cudarc` context is refused.
//! - **Nothing is lost on a refusal.** A moved-in slice comes back with the error
//!   ([`ExportError::into_slice`]).

/// The `cudarc` this crate is built against (0.19), so that callers name its types
/// (`cudarc::driver::CudaSlice`, `CudaStream`) in the version that [`tensor`] and
/// [`Stream::from_cudarc`] take without depending on it themselves.
pub use cudarc;

use std::fmt;
use std::sync::Arc;

use cuda_sys::{CUcontext, CUresult, CUstream, CudaError, driver};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut, DriverError};
use tile_dlpack::Used;
use tile_dlpack::dlpark::ffi::{DLDevice, DLManagedTensorVersioned};
use tile_dlpack::dlpark::metadata::Dynamic;
use tile_dlpack::dlpark::{DlpackElement, OpaqueContext};

use crate::args::TensorArg;
use crate::context::SavedContext;
use crate::error::{Error, LayoutError, Result};
use crate::{Context, Stream};

/// A refused export of a moved-in `CudaSlice`: the error, and the slice, untouched (not freed,
/// no event recorded for it).
///
/// Converts into [`Error`] with `?` as [`Error::ExportRefused`], which keeps the slice for the
/// caller ([`Error::take_slice`]). Wherever the slice is finally dropped unclaimed (with this
/// value, or with the error it became), it is freed with its context current, or leaked
/// (logged) while its stream captures: most refusals happen while that stream captures, and a
/// `cudarc` free there would record and wait on events inside the capture.
pub struct ExportError<T> {
    error: Error,
    slice: Handed<T>,
}

/// A slice handed back by a refusal: freed safely ([`release`]) if dropped unclaimed.
struct Handed<T>(Option<CudaSlice<T>>);

impl<T> Drop for Handed<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.0.take() {
            release(slice);
        }
    }
}

impl<T> Handed<T> {
    fn take(&mut self) -> CudaSlice<T> {
        self.0.take().expect("a handed-back slice is taken once")
    }
}

pub use crate::error::HeldSlice;

impl Error {
    /// The `CudaSlice<T>` an [`Error::ExportRefused`] holds, taken out of it (`None` for any
    /// other error, for another element type, or once taken).
    pub fn take_slice<T: 'static>(&mut self) -> Option<CudaSlice<T>> {
        match self {
            Error::ExportRefused { slice, .. } => slice.0.downcast_mut::<Handed<T>>()?.0.take(),
            _ => None,
        }
    }
}

impl<T> ExportError<T> {
    fn new(error: Error, slice: CudaSlice<T>) -> Self {
        Self {
            error,
            slice: Handed(Some(slice)),
        }
    }

    /// Why the export was refused.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The caller's slice, handed back.
    pub fn into_slice(mut self) -> CudaSlice<T> {
        self.slice.take()
    }

    /// The error and the slice.
    pub fn into_parts(mut self) -> (Error, CudaSlice<T>) {
        let slice = self.slice.take();
        (self.error, slice)
    }
}

impl<T> fmt::Debug for ExportError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExportError")
            .field("error", &self.error)
            .field("slice_len", &self.slice.0.as_ref().map(|s| s.len()))
            .finish()
    }
}

impl<T> fmt::Display for ExportError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaSlice not exported (handed back): {}", self.error)
    }
}

impl<T> std::error::Error for ExportError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<T: Send + Sync + 'static> From<ExportError<T>> for Error {
    fn from(e: ExportError<T>) -> Self {
        let ExportError { error, slice } = e;
        Error::ExportRefused {
            source: Box::new(error),
            slice: HeldSlice(Box::new(slice)),
        }
    }
}

/// A moved-in `CudaSlice` as a DLPack tensor, with the stream its data becomes ready on (the
/// slice's stream, where `cudarc` ordered its pending work). The two travel together so that
/// the ordering cannot be dropped by accident: [`into_arg`](Exported::into_arg) makes a launch
/// argument ordered after that stream; [`into_parts`](Exported::into_parts) hands both over to a
/// caller that orders the tensor's users itself.
#[must_use = "the tensor's data is ready only on `ready_on`: use `into_arg` (ordered after it) or               `into_parts` and order the users yourself"]
pub struct Exported {
    used: Used,
    ready_on: Arc<CudaStream>,
}

impl fmt::Debug for Exported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exported")
            .field("ready_on", &self.ready_on.cu_stream())
            .finish_non_exhaustive()
    }
}

impl Exported {
    /// The stream the tensor's data becomes ready on (the slice's stream).
    pub fn ready_on(&self) -> &Arc<CudaStream> {
        &self.ready_on
    }

    /// The tensor as a launch argument declared ready on [`ready_on`](Exported::ready_on)
    /// ([`TensorArg::ready_on`]): the launch stream waits for it on the device.
    pub fn into_arg(self) -> TensorArg<'static> {
        let raw = self.ready_on.cu_stream() as CUstream;
        // SAFETY: the slice, now owned by `used`'s deleter context, holds an `Arc` to its
        // stream, so the stream outlives the launch that consumes this argument; the slice's
        // context is a primary context (checked by `export`), the one tile launches in.
        unsafe { TensorArg::from(self.used).ready_on(raw) }
    }

    /// The tensor and the stream its data becomes ready on. Whoever uses the tensor must first
    /// order its work after that stream (e.g. [`TensorArg::ready_on`], or an event waited on),
    /// or it may read the slice before `cudarc`'s pending work on it is done.
    pub fn into_parts(self) -> (Used, Arc<CudaStream>) {
        (self.used, self.ready_on)
    }
}

/// Moves `slice` into a DLPack tensor of the given `shape` and `strides` (in elements), with
/// write access (see the module docs), and returns it with the stream its data becomes ready on
/// (the slice's stream), as one [`Exported`] value.
///
/// # Errors
///
/// Each with the slice handed back ([`ExportError`]), nothing freed:
/// - [`Error::Layout`] if `shape` and `strides` differ in length or the layout reaches outside
///   the slice ([`LayoutError`]);
/// - [`Error::NonPrimaryContext`] if the slice belongs to a non-primary `cudarc` context;
/// - [`Error::CaptureInProgress`] if the slice's stream is capturing while `cudarc` tracks it
///   with events;
/// - [`Error::DeviceOrdinal`] if the slice's device ordinal does not fit in `i32`;
/// - [`Error::Cuda`] if a driver call fails (`cuCtxGetCurrent`, `cuCtxSetCurrent`,
///   `cuStreamIsCapturing`), or if `cudarc` holds a sticky error or records one while waiting
///   for the slice's pending work (`cuStreamWaitEvent`, `cuEventRecord`); a sticky error found
///   before is left in `cudarc`'s context too;
/// - [`Error::Driver`] without a driver;
/// - [`Error::Descriptor`] (index 0) if the resulting descriptor is refused (dtype, rank,
///   negative dimension, byte extent).
#[doc(alias = "cuStreamIsCapturing")]
pub fn export<T: DlpackElement>(
    mut slice: CudaSlice<T>,
    shape: &[i64],
    strides: &[i64],
) -> Result<Exported, ExportError<T>> {
    let ready_on = Arc::clone(slice.stream());
    let ptr = {
        let restore = match save_context() {
            Ok(r) => r,
            Err(e) => return Err(ExportError::new(e, slice)),
        };
        if let Err(e) = check_layout(slice.len(), shape, strides) {
            return Err(ExportError::new(e.into(), slice));
        }
        match write_access(&mut slice, "cudarc_interop::export", &restore) {
            Ok(ptr) => ptr,
            Err(e) => return Err(ExportError::new(e, slice)),
        }
    };
    let device = slice.ordinal();
    // The tensor's deleter owns one reference and this function another until the descriptor
    // has been accepted: if it is refused, the deleter drops its reference only, and the slice
    // is handed back from this one.
    let shared = Arc::new(slice);
    let owner = SliceOwner(Some(Arc::clone(&shared)));
    match describe(ptr, shape, strides, device, T::DTYPE, Box::new(owner)) {
        Ok(used) => {
            drop(shared);
            Ok(Exported { used, ready_on })
        }
        Err(e) => {
            let slice = Arc::into_inner(shared)
                .expect("the refused tensor's deleter has dropped its reference");
            Err(ExportError::new(e, slice))
        }
    }
}

/// A tensor argument from `slice` (shape `[len]`, stride 1), with write access, ordered after
/// the slice's stream (see the module docs).
///
/// # Errors
///
/// As [`export`]; [`Error::Layout`] ([`LayoutError::LengthOverflow`]) too if the length does
/// not fit in `i64`.
pub fn tensor<T: DlpackElement>(slice: CudaSlice<T>) -> Result<TensorArg<'static>, ExportError<T>> {
    let n = match length(&slice) {
        Ok(n) => n,
        Err(e) => return Err(ExportError::new(e, slice)),
    };
    strided_tensor(slice, &[n], &[1])
}

/// A tensor argument from `slice` with an explicit layout (`shape` and `strides` in elements),
/// with write access, ordered after the slice's stream (see the module docs).
///
/// # Errors
///
/// As [`export`].
pub fn strided_tensor<T: DlpackElement>(
    slice: CudaSlice<T>,
    shape: &[i64],
    strides: &[i64],
) -> Result<TensorArg<'static>, ExportError<T>> {
    Ok(export(slice, shape, strides)?.into_arg())
}

/// A tensor argument (shape `[len]`, stride 1) that borrows `slice` instead of taking it:
/// releasing it frees nothing. It asks `cudarc` for write access, whether it is then bound to an
/// input or an output (see the module docs): its stream waits for the slice's pending reads and
/// writes, and the launch waits for its stream.
///
/// # Safety
///
/// `cudarc` records its write marker for the slice *now*, before tile's kernel is enqueued, so
/// `cudarc` itself does not order later uses of the slice after that kernel. Until the launch
/// that consumes this argument is retired (or its stream synchronised), the slice must not be
/// dropped, freed, read, written or reused through `cudarc` or anything else, unless
/// [`order_after`] has first been called with the launch's stream: that makes `cudarc`'s later
/// users of the slice, and its free, wait for the launch on the device.
///
/// # Errors
///
/// As [`export`] (without the slice, which stays with the caller).
#[doc(alias = "cuStreamIsCapturing")]
pub unsafe fn borrowed<T: DlpackElement>(slice: &mut CudaSlice<T>) -> Result<TensorArg<'static>> {
    let n = length(slice)?;
    let ptr = {
        let restore = save_context()?;
        write_access(slice, "cudarc_interop::borrowed", &restore)?
    };
    let used = describe(ptr, &[n], &[1], slice.ordinal(), T::DTYPE, Box::new(()))?;
    let raw = slice.stream().cu_stream() as CUstream;
    // SAFETY: the caller keeps the slice, and so its stream, alive until the launch is retired
    // (this function's contract); the stream is of a primary context (checked above).
    Ok(unsafe { TensorArg::from(used).ready_on(raw) })
}

/// Orders `cudarc`'s later uses of `slice` after everything enqueued on `stream` so far: the
/// slice's stream waits for `stream` on the device (an event recorded on `stream` and
/// `cuStreamWaitEvent`), then `cudarc` records its write marker for the slice there. Call it
/// right after a launch on `stream` that wrote a [`borrowed`] slice; `cudarc`'s later readers,
/// writers and the slice's free then wait for that launch without the host blocking.
///
/// # Errors
///
/// [`Error::NonPrimaryContext`] if the slice belongs to a non-primary `cudarc` context;
/// [`Error::WrongContext`] if it is on another device than `stream`;
/// [`Error::ThreadRelativeStream`] if `stream` is the per-thread default stream and another
/// thread has launched on it (this thread's handle names another stream);
/// [`Error::CaptureInProgress`] if either stream is capturing a graph and `cudarc` tracks the
/// slice with events (nothing is enqueued then);
/// [`Error::Cuda`] if a driver call fails (`cuCtxGetCurrent`, `cuCtxSetCurrent`,
/// `cuStreamIsCapturing`, `cuEventCreate`, `cuEventRecord`, `cuStreamWaitEvent`), or for
/// `cudarc`'s sticky error as in [`export`]; [`Error::Driver`] without a driver.
#[doc(alias = "cuStreamWaitEvent")]
pub fn order_after<T>(slice: &mut CudaSlice<T>, stream: &Stream) -> Result<()> {
    let restore = save_context()?;
    let cu = Arc::clone(slice.context());
    if !cu.is_primary() {
        return Err(Error::NonPrimaryContext {
            what: "CudaSlice",
            device: cu.ordinal(),
        });
    }
    if raw_ctx(&cu) != stream.context().raw() {
        // Both are primary contexts: of different devices.
        return Err(Error::WrongContext {
            what: "CudaSlice",
            device: cu.ordinal(),
            context_device: stream.context().ordinal(),
        });
    }
    if !stream.names_every_launch_here() {
        return Err(Error::ThreadRelativeStream);
    }
    // SAFETY: `cu` (held) keeps its context alive; `restore` puts the caller's back.
    unsafe { restore.switch_to(raw_ctx(&cu)) }?;
    let own = slice.stream().cu_stream() as CUstream;
    let tracked = cu.is_managing_stream_synchronization();
    if tracked && (is_capturing(stream.raw())? || is_capturing(own)?) {
        return Err(Error::CaptureInProgress {
            call: ORDER_AFTER,
            device: cu.ordinal(),
        });
    }
    if own != stream.raw() {
        raw::stream_wait_stream(own, stream.raw())?;
    }
    write_access(slice, ORDER_AFTER, &restore).map(drop)
}

/// Asks `cudarc` for write access to `slice` on its own stream (that stream waits for the
/// slice's pending reads and writes; the write marker is recorded there), refusing first what
/// would break: a non-primary context, a capturing stream with event tracking, a sticky error.
/// Makes the slice's context current in place of the caller's, which `saved` puts back.
/// `call` names the public function refused ([`Error::CaptureInProgress`]).
fn write_access<T>(
    slice: &mut CudaSlice<T>,
    call: &'static str,
    saved: &SavedContext,
) -> Result<cudarc::driver::sys::CUdeviceptr> {
    let cu = Arc::clone(slice.context());
    if !cu.is_primary() {
        return Err(Error::NonPrimaryContext {
            what: "CudaSlice",
            device: cu.ordinal(),
        });
    }
    // SAFETY: `cu` (held) keeps its context alive; `saved` puts the caller's back.
    unsafe { saved.switch_to(raw_ctx(&cu)) }?;
    let stream = Arc::clone(slice.stream());
    if cu.is_managing_stream_synchronization() && is_capturing(stream.cu_stream() as CUstream)? {
        return Err(Error::CaptureInProgress {
            call,
            device: cu.ordinal(),
        });
    }
    if let Err(e) = cu.check_err() {
        // Not ours: leave it for the caller's next cudarc call as well.
        cu.record_err::<()>(Err(e));
        return Err(cudarc_error(
            e,
            "cudarc (a sticky error of an earlier call)",
        ));
    }
    let (ptr, record) = slice.device_ptr_mut(&stream);
    drop(record);
    cu.check_err()
        .map_err(|e| cudarc_error(e, "cuStreamWaitEvent/cuEventRecord (cudarc event tracking)"))?;
    Ok(ptr)
}

/// The name [`Error::CaptureInProgress`] gives [`order_after`].
const ORDER_AFTER: &str = "cudarc_interop::order_after";

/// The slice's length in elements as a DLPack dimension.
fn length<T>(slice: &CudaSlice<T>) -> Result<i64> {
    let len = slice.len();
    i64::try_from(len).map_err(|_| LayoutError::LengthOverflow { len }.into())
}

/// Checks that `shape` and `strides` have the same rank and that the elements they reach lie
/// inside a slice of `len` elements. Negative dimensions and the rank limit are left to the
/// descriptor's validation.
fn check_layout(len: usize, shape: &[i64], strides: &[i64]) -> Result<(), LayoutError> {
    if shape.len() != strides.len() {
        return Err(LayoutError::RankMismatch {
            shape: shape.len(),
            strides: strides.len(),
        });
    }
    if shape.iter().any(|&d| d <= 0) {
        // Empty (no element is reached) or refused by validation (negative).
        return Ok(());
    }
    let (mut lo, mut hi) = (0i128, 0i128);
    for (&d, &s) in shape.iter().zip(strides) {
        // |(d - 1) * s| < 2^126, and at most `MAX_NDIM` of them are added before validation
        // could refuse the rank: checked anyway.
        let reach = i128::from(d - 1) * i128::from(s);
        let overflow = || LayoutError::Overflow {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        };
        if reach < 0 {
            lo = lo.checked_add(reach).ok_or_else(overflow)?;
        } else {
            hi = hi.checked_add(reach).ok_or_else(overflow)?;
        }
    }
    if lo < 0 || hi >= len as i128 {
        return Err(LayoutError::OutOfBounds {
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            lowest: lo,
            highest: hi,
            len,
        });
    }
    Ok(())
}

/// A validated DLPack tensor over `ptr` with the given layout on `cuda:device`, whose deleter
/// drops `owner`.
fn describe<C: OpaqueContext>(
    ptr: cudarc::driver::sys::CUdeviceptr,
    shape: &[i64],
    strides: &[i64],
    device: usize,
    dtype: tile_dlpack::dlpark::ffi::DLDataType,
    owner: C,
) -> Result<Used> {
    let device = i32::try_from(device).map_err(|_| Error::DeviceOrdinal { ordinal: device })?;
    let mut init = Dynamic::new(shape, strides)
        .prepare_as::<DLManagedTensorVersioned>()
        .map_err(LayoutError::Metadata)?
        .initialize(owner);
    init.set_data(ptr as usize as *mut std::ffi::c_void)
        .set_device(DLDevice::cuda(device))
        .set_dtype(dtype);
    // SAFETY: every field is set; the data stays valid until the deleter runs (the owner holds
    // the slice, or the caller keeps it: `borrowed`'s contract).
    let managed = unsafe { init.finish() };
    Used::from_managed_versioned(managed).map_err(|source| Error::Descriptor { index: 0, source })
}

/// The deleter context of a moved-in slice. It frees the slice only if it holds the last
/// reference (the exporting function holds another until the descriptor is accepted).
struct SliceOwner<T>(Option<Arc<CudaSlice<T>>>);

impl<T> Drop for SliceOwner<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.0.take().and_then(Arc::into_inner) {
            release(slice);
        }
    }
}

/// Drops `slice` with its context current, restoring the thread's context afterwards. Leaks it
/// (logged) when its stream is capturing and `cudarc` would wait on or record events, or free
/// it, inside the capture. `cudarc` keeps its own errors (its sticky error slot).
fn release<T>(slice: CudaSlice<T>) {
    let restore = match save_context() {
        Ok(r) => r,
        Err(e) => {
            log::error!("releasing a CudaSlice: {e}; dropped without binding its context");
            drop(slice);
            return;
        }
    };
    let cu = Arc::clone(slice.context());
    // SAFETY: `cu` (held) keeps its context alive; `restore` puts the caller's back.
    if let Err(e) = unsafe { restore.switch_to(raw_ctx(&cu)) } {
        log::error!("releasing a CudaSlice: {e}");
    }
    match is_capturing(slice.stream().cu_stream() as CUstream) {
        Ok(false) => drop(slice),
        Ok(true) => {
            log::error!(
                "a CudaSlice of {} bytes is leaked: its stream is capturing a CUDA graph, and \
                 freeing it there would put the free into (or invalidate) the capture",
                slice.num_bytes()
            );
            std::mem::forget(slice);
        }
        Err(e) => {
            log::error!("a CudaSlice of {} bytes is leaked: {e}", slice.num_bytes());
            std::mem::forget(slice);
        }
    }
    drop(restore);
}

/// The primary context of device `ordinal`, through `cudarc` (`CudaContext::new`), once tile
/// has found the driver (honouring `TILE_LIBCUDA`) and checked that `cudarc` finds it too:
/// where `CudaContext::new` would panic without a driver, this returns an error.
///
/// # Errors
///
/// [`Error::Driver`] without a driver; [`Error::CudarcDriverUnavailable`] when `cudarc` would
/// not load it; [`Error::Cuda`] when `cudarc` fails to retain the context.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    crate::probe::require_cudarc_driver()?;
    CudaContext::new(ordinal).map_err(|e| cudarc_error(e, "CudaContext::new"))
}

/// `cudarc`'s handle of its context, as a `cuda-sys` handle (the same driver object).
fn raw_ctx(cu: &CudaContext) -> CUcontext {
    cu.cu_ctx() as CUcontext
}

fn cudarc_error(e: DriverError, function: &'static str) -> Error {
    Error::Cuda(CudaError::new(CUresult(e.0 as u32), function))
}

/// The calling thread's current context, put back when the value is dropped.
fn save_context() -> Result<SavedContext> {
    Ok(SavedContext::save(driver()?)?)
}

/// Whether `stream` (of the current context) is capturing, actively or invalidated.
fn is_capturing(stream: CUstream) -> Result<bool> {
    Ok(crate::capture::is_capturing(driver()?, stream)?)
}

/// The driver calls of this module, one thin wrapper each.
mod raw {
    use cuda_sys::{CUevent, CUevent_flags, CUstream, CuResultExt, driver};

    use crate::error::Result;

    /// Makes `waiter` wait on the device for the work enqueued on `producer` so far (an event
    /// recorded on `producer`, `cuStreamWaitEvent`, the event destroyed). Both streams must be
    /// of the current context.
    pub(super) fn stream_wait_stream(waiter: CUstream, producer: CUstream) -> Result<()> {
        let d = driver()?;
        let mut event: CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; a context is current.
        unsafe { (d.cuEventCreate)(&mut event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) }
            .check("cuEventCreate")?;
        // SAFETY: `event` was just created in the current context, the streams' context.
        let recorded = unsafe { (d.cuEventRecord)(event, producer) }.check("cuEventRecord");
        let waited = recorded.and_then(|()| {
            // SAFETY: as above; the wait captures the event's state now.
            unsafe { (d.cuStreamWaitEvent)(waiter, event, 0) }.check("cuStreamWaitEvent")
        });
        // SAFETY: nothing uses `event` after this; a pending wait keeps what it needs.
        let destroyed = unsafe { (d.cuEventDestroy)(event) }.check("cuEventDestroy");
        waited?;
        destroyed?;
        Ok(())
    }
}

impl Stream {
    /// Launches on a `cudarc` stream. The stream is kept alive (its `Arc` is held) for as long
    /// as this value or any launch on it lives.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] without a driver; [`Error::WrongContext`] if `ctx` is not the stream's
    /// device; [`Error::NonPrimaryContext`] if the stream's `cudarc` context is not that
    /// device's primary context (`ctx`): tile launches only in primary contexts.
    pub fn from_cudarc(ctx: &Arc<Context>, stream: &Arc<CudaStream>) -> Result<Stream> {
        let cu = stream.context();
        if i32::try_from(cu.ordinal()).ok() != Some(ctx.ordinal()) {
            return Err(Error::WrongContext {
                what: "cudarc stream",
                device: cu.ordinal(),
                context_device: ctx.ordinal(),
            });
        }
        if raw_ctx(cu) != ctx.raw() {
            return Err(Error::NonPrimaryContext {
                what: "cudarc stream",
                device: cu.ordinal(),
            });
        }
        let raw = stream.cu_stream() as CUstream;
        // SAFETY: `raw` belongs to `ctx`, the device's primary context (checked above); the
        // `Arc` kept by the stream keeps it valid.
        unsafe { Stream::from_raw_keeping(ctx, raw, Box::new(Arc::clone(stream))) }
    }
}

#[cfg(test)]
mod tests {
    //! The layout check is a pure function: every refusal, on the CPU.

    use super::check_layout;
    use crate::LayoutError;

    #[test]
    fn layouts_inside_the_buffer_are_accepted() {
        assert!(check_layout(6, &[2, 3], &[3, 1]).is_ok());
        assert!(check_layout(6, &[3, 2], &[1, 3]).is_ok()); // column-major
        assert!(check_layout(1, &[5], &[0]).is_ok()); // broadcast
        assert!(check_layout(0, &[0], &[1]).is_ok()); // empty: reaches nothing
        assert!(check_layout(1, &[], &[]).is_ok()); // a scalar
        assert!(check_layout(0, &[-1], &[1]).is_ok()); // left to descriptor validation
    }

    #[test]
    fn refused_layouts_say_why() {
        match check_layout(8, &[4], &[1, 1]) {
            Err(LayoutError::RankMismatch {
                shape: 1,
                strides: 2,
            }) => {}
            other => panic!("{other:?}"),
        }
        match check_layout(4, &[2, 3], &[3, 1]) {
            Err(LayoutError::OutOfBounds {
                lowest: 0,
                highest: 5,
                len: 4,
                shape,
                strides,
            }) => assert_eq!((shape, strides), (vec![2, 3], vec![3, 1])),
            other => panic!("{other:?}"),
        }
        match check_layout(4, &[4], &[-1]) {
            Err(LayoutError::OutOfBounds {
                lowest: -3,
                highest: 0,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_layout(0, &[1], &[1]),
            Err(LayoutError::OutOfBounds { .. })
        ));
        let huge = vec![i64::MAX; 64];
        assert!(matches!(
            check_layout(usize::MAX, &huge, &huge),
            Err(LayoutError::Overflow { .. })
        ));
    }

    #[test]
    fn without_a_driver_context_is_an_error_not_a_panic() {
        match (cuda_sys::driver(), super::context(0)) {
            (Err(_), Err(e)) => assert!(matches!(e, super::Error::Driver(_)), "{e:?}"),
            (Ok(_), r) => drop(r), // a driver: whatever cudarc says, it said it without panicking
            (Err(_), Ok(_)) => panic!("a context without a driver"),
        }
    }
}
