"""CPU tests of array parameters (``In(dtype, ndim=..., index=...)``): the ``1 + 2 * ndim`` kernel
parameters a tensor is packed into (data pointer with byte_offset, extents, strides in elements)
against a reference built from NumPy's own layouts, and the refusals (ndim, index-type overflow,
broken layout assumptions) made before anything is consumed. ``_testing.pack_args`` runs the
conversion and checks of ``tile_py.launch`` without a device and returns the packed values."""

import numpy as np
import pytest

import tile_py
from tile_py import _testing
from tile_py import In, InOut, Out, Scalar
from dlpack_ctypes import F32, Producer, capsule_name, make_capsule

STREAM = 0x1234
BASE = 0x7F00_0000_0000


def pack(params, args, **kw):
    kw.setdefault("stream", STREAM)
    return _testing.pack_args(params, args, **kw)


def reference(data, byte_offset, shape, strides, index):
    """What the calling convention says the kernel receives, each extent and stride reduced to
    the index type's width (two's complement) as the kernel reads it."""
    width = {"i32": 32, "u32": 32, "i64": 64}[index]
    mask = (1 << width) - 1
    return [data + byte_offset] + [v & mask for v in shape] + [v & mask for v in strides]


def numpy_views():
    """(name, view) pairs of a 6x8 float32 buffer: every layout NumPy makes."""
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    return [
        ("dense", base),
        ("transposed", base.T),
        ("row slice", base[1:5]),
        ("column slice", base[:, 3:7]),
        ("step 2", base[::2, ::3]),
        ("reversed rows", base[::-1]),
        ("reversed both", base[::-1, ::-1]),
        ("broadcast", np.broadcast_to(base[2], (5, 8))),
        ("single", base[3:4, 5:6]),
        ("empty", base[:0]),
    ]


@pytest.mark.parametrize("index", ["i32", "i64"])
@pytest.mark.parametrize("name,view", numpy_views(), ids=[n for n, _ in numpy_views()])
def test_numpy_layouts_pack_as_the_reference(name, view, index):
    """A capsule describing each NumPy view of a buffer at BASE: the pointer is BASE plus the
    view's offset into the buffer (passed as byte_offset), extents and strides as NumPy has
    them (strides in elements)."""
    item = view.itemsize
    owner = view.base if view.base is not None else view
    while getattr(owner, "base", None) is not None:
        owner = owner.base
    offset = view.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    strides = [s // item for s in view.strides]
    cap, c = make_capsule(
        shape=view.shape, strides=strides, data=BASE, byte_offset=offset, dtype=F32
    )
    got = pack([In("float32", ndim=2, index=index)], (cap,))
    assert got == reference(BASE, offset, list(view.shape), strides, index)
    # Nothing consumed: the capsule keeps its name and the deleter has not run.
    assert capsule_name(cap) == "dltensor_versioned"
    assert c.calls == 0


def test_arrays_around_scalars_and_pointers():
    a, ca = make_capsule(shape=(3, 4), strides=(1, 3), byte_offset=64, data=BASE)
    b = Producer(shape=(5,), data=BASE + 0x1000)
    p, cp = make_capsule(shape=(7,), data=BASE + 0x2000)
    params = [In("float32", ndim=2, index="i32"), Scalar("i32"), Out("float32", ndim=1), In("float32")]
    got = pack(params, (a, -7, b, p))
    want = reference(BASE, 64, [3, 4], [1, 3], "i32")
    want.append((-7) & 0xFFFF_FFFF)
    want += reference(BASE + 0x1000, 0, [5], [1], "i64")  # index defaults to i64
    want.append(BASE + 0x2000)
    assert got == want
    # Nothing consumed: the capsules keep their deleters; the producer's export was handed back
    # unconsumed, and its capsule's destructor ran the producer's deleter.
    assert (ca.calls, cp.calls) == (0, 0)
    assert (len(b.calls), b.deleted) == (1, 1)
    assert b.calls[0]["stream"] == STREAM


def test_negative_and_zero_strides_pass_as_given():
    cap, c = make_capsule(shape=(4, 6), strides=(0, -1), byte_offset=20, data=BASE)
    assert pack([In("float32", ndim=2, index="i32")], (cap,)) == reference(
        BASE, 20, [4, 6], [0, -1], "i32"
    )
    assert c.calls == 0


def test_negative_stride_does_not_fit_u32():
    cap, c = make_capsule(shape=(6,), strides=(-1,), byte_offset=20, data=BASE)
    with pytest.raises(
        OverflowError,
        match=r"^argument 1: stride -1 of dimension 0 does not fit the array parameter's index "
        r"type u32$",
    ):
        pack([Scalar("u8"), In("float32", ndim=1, index="u32")], (1, cap))
    assert c.calls == 0
    assert capsule_name(cap) == "dltensor_versioned"


def test_extent_beyond_i32_is_refused_and_fits_i64():
    cap, c = make_capsule(shape=(1 << 31,), dtype=(1, 8, 1), data=BASE)  # uint8
    with pytest.raises(OverflowError, match=r"argument 0: extent 2147483648 of dimension 0"):
        pack([In("uint8", ndim=1, index="i32")], (cap,))
    assert pack([In("uint8", ndim=1, index="i64")], (cap,))[1] == 1 << 31
    assert c.calls == 0


def test_wrong_ndim_is_a_type_error_before_consuming():
    a, ca = make_capsule(shape=(4, 4), data=BASE)
    b = Producer(shape=(4,), data=BASE)
    with pytest.raises(TypeError, match=r"^argument 1: expected an array of 2 dimensions, got 1$"):
        pack([In("float32", ndim=2), InOut("float32", ndim=2)], (a, b))
    assert (ca.calls, b.deleted) == (0, 1)  # b's capsule was handed back to the producer


def test_broken_assumption_is_refused_naming_the_rule():
    assume = dict(base_addr_divisible_by=16, unit_stride=[1], shape_divisible_by=[16, 16])
    ok, cok = make_capsule(shape=(16, 32), data=BASE)
    params = [In("float32", ndim=2, index="i32", assume=assume)]
    assert pack(params, (ok,)) == reference(BASE, 0, [16, 32], [32, 1], "i32")
    for kw, rule in [
        (dict(byte_offset=4), r"its data pointer 0x7f0000000004 is not a multiple of 16 bytes"),
        (dict(strides=(1, 16)), r"the stride 16 of dimension 1 is not 1"),
        (dict(shape=(8, 32)), r"the extent 8 of dimension 0 is not a multiple of 16"),
    ]:
        desc = dict(shape=(16, 32), data=BASE)
        desc.update(kw)
        cap, c = make_capsule(**desc)
        with pytest.raises(
            ValueError, match=rf"^argument 0: {rule}, which the kernel was compiled to assume$"
        ):
            pack(params, (cap,))
        assert c.calls == 0
        assert capsule_name(cap) == "dltensor_versioned"
    assert cok.calls == 0


def test_declarations_and_their_errors():
    p = In("float32", ndim=2, index="i32")
    assert repr(p) == 'tile_py.In("float32", ndim=2, index="i32")'
    assert str(Out("bfloat16", ndim=3)) == "output array of bfloat16 (ndim 3, index i64)"
    assert In("float32", ndim=1) != In("float32")
    assert In("float32", ndim=1, index="int64") == In("float32", ndim=1)
    with pytest.raises(TypeError, match="give ndim too"):
        In("float32", index="i32")
    with pytest.raises(ValueError, match="unknown index type 'i16'"):
        In("float32", ndim=1, index="i16")
    with pytest.raises(ValueError, match="ndim must be an int from 0 to 32, got -1"):
        In("float32", ndim=-1)
    with pytest.raises(ValueError, match='unknown assumption "aligned"'):
        In("float32", ndim=1, assume={"aligned": 16})
    with pytest.raises(ValueError, match=r'assume\["unit_stride"\]: dimension 2 is not below 2'):
        In("float32", ndim=2, assume={"unit_stride": [2]})
