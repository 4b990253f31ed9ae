//! Where a tensor's memory lives: [`Device`].

use std::fmt;

use crate::DescriptorError;
use crate::ffi::{DLDevice, DLDeviceType};

/// A DLPack device: a device type and a device ordinal.
///
/// Validation accepts every device type the DLPack 1.3 header defines (CPU, CUDA, CUDA host,
/// OpenCL, Vulkan, Metal, VPI, ROCm, ROCm host, ext_dev, CUDA managed, oneAPI, WebGPU, Hexagon,
/// MAIA, Trainium) with a non-negative ordinal, and rejects anything else with
/// [`DescriptorError::InvalidDevice`]. Whether the device suits a launch (CUDA, the stream's
/// device) is decided by the launcher, not here.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Device {
    /// `DLDeviceType` code.
    pub device_type: DLDeviceType,
    /// Device ordinal (0 for CPU, CUDA host and CUDA managed memory by convention).
    pub device_id: i32,
}

impl Device {
    /// Host memory.
    pub const CPU: Self = Self {
        device_type: DLDeviceType::CPU,
        device_id: 0,
    };

    /// CUDA device memory on the device with ordinal `device_id`.
    pub const fn cuda(device_id: i32) -> Self {
        Self {
            device_type: DLDeviceType::CUDA,
            device_id,
        }
    }

    /// `kDLCUDA`: memory of one CUDA device.
    pub const fn is_cuda(self) -> bool {
        matches!(self.device_type, DLDeviceType::CUDA)
    }

    /// Memory a CUDA kernel can address: `kDLCUDA`, `kDLCUDAManaged` (unified memory) or
    /// `kDLCUDAHost` (pinned host memory).
    pub const fn is_cuda_accessible(self) -> bool {
        matches!(
            self.device_type,
            DLDeviceType::CUDA | DLDeviceType::CUDAHOST | DLDeviceType::CUDAMANAGED
        )
    }

    /// `Ok` for a device type defined by DLPack and a non-negative ordinal, else
    /// [`DescriptorError::InvalidDevice`].
    pub(crate) fn check(self) -> Result<(), DescriptorError> {
        if self.device_type.is_known() && self.device_id >= 0 {
            Ok(())
        } else {
            Err(DescriptorError::InvalidDevice {
                device_type: self.device_type.0,
                device_id: self.device_id,
            })
        }
    }
}

impl From<DLDevice> for Device {
    fn from(device: DLDevice) -> Self {
        Self {
            device_type: device.device_type,
            device_id: device.device_id,
        }
    }
}

impl From<Device> for DLDevice {
    fn from(device: Device) -> Self {
        Self {
            device_type: device.device_type,
            device_id: device.device_id,
        }
    }
}

/// `cuda:0`, `cuda_host:0`, `cuda_managed:0`, `cpu` (or `cpu:N` for a nonzero ordinal), and
/// `device_type T:N` for every other device type.
impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let id = self.device_id;
        match self.device_type {
            DLDeviceType::CPU if id == 0 => f.write_str("cpu"),
            DLDeviceType::CPU => write!(f, "cpu:{id}"),
            DLDeviceType::CUDA => write!(f, "cuda:{id}"),
            DLDeviceType::CUDAHOST => write!(f, "cuda_host:{id}"),
            DLDeviceType::CUDAMANAGED => write!(f, "cuda_managed:{id}"),
            DLDeviceType(other) => write!(f, "device_type {other}:{id}"),
        }
    }
}
