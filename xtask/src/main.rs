//! Build tasks for the tile workspace.
//!
//! `cargo xtask codegen [--check]` regenerates (or checks) the CUDA driver bindings,
//! `cargo xtask test` runs everything that needs no GPU, `cargo xtask gpu-bundle` builds the
//! self-contained folder that runs the GPU tests on a machine without Rust, and
//! `cargo xtask bench` runs the benchmarks (on a GPU machine, from the bundle).

mod codegen;

use anyhow::{Result, bail};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    match args.first().map(String::as_str) {
        Some("codegen") => codegen::run(rest.contains(&"--check")),
        Some(other) => bail!("unknown task `{other}`\n\n{USAGE}"),
        None => {
            println!("{USAGE}");
            Ok(())
        }
    }
}

const USAGE: &str = "usage: cargo xtask <task>

tasks:
  codegen [--check]   regenerate cuda-sys bindings from the pinned cuda.h (--check: fail on any difference)
  test                run every test that needs no GPU (formatting, clippy, codegen check, unit and doc tests)
  gpu-bundle          build target/gpu-bundle/ (release test binaries, example, run.sh) for a GPU machine
  bench               print how to run the benchmarks from the bundle";
