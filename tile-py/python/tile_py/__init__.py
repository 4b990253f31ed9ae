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
    compute_capability,
    hold,
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
    "hold",
    "launch",
    "stats",
    "synchronize",
]
