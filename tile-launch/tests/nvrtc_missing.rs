//! `Library::from_cuda_source` on a machine whose NVRTC cannot be loaded: one error value, and
//! nothing printed (no panic message, no backtrace, even with `RUST_BACKTRACE=1`).
//!
//! Without a CUDA driver, the driver is the stub of `bench/profile/cuda_stub.c` (built here with
//! `cc`), so that the driver is found and the NVRTC look-up is reached without a GPU. The call
//! runs in a child process (this test binary, re-run) whose stderr is captured whole. Where NVRTC
//! is on the loader's path (a GPU machine), the test checks the other side: the look-up finds
//! it, and the call still prints nothing.

use std::path::PathBuf;
use std::process::Command;

use tile_launch::{Error, Library};

const CHILD: &str = "TILE_TEST_NVRTC_CHILD";

/// In the child: the call, its outcome on stdout.
fn child() {
    match Library::from_cuda_source("extern \"C\" __global__ void k() {}", &[]) {
        Err(Error::NvrtcUnavailable { searched, .. }) => {
            println!("unavailable {}", searched.len());
        }
        Err(e) => println!("other {e}"),
        Ok(_) => println!("compiled"),
    }
}

/// The `TILE_LIBCUDA` for the child: none where a CUDA driver loads (a GPU machine), else the
/// stub driver of `bench/profile/cuda_stub.c`, built with `cc` into a fresh directory.
fn driver_for_child() -> Option<PathBuf> {
    if tile_launch::cuda_sys::driver().is_ok() {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("tile-nvrtc-missing-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Read from the workspace (not compiled in: the packaged crate does not ship it).
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/profile/cuda_stub.c");
    assert!(
        source.exists(),
        "without a CUDA driver this test needs the workspace's {}",
        source.display()
    );
    let stub = dir.join("libcuda.so.1");
    let status = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&stub)
        .arg(&source)
        .status()
        .expect(
            "without a CUDA driver this test builds a stub one with `cc`: install a C compiler",
        );
    assert!(status.success(), "cc failed on bench/profile/cuda_stub.c");
    Some(stub)
}

/// Whether the dynamic loader opens one of the names NVRTC is looked for under.
fn nvrtc_loadable() -> bool {
    cudarc_names().iter().any(|name| {
        // SAFETY: opening NVRTC runs its initialisers, which have no preconditions.
        unsafe { libloading::Library::new(name) }.is_ok()
    })
}

fn cudarc_names() -> Vec<String> {
    tile_launch::cudarc_interop::cudarc::get_lib_name_candidates("nvrtc")
}

#[test]
fn a_missing_nvrtc_is_one_error_and_prints_nothing() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let stub = driver_for_child();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "a_missing_nvrtc_is_one_error_and_prints_nothing",
        "--nocapture",
    ])
    .args(["--test-threads", "1", "-q"])
    .env(CHILD, "1")
    .env("RUST_BACKTRACE", "1");
    if let Some(stub) = &stub {
        cmd.env("TILE_LIBCUDA", stub);
    }
    let out = cmd.output().unwrap();
    if let Some(stub) = &stub {
        std::fs::remove_dir_all(stub.parent().unwrap()).unwrap();
    }
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    assert!(stderr.trim().is_empty(), "{stderr}");
    if nvrtc_loadable() {
        // NVRTC is on this machine's loader path: the look-up finds it and the call goes on to
        // compile (the stub driver then loads whatever it is given).
        assert!(!stdout.contains("unavailable"), "{stdout}");
    } else {
        let names = cudarc_names().len();
        assert!(
            stdout.contains(&format!("unavailable {names}\n")),
            "{stdout}"
        );
    }
}
