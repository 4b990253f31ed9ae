"""CPU tests of the caches on tile_py's launch path (they must never change a result): the
per-thread stream-object cache, the ``__dlpack__`` keyword retries (not cached per type), the
per-type exchange-API cache, and the scalar fast path."""

import gc

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, Scalar
from dlpack_ctypes import Producer, kDLCUDA, make_exchange_producer_type
import fake_torch_stream as fts


def check(params, args, **kw):
    kw.setdefault("stream", 0x1234)
    return _testing.check_args(params, args, **kw)


class CudaStream:
    def __init__(self, handle, device=0):
        self.handle = handle
        self.device_id = device
        self.asked = 0

    def __cuda_stream__(self):
        self.asked += 1
        return (0, self.handle)


# ---- stream objects ------------------------------------------------------------------------------


def test_same_stream_object_gives_its_handle_every_time():
    # Without a launch no stream is cached, so each check parses the object again (the identity
    # cache remembers only objects that a cached stream keeps alive: see test_gpu_streams.py).
    s = CudaStream(0xABC0)
    for _ in range(5):
        p = Producer()
        check([In("float32")], (p,), stream=s)
        assert p.calls == [{"stream": 0xABC0, "max_version": (1, 3)}]
    assert s.asked == 5


def test_stream_objects_with_reused_ids_never_see_a_stale_handle():
    # Fresh objects, each dropped after use: were the cache keyed by a bare id(), a new object
    # at a freed address would be handed the old handle. The cache holds the object it caches,
    # so an address can only repeat after the entry was replaced.
    for i in range(200):
        h = 0x10000 + 0x100 * i
        s = CudaStream(h)
        p = Producer()
        check([In("float32")], (p,), stream=s)
        assert p.calls == [{"stream": h, "max_version": (1, 3)}]
        assert s.asked == 1
        del s
        gc.collect()

def test_alternating_stream_objects_and_ints():
    a, b = CudaStream(0xA000), CudaStream(0xB000)
    for s, seen in [(a, 0xA000), (b, 0xB000), (0x1234, 0x1234), (a, 0xA000), (1, 1), (b, 0xB000)]:
        p = Producer()
        check([In("float32")], (p,), stream=s)
        assert p.calls[0]["stream"] == seen


# ---- torch stream types: a new object per call (torch.cuda.current_stream()) ---------------------


def _seen(stream, device=0):
    p = Producer(device=(kDLCUDA, device))
    check([In("float32")], (p,), stream=stream)
    assert p.deleted == 1
    return p.calls[0]["stream"]


def test_torch_stream_objects_are_read_from_two_attributes():
    _seen(fts.TorchLikeStream(0xD000, 0))  # the type is learnt (parsed in full once)
    fts.reset()
    for _ in range(4):
        assert _seen(fts.TorchLikeStream(0xD000, 0)) == 0xD000
    # Each new object: its handle and device attributes, no __cuda_stream__() call, no
    # torch.device made.
    assert fts.READS == {"cuda_stream": 4, "device_index": 4, "__cuda_stream__": 0, "device": 0}


@pytest.mark.parametrize("handle, seen", [(0, 1), (1, 1), (2, 1), (0xD100, 0xD100)])
def test_torch_stream_handle_values(handle, seen):
    _seen(fts.TorchLikeStream(0xD000, 0))
    assert _seen(fts.TorchLikeStream(handle, 0)) == seen  # the legacy default stream is 1, never 0; 2 is offered as 1


def test_torch_stream_same_handle_other_device():
    # A handle freed and reused by a stream of another device: the device is read every time.
    assert _seen(fts.TorchLikeStream(0xD200, 0), device=0) == 0xD200
    assert _seen(fts.TorchLikeStream(0xD200, 1), device=1) == 0xD200
    p = Producer(device=(kDLCUDA, 0))
    with pytest.raises(ValueError, match=r"tensor is on cuda:0, but the launch stream is on cuda:1"):
        check([In("float32")], (p,), stream=fts.TorchLikeStream(0xD200, 1))


def test_torch_stream_sync_false_sends_minus_one():
    s = fts.TorchLikeStream(0xD300, 0)
    p = Producer()
    check([In("float32")], (p,), stream=s, sync=False)
    p2 = Producer()
    check([In("float32")], (p2,), stream=fts.TorchLikeStream(0xD300, 0), sync=False)
    assert p.calls[0]["stream"] == p2.calls[0]["stream"] == -1


def test_subclass_overriding_cuda_stream_is_parsed_in_full():
    for i in range(3):
        fts.reset()
        assert _seen(fts.OverridingStream(0xE000, 0)) == 0xE010  # its own __cuda_stream__
        assert fts.READS["__cuda_stream__"] == 1


def test_cached_stream_object_sync_false_still_sends_minus_one():
    s = CudaStream(0xC000)
    check([In("float32")], (Producer(),), stream=s)
    p = Producer()
    check([In("float32")], (p,), stream=s, sync=False)
    assert p.calls[0]["stream"] == -1


def test_stream_object_error_is_not_cached():
    class Bad:
        def __cuda_stream__(self):
            raise RuntimeError("no stream")

    b = Bad()
    for _ in range(2):
        with pytest.raises(RuntimeError, match="no stream"):
            check([], (), stream=b)


# ---- the __dlpack__ keyword retries --------------------------------------------------------------


class Counting(Producer):
    """Counts every call to ``__dlpack__``, including the ones rejected for their keywords."""

    attempts = 0


def make_stream_only_type():
    class StreamOnly(Counting):
        def __dlpack__(self, stream=None):
            type(self).attempts += 1
            self.calls.append({"stream": stream})
            return self._export()

    # Keyword TypeErrors happen before the body runs: count them through a wrapper.
    real = StreamOnly.__dlpack__

    def __dlpack__(self, **kw):
        type(self).attempts += 1
        return real(self, **kw)

    StreamOnly.__dlpack__ = __dlpack__
    StreamOnly.attempts = 0
    return StreamOnly


def test_keyword_retry_happens_per_call_never_cached_per_type():
    # What one instance accepted says nothing about the next (review D2): every conversion
    # offers all keywords first, and a stream-only producer always gets its stream.
    T = make_stream_only_type()
    for _ in range(4):
        p = T()
        before = T.attempts
        check([In("float32")], (p,))
        assert p.calls == [{"stream": 0x1234}] and p.deleted == 1
        # The rejected full-keyword try (wrapper only), then the accepted one (wrapper + body).
        assert T.attempts - before == 3


def test_type_whose_instances_differ_still_works():
    class Mixed(Producer):
        def __init__(self, modern, **kw):
            super().__init__(**kw)
            self.modern = modern

        def __dlpack__(self, **kw):
            if not self.modern and "max_version" in kw:
                raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
            self.calls.append(dict(kw))
            return self._export()

    m1, old, m2 = Mixed(True), Mixed(False), Mixed(True)
    for p in (m1, old, m2):
        check([In("float32")], (p,))
        assert p.deleted == 1
    assert m1.calls == [{"stream": 0x1234, "max_version": (1, 3)}]
    assert old.calls == [{"stream": 0x1234}]
    # Once instances were seen to differ, every call offers max_version again.
    assert m2.calls == [{"stream": 0x1234, "max_version": (1, 3)}]
    old2 = Mixed(False)
    check([In("float32")], (old2,))
    assert old2.calls == [{"stream": 0x1234}] and old2.deleted == 1


def test_internal_type_error_is_not_mistaken_for_a_keyword_rejection():
    class Broken(Producer):
        def __dlpack__(self, **kw):
            raise TypeError("something else went wrong")

    for _ in range(2):
        with pytest.raises(TypeError, match="something else went wrong") as e:
            check([In("float32")], (Broken(),))
        assert "argument 0" in "".join(getattr(e.value, "__notes__", []))
    # A modern instance of an unrelated type is unaffected.
    p = Producer()
    check([In("float32")], (p,))
    assert p.calls == [{"stream": 0x1234, "max_version": (1, 3)}]


# ---- the exchange-API type cache -----------------------------------------------------------------


def test_exchange_api_cache_switches_between_types():
    Ex, log = make_exchange_producer_type()
    Ex2, log2 = make_exchange_producer_type()
    args = (Ex(), Producer(), Ex2(), Ex(), Producer(), Ex2())
    check([In("float32")] * len(args), args)
    assert log["from_obj"] == 2 and log2["from_obj"] == 2
    assert log["dlpack"] == log2["dlpack"] == 0
    assert all(a.deleted == 1 for a in args)
    assert args[1].calls == [{"stream": 0x1234, "max_version": (1, 3)}]


def test_exchange_api_cost_exports_and_deletes_each_time_and_refuses_other_types():
    # The benchmark's bound on the producer's side: every export it times is released by its
    # own deleter at once, and current_work_stream is asked for the tensor's device.
    Ex, log = make_exchange_producer_type()
    x = Ex()
    export_ns, stream_ns = _testing.exchange_api_cost(x, 5)
    assert export_ns > 0 and stream_ns > 0
    assert log["from_obj"] == 5 and len(x.counters) == 5 and x.deleted == 5
    assert log["current_work_stream"] == [(kDLCUDA, 0)] * 5
    with pytest.raises(TypeError, match="no usable DLPack C exchange API"):
        _testing.exchange_api_cost(Producer())


# ---- scalars -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ty, value, exc",
    [
        ("u64", 2**64 - 1, None),
        ("u64", 2**64, OverflowError),
        ("u64", -1, OverflowError),
        ("i8", -128, None),
        ("i8", 128, OverflowError),
        ("i32", True, TypeError),
        ("i32", 1.0, TypeError),
        ("f32", 1, None),
        ("f32", 1e39, OverflowError),
        ("f32", 3.4028235e38, None),  # a double above FLT_MAX that rounds to it
        ("f32", 3.4028236e38, OverflowError),  # rounds beyond FLT_MAX
        ("f32", float("inf"), None),
        ("f64", 1.5, None),
        ("bool", 1, TypeError),
        ("bool", False, None),
    ],
)
def test_scalar_fast_path_agrees_with_the_checks(ty, value, exc):
    if exc is None:
        check([Scalar(ty)], (value,))
    else:
        with pytest.raises(exc, match="argument 0"):
            check([Scalar(ty)], (value,))


class IntSub(int):
    pass


def test_int_subclass_takes_the_general_path():
    check([Scalar("u32")], (IntSub(7),))
    with pytest.raises(OverflowError):
        check([Scalar("u8")], (IntSub(300),))


# ---- torch's device-generic streams (torch.Stream) -------------------------------------------


class _FakeTorchModules:
    """``torch.Stream`` and ``torch.cuda.Stream`` as far as tile_py uses them, installed in
    ``sys.modules`` as ``torch`` and ``torch.cuda`` (only where PyTorch is not installed)."""

    def __init__(self):
        import types

        made = []

        class CudaStreamFromId(fts.TorchLikeStream):
            def __init__(self, stream_id=0, device_index=0, device_type=0):
                made.append((stream_id, device_index, device_type))
                super().__init__(0x7000 + stream_id, device_index)

        CudaStreamFromId.__module__ = "torch.cuda.streams"

        class _Device:
            def __init__(self, kind, index):
                self.type, self.index = kind, index

        class Stream:
            def __init__(self, stream_id, device_index, device_type, kind="cuda"):
                self.stream_id, self.device_index, self.device_type = stream_id, device_index, device_type
                self.device = _Device(kind, device_index)

        Stream.__module__ = "torch"
        torch = types.ModuleType("torch")
        cuda = types.ModuleType("torch.cuda")
        cuda.Stream = CudaStreamFromId
        torch.cuda = cuda
        torch.Stream = Stream
        self.modules = {"torch": torch, "torch.cuda": cuda}
        self.made = made
        self.Stream = Stream


@pytest.fixture
def fake_torch(monkeypatch):
    import sys

    if "torch" in sys.modules or __import__("importlib").util.find_spec("torch") is not None:
        pytest.skip("PyTorch is installed: its own torch.Stream is tested on the GPU")
    f = _FakeTorchModules()
    for name, m in f.modules.items():
        monkeypatch.setitem(sys.modules, name, m)
    return f


def test_torch_generic_stream_is_the_cuda_stream_of_its_id(fake_torch):
    s = fake_torch.Stream(stream_id=0x21, device_index=0, device_type=1)
    assert _seen(s) == 0x7021
    assert fake_torch.made == [(0x21, 0, 1)]


def test_torch_generic_stream_of_another_device_type_is_refused(fake_torch):
    s = fake_torch.Stream(stream_id=3, device_index=0, device_type=0, kind="cpu")
    p = Producer()
    with pytest.raises(ValueError, match=r'torch.Stream of device type "cpu".*CUDA streams only'):
        check([In("float32")], (p,), stream=s)
    assert p.calls == [] and p.deleted == 0


# ---- __cuda_stream__ values that are not handles --------------------------------------------


@pytest.mark.parametrize("value", [(0, True), (0, False)])
def test_cuda_stream_bool_handle_is_refused(value):
    s = CudaStream(0)
    s.__cuda_stream__ = lambda: value
    p = Producer()
    with pytest.raises(TypeError, match=r"__cuda_stream__ returned \(0, (True|False)\).*the handle must be an int, got (True|False)"):
        check([In("float32")], (p,), stream=s)
    assert p.calls == [] and p.deleted == 0


def test_bool_stream_is_refused():
    p = Producer()
    with pytest.raises(TypeError, match="unsupported stream True"):
        check([In("float32")], (p,), stream=True)
    assert p.calls == [] and p.deleted == 0


def test_a_types_exchange_api_table_is_read_once_and_kept():
    # DLPack requires the table to live as long as the process: tile_py reads it at the type's
    # first tensor and keeps it, so a later change of the attribute is not seen (documented).
    Ex, log = make_exchange_producer_type()
    x = Ex()
    check([In("float32")], (x,))
    Ex.__dlpack_c_exchange_api__ = None
    check([In("float32")], (x,))
    assert log["from_obj"] == 2 and log["dlpack"] == 0 and x.deleted == 2
