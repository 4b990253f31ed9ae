"""What the CPU tests of argument conversion share: a launch's conversion and checks without a
device (`check`), the notes an exception carries, and a minimal `__cuda_array_interface__`
object."""

from tile_py import _testing

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
