"""CPU regression tests for the reliability review of tile-py (defects D1-D11): panics during
conversion, the ``__dlpack__`` keyword handshake, stream handle signs, error causes and argument
indices, scalar and launch-configuration messages, ``_shutdown`` timeouts, a mutated exchange-API
table."""

import gc
import os
import subprocess
import sys
import textwrap

import pytest

import tile_py
from tile_py import _testing
from tile_py import In, Out, Scalar
from dlpack_ctypes import (
    READ_ONLY,
    LegacyProducer,
    StreamOnlyProducer,
    Producer,
    capsule_name,
    make_capsule,
    make_exchange_producer_type,
)

HERE = os.path.dirname(__file__)
STREAM = 0x1234


def check(params, args, **kw):
    kw.setdefault("stream", STREAM)
    return _testing.check_args(params, args, **kw)


def notes(e):
    return "".join(getattr(e, "__notes__", []))


class CAI:
    BASE = {"shape": (4,), "typestr": "<f4", "data": (0x20000, False), "version": 3,
            "strides": None, "stream": None}

    def __init__(self, **over):
        self.__cuda_array_interface__ = {**self.BASE, **over}

    def __repr__(self):
        return "CAI()"


# ---- D1: a panic while converting still rolls back -------------------------------------------


def test_non_ascii_typestr_is_a_type_error_and_rolls_back_earlier_arguments():
    cap, c = make_capsule()
    p = Producer()
    good = CAI()
    rc = sys.getrefcount(good)
    with pytest.raises(TypeError, match=r"argument 3: unsupported __cuda_array_interface__ typestr"):
        check([In("float32")] * 4, (cap, p, good, CAI(typestr="<\u00e94")))
    gc.collect()
    assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
    assert p.deleted == 1
    assert sys.getrefcount(good) == rc
    for ts in ("\u00e9f4", "<f\u00e9", "<f\u0664"):  # a non-ASCII digit is not a size either
        with pytest.raises(TypeError, match="typestr"):
            check([In("float32")], (CAI(typestr=ts),))
    check([In("float32")], (cap,))  # the caller's capsule is usable again
    del cap
    gc.collect()
    assert c.calls == 1


def _panic_exception_types():
    # pyo3 makes its PanicException type on the first error it fetches; find it by name.
    try:
        check([In("float32")], (1,))
    except TypeError:
        pass
    return [o for o in gc.get_objects()
            if isinstance(o, type) and o.__name__ == "PanicException"
            and o.__module__ == "pyo3_runtime"]


def test_panic_during_conversion_rolls_back_and_raises_runtime_error():
    # A PanicException fetched by pyo3 resumes the panic inside tile_py's conversion: the
    # panic path, reachable from Python.
    types = _panic_exception_types()
    assert types, "pyo3's PanicException type not found"
    seen = False
    for P in types:
        class Panicking(Producer):
            def __dlpack__(self, **kw):
                raise P("boom")

        cap, c = make_capsule()
        p = Producer()
        try:
            check([In("float32")] * 3, (cap, p, Panicking()))
        except RuntimeError as e:
            if "internal error" not in str(e):
                raise
            assert str(e).startswith("argument 2: ")
            seen = True
        except BaseException as e:  # another extension's PanicException: not tile_py's
            if type(e) is not P:
                raise
            continue
        gc.collect()
        assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
        assert p.deleted == 1
        check([In("float32")], (cap,))
    assert seen


# ---- D2: no per-type downgrade of the __dlpack__ keywords ------------------------------------


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


# ---- D11: only argument-binding TypeErrors are retried; positional-only stream ---------------


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


# ---- D3: stream handles must fit a signed 64-bit value ----------------------------------------


@pytest.mark.parametrize("s", [2**63, 2**64 - 2, 2**64 - 1])
def test_stream_handle_at_or_above_2_63_is_refused(s):
    p = Producer()
    with pytest.raises(ValueError, match=str(s)):
        check([In("float32")], (p,), stream=s)
    assert p.calls == [] and p.deleted == 0


def test_cuda_stream_protocol_handle_above_2_63_is_refused():
    class S:
        def __cuda_stream__(self):
            return (0, 2**64 - 1)

    p = Producer()
    with pytest.raises(ValueError, match=str(2**64 - 1)):
        check([In("float32")], (p,), stream=S())
    assert p.calls == [] and p.deleted == 0
    q = Producer()
    check([In("float32")], (q,), stream=2**63 - 1)
    assert q.calls == [{"stream": 2**63 - 1, "max_version": (1, 3)}]


# ---- D4: argument index and cause on every conversion error -----------------------------------


@pytest.mark.parametrize(
    "over, exc, cause",
    [
        (dict(version="3"), ValueError, TypeError),
        (dict(version=2**70), ValueError, OverflowError),
        (dict(typestr=b"<f4"), TypeError, TypeError),
    ],
)
def test_bad_cai_fields_name_the_argument_and_keep_the_cause(over, exc, cause):
    p = Producer()
    with pytest.raises(exc, match=r"^argument 1: __cuda_array_interface__") as e:
        check([In("float32"), In("float32")], (p, CAI(**over)))
    assert isinstance(e.value.__cause__, cause)
    assert p.deleted == 1


def test_raising_attributes_and_float_carry_the_argument_index():
    class CAIProp:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("cai property failed")

    class DlpackProp:
        @property
        def __dlpack__(self):
            raise RuntimeError("__dlpack__ lookup failed")

    class FloatRaises:
        def __float__(self):
            raise KeyError("inner")

    for obj, param, exc in [(CAIProp(), In("float32"), RuntimeError),
                            (DlpackProp(), In("float32"), RuntimeError),
                            (FloatRaises(), Scalar("f32"), KeyError)]:
        p = Producer()
        with pytest.raises(exc) as e:
            check([In("float32"), param], (p, obj))
        assert "argument 1: raised while converting this argument" in notes(e.value)
        assert p.deleted == 1


# ---- D5 / D7: __index__ results and causes; a raising __cuda_stream__ -------------------------


def test_index_returning_non_int_is_a_type_error():
    class IdxStr:
        def __index__(self):
            return "3"

    class IdxFloat:
        def __index__(self):
            return 1.5

    for obj in (IdxStr(), IdxFloat()):
        with pytest.raises(TypeError, match="argument 1: expected an integer") as e:
            check([In("float32"), Scalar("i32")], (Producer(), obj))
        assert isinstance(e.value.__cause__, TypeError)


def test_index_raising_keeps_the_cause():
    class IdxRaise:
        def __index__(self):
            raise KeyError("the real cause")

    with pytest.raises(TypeError, match="argument 1") as e:
        check([In("float32"), Scalar("i32")], (Producer(), IdxRaise()))
    assert isinstance(e.value.__cause__, KeyError)


def test_cuda_stream_property_raising_keeps_the_cause():
    class StreamProp:
        @property
        def __cuda_stream__(self):
            raise RuntimeError("stream lookup failed")

    p = Producer()
    with pytest.raises(TypeError, match="__cuda_stream__") as e:
        check([In("float32")], (p,), stream=StreamProp())
    assert isinstance(e.value.__cause__, RuntimeError)
    assert p.calls == []


# ---- D6: CAI shape / strides beyond int64 are OverflowError ---------------------------------


@pytest.mark.parametrize("over", [dict(shape=(2**63,)), dict(strides=(2**63,)),
                                  dict(strides=(-2**63 - 1,))])
def test_cai_shape_and_strides_beyond_int64_overflow(over):
    p = Producer()
    with pytest.raises(OverflowError, match=r"argument 1: __cuda_array_interface__") as e:
        check([In("float32"), In("float32")], (p, CAI(**over)))
    assert isinstance(e.value.__cause__, OverflowError)
    assert p.deleted == 1


# ---- D8: huge launch-configuration values are quoted as given -------------------------------


def test_huge_grid_block_shared_mem_values_are_quoted_exactly():
    big = 2**200
    with pytest.raises(ValueError, match=rf"grid\[0\] is -{big}, outside 0..=4294967295"):
        tile_py.launch(STREAM, -big, None, (), block=1)
    with pytest.raises(ValueError, match=rf"grid\[0\] is {big}, outside 0..=4294967295"):
        tile_py.launch(STREAM, (big,), None, (), block=1)
    with pytest.raises(ValueError, match=rf"block\[1\] is -{big}, outside"):
        tile_py.launch(STREAM, 1, None, (), block=(1, -big))
    with pytest.raises(ValueError, match=rf"shared_mem is -{big} bytes, below the minimum 0"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=-big)
    with pytest.raises(ValueError, match=rf"shared_mem is {big} bytes, above the limit"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=big)


# ---- D9: _shutdown with an infinite or huge timeout ------------------------------------------


def test_shutdown_with_infinite_or_huge_timeout_does_not_panic():
    # _shutdown stops tile_py for good: run it in a child.
    code = textwrap.dedent("""
        import tile_py
        from tile_py import _testing
        for t in (float("inf"), 1e300, -5.0):
            assert _testing.shutdown(t) == 0, t
        try:
            _testing.shutdown(float("nan"))
        except ValueError:
            print("nan refused")
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "nan refused" in r.stdout and "ok" in r.stdout
    assert "panicked" not in r.stderr


# ---- D10: an exchange-API table mutated after tile cached it ---------------------------------


def test_exchange_api_table_cleared_after_caching_is_a_buffer_error():
    import ctypes

    Ex, log = make_exchange_producer_type()
    a = Ex()
    check([In("float32")], (a,))
    assert log["from_obj"] == 1
    api = Ex._keep[0]
    saved = api.current_work_stream
    ctypes.memset(ctypes.addressof(api) + type(api).current_work_stream.offset, 0, 8)
    try:
        p = Producer()
        with pytest.raises(BufferError, match="argument 1: .*exchange API"):
            check([In("float32"), In("float32")], (p, Ex()))
        assert p.deleted == 1
        assert log["from_obj"] == 1  # nothing exported
    finally:
        api.current_work_stream = saved
