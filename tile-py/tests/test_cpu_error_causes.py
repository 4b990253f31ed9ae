"""Conversion errors name the argument and keep what the user's object raised as their cause:
``__cuda_array_interface__`` fields, raising attributes and ``__float__``, ``__index__``
results, a raising ``__cuda_stream__``, sizes beyond int64."""

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
