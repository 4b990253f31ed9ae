//! The handle that owns what a launch keeps alive until its work is done ([`LaunchHandle`]).

use std::fmt;

use crate::error::{Error, Result};
use crate::guard::Guard;
use crate::release::{Pending, Queued, Retired};
use crate::timeline::CudaTimeline;

/// The work of one launch and everything it keeps alive.
///
/// It must be retired: [`retire`](LaunchHandle::retire) waits and releases,
/// [`try_retire`](LaunchHandle::try_retire) releases only if the work is done,
/// [`defer`](LaunchHandle::defer) hands the tensors to the stream's release queue (released
/// at later launches, [`Stream::poll`](crate::Stream::poll), [`Stream::synchronize`](crate::Stream::synchronize) or when the stream is dropped).
/// Dropping an unretired handle blocks until the work is done, then releases: never earlier.
/// (A handle of a launch made with [`Checked::queue_guards`](crate::Checked::queue_guards)
/// owns nothing, its tensors being on the release queue: dropping it does nothing.)
/// `mem::forget` leaks the tensors; it never frees them early.
///
/// A launch made while the stream was capturing a CUDA graph ([`is_captured`](Self::is_captured))
/// owns nothing: its tensors belong to the graph (through a CUDA user object) and are released
/// when the last graph, clone or executable graph holding them is destroyed. For such a handle
/// `retire`, `try_retire` and `defer` return at once having released nothing, dropping it does
/// not block, and [`is_complete`](Self::is_complete) is an error ([`Error::CapturedLaunch`]).
#[must_use = "the launch's tensors stay alive until the handle is retired, deferred or dropped \
              (dropping blocks until the GPU work is done)"]
pub struct LaunchHandle {
    pub(crate) inner: HandleInner,
}

/// What a handle owns.
pub(crate) enum HandleInner {
    /// On the stream's release queue.
    Tracked(Pending<CudaTimeline, Guard>),
    /// Its guards went straight to the stream's release queue
    /// ([`Checked::queue_guards`](crate::Checked::queue_guards)): the handle owns
    /// nothing, and can wait for the launch or ask about it.
    Queued(Queued<CudaTimeline, Guard>),
    /// Captured into a graph, which owns this many guards.
    Captured { guards: usize },
}

impl fmt::Debug for LaunchHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("LaunchHandle");
        match &self.inner {
            HandleInner::Tracked(p) => d.field("seq", &p.seq()),
            HandleInner::Queued(q) => d.field("queued_seq", &q.seq()),
            HandleInner::Captured { guards } => d.field("captured_guards", guards),
        }
        .finish()
    }
}

impl LaunchHandle {
    /// Whether the launch was captured into a CUDA graph (its tensors then belong to the graph).
    pub fn is_captured(&self) -> bool {
        matches!(self.inner, HandleInner::Captured { .. })
    }

    /// Whether the launched work has completed (`cuEventQuery`; records an event if none covers
    /// this launch yet).
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the query fails (e.g. the context is poisoned by a kernel fault, or
    /// the stream captures a graph now, so that no event can be recorded on it:
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`); [`Error::CapturedLaunch`] for a captured
    /// launch, which has no single completion.
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool> {
        match &self.inner {
            HandleInner::Tracked(p) => Ok(p.is_complete()?),
            HandleInner::Queued(q) => Ok(q.is_complete()?),
            HandleInner::Captured { .. } => Err(Error::CapturedLaunch),
        }
    }

    /// Blocks until the work is done (`cuEventSynchronize`), then releases this launch's
    /// tensors, and any deferred tensors of earlier launches, in launch order. A captured
    /// launch returns at once, having released nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Cuda`] if the wait fails. The tensors are then leaked, never released, since
    /// their work may still be running; the stream's [`stats`](crate::Stream::stats) count them. While
    /// the stream captures a graph no event can be recorded on it, so waiting for a launch that
    /// no earlier event covers fails (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and leaks: defer
    /// handles during capture instead.
    #[doc(alias = "cuEventSynchronize")]
    pub fn retire(self) -> Result<Retired> {
        match self.inner {
            HandleInner::Tracked(p) => p.retire().map_err(|e| Error::Cuda(e.into_error())),
            HandleInner::Queued(q) => {
                let total = q.wait().map_err(|e| Error::Cuda(e.into_error()))?;
                Ok(Retired::queued(q.guards(), total))
            }
            HandleInner::Captured { .. } => Ok(Retired::nothing()),
        }
    }

    /// Releases the tensors if the work is done, else gives the handle back. A captured launch
    /// returns `Ok` at once, having released nothing.
    pub fn try_retire(self) -> Result<Retired, LaunchHandle> {
        match self.inner {
            HandleInner::Tracked(p) => p.try_retire().map_err(|pending| LaunchHandle {
                inner: HandleInner::Tracked(pending),
            }),
            HandleInner::Queued(q) => match q.try_release() {
                Ok(Some(total)) => Ok(Retired::queued(q.guards(), total)),
                Ok(None) => Err(LaunchHandle {
                    inner: HandleInner::Queued(q),
                }),
                Err(e) => {
                    log::error!("tile-launch: try_retire of queued launch #{}: {e}", q.seq());
                    Err(LaunchHandle {
                        inner: HandleInner::Queued(q),
                    })
                }
            },
            HandleInner::Captured { .. } => Ok(Retired::nothing()),
        }
    }

    /// Hands the tensors to the stream's release queue and returns at once (a captured launch
    /// has nothing to hand over).
    pub fn defer(self) {
        match self.inner {
            HandleInner::Tracked(p) => p.defer(),
            HandleInner::Queued(_) | HandleInner::Captured { .. } => {}
        }
    }
}
