"""GPU tests of launch streams over their lives: streams destroyed or dropped once their work is
released (tile_py keeps neither the stream object nor state it would touch later), a stream
handle reused for a new stream, and PyTorch's device-generic ``torch.Stream`` (what
``torch.accelerator.current_stream()`` returns, and ``torch.cuda.current_stream()`` inside
``torch.compile``)."""

import ctypes
import sys

import pytest

import tile_py
from tile_py import In, InOut, Out, Scalar

pytestmark = pytest.mark.gpu

BLOCK = 256
SOURCE = r"""
extern "C" __global__ void scale_f32(const float* x, float* y, float a, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    torch.zeros(1, device="cuda")
    return torch


@pytest.fixture(scope="module")
def scale(torch):
    lib = tile_py.Library.from_cuda_source(SOURCE)
    return lib.kernel("scale_f32", [In("float32"), Out("float32"), Scalar("f32"), Scalar("u64")])


def grid(n):
    return (n + BLOCK - 1) // BLOCK


def launch_scale(stream, scale, x, y, a=2.0):
    n = x.size if isinstance(x.size, int) else x.numel()  # CuPy or torch
    return tile_py.launch(stream, grid(n), scale, (x, y, a, n), block=BLOCK)


def test_destroyed_stream_handle_is_never_touched_and_a_reused_handle_starts_fresh(torch, scale):
    """A stream made with the driver, launched on by its int handle, waited for and destroyed:
    synchronize() and stats() must not touch it; the next stream (often the same handle value)
    gets fresh state. Three rounds."""
    cuda = ctypes.CDLL("libcuda.so.1")
    n = 1 << 20
    start = tile_py.stats()
    handles = []
    for round_ in range(3):
        h = ctypes.c_void_p()
        assert cuda.cuStreamCreate(ctypes.byref(h), 1) == 0  # CU_STREAM_NON_BLOCKING
        handles.append(h.value)
        x = torch.randn(n, device="cuda")
        y = torch.full((n,), float("nan"), device="cuda")
        torch.cuda.synchronize()
        launch_scale(h.value, scale, x, y, 3.0).wait()
        assert torch.equal(y, 3.0 * x), f"round {round_}: wrong results"
        assert cuda.cuStreamDestroy_v2(h) == 0
        tile_py.synchronize()  # raised CUDA_ERROR_INVALID_CONTEXT from a destroyed stream before
        st = tile_py.stats()
        assert st["pending_guards"] == st["held_guards"] == 0
    st = tile_py.stats()
    assert st["launches"] - start["launches"] == 3
    assert st["errors"] == start["errors"]
    print(f"destroyed streams: handles {[hex(v) for v in handles]}, stats {st}")


def test_dropped_stream_objects_are_not_kept(torch, scale):
    """200 rounds of a new CuPy stream, a launch, a wait and the stream dropped: once the wait
    returns tile_py holds no reference to the stream object, and its stream count does not grow.
    (References are counted with sys.getrefcount: weak references to stream objects are not
    reliable in every library.)"""
    cp = pytest.importorskip("cupy")
    n = 4096
    x = cp.random.standard_normal(n, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    start = tile_py.stats()
    for i in range(200):
        s = cp.cuda.Stream(non_blocking=True)
        refs_before = sys.getrefcount(s)
        y = cp.full(n, cp.nan, dtype=cp.float32)
        h = launch_scale(s, scale, x, y, 2.0)
        assert sys.getrefcount(s) > refs_before, "the stream is not held while its launch is pending"
        h.wait()
        assert sys.getrefcount(s) == refs_before, f"round {i}: tile_py still holds the stream object"
        assert bool(cp.all(y == 2 * x)), f"round {i}: wrong results"
        del s, y, h
    st = tile_py.stats()
    assert st["streams"] <= start["streams"], (start, st)
    assert st["launches"] - start["launches"] == 200
    print(f"200 dropped CuPy streams: stats {st}")


def test_dropped_torch_stream_objects_are_not_kept(torch, scale):
    n = 4096
    x = torch.randn(n, device="cuda")
    torch.cuda.synchronize()
    for i in range(50):
        s = torch.cuda.Stream()
        refs_before = sys.getrefcount(s)
        y = torch.full((n,), float("nan"), device="cuda")
        with torch.cuda.stream(s):
            h = launch_scale(s, scale, x, y)
        h.wait()
        assert sys.getrefcount(s) == refs_before, f"round {i}: tile_py still holds the stream object"
        assert torch.equal(y, 2 * x)
        del s, y, h
    assert tile_py.stats()["streams"] == 0


def test_same_stream_object_is_parsed_once_while_it_has_a_cached_stream(torch, scale):
    s = torch.cuda.Stream()

    class Wrapper:
        asked = 0

        def __cuda_stream__(self):
            Wrapper.asked += 1
            return (0, s.cuda_stream)

    w = Wrapper()
    n = 4096
    x = torch.randn(n, device="cuda")
    ys = [torch.full((n,), float("nan"), device="cuda") for _ in range(5)]
    torch.cuda.synchronize()
    handles = [launch_scale(w, scale, x, y) for y in ys]
    assert Wrapper.asked == 1
    for h in handles:
        h.wait()
    for y in ys:
        assert torch.equal(y, 2 * x)


def test_torch_accelerator_stream_is_accepted(torch, scale):
    acc = getattr(torch, "accelerator", None)
    if acc is None or not hasattr(acc, "current_stream"):
        pytest.skip("this PyTorch has no torch.accelerator.current_stream")
    n = 1 << 20
    x = torch.randn(n, device="cuda")
    y = torch.full((n,), float("nan"), device="cuda")
    s = acc.current_stream()
    assert type(s) is torch.Stream, type(s)
    launch_scale(s, scale, x, y, 4.0).wait()
    assert torch.equal(y, 4.0 * x)
    # Ordered after torch's pending work on that stream: a producer write just before launch.
    x2 = torch.randn(n, device="cuda")
    y2 = torch.full((n,), float("nan"), device="cuda")
    torch.cuda._sleep(50_000_000)
    x2.mul_(-1.0)
    launch_scale(acc.current_stream(), scale, x2, y2, 1.0).wait()
    torch.cuda.synchronize()
    assert torch.equal(y2, x2)


def _compiled_body(scale):
    def f(x):
        y = torch_mod().empty_like(x)
        h = tile_py.launch(torch_mod().cuda.current_stream(), grid(x.numel()), scale, (x * 2.0, y, 0.5, x.numel()), block=BLOCK)
        h.wait()
        return y + 1.0

    return f


def torch_mod():
    import torch

    return torch


def _inductor_works(torch):
    try:
        torch.compile(lambda a: a + 1, backend="inductor")(torch.ones(4, device="cuda"))
        return None
    except Exception as e:  # noqa: BLE001 - any failure means this machine cannot run inductor
        return f"{type(e).__name__}: {str(e)[:200]}"


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_launch_inside_torch_compile_gives_the_eager_result(torch, scale, backend):
    if backend == "inductor":
        why = _inductor_works(torch)
        if why:
            pytest.skip(f"inductor cannot compile on this machine: {why}")
    torch._dynamo.reset()
    f = _compiled_body(scale)
    x = torch.randn(1 << 16, device="cuda")
    expected = f(x)
    got = torch.compile(f, backend=backend)(x)
    torch.cuda.synchronize()
    assert torch.equal(got, expected)
    assert torch.equal(expected, x + 1.0)


def test_fullgraph_fails_with_torchs_own_error(torch, scale):
    torch._dynamo.reset()
    f = _compiled_body(scale)
    x = torch.randn(1024, device="cuda")
    with pytest.raises(Exception) as info:
        torch.compile(f, backend="eager", fullgraph=True)(x)
    e = info.value
    assert type(e).__module__.startswith("torch"), f"{type(e).__module__}.{type(e).__name__}: {e}"
    assert "unsupported stream type" not in str(e)
    print(f"fullgraph=True: {type(e).__module__}.{type(e).__name__}")


ADD3 = r"""
extern "C" __global__ void add3_f32(const float* a, const float* b, float* c,
                                    unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i] + 0.5f * c[i];
}
"""


@pytest.mark.parametrize("same", [False, True], ids=["cupy-current-is-another", "cupy-current-is-launch"])
def test_cupy_pending_writes_on_cupys_current_stream_are_seen(torch, same):
    """CuPy arrays are offered CuPy's current stream (read once per launch) and the launch
    stream waits once for it: writes still pending there, behind a long kernel, are seen by the
    kernel, for every array, whether or not CuPy's current stream is the launch stream."""
    cp = pytest.importorskip("cupy")
    k = tile_py.Library.from_cuda_source(ADD3).kernel(
        "add3_f32", [In("float32"), In("float32"), InOut("float32"), Scalar("u64")]
    )
    n = 1 << 22
    launch = torch.cuda.Stream()
    producer = cp.cuda.ExternalStream(launch.cuda_stream) if same else cp.cuda.Stream(non_blocking=True)
    a, b, c = (cp.ones(n, dtype=cp.float32) for _ in range(3))
    cp.cuda.Device().synchronize()
    with producer:
        # Keep CuPy's current stream busy, then queue the writes behind it.
        with torch.cuda.stream(torch.cuda.ExternalStream(producer.ptr)):
            torch.cuda._sleep(100_000_000)
        a.fill(3.0)
        b.fill(5.0)
        c.fill(8.0)
        h = tile_py.launch(launch, grid(n), k, (a, b, c, n), block=BLOCK)
    h.wait()
    launch.synchronize()
    got = cp.asnumpy(c)
    wrong = int((got != 12.0).sum())
    assert wrong == 0, f"{wrong} of {n} elements missed the producer's pending writes"
    tile_py.synchronize()
