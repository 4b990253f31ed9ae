"""GPU tests of array parameters with a CUDA C++ kernel (NVRTC): a tensor passed as pointer,
extents and strides in elements, in the declared index type, for every layout (dense,
transposed, sliced with an offset, broadcast, reversed); the declaration checked against the
kernel's parameter sizes (cuKernelGetParamInfo); refusals consume nothing."""

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, Out

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void copy2d(const float* x, int xn0, int xn1, int xs0, int xs1,
                                  float* y, long long yn0, long long yn1, long long ys0,
                                  long long ys1) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < (long long)xn0 * xn1 && xn0 == yn0 && xn1 == yn1) {
        long long r = i / xn1, c = i % xn1;
        y[r * ys0 + c * ys1] = x[r * (long long)xs0 + c * (long long)xs1];
    }
}
"""

BLOCK = 256


@pytest.fixture(scope="module")
def torch():
    import torch

    assert torch.cuda.is_available()
    return torch


@pytest.fixture(scope="module")
def copy2d(torch):
    torch.zeros(1, device="cuda")
    lib = tile_py.Library.from_cuda_source(SOURCE)
    return lib, lib.kernel(
        "copy2d", [In("float32", ndim=2, index="i32"), Out("float32", ndim=2, index="i64")]
    )


def run(torch, kernel, x, y):
    n = y.numel()
    tile_py.launch(torch.cuda.current_stream(), max(1, (n + BLOCK - 1) // BLOCK), kernel, (x, y),
                   block=BLOCK).wait()


@pytest.mark.parametrize("layout", ["dense", "transposed", "offset slice", "broadcast", "step"])
def test_every_torch_layout_is_read_through_its_strides(torch, copy2d, layout):
    base = torch.randn(96, 80, device="cuda")
    x = {
        "dense": base,
        "transposed": base.t(),
        "offset slice": base[7:61, 3:77],
        "broadcast": base[5].expand(33, 80),  # stride 0 in dimension 0
        "step": base[::3, 1::2],
    }[layout]
    # The output is written through its strides too: a transposed destination.
    y_t = torch.full((x.shape[1], x.shape[0]), float("nan"), device="cuda")
    y = y_t.t()
    run(torch, copy2d[1], x, y)
    assert torch.equal(y, x), f"{layout}: {(y != x).sum().item()} wrong elements"


class CaiOnly:
    """Only ``__cuda_array_interface__`` of an array (the producer's DLPack export not used)."""

    def __init__(self, a):
        self.a = a
        self.__cuda_array_interface__ = a.__cuda_array_interface__


def test_negative_strides_from_cupy(torch, copy2d):
    cp = pytest.importorskip("cupy")
    base = cp.random.standard_normal((40, 24), dtype=cp.float32)
    x = base[::-1, ::-2]  # negative strides; the data pointer is the last row
    y = cp.full(x.shape, cp.nan, dtype=cp.float32)
    n = x.size
    cp.cuda.get_current_stream().synchronize()
    tile_py.launch(cp.cuda.get_current_stream(), (n + BLOCK - 1) // BLOCK, copy2d[1],
                   (CaiOnly(x), y), block=BLOCK).wait()
    assert bool((y == x).all())


def test_declaration_is_checked_against_each_kernel_parameter(torch, copy2d):
    lib, _ = copy2d
    with pytest.raises(
        TypeError,
        match=r"kernel parameter 1 \(extent 0 of parameter 0\) is declared as input array of "
        r"float32 \(ndim 2, index i64\) \(8 bytes\) but the kernel's is 4 bytes",
    ):
        lib.kernel("copy2d", [In("float32", ndim=2, index="i64"), Out("float32", ndim=2, index="i64")])
    with pytest.raises(TypeError, match=r"declares 8 parameters but the kernel takes 10"):
        lib.kernel("copy2d", [In("float32", ndim=2, index="i32"), Out("float32", ndim=1, index="i64")])


def test_wrong_ndim_is_refused_before_consuming(torch, copy2d):
    before = _testing.debug_counters()
    x = torch.randn(64, device="cuda")
    y = torch.full((8, 8), float("nan"), device="cuda")
    with pytest.raises(TypeError, match=r"^argument 0: expected an array of 2 dimensions, got 1$"):
        run(torch, copy2d[1], x, y)
    after = _testing.debug_counters()
    # Nothing launched; the exports made for the call (torch's exchange API) are released once.
    assert after["consumed"] - before["consumed"] == after["released"] - before["released"]
    assert after["launches_issued"] == before["launches_issued"]
    assert torch.isnan(y).all()
