//! tile's XLA FFI handler: one `extern "C"` function for every tile kernel called from JAX. It
//! reads the call frame ([`super::frame`]), finds the kernel in the registry filled at trace
//! time, describes XLA's buffers as DLPack tensors, and launches through tile-launch's checked
//! launch on XLA's stream. It never touches the interpreter.

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, RwLock};

use smallvec::SmallVec;
use tile_dlpack::Unused;
use tile_dlpack::dlpark::DlpackFlags;
use tile_dlpack::ffi::{
    DLDataType, DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPackVersion, DLTensor,
};
use tile_launch::{Arg, Dim3, LaunchConfig, Scalar, Stream, TensorArg};

use super::frame::{Attr, Call, FfiError, Frame, answer_metadata, dtype};
use super::roles::{Binding, Roles};
use crate::xla_ffi_sys as sys;

/// A kernel declared to `tile_py.jax` with the roles of its parameters at one call site: what
/// the handler launches for an id.
pub(crate) struct Entry {
    pub(crate) kernel: tile_launch::Kernel,
    pub(crate) roles: Roles,
}

/// The kernels `tile_py.jax` has traced calls of, by id (the index). Entries are never removed:
/// a compiled XLA executable may call its kernel for as long as the process lives.
static KERNELS: RwLock<Vec<Arc<Entry>>> = RwLock::new(Vec::new());

/// Registers `entry` and returns its id.
pub(crate) fn register(entry: Entry) -> i64 {
    let mut k = KERNELS.write().unwrap_or_else(|p| p.into_inner());
    k.push(Arc::new(entry));
    (k.len() - 1) as i64
}

fn kernel(id: i64) -> Option<Arc<Entry>> {
    let k = KERNELS.read().unwrap_or_else(|p| p.into_inner());
    usize::try_from(id).ok().and_then(|i| k.get(i)).cloned()
}

/// tile's streams over XLA's, by handle. XLA's streams are named only inside calls
/// ([`Stream::from_raw_launch_only`]): a stream XLA destroys once its work is done is never
/// touched again.
static STREAMS: Mutex<Option<HashMap<usize, Stream>>> = Mutex::new(None);

fn stream(raw: *mut c_void) -> Result<Stream, FfiError> {
    let key = raw as usize;
    let mut g = STREAMS.lock().unwrap_or_else(|p| p.into_inner());
    let map = g.get_or_insert_with(HashMap::new);
    if let Some(s) = map.get(&key) {
        return Ok(s.clone());
    }
    let raw = raw as cuda_sys::CUstream;
    // SAFETY: XLA's stream for this call, live during it.
    let device = unsafe { tile_launch::Context::device_of_stream(raw) }
        .map_err(launch_error)?
        .unwrap_or(0);
    let ctx = crate::device_contexts::context(device).map_err(launch_error)?;
    // SAFETY: XLA's stream of the device's primary context (the context XLA's CUDA runtime
    // uses), valid during every call it is passed to, and naming that stream until the work
    // enqueued there finished; tile names it only inside launches.
    let s = unsafe { Stream::from_raw_launch_only(&ctx, raw) }.map_err(launch_error)?;
    map.insert(key, s.clone());
    Ok(s)
}

/// The handler XLA calls (`XLA_FFI_Handler`). Panics are caught here and returned as an
/// `INTERNAL` error: nothing unwinds into XLA.
///
/// # Safety
///
/// `frame` must be a call frame XLA passes to an FFI handler (or null), valid during the call.
pub(crate) unsafe extern "C" fn handler(
    frame: *mut sys::XLA_FFI_CallFrame,
) -> *mut sys::XLA_FFI_Error {
    // SAFETY: the caller's contract.
    let Some(frame) = (unsafe { Frame::new(frame) }) else {
        // Without XLA's API table no error can be returned; XLA always passes one.
        eprintln!("tile_py.jax: called without an XLA FFI API table; nothing was launched");
        return std::ptr::null_mut();
    };
    match std::panic::catch_unwind(AssertUnwindSafe(|| call(&frame))) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(e)) => frame.error(&e),
        Err(panic) => {
            let what = crate::exceptions::panic_text(&*panic, "a panic");
            // The payload is dropped inside a guard too: a payload that panics on drop must not
            // unwind into XLA either.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(panic)));
            frame.error(&FfiError::internal(format!(
                "tile_py.jax: internal error in the handler: {what}"
            )))
        }
    }
}

fn call(frame: &Frame<'_>) -> Result<(), FfiError> {
    match frame.call()? {
        Call::Metadata(m) => answer_metadata(m),
        Call::Execute => execute(frame),
    }
}

/// The launch attributes `tile_py.jax` sets, each an int64 scalar (the one attribute type every
/// JAX version lowers the same way): `kernel` (the registry id), `grid_x`, `grid_y`, `grid_z`,
/// `block_x`, `block_y`, `block_z`, `shared_mem` (bytes), and per scalar parameter `i` (in
/// declaration order) `scalar{i}` (its 64 bits) and `scalar{i}_kind` (how to read them).
#[derive(Default, Debug)]
pub(crate) struct Attrs {
    pub(crate) kernel: Option<i64>,
    pub(crate) grid: [Option<i64>; 3],
    pub(crate) block: [Option<i64>; 3],
    pub(crate) shared_mem: Option<i64>,
    /// `(bits, kind)` per scalar index; `None` where one of the two is missing.
    pub(crate) scalars: Vec<(Option<i64>, Option<i64>)>,
}

/// Scalar kinds (`scalar{i}_kind`): how the 64 bits of `scalar{i}` are read. A bool.
pub(crate) const KIND_BOOL: i64 = 0;
/// A signed integer (the bits as `i64`).
pub(crate) const KIND_INT: i64 = 1;
/// An unsigned integer (the bits as `u64`).
pub(crate) const KIND_UINT: i64 = 2;
/// A float (the bits of an `f64`).
pub(crate) const KIND_FLOAT: i64 = 3;

/// The most scalar parameters a kernel called from JAX may have.
pub(crate) const MAX_SCALARS: usize = 4096;

pub(crate) fn read_attrs(list: &[(&str, Attr)]) -> Result<Attrs, FfiError> {
    let mut a = Attrs::default();
    for (name, v) in list {
        let slot = match *name {
            "kernel" => &mut a.kernel,
            "grid_x" => &mut a.grid[0],
            "grid_y" => &mut a.grid[1],
            "grid_z" => &mut a.grid[2],
            "block_x" => &mut a.block[0],
            "block_y" => &mut a.block[1],
            "block_z" => &mut a.block[2],
            "shared_mem" => &mut a.shared_mem,
            other => {
                let scalar = other.strip_prefix("scalar").and_then(|rest| {
                    let (index, kind) = match rest.strip_suffix("_kind") {
                        Some(i) => (i, true),
                        None => (rest, false),
                    };
                    // Only tile_py.jax's own spelling: digits, no sign, no leading zero.
                    let canonical = !index.is_empty()
                        && index.bytes().all(|b| b.is_ascii_digit())
                        && (index == "0" || !index.starts_with('0'));
                    let i: usize = index
                        .parse()
                        .ok()
                        .filter(|&i| canonical && i < MAX_SCALARS)?;
                    Some((i, kind))
                });
                let Some((i, kind)) = scalar else {
                    return Err(FfiError::invalid(format!(
                        "tile_py.jax: unknown attribute `{other}` (call kernels through \
                         tile_py.jax.call)"
                    )));
                };
                if a.scalars.len() <= i {
                    a.scalars.resize(i + 1, (None, None));
                }
                let (bits, k) = &mut a.scalars[i];
                if kind { k } else { bits }
            }
        };
        *slot = Some(v.i64(name)?);
    }
    Ok(a)
}

fn missing(name: &str) -> FfiError {
    FfiError::invalid(format!(
        "tile_py.jax: attribute `{name}` is missing (call kernels through tile_py.jax.call)"
    ))
}

fn dim3(name: &str, v: [Option<i64>; 3]) -> Result<Dim3, FfiError> {
    let d = |i: usize, axis: &str| {
        let x = v[i].ok_or_else(|| missing(&format!("{name}_{axis}")))?;
        u32::try_from(x).map_err(|_| {
            FfiError::invalid(format!("tile_py.jax: {name}_{axis} {x} is out of range"))
        })
    };
    Ok(Dim3 {
        x: d(0, "x")?,
        y: d(1, "y")?,
        z: d(2, "z")?,
    })
}

/// The launch configuration of the attributes.
pub(crate) fn config(a: &Attrs) -> Result<LaunchConfig, FfiError> {
    let mut c = LaunchConfig::new(dim3("grid", a.grid)?, dim3("block", a.block)?);
    let sm = a.shared_mem.unwrap_or(0);
    c.shared_mem_bytes = u32::try_from(sm)
        .map_err(|_| FfiError::invalid(format!("tile_py.jax: shared_mem {sm} is out of range")))?;
    Ok(c)
}

/// The scalar of index `i` of the attributes.
pub(crate) fn scalar(a: &Attrs, i: usize) -> Result<Scalar, FfiError> {
    let Some(&(Some(bits), Some(kind))) = a.scalars.get(i) else {
        return Err(FfiError::invalid(format!(
            "tile_py.jax: the kernel's scalar {i} has no value (attributes `scalar{i}` and \
             `scalar{i}_kind`)"
        )));
    };
    Ok(match kind {
        KIND_BOOL => Scalar::Bool(bits != 0),
        KIND_INT => Scalar::Int(i128::from(bits)),
        KIND_UINT => Scalar::Int(i128::from(bits as u64)),
        KIND_FLOAT => Scalar::Float(f64::from_bits(bits as u64)),
        other => {
            return Err(FfiError::invalid(format!(
                "tile_py.jax: scalar {i} has unknown kind {other}"
            )));
        }
    })
}

/// The DLPack descriptors of one call's buffers, on the handler's stack: dense row-major, on
/// device `ordinal`, with no deleter. They are lent to the launch ([`TensorArg::borrowed`]),
/// never consumed: the buffers are XLA's, which keeps them alive until the work it enqueued for
/// the call on its stream has finished, and the descriptors are read only during the launch
/// call (the kernel receives pointers and extents by value). Nothing is allocated for a call of
/// up to eight buffers of rank four or less.
pub(crate) struct Descriptors {
    tensors: SmallVec<[DLManagedTensorVersioned; 8]>,
    /// The strides of every buffer, one after the other: only pointed into by `tensors`, and
    /// never grown once a descriptor points into it.
    _strides: SmallVec<[i64; 32]>,
}

/// Compact row-major strides of `dims`, in elements, appended to `out`; `None` if one does not
/// fit `i64`.
fn compact_strides(dims: &[i64], out: &mut SmallVec<[i64; 32]>) -> Option<()> {
    let start = out.len();
    out.resize(start + dims.len(), 0);
    let mut stride = 1i64;
    for (i, &d) in dims.iter().enumerate().rev() {
        out[start + i] = stride;
        // The outermost extent multiplies into no stride.
        if i > 0 {
            stride = stride.checked_mul(d.max(1))?;
        }
    }
    Some(())
}

impl Descriptors {
    /// Describes the buffers `bound` names on device `ordinal`, refusing an XLA element type
    /// with no DLPack dtype tile supports.
    pub(crate) fn new(bound: &[Binding<'_>], ordinal: i32) -> Result<Descriptors, FfiError> {
        let mut strides = SmallVec::new();
        for b in bound {
            if let Binding::Buffer(buffer, index) = b
                && compact_strides(buffer.dims, &mut strides).is_none()
            {
                return Err(FfiError::invalid(format!(
                    "tile_py.jax: argument {index}: extents {:?} overflow 64-bit strides",
                    buffer.dims
                )));
            }
        }
        let mut tensors = SmallVec::new();
        let mut at = 0usize;
        for b in bound {
            let Binding::Buffer(buffer, index) = b else {
                continue;
            };
            let dt = dtype(buffer.dtype).ok_or_else(|| {
                FfiError::invalid(format!(
                    "tile_py.jax: argument {index}: XLA element type {} has no DLPack dtype \
                     tile supports",
                    buffer.dtype.0
                ))
            })?;
            let rank = buffer.dims.len();
            tensors.push(DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 1 },
                manager_ctx: std::ptr::null_mut(),
                deleter: None,
                flags: DlpackFlags::empty(),
                dl_tensor: DLTensor {
                    data: buffer.data,
                    device: DLDevice {
                        device_type: DLDeviceType::CUDA,
                        device_id: ordinal,
                    },
                    ndim: rank as i32, // at most 64 (`frame::buffers`)
                    dtype: DLDataType::from(dt),
                    // Read only, never written through (DLPack's field is `int64_t*`).
                    shape: buffer.dims.as_ptr().cast_mut(),
                    strides: strides[at..].as_ptr().cast_mut(),
                    byte_offset: 0,
                },
            });
            at += rank;
        }
        Ok(Descriptors {
            tensors,
            _strides: strides,
        })
    }

    /// The kernel's launch arguments: each bound buffer lent as its descriptor (memory trusted
    /// to be the device memory XLA allocated), each scalar as it is.
    pub(crate) fn arguments<'d>(&'d mut self, bound: &[Binding<'_>]) -> SmallVec<[Arg<'d>; 8]> {
        let base = self.tensors.as_mut_ptr();
        let mut next = 0usize;
        bound
            .iter()
            .map(|b| match b {
                Binding::Buffer(..) => {
                    // SAFETY: `next` indexes `tensors` (one descriptor per buffer, in order);
                    // the descriptor, its shape (XLA's dims, live during the call) and strides
                    // (`self._strides`) stay valid and unchanged for `'d`; XLA keeps the data
                    // alive until the call's stream work is done, which is
                    // `TensorArg::borrowed`'s contract, and it is XLA's own device memory
                    // (`trust_memory`'s).
                    let t = unsafe {
                        let u = Unused::from_versioned(base.add(next));
                        TensorArg::borrowed(u).trust_memory()
                    };
                    next += 1;
                    Arg::Tensor(t)
                }
                Binding::Scalar(s) => Arg::Scalar(*s),
            })
            .collect()
    }
}

/// A tile-launch error as an XLA error: driver failures are `INTERNAL`, every refused check
/// `INVALID_ARGUMENT`.
fn launch_error(e: tile_launch::Error) -> FfiError {
    match e {
        tile_launch::Error::Cuda(_) | tile_launch::Error::Driver(_) => {
            FfiError::internal(format!("tile_py.jax: {e}"))
        }
        other => FfiError::invalid(format!("tile_py.jax: {other}")),
    }
}

fn execute(frame: &Frame<'_>) -> Result<(), FfiError> {
    let attrs = read_attrs(&frame.attrs()?)?;
    let id = attrs.kernel.ok_or_else(|| missing("kernel"))?;
    let entry = kernel(id).ok_or_else(|| {
        FfiError::invalid(format!(
            "tile_py.jax: no kernel with id {id} in this process (a call traced in another \
             process cannot run here)"
        ))
    })?;
    let config = config(&attrs)?;
    let (args, rets) = frame.buffers()?;
    let name = entry.kernel.name();
    // Buffers and scalars by the call site's roles, before XLA's stream is touched.
    let bound = entry
        .roles
        .bind(name, &args, &rets, attrs.scalars.len(), |i| {
            scalar(&attrs, i)
        })?;
    let s = stream(frame.stream()?)?;
    let mut descriptors = Descriptors::new(&bound, s.context().ordinal())?;
    let launch = descriptors.arguments(&bound);
    // The checks of every launch (configuration against the device, each tensor against the
    // declaration, memory, capture), then the launch on XLA's stream. The descriptors are only
    // lent: nothing is queued for release and no completion marker is recorded.
    let checked = s
        .check(&entry.kernel, &config, launch)
        .map_err(|e| in_kernel(name, e))?;
    checked.launch_queued().map_err(|e| in_kernel(name, e))
}

fn in_kernel(name: &str, e: tile_launch::Error) -> FfiError {
    let mut f = launch_error(e);
    f.message = f.message.replacen(
        "tile_py.jax: ",
        &format!("tile_py.jax: kernel `{name}`: "),
        1,
    );
    f
}
