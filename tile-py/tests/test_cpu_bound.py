"""Prepared launches without a device: ``tile_py.BoundLaunch`` (``Kernel.bind``) refuses a bad
stream, configuration or kernel at bind time, before any driver call, with the same errors as
``tile_py.launch``. (Binding a good configuration needs a device: the GPU tests cover it.)"""

import inspect

import pytest

import tile_py

STREAM = 0x1234


def test_bound_launch_is_exported_and_documented():
    assert "BoundLaunch" in tile_py.__all__
    assert tile_py.BoundLaunch.__module__ == "tile_py"
    assert "bind" in dir(tile_py.Kernel)
    assert "launch" in (tile_py.Kernel.bind.__doc__ or "")
    assert "LaunchHandle" in (tile_py.BoundLaunch.__doc__ or "")


@pytest.mark.parametrize(
    "grid, block, kw, exc, pattern",
    [
        ((0,), 1, {}, ValueError, r"grid\[0\] is 0; every dimension must be at least 1"),
        ((2**31,), 1, {}, ValueError, r"grid\[0\] is 2147483648, above the limit 2147483647"),
        ((1, 1.5), 1, {}, TypeError, r"grid\[1\] must be an int, got 1.5"),
        (1, (1025,), {}, ValueError, r"block\[0\] is 1025, above the limit 1024"),
        (1, (32, 32, 2), {}, ValueError, r"block has 2048 threads"),
        (1, 1, {"shared_mem": -1}, ValueError, r"shared_mem is -1 bytes"),
        (1, 1, {"shared_mem": 1.0}, TypeError, r"shared_mem must be an int"),
    ],
)
def test_bad_configuration_refused_at_bind_time(grid, block, kw, exc, pattern):
    # The kernel is checked after the configuration, as tile_py.launch checks it: a bad
    # configuration is reported first, and no device is needed to report it.
    with pytest.raises(exc, match=pattern):
        tile_py.BoundLaunch(STREAM, grid, None, block=block, **kw)


def test_bad_stream_refused_at_bind_time():
    with pytest.raises(TypeError, match=r"stream is required \(got None\)"):
        tile_py.BoundLaunch(None, 1, None, block=1)


def test_non_kernel_refused_at_bind_time():
    with pytest.raises(TypeError, match=r"kernel must be a tile_py.Kernel, got 'k' \(str\)"):
        tile_py.BoundLaunch(STREAM, 1, "k", block=1)


def test_bind_takes_the_launch_keywords():
    params = inspect.signature(tile_py.BoundLaunch).parameters
    for name in ("block", "shared_mem", "cluster", "cooperative", "programmatic_dependent_launch"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name
