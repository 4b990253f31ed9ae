"""Hand-built DLPack capsules for tests that run without a GPU.

``make_capsule`` builds a ``DLManagedTensor`` or ``DLManagedTensorVersioned`` in ctypes memory,
with a deleter that counts its calls, wrapped in a capsule whose destructor calls the deleter when
the capsule was never consumed (as NumPy's and PyTorch's capsules do). The data pointer is fake:
nothing here reads tensor memory, only the descriptor.
"""

import ctypes
import threading

c_void_p = ctypes.c_void_p


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


DELETER = ctypes.CFUNCTYPE(None, c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", c_void_p), ("deleter", DELETER)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


assert ctypes.sizeof(DLTensor) == 48
assert ctypes.sizeof(DLManagedTensor) == 64
assert ctypes.sizeof(DLManagedTensorVersioned) == 80

# DLPack codes
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 4, 5, 6
kDLFloat4_e2m1fn = 17
kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
READ_ONLY = 1

F32 = (kDLFloat, 32, 1)
F64 = (kDLFloat, 64, 1)
I32 = (kDLInt, 32, 1)
BF16 = (kDLBfloat, 16, 1)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [c_void_p, ctypes.c_char_p, c_void_p]
_api.PyCapsule_GetName.restype = ctypes.c_char_p
_api.PyCapsule_GetName.argtypes = [ctypes.py_object]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = c_void_p
_api.PyCapsule_GetPointer.argtypes = [c_void_p, ctypes.c_char_p]

# Capsule names must outlive the capsules: module-level bytes.
_NAMES = {
    "dltensor": b"dltensor",
    "dltensor_versioned": b"dltensor_versioned",
}

# Keeps each descriptor's memory alive until its deleter runs.
_LIVE = {}
_LOCK = threading.Lock()


class Counter:
    """Counts deleter calls of one tensor."""

    def __init__(self):
        self.calls = 0
        self.threads = []

    def __repr__(self):
        return f"Counter(calls={self.calls})"


def _make_deleter(counter, key):
    def deleter(_ptr):
        counter.calls += 1
        counter.threads.append(threading.get_ident())
        # The descriptor memory stays in _LIVE: freeing the ctypes callback object while it
        # runs would be unsafe, and tests are short-lived.

    return DELETER(deleter)


@ctypes.CFUNCTYPE(None, c_void_p)
def _capsule_destructor(cap):
    # Called as the capsule dies: if it was never consumed, the producer still owns the tensor
    # and must delete it. Only the name decides.
    for name, versioned in ((b"dltensor", False), (b"dltensor_versioned", True)):
        if _api.PyCapsule_IsValid(cap, name):
            ptr = _api.PyCapsule_GetPointer(cap, name)
            if versioned:
                m = DLManagedTensorVersioned.from_address(ptr)
            else:
                m = DLManagedTensor.from_address(ptr)
            if m.deleter:
                m.deleter(ptr)
            return


@ctypes.CFUNCTYPE(None, c_void_p)
def _unconditional_destructor(cap):
    # The destructor of CuPy's capsules before dmlc/dlpack#51 (pytorch/pytorch#9260): it calls
    # the deleter whatever the capsule's name, consumed (``used_*``) or not.
    for name, versioned in (
        (b"dltensor", False),
        (b"used_dltensor", False),
        (b"dltensor_versioned", True),
        (b"used_dltensor_versioned", True),
    ):
        if _api.PyCapsule_IsValid(cap, name):
            ptr = _api.PyCapsule_GetPointer(cap, name)
            kind = DLManagedTensorVersioned if versioned else DLManagedTensor
            m = kind.from_address(ptr)
            if m.deleter:
                m.deleter(ptr)
            return


def make_capsule(name=None, destructor=True, **descriptor):
    """Returns ``(capsule, counter)``; ``descriptor`` takes the keywords of ``make_managed``.
    ``destructor``: True for the DLPack capsule destructor (the deleter runs only while the
    capsule is unconsumed), False for none, ``"unconditional"`` for one that runs it whatever
    the name."""
    key, counter, default_name = make_managed(**descriptor)
    cname = _NAMES.get(name or default_name, None)
    if cname is None:
        cname = (name or default_name).encode()
        _NAMES[name] = cname
    if destructor == "unconditional":
        dtor = ctypes.cast(_unconditional_destructor, c_void_p)
    else:
        dtor = ctypes.cast(_capsule_destructor, c_void_p) if destructor else None
    cap = _api.PyCapsule_New(key, cname, dtor)
    return cap, counter


def make_managed(
    shape=(4,),
    dtype=F32,
    device=(kDLCUDA, 0),
    data=0x10000,
    strides=None,
    byte_offset=0,
    versioned=True,
    version=(1, 3),
    flags=0,
    ndim=None,
    null_shape=False,
):
    """A managed tensor without a capsule: returns ``(address, counter, capsule_name)``."""
    counter = Counter()
    shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(len(shape), 1))(*strides) if strides is not None else None
    t = DLTensor()
    t.data = data
    t.device = DLDevice(*device)
    t.ndim = len(shape) if ndim is None else ndim
    t.dtype = DLDataType(*dtype)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)) if not null_shape else None
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64)) if strides_arr is not None else None
    t.byte_offset = byte_offset
    if versioned:
        m = DLManagedTensorVersioned()
        m.version = DLPackVersion(*version)
        m.flags = flags
        m.dl_tensor = t
        default_name = "dltensor_versioned"
    else:
        m = DLManagedTensor()
        m.dl_tensor = t
        default_name = "dltensor"
    key = ctypes.addressof(m)
    deleter = _make_deleter(counter, key)
    m.deleter = deleter
    with _LOCK:
        _LIVE[key] = (m, shape_arr, strides_arr, deleter)
    return key, counter, default_name


def capsule_name(cap):
    return _api.PyCapsule_GetName(cap).decode()


class Producer:
    """A CUDA producer with a modern ``__dlpack__``; records the keywords of every call and
    hands out a fresh capsule each time, counting deleter calls of all of them."""

    def __init__(self, device=(kDLCUDA, 0), **capsule_kwargs):
        self.device = device
        self.kwargs = dict(capsule_kwargs)
        self.kwargs.setdefault("device", device)
        self.calls = []
        self.counters = []

    @property
    def deleted(self):
        return sum(c.calls for c in self.counters)

    def __dlpack_device__(self):
        return self.device

    def _export(self):
        cap, counter = make_capsule(**self.kwargs)
        self.counters.append(counter)
        return cap

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        return self._export()


class StreamOnlyProducer(Producer):
    """A pre-DLPack-1.0 producer: accepts ``stream`` but not ``max_version``."""

    def __dlpack__(self, stream=None):
        self.calls.append({"stream": stream})
        return self._export()


class LegacyProducer(Producer):
    """A producer whose ``__dlpack__`` takes no arguments at all."""

    def __dlpack__(self):
        self.calls.append({})
        return self._export()


# ---- a fake producer type with the DLPack C exchange API (DLPack 1.3) ----------------------------


class DLPackExchangeAPIHeader(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("prev_api", c_void_p)]


FROM_OBJ = ctypes.CFUNCTYPE(ctypes.c_int, c_void_p, ctypes.POINTER(c_void_p))
CURRENT_STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(c_void_p))


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("header", DLPackExchangeAPIHeader),
        ("managed_tensor_allocator", c_void_p),
        ("managed_tensor_from_py_object_no_sync", FROM_OBJ),
        ("managed_tensor_to_py_object_no_sync", c_void_p),
        ("dltensor_from_py_object_no_sync", c_void_p),
        ("current_work_stream", CURRENT_STREAM),
    ]


assert ctypes.sizeof(DLPackExchangeAPI) == 56


def make_exchange_producer_type(current_stream=0x777):
    """A class whose instances export through ``__dlpack_c_exchange_api__``; ``__dlpack__``
    raises, so a test sees which path was taken. Instances take capsule keyword arguments."""
    log = {"from_obj": 0, "current_work_stream": [], "dlpack": 0}

    def from_obj(obj_ptr, out):
        obj = ctypes.cast(obj_ptr, ctypes.py_object).value
        key, counter, _ = make_managed(**obj.kwargs)
        obj.counters.append(counter)
        log["from_obj"] += 1
        out[0] = key
        return 0

    def current(device_type, device_id, out):
        log["current_work_stream"].append((device_type, device_id))
        out[0] = current_stream
        return 0

    api = DLPackExchangeAPI()
    api.header.version = DLPackVersion(1, 3)
    f1, f2 = FROM_OBJ(from_obj), CURRENT_STREAM(current)
    api.managed_tensor_from_py_object_no_sync = f1
    api.current_work_stream = f2
    capsule = _api.PyCapsule_New(ctypes.addressof(api), b"dlpack_exchange_api", None)

    class ExchangeProducer:
        __dlpack_c_exchange_api__ = capsule
        _keep = (api, f1, f2)

        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.counters = []

        @property
        def deleted(self):
            return sum(c.calls for c in self.counters)

        def __dlpack__(self, **kw):
            log["dlpack"] += 1
            raise AssertionError("__dlpack__ must not be called when the C exchange API exists")

    return ExchangeProducer, log
