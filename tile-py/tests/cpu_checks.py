"""What the CPU tests of argument conversion share: a launch's conversion and checks without a
device (`check`), the notes an exception carries, a minimal `__cuda_array_interface__`
object, and a program run in a child process against the stub driver (`run_with_stub`)."""

import os
import subprocess
import sys
import textwrap

from tile_py import _testing

HERE = os.path.dirname(os.path.abspath(__file__))

# A stream handle the checks accept; nothing is ever launched on it.
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


def run_with_stub(stub, code, timeout=120):
    """Runs `code` (dedented) in a fresh interpreter whose driver is the stub `stub` and whose
    path has this folder's helpers; fails unless it exits with 0. Returns its standard output."""
    env = dict(os.environ, TILE_LIBCUDA=stub,
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout
