//! `Library::from_cuda_source` on a machine whose NVRTC cannot be loaded: one error value, and
//! nothing printed (no panic message, no backtrace, even with `RUST_BACKTRACE=1`).
//!
//! Without a CUDA driver, the driver is the stub of `bench/profile/cuda_stub.c` (built here with
//! `cc`), so that the driver is found and the NVRTC look-up is reached without a GPU. The call
//! runs in a child process (this test binary, re-run) whose stderr is captured whole. Where NVRTC
//! is on the loader's path (a GPU machine), the test checks the other side: the look-up finds
//! it, and the call still prints nothing.

mod stub;

use std::path::PathBuf;

use tile_launch::{Error, Library};

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
/// stub driver.
fn driver_for_child() -> Option<PathBuf> {
    if tile_launch::cuda_sys::driver().is_ok() {
        return None;
    }
    Some(stub::build())
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
    if stub::in_child() {
        return child();
    }
    let stub = driver_for_child();
    let out = stub::run_child(
        "a_missing_nvrtc_is_one_error_and_prints_nothing",
        stub.as_ref(),
    );
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
