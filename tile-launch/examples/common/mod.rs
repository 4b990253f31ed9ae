//! What the launch benchmark (`bench_launch.rs`) and the instruction-count profile
//! (`launch_profile.rs`) share: the vector add's two declarations and its DLPack tensors.

use std::ffi::c_void;

use anyhow::Result;
use cuda_sys::CUdeviceptr;
use tile_dlpack::dlpark::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLManagedTensorVersioned};
use tile_dlpack::dlpark::metadata::Dynamic;
use tile_dlpack::{DType, Used};
use tile_launch::{Param, ScalarType, Signature};

/// Elements per tensor.
pub const N: usize = 4096;

/// `vector_add(a, a_stride, b, b_stride, c, c_stride, n)`: three float32 tensors, each with its
/// stride, and the element count.
pub fn vector_add_signature() -> Signature {
    Signature::new([
        Param::input(DType::F32).strided(),
        Param::scalar(ScalarType::I64),
        Param::input(DType::F32).strided(),
        Param::scalar(ScalarType::I64),
        Param::output(DType::F32).strided(),
        Param::scalar(ScalarType::I64),
        Param::scalar(ScalarType::U64),
    ])
}

/// The same kernel with its pointers declared as plain 64-bit scalars: a launch that consumes
/// no tensor, to separate the fixed cost from the tensors' cost.
pub fn raw_pointer_signature() -> Signature {
    Signature::new([
        Param::scalar(ScalarType::U64),
        Param::scalar(ScalarType::I64),
        Param::scalar(ScalarType::U64),
        Param::scalar(ScalarType::I64),
        Param::scalar(ScalarType::U64),
        Param::scalar(ScalarType::I64),
        Param::scalar(ScalarType::U64),
    ])
}

/// A versioned DLPack tensor of N float32 at `ptr`, whose deleter drops `owner`.
pub fn tensor<O: Send + 'static>(ptr: CUdeviceptr, owner: O) -> Result<Used> {
    let mut init = Dynamic::new([N as i64], [1i64])
        .prepare_as::<DLManagedTensorVersioned>()?
        .initialize(Box::new(owner));
    init.set_data(ptr as usize as *mut c_void)
        .set_device(DLDevice::cuda(0))
        .set_dtype(DLDataType {
            code: DLDataTypeCode::FLOAT,
            bits: 32,
            lanes: 1,
        });
    // SAFETY: every field is set; the caller's buffers outlive the tensors.
    let managed = unsafe { init.finish() };
    Ok(Used::from_managed_versioned(managed)?)
}
