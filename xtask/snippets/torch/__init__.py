"""A stand-in for the few PyTorch calls of the documentation's Python programs, for running them
without a GPU (`cargo xtask test`, against the stub driver `bench/profile/cuda_stub.c`).

Not PyTorch: a "CUDA tensor" here is a NumPy float32 array whose host address is exported
through `__dlpack__` as `kDLCUDA` device 0 memory (the stub driver calls every address device
memory; no kernel ever reads it). The classes live in module `torch_stand_in`, so tile_py takes
its generic `__dlpack__` / `__cuda_stream__` paths, not PyTorch's C exchange API. Every export's
deleter calls are counted (`EXPORTS`), so the runner can check that each was released exactly
once. Nothing here pretends a kernel ran: an output keeps the NaNs it was created with.
"""

import ctypes

import numpy as np

_DLTENSOR_VERSIONED = b"dltensor_versioned"
_F32 = (2, 32, 1)  # kDLFloat, 32 bits, 1 lane
_CUDA = 2  # kDLCUDA


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

# One record per export: [deleter calls, the objects its descriptor points into].
EXPORTS = []


def _export(array):
    record = [0, None]
    shape = (ctypes.c_int64 * 1)(array.shape[0])
    strides = (ctypes.c_int64 * 1)(array.strides[0] // array.itemsize)

    def deleter(_ptr):
        record[0] += 1

    m = _Managed()
    m.major, m.minor = 1, 3
    m.deleter = _DELETER(deleter)
    t = m.dl_tensor
    t.data = array.ctypes.data
    t.device_type, t.device_id = _CUDA, 0
    t.ndim = 1
    t.code, t.bits, t.lanes = _F32
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    record[1] = (m, shape, strides, array)  # kept for the process: the descriptor points here
    EXPORTS.append(record)
    # No capsule destructor: tile_py consumes every capsule it is handed.
    return _api.PyCapsule_New(ctypes.addressof(m), _DLTENSOR_VERSIONED, None)


class Tensor:
    """A one-dimensional float32 "CUDA tensor" (see the module's docstring)."""

    def __init__(self, array):
        self._a = array

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if stream is None:
            raise TypeError("the stand-in expects the launch stream")
        return _export(self._a)

    def __dlpack_device__(self):
        return (_CUDA, 0)

    def __getitem__(self, key):
        return Tensor(self._a[key])

    def __add__(self, other):
        return Tensor(self._a + other._a)

    def __mul__(self, k):
        return Tensor(self._a * k)

    __rmul__ = __mul__

    def stride(self, dim):
        if dim != 0:
            raise IndexError(dim)
        return self._a.strides[0] // self._a.itemsize

    def numel(self):
        return self._a.size


Tensor.__module__ = "torch_stand_in"

_rng = np.random.default_rng(0)


def _cuda_only(device):
    if device != "cuda":
        raise ValueError(f"the stand-in makes CUDA tensors only, not {device!r}")


def randn(n, *, device):
    _cuda_only(device)
    return Tensor(_rng.standard_normal(n, dtype=np.float32))


def empty(n, *, device):
    _cuda_only(device)
    return Tensor(np.full(n, np.nan, dtype=np.float32))  # poisoned: never equal to anything


def equal(x, y):
    return x._a.shape == y._a.shape and bool(np.array_equal(x._a, y._a))


class _Stream:
    def __cuda_stream__(self):
        return (0, 0x5000)  # a stream handle the stub driver accepts


_Stream.__module__ = "torch_stand_in"


class cuda:  # noqa: N801 - the module attribute `torch.cuda`
    @staticmethod
    def current_stream():
        return _Stream()
