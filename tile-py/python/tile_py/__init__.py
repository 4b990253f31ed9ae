"""Launch CUDA kernels on tensors from PyTorch, CuPy, JAX, cuda.core or any DLPack /
``__cuda_array_interface__`` producer, and keep every consumed tensor alive until the GPU work
that uses it has finished.

    import tile_py

    lib = tile_py.Library.from_cuda_source(SOURCE)
    add = lib.kernel("vector_add", [tile_py.In("float32"), tile_py.In("float32"),
                                    tile_py.Out("float32"), tile_py.Scalar("u64")])
    h = tile_py.launch(torch.cuda.current_stream(), (n + 255) // 256, add, (a, b, c, n),
                       block=256)
    h.wait()   # or let it go: the tensors are on the stream's release queue already

Importing needs no GPU; the CUDA driver is loaded on first use. Without one, the first call
that needs it raises ``tile_py.DriverNotFoundError`` (a ``tile_py.CudaError``).
"""

import atexit as _atexit
import os as _os

from ._tile_py import (
    BoundLaunch,
    CudaError,
    DriverNotFoundError,
    In,
    InOut,
    Kernel,
    LaunchHandle,
    Library,
    Out,
    Param,
    Scalar,
    _check_args,
    _export,
    _pack_args,
    _debug_counters,
    _exchange_api_cost,
    _after_fork_in_child,
    _queue_release,
    _release_thread,
    _shutdown,
    compute_capability,
    launch,
    stats,
    synchronize,
    __version__,
)

__all__ = [
    "BoundLaunch",
    "CudaError",
    "DriverNotFoundError",
    "In",
    "InOut",
    "Kernel",
    "LaunchHandle",
    "Library",
    "Out",
    "Param",
    "Scalar",
    "compute_capability",
    "launch",
    "stats",
    "synchronize",
]

def _bind(
    self,
    stream,
    grid,
    *,
    block,
    shared_mem=None,
    cluster=None,
    cooperative=False,
    programmatic_dependent_launch=False,
):
    """Binds this kernel to `stream` and a launch configuration for repeated launches, and
    returns a `BoundLaunch` (the same as `BoundLaunch(stream, grid, kernel, block=..., ...)`):
    `bound(*args)` then launches as `launch(stream, grid, kernel, args, block=..., ...)` does.
    The configuration is checked against the device once, here; each call checks only its
    arguments."""
    return BoundLaunch(
        stream,
        grid,
        self,
        block=block,
        shared_mem=shared_mem,
        cluster=cluster,
        cooperative=cooperative,
        programmatic_dependent_launch=programmatic_dependent_launch,
    )


# `Kernel.bind` is defined here, over `BoundLaunch`'s constructor, so that the extension's
# kernel module and its prepared-launch module do not import each other.
Kernel.bind = _bind
del _bind

# At exit: wait a little for pending work, release what finished, leak (and count) the rest.
_atexit.register(_shutdown)

# In a child made by os.fork(): refuse to launch, and never run the parent's deleters (leaked).
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)
