//! Launch configuration: grid, block, dynamic shared memory and launch attributes, checked
//! against a device's limits.

use crate::context::{Context, DeviceLimits};
use crate::error::{Error, Result};
use crate::library::Kernel;

/// Grid, block or cluster dimensions `(x, y, z)`, each at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Dim3 {
    /// Extent along x.
    pub x: u32,
    /// Extent along y.
    pub y: u32,
    /// Extent along z.
    pub z: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }
    /// The product `x * y * z`.
    pub fn volume(&self) -> u64 {
        u64::from(self.x) * u64::from(self.y) * u64::from(self.z)
    }
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Dim3 {
        Dim3::new(x, 1, 1)
    }
}
impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Dim3 {
        Dim3::new(x, y, 1)
    }
}
impl From<(u32, u32, u32)> for Dim3 {
    fn from((x, y, z): (u32, u32, u32)) -> Dim3 {
        Dim3::new(x, y, z)
    }
}

/// How to launch: grid and block dimensions, dynamic shared memory and launch attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Number of blocks along each axis.
    pub grid: Dim3,
    /// Number of threads per block along each axis.
    pub block: Dim3,
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
    /// Thread block cluster dimensions, in blocks (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`).
    /// Each grid dimension must be a multiple of the cluster's.
    pub cluster: Option<Dim3>,
    /// A cooperative launch, whose blocks may synchronise across the grid
    /// (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`).
    pub cooperative: bool,
    /// Programmatic dependent launch: this kernel may start before the previous kernel on the
    /// stream finishes, up to its `griddepcontrol.wait`
    /// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`).
    pub programmatic_dependent_launch: bool,
}

impl LaunchConfig {
    /// A plain launch of `grid` blocks of `block` threads.
    pub fn new(grid: impl Into<Dim3>, block: impl Into<Dim3>) -> LaunchConfig {
        LaunchConfig {
            grid: grid.into(),
            block: block.into(),
            shared_mem_bytes: 0,
            cluster: None,
            cooperative: false,
            programmatic_dependent_launch: false,
        }
    }

    /// One thread per element for `n` elements in blocks of `block` threads (grid rounded up).
    pub fn for_elements(n: u64, block: u32) -> LaunchConfig {
        let blocks = n.div_ceil(u64::from(block.max(1))).max(1);
        LaunchConfig::new(u32::try_from(blocks).unwrap_or(u32::MAX), block)
    }

    /// Checks the configuration against CUDA's rules and the device's limits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the value and the limit it breaks.
    pub fn validate(&self, limits: &DeviceLimits) -> Result<()> {
        let check = |what, value: u64, limit: u64| {
            if value == 0 {
                Err(Error::InvalidConfig {
                    what,
                    value,
                    limit: 1,
                })
            } else if value > limit {
                Err(Error::InvalidConfig { what, value, limit })
            } else {
                Ok(())
            }
        };
        let g = self.grid;
        let b = self.block;
        check("grid.x", g.x.into(), limits.max_grid[0].into())?;
        check("grid.y", g.y.into(), limits.max_grid[1].into())?;
        check("grid.z", g.z.into(), limits.max_grid[2].into())?;
        check("block.x", b.x.into(), limits.max_block[0].into())?;
        check("block.y", b.y.into(), limits.max_block[1].into())?;
        check("block.z", b.z.into(), limits.max_block[2].into())?;
        check(
            "block size (x*y*z)",
            b.volume(),
            limits.max_threads_per_block.into(),
        )?;
        // Above `max_shared_mem_per_block` the kernel opts in at launch; the kernel's static
        // shared memory is subtracted there too (`Kernel::prepare_launch`).
        if self.shared_mem_bytes > limits.max_shared_mem_per_block_optin {
            return Err(Error::InvalidConfig {
                what: "shared_mem_bytes (the device's opt-in limit per block)",
                value: self.shared_mem_bytes.into(),
                limit: limits.max_shared_mem_per_block_optin.into(),
            });
        }
        if let Some(c) = self.cluster {
            if !limits.cluster_launch {
                return Err(Error::InvalidConfig {
                    what: "cluster (device has no cluster launch)",
                    value: c.volume(),
                    limit: 0,
                });
            }
            check("cluster.x", c.x.into(), g.x.into())?;
            check("cluster.y", c.y.into(), g.y.into())?;
            check("cluster.z", c.z.into(), g.z.into())?;
            check("cluster size (x*y*z, portable limit)", c.volume(), 8)?;
            for (what, gd, cd) in [
                ("grid.x % cluster.x", g.x, c.x),
                ("grid.y % cluster.y", g.y, c.y),
                ("grid.z % cluster.z", g.z, c.z),
            ] {
                if gd % cd != 0 {
                    return Err(Error::InvalidConfig {
                        what,
                        value: gd.into(),
                        limit: cd.into(),
                    });
                }
            }
        }
        if self.cooperative && !limits.cooperative_launch {
            return Err(Error::InvalidConfig {
                what: "cooperative (device has no cooperative launch)",
                value: 1,
                limit: 0,
            });
        }
        if self.cooperative && self.grid.volume() > limits.max_cooperative_grid() {
            return Err(Error::InvalidConfig {
                what: "grid size (x*y*z) of a cooperative launch (the device's most resident \
                       blocks per SM times its SM count)",
                value: self.grid.volume(),
                limit: limits.max_cooperative_grid(),
            });
        }
        let (major, _) = limits.compute_capability;
        if self.programmatic_dependent_launch && major < 9 {
            return Err(Error::InvalidConfig {
                what: "programmatic_dependent_launch (needs compute capability 9.0; the device's \
                       major version is the value)",
                value: major.into(),
                limit: 9,
            });
        }
        Ok(())
    }
}

/// A configuration that passed [`LaunchConfig::validate`] against a device's limits, not yet
/// checked against a kernel's ([`DeviceConfig::prepare`]).
pub(crate) struct DeviceConfig<'c>(&'c LaunchConfig);

/// A configuration valid on one device for one kernel, which is prepared for it there (the
/// shared-memory opt-in, the cooperative grid bound: [`Kernel::prepare_launch`]). Only
/// [`DeviceConfig::prepare`] makes one: holding it proves both checks, so that a launch with it
/// ([`BoundLaunch`](crate::BoundLaunch)) makes neither again.
#[derive(Clone, Copy, Debug)]
#[repr(transparent)]
pub(crate) struct ValidConfig(LaunchConfig);

impl LaunchConfig {
    /// [`LaunchConfig::validate`], as the first step towards a [`ValidConfig`].
    pub(crate) fn validate_for(&self, limits: &DeviceLimits) -> Result<DeviceConfig<'_>> {
        self.validate(limits)?;
        Ok(DeviceConfig(self))
    }
}

impl<'c> DeviceConfig<'c> {
    /// Whether [`prepare`](DeviceConfig::prepare) asks the driver (the context must then be
    /// current): for dynamic shared memory or a cooperative launch.
    pub(crate) fn needs_kernel(&self) -> bool {
        self.0.shared_mem_bytes > 0 || self.0.cooperative
    }

    /// Checks the configuration against `kernel`'s limits on `ctx`'s device and prepares the
    /// kernel for it; `ctx` must be current when [`needs_kernel`](DeviceConfig::needs_kernel).
    pub(crate) fn prepare(
        self,
        kernel: &Kernel,
        d: &cuda_sys::Driver,
        ctx: &Context,
    ) -> Result<&'c ValidConfig> {
        if self.needs_kernel() {
            kernel.prepare_launch(d, ctx, self.0)?;
        }
        let config: *const LaunchConfig = self.0;
        // SAFETY: `ValidConfig` is a `repr(transparent)` wrapper of `LaunchConfig`, so a
        // reference to one is a valid reference to the other, for the same lifetime. (A
        // reference, not a copy: a checked launch keeps it, and stays small to move.)
        Ok(unsafe { &*config.cast::<ValidConfig>() })
    }
}

impl std::ops::Deref for ValidConfig {
    type Target = LaunchConfig;
    fn deref(&self) -> &LaunchConfig {
        &self.0
    }
}
