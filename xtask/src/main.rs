//! Build tasks for the tile workspace.
//!
//! - `cargo xtask codegen [--check]` regenerates (or checks) the CUDA driver bindings and the XLA
//!   FFI bindings.
//! - `cargo xtask test` runs everything that needs no GPU: formatting, clippy, the codegen
//!   freshness check, every test (GPU tests are listed as ignored), and the documentation's
//!   Python programs against the stub driver; it ends with its totals.
//! - `cargo xtask wheel` builds the `tile-py` abi3 wheel into `target/wheels/`; `cargo xtask test`
//!   also builds it and runs its pytest suite in `target/py-venv`.
//! - `cargo xtask gpu-bundle` builds `target/gpu-bundle/`: release test binaries, the examples,
//!   the kernels, the tile-py wheel with its tests and a `run.sh` that runs it all on a GPU
//!   machine without Rust or network.
//! - `cargo xtask bench` builds the bundle and runs its benchmarks on this machine's GPU.
//! - `cargo xtask profile` counts host instructions per launch with callgrind against a stub
//!   driver (no GPU needed).
//! - `cargo xtask doc [--open]` builds the library crates' API docs with docs.rs's features.
//!
//! A task refuses any argument it does not take; `--help` or `-h` after a task prints the usage.
//! Before it starts, a task checks what it needs from the machine (libclang for codegen, a Python
//! with pip and venv for codegen and the wheel) and stops with one line naming what to install.

#[cfg(test)]
mod architecture;
mod bundle;
mod codegen;
mod doc;
mod prereq;
mod profile;
mod snippets;
mod wheel;

use std::process::Command;

use anyhow::{Context, Result, bail};

/// The tasks, each with the arguments it accepts.
const TASKS: &[(&str, &[&str])] = &[
    ("codegen", &["--check"]),
    ("test", &[]),
    ("wheel", &[]),
    ("gpu-bundle", &[]),
    ("bench", &["--burst="]),
    ("profile", &["--launches=", "--rust", "--files", "--files="]),
    ("doc", &["--open"]),
];

/// Runs the task; a failure is printed as one `xtask: ...` line (the error and its causes), never
/// as `anyhow`'s debug report, which adds a backtrace under `RUST_BACKTRACE=1`.
fn main() -> std::process::ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<String>) -> Result<()> {
    let Some(task) = args.first().map(String::as_str) else {
        println!("{USAGE}");
        return Ok(());
    };
    if matches!(task, "help" | "--help" | "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    let Some((_, accepted)) = TASKS.iter().find(|(name, _)| *name == task) else {
        bail!("unknown task `{task}`\n\n{USAGE}")
    };
    let rest = &args[1..];
    // `cargo xtask <task> --help` prints the help and runs nothing.
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    // An accepted `--name=` takes a value in the same argument (`--burst=32`).
    let is_accepted = |a: &str| {
        accepted
            .iter()
            .any(|acc| *acc == a || (acc.ends_with('=') && a.starts_with(acc)))
    };
    if let Some(bad) = rest.iter().find(|a| !is_accepted(a)) {
        let takes = if accepted.is_empty() {
            "no arguments".to_owned()
        } else {
            format!("only {}", accepted.join(", "))
        };
        bail!(
            "`cargo xtask {task}` does not accept the argument `{bad}` (it takes {takes}); \
             see `cargo xtask --help`"
        );
    }
    prereq::require(prereq::of_task(task));
    match task {
        "codegen" => codegen::run(rest.iter().any(|a| a == "--check")),
        "test" => test(),
        "gpu-bundle" => bundle::run(),
        "bench" => bench(rest),
        "profile" => profile::run(rest),
        "doc" => doc::run(rest.iter().any(|a| a == "--open")),
        "wheel" => wheel::build().map(|w| println!("wheel: {}", w.display())),
        _ => unreachable!("every task of TASKS is matched"),
    }
}

const USAGE: &str = "usage: cargo xtask <task> [--help]

tasks:
  codegen [--check]   regenerate the bindings: cuda-sys's from the pinned cuda.h, tile-py's XLA FFI
                      ones from the pinned jaxlib's c_api.h (--check: fail on any difference)
  test                run everything that needs no GPU: fmt, clippy, codegen --check, all Rust tests,
                      then build the tile_py wheel (manylinux2014, via zig) and run its pytest suite
                      and mypy stubtest in target/py-venv, then the docs' Python programs against
                      the stub driver; ends with the totals (tests passed, ignored, skipped)
  wheel               build the tile-py abi3 wheel into target/wheels/ (maturin)
  gpu-bundle          build target/gpu-bundle/ for a GPU machine: release test binaries, the examples,
                      the kernels, the tile_py wheel with its tests, and run.sh
  bench [--burst=N]   build the bundle and run its benchmarks here (needs a GPU): burst mode (N
                      launches per burst, default 64) beside the saturated loop; results in
                      bench/results/. On a GPU machine without Rust:
                      bash target/gpu-bundle/run.sh --bench [DIR] [--burst N]
                      (DIR defaults to ./bench-results)
  profile [--launches=N] [--rust] [--files[=PATH]]
                      host instructions per launch of tile-launch's launch paths (raw, export,
                      scalars, deferred, bound, queued, int; N launches each, default 2000),
                      counted by callgrind against a stub driver (bench/profile/cuda_stub.c; no
                      GPU needed; needs valgrind and cc), and the driver calls per launch the
                      stub counts, then where the deferred path's instructions go; then
                      tile_py.launch's paths when target/py-venv has tile_py (--rust: the Rust
                      rows only, printed and not written to bench/results/).
                      --files[=PATH]: only the source files one launch of the Python path
                      PATH (default torch) runs code in, with instructions per launch in
                      each (the extension rebuilt with line tables); the rest grouped
  doc [--open]        the library crates' API docs with the features docs.rs documents
                      ([package.metadata.docs.rs]; a plain `cargo doc` leaves them out)

A task takes no arguments but those shown; `cargo xtask <task> --help` prints this help.";

/// `cargo xtask bench [--burst=N]`: the bundle's benchmarks, run on this machine's GPU.
fn bench(rest: &[String]) -> Result<()> {
    let burst = positive_flag(rest, "--burst")?;
    bundle::run()?;
    let root = workspace_root();
    let mut cmd = Command::new("bash");
    cmd.arg(root.join("target/gpu-bundle/run.sh"))
        .args(["--bench".as_ref(), root.join("bench/results").as_os_str()]);
    if let Some(n) = burst {
        cmd.args(["--burst".to_owned(), n.to_string()]);
    }
    run_cmd(&mut cmd)
}

/// The value of `--name=N` among `rest`, which must be a positive integer; `None` when absent.
pub(crate) fn positive_flag(rest: &[String], name: &str) -> Result<Option<u32>> {
    let prefix = format!("{name}=");
    rest.iter()
        .find_map(|a| a.strip_prefix(&prefix))
        .map(|n| {
            n.parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .with_context(|| format!("{name} takes a positive integer, got `{n}`"))
        })
        .transpose()
}

/// Runs a command from the workspace root, failing with the command line if it fails.
pub(crate) fn run_cmd(cmd: &mut Command) -> Result<()> {
    let line = format!("{cmd:?}");
    eprintln!("$ {line}");
    let status = cmd
        .current_dir(workspace_root())
        .status()
        .with_context(|| format!("cannot start {line}"))?;
    if !status.success() {
        bail!("{line} failed with {status}");
    }
    Ok(())
}

pub(crate) fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn test() -> Result<()> {
    run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
    run_cmd(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]))?;
    codegen::run(true)?;
    let rust = cargo_test_counted(cargo().args([
        "test",
        "--workspace",
        "--all-features",
        "--no-fail-fast",
    ]))?;
    // The Python extension: build the wheel, install it into target/py-venv, run pytest.
    let w = wheel::build()?;
    let junit = workspace_root().join("target/pytest-results.xml");
    // A stale file must not stand in for this run's results.
    let _ = std::fs::remove_file(&junit);
    wheel::pytest(&w, &junit)?;
    let py = PytestTotals::read(&junit)?;
    let blocks = snippets::run(&workspace_root().join("target/py-venv/bin/python"))?;
    println!(
        "xtask test: all passed. Rust: {} passed, {} ignored (GPU tests: run them from the GPU \
         bundle). pytest: {} passed, {} skipped. Docs: {blocks} Python programs run against the \
         stub driver.",
        rust.passed, rust.ignored, py.passed, py.skipped
    );
    Ok(())
}

/// The sums of the `test result:` lines of one `cargo test` run.
#[derive(Debug, Default, PartialEq)]
struct RustTotals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl RustTotals {
    /// Adds one line of `cargo test`'s output if it is a `test result:` line (`test result: ok.
    /// 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s`).
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else { continue };
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// Runs `cmd` (a `cargo test`), passing its output through as it comes, and sums its `test
/// result:` lines. Fails, with those sums, when the command fails.
fn cargo_test_counted(cmd: &mut Command) -> Result<RustTotals> {
    use std::io::{BufRead, Write};

    let line = format!("{cmd:?}");
    eprintln!("$ {line}");
    let mut child = cmd
        .current_dir(workspace_root())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {line}"))?;
    let mut totals = RustTotals::default();
    let stdout = child.stdout.take().context("cargo test's stdout")?;
    let mut out = std::io::stdout().lock();
    for l in std::io::BufReader::new(stdout).lines() {
        let l = l.context("reading cargo test's output")?;
        totals.add_line(&l);
        writeln!(out, "{l}")?;
    }
    drop(out);
    let status = child.wait()?;
    if !status.success() {
        if totals == RustTotals::default() {
            bail!(
                "cargo test failed with {status} before any test ran: the build failed (its first \
                 `error:` line is above)"
            );
        }
        bail!(
            "{line} failed with {status} ({} passed, {} failed, {} ignored)",
            totals.passed,
            totals.failed,
            totals.ignored
        );
    }
    Ok(totals)
}

/// pytest's totals, from its JUnit XML report.
#[derive(Debug, PartialEq)]
struct PytestTotals {
    passed: u64,
    skipped: u64,
}

impl PytestTotals {
    fn read(path: &std::path::Path) -> Result<PytestTotals> {
        let xml = std::fs::read_to_string(path)
            .with_context(|| format!("pytest wrote no report to {}", path.display()))?;
        PytestTotals::parse(&xml).with_context(|| format!("no <testsuite> in {}", path.display()))
    }

    /// From the attributes of the `<testsuite>` element: `tests` counts every test, of which
    /// `skipped`, `failures` and `errors` did not pass.
    fn parse(xml: &str) -> Option<PytestTotals> {
        let start = xml.find("<testsuite ")?;
        let tag = &xml[start..start + xml[start..].find('>')?];
        let attr = |name: &str| -> Option<u64> {
            let key = format!(" {name}=\"");
            let at = tag.find(&key)? + key.len();
            tag[at..at + tag[at..].find('"')?].parse().ok()
        };
        let (tests, skipped) = (attr("tests")?, attr("skipped")?);
        let not_passed = skipped + attr("failures")? + attr("errors")?;
        Some(PytestTotals {
            passed: tests.checked_sub(not_passed)?,
            skipped,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_totals_sum_the_test_result_lines_only() {
        let mut t = RustTotals::default();
        for l in [
            "test result: ok. 5 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.01s",
            "running 3 tests",
            "test a ... ok",
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.20s",
            "test result: ok. 0 passed; 0 failed; 7 ignored; 0 measured; 0 filtered out; finished in 0.00s",
        ] {
            t.add_line(l);
        }
        assert_eq!(
            t,
            RustTotals {
                passed: 7,
                failed: 1,
                ignored: 8
            }
        );
    }

    #[test]
    fn pytest_totals_come_from_the_testsuite_attributes() {
        let xml = r#"<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1" failures="2" skipped="157" tests="626" time="9.2" timestamp="x" hostname="h"><testcase/></testsuite></testsuites>"#;
        assert_eq!(
            PytestTotals::parse(xml),
            Some(PytestTotals {
                passed: 466,
                skipped: 157
            })
        );
        assert_eq!(PytestTotals::parse("<testsuites/>"), None);
    }
}
