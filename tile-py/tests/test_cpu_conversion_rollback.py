"""A conversion that fails, or panics, part-way through the arguments hands back everything it
claimed before the failing argument (capsules renamed back, owned exports released)."""

import gc
import sys

import pytest

from tile_py import In
from dlpack_ctypes import Producer, capsule_name, make_capsule

from cpu_checks import CAI, check


# ---- a panic while converting still rolls back -------------------------------------------


def test_non_ascii_typestr_is_a_type_error_and_rolls_back_earlier_arguments():
    cap, c = make_capsule()
    p = Producer()
    good = CAI()
    rc = sys.getrefcount(good)
    with pytest.raises(TypeError, match=r"argument 3: unsupported __cuda_array_interface__ typestr"):
        check([In("float32")] * 4, (cap, p, good, CAI(typestr="<\u00e94")))
    gc.collect()
    assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
    assert p.deleted == 1
    assert sys.getrefcount(good) == rc
    for ts in ("\u00e9f4", "<f\u00e9", "<f\u0664"):  # a non-ASCII digit is not a size either
        with pytest.raises(TypeError, match="typestr"):
            check([In("float32")], (CAI(typestr=ts),))
    check([In("float32")], (cap,))  # the caller's capsule is usable again
    del cap
    gc.collect()
    assert c.calls == 1


def _panic_exception_types():
    # pyo3 makes its PanicException type on the first error it fetches; find it by name.
    try:
        check([In("float32")], (1,))
    except TypeError:
        pass
    return [o for o in gc.get_objects()
            if isinstance(o, type) and o.__name__ == "PanicException"
            and o.__module__ == "pyo3_runtime"]


def test_panic_during_conversion_rolls_back_and_raises_runtime_error():
    # A PanicException fetched by pyo3 resumes the panic inside tile_py's conversion: the
    # panic path, reachable from Python.
    types = _panic_exception_types()
    assert types, "pyo3's PanicException type not found"
    seen = False
    for P in types:
        class Panicking(Producer):
            def __dlpack__(self, **kw):
                raise P("boom")

        cap, c = make_capsule()
        p = Producer()
        try:
            check([In("float32")] * 3, (cap, p, Panicking()))
        except RuntimeError as e:
            if "internal error" not in str(e):
                raise
            assert str(e).startswith("argument 2: ")
            seen = True
        except BaseException as e:  # another extension's PanicException: not tile_py's
            if type(e) is not P:
                raise
            continue
        gc.collect()
        assert capsule_name(cap) == "dltensor_versioned" and c.calls == 0
        assert p.deleted == 1
        check([In("float32")], (cap,))
    assert seen
