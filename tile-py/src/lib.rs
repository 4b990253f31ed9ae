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
//! - **Errors** map to Python exceptions in one place, [`errors`].
//!
//! # Layering
//!
//! Depends on `tile-launch` (streams, kernels, the release queue), `tile-dlpack` (ownership
//! states, validation), `cuda-sys` (a few driver queries), `dlpark` (DLPack flags), `smallvec`
//! (inline argument buffers) and `pyo3`.
//! Nothing depends on it. `pyo3` appears in this crate alone.
mod bound;
mod contexts;
mod convert;
mod cutile;
mod errors;
mod export;
mod handle;
mod hooks;
mod kernel;
mod launch;
mod lifecycle;
mod producers;
mod pytypes;
mod release;
mod stream_numbers;
mod streams;
mod worker;
mod xla;
mod xla_ffi_sys;

use pyo3::prelude::*;

#[pymodule]
fn _tile_py(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    lifecycle::record_process();
    // The crate version, which maturin also writes into the wheel's metadata.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("CudaError", errors::cuda_error_type(py))?;
    m.add(
        "DriverNotFoundError",
        errors::driver_not_found_error_type(py),
    )?;
    m.add_class::<kernel::Library>()?;
    m.add_class::<kernel::Kernel>()?;
    m.add_class::<kernel::PyParam>()?;
    m.add_class::<handle::LaunchHandle>()?;
    m.add_class::<bound::BoundLaunch>()?;
    m.add_function(wrap_pyfunction!(kernel::input, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::output, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::inout, m)?)?;
    m.add_function(wrap_pyfunction!(kernel::scalar, m)?)?;
    m.add_function(wrap_pyfunction!(launch::launch, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::stats, m)?)?;
    m.add_function(wrap_pyfunction!(hooks::_check_args, m)?)?;
    m.add_function(wrap_pyfunction!(hooks::_pack_args, m)?)?;
    m.add_function(wrap_pyfunction!(export::_export, m)?)?;
    m.add_function(wrap_pyfunction!(cutile::launch, m)?)?;
    m.add_function(wrap_pyfunction!(cutile::_cutile_clear, m)?)?;
    m.add_function(wrap_pyfunction!(cutile::_cutile_info, m)?)?;
    m.add_function(wrap_pyfunction!(cutile::_cutile_key, m)?)?;
    m.add_function(wrap_pyfunction!(cutile::_cutile_grid, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::compute_capability, m)?)?;
    m.add_function(wrap_pyfunction!(hooks::_debug_counters, m)?)?;
    m.add_function(wrap_pyfunction!(hooks::_exchange_api_cost, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(lifecycle::_after_fork_in_child, m)?)?;
    m.add_function(wrap_pyfunction!(worker::_release_thread, m)?)?;
    m.add_function(wrap_pyfunction!(worker::_queue_release, m)?)?;
    m.add_function(wrap_pyfunction!(xla::_xla_handler, m)?)?;
    m.add_function(wrap_pyfunction!(xla::_xla_register, m)?)?;
    m.add_function(wrap_pyfunction!(xla::_xla_roles, m)?)?;
    m.add_function(wrap_pyfunction!(xla::_xla_config, m)?)?;
    m.add_function(wrap_pyfunction!(xla::_xla_scalars, m)?)?;
    Ok(())
}
