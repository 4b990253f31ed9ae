"""Stream handles that do not fit a signed 64-bit ``stream=`` value are refused, as an int and
through ``__cuda_stream__``."""

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


# ---- stream handles must fit a signed 64-bit value ----------------------------------------


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
