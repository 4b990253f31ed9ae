"""CPU tests of tile_py.cutile: importing tile_py leaves cuTile alone; cuTile constraints map to
tile parameter declarations (arrays with their layout assumptions, scalars, constants omitted,
tuples flattened; unsupported kinds refused naming the parameter); cuTile's launch conventions
and refusals; and, against the repository's stub driver (``bench/profile/cuda_stub.c``, built
with ``cc``) in a child process, the cached launch end to end: which launches compile (a new
specialisation) and which find a compiled kernel, what cuTile is shown, what is exported and
released. ``cuda.tile`` imports without a driver; its compiler is replaced by one that declares
the stub driver's kernels, so no GPU and no cuTile compiler is needed. Deriving a real signature
from arguments, exporting and launching real kernels need a GPU (``test_gpu_cutile.py``)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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



def test_install_twice_undone_in_the_order_made_restores_ct_launch():
    """Issue: undoing the first install, then the second, left ct.launch routed through tile.
    Whatever the order, ct.launch is routed while any install is in force and is the original
    once none is."""
    import cuda.tile._cext as cext

    original = (ct.launch, cext.launch)
    for order in ((0, 1), (1, 0)):
        handles = [tc.install(), tc.install()]
        for i in order:
            assert tc.installed()
            handles[i].uninstall()
        assert (ct.launch, cext.launch) == original and not tc.installed()
        handles[order[0]].uninstall()  # again: changes nothing
        assert (ct.launch, cext.launch) == original
    # A context manager inside an install ends only its own.
    outer = tc.install()
    with tc.install():
        assert tc.installed()
    assert tc.installed()
    outer.uninstall()
    assert (ct.launch, cext.launch) == original


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


# ---- list-of-array parameters ------------------------------------------------------------------


def test_a_list_parameter_is_a_staged_buffer_pointer_and_a_length():
    lst = ListConstraint(dense_f32(1), alias_groups=(), elements_may_alias=False)
    params, keep = tc.params_from_signature(v2([lst, dense_f32(1)]), ["xs", "out"])
    assert params[:2] == [tile_py.In("int64"), tile_py.Scalar("i32")]
    assert keep == (True, True)



# ---- the cached launch against the stub driver -------------------------------------------------

TESTS = Path(__file__).resolve().parent


# Run first in every scenario: kernels whose passed arguments are the stub driver's seven 8-byte
# parameters, and cuTile's compiler replaced by one that records what cuTile is shown and
# declares one such parameter per passed leaf (constants are not passed).
PRELUDE = """
import sys
sys.path.insert(0, {tests!r})
from typing import Annotated

import cuda.tile as ct
import tile_py
import tile_py.cutile as tc
from dlpack_ctypes import Producer, make_capsule, capsule_name

BASE = 0x7F00_0000_0000


class Dev:
    def __init__(self, shape, strides=None, ptr=BASE, typestr="<f4"):
        item = int(typestr[2:])
        self.__cuda_array_interface__ = {{
            "shape": tuple(shape),
            "strides": None if strides is None else tuple(s * item for s in strides),
            "typestr": typestr, "data": (ptr, False), "version": 3,
        }}


@ct.kernel
def k7(x, y, out, a, b, c, d):
    pass


@ct.kernel
def kconst(x, y, out, a, b, c, d, t: ct.Constant[int]):
    pass


@ct.kernel
def ktuple(out, items, a, b, c):
    pass


@ct.kernel
def k2d(x, out, a, b, c, d, e):
    pass


@ct.kernel
def kstatic(x: Annotated[ct.Array, ct.ArrayAnnotation(static_shape_dims=(0, -1))], out, a, b, c,
            d, e):
    pass


@ct.kernel
def kstrides(x: Annotated[ct.Array, ct.ArrayAnnotation(static_stride_dims=(0, 1))], out, a, b,
             c, d, e):
    pass


@ct.kernel
def klist(xs, out, a, b, c, d):
    pass


# A stand-in for a numba-cuda stream: no __cuda_stream__, its handle in .handle.value.
def numba_stream(value):
    cls = type("Stream", (), {{"__module__": "numba.cuda.cudadrv.driver"}})
    s = cls()
    s.handle = type("Handle", (), {{}})()
    s.handle.value = value
    return s


LIB = tile_py.Library.from_bytes(b"\\x7fELF stub image\\0")
TYPES = {{"<f4": "float32", "<f2": "float16", "<f8": "float64", "<i4": "int32"}}
compiled = []


def params(x):
    if isinstance(x, list):
        return [tile_py.In("int64"), tile_py.Scalar("i64")]
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return [tile_py.In(TYPES[cai["typestr"]], strided=True)]
    return [tile_py.Scalar("f64" if isinstance(x, float) else "i64")]


def fake_compile(kernel, args, cc):
    assert cc == (9, 0)
    compiled.append(args)
    declared, keep = [], []
    for a, const in zip(args, tc._plan(kernel)[2]):
        for x in a if isinstance(a, tuple) else (a,):
            keep.append(not const)
            declared += [] if const else params(x)
    return tc._Compiled(LIB.kernel("k", declared), tuple(keep), None)


tc._compile = fake_compile


def compiles(kernel, *launches):
    \"\"\"How many of ``launches`` (argument tuples, on stream 1, grid 4) compiled.\"\"\"
    before = len(compiled)
    for args in launches:
        tc.launch(1, (4,), kernel, args)
    return len(compiled) - before
"""


def on_stub(stub_driver, tmp_path, body):
    """Runs ``body`` after PRELUDE in a child process whose CUDA driver is the stub."""
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE.format(tests=str(TESTS)) + textwrap.dedent(body))
    env = dict(os.environ, TILE_LIBCUDA=str(stub_driver))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_generic_producer_is_exported_once_and_that_export_is_launched(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        x = Producer(shape=(64,), data=BASE)
        y, cy = make_capsule(shape=(64,), data=BASE + 0x1000)
        out = Dev([64], ptr=BASE + 0x2000)
        h = tc.launch(0, (), k7, (x, y, out, 2.0, 1, 2, 3))
        assert type(h) is tile_py.LaunchHandle
        # One export, for the legacy default stream (cuTile's 0), nothing released yet.
        assert x.calls == [{"stream": 1, "max_version": (1, 3)}] and x.deleted == 0
        # cuTile was shown the export's layout, not the producer (which it would export again).
        (shown,) = compiled
        assert shown[0].__cuda_array_interface__ == {
            "shape": (64,), "strides": (4,), "typestr": "<f4", "data": (BASE, False),
            "version": 3,
        }
        assert shown[1].__cuda_array_interface__["data"] == (BASE + 0x1000, False)
        assert shown[2] is out and shown[3:] == (2.0, 1, 2, 3)
        # The caller's capsule is the one launched (consumed), and both exports are released
        # once the kernel is done.
        assert capsule_name(y) == "used_dltensor_versioned"
        h.wait()
        assert x.deleted == 1 and cy.calls == 1
        # A second launch with the same layouts finds the compiled kernel: no compile, one more
        # export.
        y2, _ = make_capsule(shape=(64,), data=BASE + 0x1000)
        tc.launch(0, (), k7, (x, y2, out, 3.0, 1, 2, 3))
        assert len(compiled) == 1 and len(x.calls) == 2
        assert tc.cache_info() == {"entries": 1, "hits": 1, "misses": 1}
    """)


def test_a_miss_calls_into_python_once_and_a_hit_never(stub_driver, tmp_path):
    """The Python functions the cached launch calls itself: a kernel's first launch reads its
    parameters and compiles (two calls), a new specialisation compiles (one), a hit none."""
    on_stub(stub_driver, tmp_path, """
        def entered(args):
            calls = []

            def record(frame, event, arg):
                if event == "call" and frame.f_back is not None and frame.f_back.f_code.co_name == "entered":
                    calls.append(frame.f_code.co_name)

            sys.setprofile(record)
            try:
                tc.launch(1, (4,), k7, args)
            finally:
                sys.setprofile(None)
            return calls

        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        assert entered((x, y, out, 2.0, 1, 2, 3)) == ["_plan_of", "_compile_miss"]
        assert entered((Dev([64], ptr=BASE + 4), y, out, 2.0, 1, 2, 3)) == ["_compile_miss"]
        assert entered((x, y, out, 5.0, 4, 5, 6)) == []
        assert len(compiled) == 2 and tc.cache_info() == {"entries": 2, "hits": 1, "misses": 2}
    """)


def test_exports_inside_tuples_are_launched_in_their_own_places(stub_driver, tmp_path):
    """Leaves are counted as tuples flatten: each export is shown to cuTile where its producer
    was, and launched from there."""
    on_stub(stub_driver, tmp_path, """
        p = Producer(shape=(16,), data=BASE + 0x1000)
        out = Dev([16])
        h = tc.launch(1, (1,), ktuple, (out, (1, 2, p), 3, 4, 5))
        ((shown,),) = [compiled]
        assert shown[0] is out and shown[1][:2] == (1, 2) and shown[2:] == (3, 4, 5)
        assert shown[1][2].__cuda_array_interface__["data"] == (BASE + 0x1000, False)
        assert len(p.calls) == 1
        h.wait()
        assert p.deleted == 1
        # An item of another type is another specialisation; another layout's address is not.
        assert compiles(ktuple, (out, (1, 2.0, Dev([16], ptr=BASE + 0x1000)), 3, 4, 5)) == 1
        assert compiles(ktuple, (out, (7, 8, Dev([16], ptr=BASE + 0x2000)), 3, 4, 5)) == 0
    """)


def test_a_key_longer_than_its_inline_words_tells_every_word_apart(stub_driver, tmp_path):
    """A key of more words than a launch's walk holds inline (a constant tuple of twenty ints
    after three arrays): the same arguments find the kernel; a change of an array's layout (in
    the inline words) or of the last constant (past them) is another kernel."""
    on_stub(stub_driver, tmp_path, """
        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        t = tuple(range(20))
        assert compiles(kconst, (x, y, out, 1.0, 2, 3, 4, t), (x, y, out, 1.0, 2, 3, 4, t)) == 1
        assert compiles(kconst, (x, y, Dev([64], ptr=BASE + 0x2004), 1.0, 2, 3, 4, t)) == 1
        assert compiles(kconst, (x, y, out, 1.0, 2, 3, 4, t[:-1] + (7,))) == 1
        assert compiles(kconst, (x, y, out, 5.0, 6, 7, 8, tuple(range(20)))) == 0
        assert tc.cache_info() == {"entries": 3, "hits": 2, "misses": 3}
    """)


def test_an_array_of_more_than_five_dimensions_keys_its_rank_and_the_words_after_it(
        stub_driver, tmp_path):
    """A 6-D array has no per-dimension word in the key (cuTile's five): its rank, alignment
    and what follows it still tell launches apart, and equal launches find their kernel."""
    on_stub(stub_driver, tmp_path, """
        six = lambda ptr=BASE: Dev([2, 2, 2, 2, 2, 16], ptr=ptr)  # noqa: E731
        out = Dev([64, 32], ptr=BASE + 0x10000)
        assert compiles(k2d, (six(), out, 1, 2, 3, 4, 5), (six(BASE + 0x800), out, 6, 7, 8, 9, 10)) == 1
        assert compiles(k2d, (six(BASE + 4), out, 1, 2, 3, 4, 5)) == 1  # misaligned
        assert compiles(k2d, (six(), out, 1, 2, 3, 4, 2**40)) == 1  # the last int past 32 bits
        assert compiles(k2d, (six(), out, 1, 2, 3, 4, 2**41)) == 0
        assert compiles(k2d, (Dev([2, 2, 2, 2, 2, 2, 8]), out, 1, 2, 3, 4, 5)) == 1  # 7-D
        assert compiles(k2d, (Dev([2, 2, 2, 2, 2, 2, 8]), out, 1, 2, 3, 4, 5)) == 0
    """)


def test_a_misaligned_export_gets_its_own_kernel(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        y, out = Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        assert compiles(k7, *[(Producer(data=BASE + 0x3000, **d), y, out, 1.0, 1, 2, 3) for d in [
            dict(shape=(64,)), dict(shape=(64,)),
            dict(shape=(64,), byte_offset=4), dict(shape=(32,), strides=(2,)),
        ]]) == 3
    """)


def test_key_ignores_what_cutile_does_not_specialise_on(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        # Other aligned addresses, another multiple-of-16 length, other scalar values.
        assert compiles(k7,
            (Dev([1024]), Dev([1024], ptr=BASE + 0x10000), Dev([1024], ptr=BASE + 0x20000), 2.0, 1, 2, 3),
            (Dev([4096], ptr=BASE + 0x400), Dev([4096], ptr=BASE + 0x8000),
             Dev([4096], ptr=BASE + 0x20000), -3.5, 7, 8, 9),
        ) == 1
        assert tc.cache_info()["hits"] == 1
    """)


def test_misaligned_strided_and_ragged_inputs_get_their_own_kernel(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        y, out = Dev([1024], ptr=BASE + 0x10000), Dev([1024], ptr=BASE + 0x20000)
        variants = [
            Dev([1024]),                                  # the base case
            Dev([1024], ptr=BASE + 4),                    # misaligned
            Dev([512], strides=[2]),                      # strided
            Dev([1000]),                                  # ragged
            Dev([1024], typestr="<f2"),                   # float16
            Dev([1024], strides=[0]),                     # broadcast
            Dev([1024], strides=[-1], ptr=BASE + 4092),   # reversed
            Dev([1]),                                     # single
        ]
        assert compiles(k7, *[(x, y, out, 2.0, 1, 2, 3) for x in variants]) == len(variants)
        assert compiles(k7, *[(x, y, out, 2.0, 1, 2, 3) for x in variants]) == 0
        # A transposed view of a 2-D array differs from the dense one.
        o2 = Dev([64, 32], ptr=BASE + 0x10000)
        assert compiles(k2d, (Dev([64, 32]), o2, 1, 2, 3, 4, 5),
                        (Dev([64, 32], strides=[1, 64]), o2, 1, 2, 3, 4, 5)) == 2
    """)


def test_constants_key_by_value_scalars_by_type(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        assert compiles(kconst, (x, y, out, 2.0, 1.0, 0, 0, 16)) == 1
        assert compiles(kconst, (x, y, out, 5.0, -1.0, 7, 9, 16)) == 0
        assert compiles(kconst, (x, y, out, 2.0, 1.0, 0, 0, 32)) == 1
        assert compiles(kconst, (x, y, out, 2, 1.0, 0, 0, 16)) == 1  # an int scalar: another type
        assert compiles(kconst, (x, y, out, 2.0, 1.0, 0, 0, 16.0)) == 1  # 16.0 is another constant
        assert compiles(kconst, (x, y, out, 2.0, 1.0, 0, 2**40, 16)) == 1  # past 32 bits
        assert compiles(kconst, (x, y, out, 2.0, 1.0, 0, 2**41, 16)) == 0
    """)


def test_float_constants_are_keyed_by_their_bits_as_cutile_tells_them_apart(stub_driver, tmp_path):
    """``0.0`` and ``-0.0`` are two constants to cuTile (two kernels), and NaNs with the same
    bits one."""
    on_stub(stub_driver, tmp_path, """
        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        launch = lambda c: (x, y, out, 1.0, 2, 3, 4, c)  # noqa: E731
        assert compiles(kconst, launch(0.0), launch(-0.0), launch(-0.0)) == 2
        assert compiles(kconst, launch(float("nan")), launch(float("nan"))) == 1
        # A float subclass (NumPy's float64, what np.sqrt returns) is read by cuTile as the
        # float of its value: keyed by its bits too, so np.float64(-0.0) is not the 0.0 kernel.
        import numpy as np
        assert compiles(kconst, launch(np.float64(1.0)), launch(np.float64(-1.0))) == 2
        assert compiles(kconst, launch(np.float64(0.0)), launch(np.float64(-0.0))) == 0
        assert compiles(kconst, launch(1.0), launch(-1.0), launch(np.float64(-1.0))) == 0
        assert compiles(kconst, launch(np.float64("nan")), launch(np.float64("nan"))) == 0
        # Constants of other types key by equal value and type (an array by identity).
        assert compiles(kconst, launch("a"), launch("a"), launch("b")) == 2
        assert compiles(kconst, launch(x), launch(x)) == 1
    """)


def test_a_constant_is_never_an_array_of_the_overlap_check(stub_driver, tmp_path):
    """An array handed to a ``ct.Constant`` parameter is a constant to key on, not an array that
    overlaps another argument."""
    on_stub(stub_driver, tmp_path, """
        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        assert compiles(kconst, (x, y, out, 1.0, 2, 3, 4, x)) == 1
    """)


def test_cutiles_own_errors_come_before_the_overlap_refusal(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        class CuTileRefusal(Exception):
            pass

        def refuse(kernel, args, cc):
            compiled.append(args)
            raise CuTileRefusal("Expected a scalar")

        x, out = Dev([64]), Dev([64], ptr=BASE + 0x2000)
        tc._compile = refuse
        try:
            tc.launch(1, (1,), k7, (x, x, out, 1.0, 2, 3, 4))
            raise AssertionError("launched")
        except CuTileRefusal:
            pass
        # cuTile accepts the arguments: tile's refusal of overlapping arrays follows, and what
        # was compiled for them is not kept.
        tc._compile = fake_compile
        try:
            tc.launch(1, (1,), k7, (x, Dev([64], ptr=BASE + 128), out, 1.0, 2, 3, 4))
            raise AssertionError("launched")
        except ValueError as e:
            assert "array arguments 0 and 1 (in order of appearance) overlap in memory" in str(e)
        assert len(compiled) == 2
        assert tc.cache_info() == {"entries": 0, "hits": 0, "misses": 0}
    """)


def test_overlap_is_checked_on_every_launch_from_the_validated_extents(stub_driver, tmp_path):
    """Arrays that share a byte are refused on a hit as on a miss, each array's bytes being the
    extent its validated descriptor states (a negative stride reaches below the data pointer);
    arrays that only touch are launched."""
    on_stub(stub_driver, tmp_path, """
        y, out = Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)

        def refusal(x, y):
            try:
                tc.launch(1, (1,), k7, (x, y, out, 1.0, 2, 3, 4)).wait()
                return None
            except ValueError as e:
                return str(e)

        overlap = "array arguments 0 and 1 (in order of appearance) overlap in memory"
        assert refusal(Dev([64], ptr=BASE + 0x1000 - 256), y) is None  # touching below
        assert refusal(Dev([64], ptr=BASE + 0x1000 + 256), y) is None  # touching above
        assert tc.cache_info() == {"entries": 1, "hits": 1, "misses": 1}
        # The same specialisation, sharing 16 bytes: found, and refused (a refused launch is
        # not counted as a hit).
        assert overlap in refusal(Dev([64], ptr=BASE + 0x1000 - 240), y)
        assert overlap in refusal(Dev([64], ptr=BASE + 0x1000 + 240), y)
        assert tc.cache_info() == {"entries": 1, "hits": 1, "misses": 1}
        # Reversed, its data pointer at its highest element: it reaches 252 bytes below. The
        # second finds the kernel the first compiled, and is refused.
        assert refusal(Dev([64], strides=[-1], ptr=BASE + 0x1000 + 256 + 252), y) is None
        assert overlap in refusal(Dev([64], strides=[-1], ptr=BASE + 0x1000 + 252 + 16), y)
        assert tc.cache_info() == {"entries": 2, "hits": 1, "misses": 2}
    """)


def test_refusals_before_anything_is_consumed(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        cap, c = make_capsule(shape=(64,), data=BASE)
        for args, error in [
            (([], cap, 1, 2, 3, 4), "TypeError: Empty lists are not supported as kernel arguments"),
            (([cap, 1.0], Dev([64]), 1, 2, 3, 4),
             "TypeError: Invalid list item #1: unsupported object type 'float'"),
        ]:
            try:
                tc.launch(0x1234, (4,), klist, args)
                raise AssertionError("launched")
            except Exception as e:
                assert f"{type(e).__name__}: {e}" == error, e
        try:
            tc.launch(0x1234, (4,), k7, (cap, Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 128), 1, 2, 3, 4))
            raise AssertionError("launched")
        except ValueError as e:
            assert "array arguments 0 and 2 (in order of appearance) overlap in memory" in str(e)
        assert c.calls == 0 and capsule_name(cap) == "dltensor_versioned"
        assert tc.cache_info()["entries"] == 0
    """)


def test_a_list_for_a_constant_is_refused_as_a_constant(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        try:
            tc.launch(1, (4,), kconst, (x, y, out, 1.0, 2, 3, 4, [16]))
            raise AssertionError("launched")
        except TypeError as e:
            assert str(e) == "tile_py.cutile cannot key a kernel on the unhashable value [16]"
        assert compiled == [] and tile_py.stats()["launches"] == 0
    """)


def test_streams_as_cutile_takes_them(stub_driver, tmp_path):
    """cuTile's stream 0 is the legacy default stream (tile_py's 1); a numba-cuda stream (no
    ``__cuda_stream__``) is its handle; a ``__cuda_stream__`` object is read by tile_py."""
    on_stub(stub_driver, tmp_path, """
        class CudaStream:
            def __cuda_stream__(self):
                return (0, 0x9ABC)

        y, out = Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        offered = []
        for stream in [0, 1, 0x1234, numba_stream(0x5678), numba_stream(None), CudaStream()]:
            x = Producer(shape=(64,), data=BASE)
            tc.launch(stream, (4,), k7, (x, y, out, 1.0, 2, 3, 4))
            offered.append(x.calls[0]["stream"])
        assert offered == [1, 1, 0x1234, 0x5678, 1, 0x9ABC]
        # A capsule is read as it is, whatever the stream: no stream is offered.
        assert tile_py._tile_py._export(make_capsule(shape=(16,), data=BASE)[0], CudaStream())[1] is None
    """)


def test_a_numba_stream_is_kept_alive_while_work_launched_on_it_is_held(stub_driver, tmp_path):
    """numba destroys a stream it drops, work pending or not, and its handle may then name
    another stream: the numba stream object is kept with the launch stream, as a
    ``__cuda_stream__`` object is, until the work launched on it is released."""
    on_stub(stub_driver, tmp_path, """
        import gc, weakref

        y, out = Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        s = numba_stream(0x7777)
        alive = weakref.ref(s)
        for _ in range(3):
            x = Producer(shape=(64,), data=BASE)
            tc.launch(s, (4,), k7, (x, y, out, 1.0, 2, 3, 4))
            assert x.calls[0]["stream"] == 0x7777
        del s, x
        gc.collect()
        assert alive() is not None, "the numba stream was dropped while its work was held"
        tile_py.synchronize()
        gc.collect()
        assert alive() is None, "the numba stream is kept after its work was released"
    """)


def test_list_elements_are_exported_once_staged_and_kept_until_the_kernel_is_done(
    stub_driver, tmp_path
):
    on_stub(stub_driver, tmp_path, """
        staged = []

        def stage(arg):
            s = tc._Staged(BASE + 0xD0000, len(arg.words), 0x99, (None, arg.keep), arg.length)
            staged.append(list(arg.words))
            return s

        tc._stage = stage
        a = Producer(shape=(64,), data=BASE)
        b, cb = make_capsule(shape=(32,), strides=(2,), data=BASE + 0x1000)
        c = Dev([64], ptr=BASE + 0x2000)
        out = Dev([64], ptr=BASE + 0x3000)
        h = tc.launch(0x1234, (4,), klist, ([a, b, c], out, 1, 2, 3, 4))
        assert a.calls == [{"stream": 0x1234, "max_version": (1, 3)}]
        assert staged == [[BASE, 64, 1, BASE + 0x1000, 32, 2, BASE + 0x2000, 64, 1]]
        # cuTile is shown the elements' layouts, never the exports.
        ((shown_list, shown_out, *_),) = compiled
        assert [x.__cuda_array_interface__["data"][0] for x in shown_list[:2]] == [BASE, BASE + 0x1000]
        assert shown_list[2] is c and shown_out is out
        # The staged buffer (which tile_py keeps until the kernel is done) holds every export.
        del shown_list, shown_out, compiled[:]
        assert a.deleted == 0
        h.wait()
        tile_py.synchronize()
        assert a.deleted == 1 and cb.calls == 0  # a caller's capsule stays the caller's
        assert capsule_name(b) == "dltensor_versioned"
        # Launched again with the same layouts: staged again, not compiled again.
        tc.launch(0x1234, (4,), klist, ([Producer(shape=(64,), data=BASE), c], out, 1, 2, 3, 4))
        tc.launch(0x1234, (4,), klist, ([Producer(shape=(64,), data=BASE + 0x100), c], out, 5, 6, 7, 8))
        assert len(compiled) == 1 and len(staged) == 3
    """)


def test_list_keys_tell_apart_each_elements_layout(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        tc._stage = lambda arg: tc._Staged(BASE + 0xD0000, len(arg.words), 1, arg.keep, arg.length)
        out = Dev([64], ptr=BASE + 0x9000)
        two = ([Dev([64]), Dev([64], ptr=BASE + 0x1000)], out, 1, 2, 3, 4)
        assert compiles(klist, two) == 1
        assert compiles(klist, ([Dev([64], ptr=BASE + 0x2000), Dev([128], ptr=BASE + 0x3000)], out, 1, 2, 3, 4)) == 0
        assert compiles(klist, ([Dev([64]), Dev([64], ptr=BASE + 0x1004)], out, 1, 2, 3, 4)) == 1  # misaligned
        assert compiles(klist, ([Dev([64])], out, 1, 2, 3, 4)) == 1  # another length
    """)


def test_static_extents_and_strides_key_by_value(stub_driver, tmp_path):
    on_stub(stub_driver, tmp_path, """
        out = Dev([16, 16], ptr=BASE + 0x100000)
        rest = (out, 1, 2, 3, 4, 5)
        assert compiles(kstatic, (Dev([16, 16]),) + rest, (Dev([16, 16], ptr=BASE + 0x4000),) + rest) == 1
        assert compiles(kstatic, (Dev([32, 32]),) + rest) == 1  # also multiples of 16: another kernel
        assert compiles(kstatic, (Dev([16, 32]),) + rest) == 1  # the last dimension is static too
        # Without the annotation, 16 and 32 share a kernel.
        assert compiles(k2d, (Dev([16, 16]),) + rest, (Dev([32, 32]),) + rest) == 1
        assert compiles(kstrides, (Dev([16, 16], strides=[64, 1]),) + rest) == 1
        assert compiles(kstrides, (Dev([16, 16], strides=[32, 1]),) + rest) == 1
        assert compiles(kstrides, (Dev([32, 16], strides=[64, 1]),) + rest) == 0
    """)


@pytest.mark.parametrize("dtype", [(2, 32, 1), (2, 64, 1), (0, 32, 1), (4, 16, 1), (1, 8, 1)])
def test_dtypes_alignments_and_layouts_each_get_their_own_kernel(stub_driver, tmp_path, dtype):
    """Capsules of one dtype in layouts that differ in one feature cuTile specialises on each
    compile; the same layout at another aligned address, or with another multiple-of-16 extent,
    does not."""
    on_stub(stub_driver, tmp_path, f"""
        dtype = {dtype!r}
        # Far above the largest layout's bytes: no overlap.
        y, out = Dev([64], ptr=BASE + 0x100_0000_0000), Dev([64], ptr=BASE + 0x200_0000_0000)
        # The stub kernel's first parameter is a strided pointer of any dtype.
        LIB2 = tile_py.Library.from_bytes(b"\\x7fELF stub image\\0")

        def compile_any(kernel, args, cc):
            compiled.append(args)
            name = {{(2, 32): "float32", (2, 64): "float64", (0, 32): "int32", (4, 16): "bfloat16",
                     (1, 8): "uint8"}}[dtype[:2]]
            declared = [tile_py.In(name, strided=True)] + [tile_py.In("float32", strided=True)] * 2
            return tc._Compiled(LIB2.kernel("k", declared + [tile_py.Scalar("i64")] * 4),
                                (True,) * 7, None)

        tc._compile = compile_any
        item = dtype[1] // 8

        def launch(shape, strides=None, offset=0, base=BASE):
            kw = {{}} if strides is None else {{"strides": strides}}
            cap, _ = make_capsule(shape=shape, dtype=dtype, data=base, byte_offset=offset, **kw)
            tc.launch(1, (4,), k7, (cap, y, out, 1, 2, 3, 4))

        distinct = [
            dict(shape=(64,)), dict(shape=(64,), offset=16 * item if item < 16 else 16),
            dict(shape=(63,)), dict(shape=(1,)), dict(shape=(64,), strides=(2,)),
            dict(shape=(16, 32)), dict(shape=(16, 32), strides=(1, 16)),
            dict(shape=(16, 32), strides=(0, 1)),
            dict(shape=(4, 4), strides=(1, 1)), dict(shape=(3, 5, 7)),
            dict(shape=(2, 2, 2, 2, 2, 2)), dict(shape=(2**31,), strides=(1,)),
            dict(shape=(16, 16), strides=(17, 1)),
        ]
        if item < 16:
            distinct.append(dict(shape=(64,), offset=item))  # misaligned
        n = 0
        for d in distinct:
            before = len(compiled)
            launch(**d)
            n += len(compiled) - before
        # Each compiled once, the first offset-16 case aside (16-byte aligned, as the base is).
        expected = len(distinct) - (1 if item < 16 else 0)
        assert n == expected, (n, expected)
        before = len(compiled)
        launch(shape=(64,), base=BASE + 0x100)
        launch(shape=(128,), base=BASE + 0x200)
        # Row strides of 32 and 64 elements are both multiples of 16 bytes: one kernel.
        launch(shape=(16, 32), strides=(64, 1))
        assert len(compiled) == before
    """)


def test_the_last_specialisation_is_found_again_only_for_its_own_key(stub_driver, tmp_path):
    """A thread finds its last specialisation again without the table, and only for an equal
    key: a launch that differs from the last in one feature cuTile specialises on (alignment,
    dtype, extent, a constant, the kernel, a launch from another thread) is served its own
    kernel, and ``clear_cache()`` leaves nothing to find."""
    on_stub(stub_driver, tmp_path, """
        import threading

        y, out = Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        a, misaligned, ragged = Dev([64]), Dev([64], ptr=BASE + 4), Dev([63])
        half = Dev([64], typestr="<f2")

        def launched(kernel, args):
            \"\"\"What the launch compiled and the kernel it launched.\"\"\"
            before = len(compiled)
            tc.launch(1, (4,), kernel, args)
            return len(compiled) - before

        assert launched(k7, (a, y, out, 1.0, 1, 2, 3)) == 1
        # Alternating with the last each time: each layout compiles once, then hits. A kernel
        # of another layout would be refused (each compiled kernel declares its dtype).
        for x in (misaligned, a, misaligned, ragged, a, half, ragged, half, a):
            launched(k7, (x, y, out, 1.0, 1, 2, 3))
        assert [c[0] for c in compiled] == [a, misaligned, ragged, half]
        assert tc.cache_info() == {"entries": 4, "hits": 6, "misses": 4}
        # A constant's value and another kernel with the same arguments are other keys.
        assert launched(kconst, (a, y, out, 1.0, 1, 2, 3, 16)) == 1
        assert launched(kconst, (a, y, out, 1.0, 1, 2, 3, 32)) == 1
        assert launched(kconst, (a, y, out, 1.0, 1, 2, 3, 16)) == 0
        assert launched(k7, (a, y, out, 1.0, 1, 2, 3)) == 0
        # Another thread's last is its own: it finds this thread's kernels in the table.
        seen = []
        t = threading.Thread(target=lambda: seen.append(
            [launched(k7, (x, y, out, 1.0, 1, 2, 3)) for x in (half, a, misaligned)]))
        t.start()
        t.join()
        assert seen == [[0, 0, 0]]
        # After clear_cache() the last specialisation is gone too: the same launch compiles.
        hits = tc.cache_info()["hits"]
        tc.clear_cache()
        assert launched(k7, (a, y, out, 1.0, 1, 2, 3)) == 1
        assert launched(k7, (a, y, out, 1.0, 1, 2, 3)) == 0
        assert tc.cache_info() == {"entries": 1, "hits": hits + 1, "misses": 7}
    """)


def test_a_leaf_cutile_makes_a_constant_leaves_the_others_in_their_own_places(
        stub_driver, tmp_path):
    """A leaf of an unannotated parameter that cuTile compiles as a constant (here a string) is
    not passed, and every later scalar is still converted into its own parameter: each value
    below fits only the type declared for its own place, on the launch that compiles and on the
    hits after it; a list's two slots after such a leaf too. (The stub kernel's parameters are
    8 bytes each.)"""
    on_stub(stub_driver, tmp_path, """
        @ct.kernel
        def k8(x, y, out, mode, a, b, c, d):
            pass

        @ct.kernel
        def klist8(xs, out, mode, a, b, c, d):
            pass

        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        array = tile_py.In("float32", strided=True)
        declared = [array] * 3 + [
            tile_py.Scalar("u64"), tile_py.Scalar("f64"), tile_py.Scalar("i64"),
            tile_py.Scalar("f64")]

        def compile_mode(kernel, args, cc):
            compiled.append(args)
            keep = (True, True, True, False, True, True, True, True)
            return tc._Compiled(LIB.kernel("k", declared), keep, None)

        tc._compile = compile_mode
        plain = LIB.kernel("k", declared)
        for a, b, c in [(2**64 - 1, 1.5, -7), (2**63 + 5, -2.0, -9), (2**64 - 1, 1.5, -7)]:
            tc.launch(1, (4,), k8, (x, y, out, "fast", a, b, c, 0.5)).wait()
            tile_py.launch(1, 4, plain, (x, y, out, a, b, c, 0.5), block=1).wait()
        assert len(compiled) == 1 and tc.cache_info()["hits"] == 2
        # Out of place (other keys, compiled with the same declarations), a value is refused:
        # each slot's type is the one declared there.
        for bad in [(x, y, out, "fast", -7, 1.5, 2**64 - 1, 0.5),
                    (x, y, out, "fast", 1.5, 2**64 - 1, -7, 0.5)]:
            try:
                tc.launch(1, (4,), k8, bad)
            except (OverflowError, TypeError) as e:
                assert str(e).startswith("argument 4:"), e
            else:
                raise AssertionError(f"launched {bad}")
        # A list before such a leaf: its buffer and its length in their own two slots.
        tc._stage = lambda arg: tc._Staged(BASE + 0xD0000, len(arg.words), 1, arg.keep, arg.length)

        def compile_list(kernel, args, cc):
            compiled.append(args)
            keep = (True, True, False, True, True, True, True)
            listed = [tile_py.In("int64"), tile_py.Scalar("u64"), array, tile_py.Scalar("f64"),
                      tile_py.Scalar("i64"), tile_py.Scalar("f64"), tile_py.Scalar("u64")]
            return tc._Compiled(LIB.kernel("k", listed), keep, None)

        tc._compile = compile_list
        before = tc.cache_info()
        for _ in range(2):
            xs = [Dev([64]), Dev([64], ptr=BASE + 0x1000)]
            tc.launch(1, (4,), klist8, (xs, out, "m", 2.5, -3, 0.25, 2**64 - 1)).wait()
        after = tc.cache_info()
        assert (after["misses"] - before["misses"], after["hits"] - before["hits"]) == (1, 1)
    """)


def test_clear_cache_during_a_launch_leaves_it_the_kernel_it_found(stub_driver, tmp_path):
    """A launch takes this thread's last specialisation before it exports its arrays: a
    ``clear_cache()`` run by a producer meanwhile leaves that launch the kernel compiled for its
    key (launched, compiled once), and the next launch compiles again."""
    on_stub(stub_driver, tmp_path, """
        class Clearing(Producer):
            def __dlpack__(self, **kw):
                if self.clear:
                    tc.clear_cache()
                return super().__dlpack__(**kw)

        x = Clearing(shape=(64,), data=BASE)
        y, out = Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        x.clear = False
        assert compiles(k7, (x, y, out, 1.0, 2, 3, 4)) == 1
        x.clear = True
        h = tc.launch(1, (4,), k7, (x, y, out, 1.0, 2, 3, 4))
        assert len(compiled) == 1 and tc.cache_info()["entries"] == 0
        h.wait()
        assert x.deleted == 2
        x.clear = False
        assert compiles(k7, (x, y, out, 1.0, 2, 3, 4)) == 1
    """)


def test_int_scalars_convert_to_the_declared_type_as_tile_py_launch_converts_them(
        stub_driver, tmp_path):
    """An int argument is read once for the key and launched from that value when it fits the
    compiled kernel's declared integer type; one that does not fit (or one for a declared
    float) is refused or converted exactly as ``tile_py.launch`` does it for the same kernel.
    (The stub kernel's parameters are 8 bytes each.)"""
    on_stub(stub_driver, tmp_path, """
        x, y, out = Dev([64]), Dev([64], ptr=BASE + 0x1000), Dev([64], ptr=BASE + 0x2000)
        declared = [tile_py.In("float32", strided=True)] * 3 + [
            tile_py.Scalar("f64"), tile_py.Scalar("u64"), tile_py.Scalar("i64"),
            tile_py.Scalar("f64")]
        kernels = []

        def compile_typed(kernel, args, cc):
            compiled.append(args)
            kernels.append(LIB.kernel("k", declared))
            return tc._Compiled(kernels[-1], (True,) * 7, None)

        tc._compile = compile_typed

        def outcome(f, args):
            try:
                f(args).wait()
                return "ok"
            except Exception as e:
                return f"{type(e).__name__}: {e}"

        cases = [(1.0, 7, -3, 2), (1.0, 2**64 - 1, 2**63 - 1, -5), (1.0, 0, -2**63, 2**70),
                 (1.0, -1, 0, 0), (1.0, 2**64, 0, 0), (1.0, 0, 2**63, 0), (1.0, 0, -2**63 - 1, 0)]
        seen = []
        for a, b, c, d in cases:
            args = (x, y, out, a, b, c, d)
            mine = outcome(lambda t: tc.launch(1, (4,), k7, t), args)
            plain = outcome(lambda t: tile_py.launch(1, 4, kernels[-1], t, block=1), args)
            assert mine == plain, (args, mine, plain)
            seen.append(mine)
        assert seen[:3] == ["ok"] * 3, seen
        assert all(s.startswith("OverflowError: argument ") for s in seen[3:]), seen
    """)


def test_list_elements_on_a_device_the_launch_cannot_use_are_refused(stub_driver, tmp_path):
    """A list element's pointer is staged in a descriptor buffer, where the launch's own device
    check never sees it: each element's device is checked as every tensor of a launch is (cuTile
    refuses a list element that is not on a CUDA device too), before anything is compiled or
    launched; the caller's capsules stay as they were, an export made for the call is released."""
    on_stub(stub_driver, tmp_path, """
        staged = []

        def stage(arg):
            staged.append(arg.device)
            return tc._Staged(BASE + 0xD0000, len(arg.words), 1, arg.keep, arg.length)

        tc._stage = stage
        out = Dev([64], ptr=BASE + 0x9000)
        for device, where in [((1, 0), "cpu"), ((2, 1), "cuda:1"), ((10, 0), "device_type 10:0")]:
            ok, c_ok = make_capsule(shape=(64,), data=BASE)
            bad, c_bad = make_capsule(shape=(64,), data=BASE + 0x1000, device=device)
            p = Producer(shape=(64,), data=BASE + 0x2000, device=device)
            for items in ([ok, bad], [ok, p]):
                try:
                    tc.launch(1, (4,), klist, (items, out, 1, 2, 3, 4))
                    raise AssertionError(f"launched an element on {where}")
                except ValueError as e:
                    assert str(e).startswith(f"argument 0: tensor is on {where}, but the "
                                             "launch stream is on cuda:0"), e
            assert [capsule_name(c) for c in (ok, bad)] == ["dltensor_versioned"] * 2
            assert c_ok.calls == 0 and c_bad.calls == 0
            assert len(p.calls) == 1 and p.deleted == 1  # the export made for the call, released
        assert compiled == [] and staged == [] and tile_py.stats()["launches"] == 0
        # Pinned host and managed memory are usable from every device, whatever their DLPack
        # device id; the descriptors are staged on the launch's device.
        pinned, _ = make_capsule(shape=(64,), data=BASE + 0x3000, device=(3, 0))
        managed, _ = make_capsule(shape=(64,), data=BASE + 0x4000, device=(13, 5))
        tc.launch(1, (4,), klist, ([pinned, managed], out, 1, 2, 3, 4))
        assert len(compiled) == 1 and staged == [0]
    """)


def test_list_elements_given_by_cuda_array_interface_are_read_as_a_launch_reads_them(
    stub_driver, tmp_path
):
    """A ``__cuda_array_interface__`` list element is parsed as a launch parses one, not by a
    reading of its own: strides that are not whole items (which such a reading truncated, so
    the kernel was handed other memory), masks and unknown versions are refused, before
    anything is compiled, staged or launched."""
    on_stub(stub_driver, tmp_path, """
        staged = []

        def stage(arg):
            staged.append(list(arg.words))
            return tc._Staged(BASE + 0xD0000, len(arg.words), 1, arg.keep, arg.length)

        tc._stage = stage
        out = Dev([64], ptr=BASE + 0x9000)

        def element(**over):
            x = Dev([4, 4], ptr=BASE + 0x1000)
            x.__cuda_array_interface__.update(over)
            return x

        for over, error in [
            (dict(strides=(18, 4)), "__cuda_array_interface__: strides[0] = 18 bytes is not a "
                                    "multiple of the item size 4"),
            (dict(mask=element()), "__cuda_array_interface__: masked arrays are not supported"),
            (dict(version=4), "__cuda_array_interface__: unsupported version 4 (0 to 3 expected)"),
            (dict(shape=(4, True)), "__cuda_array_interface__: 'shape' holds a bool"),
        ]:
            try:
                tc.launch(1, (4,), klist, ([Dev([4, 4]), element(**over)], out, 1, 2, 3, 4))
                raise AssertionError(f"launched {over}")
            except ValueError as e:
                assert str(e).startswith("argument 0: " + error), e
        assert compiled == [] and staged == [] and tile_py.stats()["launches"] == 0
        # Well-formed elements: strides in bytes become strides in elements, none is compact.
        tc.launch(1, (4,), klist, ([Dev([4, 4]), element(strides=(64, 4))], out, 1, 2, 3, 4))
        assert staged == [[BASE, 4, 4, 4, 1, BASE + 0x1000, 4, 4, 16, 1]]
    """)


def test_a_list_element_with_a_negative_stride_is_refused(stub_driver, tmp_path):
    """cuTile derives every list element constraint with ``stride_lower_bound_incl=(0, ...)``,
    negative strides or not (its own launch compiles and runs such a list), and the staged words
    are no argument whose declared assumptions tile checks: an element with a negative stride is
    refused before anything is compiled, staged or launched, as an array argument is."""
    on_stub(stub_driver, tmp_path, """
        staged = []
        tc._stage = lambda arg: staged.append(1) or tc._Staged(
            BASE + 0xD0000, len(arg.words), 1, arg.keep, arg.length)
        out = Dev([64], ptr=BASE + 0x9000)
        p = Producer(shape=(64,), strides=(-1,), data=BASE + 0x3000 + 252)
        for items in ([Dev([64], ptr=BASE), Dev([64], strides=[-2], ptr=BASE + 0x1000 + 504)],
                      [Dev([64], ptr=BASE), p]):
            try:
                tc.launch(1, (4,), klist, (items, out, 1, 2, 3, 4))
                raise AssertionError("launched a negative stride")
            except ValueError as e:
                j, s = (1, -2) if len(p.calls) == 0 else (1, -1)
                assert str(e) == (f"argument 0: element {j} of the list: the stride {s} of "
                                  "dimension 0 is negative, which the kernel was compiled to "
                                  "assume"), e
        assert len(p.calls) == 1 and p.deleted == 1  # the export made for the call, released
        assert compiled == [] and staged == [] and tile_py.stats()["launches"] == 0
        # Zero strides (a broadcast element) are not negative.
        tc.launch(1, (4,), klist, ([Dev([64], strides=[0], ptr=BASE)], out, 1, 2, 3, 4))
        assert len(compiled) == 1 and staged == [1]
    """)


def test_list_elements_are_screened_as_a_launch_screens_torch_tensors(stub_driver, tmp_path):
    """A torch tensor that requires grad (a model's weights, listed for a grouped kernel) is
    read as an input of a launch is: torch's ``__dlpack__`` refuses it ("Can't export tensors
    that require gradient"), so its ``detach()`` is exported, as the launch's own export of such
    a tensor is; a lazy view (the negative bit) is refused before anything is compiled."""
    on_stub(stub_driver, tmp_path, """
        TensorBase = type("TensorBase", (), {"__module__": "torch._C"})

        class FakeTorch(TensorBase, Producer):
            def __init__(self, requires_grad=False, neg=False, **kw):
                Producer.__init__(self, **kw)
                self.requires_grad, self.neg, self.detached = requires_grad, neg, None

            def is_conj(self):
                return False

            def is_neg(self):
                return self.neg

            def detach(self):
                self.detached = FakeTorch(neg=self.neg, **self.kwargs)
                return self.detached

            def __dlpack__(self, **kw):
                if self.requires_grad:
                    raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
                return super().__dlpack__(**kw)

        staged = []
        tc._stage = lambda arg: staged.append(list(arg.words)) or tc._Staged(
            BASE + 0xD0000, len(arg.words), 1, arg.keep, arg.length)
        out = Dev([64], ptr=BASE + 0x9000)
        w = FakeTorch(requires_grad=True, shape=(64,), data=BASE + 0x1000)
        h = tc.launch(0x1234, (4,), klist, ([Dev([64], ptr=BASE), w], out, 1, 2, 3, 4))
        assert w.calls == [] and w.detached.calls == [{"stream": 0x1234, "max_version": (1, 3)}]
        assert staged == [[BASE, 64, 1, BASE + 0x1000, 64, 1]]
        h.wait()
        tile_py.synchronize()
        assert w.detached.deleted == 1
        lazy = FakeTorch(neg=True, shape=(64,), data=BASE + 0x1000)
        try:
            tc.launch(0x1234, (4,), klist, ([Dev([64], ptr=BASE), lazy], out, 1, 2, 3, 4))
            raise AssertionError("launched a lazy view")
        except ValueError as e:
            assert "has its negative bit set" in str(e), e
        assert lazy.calls == [] and len(staged) == 1
    """)
