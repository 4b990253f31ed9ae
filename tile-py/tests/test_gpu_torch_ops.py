"""GPU tests of tile kernels as PyTorch custom operators (``tile_py.torch.custom_op``):
``torch.library.opcheck``, ``torch.compile`` with ``fullgraph=True`` on the eager, aot_eager and
inductor backends, and CUDA graph trees (``mode="reduce-overhead"``) whose captured launches keep
their tensors until the graph is freed."""

import gc
import time

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, InOut, Out, Scalar

pytestmark = pytest.mark.gpu

BLOCK = 256
SOURCE = r"""
typedef unsigned long long u64;
typedef long long i64;
extern "C" __global__ void scale_f32(const float* x, float* y, float a, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void add_inplace_f32(float* x, const float* y, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}
// y (rows x cols, dense) = 2 * x, x read through its element strides (any layout).
extern "C" __global__ void double_2d_f32(const float* x, i64 s0, i64 s1, float* y, i64 rows, i64 cols) {
    i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x;
    if (i < rows * cols) { i64 r = i / cols, c = i % cols; y[i] = 2.0f * x[r * s0 + c * s1]; }
}
"""


def strided_in(dtype):
    """An input read through its strides: declared strided where tile_py has that option."""
    try:
        return In(dtype, strided=True)
    except TypeError:
        return In(dtype)


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
    scale_k = lib.kernel("scale_f32", [In("float32"), Out("float32"), Scalar("f32"), Scalar("u64")])
    add_k = lib.kernel("add_inplace_f32", [InOut("float32"), In("float32"), Scalar("u64")])
    dbl_k = lib.kernel(
        "double_2d_f32",
        [strided_in("float32"), Scalar("i64"), Scalar("i64"), Out("float32"), Scalar("i64"), Scalar("i64")],
    )

    def blocks(x, **_):
        return (x.numel() + BLOCK - 1) // BLOCK

    @tt.custom_op(
        "tile_test::scale",
        scale_k,
        args=("x", "out", "alpha", lambda x, **_: x.numel()),
        outputs={"out": lambda x, **_: torch.empty_like(x)},
        grid=blocks,
        block=BLOCK,
    )
    def scale(x: torch.Tensor, alpha: float) -> torch.Tensor: ...

    @tt.custom_op(
        "tile_test::add_",
        add_k,
        args=("x", "y", lambda x, **_: x.numel()),
        grid=blocks,
        block=BLOCK,
    )
    def add_(x: torch.Tensor, y: torch.Tensor) -> None: ...

    @tt.custom_op(
        "tile_test::double_2d",
        dbl_k,
        args=("x", lambda x, **_: x.stride(0), lambda x, **_: x.stride(1), "out",
              lambda x, **_: x.shape[0], lambda x, **_: x.shape[1]),
        outputs={"out": lambda x, **_: torch.empty(x.shape, dtype=x.dtype, device=x.device)},
        grid=blocks,
        block=BLOCK,
    )
    def double_2d(x: torch.Tensor) -> torch.Tensor: ...

    return scale, add_, double_2d


def test_mutation_is_derived_from_the_kernel(torch, ops):
    scale, add_, double_2d = ops
    schema = str(add_._schema)
    assert "!) x" in schema and "!) y" not in schema, schema
    assert "!" not in str(scale._schema)
    # The operator is PyTorch's own OpOverload, with nothing in Python before the CUDA kernel.
    assert scale is torch.ops.tile_test.scale.default
    assert torch._C._dispatch_has_kernel_for_dispatch_key(scale.name(), "CUDA")
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(scale.name(), "Autograd")


def test_eager_results(torch, ops):
    scale, add_, double_2d = ops
    x = torch.randn(10_000, device="cuda")
    y = torch.randn(10_000, device="cuda")
    assert torch.equal(scale(x, 3.0), 3.0 * x)
    x0 = x.clone()
    add_(x, y)
    assert torch.equal(x, x0 + y)
    a = torch.randn(64, 48, device="cuda").t()  # non-contiguous
    assert torch.equal(double_2d(a), 2.0 * a)


def test_opcheck(torch, ops):
    scale, add_, double_2d = ops
    x = torch.randn(4096, device="cuda")
    torch.library.opcheck(scale, (x, 1.5))
    torch.library.opcheck(add_, (x.clone(), torch.randn(4096, device="cuda")))
    torch.library.opcheck(double_2d, (torch.randn(32, 16, device="cuda").t(),))


def _inductor_works(torch):
    try:
        torch.compile(lambda a: a + 1, backend="inductor")(torch.ones(4, device="cuda"))
        return None
    except Exception as e:  # noqa: BLE001 - any failure means inductor cannot run here
        return f"{type(e).__name__}: {str(e)[:200]}"


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(torch, ops, backend):
    if backend == "inductor" and (why := _inductor_works(torch)):
        pytest.skip(f"inductor cannot compile on this machine: {why}")
    scale, add_, double_2d = ops

    def f(x, y, m):
        z = scale(x, 2.0) + 1.0
        w = z.clone()
        add_(w, y)
        return w * 0.5, double_2d(m)

    torch._dynamo.reset()
    x = torch.randn(8192, device="cuda")
    y = torch.randn(8192, device="cuda")
    m = torch.randn(40, 24, device="cuda").t()
    expected = f(x, y, m)
    got = torch.compile(f, backend=backend, fullgraph=True)(x, y, m)
    torch.cuda.synchronize()
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


def test_reduce_overhead_replays_and_releases_after_the_graph_is_freed(torch, ops):
    if why := _inductor_works(torch):
        pytest.skip(f"inductor cannot compile on this machine: {why}")
    scale, add_, _ = ops

    def f(x, y):
        z = scale(x, 3.0)
        add_(z, y)
        return z

    import tile_py.torch as tt

    torch._dynamo.reset()
    gc.collect()
    torch.cuda.synchronize()
    tile_py.synchronize()
    start = _testing.debug_counters()
    captures_before = tt._region_calls["capture"]
    errors_before = tile_py.stats()["errors"]
    g = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    n = 1 << 16
    static_x = torch.randn(n, device="cuda")
    static_y = torch.randn(n, device="cuda")
    for i in range(20):
        fresh_x = torch.randn(n, device="cuda")
        fresh_y = torch.randn(n, device="cuda")
        static_x.copy_(fresh_x)
        static_y.copy_(fresh_y)
        out = g(static_x, static_y)
        torch.cuda.synchronize()
        assert torch.equal(out, 3.0 * fresh_x + fresh_y), f"replay {i}: wrong results"
        out = out.clone()  # the graph's output memory is overwritten by the next replay

    def held():
        c = _testing.debug_counters()
        return (c["consumed"] - start["consumed"]) - (c["released"] - start["released"])

    tile_py.synchronize()
    captured = tt._region_calls["capture"] - captures_before
    # The captured launches' tensors (aliases of the graph's memory) stay with the graph.
    assert captured > 0 and held() > 0, (captured, held())
    kept = held()
    del g
    torch._dynamo.reset()
    trees = getattr(getattr(torch, "_inductor", None), "cudagraph_trees", None)
    if trees is not None and hasattr(trees, "reset_cudagraph_trees"):
        trees.reset_cudagraph_trees()
    gc.collect()
    torch.cuda.synchronize()
    deadline = time.monotonic() + 10
    while held() and time.monotonic() < deadline:
        time.sleep(0.02)
        tile_py.synchronize()
    assert held() == 0, held()
    # Polls made while the graph was captured recorded nothing and reported no error.
    assert tile_py.stats()["errors"] == errors_before
    print(f"reduce-overhead: 20 replays right; {kept} captured tensor alias(es) held by the graph, all released after it was freed")
