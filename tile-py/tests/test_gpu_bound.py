"""GPU tests of prepared launches (``Kernel.bind`` / ``tile_py.BoundLaunch``) and of launches
that must never wait for the GPU because their tensors are large (H200, from the GPU bundle with
TILE_REQUIRE_GPU=1).

Fresh random inputs, poisoned outputs; every consumed tensor released exactly once, none while
its work is pending.
"""

import time

import pytest

import tile_py
from gpu_support import BLOCK, Cloner, Counts, grid_for, settle
from tile_py import In, Out, Scalar

pytestmark = pytest.mark.gpu

SOURCE = r"""
typedef unsigned long long u64;
extern "C" __global__ void add(const float* a, const float* b, float* c, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
extern "C" __global__ void copy(const float* x, float* y, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    return torch


@pytest.fixture(scope="module")
def lib(torch):
    torch.zeros(1, device="cuda")
    return tile_py.Library.from_cuda_source(SOURCE)


def add_kernel(lib):
    return lib.kernel("add", [In("float32"), In("float32"), Out("float32"), Scalar("u64")])


@pytest.mark.parametrize("current", ["launch_stream", "other_stream"])
def test_bound_launch_results_and_releases(torch, lib, current):
    n = 1 << 20
    s = torch.cuda.Stream()
    other = torch.cuda.Stream()
    bound = add_kernel(lib).bind(s, grid_for(n), block=BLOCK)
    assert isinstance(bound, tile_py.BoundLaunch)
    assert bound.kernel.name == "add"
    settle(torch)
    counts = Counts()
    outs = []
    with torch.cuda.stream(s if current == "launch_stream" else other):
        for i in range(20):
            a = torch.randn(n, device="cuda")
            b = torch.randn(n, device="cuda")
            c = torch.full((n,), float("nan"), device="cuda")
            h = bound(a, b, c, n)
            assert isinstance(h, tile_py.LaunchHandle)
            if i % 2 == 0:
                h.wait()
            del h
            outs.append((a, b, c))
    settle(torch)
    for a, b, c in outs:
        assert torch.equal(c, a + b)
    assert counts["consumed"] == counts["released"] == 60
    assert counts["launches_issued"] == 20


@pytest.mark.parametrize("trial", range(3))
def test_bound_launch_premature_release_made_visible(torch, lib, trial):
    n = 2**26
    src = torch.randn(n, device="cuda")
    out = torch.full((n,), -1.0, device="cuda")
    k = lib.kernel("copy", [In("float32"), Out("float32"), Scalar("u64")])
    s = torch.cuda.Stream()
    bound = k.bind(s, grid_for(n), block=BLOCK)
    settle(torch)
    base_mem = torch.cuda.memory_allocated()
    counts = Counts()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # hold the launch stream busy
    producer = Cloner(src)
    bound(producer, out, n)  # handle dropped at once
    # Had the clone been released, this allocation would get its memory and the kernel would
    # copy -7s.
    junk = torch.full((n,), -7.0, device="cuda")
    assert counts["released"] == 0, "a tensor was released while its work was pending"
    assert not s.query()
    settle(torch)
    assert producer.exports == 1
    assert (out != src).sum().item() == 0, "premature release"
    assert counts["released"] == counts["consumed"] == 2
    del junk
    assert torch.cuda.memory_allocated() == base_mem  # the clone was freed, once


def test_bound_launch_checks_each_call_and_consumes_nothing_on_error(torch, lib):
    n = 4096
    s = torch.cuda.Stream()
    bound = add_kernel(lib).bind(s, grid_for(n), block=BLOCK)
    a = torch.randn(n, device="cuda")
    b64 = torch.randn(n, device="cuda", dtype=torch.float64)
    c = torch.full((n,), -1.0, device="cuda")
    settle(torch)
    counts = Counts()
    with pytest.raises(TypeError, match=r"expects 4 arguments but 3 were given"):
        bound(a, a, c)
    with pytest.raises(TypeError, match=r"argument 1: .*float64"):
        bound(a, b64, c, n)
    with pytest.raises(OverflowError, match=r"argument 3: -1 \(int\) does not fit scalar u64"):
        bound(a, a, c, -1)
    settle(torch)
    # Nothing launched; an export made for a refused call (the exchange API's) is released once.
    assert counts["launches_issued"] == 0
    assert counts["consumed"] == counts["released"], (counts["consumed"], counts["released"])
    assert (c == -1.0).all(), "nothing was launched"
    # The same binding still launches.
    bound(a, a, c, n).wait()
    assert torch.equal(c, a + a)
    assert counts["launches_issued"] == 1
    assert counts["consumed"] == counts["released"], (counts["consumed"], counts["released"])


def test_bind_refuses_a_bad_configuration_at_bind_time(torch, lib):
    k = add_kernel(lib)
    s = torch.cuda.Stream()
    counts = Counts()
    # The limits are tile-launch's, checked once by the bind.
    with pytest.raises(ValueError, match=r"block size \(x\*y\*z\) is 2048, limit 1024"):
        k.bind(s, 1, block=(1024, 2))
    with pytest.raises(ValueError, match=r"grid.x is 0; it must be at least 1"):
        k.bind(s, 0, block=1)
    with pytest.raises(ValueError, match=r"shared"):
        k.bind(s, 1, block=32, shared_mem=1 << 30)
    with pytest.raises(TypeError, match=r"kernel must be a tile_py.Kernel"):
        tile_py.BoundLaunch(s, 1, "add", block=32)
    assert counts["launches_attempted"] == 0


@pytest.mark.parametrize("how", ["launch", "bound"])
def test_large_input_never_makes_a_launch_synchronous(torch, lib, how):
    """A 4 GiB input the caller holds, launched behind a ~0.1 s kernel: the launch returns in
    well under that kernel's GPU time (it never waits because its tensors are large)."""
    n = 1 << 20
    big = torch.ones(1 << 30, device="cuda")  # 4 GiB
    b = torch.randn(n, device="cuda")
    c = torch.full((n,), float("nan"), device="cuda")
    s = torch.cuda.Stream()
    k = add_kernel(lib)
    bound = k.bind(s, grid_for(n), block=BLOCK)
    # Warm-up launches on an idle stream (both paths), so that what is timed is a launch, not
    # the first launch of the process.
    bound(b, b, c, n).wait()
    tile_py.launch(s, grid_for(n), k, (b, b, c, n), block=BLOCK).wait()
    settle(torch)
    counts = Counts()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(s):
        start.record()
        torch.cuda._sleep(200_000_000)
        end.record()
        t0 = time.perf_counter()
        if how == "launch":
            h = tile_py.launch(s, grid_for(n), k, (big, b, c, n), block=BLOCK)
        else:
            h = bound(big, b, c, n)
        del h  # deferred: must not wait either
        launched = time.perf_counter() - t0
    pending = tile_py.stats()["pending_bytes"]
    settle(torch)
    kernel = start.elapsed_time(end) / 1e3
    assert kernel > 0.05, f"the sleep kernel ran only {kernel:.3f} s"
    assert launched < kernel / 10, f"launch took {launched:.4f} s behind a {kernel:.3f} s kernel"
    assert pending == 0, "the caller's tensors are not counted as the queue's bytes"
    assert torch.equal(c, b + 1.0)
    assert counts["launches_issued"] == 1
    assert counts["consumed"] == counts["released"], (counts["consumed"], counts["released"])
