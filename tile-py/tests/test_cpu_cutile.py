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
from tile_py import _testing
from dlpack_ctypes import Producer, StreamOnlyProducer, capsule_name, make_capsule

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
    assert _testing.pack_args([param], (ok,), stream=0x1234) == [BASE, 64, 1]
    for desc, rule in [
        (dict(shape=(64,), data=BASE, byte_offset=4), "is not a multiple of 16 bytes"),
        (dict(shape=(32,), strides=(2,), data=BASE), "the stride 2 of dimension 0 is not 1"),
        (dict(shape=(40,), data=BASE), "the extent 40 of dimension 0 is not a multiple of 16"),
    ]:
        cap, c = make_capsule(**desc)
        with pytest.raises(ValueError, match=rf"^argument 0: .*{rule}, which the kernel was"):
            _testing.pack_args([param], (cap,), stream=0x1234)
        assert c.calls == 0 and capsule_name(cap) == "dltensor_versioned"
    assert c_ok.calls == 0


def test_static_zero_extents_and_strides_declare_no_check_and_negative_ones_are_refused():
    """A static extent or stride of 0 (an empty or broadcast dimension) is keyed by value and
    declared without a launch-time check; a negative one names the parameter."""
    def array(**kw):
        return ArrayConstraint(ct.float32, 1, index_dtype=ct.int32, stride_lower_bound_incl=0,
                               alias_groups=(), may_alias_internally=True, **kw)

    for zero, desc, words in [
        (dict(shape_constant=(0,)), dict(shape=(0,)), [BASE, 0, 1]),
        (dict(stride_constant=(0,)), dict(shape=(64,), strides=(0,)), [BASE, 64, 0]),
    ]:
        (param,), keep = tc.params_from_signature(v2([array(**zero)]), ["x"])
        cap, _ = make_capsule(data=BASE, **desc)
        assert keep == (True,) and _testing.pack_args([param], (cap,), stream=0x1234) == words
    negative = ArrayConstraint(ct.float32, 1, index_dtype=ct.int32, stride_constant=(-2,),
                               stride_lower_bound_incl=(None,),
                               alias_groups=(), may_alias_internally=True)
    with pytest.raises(NotImplementedError, match=r"parameter 'x': a static stride of -2"):
        tc.params_from_signature(v2([negative]), ["x"])
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
    with pytest.raises(TypeError, match=r"^Empty lists are not supported as kernel arguments$"):
        tc.launch(0x1234, (4,), K.copy_list, ([], cap))
    with pytest.raises(TypeError, match=r"^Invalid list item #1: unsupported object type 'float'$"):
        tc.launch(0x1234, (4,), K.copy_list, ([cap, 1.0], Dev([64])))
    with pytest.raises(ValueError, match=r"array arguments 0 and 2 .* overlap in memory"):
        key(K.axpy, (Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 128), 1.0))
    with pytest.raises(TypeError, match=r"^Kernel expects 4 arguments but 2 were given$"):
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
    "copy_static": lambda: [_arr(ct.float32, 2, stride_constant=(None, 1), shape_constant=(32, 48)),
                            _arr(ct.float32, 2, stride_constant=(None, 1))],
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


# ---- cuTile's launch conventions ---------------------------------------------------------------


def test_grid_is_read_as_cutile_reads_it():
    assert tc._dims(()) == (1, 1, 1)  # cuTile pads an empty grid to one block
    assert tc._dims((4,)) == (4, 1, 1)
    assert tc._dims((4, 2)) == (4, 2, 1)
    assert tc._dims(7) == (7, 1, 1)  # tile's convenience, beyond cuTile
    assert tc._dims((tc.MAX_GRID_DIM, 1, tc.MAX_GRID_DIM)) == (2**24 - 1, 1, 2**24 - 1)
    msg = ("Grid[1] exceeds 24-bit limit: max=16777215, got=16777216. "
           "Use multiple kernel launches for larger workloads.")
    with pytest.raises(ValueError) as e:
        tc._dims((1, 2**24))
    assert str(e.value) == msg
    with pytest.raises(ValueError, match=r"^Grid dimensions must be at most 3, got length 4$"):
        tc._dims((1, 1, 1, 1))
    with pytest.raises(TypeError, match=r"^Grid must be a tuple$"):
        tc._dims([4])
    with pytest.raises(OverflowError, match=r"Grid\[0\] is negative"):
        tc._dims((-1,))


def test_without_cutile_install_names_the_package_to_install():
    # cuTile Python absent (None in sys.modules makes its import fail as a missing module would).
    code = (
        "import sys; sys.modules['cuda.tile'] = None\n"
        "import tile_py.cutile as tc\n"
        "try:\n"
        "    tc.install()\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name, '|', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("cuda.tile | tile_py.cutile needs cuTile Python"), out.stdout
    assert "pip install cuda-tile==1.7.0" in out.stdout


def test_grid_limit_is_checked_before_anything_is_exported():
    producer = Producer(shape=(64,), data=BASE)
    cap, c = make_capsule(shape=(64,), data=BASE + 0x1000)
    with pytest.raises(ValueError, match=r"^Grid\[0\] exceeds 24-bit limit"):
        tc.launch(0x1234, (2**24,), K.axpy, (producer, cap, Dev([64], ptr=BASE + 0x2000), 1.0))
    with pytest.raises(ValueError, match=r"^Grid\[2\] exceeds 24-bit limit"):
        tc.launch(0x1234, (1,), K.axpy, (producer, cap, Dev([64], ptr=BASE + 0x2000), 1.0),
                  block_in_cluster_count=(1, 1, 2**24))
    assert producer.calls == [] and c.calls == 0 and capsule_name(cap) == "dltensor_versioned"


class _NumbaHandle:
    def __init__(self, value):
        self.value = value


def _numba_stream(value):
    """A stream object shaped as numba-cuda's (``handle.value``, no ``__cuda_stream__``)."""
    cls = type("Stream", (), {"__module__": "numba.cuda.cudadrv.driver"})
    s = cls()
    s.handle = _NumbaHandle(value)
    return s


def test_streams_as_cutile_takes_them():
    assert tc._stream(0) == 1  # ct.launch's 0: the legacy default stream (tile_py's 1)
    assert tc._stream(1) == 1 and tc._stream(2) == 2 and tc._stream(0x1234) == 0x1234
    assert tc._stream(_numba_stream(0x5678)) == 0x5678
    assert tc._stream(_numba_stream(None)) == 1  # numba's default stream

    class CudaStream:  # cuda.core's protocol: passed on, tile_py reads it
        def __cuda_stream__(self):
            return (0, 0x9ABC)

    s = CudaStream()
    assert tc._stream(s) is s
    assert tile_py._tile_py._export(make_capsule(shape=(16,), data=BASE)[0], s)[1] is None


def _kernel_one(x):
    pass


def test_wrong_argument_count_in_cutiles_words():
    for kernel, args, msg in [
        (K.axpy, (Dev([64]),), "Kernel expects 4 arguments but 1 was given"),
        (K.axpy, (1, 2, 3, 4, 5), "Kernel expects 4 arguments but 5 were given"),
        (K.one_arg, (1, 2), "Kernel expects 1 argument but 2 were given"),
    ]:
        with pytest.raises(TypeError) as e:
            tc.launch(0x1234, (1,), kernel, args)
        assert str(e.value) == msg


# ---- arguments known only through DLPack: exported once, that export launched ------------------


def test_export_calls_the_producer_once_with_the_launch_stream_and_consumes_nothing():
    p = Producer(shape=(64, 32), data=BASE + 0x40)
    cap, offered, layout = tile_py._tile_py._export(p, 0x1234, 3, device=0)
    assert p.calls == [{"stream": 0x1234, "max_version": (1, 3)}]
    assert offered == 0x1234
    assert layout == ((2, 32, 1), (2, 0), BASE + 0x40, [64, 32], [32, 1])
    assert capsule_name(cap) == "dltensor_versioned" and p.deleted == 0
    del cap  # never launched: the capsule's destructor releases the export
    assert p.deleted == 1
    # The per-thread default stream is offered as the legacy one, as a launch offers it.
    p2 = StreamOnlyProducer(shape=(8,), strides=(4,), data=BASE)
    cap2, offered2, layout2 = tile_py._tile_py._export(p2, 2, device=0)
    assert p2.calls == [{"stream": 1}] and offered2 == 1 and layout2[3:] == ([8], [4])
    # A capsule is read as it is: no stream is offered, its name stays.
    own, c = make_capsule(shape=(16,), data=BASE, byte_offset=8)
    got, offered3, layout3 = tile_py._tile_py._export(own, 0x1234, device=0)
    assert got is own and offered3 is None and layout3[2] == BASE + 8
    assert capsule_name(own) == "dltensor_versioned" and c.calls == 0
    used, _ = make_capsule(name="used_dltensor_versioned", shape=(16,), data=BASE)
    with pytest.raises(ValueError, match=r"^argument 5: DLPack capsule already consumed"):
        tile_py._tile_py._export(used, 0x1234, 5, device=0)


@pytest.fixture
def fake_device(monkeypatch):
    """tile_py.cutile.launch up to tile_py.launch, without a GPU: the real exports (with device
    0 given, so no driver is loaded), a fake compute capability and compiler, and tile_py.launch
    replaced by a recorder of what it would have been handed."""
    real_export = tile_py._tile_py._export
    calls = {"compile": [], "launch": []}
    monkeypatch.setattr(tile_py._tile_py, "_export", lambda o, s, i=0: real_export(o, s, i, device=0))
    monkeypatch.setattr(tile_py, "compute_capability", lambda s: (9, 0))

    def compile_(kernel, args, cc):
        calls["compile"].append(args)
        n = len(tc._leaves(args))
        return tc._Compiled(kernel=("kernel", n), keep=(True,) * n, signature=None)

    monkeypatch.setattr(tc, "_compile", compile_)

    def launch(stream, grid, kernel, args, **kw):
        calls["launch"].append((stream, grid, kernel, list(args), kw))
        return "handle"

    monkeypatch.setattr(tile_py, "launch", launch)
    tc.clear_cache()
    yield calls
    tc.clear_cache()


def test_a_generic_producer_is_exported_once_and_that_export_is_launched(fake_device):
    x = Producer(shape=(64,), data=BASE)
    y, cy = make_capsule(shape=(64,), data=BASE + 0x1000)
    out = Dev([64], ptr=BASE + 0x2000)
    assert tc.launch(0, (), K.axpy, (x, y, out, 2.0)) == "handle"
    # One export, for the legacy default stream (cuTile's 0), nothing released.
    assert x.calls == [{"stream": 1, "max_version": (1, 3)}] and x.deleted == 0
    # cuTile was shown the export's layout, not the producer (which it would export again).
    (shown,) = fake_device["compile"]
    assert shown[0].__cuda_array_interface__ == {
        "shape": (64,), "strides": (4,), "typestr": "<f4", "data": (BASE, False), "version": 3,
    }
    assert shown[1].__cuda_array_interface__["data"] == (BASE + 0x1000, False)
    assert shown[2] is out and shown[3] == 2.0
    ((stream, grid, kernel, passed, kw),) = fake_device["launch"]
    assert stream == 1 and grid == (1, 1, 1) and kw["block"] == 1
    # The capsule is passed as it is; the producer's export through a stand-in that hands
    # tile_py that very capsule, once, for the stream it was made for.
    assert passed[1] is y and passed[2] is out and passed[3] == 2.0
    with pytest.raises(BufferError, match="was made for stream 1, not 4660"):
        passed[0].__dlpack__(stream=0x1234, max_version=(1, 3))
    cap = passed[0].__dlpack__(stream=1, max_version=(1, 3))
    assert capsule_name(cap) == "dltensor_versioned" and x.deleted == 0
    with pytest.raises(BufferError, match="handed out already"):
        passed[0].__dlpack__(stream=1, max_version=(1, 3))
    assert len(x.calls) == 1 and cy.calls == 0
    # A second launch with the same layouts finds the compiled kernel: no compile, one more
    # export.
    tc.launch(0, (), K.axpy, (x, make_capsule(shape=(64,), data=BASE + 0x1000)[0], out, 3.0))
    assert len(fake_device["compile"]) == 1 and len(x.calls) == 2
    assert tc.cache_info()["hits"] >= 1


def test_exports_inside_tuples_are_launched_in_their_own_places(fake_device):
    """Leaves are counted as tile_py.cutile flattens them, also past a tuple's annotation (which
    cuTile refuses when compiling): each export is shown to cuTile and launched where its
    producer was."""
    p = Producer(shape=(16,), data=BASE + 0x1000)
    out = Dev([16])
    tc.launch(1, (1,), K.tuple_head, (out, (1, 2, p)))
    ((shown,),) = [fake_device["compile"]]
    assert shown[0] is out and shown[1][:2] == (1, 2)
    assert shown[1][2].__cuda_array_interface__["data"] == (BASE + 0x1000, False)
    ((_, _, _, passed, _),) = fake_device["launch"]
    assert passed[:3] == [out, 1, 2] and isinstance(passed[3], tc._Exported)
    assert passed[3].source is p and len(p.calls) == 1


def test_a_misaligned_export_gets_its_own_kernel(fake_device):
    out = Dev([64], ptr=BASE + 0x2000)
    y = Dev([64], ptr=BASE + 0x1000)
    tc.launch(1, (4,), K.axpy, (Producer(shape=(64,), data=BASE), y, out, 1.0))
    tc.launch(1, (4,), K.axpy, (Producer(shape=(64,), data=BASE + 4), y, out, 1.0))
    tc.launch(1, (4,), K.axpy, (Producer(shape=(32,), strides=(2,), data=BASE), y, out, 1.0))
    assert len(fake_device["compile"]) == 3


def test_cutiles_own_errors_come_before_the_overlap_refusal(fake_device, monkeypatch):
    class CuTileRefusal(Exception):
        pass

    def refuse(kernel, args, cc):
        fake_device["compile"].append(args)
        raise CuTileRefusal("Expected a scalar")

    x = Dev([64])
    monkeypatch.setattr(tc, "_compile", refuse)
    with pytest.raises(CuTileRefusal):
        tc.launch(1, (1,), K.axpy, (x, x, Dev([64], ptr=BASE + 0x2000), 1.0))
    # cuTile accepts the arguments: tile's refusal of overlapping arrays follows, and what was
    # compiled for them is not kept.
    monkeypatch.setattr(tc, "_compile", lambda k, a, cc: tc._Compiled(("k", 4), (True,) * 4, None))
    with pytest.raises(ValueError, match=r"array arguments 0 and 1 .* overlap in memory"):
        tc.launch(1, (1,), K.axpy, (x, x, Dev([64], ptr=BASE + 0x2000), 1.0))
    assert tc.cache_info()["entries"] == 0 and fake_device["launch"] == []


def test_a_constant_is_never_an_array_of_the_overlap_check(fake_device):
    """An array handed to a ``ct.Constant`` parameter is a constant to key on (cuTile refuses
    it when compiling), not an array that overlaps another argument."""
    pair = (Dev([64]), Dev([64], ptr=BASE + 0x1000))
    tc.launch(1, (4,), K.affine_pair, (pair, Dev([64], ptr=BASE + 0x2000), 1.0, 0.0, pair[0]))
    assert len(fake_device["compile"]) == 1


# ---- install(): every ct.launch through tile ----------------------------------------------------


def test_install_routes_ct_launch_through_tile_and_returns_what_ct_launch_returns(monkeypatch):
    import cuda.tile._cext as cext

    seen = []
    monkeypatch.setattr(tc, "launch", lambda *a, **kw: seen.append((a, kw)) or "handle")
    original = ct.launch
    assert not tc.installed()
    with tc.install() as inst:
        assert tc.installed()
        assert ct.launch is cext.launch is not original
        from cuda.tile import launch as imported_after

        assert imported_after(0, (1,), K.axpy, (1, 2, 3, 4), programmatic_dependent_launch=True) is None
        assert ct.launch(5, (2,), K.one_arg, [7]) is None
        inner = tc.install()  # installing twice is harmless
        inner.uninstall()
        assert tc.installed()
    assert ct.launch is original and cext.launch is original and not tc.installed()
    inst.uninstall()  # a second uninstall changes nothing
    assert ct.launch is original
    assert seen == [
        ((0, (1,), K.axpy, (1, 2, 3, 4)), {"programmatic_dependent_launch": True}),
        ((5, (2,), K.one_arg, [7]), {"programmatic_dependent_launch": False}),
    ]
    # Without the context manager it stays until uninstalled.
    handle = tc.install()
    try:
        assert tc.installed()
    finally:
        handle.uninstall()
    assert not tc.installed()


# ---- static extents and strides (ct.ArrayAnnotation) -------------------------------------------


def test_static_extents_and_strides_map_to_checked_divisibility():
    c = ArrayConstraint(ct.float32, 2, index_dtype=ct.int32, shape_constant=(48, 16),
                        stride_constant=(64, 1), shape_divisible_by=(16, 16),
                        stride_lower_bound_incl=0, alias_groups=(), may_alias_internally=False)
    (param,), _ = tc.params_from_signature(v2([c]), ["x"])
    assert param == tile_py.In(
        "float32", ndim=2, index="i32",
        assume=dict(shape_divisible_by=[48, 16], stride_divisible_by=[64, 1], unit_stride=[1],
                    disjoint=True),
    )
    ok, _ = make_capsule(shape=(48, 16), strides=(64, 1), data=BASE)
    assert _testing.pack_args([param], (ok,), stream=0x1234) == [BASE, 48, 16, 64, 1]
    for desc, rule in [
        (dict(shape=(40, 16), strides=(64, 1), data=BASE), "the extent 40 of dimension 0 is not a multiple of 48"),
        (dict(shape=(48, 16), strides=(32, 1), data=BASE), "the stride 32 of dimension 0 is not a multiple of 64"),
    ]:
        cap, counter = make_capsule(**desc)
        with pytest.raises(ValueError, match=rf"^argument 0: .*{rule}"):
            _testing.pack_args([param], (cap,), stream=0x1234)
        assert counter.calls == 0


def test_static_extents_and_strides_key_by_value():
    out = Dev([16, 16], ptr=BASE + 0x100000)
    k16 = key(K.copy_static, (Dev([16, 16]), out))
    assert key(K.copy_static, (Dev([16, 16], ptr=BASE + 0x4000), out)) == k16
    assert key(K.copy_static, (Dev([32, 32]), out)) != k16  # also multiples of 16: another kernel
    assert key(K.copy_static, (Dev([16, 32]), out)) != k16  # the last dimension is static too
    # Without the annotation, 16 and 32 share a kernel.
    assert (key(K.scale_2d, (Dev([16, 16]), out, 16, 16))
            == key(K.scale_2d, (Dev([32, 32]), out, 16, 16)))
    s64 = key(K.copy_static_strides, (Dev([16, 16], strides=[64, 1]), out))
    assert key(K.copy_static_strides, (Dev([16, 16], strides=[32, 1]), out)) != s64
    assert key(K.copy_static_strides, (Dev([32, 16], strides=[64, 1]), out)) == s64


# ---- list-of-array parameters ------------------------------------------------------------------


def test_a_list_parameter_is_a_staged_buffer_pointer_and_a_length():
    lst = ListConstraint(dense_f32(1), alias_groups=(), elements_may_alias=False)
    params, keep = tc.params_from_signature(v2([lst, dense_f32(1)]), ["xs", "out"])
    assert params[:2] == [tile_py.In("int64"), tile_py.Scalar("i32")]
    assert keep == (True, True)


def test_list_elements_are_exported_once_staged_and_kept_until_the_staged_buffer_goes(
    fake_device, monkeypatch
):
    staged = []
    real_staged = tc._Staged

    def stage(arg):
        s = real_staged(0xD000_0000, len(arg.words), 0x99, (None, arg.keep), arg.length)
        staged.append((list(arg.words), s))
        return s

    monkeypatch.setattr(tc, "_stage", stage)
    a = Producer(shape=(64,), data=BASE)
    b, cb = make_capsule(shape=(32,), strides=(2,), data=BASE + 0x1000)
    c = Dev([64], ptr=BASE + 0x2000)
    out = Dev([64], ptr=BASE + 0x3000)
    tc.launch(0x1234, (4,), K.copy_list, ([a, b, c], out))
    assert a.calls == [{"stream": 0x1234, "max_version": (1, 3)}]
    ((words, s),) = staged
    assert words == [BASE, 64, 1, BASE + 0x1000, 32, 2, BASE + 0x2000, 64, 1]
    ((_, _, _, passed, _),) = fake_device["launch"]
    assert passed == [s, 3, out]
    assert s.__cuda_array_interface__ == {
        "shape": (9,), "strides": None, "typestr": "<i8", "data": (0xD000_0000, False),
        "version": 3, "stream": 0x99,
    }
    # cuTile is shown the elements' layouts, never the exports.
    ((shown_list, shown_out),) = fake_device["compile"]
    assert [x.__cuda_array_interface__["data"][0] for x in shown_list[:2]] == [BASE, BASE + 0x1000]
    assert shown_list[2] is c and shown_out is out
    # The staged object (which tile_py keeps until the kernel is done) holds every export.
    del passed, fake_device["launch"][:], staged[:], shown_list, shown_out
    fake_device["compile"].clear()
    assert a.deleted == 0 and cb.calls == 0
    del s
    assert a.deleted == 1 and cb.calls == 0  # a caller's capsule stays the caller's
    assert capsule_name(b) == "dltensor_versioned"


def test_list_keys_tell_apart_each_elements_layout_and_static_values(fake_device, monkeypatch):
    monkeypatch.setattr(tc, "_stage", lambda arg: tc._Staged(0xD000_0000, len(arg.words), 1, arg.keep, arg.length))
    out = Dev([64], ptr=BASE + 0x9000)
    k2 = key(K.copy_list, ([Dev([64]), Dev([64], ptr=BASE + 0x1000)], out))
    assert key(K.copy_list, ([Dev([64], ptr=BASE + 0x2000), Dev([128], ptr=BASE + 0x3000)], out)) == k2
    assert key(K.copy_list, ([Dev([64]), Dev([64], ptr=BASE + 0x1004)], out)) != k2  # misaligned
    assert key(K.copy_list, ([Dev([64])], out)) != k2  # another length


# ---- the cached launch's key (Rust) against this module's ----------------------------------------


def _layouts():
    """Layouts that differ in each feature cuTile specialises on, and some that do not."""
    from dlpack_ctypes import BF16, F32, F64, I32

    out = []
    for dtype in (F32, F64, I32, BF16, (1, 8, 1)):
        for data in (0x10000, 0x10004, 0x10008, 0x10010, 0x10002, 0x10001):
            if data % max(dtype[1] // 8, 1):
                continue  # a misaligned element is refused before any key is computed
            for shape, strides in [
                ((64,), None), ((64,), (1,)), ((64,), (2,)), ((63,), (1,)), ((1,), (1,)),
                ((16, 32), None), ((16, 32), (1, 16)), ((16, 32), (64, 1)), ((16, 32), (0, 1)),
                ((4, 4), (1, 1)), ((32, 1), (1, 1)), ((3, 5, 7), None), ((2, 2, 2, 2, 2, 2), None),
                ((0,), (1,)), ((8,), (-1,)), ((2**31,), (1,)), ((2,), (2**31,)),
                ((16, 16), (16, 1)), ((16, 16), (17, 1)),
            ]:
                out.append((dtype, data, shape, strides))
    return out


def _python_features(dtype, data, shape, strides, static=None):
    if strides is None:
        acc, st = 1, []
        for n in reversed(shape):
            st.append(acc)
            acc *= n
        strides = tuple(reversed(st))
    bits = dtype[1] * dtype[2]
    f = tc._keyed_features(
        ("dlpack",) + tuple(dtype), bits, data, tuple(shape), tuple(strides), static
    )
    return f, tc._span(bits, data, tuple(shape), tuple(strides))


@pytest.mark.parametrize("static", [None, ((0, -1), (1,)), ((5,), (-3, 0)), ((0,), ())])
def test_rust_features_match_python_features(static):
    """Two layouts get the same key words from the cached launch exactly when this module's
    features (which decide the compiled kernel) are the same, and the spans of the overlap
    check agree: a cached kernel is launched only on layouts it was compiled for."""
    seen_rust, seen_py = {}, {}
    for i, (dtype, data, shape, strides) in enumerate(_layouts()):
        kw = {} if strides is None else {"strides": strides}
        cap, _ = make_capsule(shape=shape, dtype=dtype, data=data, **kw)
        words, span = _testing.cutile_features(cap, static)
        py_key, py_span = _python_features(dtype, data, shape, strides, static)
        assert (span is None) == (py_span is None) and (span is None or tuple(span) == py_span), (
            dtype, data, shape, strides,
        )
        seen_rust.setdefault(tuple(words), set()).add(i)
        seen_py.setdefault(py_key, set()).add(i)
        assert capsule_name(cap) == "dltensor_versioned"  # read, not consumed
    assert sorted(map(sorted, seen_rust.values())) == sorted(map(sorted, seen_py.values()))
    assert len(seen_rust) > 100  # the layouts do differ


def test_the_cached_launch_leaves_what_it_does_not_take_to_python(fake_device):
    """The cached launch takes nothing before Python has registered the kernel's plan (None),
    nor on a stream it cannot resolve (False: no driver here); either way it has exported
    nothing, and Python's path launches once."""
    tc.clear_cache()
    x = Producer(shape=(64,), data=BASE)
    y, out = Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
    assert tile_py._tile_py._cutile_try(1, (4,), K.axpy, (x, y, out, 2.0)) is None
    assert x.calls == []
    tc.launch(1, (4,), K.axpy, (x, y, out, 2.0))  # registers the plan, then Python launches
    assert len(fake_device["launch"]) == 1 and len(x.calls) == 1
    assert tile_py._tile_py._cutile_try(1, (4,), K.axpy, (x, y, out, 2.0)) is False
    assert len(x.calls) == 1
    tc.launch(1, (4,), K.axpy, (x, y, out, 2.0))
    assert len(fake_device["launch"]) == 2 and len(x.calls) == 2


def test_float_constants_are_keyed_by_their_bits_as_cutile_tells_them_apart(fake_device):
    """``0.0`` and ``-0.0`` are two constants to cuTile (two kernels), and NaNs with the same
    bits one: the key follows the bits, in tuples too."""
    x, o = Dev([64, 64]), Dev([64, 64], ptr=BASE + 0x100000)
    key = lambda c: tc.specialization_key(K.scale_2d, (x, o, c, 16))  # noqa: E731
    assert key(0.0) != key(-0.0)
    assert key(float("nan")) == key(float("nan"))
    tc.launch(1, (4,), K.scale_2d, (x, o, 0.0, 16))
    tc.launch(1, (4,), K.scale_2d, (x, o, -0.0, 16))
    tc.launch(1, (4,), K.scale_2d, (x, o, -0.0, 16))
    assert len(fake_device["compile"]) == 2
    assert tc._const_value((1.0, (-0.0,))) != tc._const_value((1.0, (0.0,)))


def test_a_list_for_a_constant_is_refused_as_a_constant(fake_device):
    x, o = Dev([64, 64]), Dev([64, 64], ptr=BASE + 0x100000)
    with pytest.raises(TypeError, match=r"cannot key a kernel on the unhashable value \[16\]"):
        tc.launch(1, (4,), K.scale_2d, (x, o, [16], 16))
    assert fake_device["launch"] == []


@pytest.mark.parametrize("obj", [object(), 5, None, "capsule"])
def test_the_key_hook_takes_capsules_only(obj):
    with pytest.raises(TypeError, match="expected a DLPack capsule"):
        _testing.cutile_features(obj)
