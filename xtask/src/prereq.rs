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
    /// The Python that runs the pytest suite (`target/py-venv`'s, or the one it will be made
    /// from) is at least the wheel's floor (`requires-python` in `tile-py/pyproject.toml`): pip
    /// refuses to install the abi3 wheel into an older one, at the end of `cargo xtask test`.
    PythonFloor,
}

/// The prerequisites of each task.
pub(crate) fn of_task(task: &str) -> &'static [Prereq] {
    match task {
        "codegen" => &[Prereq::Libclang, Prereq::PythonPip],
        "test" => &[
            Prereq::Libclang,
            Prereq::PythonPip,
            Prereq::PythonVenv,
            Prereq::PythonFloor,
        ],
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
        Prereq::PythonFloor => {
            let venv = workspace_root().join("target/py-venv/bin/python");
            let (python, whose) = if venv.exists() {
                (venv.into_os_string(), "target/py-venv")
            } else {
                let python = std::env::var_os("TILE_PYTHON").unwrap_or_else(|| "python3".into());
                (python, "the Python that target/py-venv would be made from")
            };
            let floor = python_floor()?;
            // Not starting is PythonVenv's line; this one is about the version alone.
            match python_version(Path::new(&python)) {
                Some(version) => at_least(version, floor, &Path::new(&python).display(), whose),
                None => Ok(()),
            }
        }
    }
}

/// `Ok` when `version` is at least `floor`, else the line saying what to do.
fn at_least(
    version: (u32, u32),
    floor: (u32, u32),
    python: &dyn std::fmt::Display,
    whose: &str,
) -> Result<(), String> {
    if version >= floor {
        return Ok(());
    }
    let (v, f) = (
        format!("{}.{}", version.0, version.1),
        format!("{}.{}", floor.0, floor.1),
    );
    Err(format!(
        "{python} ({whose}) is Python {v}, older than the tile_py wheel's floor {f} \
         (requires-python in tile-py/pyproject.toml): remove target/py-venv and set TILE_PYTHON \
         to a Python {f} or newer"
    ))
}

/// The wheel's Python floor, from `requires-python = ">=X.Y"` in `tile-py/pyproject.toml`.
pub(crate) fn python_floor() -> Result<(u32, u32), String> {
    let path = workspace_root().join("tile-py/pyproject.toml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse_floor(&text).ok_or_else(|| {
        format!(
            "{} has no `requires-python = \">=X.Y\"` line",
            path.display()
        )
    })
}

fn parse_floor(pyproject: &str) -> Option<(u32, u32)> {
    let line = pyproject
        .lines()
        .find_map(|l| l.trim().strip_prefix("requires-python"))?;
    let spec = line.trim().strip_prefix('=')?.trim().trim_matches('"');
    let (major, minor) = spec.strip_prefix(">=")?.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// `python`'s `(major, minor)`, or `None` when it does not run.
fn python_version(python: &Path) -> Option<(u32, u32)> {
    let out = Command::new(python)
        .args(["-c", "import sys; print(*sys.version_info[:2])"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8(out.stdout).ok()?;
    let (major, minor) = text.trim().split_once(' ')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether `cmd` starts and exits successfully (its output discarded).
fn runs(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_the_pyproject_one_and_matches_the_abi3_feature() {
        let floor = python_floor().unwrap();
        let cargo = std::fs::read_to_string(workspace_root().join("tile-py/Cargo.toml")).unwrap();
        let abi3 = format!("abi3-py{}{}", floor.0, floor.1);
        assert!(
            cargo.contains(&abi3),
            "tile-py/Cargo.toml does not ask pyo3 for {abi3}"
        );
        assert_eq!(
            parse_floor("[project]\nrequires-python = \">=3.10\"\n"),
            Some((3, 10))
        );
        assert_eq!(parse_floor("[project]\nname = \"x\"\n"), None);
    }

    /// A stand-in interpreter that reports `major minor` as the real one's `sys.version_info`.
    fn fake_python(dir: &Path, major: u32, minor: u32) -> std::path::PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("python{major}.{minor}"));
        std::fs::write(&path, format!("#!/bin/sh\necho {major} {minor}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn an_old_python_is_refused_with_one_line_saying_what_to_do() {
        let dir = std::env::temp_dir().join(format!("xtask-prereq-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let old = fake_python(&dir, 3, 9);
        let new = fake_python(&dir, 3, 12);
        assert_eq!(python_version(&old), Some((3, 9)));
        assert_eq!(python_version(&dir.join("no-such-python")), None);

        let err = at_least((3, 9), (3, 10), &old.display(), "target/py-venv").unwrap_err();
        for part in [
            "is Python 3.9",
            "floor 3.10",
            "target/py-venv",
            "TILE_PYTHON",
            &old.display().to_string(),
        ] {
            assert!(err.contains(part), "{part:?} missing from {err:?}");
        }
        assert!(!err.contains('\n'), "{err:?}");
        let newer = python_version(&new).unwrap();
        assert_eq!(at_least(newer, (3, 10), &new.display(), "x"), Ok(()));
        assert_eq!(at_least((3, 10), (3, 10), &"p", "x"), Ok(()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
