//! Tests that need a CUDA device. Run with `cargo test -p cuda-sys -- --ignored`; without a
//! driver or a device they fail.

use std::ffi::CStr;

use cuda_sys::{CUdevice, CUdevice_attribute, CuResultExt, driver};

#[test]
#[ignore = "needs a CUDA device"]
fn driver_loads_and_sees_a_device() {
    let cuda = driver().expect("a CUDA driver and device");
    println!("{cuda:?}: CUDA driver {}", cuda.version());
    assert!(cuda.version() >= 13000, "driver older than CUDA 13.0");

    let mut count = 0;
    // SAFETY: `count` is valid for a write and the driver is initialised.
    unsafe { (cuda.cuDeviceGetCount)(&mut count) }
        .check("cuDeviceGetCount")
        .unwrap();
    assert!(count >= 1, "no CUDA device");

    let mut device: CUdevice = 0;
    // SAFETY: ordinal 0 exists (count >= 1); `device` is valid for a write.
    unsafe { (cuda.cuDeviceGet)(&mut device, 0) }
        .check("cuDeviceGet")
        .unwrap();
    let mut name = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer holds `name.len()` bytes; the driver NUL-terminates what it writes.
    unsafe { (cuda.cuDeviceGetName)(name.as_mut_ptr(), name.len() as i32, device) }
        .check("cuDeviceGetName")
        .unwrap();
    // SAFETY: the driver wrote a NUL-terminated string into `name`.
    let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
    let mut major = 0;
    // SAFETY: `major` is valid for a write; `device` is a valid device.
    unsafe {
        (cuda.cuDeviceGetAttribute)(
            &mut major,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            device,
        )
    }
    .check("cuDeviceGetAttribute")
    .unwrap();
    println!("{count} device(s); device 0: {name} (compute capability {major}.x)");
    assert!(!name.is_empty());

    let error = cuda_sys::CUresult::CUDA_ERROR_INVALID_VALUE
        .check("test")
        .unwrap_err();
    assert_eq!(error.description(), Some("invalid argument"));
    assert_eq!(
        error.to_string(),
        "test failed: CUDA_ERROR_INVALID_VALUE (invalid argument)"
    );
}
