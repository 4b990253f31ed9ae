"""Two-GPU tests of tile_py (from the GPU bundle on a machine with two GPUs)."""

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, Out, Scalar

pytestmark = pytest.mark.gpu

SOURCE = r"""
extern "C" __global__ void add(const float* a, const float* b, float* c, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


@pytest.fixture(scope="module")
def torch():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs, this machine has {torch.cuda.device_count()}")
    return torch


def test_torch_current_device_differs_from_the_tensors_device(torch):
    n = 1 << 20
    torch.cuda.set_device(0)
    lib = tile_py.Library.from_cuda_source(SOURCE)
    k = lib.kernel("add", [In("f32"), In("f32"), Out("f32"), Scalar("u64")])
    a = torch.randn(n, device="cuda:1")
    b = torch.randn(n, device="cuda:1")
    c = torch.full((n,), -1.0, device="cuda:1")
    s1 = torch.cuda.Stream(device=1)
    assert torch.cuda.current_device() == 0
    tile_py.launch(s1, n // 256, k, (a, b, c, n), block=256).wait()
    assert torch.equal(c, a + b)
    assert torch.cuda.current_device() == 0, "the caller's current device is unchanged"
    # A device-1 tensor with a device-0 stream: refused before anything is consumed.
    before = _testing.debug_counters()
    with pytest.raises(ValueError, match="cuda:1") as e:
        tile_py.launch(torch.cuda.Stream(device=0), n // 256, k, (a, b, c, n), block=256)
    assert "cuda:0" in str(e.value)
    after = _testing.debug_counters()
    assert after["launches_issued"] == before["launches_issued"]
    assert after["consumed"] - before["consumed"] == after["released"] - before["released"]
