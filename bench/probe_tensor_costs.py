"""Where tile_py's per-tensor cost goes, torch tensors against CuPy arrays, on a GPU machine:
tile_py.launch with 4 scalars (three kinds of stream argument), 3 torch tensors, 3 CuPy arrays
(CuPy's current stream the launch stream; with sync=False), one CuPy array among torch tensors,
CuPy's own export, CuPy's current-stream read, and the conversion alone (_testing.check_args,
no launch). Host us per call, bursts of 64, median of 200 rounds.

    PYTHONPATH=<tile_py site> python3 bench/probe_tensor_costs.py
"""
import statistics, time
import torch, cupy
import tile_py
from tile_py import _testing
from tile_py import In, Out, Scalar

def t(name, f, n=64, rounds=200, before=None):
    if before: before()
    for _ in range(n): f()
    v = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n): f()
        v.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    m = statistics.median(v)
    print(f"{name:<70} {m:8.3f} us", flush=True)
    return m

src = r'''extern "C" __global__ void k3(const float* a, const float* b, float* c, unsigned long long n) {}
extern "C" __global__ void k0(unsigned long long a, unsigned long long b, unsigned long long c, unsigned long long n) {}'''
lib = tile_py.Library.from_cuda_source(src)
k3 = lib.kernel("k3", [In("float32"), In("float32"), Out("float32"), Scalar("u64")])
k0 = lib.kernel("k0", [Scalar("u64")] * 4)
s = torch.cuda.Stream()
h = s.cuda_stream
xs = cupy.cuda.ExternalStream(h, 0)
a, b, c = (torch.ones(4096, device="cuda") for _ in range(3))
ca, cb, cc = (cupy.from_dlpack(x) for x in (a, b, c))
use = xs.use
with torch.cuda.stream(s):
    t("scalars, torch stream object", lambda: tile_py.launch(s, 16, k0, (1, 2, 3, 4), block=256), before=use)
    t("scalars, CuPy ExternalStream object", lambda: tile_py.launch(xs, 16, k0, (1, 2, 3, 4), block=256), before=use)
    t("scalars, int handle", lambda: tile_py.launch(h, 16, k0, (1, 2, 3, 4), block=256), before=use)
    t("3 torch tensors, torch stream object", lambda: tile_py.launch(s, 16, k3, (a, b, c, 4096), block=256), before=use)
    t("3 CuPy arrays, CuPy stream object", lambda: tile_py.launch(xs, 16, k3, (ca, cb, cc, 4096), block=256), before=use)
    t("3 CuPy arrays, torch stream object", lambda: tile_py.launch(s, 16, k3, (ca, cb, cc, 4096), block=256), before=use)
    t("1 CuPy array + 2 torch, torch stream object", lambda: tile_py.launch(s, 16, k3, (ca, b, c, 4096), block=256), before=use)
    t("3 CuPy arrays, sync=False, torch stream object", lambda: tile_py.launch(s, 16, k3, (ca, cb, cc, 4096), block=256, sync=False), before=use)
    t("ca.__dlpack__(stream=h, max_version=(1,3)) + drop", lambda: ca.__dlpack__(stream=h, max_version=(1, 3)), before=use)
    t("ca.__dlpack__(stream=-1, max_version=(1,3)) + drop", lambda: ca.__dlpack__(stream=-1, max_version=(1, 3)), before=use)
    t("cupy.cuda.get_current_stream(0).ptr", lambda: cupy.cuda.get_current_stream(0).ptr, before=use)
    t("xs.__cuda_stream__()", lambda: xs.__cuda_stream__(), before=use)
    caps = [None]
    def export_consume():
        cap = ca.__dlpack__(stream=h, max_version=(1, 3))
        _testing.check_args([In("float32")], (cap,), stream=h, device=0)
    t("capsule through _testing.check_args (export+check+consume+release)", export_consume, before=use)
    t("_testing.check_args, 1 CuPy array", lambda: _testing.check_args([In("float32")], (ca,), stream=h, device=0), before=use)
    t("_testing.check_args, 1 torch tensor", lambda: _testing.check_args([In("float32")], (a,), stream=h, device=0), before=use)
print("cupy", cupy.__version__, "current==xs:", cupy.cuda.get_current_stream().ptr == h)
tile_py.synchronize()
