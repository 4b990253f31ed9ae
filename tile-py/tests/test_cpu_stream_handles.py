"""Stream handles that do not fit a signed 64-bit ``stream=`` value are refused, as an int and
through ``__cuda_stream__``."""

import pytest

from tile_py import In
from dlpack_ctypes import Producer

from cpu_checks import check


# ---- stream handles must fit a signed 64-bit value ----------------------------------------


@pytest.mark.parametrize("s", [2**63, 2**64 - 2, 2**64 - 1])
def test_stream_handle_at_or_above_2_63_is_refused(s):
    p = Producer()
    with pytest.raises(ValueError, match=str(s)):
        check([In("float32")], (p,), stream=s)
    assert p.calls == [] and p.deleted == 0


def test_cuda_stream_protocol_handle_above_2_63_is_refused():
    class S:
        def __cuda_stream__(self):
            return (0, 2**64 - 1)

    p = Producer()
    with pytest.raises(ValueError, match=str(2**64 - 1)):
        check([In("float32")], (p,), stream=S())
    assert p.calls == [] and p.deleted == 0
    q = Producer()
    check([In("float32")], (q,), stream=2**63 - 1)
    assert q.calls == [{"stream": 2**63 - 1, "max_version": (1, 3)}]
