//! A launch, from [`Stream::launch`](crate::Stream::launch) to the driver. The check
//! (`check.rs`: [`Stream::check`](crate::Stream::check) and the checks it runs) validates
//! everything a launch needs before anything is consumed and returns a [`Checked`] launch, the
//! proof that it did; the enqueue (`enqueue.rs`: `Stream::launch`, `Stream::launch_queued` and
//! [`Checked::launch`]) trusts that proof, consumes the tensors, orders the launch after their
//! producers and launches it into a [`LaunchHandle`] (`handle.rs`) or the stream's release
//! queue. A [`BoundLaunch`] (`bound.rs`) holds a configuration checked once for many launches.

mod bound;
mod check;
mod enqueue;
mod handle;

pub use bound::BoundLaunch;
pub use check::Checked;
pub use handle::LaunchHandle;
