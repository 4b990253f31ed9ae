"""Type stubs for tile_py.jax: tile kernels inside ``jax.jit`` through XLA's FFI."""

from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import tile_py

__all__ = ["TARGET", "call", "kernel_id", "register_target", "attributes"]

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
