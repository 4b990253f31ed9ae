//! The enqueue: what a [`Checked`] launch does once checked, consuming the tensors, ordering the
//! launch after their producers and handing it to the driver.

use std::ffi::c_void;

use cuda_sys::{
    CUfunction, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
    CUstream, CuResultExt,
};
use smallvec::SmallVec;
use tile_dlpack::Used;

use super::check::Checked;
use super::handle::{HandleInner, LaunchHandle};
use crate::args::{Arg, INLINE_ARGS, IntoArgs, TensorSource};
use crate::config::LaunchConfig;
use crate::error::{Error, Result};
use crate::guard::{Guard, HandOff, spare_guards};
use crate::library::Kernel;
use crate::stream::Stream;
use crate::timeline::LaunchInProgress;

impl<'a> Checked<'_, 'a> {
    /// Option: `owners` are held with the launch's tensors until its work is done (e.g. the
    /// Python objects a tensor's memory depends on), and released after them. Released at once,
    /// as the tensors are, if the launch is refused or the `Checked` dropped after this.
    ///
    /// Options are set in place (`checked.hold(o).release_with(f)`), so that the checked
    /// launch (a few hundred bytes) is not moved for each.
    pub fn hold(&mut self, owners: impl IntoIterator<Item = Guard>) -> &mut Self {
        self.owners.extend(owners);
        self
    }

    /// Option: each consumed tensor is released through `release` (which then owns it, and
    /// must keep it alive at least as long) instead of dropped where the release queue drops it
    /// (for example handed to a thread that may run its deleter). No allocation per tensor
    /// ([`Guard::HandedOff`]).
    pub fn release_with(&mut self, release: fn(Used)) -> &mut Self {
        self.release = Some(release);
        self
    }

    /// Option for [`Checked::launch`]: the launch's guards go straight to the stream's release
    /// queue, and the returned handle owns nothing; it can still wait for the launch
    /// ([`LaunchHandle::retire`], [`LaunchHandle::is_complete`]), and dropping it does nothing.
    /// One lock of the release queue per launch, instead of two for a handle that is later
    /// dropped or deferred.
    pub fn queue_guards(&mut self) -> &mut Self {
        self.queue_guards = true;
        self
    }

    /// Consumes the tensors, orders the launch after their producers and launches
    /// (`cuLaunchKernel`, or `cuLaunchKernelEx` with launch attributes), checking nothing again.
    /// The returned handle owns the tensors (and the [held](Checked::hold) owners) until the
    /// work is done, unless [`Checked::queue_guards`] was set. While the stream captures a
    /// graph, they are handed to the graph instead ([`LaunchHandle::is_captured`]).
    ///
    /// # Errors
    ///
    /// [`Error::Descriptor`] if a tensor's export cannot be taken over (only a producer that
    /// changed its version field since the check can cause this), and [`Error::Cuda`] if a wait
    /// or the launch fails. Either way every tensor was consumed and is released before the error
    /// returns (for a capturing stream, with the graph).
    #[doc(alias = "cuLaunchKernel")]
    #[doc(alias = "cuLaunchKernelEx")]
    #[inline]
    pub fn launch(self) -> Result<LaunchHandle> {
        let keep = if self.queue_guards {
            Keep::Queued
        } else {
            Keep::Handle
        };
        self.enqueue(keep)
            .map(|handle| handle.expect("a launch into a handle returns its handle"))
    }

    /// As [`Checked::launch`], with no handle: the launch's guards go straight to the stream's
    /// release queue, and are released once a later launch,
    /// [`Stream::poll`](crate::Stream::poll), [`Stream::synchronize`](crate::Stream::synchronize)
    /// or the stream's drop sees the work complete. A launch that holds nothing (scalars and
    /// [borrowed](crate::TensorArg::borrowed) tensors only) does not touch the queue.
    ///
    /// # Errors
    ///
    /// As [`Checked::launch`].
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch_queued(self) -> Result<()> {
        self.enqueue(Keep::Deferred).map(drop)
    }

    /// Consumes, orders and enqueues; checks nothing (the [`Checked`] proves it was checked).
    #[inline(always)]
    fn enqueue(mut self, keep: Keep) -> Result<Option<LaunchHandle>> {
        let (kernel, config, d) = (self.kernel, self.config, self.d);
        let (ctx, raw) = (self.site.ctx, self.site.raw);
        let capture = self.capture;
        // 1. Consume every tensor. A failure (only possible for a descriptor changed since it
        //    was checked) is reported once all of them are consumed, and releases them all:
        //    nothing is launched, and every tensor is then consumed whatever the outcome.
        let mut owners = std::mem::take(&mut self.owners);
        let mut guards = spare_guards(self.tensors + owners.len());
        let release = self.release;
        let mut waits: SmallVec<[CUstream; 4]> = SmallVec::new();
        let mut refused = None;
        // `drain` moves one argument at a time out of the vector, which then goes back to this
        // thread's spares when the `Checked` drops.
        for (index, arg) in self.args.drain(..).enumerate() {
            let Arg::Tensor(t) = arg else { continue };
            if let Some(p) = t.ready_on.filter(|p| *p != raw)
                && !waits.contains(&p)
            {
                waits.push(p);
            }
            let used = match t.source {
                TensorSource::Used(u) => u,
                TensorSource::Unused(u) => match u.consume() {
                    Ok(used) => used,
                    Err(source) => {
                        refused.get_or_insert(Error::Descriptor { index, source });
                        continue;
                    }
                },
                // Its owner keeps the memory alive; nothing is held or released here.
                TensorSource::Borrowed(_) => continue,
            };
            guards.push(match release {
                Some(f) => Guard::HandedOff(HandOff::new(used, f)),
                None => Guard::Tensor(used),
            });
        }
        guards.append(&mut owners);
        if let Some(e) = refused {
            release_taken(ctx, guards);
            return Err(e);
        }
        let bytes = self.bytes;
        // 2. Parameters: one 8-byte slot per kernel parameter (an array argument fills
        //    `1 + 2 * ndim`), pointed to by the parameter array, inline for as many slots as
        //    `ParamValues` holds inline (three 1-D arrays fill 9).
        let mut ptrs: SmallVec<[*mut c_void; 2 * INLINE_ARGS]> = self
            .values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        // 3. Order after the producers, then launch, on the calling thread's release queue.
        //    The context is bound and `waits` holds only other streams: wait directly rather
        //    than through `wait_for_raw`, which would check and bind both again.
        let tracker = &self.site.tracker;
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
            hStream: raw,
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
                        raw,
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
                crate::capture::attach(d, graph, ctx, guards, crate::capture::Refused::Release)?
            };
            enqueue()?;
            return Ok((keep != Keep::Deferred).then_some(LaunchHandle {
                inner: HandleInner::Captured { guards },
            }));
        }
        // Nothing to hold (scalars and borrowed tensors only) and no handle: no release queue,
        // no completion marker.
        if keep == Keep::Deferred && guards.is_empty() {
            drop(guards);
            enqueue()?;
            return Ok(None);
        }
        // Not capturing, the context bound by the check: the release queue's calls below (the
        // amortised marker, the poll, the release) need not ask either again. A launch that
        // holds nothing does not pay for the scope (a thread-local's two accesses, which cost
        // most in a shared library): the release queue's calls it happens to make ask as they
        // do outside a launch.
        let _known =
            (!guards.is_empty()).then(|| LaunchInProgress::enter(tracker.timeline(), &self._bound));
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

impl Stream {
    /// Launches `kernel` on this stream: [`Stream::check`], then [`Checked::launch`]. The
    /// returned handle owns the consumed tensors until the work is done.
    ///
    /// # Errors
    ///
    /// Those of [`Stream::check`] (nothing consumed, nothing launched) and of
    /// [`Checked::launch`] (every tensor consumed and released).
    ///
    /// # Capture
    ///
    /// On a stream capturing a graph, the tensors are handed to the graph (see
    /// [`capture`](crate::capture)) and the handle owns nothing.
    #[doc(alias = "cuLaunchKernel")]
    #[doc(alias = "cuLaunchKernelEx")]
    #[inline]
    pub fn launch<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoArgs<'a>,
    ) -> Result<LaunchHandle> {
        self.check(kernel, config, args)?.launch()
    }

    /// As [`Stream::launch`], with no handle: the tensors go straight to the stream's release
    /// queue ([`Checked::launch_queued`]).
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`].
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch_queued<'a>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: impl IntoArgs<'a>,
    ) -> Result<()> {
        self.check(kernel, config, args)?.launch_queued()
    }
}

/// The launch attributes `config` sets (`cuLaunchKernelEx`); none for a plain launch.
#[inline]
fn launch_attributes(config: &LaunchConfig) -> SmallVec<[CUlaunchAttribute; 3]> {
    let mut attrs = SmallVec::new();
    let mut push = |id: CUlaunchAttributeID, set: &dyn Fn(&mut CUlaunchAttributeValue)| {
        // SAFETY: `CUlaunchAttribute` is a plain C struct for which all-zero bytes are valid.
        let mut a: CUlaunchAttribute = unsafe { std::mem::zeroed() };
        a.id = id;
        set(&mut a.value);
        attrs.push(a);
    };
    if let Some(c) = config.cluster {
        push(
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            &|v| {
                // Assigning to a union field is safe; this selects the member the id names.
                v.clusterDim.x = c.x;
                v.clusterDim.y = c.y;
                v.clusterDim.z = c.z;
            },
        );
    }
    if config.cooperative {
        push(CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, &|v| {
            v.cooperative = 1
        });
    }
    if config.programmatic_dependent_launch {
        push(
            CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            &|v| v.programmaticStreamSerializationAllowed = 1,
        );
    }
    attrs
}

/// Releases what a launch refused after consuming took (its guards), as a finished launch's are
/// released ([`Context::releasing`](crate::Context::releasing)).
fn release_taken(ctx: &crate::Context, guards: Vec<Guard>) {
    if !guards.is_empty() {
        ctx.releasing(|| drop(guards));
    }
}

/// What holds a launch's guards until its work is done.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keep {
    /// The returned handle ([`HandleInner::Tracked`]).
    Handle,
    /// The release queue; no handle is returned.
    Deferred,
    /// The release queue; the returned handle can wait for the launch ([`HandleInner::Queued`]).
    Queued,
}
