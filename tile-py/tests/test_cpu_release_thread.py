"""CPU tests of the release thread (issue 24, class 2): a release queued for a thread holding the
interpreter is run within a bounded time without any call into tile_py, on the release thread,
with the GIL held; the thread does not keep the interpreter from exiting, and a forked child has
no such thread and runs none of the parent's releases."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import tile_py
from tile_py import _testing
HERE = os.path.dirname(__file__)


class Released:
    """An object whose release (its last reference dropped) records the thread it ran on and
    whether that thread held the GIL."""

    def __init__(self, done):
        self.done = done

    def __del__(self):
        import ctypes

        self.done.append((threading.get_ident(), ctypes.pythonapi.PyGILState_Check()))


def wait_for(cond, seconds):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_queued_release_runs_without_a_call_within_the_bound():
    done = []
    obj = Released(done)
    t0 = time.monotonic()
    _testing.queue_release(obj)
    del obj  # the queued release holds the last reference now
    assert done == [], "released before the release thread ran"
    period = _testing.release_thread()["period_ms"] / 1000
    # No call into tile_py from here until it is released: the bound is one period, plus
    # handing the interpreter over (this thread sleeps, so at once) and scheduling slack.
    assert wait_for(lambda: done, 10 * period), "not released without a call"
    took = time.monotonic() - t0
    (thread, gil), = done
    assert thread != threading.get_ident(), "released on the caller's thread, not the release thread"
    assert gil == 1, "released without the GIL held"
    assert took < period + 0.5, f"released after {took:.3f} s; the bound is {period} s"
    state = _testing.release_thread()
    assert state["running"] is True and state["cycles"] >= 1, state
    print(f"released {took * 1000:.1f} ms after queueing (period {period * 1000:.0f} ms)")


def test_many_releases_all_run_exactly_once():
    done = []
    for _ in range(200):
        _testing.queue_release(Released(done))
    assert wait_for(lambda: len(done) == 200, 5), len(done)
    time.sleep(0.2)
    assert len(done) == 200


def run_child(code, timeout=60):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_the_release_thread_does_not_keep_the_interpreter_from_exiting():
    # Releases queued right before exit, and a release thread started: the interpreter exits
    # at once, cleanly, whatever the thread was doing.
    r = run_child(
        """
        import time, tile_py
        from tile_py import _testing
        class Slow:
            def __del__(self):
                time.sleep(0.01)
        for _ in range(50):
            _testing.queue_release(Slow())
        assert _testing.release_thread()["running"]
        print("EXITING", flush=True)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "EXITING" in r.stdout
    assert "Fatal Python error" not in r.stderr and "panicked" not in r.stderr, r.stderr[-2000:]


def test_exit_while_the_release_thread_is_attached_is_clean():
    # Many rounds of exit racing the thread's wake-up (it attaches every period).
    for i in range(5):
        r = run_child(
            f"""
            import time, tile_py
            from tile_py import _testing
            class Obj:
                pass
            _testing.queue_release(Obj())
            time.sleep({i} * 0.013)
            for _ in range(20):
                _testing.queue_release(Obj())
            """
        )
        assert r.returncode == 0, (i, r.stderr[-2000:])
        assert "Fatal Python error" not in r.stderr and "panicked" not in r.stderr, r.stderr[-2000:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_forked_child_has_no_release_thread_and_runs_none_of_the_parents_releases():
    r = run_child(
        """
        import os, sys, time, threading, tile_py
        from tile_py import _testing
        done = []
        class Obj:
            def __del__(self):
                done.append(os.getpid())
        _testing.queue_release(Obj())
        deadline = time.monotonic() + 5
        while not done and time.monotonic() < deadline:
            time.sleep(0.005)
        assert done, "the parent's release did not run"
        parent = os.getpid()
        for round_ in range(10):
            # Queue a release and fork at once: the child must not run it, nor deadlock.
            _testing.queue_release(Obj())
            pid = os.fork()
            if pid == 0:
                time.sleep(0.2)
                ok = (
                    os.getpid() not in done
                    and _testing.release_thread()["running"] is False
                    and _testing.debug_counters()["leaked_at_exit"] >= 0
                )
                os._exit(0 if ok else 3)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, (round_, status)
        deadline = time.monotonic() + 5
        while len(done) < 11 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert len(done) == 11 and set(done) == {parent}, done
        assert _testing.release_thread()["running"] is True
        print("FORK OK", flush=True)
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "FORK OK" in r.stdout, r.stdout


# A deleter on the release thread that never returns: the exit hook waits at most its timeout
# in all, then leaks and counts the batch in flight (and what is queued behind it), with the
# one warning; none of those deleters runs afterwards.
BLOCKED_ON_THE_RELEASE_THREAD = """
    import os, sys, threading, time, tile_py
    from tile_py import _testing
    entered = []
    forever = threading.Event()
    class Block:
        def __del__(self):
            entered.append(threading.get_ident())
            forever.wait()  # never set
    class Note:
        def __del__(self):
            print("note deleter ran", flush=True)
    _testing.queue_release(Block())
    for _ in range(3):
        _testing.queue_release(Note())
    deadline = time.monotonic() + 10
    while not entered and time.monotonic() < deadline:
        time.sleep(0.005)
    assert entered and entered[0] != threading.get_ident(), "not on the release thread"
"""


def test_shutdown_returns_by_its_timeout_while_a_release_thread_deleter_blocks():
    r = run_child(
        BLOCKED_ON_THE_RELEASE_THREAD
        + """
    t0 = time.monotonic()
    leaked = _testing.shutdown(1.0)
    print(f"RESULT {leaked} {time.monotonic() - t0:.3f}", flush=True)
    time.sleep(0.3)  # the release thread would run the notes now, if it went on
    t0 = time.monotonic()
    again = _testing.shutdown(1.0)  # and once more at exit: no second wait, no second warning
    print(f"AGAIN {again} {time.monotonic() - t0:.3f}", flush=True)
    """,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (line,) = [l for l in r.stdout.splitlines() if l.startswith("RESULT")]
    _, leaked, took = line.split()
    # The blocked release and the three behind it (in its batch, or still queued).
    assert int(leaked) == 4, r.stdout
    assert 0.9 <= float(took) < 3.0, f"shutdown(1.0) returned after {took} s"
    assert "note deleter ran" not in r.stdout, r.stdout
    assert "4 tensor(s) or object(s) kept for GPU work leaked at exit" in r.stderr, r.stderr[-2000:]
    (line,) = [l for l in r.stdout.splitlines() if l.startswith("AGAIN")]
    _, again, took = line.split()
    assert int(again) == 0 and float(took) < 0.5, line
    assert r.stderr.count("leaked at exit") == 1, r.stderr[-2000:]


def test_exit_is_bounded_while_a_release_thread_deleter_blocks_forever():
    r = run_child(
        BLOCKED_ON_THE_RELEASE_THREAD
        + """
    print(f"EXITING {time.time()}", flush=True)
    """,
        timeout=40,
    )
    import time as _t

    end = _t.time()
    assert r.returncode == 0, r.stderr[-2000:]
    (line,) = [l for l in r.stdout.splitlines() if l.startswith("EXITING")]
    took = end - float(line.split()[1])
    # The default timeout, 5 s, plus start-up of nothing and scheduling slack.
    assert took < 5 + 5, f"exit took {took:.1f} s"
    assert "note deleter ran" not in r.stdout, r.stdout
    assert r.stderr.count("leaked at exit") == 1, r.stderr[-2000:]
    assert "4 tensor(s) or object(s) kept for GPU work leaked at exit" in r.stderr, r.stderr[-2000:]
    assert "Fatal Python error" not in r.stderr and "panicked" not in r.stderr, r.stderr[-2000:]
