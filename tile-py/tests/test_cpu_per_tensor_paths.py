"""CPU tests of the per-tensor paths made cheaper without changing what they do: the
``__dlpack__`` call passes its keywords without a dict where the interpreter allows it, and the
drain releases each device's group straight from the queue. Each asserts what the producer saw
or what ran, and the deleter count."""

import gc
import time

import pytest

import tile_py
from tile_py import _testing
from tile_py import In
from dlpack_ctypes import Producer, StreamOnlyProducer, kDLCPU, make_capsule

STREAM = 0x1234


def check(params, args, **kw):
    kw.setdefault("stream", STREAM)
    return _testing.check_args(params, args, **kw)


class CallableDlpack:
    """A ``__dlpack__`` that is a callable instance, not a function: sees exactly the positional
    and keyword arguments of the call."""

    def __init__(self, producer):
        self.producer = producer
        self.seen = []

    def __call__(self, *args, **kwargs):
        self.seen.append((args, dict(kwargs)))
        return self.producer._export()


def test_dlpack_gets_stream_and_max_version_as_keywords_only():
    p = Producer()
    p.__dlpack__ = CallableDlpack(p)  # an instance attribute: found before the class's method
    check([In("float32")], (p,))
    (args, kwargs), = p.__dlpack__.seen
    assert args == ()
    assert kwargs == {"stream": STREAM, "max_version": (1, 3)}
    assert type(kwargs["stream"]) is int and type(kwargs["max_version"]) is tuple
    assert p.deleted == 1


def test_keyword_values_survive_the_producer_keeping_them():
    # A producer that keeps the keyword values: they stay alive and unchanged after the call and
    # after later calls (the stream int is shared by one launch's calls; ints are immutable).
    kept = []

    class Keeper(Producer):
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            kept.append((stream, max_version))
            return self._export()

    ps = [Keeper() for _ in range(3)]
    check([In("float32")] * 3, tuple(ps))
    check([In("float32")], (ps[0],), stream=STREAM + 1)
    gc.collect()
    assert kept == [(STREAM, (1, 3))] * 3 + [(STREAM + 1, (1, 3))]
    assert sum(p.deleted for p in ps) == 4


def test_stream_only_producer_is_retried_with_the_stream_keyword_alone():
    p = StreamOnlyProducer()
    check([In("float32")], (p,))
    assert p.calls == [{"stream": STREAM}]
    assert p.deleted == 1


def test_a_producers_own_type_error_is_raised_once_not_retried():
    calls = []

    class Raises(Producer):
        def __dlpack__(self, *, stream=None, max_version=None):
            calls.append(stream)
            raise TypeError("producer's own failure")

    with pytest.raises(TypeError, match="producer's own failure"):
        check([In("float32")], (Raises(),))
    assert calls == [STREAM]


def test_drain_releases_queued_objects_once_each_in_queue_order():
    # One drain releases the whole queue, group by group, straight from it: every release runs
    # once, in the order queued, also when a release queues more.
    done = []

    class Released:
        def __init__(self, i):
            self.i = i

        def __del__(self):
            done.append(self.i)
            if self.i == 5:
                _testing.queue_release(Released(100))  # queued while draining

    for i in range(40):
        _testing.queue_release(Released(i))
    deadline = time.monotonic() + 10  # the release thread drains within a period
    while len(done) < 41 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done[:40] == list(range(40))
    assert done[40:] == [100]


def test_dlpack_reached_through_getattr_is_called_as_the_attribute():
    # A wrapper whose type defines no __dlpack__ and forwards attribute access (`__getattr__`):
    # its __dlpack__ is the attribute its lookup returns, called with the same keywords.
    class Forwarding:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

    p = Producer()
    check([In("float32")], (Forwarding(p),))
    assert p.calls == [{"stream": STREAM, "max_version": (1, 3)}]
    assert p.deleted == 1


def test_a_class_that_loses_its_dlpack_is_then_treated_as_an_object_without_one():
    # The type is first seen with __dlpack__ on it (called by name); once the class no longer
    # has it, an instance is an object without __dlpack__: refused as such, nothing called.
    class Changing(Producer):
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            self.calls.append({"stream": stream})
            return self._export()

    p = Changing()
    check([In("float32")], (p,))
    assert p.calls == [{"stream": STREAM}] and p.deleted == 1
    del Changing.__dlpack__  # Producer's own __dlpack__ is still inherited: called by name
    check([In("float32")], (p,))
    assert p.calls[-1] == {"stream": STREAM, "max_version": (1, 3)} and p.deleted == 2

    class Plain:
        def __dlpack__(self, **kw):
            raise AssertionError("not called once removed")

    q = Plain()
    with pytest.raises(AssertionError):
        check([In("float32")], (q,))
    del Plain.__dlpack__
    with pytest.raises(TypeError, match=r"argument 0: expected a tensor .*__dlpack__ or __cuda_array_interface__"):
        check([In("float32")], (q,))


def test_positional_only_stream_is_retried_positionally_on_the_type_path():
    calls = []

    class PositionalOnly(Producer):
        def __dlpack__(self, stream, /):
            calls.append(stream)
            return self._export()

    p = PositionalOnly()
    check([In("float32")], (p,))
    assert calls == [STREAM] and p.deleted == 1


def test_a_lost_dlpack_is_not_mistaken_for_a_host_producer_refusing_the_stream():
    # Once the class no longer has __dlpack__, its __dlpack_device__ (CPU here) is not asked:
    # the object is one without __dlpack__, converted through __cuda_array_interface__ if it
    # has one, as a class that never had __dlpack__ is.
    class Lost:
        def __dlpack__(self, **kw):
            return Producer().__dlpack__(**kw)

        def __dlpack_device__(self):
            raise AssertionError("__dlpack_device__ must not be asked")

    class WithCai(Lost):
        __cuda_array_interface__ = {
            "shape": (4,), "typestr": "<f4", "data": (0x10000, False), "version": 3,
        }

    p, q = Lost(), WithCai()
    check([In("float32")], (p,))
    check([In("float32")], (q,))
    del Lost.__dlpack__
    with pytest.raises(TypeError, match=r"argument 0: expected a tensor .*__dlpack__ or __cuda_array_interface__"):
        check([In("float32")], (p,))
    check([In("float32")], (q,))  # through its __cuda_array_interface__


def test_a_dlpack_taking_no_argument_at_all_is_refused_as_taking_no_stream():
    class NoArgs:
        __dlpack__ = staticmethod(lambda: make_capsule()[0])

    with pytest.raises(TypeError, match=r"argument 0: .*__dlpack__ takes no stream argument"):
        check([In("float32")], (NoArgs(),))


def test_the_refusal_after_retries_names_what_the_first_call_raised():
    # A producer whose own helper raises a binding-like TypeError: after the retries, the
    # refusal still shows what the first call raised.
    def helper(x):
        return x

    class Buggy(Producer):
        def __dlpack__(self, *, stream=None, max_version=None):
            return helper(stream=stream)

    with pytest.raises(TypeError, match=r"takes no stream argument.*first call, with keywords, raised: .*helper\(\) got an unexpected keyword argument 'stream'"):
        check([In("float32")], (Buggy(),))
