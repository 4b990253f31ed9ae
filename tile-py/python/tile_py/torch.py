"""PyTorch custom operators from tile kernels: ``torch.compile`` (``fullgraph=True`` included),
``torch.library.opcheck`` and CUDA graphs (``mode="reduce-overhead"``) see a tile launch as an
operator with a schema, declared mutations and a fake implementation, instead of an opaque call.

    import torch
    import tile_py
    import tile_py.torch

    scale_kernel = lib.kernel("scale", [tile_py.In("float32"), tile_py.Out("float32"),
                                        tile_py.Scalar("f32"), tile_py.Scalar("u64")])

    @tile_py.torch.custom_op(
        "mylib::scale",
        scale_kernel,
        args=("x", "out", "alpha", lambda x, **_: x.numel()),
        outputs={"out": lambda x, **_: torch.empty_like(x)},
        grid=lambda x, **_: (x.numel() + 255) // 256,
        block=256,
    )
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor: ...

    y = scale(x, 2.0)                       # eager
    y = torch.compile(f, fullgraph=True)(x)  # traced as mylib::scale

The decorated function is a stub: its signature and type annotations give the operator's schema
(as ``torch.library.custom_op`` infers it), its body is never run. The launch runs on PyTorch's
current stream of the first tensor input's device, through ``tile_py.launch``: every argument is
checked before anything is consumed, and the tensors are released only after the kernel has
finished. Captured into a PyTorch CUDA graph (``mode="reduce-overhead"``, ``torch.cuda.graph``),
the launch hands tile views of the tensors' memory instead (``__cuda_array_interface__``, no
reference to the tensors), which tile keeps until the graph is freed: the memory belongs to the
graph's pool or to static inputs the graph's owner keeps, as for every operator in a PyTorch CUDA
graph, and PyTorch's CUDA graph trees refuse to record while other references to pool memory
live. bfloat16 has no ``__cuda_array_interface__`` type: such tensors are passed as tensors.

Importing this module does not import ``torch``; defining an operator does.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Mapping, Sequence, Union

from . import Kernel, launch, stats

__all__ = ["custom_op"]

#: What an entry of ``args`` may be: the name of an operator input or output, a function of the
#: operator's inputs (called with them as keywords), or a constant scalar.
ArgSpec = Union[str, Callable[..., Any], int, float, bool]
#: A launch dimension: an int or a 1-3 tuple, or a function of the operator's inputs giving one.
DimSpec = Union[int, Sequence[int], Callable[..., Any]]


def custom_op(
    name: str,
    kernel: Any,
    *,
    args: Sequence[ArgSpec],
    grid: DimSpec,
    block: DimSpec = 1,
    outputs: Mapping[str, Callable[..., Any]] | None = None,
    mutates_args: Sequence[str] | None = None,
    shared_mem: int | Callable[..., int] = 0,
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: the PyTorch custom operator ``name`` (``"namespace::op"``) that launches
    ``kernel``, a ``tile_py.Kernel`` or a cuTile kernel (``@ct.kernel``, launched through
    ``tile_py.cutile.launch``); the decorated stub gives the operator's signature.

    - ``args``: one entry per kernel parameter, in order. A tensor parameter (``In``, ``Out``,
      ``InOut``) must name an operator input or an entry of ``outputs``; a scalar parameter takes
      an input's name, a function of the inputs (called with them as keywords, e.g.
      ``lambda x, **_: x.numel()``) or a constant.
    - ``grid``, ``block``: blocks per grid and threads per block (int or 1-3 tuple), or functions
      of the inputs giving them. ``shared_mem``: dynamic shared memory in bytes, or a function.
    - ``outputs``: tensors the operator allocates and returns, by name, in return order: each a
      function of the inputs that allocates it (``lambda x, **_: torch.empty_like(x)``). Called
      with fake tensors too, so it doubles as the fake (meta) implementation.
    - ``mutates_args``: the inputs the operator writes. Derived from the kernel's ``Out`` and
      ``InOut`` parameters when omitted; when given, it must include every input bound to one
      (``ValueError`` otherwise: a mutation is declared, never hidden). A cuTile kernel does not
      declare what it writes: for one, ``mutates_args`` is required (``()`` when the kernel
      writes only outputs the operator allocates), and ``block`` is ignored.

    Raises ``ValueError`` or ``TypeError`` at definition for a spec that does not match the
    kernel's parameters or the stub's signature; ``ImportError`` without PyTorch.
    """
    outputs = dict(outputs or {})
    if isinstance(args, str) or isinstance(mutates_args, str):
        which = "args" if isinstance(args, str) else "mutates_args"
        raise TypeError(f"{name}: {which} must be a sequence of names, not the str {args if which == 'args' else mutates_args!r}")
    arg_specs = tuple(args)

    def define(stub: Callable[..., Any]) -> Any:
        sig = inspect.signature(stub)
        mutated = _check_spec(name, kernel, sig, arg_specs, outputs, mutates_args)
        return _register(name, kernel, stub, sig, arg_specs, outputs, mutated, grid, block, shared_mem)

    return define


def _is_cutile(kernel: Any) -> bool:
    """Whether ``kernel`` is a cuTile kernel rather than a ``tile_py.Kernel`` (read without
    importing ``cuda.tile``)."""
    if isinstance(kernel, Kernel) or hasattr(kernel, "params"):
        return False
    return type(kernel).__module__.split(".")[:2] == ["cuda", "tile"]


def _check_spec(
    name: str,
    kernel: Any,
    sig: inspect.Signature,
    arg_specs: tuple[ArgSpec, ...],
    outputs: dict[str, Callable[..., Any]],
    mutates_args: Sequence[str] | None,
) -> tuple[str, ...]:
    """Checks the spec against the stub's signature and, for a ``tile_py.Kernel``, its declared
    parameters (a cuTile kernel declares none: its ``mutates_args`` must be given); returns the
    mutated inputs. Runs before PyTorch is imported."""
    if not isinstance(name, str) or name.count("::") != 1 or not all(name.split("::")):
        raise ValueError(f"operator name must be 'namespace::name', got {name!r}")
    params: list[Any] | None = None
    if _is_cutile(kernel):
        if mutates_args is None:
            raise ValueError(
                f"{name}: a cuTile kernel does not declare which arrays it writes: pass "
                f"mutates_args (the inputs it writes; () when it writes only the outputs the "
                f"operator allocates)"
            )
    elif not hasattr(kernel, "params"):
        raise TypeError(
            f"{name}: kernel must be a tile_py.Kernel or a cuTile kernel (@ct.kernel), got "
            f"{type(kernel).__name__} {kernel!r}"
        )
    else:
        params = list(kernel.params)
        if len(arg_specs) != len(params):
            raise ValueError(
                f"{name}: kernel {kernel.name!r} takes {len(params)} arguments, args has {len(arg_specs)}"
            )
    inputs = list(sig.parameters)
    for p in sig.parameters.values():
        if p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise TypeError(f"{name}: the stub may not take *args or **kwargs ({p})")
    for out, alloc in outputs.items():
        if out in inputs:
            raise ValueError(f"{name}: output {out!r} has the name of an input")
        if not callable(alloc):
            raise TypeError(f"{name}: outputs[{out!r}] must be a function of the inputs allocating the tensor")
    written: list[str] = []
    for i, spec in enumerate(arg_specs):
        param = params[i] if params is not None else None
        if param is not None and param.is_tensor:
            if not isinstance(spec, str):
                raise TypeError(
                    f"{name}: kernel argument {i} ({param}) is a tensor: args[{i}] must name an "
                    f"input or an output, got {spec!r}"
                )
            if param.writes and spec in inputs and spec not in written:
                written.append(spec)
        if isinstance(spec, str):
            if param is not None and not param.is_tensor and spec not in inputs:
                raise ValueError(f"{name}: args[{i}] names {spec!r}, which is not an input")
            if spec not in inputs and spec not in outputs:
                raise ValueError(f"{name}: args[{i}] names {spec!r}, which is neither an input nor an output")
        elif param is not None and not callable(spec) and not isinstance(spec, (int, float, bool)):
            raise TypeError(
                f"{name}: args[{i}] for scalar parameter {param} must be an input name, a function "
                f"of the inputs or a constant, got {spec!r}"
            )
    for out in outputs:
        if out not in arg_specs:
            raise ValueError(f"{name}: output {out!r} is not passed to the kernel")
        if params is not None and not any(p.writes and spec == out for p, spec in zip(params, arg_specs)):
            raise ValueError(
                f"{name}: output {out!r} is bound only to parameters the kernel reads (In): it "
                f"would be returned unwritten; bind it to an Out or InOut parameter"
            )
    if mutates_args is None:
        return tuple(written)
    declared = tuple(mutates_args)
    for m in declared:
        if m not in inputs:
            raise ValueError(f"{name}: mutates_args names {m!r}, which is not an input")
    hidden = [w for w in written if w not in declared]
    if hidden:
        raise ValueError(
            f"{name}: the kernel writes input(s) {hidden} (bound to Out/InOut parameters) that "
            f"mutates_args does not declare; declare them, or write into an output instead"
        )
    return declared


# `__cuda_array_interface__` type strings of the dtypes a capture view can describe.
_TYPESTR = {
    "torch.float16": "<f2",
    "torch.float32": "<f4",
    "torch.float64": "<f8",
    "torch.int8": "|i1",
    "torch.int16": "<i2",
    "torch.int32": "<i4",
    "torch.int64": "<i8",
    "torch.uint8": "|u1",
    "torch.bool": "|b1",
    "torch.complex64": "<c8",
    "torch.complex128": "<c16",
}


class _CaptureView:
    """A tensor's memory described by ``__cuda_array_interface__`` (v3, no stream to order
    after), without a reference to the tensor: what a launch captured into a PyTorch CUDA graph
    hands to tile. tile keeps the view until the graph is freed; the memory itself belongs to
    the graph's memory pool (or is a static input the graph's owner keeps), as for every
    operator in a PyTorch CUDA graph. Holding the tensors instead would keep pool memory alive
    that PyTorch's CUDA graph trees require to be freed (they refuse to record)."""

    alive = 0
    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, t: Any, typestr: str) -> None:
        item = t.element_size()
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": typestr,
            "data": (t.data_ptr(), False),
            "strides": tuple(st * item for st in t.stride()),
            "version": 3,
            "stream": None,
        }
        _CaptureView.alive += 1

    def __del__(self) -> None:
        _CaptureView.alive -= 1


def _capture_arg(torch: Any, a: Any) -> Any:
    if isinstance(a, torch.Tensor) and a.is_cuda:
        typestr = _TYPESTR.get(str(a.dtype))
        if typestr is not None:
            return _CaptureView(a, typestr)
    return a


def _dim(spec: Any, inputs: dict[str, Any]) -> Any:
    return spec(**inputs) if callable(spec) else spec


def _register(
    name: str,
    kernel: Any,
    stub: Callable[..., Any],
    sig: inspect.Signature,
    arg_specs: tuple[ArgSpec, ...],
    outputs: dict[str, Callable[..., Any]],
    mutated: tuple[str, ...],
    grid: DimSpec,
    block: DimSpec,
    shared_mem: int | Callable[..., int],
) -> Any:
    import torch  # type: ignore[import-not-found, unused-ignore]

    cutile_kernel = _is_cutile(kernel)

    def bind(a: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
        bound = sig.bind(*a, **kw)
        bound.apply_defaults()
        return dict(bound.arguments)

    def results(made: list[Any]) -> Any:
        if not made:
            return None
        return made[0] if len(made) == 1 else tuple(made)

    @functools.wraps(stub)
    def impl(*a: Any, **kw: Any) -> Any:
        inputs = bind(a, kw)
        made = {out: alloc(**inputs) for out, alloc in outputs.items()}
        env = {**inputs, **made}
        kernel_args = tuple(
            env[s] if isinstance(s, str) else (s(**inputs) if callable(s) else s) for s in arg_specs
        )
        device = next(
            (v.device for v in env.values() if isinstance(v, torch.Tensor) and v.is_cuda),
            None,
        )
        if device is None:
            raise ValueError(f"{name}: no CUDA tensor among the arguments to take the device from")
        if not cutile_kernel and torch.cuda.is_current_stream_capturing():
            # Captured into a PyTorch CUDA graph: tile holds views, the graph's pool the memory
            # (see _CaptureView); launches of the warm-up runs are released first where done.
            stats()
            kernel_args = tuple(_capture_arg(torch, v) for v in kernel_args)
        if cutile_kernel:
            from . import cutile

            # Tensors are passed as they are (cuTile picks its compiled variant from them).
            cutile.launch(torch.cuda.current_stream(device), _dim(grid, inputs), kernel, kernel_args)
            return results(list(made.values()))
        # The handle is dropped: tile's release queue keeps the tensors until the kernel is done.
        launch(
            torch.cuda.current_stream(device),
            _dim(grid, inputs),
            kernel,
            kernel_args,
            block=_dim(block, inputs),
            shared_mem=_dim(shared_mem, inputs),
        )
        return results(list(made.values()))

    def fake(*a: Any, **kw: Any) -> Any:
        inputs = bind(a, kw)
        return results([alloc(**inputs) for alloc in outputs.values()])

    schema = torch.library.infer_schema(stub, mutates_args=mutated)
    op = torch.library.custom_op(name, mutates_args=mutated, device_types="cuda", schema=schema)(impl)
    op.register_fake(fake)
    return op
