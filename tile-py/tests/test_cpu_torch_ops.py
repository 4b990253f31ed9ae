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


# --- The generated call path, against a stand-in for the few torch calls it makes ------------


class _FakeTensor:
    """A CUDA tensor as the generated call reads it (device, layout, storage)."""

    def __init__(self, n, device=0, dtype="bfloat16", ptr=0x10000, cuda=True):
        self.n, self.device_index, self.dtype, self.ptr, self.is_cuda = n, device, dtype, ptr, cuda
        self.device = ("cuda", device)
        self.alias_of = None
        self.requires_grad = False

    def numel(self):
        return self.n

    def get_device(self):
        return self.device_index if self.is_cuda else -1

    def untyped_storage(self):
        return _FakeStorage(self.ptr, 2 * self.n)

    def storage_offset(self):
        return 3

    def size(self):
        return (self.n,)

    def stride(self):
        return (1,)

    def set_(self, storage, offset, size, stride):
        assert storage.owning is False
        self.ptr, self.n, self.alias_of = storage.ptr, size[0], (storage.ptr, offset, size, stride)
        return self


class _FakeStorage:
    def __init__(self, ptr, nbytes, owning=True):
        self.ptr, self.size, self.owning = ptr, nbytes, owning

    def data_ptr(self):
        return self.ptr

    def nbytes(self):
        return self.size


class _FakeArg:
    def __init__(self, name, type_):
        self.name, self.type = name, type_


class _FakeSchema:
    def __init__(self, *args):
        self.arguments = [_FakeArg(n, t) for n, t in args]


class _FakeTorch:
    """What ``tile_py.torch``'s call path uses of torch: current raw streams, stream objects,
    the capture query, non-owning storages and ``empty``."""

    Tensor = _FakeTensor

    def __init__(self, raw=0, capturing=False):
        self.raw, self.capturing, self.streams_made, self.grad = raw, capturing, 0, False
        fake = self

        class _C:
            @staticmethod
            def _cuda_getCurrentRawStream(device):
                return fake.raw

            @staticmethod
            def _cuda_isCurrentStreamCapturing():
                return fake.capturing

            @staticmethod
            def _construct_storage_from_data_pointer(ptr, device, nbytes):
                return _FakeStorage(ptr, nbytes, owning=False)

        class cuda:
            @staticmethod
            def current_stream(device):
                fake.streams_made += 1
                return ("stream", device, fake.raw)

        self._C, self.cuda = _C, cuda

    def is_grad_enabled(self):
        return self.grad

    def empty(self, n, dtype, device):
        return _FakeTensor(n, device=device[1], dtype=dtype, ptr=0)


def _generated(monkeypatch, fake, spec, stub, **kw):
    launches = []
    monkeypatch.setattr(tt, "launch", lambda *a, **k: launches.append((a, k)))
    import inspect

    sig = inspect.signature(stub)
    tensors = kw.pop("tensors", ("x",))
    schema = _FakeSchema(*[(p, "Tensor" if p in tensors else "float") for p in sig.parameters])
    outputs = kw.pop("outputs", {})
    impl, fake_impl, source = tt._generate(
        fake, "tile_test::op", SCALE, sig, schema, tuple(spec), outputs, kw.pop("grid", 7),
        kw.pop("block", 256), kw.pop("shared_mem", 0),
    )
    return impl, fake_impl, source, launches


def test_generated_call_maps_args_once_with_defaults_and_keyword_only_inputs(monkeypatch):
    fake = _FakeTorch()
    seen = []

    def numel(x, **inputs):
        seen.append(sorted(inputs))
        return x.numel()

    def scale(x, alpha=2.0, *, beta=1.0): ...

    out = _FakeTensor(5)
    impl, fake_impl, source, launches = _generated(
        monkeypatch, fake, ("x", "out", "alpha", numel), scale,
        outputs={"out": lambda x, **_: out}, grid=lambda x, **_: x.numel() + 1,
    )
    x = _FakeTensor(5)
    assert impl(x) is out
    assert impl(x, 3.0, beta=4.0) is out
    (a1, k1), (a2, k2) = launches
    assert a1 == (("stream", 0, 0), 6, SCALE, (x, out, 2.0, 5)) and k1 == {"block": 256}
    assert a2[3] == (x, out, 3.0, 5)
    # Spec functions get every input as a keyword.
    assert seen == [["alpha", "beta"], ["alpha", "beta"]]
    # One stream object per device and raw handle, made once.
    assert fake.streams_made == 1
    # The fake implementation allocates and returns the outputs, launching nothing.
    assert fake_impl(x) is out and len(launches) == 2
    assert "def impl(x, alpha=_tile_default_alpha, *, beta=_tile_default_beta):" in source


def test_eager_on_the_default_stream_hands_tile_the_tensors(monkeypatch):
    fake = _FakeTorch(raw=0, capturing=True)  # never asked on the legacy default stream

    def op(x, y): ...

    before = dict(tt._region_calls)
    impl, _, _, launches = _generated(monkeypatch, fake, ("x", "y", 4), op, tensors=("x", "y"))
    x, y = _FakeTensor(4), _FakeTensor(4, ptr=0x20000)
    impl(x, y)
    assert launches[0][0][3] == (x, y, 4)
    assert tt._region_calls == before


def test_inside_a_capture_tile_gets_non_owning_aliases_of_every_dtype(monkeypatch):
    fake = _FakeTorch(raw=0x77, capturing=True)
    before = dict(tt._region_calls)

    def op(x, y): ...

    impl, _, _, launches = _generated(monkeypatch, fake, ("x", "y", 4), op, tensors=("x", "y"))
    x, y = _FakeTensor(4, dtype="bfloat16"), _FakeTensor(4, dtype="float32", ptr=0x20000)
    impl(x, y)
    ax, ay, n = launches[0][0][3]
    assert ax is not x and ay is not y and n == 4
    assert (ax.dtype, ax.alias_of) == ("bfloat16", (0x10000, 3, (4,), (1,)))
    assert (ay.dtype, ay.alias_of) == ("float32", (0x20000, 3, (4,), (1,)))
    assert tt._region_calls["capture"] == before["capture"] + 1


def test_graph_trees_warm_up_stream_gets_aliases_and_other_side_streams_do_not(monkeypatch):
    import types

    class Manager:
        stream = types.SimpleNamespace(cuda_stream=0x55)

    trees = types.ModuleType(tt._TREES)
    trees.get_manager = lambda device, create_if_none_exists=True: None if create_if_none_exists else Manager()
    monkeypatch.setitem(sys.modules, tt._TREES, trees)
    before = dict(tt._region_calls)

    def op(x): ...

    fake = _FakeTorch(raw=0x55)
    impl, _, _, launches = _generated(monkeypatch, fake, ("x", "x", 4), op)
    x = _FakeTensor(4)
    impl(x)
    assert launches[-1][0][3][0] is not x
    assert tt._region_calls["warmup"] == before["warmup"] + 1
    fake.raw = 0x66  # another side stream: eager, the tensor itself
    impl(x)
    assert launches[-1][0][3][0] is x
    assert tt._region_calls["warmup"] == before["warmup"] + 1


def test_device_comes_from_a_cuda_tensor_when_the_first_tensor_input_is_not_one(monkeypatch):
    fake = _FakeTorch()
    asked = []
    fake._C._cuda_getCurrentRawStream = staticmethod(lambda d: asked.append(d) or 0)

    def op(x, y): ...

    impl, _, _, _ = _generated(monkeypatch, fake, ("x", "y", 4), op, tensors=("x", "y"))
    impl(_FakeTensor(4, cuda=False), _FakeTensor(4, device=1))
    assert asked == [1]
    with pytest.raises(ValueError, match="no CUDA tensor among the arguments"):
        impl(_FakeTensor(4, cuda=False), _FakeTensor(4, cuda=False))


def test_reserved_parameter_names_are_refused(monkeypatch):
    def op(_tile_x): ...

    with pytest.raises(ValueError, match="reserved"):
        _generated(monkeypatch, _FakeTorch(), ("_tile_x", "_tile_x", 4), op, tensors=("_tile_x",))


def test_an_input_that_requires_grad_is_refused_while_grad_is_enabled(monkeypatch):
    fake = _FakeTorch()

    def op(x, y): ...

    impl, _, _, launches = _generated(monkeypatch, fake, ("x", "y", 4), op, tensors=("x", "y"))
    x, y = _FakeTensor(4), _FakeTensor(4)
    y.requires_grad = True
    impl(x, y)  # grad disabled: launched
    fake.grad = True
    with pytest.raises(RuntimeError, match="tile_test::op: an input requires grad, but a tile operator has no autograd formula"):
        impl(x, y)
    assert len(launches) == 1
