//! `cargo xtask gpu-bundle`: everything the GPU tests need, built here, runnable on a GPU
//! machine that has no Rust toolchain and no network.

use std::fs;
use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;

use anyhow::{Context, Result, bail};

use crate::{cargo, run_cmd, workspace_root};

/// Test binaries that need a Rust toolchain at run time and so stay out of the bundle.
const NEEDS_TOOLCHAIN: &[&str] = &["compile_fail"];

pub fn run() -> Result<()> {
    let root = workspace_root();
    let out = root.join("target/gpu-bundle");
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("cannot clear {}", out.display()))?;
    }
    fs::create_dir_all(out.join("tests"))?;
    fs::create_dir_all(out.join("examples"))?;

    // Release test binaries of every crate, with every feature (the GPU tests need cudarc).
    let mut child = cargo()
        .args([
            "test",
            "--release",
            "--workspace",
            "--all-features",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(&root)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start cargo test --no-run")?;
    let stdout = child.stdout.take().expect("piped");
    let mut copied = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let target = msg["target"]["name"].as_str().unwrap_or("test");
        let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
        let krate = msg["package_id"].as_str().unwrap_or("");
        let krate = package_name(krate);
        // xtask's own tests run cargo and the workspace's files: CPU tests, never bundled.
        if NEEDS_TOOLCHAIN.contains(&target) || krate == "xtask" {
            continue;
        }
        let name = if kind == "lib" {
            format!("{krate}-unit")
        } else {
            format!("{krate}-{target}")
        };
        fs::copy(exe, out.join("tests").join(&name))
            .with_context(|| format!("cannot copy {exe}"))?;
        copied.push(name);
    }
    if !child.wait()?.success() {
        bail!("cargo test --no-run failed");
    }
    if copied.is_empty() {
        bail!("no test binaries were built");
    }
    // The C API's example test builds `examples/launcher.c` against the crate's cdylib, which it
    // looks for beside its own binary (where cargo puts it).
    if copied.iter().any(|c| c.starts_with("tile-capi-")) {
        let lib = root.join("target/release/deps/libtile_capi.so");
        fs::copy(&lib, out.join("tests/libtile_capi.so"))
            .with_context(|| format!("cannot copy {}", lib.display()))?;
    }

    run_cmd(cargo().args([
        "build",
        "--release",
        "-p",
        "tile-launch",
        "--features",
        "cudarc,nvrtc",
        "--example",
        "vector_add",
        "--example",
        "bench_launch",
    ]))?;
    for example in ["vector_add", "bench_launch"] {
        fs::copy(
            root.join("target/release/examples").join(example),
            out.join("examples").join(example),
        )?;
    }
    copy_dir(&root.join("tile-launch/kernels"), &out.join("kernels"))?;
    fs::write(out.join("run.sh"), RUN_SH)?;
    crate::wheel::bundle(&out)?;
    strip_debug_info(&out)?;
    copied.sort();
    println!(
        "gpu-bundle: {} test binaries, example vector_add, kernels",
        copied.len()
    );
    for c in &copied {
        println!("  tests/{c}");
    }
    println!("run it on a GPU machine: bash target/gpu-bundle/run.sh");
    Ok(())
}

/// `registry+...#name@1.0` or `path+file:///.../name#0.1.0` → `name`.
fn package_name(id: &str) -> String {
    let tail = id.rsplit('/').next().unwrap_or(id);
    let name = tail.split(['#', '@']).next().unwrap_or(tail);
    // `path+file:///work/tile-launch#0.1.0` has no `@name`; `...#tile-launch@0.1.0` does.
    match tail.split_once('#') {
        Some((_, rest)) if rest.contains('@') => rest.split('@').next().unwrap_or(name).into(),
        _ => name.into(),
    }
}

/// Drops debug info from the bundled binaries (the release profile keeps it for profiling),
/// which keeps the bundle small enough to copy around.
fn strip_debug_info(out: &Path) -> Result<()> {
    for dir in ["tests", "examples"] {
        for entry in fs::read_dir(out.join(dir))? {
            let path = entry?.path();
            let status = std::process::Command::new("strip")
                .arg("--strip-debug")
                .arg(&path)
                .status();
            if !matches!(status, Ok(s) if s.success()) {
                eprintln!(
                    "gpu-bundle: could not strip {} (is binutils installed?)",
                    path.display()
                );
            }
        }
    }
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs the GPU bundle. Fails if no NVIDIA GPU is found.
#   bash run.sh                 every test binary with the GPU tests included, the example, and
#                               the tile_py wheel's pytest suite
#   bash run.sh --bench [DIR] [--burst N]
#                               the launch benchmarks (Rust, then Python), burst mode (N
#                               launches per burst, default 64) and the saturated loop; figures
#                               go to DIR (default ./bench-results), the tables to standard output
#   bash run.sh --sanitize [rust|python [TOOL...]]
#                               the GPU tests under compute-sanitizer (memcheck, racecheck,
#                               synccheck); both halves unless one is named
set -u
here=$(cd "$(dirname "$0")" && pwd)
if ! { nvidia-smi -L >/dev/null 2>&1 || [ -e /dev/nvidia0 ]; }; then
    echo "run.sh: no NVIDIA GPU found (nvidia-smi and /dev/nvidia0 are missing)" >&2
    exit 1
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
# NVRTC for the kernels compiled at run time: the CUDA toolkit's, if there is one.
for d in "${CUDA_HOME:-}" /usr/local/cuda; do
    if [ -n "$d" ] && [ -d "$d/lib64" ]; then export LD_LIBRARY_PATH="$d/lib64:${LD_LIBRARY_PATH:-}"; break; fi
done
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
if [ "${1:-}" = "--sanitize" ]; then
    # The GPU tests under compute-sanitizer: memcheck, racecheck and synccheck, the Rust tests
    # and then the tile_py tests (python/run_pytest.sh --sanitize). `--sanitize rust` or
    # `--sanitize python` runs one half. Any report fails the run. Two settings, both deliberate:
    # - API errors are not reported: loading a kernel probes cuKernelGetParamInfo one past its
    #   last parameter (CUDA_ERROR_INVALID_VALUE is how the parameter count is learnt), and the
    #   capture tests provoke refusals on purpose.
    # - memcheck's stream-ordered race tracking is off: it reports a stream-ordered free (a
    #   cudarc deleter's cuMemFreeAsync on the producer's stream) as racing the kernel on the
    #   launch stream, although the free is only issued after an event query has seen that
    #   kernel complete; the sanitizer does not count a completed cuEventQuery as ordering.
    # Left out: the negative control (it corrupts memory on purpose), the primary-context
    # reset test (cuDevicePrimaryCtxReset tears down the context the sanitizer instruments), and
    # the test of another thread's first use during a global-mode capture: under the sanitizer
    # (memcheck and synccheck seen) loading a library on the other thread leaves the capture
    # invalidated, which it does not without the sanitizer; the sanitizer's own work on each
    # loaded module is the likely cause (not established).
    part=${2:-all}
    shift $(( $# > 1 ? 2 : 1 ))
    status=0
    if [ "$part" = all ] || [ "$part" = rust ]; then
        tests=("$here"/tests/tile-launch-gpu "$here"/tests/tile-launch-gpu_capture "$here"/tests/tile-launch-gpu_config
               "$here"/tests/tile-launch-gpu_threads "$here"/tests/tile-launch-gpu_cudarc_edges
               "$here"/tests/tile-launch-gpu_capture_edges "$here"/tests/tile-launch-gpu_edges)
        if [ "${gpus:-0}" -ge 2 ]; then
            tests+=("$here"/tests/tile-launch-gpu_multi)
        else
            echo "SKIPPED under the sanitizer: tile-launch-gpu_multi needs two GPUs, this machine has ${gpus:-0}"
        fi
        for tool in memcheck racecheck synccheck; do
            extra=(--report-api-errors no)
            if [ "$tool" = memcheck ]; then extra+=(--track-stream-ordered-races no); fi
            for t in "${tests[@]}"; do
                echo "== compute-sanitizer --tool $tool $(basename "$t")"
                if ! compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 \
                    "$t" --include-ignored --test-threads=1 --skip negative_control \
                    --skip primary_context_reset --skip first_use_on_another_thread; then
                    status=1
                fi
            done
        done
    fi
    if [ "$part" = all ] || [ "$part" = python ]; then
        echo "== tile_py under compute-sanitizer"
        bash "$here/python/run_pytest.sh" --sanitize "$@" || status=1
    fi
    echo "run.sh --sanitize $part: $([ $status -eq 0 ] && echo clean || echo FAILED)"
    exit $status
fi
if [ "${1:-}" = "--bench" ]; then
    # bash run.sh --bench [DIR] [--burst N]: burst mode and the saturated loop, Rust then Python
    # (one process each); the Python JSON carries every burst ratio, the Rust one included.
    shift
    results=bench-results
    if [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; then results=$1; shift; fi
    mkdir -p "$results"
    stamp=$(date -u +%Y-%m-%dT%H-%M-%SZ)
    status=0
    start=$(date +%s)
    echo "== Rust launch benchmark"
    "$here/examples/bench_launch" --out "$results/$stamp-rust.json" "$@" || status=1
    echo "== Python launch benchmark"
    bash "$here/python/run_pytest.sh" --bench "$results/$stamp-python.json" \
        --rust "$results/$stamp-rust.json" "$@" || status=1
    echo "run.sh --bench: $(( $(date +%s) - start )) s; figures in $results/$stamp-{rust,python}.json"
    exit $status
fi
status=0
failed=()
for t in "$here"/tests/*; do
    name=$(basename "$t")
    echo "== $name"
    if [ "$name" = tile-launch-gpu_multi ] && [ "${gpus:-0}" -lt 2 ]; then
        echo "SKIPPED: needs two GPUs, this machine has ${gpus:-0} (run the bundle on a 2-GPU machine)"
        continue
    fi
    if ! "$t" --include-ignored --test-threads=1; then status=1; failed+=("$name"); fi
done
echo "== example vector_add"
if ! "$here/examples/vector_add"; then status=1; failed+=("vector_add"); fi
echo "== tile_py (wheel + pytest)"
if ! bash "$here/python/run_pytest.sh"; then status=1; failed+=("tile_py"); fi
if [ $status -ne 0 ]; then echo "run.sh: FAILED: ${failed[*]}"; else echo "run.sh: all passed"; fi
exit $status
"#;
