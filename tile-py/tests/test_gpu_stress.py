"""GPU stress and fault tests of tile_py (from the GPU bundle, TILE_REQUIRE_GPU=1).

- Many launches across several streams and threads, with PyTorch tensors (C exchange API),
  CuPy arrays and a plain __dlpack__ producer: every consumed tensor released exactly once,
  the release queues bounded, no Python reference leaked.
- A kernel fault that poisons the context, in a subprocess: the error names the CUDA error, the
  pending tensors are leaked and counted, never released, and the process exits cleanly.
"""

import os
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, Out, Scalar
from producers import ViaDlpack

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""

LAUNCHES = int(os.environ.get("TILE_STRESS_LAUNCHES", "1000000"))


def test_stress_threads_streams_producers():
    import torch

    try:
        import cupy
    except ImportError:  # pragma: no cover - CuPy is on the GPU machine
        cupy = None
    n = 4096
    lib = tile_py.Library.from_cuda_source(SOURCE)
    k = lib.kernel("add", [In("f32"), In("f32"), Out("f32"), Scalar("u64")])
    threads = 4
    per_thread = LAUNCHES // threads
    tile_py.synchronize()
    start = _testing.debug_counters()
    errors = []
    max_pending = [0]
    refs = {}

    def work(tid):
        try:
            stream = torch.cuda.Stream()
            a = torch.randn(n, device="cuda")
            b = torch.randn(n, device="cuda")
            c = torch.empty(n, device="cuda")
            pa = ViaDlpack(a)
            if cupy is not None:
                with cupy.cuda.Device(torch.cuda.current_device()):
                    ca = cupy.from_dlpack(a)
            refs[tid] = [weakref.ref(x) for x in (a, b, c, pa)]
            grid = (n + 255) // 256
            with torch.cuda.stream(stream):
                for i in range(per_thread):
                    if i % 100 == 1:
                        x = pa  # Python __dlpack__ path
                    elif cupy is not None and i % 10 == 2:
                        x = ca  # CuPy
                    else:
                        x = a  # C exchange API
                    tile_py.launch(stream, grid, k, (x, b, c, n), block=256)
                    if i % 5000 == 0:
                        st = tile_py.stats()
                        max_pending[0] = max(max_pending[0], st["pending_guards"])
                stream.synchronize()
            torch.testing.assert_close(c, a + b)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    tile_py.synchronize()
    end = _testing.debug_counters()
    consumed = end["consumed"] - start["consumed"]
    released = end["released"] - start["released"]
    launches = threads * per_thread
    print(
        f"stress: {launches} launches on {threads} threads/streams; consumed {consumed}, "
        f"released {released}, max pending guards {max_pending[0]}, leaked {tile_py.stats()['leaked']}"
    )
    assert consumed == 3 * launches
    assert released == consumed, "every consumed tensor released exactly once"
    assert max_pending[0] <= 65_536 * threads, "release queues stay bounded"
    # No Python reference is kept once every launch is released: each thread's tensors and
    # producer objects die with the thread.
    import gc

    del ts
    gc.collect()
    for tid, wrs in refs.items():
        alive = [i for i, w in enumerate(wrs) if w() is not None]
        assert not alive, f"thread {tid}: objects {alive} (a, b, c, plain) still referenced"


def child_script(body, extra_source=""):
    """A Python program for a subprocess: imports, the `add` kernel of SOURCE (plus
    `extra_source`) loaded as `lib` and `add`, then `body`."""
    return (
        "import sys, torch, tile_py\n"
        "from tile_py import In, Out, Scalar\n"
        f"lib = tile_py.Library.from_cuda_source({SOURCE + extra_source!r})\n"
        'add = lib.kernel("add", [In("f32"), In("f32"), Out("f32"), Scalar("u64")])\n'
        + textwrap.dedent(body)
    )


FAULT_SCRIPT = child_script(
    r"""
    fault = lib.kernel("fault", [Out("f32")])
    n = 1 << 20
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    s = torch.cuda.current_stream()
    for _ in range(3):
        tile_py.launch(s, n // 256, add, (a, b, c, n), block=256)  # deferred
    h = tile_py.launch(s, 1, fault, (torch.empty(1, device="cuda"),), block=1)
    try:
        h.wait()
        print("NO ERROR")
    except tile_py.CudaError as e:
        print("ERROR", e.name, file=sys.stdout)
    st = tile_py.stats()
    print("STATS", st["released"], st["leaked"])
    sys.stdout.flush()
    """,
    extra_source='extern "C" __global__ void fault(float* p) { asm volatile("trap;"); }\n',
)


def test_kernel_fault_poisons_the_context_in_a_subprocess():
    r = subprocess.run(
        [sys.executable, "-c", FAULT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    out = r.stdout
    print(out, r.stderr[-2000:])
    assert "Fatal Python error" not in r.stderr
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    errs = [l for l in out.splitlines() if l.startswith("ERROR ")]
    assert errs and "CUDA_ERROR" in errs[0], out
    released, leaked = map(int, [l for l in out.splitlines() if l.startswith("STATS")][0].split()[1:])
    # The faulting launch's tensor (and any launch whose completion was not confirmed) is leaked
    # and counted, never released; nothing is released twice.
    assert leaked >= 1, out


EXIT_SCRIPT = child_script(
    r"""
    n = 1 << 20
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(sys.argv[1]))  # the launches below stay pending for a while
        for _ in range(10):
            tile_py.launch(s, n // 256, add, tuple(torch.randn(n, device="cuda") for _ in range(3)) + (n,), block=256)
    print("LAUNCHED", tile_py.stats()["pending_guards"] + tile_py.stats()["held_guards"], flush=True)
    if sys.argv[2] == "exception":
        raise RuntimeError("uncaught, with launches pending")
    """
)


@pytest.mark.parametrize("how", ["normal", "exception"])
@pytest.mark.parametrize("cycles", [1_000_000, 20_000_000_000])
def test_interpreter_exit_with_launches_pending(how, cycles):
    # ~0.5 ms of sleep (drained at exit) and ~10 s (longer than the exit hook waits: leaked).
    r = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT, str(cycles), how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(r.stdout, r.stderr[-3000:])
    assert "LAUNCHED" in r.stdout
    assert "Fatal Python error" not in r.stderr and "Segmentation" not in r.stderr
    assert r.returncode == (0 if how == "normal" else 1), r.returncode
    leak_lines = [l for l in r.stderr.splitlines() if "leak" in l.lower()]
    assert len(leak_lines) <= 1, leak_lines
