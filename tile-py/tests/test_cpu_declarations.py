"""Declarations and library constructors refuse bad arguments in tile_py's words: one line
naming the argument and quoting the value, never PyO3's extraction messages; keywords that
contradict each other are an error, not silently dropped. Also: a producer's own exception gets
an `argument i:` note and keeps its type; a host array is quoted on one line. No GPU needed."""

import numpy as np
import pytest

import tile_py
from tile_py import _testing
from tile_py import In, InOut, Out

STREAM = 0x1234
PYO3_WORDS = ("Can't extract", "is not an instance of", "failed to extract")


def assert_ours(e, *parts):
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in PYO3_WORDS:
        assert w not in msg, msg
    for p in parts:
        assert p in msg, msg


@pytest.mark.parametrize(
    "call, parts",
    [
        (lambda: tile_py.Library.from_cuda_source("x", "-O3"),
         ["Library.from_cuda_source: options must be a list of str", "'-O3' (str)"]),
        (lambda: tile_py.Library.from_cuda_source("x", b"-O3"),
         ["options must be a list of str", "b'-O3' (bytes)"]),
        (lambda: tile_py.Library.from_cuda_source("x", ["-O3", 3]),
         ["options must be a list of str", "['-O3', 3] (list)"]),
        (lambda: tile_py.Library.from_cuda_source(123),
         ["Library.from_cuda_source: source must be a str (CUDA C++ text)", "123 (int)"]),
        (lambda: tile_py.Library.from_bytes("str"),
         ["Library.from_bytes: data must be bytes", "Library.from_ptx", "'str' (str)"]),
        (lambda: tile_py.Library.from_bytes(1.5), ["data must be bytes", "1.5 (float)"]),
        (lambda: tile_py.Library.from_ptx(b".version 8.0"),
         ["Library.from_ptx: ptx must be a str", "Library.from_bytes", "b'.version 8.0' (bytes)"]),
        (lambda: tile_py.Library.from_file(3),
         ["Library.from_file: path must be a str or os.PathLike", "3 (int)"]),
        (lambda: In("float32", strided="yes"),
         ["In(strided=...) must be True or False", "'yes' (str)"]),
        (lambda: Out("float32", strided=1), ["Out(strided=...) must be True or False", "1 (int)"]),
        (lambda: InOut("float32", ndim=1, assume=[("unit_stride", 1)]),
         ["InOut(assume=...) must be a dict", "(list)"]),
    ],
)
def test_bad_constructor_arguments_name_the_argument(call, parts):
    with pytest.raises(TypeError) as e:
        call()
    assert_ours(e, *parts)


@pytest.mark.parametrize("decl, name", [(In, "In"), (Out, "Out"), (InOut, "InOut")])
def test_strided_with_ndim_contradict_each_other(decl, name):
    with pytest.raises(TypeError) as e:
        decl("float32", strided=True, ndim=2)
    assert_ours(e, f"{name}(strided=True) declares a pointer parameter", "ndim=2",
                "give one of them")
    # Each alone, or strided=False with ndim, declares what it says.
    assert repr(decl("float32", strided=True)) == f'tile_py.{name}("float32", strided=True)'
    assert repr(decl("float32", ndim=2, strided=False)) == \
        f'tile_py.{name}("float32", ndim=2, index="i64")'
    assert repr(decl("float32")) == f'tile_py.{name}("float32")'


def test_options_may_be_any_sequence_of_str():
    # Conversion passes: the call then compiles (a machine with a driver and NVRTC), or stops
    # at the missing driver or NVRTC, never at the options' type.
    for options in (["-O3"], ("-O3", "-std=c++17"), []):
        try:
            lib = tile_py.Library.from_cuda_source('extern "C" __global__ void k() {}', options)
        except (tile_py.DriverNotFoundError, RuntimeError, tile_py.CudaError) as e:
            assert not isinstance(e, TypeError), e
        else:
            assert isinstance(lib, tile_py.Library)


def test_a_producers_exception_keeps_its_type_and_gets_an_argument_note():
    class Boom:
        def __dlpack__(self, stream=None, max_version=None):
            raise KeyError("the producer's own failure")

    with pytest.raises(KeyError, match="the producer's own failure") as e:
        _testing.check_args([In("float32")] * 3, (Boom(), Boom(), Boom()), stream=STREAM)
    assert e.type is KeyError
    assert e.value.__notes__ == ["argument 0: raised while converting this argument"]


def test_a_host_array_is_quoted_on_one_line():
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    assert "\n" in repr(a)
    with pytest.raises(ValueError) as e:
        _testing.check_args([In("float32")], (a,), stream=STREAM)
    msg = str(e.value)
    assert msg.startswith("argument 0: tensor is on cpu, but the launch stream is on cuda:0"), msg
    assert "\n" not in msg, msg
    assert "; array([[ 0.,  1.,  2.,  3.,  4.,  5.,  6.,  7.], [ 8.,  9., 10.," in msg, msg
    assert "(ndarray) is host memory" in msg, msg
