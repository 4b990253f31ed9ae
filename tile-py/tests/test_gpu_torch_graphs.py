"""GPU tests of tile operators (``tile_py.torch.custom_op``) inside PyTorch's CUDA graphs, as a
model uses them: with ``torch.compile(mode="reduce-overhead")`` (CUDA graph trees: a warm-up run
on the trees' stream, a recording, replays) the operator's output is an intermediate, compiled
functions are chained, the input size changes (one graph per size), steps are marked with
``torch.compiler.cudagraph_mark_step_begin``, tensors are bfloat16, and the kernel is a cuTile
kernel; with manual ``torch.cuda.graph`` captures, two graphs share a pool. Each test checks the
values against PyTorch's own operators and that nothing is left: every tensor tile took is
released once the graphs are freed, and none is leaked.

Graph trees check, after the warm-up and around each recording, that every allocated block of
their pool belongs to a tensor they track; a tensor tile kept (the operator's intermediate
output, waiting for tile's release queue) fails that check with "Detected N tensor(s) in the
cudagraph pool not tracked as outputs", which is what these tests met before tile handed
aliases inside graph regions."""

import gc
import re
import time

import pytest

import tile_py
from tile_py import _testing
import gpu_support
from tile_py import In, InOut, Out, Scalar

pytestmark = pytest.mark.gpu

BLOCK = 256
SOURCE = r"""
typedef unsigned long long u64;
typedef unsigned short bf16;
__device__ float bf16_to_f32(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ bf16 f32_to_bf16(float f) {  // round to nearest even (finite values)
    unsigned u = __float_as_uint(f);
    return (bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
extern "C" __global__ void scale_f32(const float* x, float* y, float a, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void scale_bf16(const bf16* x, bf16* y, float a, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = f32_to_bf16(a * bf16_to_f32(x[i]));
}
extern "C" __global__ void add_inplace_f32(float* x, const float* y, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    torch.zeros(1, device="cuda")
    return torch


@pytest.fixture(scope="module")
def ops(torch):
    import tile_py.torch as tt

    lib = tile_py.Library.from_cuda_source(SOURCE)

    def blocks(x, **_):
        return (x.numel() + BLOCK - 1) // BLOCK

    def numel(x, **_):
        return x.numel()

    def like(x, **_):
        return torch.empty_like(x)

    made = {}
    for dtype in ("float32", "bfloat16"):
        short = "f32" if dtype == "float32" else "bf16"
        k = lib.kernel(f"scale_{short}", [In(dtype), Out(dtype), Scalar("f32"), Scalar("u64")])

        @tt.custom_op(f"tile_graphs::scale_{short}", k, args=("x", "out", "alpha", numel),
                      outputs={"out": like}, grid=blocks, block=BLOCK)
        def scale(x: torch.Tensor, alpha: float) -> torch.Tensor: ...

        made[dtype] = scale
    add_k = lib.kernel("add_inplace_f32", [InOut("float32"), In("float32"), Scalar("u64")])

    @tt.custom_op("tile_graphs::add_", add_k, args=("x", "y", numel), grid=blocks, block=BLOCK)
    def add_(x: torch.Tensor, y: torch.Tensor) -> None: ...

    made["add_"] = add_
    return made


def _inductor_reason(torch):
    try:
        torch.compile(lambda a: a + 1, backend="inductor")(torch.ones(4, device="cuda"))
        return None
    except Exception as e:  # noqa: BLE001 - any failure means inductor cannot run here
        return f"{type(e).__name__}: {str(e)[:200]}"


def _free_graphs(torch):
    """Frees every compiled function's graphs and graph trees, and what the program dropped."""
    torch._dynamo.reset()
    trees = getattr(torch._inductor, "cudagraph_trees", None)
    if trees is not None:
        trees.reset_cudagraph_trees()
    gc.collect()
    torch.cuda.synchronize()
    tile_py.synchronize()


class Ledger:
    """What a test starts from: tile's tensors taken and released, PyTorch's allocated memory,
    and the graph-region calls of tile_py.torch."""

    def __init__(self, torch):
        import tile_py.torch as tt

        self.torch, self.tt = torch, tt
        _free_graphs(torch)
        self.counters = _testing.debug_counters()
        self.memory = torch.cuda.memory_allocated()
        self.regions = dict(tt._region_calls)

    def regions_since(self):
        return {k: v - self.regions[k] for k, v in self.tt._region_calls.items()}

    def assert_clean(self, timeout=10.0):
        """Every tensor tile took since the start is released (graphs release theirs once
        freed, through tile's release thread), and nothing leaked."""
        torch = self.torch
        _free_graphs(torch)
        deadline = time.monotonic() + timeout
        while True:
            c = _testing.debug_counters()
            held = (c["consumed"] - self.counters["consumed"]) - (c["released"] - self.counters["released"])
            if held == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
            tile_py.synchronize()
        assert held == 0, f"{held} tensor(s) tile took are not released after the graphs were freed"
        st = tile_py.stats()
        assert st["pending_guards"] == 0, st
        assert c["leaked_at_exit"] == self.counters["leaked_at_exit"], "tensors were leaked"
        assert c["consumed"] > self.counters["consumed"], "tile took no tensor: nothing was tested"
        print(f"torch memory allocated: {self.memory} B before, {torch.cuda.memory_allocated()} B after")


@pytest.fixture
def compiled(torch):
    if why := _inductor_reason(torch):
        pytest.skip(f"inductor cannot compile on this machine: {why}")
    return lambda f, **kw: torch.compile(f, mode="reduce-overhead", **kw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reduce_overhead_with_the_operator_output_as_an_intermediate(torch, ops, compiled, dtype):
    scale = ops[dtype]
    dt = getattr(torch, dtype)
    ledger = Ledger(torch)
    f = compiled(lambda x: scale(x, 2.0) + 1.0)
    for i in range(6):  # warm-up, recording, replays
        x = torch.randn(1 << 14, device="cuda").to(dt)
        out = f(x)
        torch.cuda.synchronize()
        assert out.dtype == dt
        assert torch.equal(out, x * 2.0 + 1.0), f"call {i}: wrong values"
        del out
    regions = ledger.regions_since()
    assert regions["warmup"] > 0 and regions["capture"] > 0, regions
    del f
    ledger.assert_clean()


def _chain(torch, compiled, scale, mark_steps):
    first = compiled(lambda x: scale(x, 2.0) + 1.0)
    second = compiled(lambda y: scale(y, 3.0) * y)
    for i in range(6):
        if mark_steps:
            torch.compiler.cudagraph_mark_step_begin()
        x = torch.randn(4096, device="cuda")
        y = first(x)
        z = second(y)
        torch.cuda.synchronize()
        ry = x * 2.0 + 1.0
        assert torch.equal(y, ry), f"call {i}: first"
        assert torch.equal(z, (ry * 3.0) * ry), f"call {i}: second"
        del y, z
    del first, second


@pytest.mark.parametrize("mark_steps", [True, False], ids=["mark-step-begin", "no-marks"])
def test_chain_of_compiled_functions_passes_graph_outputs_along(torch, ops, compiled, mark_steps):
    """Two compiled functions, the first's graph output the second's input: the tile operator
    is accepted wherever ``torch.mul`` in its place is, with the same values and no leak, and
    refused (by PyTorch) with the same error where ``torch.mul`` is."""
    try:
        _chain(torch, compiled, lambda x, s: torch.mul(x, s), mark_steps)
        builtin_error = None
    except RuntimeError as e:
        builtin_error = e
    torch.compiler.cudagraph_mark_step_begin()
    ledger = Ledger(torch)
    if builtin_error is None:
        _chain(torch, compiled, ops["float32"], mark_steps)
        ledger.assert_clean()
    else:
        first_words = str(builtin_error).split(".")[0]
        with pytest.raises(RuntimeError, match=re.escape(first_words)):
            _chain(torch, compiled, ops["float32"], mark_steps)
    assert mark_steps is False or builtin_error is None, builtin_error


def test_mutating_operator_and_bfloat16_operator_inside_one_compiled_function(torch, ops, compiled):
    scale, add_, scale_bf = ops["float32"], ops["add_"], ops["bfloat16"]

    def f(x, y, h):
        z = scale(x, 2.0)
        add_(z, y)
        return z * 0.5, scale_bf(h, 4.0) - 1.0

    ledger = Ledger(torch)
    g = compiled(f)
    for i in range(6):
        x, y = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
        h = torch.randn(5000, device="cuda").bfloat16()
        a, b = g(x, y, h)
        torch.cuda.synchronize()
        assert torch.equal(a, (x * 2.0 + y) * 0.5), f"call {i}"
        assert torch.equal(b, h * 4.0 - 1.0), f"call {i}"
        del a, b
    del g
    ledger.assert_clean()


def test_several_input_sizes_each_with_its_graph(torch, ops, compiled):
    scale = ops["float32"]
    ledger = Ledger(torch)
    f = compiled(lambda x: scale(x, 2.0) + 1.0, dynamic=False)
    for rnd in range(3):
        for n in (1000, 4096, 1 << 16):
            x = torch.randn(n, device="cuda")
            out = f(x)
            torch.cuda.synchronize()
            assert out.shape == (n,) and torch.equal(out, x * 2.0 + 1.0), (rnd, n)
            del out
    del f
    ledger.assert_clean()


def test_steps_marked_with_cudagraph_mark_step_begin(torch, ops, compiled):
    scale = ops["float32"]
    ledger = Ledger(torch)
    f = compiled(lambda x: scale(x, 3.0) - x)
    kept = []
    xs = [torch.randn(8192, device="cuda") for _ in range(8)]
    for x in xs:
        torch.compiler.cudagraph_mark_step_begin()
        out = f(x)
        kept.append(out.clone())  # the next step may overwrite the graph's output
    torch.cuda.synchronize()
    for i, (x, got) in enumerate(zip(xs, kept)):
        assert torch.equal(got, x * 3.0 - x), f"step {i}"
    del f, out
    ledger.assert_clean()


def test_manual_captures_sharing_a_pool(torch, ops):
    scale, scale_bf = ops["float32"], ops["bfloat16"]
    ledger = Ledger(torch)
    n = 1 << 15
    x = torch.randn(n, device="cuda")
    h = torch.randn(n, device="cuda").bfloat16()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, eager on a side stream
        scale(x, 2.0)
        scale_bf(h, 2.0)
    torch.cuda.current_stream().wait_stream(side)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        y = scale(x, 2.0) + 1.0
        hb = scale_bf(h, 2.0) + 1.0
    with torch.cuda.graph(g2, pool=g1.pool()):
        z = scale(y, 3.0) * y
        hz = scale_bf(hb, 0.5)
    assert ledger.regions_since()["capture"] == 4
    for i in range(5):
        fx = torch.randn(n, device="cuda")
        fh = torch.randn(n, device="cuda").bfloat16()
        x.copy_(fx)
        h.copy_(fh)
        g1.replay()
        g2.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, fx * 2.0 + 1.0), f"replay {i}: g1"
        assert torch.equal(z, (fx * 2.0 + 1.0) * 3.0 * (fx * 2.0 + 1.0)), f"replay {i}: g2"
        assert torch.equal(hz, (fh * 2.0 + 1.0) * 0.5), f"replay {i}: bfloat16"
    del g1, g2, y, z, hb, hz, x, h, fx, fh
    ledger.assert_clean()


# ---- a cuTile kernel made into an operator, inside graph trees --------------------------------


def test_cutile_operator_in_reduce_overhead_as_an_intermediate(torch, compiled):
    gpu_support.require_cutile()
    import cutile_kernels as K
    import tile_py.torch as tt

    @tt.custom_op(
        "tile_graphs::cutile_axpy",
        K.axpy,
        args=("x", "y", "out", "alpha"),
        outputs={"out": lambda x, **_: torch.empty_like(x)},
        grid=lambda x, **_: (x.numel() // K.TILE,),
        mutates_args=(),
    )
    def axpy(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor: ...

    ledger = Ledger(torch)
    f = compiled(lambda x, y: axpy(x, y, 2.0) + 1.0)
    for i in range(5):
        x = torch.randn(1 << 14, device="cuda")
        y = torch.randn(1 << 14, device="cuda")
        out = f(x, y)
        torch.cuda.synchronize()
        assert torch.allclose(out, x * 2.0 + y + 1.0, rtol=1e-6, atol=1e-6), f"call {i}"
        del out
    del f, x, y
    regions = ledger.regions_since()
    assert regions["warmup"] > 0 and regions["capture"] > 0, regions
    ledger.assert_clean()
