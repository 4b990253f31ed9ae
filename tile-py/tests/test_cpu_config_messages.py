"""Launch-configuration values too large for any device are quoted exactly as given."""

import pytest

import tile_py

from cpu_checks import STREAM


# ---- huge launch-configuration values are quoted as given -------------------------------


def test_huge_grid_block_shared_mem_values_are_quoted_exactly():
    big = 2**200
    with pytest.raises(ValueError, match=rf"grid\[0\] is -{big}, outside 0..=4294967295"):
        tile_py.launch(STREAM, -big, None, (), block=1)
    with pytest.raises(ValueError, match=rf"grid\[0\] is {big}, outside 0..=4294967295"):
        tile_py.launch(STREAM, (big,), None, (), block=1)
    with pytest.raises(ValueError, match=rf"block\[1\] is -{big}, outside"):
        tile_py.launch(STREAM, 1, None, (), block=(1, -big))
    with pytest.raises(ValueError, match=rf"shared_mem is -{big} bytes, below the minimum 0"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=-big)
    with pytest.raises(ValueError, match=rf"shared_mem is {big} bytes, above the limit"):
        tile_py.launch(STREAM, 1, None, (), block=1, shared_mem=big)
