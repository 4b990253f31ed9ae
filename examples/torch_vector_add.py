import torch
import tile_py

# The kernel of tile-launch/kernels/vector_add.cu. `extern "C"` keeps its name unmangled, so
# that the library finds it as "vector_add".
SOURCE = r"""
extern "C" __global__ void vector_add(const float* a, long long stride_a,
                                      const float* b, long long stride_b,
                                      float* c, long long stride_c,
                                      unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[(long long)i * stride_c] = a[(long long)i * stride_a] + b[(long long)i * stride_b];
    }
}
"""

lib = tile_py.Library.from_cuda_source(SOURCE)  # NVRTC; or from_ptx / from_file / from_bytes
add = lib.kernel("vector_add", [  # checked against the compiled kernel's parameters
    tile_py.In("float32", strided=True), tile_py.Scalar("i64"),
    tile_py.In("float32", strided=True), tile_py.Scalar("i64"),
    tile_py.Out("float32", strided=True), tile_py.Scalar("i64"),
    tile_py.Scalar("u64"),
])

n = 1 << 24
a = torch.randn(n, device="cuda")
b = torch.randn(2 * n, device="cuda")[::2]  # a strided view: the kernel is given its stride
c = torch.empty(n, device="cuda")
handle = tile_py.launch(torch.cuda.current_stream(), (n + 255) // 256, add,
                        (a, a.stride(0), b, b.stride(0), c, c.stride(0), n), block=256)
handle.wait()  # or drop the handle: the tensors are released once the kernel is done, never before
assert torch.equal(c, a + b)
print("vector_add: ok;", tile_py.stats()["released"], "tensors released after the kernel")
