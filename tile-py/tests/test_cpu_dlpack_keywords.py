"""The ``__dlpack__`` keyword handshake: decided per call, never downgraded per type; only a
binding ``TypeError`` caused by tile_py's own keywords is retried; a positional-only stream is
still given the stream."""

import pytest

from tile_py import In, Out
from dlpack_ctypes import READ_ONLY, LegacyProducer, StreamOnlyProducer, Producer, make_capsule

from cpu_checks import STREAM, check, notes


# ---- no per-type downgrade of the __dlpack__ keywords ------------------------------------


class FaithfulProducer(Producer):
    """A versioned capsule (with its flags) only when max_version >= (1, 0) is passed."""

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        kw = dict(self.kwargs)
        if not (max_version and max_version[0] >= 1):
            kw["versioned"] = False
            kw.pop("flags", None)
        cap, c = make_capsule(**kw)
        self.counters.append(c)
        return cap


class Proxy:
    def __init__(self, inner):
        self.inner = inner

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()

    def __dlpack__(self, *a, **kw):
        return self.inner.__dlpack__(*a, **kw)


def test_old_instance_does_not_downgrade_later_instances_of_its_type():
    class P(Proxy):
        pass

    old = StreamOnlyProducer(versioned=False)
    check([In("float32")], (P(old),))
    assert old.calls == [{"stream": STREAM}] and old.deleted == 1
    ro = FaithfulProducer(flags=READ_ONLY)
    with pytest.raises(ValueError, match="read-only"):
        check([Out("float32")], (P(ro),))
    assert ro.calls == [{"stream": STREAM, "max_version": (1, 3)}] and ro.deleted == 1
    m = FaithfulProducer()
    check([In("float32")], (P(m),), stream=0xABC)
    assert m.calls == [{"stream": 0xABC, "max_version": (1, 3)}]
    # And the old one still works after the modern ones.
    old2 = StreamOnlyProducer(versioned=False)
    check([In("float32")], (P(old2),))
    assert old2.calls == [{"stream": STREAM}] and old2.deleted == 1
    # A producer whose __dlpack__ takes no stream is refused, behind a proxy too (row 19).
    legacy = LegacyProducer(versioned=False)
    with pytest.raises(TypeError, match="takes no stream argument"):
        check([In("float32")], (P(legacy),))
    assert legacy.calls == [] and legacy.deleted == 0


def test_modern_producer_is_one_call():
    class Counted(Producer):
        n = 0

        def __dlpack__(self, **kw):
            type(self).n += 1
            return super().__dlpack__(**kw)

    for _ in range(3):
        before = Counted.n
        check([In("float32")], (Counted(),))
        assert Counted.n - before == 1


# ---- only argument-binding TypeErrors are retried; positional-only stream ---------------


def test_producer_type_error_is_not_retried():
    class Broken(Producer):
        n = 0

        def __dlpack__(self, **kw):
            type(self).n += 1
            raise TypeError("bad keyword in my internal config")

    with pytest.raises(TypeError, match="bad keyword in my internal config") as e:
        check([In("float32")], (Broken(),))
    assert Broken.n == 1
    assert "argument 0" in notes(e.value)


def test_positional_only_stream_gets_the_stream():
    class PosOnly(Producer):
        def __dlpack__(self, stream=None, /):
            self.calls.append({"stream": stream})
            return self._export()

    p = PosOnly()
    check([In("float32")], (p,))
    assert p.calls == [{"stream": STREAM}] and p.deleted == 1
