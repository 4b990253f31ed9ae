"""GPU tests are marked ``gpu``: skipped with a reason on machines without a CUDA GPU, and
failed (not skipped) there when ``TILE_REQUIRE_GPU=1`` (the GPU bundle sets it)."""

import os
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _gpu_reason():
    """None when a CUDA GPU is usable, else why not."""
    if not os.path.exists("/dev/nvidia0") and shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU (no /dev/nvidia0, no nvidia-smi)"
    try:
        import torch  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the machine
        return f"PyTorch is not importable: {e}"
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False"
    return None


_REASON = "unset"


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (TILE_REQUIRE_GPU=1 turns a missing GPU into a failure)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    global _REASON
    if item.get_closest_marker("gpu") is None:
        return
    if _REASON == "unset":
        _REASON = _gpu_reason()
    if _REASON is None:
        return
    if os.environ.get("TILE_REQUIRE_GPU") == "1":
        pytest.fail(f"TILE_REQUIRE_GPU=1 but {_REASON}", pytrace=False)
    pytest.skip(f"needs a CUDA GPU: {_REASON}")


@pytest.fixture(scope="session")
def stub_driver(tmp_path_factory):
    """The path of ``libcuda.so.1`` built once from the repository's stub driver
    (``bench/profile/cuda_stub.c``: one device of compute capability 9.0, every kernel with seven
    8-byte parameters, every address device memory, events complete at once, nothing runs)."""
    source = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
        __file__)))), "bench", "profile", "cuda_stub.c")
    cc = shutil.which("cc")
    if cc is None or not os.path.exists(source):
        pytest.skip("needs a C compiler (cc) and the checkout's bench/profile/cuda_stub.c")
    out = tmp_path_factory.mktemp("stub") / "libcuda.so.1"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), source], check=True)
    return str(out)


@pytest.fixture
def counters():
    """For tests that launch nothing: asserts that nothing was launched and no release is left
    queued at the end, and gives the deltas of tile_py's debug counters (``counters["consumed"]``,
    ``counters["released"]``, ...) since the test began."""
    from tile_py import _testing

    class Delta:
        def __init__(self):
            self.start = _testing.debug_counters()

        def __getitem__(self, k):
            return _testing.debug_counters()[k] - self.start[k]

    d = Delta()
    yield d
    assert d["launches_issued"] == 0
    assert _testing.debug_counters()["queued_releases"] == 0
