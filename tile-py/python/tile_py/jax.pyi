"""Type stubs for tile_py.jax: tile kernels and cuTile kernels inside ``jax.jit`` through XLA's
FFI."""

from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import tile_py

__all__ = [
    "TARGET",
    "call",
    "cutile_call",
    "OutputPlaceholder",
    "InputOutput",
    "kernel_id",
    "register_target",
    "attributes",
]

TARGET: str
"""The name of tile's FFI target (one for every kernel), registered for platform ``CUDA``."""

def register_target() -> None: ...
def kernel_id(kernel: tile_py.Kernel) -> int: ...
def attributes(
    kernel: tile_py.Kernel, grid: Any, block: Any, shared_mem: Any, scalars: Sequence[Any]
) -> Dict[str, int]: ...
def call(
    kernel: Any,
    *,
    out_shapes: Any = ...,
    grid: Any,
    block: Any = ...,
    shared_mem: Any = ...,
    input_output_aliases: Optional[Mapping[int, int]] = ...,
    vmap_method: Optional[str] = ...,
) -> Callable[..., Any]: ...

class OutputPlaceholder:
    """An output of ``cutile_call``: XLA allocates an array of ``shape`` and ``dtype``."""

    shape: Tuple[int, ...]
    dtype: Any
    def __init__(self, shape: Sequence[int], dtype: Any) -> None: ...

class InputOutput:
    """An array the kernel updates in place (aliased by XLA to an output)."""

    array: Any
    def __init__(self, array: Any) -> None: ...

def cutile_call(grid: Any, kernel: Any, args: Sequence[Any]) -> Any: ...
