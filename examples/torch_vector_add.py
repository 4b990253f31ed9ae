"""Vector addition on PyTorch tensors with tile_py.

    python examples/torch_vector_add.py

Needs a CUDA GPU, PyTorch and NVRTC (the CUDA toolkit's lib64, or the pip package
nvidia-cuda-nvrtc) on the library path. Without PyTorch, tile_py or an NVIDIA driver it prints
one line saying what is missing and exits with status 1.
"""

import sys

try:
    import torch

    import tile_py
except ImportError as e:
    print(
        f"torch_vector_add: {e}; the example needs PyTorch and tile_py "
        "(cargo xtask wheel, then pip install target/wheels/tile_py-*manylinux*.whl)",
        file=sys.stderr,
    )
    sys.exit(1)

SOURCE = r"""
extern "C" __global__ void vector_add(const float* a, const float* b, float* c,
                                      unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def main():
    try:
        lib = tile_py.Library.from_cuda_source(SOURCE)
    except tile_py.CudaError as e:
        if e.name is not None:
            raise
        # No driver call was made: no NVIDIA driver could be loaded.
        print(f"torch_vector_add: {e}", file=sys.stderr)
        sys.exit(1)
    add = lib.kernel(
        "vector_add",
        [tile_py.In("float32"), tile_py.In("float32"), tile_py.Out("float32"), tile_py.Scalar("u64")],
    )
    n = 1 << 24
    a = torch.randn(n, device="cuda")
    b = torch.randn(n, device="cuda")
    c = torch.empty(n, device="cuda")
    stream = torch.cuda.current_stream()

    # a, b and c (their DLPack exports) are on the stream's release queue until the kernel has
    # finished; the handle only waits for it.
    handle = tile_py.launch(stream, (n + 255) // 256, add, (a, b, c, n), block=256)
    handle.wait()  # blocks with the GIL released, then runs the three deleters
    assert torch.equal(c, a + b)

    # Fire and forget: the tensors are on the stream's release queue already; temporaries such as
    # a * 2 stay alive until the kernel is done, even though Python drops them at once.
    tile_py.launch(stream, (n + 255) // 256, add, (a * 2, b, c, n), block=256)
    tile_py.synchronize()
    assert torch.equal(c, a * 2 + b)
    print("torch_vector_add: ok", tile_py.stats())


if __name__ == "__main__":
    main()
