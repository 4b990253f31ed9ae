//! `cudarc_interop::context` where `cudarc` would find no driver: the driver tile loads (the stub
//! of `bench/profile/cuda_stub.c`, named by `TILE_LIBCUDA`, which `cudarc` does not honour) is
//! not one `cudarc` looks for, and the call returns tile's error instead of panicking inside
//! `cudarc`. Where `cudarc` finds a real driver (a GPU machine), the call succeeds; either way
//! nothing is printed.

mod stub;

use tile_launch::Error;
use tile_launch::cudarc_interop;

/// In the child: the call, its outcome on stdout.
fn child() {
    match cudarc_interop::context(0) {
        Err(e @ Error::CudarcDriverUnavailable { .. }) => println!("unavailable: {e}"),
        Err(e) => println!("other {e}"),
        Ok(_) => println!("context"),
    }
}

#[test]
fn a_driver_cudarc_cannot_load_is_an_error_not_a_panic() {
    if stub::in_child() {
        return child();
    }
    let driver = stub::build();
    let out = stub::run_child(
        "a_driver_cudarc_cannot_load_is_an_error_not_a_panic",
        Some(&driver),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.trim().is_empty(), "{stderr}");
    let found = tile_launch::cudarc_interop::cudarc::get_lib_name_candidates("cuda")
        .iter()
        // SAFETY: opening the CUDA driver runs its initialisers, which have no preconditions.
        .any(|name| unsafe { libloading::Library::new(name) }.is_ok());
    if found {
        assert!(stdout.contains("context\n"), "{stdout}");
    } else {
        assert!(
            stdout.contains("unavailable: cudarc cannot load the CUDA driver"),
            "{stdout}"
        );
        assert!(stdout.contains("TILE_LIBCUDA"), "{stdout}");
    }
}
