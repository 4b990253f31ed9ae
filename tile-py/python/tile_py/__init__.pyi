"""Type stubs for tile_py."""

import os
from types import TracebackType
from typing import Any, List, Optional, Sequence, SupportsIndex, Tuple, Type, Union, final

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

__version__: str
"""The version of tile_py (the Rust crate's version, as in the wheel's metadata), e.g. '0.1.0'."""

# Type aliases for the annotations below; they exist in the stub only.
# An int, or a tuple or list of 1 to 3 of them; NumPy integer scalars count (anything with __index__ but a bool).
_Dim = SupportsIndex
_Dims = Union[_Dim, Tuple[_Dim], Tuple[_Dim, _Dim], Tuple[_Dim, _Dim, _Dim], List[_Dim]]
_StreamLike = Any  # an object with __cuda_stream__, a CuPy or numba stream, or an int handle
_DTypeLike = Any  # 'float32', 'bfloat16', torch.float16, numpy.int32, ...

class CudaError(RuntimeError):
    """A CUDA driver call failed, or no driver could be loaded."""

    name: Optional[str]
    """The driver's name for the error, e.g. 'CUDA_ERROR_INVALID_VALUE'; None if no driver call
    was made (no driver could be loaded, or it lacks an entry point tile_py needs)."""
    function: Optional[str]
    """The driver call that returned the error, e.g. 'cuLaunchKernel'; None as for name."""

class DriverNotFoundError(CudaError):
    """The CUDA driver library could not be opened: no NVIDIA driver is installed, or
    TILE_LIBCUDA names a missing file. `name` and `function` are None; the message names the
    library and the loader's reason. Raised by the first call that needs the driver (a launch,
    a Library load), never by `import tile_py`."""

@final
class Param:
    """A declared kernel parameter; made by In, Out, InOut or Scalar."""

    @property
    def is_tensor(self) -> bool:
        """Whether the parameter is a tensor (In, Out, InOut) rather than a scalar."""
    @property
    def writes(self) -> bool:
        """Whether the kernel writes the parameter's tensor (Out, InOut)."""

def In(
    dtype: _DTypeLike,
    *,
    ndim: Optional[int] = None,
    index: Optional[str] = None,
    assume: Optional[dict[str, Any]] = None,
    strided: bool = False,
) -> Param:
    """A tensor the kernel reads: a pointer to its first element (data + byte_offset).

    Unless ``strided=True`` (the kernel is passed the strides itself) or ``ndim`` is given, the
    tensor must be dense row-major (``ValueError`` naming its shape and strides otherwise): the
    kernel indexes the pointer densely. Lazy conjugate or negative torch views are refused
    (``ValueError``).

    With ``ndim`` (0 to 32), an array parameter: ``1 + 2 * ndim`` kernel parameters, the
    pointer, then the ``ndim`` extents, then the ``ndim`` strides in elements, each in
    ``index`` ('i32', 'u32' or 'i64'; default 'i64'). Any layout is accepted; a tensor of
    another ndim raises TypeError, an extent or stride that does not fit ``index`` raises
    OverflowError, both before anything is consumed. Each of the kernel parameters is checked
    against the compiled kernel's size (cuKernelGetParamInfo).

    ``assume`` (array parameters only) names layout assumptions the kernel was compiled under,
    checked at every launch before anything is consumed (a tensor that breaks one raises
    ValueError naming the rule): ``base_addr_divisible_by`` (bytes), ``stride_divisible_by`` and
    ``shape_divisible_by`` (one int per dimension, in elements), ``unit_stride`` and
    ``unit_shape`` (dimensions whose stride, or extent, is 1), ``nonnegative_strides`` and
    ``disjoint`` (no two indices address one element). Per-dimension assumptions cover at most
    the first 8 dimensions.

    Declaring raises ValueError for an unknown dtype, index type or assumption, or an ndim
    outside 0 to 32, and TypeError for a value of the wrong type (``strided`` not a bool,
    ``assume`` not a dict, ``index`` or ``assume`` without ``ndim``, ``strided=True`` with
    ``ndim``)."""

def Out(
    dtype: _DTypeLike,
    *,
    ndim: Optional[int] = None,
    index: Optional[str] = None,
    assume: Optional[dict[str, Any]] = None,
    strided: bool = False,
) -> Param:
    """A tensor the kernel writes. ``ndim``, ``index``, ``assume`` and ``strided`` as for In.

    Refused with ``ValueError``: read-only (``DLPACK_FLAG_BITMASK_READ_ONLY``), copied
    (``DLPACK_FLAG_BITMASK_IS_COPIED``) or self-overlapping tensors, torch tensors that require
    grad, JAX arrays (immutable), and, for a plain pointer parameter, tensors that are not dense
    row-major."""

def InOut(
    dtype: _DTypeLike,
    *,
    ndim: Optional[int] = None,
    index: Optional[str] = None,
    assume: Optional[dict[str, Any]] = None,
    strided: bool = False,
) -> Param:
    """A tensor the kernel reads and writes; refused as for ``Out``. ``ndim``, ``index``,
    ``assume`` and ``strided`` as for In."""

def Scalar(ty: str, /) -> Param:
    """A scalar by value: 'bool', 'i8'..'i64', 'u8'..'u64', 'f32', 'f64'. Raises ValueError
    for another name."""

@final
class Kernel:
    @property
    def name(self) -> str: ...
    @property
    def params(self) -> list[Param]: ...
    def bind(
        self,
        stream: _StreamLike,
        grid: _Dims,
        *,
        block: _Dims,
        shared_mem: Optional[SupportsIndex] = None,
        cluster: Optional[_Dims] = None,
        cooperative: bool = False,
        programmatic_dependent_launch: bool = False,
    ) -> BoundLaunch:
        """Binds this kernel to `stream` and a launch configuration for repeated launches, and
        returns a `BoundLaunch`: `bound(*args)` then launches as `launch(stream, grid, kernel,
        args, block=..., ...)` does. The arguments are as for `launch`. The configuration is
        checked against the device once, here (and the kernel opted in to more than 48 KiB of
        dynamic shared memory, `cuKernelSetAttribute`); each call checks only its arguments.

        Raises `TypeError` or `ValueError` for a bad stream, grid, block, shared memory or
        kernel (as `launch` does, before anything is bound), `ValueError` in a child made by
        `os.fork()` or during interpreter exit, `tile_py.CudaError` (a failed driver call) and
        `tile_py.DriverNotFoundError` (no CUDA driver could be loaded).
        """

@final
class BoundLaunch:
    """A kernel bound to a stream and a launch configuration (`Kernel.bind`); calling it
    launches. `BoundLaunch(stream, grid, kernel, block=..., ...)` is `kernel.bind(stream, grid,
    block=..., ...)`."""

    def __new__(
        cls,
        stream: _StreamLike,
        grid: _Dims,
        kernel: Kernel,
        *,
        block: _Dims,
        shared_mem: Optional[SupportsIndex] = None,
        cluster: Optional[_Dims] = None,
        cooperative: bool = False,
        programmatic_dependent_launch: bool = False,
    ) -> BoundLaunch: ...
    def __call__(self, *args: Any, sync: bool = True) -> LaunchHandle:
        """Launches the bound kernel with `args` (one per declared parameter) and returns the
        `LaunchHandle`, as `launch` does: every argument is
        checked (count, kinds, dtypes, devices, writability, overlap, scalar ranges) before any
        tensor is consumed, producers are ordered before the bound stream, and tensors are
        released only after the work is done. `sync` is as for `launch`. Raises as `launch`
        does, less the configuration's errors (checked at bind time)."""
    @property
    def kernel(self) -> Kernel:
        """The bound kernel."""

@final
class Library:
    """Loaded device code: a cubin, fatbin or PTX, or CUDA C++ compiled with NVRTC. Loading
    raises TypeError for an argument of the wrong type, CudaError when the driver refuses the
    image, DriverNotFoundError when no CUDA driver could be loaded, and ValueError in a child
    made by os.fork()."""

    @staticmethod
    def from_file(path: Union[str, "os.PathLike[str]"]) -> Library:
        """Load a cubin, fatbin or PTX file. Raises OSError (FileNotFoundError, ...) as open()
        does when the file cannot be read."""
    @staticmethod
    def from_bytes(data: bytes) -> Library:
        """Load a cubin, fatbin or PTX image."""
    @staticmethod
    def from_ptx(ptx: str) -> Library:
        """Load PTX text."""
    @staticmethod
    def from_cuda_source(source: str, options: Sequence[str] = ...) -> Library:
        """Compile CUDA C++ with NVRTC (declare kernels extern "C") and load it. Raises
        RuntimeError with NVRTC's log when compilation fails, or when NVRTC cannot be loaded."""
    def kernel(self, name: str, params: Sequence[Param]) -> Kernel:
        """Look up a kernel and declare its parameters. Raises TypeError for a declaration
        that does not match the compiled kernel's parameters, ValueError for a name with a NUL
        and in a child made by os.fork(), and CudaError for a name the library lacks
        (CUDA_ERROR_NOT_FOUND)."""

@final
class LaunchHandle:
    """Waits for a launch, or asks whether it is done. It owns nothing: the launch's tensors
    are on the stream's release queue until its work is done, so dropping the handle does
    nothing."""

    def wait(self) -> None:
        """Block (GIL released) until the work is done, then release the tensors. Raises
        tile_py.CudaError when the driver reports the wait failed (a kernel fault, a lost
        context)."""
    def done(self) -> bool:
        """Whether the work is done (non-blocking); releases the tensors if so. Raises
        tile_py.CudaError as wait does."""
    def __enter__(self) -> LaunchHandle: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> bool: ...

def launch(
    stream: _StreamLike,
    grid: _Dims,
    kernel: Kernel,
    args: Sequence[Any],
    *,
    block: _Dims,
    shared_mem: Optional[SupportsIndex] = None,
    cluster: Optional[_Dims] = None,
    cooperative: bool = False,
    programmatic_dependent_launch: bool = False,
    sync: bool = True,
) -> LaunchHandle:
    """Launches `kernel` on `stream` with `args`, and returns a handle to wait on or poll
    (the consumed tensors are on the stream's release queue until the kernel has finished).

    - `stream`: an object with `__cuda_stream__` (torch, cuda.core), a CuPy or numba-cuda
      stream, a CUDA `torch.Stream` (`torch.accelerator.current_stream()`, and streams inside
      `torch.compile`), or an int handle (1: legacy default stream, 2: per-thread default
      stream, which producers are asked to order their work before through the legacy default
      stream; 0 and None are refused).
      An int handle must name a live stream during the call and keep naming that stream until
      the work launched on it has finished (it may be destroyed after that).
    - `grid`, `block`: blocks per grid and threads per block, an int or a tuple or list of 1 to
      3 ints (x, y, z).
    - `args`: one per declared parameter: DLPack producers, capsules,
      `__cuda_array_interface__` objects, Python or NumPy scalars. A tensor's DLPack device must
      be device memory (`kDLCUDA`) or managed memory (`kDLCUDAManaged`) of the stream's device,
      or pinned host memory (`kDLCUDAHost`, any device id); host memory (`kDLCPU`) and other
      devices are refused with a `ValueError`, and so is a data pointer the driver does not know
      as device, managed or page-locked host memory (host memory labelled as device memory).
    - `shared_mem`: dynamic shared memory per block, in bytes: an int, NumPy integer scalars
      included, never a bool (above 48 KiB is opted into).
    - `cluster`: thread-block cluster dimensions, in blocks (compute capability 9.0+).
    - `cooperative`: a cooperative launch (grid-wide sync); the grid must fit on the device at once.
    - `programmatic_dependent_launch`: may start before the previous kernel on the stream ends.
    - `sync`: False sends stream=-1 to producers and inserts no stream waits.

    Every argument is checked before any tensor is consumed; producers are asked to order their
    pending work before `stream` (`__dlpack__(stream=...)` or the DLPack C exchange API). The launch
    is one `cuLaunchKernel` (`cuLaunchKernelEx` when launch attributes are set). Tensors are
    released (their deleters run) only after an event shows the work has finished: at
    `LaunchHandle.wait()` or `done()`, at a later call into tile_py, or by the release thread
    within 50 ms (the handle owns nothing: dropping it does nothing).

    Raises `TypeError` (parameter kinds, dtypes, counts, a `__dlpack__` that takes no stream),
    `ValueError` (devices, host memory, host memory labelled as device memory, read-only,
    copied or self-overlapping outputs, tensors that are not dense row-major for plain pointer
    parameters, lazy conjugate / negative torch views, outputs that require grad or are JAX
    arrays, grid/block/cluster/shared memory limits; a launch in a child made by `os.fork()`
    or during interpreter exit), `BufferError` (DLPack version), `OverflowError` (sizes,
    scalar ranges), `RuntimeError` (tensor memory on another device than its descriptor says,
    a producer outside a graph capture in progress), `tile_py.CudaError` (a failed driver
    call), and its subclass `tile_py.DriverNotFoundError` (no CUDA driver could be loaded).
    An exception a producer raises (its `__dlpack__`, `__index__`, `__float__`, ...) keeps its
    object and type, with a note naming the argument (`argument i: raised while converting this
    argument`; `grid[0]: ...` for a configuration value's `__index__`); only a value that
    converts but does not fit is tile_py's own error.
    """

def hold(stream: _StreamLike, *objects: Any) -> None:
    """Keeps each of `objects` alive until all the work enqueued on `stream` up to this call has
    completed, then releases it; returns None without waiting for that work (but see below).

    This is what a launcher that is not tile_py calls right after enqueueing work that uses
    `objects`, instead of dropping them (or calling a DLPack deleter) when its launch call
    returns: the objects join `stream`'s release queue as the tensors of a `tile_py.launch`
    do, and are released once an event recorded after this call shows the work done (at a later
    call into tile_py, or by tile_py's release thread within 50 ms). Inside a CUDA graph capture
    of `stream`, the graph owns them instead, until it and every executable graph made from it
    are destroyed.

    - `stream`: as for `launch`: an object with `__cuda_stream__` (torch, cuda.core), a CuPy or
      numba-cuda stream, a CUDA `torch.Stream`, or an int handle (1: legacy default stream, 2:
      per-thread default stream; 0 and None are refused). An int handle must name a live stream
      during the call and keep naming that stream until the work this call holds the objects for has
      finished (as for `launch`: tile_py names it only inside the calls that launch or hold on it,
      and reads completion from the events those calls record there, newest first, so a handle
      destroyed while that work runs and reused by a new stream would let them go early).
    - `objects`, each one of:
      - a DLPack producer (an object with `__dlpack__`, or PyTorch's C exchange API): exported
        as `launch` exports an argument for `stream` (`__dlpack__(stream=...)`, so the producer
        orders its pending work before later work on `stream`), and that export is held: its
        deleter runs once the work is done, and it keeps the producer's memory alive until
        then, even if the producer object is deleted. No stream wait is inserted. A host producer
        whose `__dlpack__` refuses the stream, as DLPack asks of host memory (a NumPy array, a CPU
        tensor: a host staging buffer of an async copy), is held as any other object is.
      - a DLPack capsule named `dltensor` or `dltensor_versioned`: consumed (renamed
        `used_dltensor[_versioned]`) and held; its deleter runs once the work is done.
      - a DLPack capsule named `used_dltensor` or `used_dltensor_versioned`, which a launcher
        consumed (it read the pointer and renamed the capsule): the caller hands over the duty
        to call the tensor's deleter, which tile_py runs once the work is done. Nothing of it is
        read but its deleter: whatever its descriptor says, it is held, never refused. The
        caller must not call that deleter itself afterwards, nor pass a capsule whose deleter
        was called already (tile_py cannot tell). A capsule tile_py consumed itself (passed to
        `launch` or `hold` before, or claimed through another object of the call) is refused
        (`ValueError`): its deleter is tile_py's already.
      - any other object (including `__cuda_array_interface__` objects without `__dlpack__`): a
        strong reference, dropped once the work is done (with the GIL, on a thread that calls
        into tile_py or on tile_py's release thread).

    Every object is read before anything is held: when one is refused, the capsules claimed before
    it get their names back, the exports made for the call are released, and nothing is taken over
    or held. The driver calls, per call whatever the number of objects: the stream's context made
    current, one `cuStreamGetCaptureInfo`, then, as for a launch, an amortised `cuEventRecord` and
    `cuEventQuery`, or under capture `cuUserObjectCreate` and `cuGraphRetainUserObject`. It does not
    wait for the work it holds, with one exception: a call of more objects than the release queue's
    guard bound (65,536) waits for that work before returning, as a launch of that many tensors
    does; like a launch, it waits for older work (with the GIL released) when `stream`'s release
    queue is at its bound. Each hold counts as one of `stats()["launches"]`, and each object as one
    of `pending_guards` until the work is done.

    Raises `TypeError` (a stream of an unsupported type; a capsule with another name or none, a
    `__dlpack__` that returns something else than a capsule or takes no stream), `ValueError`
    (stream 0 or another bad stream value; the same capsule twice; a DLPack capsule of a null
    pointer; an export or unconsumed capsule whose descriptor does not validate; a lazy
    conjugate / negative torch view; a call in a child made by
    `os.fork()` or during interpreter exit), `BufferError` (DLPack version), `OverflowError`
    (descriptor sizes), `tile_py.CudaError` (a failed driver call: resolving the stream; reading its
    capture state, when what was read is leaked rather than released early; attaching it to the
    graph being captured) and its subclass `tile_py.DriverNotFoundError` (no CUDA driver). An error
    names the object at fault as `argument i` (`i` counting from 0 among `objects`); an
    exception a producer raises keeps its type, with that note.
    """

def synchronize() -> None:
    """Wait for the work of every stream that holds tensors not yet released (streams with
    nothing pending are not touched), then release every deferred tensor: on return, every
    deleter of work launched before the call has run, including those another thread (the
    release thread, or a thread inside a tile_py call) was still running; it waits for them with
    the GIL released. Called from inside a deleter, it does not wait for releases under way on
    other threads (that could deadlock; see `stats()["releasing"]`). Streams whose tensors are
    all released are then forgotten (their stream objects no longer kept alive). Never raises for one
    stream's trouble: a failed wait is counted in `stats()["errors"]`, and a stream found lost
    (destroyed, its context reset, a kernel fault) leaks what it held (counted in `leaked`) and
    is forgotten."""

def stats() -> dict[str, int]:
    """Counters of tile_py's streams and release queues. Polls the streams first (non-blocking)
    and runs the queued releases, so tensors whose work has finished are released. Never raises
    for one stream's trouble (see `synchronize`).

    - `streams`: streams tile_py holds: one per device and stream handle with launches whose tensors are
      not all released yet. Once its work is released a stream is forgotten: its stream object is
      no longer kept alive and its handle is never touched again (it may be destroyed and reused).
    - `pending_guards`, `pending_bytes`: guards (one per tensor, and one per
      `__cuda_array_interface__` object kept alive) of launches, and one per object of `hold`,
      queued on the streams' release queues until an event shows their work finished, and the
      bytes among them that only the queue keeps alive (exports the producer copied for the
      launch, DLPack `IS_COPIED`; a tensor the caller still holds counts 0). The bytes are
      bounded by a quarter of the device's memory: past it, a launch that adds such bytes first
      waits for older work.
    - `held_guards`, `held_bytes`: always 0 in tile_py, whose launches put their tensors straight on
      the release queue (kept for parity with Rust's `Stream::stats`).
    - `released`: DLPack deleters tile_py has run (tensors released, and the descriptors it
      makes for `__cuda_array_interface__` objects), on every path: `wait()` / `done()`,
      release queues, CUDA graphs, and exports dropped by a failed check.
    - `guards_released`: guards the streams' release queues dropped, once the work was done (or
      at once when the driver refused the launch). Dropping a guard only queues its release for
      a thread that holds the GIL; this count includes `__cuda_array_interface__` objects and
      leaves out captured launches and failed checks, so it differs from `released`.
    - `guards_leaked`: guards the streams' release queues leaked because their completion could
      not be confirmed (a failed wait); part of `leaked`.
    - `leaked`: tensors never released: their completion could not be confirmed (a failed
      wait), the interpreter was exiting, or they were inherited by a child of `os.fork()`.
    - `launches`: launches the driver accepted on those streams, and `hold` calls (those captured
      into a CUDA graph are not counted).
    - `errors`: completion events the release queues failed to record, query or wait for.
    - `queued_releases`: releases whose work is done but whose deleter has not run yet (they run
      at the next call into tile_py, or on the release thread within 50 ms).
    - `releasing`: releases under way on some thread: taken off `pending_guards` or
      `queued_releases` by a thread that has not finished them yet (a deleter running, or
      waiting its turn in the same batch). `synchronize()` and `LaunchHandle.wait()` wait for
      them.
    """

def compute_capability(stream: _StreamLike) -> Tuple[int, int]:
    """The compute capability (major, minor) of ``stream``'s device, e.g. (9, 0) on an H100 or
    H200 (cuDeviceGetAttribute, read once per device). ``stream`` as for launch. Raises
    TypeError / ValueError for a bad stream as launch does, ValueError in a child made by
    os.fork(), and tile_py.CudaError / tile_py.DriverNotFoundError as launch does."""
