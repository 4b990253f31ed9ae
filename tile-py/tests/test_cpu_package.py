"""The installed package: its version, its wheel metadata, and the error a machine without a CUDA
driver gets. No GPU needed."""

import importlib.metadata
import os
import re
import subprocess
import sys
import textwrap

import tile_py

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _crate_version():
    """tile-py's version from the workspace manifests, or None outside a checkout (the GPU
    bundle) or before Python 3.11 (no tomllib)."""
    try:
        import tomllib
    except ImportError:
        return None
    crate = os.path.join(_REPO, "tile-py", "Cargo.toml")
    if not os.path.exists(crate):
        return None
    with open(crate, "rb") as f:
        package = tomllib.load(f)["package"]
    if isinstance(package["version"], str):
        return package["version"]
    with open(os.path.join(_REPO, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["workspace"]["package"]["version"]


def test_version_is_the_crate_and_wheel_version():
    v = tile_py.__version__
    assert isinstance(v, str) and re.fullmatch(r"\d+\.\d+\.\d+", v), v
    assert v == tile_py._tile_py.__version__
    # maturin writes the crate version into the wheel's metadata.
    assert v == importlib.metadata.version("tile-py")
    crate = _crate_version()
    if crate is not None:
        assert v == crate


def test_wheel_metadata():
    dist = importlib.metadata.distribution("tile-py")
    md = dist.metadata
    assert md["Summary"].startswith("Launch CUDA kernels")
    assert md["License-Expression"] == "Apache-2.0"
    assert any(f.name == "LICENSE" for f in dist.files or [])
    urls = dict(u.split(", ", 1) for u in md.get_all("Project-URL"))
    assert urls["Homepage"].startswith("https://")
    classifiers = md.get_all("Classifier")
    for c in ("Environment :: GPU :: NVIDIA CUDA", "Operating System :: POSIX :: Linux", "Typing :: Typed"):
        assert c in classifiers
    assert md["Description-Content-Type"].startswith("text/markdown")
    assert "tile_py" in md.get_payload()  # the README
    # Requires-Python is the abi3 floor of the wheel's tag (cp310-abi3-... needs >=3.10).
    tags = [line.split(": ", 1)[1] for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag: ")]
    assert tags and all(t.split("-")[1] == "abi3" for t in tags), tags
    floor = {t.split("-")[0] for t in tags}
    assert len(floor) == 1
    (cp,) = floor
    assert md["Requires-Python"] == f">=3.{cp[3:]}"
    assert f"Programming Language :: Python :: 3.{cp[3:]}" in classifiers


def _run_without_driver(code):
    """Runs `code` in a fresh interpreter whose CUDA driver path names a missing file (the driver
    is loaded once per process, so the path must be set before the first call)."""
    env = dict(os.environ, TILE_LIBCUDA="/nonexistent/tile-test/libcuda.so.1")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_driver_not_found_error_is_a_cuda_error():
    assert issubclass(tile_py.DriverNotFoundError, tile_py.CudaError)
    assert issubclass(tile_py.DriverNotFoundError, RuntimeError)
    assert tile_py.DriverNotFoundError.__module__ == "tile_py"
    assert "DriverNotFoundError" in tile_py.__all__


def test_missing_driver_raises_driver_not_found_error():
    # Every entry that needs the driver raises DriverNotFoundError, with name and function None
    # and a message naming the library; import, stats and synchronize need no driver.
    r = _run_without_driver(
        """
        import tile_py
        assert tile_py.stats()["launches"] == 0
        tile_py.synchronize()
        for load in (lambda: tile_py.Library.from_ptx(".version 8.0"),
                     lambda: tile_py.Library.from_bytes(b"\\x7fELF"),
                     lambda: tile_py.Library.from_ptx(".version 8.0")):  # the same error again
            try:
                load()
            except tile_py.DriverNotFoundError as e:
                assert isinstance(e, tile_py.CudaError)
                assert e.name is None and e.function is None, (e.name, e.function)
                assert "/nonexistent/tile-test/libcuda.so.1" in str(e), str(e)
                assert "TILE_LIBCUDA" in str(e), str(e)
            else:
                raise AssertionError("no DriverNotFoundError")
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_unreadable_library_file_raises_os_error_like_open(tmp_path):
    # The file is read before the driver is asked for: an OSError subclass as `open()` raises
    # it, with errno and filename, on any machine.
    missing = tmp_path / "no-such" / "kernel.cubin"
    try:
        tile_py.Library.from_file(missing)
    except FileNotFoundError as e:
        assert e.errno == 2, e.errno
        assert os.fspath(e.filename) == str(missing), e.filename
        assert str(missing) in str(e), str(e)
        assert "os error" not in str(e), str(e)
    else:
        raise AssertionError("no FileNotFoundError")
    try:
        tile_py.Library.from_file(tmp_path)  # a directory
    except OSError as e:
        assert e.errno is not None and os.fspath(e.filename) == str(tmp_path), (e.errno, e.filename)
    else:
        raise AssertionError("no OSError for a directory")


def test_the_namespace_holds_no_test_hook():
    """`tile_py`'s namespace is its API: every public name is in `__all__`, and the test and
    benchmark hooks, the process hooks and the JAX / cuTile internals are elsewhere
    (`tile_py._testing`, the compiled `tile_py._tile_py`)."""
    import tile_py._testing as hooks

    hook_names = {n for n in dir(hooks) if not n.startswith("__")}
    assert {"check_args", "pack_args", "debug_counters", "exchange_api_cost", "queue_release",
            "release_thread", "shutdown", "after_fork_in_child", "xla_roles"} <= hook_names
    names = set(dir(tile_py))
    assert set(tile_py.__all__) <= names
    # Beyond `__all__`: dunders, the version, and submodules (the compiled module, and
    # `_testing` / `cutile` / `jax` / `torch` once imported).
    extra = {n for n in names - set(tile_py.__all__) if not (n.startswith("__") and n.endswith("__"))}
    assert extra <= {"_tile_py", "_testing", "cutile", "jax", "torch"}, extra
    for n in extra:
        assert type(getattr(tile_py, n)).__name__ == "module", n
    for n in tile_py.__all__:
        assert not n.startswith("_"), n


def test_kernel_bind_is_a_method_of_the_compiled_class():
    """`Kernel.bind` is defined by the extension, not patched on from Python."""
    bind = tile_py.Kernel.__dict__["bind"]
    assert type(bind).__name__ == "method_descriptor", type(bind)
    assert bind.__text_signature__.startswith("($self, stream, grid, *, block")
