"""GPU tests of the promises around the launch (issue 24): a first launch that waits for nothing,
release without a later call, deleters that run with the stream's context current and the
capture mode relaxed, and `stats()` / `synchronize()` that never raise for one stream's
trouble."""

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import tile_py
from tile_py import _testing
import dlpack_ctypes
from tile_py import In, Out, Scalar

pytestmark = pytest.mark.gpu

HERE = os.path.dirname(__file__)
BLOCK = 256
SOURCE = r"""
extern "C" __global__ void scale_f32(const float* x, float* y, float a, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
extern "C" __global__ void fault(float* p) { asm volatile("trap;"); }
"""
SCALE = [In("float32"), Out("float32"), Scalar("f32"), Scalar("u64")]


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    torch.zeros(1, device="cuda")
    return torch


@pytest.fixture(scope="module")
def scale(torch):
    return tile_py.Library.from_cuda_source(SOURCE).kernel("scale_f32", SCALE)


@pytest.fixture(scope="module")
def cuda(torch):
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    lib.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    lib.cuThreadExchangeStreamCaptureMode.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    lib.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    lib.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
    lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    lib.cuStreamBeginCapture_v2.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.cuStreamEndCapture.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    lib.cuMemsetD32Async.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t, ctypes.c_void_p]
    lib.cuGraphInstantiateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_ulonglong]
    lib.cuGraphLaunch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cuGraphExecDestroy.argtypes = [ctypes.c_void_p]
    lib.cuGraphDestroy.argtypes = [ctypes.c_void_p]
    return lib


def grid(n):
    return (n + BLOCK - 1) // BLOCK


# `torch.cuda._sleep` cycles per second, about (the H200 runs at up to 1.98 GHz).
CYCLES_PER_S = 2_000_000_000


def run_child(code, timeout=120):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


# ---- class 1: the first launch waits for nothing ----


def test_first_launch_of_a_kernel_built_at_import_does_not_wait_for_queued_work():
    """Kernels compiled and looked up before the process has a context (at import), torch makes
    the context later, and the first launch goes onto a stream busy with a 1.5 s kernel: the
    launch call must return at once (it used to take about 0.75 s)."""
    r = run_child(
        f"""
        import time, tile_py
        from tile_py import _testing
        from tile_py import In, Out, Scalar
        # At import: no CUDA context yet.
        scale = tile_py.Library.from_cuda_source({SOURCE!r}).kernel("scale_f32", {SCALE!r})
        import torch
        n = 1 << 20
        x = torch.randn(n, device="cuda")
        y = torch.full((n,), float("nan"), device="cuda")
        s = torch.cuda.current_stream()
        torch.cuda.synchronize()
        torch.cuda._sleep(int(1.5 * {CYCLES_PER_S}))
        t = time.perf_counter()
        h = tile_py.launch(s, (n + 255) // 256, scale, (x, y, 2.0, n), block=256)
        took = time.perf_counter() - t
        busy = not s.query()
        h.wait()
        ok = torch.equal(y, 2.0 * x)
        print("RESULT", took, busy, ok, flush=True)
        """
    )
    print(r.stdout, r.stderr[-2000:])
    assert r.returncode == 0, r.stderr[-2000:]
    line = [l for l in r.stdout.splitlines() if l.startswith("RESULT")][0].split()
    took, busy, ok = float(line[1]), line[2] == "True", line[3] == "True"
    assert busy, "the stream was not busy when the launch returned: the launch waited for it"
    assert ok, "wrong results"
    assert took < 0.1, f"the first launch took {took * 1000:.1f} ms behind a busy stream"


# ---- class 2: release without a later call ----


def test_memory_only_tile_keeps_alive_is_released_without_a_call(torch, scale):
    """A 1 GiB export that the producer copied for the launch (only tile keeps it alive), on a
    stream busy for 0.3 s: once the work is done, the memory goes back to the allocator within
    the release thread's bound, while the program makes no tile_py call."""
    from gpu_support import Cloner

    n = 1 << 28  # 1 GiB of float32
    x = torch.randn(n, device="cuda")
    y = torch.empty(n, device="cuda")
    s = torch.cuda.current_stream()
    torch.cuda.synchronize()
    tile_py.synchronize()
    base = torch.cuda.memory_allocated()
    period = _testing.release_thread()["period_ms"] / 1000
    torch.cuda._sleep(int(0.3 * CYCLES_PER_S))
    src = Cloner(x)
    tile_py.launch(s, grid(n), scale, (src, y, 2.0, n), block=BLOCK)
    del src
    assert torch.cuda.memory_allocated() >= base + 4 * n, "the copy is not held by the launch"
    t0 = time.monotonic()
    # From here on, no call into tile_py until the memory is back.
    s.synchronize()
    done = time.monotonic()
    while torch.cuda.memory_allocated() >= base + 4 * n and time.monotonic() < done + 3:
        time.sleep(0.002)
    released = time.monotonic()
    held = torch.cuda.memory_allocated() - base
    print(f"work done after {done - t0:.3f} s, copy released {1e3 * (released - done):.1f} ms later")
    assert held < 4 * n, f"{held} bytes still held 3 s after the work finished, with no call"
    assert released - done < period + 0.25, (
        f"released {released - done:.3f} s after the work; the bound is {period} s plus the "
        "wait for the interpreter"
    )
    assert torch.equal(y, 2.0 * x)


# ---- class 4: deleters run with the context current and the capture mode relaxed ----


def _freeing_capsule(cuda, n, seen):
    """A DLPack capsule over `n` float32 of device memory from `cuMemAlloc`, whose deleter
    records the current context and capture mode it ran with, then frees the memory with
    `cuMemFree` (a call that a global-mode capture on any thread forbids)."""
    ptr = ctypes.c_uint64()
    assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), 4 * n) == 0
    key, counter, name = dlpack_ctypes.make_managed(shape=(n,), data=ptr.value)
    m = dlpack_ctypes.DLManagedTensorVersioned.from_address(key)

    def deleter(_p):
        cur = ctypes.c_void_p()
        cuda.cuCtxGetCurrent(ctypes.byref(cur))
        mode = ctypes.c_int(2)  # CU_STREAM_CAPTURE_MODE_RELAXED
        cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
        seen["mode"] = mode.value
        cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
        seen["context"] = cur.value
        seen["free"] = cuda.cuMemFree_v2(ptr.value)
        seen["thread"] = threading.get_ident()
        counter.calls += 1

    cb = dlpack_ctypes.DELETER(deleter)
    m.deleter = cb
    with dlpack_ctypes._LOCK:
        dlpack_ctypes._LIVE[key] = dlpack_ctypes._LIVE[key] + (cb,)
    dtor = ctypes.cast(dlpack_ctypes._capsule_destructor, ctypes.c_void_p)
    cap = dlpack_ctypes._api.PyCapsule_New(key, b"dltensor_versioned", dtor)
    return cap, counter


def test_a_deleter_that_frees_memory_leaves_another_threads_global_capture_valid(torch, scale, cuda):
    """Thread B captures a graph in global mode (driver calls, so that nothing synchronises the
    device first); meanwhile the release of a launch that finished during the capture runs a
    Python producer's deleter that frees device memory (`cuMemFree`). The deleter runs with the
    stream's context current and the capture mode relaxed, so the free succeeds and B's capture
    stays valid: it ends, and its graph replays."""
    n = 1 << 20
    seen = {}
    cap, counter = _freeing_capsule(cuda, n, seen)
    y = torch.empty(n, device="cuda")
    buf = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    ctx = ctypes.c_void_p()
    assert cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value
    started, finish = threading.Event(), threading.Event()
    outcome = {}

    def capture():
        v = ctypes.c_void_p
        assert cuda.cuCtxSetCurrent(ctx) == 0
        hs, graph, exec_ = v(), v(), v()
        assert cuda.cuStreamCreate(ctypes.byref(hs), 1) == 0
        assert cuda.cuStreamBeginCapture_v2(hs, 0) == 0  # CU_STREAM_CAPTURE_MODE_GLOBAL
        outcome["memset"] = cuda.cuMemsetD32Async(
            ctypes.c_uint64(buf.data_ptr()), ctypes.c_uint(7), ctypes.c_size_t(buf.numel()), hs
        )
        started.set()
        finish.wait(20)
        outcome["end"] = cuda.cuStreamEndCapture(hs, ctypes.byref(graph))
        if outcome["end"] == 0:
            outcome["instantiate"] = cuda.cuGraphInstantiateWithFlags(
                ctypes.byref(exec_), graph, ctypes.c_ulonglong(0)
            )
            outcome["launch"] = cuda.cuGraphLaunch(exec_, hs)
            outcome["sync"] = cuda.cuStreamSynchronize(hs)
            cuda.cuGraphExecDestroy(exec_)
            cuda.cuGraphDestroy(graph)
        cuda.cuStreamDestroy_v2(hs)

    with torch.cuda.stream(s):
        torch.cuda._sleep(int(0.3 * CYCLES_PER_S))  # the work finishes during the capture
    tile_py.launch(s, grid(n), scale, (cap, y, 2.0, n), block=BLOCK)
    del cap
    t = threading.Thread(target=capture)
    t.start()
    assert started.wait(10)
    assert counter.calls == 0, "released before the capture began: the test shows nothing"
    # The deleter runs once the work is done: from the release thread, or here (stats() polls
    # and drains). No other driver call is made on this thread meanwhile.
    deadline = time.monotonic() + 5
    while counter.calls == 0 and time.monotonic() < deadline:
        tile_py.stats()
        time.sleep(0.01)
    during = not finish.is_set()
    finish.set()
    t.join(30)
    assert counter.calls == 1, counter
    assert during, "the deleter did not run during the capture"
    assert seen["free"] == 0, f"cuMemFree in the deleter returned {seen['free']}"
    assert seen["context"] == ctx.value, "the deleter ran without the stream's context current"
    assert seen["mode"] == 2, f"the deleter ran in capture mode {seen['mode']}, not relaxed (2)"
    assert outcome.get("memset") == 0, outcome
    assert outcome.get("end") == 0, f"the capture was invalidated: {outcome}"
    assert (outcome.get("instantiate"), outcome.get("launch"), outcome.get("sync")) == (0, 0, 0), outcome
    assert bool(torch.all(buf == 7)), "the graph did not replay the captured memset"


# ---- class 5: stats() and synchronize() never raise for one stream's trouble ----


def test_int_handle_stream_destroyed_after_its_work_without_a_wait(torch, scale, cuda):
    """cuTile's `test_cupy_pass_stream_ptr` shape: launches on a stream passed as an int
    handle, not waited for through tile_py; the owner synchronises the stream and destroys it.
    stats() and synchronize() must not raise, must not count an error on every call, and must
    release the launches' tensors (from the markers recorded at each launch); the next launch on
    a new stream works."""
    n = 1 << 20
    torch.cuda.synchronize()
    tile_py.synchronize()  # nothing of earlier tests left to release during this one
    start = tile_py.stats()
    before = _testing.debug_counters()
    h = ctypes.c_void_p()
    assert cuda.cuStreamCreate(ctypes.byref(h), 1) == 0  # CU_STREAM_NON_BLOCKING
    x = torch.randn(n, device="cuda")
    ys = [torch.full((n,), float("nan"), device="cuda") for _ in range(3)]
    torch.cuda.synchronize()
    for y in ys:
        tile_py.launch(h.value, grid(n), scale, (x, y, 3.0, n), block=BLOCK)  # handle dropped
    assert cuda.cuStreamSynchronize(h) == 0
    assert cuda.cuStreamDestroy_v2(h) == 0
    for _ in range(5):
        st = tile_py.stats()  # raised CUDA_ERROR_CONTEXT_IS_DESTROYED from cuStreamIsCapturing
    tile_py.synchronize()
    st = tile_py.stats()
    assert st["errors"] == start["errors"], (start, st)
    assert st["pending_guards"] == 0 and st["guards_leaked"] == start["guards_leaked"], st
    after = _testing.debug_counters()
    assert after["released"] - before["released"] == after["consumed"] - before["consumed"] == 6
    for y in ys:
        assert torch.equal(y, 3.0 * x)
    # The next launch, on a new stream, works.
    s = torch.cuda.Stream()
    z = torch.empty(n, device="cuda")
    tile_py.launch(s, grid(n), scale, (x, z, 5.0, n), block=BLOCK).wait()
    assert torch.equal(z, 5.0 * x)


def test_stats_and_synchronize_after_a_kernel_fault_do_not_raise_and_leak_counted():
    """A kernel fault poisons the context: synchronize() and stats() do not raise, what the
    stream held is leaked and counted once, and the error count stops growing."""
    r = run_child(
        f"""
        import torch, tile_py
        from tile_py import _testing
        from tile_py import In, Out, Scalar
        lib = tile_py.Library.from_cuda_source({SOURCE!r})
        scale = lib.kernel("scale_f32", {SCALE!r})
        fault = lib.kernel("fault", [Out("f32")])
        n = 1 << 20
        x = torch.randn(n, device="cuda")
        ys = [torch.empty(n, device="cuda") for _ in range(3)]
        s = torch.cuda.Stream()
        for y in ys:
            tile_py.launch(s, (n + 255) // 256, scale, (x, y, 2.0, n), block=256)
        tile_py.launch(s, 1, fault, (torch.empty(1, device="cuda"),), block=1)
        tile_py.synchronize()  # must not raise
        first = tile_py.stats()
        for _ in range(5):
            st = tile_py.stats()
        tile_py.synchronize()
        print("STATS", first["errors"], st["errors"], st["pending_guards"], st["leaked"], flush=True)
        """
    )
    print(r.stdout, r.stderr[-2000:])
    assert "Fatal Python error" not in r.stderr
    assert r.returncode == 0, r.stderr[-2000:]
    first_errors, errors, pending, leaked = map(
        int, [l for l in r.stdout.splitlines() if l.startswith("STATS")][0].split()[1:]
    )
    assert errors == first_errors >= 1, (first_errors, errors)
    assert pending == 0
    assert leaked >= 1


def test_a_primary_context_reset_does_not_make_stats_or_synchronize_raise_and_a_new_stream_works():
    """Another library resets the device (`cuDevicePrimaryCtxReset`, as `cudaDeviceReset` does)
    while tile_py holds launches on it: stats() and synchronize() do not raise, the error is
    counted once, what the destroyed context's stream held is released or leaked (counted), and
    a launch on a new stream, in the recreated context, works. Driver calls only (PyTorch does
    not survive a reset), in a subprocess."""
    r = run_child(
        f"""
        import ctypes, tile_py, dlpack_ctypes
        from tile_py import In, Out, Scalar
        cu = ctypes.CDLL("libcuda.so.1")
        V, U64 = ctypes.c_void_p, ctypes.c_uint64
        cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(V), ctypes.c_int]
        cu.cuCtxSetCurrent.argtypes = [V]
        cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t]
        cu.cuMemsetD32_v2.argtypes = [U64, ctypes.c_uint, ctypes.c_size_t]
        cu.cuMemcpyDtoH_v2.argtypes = [V, U64, ctypes.c_size_t]
        cu.cuStreamCreate.argtypes = [ctypes.POINTER(V), ctypes.c_uint]
        cu.cuStreamSynchronize.argtypes = [V]
        assert cu.cuInit(0) == 0
        n = 1 << 16

        def setup():
            ctx = V()
            assert cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
            assert cu.cuCtxSetCurrent(ctx) == 0
            s = V()
            assert cu.cuStreamCreate(ctypes.byref(s), 1) == 0
            return s.value

        def buffer(value_bits):
            p = U64()
            assert cu.cuMemAlloc_v2(ctypes.byref(p), 4 * n) == 0
            assert cu.cuMemsetD32_v2(p.value, value_bits, n) == 0
            return p.value

        def capsule(ptr):
            key, counter, _ = dlpack_ctypes.make_managed(shape=(n,), data=ptr)
            dtor = ctypes.cast(dlpack_ctypes._capsule_destructor, V)
            return dlpack_ctypes._api.PyCapsule_New(key, b"dltensor_versioned", dtor), counter

        s = setup()
        scale = tile_py.Library.from_cuda_source({SOURCE!r}).kernel("scale_f32", {SCALE!r})
        ONE = 0x3F800000  # 1.0f
        counters = []
        for _ in range(3):
            (x, cx), (y, cy) = capsule(buffer(ONE)), capsule(buffer(0))
            counters += [cx, cy]
            tile_py.launch(s, n // 256, scale, (x, y, 2.0, n), block=256)
        before = tile_py.stats()
        assert cu.cuDevicePrimaryCtxReset_v2(0) == 0
        tile_py.synchronize()  # must not raise
        first = tile_py.stats()
        for _ in range(5):
            st = tile_py.stats()
        tile_py.synchronize()
        calls = [c.calls for c in counters]
        assert all(c in (0, 1) for c in calls), calls
        leaked = st["leaked"] - before["leaked"]
        # Each tensor either released (after its work was confirmed) or leaked, never both.
        assert sum(calls) + leaked == 6, (calls, leaked, st)
        assert st["errors"] == first["errors"], (first, st)
        assert st["pending_guards"] == 0 and st["streams"] == 0, st
        # A new stream in the recreated context works.
        s2 = setup()
        xp, yp = buffer(ONE), buffer(0)
        (x, cx), (y, cy) = capsule(xp), capsule(yp)
        tile_py.launch(s2, n // 256, scale, (x, y, 3.0, n), block=256).wait()
        out = (ctypes.c_float * n)()
        assert cu.cuMemcpyDtoH_v2(out, yp, 4 * n) == 0
        assert all(v == 3.0 for v in out), out[:4]
        assert (cx.calls, cy.calls) == (1, 1)
        print("RESET OK", first["errors"] - before["errors"], leaked, flush=True)
        """
    )
    print(r.stdout, r.stderr[-3000:])
    assert "Fatal Python error" not in r.stderr
    assert r.returncode == 0, r.stderr[-3000:]
    assert "RESET OK" in r.stdout
