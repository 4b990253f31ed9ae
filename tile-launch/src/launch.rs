//! The launch path: [`Stream::launch`] and its variants, the checks that need the driver
//! (pointer devices, capture joins), consuming, ordering after producers, and enqueueing.

use std::ffi::c_void;

use cuda_sys::{CUfunction, CUlaunchConfig, CUstream, CuResultExt};
use smallvec::SmallVec;
use tile_dlpack::Used;

use crate::args::{Arg, INLINE_ARGS, TensorSource, check_all, queue_bytes};
use crate::config::{LaunchConfig, launch_attributes};
use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::handle::{HandleInner, LaunchHandle};
use crate::module::Kernel;
use crate::stream::Stream;

impl Stream {
    /// Launches `kernel` on this stream (`cuLaunchKernelEx`).
    ///
    /// Every argument is checked against the kernel's [`Signature`](crate::Signature) (count,
    /// kind, dtype, device, writability of outputs, dense row-major layout for plain pointer
    /// parameters, scalar range) and the configuration against the device's limits before any
    /// tensor is consumed; so is each tensor's memory: unless it is
    /// [trusted](crate::TensorArg::trust_memory), the driver must know its data pointer as
    /// device, managed or page-locked host memory (one `cuPointerGetAttributes` per tensor).
    /// Nothing is consumed or launched when a check fails. Then the tensors are consumed, the stream is made to wait for the streams
    /// their data is ready on, and the kernel is launched. The returned handle owns the tensors
    /// until the work is done.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`], [`Error::ArgumentCount`], [`Error::ArgumentKind`],
    /// [`Error::DtypeMismatch`], [`Error::DeviceMismatch`], [`Error::PointerDeviceMismatch`],
    /// [`Error::NotDeviceMemory`], [`Error::NotContiguous`], [`Error::Descriptor`] from the
    /// checks (nothing consumed, nothing launched);
    /// [`Error::Cuda`] from a driver call made by the checks (e.g.
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` when the stream's capture was invalidated: nothing
    /// consumed), or if a wait or the launch fails (the consumed tensors are released before the
    /// error returns, since nothing was enqueued that uses them; for a capturing stream, they are
    /// released with the graph).
    ///
    /// # Capture
    ///
    /// One `cuStreamGetCaptureInfo` per launch tells whether the stream is capturing a graph.
    /// If it is, the tensors are handed to the graph (see [`capture`](crate::capture)) and the
    /// handle owns nothing ([`LaunchHandle::is_captured`]).
    #[doc(alias = "cuLaunchKernelEx")]
    #[doc(alias = "cuStreamGetCaptureInfo")]
    pub fn launch<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<LaunchHandle> {
        self.launch_with(kernel, config, args, |_, used| Guard::Tensor(used), [])
    }

    /// As [`Stream::launch`] followed by [`LaunchHandle::defer`], in one step: the tensors go
    /// straight to the stream's release queue (one lock round trip instead of two, and no
    /// handle). For a caller that never waits for this launch in particular; the tensors are
    /// released once a later launch, [`Stream::poll`], [`Stream::synchronize`] or the stream's
    /// drop sees the work complete.
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`].
    #[doc(alias = "cuLaunchKernel")]
    pub fn launch_deferred<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<()> {
        self.launch_core(
            kernel,
            config,
            args,
            |_, used| Guard::Tensor(used),
            [],
            Keep::Deferred,
            false,
        )
        .map(drop)
    }

    /// As [`Stream::launch`], for callers that must control how each consumed tensor is held
    /// and released (e.g. a Python binding whose deleters must run with the interpreter
    /// attached), or that must keep more values alive until the work is done.
    ///
    /// `guard(index, used)` is called once for each tensor argument, in argument order, at the
    /// moment it is consumed (after every check has passed), and returns what the launch holds
    /// for it; a caller can tell from these calls which arguments were consumed when an error
    /// comes back. `owners` are held, like the tensors' guards, until the launched work has
    /// completed (dropped at once on an error before the launch was enqueued).
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`].
    #[doc(alias = "cuLaunchKernelEx")]
    pub fn launch_with<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
        guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
    ) -> Result<LaunchHandle> {
        self.launch_core(kernel, config, args, guard, owners, Keep::Handle, false)
            .map(|handle| handle.expect("a launch that is not deferred returns its handle"))
    }

    /// As [`Stream::launch_with`], but the tensors go straight to the stream's release queue,
    /// as with [`Stream::launch_deferred`]: the returned handle owns nothing. Its
    /// [`retire`](LaunchHandle::retire) waits for the launch and then releases every queued
    /// launch known complete, [`try_retire`](LaunchHandle::try_retire) and
    /// [`is_complete`](LaunchHandle::is_complete) ask without blocking, and dropping it does
    /// nothing (the queue releases the tensors once a later call sees the work complete). One
    /// lock of the release queue per launch instead of two for a handle that is deferred.
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`].
    #[doc(alias = "cuLaunchKernel")]
    pub fn launch_queued_with<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
        guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
    ) -> Result<LaunchHandle> {
        self.launch_core(kernel, config, args, guard, owners, Keep::Queued, false)
            .map(|handle| handle.expect("a queued launch returns its handle"))
    }

    /// The launch path: `keep` says what holds the guards and whether a handle is returned.
    /// With `bound`, the configuration was checked and the
    /// kernel prepared for it by [`Stream::bind`], and neither is done again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_core<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
        mut guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
        keep: Keep,
        bound: bool,
    ) -> Result<Option<LaunchHandle>> {
        let ctx = self.context();
        if !bound {
            config.validate(ctx.limits())?;
        }
        let mut args: SmallVec<[Arg<'a>; INLINE_ARGS]> = {
            let mut v = SmallVec::new();
            for a in args {
                v.push(a);
            }
            v
        };
        // 1. Check everything without consuming anything: the arguments, the kernel's own
        //    limits on this device, the tensors' memory, and whether the stream is capturing.
        let mut values = check_all(kernel.name(), kernel.signature(), &args, ctx.ordinal())?;
        let d = cuda_sys::driver()?;
        let _bound = ctx.bind_with(d)?;
        if !bound && (config.shared_mem_bytes > 0 || config.cooperative) {
            kernel.prepare_launch(d, ctx, config)?;
        }
        let capture = crate::capture_state::capturing_graph(d, self.raw())?;
        check_pointer_memory(
            d,
            &args,
            ctx.ordinal(),
            self.checks_pointer_devices(),
            capture.is_some(),
        )?;
        if let Some((_, ours)) = capture
            && let Err(e) = check_capture_joins(d, self.raw(), ours, &args)
        {
            // Tensors handed over already consumed are released here (nothing uses them); their
            // deleters must not disturb the capture in progress on this thread.
            let _ = crate::capture_state::relaxed(d, || {
                drop(std::mem::take(&mut args));
                Ok(())
            });
            return Err(e);
        }
        // 2. Consume. A failure here releases what was consumed so far (nothing is launched).
        let tensors = args.iter().filter(|a| matches!(a, Arg::Tensor(_))).count();
        let mut guards = Vec::new();
        if tensors > 0 {
            guards.reserve_exact(tensors);
        }
        let mut waits: SmallVec<[CUstream; 4]> = SmallVec::new();
        let mut bytes = 0u64;
        // `drain` moves one argument at a time out of the inline buffer instead of moving the
        // whole buffer into an iterator (arguments are about 100 bytes each).
        for (index, arg) in args.drain(..).enumerate() {
            let Arg::Tensor(t) = arg else { continue };
            let used = match t.source {
                TensorSource::Unused(u) => u
                    .consume()
                    .map_err(|source| Error::Descriptor { index, source })?,
                TensorSource::Used(u) => u,
            };
            bytes = bytes.saturating_add(queue_bytes(&used.view()));
            guards.push(guard(index, used));
            if let Some(s) = t.ready_on.filter(|s| *s != self.raw())
                && !waits.contains(&s)
            {
                waits.push(s);
            }
        }
        guards.extend(owners);
        // 3. Parameters: one 8-byte slot per kernel parameter (an array argument fills
        //    `1 + 2 * ndim`), pointed to by the parameter array.
        let mut ptrs: SmallVec<[*mut c_void; INLINE_ARGS]> = values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        // 4. Order after the producers, then launch, on the calling thread's release queue
        //    (looked up once). The context is bound and `waits` holds only other streams: wait
        //    directly rather than through `wait_for_raw`, which would check and bind both again.
        let tracker = self.tracker_here();
        for s in waits {
            // SAFETY: `TensorArg::ready_on`'s contract: `s` is a valid stream of this context,
            // which is bound.
            unsafe { tracker.timeline().wait_for(s) }?;
        }
        let mut attrs = launch_attributes(config);
        let cfg = CUlaunchConfig {
            gridDimX: config.grid.x,
            gridDimY: config.grid.y,
            gridDimZ: config.grid.z,
            blockDimX: config.block.x,
            blockDimY: config.block.y,
            blockDimZ: config.block.z,
            sharedMemBytes: config.shared_mem_bytes,
            hStream: self.raw(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        let mut enqueue = || {
            if cfg.numAttrs == 0 {
                // No launch attributes: the plain entry point, measurably cheaper than the Ex
                // one.
                // SAFETY: as for `cuLaunchKernelEx` below; a `CUkernel` may be passed where a
                // `CUfunction` is expected (CUDA 12.0 and later).
                unsafe {
                    (d.cuLaunchKernel)(
                        kernel.raw() as CUfunction,
                        config.grid.x,
                        config.grid.y,
                        config.grid.z,
                        config.block.x,
                        config.block.y,
                        config.block.z,
                        config.shared_mem_bytes,
                        self.raw(),
                        ptrs.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
                .check("cuLaunchKernel")
            } else {
                // SAFETY: `cfg` points at live attributes; `ptrs` has one pointer per declared
                // parameter, each to an 8-byte slot holding a value of the declared size
                // (checked against `cuKernelGetParamInfo` when the kernel was loaded); the
                // tensors the pointers address are owned by `guards` (or by the graph being
                // captured) until the launched work completes.
                unsafe {
                    (d.cuLaunchKernelEx)(
                        &cfg,
                        kernel.raw() as CUfunction,
                        ptrs.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
                .check("cuLaunchKernelEx")
            }
        };
        if let Some((graph, _)) = capture {
            // The graph owns the guards before the kernel node exists. If the launch then fails,
            // they are released with the graph (a failed launch invalidates the capture, and
            // ending it destroys the graph).
            let guards = crate::capture::attach(d, graph, ctx, guards)?;
            enqueue()?;
            return Ok((keep != Keep::Deferred).then_some(LaunchHandle {
                inner: HandleInner::Captured { guards },
            }));
        }
        match keep {
            Keep::Deferred => {
                tracker.launch_deferred(guards, bytes, enqueue)?;
                Ok(None)
            }
            Keep::Queued => {
                let queued = tracker.launch_queued(guards, bytes, enqueue)?;
                Ok(Some(LaunchHandle {
                    inner: HandleInner::Queued(queued),
                }))
            }
            Keep::Handle => {
                let pending = tracker.launch(guards, bytes, enqueue)?;
                Ok(Some(LaunchHandle {
                    inner: HandleInner::Tracked(pending),
                }))
            }
        }
    }
}

/// What holds a launch's guards until its work is done.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Keep {
    /// The returned handle ([`HandleInner::Tracked`]).
    Handle,
    /// The release queue; no handle is returned.
    Deferred,
    /// The release queue; the returned handle can wait for the launch ([`HandleInner::Queued`]).
    Queued,
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
        let theirs = match crate::capture_state::capture_id(d, producer) {
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

/// Checks the memory of every non-empty CUDA-accessible tensor (`kDLCUDA`, `kDLCUDAHost`,
/// `kDLCUDAManaged`) before anything is consumed:
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
///   about there.
fn check_pointer_memory(
    d: &cuda_sys::Driver,
    args: &[Arg<'_>],
    ordinal: i32,
    devices: bool,
    capturing: bool,
) -> Result<()> {
    use tile_dlpack::ffi::DLDeviceType;
    for (index, arg) in args.iter().enumerate() {
        let Arg::Tensor(t) = arg else { continue };
        if t.memory_trusted && !devices {
            continue;
        }
        let view = match &t.source {
            TensorSource::Unused(u) => u
                .peek()
                .map_err(|source| Error::Descriptor { index, source })?,
            TensorSource::Used(u) => u.view(),
        };
        let tensor = view.device();
        let accessible = matches!(
            tensor.device_type,
            DLDeviceType::CUDA | DLDeviceType::CUDAHOST | DLDeviceType::CUDAMANAGED
        );
        if !accessible || view.nbytes_spanned() == 0 {
            continue;
        }
        if !t.memory_trusted {
            let Some(memory) = crate::context::memory_of_pointer_with(d, view.data_ptr()) else {
                if capturing {
                    // Memory a graph allocates (an allocation node of the capture in progress)
                    // has no backing the driver can describe until the graph runs.
                    continue;
                }
                return Err(Error::NotDeviceMemory {
                    index,
                    tensor,
                    address: view.data_ptr(),
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
        if tensor.device_type != DLDeviceType::CUDA {
            continue;
        }
        let mut on: std::ffi::c_int = -1;
        // SAFETY: the out-pointer is a local `int`, the size this attribute writes; the driver
        // answers for any address.
        let r = unsafe {
            (d.cuPointerGetAttribute)(
                (&raw mut on).cast::<c_void>(),
                cuda_sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                view.data_ptr(),
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
