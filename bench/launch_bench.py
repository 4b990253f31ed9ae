"""Launch-overhead benchmark, Python side: one process, one stream, one kernel.

Two timings, both reported.

Burst mode (host cost; BENCHMARKS.md): bursts of --burst launches (default 64) timed with no sync
inside, the launch stream synchronised, untimed, between bursts, so the launch queue never fills;
per path the median over --rounds interleaved rounds (the path order rotates every round) of
--bursts bursts each. Rows:

  cuda.core launch, raw pointers                     the floor users would pick
  CuPy RawKernel, CuPy arrays
  ct.launch (cuTile), 3 torch tensors                only when cuda.tile imports and compiles;
                                                     else skipped with the reason printed
  tile_py.launch, 3 torch tensors                    launch stream == torch's current stream
  tile_py.launch, 3 torch tensors, cross stream      torch's current stream is another one: tile
                                                     orders the launch after it
  tile_py.launch, 3 CuPy arrays / 3 plain __dlpack__ objects / 4 u64 scalars
  tile_py prepared (Kernel.bind), 3 torch tensors    same stream and cross stream
  tile_py prepared (Kernel.bind), 4 u64 scalars      the prepared path without any tensor
                                                     (bound.py_prepared_vs_cuda_core's base)

  tile_py.launch, 3 CuPy arrays, CuPy current stream != launch stream
  tile_py.cutile.launch, cuTile kernel, 3 torch tensors   same stream and cross stream (with cuTile)

and the ratios burst.py_torch_vs_cutile, burst.py_torch_cross_stream_vs_cutile,
burst.py_torch_vs_cuda_core, burst.py_prepared_vs_cuda_core, burst.py_cupy_vs_cupy_raw,
burst.py_cupy_cross_stream_vs_cupy_raw, burst.py_cutile_vs_ct_launch,
burst.py_cutile_cross_stream_vs_ct_launch, burst.py_per_torch_tensor_us (and burst.rust_vs_raw,
read from the Rust benchmark's JSON given with --rust); a ratio whose row is missing is null, with
the reason. The per torch tensor cost is (3 torch tensors - 4 u64 scalars) / 3, same stream, in
microseconds.

Saturated loop: per launch of a 4096-element float32 vector add with three tensor arguments, host time from the
first enqueue to a stream synchronisation, over LAUNCHES launches after WARMUP launches, median of
REPS repetitions (each path's repetitions are interleaved with the other paths'). Paths:

  cuda.core launch, raw pointers                     the floor users would pick
  tile_py.launch, 3 torch tensors                    DLPack C exchange API path
  tile_py.launch, 3 torch tensors, sync=False        the same without the stream handshake
  tile_py.launch, 4 u64 scalars                      the same kernel given raw pointers: tile_py's
                                                     cost without any tensor
  tile_py.launch, 3 plain __dlpack__ objects         generic DLPack path (Python __dlpack__ calls)
  tile_py.launch, 3 CuPy arrays
  cuda.core launch + 3 x StridedMemoryView           consumes DLPack, capsule lives with the view
  CuPy RawKernel + 3 x cupy.from_dlpack
  torch.add(out=)                                    a reference op

then a scale run: SCALE launches whose first input is a fresh torch tensor each time (freed when
released), tracking the release queue and torch's allocated memory.

Custom operators (op_bench): bursts of calls of PyTorch custom operators that scale a 4096-element
float32 tensor (torch.mul for reference; hand-written torch.library.custom_op operators around
tile_py.launch and ct.launch; tile_py.torch.custom_op of a tile and of a cuTile kernel; the steps
of tile's operator), with the ratios op.py_custom_op_vs_hand_ct_launch,
op.py_cutile_custom_op_vs_hand_ct_launch and op.py_custom_op_vs_torch_mul.

    python bench/launch_bench.py [--burst N] [--bursts N] [--rounds N] [--launches N]
        [--warmup N] [--reps N] [--scale N] [--rust RUST.json] [--out FILE]

Prints a table and the ratios; writes every figure to --out as JSON. It asserts no time.
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np
import torch

import tile_py

from tile_py import _testing
N = 4096
SOURCE = r"""
extern "C" __global__ void vector_add(const float* a, const float* b, float* c,
                                      unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


# cuTile, when importable: the same vector add as a tile kernel (block size from the compiled code).
CT_TILE = 256
try:
    import cuda.tile as ct

    @ct.kernel
    def ct_vector_add(a, b, c):
        bid = ct.bid(0)
        ta = ct.load(a, index=(bid,), shape=(CT_TILE,))
        tb = ct.load(b, index=(bid,), shape=(CT_TILE,))
        ct.store(c, index=(bid,), tile=ta + tb)

    CT_MISSING = None
except Exception as e:  # noqa: BLE001 - reported as the row's reason, not fatal
    ct = None
    CT_MISSING = f"cuda.tile unavailable: {e!r}"


class PlainDLPack:
    """Exposes only __dlpack__ / __dlpack_device__, as a generic producer does."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, **kw):
        return self._t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()


def timed(fn, launches, warmup, sync):
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(launches):
        fn()
    sync()
    return (time.perf_counter() - t0) / launches * 1e6


def bursts(fn, sync, burst, count):
    """One untimed warm-up burst, then `count` bursts of `burst` calls of `fn`, each timed with
    no sync inside and followed by an untimed `sync`. Returns us per launch of each burst."""
    for _ in range(burst):
        fn()
    sync()
    out = []
    clock = time.perf_counter
    for _ in range(count):
        t0 = clock()
        for _ in range(burst):
            fn()
        t = clock() - t0
        sync()
        out.append(t / burst * 1e6)
    return out


def producer_bounds(bmed, t):
    """What bounds the burst ratios from below, from rows of the same run: tile_py's launch
    with no tensor (4 u64 scalars) plus what the producers themselves cost per tensor (torch:
    one C exchange-API export and its deleter, timed in C by `_testing.exchange_api_cost`, plus
    the negative-bit check per tensor and requires_grad for the output; CuPy: one
    `__dlpack__(stream=...)` and the capsule's release per array). A launch that did no
    per-tensor work of its own would still cost this. Returns (bounds, reasons for nulls)."""
    out, missing = {}, {}
    try:
        costs = [_testing.exchange_api_cost(t, 64) for _ in range(200)]
        export_us = statistics.median(c[0] for c in costs) / 1e3
        out["bound.torch_exchange_export_release_us"] = export_us
        out["bound.torch_current_work_stream_us"] = statistics.median(c[1] for c in costs) / 1e3
    except Exception as e:  # noqa: BLE001 - an older torch without the C exchange API
        export_us = None
        missing["bound.torch_exchange_export_release_us"] = repr(e)
    neg = bmed.get("producer: torch x.is_neg(), 1 tensor")
    grad = bmed.get("producer: torch x.requires_grad, 1 tensor")
    per = None
    if None not in (export_us, neg, grad):
        per = export_us + neg + grad / 3
    out["bound.py_per_torch_tensor_producer_us"] = per
    if per is None:
        missing["bound.py_per_torch_tensor_producer_us"] = "a producer row is missing"

    def floor(key, den, per_tensor, base="tile_py.launch, 4 u64 scalars"):
        no_tensor = bmed.get(base)
        if None not in (no_tensor, per_tensor) and den in bmed:
            out[key] = (no_tensor + 3 * per_tensor) / bmed[den]
        else:
            out[key] = None
            missing[key] = f"a row is missing ({den}, {base} or a producer row)"

    floor("bound.py_torch_vs_cutile", "ct.launch (cuTile), 3 torch tensors", per)
    floor("bound.py_torch_vs_cuda_core", "cuda.core launch, raw pointers", per)
    floor("bound.py_prepared_vs_cuda_core", "cuda.core launch, raw pointers", per,
          base="tile_py prepared (Kernel.bind), 4 u64 scalars")
    floor("bound.py_cupy_vs_cupy_raw", "CuPy RawKernel, CuPy arrays",
          bmed.get("producer: CuPy __dlpack__(stream=current) + capsule drop, 1 array"))
    floor("bound.py_cupy_cross_stream_vs_cupy_raw", "CuPy RawKernel, CuPy arrays",
          bmed.get("producer: CuPy __dlpack__(stream=current) + capsule drop, 1 array, "
                   "CuPy current stream != launch stream"))
    return out, missing


def cuda_core_setup(stream):
    try:
        from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
    except ImportError:
        from cuda.core.experimental import Device, LaunchConfig, Program, ProgramOptions, launch
    dev = Device(torch.cuda.current_device())
    dev.set_current()
    cc = dev.compute_capability
    prog = Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{cc[0]}{cc[1]}"))
    kernel = prog.compile("cubin", name_expressions=("vector_add",)).get_kernel("vector_add")
    s = dev.create_stream(stream)
    cfg = LaunchConfig(grid=(N + 255) // 256, block=256)
    return launch, kernel, s, cfg


def strided_memory_view():
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError:
        from cuda.core.experimental.utils import StridedMemoryView
    if hasattr(StridedMemoryView, "from_dlpack"):
        return lambda obj, s: StridedMemoryView.from_dlpack(obj, s)
    return lambda obj, s: StridedMemoryView(obj, stream_ptr=s)


# ---- PyTorch custom operators: eager cost per call (op.* ratios) -------------------------------
#
# Bursts of --burst calls on a 4096-element float32 tensor, on torch's current (default) stream,
# each call allocating its output: torch.mul (PyTorch's own operator), hand-written
# torch.library.custom_op operators around tile_py.launch and around cuTile's ct.launch (what
# cuTile suggests for torch.compile), and tile_py.torch.custom_op of a tile kernel and of a
# cuTile kernel; plus the steps of tile's operator (the dispatcher alone; its body alone:
# empty_like + tile_py.launch; the same operator called on a side stream, where it asks whether
# it is in a CUDA graph region). Ratios: op.py_custom_op_vs_hand_ct_launch,
# op.py_cutile_custom_op_vs_hand_ct_launch (target <= 1.0 each) and op.py_custom_op_vs_torch_mul
# (reference); null with the reason when a row is missing (cuTile absent).

OP_SCALE_SOURCE = r"""
extern "C" __global__ void op_scale(const float* x, float* y, float a, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i];
}
"""

if ct is not None:

    @ct.kernel
    def ct_op_scale(x, y, alpha):
        bid = ct.bid(0)
        ct.store(y, index=(bid,), tile=ct.load(x, index=(bid,), shape=(CT_TILE,)) * alpha)


def op_bench(o):
    """The op.* rows and ratios: returns {"median_us": ..., "skipped": ..., "ratios": ...,
    "ratios_missing": ...}."""
    import tile_py.torch as tt

    x = torch.randn(N, device="cuda")
    k = tile_py.Library.from_cuda_source(OP_SCALE_SOURCE).kernel(
        "op_scale", [tile_py.In("f32"), tile_py.Out("f32"), tile_py.Scalar("f32"), tile_py.Scalar("u64")])
    grid = (N + 255) // 256
    rows, skipped = {}, {}

    @torch.library.custom_op("tile_bench::hand_tile_scale", mutates_args=())
    def hand_tile(x: torch.Tensor, alpha: float) -> torch.Tensor:
        out = torch.empty_like(x)
        tile_py.launch(torch.cuda.current_stream(), (x.numel() + 255) // 256, k, (x, out, alpha, x.numel()),
                       block=256)
        return out

    hand_tile.register_fake(lambda x, alpha: torch.empty_like(x))

    @tt.custom_op("tile_bench::scale", k, args=("x", "out", "alpha", lambda x, **_: x.numel()),
                  outputs={"out": lambda x, **_: torch.empty_like(x)},
                  grid=lambda x, **_: (x.numel() + 255) // 256, block=256)
    def tile_op(x: torch.Tensor, alpha: float) -> torch.Tensor: ...

    def body_alone():
        out = torch.empty_like(x)
        tile_py.launch(torch.cuda.current_stream(), grid, k, (x, out, 2.0, N), block=256)

    # PyTorch's dispatcher alone, on the path tile_py.torch registers on: a Library operator
    # whose CUDA kernel does nothing.
    noop_lib = torch.library.Library("tile_bench", "FRAGMENT")
    noop_lib.define("noop(Tensor x) -> ()")
    noop_lib.impl("noop", lambda x: None, "CUDA")
    noop = torch.ops.tile_bench.noop.default

    side = torch.cuda.Stream()
    rows["torch.mul"] = (lambda: torch.mul(x, 2.0), None)
    rows["dispatcher alone: a Library operator doing nothing"] = (lambda: noop(x), None)
    rows["hand custom_op around tile_py.launch"] = (lambda: hand_tile(x, 2.0), None)
    rows["tile_py.torch.custom_op"] = (lambda: tile_op(x, 2.0), None)
    rows["tile_py.torch.custom_op, side stream"] = (lambda: tile_op(x, 2.0), side)
    rows["its body alone: empty_like + tile_py.launch"] = (body_alone, None)
    if ct is not None:

        @torch.library.custom_op("tile_bench::hand_ct_scale", mutates_args=())
        def hand_ct(x: torch.Tensor, alpha: float) -> torch.Tensor:
            out = torch.empty_like(x)
            ct.launch(torch.cuda.current_stream(), (x.numel() // CT_TILE, 1, 1), ct_op_scale, (x, out, alpha))
            return out

        hand_ct.register_fake(lambda x, alpha: torch.empty_like(x))

        @tt.custom_op("tile_bench::cutile_scale", ct_op_scale, args=("x", "out", "alpha"),
                      outputs={"out": lambda x, **_: torch.empty_like(x)},
                      grid=lambda x, **_: (x.numel() // CT_TILE, 1, 1), mutates_args=())
        def cutile_op(x: torch.Tensor, alpha: float) -> torch.Tensor: ...

        rows["hand custom_op around ct.launch"] = (lambda: hand_ct(x, 2.0), None)
        rows["tile_py.torch.custom_op, cuTile kernel"] = (lambda: cutile_op(x, 2.0), None)
    else:
        for r in ("hand custom_op around ct.launch", "tile_py.torch.custom_op, cuTile kernel"):
            skipped[r] = CT_MISSING
    us = {name: [] for name in rows}
    names = list(rows)
    for rnd in range(o.rounds):
        for j in range(len(names)):
            name = names[(j + rnd) % len(names)]
            if name in skipped:
                continue
            fn, s = rows[name]
            try:
                with torch.cuda.stream(s or torch.cuda.default_stream()):
                    us[name].extend(bursts(fn, torch.cuda.synchronize, o.burst, o.bursts))
            except Exception as e:  # noqa: BLE001 - reported as the row's reason
                skipped[name] = repr(e)
            tile_py.synchronize()
    med = {name: statistics.median(v) for name, v in us.items() if v}
    ratios, missing = {}, {}
    for key, num, den in [
        ("op.py_custom_op_vs_hand_ct_launch", "tile_py.torch.custom_op", "hand custom_op around ct.launch"),
        ("op.py_cutile_custom_op_vs_hand_ct_launch", "tile_py.torch.custom_op, cuTile kernel",
         "hand custom_op around ct.launch"),
        ("op.py_custom_op_vs_torch_mul", "tile_py.torch.custom_op", "torch.mul"),
    ]:
        if num in med and den in med:
            ratios[key] = med[num] / med[den]
        else:
            ratios[key] = None
            missing[key] = "; ".join(
                f"{r}: {skipped.get(r, 'not measured')}" for r in (num, den) if r not in med
            )
    print(f"custom operators: per call, {N}-element f32, bursts of {o.burst}, median over {o.rounds} rounds")
    for name in rows:
        print(f"{name:<64} " + (f"{med[name]:>9.2f} us" if name in med else f"skipped: {skipped.get(name)}"))
    targets = {"op.py_custom_op_vs_hand_ct_launch": "<= 1.0",
               "op.py_cutile_custom_op_vs_hand_ct_launch": "<= 1.0",
               "op.py_custom_op_vs_torch_mul": "reference"}
    for key, v in ratios.items():
        shown = f"{v:.3f}" if v is not None else f"null ({missing[key]})"
        print(f"{key:<44} {shown}  ({targets[key]})")
    return {"median_us": med, "us_per_call": us, "skipped": skipped, "ratios": ratios,
            "ratios_missing": missing}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=20_000)
    ap.add_argument("--warmup", type=int, default=2_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--scale", type=int, default=1_000_000)
    ap.add_argument("--burst", type=int, default=64, help="launches per burst")
    ap.add_argument("--bursts", type=int, default=25, help="timed bursts per path and round")
    ap.add_argument("--rounds", type=int, default=20, help="interleaved rounds")
    ap.add_argument("--rust", default=None, help="the Rust benchmark's JSON (for burst.rust_vs_raw)")
    ap.add_argument("--out", default=None)
    o = ap.parse_args()

    torch.manual_seed(0)
    a, b, c = (torch.randn(N, device="cuda") for _ in range(3))
    stream = torch.cuda.Stream()
    handle = stream.cuda_stream
    grid = (N + 255) // 256
    sync = stream.synchronize

    lib = tile_py.Library.from_cuda_source(SOURCE)
    k = lib.kernel("vector_add", [tile_py.In("f32"), tile_py.In("f32"), tile_py.Out("f32"),
                                  tile_py.Scalar("u64")])
    paths = {}

    def add(name, fn, s=sync):
        paths[name] = (fn, s)

    # cuda.core, raw pointers.
    try:
        launch, ck, cs, cfg = cuda_core_setup(stream)
        pa, pb, pc = (np.uint64(t.data_ptr()) for t in (a, b, c))
        n64 = np.uint64(N)
        add("cuda.core launch, raw pointers", lambda: launch(cs, cfg, ck, pa, pb, pc, n64))
        smv = strided_memory_view()

        def cuda_core_smv():
            va, vb, vc = smv(a, handle), smv(b, handle), smv(c, handle)
            launch(cs, cfg, ck, np.uint64(va.ptr), np.uint64(vb.ptr), np.uint64(vc.ptr), n64)

        add("cuda.core launch + 3 x StridedMemoryView", cuda_core_smv)
        qa, qb, qc = PlainDLPack(a), PlainDLPack(b), PlainDLPack(c)

        def cuda_core_smv_plain():
            va, vb, vc = smv(qa, handle), smv(qb, handle), smv(qc, handle)
            launch(cs, cfg, ck, np.uint64(va.ptr), np.uint64(vb.ptr), np.uint64(vc.ptr), n64)

        add("cuda.core launch + 3 x StridedMemoryView, plain objs", cuda_core_smv_plain)
    except Exception as e:  # noqa: BLE001 - a missing library is reported, not fatal
        print(f"cuda.core paths unavailable: {e!r}", file=sys.stderr)

    add("tile_py.launch, 3 torch tensors (C exchange API)",
        lambda: tile_py.launch(stream, grid, k, (a, b, c, N), block=256))
    add("tile_py.launch, 3 torch tensors, sync=False",
        lambda: tile_py.launch(stream, grid, k, (a, b, c, N), block=256, sync=False))
    k_ptrs = lib.kernel("vector_add", [tile_py.Scalar("u64")] * 4)
    ia, ib, ic = (t.data_ptr() for t in (a, b, c))
    add("tile_py.launch, 4 u64 scalars (raw pointers)",
        lambda: tile_py.launch(stream, grid, k_ptrs, (ia, ib, ic, N), block=256))
    pA, pB, pC = PlainDLPack(a), PlainDLPack(b), PlainDLPack(c)
    sat_bound = k.bind(stream, grid, block=256)
    add("tile_py prepared (Kernel.bind), 3 torch tensors", lambda: sat_bound(a, b, c, N))
    add("tile_py.launch, 3 plain __dlpack__ objects",
        lambda: tile_py.launch(stream, grid, k, (pA, pB, pC, N), block=256))
    try:
        import cupy

        xs = cupy.cuda.ExternalStream(handle, torch.cuda.current_device())
        ca, cb, cc = (cupy.from_dlpack(t) for t in (a, b, c))
        add("tile_py.launch, 3 CuPy arrays",
            lambda: tile_py.launch(xs, grid, k, (ca, cb, cc, N), block=256))
        raw = cupy.RawKernel(SOURCE, "vector_add")

        def cupy_from_dlpack():
            with xs:
                raw((grid,), (256,), (cupy.from_dlpack(a), cupy.from_dlpack(b),
                                      cupy.from_dlpack(c), np.uint64(N)))

        add("CuPy RawKernel + 3 x cupy.from_dlpack", cupy_from_dlpack)
    except Exception as e:  # noqa: BLE001
        print(f"CuPy paths unavailable: {e!r}", file=sys.stderr)

    # What the producer alone costs on the generic path: three __dlpack__ calls with the launch
    # stream, capsules dropped unconsumed (torch's deleter runs via the capsule destructor).
    def producer_only():
        for t in (pA, pB, pC):
            t.__dlpack__(stream=handle, max_version=(1, 3))

    add("3 x plain __dlpack__(stream=...) alone (producer cost)", producer_only)

    def torch_add():
        with torch.cuda.stream(stream):
            torch.add(a, b, out=c)

    add("torch.add(out=) (reference op)", torch_add)

    # ---- burst mode ------------------------------------------------------------------------
    other = torch.cuda.Stream()  # torch's current stream in the cross-stream rows
    bound = k.bind(stream, grid, block=256)
    burst_rows = {}  # name -> (fn, same_stream)
    burst_before = {}  # name -> what sets the row's condition up, untimed, before its bursts
    burst_skipped = {}

    def brow(name, fn, same=True, before=None):
        burst_rows[name] = (fn, same)
        if before is not None:
            burst_before[name] = before

    if "cuda.core launch, raw pointers" in paths:
        brow("cuda.core launch, raw pointers", paths["cuda.core launch, raw pointers"][0])
    else:
        burst_skipped["cuda.core launch, raw pointers"] = "cuda.core unavailable"
    try:
        import cupy

        xs2 = cupy.cuda.ExternalStream(handle, torch.cuda.current_device())
        ca2, cb2, cc2 = (cupy.from_dlpack(t) for t in (a, b, c))
        raw2 = cupy.RawKernel(SOURCE, "vector_add")
        n2 = np.uint64(N)

        def cupy_on_launch_stream():
            # CuPy's current stream (what RawKernel launches on, and what tile_py offers CuPy
            # arrays) is the launch stream for the CuPy rows, set before each row's bursts: set
            # once, other code in this process was seen to leave another one current.
            xs2.use()
            if cupy.cuda.get_current_stream().ptr != handle:
                raise RuntimeError("CuPy's current stream is not the launch stream after use()")

        def cupy_raw():
            raw2((grid,), (256,), (ca2, cb2, cc2, n2))

        brow("CuPy RawKernel, CuPy arrays", cupy_raw, before=cupy_on_launch_stream)
        brow("tile_py.launch, 3 CuPy arrays",
             lambda: tile_py.launch(xs2, grid, k, (ca2, cb2, cc2, N), block=256),
             before=cupy_on_launch_stream)
        # CuPy's current stream is another stream than the launch stream: tile_py orders the
        # launch after it (CuPy RawKernel launches on its current stream, so its row is the
        # same-stream one).
        other_cupy = cupy.cuda.Stream(non_blocking=True)

        def cupy_cross():
            with other_cupy:
                tile_py.launch(xs2, grid, k, (ca2, cb2, cc2, N), block=256)

        brow("tile_py.launch, 3 CuPy arrays, CuPy current stream != launch stream", cupy_cross,
             before=cupy_on_launch_stream)
        # The producer's own cost per array (bounds): the export tile_py asks CuPy for (offered
        # CuPy's current stream, which therefore needs no event), and the capsule's release; in
        # the cross-stream case with `other_cupy` current (set before the bursts, so that the
        # row does not pay a `with` per array).
        brow("producer: CuPy __dlpack__(stream=current) + capsule drop, 1 array",
             lambda: ca2.__dlpack__(stream=handle, max_version=(1, 3)),
             before=cupy_on_launch_stream)
        other_ptr = other_cupy.ptr
        brow("producer: CuPy __dlpack__(stream=current) + capsule drop, 1 array, "
             "CuPy current stream != launch stream",
             lambda: ca2.__dlpack__(stream=other_ptr, max_version=(1, 3)),
             before=other_cupy.use)
    except Exception as e:  # noqa: BLE001
        burst_skipped["CuPy RawKernel, CuPy arrays"] = f"CuPy unavailable: {e!r}"
        burst_skipped["tile_py.launch, 3 CuPy arrays"] = f"CuPy unavailable: {e!r}"
    if ct is not None:
        ct_grid = ((N + CT_TILE - 1) // CT_TILE, 1, 1)
        brow("ct.launch (cuTile), 3 torch tensors",
             lambda: ct.launch(stream, ct_grid, ct_vector_add, (a, b, c)))
        brow("ct.launch (cuTile), 3 torch tensors, cross stream",
             lambda: ct.launch(stream, ct_grid, ct_vector_add, (a, b, c)), same=False)
        import tile_py.cutile as tcu

        brow("tile_py.cutile.launch, cuTile kernel, 3 torch tensors",
             lambda: tcu.launch(stream, ct_grid, ct_vector_add, (a, b, c)))
        brow("tile_py.cutile.launch, cuTile kernel, 3 torch tensors, cross stream",
             lambda: tcu.launch(stream, ct_grid, ct_vector_add, (a, b, c)), same=False)
    else:
        for row in ("ct.launch (cuTile), 3 torch tensors",
                    "ct.launch (cuTile), 3 torch tensors, cross stream",
                    "tile_py.cutile.launch, cuTile kernel, 3 torch tensors",
                    "tile_py.cutile.launch, cuTile kernel, 3 torch tensors, cross stream"):
            burst_skipped[row] = CT_MISSING
    brow("tile_py.launch, 3 torch tensors",
         lambda: tile_py.launch(stream, grid, k, (a, b, c, N), block=256))
    brow("tile_py.launch, 3 torch tensors, cross stream",
         lambda: tile_py.launch(stream, grid, k, (a, b, c, N), block=256), same=False)
    brow("tile_py.launch, 3 plain __dlpack__ objects",
         lambda: tile_py.launch(stream, grid, k, (pA, pB, pC, N), block=256))
    brow("tile_py.launch, 4 u64 scalars",
         lambda: tile_py.launch(stream, grid, k_ptrs, (ia, ib, ic, N), block=256))
    brow("tile_py prepared (Kernel.bind), 3 torch tensors", lambda: bound(a, b, c, N))
    bound_ptrs = k_ptrs.bind(stream, grid, block=256)
    brow("tile_py prepared (Kernel.bind), 4 u64 scalars", lambda: bound_ptrs(ia, ib, ic, N))
    # The checks on a torch tensor that protect values, as Python calls (bounds): the negative
    # bit (every tensor) and requires_grad (the output).
    brow("producer: torch x.is_neg(), 1 tensor", lambda: a.is_neg())
    brow("producer: torch x.requires_grad, 1 tensor", lambda: c.requires_grad)
    brow("tile_py prepared (Kernel.bind), 3 torch tensors, cross stream",
         lambda: bound(a, b, c, N), same=False)

    burst_us = {name: [] for name in burst_rows}
    burst_errors = {}
    bnames = list(burst_rows)
    t_burst = time.perf_counter()
    for rnd in range(o.rounds):
        for j in range(len(bnames)):
            name = bnames[(j + rnd) % len(bnames)]
            if name in burst_errors:
                continue
            fn, same = burst_rows[name]
            try:
                if name in burst_before:
                    burst_before[name]()
                with torch.cuda.stream(stream if same else other):
                    burst_us[name].extend(bursts(fn, sync, o.burst, o.bursts))
            except Exception as e:  # noqa: BLE001
                burst_errors[name] = repr(e)
            tile_py.synchronize()
    t_burst = time.perf_counter() - t_burst
    bmed = {name: statistics.median(v) for name, v in burst_us.items() if v}
    burst_skipped.update(burst_errors)

    def ratio(key, num, den):
        if num in bmed and den in bmed:
            return bmed[num] / bmed[den], None
        missing = [r for r in (num, den) if r not in bmed]
        return None, "; ".join(f"{r}: {burst_skipped.get(r, 'not measured')}" for r in missing)

    burst_ratios, burst_ratio_missing = {}, {}
    rust_key = "burst.rust_vs_raw"
    if o.rust:
        try:
            with open(o.rust) as f:
                burst_ratios[rust_key] = json.load(f)["ratios"][rust_key]
        except Exception as e:  # noqa: BLE001
            burst_ratios[rust_key] = None
            burst_ratio_missing[rust_key] = f"cannot read {o.rust}: {e!r}"
    else:
        burst_ratios[rust_key] = None
        burst_ratio_missing[rust_key] = "no --rust file given (the Rust benchmark's JSON has it)"
    torch_same = "tile_py.launch, 3 torch tensors"
    for key, num, den in [
        ("burst.py_torch_vs_cutile", torch_same, "ct.launch (cuTile), 3 torch tensors"),
        ("burst.py_torch_cross_stream_vs_cutile", "tile_py.launch, 3 torch tensors, cross stream",
         "ct.launch (cuTile), 3 torch tensors, cross stream"),
        ("burst.py_torch_vs_cuda_core", torch_same, "cuda.core launch, raw pointers"),
        ("burst.py_prepared_vs_cuda_core", "tile_py prepared (Kernel.bind), 3 torch tensors",
         "cuda.core launch, raw pointers"),
        ("burst.py_cutile_vs_ct_launch", "tile_py.cutile.launch, cuTile kernel, 3 torch tensors",
         "ct.launch (cuTile), 3 torch tensors"),
        ("burst.py_cutile_cross_stream_vs_ct_launch",
         "tile_py.cutile.launch, cuTile kernel, 3 torch tensors, cross stream",
         "ct.launch (cuTile), 3 torch tensors, cross stream"),
        ("burst.py_cupy_vs_cupy_raw", "tile_py.launch, 3 CuPy arrays", "CuPy RawKernel, CuPy arrays"),
        ("burst.py_cupy_cross_stream_vs_cupy_raw",
         "tile_py.launch, 3 CuPy arrays, CuPy current stream != launch stream",
         "CuPy RawKernel, CuPy arrays"),
    ]:
        r, why = ratio(key, num, den)
        burst_ratios[key] = r
        if why:
            burst_ratio_missing[key] = why
    per_tensor = None
    if torch_same in bmed and "tile_py.launch, 4 u64 scalars" in bmed:
        per_tensor = (bmed[torch_same] - bmed["tile_py.launch, 4 u64 scalars"]) / 3
    burst_ratios["burst.py_per_torch_tensor_us"] = per_tensor
    if per_tensor is None:
        burst_ratio_missing["burst.py_per_torch_tensor_us"] = "a torch or u64-scalar row is missing"
    bounds, bounds_missing = producer_bounds(bmed, a)

    results = {name: [] for name in paths}
    errors = {}
    names = list(paths)
    # The launch stream is torch's current stream too (the common case: launching where the
    # producer works), so no cross-stream wait is needed; the order of the paths rotates each
    # repetition so that drift favours none.
    with torch.cuda.stream(stream):
        for rep in range(o.reps):
            for j in range(len(names)):
                name = names[(j + rep) % len(names)]
                fn, s = paths[name]
                if name in errors:
                    continue
                try:
                    results[name].append(timed(fn, o.launches, o.warmup, s))
                except Exception as e:  # noqa: BLE001
                    errors[name] = repr(e)
                tile_py.synchronize()
    med = {name: statistics.median(v) for name, v in results.items() if v}

    # Correctness of the measured kernel, once: c = a + b.
    tile_py.launch(stream, grid, k, (a, b, c, N), block=256).wait()
    sync()
    correct = bool(torch.equal(c, a + b))

    # Scale: a fresh input tensor per launch, freed when released.
    tile_py.synchronize()
    s0 = tile_py.stats()
    base_mem = torch.cuda.memory_allocated()
    max_pending = max_bytes = max_mem = 0
    t0 = time.perf_counter()
    with torch.cuda.stream(stream):
        for i in range(o.scale):
            x = torch.empty(N, device="cuda")
            tile_py.launch(stream, grid, k, (x, b, c, N), block=256)
            del x
            if i % 1000 == 0:
                st = tile_py.stats()
                max_pending = max(max_pending, st.get("pending_guards", 0))
                max_bytes = max(max_bytes, st.get("pending_bytes", 0))
                max_mem = max(max_mem, torch.cuda.memory_allocated() - base_mem)
    tile_py.synchronize()
    scale_s = time.perf_counter() - t0
    s1 = tile_py.stats()
    released = s1.get("released", 0) - s0.get("released", 0)
    end_mem = torch.cuda.memory_allocated() - base_mem

    floor = med.get("cuda.core launch, raw pointers")
    torch_path = med.get("tile_py.launch, 3 torch tensors (C exchange API)")
    plain = med.get("tile_py.launch, 3 plain __dlpack__ objects")
    smv_t = med.get("cuda.core launch + 3 x StridedMemoryView, plain objs")
    print(f"burst mode: per launch, {N}-element f32 vector add, median over {o.rounds} interleaved "
          f"rounds x {o.bursts} bursts of {o.burst} launches (no sync inside a burst) "
          f"[{t_burst:.1f} s]")
    floor_b = bmed.get("cuda.core launch, raw pointers")
    print(f"{'path':<64} {'us/launch':>9} {'x cuda.core':>11}")
    for name in burst_rows:
        if name in bmed:
            rel = f"{bmed[name] / floor_b:>11.3f}" if floor_b else f"{'-':>11}"
            print(f"{name:<64} {bmed[name]:>9.2f} {rel}")
    for name, why in burst_skipped.items():
        print(f"{name:<64} skipped: {why}")
    targets = {"burst.rust_vs_raw": 1.15, "burst.py_torch_vs_cutile": 1.0,
               "burst.py_torch_cross_stream_vs_cutile": 1.1, "burst.py_torch_vs_cuda_core": 1.10,
               "burst.py_prepared_vs_cuda_core": 1.0, "burst.py_cupy_vs_cupy_raw": 1.10,
               "burst.py_cupy_cross_stream_vs_cupy_raw": 1.15,
               "burst.py_per_torch_tensor_us": 0.25, "burst.py_cutile_vs_ct_launch": 1.0,
               "burst.py_cutile_cross_stream_vs_ct_launch": 1.1}
    for key, v in burst_ratios.items():
        shown = f"{v:.3f}" if v is not None else f"null ({burst_ratio_missing.get(key)})"
        print(f"{key:<40} {shown}  (target <= {targets[key]})")
    for key, v in bounds.items():
        shown = f"{v:.3f}" if v is not None else f"null ({bounds_missing.get(key)})"
        print(f"{key:<52} {shown}")
    print()
    print(f"saturated: per launch, {N}-element f32 vector add, 3 tensors, median of {o.reps} reps x "
          f"{o.launches} launches (after {o.warmup} warm-up)")
    print(f"{'path':<52} {'us/launch':>9}")
    for name, v in med.items():
        print(f"{name:<52} {v:>9.2f}")
    for name, e in errors.items():
        print(f"{name:<52} failed: {e}")
    ratios = {}
    if floor and torch_path:
        ratios["tile_py_torch_over_cuda_core_raw"] = torch_path / floor
        print(f"ratio tile_py (torch) / cuda.core raw:              {torch_path / floor:.3f}  (target <= 1.3)")
    if plain and smv_t:
        ratios["tile_py_plain_over_cuda_core_smv"] = plain / smv_t
        print(f"ratio tile_py (plain __dlpack__) / cuda.core + SMV (same plain objects): "
              f"{plain / smv_t:.3f}  (target <= 0.2)")
    scalars = med.get("tile_py.launch, 4 u64 scalars (raw pointers)")
    if floor and torch_path and scalars:
        print(f"tile_py without tensors - cuda.core raw: {scalars - floor:+.2f} us; "
              f"3 torch tensors - no tensors: {torch_path - scalars:+.2f} us")
    print(f"kernel result correct: {correct}")
    print(f"scale: {o.scale} launches in {scale_s:.1f} s; guards released {released} "
          f"(expected {3 * o.scale}); max pending guards {max_pending}, max pending bytes "
          f"{max_bytes}; torch memory above baseline: max {max_mem} B, end {end_mem} B; "
          f"leaked {s1.get('leaked', 0)}")
    try:
        jax_figures = jax_section(N, o.burst, o.bursts, o.rounds)
    except Exception as e:  # noqa: BLE001 - the other figures are kept
        print(f"JAX section failed: {e!r}")
        jax_figures = {"error": repr(e)}
    try:
        op = op_bench(o)
    except Exception as e:  # noqa: BLE001 - the other figures are kept
        print(f"custom-operator section failed: {e!r}")
        op = {"error": repr(e), "ratios": {}, "ratios_missing": {"op.*": repr(e)}}
    if o.out:
        with open(o.out, "w") as f:
            json.dump({
                "jax": jax_figures,
                "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "gpu": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "burst": {"size": o.burst, "rounds": o.rounds, "bursts_per_round": o.bursts,
                          "seconds": t_burst, "median_us": bmed, "us_per_launch": burst_us,
                          "skipped": burst_skipped,
                          "launch_stream_is_torch_current": {n: same for n, (_, same)
                                                             in burst_rows.items()},
                          "per_torch_tensor_us": per_tensor},
                "ratios": {**burst_ratios, **ratios, **op["ratios"]},
                "bounds": bounds, "bounds_missing": bounds_missing,
                "ratios_missing": {**burst_ratio_missing, **op["ratios_missing"]},
                "op": op,
                "launches": o.launches, "warmup": o.warmup, "reps": o.reps,
                "us_per_launch": results, "median_us": med, "errors": errors,
                "kernel_correct": correct,
                "scale": {"launches": o.scale, "seconds": scale_s, "released": released,
                          "max_pending_guards": max_pending, "max_pending_bytes": max_bytes,
                          "torch_mem_max_above_baseline": max_mem,
                          "torch_mem_end_above_baseline": end_mem,
                          "leaked": s1.get("leaked", 0)},
            }, f, indent=1)


# ---- JAX: a jitted tile call against the jax.numpy op (tile_py.jax) -----------------------------

JAX_ADD_SOURCE = r"""
extern "C" __global__ void jax_vector_add(const float* a, const float* b, float* c,
                                          unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
"""


def jax_section(n, burst, bursts, rounds):
    """Per call of an already-jitted function, in bursts of `burst` calls (no sync inside a
    burst, `block_until_ready` on the last result ends it): `tile_py.jax.call` of an `n`-element
    f32 vector add, the same add as a jax.numpy op, and the cuTile vector add (`ct_vector_add`)
    through `tile_py.jax.cutile_call` and through cuTile's own `ct.jax.cutile_call`, where cuTile
    and its compiler are there. Returns the medians (us) and the ratios `jax.tile_call_vs_jnp`
    and `jax.tile_call_vs_cutile_call` (None, with the reason in `ratios_missing`, when a row is
    missing)."""
    import os
    import shutil
    import statistics

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    out = {"median_us": {}, "ratios": {}, "ratios_missing": {}, "skipped": {}}
    try:
        import jax
        import jax.numpy as jnp
        import tile_py.jax

        jax.devices("gpu")
    except Exception as e:  # noqa: BLE001 - any reason JAX's GPU backend is unusable
        why = f"JAX's GPU backend is unavailable: {e}"
        for key in ("jax.tile_call_vs_jnp", "jax.tile_call_vs_cutile_call"):
            out["ratios"][key] = None
            out["ratios_missing"][key] = why
        return out
    k = tile_py.Library.from_cuda_source(JAX_ADD_SOURCE).kernel(
        "jax_vector_add", [tile_py.In("float32"), tile_py.In("float32"),
                           tile_py.Out("float32"), tile_py.Scalar("u64")])
    add = tile_py.jax.call(k, out_shapes=lambda a, b: jax.ShapeDtypeStruct(a.shape, a.dtype),
                           grid=(n + 255) // 256, block=256)
    rows = {
        "jax.jit(tile_py.jax.call)": jax.jit(lambda a, b: add(a, b, n)),
        "jax.jit(jnp add)": jax.jit(lambda a, b: a + b),
    }
    a = jax.random.normal(jax.random.key(0), (n,))
    b = jax.random.normal(jax.random.key(1), (n,))
    np_want = (a + b).block_until_ready()
    assert bool(jnp.allclose(rows["jax.jit(tile_py.jax.call)"](a, b), np_want))
    # The cuTile pair: the same cuTile kernel through tile_py.jax.cutile_call and through
    # ct.jax.cutile_call, each jitted, each checked against jax.numpy before it is timed.
    ct_rows = ("jax.jit(tile_py.jax.cutile_call)", "jax.jit(ct.jax.cutile_call)")
    ct_missing = CT_MISSING
    if ct_missing is None and shutil.which("tileiras") is None:
        ct_missing = "cuTile's compiler (tileiras) is not on PATH"
    if ct_missing is None:
        try:
            import cuda.tile.jax as ctj

            ct_grid = ((n + CT_TILE - 1) // CT_TILE,)
            pairs = {
                ct_rows[0]: jax.jit(lambda a, b: tile_py.jax.cutile_call(
                    ct_grid, ct_vector_add, (a, b, tile_py.jax.OutputPlaceholder(a.shape, a.dtype)))),
                ct_rows[1]: jax.jit(lambda a, b: ctj.cutile_call(
                    ct_grid, ct_vector_add, (a, b, ctj.OutputPlaceholder(a.shape, a.dtype)))),
            }
            for name, f in pairs.items():
                assert bool(jnp.allclose(f(a, b), np_want)), f"{name} computed a wrong sum"
            rows.update(pairs)
        except Exception as e:  # noqa: BLE001 - reported as the rows' reason, not fatal
            ct_missing = f"a cuTile JAX call failed: {e!r}"
    if ct_missing is not None:
        for name in ct_rows:
            out["skipped"][name] = ct_missing
    samples = {name: [] for name in rows}
    for name, f in rows.items():  # warm-up: compile, then a few bursts
        for _ in range(3 * burst):
            f(a, b)
        f(a, b).block_until_ready()
    names = list(rows)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            f = rows[name]
            for _ in range(bursts):
                t0 = time.perf_counter()
                for _ in range(burst - 1):
                    f(a, b)
                f(a, b).block_until_ready()
                samples[name].append((time.perf_counter() - t0) / burst * 1e6)
    med = {name: statistics.median(v) for name, v in samples.items()}
    out["median_us"] = med
    out["ratios"]["jax.tile_call_vs_jnp"] = med["jax.jit(tile_py.jax.call)"] / med["jax.jit(jnp add)"]
    if ct_missing is None:
        out["ratios"]["jax.tile_call_vs_cutile_call"] = med[ct_rows[0]] / med[ct_rows[1]]
    else:
        out["ratios"]["jax.tile_call_vs_cutile_call"] = None
        out["ratios_missing"]["jax.tile_call_vs_cutile_call"] = ct_missing
    print(f"JAX: per call of a jitted {n}-element f32 add, bursts of {burst} (block_until_ready "
          f"at the end of each)")
    for name, v in med.items():
        print(f"{name:<40} {v:>9.2f} us")
    for name, why in out["skipped"].items():
        print(f"{name:<40} skipped: {why}")
    for key, v in out["ratios"].items():
        shown = f"{v:.3f}" if v is not None else f"null ({out['ratios_missing'][key]})"
        print(f"{key:<40} {shown}  (target <= 1.0)")
    return out


if __name__ == "__main__":
    main()
