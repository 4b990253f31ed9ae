"""CPU tests of every public tile_py call in a child made by ``os.fork()``: none makes a driver
call or waits for a lock the parent may have held. Launches, holds, prepared launches, library
loads and ``compute_capability`` raise the fork ``ValueError``; ``synchronize`` returns; ``stats``
answers without polling, releases queued in the parent counted as leaked; the release thread
does not exist; the exit hook returns at once. No GPU needed (a machine without a driver)."""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(__file__)

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")


def run(code):
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (r.stdout, r.stderr)
    return r.stdout


CHILD = """
    import os, sys, traceback
    import tile_py
    from tile_py import _testing

    def report(code):
        sys.stdout.flush()
        os._exit(code)

    class Marker:
        pass

    # A release queued in the parent (as a finished launch's would be), not yet drained.
    _testing.queue_release(Marker())
    parent_leaked = _testing.debug_counters()["leaked_at_exit"]
    pid = os.fork()
    if pid == 0:
        try:
            failures = []

            def refused(what, fn, *a, **kw):
                try:
                    fn(*a, **kw)
                except ValueError as e:
                    if "os.fork" not in str(e):
                        failures.append(f"{what}: ValueError without the fork reason: {e}")
                except Exception as e:
                    failures.append(f"{what}: {type(e).__name__}: {e}")
                else:
                    failures.append(f"{what}: returned")

            # Return, without a driver call.
            if tile_py.synchronize() is not None:
                failures.append("synchronize returned a value")
            st = tile_py.stats()
            if st["streams"] != 0 or st["pending_guards"] != 0:
                failures.append(f"stats: {st}")
            c = _testing.debug_counters()
            if c["leaked_at_exit"] != parent_leaked + 1:
                failures.append(f"the parent's queued release is not counted leaked: {c}")
            if _testing.release_thread()["running"]:
                failures.append("a release thread runs in the child")
            # Refused with the fork ValueError.
            refused("launch", tile_py.launch, 1, 1, None, (), block=1)
            refused("hold", tile_py.hold, 1, Marker())
            refused("BoundLaunch", tile_py.BoundLaunch, 1, 1, None, block=1)
            refused("compute_capability", tile_py.compute_capability, 1)
            refused("Library.from_bytes", tile_py.Library.from_bytes, b"\\x7fELF" + bytes(60))
            refused("Library.from_ptx", tile_py.Library.from_ptx, ".version 8.0\\n.target sm_90\\n")
            refused("Library.from_file", tile_py.Library.from_file, "/dev/null")
            if _testing.shutdown() != 0:
                failures.append("_shutdown reported pending work in the child")
            print("\\n".join(failures) or "child ok")
            report(0 if not failures else 1)
        except BaseException:
            traceback.print_exc()
            report(2)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
    # The parent is unaffected: its queued release runs.
    before = _testing.debug_counters()["leaked_at_exit"]
    tile_py.synchronize()
    print("parent leaked", _testing.debug_counters()["leaked_at_exit"] - before)
"""


def test_every_public_call_in_a_forked_child_returns_or_refuses_with_the_fork_reason():
    out = run(CHILD)
    assert "child ok" in out and "child exit 0" in out, out
    assert "parent leaked 0" in out, out


def test_the_fork_hook_called_in_the_process_itself_changes_nothing():
    """The hook ``os.register_at_fork`` runs in a child, called in the process tile_py was
    loaded in, is not a fork: launches are not refused with the fork reason afterwards."""
    code = (
        "import tile_py, tile_py._testing\n"
        "tile_py._testing.after_fork_in_child()\n"
        "try:\n"
        "    tile_py.compute_capability(1)\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n"
        "except Exception as e:\n"
        "    print('other:', type(e).__name__)\n"
        "else:\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "os.fork()" not in out.stdout, out.stdout


FORK_IN_A_RELEASE = """
    import os, sys, threading
    import tile_py
    from tile_py import _testing

    in_child = []
    deleted = []

    class Forker:
        # Released in a drain's batch: forks from inside it, so that the child goes on running
        # that batch on this thread (the main one: the release thread first wakes 50 ms after
        # the first queue_release below, long after synchronize took the batch).
        def __del__(self):
            if threading.current_thread() is not threading.main_thread():
                print("released on another thread", flush=True)
                return
            pid = os.fork()
            if pid == 0:
                in_child.append(True)
                return
            _, status = os.waitpid(pid, 0)
            print("child exit", os.waitstatus_to_exitcode(status), flush=True)

    class Marker:
        def __del__(self):
            deleted.append(1)

    leaked_before = _testing.debug_counters()["leaked_at_exit"]
    _testing.queue_release(Forker())
    for _ in range(3):
        _testing.queue_release(Marker())
    tile_py.synchronize()
    st = tile_py.stats()
    leaked = _testing.debug_counters()["leaked_at_exit"] - leaked_before
    who = "child" if in_child else "parent"
    print(who, "releasing", st["releasing"], "leaked", leaked, "deleted", len(deleted),
          flush=True)
    if in_child:
        os._exit(0)
"""


def test_a_fork_inside_a_release_counts_the_rest_of_its_batch_leaked_once():
    """A deleter (here a released object's ``__del__``) that forks: the child goes on running
    the batch it was released in. What that batch had left at the fork counts as leaked once
    (at the fork: the release running then, and the three never run in the child), and
    ``stats()["releasing"]`` is 0 once the batch ends, never wrapped below zero; the parent
    runs the whole batch."""
    out = run(FORK_IN_A_RELEASE)
    assert "child releasing 0 leaked 4 deleted 0" in out, out
    assert "child exit 0" in out, out
    assert "parent releasing 0 leaked 0 deleted 3" in out, out


def test_a_fork_while_another_thread_holds_the_release_queue_lock_does_not_hang_the_child():
    """A thread of the parent releasing a detached launch's tensors holds the release queue's
    lock; a fork at that moment leaves the lock held for good in the child, where that thread
    does not exist. The child's fork hook and every call must not wait for it: the child answers
    ``stats``, ``synchronize`` and the exit hook, refuses a launch with the fork reason, and
    exits; the parent's queue works once the lock is let go."""
    out = run("""
        import os, signal, sys, time, weakref
        import tile_py
        from tile_py import _testing

        class Marker:
            pass

        marker = Marker()
        alive = weakref.ref(marker)
        _testing.queue_release(marker)
        del marker
        _testing.hold_release_queue_lock(3.0)
        pid = os.fork()
        if pid == 0:
            try:
                tile_py.stats()
                tile_py.synchronize()
                try:
                    tile_py.launch(1, 1, None, (), block=1)
                except ValueError as e:
                    ok = "os.fork" in str(e)
                else:
                    ok = False
                _testing.shutdown()
                print("child ok" if ok else "child: launch not refused", flush=True)
                os._exit(0 if ok else 1)
            except BaseException as e:
                print("child raised", type(e).__name__, e, flush=True)
                os._exit(2)
        deadline = time.monotonic() + 20
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("child exit", os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                print("child hung")
                break
            time.sleep(0.02)
        tile_py.synchronize()
        print("parent's release ran" if alive() is None else "parent's release did not run")
    """)
    assert "child hung" not in out, out
    assert "child ok" in out and "child exit 0" in out, out
    assert "parent's release ran" in out, out
