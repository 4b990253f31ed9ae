"""CPU tests of tile_py's argument path: the bad-input table (reliability plan, section 6), the
stream handshake, capsule consumption and rollback. They run the same conversion and checks as
``tile_py.launch`` through ``_testing.check_args`` (no device needed), or ``tile_py.launch``
itself where it fails before needing a driver. Every test asserts the exception type, the argument
index and offending value in the message, the deleter count, and that nothing was launched."""

import gc
import sys
import threading

import numpy as np
import pytest

import tile_py
from tile_py import _testing
from tile_py import In, InOut, Out, Scalar
from dlpack_ctypes import (
    BF16,
    F32,
    F64,
    I32,
    READ_ONLY,
    LegacyProducer,
    Producer,
    StreamOnlyProducer,
    capsule_name,
    kDLBfloat,
    kDLCPU,
    kDLCUDA,
    kDLCUDAHost,
    kDLCUDAManaged,
    kDLFloat,
    kDLFloat4_e2m1fn,
    make_capsule,
)

STREAM = 0x1234


def check(params, args, **kw):
    kw.setdefault("stream", STREAM)
    return _testing.check_args(params, args, **kw)


# ---- success paths ----------------------------------------------------------------------------


@pytest.mark.parametrize("versioned", [True, False])
def test_capsule_consumed_once(counters, versioned):
    cap, c = make_capsule(versioned=versioned)
    check([In("float32")], (cap,))
    assert capsule_name(cap).startswith("used_dltensor")
    assert c.calls == 1
    assert counters["consumed"] == 1 and counters["released"] == 1
    with pytest.raises(ValueError, match=r"argument 0: DLPack capsule already consumed"):
        check([In("float32")], (cap,))
    del cap
    gc.collect()
    assert c.calls == 1


def test_producer_consumed_and_released(counters):
    p = Producer(shape=(3, 4), dtype=BF16)
    check([InOut("bfloat16")], (p,))
    assert p.calls == [{"stream": STREAM, "max_version": (1, 3)}]
    assert p.deleted == 1


def test_null_strides_are_compact_and_zero_size_null_data_ok(counters):
    cap, c = make_capsule(shape=(3, 4), strides=None)
    cap0, c0 = make_capsule(shape=(0,), data=0)
    check([Out("float32"), Out("float32")], (cap, cap0))
    assert (c.calls, c0.calls) == (1, 1)


def test_scalars_accept_python_and_numpy(counters):
    params = [Scalar("i32"), Scalar("u64"), Scalar("f32"), Scalar("f64"), Scalar("bool")]
    check(params, (np.int32(-5), 2**64 - 1, np.float32(1.5), 3, np.bool_(True)))
    check(params, (-(2**31), 0, 1e38, float("inf"), False))


def test_input_may_be_read_only_or_broadcast(counters):
    ro, c1 = make_capsule(flags=READ_ONLY)
    bc, c2 = make_capsule(shape=(4, 4), strides=(0, 1))
    # A broadcast is not dense row-major: its parameter is declared strided.
    check([In("float32"), In("float32", strided=True)], (ro, bc))
    assert (c1.calls, c2.calls) == (1, 1)


# ---- row 1: wrong capsule name / not a capsule ---------------------------------------------


def test_row1_wrong_capsule_name(counters):
    cap, c = make_capsule(name="foo", destructor=False)
    with pytest.raises(TypeError, match=r"argument 0: .*named \"foo\""):
        check([In("float32")], (cap,))
    assert capsule_name(cap) == "foo"
    assert c.calls == 0 and counters["consumed"] == 0


@pytest.mark.parametrize(
    "name",
    ["d", "dltenso", "dltensorX", "dltensor_", "dltensor_versione", "dltensor_versionedX",
     "used_", "used_dltenso", "used_dltensor_", "used_dltensor_versionedX", "usedltensor",
     "DLTENSOR", "dltensor versioned"],
)
def test_row1_a_name_that_only_starts_or_ends_like_dlpack_s_is_refused(counters, name):
    """Only the four DLPack names count, whole: a prefix of one, one with more after it, or one
    spelled otherwise is another kind of capsule, refused and left as it was."""
    cap, c = make_capsule(name=name, destructor=False)
    with pytest.raises(TypeError, match=r"argument 0: .*named " + repr_re(name).replace("'", '"')):
        check([In("float32")], (cap,))
    assert capsule_name(cap) == name
    assert c.calls == 0 and counters["consumed"] == 0


@pytest.mark.parametrize("bad", [1, None, "x", object()])
def test_row1_not_a_tensor(counters, bad):
    good = Producer()
    with pytest.raises(TypeError, match=r"argument 1: expected a tensor \(input tensor of float32\).*got " + repr_re(bad)):
        check([In("float32"), In("float32")], (good, bad))
    assert good.deleted == 1  # argument 0 was converted first: released, not leaked
    assert counters["consumed"] == 0


def repr_re(obj):
    import re

    return re.escape(repr(obj)[:20])


def test_row1_dlpack_returns_non_capsule(counters):
    class ListProducer:
        calls = 0

        def __dlpack__(self, **kw):
            ListProducer.calls += 1
            return [1, 2]

    with pytest.raises(TypeError, match=r"argument 0: __dlpack__\(\) returned \[1, 2\] \(list\)"):
        check([In("float32")], (ListProducer(),))
    assert ListProducer.calls == 1


# ---- row 2: already consumed -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["used_dltensor", "used_dltensor_versioned"])
def test_row2_used_capsule(counters, name):
    cap, c = make_capsule(name=name, destructor=False)
    with pytest.raises(ValueError, match=rf"argument 0: DLPack capsule already consumed .*{name}"):
        check([In("float32")], (cap,))
    assert c.calls == 0


def test_row2_same_capsule_twice_in_one_call(counters):
    cap, c = make_capsule()
    with pytest.raises(ValueError, match=r"argument 1: the same DLPack capsule as argument 0; a capsule can be consumed only once"):
        check([In("float32"), In("float32")], (cap, cap))
    # Argument 0's claim was rolled back: the capsule is untouched and still usable.
    assert c.calls == 0 and capsule_name(cap) == "dltensor_versioned"


# ---- row 3: major version too new ------------------------------------------------------------


def test_row3_major_version_too_new_raw_capsule(counters):
    cap, c = make_capsule(version=(2, 0), ndim=-99, null_shape=True)
    with pytest.raises(BufferError, match=r"argument 0: unsupported DLPack version 2\.0"):
        check([In("float32")], (cap,))
    # Not ours: the name is restored and the capsule's destructor deletes it, exactly once.
    assert capsule_name(cap) == "dltensor_versioned"
    assert c.calls == 0
    del cap
    gc.collect()
    assert c.calls == 1


def test_row3_major_version_too_new_producer(counters):
    p = Producer(version=(2, 0), ndim=-99, null_shape=True)
    with pytest.raises(BufferError, match=r"argument 0: unsupported DLPack version 2\.0"):
        check([In("float32")], (p,))
    assert p.deleted == 1


def test_row3_major_version_too_new_exchange_api(counters):
    from dlpack_ctypes import make_exchange_producer_type

    Ex, log = make_exchange_producer_type()
    p = Ex(version=(2, 0), ndim=-5, null_shape=True)
    with pytest.raises(BufferError, match=r"argument 0: unsupported DLPack version 2\.0"):
        check([In("float32")], (p,))
    assert log["from_obj"] == 1 and p.deleted == 1


# ---- rows 4-9: malformed descriptors (deleter exactly once via the producer's capsule) ---------


@pytest.mark.parametrize(
    "kwargs, exc, pattern",
    [
        (dict(data=0, shape=(4,)), ValueError, r"data pointer is null but the tensor has 4 elements"),
        (dict(ndim=-1), ValueError, r"ndim -1 is out of range 0..=64"),
        (dict(shape=(1,) * 65), ValueError, r"ndim 65 is out of range 0..=64"),
        (dict(null_shape=True, shape=(4,)), ValueError, r"shape pointer is null with ndim 1"),
        (dict(shape=(-1,)), ValueError, r"shape\[0\] is negative: -1"),
        (dict(shape=(2**62, 4)), OverflowError, r"element count overflows"),
        (dict(shape=(2,), strides=(2**62,), dtype=F64), OverflowError, r"byte extent overflows"),
        (dict(data=2**64 - 8, byte_offset=16), OverflowError, r"data pointer \+ byte_offset overflows"),
        (dict(data=0x10002), ValueError, r"0x10002 .*not aligned to 4 bytes for float32"),
        (dict(dtype=(kDLFloat, 32, 4)), TypeError, r"code 2, bits 32, lanes 4.*kernel expects input tensor of float32"),
        (dict(dtype=(kDLFloat, 24, 1)), TypeError, r"code 2, bits 24, lanes 1"),
        (dict(dtype=(200, 8, 1)), TypeError, r"code 200"),
        (dict(dtype=(kDLFloat4_e2m1fn, 8, 1)), TypeError, r"code 17, bits 8"),
        (dict(device=(99, 0)), ValueError, r"invalid device \(device_type 99"),
    ],
)
def test_rows4_to_9_malformed(counters, kwargs, exc, pattern):
    p = Producer(**kwargs)
    with pytest.raises(exc, match=r"argument 0: .*" + pattern):
        check([In("float32")], (p,))
    assert p.deleted == 1
    assert counters["consumed"] == 0


def test_rows4_to_9_raw_capsule_not_consumed(counters):
    cap, c = make_capsule(shape=(-3,))
    with pytest.raises(ValueError, match=r"argument 0: shape\[0\] is negative: -3"):
        check([In("float32")], (cap,))
    assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
    del cap
    gc.collect()
    assert c.calls == 1


def test_row9_dtype_mismatch(counters):
    p = Producer(dtype=I32)
    with pytest.raises(TypeError, match=r"argument 0: expected a tensor of float32, got int32"):
        check([In("float32")], (p,))
    assert p.deleted == 1


# ---- row 10: device --------------------------------------------------------------------------


def test_row10_numpy_host_memory_refused(counters):
    # NumPy refuses any stream but None (RuntimeError); tile_py then asks __dlpack_device__ and
    # refuses host memory without exporting it.
    a = np.arange(10, dtype=np.float32)
    before = sys.getrefcount(a)
    with pytest.raises(ValueError, match=r"argument 0: tensor is on cpu, but the launch stream is on cuda:0; .*ndarray.* is host memory") as ei:
        check([In("float32")], (a,))
    assert ei.value.__cause__ is not None
    # The message ends with the fix.
    assert str(ei.value).endswith(
        "move it to the device first, e.g. torch.from_numpy(x).cuda() or cupy.asarray(x)"
    ), str(ei.value)
    assert counters["consumed"] == 0
    del ei
    gc.collect()
    assert sys.getrefcount(a) == before  # NumPy's deleter ran: no reference kept


@pytest.mark.parametrize(
    "device, shown", [((kDLCUDA, 1), "cuda:1"), ((kDLCPU, 0), "cpu"), ((9, 0), "device_type 9:0")]
)
def test_row10_wrong_device(counters, device, shown):
    p = Producer(device=device)
    with pytest.raises(ValueError, match=rf"argument 0: tensor is on {shown}, but the launch stream is on cuda:0") as ei:
        check([In("float32")], (p,))
    assert p.deleted == 1
    # Host memory is told how to move to the device; another device is not.
    assert str(ei.value).endswith("cupy.asarray(x)") == (shown == "cpu"), str(ei.value)


def test_row10_stream_device_from_keyword(counters):
    p = Producer(device=(kDLCUDA, 1))
    check([In("float32")], (p,), device=1)
    assert p.deleted == 1


def test_row10_pinned_host_accepted(counters):
    p = Producer(device=(kDLCUDAHost, 0))
    check([In("float32")], (p,))
    assert p.deleted == 1


@pytest.mark.parametrize("device", [(kDLCUDAManaged, 0), (kDLCUDAHost, 7)])
def test_row10_managed_on_the_stream_device_and_pinned_host_with_any_id_accepted(counters, device):
    p = Producer(device=device)
    check([Out("float32")], (p,))
    assert p.deleted == 1


@pytest.mark.parametrize("device", [(kDLCUDAManaged, 1), (kDLCUDAManaged, 5)])
def test_row10_managed_with_another_device_id_accepted(counters, device):
    # DLPack sets the device id of managed memory to 0 whatever GPU allocated it (dlpack.h,
    # DLDevice: "for vanilla CPU memory, pinned memory, or managed memory, this is set to 0"),
    # CuPy sets the allocating GPU's: either way the id does not name the launch device, and
    # managed memory is usable from every device. A launch on device 1 of a conforming
    # producer's (kDLCUDAManaged, 0) tensor was refused.
    p = Producer(device=device)
    check([Out("float32")], (p,))
    assert p.deleted == 1 and counters["consumed"] == 1
    check([Out("float32")], (Producer(device=(kDLCUDAManaged, 0)),), device=1)


# ---- rows 11-12: outputs ---------------------------------------------------------------------


def test_row11_read_only_output(counters):
    p = Producer(flags=READ_ONLY)
    with pytest.raises(ValueError, match=r"argument 1: tensor is read-only \(DLPACK_FLAG_BITMASK_READ_ONLY\)"):
        check([In("float32"), Out("float32")], (Producer(), p))
    assert p.deleted == 1


def test_row11_read_only_inout(counters):
    p = Producer(flags=READ_ONLY)
    with pytest.raises(ValueError, match=r"argument 0: tensor is read-only"):
        check([InOut("float32")], (p,))
    assert p.deleted == 1


def test_row12_overlapping_output(counters):
    p = Producer(shape=(4, 4), strides=(0, 1))
    with pytest.raises(ValueError, match=r"argument 0: tensor has internal overlap at axis 0"):
        check([Out("float32")], (p,))
    assert p.deleted == 1


# ---- row 13: grid / block (converted by launch itself, before any argument is touched) --------
# Only what a dimension cannot be (not an int, below 0, above 2**32 - 1) is refused here; the
# limits (at least 1, the device's maxima) are tile-launch's, checked once with the launch
# (test_gpu_edges.py::test_row13_limits_are_checked_once_by_the_launch).


@pytest.mark.parametrize(
    "grid, block, exc, pattern",
    [
        ("1", 1, TypeError, r"grid must be an int or a tuple or list of 1 to 3 ints, got '1'"),
        ([1, 2, 3, 4], 1, ValueError, r"grid has 4 dimensions, \[1, 2, 3, 4\]"),
        (1, [1.5], TypeError, r"block\[0\] must be an int, got 1.5"),
        ((1, 2, 3, 4), 1, ValueError, r"grid has 4 dimensions, \(1, 2, 3, 4\)"),
        ((-1,), 1, ValueError, r"grid\[0\] is -1, outside 0..=4294967295"),
        ((2**32,), 1, ValueError, r"grid\[0\] is 4294967296, outside 0..=4294967295"),
        (-5, 1, ValueError, r"grid\[0\] is -5, outside"),
        ((1, 1.5), 1, TypeError, r"grid\[1\] must be an int, got 1.5"),
        (1, (2**40,), ValueError, r"block\[0\] is 1099511627776, outside"),
        (1, True, TypeError, r"block must be an int or a tuple or list of 1 to 3 ints, got True"),
    ],
)
def test_row13_grid_and_block(counters, grid, block, exc, pattern):
    cap, c = make_capsule()
    with pytest.raises(exc, match=pattern):
        tile_py.launch(STREAM, grid, None, (cap,), block=block)
    assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
    check([In("float32")], (cap,))  # still usable
    assert c.calls == 1


@pytest.mark.parametrize("grid, block", [([4], [256]), ([4, 2], (256,)), (4, [16, 16, 1])])
def test_row13_lists_are_dimensions_as_tuples_are(counters, grid, block):
    # A list is read as the tuple of its items (as `args` takes either): the configuration is
    # accepted and the launch goes on to the next check, the kernel.
    cap, c = make_capsule()
    with pytest.raises(TypeError, match=r"kernel must be a tile_py.Kernel, got None"):
        tile_py.launch(STREAM, grid, None, (cap,), block=block, cluster=[1])
    check([In("float32")], (cap,), grid=grid, block=block)
    assert c.calls == 1


def test_row13_numpy_integer_dimensions_are_ints(counters):
    # Dimensions computed with NumPy (np.int64 from shape arithmetic) are taken as ints, through
    # __index__; NumPy floats and bools are not ints. The kernel check comes after the
    # configuration, so reaching it means the configuration was read.
    for grid, block in [(np.int64(4), 256), ((np.int32(2), np.uint8(3)), (np.int64(128),))]:
        with pytest.raises(TypeError, match="kernel must be a tile_py.Kernel"):
            tile_py.launch(STREAM, grid, None, (), block=block)
    with pytest.raises(TypeError, match=r"grid must be an int or a tuple or list of 1 to 3 ints, got (np\.float64\()?4\.0"):
        tile_py.launch(STREAM, np.float64(4), None, (), block=1)
    with pytest.raises(TypeError, match=r"block\[0\] must be an int, got (np\.)?True"):
        tile_py.launch(STREAM, 1, None, (), block=(np.bool_(True),))
    with pytest.raises(ValueError, match=r"grid\[0\] is -1, outside"):
        tile_py.launch(STREAM, np.int64(-1), None, (), block=1)
    with pytest.raises(KeyboardInterrupt):
        tile_py.launch(STREAM, (_Index(KeyboardInterrupt()),), None, (), block=1)


def test_row13_shared_mem(counters):
    with pytest.raises(ValueError, match=r"shared_mem is -1 bytes"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=-1)
    with pytest.raises(TypeError, match=r"shared_mem must be an int"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=1.0)


def test_launch_rejects_non_kernel(counters):
    cap, c = make_capsule()
    with pytest.raises(TypeError, match=r"kernel must be a tile_py.Kernel, got 'k' \(str\)"):
        tile_py.launch(STREAM, 1, "k", (cap,), block=1)
    assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0


# ---- row 14: argument count / kind -------------------------------------------------------------


def test_row14_argument_count(counters):
    p = Producer()
    with pytest.raises(TypeError, match=r"expects 2 arguments but 1 were given"):
        check([In("float32"), In("float32")], (p,))
    assert p.calls == [] and p.deleted == 0  # the producer was never asked


def test_row14_args_not_a_sequence(counters):
    with pytest.raises(TypeError, match=r"args must be a tuple or a list, got"):
        check([In("float32")], Producer())


def test_row14_tensor_for_scalar(counters):
    p = Producer()
    with pytest.raises(TypeError, match=r"argument 1: expected a number for scalar u64, got <.*Producer"):
        check([In("float32"), Scalar("u64")], (Producer(), p))
    assert p.calls == []


# ---- row 15: scalars ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ty, value, exc, pattern",
    [
        ("i32", 2**31, OverflowError, r"argument 1: 2147483648 \(int\) does not fit scalar i32 \(range -2147483648..=2147483647\)"),
        ("u64", -1, OverflowError, r"argument 1: -1 \(int\) does not fit scalar u64"),
        ("u8", 256, OverflowError, r"argument 1: 256 \(int\) does not fit scalar u8"),
        ("i64", 2**200, OverflowError, r"argument 1: .* does not fit scalar i64"),
        ("i32", 1.5, TypeError, r"argument 1: expected an integer for scalar i32, got 1.5 \(float\)"),
        ("i32", True, TypeError, r"argument 1: expected an integer for scalar i32, got True \(bool\)"),
        ("i32", "3", TypeError, r"argument 1: expected an integer for scalar i32, got '3' \(str\)"),
        ("f32", "x", TypeError, r"argument 1: expected a float for scalar f32, got 'x' \(str\)"),
        ("f32", 1e300, OverflowError, r"argument 1: 1e\+300 \(float\) does not fit scalar f32"),
        ("bool", 1, TypeError, r"argument 1: expected a bool for scalar bool, got 1 \(int\)"),
        ("i16", np.int64(40000), OverflowError, r"argument 1: .*40000.* does not fit scalar i16"),
        ("f64", 1 + 2j, TypeError, r"argument 1: expected a float for scalar f64, got \(1\+2j\) \(complex\)"),
        ("f64", np.complex128(1 + 2j), TypeError, r"argument 1: expected a float for scalar f64, got .*complex128"),
        ("f32", np.complex64(1), TypeError, r"argument 1: expected a float for scalar f32, got .*complex64"),
    ],
)
def test_row15_scalar(counters, ty, value, exc, pattern):
    p = Producer()
    with pytest.raises(exc, match=pattern):
        check([In("float32"), Scalar(ty)], (p, value))
    assert p.deleted == 1  # argument 0 was converted first, then released


# ---- row 16: streams ---------------------------------------------------------------------------


def test_row16_stream_none(counters):
    cap, c = make_capsule()
    with pytest.raises(TypeError, match=r"stream is required \(got None\).*torch\.cuda\.current_stream\(\)"):
        tile_py.launch(None, 1, None, (cap,), block=1)
    assert c.calls == 0 and capsule_name(cap) == "dltensor_versioned"


@pytest.mark.parametrize(
    "stream, exc, pattern",
    [
        (0, ValueError, r"stream 0 is ambiguous"),
        (-5, ValueError, r"stream handle -5 is not a valid CUstream"),
        ("s", TypeError, r"unsupported stream type 's' \(str\)"),
        (1.0, TypeError, r"unsupported stream type 1.0 \(float\)"),
        (True, TypeError, r"unsupported stream True"),
    ],
)
def test_row16_bad_stream(counters, stream, exc, pattern):
    p = Producer()
    with pytest.raises(exc, match=pattern):
        check([In("float32")], (p,), stream=stream)
    assert p.calls == [] and p.deleted == 0


# ---- row 17: producer errors -------------------------------------------------------------------


def test_row17_producer_raises(counters):
    class Boom(Producer):
        def __dlpack__(self, **kw):
            self.calls.append(kw)
            raise RuntimeError("boom")

    b = Boom()
    with pytest.raises(RuntimeError, match="boom") as ei:
        check([In("float32"), In("float32")], (Producer(), b))
    assert len(b.calls) == 1
    assert "argument 1: raised while converting this argument" in ei.value.__notes__


def test_row17_internal_type_error_is_not_retried(counters):
    class Internal(Producer):
        def __dlpack__(self, **kw):
            self.calls.append(kw)
            raise TypeError("unsupported dtype in producer")

    p = Internal()
    with pytest.raises(TypeError, match="unsupported dtype in producer"):
        check([In("float32")], (p,))
    assert len(p.calls) == 1


# ---- the stream handshake ------------------------------------------------------------------------


class CudaStream:
    """Like torch.cuda.Stream / cuda.core Stream: __cuda_stream__ returns (version, handle)."""

    def __init__(self, handle, device=None):
        self.handle = handle
        if device is not None:
            self.device_id = device

    def __cuda_stream__(self):
        return (0, self.handle)


class CupyLikeStream:
    def __init__(self, ptr):
        self.ptr = ptr


CupyLikeStream.__module__ = "cupy.cuda.stream"  # what tile_py takes a `ptr` from


class NotAStream:
    """Has a `ptr` (as a CuPy event or memory pointer has), but is no CuPy stream."""

    def __init__(self, ptr):
        self.ptr = ptr
        self.cuda_stream = ptr


@pytest.mark.parametrize("obj", [NotAStream(0x7F0000001000)])
def test_objects_with_a_ptr_that_are_no_streams_are_refused(counters, obj):
    p = Producer()
    with pytest.raises(TypeError, match="unsupported stream type"):
        check([In("float32")], (p,), stream=obj)
    assert p.calls == [] and p.deleted == 0


@pytest.mark.parametrize(
    "stream, sync, seen",
    [
        (0x1234, True, 0x1234),
        (1, True, 1),
        (2, True, 1),  # the per-thread default stream is asked on the legacy stream (row 20)
        (CudaStream(0), True, 1),  # torch's default stream: handle 0 is sent as 1, never 0
        (CudaStream(0xBEEF), True, 0xBEEF),
        (CupyLikeStream(0), True, 1),
        (CupyLikeStream(0xF00), True, 0xF00),
        (0x1234, False, -1),  # only when the caller opts out
    ],
)
def test_stream_value_passed_to_producer(counters, stream, sync, seen):
    p = Producer()
    check([In("float32")], (p,), stream=stream, sync=sync)
    assert p.calls == [{"stream": seen, "max_version": (1, 3)}]
    assert p.deleted == 1


def test_stream_device_attribute_is_used(counters):
    p = Producer(device=(kDLCUDA, 3))
    check([In("float32")], (p,), stream=CudaStream(0x99, device=3))
    assert p.deleted == 1


def test_cuda_producer_is_not_asked_its_device(counters):
    # The launch stream is offered straight away: __dlpack_device__ is asked only when
    # __dlpack__ raises (the device is read from the returned tensor).
    class Counting(Producer):
        device_calls = 0

        def __dlpack_device__(self):
            Counting.device_calls += 1
            return self.device

    p = Counting()
    check([In("float32")], (p,))
    assert p.calls == [{"stream": STREAM, "max_version": (1, 3)}]
    assert Counting.device_calls == 0 and p.deleted == 1


def test_cpu_producer_accepting_the_stream_is_refused_unconsumed(counters):
    # A CPU producer that exports although it was given a stream: the device check refuses the
    # tensor and the rollback gives it back (its capsule's destructor deletes it), unconsumed.
    p = Producer(device=(kDLCPU, 0))
    with pytest.raises(ValueError, match=r"argument 0: tensor is on cpu, but the launch stream is on cuda:0"):
        check([In("float32")], (p,))
    assert p.calls == [{"stream": STREAM, "max_version": (1, 3)}]
    assert p.deleted == 1 and counters["consumed"] == 0


class StreamRefusingCpuProducer(Producer):
    """A host producer as DLPack wants them (NumPy's behaviour): any stream but None raises."""

    def __init__(self, **kw):
        super().__init__(device=(kDLCPU, 0), **kw)
        self.device_calls = 0

    def __dlpack_device__(self):
        self.device_calls += 1
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        if stream is not None:
            raise RuntimeError("only stream=None is supported")
        return self._export()


@pytest.mark.parametrize("sync, seen", [(True, STREAM), (False, -1)])
def test_cpu_producer_refusing_the_stream_gets_the_host_error(counters, sync, seen):
    p = StreamRefusingCpuProducer()
    with pytest.raises(ValueError) as ei:
        check([In("float32"), In("float32")], (Producer(), p), sync=sync)
    msg = str(ei.value)
    assert msg.startswith("argument 1: tensor is on cpu, but the launch stream is on cuda:0")
    assert "StreamRefusingCpuProducer" in msg and "is host memory" in msg
    assert isinstance(ei.value.__cause__, RuntimeError)
    # Offered the launch stream once (never stream=None), then asked its device; nothing was
    # exported, so nothing was consumed or deleted.
    assert p.calls == [{"stream": seen, "max_version": (1, 3)}]
    assert p.device_calls == 1
    assert p.counters == [] and counters["consumed"] == 0


def test_raising_cuda_producer_error_propagates_after_the_device_question(counters):
    class Boom(Producer):
        device_calls = 0

        def __dlpack_device__(self):
            Boom.device_calls += 1
            return self.device

        def __dlpack__(self, **kw):
            raise BufferError("cannot export")

    with pytest.raises(BufferError, match="cannot export") as ei:
        check([In("float32")], (Boom(),))
    assert Boom.device_calls == 1
    assert "argument 0: raised while converting this argument" in ei.value.__notes__


def test_raising_producer_with_raising_device_keeps_its_own_error(counters):
    class Both(Producer):
        def __dlpack_device__(self):
            raise RuntimeError("device unknown")

        def __dlpack__(self, **kw):
            raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        check([In("float32")], (Both(),))


def test_keyword_retry_stream_only_producer(counters):
    p = StreamOnlyProducer()
    check([In("float32")], (p,))
    assert p.calls == [{"stream": STREAM}]
    assert p.deleted == 1


def test_producer_without_a_stream_parameter_is_refused(counters):
    # The stream is never dropped: an export made without it is not ordered after the
    # producer's work (row 19).
    p = LegacyProducer(versioned=False)
    with pytest.raises(TypeError, match=r"argument 0: .*__dlpack__ takes no stream argument"):
        check([In("float32")], (p,))
    assert p.calls == []
    assert p.deleted == 0


# ---- partial conversion and rollback -----------------------------------------------------------


def test_partial_conversion_releases_what_it_took(counters):
    a, b = Producer(), Producer()
    with pytest.raises(TypeError, match=r"argument 2: expected a tensor .* got <object object"):
        check([In("float32")] * 3, (a, b, object()))
    assert (a.deleted, b.deleted) == (1, 1)
    assert counters["consumed"] == 0 and counters["launches_attempted"] == 1


def test_partial_conversion_restores_callers_capsules(counters):
    ca, ka = make_capsule()
    cb, kb = make_capsule(versioned=False)
    with pytest.raises(TypeError, match=r"argument 2"):
        check([In("float32")] * 3, (ca, cb, object()))
    assert capsule_name(ca) == "dltensor_versioned" and capsule_name(cb) == "dltensor"
    assert (ka.calls, kb.calls) == (0, 0)
    check([In("float32")] * 2, (ca, cb))
    assert (ka.calls, kb.calls) == (1, 1)


def test_check_failure_after_conversion_rolls_back_everything(counters):
    ca, ka = make_capsule()
    p = Producer()
    bad = Producer(dtype=I32)
    with pytest.raises(TypeError, match=r"argument 2: expected a tensor of float32, got int32"):
        check([In("float32")] * 3, (ca, p, bad))
    assert capsule_name(ca) == "dltensor_versioned" and ka.calls == 0
    assert (p.deleted, bad.deleted) == (1, 1)


def test_consume_false_rolls_back(counters):
    ca, ka = make_capsule()
    check([In("float32")], (ca,), consume=False)
    assert capsule_name(ca) == "dltensor_versioned" and ka.calls == 0


# ---- concurrent consumption of one capsule -------------------------------------------------------


def test_capsule_consumed_by_exactly_one_thread(counters):
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            cap, c = make_capsule()
            barrier = threading.Barrier(16)
            results = []

            def worker():
                barrier.wait()
                try:
                    check([In("float32")], (cap,))
                    results.append("ok")
                except ValueError as e:
                    assert "already consumed" in str(e)
                    results.append("consumed")

            threads = [threading.Thread(target=worker) for _ in range(16)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert results.count("ok") == 1 and results.count("consumed") == 15
            assert c.calls == 1
    finally:
        sys.setswitchinterval(old)


# ---- __cuda_array_interface__ --------------------------------------------------------------------


class CAI:
    def __init__(self, **over):
        self.__cuda_array_interface__ = {
            "shape": (4, 3),
            "typestr": "<f4",
            "data": (0x20000, False),
            "version": 3,
            "strides": None,
            "stream": 0x77,
        }
        self.__cuda_array_interface__.update(over)


def test_cai_object_is_held_then_released(counters):
    obj = CAI()
    before = sys.getrefcount(obj)
    check([InOut("float32")], (obj,))
    assert sys.getrefcount(obj) == before
    assert counters["consumed"] == 1 and counters["released"] == 1


def test_cai_strided(counters):
    check([In("float32", strided=True)], (CAI(strides=(4, 16)),))
    with pytest.raises(ValueError, match=r"argument 0: tensor is not dense row-major"):
        check([In("float32")], (CAI(strides=(4, 16)),))


@pytest.mark.parametrize(
    "over, exc, pattern",
    [
        (dict(data=(0x20000, True)), ValueError, r"argument 0: tensor is read-only"),
        (dict(stream=-1), ValueError, r"argument 0: __cuda_array_interface__: 'stream' is -1"),
        (dict(mask=object()), ValueError, r"argument 0: __cuda_array_interface__: masked arrays"),
        (dict(typestr=">f4"), TypeError, r"argument 0: unsupported __cuda_array_interface__ typestr \">f4\""),
        (dict(strides=(3, 4)), ValueError, r"strides\[0\] = 3 bytes is not a multiple of the item size 4"),
        (dict(typestr="<i4"), TypeError, r"argument 0: expected a tensor of float32, got int32"),
    ],
)
def test_cai_bad(counters, over, exc, pattern):
    obj = CAI(**over)
    before = sys.getrefcount(obj)
    with pytest.raises(exc, match=pattern):
        check([Out("float32")], (obj,))
    gc.collect()
    assert sys.getrefcount(obj) == before


# ---- parameter declarations ----------------------------------------------------------------------


def test_param_declarations():
    assert repr(In("f32")) == 'tile_py.In("float32")'
    assert repr(Out(np.float16)) == 'tile_py.Out("float16")'
    assert repr(InOut(np.dtype("int64"))) == 'tile_py.InOut("int64")'
    assert repr(In("bf16")) == 'tile_py.In("bfloat16")'
    assert repr(Scalar("uint64")) == 'tile_py.Scalar("u64")'
    assert In("float32") == In("f32")
    with pytest.raises(ValueError, match=r"unknown dtype 'float33'"):
        In("float33")
    with pytest.raises(ValueError, match=r"unknown scalar type 'u128'"):
        Scalar("u128")
    with pytest.raises(TypeError, match=r"params\[1\] must be a tile_py.In/Out/InOut/Scalar declaration"):
        check([In("f32"), "f32"], (1, 2))


def test_driver_errors_are_cuda_errors():
    # Without a driver, loading fails with CudaError (no driver). With one, the driver loads
    # PTX lazily, so the failure may come at the kernel lookup instead: CudaError either way.
    with pytest.raises(tile_py.CudaError) as info:
        lib = tile_py.Library.from_ptx(".version 8.0")
        lib.kernel("no_such_kernel", [])
    e = info.value
    assert isinstance(e, RuntimeError)
    # Both set from the failing driver call, or both None when no driver could be loaded
    # (DriverNotFoundError when the library is missing; test_cpu_package.py covers it).
    assert (e.name is None) == (e.function is None)
    if isinstance(e, tile_py.DriverNotFoundError):
        assert e.name is None and "libcuda" in str(e)
    if e.function is not None:
        assert e.function.startswith("cu") and e.function in str(e)
        assert e.name.startswith("CUDA_ERROR_")


def test_stats_shape():
    s = tile_py.stats()
    for k in ("pending_guards", "pending_bytes", "held_guards", "held_bytes", "released", "leaked", "launches"):
        assert isinstance(s[k], int)
    tile_py.synchronize()


# ---- the DLPack C exchange API -------------------------------------------------------------------


def test_exchange_api_used_without_python_call(counters):
    from dlpack_ctypes import make_exchange_producer_type

    Ex, log = make_exchange_producer_type(current_stream=0x777)
    p = Ex()
    check([In("float32")], (p,))
    assert log["dlpack"] == 0 and log["from_obj"] == 1
    assert log["current_work_stream"] == [(kDLCUDA, 0)]
    assert p.deleted == 1
    assert counters["consumed"] == 1


def test_exchange_api_no_sync_skips_current_stream(counters):
    from dlpack_ctypes import make_exchange_producer_type

    Ex, log = make_exchange_producer_type()
    p = Ex()
    check([In("float32")], (p,), sync=False)
    assert log["current_work_stream"] == [] and p.deleted == 1


def test_exchange_api_rollback_releases(counters):
    from dlpack_ctypes import make_exchange_producer_type

    Ex, log = make_exchange_producer_type()
    p, q = Ex(), Ex(dtype=I32)
    with pytest.raises(TypeError, match=r"argument 1: expected a tensor of float32, got int32"):
        check([In("float32"), In("float32")], (p, q))
    assert (p.deleted, q.deleted) == (1, 1)
    p2 = Ex()
    with pytest.raises(TypeError, match=r"argument 1: expected a tensor"):
        check([In("float32"), In("float32")], (p2, object()))
    assert p2.deleted == 1
    # Exchange-API exports are ours from the start: taken over and released, never launched.
    assert counters["consumed"] == counters["released"] == 3


# ---- found by trying to break it ------------------------------------------------------------


@pytest.mark.parametrize("ty", ["f32", "f64"])
def test_finite_scalar_too_large_for_a_double_is_refused(counters, ty):
    import decimal

    p = Producer()
    with pytest.raises(OverflowError, match=r"argument 1: .*1E\+400.* does not fit scalar " + ty):
        check([In("float32"), Scalar(ty)], (p, decimal.Decimal("1e400")))
    assert p.deleted == 1  # the export made for the call, released once


def test_infinite_scalars_are_still_accepted(counters):
    import decimal

    for v in (float("inf"), decimal.Decimal("Infinity"), np.float64("-inf")):
        assert _testing.pack_args([Scalar("f64")], (v,), stream=5)[0] in (0x7FF0000000000000, 0xFFF0000000000000)


def test_python_number_types_declare_what_numpy_makes_of_them():
    assert repr(tile_py.In(float)) == repr(tile_py.In("float64"))
    assert repr(tile_py.In(int)) == repr(tile_py.In("int64"))
    assert repr(tile_py.Out(bool)) == repr(tile_py.Out("bool"))
    assert repr(tile_py.In(complex)) == repr(tile_py.In("complex128"))


class _Interrupting:
    def __dlpack__(self, **kw):
        raise KeyboardInterrupt

    def __dlpack_device__(self):
        return (1, 0)


def test_interrupt_in_a_host_producer_propagates(counters):
    with pytest.raises(KeyboardInterrupt):
        check([In("float32")], (_Interrupting(),))


@pytest.mark.parametrize(
    "field, value",
    [("stream", True), ("data", (True, False)), ("shape", (True,)), ("strides", (True,))],
)
def test_cai_bools_are_refused(counters, field, value):
    d = {"shape": (4,), "typestr": "|u1", "data": (0x7F0000000000, False), "version": 3, "strides": None}
    d[field] = value

    class Cai:
        __cuda_array_interface__ = d

    with pytest.raises(ValueError, match=rf"argument 0: .*'{field}(\[0\])?' holds a bool"):
        check([In("uint8", strided=True)], (Cai(),))


@pytest.mark.parametrize(
    "kw, exc, message",
    [
        ({"ndim": True}, ValueError, "ndim must be an int from 0 to 32, got True"),
        ({"ndim": 1, "assume": {1: 2}}, TypeError, "assume's keys are names \\(str\\), got 1"),
        ({"ndim": 1, "assume": {"disjoint": "no"}}, ValueError, "assume\\[\"disjoint\"\\]: expected True or False, got 'no'"),
        ({"ndim": 1, "assume": {"nonnegative_strides": 1}}, ValueError, "expected True or False, got 1"),
    ],
)
def test_array_declarations_refuse_values_that_only_look_right(kw, exc, message):
    with pytest.raises(exc, match=message):
        tile_py.In("float32", **kw)


# ---- CuPy arrays: CuPy's current stream read once per launch -------------------------------------

_FAKE_CUPY = {"ptr": 0, "asked": []}


class _FakeCupyStream:
    def __init__(self, ptr):
        self.ptr = ptr


def _fake_get_current_stream(device_id=-1):
    _FAKE_CUPY["asked"].append(device_id)
    return _FakeCupyStream(_FAKE_CUPY["ptr"])


class FakeCupyArray(Producer):
    """Classified as a CuPy array (its class is from the ``cupy`` package)."""


FakeCupyArray.__module__ = "cupy._core.core"


@pytest.fixture
def fake_cupy(monkeypatch):
    import types

    pkg = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    cuda.get_current_stream = _fake_get_current_stream
    pkg.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", pkg)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    _FAKE_CUPY["asked"].clear()
    yield _FAKE_CUPY
    _FAKE_CUPY["asked"].clear()


@pytest.mark.parametrize(
    "cupy_ptr, offered",
    [
        (0x4321, 0x4321),  # another stream: offered CuPy's own, so CuPy makes no event
        (STREAM, STREAM),  # the launch stream itself
        (0, 1),  # CuPy's null stream is the legacy default stream, DLPack's 1
        (2, 2),  # the per-thread default stream
    ],
)
def test_cupy_arrays_offered_cupy_current_stream_read_once(counters, fake_cupy, cupy_ptr, offered):
    fake_cupy["ptr"] = cupy_ptr
    arrays = [FakeCupyArray() for _ in range(3)]
    plain = Producer()
    check([In("float32")] * 4, (*arrays, plain), device=0)
    # One read of CuPy's current stream for the whole launch, on the launch device.
    assert fake_cupy["asked"] == [0]
    assert [a.calls[0]["stream"] for a in arrays] == [offered] * 3
    # A producer whose current stream tile_py cannot read is offered the launch stream.
    assert plain.calls[0]["stream"] == STREAM
    assert [a.deleted for a in arrays] == [1, 1, 1] and plain.deleted == 1


def test_cupy_current_stream_read_per_launch(counters, fake_cupy):
    a = FakeCupyArray()
    fake_cupy["ptr"] = 0x50
    check([In("float32")], (a,), device=0)
    fake_cupy["ptr"] = 0x60
    check([In("float32")], (a,), device=0)
    assert fake_cupy["asked"] == [0, 0]
    assert [c["stream"] for c in a.calls] == [0x50, 0x60]


def test_cupy_no_sync_offers_minus_one_without_reading(counters, fake_cupy):
    a = FakeCupyArray()
    check([In("float32")], (a,), sync=False)
    assert fake_cupy["asked"] == [] and a.calls[0]["stream"] == -1 and a.deleted == 1


def test_cupy_unreadable_stream_offers_launch_stream(counters, fake_cupy):
    a, b = FakeCupyArray(), FakeCupyArray()
    fake_cupy["ptr"] = None  # `.ptr` is not an int: the current stream cannot be read
    check([In("float32")] * 2, (a, b), device=0)
    # Asked once; each array is then offered the launch stream, as any producer is.
    assert fake_cupy["asked"] == [0]
    assert [a.calls[0]["stream"], b.calls[0]["stream"]] == [STREAM, STREAM]
    assert a.deleted == 1 and b.deleted == 1


class _Index:
    """An int-like whose conversion raises ``exc``."""

    def __init__(self, exc):
        self.exc = exc

    def __index__(self):
        raise self.exc


@pytest.mark.parametrize("exc", [KeyboardInterrupt, MemoryError])
def test_an_interrupt_while_reading_an_array_is_raised_as_it_is(counters, exc):
    """Only a value that does not convert becomes tile_py's ValueError / TypeError /
    OverflowError; an interrupt (or running out of memory) while converting a
    __cuda_array_interface__ is raised as it was."""
    with pytest.raises(exc):
        check([In("float32")], (CAI(data=(_Index(exc()), False)),))


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, MemoryError, RecursionError])
def test_an_interrupt_from_index_is_raised_as_it_is_wherever_an_int_is_read(exc):
    """The same rule for every int tile_py reads through ``__index__``: a scalar argument, an
    array parameter's ``ndim``, and its ``assume`` entries. Only a value that does not convert
    becomes tile_py's TypeError / ValueError (with the conversion error as its cause)."""
    with pytest.raises(exc):
        check([Scalar("i32")], (_Index(exc()),))
    with pytest.raises(exc):
        In("float32", ndim=_Index(exc()))
    with pytest.raises(exc):
        In("float32", ndim=1, assume={"stride_divisible_by": [_Index(exc())]})
    with pytest.raises(exc):
        In("float32", ndim=1, assume={"unit_stride": [_Index(exc())]})
    with pytest.raises(exc):
        In("float32", ndim=1, assume={"base_addr_divisible_by": _Index(exc())})
    # An ordinary exception from a scalar's __index__ keeps its type, as a producer's does,
    # with a note naming the argument.
    with pytest.raises(ValueError, match="no") as e:
        check([Scalar("i32")], (_Index(ValueError("no")),))
    assert e.value.__notes__ == ["argument 0: raised while converting this argument"]
    with pytest.raises(ValueError, match="ndim must be an int from 0 to 32") as e:
        In("float32", ndim=_Index(ValueError("no")))
    assert isinstance(e.value.__cause__, ValueError)


def test_assume_base_addr_refuses_bools_and_names_out_of_range_values():
    with pytest.raises(ValueError, match=r"assume\[\"base_addr_divisible_by\"\]: expected an int"):
        In("float32", ndim=1, assume={"base_addr_divisible_by": True})
    with pytest.raises(ValueError, match="out of range"):
        In("float32", ndim=1, assume={"base_addr_divisible_by": 2**64 - 1})
    In("float32", ndim=1, assume={"base_addr_divisible_by": 16})


def test_cuda_array_interface_integers_out_of_range_are_named_as_such(counters):
    with pytest.raises(OverflowError, match=r"'stream' is 18446744073709551616 \(int\), outside"):
        check([In("float32")], (CAI(stream=2**64),))
    with pytest.raises(OverflowError, match="'data' pointer of .* is outside 0..2\\*\\*64"):
        check([In("float32")], (CAI(data=(2**64, False)),))


@pytest.mark.parametrize("flag", ["cooperative", "programmatic_dependent_launch", "sync"])
def test_launch_flags_are_bools_and_a_wrong_one_is_named(flag):
    # Refused before anything else (no driver needed): the message names the keyword.
    with pytest.raises(TypeError, match=f"launch: {flag} must be True or False, got 1"):
        tile_py.launch(1, 1, object(), (), block=1, **{flag: 1})


@pytest.mark.parametrize("flag", ["cooperative", "programmatic_dependent_launch"])
def test_launch_and_bind_read_their_bool_keywords_alike(flag):
    # One reading for both entry points: an int refused naming the keyword, NumPy's bool taken
    # as a bool (the call then fails later, on the kernel, exactly as with True).
    not_a_kernel = object()
    for call, name in [
        (lambda **kw: tile_py.launch(1, 1, not_a_kernel, (), block=1, **kw), "launch"),
        (lambda **kw: tile_py.BoundLaunch(1, 1, not_a_kernel, block=1, **kw), "Kernel.bind"),
    ]:
        with pytest.raises(TypeError, match=f"{name}: {flag} must be True or False, got 1"):
            call(**{flag: 1})
        with pytest.raises(Exception) as with_true:
            call(**{flag: True})
        with pytest.raises(Exception) as with_np:
            call(**{flag: np.True_})
        assert type(with_np.value) is type(with_true.value)
        assert str(with_np.value) == str(with_true.value)
        assert flag not in str(with_true.value)
