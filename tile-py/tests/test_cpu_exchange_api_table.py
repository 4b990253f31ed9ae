"""A DLPack C exchange-API table mutated after tile_py cached it is refused, not followed."""

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


# ---- an exchange-API table mutated after tile cached it ---------------------------------


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
