//! The enqueue: [`Stream::launch`] and its variants, and what a [`Checked`] launch does once
//! checked (`check.rs`): consuming, ordering after producers, and enqueueing.

use std::ffi::c_void;

use cuda_sys::{CUfunction, CUlaunchConfig, CUstream, CuResultExt};
use smallvec::SmallVec;
use tile_dlpack::Used;

use crate::args::{Arg, INLINE_ARGS, TensorSource};
use crate::check::Checked;
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
    /// error returns, since nothing was enqueued that uses them, as a finished launch's are: with
    /// the stream's context current and the capture mode relaxed; for a capturing stream, they
    /// are released with the graph).
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

    /// The launch path: [`Stream::check_inner`], then [`Checked::enqueue`]. `keep` says what
    /// holds the guards and whether a handle is returned. With `bound`, the configuration was
    /// checked and the kernel prepared for it by [`Stream::bind`], and neither is done again.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn launch_core<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
        guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
        keep: Keep,
        bound: bool,
    ) -> Result<Option<LaunchHandle>> {
        self.check_inner(kernel, config, args, bound)?
            .enqueue(guard, owners, keep)
    }
}

impl Checked<'_, '_> {
    /// Consumes the tensors and launches, as [`Stream::launch`] does after its checks: the
    /// returned handle owns the tensors until the work is done.
    ///
    /// # Errors
    ///
    /// [`Error::Descriptor`] if a tensor's deleter-owning export cannot be taken over (see
    /// [`Unused::consume`](tile_dlpack::Unused::consume); what was consumed is released), and
    /// [`Error::Cuda`] if a wait or the launch fails (the consumed tensors are released, since
    /// nothing was enqueued that uses them, with the stream's context current and the capture
    /// mode relaxed; for a capturing stream, they are released with the graph).
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch(self) -> Result<LaunchHandle> {
        self.launch_with(|_, used| Guard::Tensor(used), [])
    }

    /// As [`Stream::launch_with`], after the checks: `guard(index, used)` is called once per
    /// tensor argument, in argument order, as it is consumed; `owners` are held until the work
    /// is done.
    ///
    /// # Errors
    ///
    /// As [`Checked::launch`].
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch_with(
        self,
        guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
    ) -> Result<LaunchHandle> {
        self.enqueue(guard, owners, Keep::Handle)
            .map(|handle| handle.expect("a launch that is not deferred returns its handle"))
    }

    /// As [`Stream::launch_queued_with`], after the checks: the guards go straight to the
    /// stream's release queue and the returned handle owns nothing.
    ///
    /// # Errors
    ///
    /// As [`Checked::launch`].
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch_queued_with(
        self,
        guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
    ) -> Result<LaunchHandle> {
        self.enqueue(guard, owners, Keep::Queued)
            .map(|handle| handle.expect("a queued launch returns its handle"))
    }

    /// As [`Stream::launch_deferred`], after the checks: the tensors go to the stream's
    /// release queue, and no handle is returned.
    ///
    /// # Errors
    ///
    /// As [`Checked::launch`].
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch_deferred(self) -> Result<()> {
        self.enqueue(|_, used| Guard::Tensor(used), [], Keep::Deferred)
            .map(drop)
    }

    /// Consumes, orders and enqueues; checks nothing (the [`Checked`] proves it was checked).
    #[inline(always)]
    pub(crate) fn enqueue(
        mut self,
        mut guard: impl FnMut(usize, Used) -> Guard,
        owners: impl IntoIterator<Item = Guard>,
        keep: Keep,
    ) -> Result<Option<LaunchHandle>> {
        let (s, kernel, config, d) = (self.stream, self.kernel, self.config, self.d);
        let ctx = s.context();
        let capture = self.capture;
        // 1. Consume. A failure here releases what was consumed so far (nothing is launched).
        let mut guards = Vec::new();
        if self.tensors > 0 {
            guards.reserve_exact(self.tensors);
        }
        let mut waits: SmallVec<[CUstream; 4]> = SmallVec::new();
        // `drain` moves one argument at a time out of the inline buffer instead of moving the
        // whole buffer into an iterator (arguments are about 100 bytes each).
        for (index, arg) in self.args.drain(..).enumerate() {
            let Arg::Tensor(t) = arg else { continue };
            let used = match t.source {
                TensorSource::Unused(u) => match u.consume() {
                    Ok(used) => Some(used),
                    Err(source) => {
                        release_taken(ctx, guards);
                        return Err(Error::Descriptor { index, source });
                    }
                },
                TensorSource::Used(u) => Some(u),
                // Its owner keeps the memory alive; nothing is held or released here.
                TensorSource::Borrowed(_) => None,
            };
            if let Some(used) = used {
                guards.push(guard(index, used));
            }
            if let Some(p) = t.ready_on.filter(|p| *p != s.raw())
                && !waits.contains(&p)
            {
                waits.push(p);
            }
        }
        guards.extend(owners);
        let bytes = self.bytes;
        // 2. Parameters: one 8-byte slot per kernel parameter (an array argument fills
        //    `1 + 2 * ndim`), pointed to by the parameter array.
        let mut ptrs: SmallVec<[*mut c_void; INLINE_ARGS]> = self
            .values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        // 3. Order after the producers, then launch, on the calling thread's release queue
        //    (looked up once). The context is bound and `waits` holds only other streams: wait
        //    directly rather than through `wait_for_raw`, which would check and bind both again.
        let tracker = s.tracker_here();
        for p in waits {
            // SAFETY: `TensorArg::ready_on`'s contract: `p` is a valid stream of this context,
            // which is bound.
            if let Err(e) = unsafe { tracker.timeline().wait_for(p) } {
                release_taken(ctx, guards);
                return Err(e.into());
            }
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
            hStream: s.raw(),
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
                        s.raw(),
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
            let guards = if guards.is_empty() {
                0 // nothing for the graph to own: no user object
            } else {
                crate::capture::attach(d, graph, ctx, guards)?
            };
            enqueue()?;
            return Ok((keep != Keep::Deferred).then_some(LaunchHandle {
                inner: HandleInner::Captured { guards },
            }));
        }
        match keep {
            // Nothing to hold (scalars and borrowed tensors only) and no handle: no release
            // queue, no completion marker.
            Keep::Deferred if guards.is_empty() => {
                drop(guards);
                enqueue()?;
                Ok(None)
            }
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

/// Releases what a launch refused after consuming took (its guards: consumed tensors, owners),
/// as a finished launch's are released: with the stream's context current and the capture mode
/// relaxed ([`Context::releasing`]), so that a deleter that frees memory cannot invalidate
/// another thread's global-mode capture.
fn release_taken(ctx: &crate::Context, guards: Vec<Guard>) {
    if !guards.is_empty() {
        ctx.releasing(|| drop(guards));
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
