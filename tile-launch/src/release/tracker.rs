//! The per-stream tracker: sequence numbers, completion markers, the queue of deferred launches,
//! its bounds, and the one place where guards are dropped.

use std::collections::VecDeque;
use std::fmt;
use std::mem::{self, ManuallyDrop};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use std::ops::{Deref, DerefMut};

use super::state::{Batch, Deferred, Held, MarkerSlot, State};
use super::{CompletionError, ReleaseConfig, RetireError, Stats, Timeline};

use crate::sync::{self, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

// How many release batches this thread is dropping guards of, nested (a guard's drop that
// releases in turn), on any tracker. A barrier called here does not wait for batches in flight:
// this thread's own would never finish ([`Tracker::settle`]). Under loom, a thread-local of
// loom's model threads.
#[cfg(not(loom))]
std::thread_local! {
    static RELEASING: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}
#[cfg(loom)]
loom::thread_local! {
    static RELEASING: std::cell::Cell<u32> = std::cell::Cell::new(0);
}

/// Counts this thread as releasing while it lives.
struct InRelease;

impl InRelease {
    fn enter() -> InRelease {
        RELEASING.with(|r| r.set(r.get() + 1));
        InRelease
    }
}

impl Drop for InRelease {
    fn drop(&mut self) {
        RELEASING.with(|r| r.set(r.get() - 1));
    }
}

/// Whether this thread is dropping the guards of a release batch (inside a deleter).
fn in_release() -> bool {
    RELEASING.with(|r| r.get() > 0)
}

/// The release queue of one stream. Shared as `Arc<Tracker>`: every [`Pending`](super::Pending) handle holds a
/// clone, so the tracker outlives its handles.
///
/// `T` is the stream's [`Timeline`]; `G` the guard type (dropping a guard releases a tensor).
/// See the [module documentation](super) for the model and the guarantees.
///
/// Dropping the tracker (when the last `Arc` goes) runs [`shutdown`](Tracker::shutdown) if
/// anything is still queued.
pub struct Tracker<T: Timeline, G: Send + 'static> {
    timeline: T,
    config: ReleaseConfig,
    /// [`ReleaseConfig::max_pending_bytes`], resolved against the device when created.
    max_pending_bytes: u64,
    state: Mutex<State<T, G>>,
    /// Signalled when a release batch finishes while a barrier waits ([`Tracker::settle`]).
    settled: Condvar,
    released: AtomicU64,
    leaked: AtomicU64,
    release_panics: AtomicU64,
    /// Guards and bytes queued when the lock was last let go ([`near_bound`](Tracker::near_bound)
    /// and [`would_wait`](Tracker::would_wait) without taking the lock).
    queued_guards: AtomicUsize,
    queued_bytes: AtomicU64,
    /// Where each released launch's emptied guard vector goes ([`Tracker::recycle_with`]); none:
    /// it is freed.
    recycle: Option<fn(Vec<G>)>,
}

/// The tracker's lock held. Letting go of it publishes how much the queue holds.
struct Locked<'a, T: Timeline, G: Send + 'static> {
    st: MutexGuard<'a, State<T, G>>,
    tracker: &'a Tracker<T, G>,
}

impl<T: Timeline, G: Send + 'static> Deref for Locked<'_, T, G> {
    type Target = State<T, G>;
    fn deref(&self) -> &State<T, G> {
        &self.st
    }
}

impl<T: Timeline, G: Send + 'static> DerefMut for Locked<'_, T, G> {
    fn deref_mut(&mut self) -> &mut State<T, G> {
        &mut self.st
    }
}

impl<T: Timeline, G: Send + 'static> Drop for Locked<'_, T, G> {
    fn drop(&mut self) {
        // Published under the lock (this runs before the guard's own drop).
        let t = self.tracker;
        t.queued_guards
            .store(self.st.deferred_guards, Ordering::Relaxed);
        t.queued_bytes
            .store(self.st.deferred_bytes, Ordering::Relaxed);
    }
}

impl<T: Timeline, G: Send + 'static> fmt::Debug for Tracker<T, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracker")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// What a wait must wait for.
enum Target {
    /// The launch with this sequence number (a marker already covering it will do).
    Launch(u64),
    /// All work enqueued on the stream so far, tracked or not (always a fresh marker).
    Everything,
}

impl<T: Timeline, G: Send + 'static> Tracker<T, G> {
    /// Creates the tracker of the stream that `timeline` observes.
    ///
    /// A [`PendingBytes::ShareOfDevice`](super::PendingBytes::ShareOfDevice) bound is resolved
    /// here, once, against [`Timeline::device_memory`].
    pub fn new(timeline: T, config: ReleaseConfig) -> Arc<Self> {
        Self::build(timeline, config, None)
    }

    /// As [`Tracker::new`], and each launch's guard vector, once its guards are released, is
    /// handed to `recycle` empty (its buffer kept) instead of being freed, so that the launching
    /// side can reuse it for a later launch rather than allocate one per launch. `recycle` runs
    /// on the releasing thread, without the tracker's lock; it must not panic.
    pub fn recycle_with(timeline: T, config: ReleaseConfig, recycle: fn(Vec<G>)) -> Arc<Self> {
        Self::build(timeline, config, Some(recycle))
    }

    fn build(timeline: T, config: ReleaseConfig, recycle: Option<fn(Vec<G>)>) -> Arc<Self> {
        let max_pending_bytes = config.max_pending_bytes.resolve(timeline.device_memory());
        Arc::new(Self {
            timeline,
            config,
            max_pending_bytes,
            state: Mutex::new(State {
                next_seq: 0,
                completed_through: 0,
                launches_since_marker: 0,
                launches_since_poll: 0,
                markers: VecDeque::new(),
                orphans: Vec::new(),
                spare_markers: Vec::new(),
                deferred: Deferred::new(),
                deferred_guards: 0,
                deferred_bytes: 0,
                held_guards: 0,
                held_bytes: 0,
                launches: 0,
                markers_recorded: 0,
                error: None,
                errors: 0,
                releasing: Vec::new(),
                next_batch: 0,
                barrier_waiters: 0,
                spare_batch: Vec::new(),
            }),
            settled: Condvar::new(),
            released: AtomicU64::new(0),
            leaked: AtomicU64::new(0),
            release_panics: AtomicU64::new(0),
            queued_guards: AtomicUsize::new(0),
            queued_bytes: AtomicU64::new(0),
            recycle,
        })
    }

    /// The stream's timeline.
    pub fn timeline(&self) -> &T {
        &self.timeline
    }

    /// The configuration the tracker was created with.
    pub fn config(&self) -> ReleaseConfig {
        self.config
    }

    /// The bound on the bytes the queue alone keeps alive, in bytes
    /// ([`ReleaseConfig::max_pending_bytes`] resolved against the device).
    pub fn max_pending_bytes(&self) -> u64 {
        self.max_pending_bytes
    }

    /// Whether the queue holds at least half of a bound (guards, or bytes once it holds any):
    /// a later launch or `defer` may soon have to wait for queued work. Takes no lock: it reads
    /// what the last holder of the lock published when letting go, so it is as racy as any
    /// answer about a queue that other threads fill and drain (a hint, e.g. for whether to
    /// release an interpreter lock around a launch).
    pub fn near_bound(&self) -> bool {
        let (guards, bytes) = self.queued();
        guards.saturating_mul(2) >= self.config.max_pending_guards
            || (bytes > 0 && bytes.saturating_mul(2) >= self.max_pending_bytes)
    }

    /// Whether a launch or `defer` of `guards` guards adding `bytes` bytes would wait for
    /// queued work first (the queue plus it over a bound, or its guards over the guard bound on
    /// their own), judged from what the queue held when its lock was last let go: as racy as
    /// [`near_bound`](Tracker::near_bound), and takes no lock either.
    pub fn would_wait(&self, guards: usize, bytes: u64) -> bool {
        let (queued_guards, queued_bytes) = self.queued();
        let queued = queued_guards > 0 || queued_bytes > 0;
        self.too_many_guards(guards)
            || (queued
                && (queued_guards.saturating_add(guards) > self.config.max_pending_guards
                    || (bytes > 0
                        && queued_bytes > 0
                        && queued_bytes.saturating_add(bytes) > self.max_pending_bytes)))
    }

    fn queued(&self) -> (usize, u64) {
        (
            self.queued_guards.load(Ordering::Relaxed),
            self.queued_bytes.load(Ordering::Relaxed),
        )
    }

    /// Whether one launch of `guards` guards exceeds the guard bound on its own (it is then
    /// waited for when deferred). Bytes never make a launch wait for its own work.
    pub(super) fn too_many_guards(&self, guards: usize) -> bool {
        guards > self.config.max_pending_guards
    }

    fn lock(&self) -> Locked<'_, T, G> {
        Locked {
            st: sync::lock(&self.state),
            tracker: self,
        }
    }

    /// The body of [`launch`](Tracker::launch) and [`launch_deferred`](Tracker::launch_deferred):
    /// returns the sequence number and the guards, or, with `defer`, queues the guards and
    /// returns none.
    pub(super) fn launch_locked<E>(
        &self,
        guards: Vec<G>,
        bytes: u64,
        defer: bool,
        enqueue: impl FnOnce() -> Result<(), E>,
    ) -> Result<(u64, Held<G>), E> {
        let guards: Held<G> = ManuallyDrop::new(guards);
        let n = guards.len();
        let mut st = self.lock();
        if self.over_bound(&st, n, bytes) {
            st = self.make_room(st, n, bytes);
        }
        match panic::catch_unwind(AssertUnwindSafe(enqueue)) {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                drop(st);
                self.release_batch(Batch::unregistered(vec![guards]));
                return Err(error);
            }
            Err(payload) => {
                // We cannot know whether the work was enqueued: treat it as if it was.
                let seq = st.next_seq;
                st.next_seq += 1;
                st.insert_deferred(seq, guards, bytes);
                drop(st);
                log::error!(
                    "tile-launch release queue: enqueue of launch #{seq} panicked; its {n} guard(s) \
                     are queued until a later marker completes"
                );
                panic::resume_unwind(payload);
            }
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.launches += 1;
        st.launches_since_marker = st.launches_since_marker.saturating_add(1);
        let guards = if !defer {
            st.held_guards += n;
            st.held_bytes = st.held_bytes.saturating_add(bytes);
            guards
        } else {
            if n > 0 {
                st.insert_deferred(seq, guards, bytes);
            } else {
                drop(ManuallyDrop::into_inner(guards)); // empty: frees only its buffer
            }
            ManuallyDrop::new(Vec::new())
        };
        if self.timeline.thread_bound() {
            // Later waits, polls and releases may come from threads where the stream cannot be
            // named: cover this launch now, on the launching thread.
            if let Err(e) = self.record_at_launch_locked(&mut st) {
                self.note_or_abandon(
                    &mut st,
                    e,
                    format_args!("recording the marker of launch #{seq}"),
                );
            }
        } else {
            self.maybe_record(&mut st);
        }
        st.launches_since_poll = st.launches_since_poll.saturating_add(1);
        if st.launches_since_poll >= self.poll_period() {
            st.launches_since_poll = 0;
            self.poll_if_worth_it(&mut st);
        }
        // Most launches find nothing completed: they skip taking an empty batch.
        let batch = st.has_completed().then(|| st.take_completed(None));
        drop(st);
        if let Some(batch) = batch {
            self.release_batch(batch);
        }
        Ok((seq, guards))
    }

    /// Releases the queued launches that have completed, without blocking: records a marker if
    /// the queue holds launches no marker covers, then queries markers oldest first
    /// (`cuEventQuery`). Returns how many guards were released.
    ///
    /// Errors (of `record` or `query`) go to the sticky slot ([`last_error`](Tracker::last_error));
    /// what was not confirmed complete stays queued, unless the error says the stream is lost
    /// ([`Timeline::is_lost`]): then everything queued is leaked and counted, once, and later
    /// polls find nothing to ask about. A timeline that cannot name its stream from here
    /// ([`Timeline::reachable_here`]) is only queried, never recorded on.
    #[doc(alias = "cuEventQuery")]
    pub fn poll(&self) -> usize {
        let mut st = self.lock();
        if st.has_uncovered()
            && self.timeline.reachable_here()
            && self.timeline.can_record_now()
            && let Err(e) = self.record_locked(&mut st)
        {
            self.note_or_abandon(
                &mut st,
                e,
                format_args!("recording a completion marker in poll"),
            );
        }
        if let Err(e) = self.poll_locked(&mut st) {
            self.note_or_abandon(
                &mut st,
                e,
                format_args!("querying a completion marker in poll"),
            );
        }
        let batch = st.take_completed(None);
        drop(st);
        self.release_batch(batch)
    }

    /// Blocks until all work enqueued on the stream so far has completed (a fresh marker and a
    /// wait for it; if the marker cannot be recorded, [`Timeline::synchronize`]), then releases
    /// every queued launch that is then known complete, and waits until every release another
    /// thread took before that has finished dropping its guards (a barrier: on return, no guard
    /// of work completed before the call is left undropped; the [module documentation](super)
    /// says the one exception: a call from inside a guard's drop).
    ///
    /// # Errors
    ///
    /// The wait's error, or the synchronisation's when recording failed too (the record error is
    /// logged), counted in [`Stats::errors`]. Nothing is released then; the queue keeps its
    /// entries, unless the error says the stream is lost ([`Timeline::is_lost`]): then every
    /// queued guard is leaked (counted) and the queue is left empty.
    #[doc(alias = "cuStreamSynchronize")]
    #[doc(alias = "cuEventSynchronize")]
    pub fn synchronize(&self) -> Result<(), T::Error> {
        let Err(e) = self.synchronize_uncounted() else {
            return Ok(());
        };
        let mut st = self.lock();
        if self.timeline.is_lost(&e) {
            self.abandon(&mut st, e.clone(), format_args!("synchronize"));
        } else {
            st.errors += 1;
        }
        Err(e)
    }

    /// [`synchronize`](Tracker::synchronize) without counting or acting on its error.
    fn synchronize_uncounted(&self) -> Result<(), T::Error> {
        if let Err(e) = self.wait(Target::Everything) {
            log::error!("tile-launch release queue: synchronize: {e}");
            return Err(e.into_error());
        }
        let batch = self.lock().take_completed(None);
        self.release_batch(batch);
        self.settle(None);
        Ok(())
    }

    /// Drains the queue at the end of the stream's life: [`synchronize`](Tracker::synchronize),
    /// and if that fails, leaks every queued guard (never releases it: its work may still be
    /// running), counts it in [`Stats::guards_leaked`], stores the error in the sticky slot and logs it.
    ///
    /// With nothing queued it makes no call on the stream at all (the stream may have been
    /// destroyed by its owner once its work was released).
    ///
    /// Meant for quiescence: launches deferred by other threads while it runs may stay queued.
    /// The tracker stays usable afterwards.
    pub fn shutdown(&self) {
        if self.lock().deferred.first().is_none() {
            // Nothing queued: the stream is not touched (it may be gone already); batches other
            // threads took are still waited for.
            self.settle(None);
            return;
        }
        let Err(error) = self.synchronize_uncounted() else {
            return;
        };
        let mut st = self.lock();
        let queue = st.deferred.take_all();
        st.deferred_guards = 0;
        st.deferred_bytes = 0;
        let launches = queue.len();
        let guards: usize = queue.iter().map(|(_, e)| e.guards.len()).sum();
        st.note_error(
            error,
            format_args!(
                "shutdown could not confirm completion; leaking {guards} guard(s) of {launches} \
                 queued launch(es)"
            ),
        );
        drop(st);
        for (_, entry) in queue {
            self.leak(entry.guards);
        }
    }

    /// Whether nothing is queued (no deferred launch), no handle holds a guard, and no thread is
    /// releasing guards it took from the tracker ([`Stats::releasing_guards`]).
    pub fn is_quiescent(&self) -> bool {
        let st = self.lock();
        st.deferred.first().is_none() && st.held_guards == 0 && st.releasing.is_empty()
    }

    /// The barrier: waits until every release batch that a thread took before this call (off
    /// the queue, or from a handle) has finished dropping its guards; with `seq`, only those
    /// that may hold the queued launch `seq`. Another thread's release runs outside the lock, so
    /// without this a `synchronize` could find the queue empty and return while that thread is
    /// still running deleters.
    ///
    /// Re-entrancy: called on a thread that is itself dropping guards of a batch (from inside a
    /// deleter, on any tracker), it returns at once: its own batch cannot finish before it
    /// returns, and two deleters each waiting for the other's batch would deadlock. So a barrier
    /// from inside a deleter covers what it released itself, not what other threads are
    /// releasing at that moment. A guard's drop must not wait for a thread that is in a
    /// barrier (as it must not wait for one that retires a handle).
    pub(super) fn settle(&self, seq: Option<u64>) {
        if in_release() {
            return;
        }
        let mut st = sync::lock(&self.state);
        let before = st.next_batch;
        while st.in_flight_before(before, seq) {
            st.barrier_waiters += 1;
            st = self
                .settled
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st.barrier_waiters -= 1;
        }
    }

    /// Whether a release batch that may hold the queued launch `seq` is in flight on another
    /// thread (never counting this thread's own: see [`settle`](Tracker::settle)).
    pub(super) fn releasing_elsewhere(&self, seq: u64) -> bool {
        !in_release() && self.lock().in_flight_before(u64::MAX, Some(seq))
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            pending_guards: st.deferred_guards,
            pending_bytes: st.deferred_bytes,
            held_guards: st.held_guards,
            held_bytes: st.held_bytes,
            guards_released: self.released.load(Ordering::Relaxed),
            guards_leaked: self.leaked.load(Ordering::Relaxed),
            release_panics: self.release_panics.load(Ordering::Relaxed),
            launches: st.launches,
            markers_recorded: st.markers_recorded,
            errors: st.errors,
            releasing_guards: st.releasing_guards(),
        }
    }

    /// The sticky error slot: the first error that happened where nobody could receive it (in
    /// `Drop`, in a poll during `launch`/`defer`/`poll`, in `shutdown`, in
    /// [`Pending::try_retire`](super::Pending::try_retire)), kept until [`take_error`](Tracker::take_error).
    pub fn last_error(&self) -> Option<T::Error> {
        self.lock().error.clone()
    }

    /// Takes the sticky error, leaving the slot empty.
    pub fn take_error(&self) -> Option<T::Error> {
        self.lock().error.take()
    }

    // ---- used by `Pending` ----

    /// Blocks until the launch `seq` is known complete.
    pub(super) fn wait_for(&self, seq: u64) -> Result<(), CompletionError<T::Error>> {
        self.wait(Target::Launch(seq))
    }

    /// Whether the launch `seq` has completed, without blocking (records a marker if none covers
    /// it).
    pub(super) fn query(&self, seq: u64) -> Result<bool, T::Error> {
        let mut st = self.lock();
        if seq < st.completed_through {
            return Ok(true);
        }
        let i = match st.covering(seq) {
            Some(i) => i,
            None => self.record_locked(&mut st)?,
        };
        let covers = st.markers[i].covers;
        if self.timeline.query(&st.markers[i].marker)? {
            st.mark_completed(covers, &self.timeline);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Releases the handle's guards (`own`, whose launch is known complete) together with every
    /// queued launch known complete, in launch order. Returns (own released, queued released).
    pub(super) fn release_completed(&self, seq: u64, own: Held<G>, bytes: u64) -> (usize, usize) {
        let n = own.len();
        let batch = self.lock().take_completed(Some((seq, own, bytes)));
        let total = self.release_batch(batch);
        (n, total - n)
    }

    /// Releases every queued launch known complete (after a wait or a query moved
    /// `completed_through`), without querying anything. Returns how many guards were released.
    pub(super) fn release_known_complete(&self) -> usize {
        let batch = self.lock().take_completed(None);
        self.release_batch(batch)
    }

    /// Takes the queued launch `seq` off the queue, if it is still there, and leaks its guards
    /// (its completion could not be confirmed). Returns how many.
    pub(super) fn leak_queued(&self, seq: u64) -> usize {
        let mut st = self.lock();
        let Some(entry) = st.deferred.remove(seq) else {
            return 0;
        };
        st.deferred_guards -= entry.guards.len();
        st.deferred_bytes = st.deferred_bytes.saturating_sub(entry.bytes);
        drop(st);
        self.leak(entry.guards)
    }

    /// Queues a handle's guards. First makes room for them (waiting for the oldest queued work
    /// if the queue is full), so that the queue stays within its bounds; guards that exceed the
    /// guard bound on their own are waited for and released here instead of being queued. A
    /// launch whose bytes alone exceed the byte bound is queued (alone, once room is made):
    /// its size never makes it synchronous.
    pub(super) fn defer(&self, seq: u64, guards: Held<G>, bytes: u64) {
        let n = guards.len();
        let st = self.lock();
        let mut st = self.make_room(st, n, bytes);
        if st.deferred.is_empty() && self.too_many_guards(n) {
            drop(st);
            log::debug!(
                "tile-launch release queue: launch #{seq} ({n} guards, {bytes} bytes) exceeds the \
                 queue's bounds on its own; waiting for it instead of queueing it"
            );
            if let Err(e) = self.wait_and_release(seq, guards, bytes) {
                let n = e.leaked;
                self.note_error(
                    e.into_error(),
                    format_args!("deferring launch #{seq}; leaked its {n} guard(s)"),
                );
            }
            return;
        }
        st.unhold(n, bytes);
        st.insert_deferred(seq, guards, bytes);
        // Polling is left to later launches (every `poll_every`), `poll` and `synchronize`: a
        // query costs about a third of a launch. What is already known complete goes now.
        self.maybe_record(&mut st);
        let batch = st.take_completed(None);
        drop(st);
        if !batch.is_empty() {
            self.release_batch(batch);
        }
    }

    /// Waits until the launch `seq` is known complete, then releases `guards` together with the
    /// queued launches known complete (launch order). Returns (own released, queued released).
    ///
    /// If completion cannot be confirmed, leaks `guards` and returns the error.
    pub(super) fn wait_and_release(
        &self,
        seq: u64,
        guards: Held<G>,
        bytes: u64,
    ) -> Result<(usize, usize), RetireError<T::Error>> {
        match self.wait_for(seq) {
            Ok(()) => Ok(self.release_completed(seq, guards, bytes)),
            Err(source) => {
                let leaked = self.leak_held(guards, bytes);
                Err(RetireError {
                    seq,
                    leaked,
                    source,
                })
            }
        }
    }

    /// Leaks a handle's guards (their completion could not be confirmed). Returns how many.
    pub(super) fn leak_held(&self, guards: Held<G>, bytes: u64) -> usize {
        self.lock().unhold(guards.len(), bytes);
        self.leak(guards)
    }

    /// Forgets the accounting of a handle that owns no guards.
    pub(super) fn unhold_empty(&self, bytes: u64) {
        self.lock().unhold(0, bytes);
    }

    /// Stores an error nobody can receive in the sticky slot, and logs it.
    pub(super) fn note_error(&self, error: T::Error, context: fmt::Arguments<'_>) {
        self.lock().note_error(error, context);
    }

    // ---- internals ----

    /// Records a marker covering everything launched so far, unless the newest marker already
    /// does. Returns its index.
    fn record_locked(&self, st: &mut State<T, G>) -> Result<usize, T::Error> {
        if st.markers.back().is_some_and(|m| m.covers == st.next_seq) {
            return Ok(st.markers.len() - 1);
        }
        self.record_fresh(st)
    }

    /// [`record_locked`](Tracker::record_locked) from inside a launch call
    /// ([`Timeline::record_at_launch`]).
    fn record_at_launch_locked(&self, st: &mut State<T, G>) -> Result<usize, T::Error> {
        if st.markers.back().is_some_and(|m| m.covers == st.next_seq) {
            return Ok(st.markers.len() - 1);
        }
        let marker = match st.spare_markers.pop() {
            Some(spare) => self.rerecord(st, spare, T::rerecord_at_launch)?,
            None => Arc::new(self.timeline.record_at_launch()?),
        };
        Ok(Self::push_marker(st, marker))
    }

    fn record_fresh(&self, st: &mut State<T, G>) -> Result<usize, T::Error> {
        let marker = match st.spare_markers.pop() {
            Some(spare) => self.rerecord(st, spare, T::rerecord)?,
            None => Arc::new(self.timeline.record()?),
        };
        Ok(Self::push_marker(st, marker))
    }

    /// Records a spare marker again with `rerecord`; on an error it stays a spare.
    fn rerecord(
        &self,
        st: &mut State<T, G>,
        mut spare: Arc<T::Marker>,
        rerecord: fn(&T, &mut T::Marker) -> Result<(), T::Error>,
    ) -> Result<Arc<T::Marker>, T::Error> {
        // The spare is taken only once nothing else refers to it (`State::sweep_orphans`).
        let Some(marker) = Arc::get_mut(&mut spare) else {
            unreachable!("the spare marker is referred to elsewhere");
        };
        match rerecord(&self.timeline, marker) {
            Ok(()) => Ok(spare),
            Err(e) => {
                st.spare_markers.push(spare);
                Err(e)
            }
        }
    }

    fn push_marker(st: &mut State<T, G>, marker: Arc<T::Marker>) -> usize {
        st.markers.push_back(MarkerSlot {
            covers: st.next_seq,
            marker,
        });
        st.markers_recorded += 1;
        st.launches_since_marker = 0;
        st.markers.len() - 1
    }

    /// Stores an error nobody can receive ([`State::note_error`]), or, when it says the stream
    /// is lost ([`Timeline::is_lost`]), [`abandon`](Tracker::abandon)s the queue.
    fn note_or_abandon(&self, st: &mut State<T, G>, error: T::Error, context: fmt::Arguments<'_>) {
        if self.timeline.is_lost(&error) {
            self.abandon(st, error, context);
        } else {
            st.note_error(error, context);
        }
    }

    /// The stream is lost ([`Timeline::is_lost`]): nothing queued can ever be confirmed complete.
    /// Leaks every queued guard (counted in [`Stats::guards_leaked`]: never dropped, since the
    /// work may still use the memory), gives every marker back to the timeline, and stores the
    /// error once. Guards held by handles stay with them (their retire reports and leaks).
    fn abandon(&self, st: &mut State<T, G>, error: T::Error, context: fmt::Arguments<'_>) {
        let queue = st.deferred.take_all();
        let launches = queue.len();
        let guards = st.deferred_guards;
        st.deferred_guards = 0;
        st.deferred_bytes = 0;
        st.note_error(
            error,
            format_args!(
                "{context}: the stream is lost; leaking {guards} guard(s) of {launches} queued \
                 launch(es)"
            ),
        );
        for (_, entry) in queue {
            self.leak(entry.guards);
        }
        let markers = mem::take(&mut st.markers);
        st.orphans
            .extend(markers.into_iter().map(|slot| slot.marker));
        // The spares go back too. (A marker a waiter still holds stays an orphan until let go;
        // should the tracker record again, a later sweep may keep it as a spare, and recording
        // it again replaces its old record, as taking it from the pool would.)
        let spares = mem::take(&mut st.spare_markers);
        st.orphans.extend(spares);
        // Launches so far are settled (leaked or held): none is waited for again, and a later
        // launch starts from a fresh marker.
        st.launches_since_marker = 0;
        st.sweep_orphans(&self.timeline, false);
    }

    /// Launches between two polls at launch time: `poll_every`, or, for a timeline that records
    /// a marker in every launch ([`Timeline::thread_bound`]), at least `marker_every`. Such a
    /// poll finds a new complete marker every time, and releases what it covers: polled every
    /// `marker_every` launches, its launches' guards are held about as long as those of a
    /// stream whose markers are amortised (one every `marker_every` launches, found complete by
    /// the next poll), for a quarter of the queries and releases.
    #[inline]
    fn poll_period(&self) -> u32 {
        let every = self.config.poll_every.max(1);
        if self.timeline.thread_bound() {
            every.max(self.config.marker_every)
        } else {
            every
        }
    }

    /// The amortised marker policy.
    fn maybe_record(&self, st: &mut State<T, G>) {
        if st.launches_since_marker >= self.config.marker_every.max(1)
            && st.has_uncovered()
            && self.timeline.reachable_here()
            && self.timeline.can_record_now()
            && let Err(e) = self.record_locked(st)
        {
            self.note_or_abandon(
                st,
                e,
                format_args!("recording an amortised completion marker"),
            );
        }
    }

    /// Queries the newest marker, then, when it has not completed, the oldest ones in order,
    /// and marks what completed.
    fn poll_locked(&self, st: &mut State<T, G>) -> Result<(), T::Error> {
        // Markers complete in the order they were recorded: a tracker records on one stream
        // (for a launch-only handle, one stream at a time: its safety contract keeps the handle
        // naming a stream until that stream's work has finished, so a marker recorded after the
        // handle came to name another stream finds the older work finished). The newest marker
        // complete thus answers for all (one query where a marker per launch would need one
        // each); only when it is not are the oldest asked, to release what has finished.
        if st.markers.len() > 1
            && let Some(newest) = st.markers.back()
            && self.timeline.query(&newest.marker)?
        {
            let covers = newest.covers;
            st.mark_completed(covers, &self.timeline);
            return Ok(());
        }
        while let Some(front) = st.markers.front() {
            if !self.timeline.query(&front.marker)? {
                break;
            }
            let covers = front.covers;
            st.mark_completed(covers, &self.timeline);
        }
        Ok(())
    }

    fn poll_if_worth_it(&self, st: &mut State<T, G>) {
        if st.worth_polling()
            && let Err(e) = self.poll_locked(st)
        {
            self.note_or_abandon(st, e, format_args!("querying a completion marker"));
        }
    }

    /// Blocks, without holding the lock, until `target` is known complete.
    fn wait(&self, target: Target) -> Result<(), CompletionError<T::Error>> {
        let mut st = self.lock();
        let recorded = match target {
            Target::Launch(seq) if seq < st.completed_through => return Ok(()),
            Target::Launch(seq) => match st.covering(seq) {
                Some(i) => Ok(i),
                None => self.record_locked(&mut st),
            },
            // Where the stream cannot be named (another thread's per-thread default stream),
            // "everything" is what was launched through this tracker: the newest marker, which
            // was recorded at launch time, covers it.
            Target::Everything if !self.timeline.reachable_here() => {
                if st.next_seq <= st.completed_through {
                    return Ok(());
                }
                self.record_locked(&mut st)
            }
            Target::Everything => self.record_fresh(&mut st),
        };
        match recorded {
            Ok(i) => {
                let covers = st.markers[i].covers;
                let marker = Arc::clone(&st.markers[i].marker);
                drop(st);
                let waited = self.timeline.wait(&marker);
                // Let go of our reference first, so that the marker can be recycled.
                drop(marker);
                waited.map_err(CompletionError::Wait)?;
                self.lock().mark_completed(covers, &self.timeline);
                Ok(())
            }
            Err(record) => {
                let covers = st.next_seq;
                drop(st);
                log::warn!(
                    "tile-launch release queue: recording a completion marker failed ({record}); \
                     synchronising the stream instead"
                );
                match self.timeline.synchronize() {
                    Ok(()) => {
                        self.lock().mark_completed(covers, &self.timeline);
                        Ok(())
                    }
                    Err(source) => Err(CompletionError::Synchronize { record, source }),
                }
            }
        }
    }

    /// Whether the queue plus `extra` would exceed a bound (never when the queue is empty). The
    /// byte bound applies only to a launch that adds bytes, and only while queued launches hold
    /// bytes: one that adds none never waits for older work because of bytes, and a large one
    /// waits at most until the bytes queued before it are released.
    #[inline]
    fn over_bound(&self, st: &State<T, G>, extra_guards: usize, extra_bytes: u64) -> bool {
        !st.deferred.is_empty()
            && (st.deferred_guards.saturating_add(extra_guards) > self.config.max_pending_guards
                || (extra_bytes > 0
                    && st.deferred_bytes > 0
                    && st.deferred_bytes.saturating_add(extra_bytes) > self.max_pending_bytes))
    }

    /// Waits for and releases the oldest queued launches until the queue plus `extra` fits the
    /// bounds (or the queue is empty). Returns with the lock held.
    fn make_room<'a>(
        &'a self,
        mut st: Locked<'a, T, G>,
        extra_guards: usize,
        extra_bytes: u64,
    ) -> Locked<'a, T, G> {
        while self.over_bound(&st, extra_guards, extra_bytes) {
            let Some(oldest) = st.deferred.first() else {
                break;
            };
            if oldest >= st.completed_through {
                drop(st);
                log::debug!(
                    "tile-launch release queue: over its bound; waiting for launch #{oldest}"
                );
                let waited = self.wait_for(oldest);
                st = self.lock();
                if let Err(e) = waited {
                    if let Some(entry) = st.deferred.remove(oldest) {
                        st.deferred_guards -= entry.guards.len();
                        st.deferred_bytes = st.deferred_bytes.saturating_sub(entry.bytes);
                        let n = self.leak(entry.guards);
                        st.note_error(
                            e.into_error(),
                            format_args!(
                                "waiting for the oldest queued launch #{oldest} to make room; \
                                 leaked its {n} guard(s)"
                            ),
                        );
                    }
                    continue;
                }
            }
            let batch = st.take_completed(None);
            if !batch.is_empty() {
                drop(st);
                self.release_batch(batch);
                st = self.lock();
            }
        }
        st
    }

    /// Counts `n` guards leaked outside the queue (in [`Stats::guards_leaked`]): guards whose
    /// work cannot be known complete, which the caller never drops (a hold the stream could not
    /// take: its capture status unreadable, or refused by the graph capturing the work).
    pub fn count_leaked(&self, n: usize) {
        self.leaked.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Leaks guards: they are never dropped. Returns how many.
    fn leak(&self, guards: Held<G>) -> usize {
        let n = guards.len();
        self.leaked.fetch_add(n as u64, Ordering::Relaxed);
        mem::forget(ManuallyDrop::into_inner(guards));
        n
    }

    /// Drops guards whose work has completed, in order, each inside `catch_unwind`, then marks
    /// the batch finished (waking a barrier waiting for it). Must be called without the lock
    /// held. Returns how many were dropped.
    fn release_batch(&self, batch: Batch<G>) -> usize {
        if batch.is_empty() {
            return 0;
        }
        /// Marks the batch finished however the release ends (a panic the release could not
        /// catch, in a timeline's `releasing`, would otherwise leave barriers waiting forever).
        struct Finish<'a, T: Timeline, G: Send + 'static> {
            tracker: &'a Tracker<T, G>,
            ticket: Option<u64>,
            released: usize,
            /// The batch's vector once emptied, kept for the next batch.
            spare: Vec<Held<G>>,
        }
        impl<T: Timeline, G: Send + 'static> Drop for Finish<'_, T, G> {
            fn drop(&mut self) {
                let t = self.tracker;
                let Some(ticket) = self.ticket else {
                    t.released
                        .fetch_add(self.released as u64, Ordering::Relaxed);
                    return;
                };
                let mut st = sync::lock(&t.state);
                // Counted released under the lock, as the batch leaves `releasing`: a stats
                // snapshot never counts a guard in both, nor in neither.
                t.released
                    .fetch_add(self.released as u64, Ordering::Relaxed);
                if st.finish_batch(ticket, mem::take(&mut self.spare)) {
                    t.settled.notify_all();
                }
            }
        }
        let Batch {
            guards: mut batch,
            ticket,
        } = batch;
        let mut finish = Finish {
            tracker: self,
            ticket,
            released: 0,
            spare: Vec::new(),
        };
        let _releasing = InRelease::enter();
        let mut released = 0usize;
        let mut panics = 0u64;
        let recycle = self.recycle;
        self.timeline.releasing(&mut || {
            Self::drop_all(&mut batch, recycle, &mut released, &mut panics);
        });
        // Were `releasing` not to call us back, the guards are dropped here all the same (and
        // if it did, the batch is empty now).
        Self::drop_all(&mut batch, recycle, &mut released, &mut panics);
        if panics > 0 {
            self.release_panics.fetch_add(panics, Ordering::Relaxed);
        }
        finish.released = released;
        finish.spare = batch;
        released
    }

    /// Drops every guard of `batch` in order, each inside `catch_unwind`, then hands each
    /// emptied vector to `recycle` (or frees it). Leaves `batch` empty.
    fn drop_all(
        batch: &mut Vec<Held<G>>,
        recycle: Option<fn(Vec<G>)>,
        released: &mut usize,
        panics: &mut u64,
    ) {
        for held in batch.drain(..) {
            let mut guards = ManuallyDrop::into_inner(held);
            let mut each = guards.drain(..);
            // One `catch_unwind` for a launch's guards: after a drop that panicked, the next
            // round drops the guards after it.
            while let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| {
                for guard in each.by_ref() {
                    *released += 1;
                    drop(guard);
                }
            })) {
                *panics += 1;
                log::error!(
                    "tile-launch release queue: a guard's drop (a tensor's deleter) panicked: {}",
                    panic_message(&*payload)
                );
                // Dropping the payload may panic in turn; if it does, forget that one.
                if let Err(again) = panic::catch_unwind(AssertUnwindSafe(move || drop(payload))) {
                    mem::forget(again);
                }
            }
            drop(each);
            if let Some(recycle) = recycle
                && guards.capacity() > 0
            {
                recycle(guards);
            }
        }
    }
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(non-string panic payload)"
    }
}

impl<T: Timeline, G: Send + 'static> Drop for Tracker<T, G> {
    /// Drains what is left: [`shutdown`](Tracker::shutdown) if launches are queued. Then gives
    /// every marker still held back to the timeline ([`Timeline::recycle`]), including markers
    /// whose work may still be pending.
    fn drop(&mut self) {
        let queued = !self.lock().deferred.is_empty();
        if queued {
            self.shutdown();
        }
        let mut st = self.lock();
        let outstanding = mem::take(&mut st.markers);
        st.orphans
            .extend(outstanding.into_iter().map(|slot| slot.marker));
        let spares = mem::take(&mut st.spare_markers);
        st.orphans.extend(spares);
        // Nobody else can refer to a marker now: waiters hold `&self`.
        st.sweep_orphans(&self.timeline, false);
    }
}
