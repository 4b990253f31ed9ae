"""A DLPack C exchange-API table mutated after tile_py cached it is refused, not followed."""

import pytest

from tile_py import In
from dlpack_ctypes import Producer, make_exchange_producer_type

from cpu_checks import check


# ---- an exchange-API table mutated after tile cached it ---------------------------------


def test_exchange_api_table_cleared_after_caching_is_a_buffer_error():
    import ctypes

    Ex, log = make_exchange_producer_type()
    a = Ex()
    check([In("float32")], (a,))
    assert log["from_obj"] == 1
    api = Ex._keep[0]
    saved = api.current_work_stream
    ctypes.memset(ctypes.addressof(api) + type(api).current_work_stream.offset, 0, 8)
    try:
        p = Producer()
        with pytest.raises(BufferError, match="argument 1: .*exchange API"):
            check([In("float32"), In("float32")], (p, Ex()))
        assert p.deleted == 1
        assert log["from_obj"] == 1  # nothing exported
    finally:
        api.current_work_stream = saved
