//! `examples/launcher.c`, built with `cc` against `include/tile.h` and this crate's cdylib, and
//! run on the stub driver of `bench/profile/cuda_stub.c`, whose kernel "runs" until the stream
//! is synchronised: the example's tensor is deleted exactly once, after the kernel, never
//! while it runs (the example checks both and exits with 1 otherwise; this test checks its
//! exit status and what it printed).

// Only `stub::build` is used here.
#[allow(dead_code)]
#[path = "../../tile-launch/tests/stub/mod.rs"]
mod stub;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The folder of this test binary, where cargo puts the crate's cdylib (`libtile_capi.so`).
fn cdylib_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(
        dir.join("libtile_capi.so").exists(),
        "no libtile_capi.so in {}",
        dir.display()
    );
    dir
}

/// Compiles the example with `cc` into `out`, warnings as errors.
fn build_example(out: &Path) {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib_dir = cdylib_dir();
    let status = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir.join("include"))
        .arg(crate_dir.join("examples/launcher.c"))
        .arg("-L")
        .arg(&lib_dir)
        .arg("-ltile_capi")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .args(["-ldl", "-o"])
        .arg(out)
        .status()
        .expect("this test builds examples/launcher.c with `cc`: install a C compiler");
    assert!(status.success(), "cc failed on examples/launcher.c");
}

#[test]
fn the_c_launcher_example_deletes_its_tensor_once_after_the_kernel() {
    let driver = stub::build();
    let dir = driver.parent().unwrap().to_path_buf();
    let example = dir.join("launcher");
    build_example(&example);
    let out = Command::new(&example)
        .env("TILE_LIBCUDA", &driver)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    // The kernel still runs after the launch: nothing released, the deleter not called.
    assert!(
        stdout.contains("after the launch: 0 released, deleter calls 0\n"),
        "{stdout}"
    );
    // Synchronising waited for it, then released the one tensor held.
    assert!(
        stdout.contains("after synchronize: deleter calls 1, pending 0, released 1\n"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with("ok: the deleter ran once, after the kernel\n"),
        "{stdout}"
    );
}
