"""CPU tests of input classes taken from public bug reports of other DLPack and
``__cuda_array_interface__`` consumers and producers, and from their own test suites (rows 31
on of ``BAD_INPUT_ROWS.md``). Each asserts the exception type and text, exact deleter counts
and that nothing was launched."""

import gc

import pytest

from tile_py import _testing
from tile_py import In, Out
from dlpack_ctypes import (
    Producer,
    capsule_name,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    kDLCUDAManaged,
    make_capsule,
    make_exchange_producer_type,
)

from cpu_checks import check, run_with_stub


# ---- row 31: a capsule destructor that calls the deleter whatever the capsule's name ----------
# pytorch/pytorch#9260, dmlc/dlpack#51: CuPy's capsules of that time deleted the tensor when the
# capsule died, consumed or not, so a consumer that only renamed the capsule had its tensor freed
# under it (and deleted twice). JAX and nanobind clear the destructor of a capsule they consume.


@pytest.mark.parametrize("versioned", [True, False])
def test_row31_consumed_capsule_with_an_unconditional_destructor_is_deleted_once(
    counters, versioned
):
    cap, c = make_capsule(destructor="unconditional", versioned=versioned)
    check([In("float32")], (cap,))
    used = "used_dltensor_versioned" if versioned else "used_dltensor"
    assert capsule_name(cap) == used
    assert c.calls == 1 and counters["consumed"] == 1
    del cap
    gc.collect()
    assert c.calls == 1


def test_row31_export_with_an_unconditional_destructor_is_deleted_once(counters):
    p = Producer(destructor="unconditional")
    check([In("float32")], (p,))
    gc.collect()
    assert len(p.calls) == 1 and p.deleted == 1


def test_row31_a_capsule_given_back_keeps_its_destructor(counters):
    # Refused at the second argument, after the first was claimed: the capsule is given back as
    # it came, so that its producer still deletes it when it dies, once.
    cap, c = make_capsule(destructor="unconditional")
    with pytest.raises(TypeError, match=r"^argument 1: expected a tensor"):
        check([In("float32"), In("float32")], (cap, object()))
    assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
    del cap
    gc.collect()
    assert c.calls == 1 and counters["consumed"] == 0


def test_row31_a_capsule_given_back_by_consume_false_keeps_its_destructor(counters):
    cap, c = make_capsule(destructor="unconditional")
    check([Out("float32")], (cap,), consume=False)
    assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
    del cap
    gc.collect()
    assert c.calls == 1


# ---- row 32: an exchange-API export of managed or pinned host memory ---------------------------
# The DLPack C exchange API exports without synchronising ("the consumer should query
# DLPackCurrentWorkStream ... and launch kernels on it"): the launch's only ordering after the
# producer's pending writes is the producer's current work stream. It was asked for kDLCUDA and
# kDLROCM tensors only, so managed (kDLCUDAManaged) and pinned host (kDLCUDAHost) exports, which
# the launch accepts, were launched with no ordering at all. Their device id is 0 by DLPack's
# rule, so the producer is asked for its current CUDA stream on the launch device.


@pytest.mark.parametrize("device_type", [kDLCUDAManaged, kDLCUDAHost])
@pytest.mark.parametrize("launch_device", [0, 1])
def test_row32_exchange_export_of_managed_or_pinned_memory_is_ordered(
    counters, device_type, launch_device
):
    Ex, log = make_exchange_producer_type(current_stream=0x777)
    p = Ex(device=(device_type, 0))
    check([In("float32")], (p,), device=launch_device)
    assert log["current_work_stream"] == [(kDLCUDA, launch_device)]
    assert p.deleted == 1 and counters["consumed"] == 1


def test_row32_exchange_export_of_host_memory_asks_no_stream(counters):
    Ex, log = make_exchange_producer_type()
    p = Ex(device=(kDLCPU, 0))
    with pytest.raises(ValueError, match=r"^argument 0: tensor is on cpu"):
        check([In("float32")], (p,))
    assert log["current_work_stream"] == [] and p.deleted == 1


# ---- row 33: a __cuda_array_interface__ of managed or pinned host memory -----------------------
# A CAI dict names no memory kind: tile_py labelled every CAI array kDLCUDA on the device the
# driver reports for its pointer, so a numba managed array (``cuda.managed_array``) or a CuPy
# array of a managed pool, allocated on one GPU, was refused by a launch on another ("tensor is
# on cuda:1, but the launch stream is on cuda:0"), although managed and pinned host memory are
# usable from every device (as for the same memory exported through DLPack, row 10). The stub
# driver answers for its managed and page-locked ranges with device 1.


def test_row33_cai_of_managed_or_pinned_memory_is_labelled_as_such(stub_driver):
    code = """
        from tile_py import _testing, In, Out
        from cpu_checks import CAI, check
        MANAGED, PINNED, DEVICE = 0x6D0000001000, 0x680000001000, 0x7F0000001000
        before = _testing.debug_counters()["consumed"]
        for address in (MANAGED, PINNED):
            check([In("float32"), Out("float32")], (CAI(data=(address, False)),) * 2)
        assert _testing.debug_counters()["consumed"] == before + 4
        # Device memory is still the device's own.
        try:
            check([In("float32")], (CAI(data=(DEVICE, False)),), device=1)
        except ValueError as e:
            assert str(e) == "argument 0: tensor is on cuda:0, but the launch stream is on cuda:1", e
        else:
            raise AssertionError("device memory of device 0 was taken for a launch on device 1")
        print("ok")
    """
    assert run_with_stub(stub_driver, code).strip() == "ok"


# Row 10's managed memory of any DLPack device id, released: the deleter runs, as every
# release does, with a context of tile_py's current and the thread's stream-capture mode relaxed
# (a deleter's cudaFree must not break another thread's global-mode capture), also when the
# managed tensor names a device tile_py has no context for (the stub has one device; its
# managed range is 0x6d00_0000_0000 on).


def test_row10_managed_memory_of_another_device_id_is_released_relaxed(stub_driver):
    code = """
        import ctypes, os
        import tile_py
        from tile_py import In, Scalar
        from dlpack_ctypes import kDLCUDA, kDLCUDAManaged, make_capsule
        stub = ctypes.CDLL(os.environ["TILE_LIBCUDA"])
        stub.stub_driver_calls.restype = ctypes.c_ulonglong
        stub.stub_driver_calls.argtypes = [ctypes.c_char_p]
        STREAM = 0x5000
        lib = tile_py.Library.from_bytes(b"\\x7fELF stub image\\0")
        k = lib.kernel("k", [In("float32")] + [Scalar("u64")] * 6)

        class Relaxed(list):
            # Each deleter call appends: whether the capture mode is relaxed there (the stub's
            # cuThreadExchangeStreamCaptureMode calls come in pairs, an odd count inside one).
            def append(self, _thread):
                n = stub.stub_driver_calls(b"cuThreadExchangeStreamCaptureMode")
                super().append(n % 2 == 1)

        seen = {}
        for device, data in [((kDLCUDA, 0), 0x7F0000001000),
                             ((kDLCUDAManaged, 0), 0x6D0000001000),
                             ((kDLCUDAManaged, 1), 0x6D0000002000)]:
            cap, count = make_capsule(device=device, data=data)
            count.threads = Relaxed()
            tile_py.launch(STREAM, 1, k, (cap, 1, 2, 3, 4, 5, 6), block=1)
            tile_py.synchronize()
            seen[device] = (count.calls, list(count.threads))
        print(seen)
    """
    seen = eval(run_with_stub(stub_driver, code))
    assert seen == {
        (kDLCUDA, 0): (1, [True]),
        (kDLCUDAManaged, 0): (1, [True]),
        (kDLCUDAManaged, 1): (1, [True]),
    }, seen


# Row 31 through tile_py.hold: a capsule another launcher consumed (renamed used_*) and whose
# deleter duty the caller hands over; its destructor may still call the deleter when it dies.


def test_row31_hold_takes_over_a_consumed_capsule_with_an_unconditional_destructor(stub_driver):
    code = """
        import ctypes, gc, os
        import tile_py
        from dlpack_ctypes import capsule_name, make_capsule
        STREAM = 0x5000
        stub = ctypes.CDLL(os.environ["TILE_LIBCUDA"])
        ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
        USED = b"used_dltensor_versioned"
        cap, count = make_capsule(destructor="unconditional")
        assert ctypes.pythonapi.PyCapsule_SetName(cap, USED) == 0
        stub.stub_set_busy(1)
        tile_py.hold(STREAM, cap)
        del cap
        gc.collect()
        tile_py.stats()
        assert count.calls == 0, count.calls  # not while the work runs
        stub.stub_set_busy(0)
        tile_py.synchronize()
        assert count.calls == 1, count.calls
        # Refused (the second object is the same capsule): given back with its destructor.
        cap, count = make_capsule(destructor="unconditional")
        assert ctypes.pythonapi.PyCapsule_SetName(cap, USED) == 0
        try:
            tile_py.hold(STREAM, cap, cap)
        except ValueError as e:
            assert "the same DLPack capsule as argument 0" in str(e), e
        else:
            raise AssertionError("the same capsule twice was held")
        assert count.calls == 0 and capsule_name(cap) == "used_dltensor_versioned"
        del cap
        gc.collect()
        assert count.calls == 1, count.calls
        print("ok")
    """
    assert run_with_stub(stub_driver, code).strip() == "ok"


# ---- row 34: a __cuda_array_interface__ whose 'stream' is 0 ------------------------------------
# numba-cuda's DeviceNDArray gives ``'stream': int(self.stream)``, and ``int()`` of numba's
# default stream (``cuda.default_stream()``, the null handle) is 0: an array made or bound on it
# says ``'stream': 0``. The protocol's text disallows 0 as ambiguous, but numba's own consumer
# (``external_stream(0)``) and CuPy's (``streamSynchronize(0)``) take it as the null stream, which
# the driver reads as the legacy default stream; tile_py refused the array. It is now ordered
# after the legacy default stream, as ``'stream': 1`` is (and as ``__cuda_stream__``'s
# ``(0, 0)`` is taken).


def test_row34_cai_stream_0_is_the_legacy_default_stream(stub_driver):
    code = """
        import ctypes, os
        import tile_py
        from tile_py import In, Scalar
        from cpu_checks import CAI
        stub = ctypes.CDLL(os.environ["TILE_LIBCUDA"])
        stub.stub_driver_calls.restype = ctypes.c_ulonglong
        stub.stub_driver_calls.argtypes = [ctypes.c_char_p]
        lib = tile_py.Library.from_bytes(b"\\x7fELF stub image\\0")
        k = lib.kernel("k", [In("float32")] + [Scalar("i64")] * 6)

        def waits(stream, sync=True):
            before = stub.stub_driver_calls(b"cuStreamWaitEvent")
            x = CAI(data=(0x7F0000001000, False), stream=stream)
            tile_py.launch(0x5000, 1, k, (x, 1, 2, 3, 4, 5, 6), block=1, sync=sync).wait()
            return stub.stub_driver_calls(b"cuStreamWaitEvent") - before

        # Ordered after the legacy default stream, as 1 is; nothing to order for None, and
        # nothing with sync=False.
        assert [waits(s) for s in (0, 1, None)] == [1, 1, 0]
        assert waits(0, sync=False) == 0
        assert tile_py.stats()["leaked"] == 0
        print("ok")
    """
    assert run_with_stub(stub_driver, code).strip() == "ok"


# ---- row 35: a __cuda_array_interface__ of version 0 or 1 --------------------------------------
# RMM's ``DeviceBuffer`` (``{"data": (ptr, False), "shape": (size,), "strides": (1,), "typestr":
# "|u1", "version": 0}``) and cuDF's buffers (the same with ``"strides": None``) say version 0;
# numba's consumer takes every version (checking ``mask`` from version 1 on) and CuPy's does not
# look. tile_py refused anything but 2 and 3. Versions 0 and 1 are read as 2 is.


class _Iface:
    def __init__(self, **desc):
        self.__cuda_array_interface__ = desc


def test_row35_cai_of_version_0_or_1_is_read_as_version_2(counters):
    from tile_py import Scalar

    rmm_buffer = _Iface(data=(0x20000, False), shape=(64,), strides=(1,), typestr="|u1", version=0)
    cudf_buffer = _Iface(data=(0x30000, False), shape=(64,), strides=None, typestr="|u1", version=0)
    v1 = _Iface(data=(0x40000, False), shape=(16,), strides=None, typestr="<f4", version=1,
                mask=None)
    check([In("uint8"), Out("uint8"), In("float32"), Scalar("i64")],
          (rmm_buffer, cudf_buffer, v1, 64))
    assert counters["consumed"] == 3 and counters["released"] == 3
    for desc, error in [
        (dict(version=1, mask=object()), "masked arrays are not supported"),
        (dict(version=4), "unsupported version 4 (0 to 3 expected)"),
        (dict(version=-1), "unsupported version -1 (0 to 3 expected)"),
    ]:
        bad = _Iface(**{"data": (0x20000, False), "shape": (4,), "typestr": "<f4", **desc})
        with pytest.raises(ValueError) as e:
            check([In("float32")], (bad,))
        assert str(e.value) == "argument 0: __cuda_array_interface__: " + error
    assert counters["consumed"] == 3 and counters["released"] == 3


# ---- row 36: a __cuda_array_interface__ whose 'data' is a sequence but not a tuple -------------
# cuDF's spillable buffers give ``"data": DelayedPointerTuple(buffer)``, a
# ``collections.abc.Sequence`` of two items that reads (and pins) the device pointer when item 0
# is read; numba's and CuPy's consumers index ``desc["data"][0]`` and take it (PyTorch's does
# not: cuDF says so). tile_py refused anything but a tuple.


def test_row36_cai_data_given_as_a_sequence_of_two_items(counters):
    import collections.abc

    class DelayedPointerTuple(collections.abc.Sequence):
        def __init__(self, ptr):
            self.ptr, self.reads = ptr, 0

        def __len__(self):
            return 2

        def __getitem__(self, i):
            if i == 0:
                self.reads += 1
                return self.ptr
            if i == 1:
                return False
            raise IndexError("tuple index out of range")

    delayed = DelayedPointerTuple(0x20000)
    for data in (delayed, [0x30000, False]):
        check([Out("float32")], (_Iface(data=data, shape=(4,), typestr="<f4", version=3),))
    assert delayed.reads == 1
    assert counters["consumed"] == 2 and counters["released"] == 2
    # A read-only pair is read-only whatever holds it; anything but two items is refused.
    with pytest.raises(ValueError, match=r"^argument 0: tensor is read-only"):
        ro = _Iface(data=[0x20000, True], shape=(4,), typestr="<f4", version=3)
        check([Out("float32")], (ro,))
    for data in ([0x20000], [0x20000, False, 0], "ab", 0x20000):
        with pytest.raises(ValueError) as e:
            check([In("float32")], (_Iface(data=data, shape=(4,), typestr="<f4", version=3),))
        assert str(e.value) == (
            "argument 0: __cuda_array_interface__: 'data' must be a (pointer, read_only) pair"
        ), data
    # The read-only descriptor was made, refused and released; the malformed ones never made.
    assert counters["consumed"] == counters["released"] == 3
