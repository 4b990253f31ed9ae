//! The documentation's Python programs, run without a GPU (part of `cargo xtask test`):
//! `xtask/snippets/run_snippets.py` runs every Python block of `README.md`, `docs/` and
//! `tile-py/README.md` against the stub driver (`bench/profile/cuda_stub.c`) with NVRTC from the
//! pinned `nvidia-cuda-nvrtc` wheel, and checks that the programs shown in several places are
//! the examples (`examples/torch_vector_add.py`, `tile-launch/examples/vector_add.rs`) with the
//! repository's kernel. The Rust programs are compiled as doctests by the Rust tests.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::workspace_root;

/// NVRTC for the blocks' `Library.from_cuda_source`, in the CUDA version the rest is pinned to.
const NVRTC: &str = "nvidia-cuda-nvrtc==13.0.88";

/// Runs the blocks with `python` (target/py-venv's, where tile_py is installed); returns how many
/// ran against the stub.
pub(crate) fn run(python: &Path) -> Result<usize> {
    let root = workspace_root();
    let dir = root.join("target/snippets");
    std::fs::create_dir_all(&dir)?;
    let stub = dir.join("libcuda.so.1");
    crate::run_cmd(
        Command::new("cc")
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&stub)
            .arg(root.join("bench/profile/cuda_stub.c")),
    )?;
    crate::run_cmd(Command::new(python).args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        NVRTC,
    ]))?;
    let out = Command::new(python)
        .args([
            "-c",
            "import importlib.util as u; print(list(u.find_spec('nvidia').submodule_search_locations)[0])",
        ])
        .output()
        .context("cannot start the venv's python")?;
    if !out.status.success() {
        bail!("{NVRTC} is not importable from {}", python.display());
    }
    let nvrtc_lib = Path::new(String::from_utf8(out.stdout)?.trim()).join("cu13/lib");
    let mut cmd = Command::new(python);
    cmd.arg(root.join("xtask/snippets/run_snippets.py"))
        .arg(&root)
        .env("TILE_LIBCUDA", &stub)
        .env("LD_LIBRARY_PATH", library_path(&nvrtc_lib))
        .current_dir(&root);
    eprintln!("$ {cmd:?}");
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot start run_snippets.py")?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    if !out.status.success() {
        bail!("the documentation's Python blocks failed against the stub driver (see above)");
    }
    // The runner's last line: "snippets: N Python blocks run against the stub driver, ...".
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("snippets: "))
        .find_map(|l| l.split(" Python blocks run").next()?.parse().ok())
        .context("run_snippets.py printed no count")
}

/// `dir` first on the loader's path, before what the environment already has.
fn library_path(dir: &Path) -> std::ffi::OsString {
    let mut path = dir.as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}
