//! `tile_py`: the Python extension of tile. Launches CUDA kernels on tensors from PyTorch, CuPy,
//! JAX, cuda.core or any DLPack / `__cuda_array_interface__` producer, and keeps every consumed
//! tensor alive until the GPU work that uses it has finished.
//!
//! # Contract
//!
//! - **Checks before consuming.** A launch ([`launch`]) reads its request, converts and
//!   claims every argument ([`convert`]; torch's lazy views, outputs that require grad and JAX
//!   outputs are refused before anything is exported, [`producers`]), and has tile-launch check
//!   them all once before any tensor is consumed. A refused launch hands every
//!   claim back: nothing is lost, nothing is launched.
//! - **The stream handshake.** Producers are told the launch stream ([`convert`]'s handshake);
//!   the launch stream waits on a producer's current stream when the two differ.
//! - **Releasing.** A consumed tensor belongs to the launch's stream until its work is done;
//!   then its deleter runs exactly once, attached to the interpreter, on a thread that called
//!   into tile_py or on the release thread ([`release`]).
//! - **Holding for other launchers.** `tile_py.hold` reads objects as a launch reads its
//!   arguments and puts them on the same release path, for work another launcher enqueued
//!   ([`hold`]).
//! - **The process.** Nothing touches CUDA in a forked child or after the exit hook
//!   ([`process`]).
//! - **Errors** map to Python exceptions in one place, [`exceptions`].
//! - **Test hooks** live in `tile_py._testing` ([`testing`]), outside the package's namespace.
//!
//! # Layering
//!
//! Depends on `tile-launch` (streams, kernels, the release queue), `tile-dlpack` (ownership
//! states, validation), `cuda-sys` (a few driver queries), `dlpark` (DLPack flags), `smallvec`
//! (inline argument buffers) and `pyo3`. Nothing depends on it. `pyo3` appears in this crate
//! alone.
mod convert;
mod cutile;
mod device_contexts;
mod exceptions;
mod export;
mod hold;
mod kernel;
mod launch;
mod lifecycle;
mod prepared;
mod process;
mod producers;
mod pytypes;
mod release;
mod stream_arg;
mod testing;
mod xla;
mod xla_ffi_sys;

/// The compiled module, `tile_py._tile_py`; `tile_py` re-exports its public names.
#[pyo3::pymodule]
mod _tile_py {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::cutile::{
        _cutile_clear, _cutile_grid, _cutile_info, _cutile_key, launch as _cutile_launch,
    };
    #[pymodule_export]
    use crate::exceptions::{CudaError, DriverNotFoundError};
    #[pymodule_export]
    use crate::export::{_cai_layout, _export};
    #[pymodule_export]
    use crate::hold::hold;
    #[pymodule_export]
    use crate::kernel::{Kernel, Library, PyParam, inout, input, output, scalar};
    #[pymodule_export]
    use crate::launch::LaunchHandle;
    #[pymodule_export]
    use crate::launch::launch;
    #[pymodule_export]
    use crate::lifecycle::{compute_capability, stats, synchronize};
    #[pymodule_export]
    use crate::prepared::BoundLaunch;
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
