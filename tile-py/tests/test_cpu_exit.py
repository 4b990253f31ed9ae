"""The exit hook with an infinite or huge timeout waits without a panic."""

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


# ---- _shutdown with an infinite or huge timeout ------------------------------------------


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
