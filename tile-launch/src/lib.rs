//! Launch CUDA kernels on DLPack tensors, and keep every consumed tensor alive until the GPU
//! work that uses it has finished.
//!
//! Use it when you launch kernels on tensors that other libraries own (PyTorch, CuPy, JAX,
//! `cudarc`, or any DLPack producer) and must not free before the kernel has run. It needs an
//! NVIDIA driver at run time only; building needs neither the driver nor the CUDA toolkit.
//!
//! # Example
//!
//! Load a kernel, declare its parameters, launch it on three consumed tensors and retire the
//! launch (compiled, not run here: it needs a GPU and a PTX file). The kernel is `vector_add` of
//! `tile-launch/kernels/vector_add.cu`, compiled ahead with `nvcc -ptx vector_add.cu -o
//! vector_add.ptx`; it is declared `extern "C"`, so the library knows it by that name (feature
//! `nvrtc` adds `Library::from_cuda_source`, which compiles at run time). The tensors are
//! [`tile_dlpack::Used`]: a producer's DLPack tensor once consumed,
//! `unsafe { tile_dlpack::Unused::from_versioned(ptr) }.consume()?` on the
//! `DLManagedTensorVersioned` another library exported (or a [`TensorArg`] made by
//! `cudarc_interop::tensor`, feature `cudarc`, from a `cudarc` slice). The workspace README has a
//! complete program.
//!
//! ```no_run
//! use tile_launch::tile_dlpack::{DType, Used};
//! use tile_launch::{Context, Library, LaunchConfig, Param, ScalarType, Signature, Stream};
//!
//! fn vector_add(a: Used, b: Used, c: Used) -> Result<(), tile_launch::Error> {
//!     let ctx = Context::new(0)?;
//!     let stream = Stream::new(&ctx)?;
//!     let lib = Library::from_file("vector_add.ptx")?;
//!     let kernel = lib.kernel(
//!         "vector_add",
//!         Signature::new([
//!             // Plain pointers take dense tensors only, so each stride passed is 1.
//!             Param::input(DType::F32),
//!             Param::scalar(ScalarType::I64),
//!             Param::input(DType::F32),
//!             Param::scalar(ScalarType::I64),
//!             Param::output(DType::F32),
//!             Param::scalar(ScalarType::I64),
//!             Param::scalar(ScalarType::U64),
//!         ]),
//!     )?;
//!     let n = a.view().numel();
//!     let handle = stream.launch(
//!         &kernel,
//!         &LaunchConfig::for_elements(n, 256),
//!         [a.into(), 1i64.into(), b.into(), 1i64.into(), c.into(), 1i64.into(), n.into()],
//!     )?;
//!     handle.retire()?; // waits, then runs the three deleters
//!     Ok(())
//! }
//! ```
//!
//! # Contract
//!
//! - [`Stream::launch`] checks a launch completely (configuration against the device's limits,
//!   argument count and kinds, dtypes, devices, writability of outputs, scalar ranges) before it
//!   consumes any tensor. When a check fails, nothing is consumed and nothing is launched.
//! - Consumed tensors ([`tile_dlpack::Used`]) are owned by the returned [`LaunchHandle`]. Their
//!   deleters run exactly once, and never before the launched work has completed: after
//!   [`LaunchHandle::retire`] has waited, when [`LaunchHandle::try_retire`] or the stream's release
//!   queue has seen the work complete, or when a dropped handle has waited. A failed wait leaks
//!   the tensors (counted in [`Stream::stats`]) rather than risk freeing memory in use.
//!   Soundness never depends on `Drop`: a forgotten handle leaks.
//! - Completion is tracked with CUDA events, amortised: one event covers every launch enqueued
//!   on the stream before it, so deferred launches record an event only every
//!   [`ReleaseConfig::marker_every`] launches. The queue is bounded in guards and bytes; past
//!   the bound, a launch first waits for the oldest work.
//! - A tensor whose data is written on another stream is ordered with
//!   [`TensorArg::ready_on`]: the launch stream waits on the device, the host never blocks.
//! - The stream's context is made current for the launch and restored afterwards. Every tensor's
//!   DLPack device must be the stream's device, and the driver must know its data pointer as
//!   device, managed or page-locked host memory (one `cuPointerGetAttributes` per tensor,
//!   [`Context::memory_of_pointer`]; skipped for tensors the caller vouches for with
//!   [`TensorArg::trust_memory`], whose device ordinal is checked only with several devices
//!   visible, [`Stream::checks_pointer_devices`]).
//! - A plain pointer parameter takes a dense row-major tensor; a parameter declared
//!   [`Param::strided`] takes any layout.
//! - A launch on a stream that is capturing a CUDA graph becomes part of the graph, which owns
//!   its tensors through a CUDA user object until the last graph, clone or executable graph
//!   holding it is destroyed; the tensors are then released by a dedicated thread, never on a
//!   CUDA callback thread ([`capture`]). [`Stream::begin_capture`] is a minimal capture API.
//! - Launch configuration (grid, block, cluster, cooperative, programmatic dependent launch,
//!   dynamic shared memory up to the opt-in limit) is checked against the device's and the
//!   kernel's limits before anything is consumed ([`LaunchConfig::validate`]); a
//!   [`BoundLaunch`] ([`Stream::bind`]) checks it once for many launches.
//!
//! # Layering
//!
//! Depends on `tile-cuda-sys` (library `cuda_sys`, the raw driver API), `tile-dlpack`
//! (ownership states and validation), `thiserror`, `log` and `smallvec`; optionally `cudarc`
//! (features `cudarc`, `nvrtc`). It knows nothing of Python. The release queue ([`release`]) is
//! written against the [`release::Timeline`] trait so that it is tested on the CPU with a
//! manual-completion fake (feature `testing`: `release::fake`).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod args;
mod array;
mod bound;
pub mod capture;
mod capture_state;
mod check;
mod config;
mod context;
mod error;
mod guard;
mod handle;
mod launch;
mod module;
pub mod release;
mod stream;
mod sync;

#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub mod cudarc_interop;

pub use args::{Arg, Scalar, TensorArg, TensorSource, check_args, pack_args};
pub use array::{ArrayAssumptions, ArrayField, IndexType, MAX_ASSUMED_DIMS};
pub use bound::BoundLaunch;
pub use capture::{Capture, CaptureMode, CaptureStats, Graph, GraphExec, capture_stats};
pub use check::Checked;
pub use config::{Dim3, LaunchConfig};
pub use context::{Context, ContextGuard, DeviceLimits, MemoryKind, PointerMemory};
pub use error::{Error, LayoutError, Result};
pub use guard::{Guard, HandOff};
pub use handle::LaunchHandle;
pub use module::{Intent, Kernel, Library, Param, ScalarType, Signature};
pub use release::{PendingBytes, ReleaseConfig, Retired, Stats};
pub use stream::{CudaTimeline, Event, Stream, WeakStream};

pub use cuda_sys;
pub use tile_dlpack;

/// The examples of this crate's `README.md`, compiled (and run, unless marked `no_run`) as
/// doctests so that they stay correct. Its program uses features `cudarc` and `nvrtc`.
#[cfg(all(doctest, feature = "cudarc", feature = "nvrtc"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust snippets of the workspace's `README.md`, compiled as doctests (they use features
/// `cudarc` and `nvrtc`). The file is outside this package, so only a workspace build has them.
#[cfg(all(doctest, feature = "cudarc", feature = "nvrtc"))]
#[doc = include_str!("../../README.md")]
pub struct WorkspaceReadmeDoctests;

/// The Rust snippets of the workspace's Rust guide, `docs/rust.md`, compiled as doctests (features
/// `cudarc` and `nvrtc`; like the workspace README, only a workspace build has them).
#[cfg(all(doctest, feature = "cudarc", feature = "nvrtc"))]
#[doc = include_str!("../../docs/rust.md")]
pub struct RustGuideDoctests;
