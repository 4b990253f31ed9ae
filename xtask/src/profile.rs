//! `cargo xtask profile [--launches=N] [--rust]`: host instructions per launch of
//! tile-launch's launch paths, counted by callgrind against the stub driver
//! `bench/profile/cuda_stub.c` (no GPU needed; the counts are exact and repeatable for one
//! build). For each path of the example `launch_profile` it runs the example twice under
//! `valgrind --tool=callgrind`, counting only its measured loop, and prints instructions per
//! launch; then, for the three-tensor deferred path, the functions that cost the most per launch
//! (inclusive). Needs `valgrind` and a C compiler (`cc`). The stub's own functions cost next to
//! nothing, so the counts are tile-launch's (and the test's DLPack exports'), never the
//! driver's. Beside each count it prints the driver calls per launch, which the stub counts and
//! the measured loop reports, and then which entry points they were.
//!
//! The tile_py paths include the peer: cuTile's own `ct.launch` (when cuda-tile is installed in
//! the virtual environment), with the same kernel, arguments and stub as tile_py's cached
//! cuTile launch. The run ends with the ratios against it and the per-tensor costs, and writes
//! every row to `bench/results/<UTC time>-profile.json`. With `--rust`, only the Rust rows and
//! their per-tensor cost are printed, and nothing is written.

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
    (
        "hold",
        "Stream::hold of 3 DLPack tensors (export included), nothing launched",
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
    if let Some(path) = rest.iter().find_map(|a| {
        (a == "--files")
            .then_some("torch")
            .or_else(|| a.strip_prefix("--files="))
    }) {
        return files(&root, &out, &stub, path, launches);
    }
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
    let mut rows = Vec::new();
    for (path, what) in PATHS {
        let file = out.join(format!("callgrind.{path}"));
        let (per, calls) = count(&exe, &stub, &file, path, launches)?;
        println!("{path:<8} {per:>12.0} {:>12}  {what}", calls.total());
        rows.push(Row::new("rust", path, what, per, calls));
    }
    print_breakdowns("", &rows);
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
    if rest.iter().any(|a| a == "--rust") {
        summarise(&rows);
        return Ok(());
    }
    python_paths(&root, &out, &stub, launches, &mut rows)?;
    summarise(&rows);
    let json = write_results(&root, &rows, launches)?;
    println!(
        "\ncallgrind files: {}; rows: {}",
        out.display(),
        json.display()
    );
    Ok(())
}

/// One measured path: instructions and driver calls per launch.
struct Row {
    /// `rust` (the `launch_profile` example) or `python` (`py_launch_profile.py`).
    group: &'static str,
    path: &'static str,
    what: &'static str,
    instructions: f64,
    calls: DriverCalls,
}

impl Row {
    fn new(
        group: &'static str,
        path: &'static str,
        what: &'static str,
        instructions: f64,
        calls: DriverCalls,
    ) -> Row {
        Row {
            group,
            path,
            what,
            instructions,
            calls,
        }
    }
}

/// The instructions per launch of `group`'s `path`, if it ran.
fn instr(rows: &[Row], group: &str, path: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.group == group && r.path == path)
        .map(|r| r.instructions)
}

/// The driver calls per launch of `group`'s `path`, if it ran against the counting stub.
fn calls(rows: &[Row], group: &str, path: &str) -> Option<f64> {
    rows.iter()
        .find(|r| r.group == group && r.path == path)
        .and_then(|r| r.calls.total.as_deref()?.parse().ok())
}

/// Prints the comparisons: each path against cuTile's `ct.launch`, and the per-tensor costs.
fn summarise(rows: &[Row]) {
    println!(
        "\nagainst cuTile's ct.launch (same stub, kernel and arguments; ratio of instructions per launch):"
    );
    match instr(rows, "python", "ct") {
        None => println!("  skipped: the ct row did not run (cuda-tile is not installed)"),
        Some(ct) => {
            let ct_calls = calls(rows, "python", "ct");
            for path in ["cutile-int", "cutile-capsule", "capsule", "torch"] {
                let Some(i) = instr(rows, "python", path) else {
                    continue;
                };
                let c = match (calls(rows, "python", path), ct_calls) {
                    (Some(c), Some(ct)) => format!("{c:.2} driver calls vs {ct:.2}"),
                    _ => String::new(),
                };
                println!("  {path:<15} {:>6.2} x  ({i:.0} vs {ct:.0}; {c})", i / ct);
            }
        }
    }
    println!("\nper tensor (instructions):");
    if let (Some(d), Some(e), Some(s)) = (
        instr(rows, "rust", "deferred"),
        instr(rows, "rust", "export"),
        instr(rows, "rust", "scalars"),
    ) {
        println!(
            "  tile-launch launch   {:>6.0}  (deferred - export - scalars) / 3",
            (d - e - s) / 3.0
        );
        if let Some(h) = instr(rows, "rust", "hold") {
            println!(
                "  tile-launch hold     {:>6.0}  (hold - export) / 3",
                (h - e) / 3.0
            );
        }
    }
    if let (Some(t), Some(s)) = (
        instr(rows, "python", "torch"),
        instr(rows, "python", "scalars"),
    ) {
        println!(
            "  tile_py launch       {:>6.0}  (torch - scalars) / 3: a tensor in place of a u64",
            (t - s) / 3.0
        );
    }
    if let (Some(h), Some(h1)) = (
        instr(rows, "python", "hold"),
        instr(rows, "python", "hold1"),
    ) {
        println!(
            "  tile_py hold         {:>6.0}  (hold - hold1) / 2; one hold call of 1 tensor {h1:.0}",
            (h - h1) / 2.0
        );
    }
}

/// Writes the rows to `bench/results/<UTC time>-profile.json` and returns its path.
fn write_results(root: &Path, rows: &[Row], launches: u64) -> Result<std::path::PathBuf> {
    let stamp = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H-%M-%SZ"])
        .output()
        .context("cannot run date")?;
    let stamp = String::from_utf8_lossy(&stamp.stdout).trim().to_owned();
    let commit = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(root)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .current_dir(root)
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    let rows: Vec<_> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "group": r.group,
                "path": r.path,
                "what": r.what,
                "instructions_per_launch": (r.instructions * 10.0).round() / 10.0,
                "driver_calls_per_launch": r.calls.total.as_deref().and_then(|t| t.parse::<f64>().ok()),
                "driver_calls_by_entry_point": r.calls.by_entry_point,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "command": "cargo xtask profile",
        "method": "callgrind instructions per launch against the stub driver bench/profile/cuda_stub.c; \
                   rust rows count the measured loop of launch_profile over N launches; python rows \
                   (Ir(3N) - Ir(N)) / 2N of py_launch_profile.py",
        "launches": launches,
        "commit": commit,
        "uncommitted_changes": dirty,
        "utc": stamp,
        "rows": rows,
    });
    let dir = root.join("bench/results");
    std::fs::create_dir_all(&dir)?;
    let file = dir.join(format!("{stamp}-profile.json"));
    std::fs::write(&file, serde_json::to_string_pretty(&doc)? + "\n")?;
    Ok(file)
}

/// tile_py's paths: `bench/profile/py_launch_profile.py` in `target/py-venv` (with the
/// installed tile_py wheel) against the stub driver, with tensors of
/// `bench/profile/fake_exchange.c` (built here against that Python). Each path runs twice, with
/// `launches` and `3 * launches` launches; the difference over `2 * launches` is the
/// instructions per launch (the interpreter's start-up cancels out). Skipped, with the reason,
/// when the virtual environment or its tile_py is missing.
fn python_paths(
    root: &Path,
    out: &Path,
    stub: &Path,
    launches: u64,
    rows: &mut Vec<Row>,
) -> Result<()> {
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
        (
            "cutile-int",
            "tile_py.cutile.launch (cached), the same with an int stream handle (needs cuda-tile)",
        ),
        (
            "ct",
            "the peer: cuTile's ct.launch (cached), the same kernel, arguments and int handle \
             (needs cuda-tile)",
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
    let ext_dir = fake_exchange(root, out, &py, &text)?;
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
    let first = rows.len();
    for (path, what) in PY_PATHS {
        if (path.starts_with("cutile") || *path == "ct") && !has_cutile {
            println!(
                "{path:<14} {:>12} {:>12}  skipped: cuda-tile is not installed",
                "-", "-"
            );
            continue;
        }
        let total = |n: u64| -> Result<(u64, DriverCalls)> {
            let file = out.join(format!("callgrind.py-{path}.{n}"));
            let o = callgrind_py(&py, &script, path, n, &file, stub, out, ext_dir.as_os_str())?;
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
        rows.push(Row::new("python", path, what, per, calls));
    }
    print_breakdowns("tile_py ", &rows[first..]);
    Ok(())
}

/// Runs `script PATH N` (`bench/profile/py_launch_profile.py`) with the interpreter `py` under
/// callgrind into `file`, against the stub driver `stub` (also on the loader's path, in `out`,
/// where cuTile looks for `libcuda.so.1`: the loader sees the file tile_py loaded and does not
/// load it twice), with `pythonpath`. Fails with the script's error output when it fails.
#[allow(clippy::too_many_arguments)]
fn callgrind_py(
    py: &Path,
    script: &Path,
    path: &str,
    n: u64,
    file: &Path,
    stub: &Path,
    out: &Path,
    pythonpath: &std::ffi::OsStr,
) -> Result<std::process::Output> {
    let o = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", file.display()))
        .arg(py)
        .arg(script)
        .args([path, &n.to_string()])
        .env("TILE_LIBCUDA", stub)
        .env("LD_LIBRARY_PATH", out)
        .env("PYTHONPATH", pythonpath)
        .output()
        .context("cannot run valgrind")?;
    if !o.status.success() {
        bail!(
            "py_launch_profile.py {path} failed under valgrind:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    Ok(o)
}

/// Builds `bench/profile/fake_exchange.c` (the torch-like producer) into `out/py` for the
/// interpreter `py`, whose include folder and extension suffix are the two lines of `probe`.
/// Returns the folder, for `PYTHONPATH`.
fn fake_exchange(root: &Path, out: &Path, py: &Path, probe: &str) -> Result<std::path::PathBuf> {
    let mut lines = probe.lines();
    let (Some(include), Some(suffix)) = (lines.next(), lines.next()) else {
        bail!("unexpected answer from {}: {probe}", py.display());
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
    Ok(ext_dir)
}

/// `cargo xtask profile --files[=PATH]`: the source files one launch of the Python path `PATH`
/// runs code in, with its instructions per launch in each, inlined code counted where it was
/// written (`bench/profile/per_file.py`). The wheel's extension is stripped, so the extension is
/// built again with line tables (`cargo build --release`, the workspace's `debug = 1`) and put
/// beside a copy of the package's Python files; the counts can differ from the wheel's by the
/// linker's choices, never by the code.
fn files(root: &Path, out: &Path, stub: &Path, path: &str, launches: u64) -> Result<()> {
    run_cmd(cargo().args([
        "build",
        "--release",
        "-p",
        "tile-py",
        "--features",
        "pyo3/extension-module",
    ]))?;
    let pkg = out.join("files/tile_py");
    std::fs::create_dir_all(&pkg)?;
    for entry in std::fs::read_dir(root.join("tile-py/python/tile_py"))? {
        let entry = entry?;
        if entry.path().extension().is_some_and(|e| e == "py") {
            std::fs::copy(entry.path(), pkg.join(entry.file_name()))?;
        }
    }
    std::fs::copy(
        root.join("target/release/lib_tile_py.so"),
        pkg.join("_tile_py.abi3.so"),
    )?;
    let py = root.join("target/py-venv/bin/python");
    let probe = Command::new(&py)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['include']); \
             print(sysconfig.get_config_var('EXT_SUFFIX'))",
        ])
        .output()
        .with_context(|| {
            format!(
                "cannot run {} (run `cargo xtask wheel` first)",
                py.display()
            )
        })?;
    let ext_dir = fake_exchange(root, out, &py, &String::from_utf8_lossy(&probe.stdout))?;
    let pythonpath = std::env::join_paths([out.join("files"), ext_dir])?;
    let mut runs = Vec::new();
    for n in [launches, 3 * launches] {
        let file = out.join(format!("callgrind.files-{path}.{n}"));
        let script = root.join("bench/profile/py_launch_profile.py");
        callgrind_py(&py, &script, path, n, &file, stub, out, &pythonpath)?;
        runs.push((file, n));
    }
    println!("instructions per launch of the Python path `{path}`, by source file:");
    run_cmd(
        Command::new("python3")
            .arg(root.join("bench/profile/per_file.py"))
            .arg(&runs[0].0)
            .arg(runs[0].1.to_string())
            .arg(&runs[1].0)
            .arg(runs[1].1.to_string()),
    )
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
fn print_breakdowns(title: &str, rows: &[Row]) {
    println!("\n{title}driver calls per launch, by entry point (stub driver, measured loop):");
    for row in rows {
        println!("{:<8} {}", row.path, row.calls.by_entry_point.join(", "));
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
