//! `tile_py`: the Python extension of tile. Launches CUDA kernels on tensors from PyTorch, CuPy,
//! JAX, cuda.core or any DLPack / `__cuda_array_interface__` producer, and keeps every consumed
//! tensor alive until the GPU work that uses it has finished.
//!
//! # Contract
//!
//! - **Checks before consuming.** `tile_py.launch` checks the stream, the launch configuration
//!   and the argument count before touching any argument, then converts every argument (the
//!   DLPack handshake, see [`convert`]) and has tile-launch check them all (dtype, device,
//!   writability, dense row-major layout for plain pointer parameters, the memory behind each
//!   data pointer, scalar ranges) before any tensor is consumed; torch's lazy views, torch
//!   outputs that require grad and JAX outputs are refused before anything is exported (see
//!   [`producers`]). When a check fails, every
//!   claimed capsule gets its name back and every tensor tile-py already owned is released:
//!   nothing is lost, nothing is launched.
//! - **The stream handshake.** Producers are always told the launch stream:
//!   `__dlpack__(stream=<handle>, max_version=(1, 3))`, retried (per call, never cached per
//!   type) only when the call did not bind because of a keyword tile_py passed: without
//!   `max_version`, then with the stream positionally; never without the stream (a producer's
//!   own `TypeError` propagates after one call). Handles must be below 2**63. The legacy
//!   default stream is sent as 1, never 0; the per-thread default stream (2) is sent as 1 and
//!   the launch stream waits for the legacy stream; -1 only when the caller passes `sync=False`. Producers whose type has the DLPack C
//!   exchange API (`__dlpack_c_exchange_api__`) are converted through it, and the launch stream
//!   waits on the producer's current stream when the two differ.
//! - **Releasing.** A consumed tensor belongs to the launch's handle until the work is done;
//!   then its deleter runs exactly once, with the interpreter attached, on a thread that called
//!   into tile_py or on the release thread ([`worker`], within 50 ms of the work finishing,
//!   without a call), with the tensor's context current and the capture mode relaxed — never on
//!   a CUDA callback thread and never while a CUDA wait holds the GIL (waits are made
//!   detached). See [`release`].
//! - **Errors** map to Python exceptions in one place, [`exceptions`].
//!
//! # Layering
//!
//! Depends on `tile-launch` (streams, kernels, the release queue), `tile-dlpack` (ownership
//! states, validation), `cuda-sys` (a few driver queries), `dlpark` (DLPack flags), `smallvec`
//! (inline argument buffers) and `pyo3`.
//! Nothing depends on it. `pyo3` appears in this crate alone.
mod completion;
mod convert;
mod cutile_cache;
mod device_contexts;
mod exceptions;
mod export;
mod kernel;
mod lifecycle;
mod prepared;
mod process;
mod producers;
mod pytypes;
mod release;
mod request;
mod stream_arg;
mod stream_cache;
mod stream_numbers;
mod submit;
mod testing;
mod worker;
mod xla;
mod xla_ffi_sys;

/// The compiled module, `tile_py._tile_py`; `tile_py` re-exports its public names.
#[pyo3::pymodule]
mod _tile_py {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::completion::LaunchHandle;
    #[pymodule_export]
    use crate::cutile_cache::{
        _cutile_clear, _cutile_info, _cutile_key, _cutile_plan, _cutile_register,
        _cutile_set_fallback, _cutile_try, CutileKey, launch as _cutile_launch,
    };
    #[pymodule_export]
    use crate::exceptions::{CudaError, DriverNotFoundError};
    #[pymodule_export]
    use crate::export::_export;
    #[pymodule_export]
    use crate::kernel::{Kernel, Library, PyParam, inout, input, output, scalar};
    #[pymodule_export]
    use crate::lifecycle::{compute_capability, stats, synchronize};
    #[pymodule_export]
    use crate::prepared::BoundLaunch;
    #[pymodule_export]
    use crate::submit::launch;
    #[pymodule_export]
    use crate::testing::_testing;
    #[pymodule_export]
    use crate::xla::{_xla_config, _xla_handler, _xla_register, _xla_scalars};

    /// The crate version, which maturin also writes into the wheel's metadata.
    #[pymodule_export]
    #[allow(non_upper_case_globals)]
    const __version__: &str = env!("CARGO_PKG_VERSION");

    #[pymodule_init]
    fn init(py: Python<'_>) -> PyResult<()> {
        crate::process::register(py)
    }
}
