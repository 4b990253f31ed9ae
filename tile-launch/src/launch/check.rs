//! The check of a launch: everything a launch needs, validated before anything is consumed,
//! and the proof that it was ([`Checked`]).

use std::ffi::c_void;

use cuda_sys::{CUgraph, CUstream, Driver};

use crate::args::{
    Arg, ArgList, Found, IntoArgs, ParamValues, PointerArg, Pointers, TensorSource, check_all,
    recycle_args,
};
use crate::config::{LaunchConfig, ValidConfig};
use crate::context::ContextGuard;
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::library::Kernel;
use crate::stream::{LaunchSite, Stream};

/// A launch that passed every check of [`Stream::check`] (or
/// [`BoundLaunch::check`](crate::BoundLaunch::check)), and the proof that it did: it holds what
/// the checks found (the kernel's parameter values, the bytes only the release queue would keep
/// alive, the capture state) and the stream's context bound on this thread, to which it is tied.
///
/// Nothing is consumed yet. [`Checked::launch`] (into a handle) and [`Checked::launch_queued`]
/// (into the stream's release queue) consume the tensors and enqueue the launch without checking
/// anything again; options are set before ([`Checked::hold`], [`Checked::release_with`],
/// [`Checked::queue_guards`]). Dropping a `Checked` launches nothing: `Unused` tensors go back to
/// their producers untouched; tensors handed over already consumed, and held owners, are
/// released.
///
/// The launch trusts what the check found on this thread: between the check and the launch,
/// the calling thread keeps the stream's context current (the `Checked` binds it) and nobody
/// begins a capture on the stream, or the kernel would be launched in another context, or
/// captured with its tensors in the release queue. The release queue's calls made inside the
/// launch call trust the same findings (`timeline::LaunchInProgress`).
#[must_use = "a checked launch does nothing until it is launched"]
pub struct Checked<'s, 'a> {
    pub(super) site: LaunchSite<'s>,
    pub(super) kernel: &'s Kernel,
    pub(super) config: &'s ValidConfig,
    pub(super) args: ArgList<'a>,
    pub(super) values: ParamValues,
    pub(super) capture: Option<InCapture>,
    /// Tensor arguments the launch holds (each becomes a guard; borrowed ones do not count).
    pub(super) tensors: usize,
    /// Bytes only the release queue would keep alive ([`crate::args::queue_bytes`]).
    pub(super) bytes: u64,
    pub(super) d: &'static Driver,
    /// [`Checked::hold`]'s owners (no allocation while there are none).
    pub(super) owners: Vec<Guard>,
    /// [`Checked::release_with`]'s function.
    pub(super) release: Option<fn(tile_dlpack::Used)>,
    /// [`Checked::queue_guards`].
    pub(super) queue_guards: bool,
    // Declared last: dropped after `args`, so that tensors released on drop see the context.
    pub(super) _bound: ContextGuard<'s>,
}

impl std::fmt::Debug for Checked<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checked")
            .field("kernel", &self.kernel.name())
            .field("args", &self.args.len())
            .field("tensors", &self.tensors)
            .field("queue_bytes", &self.bytes)
            .field("capturing", &self.capture.is_some())
            .finish()
    }
}

impl Drop for Checked<'_, '_> {
    fn drop(&mut self) {
        // Not launched (or launched: then `args` and `owners` are empty), released as a
        // refusal is.
        release_refused(self.d, &mut self.args);
        recycle_args(std::mem::take(&mut self.args));
        if !self.owners.is_empty() {
            let owners = std::mem::take(&mut self.owners);
            self.site.ctx.releasing(|| drop(owners));
        }
    }
}

impl<'a> Checked<'_, 'a> {
    /// The number of tensor arguments the launch holds (each by one guard once launched):
    /// every tensor but the [borrowed](crate::TensorArg::borrowed) ones.
    pub fn tensors(&self) -> usize {
        self.tensors
    }

    /// The bytes only the release queue would keep alive for this launch's tensors: the byte
    /// extent of each export the producer copied for the launch (DLPack `IS_COPIED`).
    pub fn queue_bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the stream is capturing a graph (the launch's guards then go to the graph).
    pub fn is_capturing(&self) -> bool {
        self.capture.is_some()
    }

    /// Whether enqueueing this launch, with its tensors and [held](Checked::hold) owners, may
    /// wait for queued work first: the calling thread's release queue of the stream near its
    /// bounds, or over one with this launch ([`Stream::launch_may_wait`]). Never true for a
    /// capturing stream, whose guards go to the graph. Takes no lock; racy by nature (it
    /// decides, e.g., whether to release an interpreter lock around the launch).
    pub fn may_wait(&self) -> bool {
        let queue = &self.site.tracker;
        self.capture.is_none()
            && (queue.near_bound()
                || queue.would_wait(self.tensors + self.owners.len(), self.bytes))
    }
}

impl Stream {
    /// Checks a launch of `kernel` with `config` and `args` on this stream, consuming nothing,
    /// and returns it [`Checked`], ready to be launched. A failed check consumes nothing:
    /// tensors handed over already consumed are released, `Unused` ones are left to their
    /// producers.
    ///
    /// Checks, in this order: the configuration against the device's limits, every argument
    /// against the kernel's [`Signature`](crate::Signature) (count, kind, dtype, device,
    /// writability of outputs, dense row-major layout for plain pointer parameters, scalar
    /// range), the kernel's own limits for the configuration (dynamic shared memory, cooperative
    /// occupancy), the memory of each tensor (unless [trusted](crate::TensorArg::trust_memory),
    /// the driver must know its data pointer as device, managed or page-locked host memory: one
    /// `cuPointerGetAttributes` per tensor), whether the stream is capturing a graph (one
    /// `cuStreamGetCaptureInfo`), and then that each producer stream joins that capture.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig), [`Error::ArgumentCount`](crate::Error::ArgumentCount), [`Error::ArgumentKind`](crate::Error::ArgumentKind),
    /// [`Error::DtypeMismatch`](crate::Error::DtypeMismatch), [`Error::DeviceMismatch`](crate::Error::DeviceMismatch), [`Error::PointerDeviceMismatch`](crate::Error::PointerDeviceMismatch),
    /// [`Error::NotDeviceMemory`](crate::Error::NotDeviceMemory), [`Error::NotContiguous`](crate::Error::NotContiguous), [`Error::Descriptor`](crate::Error::Descriptor),
    /// [`Error::NdimMismatch`](crate::Error::NdimMismatch), [`Error::IndexOverflow`](crate::Error::IndexOverflow), [`Error::ProducerOutsideCapture`](crate::Error::ProducerOutsideCapture),
    /// and [`Error::Cuda`](crate::Error::Cuda) from a driver call the checks make (e.g.
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
    #[doc(alias = "cuStreamGetCaptureInfo")]
    #[doc(alias = "cuPointerGetAttributes")]
    #[inline]
    pub fn check<'s, 'a>(
        &'s self,
        kernel: &'s Kernel,
        config: &'s LaunchConfig,
        args: impl IntoArgs<'a>,
    ) -> Result<Checked<'s, 'a>> {
        check(self, kernel, Config::ToCheck(config), args)
    }
}

/// The graph the stream is capturing into, and the capture's id.
pub(super) type InCapture = (CUgraph, u64);

/// The configuration of a launch to check.
pub(super) enum Config<'c> {
    /// To check against the device and the kernel ([`Stream::check`]).
    ToCheck(&'c LaunchConfig),
    /// Checked already ([`Stream::bind`]).
    Valid(&'c ValidConfig),
}

/// [`Stream::check`] and [`BoundLaunch::check`](crate::BoundLaunch::check).
#[inline(always)]
pub(super) fn check<'s, 'a>(
    s: &'s Stream,
    kernel: &'s Kernel,
    config: Config<'s>,
    args_in: impl IntoArgs<'a>,
) -> Result<Checked<'s, 'a>> {
    let mut args = args_in.into_arg_list();
    // No driver: nothing was ever handed to CUDA, and nothing can be captured.
    let d = cuda_sys::driver()?;
    let site = s.launch_site();
    let bound = match site.ctx.bind_with(d) {
        Ok(b) => b,
        Err(e) => {
            release_refused(d, &mut args);
            recycle_args(args);
            return Err(e.into());
        }
    };
    match check_bound(&site, d, kernel, config, &args) {
        Ok((config, found, capture)) => Ok(Checked {
            site,
            kernel,
            config,
            args,
            values: found.values,
            capture,
            tensors: found.tensors,
            bytes: found.bytes,
            d,
            owners: Vec::new(),
            release: None,
            queue_guards: false,
            _bound: bound,
        }),
        Err(e) => {
            release_refused(d, &mut args);
            recycle_args(args);
            drop(bound);
            Err(e)
        }
    }
}

/// Releases the tensors of a refused (or dropped) launch that were handed over already
/// consumed, in relaxed capture mode; without such a tensor, makes no driver call.
fn release_refused(d: &Driver, args: &mut ArgList<'_>) {
    let consumed =
        |a: &Arg<'_>| matches!(a, Arg::Tensor(t) if matches!(t.source, TensorSource::Used(_)));
    if !args.iter().any(consumed) {
        return;
    }
    let _ = crate::capture::relaxed(d, || {
        args.clear();
        Ok(())
    });
}

/// The checks of [`Stream::check`], in its documented order, with the stream's context bound.
fn check_bound<'c>(
    site: &LaunchSite<'_>,
    d: &'static Driver,
    kernel: &Kernel,
    config: Config<'c>,
    args: &[Arg<'_>],
) -> Result<(&'c ValidConfig, Found, Option<InCapture>)> {
    let ctx = site.ctx;
    let mut pointers = Pointers::new();
    let mut check_args = || {
        check_all(
            kernel.name(),
            kernel.signature(),
            args,
            ctx.ordinal(),
            &mut pointers,
        )
    };
    let (config, found) = match config {
        Config::ToCheck(config) => {
            let device = config.validate_for(ctx.limits())?;
            let found = check_args()?;
            (device.prepare(kernel, d, ctx)?, found)
        }
        Config::Valid(config) => (config, check_args()?),
    };
    let capture = crate::capture::capturing_graph(d, site.raw)?;
    check_pointer_memory(
        d,
        &pointers,
        ctx.ordinal(),
        site.check_pointer_devices,
        capture.map(|(graph, _)| graph),
    )?;
    if let Some((_, ours)) = capture {
        check_capture_joins(d, site.raw, ours, args)?;
    }
    Ok((config, found, capture))
}

/// While `stream` captures a graph, a tensor whose data is ready on another stream can be
/// ordered only if that stream takes part in the same capture (the wait then joins it into the
/// graph). Waiting on work outside the capture fails (`CUDA_ERROR_STREAM_CAPTURE_ISOLATION`)
/// and invalidates the capture; it would also order the graph's replays after nothing. Such a
/// launch is refused here, before anything is consumed, and the capture is left as it was.
/// `ours` is the id of the capture `stream` is in (from the launch's one capture query).
fn check_capture_joins(
    d: &cuda_sys::Driver,
    stream: CUstream,
    ours: u64,
    args: &[Arg<'_>],
) -> Result<()> {
    for (index, arg) in args.iter().enumerate() {
        let Arg::Tensor(t) = arg else { continue };
        let Some(producer) = t.ready_on.filter(|s| *s != stream) else {
            continue;
        };
        let theirs = match crate::capture::capture_id(d, producer) {
            Ok(id) => id,
            // The legacy stream asked about while a blocking stream captures: not part of it.
            Err(e) if e.code == cuda_sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => None,
            Err(e) => return Err(e.into()),
        };
        if theirs != Some(ours) {
            return Err(Error::ProducerOutsideCapture { index });
        }
    }
    Ok(())
}

/// Checks the memory of every non-empty tensor (`pointers`, as [`check_all`] found them; each
/// is `kDLCUDA`, `kDLCUDAHost` or `kDLCUDAManaged`) before anything is consumed:
///
/// - unless the tensor's memory is trusted ([`TensorArg::trust_memory`](crate::TensorArg::trust_memory)),
///   the driver must know its data pointer as device, managed or page-locked host memory
///   (one `cuPointerGetAttributes`), else [`Error::NotDeviceMemory`]: plain host memory
///   labelled as device memory would make the kernel fault and poison the context. Device
///   memory of another device than `ordinal` is [`Error::PointerDeviceMismatch`]. While the
///   stream is `capturing`, a pointer the driver does not know is let through: memory that an
///   allocation node of the capture allocates has no backing until the graph runs;
/// - a trusted `kDLCUDA` tensor is checked against `ordinal` only when `devices` is set
///   (`cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); a pointer the
///   driver does not know is then let through (the descriptor's device was checked). Pinned
///   host memory is usable from every device and managed memory migrates, so neither is asked
///   about there ([`check_all`] leaves them out).
fn check_pointer_memory(
    d: &cuda_sys::Driver,
    pointers: &[PointerArg],
    ordinal: i32,
    devices: bool,
    capture: Option<cuda_sys::CUgraph>,
) -> Result<()> {
    for &PointerArg {
        index,
        tensor,
        ptr,
        trusted,
    } in pointers
    {
        if trusted && !devices {
            continue;
        }
        if !trusted {
            let Some(memory) = crate::context::memory_of_pointer_with(d, ptr) else {
                // Memory a graph allocates (an allocation node of the capture in progress) has
                // no backing the driver can describe until the graph runs: it is told from host
                // memory by the capture's own allocation nodes.
                if let Some(graph) = capture
                    && crate::capture::graph_allocates(d, graph, ptr, 0)?
                {
                    continue;
                }
                return Err(Error::NotDeviceMemory {
                    index,
                    tensor,
                    address: ptr,
                });
            };
            if memory.kind == crate::MemoryKind::Device
                && let Some(on) = memory.device
                && on != ordinal
            {
                return Err(Error::PointerDeviceMismatch {
                    index,
                    tensor,
                    pointer_device: on,
                    stream_device: ordinal,
                });
            }
            continue;
        }
        let mut on: std::ffi::c_int = -1;
        // SAFETY: the out-pointer is a local `int`, the size this attribute writes; the driver
        // answers for any address.
        let r = unsafe {
            (d.cuPointerGetAttribute)(
                (&raw mut on).cast::<c_void>(),
                cuda_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                ptr,
            )
        };
        if r != cuda_sys::CUresult::CUDA_SUCCESS {
            log::debug!(
                "argument {index}: cuPointerGetAttribute(DEVICE_ORDINAL) returned {r:?}; the \
                 descriptor's device is trusted"
            );
            continue;
        }
        if on != ordinal {
            return Err(Error::PointerDeviceMismatch {
                index,
                tensor,
                pointer_device: on,
                stream_device: ordinal,
            });
        }
    }
    Ok(())
}
