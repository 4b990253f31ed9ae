//! A launch, from [`Stream::launch`] to the driver. The check ([`Stream::check`], `check.rs`)
//! validates everything a launch needs before anything is consumed and returns a [`Checked`]
//! launch, the proof that it did; the enqueue (`enqueue.rs`) trusts that proof, consumes the
//! tensors, orders the launch after their producers and launches it into a [`LaunchHandle`]
//! (`handle.rs`) or the stream's release queue. A [`BoundLaunch`] (`bound.rs`) holds a
//! configuration checked once for many launches.

mod bound;
mod check;
mod enqueue;
mod handle;

pub use bound::BoundLaunch;
pub use check::Checked;
pub use handle::LaunchHandle;

use crate::args::Arg;
use crate::config::LaunchConfig;
use crate::error::Result;
use crate::library::Kernel;
use crate::stream::Stream;
use check::Config;

impl Stream {
    /// Checks a launch of `kernel` with `config` and `args` on this stream, consuming nothing,
    /// and returns it [`Checked`], ready to be launched. A failed check consumes nothing:
    /// tensors handed over already consumed are released, `Unused` ones are left to their
    /// producers.
    ///
    /// Checks, in this order: the configuration against the device's limits, every argument
    /// against the kernel's [`Signature`](crate::Signature) (count, kind, dtype, device,
    /// writability of outputs, dense row-major layout for plain pointer parameters, scalar
    /// range), the kernel's own limits for the configuration (dynamic shared memory, cooperative
    /// occupancy), the memory of each tensor (unless [trusted](crate::TensorArg::trust_memory),
    /// the driver must know its data pointer as device, managed or page-locked host memory: one
    /// `cuPointerGetAttributes` per tensor), whether the stream is capturing a graph (one
    /// `cuStreamGetCaptureInfo`), and then that each producer stream joins that capture.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig), [`Error::ArgumentCount`](crate::Error::ArgumentCount), [`Error::ArgumentKind`](crate::Error::ArgumentKind),
    /// [`Error::DtypeMismatch`](crate::Error::DtypeMismatch), [`Error::DeviceMismatch`](crate::Error::DeviceMismatch), [`Error::PointerDeviceMismatch`](crate::Error::PointerDeviceMismatch),
    /// [`Error::NotDeviceMemory`](crate::Error::NotDeviceMemory), [`Error::NotContiguous`](crate::Error::NotContiguous), [`Error::Descriptor`](crate::Error::Descriptor),
    /// [`Error::NdimMismatch`](crate::Error::NdimMismatch), [`Error::IndexOverflow`](crate::Error::IndexOverflow), [`Error::ProducerOutsideCapture`](crate::Error::ProducerOutsideCapture),
    /// and [`Error::Cuda`](crate::Error::Cuda) from a driver call the checks make (e.g.
    /// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`).
    #[doc(alias = "cuStreamGetCaptureInfo")]
    #[doc(alias = "cuPointerGetAttributes")]
    #[inline]
    pub fn check<'s, 'a>(
        &'s self,
        kernel: &'s Kernel,
        config: &'s LaunchConfig,
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<Checked<'s, 'a>> {
        check::check(self, kernel, Config::ToCheck(config), args)
    }

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
        args: impl IntoIterator<Item = Arg<'a>>,
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
        args: impl IntoIterator<Item = Arg<'a>>,
    ) -> Result<()> {
        self.check(kernel, config, args)?.launch_queued()
    }
}
