//! Kernel arguments (tensors and scalars) and the checks of a launch's arguments against the
//! kernel's signature, made before anything is consumed.

use std::fmt;

use cuda_sys::CUstream;
use smallvec::SmallVec;
use tile_dlpack::{Unused, Used};

use crate::error::{Error, Result};
use crate::signature::{Param, ScalarType, Signature};

/// A scalar kernel argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Scalar {
    /// `bool`.
    Bool(bool),
    /// Any integer, converted to the parameter's integer type if it fits.
    Int(i128),
    /// Any float, converted to the parameter's float type (`f64` → `f32` rounds to nearest; a
    /// finite value that rounds beyond f32's range is refused).
    Float(f64),
}

macro_rules! scalar_from {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Scalar {
            fn from(x: $t) -> Scalar { Scalar::$v(x.into()) }
        }
        impl From<$t> for Arg<'_> {
            fn from(x: $t) -> Self { Arg::Scalar(Scalar::$v(x.into())) }
        }
    )*};
}
scalar_from!(bool => Bool, i8 => Int, i16 => Int, i32 => Int, i64 => Int, u8 => Int, u16 => Int,
    u32 => Int, u64 => Int, f32 => Float, f64 => Float);

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "bool {b}"),
            Scalar::Int(i) => write!(f, "integer {i}"),
            Scalar::Float(x) => write!(f, "float {x}"),
        }
    }
}

impl Scalar {
    /// The value's bytes as the kernel receives it (little-endian, in the low bytes of a `u64`).
    fn encode(&self, ty: ScalarType) -> Option<u64> {
        use ScalarType as T;
        Some(match (*self, ty) {
            (Scalar::Bool(b), T::Bool) => u64::from(b),
            (Scalar::Int(i), T::I8) => i8::try_from(i).ok()? as u8 as u64,
            (Scalar::Int(i), T::I16) => i16::try_from(i).ok()? as u16 as u64,
            (Scalar::Int(i), T::I32) => i32::try_from(i).ok()? as u32 as u64,
            (Scalar::Int(i), T::I64) => i64::try_from(i).ok()? as u64,
            (Scalar::Int(i), T::U8) => u8::try_from(i).ok()?.into(),
            (Scalar::Int(i), T::U16) => u16::try_from(i).ok()?.into(),
            (Scalar::Int(i), T::U32) => u32::try_from(i).ok()?.into(),
            (Scalar::Int(i), T::U64) => u64::try_from(i).ok()?,
            // Rounds to the nearest f32 (ties to even, as NumPy's `float32(x)`); a finite value
            // that rounds beyond f32's range (at or above f32::MAX plus half its last step) is
            // refused rather than turned into an infinity. NaN and the infinities pass through.
            (Scalar::Float(x), T::F32) if x.is_finite() && !(x as f32).is_finite() => {
                return None;
            }
            (Scalar::Float(x), T::F32) => u64::from((x as f32).to_bits()),
            (Scalar::Float(x), T::F64) => x.to_bits(),
            _ => return None,
        })
    }
}

/// Where a tensor argument comes from.
#[derive(Debug)]
pub enum TensorSource<'a> {
    /// A producer's tensor that is not consumed yet; it is consumed only once every argument of
    /// the launch has been checked.
    Unused(Unused<'a>),
    /// A tensor already owned by the caller (e.g. exported from `cudarc`).
    Used(Used),
    /// A descriptor the launch only reads, never consumes: its memory is kept alive until the
    /// launched work is done by whoever owns it, not by tile ([`TensorArg::borrowed`]).
    Borrowed(Unused<'a>),
}

impl TensorSource<'_> {
    /// The validated view of the tensor: validates a descriptor not consumed yet once (the
    /// launch reuses that), or hands out a consumed one's.
    pub(crate) fn view(
        &self,
    ) -> std::result::Result<tile_dlpack::TensorView<'_>, tile_dlpack::DescriptorError> {
        match self {
            TensorSource::Unused(u) | TensorSource::Borrowed(u) => u.peek(),
            TensorSource::Used(u) => Ok(u.view()),
        }
    }
}

/// A tensor argument, with the stream on which its data becomes ready (if any).
#[derive(Debug)]
pub struct TensorArg<'a> {
    pub(crate) source: TensorSource<'a>,
    pub(crate) ready_on: Option<CUstream>,
    /// Whether the launch may skip asking the driver what the data pointer is
    /// ([`TensorArg::trust_memory`]).
    pub(crate) memory_trusted: bool,
}

/// The bytes only a launch's release queue keeps alive for a tensor with this view: an export
/// the producer copied for the launch (DLPack `IS_COPIED`) counts its byte extent; a tensor its
/// caller still holds costs the queue nothing. The one rule for the queue's byte bound.
pub(crate) fn queue_bytes(view: &tile_dlpack::TensorView<'_>) -> u64 {
    if view.is_copied() {
        view.nbytes_spanned()
    } else {
        0
    }
}

impl<'a> TensorArg<'a> {
    /// The bytes only a launch's release queue would keep alive for this tensor: its byte
    /// extent when the producer copied it for the launch (DLPack `IS_COPIED`), else 0 (also for
    /// a descriptor that does not validate: the launch refuses it before anything is queued).
    /// Validates the descriptor of a tensor not consumed yet once; the launch reuses that.
    pub fn queue_bytes(&self) -> u64 {
        match self.source.view() {
            // A borrowed tensor is never queued.
            Ok(v) if !matches!(self.source, TensorSource::Borrowed(_)) => queue_bytes(&v),
            _ => 0,
        }
    }

    /// Declares that the tensor's data is written by work enqueued on `producer`: the launch
    /// stream then waits for that work on the device (`cuStreamWaitEvent`) before the kernel
    /// runs. Nothing is inserted when `producer` is the launch stream.
    ///
    /// # Safety
    ///
    /// `producer` must be a valid stream of the launch stream's context (null means the legacy
    /// default stream) until the launch returns.
    pub unsafe fn ready_on(mut self, producer: CUstream) -> Self {
        self.ready_on = Some(producer);
        self
    }

    /// Skips the launch's check that the driver knows the data pointer as device, managed or
    /// page-locked host memory (one `cuPointerGetAttributes` per tensor per launch, see
    /// [`Stream::launch`](crate::Stream::launch)), for producers whose descriptors are trusted
    /// to describe their memory (e.g. a framework's own allocator, through the DLPack C
    /// exchange API).
    ///
    /// # Safety
    ///
    /// The data pointer must be memory of the kind and device the descriptor names: a host
    /// address labelled as device memory makes the kernel fault, which poisons the context.
    pub unsafe fn trust_memory(mut self) -> Self {
        self.memory_trusted = true;
        self
    }

    /// A tensor the launch reads but never consumes: nothing of it is held by the launch or
    /// queued for release, its deleter is never called, and the descriptor is read only until
    /// the launch call returns (the kernel receives the data pointer and extents by value). For
    /// memory whose lifetime another owner already ties to the launch stream's work, such as
    /// the buffers an XLA FFI handler is passed (XLA keeps them alive until the work enqueued
    /// for the call on its stream is done). Checked like any other tensor.
    ///
    /// # Safety
    ///
    /// The memory the descriptor points to must stay allocated, and must not be reused, until
    /// the work launched with it on the launch stream has completed; the descriptor itself must
    /// stay valid until the launch call returns.
    pub unsafe fn borrowed(tensor: Unused<'a>) -> Self {
        TensorArg {
            source: TensorSource::Borrowed(tensor),
            ready_on: None,
            memory_trusted: false,
        }
    }

    /// The tensor, without its readiness stream (e.g. to consume it outside a launch).
    pub fn into_source(self) -> TensorSource<'a> {
        self.source
    }
}

/// One kernel argument: a tensor or a scalar.
#[derive(Debug)]
pub enum Arg<'a> {
    /// A tensor, passed as a pointer to its first element.
    Tensor(TensorArg<'a>),
    /// A scalar, passed by value.
    Scalar(Scalar),
}

impl<'a> From<Unused<'a>> for TensorArg<'a> {
    fn from(t: Unused<'a>) -> Self {
        TensorArg {
            source: TensorSource::Unused(t),
            ready_on: None,
            memory_trusted: false,
        }
    }
}
impl From<Used> for TensorArg<'_> {
    fn from(t: Used) -> Self {
        TensorArg {
            source: TensorSource::Used(t),
            ready_on: None,
            memory_trusted: false,
        }
    }
}
impl<'a> From<TensorArg<'a>> for Arg<'a> {
    fn from(t: TensorArg<'a>) -> Self {
        Arg::Tensor(t)
    }
}
impl<'a> From<Unused<'a>> for Arg<'a> {
    fn from(t: Unused<'a>) -> Self {
        Arg::Tensor(t.into())
    }
}
impl From<Used> for Arg<'_> {
    fn from(t: Used) -> Self {
        Arg::Tensor(t.into())
    }
}
impl From<Scalar> for Arg<'_> {
    fn from(s: Scalar) -> Self {
        Arg::Scalar(s)
    }
}

/// The number of arguments a new argument vector has room for ([`Args::new`]; it grows past
/// it), and the inline size of the buffers a launch keeps per argument (its parameter slots,
/// its pointer list), which spill to the heap beyond it.
pub const INLINE_ARGS: usize = 8;

/// The arguments of one launch, in a vector reused per thread ([`spare_args`]): a checked launch
/// holds them until it is launched or dropped, and is moved between the check and the enqueue,
/// which then moves the vector's three words instead of its arguments (about 100 bytes each).
pub(crate) type ArgList<'a> = Vec<Arg<'a>>;

/// Argument vectors kept for reuse on this thread ([`spare_args`], [`recycle_args`]): at most
/// [`SPARE_ARG_LISTS`] of at most [`SPARE_ARG_CAPACITY`] arguments each; the rest are freed.
/// Several are kept for callers that hold more than one checked launch at a time.
const SPARE_ARG_LISTS: usize = 4;
const SPARE_ARG_CAPACITY: usize = 64;

thread_local! {
    /// Empty vectors only: no argument, so no borrow of `'static` or any other lifetime, is
    /// ever stored here.
    static SPARE_ARGS: std::cell::RefCell<Vec<Vec<Arg<'static>>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// An empty argument vector: a spare of this thread's, else a new one with room for
/// [`INLINE_ARGS`].
#[inline]
pub(crate) fn spare_args<'a>() -> ArgList<'a> {
    let spare = SPARE_ARGS
        .try_with(|s| s.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten();
    match spare {
        Some(v) => relabel(v),
        None => Vec::with_capacity(INLINE_ARGS),
    }
}

/// Keeps `args`, emptied, for a later launch on this thread, or frees it. Never panics (at
/// thread exit the spares may be gone already: then it is freed).
#[inline]
pub(crate) fn recycle_args(mut args: ArgList<'_>) {
    args.clear();
    if args.capacity() == 0 || args.capacity() > SPARE_ARG_CAPACITY {
        return;
    }
    let args = relabel(args);
    let _ = SPARE_ARGS.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut()
            && s.len() < SPARE_ARG_LISTS
        {
            s.push(args);
        }
    });
}

/// The arguments of one launch, gathered one at a time before its check, in a vector reused
/// per thread: [`Stream::check`](crate::Stream::check) (and every launch entry point) takes
/// it as it is, where any other collection of arguments is moved into such a vector one
/// argument at a time (about 100 bytes each). For launchers that convert their arguments
/// into a buffer of their own before launching; `Args::new()` allocates nothing once the
/// thread has launched before.
///
/// ```
/// use tile_launch::{Arg, Args, Scalar};
///
/// let mut args = Args::new();
/// args.push(Scalar::Int(3));
/// args.push(Arg::Scalar(Scalar::Float(0.5)));
/// assert_eq!(args.len(), 2);
/// // stream.launch_queued(&kernel, &config, args)?;
/// ```
pub struct Args<'a> {
    list: ArgList<'a>,
}

impl<'a> Args<'a> {
    /// No arguments yet: a spare vector of this thread's, else a new one with room for
    /// [`INLINE_ARGS`].
    #[inline]
    pub fn new() -> Args<'a> {
        Args { list: spare_args() }
    }

    /// Appends an argument: anything that converts into an [`Arg`] (a [`TensorArg`], an
    /// `Unused` or `Used` tensor, a [`Scalar`], a Rust integer or float).
    #[inline]
    pub fn push(&mut self, arg: impl Into<Arg<'a>>) {
        self.list.push(arg.into());
    }

    /// Removes every argument (an unconsumed tensor is left to its producer; a consumed one
    /// is released: its deleter runs here).
    pub fn clear(&mut self) {
        self.list.clear();
    }

    /// Removes every argument and yields each, in order.
    pub fn drain(&mut self) -> impl Iterator<Item = Arg<'a>> + '_ {
        self.list.drain(..)
    }

    /// Removes and returns the argument at `index`, shifting those after it.
    ///
    /// # Panics
    ///
    /// If `index` is out of bounds.
    pub fn remove(&mut self, index: usize) -> Arg<'a> {
        self.list.remove(index)
    }

    /// Removes and returns the last argument.
    pub fn pop(&mut self) -> Option<Arg<'a>> {
        self.list.pop()
    }
}

/// No arguments and no vector yet (the first [`push`](Args::push) allocates one): what
/// `std::mem::take` leaves behind. [`Args::new`] takes a reused vector.
impl Default for Args<'_> {
    fn default() -> Self {
        Args { list: Vec::new() }
    }
}

impl<'a> std::ops::Deref for Args<'a> {
    type Target = [Arg<'a>];
    fn deref(&self) -> &[Arg<'a>] {
        &self.list
    }
}

impl<'a> std::ops::DerefMut for Args<'a> {
    fn deref_mut(&mut self) -> &mut [Arg<'a>] {
        &mut self.list
    }
}

impl Drop for Args<'_> {
    fn drop(&mut self) {
        recycle_args(std::mem::take(&mut self.list));
    }
}

impl std::fmt::Debug for Args<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("len", &self.list.len())
            .finish()
    }
}

impl<'a, A: Into<Arg<'a>>> Extend<A> for Args<'a> {
    fn extend<I: IntoIterator<Item = A>>(&mut self, iter: I) {
        self.list.extend(iter.into_iter().map(Into::into));
    }
}

impl<'a, A: Into<Arg<'a>>> FromIterator<A> for Args<'a> {
    fn from_iter<I: IntoIterator<Item = A>>(iter: I) -> Self {
        let mut args = Args::new();
        args.extend(iter);
        args
    }
}

/// What a launch entry point takes as its arguments: an [`Args`] (taken as it is), or any
/// collection of [`Arg`] values (`[Arg; N]`, `Vec<Arg>`, an iterator), moved into one. Sealed: not
/// for other types.
pub trait IntoArgs<'a>: sealed::Sealed {
    #[doc(hidden)]
    fn into_arg_list(self) -> ArgList<'a>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Args<'_> {}
    impl<'a, I: IntoIterator<Item = super::Arg<'a>>> Sealed for I {}
}

impl<'a> IntoArgs<'a> for Args<'a> {
    #[inline]
    fn into_arg_list(mut self) -> ArgList<'a> {
        // `self` then drops with an empty vector, which keeps nothing.
        std::mem::take(&mut self.list)
    }
}

impl<'a, I: IntoIterator<Item = Arg<'a>>> IntoArgs<'a> for I {
    #[inline]
    fn into_arg_list(self) -> ArgList<'a> {
        let mut list = spare_args();
        list.extend(self);
        list
    }
}

/// An empty argument vector under another lifetime: its allocation, which the lifetime does
/// not change the layout of.
#[inline(always)]
fn relabel<'b>(mut v: Vec<Arg<'_>>) -> Vec<Arg<'b>> {
    v.clear();
    let mut v = std::mem::ManuallyDrop::new(v);
    let (ptr, cap) = (v.as_mut_ptr(), v.capacity());
    // SAFETY: `v` is empty, so no `Arg` of either lifetime is reinterpreted; `Arg<'_>` and
    // `Arg<'b>` differ only in a lifetime, which has no effect on size or alignment, so the
    // allocation (made by the global allocator for `cap` of them) is one `Vec<Arg<'b>>` may own
    // and free. `ManuallyDrop` keeps `v` from freeing it too.
    unsafe { Vec::from_raw_parts(ptr.cast::<Arg<'b>>(), 0, cap) }
}

/// The 8-byte parameter slots of a launch, one per kernel parameter, in order (an array
/// argument fills `1 + 2 * ndim`), inline up to twice [`INLINE_ARGS`]: three 2-D arrays and a
/// scalar, or three 1-D arrays and seven scalars, allocate nothing.
pub(crate) type ParamValues = SmallVec<[u64; 2 * INLINE_ARGS]>;

#[cfg(any(test, feature = "testing"))]
/// Checks `args` against `signature` exactly as [`Stream::launch`](crate::Stream::launch) does before consuming
/// anything (count, kind, dtype, device `device_ordinal`, writability of outputs, dense
/// row-major layout unless the parameter is strided or an array, scalar range),
/// without a stream or a driver. Nothing is consumed; `Unused` tensors are only peeked at.
///
/// # Errors
///
/// [`Error::ArgumentCount`], [`Error::ArgumentKind`], [`Error::DtypeMismatch`],
/// [`Error::DeviceMismatch`], [`Error::Descriptor`], [`Error::NotContiguous`], each naming the
/// argument index.
pub fn check_args(
    kernel_name: &str,
    signature: &Signature,
    args: &[Arg<'_>],
    device_ordinal: i32,
) -> Result<()> {
    pack_args(kernel_name, signature, args, device_ordinal).map(drop)
}

/// Checks that memory on DLPack device `device` (argument `index`) is usable by a launch on
/// device `ordinal`, the rule every tensor argument of a launch is checked by: device memory
/// (`kDLCUDA`) of that device, or pinned host (`kDLCUDAHost`) or managed (`kDLCUDAManaged`)
/// memory, whatever their device id (DLPack sets it to 0 "for vanilla CPU memory, pinned
/// memory, or managed memory", so it says nothing about the launch device). For a caller that
/// places a tensor's pointer where the launch's own checks do not see it (a descriptor staged
/// in device memory).
///
/// # Errors
///
/// [`Error::DeviceMismatch`] naming `index`, for any other device.
#[inline]
pub fn check_device(index: usize, device: tile_dlpack::Device, ordinal: i32) -> Result<()> {
    use tile_dlpack::ffi::DLDeviceType;
    let ok = match device.device_type {
        DLDeviceType::CUDAHOST | DLDeviceType::CUDAMANAGED => true,
        DLDeviceType::CUDA => device.device_id == ordinal,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Error::DeviceMismatch {
            index,
            tensor: device,
            stream_device: ordinal,
        })
    }
}

/// What [`check_all`] found: the parameter values, and what the launch's guards will hold.
#[derive(Debug)]
pub(crate) struct Found {
    /// One 8-byte slot per kernel parameter ([`ParamValues`]).
    pub values: ParamValues,
    /// Tensor arguments the launch holds (all but [borrowed](TensorArg::borrowed) ones).
    pub tensors: usize,
    /// Bytes only the release queue would keep alive ([`queue_bytes`] of each tensor).
    pub bytes: u64,
}

/// The data pointer of each tensor whose memory a launch may ask the driver about once the
/// other checks have passed (`launch/check.rs`), as [`check_all`] read them from the views it
/// validated (rather than from second views).
pub(crate) type Pointers = SmallVec<[PointerArg; 4]>;

/// A non-empty tensor argument's data pointer, as [`check_all`] found it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PointerArg {
    /// Zero-based argument index.
    pub index: usize,
    /// The tensor's DLPack device (CUDA, CUDA host or CUDA managed: [`check_all`] refuses
    /// every other).
    pub tensor: tile_dlpack::Device,
    /// The tensor's data pointer (`data + byte_offset`).
    pub ptr: u64,
    /// [`TensorArg::trust_memory`].
    pub trusted: bool,
}

#[cfg(any(test, feature = "testing"))]
/// The kernel parameter values a launch of `signature` with `args` passes, one 8-byte slot per
/// kernel parameter (a value narrower than 8 bytes in the slot's low bytes, little-endian; an
/// array parameter is `1 + 2 * ndim` slots), after the same checks as [`check_args`]. Nothing
/// is consumed. For tests and tools that inspect what a kernel receives.
///
/// # Errors
///
/// As [`check_args`], plus [`Error::NdimMismatch`] and [`Error::IndexOverflow`] for array
/// parameters.
pub fn pack_args(
    kernel_name: &str,
    signature: &Signature,
    args: &[Arg<'_>],
    device_ordinal: i32,
) -> Result<Vec<u64>> {
    check_all(
        kernel_name,
        signature,
        args,
        device_ordinal,
        &mut Pointers::new(),
    )
    .map(|f| f.values.into_vec())
}

/// Checks `args` against `signature` on device `ordinal` and packs their values; pushes onto
/// `pointers` each tensor whose memory the launch may ask the driver about.
pub(crate) fn check_all(
    kernel_name: &str,
    signature: &Signature,
    args: &[Arg<'_>],
    ordinal: i32,
    pointers: &mut Pointers,
) -> Result<Found> {
    let params = signature.params();
    if args.len() != params.len() {
        return Err(Error::ArgumentCount {
            kernel: kernel_name.to_owned(),
            expected: params.len(),
            got: args.len(),
        });
    }
    let mut found = Found {
        values: ParamValues::with_capacity(args.len()),
        tensors: 0,
        bytes: 0,
    };
    for (index, (arg, param)) in args.iter().zip(params).enumerate() {
        check_arg(index, arg, param, ordinal, &mut found, pointers)?;
    }
    Ok(found)
}

fn check_arg(
    index: usize,
    arg: &Arg<'_>,
    param: &Param,
    ordinal: i32,
    found: &mut Found,
    pointers: &mut Pointers,
) -> Result<()> {
    let out = &mut found.values;
    // `dense`: a plain pointer parameter, which the kernel indexes densely.
    let (dtype, intent, array, dense) = match (arg, param) {
        (
            Arg::Tensor(_),
            Param::Tensor {
                dtype,
                intent,
                strided,
            },
        ) => (*dtype, *intent, None, !*strided),
        (
            Arg::Tensor(_),
            Param::Array {
                dtype,
                intent,
                ndim,
                index: ty,
                assume,
            },
        ) => (*dtype, *intent, Some((*ndim, *ty, assume)), false),
        (Arg::Scalar(s), Param::Scalar(ty)) => {
            return match s.encode(*ty) {
                Some(value) => {
                    out.push(value);
                    Ok(())
                }
                None => Err(Error::ArgumentKind {
                    index,
                    expected: param.to_string(),
                    got: format!("{s} (wrong type or out of range)"),
                }),
            };
        }
        (Arg::Tensor(_), p) => {
            return Err(Error::ArgumentKind {
                index,
                expected: p.to_string(),
                got: "a tensor".into(),
            });
        }
        (Arg::Scalar(s), p) => {
            return Err(Error::ArgumentKind {
                index,
                expected: p.to_string(),
                got: s.to_string(),
            });
        }
    };
    let Arg::Tensor(t) = arg else {
        unreachable!("only tensor arguments reach here")
    };
    let view = t
        .source
        .view()
        .map_err(|source| Error::Descriptor { index, source })?;
    if view.dtype() != dtype {
        return Err(Error::DtypeMismatch {
            index,
            expected: dtype,
            got: view.dtype(),
        });
    }
    let dev = view.device();
    check_device(index, dev, ordinal)?;
    // Trusted memory on the host or managed is never asked about; an empty tensor has no data.
    if (!t.memory_trusted || dev.device_type == tile_dlpack::ffi::DLDeviceType::CUDA)
        && view.nbytes_spanned() != 0
    {
        pointers.push(PointerArg {
            index,
            tensor: dev,
            ptr: view.data_ptr(),
            trusted: t.memory_trusted,
        });
    }
    if intent.writes() {
        view.check_writable()
            .map_err(|source| Error::Descriptor { index, source })?;
    }
    // A borrowed tensor is never held: it costs the release queue no guard and no bytes.
    if !matches!(t.source, TensorSource::Borrowed(_)) {
        found.tensors += 1;
        found.bytes = found.bytes.saturating_add(queue_bytes(&view));
    }
    if dense && !view.is_contiguous() {
        return Err(Error::NotContiguous {
            index,
            shape: view.shape().to_vec(),
            strides: view.strides().to_vec(),
        });
    }
    match array {
        None => {
            out.push(view.data_ptr());
            Ok(())
        }
        Some((ndim, ty, assume)) => {
            crate::signature::pack(index, &view, ndim, ty, out)?;
            crate::signature::check_assumptions(index, &view, assume).inspect_err(|_| {
                out.truncate(out.len() - (1 + 2 * usize::from(ndim)));
            })
        }
    }
}

#[cfg(test)]
mod spare_tests {
    use super::*;
    use tile_dlpack::testing::{DeleterCount, RawTensor};

    #[test]
    fn a_recycled_argument_vector_is_the_next_one_handed_out_and_is_empty() {
        let mut first = spare_args();
        assert!(first.is_empty());
        assert!(first.capacity() >= INLINE_ARGS);
        first.push(Arg::Scalar(Scalar::Int(7)));
        let at = first.as_ptr() as usize;
        recycle_args(first);
        let again = spare_args();
        assert!(again.is_empty(), "a recycled vector comes back emptied");
        assert_eq!(again.as_ptr() as usize, at, "the same allocation is reused");
        // A second one while the first is out is another allocation.
        let other = spare_args();
        assert_ne!(other.as_ptr() as usize, at);
        recycle_args(other);
        recycle_args(again);
    }

    #[test]
    fn a_large_argument_vector_is_freed_and_the_spares_are_bounded() {
        let big: ArgList<'_> = Vec::with_capacity(SPARE_ARG_CAPACITY + 1);
        let at = big.as_ptr() as usize;
        recycle_args(big);
        let next = spare_args();
        assert_ne!(
            next.as_ptr() as usize,
            at,
            "an oversized vector is not kept"
        );
        recycle_args(next);
        for _ in 0..SPARE_ARG_LISTS + 3 {
            recycle_args(Vec::with_capacity(INLINE_ARGS));
        }
        let kept = SPARE_ARGS.with(|s| s.borrow().len());
        assert_eq!(kept, SPARE_ARG_LISTS);
    }

    fn export() -> (RawTensor, DeleterCount) {
        let spec = tile_dlpack::testing::TensorSpec::new(&[4], tile_dlpack::DType::F32);
        tile_dlpack::testing::counted_raw(&spec)
    }

    #[test]
    fn dropped_arguments_release_consumed_tensors_once_and_leave_the_others_in_a_reused_vector() {
        let (left, left_count) = export();
        let (taken, taken_count) = export();
        let at;
        {
            let scale = 3i64;
            let mut args = Args::new();
            // SAFETY: a fresh export, deleted only below, once its `Unused` is gone.
            args.push(unsafe { left.unused() });
            // SAFETY: a fresh export, deleted only by its `Used`.
            args.push(unsafe { taken.unused() }.consume().unwrap());
            args.push(Scalar::Int(scale.into()));
            at = args.as_ptr() as usize;
            // Handed to a launch entry point as it is: the same vector, its arguments in it.
            let list = args.into_arg_list();
            assert_eq!((list.as_ptr() as usize, list.len()), (at, 3));
            recycle_args(list);
        }
        assert_eq!(
            left_count.get(),
            0,
            "an unconsumed tensor is left to its producer"
        );
        assert_eq!(taken_count.get(), 1, "a consumed tensor is released once");
        // The vector is handed out again, empty, for arguments of another lifetime.
        let again: ArgList<'static> = spare_args();
        assert_eq!((again.as_ptr() as usize, again.len()), (at, 0));
        recycle_args(again);
        // SAFETY: the `Unused` of `left` was dropped without consuming it.
        unsafe { left.delete() };
        assert_eq!((left_count.get(), taken_count.get()), (1, 1));
    }

    #[test]
    fn arguments_dropped_at_thread_exit_are_released_before_or_after_the_spares_are_gone() {
        use std::cell::RefCell;
        thread_local! {
            static PARKED: RefCell<Option<Args<'static>>> = const { RefCell::new(None) };
        }
        for spares_first in [false, true] {
            let (raw, count) = export();
            // SAFETY: a fresh export, deleted only by its `Used`.
            let used = unsafe { raw.unused() }.consume().unwrap();
            std::thread::spawn(move || {
                // Thread-locals are destroyed in the reverse order of their first use: the
                // parked arguments drop while this thread's spares still exist, or after.
                if spares_first {
                    recycle_args(spare_args());
                    PARKED.with(|_| ());
                } else {
                    PARKED.with(|_| ());
                    recycle_args(spare_args());
                }
                let mut args = Args::new();
                args.push(used);
                PARKED.with(|p| *p.borrow_mut() = Some(args));
            })
            .join()
            .unwrap();
            assert_eq!(count.get(), 1, "spares first: {spares_first}");
        }
    }
}
