"""GPU test of tile_py in a child made by ``os.fork()`` while the parent's launch is still running:
every public call the child makes returns or refuses with the fork ``ValueError``, none raises a
driver error (``synchronize()`` raised ``CudaError: cuCtxGetCurrent failed:
CUDA_ERROR_NOT_INITIALIZED`` before), the tensors the parent's stream held are counted as leaked
in the child, and the parent's launch finishes and releases them as usual."""

import os

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, Out, Scalar

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")]

SOURCE = r"""
extern "C" __global__ void spin_copy(const float* x, float* y, long long cycles, unsigned long long n) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


def test_public_calls_in_a_child_forked_while_a_launch_runs():
    import torch

    assert torch.cuda.is_available()
    lib = tile_py.Library.from_cuda_source(SOURCE)
    k = lib.kernel("spin_copy", [In("float32"), Out("float32"), Scalar("i64"), Scalar("u64")])
    n = 1 << 12
    x = torch.randn(n, device="cuda")
    y = torch.full((n,), float("nan"), device="cuda")
    stream = torch.cuda.current_stream()
    tile_py.synchronize()
    before = _testing.debug_counters()
    # About a second of spinning at the H200's clock: the launch is pending at the fork.
    h = tile_py.launch(stream, (n + 255) // 256, k, (x, y, 2_000_000_000, n), block=256)
    assert tile_py.stats()["pending_guards"] >= 2
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no CUDA, no pytest machinery; reports through the pipe
        os.close(r)
        failures = []

        def refused(what, fn, *a, **kw):
            try:
                fn(*a, **kw)
            except ValueError as e:
                if "os.fork" not in str(e):
                    failures.append(f"{what}: {e}")
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                failures.append(f"{what}: {type(e).__name__}: {e}")
            else:
                failures.append(f"{what}: returned")

        def returns(what, fn, *a):
            try:
                return fn(*a)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                failures.append(f"{what}: {type(e).__name__}: {e}")

        returns("synchronize", tile_py.synchronize)
        st = returns("stats", tile_py.stats) or {}
        if st.get("streams") != 0 or st.get("pending_guards") != 0:
            failures.append(f"stats: {st}")
        c = returns("_debug_counters", _testing.debug_counters) or {}
        if c.get("leaked_at_exit", 0) - before["leaked_at_exit"] < 2:
            failures.append(f"the parent's pending tensors are not counted leaked: {c}")
        returns("LaunchHandle.wait", h.wait)
        if returns("LaunchHandle.done", h.done) is not True:
            failures.append("LaunchHandle.done is not True")
        refused("launch", tile_py.launch, stream, 1, k, (x, y, 0, n), block=256)
        refused("Kernel.bind", k.bind, stream, 1, block=256)
        refused("compute_capability", tile_py.compute_capability, stream)
        refused("Library.from_cuda_source", tile_py.Library.from_cuda_source, SOURCE)
        refused("Library.kernel", lib.kernel, "spin_copy", [In("float32"), Out("float32"), Scalar("i64"), Scalar("u64")])
        returns("_shutdown", _testing.shutdown)
        os.write(w, ("\n".join(failures) or "ok").encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert report == "ok", report
    # The parent: its launch finishes and releases as usual.
    h.wait()
    assert torch.equal(y, x)
    after = _testing.debug_counters()
    assert after["released"] - before["released"] == after["consumed"] - before["consumed"] == 2
    assert after["leaked_at_exit"] == before["leaked_at_exit"]
