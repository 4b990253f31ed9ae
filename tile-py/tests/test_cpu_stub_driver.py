"""Calls that need a driver, against the repository's stub driver (bench/profile/cuda_stub.c,
built here with the C compiler; no GPU): `Kernel.bind` as the extension defines it, lists as
dimensions, and a configuration refused by the device's limits naming the Python keyword. The
stub launches nothing, so only what tile_py does around a launch is checked."""

import os
import subprocess
import sys
import textwrap

import pytest


def run_with_stub(stub, code):
    env = dict(os.environ, TILE_LIBCUDA=stub)
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


PRELUDE = """
    import tile_py
    from tile_py import _testing, Scalar

    STREAM = 0x5000  # a stream handle the stub accepts
    lib = tile_py.Library.from_bytes(b"\\x7fELF stub image\\0")
    k = lib.kernel("k", [Scalar("u64")] * 7)  # the stub's kernels take seven 8-byte values
    ARGS = (1, 2, 3, 4, 5, 6, 7)
"""


def test_kernel_bind_binds_and_launches(stub_driver):
    out = run_with_stub(stub_driver, PRELUDE + """
    bound = k.bind(STREAM, 16, block=256)
    assert type(bound) is tile_py.BoundLaunch and bound.kernel is k
    assert repr(bound) == "<tile_py.BoundLaunch k grid=(16, 1, 1) block=(256, 1, 1) shared_mem=0>", repr(bound)
    before = _testing.debug_counters()["launches_issued"]
    bound(*ARGS).wait()
    bound(*ARGS, sync=False).wait()
    assert _testing.debug_counters()["launches_issued"] == before + 2
    # The same as the class's constructor.
    again = tile_py.BoundLaunch(STREAM, 16, k, block=256)
    assert repr(again) == repr(bound)
    for bad, message in [
        (dict(block=256, cooperative=1), "Kernel.bind: cooperative must be True or False, got 1"),
        (dict(block="x"), "block must be an int or a tuple or list of 1 to 3 ints, got 'x'"),
    ]:
        try:
            k.bind(STREAM, 16, **bad)
        except TypeError as e:
            assert str(e).startswith(message), str(e)
        else:
            raise AssertionError(bad)
    try:
        bound(*ARGS[:6])
    except TypeError as e:
        assert str(e) == "kernel `k` expects 7 arguments but 6 were given", str(e)
    else:
        raise AssertionError("a short call was launched")
    print("ok")
    """)
    assert out.strip() == "ok"


def test_lists_are_dimensions(stub_driver):
    out = run_with_stub(stub_driver, PRELUDE + """
    tile_py.launch(STREAM, [16], k, list(ARGS), block=[256]).wait()
    tile_py.launch(STREAM, [4, 4], k, ARGS, block=[16, 16, 1]).wait()
    bound = k.bind(STREAM, [2, 3], block=[8, 4])
    assert repr(bound).endswith("grid=(2, 3, 1) block=(8, 4, 1) shared_mem=0>"), repr(bound)
    bound(*ARGS).wait()
    print("ok")
    """)
    assert out.strip() == "ok"


def test_shared_memory_above_the_limit_names_the_keyword(stub_driver):
    out = run_with_stub(stub_driver, PRELUDE + """
    for call in (
        lambda: tile_py.launch(STREAM, 1, k, ARGS, block=1, shared_mem=1 << 20),
        lambda: k.bind(STREAM, 1, block=1, shared_mem=1 << 20),
    ):
        try:
            call()
        except ValueError as e:
            assert "shared_mem" in str(e) and "shared_mem_bytes" not in str(e), str(e)
            assert "1048576" in str(e), str(e)
        else:
            raise AssertionError("1 MiB of shared memory was accepted")
    print("ok")
    """)
    assert out.strip() == "ok"


def test_shared_mem_takes_numpy_integers(stub_driver):
    pytest.importorskip("numpy")
    out = run_with_stub(stub_driver, PRELUDE + """
    import numpy as np
    smem = np.prod((16, 16)) * np.dtype(np.float32).itemsize  # np.int64(1024)
    bound = k.bind(STREAM, np.int64(4), block=(np.int64(16), np.int64(16)), shared_mem=smem)
    assert repr(bound).endswith("grid=(4, 1, 1) block=(16, 16, 1) shared_mem=1024>"), repr(bound)
    bound(*ARGS).wait()
    tile_py.launch(STREAM, 4, k, ARGS, block=256, shared_mem=np.intp(512)).wait()
    try:
        k.bind(STREAM, 4, block=256, shared_mem=np.bool_(True))
    except TypeError as e:
        assert str(e).startswith("shared_mem must be an int (bytes)"), e
        print("bool refused")
    print("ok")
    """)
    assert "bool refused" in out and "ok" in out


def test_a_numba_stream_is_read_and_kept_alive_while_its_work_is_held(stub_driver):
    # numba-cuda streams have no __cuda_stream__: their handle is `.handle.value` (None for the
    # legacy default stream). numba destroys a stream it drops, work pending or not, so the
    # object is kept with the launch stream until the work launched on it is released.
    out = run_with_stub(stub_driver, PRELUDE + """
    import gc, weakref
    from tile_py import In

    def numba_stream(value):
        cls = type("Stream", (), {"__module__": "numba.cuda.cudadrv.driver"})
        s = cls()
        s.handle = type("Handle", (), {})()
        s.handle.value = value
        return s

    class Dev:
        __cuda_array_interface__ = {"shape": (64,), "typestr": "<f4", "strides": None,
                                    "data": (0x7F00_0000_0000, False), "version": 3}

    kt = lib.kernel("kt", [In("float32")] + [Scalar("u64")] * 6)
    s = numba_stream(STREAM)
    alive = weakref.ref(s)
    tile_py.launch(s, 1, kt, (Dev(), 2, 3, 4, 5, 6, 7), block=32)
    tile_py.launch(numba_stream(None), 1, k, ARGS, block=32).wait()  # the legacy default stream
    del s
    gc.collect()
    assert alive() is not None, "the numba stream was dropped while its work was held"
    tile_py.synchronize()
    gc.collect()
    assert alive() is None, "the numba stream is kept after its work was released"
    print("ok")
    """)
    assert out.strip() == "ok"
