//! What the tracker's lock protects: the queue of deferred launches in sequence order, the
//! recorded completion markers, and the counters; and the bookkeeping on them that makes no
//! driver call (inserting, taking what completed, retiring markers).

use std::collections::VecDeque;
use std::fmt;
use std::mem::{self, ManuallyDrop};
use std::sync::Arc;

use super::Timeline;

/// The guards of one launch. They are never dropped implicitly: every path either hands them to
/// [`Tracker::release_batch`] (after completion) or leaks them, so that an unexpected unwind or a
/// forgotten value can only leak, never release early.
pub(crate) type Held<G> = ManuallyDrop<Vec<G>>;

/// A deferred launch in the queue.
pub(super) struct Entry<G> {
    pub(super) guards: Held<G>,
    pub(super) bytes: u64,
}

/// The deferred launches, in sequence-number order. Launches are nearly always deferred in launch
/// order, so an insert is a push at the back; a handle deferred after a later launch's is placed
/// by binary search. (A `BTreeMap` did the same at several times the cost per launch.)
pub(super) struct Deferred<G> {
    pub(super) entries: VecDeque<(u64, Entry<G>)>,
}

impl<G> Deferred<G> {
    pub(super) fn new() -> Self {
        Self {
            entries: VecDeque::new(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The smallest queued sequence number.
    pub(super) fn first(&self) -> Option<u64> {
        self.entries.front().map(|(seq, _)| *seq)
    }

    /// The largest queued sequence number.
    pub(super) fn last(&self) -> Option<u64> {
        self.entries.back().map(|(seq, _)| *seq)
    }

    /// Queues `entry` at its place in sequence order (each `seq` is queued at most once).
    #[inline]
    pub(super) fn insert(&mut self, seq: u64, entry: Entry<G>) {
        if self.last().is_some_and(|last| last > seq) {
            let at = self.entries.partition_point(|(s, _)| *s < seq);
            self.entries.insert(at, (seq, entry));
        } else {
            self.entries.push_back((seq, entry));
        }
    }

    /// Removes the entry of `seq`, if queued.
    pub(super) fn remove(&mut self, seq: u64) -> Option<Entry<G>> {
        let at = self.entries.partition_point(|(s, _)| *s < seq);
        if self.entries.get(at).is_some_and(|(s, _)| *s == seq) {
            self.entries.remove(at).map(|(_, entry)| entry)
        } else {
            None
        }
    }

    /// Removes and returns, in order, every entry with a sequence number below `bound`.
    pub(super) fn take_below(
        &mut self,
        bound: u64,
    ) -> std::collections::vec_deque::Drain<'_, (u64, Entry<G>)> {
        let end = self.entries.partition_point(|(s, _)| *s < bound);
        self.entries.drain(..end)
    }

    /// Removes and returns every entry, in order.
    pub(super) fn take_all(&mut self) -> VecDeque<(u64, Entry<G>)> {
        mem::take(&mut self.entries)
    }
}

/// A recorded marker and what it covers: every launch with a sequence number below `covers`.
pub(super) struct MarkerSlot<M> {
    pub(super) covers: u64,
    /// Shared so that a thread can wait for it without holding the lock.
    pub(super) marker: Arc<M>,
}

/// The largest batch vector kept for reuse, in launches (a larger one, made for a release of
/// many launches at once, is freed).
const MAX_SPARE_BATCH: usize = 1024;

/// The most retired markers kept to be recorded again: as many as a stream with a marker at
/// every launch retires at a poll (`ReleaseConfig::marker_every` launches' worth, by default
/// 64), with room.
const MAX_SPARE_MARKERS: usize = 256;

/// Everything behind the tracker's lock.
pub(super) struct State<T: Timeline, G> {
    /// The sequence number the next launch gets.
    pub(super) next_seq: u64,
    /// Every launch with a smaller sequence number is known to have completed.
    pub(super) completed_through: u64,
    /// Successful launches since the last marker was recorded.
    pub(super) launches_since_marker: u32,
    /// Successful launches since the last launch-time poll.
    pub(super) launches_since_poll: u32,
    /// Recorded, not yet known complete; `covers` non-decreasing from front to back.
    pub(super) markers: VecDeque<MarkerSlot<T::Marker>>,
    /// Markers no longer needed that another thread still referred to (it was waiting for
    /// them) when they were retired; recycled by a later sweep, at the latest when the tracker
    /// is dropped.
    pub(super) orphans: Vec<Arc<T::Marker>>,
    /// Retired markers nobody refers to, kept to be recorded again ([`Timeline::rerecord`])
    /// rather than recycled: a new marker reuses one's allocation (at most
    /// [`MAX_SPARE_MARKERS`]).
    pub(super) spare_markers: Vec<Arc<T::Marker>>,
    /// Deferred launches by sequence number (deferral order may differ from launch order).
    pub(super) deferred: Deferred<G>,
    pub(super) deferred_guards: usize,
    pub(super) deferred_bytes: u64,
    pub(super) held_guards: usize,
    pub(super) held_bytes: u64,
    pub(super) launches: u64,
    pub(super) markers_recorded: u64,
    /// The sticky error slot: the first error nobody could receive, until taken.
    pub(super) error: Option<T::Error>,
    pub(super) errors: u64,
    /// Release batches taken off the queue (or from a handle) whose guards another thread may
    /// still be dropping, outside the lock: the barriers wait for them
    /// ([`Tracker::settle`](super::Tracker)).
    pub(super) releasing: Vec<InFlight>,
    /// The ticket the next batch gets: batches are numbered in the order they are taken.
    pub(super) next_batch: u64,
    /// Threads waiting in a barrier for batches to finish: a finished batch wakes them only
    /// when there are any (a wake-up is a system call).
    pub(super) barrier_waiters: usize,
    /// An emptied batch vector, reused by the next batch: a batch vector freed and allocated
    /// again at every release would make the allocator reorganise its free lists then, at a
    /// cost per released tensor.
    pub(super) spare_batch: Vec<Held<G>>,
}

/// A release batch in flight: taken under the lock, its guards being dropped outside it.
#[derive(Debug, Clone, Copy)]
pub(super) struct InFlight {
    /// Its place in the order batches were taken ([`State::next_batch`]).
    pub(super) ticket: u64,
    /// `completed_through` when it was taken: it holds no queued launch with a sequence number
    /// at or above this (every queued launch below it, not taken by an earlier batch).
    pub(super) below: u64,
    /// How many guards it holds.
    pub(super) guards: usize,
    /// Whether it holds queued launches (not only a handle's own guards, which their handle
    /// releases and no barrier waits for).
    pub(super) queued: bool,
}

/// Guards taken for release: dropped by [`Tracker::release_batch`](super::Tracker), which then
/// reports the batch finished (when it was registered in [`State::releasing`]).
pub(crate) struct Batch<G> {
    pub(super) guards: Vec<Held<G>>,
    /// The batch's ticket in [`State::releasing`]; `None` for guards nobody can wait for (a
    /// launch whose enqueue failed, released inside the launch call).
    pub(super) ticket: Option<u64>,
}

impl<G> Batch<G> {
    /// Guards released without being registered (nothing was ever enqueued for them).
    pub(super) fn unregistered(guards: Vec<Held<G>>) -> Self {
        Batch {
            guards,
            ticket: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }
}

impl<T: Timeline, G> State<T, G> {
    /// Index of the oldest marker covering `seq`.
    pub(super) fn covering(&self, seq: u64) -> Option<usize> {
        self.markers.iter().position(|m| m.covers > seq)
    }

    /// Whether the queue holds a launch that neither a marker covers nor is known complete.
    pub(super) fn has_uncovered(&self) -> bool {
        let covered = self
            .markers
            .back()
            .map_or(self.completed_through, |m| m.covers);
        let covered = covered.max(self.completed_through);
        self.deferred.last().is_some_and(|seq| seq >= covered)
    }

    /// Whether querying the markers could release something from the queue.
    pub(super) fn worth_polling(&self) -> bool {
        match (self.deferred.first(), self.markers.back()) {
            (Some(oldest), Some(newest)) => newest.covers > oldest,
            _ => false,
        }
    }

    /// Raises `completed_through` to `covers` and retires every marker that is now known to have
    /// completed (FIFO: a marker covering less than a completed one has completed too).
    pub(super) fn mark_completed(&mut self, covers: u64, timeline: &T) {
        self.completed_through = self.completed_through.max(covers);
        while self
            .markers
            .front()
            .is_some_and(|m| m.covers <= self.completed_through)
        {
            if let Some(slot) = self.markers.pop_front() {
                self.orphans.push(slot.marker);
            }
        }
        self.sweep_orphans(timeline, true);
    }

    /// Recycles the retired markers that nobody refers to any more, but for those kept in
    /// `spare_markers` when `keep_spare` (up to [`MAX_SPARE_MARKERS`]). (A waiter lets go of its reference
    /// before it takes the lock again, so whatever it was waiting for is recycled at the latest
    /// by the sweep its own `mark_completed` does.)
    pub(super) fn sweep_orphans(&mut self, timeline: &T, keep_spare: bool) {
        let mut i = 0;
        while i < self.orphans.len() {
            if Arc::strong_count(&self.orphans[i]) == 1 {
                let marker = self.orphans.swap_remove(i);
                if keep_spare && self.spare_markers.len() < MAX_SPARE_MARKERS {
                    self.spare_markers.push(marker);
                } else if let Ok(marker) = Arc::try_unwrap(marker) {
                    timeline.recycle(marker);
                }
            } else {
                i += 1;
            }
        }
    }

    #[inline]
    pub(super) fn insert_deferred(&mut self, seq: u64, guards: Held<G>, bytes: u64) {
        self.deferred_guards += guards.len();
        self.deferred_bytes = self.deferred_bytes.saturating_add(bytes);
        self.deferred.insert(seq, Entry { guards, bytes });
    }

    pub(super) fn unhold(&mut self, guards: usize, bytes: u64) {
        self.held_guards = self.held_guards.saturating_sub(guards);
        self.held_bytes = self.held_bytes.saturating_sub(bytes);
    }

    /// Whether a queued launch is known to have completed ([`State::take_completed`] would take
    /// it).
    #[inline]
    pub(super) fn has_completed(&self) -> bool {
        self.deferred
            .first()
            .is_some_and(|oldest| oldest < self.completed_through)
    }

    /// Takes every queued launch known to have completed, in launch order, with `own` (a handle's
    /// launch that is known to have completed) at its place in that order, and registers the
    /// batch as in flight ([`State::releasing`]) when it holds anything.
    pub(super) fn take_completed(&mut self, own: Option<(u64, Held<G>, u64)>) -> Batch<G> {
        let queued_before = self.deferred_guards;
        let guards = self.take_completed_guards(own);
        let n: usize = guards.iter().map(|g| g.len()).sum();
        if n == 0 {
            return Batch::unregistered(guards);
        }
        let ticket = self.next_batch;
        self.next_batch += 1;
        self.releasing.push(InFlight {
            ticket,
            below: self.completed_through,
            guards: n,
            queued: self.deferred_guards < queued_before,
        });
        Batch {
            guards,
            ticket: Some(ticket),
        }
    }

    /// The guards of the batches in flight ([`Stats::releasing_guards`](super::Stats::releasing_guards)).
    pub(super) fn releasing_guards(&self) -> usize {
        self.releasing.iter().map(|b| b.guards).sum()
    }

    /// Marks the batch `ticket` finished (its guards dropped), keeping its emptied vector
    /// `spare` for the next batch. Returns whether a barrier is waiting (to be woken).
    pub(super) fn finish_batch(&mut self, ticket: u64, spare: Vec<Held<G>>) -> bool {
        if let Some(i) = self.releasing.iter().position(|b| b.ticket == ticket) {
            self.releasing.swap_remove(i);
        }
        if spare.is_empty()
            && spare.capacity() > self.spare_batch.capacity()
            && spare.capacity() <= MAX_SPARE_BATCH
        {
            self.spare_batch = spare;
        }
        self.barrier_waiters > 0
    }

    /// Whether a batch of queued launches taken before ticket `before` is still in flight; with
    /// `seq`, only one that may hold the queued launch `seq`.
    pub(super) fn in_flight_before(&self, before: u64, seq: Option<u64>) -> bool {
        self.releasing
            .iter()
            .any(|b| b.queued && b.ticket < before && seq.is_none_or(|s| s < b.below))
    }

    fn take_completed_guards(&mut self, own: Option<(u64, Held<G>, u64)>) -> Vec<Held<G>> {
        let mut own = own;
        if let Some((_, guards, bytes)) = &own {
            let (n, b) = (guards.len(), *bytes);
            self.unhold(n, b);
        }
        if !self.has_completed() {
            return own.map(|(_, guards, _)| guards).into_iter().collect();
        }
        let mut batch = mem::take(&mut self.spare_batch);
        let done = self.deferred.take_below(self.completed_through);
        batch.reserve(done.len() + 1);
        let (mut guards_done, mut bytes_done) = (0usize, 0u64);
        for (seq, entry) in done {
            if own.as_ref().is_some_and(|(own_seq, ..)| *own_seq < seq)
                && let Some((_, guards, _)) = own.take()
            {
                batch.push(guards);
            }
            guards_done += entry.guards.len();
            bytes_done = bytes_done.saturating_add(entry.bytes);
            batch.push(entry.guards);
        }
        self.deferred_guards -= guards_done;
        self.deferred_bytes = self.deferred_bytes.saturating_sub(bytes_done);
        if let Some((_, guards, _)) = own {
            batch.push(guards);
        }
        batch
    }

    pub(super) fn note_error(&mut self, error: T::Error, context: fmt::Arguments<'_>) {
        log::error!("tile-launch release queue: {context}: {error}");
        self.errors += 1;
        if self.error.is_none() {
            self.error = Some(error);
        }
    }
}
