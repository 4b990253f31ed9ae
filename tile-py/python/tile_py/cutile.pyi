"""Type stubs for tile_py.cutile: cuTile kernels (``@ct.kernel``) launched through tile."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, final

from tile_py import LaunchHandle, Param

__all__ = [
    "MAX_GRID_DIM",
    "launch",
    "install",
    "installed",
    "params_from_signature",
    "cache_info",
    "clear_cache",
]

MAX_GRID_DIM: int
"""cuTile's largest grid dimension, 2**24 - 1 (larger ones may compute wrong tile block IDs)."""

def launch(
    stream: Any,
    grid: Any,
    kernel: Any,
    args: Sequence[Any],
    /,
    *,
    programmatic_dependent_launch: bool = False,
    cooperative: bool = False,
    block_in_cluster_count: Any = None,
) -> LaunchHandle:
    """Launches the cuTile kernel ``kernel`` on ``stream`` with ``grid`` blocks and ``args``, as
    ``ct.launch(stream, grid, kernel, args)`` does, through ``tile_py.launch`` with block
    (1, 1, 1). ``stream``: a torch, CuPy or numba-cuda stream, an object with
    ``__cuda_stream__`` (cuda.core), or an int handle (0 and 1: the legacy default stream).
    ``grid``: a tuple of at most 3 ints, padded with 1s (``()`` is one block), each at most
    ``MAX_GRID_DIM``, or an int. ``args``: PyTorch tensors, any ``__dlpack__`` producer (exported
    once, with the launch stream; that export is launched), DLPack capsules,
    ``__cuda_array_interface__`` objects, scalars, tuples, lists of arrays (staged through
    PyTorch, kept with their exports until the kernel is done). The kernel is exported (cubin,
    calling convention cutile_python_v2, the stream's device's compute capability) once per
    specialisation and kept in memory; a launch whose specialisation was compiled before runs
    no Python. Returns a handle to wait on or poll (the consumed
    tensors stay on the stream's release queue until the kernel has finished). Raises cuTile's
    errors first where ct.launch raises them (grid, kernel, argument count, compiling for these
    arguments), TypeError for an unhashable constant, NotImplementedError naming a parameter kind it cannot pass (tensor map,
    pointer, dataclass, negative static extents or strides), ValueError for
    arrays that overlap or a tensor that breaks the compiled layout assumptions, and every
    error of tile_py.launch; all before anything is consumed."""

def install() -> _Installed:
    """Routes every ``ct.launch`` through tile: ``cuda.tile.launch`` and
    ``cuda.tile._cext.launch`` become a function with ct.launch's signature and return value
    (None) that calls ``launch``. Returns an object whose ``uninstall()`` (or the end of a
    ``with`` block) puts back what was there before."""

def installed() -> bool:
    """Whether ``ct.launch`` is routed through tile now."""

@final
class _Installed:
    def __init__(self) -> None: ...
    def uninstall(self) -> None: ...
    def __enter__(self) -> _Installed: ...
    def __exit__(self, *exc: Any) -> None: ...

def params_from_signature(
    signature: Any, names: Optional[Sequence[str]] = None
) -> Tuple[List[Param], Tuple[bool, ...]]:
    """The tile parameter declarations of a cuTile KernelSignature (cutile_python_v2), and per
    leaf argument (tuples flattened) whether it is passed (False for constants)."""

def cache_info() -> Dict[str, int]:
    """``{"entries", "hits", "misses"}`` of the in-memory cache of compiled specialisations."""

def clear_cache() -> None:
    """Drops every compiled specialisation."""
