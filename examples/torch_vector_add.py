"""Vector addition on PyTorch tensors with tile_py.

    python examples/torch_vector_add.py

Needs a CUDA GPU, PyTorch and NVRTC (the CUDA toolkit's lib64, or the pip package
nvidia-cuda-nvrtc) on the library path.
"""

import torch

import tile_py

SOURCE = r"""
extern "C" __global__ void vector_add(const float* a, const float* b, float* c,
                                      unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def main():
    lib = tile_py.Library.from_cuda_source(SOURCE)
    add = lib.kernel(
        "vector_add",
        [tile_py.In("float32"), tile_py.In("float32"), tile_py.Out("float32"), tile_py.Scalar("u64")],
    )
    n = 1 << 24
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    c = torch.empty(n, device="cuda")
    stream = torch.cuda.current_stream()

    # The handle owns a, b and c (their DLPack exports) until the kernel has finished.
    handle = tile_py.launch(stream, (n + 255) // 256, add, (a, b, c, n), block=256)
    handle.wait()  # blocks with the GIL released, then runs the three deleters
    assert torch.equal(c, a + b)

    # Fire and forget: a dropped handle goes to the stream's release queue; temporaries such as
    # a * 2 stay alive until the kernel is done, even though Python drops them at once.
    tile_py.launch(stream, (n + 255) // 256, add, (a * 2, b, c, n), block=256)
    tile_py.synchronize()
    assert torch.equal(c, a * 2 + b)
    print("torch_vector_add: ok", tile_py.stats())


if __name__ == "__main__":
    main()
