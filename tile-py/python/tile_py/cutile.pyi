"""Type stubs for tile_py.cutile: cuTile kernels (``@ct.kernel``) launched through tile."""

from typing import Any, Dict, List, Optional, Sequence, Tuple

from tile_py import LaunchHandle, Param

__all__ = ["launch", "specialization_key", "params_from_signature", "cache_info", "clear_cache"]

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
    """Launches the cuTile kernel ``kernel`` on ``stream`` with ``grid`` blocks (an int or a
    1-3 tuple) and ``args``, as ``ct.launch(stream, grid, kernel, args)`` does, through
    ``tile_py.launch`` with block (1, 1, 1). The kernel is exported (cubin, calling convention
    cutile_python_v2, the stream's device's compute capability) once per specialisation and
    kept in memory. Returns a handle to wait on or poll (the consumed tensors stay on the
    stream's release queue until the kernel has finished). Raises NotImplementedError naming a parameter kind it cannot pass (list of
    arrays, tensor map, pointer, dataclass, static extents or strides other than 1), ValueError
    for arrays that overlap or a tensor that breaks the compiled layout assumptions, TypeError
    for an argument whose layout cannot be read, and every error of tile_py.launch; all before
    anything is consumed."""

def specialization_key(kernel: Any, args: Sequence[Any]) -> Tuple[Any, ...]:
    """The cache key of ``kernel`` with ``args``: what cuTile specialises on (dtype, ndim, base
    address 16-byte alignment, per dimension unit or 16-byte-divisible stride and unit or
    multiple-of-16 extent, disjoint elements, constant values, scalar types). Computed without
    cuTile. Raises as launch does for unsupported parameters and overlapping arrays."""

def params_from_signature(
    signature: Any, names: Optional[Sequence[str]] = None
) -> Tuple[List[Param], Tuple[bool, ...]]:
    """The tile parameter declarations of a cuTile KernelSignature (cutile_python_v2), and per
    leaf argument (tuples flattened) whether it is passed (False for constants)."""

def cache_info() -> Dict[str, int]:
    """``{"entries", "hits", "misses"}`` of the in-memory cache of compiled specialisations."""

def clear_cache() -> None:
    """Drops every compiled specialisation."""
