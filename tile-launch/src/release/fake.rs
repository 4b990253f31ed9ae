//! A [`Timeline`] whose work completes only when the test says so (feature `testing`).
//!
//! The fake models one stream: [`FakeTimeline::enqueue`] adds a unit of work (call it from the
//! `enqueue` closure of [`Tracker::launch`](super::Tracker::launch)); a marker recorded after
//! `n` units covers units `1..=n`; the test completes work with
//! [`complete_work`](FakeTimeline::complete_work),
//! [`complete_through`](FakeTimeline::complete_through) (by marker number) or
//! [`complete_all`](FakeTimeline::complete_all). Every operation can be made to fail, and
//! every call is counted.
//!
//! By default, [`wait`](Timeline::wait) and [`synchronize`](Timeline::synchronize) complete the
//! work they wait for themselves (the simulated GPU finishes when someone waits). With
//! [`set_blocking(true)`](FakeTimeline::set_blocking) they block until another thread completes
//! it, which is what tests of blocking behaviour need.
//!
//! Cloning is cheap and shares the timeline, so a test's guards can hold a clone and check
//! [`is_work_complete`](FakeTimeline::is_work_complete) when they are dropped.

use std::sync::Arc;

use super::Timeline;
use crate::sync::{self, Condvar, Mutex};

/// An operation of the fake, for failure injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FakeOp {
    /// [`Timeline::record`].
    Record,
    /// [`Timeline::query`].
    Query,
    /// [`Timeline::wait`].
    Wait,
    /// [`Timeline::synchronize`].
    Synchronize,
}

impl FakeOp {
    fn index(self) -> usize {
        match self {
            Self::Record => 0,
            Self::Query => 1,
            Self::Wait => 2,
            Self::Synchronize => 3,
        }
    }
}

/// How many times each operation was called (failed calls included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct FakeCalls {
    /// Calls of [`Timeline::record`].
    pub record: u64,
    /// Calls of [`Timeline::query`].
    pub query: u64,
    /// Calls of [`Timeline::wait`].
    pub wait: u64,
    /// Calls of [`Timeline::synchronize`].
    pub synchronize: u64,
    /// Calls of [`Timeline::recycle`].
    pub recycle: u64,
    /// Successful calls of [`Timeline::rerecord`] and [`Timeline::rerecord_at_launch`] (each
    /// also counted in `record` and in [`FakeTimeline::markers_recorded`]: a marker recorded
    /// again is recorded, with no new marker to recycle).
    pub rerecord: u64,
    /// Calls of [`Timeline::record`] or [`Timeline::synchronize`] made, and refused, on a thread
    /// other than the one a [`bound`](FakeTimeline::bind_to_current_thread) timeline belongs to.
    pub foreign: u64,
}

/// An injected failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("injected failure of {op:?} (fake timeline)")]
#[non_exhaustive]
pub struct FakeError {
    /// The operation that failed.
    pub op: FakeOp,
    /// Whether the failure says the stream is lost ([`Timeline::is_lost`]): injected by
    /// [`FakeTimeline::lose`].
    pub lost: bool,
}

impl FakeError {
    fn of(op: FakeOp) -> Self {
        Self { op, lost: false }
    }
}

/// A marker of the fake: its number (1 for the first recorded) and the work it covers.
#[derive(Debug)]
pub struct FakeMarker {
    id: u64,
    covers: u64,
}

impl FakeMarker {
    /// The marker's number: 1 for the first marker recorded, 2 for the next, ...
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The marker completes when work units `1..=covers` have completed.
    pub fn covers(&self) -> u64 {
        self.covers
    }
}

/// "Fail forever".
const ALWAYS: u32 = u32::MAX;

struct FakeState {
    enqueued: u64,
    completed: u64,
    /// What marker `i + 1` covers.
    markers: Vec<u64>,
    /// Failures to inject per operation ([`ALWAYS`] = every call).
    failures: [u32; 4],
    blocking: bool,
    calls: FakeCalls,
    /// For a thread-bound timeline: the thread it belongs to.
    owner: Option<std::thread::ThreadId>,
    /// What [`Timeline::device_memory`] answers.
    device_memory: Option<u64>,
    /// Whether the stream is "capturing": [`Timeline::can_record_now`] answers `false`, and
    /// `record` fails.
    capturing: bool,
    /// Whether the stream is lost ([`FakeTimeline::lose`]): every operation fails with a lost
    /// error.
    lost: bool,
    /// Whether the handle may be named only inside launch calls
    /// ([`FakeTimeline::set_launch_only`]).
    launch_only: bool,
}

impl FakeState {
    /// Refuses `op` (record or synchronize) on a thread other than the owner's, as the
    /// per-thread default stream cannot be named from there.
    fn refuse_if_foreign(&mut self, op: FakeOp) -> Result<(), FakeError> {
        if self.launch_only
            || self
                .owner
                .is_some_and(|owner| owner != std::thread::current().id())
        {
            self.calls.foreign += 1;
            return Err(FakeError::of(op));
        }
        Ok(())
    }

    fn should_fail(&mut self, op: FakeOp) -> Result<(), FakeError> {
        if self.lost {
            return Err(FakeError { op, lost: true });
        }
        let left = &mut self.failures[op.index()];
        match *left {
            0 => Ok(()),
            ALWAYS => Err(FakeError::of(op)),
            _ => {
                *left -= 1;
                Err(FakeError::of(op))
            }
        }
    }
}

struct Shared {
    state: Mutex<FakeState>,
    progressed: Condvar,
}

/// A manual-completion [`Timeline`]; see the [module documentation](self).
#[derive(Clone)]
pub struct FakeTimeline {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeTimeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = sync::lock(&self.shared.state);
        f.debug_struct("FakeTimeline")
            .field("enqueued", &st.enqueued)
            .field("completed", &st.completed)
            .field("markers", &st.markers.len())
            .field("calls", &st.calls)
            .finish_non_exhaustive()
    }
}

impl Default for FakeTimeline {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeTimeline {
    /// A timeline with no work, no markers, no failures, non-blocking waits.
    pub fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(FakeState {
                    enqueued: 0,
                    completed: 0,
                    markers: Vec::new(),
                    failures: [0; 4],
                    blocking: false,
                    calls: FakeCalls::default(),
                    owner: None,
                    device_memory: None,
                    capturing: false,
                    lost: false,
                    launch_only: false,
                }),
                progressed: Condvar::new(),
            }),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        f(&mut sync::lock(&self.shared.state))
    }

    /// Makes this a thread-bound timeline ([`Timeline::thread_bound`]) belonging to the calling
    /// thread, as CUDA's per-thread default stream is: [`Timeline::record`] and
    /// [`Timeline::synchronize`] then fail on every other thread (counted in
    /// [`FakeCalls::foreign`]).
    pub fn bind_to_current_thread(&self) {
        self.with(|st| st.owner = Some(std::thread::current().id()));
    }

    /// Makes [`Timeline::device_memory`] answer `bytes` (a device of that much memory); a new
    /// fake answers `None`. Set it before creating the tracker, which reads it once.
    pub fn set_device_memory(&self, bytes: u64) {
        self.with(|st| st.device_memory = Some(bytes));
    }

    /// Enqueues one unit of work; returns its number (1 for the first).
    pub fn enqueue(&self) -> u64 {
        self.with(|st| {
            st.enqueued += 1;
            st.enqueued
        })
    }

    /// Units of work enqueued so far.
    pub fn enqueued(&self) -> u64 {
        self.with(|st| st.enqueued)
    }

    /// Units of work completed so far (work completes in order: units `1..=completed`).
    pub fn completed(&self) -> u64 {
        self.with(|st| st.completed)
    }

    /// Whether unit `work` has completed.
    pub fn is_work_complete(&self, work: u64) -> bool {
        self.with(|st| work <= st.completed)
    }

    /// Completes units `1..=work` (capped at what was enqueued).
    pub fn complete_work(&self, work: u64) {
        self.with(|st| st.completed = st.completed.max(work.min(st.enqueued)));
        self.shared.progressed.notify_all();
    }

    /// Completes the work covered by marker number `marker` (and so every earlier marker).
    ///
    /// # Panics
    ///
    /// If no marker with that number was recorded.
    pub fn complete_through(&self, marker: u64) {
        let covers = self.with(|st| {
            let index = usize::try_from(marker).ok().and_then(|m| m.checked_sub(1));
            match index.and_then(|i| st.markers.get(i)) {
                Some(&covers) => covers,
                None => panic!(
                    "no marker #{marker} was recorded ({} were)",
                    st.markers.len()
                ),
            }
        });
        self.complete_work(covers);
    }

    /// Completes all work enqueued so far.
    pub fn complete_all(&self) {
        let enqueued = self.enqueued();
        self.complete_work(enqueued);
    }

    /// Markers recorded so far (successful [`Timeline::record`] calls).
    pub fn markers_recorded(&self) -> u64 {
        self.with(|st| st.markers.len() as u64)
    }

    /// Whether marker number `marker` has completed (`false` if it was never recorded).
    pub fn is_marker_complete(&self, marker: u64) -> bool {
        self.with(|st| {
            let index = usize::try_from(marker).ok().and_then(|m| m.checked_sub(1));
            index
                .and_then(|i| st.markers.get(i))
                .is_some_and(|&covers| covers <= st.completed)
        })
    }

    /// With `true`, [`wait`](Timeline::wait) and [`synchronize`](Timeline::synchronize) block
    /// until another thread completes the work; with `false` (the default) they complete it.
    pub fn set_blocking(&self, blocking: bool) {
        self.with(|st| st.blocking = blocking);
    }

    /// With `true`, the stream is "capturing a graph": [`can_record_now`](Timeline::can_record_now)
    /// answers `false` and [`record`](Timeline::record) fails (counted in [`FakeCalls::record`]).
    pub fn set_capturing(&self, capturing: bool) {
        self.with(|st| st.capturing = capturing);
    }

    /// Makes the next `times` calls of `op` fail.
    pub fn fail_next(&self, op: FakeOp, times: u32) {
        self.with(|st| st.failures[op.index()] = times.min(ALWAYS - 1));
    }

    /// Makes every call of `op` fail until [`clear_failures`](FakeTimeline::clear_failures).
    pub fn fail_always(&self, op: FakeOp) {
        self.with(|st| st.failures[op.index()] = ALWAYS);
    }

    /// Loses the stream, as a destroyed stream or context, or a fault that poisons the context,
    /// does: from now on every operation fails with an error that [`Timeline::is_lost`] says is
    /// lost ([`FakeError::lost`]). Not undone by [`clear_failures`](FakeTimeline::clear_failures).
    pub fn lose(&self) {
        self.with(|st| st.lost = true);
    }

    /// Makes the handle usable only inside launch calls, as for
    /// `Stream::from_raw_launch_only`: the timeline is [`thread_bound`](Timeline::thread_bound)
    /// (a marker at every launch, [`Timeline::record_at_launch`]), never
    /// [`reachable_here`](Timeline::reachable_here), and [`Timeline::record`] and
    /// [`Timeline::synchronize`] fail (counted in [`FakeCalls::foreign`]).
    pub fn set_launch_only(&self, on: bool) {
        self.with(|st| st.launch_only = on);
    }

    /// Stops injecting failures.
    pub fn clear_failures(&self) {
        self.with(|st| st.failures = [0; 4]);
    }

    /// How many times each operation was called.
    pub fn calls(&self) -> FakeCalls {
        self.with(|st| st.calls)
    }

    /// [`Timeline::record`]; with `checked`, refused where the handle cannot be named
    /// (another thread of a bound timeline, or a launch-only one outside a launch); without it
    /// ([`Timeline::record_at_launch`]), refused on another thread of a bound timeline only.
    fn record_checked(&self, checked: bool) -> Result<FakeMarker, FakeError> {
        self.with(|st| {
            st.calls.record += 1;
            if checked {
                st.refuse_if_foreign(FakeOp::Record)?;
            } else {
                let launch_only = std::mem::replace(&mut st.launch_only, false);
                let r = st.refuse_if_foreign(FakeOp::Record);
                st.launch_only = launch_only;
                r?;
            }
            if st.capturing {
                return Err(FakeError::of(FakeOp::Record));
            }
            st.should_fail(FakeOp::Record)?;
            st.markers.push(st.enqueued);
            Ok(FakeMarker {
                id: st.markers.len() as u64,
                covers: st.enqueued,
            })
        })
    }

    /// Blocks (blocking mode) or completes (default) until units `1..=work` have completed.
    fn finish(&self, work: u64) {
        let mut st = sync::lock(&self.shared.state);
        if !st.blocking {
            st.completed = st.completed.max(work);
            drop(st);
            self.shared.progressed.notify_all();
            return;
        }
        while st.completed < work {
            st = self
                .shared
                .progressed
                .wait(st)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }
}

impl Timeline for FakeTimeline {
    type Marker = FakeMarker;
    type Error = FakeError;

    fn record(&self) -> Result<FakeMarker, FakeError> {
        self.record_checked(true)
    }

    fn record_at_launch(&self) -> Result<FakeMarker, FakeError> {
        self.record_checked(false)
    }

    fn rerecord(&self, marker: &mut FakeMarker) -> Result<(), FakeError> {
        *marker = self.record_checked(true)?;
        self.with(|st| st.calls.rerecord += 1);
        Ok(())
    }

    fn rerecord_at_launch(&self, marker: &mut FakeMarker) -> Result<(), FakeError> {
        *marker = self.record_checked(false)?;
        self.with(|st| st.calls.rerecord += 1);
        Ok(())
    }

    fn is_lost(&self, error: &FakeError) -> bool {
        error.lost
    }

    fn query(&self, marker: &FakeMarker) -> Result<bool, FakeError> {
        self.with(|st| {
            st.calls.query += 1;
            st.should_fail(FakeOp::Query)?;
            Ok(marker.covers <= st.completed)
        })
    }

    fn wait(&self, marker: &FakeMarker) -> Result<(), FakeError> {
        self.with(|st| {
            st.calls.wait += 1;
            st.should_fail(FakeOp::Wait)
        })?;
        self.finish(marker.covers);
        Ok(())
    }

    fn synchronize(&self) -> Result<(), FakeError> {
        let enqueued = self.with(|st| {
            st.calls.synchronize += 1;
            st.refuse_if_foreign(FakeOp::Synchronize)?;
            st.should_fail(FakeOp::Synchronize).map(|()| st.enqueued)
        })?;
        self.finish(enqueued);
        Ok(())
    }

    fn recycle(&self, _marker: FakeMarker) {
        self.with(|st| st.calls.recycle += 1);
    }

    fn thread_bound(&self) -> bool {
        self.with(|st| st.owner.is_some() || st.launch_only)
    }

    fn reachable_here(&self) -> bool {
        self.with(|st| !st.launch_only && st.owner.is_none_or(|o| o == std::thread::current().id()))
    }

    fn device_memory(&self) -> Option<u64> {
        self.with(|st| st.device_memory)
    }

    fn can_record_now(&self) -> bool {
        self.with(|st| !st.capturing)
    }
}
