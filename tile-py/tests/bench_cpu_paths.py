"""CPU timings of tile_py's argument paths, no GPU needed: the generic ``__dlpack__`` handshake
and the stream-object parse, through ``_testing.check_args`` (the same conversion as
``tile_py.launch``, without the launch).

    python tile-py/tests/bench_cpu_paths.py [calls]

Not a test (pytest does not collect it). Every figure is the median of 5 runs, in microseconds
per call. ``check_args`` parses its parameter list on every call, so compare rows with each
other (``tile_py adds`` subtracts the producer's own cost and the 1-scalar baseline), not with
``tile_py.launch`` timings.
"""

import ctypes
import statistics
import sys
import time

import tile_py
from tile_py import _testing
from tile_py import In, Out, Scalar

from dlpack_ctypes import F32, kDLCUDA, make_managed

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_VERSIONED = b"dltensor_versioned"


class CudaProducer:
    """A CUDA producer written in Python, shaped like torch's: ``__dlpack_device__`` is a Python
    method, ``__dlpack__`` takes keywords and returns a fresh capsule for one descriptor whose
    deleter is null (the producer keeps ownership, as DLPack allows), so a call costs one ctypes
    ``PyCapsule_New``."""

    def __init__(self):
        self._key, _, _ = make_managed(shape=(4,), dtype=F32, device=(kDLCUDA, 0))
        ctypes.c_void_p.from_address(self._key + 16).value = None  # deleter: null
        self.calls = 0

    def __dlpack_device__(self):
        return (kDLCUDA, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return _new_capsule(self._key, _VERSIONED, None)


# A class of this name and module stands in for `torch._C.TensorBase`: tile_py then makes the
# checks it makes for every PyTorch tensor (conjugate bit, negative bit, and requires_grad for an
# output), here through C-level callables, as torch's own methods are.
_TensorBase = type("TensorBase", (), {"__module__": "torch._C"})


class TorchLikeProducer(_TensorBase, CudaProducer):
    is_conj = False.__bool__
    is_neg = False.__bool__
    requires_grad = False


class FakeDevice:
    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index


class ProtocolStream:
    """A stream object with the CUDA stream protocol (``__cuda_stream__``) and ``device.index``,
    as cuda.core and torch>=2.8 streams have; each instance is a new Python object, as
    ``torch.cuda.current_stream()`` returns."""

    def __init__(self, handle, device=0):
        self.handle = handle
        self.device = FakeDevice(device)

    def __cuda_stream__(self):
        return (0, self.handle)


def per_call_us(fn, calls):
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def main():
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    check = _testing.check_args
    stream = 0x1234
    ps = [CudaProducer() for _ in range(3)]
    params3 = [In("f32"), In("f32"), Out("f32"), Scalar("u64")]
    args3 = (ps[0], ps[1], ps[2], 4096)
    params1 = [Scalar("u64")]
    rows = {}

    rows["baseline: 1 scalar, int stream"] = per_call_us(lambda: check(params1, (4096,), stream=stream), calls)
    rows["3 Python CUDA producers + 1 scalar"] = per_call_us(lambda: check(params3, args3, stream=stream), calls)

    def producer_only():
        for p in ps:
            p.__dlpack__(stream=stream, max_version=(1, 3))

    rows["3 x __dlpack__(stream=..., max_version=...) alone"] = per_call_us(producer_only, calls)
    rows["3 x __dlpack_device__() alone"] = per_call_us(lambda: [p.__dlpack_device__() for p in ps], calls)

    same = ProtocolStream(0x5000)
    rows["stream: same __cuda_stream__ object"] = per_call_us(lambda: check(params1, (4096,), stream=same), calls)
    pool = [ProtocolStream(0x5000) for _ in range(2)]
    i = [0]

    def alternating():
        i[0] ^= 1
        check(params1, (4096,), stream=pool[i[0]])

    rows["stream: 2 alternating __cuda_stream__ objects"] = per_call_us(alternating, calls)

    try:
        from fake_torch_stream import TorchLikeStream
    except ImportError:
        TorchLikeStream = None
    if TorchLikeStream is not None:
        tpool = [TorchLikeStream(0x6000, 0) for _ in range(2)]

        def torch_alternating():
            i[0] ^= 1
            check(params1, (4096,), stream=tpool[i[0]])

        rows["stream: 2 alternating torch-like Stream objects"] = per_call_us(torch_alternating, calls)

    outs8 = [Out("f32")] * 8
    plain8 = tuple(CudaProducer() for _ in range(8))
    torch8 = tuple(TorchLikeProducer() for _ in range(8))
    rows["8 Python CUDA producers as Out"] = per_call_us(lambda: check(outs8, plain8, stream=stream), calls)
    rows["8 torch-like producers as Out (+ torch checks)"] = per_call_us(lambda: check(outs8, torch8, stream=stream), calls)

    base = rows["baseline: 1 scalar, int stream"]
    for name, v in rows.items():
        print(f"{name:<52} {v:7.3f} us")
    added = rows["3 Python CUDA producers + 1 scalar"] - base - rows["3 x __dlpack__(stream=..., max_version=...) alone"]
    print(f"{'tile_py adds for 3 producers (row 2 - row 1 - row 3)':<52} {added:7.3f} us")
    checks = (rows["8 torch-like producers as Out (+ torch checks)"] - rows["8 Python CUDA producers as Out"]) / 8
    print(f"{'torch checks per Out tensor (is_conj, is_neg, requires_grad)':<52} {checks * 1000:7.0f} ns")


if __name__ == "__main__":
    main()
