//! Holding what another launcher's work uses ([`Stream::hold`]): the release queue of tile's own
//! launches, offered to any code that enqueues work on a stream (a kernel launched by cuTile,
//! cuda.core, CuPy, a C++ launcher, a copy, ...) and must keep its inputs alive until that work
//! has finished.

use cuda_sys::driver;
use tile_dlpack::{Taken, Used};

use crate::error::{Error, Result};
use crate::guard::{Guard, spare_guards};
use crate::stream::Stream;
use crate::timeline::LaunchInProgress;

impl Guard {
    /// Any value, held until the work is done and then dropped (on the thread that releases it:
    /// the one that polls, synchronises, launches or holds next, or the graph release thread).
    pub fn owner(value: impl Send + 'static) -> Guard {
        Guard::Owner(Box::new(value))
    }
}

impl From<Used> for Guard {
    fn from(tensor: Used) -> Guard {
        Guard::Tensor(tensor)
    }
}

/// A managed tensor whose deleter duty was handed over, held as it is (nothing of it is read or
/// validated: see [`Taken`]). What a launcher holds for a tensor whose data pointer it read and
/// launched on: unlike consuming it into a [`Used`], which runs the deleter at once when the
/// descriptor does not validate, this never releases early.
impl From<Taken> for Guard {
    fn from(tensor: Taken) -> Guard {
        Guard::Owner(Box::new(tensor))
    }
}

impl From<Box<dyn Send>> for Guard {
    fn from(owner: Box<dyn Send>) -> Guard {
        Guard::Owner(owner)
    }
}

impl Stream {
    /// Keeps `guards` alive until all the work enqueued on this stream up to this call has
    /// completed, then releases them (a consumed tensor's deleter runs once, a held owner is
    /// dropped), without waiting for that work: the guards join the stream's release queue as a
    /// launch's do, and are released once a completion marker recorded after this call has
    /// completed (found by a later launch, hold, [`poll`](Stream::poll),
    /// [`synchronize`](Stream::synchronize) or the stream's drop). As for a launch, the call
    /// waits for older work when the queue is over its bounds
    /// ([`ReleaseConfig`](crate::ReleaseConfig)), and for its own work when it holds more
    /// guards than the queue's guard bound on its own.
    ///
    /// While the stream captures a CUDA graph, the graph owns the guards instead, as it owns a
    /// captured launch's: they are released once the graph, its clones and every executable
    /// graph made from it are destroyed.
    ///
    /// This is what a launcher that is not tile does instead of calling a DLPack deleter as soon
    /// as its launch call returns: enqueue the kernel, then hold the tensor it read the pointer
    /// from, as a [`Taken`] (`Guard::from(taken)`: never validated, so never released early) or
    /// a [`Used`] it already consumed.
    ///
    /// The driver calls: `cuStreamGetCaptureInfo` once; then, as for a launch, an amortised
    /// `cuEventRecord` and `cuEventQuery` (see [`ReleaseConfig`](crate::ReleaseConfig)), or
    /// `cuUserObjectCreate` and `cuGraphRetainUserObject` under capture. Nothing is called for
    /// an empty `guards`.
    ///
    /// # Errors
    ///
    /// [`Error::Driver`] without a driver (the guards are then released at once: no work of
    /// this process can use them); [`Error::Cuda`] if the stream's context cannot be made
    /// current, its capture status cannot be read (an invalidated capture, say), or the graph
    /// refuses the guards (`cuUserObjectCreate`, `cuGraphRetainUserObject`). Then when the work
    /// that uses them completes cannot be known, and the guards are leaked rather than released
    /// early (logged, and counted in [`Stats::guards_leaked`](crate::Stats::guards_leaked)).
    #[doc(alias = "cuStreamGetCaptureInfo")]
    #[doc(alias = "cuUserObjectCreate")]
    pub fn hold(&self, guards: impl IntoIterator<Item = Guard>) -> Result<()> {
        let guards = guards.into_iter();
        let mut held = spare_guards(guards.size_hint().0);
        held.extend(guards);
        if held.is_empty() {
            return Ok(());
        }
        // No driver: nothing of this process ever ran on a GPU, so nothing can use the guards.
        let d = driver()?;
        let site = self.launch_site();
        let tracker = &site.tracker;
        let bytes = held.iter().map(guard_bytes).sum::<u64>();
        let bound = match site.ctx.bind_with(d) {
            Ok(bound) => bound,
            Err(e) => return Err(leak(tracker, held, e.into())),
        };
        let capture = match crate::capture::capturing_graph(d, site.raw) {
            Ok(capture) => capture,
            Err(e) => return Err(leak(tracker, held, e.into())),
        };
        if let Some((graph, _)) = capture {
            // The work that uses the guards is in the graph already: what the graph does not
            // take is leaked (and counted), never released while the graph may run that work.
            let count = |n| tracker.count_leaked(n);
            return crate::capture::attach(
                d,
                graph,
                site.ctx,
                held,
                crate::capture::Refused::Leak(&count),
            )
            .map(drop);
        }
        let _known = LaunchInProgress::enter(tracker.timeline(), &bound);
        tracker.launch_deferred(held, bytes, || Ok::<(), Error>(()))?;
        Ok(())
    }
}

/// The bytes only the release queue keeps alive for a guard, by the launch's rule
/// ([`queue_bytes`](crate::args::queue_bytes)); 0 for an owner, whose size is unknown.
fn guard_bytes(guard: &Guard) -> u64 {
    match guard {
        Guard::Tensor(t) => crate::args::queue_bytes(&t.view()),
        Guard::HandedOff(h) => crate::args::queue_bytes(&h.tensor().view()),
        Guard::Owner(_) => 0,
    }
}

/// Leaks `guards` whose work cannot be known complete (counted in the stream's
/// [`Stats::guards_leaked`](crate::Stats::guards_leaked)), and returns `error`.
fn leak(tracker: &crate::stream::StreamTracker, guards: Vec<Guard>, error: Error) -> Error {
    log::error!(
        "tile-launch hold: {} guard(s) leaked, since when the stream's work completes cannot be \
         known: {error}",
        guards.len()
    );
    tracker.count_leaked(guards.len());
    std::mem::forget(guards);
    error
}
