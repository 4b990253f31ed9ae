"""CPU tests of tile_py.cutile: importing tile_py leaves cuTile alone; cuTile constraints map to
tile parameter declarations (arrays with their layout assumptions, scalars, constants omitted,
tuples flattened; unsupported kinds refused naming the parameter); and the specialisation key
tells apart every layout cuTile specialises on. ``cuda.tile`` imports without a driver, so the
signatures are built explicitly; deriving one from arguments (``from_kernel_args``), exporting
and launching need a GPU (``test_gpu_cutile.py``)."""

import subprocess
import sys

import pytest

import tile_py
from dlpack_ctypes import capsule_name, make_capsule

ct = pytest.importorskip("cuda.tile", reason="cuda-tile is not installed (Python >= 3.10)")
from cuda.tile.compilation import (  # noqa: E402
    ArrayConstraint,
    CallingConvention,
    KernelSignature,
    ListConstraint,
    ScalarConstraint,
)

import tile_py.cutile as tc  # noqa: E402
import cutile_kernels as K  # noqa: E402

BASE = 0x7F00_0000_0000


def test_importing_tile_py_does_not_import_cuda_tile():
    code = (
        "import sys, tile_py, tile_py.cutile\n"
        "assert 'cuda.tile' not in sys.modules, sorted(m for m in sys.modules if 'cuda' in m)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def dense_f32(n, **kw):
    """The constraint cuTile derives for a dense float32 vector whose length is a multiple of
    16 at a 16-byte aligned address (reference/cutile-interop.md's example)."""
    kw.setdefault("base_addr_divisible_by", 16)
    return ArrayConstraint(
        ct.float32,
        1,
        index_dtype=ct.int32,
        stride_constant=(1,),
        shape_divisible_by=(16,),
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        **kw,
    )


def v2(params):
    return KernelSignature(params, CallingConvention.cutile_python_v2(), symbol="k")


def test_arrays_scalars_constants_and_tuples_map_in_order():
    two_d = ArrayConstraint(
        ct.float16,
        2,
        index_dtype=ct.int64,
        stride_constant=(None, 1),
        stride_divisible_by=(8, 1),
        shape_divisible_by=(16, 1),
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=True,
    )
    sig = v2([(dense_f32(1), dense_f32(1)), two_d, ScalarConstraint(ct.float32), 16,
              ScalarConstraint(ct.int32), (4, ScalarConstraint(ct.int64))])
    params, keep = tc.params_from_signature(sig, ["pair", "m", "s", "tile", "n", "mixed"])
    vec = tile_py.In(
        "float32",
        ndim=1,
        index="i32",
        # No stride lower bound: cuTile drops it where the stride is the constant 1.
        assume=dict(base_addr_divisible_by=16, shape_divisible_by=[16], unit_stride=[0],
                    disjoint=True),
    )
    mat = tile_py.In(
        "float16",
        ndim=2,
        index="i64",
        assume=dict(stride_divisible_by=[8, 1], shape_divisible_by=[16, 1], unit_stride=[1],
                    nonnegative_strides=True),
    )
    assert params == [vec, vec, mat, tile_py.Scalar("f32"), tile_py.Scalar("i32"),
                      tile_py.Scalar("i64")]
    # Leaves in order: pair[0], pair[1], m, s, tile (constant), n, mixed[0] (constant), mixed[1].
    assert keep == (True, True, True, True, False, True, False, True)


def test_mapped_array_refuses_what_breaks_the_constraint():
    """The declaration made from a constraint lets through what cuTile compiled for and refuses,
    before consuming, a misaligned, strided or ragged tensor."""
    (param,), _ = tc.params_from_signature(v2([dense_f32(1)]))
    ok, c_ok = make_capsule(shape=(64,), data=BASE)
    assert tile_py._pack_args([param], (ok,), stream=0x1234) == [BASE, 64, 1]
    for desc, rule in [
        (dict(shape=(64,), data=BASE, byte_offset=4), "is not a multiple of 16 bytes"),
        (dict(shape=(32,), strides=(2,), data=BASE), "the stride 2 of dimension 0 is not 1"),
        (dict(shape=(40,), data=BASE), "the extent 40 of dimension 0 is not a multiple of 16"),
    ]:
        cap, c = make_capsule(**desc)
        with pytest.raises(ValueError, match=rf"^argument 0: .*{rule}, which the kernel was"):
            tile_py._pack_args([param], (cap,), stream=0x1234)
        assert c.calls == 0 and capsule_name(cap) == "dltensor_versioned"
    assert c_ok.calls == 0


def test_unsupported_constraints_name_the_parameter():
    lst = ListConstraint(dense_f32(1), alias_groups=(), elements_may_alias=False)
    with pytest.raises(NotImplementedError, match=r"parameter 'xs': a list of arrays"):
        tc.params_from_signature(v2([lst, dense_f32(1)]), ["xs", "out"])
    static = ArrayConstraint(ct.float32, 1, index_dtype=ct.int32, shape_constant=(64,),
                             stride_lower_bound_incl=0, alias_groups=(),
                             may_alias_internally=False)
    with pytest.raises(NotImplementedError, match=r"parameter 'x': a static extent of 64"):
        tc.params_from_signature(v2([static]), ["x"])
    with pytest.raises(NotImplementedError, match=r"parameter 'h': a scalar of dtype"):
        tc.params_from_signature(v2([ScalarConstraint(ct.float16)]), ["h"])


class Dev:
    """A device array seen only through ``__cuda_array_interface__`` (nothing is allocated)."""

    def __init__(self, shape, strides=None, ptr=BASE, typestr="<f4"):
        item = int(typestr[2:])
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "strides": None if strides is None else tuple(s * item for s in strides),
            "typestr": typestr,
            "data": (ptr, False),
            "version": 3,
        }


def key(kernel, args):
    return tc.specialization_key(kernel, args)


def test_key_ignores_what_cutile_does_not_specialise_on():
    a = key(K.axpy, (Dev([1024]), Dev([1024], ptr=BASE + 0x10000), Dev([1024], ptr=BASE + 0x20000), 2.0))
    b = key(K.axpy, (Dev([4096], ptr=BASE + 0x400), Dev([4096], ptr=BASE + 0x8000),
                     Dev([4096], ptr=BASE + 0x20000), -3.5))
    assert a == b  # other aligned addresses, another multiple-of-16 length, another scalar value


def test_misaligned_strided_and_ragged_inputs_get_their_own_key():
    y, out = Dev([1024], ptr=BASE + 0x10000), Dev([1024], ptr=BASE + 0x20000)
    base = key(K.axpy, (Dev([1024]), y, out, 2.0))
    variants = {
        "misaligned": Dev([1024], ptr=BASE + 4),
        "strided": Dev([512], strides=[2]),
        "ragged": Dev([1000]),
        "float16": Dev([1024], typestr="<f2"),
        "broadcast": Dev([1024], strides=[0]),
        "reversed": Dev([1024], strides=[-1], ptr=BASE + 4092),
        "single": Dev([1]),
    }
    keys = {name: key(K.axpy, (x, y, out, 2.0)) for name, x in variants.items()}
    assert all(k != base for k in keys.values()), keys
    assert len(set(keys.values())) == len(keys)
    # A transposed view of a 2-D array differs from the dense one.
    dense = key(K.scale_2d, (Dev([64, 32]), Dev([64, 32], ptr=BASE + 0x10000), 16, 16))
    transposed = key(K.scale_2d, (Dev([64, 32], strides=[1, 64]), Dev([64, 32], ptr=BASE + 0x10000), 16, 16))
    assert dense != transposed


def test_constants_key_by_value_scalars_by_type():
    pair = (Dev([64]), Dev([64], ptr=BASE + 0x1000))
    out = Dev([64], ptr=BASE + 0x2000)
    k16 = key(K.affine_pair, (pair, out, 2.0, 1.0, 16))
    assert key(K.affine_pair, (pair, out, 5.0, -1.0, 16)) == k16
    assert key(K.affine_pair, (pair, out, 2.0, 1.0, 32)) != k16
    assert key(K.affine_pair, (pair, out, 2, 1.0, 16)) != k16  # an int scalar is another type
    assert key(K.affine_pair, (pair, out, 2.0, 1.0, 16.0)) != k16  # 16 and 16.0 are not one constant


def test_refusals_before_anything_is_consumed():
    cap, c = make_capsule(shape=(64,), data=BASE)
    with pytest.raises(NotImplementedError, match=r"parameter 'xs' is a list of arrays"):
        tc.launch(0x1234, (4,), K.copy_list, ([cap], Dev([64])))
    with pytest.raises(ValueError, match=r"array arguments 0 and 2 .* overlap in memory"):
        key(K.axpy, (Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 128), 1.0))
    with pytest.raises(TypeError, match=r"takes 4 arguments but 2 were given"):
        key(K.axpy, (Dev([64]), 1.0))
    assert c.calls == 0 and capsule_name(cap) == "dltensor_versioned"
    assert tc.cache_info()["entries"] == 0


def _arr(dtype, ndim, **kw):
    kw.setdefault("stride_lower_bound_incl", 0)
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, alias_groups=(),
                           may_alias_internally=False, **kw)


EXPORTS = {
    "axpy": lambda: [_arr(ct.float32, 1, stride_constant=(1,))] * 3 + [ScalarConstraint(ct.float32)],
    "scale_2d": lambda: [_arr(ct.float32, 2, stride_constant=(1, None)),
                         _arr(ct.float32, 2, stride_constant=(None, 1)), 32, 16],
    "row_sum": lambda: [_arr(ct.float32, 2, stride_constant=(None, 1)),
                        _arr(ct.float32, 1, stride_constant=(1,)), 256],
    "affine_pair": lambda: [(_arr(ct.float32, 1), _arr(ct.float32, 1)), _arr(ct.float32, 1),
                            ScalarConstraint(ct.float32), ScalarConstraint(ct.float32), 16],
    "matmul": lambda: [_arr(ct.float32, 2, stride_constant=(None, 1))] * 3 + [64, 64, 32],
}


@pytest.mark.skipif(
    __import__("shutil").which("tileiras") is None,
    reason="cuTile's compiler (tileiras, CUDA 13.2+) is not on PATH",
)
@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_test_kernels_export_for_sm_90_without_a_gpu(name):
    """The GPU tests' kernels compile for sm_90 on this machine (tileiras needs no GPU), under
    the mangled symbol tile_py.cutile looks up."""
    import io

    from cuda.tile.compilation import export_kernel

    kernel = getattr(K, name)
    sig = KernelSignature(EXPORTS[name](), CallingConvention.cutile_python_v2()).with_mangled_symbol(name)
    buf = io.BytesIO()
    export_kernel(kernel, [sig], buf, gpu_code="sm_90", output_format="cubin")
    cubin = buf.getvalue()
    assert cubin[:4] == b"\x7fELF"
    assert sig.symbol.encode() in cubin
    tc.params_from_signature(sig)


def test_a_plain_function_is_refused_as_a_kernel():
    import tile_py.cutile as tc

    def f(x):
        return x

    with pytest.raises(TypeError, match=r"kernel must be a cuTile kernel \(a function decorated with @ct.kernel\), got function"):
        tc.launch(1, 1, f, (1,))
