"""cuTile kernels (``@ct.kernel``) launched through tile.

    import cuda.tile as ct
    import tile_py.cutile

    h = tile_py.cutile.launch(torch.cuda.current_stream(), (n // 16,), scale, (x, y, 2.0))

``launch`` takes ``ct.launch``'s arguments and returns a ``tile_py.LaunchHandle``: the
arguments are checked before any is consumed, producers are told the launch stream, and every
consumed tensor is released only after the kernel has finished, which ``ct.launch`` does not
guarantee. ``install()`` routes every ``ct.launch`` of a program through it, with
``ct.launch``'s return value (None).

What it takes, as ``ct.launch`` does: PyTorch tensors, any ``__dlpack__`` producer, DLPack
capsules, ``__cuda_array_interface__`` objects (numba's device arrays), scalars, tuples, lists
of arrays; streams of torch, CuPy, numba-cuda, cuda.core (``__cuda_stream__``) or int handles
(0 and 1 the legacy default stream); grids as tuples of at most 3 ints, padded with 1s (``()``
is one block), each at most ``MAX_GRID_DIM`` (cuTile's 24-bit limit, refused with cuTile's
message). cuTile's own errors come first where it would raise them (the grid, the argument
count, and what compiling for these arguments raises).

How it works. The kernel is compiled as ``ct.launch`` compiles it (the kernel's own compile,
with cuTile's compiler options and context) for the signature cuTile itself would use for these
arguments (``KernelSignature.from_kernel_args``, calling convention ``cutile_python_v2``), as a
cubin for the compute capability of the stream's device, once per specialisation, and kept in
memory (cuTile's own on-disk cache, where it is enabled, serves repeated compiles across
processes). A launch whose specialisation was compiled before is found by the cached launch
(Rust), which computes the key from the exported descriptors without running Python. The cubin
is loaded with
``tile_py.Library.from_bytes`` and its parameters declared from the signature's constraints:

- an array becomes an array parameter, ``In(dtype, ndim=n, index=...)``: pointer, ``n`` extents,
  ``n`` strides in elements, with the constraint's layout assumptions (base address, stride and
  extent divisibility, unit strides and extents, non-negative strides, disjoint elements)
  declared with ``assume=``, which tile checks on every launch;
- a scalar becomes ``Scalar`` of its dtype;
- a ``ct.Constant`` parameter (and every other compile-time constant) is omitted;
- a tuple is flattened into its items;
- a list of arrays becomes cuTile's two parameters: a pointer to its staged descriptor words
  (``In("int64")``: per element the data pointer, the extents, the strides, 64 bits each) and
  its length (``Scalar("i32")``). The words are copied to device memory through PyTorch (on its
  current stream, which the launch is ordered after) and the staged buffer, with every listed
  export, is held by a ``__cuda_array_interface__`` owner that tile keeps until the kernel has
  finished.

Layouts are read once per argument and launch: from the attributes of a PyTorch tensor (which
tile_py then exports through PyTorch's DLPack C exchange API, a view of the same memory) or of a
``__cuda_array_interface__`` object, and for any other ``__dlpack__`` producer and every DLPack
capsule from the descriptor of one export made with the launch stream (``tile_py._tile_py._export``),
which is then the export launched (a capsule is read as it is and launched as it is).

Specialisation is a correctness rule: code compiled under an assumption is undefined on
arguments that break it. The cache key (``specialization_key``) is computed on every launch from
the arguments' layouts, without cuTile, and covers everything cuTile derives its assumptions from
(dtype, ndim, 16-byte alignment of the base address, per dimension whether the stride is 1 or a
multiple of 16 bytes and whether the extent is 1 or a multiple of 16, whether the elements are
disjoint, the value of every constant, the type of every scalar, and the value of every static
extent and stride of a ``ct.ArrayAnnotation``), so arguments that differ in any of them get their
own cubin. And tile itself refuses, before consuming anything, a tensor that breaks an
assumption of the cubin it is launched with (``ValueError`` naming the rule; a static extent or
stride is checked as divisibility by its value, the key holding the value itself). Arrays with a
negative stride are refused that way: cuTile compiles every array as having non-negative
strides. cuTile also compiles every array as not overlapping any other argument; ``launch``
refuses arguments whose memory overlaps (``ValueError``), after cuTile's own refusal of the
arguments where it has one. The elements of a list are keyed one by one (tile cannot check
what the staged buffer holds) and are not part of the overlap check (cuTile compiles them as
possibly aliasing).

What cuTile supports and this module does not (yet): tensor-map, pointer and dataclass
parameters, and negative static extents or strides. Each raises ``NotImplementedError``
naming the parameter, before anything is consumed. tile cannot tell which arrays a cuTile kernel
writes: every array is declared as read (``In``), so read-only tensors are not refused.

Importing ``tile_py`` does not import ``cuda.tile``; this module imports it on first use.
"""

from __future__ import annotations

import math
import operator
import struct
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tile_py
from tile_py import _tile_py as _tile

_cutile_try = _tile._cutile_try
_LaunchHandle = tile_py.LaunchHandle

__all__ = [
    "MAX_GRID_DIM",
    "launch",
    "install",
    "installed",
    "specialization_key",
    "params_from_signature",
    "cache_info",
    "clear_cache",
]

# The calling convention whose binary layout tile declares (see params_from_signature).
_CONVENTION = "cutile_python_v2"


class _Compiled:
    __slots__ = ("kernel", "keep", "signature")

    def __init__(self, kernel: "tile_py.Kernel", keep: Tuple[bool, ...], signature: Any) -> None:
        self.kernel = kernel
        self.keep = keep
        self.signature = signature


_CACHE: Dict[Any, _Compiled] = {}
_LOCK = threading.Lock()
_STATS = {"hits": 0, "misses": 0}


# ---- the specialisation key --------------------------------------------------------------------
#
# Computed on every launch, so kept cheap: an array's features are memoised by its raw layout
# (dtype, shape, strides, base-address alignment), and a kernel's parameter annotations are read
# once.


def _layout(obj: Any) -> Optional[Tuple[Any, int, int, Tuple[int, ...], Tuple[int, ...]]]:
    """``(dtype, bits, data_ptr, shape, strides_in_elements)`` of an array argument read from its
    attributes, or None when it has none to read (an argument exported instead, see
    ``_export_leaf``, or a scalar). PyTorch-like tensors are read through their attributes
    (tile_py then exports them through PyTorch's DLPack C exchange API, a view of the same
    memory), objects with ``__cuda_array_interface__`` and no ``__dlpack__`` through it."""
    data_ptr = getattr(obj, "data_ptr", None)
    if data_ptr is not None and hasattr(obj, "stride"):
        return (obj.dtype, obj.element_size() * 8, data_ptr(), tuple(obj.shape), tuple(obj.stride()))
    if hasattr(obj, "__dlpack__"):
        return None
    cai = getattr(obj, "__cuda_array_interface__", None)
    if isinstance(cai, dict):
        typestr = cai["typestr"]
        item = int(typestr[2:])
        shape = tuple(cai["shape"])
        st = cai.get("strides")
        if st is None:
            strides: List[int] = []
            acc = 1
            for n in reversed(shape):
                strides.append(acc)
                acc *= n
            st_e = tuple(reversed(strides))
        else:
            st_e = tuple(s // item for s in st)
        return (typestr, item * 8, int(cai["data"][0]), shape, st_e)
    return None


def _exportable(obj: Any) -> bool:
    """Whether ``obj`` is an array argument known only through DLPack: a producer with
    ``__dlpack__`` (and no tensor attributes to read), or a DLPack capsule."""
    return hasattr(obj, "__dlpack__") or type(obj).__name__ == "PyCapsule"


# DLPack type codes to ``__cuda_array_interface__`` kinds, for describing an exported array to
# cuTile (int, uint, float, bfloat, complex, bool).
_CAI_KIND = {0: "i", 1: "u", 2: "f", 4: "V", 5: "c", 6: "b"}


class _Exported:
    """The producer tile_py.launch is handed for an argument tile_py.cutile exported already
    (``tile_py._tile_py._export``, once, with the launch stream): its ``__dlpack__`` gives that capsule
    back, once, for the stream it was made for. So the argument is exported once per launch,
    the capsule launched is the one whose layout picked the kernel, and tile_py.launch orders it
    as it orders every export (on the per-thread default stream too)."""

    __slots__ = ("capsule", "stream", "device", "source")

    def __init__(self, capsule: Any, stream: int, device: Tuple[int, int], source: Any) -> None:
        self.capsule = capsule
        self.stream = stream
        self.device = device
        self.source = source

    def __dlpack__(self, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        cap = self.capsule
        if cap is None:
            raise BufferError(f"the export of {self.source!r} made for this launch was handed out already")
        if stream != self.stream:
            raise BufferError(
                f"the export of {self.source!r} was made for stream {self.stream}, not {stream!r}"
            )
        self.capsule = None
        return cap

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.device

    def __repr__(self) -> str:
        return repr(self.source)


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


class _Walk:
    """One launch's walk over its arguments: the launch stream (for exports), the byte spans
    of the arrays (for the overlap check), and per leaf index what was exported: the object to
    launch and the one to show cuTile."""

    __slots__ = ("stream", "spans", "leaf", "exports")

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.spans: List[Tuple[int, int, int]] = []
        self.leaf = 0
        self.exports: Dict[int, Tuple[Any, Any]] = {}


def _export_leaf(obj: Any, index: int, w: _Walk):
    """Exports leaf ``index`` once for the launch stream and returns its layout (as
    ``_layout``), keeping the export to launch."""
    if w.stream is None:
        raise TypeError(
            f"tile_py.cutile needs the launch stream to read the layout of argument {index} "
            f"({type(obj).__name__!r}, known only through DLPack): pass stream="
        )
    cap, offered, (dtype, device, ptr, shape, strides) = _tile._export(obj, w.stream, index)
    launched = cap if offered is None else _Exported(cap, offered, device, obj)
    w.exports[index] = (launched, _Described(index, dtype, ptr, shape, strides))
    return (("dlpack",) + tuple(dtype), dtype[1] * dtype[2], ptr, tuple(shape), tuple(strides))


def _disjoint(shape: Sequence[int], strides: Sequence[int]) -> bool:
    dims = sorted(zip(strides, shape))
    if not dims:
        return True
    if dims[0][0] <= 0:
        return False
    return all(b[0] > 0 and b[0] >= a[0] * a[1] for a, b in zip(dims, dims[1:]))


def _array_key(dtype: Any, bits: int, aligned: bool, shape: Sequence[int], strides: Sequence[int]):
    """What cuTile decides an array's constraint from (its specialisation bits)."""
    per_dim: Tuple[Any, ...] = ()
    if len(shape) <= 5:
        per_dim = tuple(
            (
                (s * bits) % 8 == 0 and ((s * bits) // 8) % 16 == 0,
                s == 1,
                (n * bits) % 8 == 0 and n % 16 == 0,
                n == 1,
            )
            for n, s in zip(shape, strides)
        )
    fits32 = all(-(2**31) <= v < 2**31 for v in (*shape, *strides))
    return ("array", dtype, len(shape), aligned, _disjoint(shape, strides), fits32, per_dim)


_FEATURES: Dict[Any, Any] = {}


def _array_features(dtype: Any, bits: int, ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...]):
    raw = (dtype, bits, ptr & 15 == 0, shape, strides)
    f = _FEATURES.get(raw)
    if f is None:
        if len(_FEATURES) >= 4096:
            _FEATURES.clear()
        f = _FEATURES[raw] = _array_key(dtype, bits, raw[2], shape, strides)
    return f


def _span(bits: int, ptr: int, shape: Tuple[int, ...], strides: Tuple[int, ...]):
    """The bytes ``[lo, hi)`` an array can touch, or None when it is empty."""
    lo = hi = ptr
    for n, s in zip(shape, strides):
        if n == 0:
            return None
        off = (n - 1) * s * bits // 8
        if off < 0:
            lo += off
        else:
            hi += off
    return (lo, hi + max(bits // 8, 1))


_PLANS: Dict[Any, Tuple[Sequence[Any], Sequence[str], Tuple[bool, ...]]] = {}


def _plan(kernel: Any) -> Tuple[Sequence[Any], Sequence[str], Tuple[bool, ...]]:
    """The kernel's parameter annotations, names, and per parameter whether it is ct.Constant."""
    plan = _PLANS.get(kernel)
    if plan is None:
        af = kernel._annotated_function
        anns = tuple(af.parameter_annotations)
        consts = tuple(bool(getattr(a, "constant", False)) for a in anns)
        plan = _PLANS[kernel] = (anns, tuple(af.pysig.parameters), consts)
    return plan


def _const_value(v: Any) -> Any:
    """A constant as it decides the code: a float by its bits, as cuTile tells constants apart
    (``0.0`` and ``-0.0`` are two kernels, and every NaN with the same bits one), in tuples too."""
    if type(v) is float:
        return struct.pack("<d", v)
    if type(v) is tuple:
        return tuple(_const_value(x) for x in v)
    return v


def _scalar_key(obj: Any, constant: bool):
    if constant or not isinstance(obj, (bool, int, float)) and not hasattr(obj, "dtype"):
        # A compile-time constant (or something only a constant can be): its value decides the
        # code.
        try:
            hash(obj)
        except TypeError:
            raise TypeError(
                f"tile_py.cutile cannot key a kernel on the unhashable value {obj!r}"
            ) from None
        return ("const", type(obj), _const_value(obj))
    t = type(obj)
    if t is float or t is bool:
        return t
    if t is int:
        return ("int", -(2**31) <= obj < 2**31)
    if isinstance(obj, (bool, int, float)):
        return ("scalar", t)
    return ("scalar", t, str(obj.dtype))


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


def _at(values: Sequence[int], dims: Sequence[int]) -> Tuple[Optional[int], ...]:
    """``values`` at ``dims`` (negative dims from the end; None out of range, which cuTile
    refuses when compiling)."""
    n = len(values)
    return tuple(values[d] if -n <= d < n else None for d in dims)


def _leaf_key(obj: Any, constant: bool, w: _Walk, ann: Any = None):
    index = w.leaf
    w.leaf += 1
    if constant:
        # Not passed to the kernel: its value decides the code (cuTile refuses what cannot be a
        # constant when the kernel is compiled).
        return _scalar_key(obj, True)
    lay = _layout(obj)
    if lay is None:
        if not _exportable(obj):
            return _scalar_key(obj, False)
        lay = _export_leaf(obj, index, w)
    dtype, bits, ptr, shape, strides = lay
    span = _span(bits, ptr, shape, strides)
    if span is not None:
        w.spans.append((span[0], span[1], len(w.spans)))
    return _keyed_features(dtype, bits, ptr, shape, strides, _static_dims(ann))


def _keyed_features(dtype: Any, bits: int, ptr: int, shape: Tuple[int, ...],
                    strides: Tuple[int, ...], static: Any):
    """An array's part of the key: its features, and with a static annotation the annotated
    extents and strides, which are compiled in as constants (their values decide the code).
    With static strides annotated, cuTile no longer infers a stride of 1 in the other
    dimensions (its signature has no such constant there), so those bits leave the key."""
    features = _array_features(dtype, bits, ptr, shape, strides)
    if static is None:
        return features
    if static[1]:
        kind, dt, ndim, aligned, disjoint, fits32, per_dim = features
        features = (kind, dt, ndim, aligned, disjoint, fits32,
                    tuple((a, False, c, d) for a, _b, c, d in per_dim))
    return (features, _at(shape, static[0]), _at(strides, static[1]))


def _arg_key(obj: Any, ann: Any, name: str, w: _Walk):
    if isinstance(obj, tuple):
        kind = getattr(ann, "KIND", "leaf")
        if kind == "homogeneous_tuple":
            anns: Sequence[Any] = [ann.each] * len(obj)
        elif kind == "heterogeneous_tuple":
            # Every item is walked, also past the annotation's (cuTile refuses such a tuple
            # when compiling): the leaf count must stay that of ``_leaves``.
            anns = list(ann.items)[: len(obj)] + [None] * (len(obj) - len(ann.items))
        else:
            anns = [ann] * len(obj)
        return ("tuple",) + tuple(_arg_key(x, a, name, w) for x, a in zip(obj, anns))
    if isinstance(obj, list) and not getattr(ann, "constant", False):
        return _list_key(obj, ann, name, w)
    return _leaf_key(obj, bool(getattr(ann, "constant", False)), w, ann)


def _list_key(obj: List[Any], ann: Any, name: str, w: _Walk):
    """The key of a list-of-arrays argument: each element's features (and its static extents
    and strides), in order. Each element is exported once for the launch stream (a capsule is
    read as it is, a ``__cuda_array_interface__`` object as it says); the exports and the
    descriptor words to stage are kept for the launch (``_ListArg``)."""
    index = w.leaf
    w.leaf += 1
    if not obj:
        raise TypeError("Empty lists are not supported as kernel arguments")
    element = getattr(getattr(ann, "list", None), "element", None)
    static = _static_of(element)
    keys: List[Any] = []
    shown: List[Any] = []
    words: List[int] = []
    keep: List[Any] = []
    device = None
    for j, item in enumerate(obj):
        if _exportable(item):
            if w.stream is None:
                raise TypeError(
                    f"tile_py.cutile needs the launch stream to export the elements of list "
                    f"parameter {name!r}: pass stream="
                )
            cap, _offered, (dtype, dev, ptr, shape, strides) = _tile._export(item, w.stream, index)
            keep.append(cap)
            shown.append(_Described(index, dtype, ptr, shape, strides))
            lay = (("dlpack",) + tuple(dtype), dtype[1] * dtype[2], ptr, tuple(shape), tuple(strides))
            if device is None and dev[0] in (2, 13):  # kDLCUDA, kDLCUDAManaged
                device = dev[1]
        else:
            cai = getattr(item, "__cuda_array_interface__", None)
            lay = _layout(item) if isinstance(cai, dict) else None
            if lay is None:
                raise TypeError(
                    f"Invalid list item #{j}: unsupported object type '{type(item).__name__}'"
                )
            if cai.get("stream") is not None:
                raise NotImplementedError(
                    f"tile_py.cutile: element {j} of list parameter {name!r} is a "
                    "__cuda_array_interface__ object with a 'stream' to order after"
                )
            keep.append(item)
            shown.append(item)
        _, bits, ptr, shape, strides = lay
        words.append(ptr)
        words.extend(shape)
        words.extend(strides)
        keys.append(_keyed_features(lay[0], bits, ptr, shape, strides, static))
    w.exports[index] = (_ListArg(words, keep, device, len(obj)), shown)
    return ("list",) + tuple(keys)


def _count_error(kernel: Any, expected: int, given: int) -> TypeError:
    """cuTile's refusal of a wrong argument count (its words, which its tests match)."""
    return TypeError(
        f"Kernel expects {expected} argument{'' if expected == 1 else 's'} but {given} "
        f"{'was' if given == 1 else 'were'} given"
    )


def _key(kernel: Any, args: Sequence[Any], stream: Any) -> Tuple[Tuple[Any, ...], Optional[str], _Walk]:
    """The specialisation key, the overlap refusal's message (None when the arrays are
    disjoint), and the walk (with the exports made for ``stream``)."""
    anns, names, consts = _plan(kernel)
    if len(args) != len(anns):
        raise _count_error(kernel, len(anns), len(args))
    w = _Walk(stream)
    key = []
    for i, a in enumerate(args):
        t = type(a)
        if t is float or t is bool or t is int:
            w.leaf += 1
            key.append(_scalar_key(a, consts[i]))
        elif isinstance(a, (tuple, list)):  # as ``_leaves`` flattens them
            key.append(_arg_key(a, anns[i], names[i], w))
        else:
            key.append(_leaf_key(a, consts[i], w, anns[i]))
    overlap = None
    spans = w.spans
    if len(spans) > 1:
        spans.sort()
        for (lo_a, hi_a, ia), (lo_b, _hi_b, ib) in zip(spans, spans[1:]):
            if lo_b < hi_a:
                overlap = (
                    f"tile_py.cutile: array arguments {min(ia, ib)} and {max(ia, ib)} (in "
                    "order of appearance) overlap in memory; cuTile compiles every array as "
                    "not aliasing any other"
                )
                break
    return tuple(key), overlap, w


def specialization_key(kernel: Any, args: Sequence[Any], stream: Any = None) -> Tuple[Any, ...]:
    """The cache key of ``kernel`` launched with ``args``: one entry per parameter describing
    what cuTile specialises the compiled code on (see the module docs). An argument known only
    through DLPack (a ``__dlpack__`` producer without tensor attributes) is exported for
    ``stream`` to read its layout (and released again); a DLPack capsule is read as it is.
    Raises ``NotImplementedError`` naming a parameter tile_py.cutile cannot pass,
    ``ValueError`` when two array arguments overlap in memory (cuTile compiles arrays as not
    aliasing), and ``TypeError`` for a wrong argument count or a producer to export without a
    ``stream``."""
    key, overlap, _ = _key(kernel, args, stream)
    if overlap is not None:
        raise ValueError(overlap)
    return key


# ---- constraints to tile parameters ------------------------------------------------------------



def _dtype_name(dt: Any) -> str:
    return str(getattr(dt, "name", dt))


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
    unit_stride = []
    for d, v in enumerate(c.stride_constant):
        if v is None:
            continue
        if v == 1:
            unit_stride.append(d)
        elif v > 1:
            stride_div[d] = math.lcm(stride_div[d], v)
        elif v < 0:
            raise NotImplementedError(f"{where}: a static stride of {v} in dimension {d}")
        # A static stride of 0 (a broadcast dimension) has no launch-time check here: only
        # arrays with that stride have this kernel's key.
    unit_shape = []
    for d, v in enumerate(c.shape_constant):
        if v is None:
            continue
        if v == 1:
            unit_shape.append(d)
        elif v > 1:
            shape_div[d] = math.lcm(shape_div[d], v)
        elif v < 0:
            raise NotImplementedError(f"{where}: a static extent of {v} in dimension {d}")
        # A static extent of 0 (an empty dimension): as a static stride of 0.
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


# ---- launch ------------------------------------------------------------------------------------


def _leaves(args: Sequence[Any]) -> List[Any]:
    """The leaf arguments, tuples flattened, in order."""
    out: List[Any] = []
    for a in args:
        _add_leaves(a, out)
    return out


def _add_leaves(x: Any, out: List[Any]) -> None:
    # Module-level, not a closure: a nested function that calls itself is a reference cycle,
    # which would keep the arguments (and exports) alive until the garbage collector runs.
    if isinstance(x, tuple):
        for y in x:
            _add_leaves(y, out)
    else:
        out.append(x)


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


# ---- cuTile's launch conventions ---------------------------------------------------------------

# cuTile refuses a grid dimension above 2**24 - 1: larger ones may compute wrong tile block IDs.
MAX_GRID_DIM = (1 << 24) - 1


def _dims(grid: Any) -> Tuple[int, int, int]:
    """A grid (or cluster) as cuTile reads it: a tuple of at most 3 ints, padded with 1s on
    the right (``()`` is ``(1, 1, 1)``), each at most ``MAX_GRID_DIM``; an int is taken as a
    1-tuple. Raises cuTile's errors, in its words where its tests match them (the same words,
    ``Grid[i]``, for ``block_in_cluster_count``)."""
    if isinstance(grid, int) and not isinstance(grid, bool):
        dims: Tuple[Any, ...] = (grid,)
    elif isinstance(grid, tuple):
        dims = grid
    else:
        raise TypeError("Grid must be a tuple")
    if len(dims) > 3:
        raise ValueError(f"Grid dimensions must be at most 3, got length {len(dims)}")
    out = []
    for i in range(3):
        v = operator.index(dims[i]) if i < len(dims) else 1
        if v < 0:
            raise OverflowError(f"Grid[{i}] is negative: {v}")
        if v > MAX_GRID_DIM:
            raise ValueError(
                f"Grid[{i}] exceeds 24-bit limit: max={MAX_GRID_DIM}, got={v}. "
                "Use multiple kernel launches for larger workloads."
            )
        out.append(v)
    return (out[0], out[1], out[2])


def _stream(stream: Any) -> Any:
    """A stream as cuTile takes it, in a form tile_py.launch takes: the int handle 0 is the
    legacy default stream (tile_py's 1), and a numba-cuda stream (without ``__cuda_stream__``)
    its handle. Everything else is passed on as it is."""
    if type(stream) is int:
        return 1 if stream == 0 else stream
    if type(stream).__module__.startswith("numba") and not hasattr(stream, "__cuda_stream__"):
        handle = getattr(stream, "handle", None)
        if handle is not None:
            value = getattr(handle, "value", handle)  # ctypes c_void_p, or a CUstream
            return 1 if value is None else int(value) or 1
    return stream


launch = _tile._cutile_launch  # the cached launch (Rust); its docs: help(launch)


def _register_plan(kernel: Any) -> bool:
    """Registers a cuTile kernel's plan with the cached launch (which parameters are
    compile-time constants and which have static annotations); False when ``kernel`` is not a
    cuTile kernel (``_launch`` refuses it)."""
    if type(kernel).__module__.split(".")[:2] != ["cuda", "tile"]:
        return False
    anns, _names, consts = _plan(kernel)
    _tile._cutile_plan(kernel, list(consts), [_static_dims(a) for a in anns])
    return True


def _launch(
    stream: Any,
    grid: Any,
    kernel: Any,
    args: Sequence[Any],
    found: Any,
    programmatic_dependent_launch: bool,
    cooperative: bool,
    block_in_cluster_count: Any,
) -> "tile_py.LaunchHandle":
    """What ``launch`` (the cached launch) calls when it did not launch: the specialisation key
    from the arguments' layouts, the compiled kernel found or compiled, and ``tile_py.launch``.
    ``found`` is what the cached launch found: None on the kernel's first launch (its plan is
    registered and the launch keyed again), a key (the kernel found or compiled here is
    registered under it for later launches), or False (a launch the cache does not take)."""
    if found is None and _register_plan(kernel):
        found = _cutile_try(stream, grid, kernel, args, cooperative, programmatic_dependent_launch)
        if type(found) is _LaunchHandle:
            return found
    given_stream = stream
    stream = _stream(stream)
    grid = _dims(grid)
    cluster = None if block_in_cluster_count is None else _dims(block_in_cluster_count)
    if type(kernel).__module__.split(".")[:2] != ["cuda", "tile"]:
        raise TypeError(
            f"kernel must be a cuTile kernel (a function decorated with @ct.kernel), got "
            f"{type(kernel).__name__} {kernel!r}"
        )
    args = tuple(args)
    key, overlap, w = _key(kernel, args, stream)
    cc = tile_py.compute_capability(stream)
    full = (kernel, cc, key)
    entry = _CACHE.get(full)
    if entry is None or overlap is not None:
        shown = _replaced(args, {i: d for i, (_, d) in w.exports.items()}) if w.exports else args
        if overlap is not None:
            if entry is None:
                # cuTile's own refusal of these arguments comes first, as with ct.launch; what
                # compiles is not kept (it was derived for overlapping arrays).
                _compile(kernel, shown, cc)
            raise ValueError(overlap)
        with _LOCK:
            entry = _CACHE.get(full)
            if entry is None:
                entry = _compile(kernel, shown, cc)
                _CACHE[full] = entry
                _STATS["misses"] += 1
    else:
        _STATS["hits"] += 1
    keep = entry.keep
    if (
        type(found) is _tile.CutileKey
        and len(keep) == len(args)
        and type(entry.kernel) is tile_py.Kernel
    ):
        # Registered only under the key of the exports it was compiled for: the cached launch
        # keys these very capsules again (no producer is asked), and a producer that described
        # its tensor differently to the cached launch's export leaves the key unregistered.
        exported = _replaced(args, {
            i: (e.capsule if type(e) is _Exported else e) for i, (e, _) in w.exports.items()
        }) if w.exports else args
        again = _tile._cutile_key(
            given_stream, grid, kernel, exported, cooperative, programmatic_dependent_launch
        )
        if again == found:
            _tile._cutile_register(found, entry.kernel, list(keep))
    if w.exports:
        args = _replaced(args, {
            i: _stage(e) if type(e) is _ListArg else e for i, (e, _) in w.exports.items()
        })
    if len(keep) == len(args) and all(keep) and not any(
        type(a) is tuple or type(a) is _Staged for a in args
    ):
        passed: Sequence[Any] = args  # no tuple, list or constant: the arguments as given
    else:
        passed = []
        for x, k in zip(_leaves(args), keep):
            if k:
                passed.append(x)
                if type(x) is _Staged:
                    passed.append(x.length)
    return tile_py.launch(
        stream,
        grid,
        entry.kernel,
        passed,
        block=1,
        cluster=cluster,
        cooperative=cooperative,
        programmatic_dependent_launch=programmatic_dependent_launch,
    )


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


class _Installed:
    """What ``install()`` returns: ``with install():`` routes ``ct.launch`` through tile for the
    block and then puts back what was there before; ``uninstall()`` does so at once."""

    __slots__ = ("_previous", "_done")

    def __init__(self, previous: Tuple[Any, Any]) -> None:
        self._previous = previous
        self._done = False

    def uninstall(self) -> None:
        """Puts back the ``launch`` that ``cuda.tile`` had before this ``install()``."""
        if not self._done:
            self._done = True
            import cuda.tile
            import cuda.tile._cext

            cuda.tile.launch, cuda.tile._cext.launch = self._previous

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
    harmless."""
    cuda_tile = _import_cuda_tile()
    previous = (cuda_tile.launch, cuda_tile._cext.launch)
    cuda_tile.launch = _as_ct_launch
    cuda_tile._cext.launch = _as_ct_launch
    return _Installed(previous)


def installed() -> bool:
    """Whether ``ct.launch`` is routed through tile now (``install()``)."""
    return _import_cuda_tile().launch is _as_ct_launch


def cache_info() -> Dict[str, int]:
    """``{"entries", "hits", "misses"}``: compiled specialisations held, and launches that found
    or compiled one."""
    return {
        "entries": len(_CACHE),
        "hits": _STATS["hits"] + _tile._cutile_info()[0],
        "misses": _STATS["misses"],
    }


def clear_cache() -> None:
    """Drops every compiled specialisation (their libraries unload once no launch holds them)."""
    with _LOCK:
        _CACHE.clear()
        _tile._cutile_clear()


_tile._cutile_set_fallback(_launch)
