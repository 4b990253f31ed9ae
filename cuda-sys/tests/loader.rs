//! Loader and error behaviour that needs no driver.

use std::path::Path;

use cuda_sys::{CUresult, CuResultExt, CudaError, Driver, LoadError, SymbolStatus, result_name};

#[test]
fn missing_library_is_library_not_found_naming_the_path() {
    let path = Path::new("/nonexistent/libcuda.so.1");
    let error = Driver::load(path).unwrap_err();
    assert!(
        matches!(&error, LoadError::LibraryNotFound { path: p, .. } if p == path),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("/nonexistent/libcuda.so.1"), "{message}");
    assert!(message.contains("no NVIDIA driver found"), "{message}");
}

/// A real shared library that is not the CUDA driver.
fn libm() -> &'static Path {
    [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists())
    .expect("libm.so.6 at a known path")
}

#[test]
#[cfg(target_os = "linux")]
fn library_without_cuda_is_missing_symbol() {
    let error = Driver::load(libm()).unwrap_err();
    match &error {
        LoadError::MissingSymbol {
            symbol,
            version,
            status,
        } => {
            assert_eq!(*symbol, "cuGetProcAddress_v2");
            assert_eq!(*version, 12000);
            assert!(
                matches!(status, SymbolStatus::NotExported { .. }),
                "{status:?}"
            );
        }
        other => panic!("expected MissingSymbol, got {other:?}"),
    }
    assert!(error.to_string().contains("cuGetProcAddress_v2"), "{error}");
}

#[test]
fn load_errors_are_cloneable_and_comparable() {
    let error = Driver::load(Path::new("/nonexistent/libcuda.so.1")).unwrap_err();
    assert_eq!(error.clone(), error);
}

#[test]
fn cuda_error_names_and_display() {
    let error = CudaError::new(CUresult::CUDA_ERROR_INVALID_VALUE, "cuLaunchKernelEx");
    assert_eq!(error.name(), "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(
        error.description(),
        None,
        "no driver was loaded in this test binary"
    );
    assert_eq!(
        error.to_string(),
        "cuLaunchKernelEx failed: CUDA_ERROR_INVALID_VALUE"
    );

    let oom = CudaError::new(CUresult(2), "cuMemAlloc");
    assert_eq!(oom.name(), "CUDA_ERROR_OUT_OF_MEMORY");

    let unknown = CudaError::new(CUresult(987_654), "cuInit");
    assert_eq!(unknown.name(), "CUDA_ERROR_UNKNOWN_987654");
    assert_eq!(
        unknown.to_string(),
        "cuInit failed: CUDA_ERROR_UNKNOWN_987654"
    );
}

#[test]
fn result_name_table() {
    assert_eq!(result_name(0), Some("CUDA_SUCCESS"));
    assert_eq!(result_name(1), Some("CUDA_ERROR_INVALID_VALUE"));
    assert_eq!(result_name(100), Some("CUDA_ERROR_NO_DEVICE"));
    assert_eq!(result_name(999), Some("CUDA_ERROR_UNKNOWN"));
    assert_eq!(result_name(987_654), None);
}

#[test]
fn check_turns_codes_into_results() {
    assert_eq!(CUresult::CUDA_SUCCESS.check("cuInit"), Ok(()));
    let error = CUresult::CUDA_ERROR_NOT_INITIALIZED
        .check("cuCtxGetCurrent")
        .unwrap_err();
    assert_eq!(error.code, CUresult::CUDA_ERROR_NOT_INITIALIZED);
    assert_eq!(error.function, "cuCtxGetCurrent");
}

#[test]
fn cuda_result_is_a_transparent_u32() {
    assert_eq!(size_of::<CUresult>(), 4);
    assert_eq!(align_of::<CUresult>(), 4);
    assert_eq!(CUresult::CUDA_ERROR_INVALID_VALUE.0, 1);
}

#[test]
fn entry_points_ask_for_abis_no_newer_than_cuda_13_0() {
    let table = Driver::ENTRY_POINTS;
    assert_eq!(table.len(), 75);
    for entry in table {
        assert!(entry.version <= 13000, "{entry:?}");
        assert!(
            entry.pfn.ends_with(&format!("_v{}", entry.version)),
            "{entry:?}"
        );
        assert!(!entry.pfn.contains("_pt"), "per-thread variant: {entry:?}");
    }
    let find = |field: &str| table.iter().find(|e| e.field == field).unwrap();
    assert_eq!(find("cuStreamGetCaptureInfo").version, 12030);
    // `cuDeviceTotalMem_v2` (a `size_t` byte count), which cuda.h maps the name to.
    assert_eq!(find("cuDeviceTotalMem").version, 3020);
    assert_eq!(find("cuCtxGetDevice").version, 2000);
    assert_eq!(find("cuKernelGetParamInfo").version, 12040);
    let instantiate = find("cuGraphInstantiate");
    assert_eq!(
        (instantiate.symbol, instantiate.version),
        ("cuGraphInstantiateWithFlags", 11040)
    );
}
