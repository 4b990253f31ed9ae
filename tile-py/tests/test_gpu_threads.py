"""GPU tests of the release promise across threads: the per-thread default stream (handle 2)
used by several threads, and handles waited for on a thread that never used CUDA.

The per-thread default stream names a different stream on every thread, so a launch's completion
can be known only from what was recorded on the launching thread at launch time; a thread with
no CUDA context current must still be able to wait, release and poll.
"""

import os
import threading

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, Out, Scalar

pytestmark = pytest.mark.gpu

SHRINK = 16 if os.environ.get("TILE_UNDER_SANITIZER") else 1
BLOCK = 256
SPIN_NS = 500_000_000

SOURCE = r"""
typedef unsigned long long u64;
typedef long long i64;

extern "C" __global__ void copy_f32(const float* x, float* y, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

extern "C" __global__ void spin(u64 ns) {
    u64 start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    return torch


@pytest.fixture(scope="module")
def kernels(torch):
    torch.zeros(1, device="cuda")
    lib = tile_py.Library.from_cuda_source(SOURCE)
    return (
        lib.kernel("copy_f32", [In("float32"), Out("float32"), Scalar("u64")]),
        lib.kernel("spin", [Scalar("u64")]),
    )


def counters():
    return _testing.debug_counters()


def run_in_thread(fn):
    """Runs fn on a new thread (which has no CUDA context current) and returns its result or
    raises its exception."""
    out = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised on the caller's thread
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out.get("value")


def test_per_thread_stream_shared_by_threads_waited_on_a_fresh_thread(torch, kernels):
    copy, spin = kernels
    n = 2**22 // SHRINK
    workers = 3
    sources = [torch.randn(n, device="cuda") for _ in range(workers)]
    outs = [torch.full((n,), -1.0, device="cuda") for _ in range(workers)]
    torch.cuda.synchronize()
    start = counters()
    handles = [None] * workers
    errors = []
    junk = []

    def worker(i):
        try:
            # Hold this thread's per-thread default stream, then copy from a fresh clone whose
            # only owner, once launch returns, is tile (the cuTile scenario).
            tile_py.launch(2, 1, spin, (SPIN_NS,), block=1)
            handles[i] = tile_py.launch(2, (n + BLOCK - 1) // BLOCK, copy, (sources[i].clone(), outs[i], n), block=BLOCK)
            # Would reuse the clone's block if it had been released.
            junk.append(torch.full((n,), -7.0, device="cuda"))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    mid = counters()
    # The clones (and the outputs) of the copies must still be held: the spins run ~500 ms.
    assert mid["released"] == start["released"], "released while the kernels run"
    held = (mid["consumed"] - start["consumed"]) - (mid["released"] - start["released"])
    assert held == 2 * workers, f"{held} tensors held while the kernels run, want {2 * workers}"

    def wait_all():
        for h in handles:
            h.wait()
        return True

    assert run_in_thread(wait_all)
    for src, out in zip(sources, outs):
        assert torch.equal(out, src), "a copy read memory that was released while it ran"
    end = counters()
    assert end["released"] - start["released"] == end["consumed"] - start["consumed"] == 2 * workers
    del junk


def test_legacy_stream_synchronized_on_a_fresh_thread(torch, kernels):
    copy, spin = kernels
    n = 2**22 // SHRINK
    src = torch.randn(n, device="cuda")
    out = torch.full((n,), -1.0, device="cuda")
    torch.cuda.synchronize()
    start = counters()
    tile_py.launch(1, 1, spin, (SPIN_NS,), block=1)
    tile_py.launch(1, (n + BLOCK - 1) // BLOCK, copy, (src.clone(), out, n), block=BLOCK)  # dropped: deferred
    junk = torch.full((n,), -7.0, device="cuda")
    mid = counters()
    assert mid["released"] == start["released"], "released while the kernel runs"
    run_in_thread(tile_py.synchronize)
    assert torch.equal(out, src)
    end = counters()
    assert end["released"] - start["released"] == end["consumed"] - start["consumed"] == 2
    del junk


FIRST_LAUNCH_CHILD = r"""
import time, sys, torch, tile_py
from tile_py import In, Out, Scalar
source = sys.argv[1]
torch.zeros(1, device="cuda")
lib = tile_py.Library.from_cuda_source(source)
copy = lib.kernel("copy_f32", [In("float32"), Out("float32"), Scalar("u64")])
n = 1 << 20
x = torch.randn(n, device="cuda")
y = torch.full((n,), -1.0, device="cuda")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    start = time.perf_counter()
    torch.cuda._sleep(2_000_000_000)  # holds the stream busy for about a second
    # The process's first tile_py launch, onto the busy stream.
    t0 = time.perf_counter()
    h = tile_py.launch(s, (n + 255) // 256, copy, (x, y, n), block=256)
    took = time.perf_counter() - t0
h.wait()
total = time.perf_counter() - start
torch.cuda.synchronize()
assert torch.equal(x, y)
print(f"{took:.6f} {total:.6f}")
"""


def test_first_launch_of_a_process_does_not_wait_for_a_busy_stream(torch):
    """The first launch of a process returns without waiting for work already on its stream."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-c", FIRST_LAUNCH_CHILD, SOURCE],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    took, total = (float(v) for v in r.stdout.split()[-2:])
    print(f"first launch onto a busy stream: returned after {took * 1e3:.2f} ms, done after {total * 1e3:.0f} ms")
    assert total > 0.3, f"the busy kernel ran only {total:.3f} s"
    assert took * 10 < total, f"the first launch took {took:.3f} s of {total:.3f} s"
