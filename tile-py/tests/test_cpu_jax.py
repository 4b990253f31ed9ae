"""tile_py.jax without a GPU: importing does not import jax, the trace-time conversions, and
tile's XLA FFI handler driven by a call frame built here with ctypes (the metadata query XLA makes
at registration, and refused calls returned through XLA's error API, never a crash)."""

import ctypes
import os
import subprocess
import sys

import pytest

import tile_py
from tile_py import _testing
import tile_py.jax
from tile_py import _tile_py as ext

# ---- the FFI C API's structs (xla/ffi/api/c_api.h, API 0.4), as XLA lays them out -------------

c_void_p, c_size_t, c_int64, c_uint32, c_int = (
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64, ctypes.c_uint32, ctypes.c_int)


class ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", c_void_p),
                ("major_version", c_int), ("minor_version", c_int)]


class ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", c_void_p),
                ("message", ctypes.c_char_p), ("errc", c_uint32)]


class StreamGetArgs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", c_void_p),
                ("ctx", c_void_p), ("stream", c_void_p)]


ERROR_CREATE = ctypes.CFUNCTYPE(c_void_p, ctypes.POINTER(ErrorCreateArgs))
STREAM_GET = ctypes.CFUNCTYPE(c_void_p, ctypes.POINTER(StreamGetArgs))
ANY_FN = ctypes.CFUNCTYPE(None, c_void_p)


class Api(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", c_void_p),
                ("api_version", ApiVersion), ("internal_api", c_void_p),
                ("error_create", ERROR_CREATE), ("error_get_details", c_void_p),
                ("error_destroy", c_void_p), ("handler_register", c_void_p),
                ("stream_get", STREAM_GET)] + [(f"fn{i}", c_void_p) for i in range(14)]


class Args(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", c_void_p), ("size", c_int64),
                ("types", ctypes.POINTER(c_uint32)), ("args", ctypes.POINTER(c_void_p))]


class Attrs(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", c_void_p), ("size", c_int64),
                ("types", ctypes.POINTER(c_uint32)), ("names", ctypes.POINTER(c_void_p)),
                ("attrs", ctypes.POINTER(c_void_p))]


class CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("extension_start", c_void_p), ("api", ctypes.POINTER(Api)),
                ("ctx", c_void_p), ("stage", c_uint32), ("args", Args), ("rets", Args),
                ("attrs", Attrs), ("future", c_void_p)]


class Metadata(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("api_version", ApiVersion), ("traits", c_uint32),
                ("state_type_id", c_int64)]


class InternalExtension(ctypes.Structure):
    _fields_ = [("struct_size", c_size_t), ("type", c_uint32), ("next", c_void_p)]


class MetadataExtension(ctypes.Structure):
    _fields_ = [("base", InternalExtension), ("metadata", ctypes.POINTER(Metadata))]


class ByteSpan(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_char_p), ("len", c_size_t)]


class Scalar(ctypes.Structure):
    _fields_ = [("dtype", c_uint32), ("value", c_void_p)]


# Struct sizes of API 0.4 (XLA_FFI_*_STRUCT_SIZE): up to the last field each version defines.
CALL_FRAME_SIZE = 168
METADATA_SIZE = 36
METADATA_EXTENSION_SIZE = 32
EXECUTE = 3
ATTR_SCALAR = 3
S64 = 5
INVALID_ARGUMENT = 3


def test_sizes_match_the_header():
    assert ctypes.sizeof(Api) == 200
    assert ctypes.sizeof(CallFrame) == 176
    assert CallFrame.future.offset == CALL_FRAME_SIZE
    assert ctypes.sizeof(MetadataExtension) == METADATA_EXTENSION_SIZE


class FakeXla:
    """An API table whose XLA_FFI_Error_Create records the errors the handler returns."""

    def __init__(self, stream_error=False):
        self.errors = []
        self._keep = []

        def create(args):
            self.errors.append((args.contents.errc, args.contents.message.decode()))
            return len(self.errors)  # any non-null pointer stands for the error

        def stream_get(args):
            args.contents.stream = None
            return 1 if stream_error else None

        self._create, self._stream = ERROR_CREATE(create), STREAM_GET(stream_get)
        self.api = Api(struct_size=ctypes.sizeof(Api), error_create=self._create,
                       stream_get=self._stream)
        self.api.api_version = ApiVersion(ctypes.sizeof(ApiVersion), None, 0, 4)

    def frame(self, attrs=(), stage=EXECUTE, size=CALL_FRAME_SIZE):
        f = CallFrame(struct_size=size, api=ctypes.pointer(self.api), stage=stage)
        f.args.struct_size = f.rets.struct_size = ctypes.sizeof(Args)
        n = len(attrs)
        types = (c_uint32 * max(n, 1))(*([ATTR_SCALAR] * n))
        names = (c_void_p * max(n, 1))()
        values = (c_void_p * max(n, 1))()
        for i, (name, v) in enumerate(attrs):
            raw = name.encode()
            span = ByteSpan(raw, len(raw))
            val = c_int64(v)
            sc = Scalar(S64, ctypes.cast(ctypes.pointer(val), c_void_p))
            self._keep += [raw, span, val, sc]
            names[i] = ctypes.addressof(span)
            values[i] = ctypes.addressof(sc)
        self._keep += [types, names, values]
        f.attrs = Attrs(ctypes.sizeof(Attrs), None, n, types, names, values)
        return f


def handler():
    cap = ext._xla_handler()
    # A library object of our own: setting argtypes on `ctypes.pythonapi`'s functions would
    # change them for every other test in the process.
    capi = ctypes.PyDLL(None)
    get = capi.PyCapsule_GetPointer
    get.restype, get.argtypes = c_void_p, [ctypes.py_object, ctypes.c_char_p]
    name = capi.PyCapsule_GetName
    name.restype, name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    assert name(cap) is None, "XLA takes handlers in capsules without a name"
    return ctypes.CFUNCTYPE(c_void_p, ctypes.POINTER(CallFrame))(get(cap, None))


def test_importing_tile_py_does_not_import_jax():
    code = "import sys, tile_py, tile_py.jax; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.strip() == "False"


def test_metadata_query_declares_api_version_and_command_buffer_trait():
    xla = FakeXla()
    meta = Metadata(struct_size=METADATA_SIZE, traits=0, state_type_id=77)
    extn = MetadataExtension(InternalExtension(METADATA_EXTENSION_SIZE, 1, None), ctypes.pointer(meta))
    f = xla.frame()
    f.extension_start = ctypes.addressof(extn)
    assert handler()(ctypes.byref(f)) is None
    assert xla.errors == []
    assert (meta.api_version.major_version, meta.api_version.minor_version) == (0, 4)
    assert meta.api_version.struct_size == ctypes.sizeof(ApiVersion)
    assert meta.traits == 1  # XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE
    # state_type_id lies past the struct size the caller declared: left alone.
    assert meta.state_type_id == 77
    meta.struct_size = ctypes.sizeof(Metadata)
    assert handler()(ctypes.byref(f)) is None
    assert meta.state_type_id == 0


def test_metadata_too_small_is_an_error():
    xla = FakeXla()
    meta = Metadata(struct_size=8)
    extn = MetadataExtension(InternalExtension(METADATA_EXTENSION_SIZE, 1, None), ctypes.pointer(meta))
    f = xla.frame()
    f.extension_start = ctypes.addressof(extn)
    assert handler()(ctypes.byref(f)) is not None
    [(code, msg)] = xla.errors
    assert code == INVALID_ARGUMENT and "XLA_FFI_Metadata has struct_size 8" in msg


@pytest.mark.parametrize(
    "case, want",
    [
        ({"stage": 1}, "execution stage 1"),
        ({"size": 100}, "XLA_FFI_CallFrame has struct_size 100"),
        ({"attrs": []}, "attribute `kernel` is missing"),
        ({"attrs": [("kernel", 1 << 40)]}, "no kernel with id 1099511627776"),
        ({"attrs": [("kernel", 0), ("colour", 3)]}, "unknown attribute `colour`"),
        # Only tile_py.jax's spelling of a scalar's name: two names never alias one scalar.
        ({"attrs": [("kernel", 0), ("scalar+5", 3)]}, "unknown attribute `scalar+5`"),
        ({"attrs": [("kernel", 0), ("scalar05", 3)]}, "unknown attribute `scalar05`"),
        # Malformed frames: refused, never read through.
        ({"attrs": [("kernel", 0)], "null": "types"}, "null attribute arrays"),
        ({"attrs": [("kernel", 0)], "null": "names"}, "null attribute arrays"),
        ({"attrs": [("kernel", 0)], "null": "name_ptr"}, "an attribute without a name"),
        ({"attrs": [("kernel", 0)], "null": "huge"}, "attributes (at most 65536)"),
    ],
)
def test_refused_calls_come_back_as_xla_errors(case, want):
    xla = FakeXla()
    null = case.pop("null", None)
    f = xla.frame(**case)
    if null == "types":
        f.attrs.types = None
    elif null == "names":
        f.attrs.names = None
    elif null == "name_ptr":
        span = ByteSpan(None, 6)
        xla._keep.append(span)
        f.attrs.names[0] = ctypes.addressof(span)
    elif null == "huge":
        f.attrs.size = 1 << 40
    assert handler()(ctypes.byref(f)) is not None
    [(code, msg)] = xla.errors
    assert code == INVALID_ARGUMENT
    assert msg.startswith("tile_py.jax: ") and want in msg, msg


def test_config_is_read_as_tile_py_launch_reads_it():
    assert ext._xla_config(4, (2, 3), 16) == ((4, 1, 1), (2, 3, 1), 16)
    assert ext._xla_config((1, 2, 3), 256) == ((1, 2, 3), (256, 1, 1), 0)
    with pytest.raises(TypeError, match="shared_mem must be an int"):
        ext._xla_config(1, 1, 1.5)
    with pytest.raises((TypeError, ValueError)):
        ext._xla_config((1, 2, 3, 4), 1)


def test_call_refuses_what_is_not_a_tile_kernel_and_unsound_vmap():
    with pytest.raises(TypeError, match="kernel must be a tile_py.Kernel"):
        tile_py.jax.call("scale", grid=1)
    with pytest.raises(ValueError, match="vmap_method='expand_dims'"):
        tile_py.jax.call("scale", grid=1, vmap_method="expand_dims")
    with pytest.raises(TypeError, match="kernel must be a tile_py.Kernel"):
        tile_py.jax.kernel_id(object())


def test_register_needs_a_kernel():
    with pytest.raises(TypeError, match="kernel must be a tile_py.Kernel"):
        ext._xla_register(3)
    with pytest.raises(TypeError, match="kernel must be a tile_py.Kernel"):
        ext._xla_scalars(3, [1.0])


# ---- role lists: which operand, result or scalar attribute each parameter takes ----------------

from tile_py import In, InOut, Out, Scalar as ScalarP  # noqa: E402


def test_roles_of_declared_intents():
    params = [In("float32"), Out("float32"), InOut("float32", ndim=2), ScalarP("f32"),
              In("int32", ndim=1), ScalarP("u64")]
    assert _testing.xla_roles(params) == (
        3, 2, 2,
        [("operand", 0, None), ("result", 0, None), ("inout", 1, 1), ("scalar", 0, None),
         ("operand", 2, None), ("scalar", 1, None)],
    )


def test_roles_given_per_call_site():
    # A cuTile kernel: every array declared In, its roles say which are results.
    params = [In("float32", ndim=1), In("float32", ndim=1), ScalarP("f32"), In("float32", ndim=1),
              In("float32", ndim=1)]
    roles = [("operand", 1), ("result", 1), ("scalar", 0), ("inout", 0, 0), ("operand", 2)]
    assert _testing.xla_roles(params, roles) == (
        3, 2, 1,
        [("operand", 1, None), ("result", 1, None), ("scalar", 0, None), ("inout", 0, 0),
         ("operand", 2, None)],
    )


@pytest.mark.parametrize(
    "params, roles, error, want",
    [
        ([In("float32")], [], ValueError, "0 roles for 1 parameters"),
        ([In("float32")], [("scalar", 0)], ValueError, "takes a buffer, its role (scalar attribute 0)"),
        ([ScalarP("f32")], [("operand", 0)], ValueError, "is a scalar, its role (operand 0) is not"),
        ([Out("float32")], [("operand", 0)], ValueError, "writes, and an operand is XLA's to keep"),
        ([InOut("float32")], [("operand", 0)], ValueError, "writes"),
        ([In("float32"), In("float32")], [("operand", 0), ("operand", 0)], ValueError,
         "operand 0 is taken by 2 parameters"),
        ([In("float32"), In("float32")], [("operand", 1), ("result", 0)],
         ValueError, "no parameter takes operand 0"),
        ([In("float32"), In("float32")], [("result", 0), ("inout", 0, 0)], ValueError,
         "result 0 is taken by 2 parameters"),
        ([ScalarP("f32"), ScalarP("f32")], [("scalar", 1), ("scalar", 0)], ValueError,
         "numbered in declaration order"),
        ([In("float32")], [("operand", -1)], TypeError, "role 0 must be"),
        ([In("float32")], [("output", 0)], TypeError, "role 0 must be"),
        ([In("float32")], [("inout", 0)], TypeError, "role 0 must be"),
        ([In("float32")], ["operand"], TypeError, "role 0 must be"),
        ([In("float32")], 3, TypeError, "roles must be a sequence"),
        # Buffer indices far past the parameter count are refused before anything is sized
        # by them.
        ([In("float32"), Out("float32")], [("operand", 0), ("result", 2**33)], ValueError,
         "buffer index 8589934592 for a kernel of 2 parameters"),
        ([In("float32"), Out("float32")], [("operand", 0), ("result", 2**62)], ValueError,
         "buffer index"),
        ([ScalarP("f32")] * 4097, [("scalar", i) for i in range(4097)], ValueError,
         "4097 scalar parameters (a call passes at most 4096)"),
    ],
)
def test_roles_breaking_a_rule_are_refused(params, roles, error, want):
    with pytest.raises(error, match="kernel `") as e:
        _testing.xla_roles(params, roles)
    assert want in str(e.value), str(e.value)


# ---- cutile_call's trace-time planning (without jax: arrays stood in for) ----------------------


class FakeArray:
    """What cutile_call reads of a JAX array (shape, dtype)."""

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), dtype


def is_fake(x):
    return isinstance(x, FakeArray)


def cutile_named(name, **fields):
    """An object of a class named like cuTile's (module cuda.tile.jax), as cutile_call duck-types
    them."""
    cls = type(name, (), {"__module__": "cuda.tile.jax._jax"})
    obj = cls()
    for k, v in fields.items():
        setattr(obj, k, v)
    return obj


def test_plan_sorts_inputs_outputs_aliases_scalars_and_tuples():
    x, y, z = FakeArray((1000,)), FakeArray((4, 8), "int8"), FakeArray((), "bool")
    names = ["x", "out", "pair", "state", "alpha", "tile", "extra"]
    args = (x, tile_py.jax.OutputPlaceholder((1000,), "float32"), (y, z), tile_py.jax.InputOutput(x),
            2.5, 16, cutile_named("OutputPlaceholder", shape=(3,), dtype="float64"))
    p = tile_py.jax._plan_args(names, args, is_fake)
    assert [k for k, _, _ in p.leaves] == ["in", "out", "in", "in", "inout", "value", "value", "out"]
    assert p.operands == [x, y, z, x]
    assert p.results == [((1000,), "float32"), ((1000,), "float32"), ((3,), "float64")]
    assert p.aliases == {3: 1}
    assert p.leaves[2][2] == "2 ('pair')[0]"
    shown = p.shown
    assert isinstance(shown[2], tuple) and shown[4:6] == (2.5, 16)
    standins = [shown[0], shown[1], shown[2][0], shown[2][1], shown[3], shown[6]]
    cais = [s.__cuda_array_interface__ for s in standins]
    assert [c["typestr"] for c in cais] == ["<f4", "<f4", "|i1", "|b1", "<f4", "<f8"]
    assert [c["shape"] for c in cais] == [(1000,), (1000,), (4, 8), (), (1000,), (3,)]
    assert all(c["strides"] is None and c["version"] == 3 for c in cais)  # dense row-major
    spans = []
    for c, n in zip(cais, [4000, 4000, 32, 1, 4000, 24]):
        ptr = c["data"][0]
        # XLA's guarantee, and no more: 16-byte aligned, not 32.
        assert ptr % 16 == 0 and ptr % 32 == 16, hex(ptr)
        spans.append((ptr, ptr + n))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "stand-ins must not overlap"


def test_roles_follow_the_compiled_keep_mask():
    x = FakeArray((64,))
    names = ["x", "y", "alpha", "tile", "n"]
    p = tile_py.jax._plan_args(
        names, (x, tile_py.jax.OutputPlaceholder((64,), "float32"), 2.0, 16, 64), is_fake)
    # "tile" is a ct.Constant: compiled in, not passed.
    roles, scalars = tile_py.jax._roles(p, (True, True, True, False, True), "k")
    assert roles == [("operand", 0), ("result", 0), ("scalar", 0), ("scalar", 1)]
    assert scalars == [2.0, 64]
    # The roles are what the registry takes for the kernel params_from_signature declares.
    params = [In("float32", ndim=1), In("float32", ndim=1), ScalarP("f32"), ScalarP("i32")]
    assert _testing.xla_roles(params, roles)[:3] == (1, 1, 2)
    with pytest.raises(TypeError, match=r"argument 0 \('x'\) is a compile-time constant"):
        tile_py.jax._roles(p, (False, True, True, False, True), "k")
    with pytest.raises(NotImplementedError, match="has 4 argument leaves compiled, 5 given"):
        tile_py.jax._roles(p, (True, True, True, True), "k")


def test_plan_refuses_what_is_not_a_jax_array_or_placeholder():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"argument 0 \('x'\): arrays are passed as JAX arrays"):
        tile_py.jax._plan_args(["x"], (np.zeros(4, np.float32),), is_fake)
    with pytest.raises(NotImplementedError, match=r"argument 0 \('xs'\): a list of arrays"):
        tile_py.jax._plan_args(["xs"], ([FakeArray((4,))],), is_fake)
    with pytest.raises(TypeError, match="InputOutput wraps a JAX array"):
        tile_py.jax._plan_args(["x"], (tile_py.jax.InputOutput(np.zeros(4)),), is_fake)
    with pytest.raises(NotImplementedError, match="dtype object cannot be described to cuTile"):
        tile_py.jax._plan_args(["x"], (FakeArray((4,), object),), is_fake)
    # A numpy scalar is a value (cuTile decides what it can take).
    p = tile_py.jax._plan_args(["a"], (np.float32(2.0),), is_fake)
    assert [k for k, _, _ in p.leaves] == ["value"]


def test_cutile_call_refuses_what_is_not_a_cutile_kernel():
    with pytest.raises(TypeError, match="kernel must be a cuTile kernel"):
        tile_py.jax.cutile_call((1,), "scale", ())
    with pytest.raises(TypeError, match="call cuTile kernels with tile_py.jax.cutile_call"):
        tile_py.jax.call(cutile_named("kernel"), grid=1)


def test_placeholders():
    a = tile_py.jax.OutputPlaceholder([2, 3], "float32")
    assert a.shape == (2, 3) and a == tile_py.jax.OutputPlaceholder((2, 3), "float32")
    assert "OutputPlaceholder(shape=(2, 3)" in repr(a)
    assert tile_py.jax.InputOutput("x").array == "x"
