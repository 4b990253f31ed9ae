"""CPU tests of ``tile_py.torch.custom_op``'s definition-time checks (they run before PyTorch
is imported, so no GPU and no PyTorch are needed), and of importing ``tile_py.torch`` without
importing PyTorch."""

import subprocess
import sys

import pytest

import tile_py
from tile_py import In, InOut, Out, Scalar
import tile_py.torch as tt


class FakeKernel:
    """What custom_op reads of a kernel before PyTorch is imported: its name and parameters."""

    def __init__(self, params, name="k"):
        self.params = params
        self.name = name


SCALE = FakeKernel([In("float32"), Out("float32"), Scalar("f32"), Scalar("u64")], "scale")
ADD_ = FakeKernel([InOut("float32"), In("float32"), Scalar("u64")], "add_")


def numel(x, **_):
    return x.numel()


def like(x, **_):
    raise AssertionError("not called at definition")


def define(kernel, stub, **kw):
    kw.setdefault("grid", 1)
    return tt.custom_op("tile_test::op", kernel, **kw)(stub)


def test_importing_tile_py_torch_does_not_import_torch():
    code = "import sys, tile_py, tile_py.torch; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_param_intent_getters():
    assert [p.is_tensor for p in SCALE.params] == [True, True, False, False]
    assert [p.writes for p in SCALE.params] == [False, True, False, False]
    assert InOut("float32").writes


def test_undeclared_mutation_is_refused():
    def add_(x, y): ...

    with pytest.raises(ValueError, match=r"writes input\(s\) \['x'\].*mutates_args does not declare"):
        define(ADD_, add_, args=("x", "y", numel), mutates_args=())


def test_undeclared_mutation_refused_even_when_another_is_declared():
    def add_(x, y): ...

    with pytest.raises(ValueError, match=r"\['x'\]"):
        define(ADD_, add_, args=("x", "y", numel), mutates_args=("y",))


def test_tensor_parameter_must_be_named():
    def scale(x, alpha): ...

    with pytest.raises(TypeError, match=r"kernel argument 1 .* is a tensor: args\[1\] must name an input or an output"):
        define(SCALE, scale, args=("x", lambda x, **_: x, "alpha", numel))


def test_argument_count_must_match_the_kernel():
    def scale(x, alpha): ...

    with pytest.raises(ValueError, match="kernel 'scale' takes 4 arguments, args has 3"):
        define(SCALE, scale, args=("x", "out", "alpha"), outputs={"out": like})


@pytest.mark.parametrize(
    "args, outputs, message",
    [
        (("x", "nope", "alpha", numel), {}, "args\\[1\\] names 'nope', which is neither an input nor an output"),
        (("x", "out", "beta", numel), {"out": like}, "args\\[2\\] names 'beta', which is not an input"),
        (("x", "x", "alpha", numel), {"out": like}, "output 'out' is not passed to the kernel"),
        (("x", "alpha", "alpha", numel), {"alpha": like}, "output 'alpha' has the name of an input"),
        (("x", "out", "alpha", numel), {"out": 3}, "must be a function of the inputs"),
        (("x", "out", "alpha", [1]), {"out": like}, "must be an input name, a function of the inputs or a constant"),
    ],
)
def test_bad_specs_are_refused(args, outputs, message):
    def scale(x, alpha): ...

    with pytest.raises((ValueError, TypeError), match=message):
        define(SCALE, scale, args=args, outputs=outputs)


def test_output_bound_only_to_inputs_is_refused():
    def op(x): ...

    reads_only = FakeKernel([In("float32"), In("float32"), Scalar("u64")])
    with pytest.raises(ValueError, match="output 'out' is bound only to parameters the kernel reads"):
        define(reads_only, op, args=("x", "out", 4), outputs={"out": like})


@pytest.mark.parametrize("name", ["scale", "a::b::c", "::b", "a::", 3])
def test_operator_name_must_be_qualified(name):
    def scale(x, alpha): ...

    with pytest.raises(ValueError, match="operator name must be 'namespace::name'"):
        tt.custom_op(name, SCALE, args=("x", "out", "alpha", numel), outputs={"out": like}, grid=1)(scale)


def test_stub_with_var_args_is_refused():
    def scale(*xs): ...

    with pytest.raises(TypeError, match=r"may not take \*args or \*\*kwargs"):
        define(SCALE, scale, args=("x", "out", "alpha", numel), outputs={"out": like})


def test_valid_spec_reaches_pytorch():
    def scale(x, alpha): ...

    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            define(SCALE, scale, args=("x", "out", "alpha", numel), outputs={"out": like})
    else:
        pytest.skip("PyTorch is installed: registration is tested on the GPU")


class FakeCuTileKernel:
    """Stands for a cuTile kernel (``@ct.kernel``): a type from the ``cuda.tile`` package, no
    declared parameters."""


FakeCuTileKernel.__module__ = "cuda.tile._fake"


def test_cutile_kernel_needs_mutates_args():
    def axpy(x, y, alpha): ...

    with pytest.raises(ValueError, match="a cuTile kernel does not declare which arrays it writes: pass mutates_args"):
        define(FakeCuTileKernel(), axpy, args=("x", "y", "out", "alpha"), outputs={"out": like})


@pytest.mark.parametrize(
    "args, outputs, mutates, message",
    [
        (("x", "y", "nope", "alpha"), {}, (), "args\\[2\\] names 'nope', which is neither an input nor an output"),
        (("x", "y", "x", "alpha"), {"out": like}, (), "output 'out' is not passed to the kernel"),
        (("x", "y", "out", "alpha"), {"out": like}, ("z",), "mutates_args names 'z', which is not an input"),
    ],
)
def test_cutile_kernel_spec_checks(args, outputs, mutates, message):
    def axpy(x, y, alpha): ...

    with pytest.raises(ValueError, match=message):
        define(FakeCuTileKernel(), axpy, args=args, outputs=outputs, mutates_args=mutates)


def test_names_given_as_one_str_are_refused():
    def op(x): ...

    with pytest.raises(TypeError, match="mutates_args must be a sequence of names, not the str 'x'"):
        define(ADD_, op, args=("x", "x", numel), mutates_args="x")


def test_a_kernel_that_is_neither_kind_is_refused():
    def op(x): ...

    with pytest.raises(TypeError, match="kernel must be a tile_py.Kernel or a cuTile kernel"):
        define(None, op, args=("x",))
