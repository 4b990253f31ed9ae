//! The release queue: keeps every consumed tensor alive until the GPU work that uses it has
//! finished, and releases it (runs its DLPack deleter) exactly once after that — never before.
//!
//! This module is pure Rust. It sees a CUDA stream only through the [`Timeline`] trait (record a
//! completion marker, query it, wait for it, synchronise the whole stream), and a consumed tensor
//! only as a *guard*: any `G: Send + 'static` whose `Drop` releases the tensor. The CUDA
//! implementation of [`Timeline`] lives in `stream.rs`; the tests drive the queue with
//! `fake::FakeTimeline` (feature `testing`), whose markers complete only when the test says so.
//!
//! # Model
//!
//! A [`Tracker`] serves one stream. [`Tracker::launch`] runs the caller's `enqueue` (the actual
//! kernel launch) under the tracker's lock and gives the launch the next *sequence number*, so
//! sequence order is the stream's FIFO order. A *marker* recorded when the next sequence number
//! is `n` *covers* every launch with a sequence number below `n`: once the marker has completed,
//! all of them have. Because of that, one marker can retire many launches, and markers are
//! recorded sparingly ([`ReleaseConfig::marker_every`]).
//!
//! The tracker knows `completed_through`: every launch with a smaller sequence number is known to
//! have completed (a marker covering it completed, or the stream was synchronised). A guard is
//! released only when its launch's sequence number is below `completed_through`. That is the one
//! rule the rest of this module is built around.
//!
//! # Paths to release
//!
//! A launch returns a [`Pending`] handle that owns the launch's guards:
//!
//! - [`Pending::retire`] waits for a marker covering the launch, then releases;
//! - [`Pending::try_retire`] releases only if the launch has completed, else gives the handle back;
//! - [`Pending::defer`] moves the guards into the tracker's queue, which releases them when a
//!   later [`launch`](Tracker::launch), [`defer`](Pending::defer), [`poll`](Tracker::poll),
//!   [`synchronize`](Tracker::synchronize) or [`shutdown`](Tracker::shutdown) sees them complete;
//! - dropping an unretired handle waits, then releases;
//! - `mem::forget` of a handle leaks its guards: soundness never depends on `Drop`.
//!
//! When the tracker cannot confirm completion (a wait fails, or recording a marker and the
//! whole-stream fallback both fail), the guards concerned are **leaked** — never dropped, counted
//! in [`Stats::guards_leaked`] — and the error is returned or, where nobody can receive it, kept in the
//! tracker's sticky error slot ([`Tracker::last_error`]) and logged.
//!
//! # Guarantees
//!
//! - Every guard is dropped at most once; a guard is dropped only after its launch is known to
//!   have completed, or immediately when `enqueue` failed (nothing was enqueued).
//! - Guards are always dropped outside the tracker's lock, each inside
//!   [`std::panic::catch_unwind`]: a deleter may be slow, may call back into the tracker, and may
//!   panic without stopping the other releases (a panic is counted in
//!   [`Stats::release_panics`] and logged; it is not re-raised).
//! - Within one release call, guards are dropped in launch order, and within a launch in argument
//!   order. Two threads releasing at the same time may interleave their batches.
//! - The queue is bounded ([`ReleaseConfig::max_pending_guards`],
//!   [`ReleaseConfig::max_pending_bytes`]): past the bound, [`launch`](Tracker::launch) and
//!   [`defer`](Pending::defer) first wait for the oldest queued work. The byte bound counts only
//!   the bytes a launch alone keeps alive (the `bytes` passed to [`Tracker::launch`]; the launch
//!   path counts exports the producer copied for it), and a launch that adds no such bytes never
//!   waits because of it; nor is a launch ever waited for because its own bytes exceed it.
//! - Waits never hold the tracker's lock, so one thread waiting for a launch does not stop
//!   other threads from launching on the same stream.
//! - **The barriers account for releases in flight.** A release takes its batch of guards under
//!   the lock and drops them outside it, so another thread may be in the middle of a batch
//!   (a slow deleter) when the queue looks empty. Every batch is registered while in flight
//!   ([`Stats::releasing_guards`] counts its guards), and the barriers —
//!   [`synchronize`](Tracker::synchronize), [`shutdown`](Tracker::shutdown) (hence a stream's
//!   drop) and [`Queued::wait`] — return only once every batch of queued launches taken
//!   before them (for `Queued::wait`, every one that may hold its launch) has been dropped.
//!   A handle's own guards are its own: [`Pending::retire`] drops them itself, and no barrier
//!   waits for another thread retiring a handle (unless queued launches share its batch).
//!   The one exception is a barrier called from inside a guard's drop (on any tracker): it
//!   does not wait for other threads' batches, since its own cannot finish first and two such
//!   deleters would wait for each other.

mod pending;
mod state;
mod tracker;

#[cfg(any(test, feature = "testing"))]
pub mod fake;

pub use pending::{Launched, Pending, Queued, Retired};
pub use tracker::Tracker;

/// One CUDA stream's ordering, seen abstractly: markers recorded on the stream complete in the
/// order they were recorded, each after all work enqueued before it.
///
/// The CUDA implementation records events (`cuEventRecord`), queries them (`cuEventQuery`),
/// waits for them (`cuEventSynchronize`), falls back to `cuStreamSynchronize`, and keeps
/// finished events in a pool ([`recycle`](Timeline::recycle)).
///
/// Implementations must not call back into the [`Tracker`] that owns them: `record` and `query`
/// run with the tracker's lock held.
pub trait Timeline: Send + Sync + 'static {
    /// A completion marker (a CUDA event). It is shared between threads: one thread may wait for
    /// it while another queries it, hence `Sync`.
    type Marker: Send + Sync + 'static;
    /// The error of a failed driver call.
    type Error: std::error::Error + Send + Sync + Clone + 'static;

    /// Records a marker that completes when all work enqueued on the stream so far has
    /// completed. Non-blocking.
    ///
    /// # Errors
    ///
    /// When the marker cannot be recorded. The tracker then falls back to
    /// [`synchronize`](Timeline::synchronize) where it must know about completion.
    #[doc(alias = "cuEventRecord")]
    fn record(&self) -> Result<Self::Marker, Self::Error>;

    /// Whether `marker` has completed. Non-blocking.
    ///
    /// # Errors
    ///
    /// When completion cannot be determined; the tracker then treats the marker as not complete
    /// (and may retry later).
    #[doc(alias = "cuEventQuery")]
    fn query(&self, marker: &Self::Marker) -> Result<bool, Self::Error>;

    /// Blocks until `marker` has completed.
    ///
    /// # Errors
    ///
    /// When the wait fails. The tracker then leaks (never releases) the guards it waited for.
    #[doc(alias = "cuEventSynchronize")]
    fn wait(&self, marker: &Self::Marker) -> Result<(), Self::Error>;

    /// Blocks until all work enqueued on the stream so far has completed. Used only when
    /// [`record`](Timeline::record) fails.
    ///
    /// # Errors
    ///
    /// When the synchronisation fails.
    #[doc(alias = "cuStreamSynchronize")]
    fn synchronize(&self) -> Result<(), Self::Error>;

    /// Takes back a marker the tracker no longer needs (an event back to the pool). Every marker
    /// returned by [`record`](Timeline::record) comes back here exactly once: when it is known
    /// to have completed, or when the tracker is dropped, in which case its work may still be
    /// pending (a CUDA event may still be re-recorded or destroyed then). The default drops it.
    fn recycle(&self, marker: Self::Marker) {
        drop(marker);
    }

    /// Runs `release`, which drops guards (runs foreign deleters). The default just calls it;
    /// the CUDA timeline relaxes the thread's stream-capture mode around it, so that a deleter
    /// making a call that is illegal during a global-mode capture (a synchronous free, say)
    /// neither fails nor invalidates a capture this thread has in progress.
    fn releasing(&self, release: &mut dyn FnMut()) {
        release();
    }

    /// Whether the stream this timeline observes is named by its handle on one thread only
    /// (CUDA's per-thread default stream). The tracker then records a marker at every launch,
    /// on the launching thread, so that a wait, poll or release made later from any thread finds
    /// a marker covering the launch and never has to record or synchronise there. The default
    /// is `false`.
    fn thread_bound(&self) -> bool {
        false
    }

    /// Whether [`record`](Timeline::record) and [`synchronize`](Timeline::synchronize) reach the
    /// stream from the calling thread: always, except for a [`thread_bound`](Timeline::thread_bound)
    /// timeline on a thread other than its own (there the handle names another stream, and both
    /// calls fail). The default is `true`.
    fn reachable_here(&self) -> bool {
        true
    }

    /// Whether `error` means that this timeline can never again confirm that work completed: the
    /// stream or its context is gone (destroyed, reset), or the context is poisoned by a fault.
    /// On such an error the tracker stops waiting for what it holds: it leaks every queued
    /// guard (counted in [`Stats::guards_leaked`]), gives its markers back and counts the error
    /// once, so that neither the queue nor the error count grows on every later call, and the
    /// tracker is left empty ([`Tracker::is_quiescent`]) for its owner to drop. The default is
    /// `false` (every error is taken as one that may pass).
    fn is_lost(&self, error: &Self::Error) -> bool {
        let _ = error;
        false
    }

    /// [`record`](Timeline::record), called by the launching thread inside the launch call
    /// (for a [`thread_bound`](Timeline::thread_bound) timeline, at every launch). A timeline
    /// whose handle is vouched for only during launch calls records here and refuses `record`
    /// elsewhere. The default is `record`.
    ///
    /// # Errors
    ///
    /// As [`record`](Timeline::record).
    fn record_at_launch(&self) -> Result<Self::Marker, Self::Error> {
        self.record()
    }

    /// [`record`](Timeline::record) into a marker of this timeline's that has completed and that
    /// nothing refers to any more, in place of a fresh one (a CUDA event recorded again: no event
    /// taken from the pool). The tracker keeps one such marker, so that a stream with a marker
    /// at every launch makes no allocation for it. On an error `marker` is left usable. The
    /// default records a fresh marker and recycles the old one.
    ///
    /// # Errors
    ///
    /// As [`record`](Timeline::record).
    fn rerecord(&self, marker: &mut Self::Marker) -> Result<(), Self::Error> {
        let fresh = self.record()?;
        self.recycle(std::mem::replace(marker, fresh));
        Ok(())
    }

    /// [`rerecord`](Timeline::rerecord) from inside a launch call, as
    /// [`record_at_launch`](Timeline::record_at_launch) is to `record`.
    ///
    /// # Errors
    ///
    /// As [`record`](Timeline::record).
    fn rerecord_at_launch(&self, marker: &mut Self::Marker) -> Result<(), Self::Error> {
        let fresh = self.record_at_launch()?;
        self.recycle(std::mem::replace(marker, fresh));
        Ok(())
    }

    /// Whether a marker can be recorded now. `false` while the stream is capturing a CUDA graph
    /// (an event recorded then would become a node of the graph): a non-blocking poll or the
    /// amortised marker policy then records nothing and stores no error (the queued work is
    /// covered by a marker once the capture has ended). Blocking waits still record and report.
    /// The default is `true`.
    fn can_record_now(&self) -> bool {
        true
    }

    /// The total memory of the stream's device, in bytes, if known (`cuDeviceTotalMem`, read
    /// once per context). [`PendingBytes::ShareOfDevice`] is resolved against it when the
    /// tracker is created. The default is `None` (the bound then falls back to
    /// [`PendingBytes::FALLBACK`]).
    fn device_memory(&self) -> Option<u64> {
        None
    }
}

/// The bound on the bytes the release queue alone keeps alive
/// ([`ReleaseConfig::max_pending_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PendingBytes {
    /// A fixed number of bytes.
    Bytes(u64),
    /// `percent` % of the device's total memory ([`Timeline::device_memory`]), resolved once
    /// when the tracker is created; [`PendingBytes::FALLBACK`] when the timeline does not know
    /// its device's memory.
    ShareOfDevice {
        /// Percent of the device's total memory, 1 to 100 (0 is treated as 1, more than 100
        /// as 100).
        percent: u8,
    },
}

impl PendingBytes {
    /// The bound used when a [`ShareOfDevice`](PendingBytes::ShareOfDevice) cannot be resolved:
    /// 4 GiB.
    pub const FALLBACK: u64 = 4 << 30;

    /// The bound in bytes on a device with `device_memory` bytes (if known).
    pub fn resolve(self, device_memory: Option<u64>) -> u64 {
        match self {
            PendingBytes::Bytes(b) => b,
            PendingBytes::ShareOfDevice { percent } => device_memory.map_or(Self::FALLBACK, |m| {
                m / 100 * u64::from(percent.clamp(1, 100))
            }),
        }
    }
}

impl From<u64> for PendingBytes {
    fn from(bytes: u64) -> Self {
        PendingBytes::Bytes(bytes)
    }
}

/// Tuning of a [`Tracker`]. `ReleaseConfig::default()` is
/// `{ marker_every: 64, poll_every: 16, max_pending_guards: 65_536,
/// max_pending_bytes: PendingBytes::ShareOfDevice { percent: 25 } }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseConfig {
    /// Launches between two amortised markers: at a launch, a marker is recorded when the queue
    /// holds launches no marker covers yet and at least this many launches happened since the
    /// last marker. `0` is treated as `1` (a marker at every launch that finds uncovered queued
    /// work). Explicit requests ([`Pending::retire`], [`Launched::is_complete`],
    /// [`Tracker::poll`], [`Tracker::synchronize`]) record a marker whenever none covers what
    /// they need.
    pub marker_every: u32,
    /// Launches between two polls of the oldest marker at launch time (`0` is treated as `1`).
    /// A poll is a `cuEventQuery`, which costs about as much as a third of a launch, so launches
    /// poll only every this many; a larger value lowers the launch cost and raises the time
    /// from a kernel's completion to its deleters running. A stream whose every launch records
    /// its own marker ([`Stream::from_raw_launch_only`](crate::Stream::from_raw_launch_only))
    /// polls every `max(poll_every, marker_every)` launches: its launches' tensors are then
    /// held about as long as an amortised marker holds them on another stream.
    pub poll_every: u32,
    /// Most guards the queue (deferred launches) may hold. Past it, `launch` and `defer` wait for
    /// the oldest queued work first. A single launch with more guards than this is waited for
    /// and released when it is deferred, rather than queued.
    pub max_pending_guards: usize,
    /// Most bytes the queue alone may keep alive: the sum of the `bytes` passed to
    /// [`Tracker::launch`] by queued launches. The launch path
    /// ([`Stream::launch`](crate::Stream::launch)) counts a tensor's bytes only when the
    /// producer flagged the export as a copy made for it (DLPack `IS_COPIED`): memory whose
    /// last owner is the queue. A tensor the caller still holds (weights, a cache) costs the
    /// queue nothing and counts nothing; a producer that frees its memory on release without
    /// that flag is bounded by [`max_pending_guards`](ReleaseConfig::max_pending_guards) only.
    ///
    /// Past the bound, a launch or `defer` that adds bytes first waits for the oldest queued
    /// work; one that adds none never waits because of bytes, and a launch whose own bytes
    /// exceed the bound is queued (alone) rather than waited for. Resolved once per tracker
    /// ([`Tracker::max_pending_bytes`]).
    pub max_pending_bytes: PendingBytes,
}

impl Default for ReleaseConfig {
    fn default() -> Self {
        Self {
            marker_every: 64,
            poll_every: 16,
            max_pending_guards: 65_536,
            max_pending_bytes: PendingBytes::ShareOfDevice { percent: 25 },
        }
    }
}

/// A snapshot of a [`Tracker`]'s counters. Totals count since the tracker was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Guards in the queue (deferred, not yet released).
    pub pending_guards: usize,
    /// Bytes the queue alone keeps alive (the sum of the `bytes` of the deferred launches; see
    /// [`ReleaseConfig::max_pending_bytes`]).
    pub pending_bytes: u64,
    /// Guards owned by live [`Pending`] handles (neither retired, deferred nor dropped; a
    /// forgotten handle stays here forever).
    pub held_guards: usize,
    /// Bytes owned by live [`Pending`] handles.
    pub held_bytes: u64,
    /// Guards released (dropped), including those released at once because `enqueue` failed and
    /// those whose drop panicked. (`tile_py.stats()["guards_released"]`.)
    pub guards_released: u64,
    /// Guards leaked (never dropped) because their completion could not be confirmed.
    /// (`tile_py.stats()["guards_leaked"]`.)
    pub guards_leaked: u64,
    /// Guards whose drop panicked (also counted in `guards_released`).
    pub release_panics: u64,
    /// Successful launches through the queue (sequence numbers handed out). A launch that
    /// holds nothing and returns no handle (scalars and
    /// [borrowed](crate::TensorArg::borrowed) tensors only, through `launch_queued`) does not
    /// go through the queue and is not counted.
    pub launches: u64,
    /// Markers recorded.
    pub markers_recorded: u64,
    /// Errors stored in the sticky slot, or that would have been had it been empty, and failed
    /// [`Tracker::synchronize`] calls (whose error is returned). A lost stream
    /// ([`Timeline::is_lost`]) counts once.
    pub errors: u64,
    /// Guards a thread has taken for release (off the queue, or from a retired handle) and is
    /// dropping now, outside the tracker's lock: no longer in `pending_guards` or `held_guards`,
    /// not yet in `guards_released`. The barriers wait for them.
    pub releasing_guards: usize,
}

impl Stats {
    /// The sum of two snapshots (e.g. the release queues of the per-thread default stream of
    /// several threads).
    #[must_use]
    pub fn plus(self, other: &Stats) -> Stats {
        Stats {
            pending_guards: self.pending_guards + other.pending_guards,
            pending_bytes: self.pending_bytes.saturating_add(other.pending_bytes),
            held_guards: self.held_guards + other.held_guards,
            held_bytes: self.held_bytes.saturating_add(other.held_bytes),
            guards_released: self.guards_released + other.guards_released,
            guards_leaked: self.guards_leaked + other.guards_leaked,
            release_panics: self.release_panics + other.release_panics,
            launches: self.launches + other.launches,
            markers_recorded: self.markers_recorded + other.markers_recorded,
            errors: self.errors + other.errors,
            releasing_guards: self.releasing_guards + other.releasing_guards,
        }
    }
}

/// Why a [`Tracker`] could not confirm that work completed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum CompletionError<E: std::error::Error + 'static> {
    /// Waiting for a completion marker failed.
    #[error("waiting for a completion marker failed: {0}")]
    Wait(#[source] E),
    /// Recording a completion marker failed, and the fallback whole-stream synchronisation failed
    /// too.
    #[error(
        "recording a completion marker failed ({record}), and synchronising the stream failed too: {source}"
    )]
    Synchronize {
        /// The error of [`Timeline::record`].
        record: E,
        /// The error of [`Timeline::synchronize`].
        #[source]
        source: E,
    },
}

impl<E: std::error::Error + 'static> CompletionError<E> {
    /// The driver error that decided the outcome: the wait's, or the synchronisation's.
    pub fn into_error(self) -> E {
        match self {
            Self::Wait(e) | Self::Synchronize { source: e, .. } => e,
        }
    }

    /// As [`into_error`](CompletionError::into_error), borrowed.
    pub fn error(&self) -> &E {
        match self {
            Self::Wait(e) | Self::Synchronize { source: e, .. } => e,
        }
    }
}

/// [`Pending::retire`] could not confirm that the launch completed; its guards were leaked
/// (never released, counted in [`Stats::guards_leaked`]), since the work may still be using them.
#[derive(Debug, Clone, thiserror::Error)]
#[error("could not confirm that launch #{seq} completed; its {leaked} guard(s) were leaked")]
#[non_exhaustive]
pub struct RetireError<E: std::error::Error + 'static> {
    /// The launch's sequence number.
    pub seq: u64,
    /// How many guards were leaked.
    pub leaked: usize,
    /// What failed.
    #[source]
    pub source: CompletionError<E>,
}

impl<E: std::error::Error + 'static> RetireError<E> {
    /// The driver error that decided the outcome (see [`CompletionError::into_error`]).
    pub fn into_error(self) -> E {
        self.source.into_error()
    }
}
