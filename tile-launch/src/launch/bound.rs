//! Prepared launches: a kernel, a launch configuration and a stream bound once
//! ([`Stream::bind`]), launched many times with new arguments ([`BoundLaunch`]).

use std::fmt;

use super::check::{Checked, Config, check};
use super::handle::LaunchHandle;
use crate::args::IntoArgs;
use crate::config::{LaunchConfig, ValidConfig};
use crate::error::Result;
use crate::library::Kernel;
use crate::stream::Stream;

/// A kernel, a launch configuration and a stream, the configuration checked once by
/// [`Stream::bind`]; each launch makes the other checks of [`Stream::check`] and launches as
/// [`Stream::launch`] does. Cloning is cheap (it shares the stream and the kernel).
///
/// What binding checked is not checked again: a primary context reset after binding (which
/// drops a kernel's shared-memory opt-in) makes a later launch that needs the opt-in fail with
/// the driver's error (`CUDA_ERROR_INVALID_VALUE`), with nothing consumed; bind again then.
#[derive(Clone)]
pub struct BoundLaunch {
    stream: Stream,
    kernel: Kernel,
    config: ValidConfig,
}

impl fmt::Debug for BoundLaunch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundLaunch")
            .field("kernel", &self.kernel.name())
            .field("config", &*self.config)
            .field("stream", &self.stream.raw())
            .finish()
    }
}

impl Stream {
    /// Binds `kernel` and `config` to this stream for repeated launches: checks the
    /// configuration against the device's limits and prepares the kernel for it once (the
    /// shared-memory opt-in, `cuKernelSetAttribute`; the cooperative grid bound,
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessor`), so that [`BoundLaunch::launch`] makes
    /// none of those checks again.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming the limit and the value;
    /// [`Error::Cuda`](crate::Error::Cuda) when a driver call fails;
    /// [`Error::Driver`](crate::Error::Driver) when no driver is installed. Nothing is bound
    /// then.
    #[doc(alias = "cuKernelSetAttribute")]
    pub fn bind(&self, kernel: &Kernel, config: &LaunchConfig) -> Result<BoundLaunch> {
        let ctx = self.context();
        let device = config.validate_for(ctx.limits())?;
        let d = cuda_sys::driver()?;
        let _bound = if device.needs_kernel() {
            Some(ctx.bind_with(d)?)
        } else {
            None
        };
        Ok(BoundLaunch {
            stream: self.clone(),
            kernel: kernel.clone(),
            config: *device.prepare(kernel, d, ctx)?,
        })
    }
}

impl BoundLaunch {
    /// The stream launches go to.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The bound kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The bound configuration.
    pub fn config(&self) -> &LaunchConfig {
        &self.config
    }

    /// Checks a launch of the bound kernel with `args`, as [`Stream::check`] does, without
    /// checking the configuration or preparing the kernel again.
    ///
    /// # Errors
    ///
    /// As [`Stream::check`], less the configuration's
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) (checked by [`Stream::bind`]).
    #[inline]
    pub fn check<'s, 'a>(&'s self, args: impl IntoArgs<'a>) -> Result<Checked<'s, 'a>> {
        check(
            &self.stream,
            &self.kernel,
            Config::Valid(&self.config),
            args,
        )
    }

    /// Launches the bound kernel with `args` into a handle, as [`Stream::launch`] does, without
    /// checking the configuration again.
    ///
    /// # Errors
    ///
    /// As [`Stream::launch`], less the configuration's
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) (checked by [`Stream::bind`]).
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch<'a>(&self, args: impl IntoArgs<'a>) -> Result<LaunchHandle> {
        self.check(args)?.launch()
    }

    /// As [`Stream::launch_queued`]: the tensors go straight to the stream's release queue.
    ///
    /// # Errors
    ///
    /// As [`launch`](BoundLaunch::launch).
    #[doc(alias = "cuLaunchKernel")]
    #[inline]
    pub fn launch_queued<'a>(&self, args: impl IntoArgs<'a>) -> Result<()> {
        self.check(args)?.launch_queued()
    }
}
