//! `cargo xtask profile [--launches=N]`: host instructions per launch of tile-launch's launch
//! paths, counted by callgrind against the stub driver `bench/profile/cuda_stub.c` (no GPU
//! needed; the counts are exact and repeatable for one build). For each path of the example
//! `launch_profile` it runs the example twice under `valgrind --tool=callgrind`, counting only
//! its measured loop, and prints instructions per launch; then, for the three-tensor deferred
//! path, the functions that cost the most per launch (inclusive). Needs `valgrind` and a C
//! compiler (`cc`). The stub's own functions cost next to nothing, so the counts are
//! tile-launch's (and the test's DLPack exports'), never the driver's. Beside each count it
//! prints the driver calls per launch, which the stub counts and the measured loop reports, and
//! then which entry points they were.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, positive_flag, run_cmd, workspace_root};

const PATHS: &[(&str, &str)] = &[
    (
        "raw",
        "raw cuLaunchKernel (the stub's cost: the floor is the driver's)",
    ),
    (
        "export",
        "3 DLPack tensors made and consumed, nothing launched",
    ),
    ("scalars", "tile-launch deferred, 7 scalars"),
    (
        "deferred",
        "tile-launch deferred, 3 DLPack tensors (export included)",
    ),
    (
        "bound",
        "tile-launch prepared (bound), 3 DLPack tensors (export included)",
    ),
    (
        "queued",
        "tile-launch queued handle, 3 DLPack tensors (export included)",
    ),
    (
        "int",
        "tile-launch deferred, 3 DLPack tensors, launch-only stream (an int handle's)",
    ),
];

/// Frames at or above the measured loop.
const RUNTIME: &[&str] = &[
    "lang_start",
    "below main",
    "__libc_start",
    "short_backtrace",
    "measured_loop",
    "launch_profile::main",
    "0x0",
];

pub(crate) fn run(rest: &[String]) -> Result<()> {
    let launches = u64::from(positive_flag(rest, "--launches")?.unwrap_or(2000));
    for tool in ["valgrind", "cc", "callgrind_annotate"] {
        if Command::new(tool).arg("--version").output().is_err() {
            bail!("`{tool}` not found: install valgrind and a C compiler (Debian: valgrind gcc)");
        }
    }
    let root = workspace_root();
    let out = root.join("target/profile");
    std::fs::create_dir_all(&out)?;
    let stub = out.join("libcuda.so.1");
    run_cmd(Command::new("cc").args([
        "-O2".as_ref(),
        "-shared".as_ref(),
        "-fPIC".as_ref(),
        "-o".as_ref(),
        stub.as_os_str(),
        root.join("bench/profile/cuda_stub.c").as_os_str(),
    ]))?;
    run_cmd(cargo().args([
        "build",
        "--release",
        "-p",
        "tile-launch",
        "--example",
        "launch_profile",
    ]))?;
    let exe = root.join("target/release/examples/launch_profile");
    println!(
        "host instructions per launch (callgrind, stub driver, {launches} launches after 256 \
         warm-up ones)"
    );
    println!(
        "{:<8} {:>12} {:>12}  what",
        "path", "instr/launch", "calls/launch"
    );
    let mut breakdowns = Vec::new();
    for (path, what) in PATHS {
        let file = out.join(format!("callgrind.{path}"));
        let (per, calls) = count(&exe, &stub, &file, path, launches)?;
        println!("{path:<8} {per:>12.0} {:>12}  {what}", calls.total());
        breakdowns.push((*path, calls));
    }
    print_breakdowns("", &breakdowns);
    let file = out.join("callgrind.deferred");
    let annotated = Command::new("callgrind_annotate")
        .args(["--inclusive=yes".as_ref(), file.as_os_str()])
        .output()
        .context("cannot run callgrind_annotate")?;
    let text = String::from_utf8_lossy(&annotated.stdout);
    println!("\nwhere the deferred path's instructions go (inclusive, per launch; first 25 rows):");
    let mut shown = 0;
    for line in text.lines() {
        let line = line.trim_start();
        let Some((count, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(n) = count.replace(',', "").parse::<u64>() else {
            continue;
        };
        let Some((_, func)) = rest.split_once(')') else {
            continue;
        };
        let func = func.trim();
        // Rows naming an object file (`file:function [object]`), below the measured loop.
        let Some((located, _)) = func.rsplit_once(" [") else {
            continue;
        };
        let name = located.split_once(':').map_or(located, |(_, f)| f);
        if n < launches || RUNTIME.iter().any(|r| name.contains(r)) {
            continue;
        }
        let name: String = name.chars().take(120).collect();
        println!("{:>10.0}  {name}", n as f64 / launches as f64);
        shown += 1;
        if shown == 25 {
            break;
        }
    }
    python_paths(&root, &out, &stub, launches)?;
    println!("\ncallgrind files: {}", out.display());
    Ok(())
}

/// tile_py's paths: `bench/profile/py_launch_profile.py` in `target/py-venv` (with the
/// installed tile_py wheel) against the stub driver, with tensors of
/// `bench/profile/fake_exchange.c` (built here against that Python). Each path runs twice, with
/// `launches` and `3 * launches` launches; the difference over `2 * launches` is the
/// instructions per launch (the interpreter's start-up cancels out). Skipped, with the reason,
/// when the virtual environment or its tile_py is missing.
fn python_paths(root: &Path, out: &Path, stub: &Path, launches: u64) -> Result<()> {
    const PY_PATHS: &[(&str, &str)] = &[
        (
            "torch",
            "tile_py.launch, 3 torch-like tensors (C exchange API) + 4 u64 scalars",
        ),
        (
            "cross",
            "the same, the producer's current stream another than the launch stream",
        ),
        ("scalars", "tile_py.launch, 7 u64 scalars"),
        (
            "bound",
            "tile_py prepared (Kernel.bind), 3 torch-like tensors + 4 u64 scalars",
        ),
        (
            "capsule",
            "tile_py.launch, 3 arrays of a C __dlpack__ producer (capsules) + 4 u64 scalars",
        ),
        (
            "hold",
            "tile_py.hold, the torch row's 3 tensors (per call; no kernel launched)",
        ),
        ("hold1", "tile_py.hold, 1 of those tensors (per call)"),
        (
            "hold-capsule",
            "tile_py.hold, the capsule row's 3 arrays (per call)",
        ),
        (
            "cutile",
            "tile_py.cutile.launch (cached), the torch row's arguments (needs cuda-tile)",
        ),
        (
            "cutile-capsule",
            "tile_py.cutile.launch (cached), the capsule row's arguments (needs cuda-tile)",
        ),
    ];
    let py = root.join("target/py-venv/bin/python");
    let probe = Command::new(&py)
        .args([
            "-c",
            "import sysconfig, tile_py; print(sysconfig.get_paths()['include']); \
                      print(sysconfig.get_config_var('EXT_SUFFIX'))",
        ])
        .output();
    let Some(probe) = probe.ok().filter(|o| o.status.success()) else {
        println!(
            "\ntile_py paths skipped: {} cannot import tile_py (run `cargo xtask wheel` first)",
            py.display()
        );
        return Ok(());
    };
    let text = String::from_utf8_lossy(&probe.stdout).to_string();
    let mut lines = text.lines();
    let (Some(include), Some(suffix)) = (lines.next(), lines.next()) else {
        bail!("unexpected answer from {}: {text}", py.display());
    };
    let ext_dir = out.join("py");
    std::fs::create_dir_all(&ext_dir)?;
    run_cmd(
        Command::new("cc")
            .args(["-O2", "-shared", "-fPIC"])
            .arg(format!("-I{include}"))
            .arg("-o")
            .arg(ext_dir.join(format!("fake_exchange{suffix}")))
            .arg(root.join("bench/profile/fake_exchange.c")),
    )?;
    let script = root.join("bench/profile/py_launch_profile.py");
    println!(
        "\ntile_py: host instructions per launch (callgrind, stub driver, interpreter included; \
         ({} - {launches} launches) / {})",
        3 * launches,
        2 * launches
    );
    println!(
        "{:<14} {:>12} {:>12}  what",
        "path", "instr/launch", "calls/launch"
    );
    let has_cutile = Command::new(&py)
        .args(["-c", "import cuda.tile"])
        .output()
        .is_ok_and(|o| o.status.success());
    let mut breakdowns = Vec::new();
    let mut per_path = std::collections::HashMap::new();
    for (path, what) in PY_PATHS {
        if path.starts_with("cutile") && !has_cutile {
            println!(
                "{path:<14} {:>12} {:>12}  skipped: cuda-tile is not installed",
                "-", "-"
            );
            continue;
        }
        let total = |n: u64| -> Result<(u64, DriverCalls)> {
            let file = out.join(format!("callgrind.py-{path}.{n}"));
            let o = Command::new("valgrind")
                .arg("--tool=callgrind")
                .arg(format!("--callgrind-out-file={}", file.display()))
                .arg(&py)
                .arg(&script)
                .args([*path, &n.to_string()])
                .env("TILE_LIBCUDA", stub)
                .env("PYTHONPATH", &ext_dir)
                .output()
                .context("cannot run valgrind")?;
            if !o.status.success() {
                bail!(
                    "py_launch_profile.py {path} failed under valgrind:\n{}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            let text = std::fs::read_to_string(&file)?;
            let total = text
                .lines()
                .find_map(|l| {
                    l.strip_prefix("summary:")
                        .or_else(|| l.strip_prefix("totals:"))
                })
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .with_context(|| format!("no total in {}", file.display()))?;
            Ok((
                total,
                DriverCalls::parse(&String::from_utf8_lossy(&o.stdout)),
            ))
        };
        let ((a, _), (b, calls)) = (total(launches)?, total(3 * launches)?);
        let per = b.saturating_sub(a) as f64 / (2 * launches) as f64;
        println!("{path:<14} {per:>12.0} {:>12}  {what}", calls.total());
        breakdowns.push((*path, calls));
        per_path.insert(*path, per);
    }
    let row = |p: &str| per_path.get(p).copied().unwrap_or(f64::NAN);
    println!(
        "\nper tensor: held {:.0} ((hold - hold1) / 2), launched {:.0} ((torch - scalars) / 3, \
         a tensor in place of a u64 scalar); a hold call of 1 tensor {:.0}",
        (row("hold") - row("hold1")) / 2.0,
        (row("torch") - row("scalars")) / 3.0,
        row("hold1"),
    );
    print_breakdowns("tile_py ", &breakdowns);
    Ok(())
}

/// The driver calls per launch that a measured loop reported (the stub counts them): the
/// line `driver calls per launch: TOTAL`, then `  NAME PER_LAUNCH` per entry point. Empty for
/// a driver that does not count.
#[derive(Default)]
struct DriverCalls {
    total: Option<String>,
    by_entry_point: Vec<String>,
}

impl DriverCalls {
    fn parse(stdout: &str) -> DriverCalls {
        let mut calls = DriverCalls::default();
        let mut lines = stdout.lines();
        for line in lines.by_ref() {
            if let Some(total) = line.strip_prefix("driver calls per launch: ") {
                calls.total = Some(total.trim().to_owned());
                break;
            }
        }
        calls.by_entry_point = lines
            .map_while(|l| l.strip_prefix("  "))
            .map(|l| l.trim().to_owned())
            .collect();
        calls
    }

    fn total(&self) -> &str {
        self.total.as_deref().unwrap_or("-")
    }
}

/// Which entry points each path's driver calls were, per launch.
fn print_breakdowns(title: &str, paths: &[(&str, DriverCalls)]) {
    println!("\n{title}driver calls per launch, by entry point (stub driver, measured loop):");
    for (path, calls) in paths {
        println!("{path:<8} {}", calls.by_entry_point.join(", "));
    }
}

/// Instructions per launch of `path` (callgrind's count of the measured loop over `launches`),
/// and the driver calls per launch the loop reported.
fn count(
    exe: &Path,
    stub: &Path,
    file: &Path,
    path: &str,
    launches: u64,
) -> Result<(f64, DriverCalls)> {
    let status = Command::new("valgrind")
        .args(["--tool=callgrind", "--toggle-collect=*measured_loop*"])
        .arg(format!("--callgrind-out-file={}", file.display()))
        .arg(exe)
        .args([path, &launches.to_string()])
        .env("TILE_LIBCUDA", stub)
        .output()
        .context("cannot run valgrind")?;
    if !status.status.success() {
        bail!(
            "launch_profile {path} failed under valgrind:\n{}",
            String::from_utf8_lossy(&status.stderr)
        );
    }
    let text = std::fs::read_to_string(file)?;
    let total: u64 = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("summary:")
                .or_else(|| l.strip_prefix("totals:"))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no total in {}", file.display()))?;
    let calls = DriverCalls::parse(&String::from_utf8_lossy(&status.stdout));
    Ok((total as f64 / launches as f64, calls))
}
