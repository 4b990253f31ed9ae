"""A stand-in for ``torch.cuda.Stream`` on machines without PyTorch: the same class layout as
torch's (a ``torch._C._CudaStreamBase`` base with ``cuda_stream`` and ``device_index``, a
``torch.cuda.streams`` subclass whose ``__cuda_stream__()`` returns ``(0, self.cuda_stream)`` and
whose ``device`` has an ``.index``), in Python. Counts attribute reads, so a test sees which
path tile_py took."""

READS = {"cuda_stream": 0, "device_index": 0, "__cuda_stream__": 0, "device": 0}


class _Device:
    def __init__(self, index):
        self.type = "cuda"
        self.index = index


class _CudaStreamBase:
    def __init__(self, handle, device_index):
        self._handle = handle
        self._device_index = device_index

    @property
    def cuda_stream(self):
        READS["cuda_stream"] += 1
        return self._handle

    @property
    def device_index(self):
        READS["device_index"] += 1
        return self._device_index

    @property
    def device(self):
        READS["device"] += 1
        return _Device(self._device_index)


_CudaStreamBase.__module__ = "torch._C"


def _cuda_stream(self):
    READS["__cuda_stream__"] += 1
    return (0, self.cuda_stream)


_cuda_stream.__module__ = "torch.cuda.streams"


class TorchLikeStream(_CudaStreamBase):
    """``torch.cuda.Stream``'s layout: every ``torch.cuda.current_stream()`` call returns a new
    one of these for the same handle."""

    __cuda_stream__ = _cuda_stream


TorchLikeStream.__module__ = "torch.cuda.streams"


class OverridingStream(TorchLikeStream):
    """A subclass outside torch that overrides ``__cuda_stream__``: not taken for torch's."""

    def __cuda_stream__(self):
        READS["__cuda_stream__"] += 1
        return (0, self._handle + 0x10)


def reset():
    for k in READS:
        READS[k] = 0
