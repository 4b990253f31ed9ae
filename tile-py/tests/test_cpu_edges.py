"""CPU tests of protocol edges (bad-input table rows 18 to 26 of the reliability plan): copied
outputs, producers' own ``TypeError``s, lazy torch views and autograd (with a stand-in torch
type), the per-thread default stream offered to ``__dlpack__``, JAX arrays bound to outputs,
dense row-major pointer parameters, CAI byte order and the ``__cuda_stream__`` protocol.

Each test asserts the exception type, the argument index and offending value in the message,
the deleter count, and that nothing was launched (the ``counters`` fixture)."""

import gc
import re

import pytest

from tile_py import _testing
from tile_py import In, InOut, Out
from dlpack_ctypes import (
    Producer,
    LegacyProducer,
    capsule_name,
    kDLComplex,
    kDLFloat,
    make_capsule,
    make_exchange_producer_type,
)

from cpu_checks import STREAM, check, notes

IS_COPIED = 2


# ---- row 18: a private copy (IS_COPIED) bound to an output ------------------------------------


@pytest.mark.parametrize("decl", [Out, InOut])
def test_row18_copied_capsule_refused_for_outputs_and_keeps_its_name(counters, decl):
    good, cg = make_capsule()
    cap, c = make_capsule(flags=IS_COPIED)
    with pytest.raises(ValueError, match=r"argument 1: .*DLPACK_FLAG_BITMASK_IS_COPIED"):
        check([In("float32"), decl("float32")], (good, cap))
    assert capsule_name(cap) == "dltensor_versioned"
    assert capsule_name(good) == "dltensor_versioned"
    assert (c.calls, cg.calls) == (0, 0)
    assert counters["consumed"] == 0
    # Nothing was lost: the caller's capsule is still usable, as an input.
    check([In("float32")], (cap,))
    assert c.calls == 1 and capsule_name(cap) == "used_dltensor_versioned"


def test_row18_copied_capsule_accepted_for_inputs(counters):
    cap, c = make_capsule(flags=IS_COPIED)
    check([In("float32")], (cap,))
    assert c.calls == 1 and counters["consumed"] == 1


def test_row18_copied_export_refused_and_released_once(counters):
    p = Producer(flags=IS_COPIED)
    with pytest.raises(ValueError, match=r"argument 0: .*IS_COPIED"):
        check([Out("float32")], (p,))
    gc.collect()
    # The export made for this launch was never consumed: its capsule's destructor released it,
    # exactly once.
    assert len(p.calls) == 1 and p.deleted == 1
    assert counters["consumed"] == 0


# ---- row 19: a producer's own TypeError is not retried away -----------------------------------


class OwnTypeError(Producer):
    """A producer whose ``__dlpack__`` accepts every keyword but whose own code raises."""

    def __init__(self, message, **kw):
        super().__init__(**kw)
        self.message = message

    def __dlpack__(self, **kw):
        self.calls.append(dict(kw))
        return self._inner(kw.get("stream"))

    def _inner(self, stream):
        raise TypeError(self.message)


@pytest.mark.parametrize(
    "message",
    [
        "_inner() takes 2 positional arguments but 3 were given",
        "f() got an unexpected keyword argument 'foo'",
        "f() got an unexpected keyword argument 'stream'",  # deeper than the call boundary
        "f() takes no keyword arguments",
    ],
)
def test_row19_producer_type_error_propagates_after_one_call(counters, message):
    p = OwnTypeError(message)
    with pytest.raises(TypeError) as e:
        check([In("float32")], (p,))
    assert str(e.value) == message
    assert p.calls == [{"stream": STREAM, "max_version": (1, 3)}]
    assert p.deleted == 0 and counters["consumed"] == 0
    assert "argument 0: raised while converting this argument" in notes(e.value)


def test_row19_binding_error_naming_another_keyword_is_not_retried(counters):
    class Strict(Producer):
        def __dlpack__(self, **kw):
            self.calls.append(dict(kw))
            # At the call boundary, but about a keyword tile_py did not pass.
            raise TypeError("__dlpack__() got an unexpected keyword argument 'foo'")

    p = Strict()
    with pytest.raises(TypeError, match="'foo'"):
        check([In("float32")], (p,))
    assert len(p.calls) == 1 and p.deleted == 0


def test_row19_stream_is_never_dropped(counters):
    # A producer whose __dlpack__ takes no stream cannot order its export after its own work:
    # refused, with the binding error as the cause, and nothing exported.
    p = LegacyProducer()
    with pytest.raises(TypeError, match=r"argument 0: .*__dlpack__ takes no stream argument") as e:
        check([In("float32")], (p,))
    assert isinstance(e.value.__cause__, TypeError)
    assert p.calls == [] and p.deleted == 0 and counters["consumed"] == 0


def test_row19_keyword_rejections_are_retried_keeping_the_stream(counters):
    class NoVersion(Producer):
        def __dlpack__(self, stream=None):
            self.calls.append({"stream": stream})
            return self._export()

    class NoKeywords(Producer):
        def __dlpack__(self, stream, /):
            self.calls.append({"stream": stream})
            return self._export()

    a, b = NoVersion(), NoKeywords()
    check([In("float32"), In("float32")], (a, b))
    assert a.calls == [{"stream": STREAM}] and b.calls == [{"stream": STREAM}]
    assert (a.deleted, b.deleted) == (1, 1)


# ---- row 20: the per-thread default stream offered to __dlpack__ -------------------------------


def test_row20_per_thread_default_stream_is_offered_as_the_legacy_stream(counters):
    # PyTorch refuses stream=2 (BufferError): the export is asked for on the legacy default
    # stream (1), which every CUDA producer supports, and the launch waits for that stream.
    class RefusesPerThread(Producer):
        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            if stream == 2:
                raise BufferError("per-thread default stream is not supported")
            return super().__dlpack__(stream=stream, max_version=max_version)

    p = RefusesPerThread()
    check([In("float32")], (p,), stream=2)
    assert p.calls == [{"stream": 1, "max_version": (1, 3)}] and p.deleted == 1
    # Other streams are offered as they are; sync=False still offers -1.
    q = Producer()
    check([In("float32")], (q,), stream=STREAM)
    check([In("float32")], (q,), stream=2, sync=False)
    assert q.calls == [
        {"stream": STREAM, "max_version": (1, 3)},
        {"stream": -1, "max_version": (1, 3)},
    ]


# ---- rows 21 and 22: lazy torch views and autograd (a stand-in for torch.Tensor) --------------

# The classification reads the MRO for `torch._C.TensorBase`; a class of that name and module
# stands in for it without importing torch.
TensorBase = type("TensorBase", (), {"__module__": "torch._C"})


class FakeTorch(TensorBase, Producer):
    """A torch-like tensor exported through ``__dlpack__``, which (like torch's) refuses
    tensors that require grad."""

    def __init__(self, conj=False, neg=False, requires_grad=False, **kw):
        Producer.__init__(self, **kw)
        self.conj, self.neg, self.requires_grad = conj, neg, requires_grad
        self.detached = None

    def is_conj(self):
        return self.conj

    def is_neg(self):
        return self.neg

    def detach(self):
        self.detached = FakeTorch(conj=self.conj, neg=self.neg)
        return self.detached

    def __dlpack__(self, **kw):
        if self.requires_grad:
            raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
        return super().__dlpack__(**kw)


def fake_torch_exchange_type():
    Ex, log = make_exchange_producer_type()

    class FakeTorchEx(TensorBase, Ex):
        def __init__(self, conj=False, neg=False, requires_grad=False, **kw):
            Ex.__init__(self, **kw)
            self.conj, self.neg, self.requires_grad = conj, neg, requires_grad

        def is_conj(self):
            return self.conj

        def is_neg(self):
            return self.neg

    return FakeTorchEx, log


@pytest.mark.parametrize("decl", [In, Out, InOut])
@pytest.mark.parametrize("bit, what", [("conj", "conjugate bit"), ("neg", "negative bit")])
def test_row21_lazy_views_refused_on_every_path(counters, decl, bit, what):
    Ex, log = fake_torch_exchange_type()
    # torch sets the conjugate bit on complex tensors only; the negative bit on any dtype.
    dtype, name = ((kDLComplex, 64, 1), "complex64") if bit == "conj" else ((kDLFloat, 32, 1), "float32")
    via_ex = Ex(**{bit: True}, dtype=dtype)
    via_dlpack = FakeTorch(**{bit: True})
    for t, declared in ((via_ex, name), (via_dlpack, "float32")):
        good = Producer()
        with pytest.raises(ValueError, match=rf"argument 1: .*has its {what} set"):
            check([In("float32"), decl(declared)], (good, t))
        assert good.deleted == 1  # exported for this launch, rolled back, released once
    # The exchange API exports before the check (the export's dtype spares the conjugate query
    # for real tensors): the refused export was released once. __dlpack__ was never called.
    assert log["from_obj"] == 1 and via_ex.deleted == 1
    assert via_dlpack.calls == [] and via_dlpack.deleted == 0
    assert counters["consumed"] == counters["released"] == 1


def test_row21_conjugate_bit_is_not_asked_of_real_exchange_tensors(counters):
    Ex, log = fake_torch_exchange_type()

    class RealOnly(Ex):
        def is_conj(self):
            raise AssertionError("is_conj asked of a real tensor")

    real, cplx = RealOnly(), Ex(conj=True, dtype=(kDLComplex, 64, 1))
    check([In("float32")], (real,))
    with pytest.raises(ValueError, match=r"argument 0: .*has its conjugate bit set"):
        check([In("complex64")], (cplx,))
    assert real.deleted == 1 and cplx.deleted == 1


@pytest.mark.parametrize("decl", [Out, InOut])
def test_row22_requires_grad_refused_for_outputs_on_every_path(counters, decl):
    Ex, log = fake_torch_exchange_type()
    ex, dl = Ex(requires_grad=True), FakeTorch(requires_grad=True)
    for t in (ex, dl):
        with pytest.raises(ValueError, match=r"argument 0: .*requires grad.*detach\(\)"):
            check([decl("float32")], (t,))
    # The exchange-API export is made before the check and released once when it refuses;
    # __dlpack__ is never called.
    assert log["from_obj"] == 1 and ex.deleted == 1 and dl.deleted == 0
    assert counters["consumed"] == counters["released"] == 1


def test_row22_requires_grad_accepted_for_inputs_on_every_path(counters):
    Ex, log = fake_torch_exchange_type()
    ex = Ex(requires_grad=True)
    dl = FakeTorch(requires_grad=True)
    check([In("float32"), In("float32")], (ex, dl))
    assert log["from_obj"] == 1 and ex.deleted == 1
    # torch's __dlpack__ refuses tensors that require grad: the detached view was exported.
    assert dl.calls == [] and dl.detached is not None and dl.detached.deleted == 1
    assert counters["consumed"] == 2


def test_rows21_22_plain_torch_tensors_pass(counters):
    Ex, log = fake_torch_exchange_type()
    ex, dl = Ex(), FakeTorch()
    check([Out("float32"), InOut("float32")], (ex, dl))
    assert (ex.deleted, dl.deleted) == (1, 1)


# ---- row 23: immutable producers (JAX) bound to outputs ---------------------------------------


class FakeJaxArray(Producer):
    pass


FakeJaxArray.__module__ = "jaxlib._jax"
FakeJaxArray.__name__ = FakeJaxArray.__qualname__ = "ArrayImpl"


@pytest.mark.parametrize("decl", [Out, InOut])
def test_row23_jax_array_refused_for_outputs(counters, decl):
    a = FakeJaxArray()
    with pytest.raises(ValueError, match=r"argument 0: .*JAX array.*immutable.*jax\.ffi\.ffi_call"):
        check([decl("float32")], (a,))
    assert a.calls == [] and a.deleted == 0 and counters["consumed"] == 0


def test_row23_jax_array_accepted_for_inputs(counters):
    a = FakeJaxArray()
    check([In("float32")], (a,))
    assert len(a.calls) == 1 and a.deleted == 1


def test_row23_read_only_export_refused_for_outputs(counters):
    p = Producer(flags=1)
    with pytest.raises(ValueError, match=r"argument 0: .*read-only"):
        check([Out("float32")], (p,))
    gc.collect()
    assert p.deleted == 1 and counters["consumed"] == 0


# ---- row 24: plain pointer parameters need dense row-major tensors -----------------------------


@pytest.mark.parametrize("decl", [In, Out, InOut])
def test_row24_transposed_view_refused_for_a_plain_pointer(counters, decl):
    first, c0 = make_capsule()
    t, c = make_capsule(shape=(64, 64), strides=(1, 64))
    with pytest.raises(ValueError, match=r"argument 1: .*not dense row-major \(shape \[64, 64\], strides \[1, 64\]"):
        check([In("float32"), decl("float32")], (first, t))
    assert capsule_name(t) == "dltensor_versioned" and capsule_name(first) == "dltensor_versioned"
    assert (c.calls, c0.calls) == (0, 0) and counters["consumed"] == 0


def test_row24_strided_parameter_accepts_any_layout(counters):
    t, c = make_capsule(shape=(64, 64), strides=(1, 64))
    o, co = make_capsule(shape=(64, 32), strides=(64, 2))
    b, cb = make_capsule(shape=(4, 4), strides=(0, 1))
    check([In("float32", strided=True), Out("float32", strided=True), In("float32", strided=True)], (t, o, b))
    assert (c.calls, co.calls, cb.calls) == (1, 1, 1)


def test_row24_strided_declaration_is_shown():
    assert repr(In("float32", strided=True)) == 'tile_py.In("float32", strided=True)'
    assert repr(Out("f32")) == 'tile_py.Out("float32")'
    assert In("f32", strided=True) != In("f32")
    assert str(InOut("f32", strided=True)) == "in-out strided tensor of float32"


# ---- row 25: CAI typestr byte order ------------------------------------------------------------


class CAI:
    def __init__(self, typestr, shape=(4,)):
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0x20000, False),
            "version": 3,
            "strides": None,
        }


DTYPES = {"f4": "float32", "u1": "uint8", "i2": "int16", "c8": "complex64"}


@pytest.mark.parametrize("typestr", ["?f4", ">f4", "|f4", "!f4", "^f4", " f4", ">u1", "|i2", "|c8"])
def test_row25_cai_byte_order_refused(counters, typestr):
    first = Producer()
    message = f"argument 1: unsupported __cuda_array_interface__ typestr \"{typestr}\": byte order"
    with pytest.raises(TypeError, match=re.escape(message)):
        check([In("float32"), In(DTYPES[typestr[1:]])], (first, CAI(typestr)))
    assert first.deleted == 1 and counters["consumed"] == 0


@pytest.mark.parametrize(
    "typestr, dtype", [("<f4", "float32"), ("=f4", "float32"), ("|u1", "uint8"), ("<u1", "uint8"), ("|b1", "bool"), ("|i1", "int8")]
)
def test_row25_cai_byte_order_accepted(counters, typestr, dtype):
    check([In(dtype)], (CAI(typestr),))
    assert counters["consumed"] == 1


# ---- row 26: the __cuda_stream__ protocol ------------------------------------------------------


class CudaStream:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return self.value


@pytest.mark.parametrize(
    "value, exc, what",
    [
        ((0, True), TypeError, r"the handle must be an int, got True \(bool\)"),
        ((0, False), TypeError, r"the handle must be an int, got False \(bool\)"),
        ((0, 1.5), TypeError, r"the handle must be an int, got 1\.5 \(float\)"),
        ((0, "0x1234"), TypeError, r"the handle must be an int, got '0x1234' \(str\)"),
        ((1, 0x1234), ValueError, r"protocol version 1 \(int\) is not supported \(0 expected\)"),
        ((True, 0x1234), ValueError, r"protocol version True \(bool\) is not supported"),
        (("0", 0x1234), ValueError, r"protocol version '0' \(str\) is not supported"),
        ((0,), TypeError, r"expected \(version, handle\)"),
        ([0, 0x1234], TypeError, r"expected \(version, handle\)"),
    ],
)
def test_row26_malformed_cuda_stream_refused(counters, value, exc, what):
    p = Producer()
    with pytest.raises(exc, match=what):
        check([In("float32")], (p,), stream=CudaStream(value))
    assert p.calls == [] and p.deleted == 0 and counters["consumed"] == 0


def test_row26_well_formed_cuda_stream_accepted(counters):
    p = Producer()
    check([In("float32")], (p,), stream=CudaStream((0, 0x4321)))
    assert p.calls == [{"stream": 0x4321, "max_version": (1, 3)}] and p.deleted == 1


def test_row19_pybind11_style_binding_error_is_retried_keeping_the_stream(counters):
    # pybind11 and nanobind say "incompatible function arguments" without naming the keyword:
    # retried without max_version, then with the stream positionally; never without it.
    class Bound(Producer):
        def __init__(self, accepts, **kw):
            super().__init__(**kw)
            self.accepts = accepts

        def __dlpack__(self, *args, **kw):
            call = {"args": args, **kw}
            if call.keys() - {"args"} - self.accepts or (args and "positional" not in self.accepts):
                raise TypeError("__dlpack__(): incompatible function arguments. The following argument types are supported: ...")
            self.calls.append(call)
            return self._export()

    only_stream = Bound({"stream"})
    positional = Bound({"positional"})
    check([In("float32"), In("float32")], (only_stream, positional))
    assert only_stream.calls == [{"args": (), "stream": STREAM}]
    assert positional.calls == [{"args": (STREAM,)}]
    nothing = Bound(set())
    with pytest.raises(TypeError, match="takes no stream argument"):
        check([In("float32")], (nothing,))
    assert nothing.calls == [] and nothing.deleted == 0
