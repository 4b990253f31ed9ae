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
//! - A launch is checked completely before any tensor is consumed ([`Stream::check`], whose
//!   proof is a [`Checked`] launch); a refused launch consumes nothing and launches nothing.
//! - A consumed tensor's deleter runs exactly once, never before the launched work has
//!   completed ([`LaunchHandle`], the stream's release queue: [`release`]); a failed wait leaks
//!   rather than frees, and soundness never depends on `Drop`.
//! - Completion is tracked with amortised CUDA events, and the release queue is bounded
//!   ([`ReleaseConfig`]).
//! - A tensor written on another stream is ordered on the device ([`TensorArg::ready_on`]).
//! - A launch on a stream capturing a CUDA graph hands its tensors to the graph ([`capture`]).
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
pub mod capture;
mod config;
mod context;
mod error;
mod guard;
mod hold;
mod launch;
mod library;
#[cfg(any(feature = "cudarc", feature = "nvrtc"))]
mod probe;
pub mod release;
mod signature;
mod stream;
mod sync;
mod timeline;

#[cfg(feature = "cudarc")]
#[cfg_attr(docsrs, doc(cfg(feature = "cudarc")))]
pub mod cudarc_interop;

pub use args::{Arg, Args, INLINE_ARGS, IntoArgs, Scalar, TensorArg, TensorSource, check_device};
#[cfg(any(test, feature = "testing"))]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub use args::{check_args, pack_args};
pub use capture::{Capture, CaptureMode, CaptureStats, Graph, GraphExec, capture_stats};
pub use config::{Dim3, LaunchConfig};
pub use context::{Context, ContextGuard, DeviceLimits, MemoryKind, PointerMemory};
pub use error::{Error, LayoutError, Result};
pub use guard::{Guard, HandOff};
pub use launch::{BoundLaunch, Checked, LaunchHandle};
pub use library::{Kernel, Library};
pub use release::{PendingBytes, ReleaseConfig, Retired, Stats};
pub use signature::{
    ArrayAssumptions, ArrayField, IndexType, Intent, MAX_ASSUMED_DIMS, Param, ScalarType, Signature,
};
pub use stream::{Stream, WeakStream};
pub use timeline::{CudaTimeline, Event};

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
