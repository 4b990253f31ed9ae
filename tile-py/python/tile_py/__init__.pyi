"""Type stubs for tile_py."""

from types import TracebackType
from typing import Any, Optional, Sequence, Tuple, Type, Union

Dims = Union[int, Tuple[int], Tuple[int, int], Tuple[int, int, int]]
StreamLike = Any  # an object with __cuda_stream__, a CuPy stream, or an int handle
DTypeLike = Any  # 'float32', 'bfloat16', torch.float16, numpy.int32, ...

class CudaError(RuntimeError):
    """A CUDA driver call failed, or no driver could be loaded."""

    name: Optional[str]
    """The driver's name for the error, e.g. 'CUDA_ERROR_INVALID_VALUE'."""

class Param:
    """A declared kernel parameter; made by In, Out, InOut or Scalar."""

def In(dtype: DTypeLike) -> Param:
    """A tensor the kernel reads."""

def Out(dtype: DTypeLike) -> Param:
    """A tensor the kernel writes; read-only or self-overlapping tensors are refused."""

def InOut(dtype: DTypeLike) -> Param:
    """A tensor the kernel reads and writes."""

def Scalar(ty: str, /) -> Param:
    """A scalar by value: 'bool', 'i8'..'i64', 'u8'..'u64', 'f32', 'f64'."""

class Kernel:
    @property
    def name(self) -> str: ...
    @property
    def params(self) -> list[Param]: ...

class Library:
    @staticmethod
    def from_file(path: Union[str, "os.PathLike[str]"]) -> Library:
        """Load a cubin, fatbin or PTX file."""
    @staticmethod
    def from_bytes(data: bytes) -> Library:
        """Load a cubin, fatbin or PTX image."""
    @staticmethod
    def from_ptx(ptx: str) -> Library:
        """Load PTX text."""
    @staticmethod
    def from_cuda_source(source: str, options: Sequence[str] = ...) -> Library:
        """Compile CUDA C++ with NVRTC (declare kernels extern "C") and load it."""
    def kernel(self, name: str, params: Sequence[Param]) -> Kernel:
        """Look up a kernel and declare its parameters."""

class LaunchHandle:
    """Owns a launch's tensors until its work is done."""

    def wait(self) -> None:
        """Block (GIL released) until the work is done, then release the tensors."""
    def done(self) -> bool:
        """Whether the work is done (non-blocking); releases the tensors if so."""
    def __enter__(self) -> LaunchHandle: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

def launch(
    stream: StreamLike,
    grid: Dims,
    kernel: Kernel,
    args: Sequence[Any],
    *,
    block: Dims,
    shared_mem: Optional[int] = None,
    cluster: Optional[Dims] = None,
    cooperative: bool = False,
    programmatic_dependent_launch: bool = False,
    sync: bool = True,
) -> LaunchHandle:
    """Launch kernel on stream. Tensors are consumed only once every argument is checked."""

def synchronize() -> None:
    """Wait for all launched work, then release every deferred tensor."""

def stats() -> dict[str, int]:
    """Release-queue counters: pending/held guards and bytes, released, leaked, launches."""

def _check_args(
    params: Sequence[Param],
    args: Sequence[Any],
    *,
    stream: StreamLike = ...,
    device: int = 0,
    sync: bool = True,
    consume: bool = True,
    grid: Optional[Dims] = None,
    block: Optional[Dims] = None,
) -> None: ...
def _debug_counters() -> dict[str, int]: ...
def _shutdown(timeout: float = 5.0) -> int: ...
def _after_fork_in_child() -> None: ...

import os
