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
(as ``torch.library.custom_op`` infers it), its body is never run. The decorator returns the
operator's ``OpOverload`` (``torch.ops.mylib.scale.default``), registered on the low-level
``torch.library.Library`` path: a CUDA kernel and a fake implementation, nothing in front of them,
so an eager call costs PyTorch's dispatcher plus one generated Python function (the mapping of
``args`` and ``outputs`` is resolved once, when the operator is defined). The launch runs on
PyTorch's current stream of the first tensor input's device, through ``tile_py.launch`` (or
``tile_py.cutile.launch``): every argument is checked before anything is consumed.

Eager, tile keeps the tensors until the kernel has finished (tile's release queue). Inside
PyTorch's CUDA graphs (``torch.cuda.graph``, ``mode="reduce-overhead"``, whose graph trees also
run a warm-up on their own stream) tile receives aliases instead: tensors over the same memory
that do not own it, so that tile holds no reference PyTorch does not know of; the memory lives
as long as for PyTorch's own operators (the graph pool's, stream-ordered; see the notes above
``_region`` below). Any dtype, bfloat16 included; cuTile kernels too. A function that graph
trees accept with a PyTorch operator in the tile operator's place is accepted with it.

Importing this module does not import ``torch``; defining an operator does.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Mapping, Sequence, Union

from . import Kernel, launch

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

    Returns the operator's ``OpOverload`` (``torch.ops.<namespace>.<name>.default``): call it,
    trace it, ``opcheck`` it. It has no autograd formula: a call with an input that requires
    grad while grad mode is on raises ``RuntimeError`` (``torch.library.register_autograd`` adds
    one). Eager, tile keeps the tensors until the kernel has finished; inside PyTorch's CUDA
    graphs (a capture, graph trees' warm-up) tile is handed non-owning aliases (module docs).

    Raises ``ValueError`` or ``TypeError`` at definition for a spec that does not match the
    kernel's parameters or the stub's signature (parameter names starting with ``_tile_`` are
    reserved); ``ImportError`` without PyTorch.
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


# --- Where a call runs: eager, or inside a PyTorch CUDA graph region -------------------------
#
# Eager, tile_py.launch receives the tensors themselves and keeps them until the kernel has
# finished (tile's release queue), whichever stream they were made on.
#
# Inside a region of PyTorch's CUDA graphs (a capture on the current stream, or the warm-up run
# of CUDA graph trees, which runs on the trees' own stream and allocates from the graph pool),
# that reference is what breaks PyTorch: graph trees check after the warm-up, before and after
# each recording, that every allocated block of the pool belongs to a tensor they track, and a
# tensor tile still holds keeps its block allocated after the program dropped it ("Detected N
# tensor(s) in the cudagraph pool not tracked as outputs"). So there tile receives aliases: new
# tensors over the same memory, of the same dtype, shape, strides and offset, whose storage does
# not own it (no deleter, no reference to the original storage: the allocator and the storage's
# use count see nothing). The dtype is whatever the tensor's is (bfloat16 and the float8 types
# included), and a cuTile kernel reads the alias's layout as it would the tensor's.
#
# Why the memory lives long enough without tile's reference, as it does for PyTorch's own
# operators and for the Triton kernels inductor generates next to the tile operator (which take
# raw pointers and hold nothing):
# - A capture: nothing runs until the graph is replayed, and the memory the graph's kernels use
#   is the graph pool's (kept until the graph is freed; graph trees reuse a block only for a
#   later recording whose replay follows in stream order) or a static input the graph's owner
#   keeps. tile keeps the aliases with the graph until the graph is freed.
# - The warm-up of graph trees: it runs eagerly on the trees' stream, where the pool's blocks
#   are allocated; a block freed there is reused only by later work on that same stream, which
#   runs after the kernel (the caching allocator's stream order); the trees synchronise the
#   device before the warm-up and order the program's stream after the trees' stream when it
#   ends, so an input made elsewhere is not reused under the kernel either. tile releases the
#   aliases once the kernel is done.

# Tensor aliases handed to tile, by region (for tests and diagnosis; counted only in regions).
_region_calls = {"capture": 0, "warmup": 0}

_TREES = "torch._inductor.cudagraph_trees"


def _region(torch: Any, device: int, raw: int) -> str | None:
    """The graph region a call on device ``device`` with current raw stream ``raw`` runs in:
    ``"capture"``, ``"warmup"`` (graph trees' warm-up run), or None (eager)."""
    if raw == 0:
        # The legacy default stream never captures, and graph trees never run on it.
        return None
    if torch._C._cuda_isCurrentStreamCapturing():
        return "capture"
    trees = sys.modules.get(_TREES)
    if trees is None:
        return None
    try:
        manager = trees.get_manager(device, create_if_none_exists=False)
        tree_stream = None if manager is None else manager.stream.cuda_stream
    except (AttributeError, TypeError):
        # Graph trees whose manager cannot be read: a side stream may be their warm-up, and
        # aliases are safe there as on any stream whose work is stream-ordered.
        return "warmup"
    return "warmup" if tree_stream == raw else None


def _aliases(torch: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """``args`` with each CUDA tensor replaced by a tensor over the same memory whose storage
    does not own it (see the region notes above)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_cuda:
            st = a.untyped_storage()
            borrowed = torch._C._construct_storage_from_data_pointer(st.data_ptr(), a.device, st.nbytes())
            a = torch.empty(0, dtype=a.dtype, device=a.device).set_(
                borrowed, a.storage_offset(), a.size(), a.stride()
            )
        out.append(a)
    return tuple(out)


class _Calls:
    """What a generated call needs at run time, one instance per operator: the current stream
    of a device (one torch stream object per device and raw handle, made once: tile_py's stream
    cache then knows the object), and the region handling."""

    def __init__(self, torch: Any, name: str) -> None:
        self.torch = torch
        self.name = name
        self.raw_stream = torch._C._cuda_getCurrentRawStream
        self.streams: dict[tuple[int, int], Any] = {}

    def stream(self, device: int) -> tuple[Any, int]:
        raw = self.raw_stream(device)
        s = self.streams.get((device, raw))
        if s is None:
            s = self.streams[(device, raw)] = self.torch.cuda.current_stream(device)
        return s, raw

    def device(self, values: tuple[Any, ...]) -> int:
        for v in values:
            if isinstance(v, self.torch.Tensor) and v.is_cuda:
                return v.get_device()
        raise ValueError(f"{self.name}: no CUDA tensor among the arguments to take the device from")

    def no_autograd(self) -> None:
        raise RuntimeError(
            f"{self.name}: an input requires grad, but a tile operator has no autograd formula "
            f"(register one with torch.library.register_autograd, or call it under "
            f"torch.no_grad())"
        )

    def in_region(self, device: int, raw: int, args: tuple[Any, ...]) -> tuple[Any, ...]:
        region = _region(self.torch, device, raw)
        if region is None:
            return args
        _region_calls[region] += 1
        return _aliases(self.torch, args)


_PREFIX = "_tile_"


def _generate(
    torch: Any,
    name: str,
    kernel: Any,
    sig: inspect.Signature,
    schema: Any,
    arg_specs: tuple[ArgSpec, ...],
    outputs: dict[str, Callable[..., Any]],
    grid: DimSpec,
    block: DimSpec,
    shared_mem: int | Callable[..., int],
) -> tuple[Callable[..., Any], Callable[..., Any], str]:
    """The operator's CUDA kernel and fake implementation, as Python functions with the stub's
    own parameters, generated once per operator: the mapping of ``args`` and ``outputs`` onto
    the kernel's arguments is resolved here, so that a call binds no signature, builds no dict
    and calls only the spec entries that are functions (each with the inputs as keywords, as
    documented). Returns both and the generated source."""
    params = list(sig.parameters.values())
    for p in params:
        if p.name.startswith(_PREFIX):
            raise ValueError(f"{name}: parameter names starting with {_PREFIX!r} are reserved ({p.name})")
    env: dict[str, Any] = {}

    def const(key: str, value: Any) -> str:
        env[_PREFIX + key] = value
        return _PREFIX + key

    plist: list[str] = []
    for p in params:
        if p.kind is inspect.Parameter.KEYWORD_ONLY and "*" not in plist:
            plist.append("*")
        plist.append(p.name if p.default is p.empty else f"{p.name}={const('default_' + p.name, p.default)}")
    keywords = ", ".join(f"{p.name}={p.name}" for p in params)

    def value(spec: Any, key: str) -> str:
        if isinstance(spec, str):
            return spec
        if callable(spec):
            return f"{const(key, spec)}({keywords})"
        return const(key, spec)

    made = {out: f"{_PREFIX}out{i}" for i, out in enumerate(outputs)}
    allocs = [
        f"    {made[out]} = {const(f'alloc{i}', alloc)}({keywords})"
        for i, (out, alloc) in enumerate(outputs.items())
    ]
    kernel_args = [
        made[s] if isinstance(s, str) and s in made else value(s, f"arg{i}")
        for i, s in enumerate(arg_specs)
    ]
    results = list(made.values())
    if not results:
        ret = "None"
    elif len(results) == 1:
        ret = results[0]
    else:
        ret = "(" + ", ".join(results) + ",)"

    # The device: the first plain Tensor input's, or else the first CUDA tensor's among the
    # kernel's arguments.
    first = next((a.name for a in schema.arguments if str(a.type) == "Tensor"), None)
    env[_PREFIX + "calls"] = _Calls(torch, name)
    env[_PREFIX + "kernel"] = kernel
    # Gradients: no Python autograd kernel sits in front of the CUDA kernel (PyTorch's own
    # fallback answers that key, which would let a backward pass through silently), so a call
    # that autograd would record is refused here, as a call without a formula.
    grads = [
        f"{a.name}.requires_grad"
        if str(a.type) == "Tensor"
        else f"({a.name} is not None and {a.name}.requires_grad)"
        for a in schema.arguments
        if str(a.type) in ("Tensor", "Tensor?")
    ]
    env[_PREFIX + "grad_enabled"] = torch.is_grad_enabled
    grad_check = (
        [
            f"    if {_PREFIX}grad_enabled() and ({' or '.join(grads)}):",
            f"        {_PREFIX}calls.no_autograd()",
        ]
        if grads
        else []
    )
    device = f"{_PREFIX}calls.device({_PREFIX}args)"
    if first is not None:
        device = f"{first}.get_device() if {first}.is_cuda else {device}"
    if _is_cutile(kernel):
        from . import cutile

        env[_PREFIX + "launch"] = cutile.launch
        launch_call = f"{_PREFIX}launch({_PREFIX}s, {value(grid, 'grid')}, {_PREFIX}kernel, {_PREFIX}args)"
    else:
        env[_PREFIX + "launch"] = launch
        extra = f", block={value(block, 'block')}"
        if callable(shared_mem) or shared_mem:
            extra += f", shared_mem={value(shared_mem, 'shared_mem')}"
        launch_call = (
            f"{_PREFIX}launch({_PREFIX}s, {value(grid, 'grid')}, {_PREFIX}kernel, {_PREFIX}args{extra})"
        )
    signature = ", ".join(plist)
    source = "\n".join(
        [
            f"def impl({signature}):",
            *grad_check,
            *allocs,
            f"    {_PREFIX}args = ({''.join(a + ', ' for a in kernel_args)})",
            f"    {_PREFIX}d = {device}",
            f"    {_PREFIX}s, {_PREFIX}raw = {_PREFIX}calls.stream({_PREFIX}d)",
            f"    if {_PREFIX}raw:",
            f"        {_PREFIX}args = {_PREFIX}calls.in_region({_PREFIX}d, {_PREFIX}raw, {_PREFIX}args)",
            # The handle is dropped: tile's release queue (or the graph) keeps what it needs.
            f"    {launch_call}",
            f"    return {ret}",
            "",
            f"def fake({signature}):",
            *allocs,
            f"    return {ret}",
            "",
        ]
    )
    code = compile(source, f"<tile_py.torch operator {name}>", "exec")
    env["__name__"] = __name__
    exec(code, env)  # noqa: S102 - source built above from the stub's parameter names only
    impl, fake = env["impl"], env["fake"]
    impl.__qualname__ = fake.__qualname__ = name
    return impl, fake, source


# The registrations, by operator name: a `torch.library.Library` removes its registrations
# when it is freed.
_LIBRARIES: dict[str, Any] = {}
#: The generated source of each operator's call path, by name (for reading, not for use).
_SOURCES: dict[str, str] = {}


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

    namespace, opname = name.split("::")
    schema_text = torch.library.infer_schema(stub, mutates_args=mutated)
    schema = torch._C.parse_schema(f"{name}{schema_text}")
    impl, fake, source = _generate(
        torch, name, kernel, sig, schema, arg_specs, outputs, grid, block, shared_mem
    )
    lib = torch.library.Library(namespace, "FRAGMENT")
    lib.define(f"{opname}{schema_text}")
    # The CUDA kernel only: no Python autograd or ADInplaceOrView kernel sits in front of it
    # (what `torch.library.custom_op` adds, two Python calls per call); PyTorch's own fallbacks
    # answer those keys.
    lib.impl(opname, impl, "CUDA")
    torch.library.register_fake(name, fake, lib=lib)
    _LIBRARIES[name] = lib
    op = getattr(getattr(torch.ops, namespace), opname).default
    _SOURCES[name] = source
    return op

