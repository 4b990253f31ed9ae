//! DLPack ownership for tile: who owns a tensor, when its deleter runs, and whether its
//! descriptor can be trusted.
//!
//! Use it alone when you consume DLPack tensors (from Python capsules, C libraries or Rust
//! producers) and want their ownership as types and their descriptors validated, with no CUDA
//! and no Python involved; `tile-launch` builds kernel launches on it.
//!
//! # Example
//!
//! A producer exports a host `Vec<f32>` as a `DLManagedTensorVersioned` (built here with
//! [`dlpark`], re-exported by this crate) whose deleter frees the `Vec`; the consumer takes it
//! through the three states.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicUsize, Ordering};
//!
//! use tile_dlpack::dlpark::metadata::Dynamic;
//! use tile_dlpack::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned};
//! use tile_dlpack::{DType, Device, Unused};
//!
//! /// What the deleter frees: the data, and a count of deleter runs for this example.
//! struct Owner {
//!     _data: Vec<f32>,
//!     deleted: Arc<AtomicUsize>,
//! }
//!
//! impl Drop for Owner {
//!     fn drop(&mut self) {
//!         self.deleted.fetch_add(1, Ordering::SeqCst);
//!     }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The producer: a 2 x 3 f32 tensor on the CPU (row-major strides [3, 1]).
//! let mut data: Vec<f32> = vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
//! let ptr = data.as_mut_ptr(); // the heap buffer stays put when the Vec moves into `Owner`
//! let deleted = Arc::new(AtomicUsize::new(0));
//! let owner = Box::new(Owner { _data: data, deleted: Arc::clone(&deleted) });
//! let mut init = Dynamic::compact([2_i64, 3]).initialize(owner)?;
//! init.set_data(ptr.cast()).set_device(DLDevice::CPU).set_dtype(DLDataType::F32);
//! // SAFETY: data, device, dtype and shape describe the Vec, which the tensor's context owns
//! // until its deleter runs.
//! let export: *mut DLManagedTensorVersioned = unsafe { init.finish() }.into_raw();
//!
//! // Unused: the producer's export, not ours yet; `peek` validates without taking it over.
//! // SAFETY: `export` is a live descriptor that nobody else consumes or deletes.
//! let unused = unsafe { Unused::from_versioned(export) };
//! assert_eq!(unused.peek()?.shape(), &[2, 3]);
//!
//! // Used: consumed. Its deleter is ours now and runs exactly once.
//! let used = unused.consume()?;
//! let view = used.view();
//! assert_eq!((view.dtype(), view.device()), (DType::F32, Device::CPU));
//! assert_eq!(view.strides(), &[3, 1]);
//! assert_eq!(view.data_ptr(), ptr as u64);
//! assert_eq!(deleted.load(Ordering::SeqCst), 0);
//!
//! // Released: the deleter has run; the token exposes no pointer.
//! let _released = used.release();
//! assert_eq!(deleted.load(Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```
//!
//! A Rust producer can skip the raw pointer: [`Used::from_managed_versioned`] takes dlpark's
//! `Managed` directly. A C producer or a Python capsule hands over the pointer, as above.
//!
//! # What this crate promises
//!
//! - **Ownership states are types.** A producer's export starts as an [`Unused`] (we do not
//!   own it: dropping it never calls the deleter). [`Unused::consume`] turns it into a
//!   [`Used`] (we own it: its deleter runs exactly once, when it is released or dropped, and
//!   never because of a `mem::forget`, which leaks). [`Used::release`] returns a [`Released`]
//!   token, which exposes nothing. Consuming twice, or using a view after release, does not
//!   compile (`tests/ui/`).
//! - **Nothing lost on the error path.** Once a tensor is consumed it is ours on every path:
//!   if validation fails, or the major version is unsupported, the deleter runs before the
//!   error is returned.
//! - **Every descriptor is validated before anything is read from it as trusted**, with a
//!   typed [`DescriptorError`] naming the field and value: ndim in `0..=`[`MAX_NDIM`], shape
//!   pointer, negative dimensions, the [dtype table](DType), device type and ordinal, null
//!   data (allowed only when the tensor is empty), alignment of `data + byte_offset` for the
//!   dtype, and every size and address computation overflow-checked. No input panics.
//! - **Views are borrowed and cheap.** [`TensorView`] (from [`Used::view`] or
//!   [`Unused::peek`]) is computed once at validation: shape, strides in elements (compact
//!   row-major strides computed when the descriptor has none), data pointer with
//!   `byte_offset` applied, element count, [`ByteExtent`], flags. It cannot outlive the value
//!   it borrows from. [`TensorView::check_writable`] checks an output (read-only flag,
//!   `IS_COPIED` flag, internal overlap).
//!
//! # What it leaves to the caller
//!
//! - The raw-pointer contract of [`Unused::from_legacy`] / [`Unused::from_versioned`]: a
//!   live, unchanging descriptor that nobody else consumes, and marking the export consumed
//!   (renaming a capsule) once [`Unused::consume`] is called.
//! - Keeping the [`Used`] alive until the GPU work that touches its memory has finished
//!   (that is `tile-launch`'s job), and matching the device against the launch stream.
//! - Whatever the data pointer points to: DLPack does not describe the allocation, so the
//!   memory itself is never read here.
//!
//! # Policies
//!
//! - **Versions.** Legacy `DLManagedTensor` and `DLManagedTensorVersioned` of major version 1
//!   (any minor) are accepted; another major version is [`DescriptorError::UnsupportedVersion`]
//!   and nothing past the version field is read (on consume, the deleter still runs, once).
//! - **Null strides** mean compact row-major for every tensor, including versioned tensors of
//!   DLPack 1.2 and later, whose header forbids null strides for `ndim > 0`: accepting them is
//!   the tolerant choice, and they have exactly one sensible meaning.
//! - **Legacy tensors have no flags**: [`TensorView::is_read_only`] is `false` for them, and
//!   whether they may be written is the producer's word.
//! - **Limits.** `ndim <= 64` ([`MAX_NDIM`]); element count in `u64`; strides, extents and
//!   `byte_offset` arithmetic in checked `i64`/`u64`.
//!
//! # Dependencies
//!
//! `dlpark` (the DLPack FFI structs, re-exported as [`ffi`], and `Managed`, whose drop runs a
//! deleter exactly once) and `thiserror`. Nothing else: no CUDA, no Python.
//!
//! # Features
//!
//! - `cudarc`: enables dlpark's `cudarc` interop, whose exports become [`Used`] through
//!   [`Used::from_managed_legacy`] / [`Used::from_managed_versioned`].
//! - `testing`: the `testing` module, hand-built descriptors with a counting deleter, for
//!   the tests of this crate and of the crates above it.

/// The `dlpark` crate, for Rust producers (`Managed`, its allocation builders, its `cudarc`
/// interop) that hand tensors to [`Used::from_managed_legacy`] /
/// [`Used::from_managed_versioned`] without depending on it (and its version) themselves.
pub use dlpark;
/// The DLPack C structs and constants (`DLManagedTensor`, `DLManagedTensorVersioned`,
/// `DLTensor`, `DLDevice`, `DLDataType`, ...), from `dlpark`.
pub use dlpark::ffi;

mod device;
mod dtype;
mod error;
mod owned;
mod taken;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod view;

#[cfg(test)]
mod tests;

pub use device::Device;
pub use dtype::DType;
pub use error::DescriptorError;
pub use owned::{Released, Unused, Used};
pub use taken::Taken;
pub use view::{ByteExtent, TensorView};

/// The largest `ndim` accepted. Tensors of higher rank are rejected with
/// [`DescriptorError::NdimOutOfRange`]. 64 is NumPy 2's own limit, far above the rank any
/// kernel uses, and bounds the work validation does per tensor.
pub const MAX_NDIM: i32 = 64;

/// The examples of this crate's `README.md`, compiled (and run, unless marked `no_run`) as
/// doctests so that they stay correct.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
