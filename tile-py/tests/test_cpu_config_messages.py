"""Launch-configuration values too large for any device are quoted exactly as given."""

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


# ---- huge launch-configuration values are quoted as given -------------------------------


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
