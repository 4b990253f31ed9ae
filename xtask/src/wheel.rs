//! `cargo xtask wheel`: the abi3 wheel of `tile-py` (maturin), the CPU pytest run of
//! `cargo xtask test`, and the Python part of the GPU bundle.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{run_cmd, workspace_root};

/// The Python used to build and test (`TILE_PYTHON`, else `python3`).
fn python() -> String {
    std::env::var("TILE_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `target/py-venv/bin/python`, creating the virtual environment (from `TILE_PYTHON`, else
/// `python3`) on first use, with `requirements` installed from PyPI. pip leaves requirements
/// that are already met alone without asking the index, so a set-up venv needs no network. A
/// venv keeps pip away from a system Python that forbids installing (PEP 668).
fn venv_python(requirements: &[&str]) -> Result<PathBuf> {
    let venv = workspace_root().join("target/py-venv");
    let vpy = venv.join("bin/python");
    if !vpy.exists() {
        run_cmd(Command::new(python()).args(["-m", "venv"]).arg(&venv))?;
    }
    pip_install(&vpy, requirements)?;
    Ok(vpy)
}

/// `python -m pip install --quiet --disable-pip-version-check ARGS...` with `python`.
fn pip_install<S: AsRef<std::ffi::OsStr>>(python: &Path, args: &[S]) -> Result<()> {
    run_cmd(
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(args),
    )
}

/// maturin, and zig (the `ziglang` wheel) to link the extension against glibc 2.17 whatever
/// this machine's glibc is. Pinned: maturin's zig driver follows zig's command line.
const BUILD_REQUIREMENTS: &[&str] = &["maturin>=1.9.3,<2", "ziglang==0.17.1"];

/// The oldest glibc the wheel runs on, as a manylinux policy (glibc 2.17, the floor of Rust's
/// `x86_64-unknown-linux-gnu` target).
const MANYLINUX: &str = "manylinux2014";

/// NumPy and pytest for the suite; mypy for `stubtest`, pinned because each mypy release adds
/// checks (mypy 2.4 needs Python 3.10 or newer, as the wheel does; without it stubtest is
/// skipped, saying so);
/// cuTile Python (`cuda-tile`, a 0.4 MB wheel without its compiler extra; it imports without a
/// driver) for the CPU tests of `tile_py.cutile`, pinned to the version whose calling convention
/// `tile_py.cutile` declares.
const TEST_REQUIREMENTS: &[&str] = &[
    "numpy",
    "pytest",
    "mypy==2.4.1; python_version >= '3.10'",
    "cuda-tile==1.7.0; python_version >= '3.10'",
];

/// Builds `target/wheels/tile_py-*.whl` (release, abi3, stripped, `manylinux2014` /
/// `manylinux_2_17`: linked by zig against glibc 2.17) with maturin from `target/py-venv`
/// (maturin and zig installed there when missing) and returns its path.
pub fn build() -> Result<PathBuf> {
    let root = workspace_root();
    let vpy = venv_python(BUILD_REQUIREMENTS)?;
    let wheels = root.join("target/wheels");
    if wheels.exists() {
        for e in fs::read_dir(&wheels)? {
            let p = e?.path();
            if p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("tile_py-"))
            {
                fs::remove_file(&p)?;
            }
        }
    }
    // maturin finds zig as `python3 -m ziglang` on PATH: the venv's bin directory first.
    let bin = vpy.parent().context("venv python has a directory")?;
    let path = std::env::join_paths(
        std::iter::once(bin.to_path_buf()).chain(
            std::env::var_os("PATH")
                .iter()
                .flat_map(std::env::split_paths),
        ),
    )?;
    run_cmd(Command::new(&vpy).env("PATH", path).args([
        "-m",
        "maturin",
        "build",
        "--release",
        "--zig",
        "--compatibility",
        MANYLINUX,
        "--manifest-path",
        "tile-py/Cargo.toml",
        "--out",
        "target/wheels",
    ]))?;
    find_wheel(&wheels)
}

fn find_wheel(dir: &Path) -> Result<PathBuf> {
    for e in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let p = e?.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with("tile_py-") && name.ends_with(".whl") {
            if !name.contains("abi3") {
                bail!("{name} is not an abi3 wheel");
            }
            return Ok(p);
        }
    }
    bail!("maturin built no tile_py wheel in {}", dir.display())
}

/// Installs `wheel` into `target/py-venv` (created with NumPy, pytest and mypy from PyPI on
/// first use), runs the pytest suite there, then mypy's `stubtest`: `tile_py/__init__.pyi`
/// against the installed module. Without a GPU the `gpu` tests are reported as skipped, with
/// the reason. pytest also writes its results as JUnit XML to `junit_xml` (for the totals that
/// `cargo xtask test` prints).
pub fn pytest(wheel: &Path, junit_xml: &Path) -> Result<()> {
    let vpy = venv_python(TEST_REQUIREMENTS)?;
    pip_install(
        &vpy,
        &[
            "--force-reinstall".as_ref(),
            "--no-deps".as_ref(),
            wheel.as_os_str(),
        ],
    )?;
    run_cmd(
        Command::new(&vpy)
            .args([
                "-m",
                "pytest",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "tile-py/tests",
            ])
            .arg(format!("--junit-xml={}", junit_xml.display())),
    )?;
    stubtest(&vpy)
}

/// `python -m mypy.stubtest tile_py`: every name, signature, `@final` and `__all__` of the stub
/// matches the installed module. No allowlist: there is no difference to excuse.
fn stubtest(vpy: &Path) -> Result<()> {
    if !succeeds(Command::new(vpy).args(["-c", "import mypy.stubtest"])) {
        println!("stubtest: skipped (mypy is not installed: it needs Python 3.10 or newer)");
        return Ok(());
    }
    // Run in target/, where its `.mypy_cache` goes (stubtest reads no MYPY_CACHE_DIR), not in
    // the checkout; `run_cmd` would run it from the workspace root.
    let mut cmd = Command::new(vpy);
    cmd.args(["-m", "mypy.stubtest", "tile_py"])
        .current_dir(workspace_root().join("target"));
    eprintln!("$ {cmd:?}");
    let status = cmd.status().context("cannot start mypy.stubtest")?;
    if !status.success() {
        bail!("stubtest: tile_py/__init__.pyi differs from the module ({status})");
    }
    Ok(())
}

/// Puts the wheel, the pytest suite, the Python example and `python/run_pytest.sh` under
/// `<bundle>/python/`.
pub fn bundle(out: &Path) -> Result<()> {
    let root = workspace_root();
    let wheel = build()?;
    let dir = out.join("python");
    fs::create_dir_all(dir.join("tests"))?;
    fs::create_dir_all(dir.join("examples"))?;
    let name = wheel.file_name().context("wheel has a file name")?;
    fs::copy(&wheel, dir.join(name))?;
    for e in fs::read_dir(root.join("tile-py/tests"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "py") {
            fs::copy(
                &p,
                dir.join("tests").join(p.file_name().context("file name")?),
            )?;
        }
    }
    fs::copy(
        root.join("examples/torch_vector_add.py"),
        dir.join("examples/torch_vector_add.py"),
    )?;
    fs::create_dir_all(dir.join("bench"))?;
    fs::copy(
        root.join("bench/launch_bench.py"),
        dir.join("bench/launch_bench.py"),
    )?;
    fs::write(dir.join("run_pytest.sh"), RUN_PYTEST_SH)?;
    println!(
        "gpu-bundle: python/{} and python/tests",
        name.to_string_lossy()
    );
    Ok(())
}

const RUN_PYTEST_SH: &str = r#"#!/usr/bin/env bash
# Installs the tile_py wheel into a temporary directory (no network, no Rust) and runs the pytest
# suite: the CPU tests, then the GPU tests with TILE_REQUIRE_GPU=1 (a missing GPU fails), then the
# example. Usage: bash python/run_pytest.sh [--bench OUT.json [BENCH ARGS...] | --sanitize [TOOL...]]
set -u
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m pip install --quiet --no-index --no-deps --target "$tmp/site" "$here"/tile_py-*.whl || exit 1
# NVRTC from the pip package nvidia-cuda-nvrtc too, when present (the toolkit's comes first).
nvrtc_dirs=$("$py" -c '
import glob, os, sys
dirs = set()
for p in sys.path:
    for f in glob.glob(os.path.join(p, "nvidia", "**", "libnvrtc.so*"), recursive=True):
        dirs.add(os.path.dirname(f))
print(":".join(sorted(dirs)))
' 2>/dev/null)
if [ -n "$nvrtc_dirs" ]; then export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$nvrtc_dirs"; fi
export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}"
if [ "${1:-}" = "--bench" ]; then
    out=${2:-python-bench.json}
    shift $(( $# > 1 ? 2 : 1 ))
    "$py" "$here/bench/launch_bench.py" --out "$out" "$@"
    exit $?
fi
cd "$tmp"
if [ "${1:-}" = "--sanitize" ]; then
    # The GPU tests under compute-sanitizer, child processes included; `--sanitize TOOL...`
    # picks tools (default: memcheck synccheck racecheck). The settings match run.sh --sanitize
    # (API errors not reported, memcheck's stream-ordered race tracking off). Departures from
    # the plain run, all printed:
    # - the stress test runs 2,000 launches, not 1,000,000 (instrumented launches are slow);
    # - TILE_UNDER_SANITIZER=1: the torch.cuda.graph test does not wait for the release after
    #   the graph is destroyed, because the sanitizer keeps the graph's user objects alive;
    # - the kernel-fault test is left out: its kernel traps on purpose, which the sanitizer
    #   reports as an error in the child;
    # - racecheck (shared-memory hazards inside kernels; the test kernels use none) leaves out
    #   the four-thread stress test: under racecheck it stops in torch's own comparison after
    #   every launch has completed and does not finish in 240 s, even at 200 launches, and a
    #   four-thread torch-only program makes racecheck report an internal error ("failure to
    #   track a kernel launch"). memcheck and synccheck run it.
    # The functional tests and the stress tests run in separate processes, and with
    # pytest-timeout installed every test has 240 s: a test that hangs under the sanitizer fails
    # with every thread's stack printed instead of using up the run.
    shift
    tools=("$@")
    if [ ${#tools[@]} -eq 0 ]; then tools=(memcheck synccheck racecheck); fi
    limit=()
    if "$py" -c "import pytest_timeout" 2>/dev/null; then
        limit=(-o timeout=240 -o timeout_method=thread)
    fi
    status=0
    for tool in "${tools[@]}"; do
        extra=(--report-api-errors no --target-processes all)
        if [ "$tool" = memcheck ]; then extra+=(--track-stream-ordered-races no); fi
        files=("$here/tests/test_gpu.py" "$here/tests/test_gpu_multi.py")
        sets=(functional stress)
        skip="not kernel_fault"
        if [ "$tool" = racecheck ]; then skip="$skip and not stress_threads"; fi
        for set in "${sets[@]}"; do
            if [ "$set" = stress ]; then files=("$here/tests/test_gpu_stress.py"); fi
            echo "-- $(date -u +%T) compute-sanitizer --tool $tool: tile_py $set tests" \
                "(left out: ${skip#not }; stress at 2000 launches)"
            if ! TILE_REQUIRE_GPU=1 TILE_UNDER_SANITIZER=1 TILE_STRESS_LAUNCHES=2000 \
                compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
                "$py" -m pytest -v -rfs --tb=short --durations=8 -p no:cacheprovider ${limit[@]+"${limit[@]}"} \
                "${files[@]}" -m gpu -k "$skip"; then
                status=1
            fi
        done
    done
    echo "-- $(date -u +%T) done"
    exit $status
fi
status=0
echo "-- tile_py CPU tests"
"$py" -m pytest -q -rs -p no:cacheprovider "$here/tests" -m "not gpu" || status=1
echo "-- tile_py GPU tests (TILE_REQUIRE_GPU=1)"
TILE_REQUIRE_GPU=1 "$py" -m pytest -v -rs -p no:cacheprovider "$here/tests" -m gpu || status=1
echo "-- example torch_vector_add.py"
"$py" "$here/examples/torch_vector_add.py" || status=1
exit $status
"#;
