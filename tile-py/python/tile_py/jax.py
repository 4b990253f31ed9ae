"""tile kernels inside ``jax.jit``, as XLA custom calls through XLA's FFI.

    import jax, jax.numpy as jnp
    import tile_py, tile_py.jax

    scale = tile_py.jax.call(
        kernel,                                   # In f32, Out f32, Scalar f32, Scalar u64
        out_shapes=lambda x: [jax.ShapeDtypeStruct(x.shape, x.dtype)],
        grid=lambda x: (x.size + 255) // 256,
        block=256,
    )
    f = jax.jit(lambda x: scale(x, 2.0, x.size) + 1.0)

``call`` returns a function of the kernel's operands: one per parameter that is not ``Out``, in
declaration order (JAX arrays for ``In`` and ``InOut`` parameters, Python numbers for scalars,
which are static). Its results are the kernel's ``Out`` parameters (allocated by XLA from
``out_shapes``) and ``InOut`` parameters (the operand's buffer, aliased by XLA), in declaration
order: one array, or a tuple of several.

Every call runs through one XLA FFI handler of tile's own, registered once for the CUDA
platform: it reads XLA's buffers, attributes and stream and launches through tile's checked
launch on XLA's stream, so a wrong dtype, rank or extent, a misaligned buffer or a buffer on
another device is refused before anything runs, as an error of the call (``jax.errors.
JaxRuntimeError`` whose message starts ``tile_py.jax: kernel `name`: argument i``). Buffers
belong to XLA: they live until the work XLA enqueued for the call has finished.

Importing this module does not import ``jax``; building a call does.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import tile_py
from tile_py import _tile_py as _ext

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

TARGET = "tile_py_launch"
"""The name of tile's FFI target (one for every kernel), registered for platform ``CUDA``."""

_lock = threading.Lock()
_registered = False
# id(kernel) -> (kernel, registry id). The kernel object is kept alive here (its id() stays
# unique), and the Rust registry keeps what the handler launches for as long as the process lives.
_ids: Dict[int, Tuple[Any, int]] = {}

# The vmap methods that are sound for a tile call: the handler launches with the configuration
# computed at trace time for unbatched shapes, so only a loop of unbatched calls is correct.
_SOUND_VMAP = ("sequential", "sequential_unrolled")


def register_target() -> None:
    """Registers tile's FFI handler with JAX as ``TARGET`` for platform ``CUDA``, once per
    process (``call`` does it when first used)."""
    global _registered
    with _lock:
        if _registered:
            return
        import jax

        jax.ffi.register_ffi_target(TARGET, _ext._xla_handler(), platform="CUDA", api_version=1)
        _registered = True


def kernel_id(kernel: "tile_py.Kernel") -> int:
    """The id of ``kernel`` in the registry the handler reads (registered on first use; the
    kernel is kept loaded for the life of the process)."""
    if not isinstance(kernel, tile_py.Kernel):
        raise TypeError(f"kernel must be a tile_py.Kernel, got {kernel!r}")
    with _lock:
        hit = _ids.get(id(kernel))
        if hit is not None:
            return hit[1]
        kid = _ext._xla_register(kernel)
        _ids[id(kernel)] = (kernel, kid)
        return kid


def attributes(
    kernel: "tile_py.Kernel", grid: Any, block: Any, shared_mem: Any, scalars: Sequence[Any]
) -> Dict[str, int]:
    """The FFI attributes of one call, all int64 scalars: ``kernel``, ``grid_x`` .. ``block_z``,
    ``shared_mem`` and, per scalar parameter ``i``, ``scalar{i}`` (its 64 bits) and
    ``scalar{i}_kind``. ``grid``, ``block`` and ``shared_mem`` are read as ``tile_py.launch``
    reads them; the scalars are converted as ``tile_py.launch`` converts them."""
    return _attributes(kernel_id(kernel), kernel, grid, block, shared_mem, scalars)


def _attributes(
    kid: int, kernel: "tile_py.Kernel", grid: Any, block: Any, shared_mem: Any,
    scalars: Sequence[Any],
) -> Dict[str, int]:
    """``attributes`` for the registry entry ``kid`` of ``kernel``."""
    (gx, gy, gz), (bx, by, bz), sm = _ext._xla_config(grid, block, shared_mem)
    bits, kinds = _ext._xla_scalars(kernel, list(scalars))
    attrs = {
        "kernel": kid,
        "grid_x": gx,
        "grid_y": gy,
        "grid_z": gz,
        "block_x": bx,
        "block_y": by,
        "block_z": bz,
        "shared_mem": sm,
    }
    for i, (b, k) in enumerate(zip(bits, kinds)):
        attrs[f"scalar{i}"] = b
        attrs[f"scalar{i}_kind"] = k
    return attrs


def _is_traced_value(x: Any) -> bool:
    import jax

    # Tracers are `jax.Array`s too.
    return isinstance(x, jax.Array)


def _shape_of(x: Any) -> Any:
    import jax

    return jax.ShapeDtypeStruct(tuple(x.shape), x.dtype)


def _resolve(value: Any, arrays: Sequence[Any]) -> Any:
    return value(*arrays) if callable(value) else value


def call(
    kernel: Any,
    *,
    out_shapes: Any = (),
    grid: Any,
    block: Any = 1,
    shared_mem: Any = 0,
    input_output_aliases: Optional[Mapping[int, int]] = None,
    vmap_method: Optional[str] = None,
) -> Callable[..., Any]:
    """A function that runs ``kernel`` as an XLA custom call (inside ``jax.jit`` or eagerly).

    - ``kernel``: a ``tile_py.Kernel``.
    - ``out_shapes``: a ``jax.ShapeDtypeStruct`` (or a sequence of them) per ``Out`` parameter, in
      declaration order, or a function of the array operands returning them.
    - ``grid``, ``block``: blocks per grid and threads per block (an int or a 1-3 tuple), or
      functions of the array operands (``jax.ShapeDtypeStruct``s) evaluated at trace time.
    - ``shared_mem``: dynamic shared memory per block in bytes, or a function as above.
    - ``input_output_aliases``: more aliases, ``{array operand index: result index}`` (``InOut``
      parameters are aliased already), e.g. to write an ``Out`` result over a donated input.
    - ``vmap_method``: ``None`` (vmapping the call raises), or ``"sequential"`` /
      ``"sequential_unrolled"`` (one call per batch element, each with the configuration of
      the unbatched shapes). Other methods would launch with an unbatched grid on batched
      buffers and are refused.

    Raises ``TypeError`` for a kernel that is not a ``tile_py.Kernel``, an operand count that
    does not match, a traced value for a scalar parameter, or ``out_shapes`` that do not match
    the ``Out`` parameters; ``ValueError`` for an unsound ``vmap_method``.
    """
    if vmap_method is not None and vmap_method not in _SOUND_VMAP:
        raise ValueError(
            f"vmap_method={vmap_method!r} would launch the kernel with the configuration of the "
            f"unbatched shapes on batched buffers; use one of {_SOUND_VMAP} or None"
        )
    if not isinstance(kernel, tile_py.Kernel):
        if _is_cutile_kernel(kernel):
            raise TypeError(
                "tile_py.jax.call takes a tile_py.Kernel; call cuTile kernels with "
                "tile_py.jax.cutile_call(grid, kernel, args)"
            )
        raise TypeError(f"kernel must be a tile_py.Kernel, got {kernel!r}")
    params = kernel.params
    kinds = [_kind(p) for p in params]
    n_operands = sum(1 for k in kinds if k != "out")
    n_out = sum(1 for k in kinds if k == "out")
    extra = dict(input_output_aliases or {})

    def run(*operands: Any) -> Any:
        import jax

        if len(operands) != n_operands:
            raise TypeError(
                f"kernel `{kernel.name}` takes {n_operands} operands (one per parameter that is "
                f"not Out), {len(operands)} were given"
            )
        arrays: List[Any] = []
        scalars: List[Any] = []
        array_index: Dict[int, int] = {}  # operand position -> array operand index
        for pos, (value, kind) in enumerate(zip(operands, [k for k in kinds if k != "out"])):
            if kind == "scalar":
                if _is_traced_value(value):
                    raise TypeError(
                        f"operand {pos} of kernel `{kernel.name}` is a scalar parameter, which "
                        f"is static (an FFI attribute): pass a Python number, not {type(value).__name__}"
                    )
                scalars.append(value)
            else:
                array_index[pos] = len(arrays)
                arrays.append(value)
        shapes = [_shape_of(a) for a in arrays]
        outs = _resolve(out_shapes, shapes)
        if isinstance(outs, jax.ShapeDtypeStruct):
            outs = [outs]
        outs = list(outs)
        if len(outs) != n_out:
            raise TypeError(
                f"kernel `{kernel.name}` has {n_out} Out parameters, out_shapes gives {len(outs)}"
            )
        results: List[Any] = []
        aliases: Dict[int, int] = {}
        it_out = iter(outs)
        op = 0
        for kind in kinds:
            if kind == "out":
                results.append(next(it_out))
            elif kind == "inout":
                aliases[array_index[op]] = len(results)
                results.append(shapes[array_index[op]])
                op += 1
            else:
                op += 1
        for a, r in extra.items():
            if a in aliases and aliases[a] != r:
                raise ValueError(f"input_output_aliases: operand {a} is aliased to result {aliases[a]} already")
            aliases[a] = r
        attrs = attributes(
            kernel,
            _resolve(grid, shapes),
            _resolve(block, shapes),
            _resolve(shared_mem, shapes),
            scalars,
        )
        register_target()
        f = jax.ffi.ffi_call(
            TARGET,
            results,
            input_output_aliases=aliases or None,
            vmap_method=vmap_method,
        )
        got = f(*arrays, **attrs)
        got = list(got) if isinstance(got, (list, tuple)) else [got]
        return got[0] if len(got) == 1 else tuple(got)

    run.__name__ = f"tile_{kernel.name}"
    run.__doc__ = f"tile kernel `{kernel.name}` as an XLA custom call ({TARGET})."
    return run


def _kind(p: Any) -> str:
    """``in``, ``out``, ``inout`` or ``scalar`` for a declared parameter."""
    if not p.is_tensor:
        return "scalar"
    if not p.writes:
        return "in"
    return "inout" if repr(p).startswith("tile_py.InOut(") else "out"


# ---- cuTile kernels ----------------------------------------------------------------------------
#
# ``cutile_call`` takes ``cuda.tile.jax.cutile_call``'s arguments. At trace time the kernel is
# compiled through tile_py.cutile for the call's avals, shown to cuTile as stand-ins (below), and
# registered with the roles of this call site: cuTile declares every array ``In``, so the handler
# is told which parameter takes which operand or result.


class OutputPlaceholder:
    """An output of ``cutile_call``: XLA allocates an array of ``shape`` and ``dtype`` for the
    kernel to write, and the call returns it. cuTile's own ``cuda.tile.jax.OutputPlaceholder``
    (and a ``jax.ShapeDtypeStruct``) is taken the same way."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: Sequence[int], dtype: Any) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"OutputPlaceholder(shape={self.shape}, dtype={self.dtype})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, OutputPlaceholder)
            and (self.shape, self.dtype) == (other.shape, other.dtype)
        )

    __hash__ = None  # type: ignore[assignment]


class InputOutput:
    """An array the kernel updates in place: passed as an operand that XLA aliases to an
    output, which the call returns (the array itself is left as it was unless donated). cuTile's
    own ``cuda.tile.jax.InputOutput`` is taken the same way."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __repr__(self) -> str:
        return f"InputOutput({self.array!r})"


def _is_cutile_kernel(kernel: Any) -> bool:
    return type(kernel).__module__.split(".")[:2] == ["cuda", "tile"]


def _is_cutile_type(x: Any, name: str) -> bool:
    """Whether ``x`` is cuTile's class ``name`` (``cuda.tile.jax``'s placeholders), read by
    name so that cuTile need not be imported."""
    t = type(x)
    return t.__name__ == name and t.__module__.split(".")[:2] == ["cuda", "tile"]


# XLA hands a custom call buffers aligned to at least 16 bytes (entry parameters; the buffers
# XLA allocates itself are aligned to 256). A stand-in's address is aligned to exactly 16 (an
# odd multiple of 16), so cuTile can derive no more than that from it; tile checks the
# assumption on every launch against the real buffer.
_XLA_BUFFER_ALIGN = 16
_STANDIN_BASE = 1 << 44


def _typestr(dtype: Any, where: str) -> str:
    """The ``__cuda_array_interface__`` typestr of a JAX dtype (numpy's own, which is what the
    interface uses). Of the extended dtypes only bfloat16 has one cuTile reads."""
    import numpy as np

    d = np.dtype(dtype)
    if d.kind not in "biufcV" or (d.kind == "V" and d.name != "bfloat16"):
        raise NotImplementedError(
            f"tile_py.jax.cutile_call: {where}: dtype {d.name} cannot be described to cuTile"
        )
    return d.str


class _Standin:
    """An array of a call as cuTile is shown it at trace time: its aval's shape and dtype, dense
    row-major (XLA's default layout, the one custom calls get), at a made-up address with XLA's
    alignment. cuTile only reads the layout to derive the kernel's signature."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, shape: Tuple[int, ...], dtype: Any, address: int, where: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "strides": None,
            "typestr": _typestr(dtype, where),
            "data": (address, False),
            "version": 3,
        }


class _Planned:
    """``cutile_call``'s arguments sorted out: what cuTile is shown (``shown``, the arguments
    with every array a ``_Standin``), per leaf (tuples flattened, in order) its role and where
    it is, the operands (JAX arrays), the results (``(shape, dtype)``) and the aliases."""

    __slots__ = ("shown", "leaves", "operands", "results", "aliases", "_address")

    def __init__(self) -> None:
        self.shown: Tuple[Any, ...] = ()
        # (kind, payload, where): ("in", j), ("out", k), ("inout", (j, k)), ("value", v).
        self.leaves: List[Tuple[str, Any, str]] = []
        self.operands: List[Any] = []
        self.results: List[Tuple[Tuple[int, ...], Any]] = []
        self.aliases: Dict[int, int] = {}
        self._address = _STANDIN_BASE

    def standin(self, shape: Any, dtype: Any, where: str) -> _Standin:
        shape = tuple(int(n) for n in shape)
        import numpy as np

        nbytes = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        s = _Standin(shape, dtype, self._address + _XLA_BUFFER_ALIGN, where)
        # The next one past this one's end, disjoint (cuTile compiles arrays as not aliasing).
        self._address += (nbytes + 2 * _XLA_BUFFER_ALIGN + 255) // 256 * 256 + 256
        return s


def _plan_args(
    names: Sequence[str], args: Sequence[Any], is_array: Callable[[Any], bool]
) -> _Planned:
    """Sorts out ``cutile_call``'s arguments (``is_array`` tells a JAX array)."""
    p = _Planned()

    def leaf(x: Any, where: str) -> Any:
        if isinstance(x, tuple):
            return tuple(leaf(y, f"{where}[{i}]") for i, y in enumerate(x))
        if isinstance(x, list):
            raise NotImplementedError(
                f"tile_py.jax.cutile_call: argument {where}: a list of arrays"
            )
        if is_array(x):
            p.leaves.append(("in", len(p.operands), where))
            p.operands.append(x)
            return p.standin(x.shape, x.dtype, where)
        if isinstance(x, InputOutput) or _is_cutile_type(x, "InputOutput"):
            a = x.array
            if not is_array(a):
                raise TypeError(
                    f"tile_py.jax.cutile_call: argument {where}: InputOutput wraps a JAX array, "
                    f"got {type(a).__name__}"
                )
            j, k = len(p.operands), len(p.results)
            p.leaves.append(("inout", (j, k), where))
            p.operands.append(a)
            p.results.append((tuple(a.shape), a.dtype))
            p.aliases[j] = k
            return p.standin(a.shape, a.dtype, where)
        if (
            isinstance(x, OutputPlaceholder)
            or _is_cutile_type(x, "OutputPlaceholder")
            or type(x).__name__ == "ShapeDtypeStruct"
        ):
            shape = tuple(int(n) for n in x.shape)
            p.leaves.append(("out", len(p.results), where))
            p.results.append((shape, x.dtype))
            return p.standin(shape, x.dtype, where)
        if hasattr(x, "__cuda_array_interface__") or hasattr(x, "__dlpack__") or (
            hasattr(x, "__array__") and hasattr(x, "ndim") and getattr(x, "ndim", 0) > 0
        ) or type(x).__name__ == "ndarray":
            raise TypeError(
                f"tile_py.jax.cutile_call: argument {where}: arrays are passed as JAX arrays "
                f"(jnp.asarray), outputs as OutputPlaceholder; got {type(x).__name__}"
            )
        # A scalar or a compile-time constant, as given (cuTile refuses what it cannot take).
        p.leaves.append(("value", x, where))
        return x

    p.shown = tuple(leaf(x, f"{i} ({names[i]!r})") for i, x in enumerate(args))
    return p


def _roles(p: _Planned, keep: Sequence[bool], kernel_name: str) -> Tuple[List[Tuple[Any, ...]], List[Any]]:
    """The role list of the compiled kernel's parameters (one per kept leaf) and the scalar
    values, in order. ``keep`` is per leaf whether it is passed (False for compile-time
    constants, which are compiled in)."""
    if len(keep) != len(p.leaves):
        raise NotImplementedError(
            f"tile_py.jax.cutile_call: kernel `{kernel_name}` has {len(keep)} argument leaves "
            f"compiled, {len(p.leaves)} given"
        )
    roles: List[Tuple[Any, ...]] = []
    scalars: List[Any] = []
    for (kind, payload, where), k in zip(p.leaves, keep):
        if not k:
            if kind != "value":
                raise TypeError(
                    f"tile_py.jax.cutile_call: {kernel_name}: argument {where} is a compile-time "
                    f"constant (ct.Constant); pass a static Python value, not an array"
                )
            continue
        if kind == "in":
            roles.append(("operand", payload))
        elif kind == "out":
            roles.append(("result", payload))
        elif kind == "inout":
            roles.append(("inout", payload[0], payload[1]))
        else:
            roles.append(("scalar", len(scalars)))
            scalars.append(payload)
    return roles, scalars


_cutile_lock = threading.Lock()
# (kernel, compute capability, specialisation key) -> compiled kernel (tile_py.cutile._Compiled).
_cutile_compiled: Dict[Any, Any] = {}
# (id of the compiled tile kernel, roles) -> (tile kernel, registry id).
_cutile_sites: Dict[Any, Tuple[Any, int]] = {}
_cc: Optional[Tuple[int, int]] = None


def _compute_capability() -> Tuple[int, int]:
    """The compute capability of JAX's first GPU (``compute_capability``, e.g. ``"9.0"``), the
    one the kernel is compiled for."""
    global _cc
    if _cc is None:
        import jax

        devices = jax.devices("gpu")
        cc = getattr(devices[0], "compute_capability", None) if devices else None
        if cc is None:
            raise RuntimeError(
                "tile_py.jax.cutile_call: JAX's GPU device reports no compute_capability"
            )
        major, _, minor = str(cc).partition(".")
        _cc = (int(major), int(minor or 0))
    return _cc


def _site(kernel: Any, p: _Planned, cc: Tuple[int, int]) -> Tuple[Any, int, List[Any]]:
    """The compiled tile kernel of this call site, its registry id and the scalar values."""
    import tile_py.cutile as tc

    key = (kernel, cc, tuple(tc._key(kernel, p.shown)))
    with _cutile_lock:
        compiled = _cutile_compiled.get(key)
        if compiled is None:
            compiled = tc._compile(kernel, p.shown, cc)
            _cutile_compiled[key] = compiled
    roles, scalars = _roles(p, compiled.keep, kernel._annotated_function.pyfunc.__name__)
    site = (id(compiled.kernel), tuple(roles))
    with _cutile_lock:
        hit = _cutile_sites.get(site)
        if hit is None:
            hit = _cutile_sites[site] = (compiled.kernel, _ext._xla_register(compiled.kernel, roles))
    return compiled.kernel, hit[1], scalars


def cutile_call(grid: Any, kernel: Any, args: Sequence[Any]) -> Any:
    """Runs a cuTile kernel (``@ct.kernel``) as an XLA custom call, inside ``jax.jit`` or
    eagerly; ``cuda.tile.jax.cutile_call``'s calling convention.

    - ``grid``: blocks per grid, a tuple of at most 3 ints (padded with 1s), each at most
      ``tile_py.cutile.MAX_GRID_DIM``.
    - ``args``: one per kernel parameter: a JAX array (an input, read only);
      ``OutputPlaceholder(shape, dtype)`` (an output XLA allocates, returned); ``InputOutput(x)``
      (``x`` updated in place: XLA aliases it to an output, returned); a ``bool``, ``int`` or
      ``float`` (a scalar, or the value of a ``ct.Constant`` parameter: static, so inside
      ``jax.jit`` pass it through ``static_argnums``); a tuple of these for a tuple parameter.
      cuTile's own ``OutputPlaceholder`` and ``InputOutput`` are taken too.

    Returns the outputs in argument order of the ``OutputPlaceholder`` and ``InputOutput``
    arguments: one array, or a tuple of several.

    The kernel is compiled at trace time through ``tile_py.cutile`` for the avals (dense
    row-major, 16-byte aligned: what XLA hands a custom call) and the constants, and runs through
    tile's FFI handler, whose checked launch re-checks every compiled assumption against XLA's
    buffers (a breaking one is an error of the call, never a wrong result).

    Raises ``TypeError`` for what is not a cuTile kernel, a wrong argument count, an argument of
    an unsupported kind (a numpy array), an array passed to a ``ct.Constant`` parameter or a
    call without outputs; cuTile's errors for what it cannot compile; ``NotImplementedError``
    for lists of arrays and for parameter kinds ``tile_py.cutile`` cannot pass.
    """
    if not _is_cutile_kernel(kernel):
        raise TypeError(
            f"kernel must be a cuTile kernel (a function decorated with @ct.kernel), got "
            f"{type(kernel).__name__} {kernel!r}"
        )
    import jax

    import tile_py.cutile as tc

    dims = tc._dims(grid)
    args = tuple(args)
    _anns, names, _consts = tc._plan(kernel)
    if len(args) != len(names):
        raise tc._count_error(kernel, len(names), len(args))
    p = _plan_args(names, args, lambda x: isinstance(x, jax.Array))
    if not p.results:
        raise TypeError(
            "tile_py.jax.cutile_call: the call has no output (an OutputPlaceholder or "
            "InputOutput argument); XLA would drop it"
        )
    tk, kid, scalars = _site(kernel, p, _compute_capability())
    attrs = _attributes(kid, tk, dims, 1, 0, scalars)
    register_target()
    results = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in p.results]
    got = jax.ffi.ffi_call(TARGET, results, input_output_aliases=p.aliases or None)(
        *p.operands, **attrs
    )
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    return got[0] if len(got) == 1 else tuple(got)
