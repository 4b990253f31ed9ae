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

__all__ = ["TARGET", "call", "kernel_id", "register_target", "attributes"]

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
    (gx, gy, gz), (bx, by, bz), sm = _ext._xla_config(grid, block, shared_mem)
    bits, kinds = _ext._xla_scalars(kernel, list(scalars))
    attrs = {
        "kernel": kernel_id(kernel),
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
        if hasattr(kernel, "_pyfunc") or type(kernel).__module__.startswith("cuda.tile"):
            raise NotImplementedError(
                "tile_py.jax.call takes a tile_py.Kernel; cuTile kernels are not supported yet"
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
