"""Conversion errors name the argument and keep what the user's object raised as their cause:
``__cuda_array_interface__`` fields, raising attributes and ``__float__``, ``__index__``
results, a raising ``__cuda_stream__``, sizes beyond int64."""

import pytest

import tile_py
from tile_py import In, Scalar
from dlpack_ctypes import Producer

from cpu_checks import CAI, STREAM, check, notes


# ---- argument index and cause on every conversion error -----------------------------------


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


# ---- __index__ results and causes; a raising __cuda_stream__ -------------------------


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


def test_index_raising_keeps_its_type():
    class IdxRaise:
        def __index__(self):
            raise KeyError("the real cause")

    with pytest.raises(KeyError, match="the real cause") as e:
        check([In("float32"), Scalar("i32")], (Producer(), IdxRaise()))
    assert e.value.__notes__ == ["argument 1: raised while converting this argument"]


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


# ---- CAI shape / strides beyond int64 are OverflowError ---------------------------------


@pytest.mark.parametrize("over", [dict(shape=(2**63,)), dict(strides=(2**63,)),
                                  dict(strides=(-2**63 - 1,))])
def test_cai_shape_and_strides_beyond_int64_overflow(over):
    p = Producer()
    with pytest.raises(OverflowError, match=r"argument 1: __cuda_array_interface__") as e:
        check([In("float32"), In("float32")], (p, CAI(**over)))
    assert isinstance(e.value.__cause__, OverflowError)
    assert p.deleted == 1


# ---- one rule for every conversion hook: the user's exception keeps its object --------------


class FloatRaises:
    def __init__(self, exc):
        self.exc = exc

    def __float__(self):
        raise self.exc


class IndexRaises:
    def __init__(self, exc):
        self.exc = exc

    def __index__(self):
        raise self.exc


@pytest.mark.parametrize("ty, cls", [("f32", FloatRaises), ("f64", FloatRaises),
                                     ("i32", IndexRaises), ("u64", IndexRaises)])
@pytest.mark.parametrize("make", [lambda: OverflowError("mine"), lambda: ValueError("mine"),
                                  lambda: LookupError("mine")])
def test_a_scalar_hook_raising_keeps_the_users_exception_even_an_overflow(ty, cls, make):
    exc = make()
    with pytest.raises(type(exc)) as e:
        check([Scalar("u8"), Scalar(ty)], (1, cls(exc)))
    assert e.value is exc
    assert e.value.__notes__ == ["argument 1: raised while converting this argument"]


def test_a_float_that_converts_but_does_not_fit_gets_tile_pys_overflow_error():
    class Big:
        def __float__(self):
            return 1e300

    for obj, ty in ((Big(), "f32"), (10**400, "f64"), (10**400, "f32")):
        with pytest.raises(OverflowError, match=rf"^argument 0: .* does not fit scalar {ty}") as e:
            check([Scalar(ty)], (obj,))
        assert not getattr(e.value, "__notes__", None)


def test_float_returning_non_float_is_a_type_error_with_the_cause():
    class NotFloat:
        def __float__(self):
            return "1.0"

    with pytest.raises(TypeError, match=r"^argument 0: expected a float") as e:
        check([Scalar("f32")], (NotFloat(),))
    assert isinstance(e.value.__cause__, TypeError)
    assert "__float__ returned non-float" in str(e.value.__cause__)


@pytest.mark.parametrize("where, label", [("grid", "grid"), ("grid[0]", "grid[0]"),
                                          ("block", "block"), ("block[1]", "block[1]"),
                                          ("cluster", "cluster"), ("cluster[2]", "cluster[2]"),
                                          ("shared_mem", "shared_mem")])
@pytest.mark.parametrize("make", [lambda: ValueError("mine"), lambda: LookupError("mine"),
                                  lambda: OverflowError("mine")])
def test_a_configuration_index_raising_keeps_the_users_exception(where, label, make):
    exc = make()
    o = IndexRaises(exc)
    grid, kw = 1, {"block": 1}
    if where == "grid":
        grid = o
    elif where == "grid[0]":
        grid = (o,)
    elif where == "block":
        kw["block"] = o
    elif where == "block[1]":
        kw["block"] = (1, o)
    elif where == "cluster":
        kw["cluster"] = o
    elif where == "cluster[2]":
        kw["cluster"] = [1, 1, o]
    else:
        kw["shared_mem"] = o
    with pytest.raises(type(exc)) as e:
        tile_py.launch(STREAM, grid, None, (), **kw)
    assert e.value is exc
    assert e.value.__notes__ == [f"{label}: raised while converting this argument"]


def test_a_configuration_index_interrupt_propagates_as_raised():
    exc = KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as e:
        tile_py.launch(STREAM, (1, IndexRaises(exc)), None, (), block=1)
    assert e.value is exc
    assert not getattr(e.value, "__notes__", None)


class Index:
    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_shared_mem_takes_what_converts_through_index_and_refuses_bools():
    # Past the configuration, the launch fails on the missing kernel: the shared_mem was taken.
    for v in (Index(1024), Index(0)):
        with pytest.raises(Exception) as e:
            tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=v)
        assert "shared_mem" not in str(e.value), e.value
    for v in (True, False, 1.0, "1", Index("1")):
        with pytest.raises(TypeError, match=r"^shared_mem must be an int \(bytes\), got "):
            tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=v)
    with pytest.raises(ValueError, match=r"^shared_mem is -1 bytes, below the minimum 0"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=Index(-1))
    with pytest.raises(ValueError, match=rf"^shared_mem is {1 << 32} bytes, above the limit"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=Index(1 << 32))


def test_shared_mem_takes_numpy_integers_as_grid_and_block_do():
    np = pytest.importorskip("numpy")
    for v in (np.int64(1024), np.intp(0), np.uint32(48 * 1024)):
        with pytest.raises(Exception) as e:
            tile_py.launch(STREAM, np.int64(1), None, (), block=np.int32(1), shared_mem=v)
        assert "shared_mem" not in str(e.value), e.value
    for v in (np.bool_(True), np.float32(1.0)):
        with pytest.raises(TypeError, match=r"^shared_mem must be an int \(bytes\)"):
            tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=v)
