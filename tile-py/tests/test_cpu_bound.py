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
        ((-1,), 1, {}, ValueError, r"grid\[0\] is -1, outside 0..=4294967295"),
        ((2**32,), 1, {}, ValueError, r"grid\[0\] is 4294967296, outside 0..=4294967295"),
        ((1, 1.5), 1, {}, TypeError, r"grid\[1\] must be an int, got 1.5"),
        (1, (2**33,), {}, ValueError, r"block\[0\] is 8589934592, outside"),
        (1, 1, {"shared_mem": -1}, ValueError, r"shared_mem is -1 bytes"),
        (1, 1, {"shared_mem": 1.0}, TypeError, r"shared_mem must be an int"),
    ],
)
def test_bad_configuration_refused_at_bind_time(grid, block, kw, exc, pattern):
    # The configuration is converted before the kernel is looked at, as tile_py.launch does: what
    # no CUDA dimension can be is reported first, and no device is needed to report it. The
    # device's limits are checked once, by the bind itself (test_gpu_edges.py, row 13).
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


def test_bind_refuses_an_unknown_keyword_and_a_missing_block_in_its_own_words():
    # Kernel.bind and BoundLaunch read one set of keywords (those of tile_py.launch but args and
    # sync); a misspelt one is never ignored, and block has no default. The error names the call
    # that was made: BoundLaunch(...) here (Kernel.bind names itself); a bad value's error says
    # Kernel.bind for both, as it did before (test_cpu_args.py).
    with pytest.raises(TypeError, match=r"^BoundLaunch\(\) got an unexpected keyword argument 'blok'$"):
        tile_py.BoundLaunch(STREAM, 1, None, blok=1)
    with pytest.raises(TypeError, match=r"^BoundLaunch\(\) got an unexpected keyword argument 'sync'$"):
        tile_py.BoundLaunch(STREAM, 1, None, block=1, sync=False)
    with pytest.raises(TypeError, match=r"^BoundLaunch\(\) missing required keyword-only argument: 'block'$"):
        tile_py.BoundLaunch(STREAM, 1, None)
    with pytest.raises(TypeError, match=r"^BoundLaunch\(\) missing required keyword-only argument: 'block'$"):
        tile_py.BoundLaunch(STREAM, 1, None, shared_mem=0)
    with pytest.raises(TypeError, match=r"^Kernel.bind: cooperative must be True or False, got 1"):
        tile_py.BoundLaunch(STREAM, 1, None, block=1, cooperative=1)


@pytest.mark.parametrize(
    "kw",
    [
        {"shared_mem": None},
        {"cluster": None},
        {"cooperative": None},
        {"programmatic_dependent_launch": None},
        {"shared_mem": None, "cluster": None, "cooperative": None, "programmatic_dependent_launch": None},
    ],
)
def test_bind_takes_none_for_an_optional_keyword_as_launch_does(kw):
    # The signature says shared_mem=None, cluster=None, and tile_py.launch reads None as "not
    # given" for each of these: a bind with None gets as far as the kernel, as the launch does,
    # instead of refusing None as a value of the wrong kind.
    pattern = r"kernel must be a tile_py.Kernel, got 'k' \(str\)"
    with pytest.raises(TypeError, match=pattern):
        tile_py.launch(STREAM, 1, "k", (), block=1, **kw)
    with pytest.raises(TypeError, match=pattern):
        tile_py.BoundLaunch(STREAM, 1, "k", block=1, **kw)


def test_bind_with_block_none_names_block():
    # block has no default: None is a bad block, as for tile_py.launch, not a missing one.
    with pytest.raises(TypeError, match=r"block must be"):
        tile_py.launch(STREAM, 1, "k", (), block=None)
    with pytest.raises(TypeError, match=r"block must be"):
        tile_py.BoundLaunch(STREAM, 1, "k", block=None)
