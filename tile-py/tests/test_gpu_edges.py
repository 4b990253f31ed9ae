"""GPU tests of protocol edges (bad-input table rows 20 to 24 and 27 of the reliability plan),
with real producers: the per-thread default stream ordered after torch's pending work on both
paths, lazy conjugate / negative torch views, autograd, JAX arrays bound to outputs, dense
row-major pointer parameters, and host memory labelled as device memory.

Every refusal asserts the exception type, the argument index in the message, the deleter count
(or the capsule's name) and that nothing was launched; the check costs are printed (run with
``-s`` to see them)."""

import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with torch

import pytest

import tile_py
from tile_py import _testing
from gpu_support import BLOCK, Counts, grid_for, settle
from tile_py import In, Out, Scalar
from producers import ViaDlpack
from dlpack_ctypes import Producer, capsule_name, kDLCUDA, make_capsule

pytestmark = pytest.mark.gpu

SOURCE = r"""
typedef unsigned long long u64;
typedef long long i64;

extern "C" __global__ void copy_f32(const float* x, float* y, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

extern "C" __global__ void copy_c64(const float2* x, float2* y, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}

extern "C" __global__ void fill_f32(float* y, float v, u64 n) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < n) y[i] = v;
}

extern "C" __global__ void copy2d_f32(const float* x, i64 sx0, i64 sx1, float* y, u64 rows,
                                      u64 cols) {
    u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x;
    if (i < rows * cols) {
        i64 r = i / cols, c = i % cols;
        y[i] = x[r * sx0 + c * sx1];
    }
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    return torch


@pytest.fixture(scope="module")
def lib(torch):
    torch.zeros(1, device="cuda")  # make sure the primary context exists
    return tile_py.Library.from_cuda_source(SOURCE)


@pytest.fixture(scope="module")
def NoExchange(torch):
    """A torch.Tensor subclass without the C exchange API: its tensors go through torch's own
    ``__dlpack__`` (the Python handshake) while tile_py still sees a torch tensor."""

    class NoExchange(torch.Tensor):
        __dlpack_c_exchange_api__ = None

    return NoExchange


def copy_f32(lib, strided=False):
    return lib.kernel("copy_f32", [In("float32", strided=strided), Out("float32"), Scalar("u64")])


# ---- row 20: the per-thread default stream ---------------------------------------------------


@pytest.mark.parametrize("path", ["exchange_api", "dlpack"])
def test_row20_per_thread_default_stream_is_ordered_after_the_producer(torch, lib, path):
    n = 1 << 22
    wrap = (lambda t: t) if path == "exchange_api" else ViaDlpack
    src = torch.randn(n, device="cuda")
    x = torch.full((n,), -7.0, device="cuda")
    y = torch.full((n,), -9.0, device="cuda")
    k = copy_f32(lib)
    side = torch.cuda.Stream()
    settle(torch)
    c = Counts()
    with torch.cuda.stream(side):
        # The producer's pending work: x is written on its current stream after a long sleep.
        torch.cuda._sleep(100_000_000)
        x.copy_(src)
        # stream=2 is refused by torch's __dlpack__; the launch must still work and wait.
        h = tile_py.launch(2, grid_for(n), k, (wrap(x), wrap(y), n), block=BLOCK)
    h.wait()
    assert torch.equal(y, src), "the launch on the per-thread default stream ran before the producer's write"
    settle(torch)
    assert c["launches_issued"] == 1
    assert c["consumed"] == 2 and c["released"] == 2


# ---- row 21: lazy conjugate / negative torch views -------------------------------------------


def test_row21_conjugate_and_negative_views_refused_on_every_path(torch, lib, NoExchange):
    n = 4096
    x = torch.randn(n, dtype=torch.complex64, device="cuda")
    conj = x.conj()
    neg = x.conj().imag
    assert conj.is_conj() and neg.is_neg()
    out_c = torch.zeros(n, dtype=torch.complex64, device="cuda")
    out_f = torch.zeros(n, device="cuda")
    kc = lib.kernel("copy_c64", [In("complex64"), Out("complex64"), Scalar("u64")])
    kf = copy_f32(lib)
    c = Counts()
    for t, k, out, what in [(conj, kc, out_c, "conjugate bit"), (neg, kf, out_f, "negative bit")]:
        sub = t.as_subclass(NoExchange)
        assert sub.is_conj() == t.is_conj() and sub.is_neg() == t.is_neg()
        for obj in (t, sub):  # the C exchange API, then torch's __dlpack__
            with pytest.raises(ValueError, match=rf"(?s)argument 0: .*has its {what} set"):
                tile_py.launch(torch.cuda.current_stream(), grid_for(n), k, (obj, out, n), block=BLOCK)
    settle(torch)
    # The exchange API exports before the check (the export's dtype spares the conjugate query
    # for real tensors): a refused export is released at once, counted consumed and released.
    assert c["launches_issued"] == 0 and c["consumed"] == c["released"] == 2
    assert not out_c.any() and not out_f.any()
    # Behind a wrapper only torch's __dlpack__ is seen: never silently wrong either (torch
    # refuses the conjugate bit; the negative bit is either refused or resolved).
    for t, k, out in [(conj, kc, out_c), (neg, kf, out_f)]:
        try:
            tile_py.launch(torch.cuda.current_stream(), grid_for(n), k, (ViaDlpack(t), out, n), block=BLOCK).wait()
        except (BufferError, ValueError, RuntimeError):
            assert not out.any()
        else:
            assert torch.equal(out, t.resolve_conj().resolve_neg())
    # The resolved copies are what to pass.
    tile_py.launch(torch.cuda.current_stream(), grid_for(n), kc, (conj.resolve_conj(), out_c, n), block=BLOCK).wait()
    assert torch.equal(out_c, torch.conj_physical(x))
    settle(torch)


def test_row21_check_cost(torch, lib):
    """Prints the cost of the torch checks (is_conj, is_neg, requires_grad) per tensor."""
    ts = [torch.empty(16, device="cuda") for _ in range(8)]
    rounds = 20_000
    t0 = time.perf_counter()
    for _ in range(rounds):
        for t in ts:
            t.is_conj()
            t.is_neg()
            t.requires_grad
    python_ns = (time.perf_counter() - t0) / (rounds * len(ts)) * 1e9
    params = [Out("float32")] * len(ts)
    s = torch.cuda.current_stream()
    for _ in range(1000):
        _testing.check_args(params, ts, stream=s, consume=False)
    t0 = time.perf_counter()
    for _ in range(rounds // 10):
        _testing.check_args(params, ts, stream=s, consume=False)
    convert_ns = (time.perf_counter() - t0) / (rounds // 10 * len(ts)) * 1e9
    print(
        f"\ntorch checks from Python (upper bound of tile_py's three calls): {python_ns:.0f} ns per tensor; "
        f"whole conversion with the checks (exchange API export + rollback): {convert_ns:.0f} ns per tensor"
    )
    settle(torch)


# ---- row 22: autograd --------------------------------------------------------------------------


def test_row22_tensors_that_require_grad_refused_for_outputs(torch, lib, NoExchange):
    n = 4096
    w = torch.randn(n, device="cuda", requires_grad=True)
    h = w * 1.0  # a non-leaf that sin() saves for backward
    out = h.sin()
    fill = lib.kernel("fill_f32", [Out("float32"), Scalar("f32"), Scalar("u64")])
    c = Counts()
    for t in (w, h, h.as_subclass(NoExchange)):
        assert t.requires_grad
        with pytest.raises(ValueError, match=r"(?s)argument 0: .*requires grad.*detach\(\)"):
            tile_py.launch(torch.cuda.current_stream(), grid_for(n), fill, (t, 5.0, n), block=BLOCK)
    # Behind a wrapper, torch's __dlpack__ refuses it itself.
    with pytest.raises(BufferError):
        tile_py.launch(torch.cuda.current_stream(), grid_for(n), fill, (ViaDlpack(h), 5.0, n), block=BLOCK)
    settle(torch)
    # w and h went through the exchange API, whose exports are made before the check and
    # released when it refuses them.
    assert c["launches_issued"] == 0 and c["consumed"] == c["released"] == 2
    assert h._version == 0 and not (h == 5.0).any()
    out.sum().backward()
    assert torch.allclose(w.grad, torch.cos(w.detach()))
    # Detached on purpose, the write goes ahead.
    d = torch.zeros(n, device="cuda", requires_grad=True)
    tile_py.launch(torch.cuda.current_stream(), grid_for(n), fill, (d.detach(), 5.0, n), block=BLOCK).wait()
    assert (d.detach() == 5.0).all()
    settle(torch)


def test_row22_tensors_that_require_grad_accepted_for_inputs(torch, lib, NoExchange):
    n = 4096
    w = torch.randn(n, device="cuda", requires_grad=True)
    k = copy_f32(lib)
    c = Counts()
    for t in (w, w.as_subclass(NoExchange)):  # the exchange API, then __dlpack__ of detach()
        y = torch.full((n,), -7.0, device="cuda")
        tile_py.launch(torch.cuda.current_stream(), grid_for(n), k, (t, y, n), block=BLOCK).wait()
        assert torch.equal(y, w.detach())
    settle(torch)
    assert c["consumed"] == 4 and c["released"] == 4


# ---- row 23: JAX arrays bound to outputs ---------------------------------------------------


def test_row23_jax_array_refused_for_outputs_and_read_as_inputs(torch, lib):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as e:
        pytest.skip(f"JAX has no GPU backend here: {e}")
    n = 4096
    a = jax.device_put(jnp.zeros(n, dtype=jnp.float32), gpu)
    fill = lib.kernel("fill_f32", [Out("float32"), Scalar("f32"), Scalar("u64")])
    c = Counts()
    with pytest.raises(ValueError, match=r"argument 0: .*JAX array.*immutable.*jax\.ffi\.ffi_call"):
        tile_py.launch(torch.cuda.current_stream(), grid_for(n), fill, (a, 5.0, n), block=BLOCK)
    settle(torch)
    assert c["launches_issued"] == 0 and c["consumed"] == 0
    assert float(jnp.abs(a).max()) == 0.0
    # Reading a JAX array is fine.
    b = jax.device_put(jnp.arange(n, dtype=jnp.float32), gpu)
    y = torch.full((n,), -7.0, device="cuda")
    tile_py.launch(torch.cuda.current_stream(), grid_for(n), copy_f32(lib), (b, y, n), block=BLOCK).wait()
    assert torch.equal(y, torch.arange(n, dtype=torch.float32, device="cuda"))
    settle(torch)


# ---- row 24: dense row-major pointer parameters ------------------------------------------------


def test_row24_transposed_view_needs_a_strided_parameter(torch, lib):
    a = torch.randn(64, 64, device="cuda")
    at = a.t()
    y = torch.full((64, 64), -7.0, device="cuda")
    n = at.numel()
    c = Counts()
    with pytest.raises(ValueError, match=r"argument 0: tensor is not dense row-major \(shape \[64, 64\], strides \[1, 64\]"):
        tile_py.launch(torch.cuda.current_stream(), grid_for(n), copy_f32(lib), (at, y, n), block=BLOCK)
    settle(torch)
    # Both tensors were exported through the exchange API and, refused, released at once.
    assert c["launches_issued"] == 0 and c["consumed"] == c["released"] == 2
    assert (y == -7.0).all()
    # Declared strided and indexed with the strides, the view is read correctly.
    k = lib.kernel(
        "copy2d_f32",
        [In("float32", strided=True), Scalar("i64"), Scalar("i64"), Out("float32"), Scalar("u64"), Scalar("u64")],
    )
    args = (at, at.stride(0), at.stride(1), y, 64, 64)
    tile_py.launch(torch.cuda.current_stream(), grid_for(n), k, args, block=BLOCK).wait()
    assert torch.equal(y, at)
    # A contiguous copy goes through a plain pointer.
    z = torch.full((64, 64), -7.0, device="cuda")
    tile_py.launch(torch.cuda.current_stream(), grid_for(n), copy_f32(lib), (at.contiguous(), z, n), block=BLOCK).wait()
    assert torch.equal(z, at)
    settle(torch)


# ---- row 27: host memory labelled as device memory ---------------------------------------------


class CAI:
    def __init__(self, ptr, n, keep=None):
        self.keep = keep
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "<f4",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


def test_row27_host_memory_labelled_as_device_refused(torch, lib):
    np = pytest.importorskip("numpy")
    n = 4096
    host = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    ptr = host.ctypes.data
    y = torch.full((n,), -7.0, device="cuda")
    k = copy_f32(lib)
    s = torch.cuda.current_stream()
    c = Counts()
    message = rf"argument 0: .*does not know its data pointer {ptr:#x} as device, managed or page-locked host memory"
    # A CAI v3 dict with a NumPy address.
    with pytest.raises(ValueError, match=message):
        tile_py.launch(s, grid_for(n), k, (CAI(ptr, n, keep=host), y, n), block=BLOCK)
    # A caller's capsule saying (kDLCUDA, 0): refused, and it keeps its name.
    cap, counter = make_capsule(shape=(n,), data=ptr, device=(kDLCUDA, 0))
    with pytest.raises(ValueError, match=message):
        tile_py.launch(s, grid_for(n), k, (cap, y, n), block=BLOCK)
    assert capsule_name(cap) == "dltensor_versioned" and counter.calls == 0
    # A __dlpack__ producer exporting it: its export is released exactly once.
    p = Producer(shape=(n,), data=ptr, device=(kDLCUDA, 0))
    with pytest.raises(ValueError, match=message):
        tile_py.launch(s, grid_for(n), k, (p, y, n), block=BLOCK)
    import gc

    gc.collect()
    assert len(p.calls) == 1 and p.deleted == 1
    settle(torch)
    assert c["launches_issued"] == 0
    # Exchange-API exports of `y` (and the CAI descriptor) were released at once: nothing pends.
    assert c["consumed"] == c["released"]
    assert (y == -7.0).all()
    # The context is not poisoned, and device memory through the same foreign paths is
    # accepted (the driver knows it).
    x = torch.from_numpy(host).cuda()
    tile_py.launch(s, grid_for(n), k, (CAI(x.data_ptr(), n, keep=x), y, n), block=BLOCK).wait()
    assert torch.equal(y, x)
    z = torch.full((n,), -7.0, device="cuda")
    tile_py.launch(s, grid_for(n), k, (ViaDlpack(x), z, n), block=BLOCK).wait()
    assert torch.equal(z, x)
    settle(torch)


# ---- row 13: grid and block limits, checked once by the launch ---------------------------------


@pytest.mark.parametrize(
    "grid, block, pattern",
    [
        ((0,), 256, r"grid.x is 0; it must be at least 1"),
        ((1, 65536), 256, r"grid.y is 65536, limit 65535"),
        ((1, 1, 0), 256, r"grid.z is 0; it must be at least 1"),
        (1, (1025,), r"block.x is 1025, limit 1024"),
        (1, (32, 32, 2), r"block size \(x\*y\*z\) is 2048, limit 1024"),
        (1, (1, 1, 65), r"block.z is 65, limit 64"),
        (2**31, 256, r"grid.x is 2147483648, limit 2147483647"),
    ],
)
def test_row13_limits_are_checked_once_by_the_launch(torch, lib, grid, block, pattern):
    """tile_py converts the grid and block; tile-launch checks their limits, once, before
    anything is consumed: the error names the value and the limit, and every argument is handed
    back (the capsule keeps its name, its deleter has not run, and it launches afterwards)."""
    x = torch.arange(256, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    cap = x.__dlpack__(stream=s.cuda_stream)
    k = copy_f32(lib)
    name = capsule_name(cap)
    with pytest.raises(ValueError, match=r"invalid launch configuration: " + pattern):
        tile_py.launch(s, grid, k, (cap, y, 256), block=block)
    assert capsule_name(cap) == name  # handed back unconsumed
    tile_py.launch(s, 1, k, (cap, y, 256), block=256).wait()
    assert torch.equal(x, y)
    assert capsule_name(cap) == "used_" + name
    # The same limits for a prepared launch, checked once by Kernel.bind.
    with pytest.raises(ValueError, match=r"invalid launch configuration: " + pattern):
        k.bind(s, grid, block=block)
