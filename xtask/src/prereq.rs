//! What a task needs from the machine, checked before the task starts, so that a missing tool
//! stops it at once with one line naming what to install, rather than after minutes of building
//! (bindgen panics without libclang; `python3 -m venv` fails half-way without `ensurepip`).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::workspace_root;

/// A prerequisite of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prereq {
    /// libclang, which bindgen loads at run time (`cargo xtask codegen`, and `test` through
    /// `codegen --check`).
    Libclang,
    /// `python3` with pip, which codegen uses to download the pinned `nvidia-cuda-runtime` wheel
    /// and hash it.
    PythonPip,
    /// A Python that can create `target/py-venv` with pip in it (`venv` and `ensurepip`), for the
    /// tile-py wheel and its pytest suite; not needed once `target/py-venv` exists.
    PythonVenv,
}

/// The prerequisites of each task.
pub(crate) fn of_task(task: &str) -> &'static [Prereq] {
    match task {
        "codegen" => &[Prereq::Libclang, Prereq::PythonPip],
        "test" => &[Prereq::Libclang, Prereq::PythonPip, Prereq::PythonVenv],
        "wheel" | "gpu-bundle" | "bench" => &[Prereq::PythonVenv],
        _ => &[],
    }
}

/// Checks `needs`; for each one missing prints one line naming what to install, then exits with
/// status 1.
pub(crate) fn require(needs: &[Prereq]) {
    let missing: Vec<String> = needs.iter().filter_map(|&need| check(need).err()).collect();
    if missing.is_empty() {
        return;
    }
    for line in &missing {
        eprintln!("xtask: {line}");
    }
    std::process::exit(1);
}

/// `Ok` when `need` is met, else the line saying what to install.
fn check(need: Prereq) -> Result<(), String> {
    match need {
        // The same search bindgen makes (`LIBCLANG_PATH`, `llvm-config`, the usual library
        // directories); the library is closed again at once.
        Prereq::Libclang => clang_sys::load_manually().map(drop).map_err(|_| {
            "libclang not found: install libclang-dev (Debian/Ubuntu) or set LIBCLANG_PATH to \
             the directory that holds libclang.so"
                .to_owned()
        }),
        Prereq::PythonPip => {
            if !runs(Command::new("python3").arg("--version")) {
                Err("python3 not found: install python3 and python3-pip (Debian/Ubuntu)".into())
            } else if !runs(Command::new("python3").args(["-m", "pip", "--version"])) {
                Err(
                    "python3 has no pip (codegen downloads the pinned cuda.h wheel with it): \
                     install python3-pip (Debian/Ubuntu)"
                        .into(),
                )
            } else {
                Ok(())
            }
        }
        Prereq::PythonVenv => {
            if workspace_root().join("target/py-venv/bin/python").exists() {
                return Ok(());
            }
            let python = std::env::var("TILE_PYTHON").unwrap_or_else(|_| "python3".into());
            let shown = Path::new(&python).display();
            if !runs(Command::new(&python).arg("--version")) {
                Err(format!(
                    "{shown} not found: install python3 and python3-venv (Debian/Ubuntu), or set \
                     TILE_PYTHON to a Python 3"
                ))
            } else if !runs(Command::new(&python).args(["-c", "import venv, ensurepip"])) {
                Err(format!(
                    "{shown} cannot create a virtual environment with pip (no venv or \
                     ensurepip): install python3-venv (Debian/Ubuntu), or set TILE_PYTHON to a \
                     Python that has them"
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Whether `cmd` starts and exits successfully (its output discarded).
fn runs(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
