"""CPU tests of issue 6 faults: a raising producer, a forked child, interpreter exit."""

import os
import subprocess
import sys
import textwrap

import pytest

import tile_py
from tile_py import _testing
from tile_py import In
from dlpack_ctypes import Producer

HERE = os.path.dirname(__file__)


def test_producer_dlpack_raises_propagates_with_index_and_consumes_nothing():
    class Raising(Producer):
        def __dlpack__(self, **kw):
            raise RuntimeError("producer failed")

    before = _testing.debug_counters()
    a = Producer()
    with pytest.raises(RuntimeError, match="producer failed") as e:
        _testing.check_args([In("float32"), In("float32")], (a, Raising()), stream=0x1234)
    assert "argument 1" in "".join(getattr(e.value, "__notes__", []))
    # The argument converted before it was given back (released), nothing launched.
    assert a.deleted == 1
    after = _testing.debug_counters()
    assert after["launches_issued"] == before["launches_issued"]
    assert after["consumed"] - before["consumed"] == after["released"] - before["released"]


def run_child(code):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_forked_child_refuses_to_launch_and_runs_no_deleters():
    r = run_child("""
        import os, sys
        import tile_py
        from tile_py import _testing
        from tile_py import In
        from dlpack_ctypes import Producer
        p = Producer()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                tile_py.launch(1, 1, None, (), block=1)
                code = 10
            except ValueError as e:
                if "os.fork" not in str(e):
                    code = 11
            try:
                _testing.check_args([In("float32")], (p,), stream=0x1234)
                code = 12
            except ValueError:
                pass
            if p.deleted != 0:
                code = 13
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        # The parent is unaffected.
        _testing.check_args([In("float32")], (p,), stream=0x1234)
        print("parent", p.deleted)
    """)
    assert r.returncode == 0, r.stderr
    assert "child 0" in r.stdout and "parent 1" in r.stdout, (r.stdout, r.stderr)


def test_interpreter_exit_after_use_is_clean():
    r = run_child("""
        import tile_py
        from tile_py import _testing
        from tile_py import In
        from dlpack_ctypes import Producer
        ps = [Producer() for _ in range(10)]
        for p in ps:
            _testing.check_args([In("float32")], (p,), stream=0x1234)
        assert all(p.deleted == 1 for p in ps)
        print("leaked", _testing.shutdown(0.1))
    """)
    assert r.returncode == 0, r.stderr
    assert "leaked 0" in r.stdout
    assert "leaked at exit" not in r.stderr


def test_deleter_that_raises_is_reported_and_later_deleters_still_run(monkeypatch):
    import dlpack_ctypes as dc

    cap1, _ = dc.make_capsule()
    cap2, c2 = dc.make_capsule()
    import ctypes

    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi)
    )
    ptr = get_pointer(cap1, b"dltensor_versioned")
    calls = []

    def raising(_ptr):
        calls.append(1)
        raise RuntimeError("deleter failed")

    raising_cb = dc.DELETER(raising)
    dc._LIVE[ptr][0].deleter = raising_cb
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u))
    # Consumes both capsules, then releases them (nothing is launched without a device).
    _testing.check_args([In("float32"), In("float32")], (cap1, cap2), stream=0x1234)
    assert calls == [1], "the raising deleter ran exactly once"
    assert c2.calls == 1, "the deleter after it still ran"
    assert len(seen) == 1 and "deleter failed" in str(seen[0].exc_value)
    del raising_cb
