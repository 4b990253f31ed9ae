//! The handle of one launch: it owns the launch's guards until they are released.

use std::fmt;
use std::mem::{self, ManuallyDrop};
use std::ops::Deref;
use std::sync::Arc;

use super::state::Held;
use super::tracker::Tracker;
use super::{RetireError, Timeline};

/// What retiring a launch released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retired {
    /// Guards of this launch that were released (all of them).
    pub released: usize,
    /// Guards of queued (deferred) launches that were found complete and released by the same
    /// call.
    pub deferred_released: usize,
}

impl Retired {
    /// Nothing released (e.g. a launch captured into a graph, which owns its guards).
    pub(crate) fn nothing() -> Retired {
        Retired {
            released: 0,
            deferred_released: 0,
        }
    }

    /// A [`Queued`] launch of `own` guards retired by a call that released `total` guards:
    /// its own count as released (now, or by an earlier call that saw the work complete; or,
    /// for a launch whose guards exceeded the guard bound on their own, leaked by a failed wait
    /// inside the launch, which [`Stats::guards_leaked`](super::Stats::guards_leaked) counts).
    pub(crate) fn queued(own: usize, total: usize) -> Retired {
        Retired {
            released: own,
            deferred_released: total.saturating_sub(own),
        }
    }
}

/// The launch a [`Pending`] or [`Queued`] handle refers to: its stream's tracker and its
/// sequence number there. Both handles dereference to it.
pub struct Launched<T: Timeline, G: Send + 'static> {
    tracker: Arc<Tracker<T, G>>,
    seq: u64,
}

impl<T: Timeline, G: Send + 'static> Clone for Launched<T, G> {
    fn clone(&self) -> Self {
        Self {
            tracker: Arc::clone(&self.tracker),
            seq: self.seq,
        }
    }
}

impl<T: Timeline, G: Send + 'static> fmt::Debug for Launched<T, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launched").field("seq", &self.seq).finish()
    }
}

impl<T: Timeline, G: Send + 'static> Launched<T, G> {
    /// The launch's sequence number on its stream (0 for the first successful launch; launch
    /// order).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The tracker of the launch's stream.
    pub fn tracker(&self) -> &Arc<Tracker<T, G>> {
        &self.tracker
    }

    /// Whether the launched work has completed, without blocking: queries the oldest marker
    /// covering the launch, recording one if none does (`cuEventQuery`, `cuEventRecord`).
    ///
    /// # Errors
    ///
    /// When recording or querying fails. The handle is unaffected.
    #[doc(alias = "cuEventQuery")]
    pub fn is_complete(&self) -> Result<bool, T::Error> {
        self.tracker.query(self.seq)
    }
}

impl<T: Timeline, G: Send + 'static> Deref for Pending<T, G> {
    type Target = Launched<T, G>;

    fn deref(&self) -> &Launched<T, G> {
        &self.launch
    }
}

impl<T: Timeline, G: Send + 'static> Deref for Queued<T, G> {
    type Target = Launched<T, G>;

    fn deref(&self) -> &Launched<T, G> {
        &self.launch
    }
}

/// The work of one launch on a [`Tracker`]'s stream and the guards it keeps alive: the core of
/// a `LaunchHandle`.
///
/// Retire it with [`retire`](Pending::retire) (wait, then release),
/// [`try_retire`](Pending::try_retire) (release only if complete) or
/// [`defer`](Pending::defer) (hand the guards to the tracker's queue). Dropping an unretired
/// handle blocks until the work is done, then releases; if that wait fails, the guards are
/// leaked and the error goes to the tracker's sticky slot. A handle with no guards is dropped
/// without waiting (it keeps nothing alive).
///
/// `mem::forget` leaks the guards (they are never dropped), and keeps the tracker alive; it
/// never releases anything early.
#[must_use = "a launch's tensors stay alive until it is retired, deferred or dropped (Drop blocks \
              until the GPU work is done)"]
pub struct Pending<T: Timeline, G: Send + 'static> {
    launch: Launched<T, G>,
    bytes: u64,
    /// Empty once taken; never dropped implicitly.
    guards: Held<G>,
    /// Whether the guards are still ours to release (not yet retired, deferred or leaked).
    live: bool,
}

impl<T: Timeline, G: Send + 'static> fmt::Debug for Pending<T, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("seq", &self.launch.seq)
            .field("guards", &self.guards.len())
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl<T: Timeline, G: Send + 'static> Pending<T, G> {
    pub(super) fn new(tracker: Arc<Tracker<T, G>>, seq: u64, guards: Held<G>, bytes: u64) -> Self {
        Self {
            launch: Launched { tracker, seq },
            bytes,
            guards,
            live: true,
        }
    }

    /// The bytes passed to [`Tracker::launch`].
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The guards, in argument order.
    pub fn guards(&self) -> &[G] {
        &self.guards
    }

    /// Blocks until the launched work has completed (waits for a marker covering it, recording
    /// one if none does, or synchronises the stream if recording fails), then releases the
    /// queued launches known complete and this launch's guards, in launch order (this launch's
    /// in argument order).
    ///
    /// # Errors
    ///
    /// [`RetireError`] when completion could not be confirmed (the wait failed, or recording
    /// and the stream synchronisation both failed). The guards are then **leaked** — never
    /// released, counted in [`Stats::guards_leaked`](super::Stats::guards_leaked) — because the work may still
    /// be using them. (Handing the handle back instead would only invite a retry that, for the
    /// sticky context errors that make a wait fail, fails the same way.)
    #[doc(alias = "cuEventSynchronize")]
    pub fn retire(mut self) -> Result<Retired, RetireError<T::Error>> {
        let guards = self.take();
        match self
            .launch
            .tracker
            .wait_and_release(self.launch.seq, guards, self.bytes)
        {
            Ok((released, deferred_released)) => Ok(Retired {
                released,
                deferred_released,
            }),
            Err(e) => {
                log::error!("tile-launch release queue: {e}: {}", e.source);
                Err(e)
            }
        }
    }

    /// Releases as [`retire`](Pending::retire) does if the launched work has completed, and
    /// gives the handle back otherwise. Never blocks.
    ///
    /// # Errors
    ///
    /// The handle itself, when the work has not completed or completion could not be
    /// determined (that error goes to the tracker's sticky slot,
    /// [`Tracker::last_error`]).
    pub fn try_retire(mut self) -> Result<Retired, Self> {
        match self.launch.tracker.query(self.launch.seq) {
            Ok(true) => {
                let guards = self.take();
                let (released, deferred_released) =
                    self.launch
                        .tracker
                        .release_completed(self.launch.seq, guards, self.bytes);
                Ok(Retired {
                    released,
                    deferred_released,
                })
            }
            Ok(false) => Err(self),
            Err(e) => {
                self.launch
                    .tracker
                    .note_error(e, format_args!("try_retire of launch #{}", self.launch.seq));
                Err(self)
            }
        }
    }

    /// Hands the guards to the tracker's queue and returns: they are released once a later
    /// [`launch`](Tracker::launch), `defer`, [`poll`](Tracker::poll),
    /// [`synchronize`](Tracker::synchronize) or [`shutdown`](Tracker::shutdown) sees the work
    /// complete.
    ///
    /// Blocks only when the queue is over its bounds ([`ReleaseConfig`](super::ReleaseConfig)):
    /// it then waits for the oldest queued work first (possibly this launch's own).
    pub fn defer(mut self) {
        let guards = self.take();
        if guards.is_empty() {
            self.launch.tracker.unhold_empty(self.bytes);
        } else {
            self.launch
                .tracker
                .defer(self.launch.seq, guards, self.bytes);
        }
    }

    /// Takes the guards out, so that `Drop` has nothing left to do.
    fn take(&mut self) -> Held<G> {
        self.live = false;
        ManuallyDrop::new(mem::take(&mut *self.guards))
    }
}

impl<T: Timeline, G: Send + 'static> Drop for Pending<T, G> {
    /// Blocks until the launched work has completed, then releases (as
    /// [`retire`](Pending::retire)). If completion cannot be confirmed, leaks the guards, counts
    /// them, stores the error in the tracker's sticky slot and logs it. Never releases early.
    fn drop(&mut self) {
        if !self.live {
            return;
        }
        let guards = self.take();
        let (seq, bytes) = (self.launch.seq, self.bytes);
        if guards.is_empty() {
            self.launch.tracker.unhold_empty(bytes);
            return;
        }
        if let Err(e) = self.launch.tracker.wait_and_release(seq, guards, bytes) {
            let n = e.leaked;
            self.launch.tracker.note_error(
                e.into_error(),
                format_args!("dropping the handle of launch #{seq}; leaked its {n} guard(s)"),
            );
        }
    }
}

/// A launch whose guards went straight to the tracker's queue
/// ([`Tracker::launch_queued`]): it owns nothing, so dropping it does nothing, and it can still
/// tell whether the launch completed, or wait for it. Cheaper than a [`Pending`] that is
/// deferred (one lock of the tracker instead of two, and nothing to hand over at the end).
#[derive(Clone)]
pub struct Queued<T: Timeline, G: Send + 'static> {
    launch: Launched<T, G>,
    guards: usize,
}

impl<T: Timeline, G: Send + 'static> fmt::Debug for Queued<T, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queued")
            .field("seq", &self.launch.seq)
            .field("guards", &self.guards)
            .finish()
    }
}

impl<T: Timeline, G: Send + 'static> Queued<T, G> {
    /// How many guards the launch queued.
    pub fn guards(&self) -> usize {
        self.guards
    }

    /// Blocks until the launched work has completed, then releases every queued launch known
    /// complete (this one among them, unless an earlier call released it already), in launch
    /// order, and waits until another thread that took this launch's guards off the queue has
    /// finished dropping them (see [`Tracker::synchronize`] for the one exception: a call from
    /// inside a guard's drop). Returns how many guards this call released.
    ///
    /// # Errors
    ///
    /// [`RetireError`] when completion could not be confirmed: as for [`Pending::retire`], this
    /// launch's guards are then **leaked** (taken off the queue, never released, counted in
    /// [`Stats::guards_leaked`](super::Stats::guards_leaked)), since the work may still be using
    /// them and the sticky context errors that make a wait fail make every later one fail too.
    /// Other queued launches stay queued.
    #[doc(alias = "cuEventSynchronize")]
    pub fn wait(&self) -> Result<usize, RetireError<T::Error>> {
        match self.launch.tracker.wait_for(self.launch.seq) {
            Ok(()) => {
                let released = self.launch.tracker.release_known_complete();
                self.launch.tracker.settle(Some(self.launch.seq));
                Ok(released)
            }
            Err(source) => {
                let leaked = self.launch.tracker.leak_queued(self.launch.seq);
                let e = RetireError {
                    seq: self.launch.seq,
                    leaked,
                    source,
                };
                log::error!("tile-launch release queue: {e}: {}", e.source);
                Err(e)
            }
        }
    }

    /// Releases as [`wait`](Queued::wait) does if the work has completed; `None` if it has not,
    /// or if another thread that took this launch's guards off the queue is still dropping
    /// them (what this call released is released all the same). Never blocks.
    ///
    /// # Errors
    ///
    /// When recording or querying a marker fails.
    pub fn try_release(&self) -> Result<Option<usize>, T::Error> {
        if self.launch.tracker.query(self.launch.seq)? {
            let released = self.launch.tracker.release_known_complete();
            if self.launch.tracker.releasing_elsewhere(self.launch.seq) {
                return Ok(None);
            }
            Ok(Some(released))
        } else {
            Ok(None)
        }
    }
}

/// Launching through a tracker makes the handle; this half of the tracker's interface lives
/// with the handle, so that the tracker never needs to know the handle's type.
impl<T: Timeline, G: Send + 'static> Tracker<T, G> {
    /// Launches: runs `enqueue` (the actual kernel launch) with the tracker's lock held, so that
    /// launch order on the stream is sequence order, and returns the handle that owns `guards`
    /// until the launched work has completed.
    ///
    /// - `guards`: what the launch keeps alive (one per consumed tensor, in argument order).
    /// - `bytes`: the memory only these guards keep alive (no other owner holds it), in bytes,
    ///   counted against [`ReleaseConfig::max_pending_bytes`](super::ReleaseConfig::max_pending_bytes)
    ///   while the launch is queued; 0 when the caller keeps every tensor alive itself.
    ///
    /// Before `enqueue`, if the queue plus these guards would exceed a bound, waits for the
    /// oldest queued work and releases it (a wait that fails leaks the entry it waited for, and
    /// stores the error in the sticky slot). After a successful `enqueue`: the launch gets the
    /// next sequence number; a marker is recorded if the queue holds launches no marker covers
    /// and [`ReleaseConfig::marker_every`](super::ReleaseConfig::marker_every) launches happened since the last one; completed
    /// markers are queried (never waited for) and the queued launches they cover released.
    ///
    /// `enqueue` must not call back into this tracker (it runs with the lock held). If it
    /// panics, the guards are queued as if the launch had been enqueued (released once a later
    /// marker completes) and the panic is resumed.
    ///
    /// # Errors
    ///
    /// `enqueue`'s error. Nothing was enqueued then, so `guards` are released before this
    /// returns and no sequence number is used.
    ///
    /// # Panics
    ///
    /// Resumes `enqueue`'s panic, after queueing the guards (see above).
    pub fn launch<E>(
        self: &Arc<Self>,
        guards: Vec<G>,
        bytes: u64,
        enqueue: impl FnOnce() -> Result<(), E>,
    ) -> Result<Pending<T, G>, E> {
        let (seq, guards) = self.launch_locked(guards, bytes, false, enqueue)?;
        Ok(Pending::new(Arc::clone(self), seq, guards, bytes))
    }

    /// As [`launch`](Tracker::launch) followed by [`Pending::defer`], taking the lock once
    /// instead of twice and making no handle: the guards go straight to the queue. Returns the
    /// launch's sequence number.
    ///
    /// Guards that exceed the guard bound on their own are handled as `defer` handles them:
    /// waited for and released before this returns. Bytes never make a launch wait for itself.
    ///
    /// # Errors
    ///
    /// As [`launch`](Tracker::launch).
    ///
    /// # Panics
    ///
    /// As [`launch`](Tracker::launch).
    #[inline]
    pub fn launch_deferred<E>(
        self: &Arc<Self>,
        guards: Vec<G>,
        bytes: u64,
        enqueue: impl FnOnce() -> Result<(), E>,
    ) -> Result<u64, E> {
        if self.too_many_guards(guards.len()) {
            let pending = self.launch(guards, bytes, enqueue)?;
            let seq = pending.seq();
            pending.defer();
            return Ok(seq);
        }
        self.launch_locked(guards, bytes, true, enqueue)
            .map(|(seq, _)| seq)
    }

    /// As [`launch_deferred`](Tracker::launch_deferred), returning a [`Queued`] that can tell
    /// whether the launch completed, or wait for it.
    ///
    /// # Errors
    ///
    /// As [`launch`](Tracker::launch).
    pub fn launch_queued<E>(
        self: &Arc<Self>,
        guards: Vec<G>,
        bytes: u64,
        enqueue: impl FnOnce() -> Result<(), E>,
    ) -> Result<Queued<T, G>, E> {
        let n = guards.len();
        let seq = self.launch_deferred(guards, bytes, enqueue)?;
        Ok(Queued {
            launch: Launched {
                tracker: Arc::clone(self),
                seq,
            },
            guards: n,
        })
    }
}
