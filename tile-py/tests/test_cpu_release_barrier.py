"""CPU tests of the release barrier (issue 38): a drain takes the queued releases as one batch
and runs their deleters; a deleter that lets the interpreter switch threads leaves that batch in
flight while other threads run. ``synchronize()``, ``LaunchHandle.wait()`` and the ``atexit``
hook must wait for such a batch (on the release thread, or on a user thread inside a tile_py
call), ``stats()`` must count it, and a barrier called from inside a deleter must not wait for
itself. Also: a stream object dropped by the caller is not kept alive past ``synchronize()``, and
an exception raised by a scalar's ``__index__`` keeps its type.

The releases here are queued with ``tile_py._testing.queue_release`` (a reference released as a launch's
guard is) and, for the tests that launch, against the stub driver ``bench/profile/cuda_stub.c``
(``TILE_LIBCUDA``), in a child process: its events are complete at once, so a launch's tensors
are released at the next poll."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest

import tile_py
import tile_py._testing
from tile_py import Scalar

HERE = os.path.dirname(__file__)
N = 30
STREAM = 0x1234  # an int stream handle: argument checks make no driver call


class Blocking:
    """A queued release: the object's last reference. The ``__del__`` of number ``block_at``
    says so and blocks (the GIL released) until ``go`` is set; each records that it ran."""

    def __init__(self, i, ran, entered, go, block_at=0):
        self.i, self.ran, self.entered, self.go, self.block_at = i, ran, entered, go, block_at

    def __del__(self):
        if self.i == self.block_at:
            self.entered.append(threading.get_ident())
            self.go.wait(30)
        self.ran.append(self.i)


def queue_blocking(ran, entered, go, n=N, block_at=0):
    for i in range(n):
        tile_py._testing.queue_release(Blocking(i, ran, entered, go, block_at))


def wait_until(cond, seconds=20):
    ev = threading.Event()
    for _ in range(int(seconds / 0.005)):
        if cond():
            return True
        ev.wait(0.005)
    return cond()


def drain_on_a_user_thread(ran, entered, go, n=N, block_at=0):
    """A user thread queues ``n`` blocking releases and drains them itself (``stats()``),
    holding the interpreter from the first queueing to the first deleter, so that the release
    thread cannot take the batch first. Returns the thread, once it is inside the deleter."""

    def run():
        old = sys.getswitchinterval()
        sys.setswitchinterval(30)
        try:
            queue_blocking(ran, entered, go, n, block_at)
            tile_py.stats()
        finally:
            sys.setswitchinterval(old)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert wait_until(lambda: entered), "the user thread never reached the deleter"
    assert entered == [t.ident], "the batch was not drained by the user thread"
    return t


def drain_on_the_release_thread(ran, entered, go, n=N, block_at=0):
    queue_blocking(ran, entered, go, n, block_at)
    assert wait_until(lambda: entered), "the release thread never reached the deleter"
    assert entered != [threading.get_ident()]


def let_go_after(go, seconds=0.3):
    t = threading.Timer(seconds, go.set)
    t.start()
    return t


@pytest.mark.parametrize("where", ["release thread", "user thread"])
def test_synchronize_waits_for_a_batch_in_flight_on_another_thread(where):
    ran, entered, go = [], [], threading.Event()
    try:
        if where == "release thread":
            drain_on_the_release_thread(ran, entered, go)
        else:
            drain_on_a_user_thread(ran, entered, go)
        assert ran == [], "a deleter ran before the first one was let go"
        let_go_after(go)
        tile_py.synchronize()
        done_at_return = len(ran)
    finally:
        go.set()
    assert done_at_return == N, (
        f"synchronize() returned with {N - done_at_return} of {N} deleters not yet run "
        f"(a batch in flight on the {where})"
    )
    assert sorted(ran) == list(range(N))


@pytest.mark.parametrize("where", ["release thread", "user thread"])
@pytest.mark.parametrize("block_at", [0, 10])
def test_stats_count_a_batch_in_flight(where, block_at):
    ran, entered, go = [], [], threading.Event()
    try:
        if where == "release thread":
            drain_on_the_release_thread(ran, entered, go, block_at=block_at)
        else:
            drain_on_a_user_thread(ran, entered, go, block_at=block_at)
        st = tile_py.stats()
        assert sorted(ran) == list(range(block_at))
        # Off the queue, not yet run (the blocked one and those behind it): counted as being
        # released, not lost from view.
        assert (st["queued_releases"], st.get("releasing")) == (0, N - block_at), st
    finally:
        go.set()
    tile_py.synchronize()
    st = tile_py.stats()
    assert (st["queued_releases"], st["releasing"]) == (0, 0), st
    assert len(ran) == N


def test_a_barrier_inside_a_deleter_does_not_wait_for_itself_or_a_crossing_one():
    """A deleter that calls synchronize() (on the release thread, while a user thread is also
    inside a deleter calling synchronize()) returns: a barrier on a thread running a batch does
    not wait for batches in flight."""
    both_inside = threading.Barrier(2, timeout=20)
    returned = []

    class Syncing:
        def __del__(self):
            both_inside.wait()
            tile_py.synchronize()
            returned.append(threading.get_ident())

    # One on the release thread...
    tile_py._testing.queue_release(Syncing())
    assert wait_until(lambda: both_inside.n_waiting == 1)
    # ...and one drained here, on this thread, at the same time.
    tile_py._testing.queue_release(Syncing())
    tile_py.stats()
    assert wait_until(lambda: len(returned) == 2), "a barrier inside a deleter deadlocked"
    assert len(set(returned)) == 2
    st = tile_py.stats()
    assert (st["queued_releases"], st["releasing"]) == (0, 0), st


def run_child(code, timeout=120, env=None):
    env = dict(os.environ, **(env or {}))
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)


CHILD_HELPERS = """
import sys, threading
import tile_py
import tile_py._testing

N = %d

class Blocking:
    def __init__(self, i, ran, entered, go):
        self.i, self.ran, self.entered, self.go = i, ran, entered, go
    def __del__(self):
        if self.i == 0:
            self.entered.append(threading.get_ident())
            self.go.wait(30)
        self.ran.append(self.i)

def wait_until(cond, seconds=20):
    ev = threading.Event()
    for _ in range(int(seconds / 0.005)):
        if cond():
            return True
        ev.wait(0.005)
    return cond()
""" % N


def test_shutdown_waits_for_a_batch_in_flight_on_a_user_thread():
    """The atexit hook (``_shutdown``) waits for the deleters a user thread is running before it
    stops releasing; called directly in a child, as the interpreter calls it at exit."""
    r = run_child(CHILD_HELPERS + """
ran, entered, go = [], [], threading.Event()
def run():
    sys.setswitchinterval(30)
    for i in range(N):
        tile_py._testing.queue_release(Blocking(i, ran, entered, go))
    tile_py.stats()
t = threading.Thread(target=run, daemon=True)
t.start()
assert wait_until(lambda: entered), "never inside the deleter"
assert entered == [t.ident], "not drained by the user thread"
sys.setswitchinterval(0.005)
threading.Timer(0.3, go.set).start()
leaked = tile_py._testing.shutdown(10.0)
print("ran at return:", len(ran), "leaked:", leaked, flush=True)
go.set()
""")
    assert r.returncode == 0, r.stderr
    assert f"ran at return: {N} leaked: 0" in r.stdout, r.stdout + r.stderr


@pytest.fixture
def stub_env(stub_driver):
    """The environment that loads the stub driver."""
    return {"TILE_LIBCUDA": stub_driver}


STUB_LAUNCH = """
import gc, weakref
from tile_py import In, Out, Scalar
from dlpack_ctypes import Producer

class CudaStream:
    def __init__(self, handle):
        self.handle = handle
    def __cuda_stream__(self):
        return (0, self.handle)

lib = tile_py.Library.from_bytes(b"\\x7fELF stub image\\0")
# The stub's kernels take seven 8-byte parameters.
k = lib.kernel("k", [In("float32"), In("float32"), Out("float32")] + [Scalar("u64")] * 4)

def launch(stream):
    # Distinct memory for each, so that every deleter counts one tensor.
    ps = [Producer(shape=(16,), data=0x100000 * (i + 1)) for i in range(3)]
    h = tile_py.launch(stream, 1, k, (*ps, 1, 2, 3, 4), block=16)
    return h, ps
"""


def test_launch_handle_wait_waits_for_its_tensors_released_on_another_thread(stub_env):
    """A user thread launches, then drains a batch holding the launch's tensors behind a
    blocked deleter; ``wait()`` on the launch's handle, on another thread, returns only once
    the tensors' deleters have run."""
    r = run_child(CHILD_HELPERS + STUB_LAUNCH + """
ran, entered, go = [], [], threading.Event()
box = {}
def run():
    sys.setswitchinterval(30)
    h, ps = launch(CudaStream(0x5000))
    box["h"], box["ps"] = h, ps
    tile_py._testing.queue_release(Blocking(0, ran, entered, go))
    # Polls the stream (its events are complete): the launch's tensors are queued behind the
    # blocking release, and drained with it.
    tile_py.stats()
t = threading.Thread(target=run, daemon=True)
t.start()
assert wait_until(lambda: entered), "never inside the deleter"
assert entered == [t.ident], "not drained by the user thread"
sys.setswitchinterval(0.005)
ps = box["ps"]
assert [p.deleted for p in ps] == [0, 0, 0], [p.deleted for p in ps]
threading.Timer(0.3, go.set).start()
box["h"].wait()
print("deleted at return:", [p.deleted for p in ps], flush=True)
go.set()
t.join()
print("deleted at the end:", [p.deleted for p in ps], flush=True)
""", env=stub_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "deleted at return: [1, 1, 1]" in r.stdout, r.stdout + r.stderr
    assert "deleted at the end: [1, 1, 1]" in r.stdout, r.stdout + r.stderr


def test_a_dropped_stream_object_does_not_outlive_synchronize(stub_env):
    r = run_child(CHILD_HELPERS + STUB_LAUNCH + """
# No thread switch between synchronize() and the check: the release thread cannot forget the
# stream in between.
sys.setswitchinterval(30)
s = CudaStream(0x5000)
h, ps = launch(s)
ref = weakref.ref(s)
del s, h
tile_py.synchronize()
gc.collect()
print("stream alive:", ref() is not None, "streams:", tile_py.stats()["streams"],
      "deleted:", [p.deleted for p in ps], flush=True)
""", env=stub_env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "stream alive: False streams: 0 deleted: [1, 1, 1]" in r.stdout, r.stdout + r.stderr


class _RaisingIndex:
    def __init__(self, exc):
        self.exc = exc

    def __index__(self):
        raise self.exc


class _RaisingFloat:
    def __init__(self, exc):
        self.exc = exc

    def __float__(self):
        raise self.exc


@pytest.mark.parametrize("exc", [ValueError("bad value"), KeyError("k"), LookupError("x"),
                                 TypeError("the user's own TypeError")])
def test_an_exception_from_a_scalars_index_keeps_its_type(exc):
    """One rule for a scalar's ``__index__`` / ``__float__`` and a producer's ``__dlpack__``:
    what the user's code raises reaches the caller with its own type and a note naming the
    argument (checked before any driver call: no GPU needed)."""
    for param, obj in ((Scalar("i32"), _RaisingIndex(exc)), (Scalar("f32"), _RaisingFloat(exc))):
        with pytest.raises(type(exc)) as e:
            tile_py._testing.check_args([Scalar("u8"), param], (1, obj), stream=STREAM)
        assert e.value is exc
        assert e.value.__notes__[-1] == "argument 1: raised while converting this argument"
        exc.__notes__ = []


def test_an_index_returning_a_non_int_is_still_refused_by_tile_py():
    class Half:
        def __index__(self):
            return 0.5

    with pytest.raises(TypeError, match="argument 0: expected an integer for scalar i32") as e:
        tile_py._testing.check_args([Scalar("i32")], (Half(),), stream=STREAM)
    assert isinstance(e.value.__cause__, TypeError)
    assert "__index__ returned non-int" in str(e.value.__cause__)


def test_a_refused_launch_releases_what_it_took_before_raising_while_the_release_thread_runs(stub_env):
    """A refused launch rolls back the arguments it converted and releases them before the
    error reaches the caller, also while the release thread is running (it is, once a launch
    has held a stream): the rollback's releases must not be left to a batch that the release
    thread took and is still running. Many refused launches, the interpreter switching threads
    as often as it can, each checked at once."""
    r = run_child(CHILD_HELPERS + STUB_LAUNCH + """
h, ps = launch(CudaStream(0x5000))  # starts the release thread and holds the stream
stream = CudaStream(0x5000)
sys.setswitchinterval(1e-6)
late = 0
for i in range(400):
    good = Producer(shape=(16,), data=0x100000)
    try:
        tile_py.launch(stream, 1, k, (good, "not a tensor", good, 1, 2, 3, 4), block=16)
    except TypeError:
        pass
    else:
        raise AssertionError("the launch was not refused")
    if good.deleted != 1:
        late += 1
    # Let the release thread run its 50 ms cycle now and then.
    if i % 40 == 0:
        threading.Event().wait(0.06)
tile_py.synchronize()
print("late:", late, flush=True)
""", env=stub_env)
    assert r.returncode == 0, r.stderr
    assert "late: 0" in r.stdout, r.stdout + r.stderr
