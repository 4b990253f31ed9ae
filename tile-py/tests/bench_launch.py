"""A first measurement of launch overhead: tile_py.launch with three torch tensors against
cuda.core's raw-pointer launch, same kernel, same stream, same process.

    python tile-py/tests/bench_launch.py [launches]

Not a test (pytest does not collect it); the GPU bundle runs it after the tests and prints the
numbers. Handles are dropped (deferred to the stream's release queue), as in a training loop.
"""

import sys
import time

import torch

import tile_py

SOURCE = r"""
extern "C" __global__ void vector_add(const float* a, const float* b, float* c,
                                      unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def per_launch_us(fn, count):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(count):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / count * 1e6


def main():
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    n = 1 << 10
    a, b, c = (torch.randn(n, device="cuda") for _ in range(3))
    grid = (n + 255) // 256
    stream = torch.cuda.Stream()

    lib = tile_py.Library.from_cuda_source(SOURCE)
    k = lib.kernel("vector_add", [tile_py.In("f32"), tile_py.In("f32"), tile_py.Out("f32"), tile_py.Scalar("u64")])

    def tile_launch():
        tile_py.launch(stream, grid, k, (a, b, c, n), block=256)

    t_tile = per_launch_us(tile_launch, count)
    tile_py.synchronize()
    print(f"tile_py.launch, 3 torch tensors + 1 scalar: {t_tile:.2f} us/launch ({count} launches)")
    print(f"  stats: {tile_py.stats()}")

    try:
        try:
            from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
        except ImportError:
            from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, launch
        import numpy as np

        dev = Device()
        dev.set_current()
        prog = Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
        ker = prog.compile("cubin").get_kernel("vector_add")
        cstream = dev.create_stream()
        cfg = LaunchConfig(grid=grid, block=256)
        pa, pb, pc, nn = a.data_ptr(), b.data_ptr(), c.data_ptr(), np.uint64(n)

        def core_launch():
            launch(cstream, cfg, ker, pa, pb, pc, nn)

        t_core = per_launch_us(core_launch, count)
        cstream.sync()
        print(f"cuda.core launch, raw pointers:           {t_core:.2f} us/launch")
        print(f"  ratio tile_py / cuda.core: {t_tile / t_core:.2f}")
    except Exception as e:  # the comparison is optional; report why it did not run
        print(f"cuda.core comparison skipped: {type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
