"""`tile_py.hold(stream, *objects)` against the stub driver (bench/profile/cuda_stub.c, built by the
session fixture `stub_driver`): what another launcher's work uses is kept until the stream's work
up to the hold has completed, then released exactly once; under a CUDA graph capture the graph
owns it. The stub's switches, reached through ctypes on the library tile_py loaded, model the
device: `stub_set_busy(1)` (the work has not finished: every completion event answers NOT_READY
until cleared; a synchronisation finishes it), `stub_set_capturing(1)` (every stream captures),
`stub_destroy_graphs()` (destroys the captured graphs, whose user objects then release what they
hold) and `stub_user_objects()`. Each test runs in a child process of its own."""

import os
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(__file__)


def run_with_stub(stub, code, timeout=120):
    env = dict(os.environ, TILE_LIBCUDA=stub,
               PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(PRELUDE) + textwrap.dedent(code)],
                       env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


PRELUDE = """
    import ctypes, gc, os, sys, threading, time, weakref
    import tile_py
    from tile_py import _testing
    from dlpack_ctypes import (LegacyProducer, Producer, capsule_name, make_capsule,
                               make_exchange_producer_type)

    STREAM = 0x5000  # a stream handle the stub accepts
    stub = ctypes.CDLL(os.environ["TILE_LIBCUDA"])  # the library tile_py loaded
    stub.stub_user_objects.restype = ctypes.c_int
    ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

    # The capsule keeps the pointer to its name: the names live as long as the process.
    USED = {"dltensor": b"used_dltensor", "dltensor_versioned": b"used_dltensor_versioned"}

    def consumed_capsule(**kw):
        # What a launcher that consumed the capsule leaves: renamed `used_*`, deleter not called.
        cap, counter = make_capsule(**kw)
        assert ctypes.pythonapi.PyCapsule_SetName(cap, USED[capsule_name(cap)]) == 0
        return cap, counter

    def released_within(check, seconds=5.0, poll=True):
        # Waits for `check()`: with tile_py.stats() polls, or (poll=False) without any call.
        deadline = time.monotonic() + seconds
        while not check():
            if time.monotonic() > deadline:
                return False
            if poll:
                tile_py.stats()
            time.sleep(0.005)
        return True

    class Plain:
        pass
"""


def test_each_object_is_released_once_after_the_work_completes_never_before(stub_driver):
    run_with_stub(stub_driver, """
    Exchange, log = make_exchange_producer_type(current_stream=0x777)
    producer, legacy, exchange = Producer(), LegacyProducer(), Exchange()
    fresh, fresh_count = make_capsule()
    fresh_legacy, fresh_legacy_count = make_capsule(versioned=False)
    used, used_count = consumed_capsule()
    used_legacy, used_legacy_count = consumed_capsule(versioned=False)
    plain = Plain()
    plain_ref = weakref.ref(plain)
    counts = lambda: (sum(c.calls for c in exported), fresh_count.calls,
                      fresh_legacy_count.calls, used_count.calls, used_legacy_count.calls)
    before = tile_py.stats()
    stub.stub_set_busy(1)  # the launcher's kernel is still running
    assert tile_py.hold(STREAM, producer, exchange, fresh, fresh_legacy, used, used_legacy,
                        plain) is None
    # The producer was exported as a launch exports it: the stream, DLPack 1.3 asked for.
    assert producer.calls == [{"stream": STREAM, "max_version": (1, 3)}], producer.calls
    assert log["from_obj"] == 1 and log["dlpack"] == 0, log
    # Fresh capsules are consumed; consumed ones keep their name.
    assert [capsule_name(c) for c in (fresh, fresh_legacy, used, used_legacy)] == [
        "used_dltensor_versioned", "used_dltensor", "used_dltensor_versioned", "used_dltensor"]
    exported = producer.counters + exchange.counters
    assert len(exported) == 2
    # The caller lets go of everything: only the hold keeps it.
    del producer, exchange, plain, fresh, fresh_legacy, used, used_legacy
    gc.collect()
    for _ in range(5):
        st = tile_py.stats()
    assert counts() == (0, 0, 0, 0, 0), counts()
    assert plain_ref() is not None, "the plain object was dropped while the work ran"
    assert st["pending_guards"] == before["pending_guards"] + 7, st
    assert st["launches"] == before["launches"] + 1, st  # a hold counts as one
    stub.stub_set_busy(0)  # the kernel finished
    st = tile_py.stats()
    assert counts() == (2, 1, 1, 1, 1), counts()
    assert plain_ref() is None, "the plain object outlived the work"
    assert st["pending_guards"] == 0 and st["leaked"] == 0, st
    assert st["released"] == before["released"] + 6, st  # deleters; the plain object has none
    tile_py.synchronize()
    assert counts() == (2, 1, 1, 1, 1), "a deleter ran twice"
    print("ok")
    """)


def test_synchronize_waits_for_the_held_work_then_releases(stub_driver):
    run_with_stub(stub_driver, """
    cap, count = make_capsule()
    stub.stub_set_busy(1)
    tile_py.hold(STREAM, cap)
    assert count.calls == 0
    tile_py.synchronize()  # waits (the stub then finishes the work) and runs the deleter
    assert count.calls == 1 and tile_py.stats()["pending_guards"] == 0
    tile_py.synchronize()
    assert count.calls == 1
    """)


def test_the_release_thread_releases_without_a_call(stub_driver):
    run_with_stub(stub_driver, """
    cap, count = make_capsule()
    plain = Plain()
    plain_ref = weakref.ref(plain)
    stub.stub_set_busy(1)
    tile_py.hold(STREAM, cap, plain)
    del plain
    time.sleep(0.2)  # the release thread wakes every 50 ms: the work is still running
    assert count.calls == 0 and plain_ref() is not None
    stub.stub_set_busy(0)
    # No tile_py call from here: the release thread polls and releases.
    assert released_within(lambda: count.calls == 1 and plain_ref() is None, poll=False), (
        count.calls, plain_ref())
    assert count.calls == 1
    """)


def test_a_plain_object_is_referenced_until_the_work_completes(stub_driver):
    run_with_stub(stub_driver, """
    plain = Plain()
    base = sys.getrefcount(plain)
    stub.stub_set_busy(1)
    tile_py.hold(STREAM, plain, plain)  # held twice: two references
    assert sys.getrefcount(plain) == base + 2, (sys.getrefcount(plain), base)
    tile_py.stats()
    assert sys.getrefcount(plain) == base + 2
    stub.stub_set_busy(0)
    tile_py.stats()
    assert sys.getrefcount(plain) == base, (sys.getrefcount(plain), base)
    # Any object: a bytearray, a tuple holding a capsule (held by reference, not consumed).
    cap, count = make_capsule()
    buf, box = bytearray(16), (cap,)
    refs = (sys.getrefcount(buf), sys.getrefcount(box))
    tile_py.hold(STREAM, buf, box, None, 3)
    tile_py.synchronize()
    assert (sys.getrefcount(buf), sys.getrefcount(box)) == refs
    assert capsule_name(cap) == "dltensor_versioned" and count.calls == 0
    """)


def test_a_host_producer_refusing_the_stream_is_referenced_until_the_work_completes(stub_driver):
    # A host staging buffer of an async copy (a NumPy array, a CPU tensor): its __dlpack__
    # refuses a CUDA stream, as DLPack asks of host memory ("stream should be None on cpu"). It
    # has no GPU work to order, so it is kept alive as any other object is; a launch refuses it.
    run_with_stub(stub_driver, """
    class HostArray(Producer):
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            self.calls.append({"stream": stream, "max_version": max_version})
            if stream is not None:
                raise BufferError("stream should be None on cpu")
            return self._export()

    host = HostArray(device=(1, 0))
    base = sys.getrefcount(host)
    stub.stub_set_busy(1)
    tile_py.hold(STREAM, host)
    assert host.calls == [{"stream": STREAM, "max_version": (1, 3)}] and host.deleted == 0
    assert sys.getrefcount(host) == base + 1, (sys.getrefcount(host), base)
    assert tile_py.stats()["pending_guards"] == 1
    stub.stub_set_busy(0)
    tile_py.stats()
    assert sys.getrefcount(host) == base and host.deleted == 0
    # A device producer's refusal is still an error, with nothing held.
    class Failing(Producer):
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            raise BufferError("cannot export")

    device = Failing()
    base = sys.getrefcount(device)
    try:
        tile_py.hold(STREAM, device)
    except BufferError as e:
        assert str(e) == "cannot export", e
    else:
        raise AssertionError("a failed device export was held")
    assert sys.getrefcount(device) == base
    # NumPy itself, when installed: held, not refused.
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        a = np.zeros(16, dtype=np.float32)
        base = sys.getrefcount(a)
        stub.stub_set_busy(1)
        tile_py.hold(STREAM, a)
        assert sys.getrefcount(a) == base + 1
        stub.stub_set_busy(0)
        tile_py.synchronize()
        assert sys.getrefcount(a) == base
    """)


def test_a_consumed_capsule_is_taken_over_and_its_deleter_runs_once(stub_driver):
    run_with_stub(stub_driver, """
    for versioned in (True, False):
        cap, count = consumed_capsule(versioned=versioned)
        stub.stub_set_busy(1)
        tile_py.hold(STREAM, cap)
        del cap  # the capsule dies: its destructor sees `used_*` and runs nothing
        gc.collect()
        tile_py.stats()
        assert count.calls == 0, versioned
        stub.stub_set_busy(0)
        tile_py.stats()
        assert count.calls == 1, versioned
    tile_py.synchronize()
    assert count.calls == 1
    """)


def test_a_consumed_capsule_tile_would_not_launch_on_is_held_all_the_same(stub_driver):
    """The launcher's work uses the memory of a consumed capsule whatever its descriptor says (a
    DLPack version tile does not read, a rank out of range): taken over unread, released once
    after the work, never refused, never before."""
    run_with_stub(stub_driver, """
    caps = [consumed_capsule(version=(2, 0)), consumed_capsule(ndim=-1),
            consumed_capsule(ndim=-1, versioned=False)]
    stub.stub_set_busy(1)
    tile_py.hold(STREAM, *(cap for cap, _ in caps))
    caps = [count for _, count in caps]  # the capsules die: `used_*`, they run nothing
    gc.collect()
    tile_py.stats()
    assert [c.calls for c in caps] == [0, 0, 0]
    stub.stub_set_busy(0)
    tile_py.synchronize()
    assert [c.calls for c in caps] == [1, 1, 1]
    """)


def test_a_capsule_tile_py_consumed_itself_is_never_taken_over_again(stub_driver):
    """A `used_*` capsule is taken over only when another consumer renamed it: one tile_py
    claimed (in an earlier hold or launch, through another argument of the same call, or in a
    call in progress on the same capsule) is refused, so its deleter runs once."""
    run_with_stub(stub_driver, """
    def refused(*objects, index):
        try:
            tile_py.hold(STREAM, *objects)
        except ValueError as e:
            assert str(e).startswith(f"argument {index}: DLPack capsule already consumed by "
                                     "tile_py"), str(e)
        else:
            raise AssertionError("a capsule tile_py consumed was taken over again")

    # An earlier hold.
    cap, count = make_capsule()
    tile_py.hold(STREAM, cap)
    refused(cap, index=0)
    tile_py.synchronize()
    assert count.calls == 1

    # Claimed through a producer of the same call that hands out this very capsule.
    cap, count = make_capsule()
    class Returns:
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return cap
        def __dlpack_device__(self):
            return (2, 0)
    refused(Returns(), cap, index=1)
    tile_py.synchronize()
    assert capsule_name(cap) == "dltensor_versioned" and count.calls == 0  # given back

    # A hold from inside another hold that has claimed the capsule, which then rolls back.
    cap, count = make_capsule()
    inner = []
    class Reenters:
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            try:
                tile_py.hold(STREAM, cap)
            except ValueError as e:
                inner.append(str(e))
            raise RuntimeError("the producer fails")
        def __dlpack_device__(self):
            return (2, 0)
    try:
        tile_py.hold(STREAM, cap, Reenters())
    except RuntimeError:
        pass
    tile_py.synchronize()
    assert inner and inner[0].startswith("argument 0: DLPack capsule already consumed by tile_py")
    assert capsule_name(cap) == "dltensor_versioned" and count.calls == 0  # given back, unfreed
    """)


def test_a_refused_object_leaves_everything_as_it_was(stub_driver):
    run_with_stub(stub_driver, """
    class NotACapsule:
        def __dlpack__(self, stream=None, max_version=None):
            return 5

    class NoStream:
        def __dlpack__(self):
            raise AssertionError("never called without a stream")

    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    OTHER = b"not_dlpack"
    other = new(1, OTHER, None)
    cases = [
        (other, TypeError, "expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', "
                           "got a capsule named \\"not_dlpack\\""),
        (NotACapsule(), TypeError, "__dlpack__() returned 5 (int), expected a DLPack capsule"),
        (LegacyProducer(), TypeError, "__dlpack__ takes no stream argument"),
        (make_capsule(version=(2, 0))[0], BufferError, "unsupported DLPack version 2.0"),
        (make_capsule(ndim=-1)[0], ValueError, "ndim -1 is out of range 0..=64"),
    ]
    before = tile_py.stats()
    for bad, kind, message in cases:
        producer = Producer()
        cap, cap_count = make_capsule()
        used, used_count = consumed_capsule()
        plain = Plain()
        base = sys.getrefcount(plain)
        try:
            tile_py.hold(STREAM, producer, cap, used, plain, bad)
        except kind as e:
            assert str(e).startswith("argument 4: ") and message in str(e), (bad, str(e))
        else:
            raise AssertionError(f"{bad!r} was held")
        # Nothing held, nothing taken over: the claimed capsule has its name back, the export
        # made for the hold was released (it was the hold's own), the consumed capsule's
        # deleter is still its caller's, the plain object is not referenced.
        assert capsule_name(cap) == "dltensor_versioned" and cap_count.calls == 0
        assert capsule_name(used) == "used_dltensor_versioned" and used_count.calls == 0
        assert producer.deleted == len(producer.counters) == 1, (bad, producer.counters)
        assert sys.getrefcount(plain) == base, bad
    st = tile_py.stats()
    assert st["pending_guards"] == 0 and st["launches"] == before["launches"], st
    assert st["leaked"] == 0, st
    # The same capsule twice in one call.
    cap, count = make_capsule()
    try:
        tile_py.hold(STREAM, cap, cap)
    except ValueError as e:
        assert str(e).startswith("argument 1: the same DLPack capsule as argument 0"), str(e)
    else:
        raise AssertionError("a capsule was held twice")
    assert capsule_name(cap) == "dltensor_versioned" and count.calls == 0
    used, count = consumed_capsule()
    try:
        tile_py.hold(STREAM, used, Plain(), used)
    except ValueError as e:
        assert str(e).startswith("argument 2: the same DLPack capsule as argument 0"), str(e)
    else:
        raise AssertionError("a consumed capsule was taken over twice")
    assert count.calls == 0
    # A producer's own exception keeps its type, with the note naming the object.
    class Raises:
        def __dlpack__(self, stream=None, max_version=None):
            raise KeyError("mine")
    cap, count = make_capsule()
    try:
        tile_py.hold(STREAM, cap, Raises())
    except KeyError as e:
        assert "argument 1: raised while converting this argument" in "".join(e.__notes__)
    assert capsule_name(cap) == "dltensor_versioned" and count.calls == 0
    print("ok")
    """)


def test_a_bad_stream_is_refused_as_a_launch_refuses_it_touching_nothing(stub_driver):
    run_with_stub(stub_driver, """
    cases = [
        (None, TypeError, "stream is required (got None)"),
        (0, ValueError, "stream 0 is ambiguous"),
        (True, TypeError, "unsupported stream True"),
        ("s", TypeError, "unsupported stream type 's'"),
        (-5, ValueError, "stream handle -5 is not a valid CUstream"),
    ]
    producer = Producer()
    for stream, kind, message in cases:
        for objects in ((), (producer, make_capsule()[0], consumed_capsule()[0])):
            try:
                tile_py.hold(stream, *objects)
            except kind as e:
                assert str(e).startswith(message), str(e)
            else:
                raise AssertionError(f"stream {stream!r} was accepted")
            for c in objects[1:]:
                assert capsule_name(c) in ("dltensor_versioned", "used_dltensor_versioned")
    assert producer.calls == [], "a producer was exported for a refused stream"
    assert tile_py.hold(STREAM) is None  # nothing to hold
    print("ok")
    """)


def test_holds_from_many_threads_release_each_object_once(stub_driver):
    run_with_stub(stub_driver, """
    THREADS, ROUNDS = 8, 150
    counters, refs, errors = [], [], []
    lock = threading.Lock()
    Exchange, _ = make_exchange_producer_type(current_stream=STREAM)
    streams = [STREAM, STREAM + 16, 2]  # the per-thread default stream too

    def work(t):
        try:
            for i in range(ROUNDS):
                cap, c1 = make_capsule()
                used, c2 = consumed_capsule(versioned=bool(i % 2))
                ex = Exchange()
                plain = Plain()
                with lock:
                    counters.extend([c1, c2])
                    refs.append(weakref.ref(plain))
                tile_py.hold(streams[(t + i) % len(streams)], cap, used, ex, plain)
                with lock:
                    counters.append(ex.counters[0])
                if i % 37 == 0:
                    stub.stub_set_busy(t % 2)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    stub.stub_set_busy(0)
    tile_py.synchronize()
    gc.collect()
    calls = [c.calls for c in counters]
    assert len(calls) == THREADS * ROUNDS * 3 and set(calls) == {1}, sorted(set(calls))
    assert all(r() is None for r in refs)
    st = tile_py.stats()
    assert st["pending_guards"] == 0 and st["leaked"] == 0, st
    print("ok")
    """)


def test_under_capture_the_graph_owns_what_is_held(stub_driver):
    run_with_stub(stub_driver, """
    cap, count = make_capsule()
    used, used_count = consumed_capsule()
    plain = Plain()
    plain_ref = weakref.ref(plain)
    before = tile_py.stats()
    stub.stub_set_capturing(1)
    tile_py.hold(STREAM, cap, used, plain)
    stub.stub_set_capturing(0)
    del plain
    assert stub.stub_user_objects() == 1
    st = tile_py.stats()
    assert st["pending_guards"] == before["pending_guards"], st  # not the queue's
    tile_py.synchronize()  # the graph's, not the stream's: nothing to wait for
    assert (count.calls, used_count.calls) == (0, 0) and plain_ref() is not None
    stub.stub_destroy_graphs()  # the graph and its executables are gone
    assert released_within(lambda: (count.calls, used_count.calls) == (1, 1)
                           and plain_ref() is None), (count.calls, used_count.calls)
    assert stub.stub_user_objects() == 0
    tile_py.synchronize()
    assert (count.calls, used_count.calls) == (1, 1)
    print("ok")
    """)


def test_under_capture_what_the_graph_refuses_is_leaked_and_counted(stub_driver):
    """The other launcher's kernel is in the graph already: objects the graph could not take
    (cuUserObjectCreate failed) are leaked, never released, and counted."""
    run_with_stub(stub_driver, """
    used, used_count = consumed_capsule()
    plain = Plain()
    plain_ref = weakref.ref(plain)
    stub.stub_set_capturing(1)
    stub.stub_refuse_user_objects(1)
    try:
        tile_py.hold(STREAM, used, plain)
    except tile_py.CudaError as e:
        assert "cuUserObjectCreate" in str(e), str(e)
    else:
        raise AssertionError("the graph's refusal was not reported")
    stub.stub_refuse_user_objects(0)
    stub.stub_set_capturing(0)
    del plain, used
    gc.collect()
    stub.stub_destroy_graphs()
    tile_py.synchronize()
    assert used_count.calls == 0 and plain_ref() is not None
    assert tile_py.stats()["guards_leaked"] == 2, tile_py.stats()
    """)


EXIT = """
    import atexit
    import dlpack_ctypes

    class LoudCounter(dlpack_ctypes.Counter):
        # Says when the deleter runs: the counters are not readable after exit.
        @property
        def calls(self):
            return self._calls

        @calls.setter
        def calls(self, n):
            self._calls = n
            if n:
                print(f"deleter call {n}", flush=True)

    class Loud:
        def __del__(self):
            print("plain object dropped", flush=True)

    dlpack_ctypes.Counter = LoudCounter
    cap, count = make_capsule()
    stub.stub_set_busy(1)
    tile_py.hold(STREAM, cap, Loud())
    del cap
"""


def test_at_exit_held_objects_of_finished_work_are_released(stub_driver):
    r = run_with_stub(stub_driver, EXIT + """
    # Registered after tile_py's exit hook, so it runs before it: the work finishes first.
    atexit.register(lambda: stub.stub_set_busy(0))
    print("exiting", flush=True)
    """)
    lines = r.stdout.splitlines()
    assert lines[0] == "exiting", lines
    assert sorted(lines[1:]) == ["deleter call 1", "plain object dropped"], lines
    assert "leaked at exit" not in r.stderr, r.stderr


def test_at_exit_held_objects_of_unfinished_work_are_leaked_never_released(stub_driver):
    r = run_with_stub(stub_driver, EXIT + """
    print("exiting", flush=True)
    """)
    # The exit hook waits for the work up to its timeout, then leaks both (a deleter or a
    # decref of an object the GPU may still use must not run), with one warning.
    assert r.stdout.splitlines() == ["exiting"], r.stdout
    assert "tile_py: 2 tensor(s) or object(s) kept for GPU work leaked at exit" in r.stderr, r.stderr
    assert "panicked" not in r.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_forked_child_refuses_holds_and_never_releases_what_the_parent_holds(stub_driver):
    run_with_stub(stub_driver, """
    cap, count = make_capsule()
    stub.stub_set_busy(1)
    tile_py.hold(STREAM, cap, Plain())
    parent_leaked = tile_py.stats()["leaked"]
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            st = tile_py.stats()
            assert st["leaked"] == parent_leaked + 2, st  # what the parent's stream held
            child_cap, child_count = make_capsule()
            try:
                tile_py.hold(STREAM, child_cap)
            except ValueError as e:
                assert "os.fork" in str(e), str(e)
            else:
                raise AssertionError("a hold in a forked child was accepted")
            assert capsule_name(child_cap) == "dltensor_versioned" and child_count.calls == 0
            stub.stub_set_busy(0)
            tile_py.synchronize()
            tile_py.stats()
            assert count.calls == 0, "the child ran a deleter of the parent's hold"
            code = 0
        finally:
            sys.stdout.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert count.calls == 0
    stub.stub_set_busy(0)
    tile_py.stats()
    assert count.calls == 1
    print("ok")
    """)


def _stub_doc(name):
    """The docstring of `name` in the installed package's stub (tile_py/__init__.pyi)."""
    import ast

    import tile_py

    path = os.path.join(os.path.dirname(tile_py.__file__), "__init__.pyi")
    with open(path) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.get_docstring(node)
    raise AssertionError(f"{name} not in the stub")


@pytest.mark.parametrize("name", ["hold", "launch"])
def test_an_int_handle_must_keep_naming_its_stream_until_the_work_finished(name):
    # An int handle is named only inside the calls that launch or hold on it, and its work is
    # known finished from the events those calls record there, the newest answering for the
    # older ones: a handle destroyed while held work runs and reused by a new stream would let
    # the objects go while that work still reads them. The contract says so (it used to ask of
    # hold only a live stream during the call).
    import tile_py

    for doc in (getattr(tile_py, name).__doc__, _stub_doc(name)):
        text = " ".join(doc.split())
        assert "An int handle must name a live stream during the call and keep naming that " \
               "stream until the work" in text, text
