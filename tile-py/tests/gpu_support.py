"""What the GPU tests share: launch sizing, settling the device and the release queues, deltas
of tile_py's debug counters, the cuTile scenario's producer, and the gate of the cuTile tests."""

import os
import shutil

import tile_py
from tile_py import _testing
BLOCK = 256


def grid_for(n, block=BLOCK):
    """Blocks of `block` threads covering `n` elements (at least one)."""
    return max(1, (n + block - 1) // block)


def settle(torch):
    """Waits for the device, then releases every tensor tile_py holds for finished work."""
    torch.cuda.synchronize()
    tile_py.synchronize()


class Counts:
    """Deltas of tile_py's debug counters since this object was made."""

    def __init__(self):
        self.start = _testing.debug_counters()

    def __getitem__(self, k):
        return _testing.debug_counters()[k] - self.start[k]


class Cloner:
    """The cuTile scenario's producer: every export is a fresh copy whose only owner is the
    capsule, so releasing it early hands its memory back to the caching allocator."""

    def __init__(self, t):
        self.t = t
        self.exports = 0

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()

    def __dlpack__(self, **kw):
        self.exports += 1
        return self.t.clone().__dlpack__(**kw)


def cutile_reason():
    """Why cuTile cannot compile here (None when it can): ``cuda.tile`` not importable, or its
    compiler ``tileiras`` not on PATH."""
    try:
        import cuda.tile  # noqa: F401
        import cuda.tile.compilation  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"cuda.tile is not importable: {e}"
    if shutil.which("tileiras") is None:
        return "cuTile's compiler (tileiras) is not on PATH"
    return None


def require_cutile():
    """Skips the calling test (fails it with TILE_REQUIRE_CUTILE=1) when cuTile cannot compile
    here."""
    import pytest

    reason = cutile_reason()
    if reason is not None:
        if os.environ.get("TILE_REQUIRE_CUTILE") == "1":
            pytest.fail(f"TILE_REQUIRE_CUTILE=1 but {reason}", pytrace=False)
        pytest.skip(f"needs cuTile: {reason}")
