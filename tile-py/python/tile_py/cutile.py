"""cuTile kernels (``@ct.kernel``) launched through tile.

    import cuda.tile as ct
    import tile_py.cutile

    h = tile_py.cutile.launch(torch.cuda.current_stream(), (n // 16,), scale, (x, y, 2.0))

``launch`` takes ``ct.launch``'s arguments and returns a ``tile_py.LaunchHandle``: the
arguments are checked before any is consumed, producers are told the launch stream, and every
consumed tensor is released only after the kernel has finished, which ``ct.launch`` does not
guarantee. ``install()`` routes every ``ct.launch`` of a program through it, with
``ct.launch``'s return value (None).

``launch`` is the cached launch of the extension (``tile-py/src/cutile.rs``, whose docs say
what the key holds and when it calls into this module). What it calls here on a miss compiles
a specialisation as ``ct.launch`` compiles it (the kernel's own compile, with cuTile's compiler
options and context) for the signature cuTile itself derives for these arguments
(``KernelSignature.from_kernel_args``, calling convention ``cutile_python_v2``), as a cubin for
the compute capability of the stream's device (cuTile's own on-disk cache, where it is enabled, serves repeated compiles
across processes). cuTile reads PyTorch tensors and ``__cuda_array_interface__`` objects
itself; an argument known only through DLPack is shown to it as the layout of the export that
the launch consumes. The cubin is loaded with ``tile_py.Library.from_bytes`` and its parameters
declared from the signature's constraints:

- an array becomes an array parameter, ``In(dtype, ndim=n, index=...)``: pointer, ``n`` extents,
  ``n`` strides in elements, with the constraint's layout assumptions (base address, stride and
  extent divisibility, unit strides and extents, non-negative strides, disjoint elements)
  declared with ``assume=``, which tile checks on every launch (a static extent or stride as
  divisibility by its value; the key holds the value itself);
- a scalar becomes ``Scalar`` of its dtype;
- a ``ct.Constant`` parameter (and every other compile-time constant) is omitted;
- a tuple is flattened into its items;
- a list of arrays becomes cuTile's two parameters: a pointer to its staged descriptor words
  (``In("int64")``: per element the data pointer, the extents, the strides, 64 bits each) and
  its length (``Scalar("i32")``). The words are copied to device memory through PyTorch (on its
  current stream, which the launch is ordered after) and the staged buffer, with every listed
  export, is held by a ``__cuda_array_interface__`` owner that tile keeps until the kernel has
  finished. The elements are keyed one by one (tile cannot check what the staged buffer
  holds) and are not part of the overlap check (cuTile compiles them as possibly aliasing).

Arrays with a negative stride are refused by the declared assumptions: cuTile compiles every
array as having non-negative strides (a list's elements too, which the key's walk refuses, as
the staged words are no argument tile checks). cuTile also compiles every array as not
overlapping any other argument; ``launch`` refuses arguments whose memory overlaps
(``ValueError``), after cuTile's own refusal of the arguments where it has one.

What cuTile supports and this module does not (yet): tensor-map, pointer and dataclass
parameters, and negative static extents or strides. Each raises ``NotImplementedError``
naming the parameter, before anything is consumed. tile cannot tell which arrays a cuTile kernel
writes: every array is declared as read (``In``), so read-only tensors are not refused.

Importing ``tile_py`` does not import ``cuda.tile``; this module imports it on first use.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tile_py
from tile_py import _tile_py as _tile

__all__ = [
    "MAX_GRID_DIM",
    "launch",
    "install",
    "installed",
    "params_from_signature",
    "cache_info",
    "clear_cache",
]

# cuTile refuses a grid dimension above 2**24 - 1: larger ones may compute wrong tile block IDs.
MAX_GRID_DIM = (1 << 24) - 1

# The calling convention whose binary layout tile declares (see params_from_signature).
_CONVENTION = "cutile_python_v2"

launch = _tile._cutile_launch  # the cached launch; its docs: help(launch)
_dims = _tile._cutile_grid  # a grid as launch reads it, (x, y, z), with cuTile's errors
_key = _tile._cutile_key  # the cached launch's key, of arrays given as layouts (tile_py.jax)


class _Compiled:
    __slots__ = ("kernel", "keep", "signature")

    def __init__(self, kernel: "tile_py.Kernel", keep: Tuple[bool, ...], signature: Any) -> None:
        self.kernel = kernel
        self.keep = keep
        self.signature = signature


# DLPack type codes to ``__cuda_array_interface__`` kinds, for describing an exported array to
# cuTile (int, uint, float, bfloat, complex, bool).
_CAI_KIND = {0: "i", 1: "u", 2: "f", 4: "V", 5: "c", 6: "b"}


class _Described:
    """An exported array as cuTile is shown it to derive a signature
    (``__cuda_array_interface__`` of the export's layout): cuTile reads the layout and never
    touches the export itself, which stays the launch's."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, index: int, dtype: Tuple[int, int, int], ptr: int,
                 shape: Sequence[int], strides: Sequence[int]) -> None:
        code, bits, lanes = dtype
        if lanes != 1:
            raise TypeError("Array dtypes with multiple lanes are not supported")
        kind = _CAI_KIND.get(code)
        if kind is None or bits % 8:
            raise NotImplementedError(
                f"tile_py.cutile: argument {index}: an array of DLPack dtype code {code} with "
                f"{bits} bits, which tile_py.cutile cannot describe to cuTile"
            )
        item = bits // 8
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "strides": tuple(s * item for s in strides),
            "typestr": ("|" if item == 1 else "<") + kind + str(item),
            "data": (ptr, False),
            "version": 3,
        }


class _ListArg:
    """A list-of-arrays argument once its elements are exported: the descriptor words cuTile's
    calling convention stages for it (per element the data pointer, the extents, the strides in
    elements, each a 64-bit word), what the launch must keep alive (the exports), the device,
    and the length."""

    __slots__ = ("words", "keep", "device", "length")

    def __init__(self, words: List[int], keep: List[Any], device: Optional[int], length: int) -> None:
        self.words = words
        self.keep = keep
        self.device = device
        self.length = length


class _Staged:
    """A staged list-of-arrays argument as tile_py.launch takes it: the device buffer of
    descriptor words as a ``__cuda_array_interface__`` object (with the stream its copy was
    enqueued on, which tile_py orders the launch after), holding the buffer and every listed
    export. tile_py keeps a ``__cuda_array_interface__`` object alive until the kernel has
    finished, so the buffer and the listed tensors are released only then."""

    __slots__ = ("__cuda_array_interface__", "keep", "length")

    def __init__(self, ptr: int, words: int, stream: int, keep: Any, length: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (words,),
            "strides": None,
            "typestr": "<i8",
            "data": (ptr, False),
            "version": 3,
            "stream": stream,
        }
        self.keep = keep
        self.length = length


def _stage(arg: _ListArg) -> _Staged:
    """Copies a list argument's descriptor words to device memory, through PyTorch (its
    caching allocator, on its current stream), as cuTile stages them on its own."""
    try:
        import torch
    except ImportError:
        raise NotImplementedError(
            "tile_py.cutile stages a list-of-arrays argument's descriptors through PyTorch, "
            "which is not importable"
        ) from None
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("List argument in CUDAGraph isn't supported yet")
    device = torch.device("cuda", torch.cuda.current_device() if arg.device is None else arg.device)
    buf = torch.tensor(arg.words, dtype=torch.int64, device=device)
    stream = torch.cuda.current_stream(device).cuda_stream or 1  # 1: the legacy default stream
    return _Staged(buf.data_ptr(), len(arg.words), stream, (buf, arg.keep), arg.length)


def _static_dims(ann: Any) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """``(static_shape_dims, static_stride_dims)`` of an array parameter's
    ``ct.ArrayAnnotation``, or None when it has none."""
    return _static_of(getattr(ann, "array", None))


def _static_of(array: Any) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """As ``_static_dims``, of a ``ct.ArrayAnnotation`` itself (None for None)."""
    if array is None:
        return None
    shape_dims = tuple(getattr(array, "static_shape_dims", ()) or ())
    stride_dims = tuple(getattr(array, "static_stride_dims", ()) or ())
    if not shape_dims and not stride_dims:
        return None
    return shape_dims, stride_dims


# ---- constraints to tile parameters ------------------------------------------------------------


def _dtype_name(dt: Any) -> str:
    return str(getattr(dt, "name", dt))


def _static_values(values: Sequence[Optional[int]], divisible_by: List[int], what: str,
                   where: str) -> List[int]:
    """Folds a constraint's static strides or extents into ``divisible_by`` (a value v above 1
    becomes divisibility by v) and returns the dimensions whose value is 1. A value of 0 (a
    broadcast stride, an empty extent) has no launch-time check: only arrays with that value
    have the kernel's key."""
    units = []
    for d, v in enumerate(values):
        if v is None:
            continue
        if v == 1:
            units.append(d)
        elif v > 1:
            divisible_by[d] = math.lcm(divisible_by[d], v)
        elif v < 0:
            raise NotImplementedError(f"{where}: a static {what} of {v} in dimension {d}")
    return units


def _array_param(c: Any, where: str) -> "tile_py.Param":
    ndim = c.ndim
    index = _dtype_name(c.index_dtype)  # tile_py reads cuTile's (NumPy's) dtype names
    try:
        tile_py.In("float32", ndim=1, index=index)
    except ValueError:
        raise NotImplementedError(f"{where}: index dtype {c.index_dtype} is not supported") from None
    assume: Dict[str, Any] = {}
    if c.base_addr_divisible_by > 1:
        assume["base_addr_divisible_by"] = c.base_addr_divisible_by
    stride_div = list(c.stride_divisible_by)
    shape_div = list(c.shape_divisible_by)
    # A static stride or extent v other than 1 (``ct.ArrayAnnotation(static_stride_dims=...,
    # static_shape_dims=...)``) is part of the specialisation key by value, so only arrays with
    # that value get this kernel; tile checks divisibility by v at every launch (it has no check
    # of an exact value).
    unit_stride = _static_values(c.stride_constant, stride_div, "stride", where)
    unit_shape = _static_values(c.shape_constant, shape_div, "extent", where)
    if any(d > 1 for d in stride_div):
        assume["stride_divisible_by"] = stride_div
    if any(d > 1 for d in shape_div):
        assume["shape_divisible_by"] = shape_div
    if max(unit_stride + unit_shape, default=-1) >= 8 or (
        ndim > 8 and any(len(assume.get(k, ())) for k in ("stride_divisible_by", "shape_divisible_by"))
    ):
        raise NotImplementedError(f"{where}: layout assumptions beyond dimension 8")
    if unit_stride:
        assume["unit_stride"] = unit_stride
    if unit_shape:
        assume["unit_shape"] = unit_shape
    bounds = [b for b in c.stride_lower_bound_incl if b is not None]
    if bounds:
        if any(b != 0 for b in bounds):
            raise NotImplementedError(f"{where}: a stride lower bound other than 0")
        assume["nonnegative_strides"] = True
    if not c.may_alias_internally:
        assume["disjoint"] = True
    dtype = _dtype_name(c.dtype)
    return tile_py.In(dtype, ndim=ndim, index=index, assume=assume or None)


def params_from_signature(
    signature: Any, names: Optional[Sequence[str]] = None
) -> Tuple[List["tile_py.Param"], Tuple[bool, ...]]:
    """The tile parameter declarations of a cuTile ``KernelSignature`` (calling convention
    ``cutile_python_v2``), and, per leaf argument (tuples flattened, in order), whether it is
    passed (False for compile-time constants). Raises ``NotImplementedError`` naming the
    parameter for constraints tile_py.cutile cannot pass."""
    from cuda.tile.compilation import (
        ArrayConstraint,
        ConstantConstraint,
        ListConstraint,
        ScalarConstraint,
        TupleConstraint,
    )

    params: List[tile_py.Param] = []
    keep: List[bool] = []

    def walk(c: Any, where: str) -> None:
        if isinstance(c, ConstantConstraint):
            keep.append(False)
        elif isinstance(c, ScalarConstraint):
            try:
                params.append(tile_py.Scalar(_dtype_name(c.dtype)))
            except ValueError:
                raise NotImplementedError(f"{where}: a scalar of dtype {c.dtype}") from None
            keep.append(True)
        elif isinstance(c, ArrayConstraint):
            params.append(_array_param(c, where))
            keep.append(True)
        elif isinstance(c, TupleConstraint):
            for i, item in enumerate(c.items):
                walk(item, f"{where}[{i}]")
        elif isinstance(c, ListConstraint):
            # A device pointer to the staged descriptor words and the list's length; the
            # elements' layout assumptions are in the specialisation key (tile cannot check
            # what the buffer holds).
            params.append(tile_py.In("int64"))
            params.append(tile_py.Scalar("i32"))
            keep.append(True)
        else:
            raise NotImplementedError(f"{where}: a {type(c).__name__} parameter")

    for i, c in enumerate(signature.parameters):
        name = names[i] if names is not None and i < len(names) else str(i)
        walk(c, f"tile_py.cutile: parameter {name!r}")
    return params, tuple(keep)


def _replaced(args: Sequence[Any], by: Dict[int, Any]) -> Tuple[Any, ...]:
    """``args`` with leaf ``i`` (tuples flattened, in order) replaced by ``by[i]``."""
    at = [0]
    return tuple(_replace_leaves(a, by, at) for a in args)


def _replace_leaves(x: Any, by: Dict[int, Any], at: List[int]) -> Any:
    if isinstance(x, tuple):
        return tuple(_replace_leaves(y, by, at) for y in x)
    i = at[0]
    at[0] += 1
    return by.get(i, x)


def _compile(kernel: Any, args: Tuple[Any, ...], cc: Tuple[int, int]) -> _Compiled:
    """Compiles ``kernel`` for ``args`` as ``ct.launch`` does: the signature cuTile derives for
    them, compiled by the kernel's own ``_compile`` (cuTile's compiler options, its context and
    on-disk cache) for compute capability ``cc``, loaded as a tile library."""
    from cuda.tile._cext import default_tile_context
    from cuda.tile.compilation import CallingConvention, KernelSignature

    convention = getattr(CallingConvention, _CONVENTION)()
    sig = KernelSignature.from_kernel_args(kernel, args, convention)
    params, keep = params_from_signature(sig, _plan(kernel)[1])
    cubin, symbol, _, lifecycle = kernel._compile(sig, default_tile_context, cc)
    if lifecycle:
        # Libraries that need cuTile's load hooks (NVSHMEM) are loaded by cuTile alone.
        raise NotImplementedError(
            "tile_py.cutile: a kernel whose library needs cuTile's load hooks "
            f"({', '.join(getattr(p, '__name__', str(p)) for p in lifecycle)})"
        )
    lib = tile_py.Library.from_bytes(bytes(cubin))
    return _Compiled(lib.kernel(symbol, params), keep, sig)


# ---- what the cached launch calls on a miss ----------------------------------------------------


def _plan(kernel: Any) -> Tuple[Sequence[Any], Sequence[str], Tuple[bool, ...]]:
    """The kernel's parameter annotations, names, and per parameter whether it is ct.Constant."""
    af = kernel._annotated_function
    anns = tuple(af.parameter_annotations)
    return anns, tuple(af.pysig.parameters), tuple(bool(getattr(a, "constant", False)) for a in anns)


def _count_error(kernel: Any, expected: int, given: int) -> TypeError:
    """cuTile's refusal of a wrong argument count (its words, which its tests match)."""
    return TypeError(
        f"Kernel expects {expected} argument{'' if expected == 1 else 's'} but {given} "
        f"{'was' if given == 1 else 'were'} given"
    )


def _node(ann: Any) -> Tuple[Any, ...]:
    """What an annotation tells the key: ``(constant, static dims, tuple kind, item nodes,
    static dims of a list's elements)``; tuple kind 1 is homogeneous (one item node), 2
    heterogeneous (one per item), 0 any other (items are annotated as the tuple)."""
    kind = getattr(ann, "KIND", "leaf")
    if kind == "homogeneous_tuple":
        k, items = 1, (_node(ann.each),)
    elif kind == "heterogeneous_tuple":
        k, items = 2, tuple(_node(a) for a in ann.items)
    else:
        k, items = 0, ()
    element = getattr(getattr(ann, "list", None), "element", None)
    return (bool(getattr(ann, "constant", False)), _static_dims(ann), k, items, _static_of(element))


def _plan_of(kernel: Any) -> Tuple[List[Tuple[Any, ...]], List[str]]:
    """Per parameter of a cuTile kernel its node (``_node``), and the parameter names; a
    ``TypeError`` for anything else."""
    if type(kernel).__module__.split(".")[:2] != ["cuda", "tile"]:
        raise TypeError(
            f"kernel must be a cuTile kernel (a function decorated with @ct.kernel), got "
            f"{type(kernel).__name__} {kernel!r}"
        )
    anns, names, _ = _plan(kernel)
    return [_node(a) for a in anns], list(names)


def _list_arg(obj: List[Any], stream: Any, index: int, name: str, ordinal: int):
    """A list-of-arrays argument (leaf ``index`` of parameter ``name``) read for a launch on
    ``stream``, whose device ordinal is ``ordinal``: its ``_ListArg`` (staged on that device),
    its elements as cuTile is shown them, and per element ``(dtype, data_ptr, shape, strides)``
    for the key (dtype ``(code, bits, lanes)``). Each element known only through DLPack is
    exported once (a capsule is read as it is); a ``__cuda_array_interface__`` element is parsed
    as a launch parses one. Each must be on a device the launch may use, as every tensor of a
    launch must (``ValueError``: the staged words are pointers the launch's own checks never
    see); the exports are kept for the launch."""
    if not obj:
        raise TypeError("Empty lists are not supported as kernel arguments")
    shown: List[Any] = []
    layouts: List[Tuple[Any, int, List[int], List[int]]] = []
    words: List[int] = []
    keep: List[Any] = []
    for j, item in enumerate(obj):
        if hasattr(item, "__dlpack__") or type(item).__name__ == "PyCapsule":
            cap, _offered, (dtype, _dev, ptr, shape, strides) = _tile._export(
                item, stream, index, ordinal
            )
            keep.append(cap)
            shown.append(_Described(index, dtype, ptr, shape, strides))
            layouts.append((dtype, ptr, list(shape), list(strides)))
        else:
            cai = getattr(item, "__cuda_array_interface__", None)
            if not isinstance(cai, dict):
                raise TypeError(
                    f"Invalid list item #{j}: unsupported object type '{type(item).__name__}'"
                )
            if cai.get("stream") is not None:
                raise NotImplementedError(
                    f"tile_py.cutile: element {j} of list parameter {name!r} is a "
                    "__cuda_array_interface__ object with a 'stream' to order after"
                )
            # Parsed and checked as a launch reads a __cuda_array_interface__ argument.
            dtype, _dev, ptr, shape, strides = _tile._cai_layout(item, index, ordinal)
            keep.append(item)
            shown.append(item)
            layouts.append((dtype, ptr, list(shape), list(strides)))
        words.append(layouts[-1][1])
        words.extend(layouts[-1][2])
        words.extend(layouts[-1][3])
    return _ListArg(words, keep, ordinal, len(obj)), shown, layouts


def _compile_miss(kernel: Any, args: Tuple[Any, ...], described: Dict[int, Any],
                  cc: Tuple[int, int]) -> Tuple["tile_py.Kernel", Tuple[bool, ...]]:
    """Compiles ``kernel`` for ``args`` (``_compile``), leaf ``i`` (tuples flattened) shown to
    cuTile as ``described[i]``: an export's ``(dtype, data_ptr, shape, strides)``, or a list's
    elements. Returns the tile kernel and, per leaf, whether it is passed."""
    shown = _replaced(args, {
        i: d if type(d) is list else _Described(i, *d) for i, d in described.items()
    })
    entry = _compile(kernel, shown, cc)
    return entry.kernel, entry.keep


# ---- routing ct.launch through tile ------------------------------------------------------------


def _as_ct_launch(
    stream: Any,
    grid: Any,
    kernel: Any,
    kernel_args: Sequence[Any],
    /,
    *,
    programmatic_dependent_launch: bool = False,
) -> None:
    """``ct.launch`` through ``tile_py.cutile.launch``, returning what ``ct.launch`` returns
    (None). The tensors are on the stream's release queue from the launch: nothing is lost by
    dropping the handle."""
    launch(stream, grid, kernel, kernel_args,
           programmatic_dependent_launch=programmatic_dependent_launch)


# ``cuda.tile``'s ``(launch, _cext.launch)`` from before the first ``install()`` still in
# force, and how many are in force: undoing the last one, in whatever order, puts it back.
_ORIGINAL: Optional[Tuple[Any, Any]] = None
_INSTALLS = 0
_INSTALL_LOCK = threading.Lock()


class _Installed:
    """What ``install()`` returns: ``with install():`` routes ``ct.launch`` through tile for the
    block; ``uninstall()`` ends this install at once. ``ct.launch`` is what it was before the
    first install once every install is ended, in whatever order."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done = False

    def uninstall(self) -> None:
        """Ends this ``install()`` (a second call changes nothing)."""
        global _ORIGINAL, _INSTALLS
        with _INSTALL_LOCK:
            if self._done:
                return
            self._done = True
            _INSTALLS -= 1
            if _INSTALLS == 0 and _ORIGINAL is not None:
                import cuda.tile
                import cuda.tile._cext

                cuda.tile.launch, cuda.tile._cext.launch = _ORIGINAL
                _ORIGINAL = None

    def __enter__(self) -> "_Installed":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()


def _import_cuda_tile() -> Any:
    """``cuda.tile`` (with ``cuda.tile._cext`` loaded), or a ``ModuleNotFoundError`` that says
    which package provides it when cuTile Python is not installed."""
    try:
        import cuda.tile
        import cuda.tile._cext  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name in ("cuda", "cuda.tile", "cuda.tile._cext"):
            raise ModuleNotFoundError(
                f"tile_py.cutile needs cuTile Python, which is not installed ({e}): "
                "pip install cuda-tile==1.7.0",
                name=e.name,
            ) from e
        raise
    return cuda.tile


def install() -> _Installed:
    """Routes every ``ct.launch`` of the program through tile: ``cuda.tile.launch`` (what
    ``ct.launch`` and ``from cuda.tile import launch`` made after this call find) and
    ``cuda.tile._cext.launch`` become a function with ``ct.launch``'s signature and return value
    (None) that calls ``tile_py.cutile.launch``. A module that imported ``launch`` by name
    before the call keeps the original. Returns an object that undoes it: ``uninstall()``, or
    use it as a context manager (``with tile_py.cutile.install(): ...``). Installing twice is
    harmless: ``ct.launch`` is routed through tile until every install is undone."""
    global _ORIGINAL, _INSTALLS
    cuda_tile = _import_cuda_tile()
    with _INSTALL_LOCK:
        if _INSTALLS == 0:
            _ORIGINAL = (cuda_tile.launch, cuda_tile._cext.launch)
        _INSTALLS += 1
        cuda_tile.launch = _as_ct_launch
        cuda_tile._cext.launch = _as_ct_launch
    return _Installed()


def installed() -> bool:
    """Whether ``ct.launch`` is routed through tile now (``install()``)."""
    return _import_cuda_tile().launch is _as_ct_launch


def cache_info() -> Dict[str, int]:
    """``{"entries", "hits", "misses"}``: compiled specialisations held, launches that found
    one, and specialisations compiled."""
    hits, misses, entries = _tile._cutile_info()
    return {"entries": entries, "hits": hits, "misses": misses}


def clear_cache() -> None:
    """Drops every compiled specialisation (their libraries unload once no launch holds them)."""
    _tile._cutile_clear()
