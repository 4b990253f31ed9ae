//! Finding the CUDA libraries `cudarc` loads (NVRTC, the driver) before `cudarc` looks for them,
//! so that a missing one is an error value and nothing is printed: `cudarc` panics when it
//! cannot load a library or a symbol, and does not honour `TILE_LIBCUDA`.

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The file names `cudarc` tries for library `name` (`"nvrtc"`, `"cuda"`), in its order.
pub(crate) fn candidates(name: &str) -> Vec<String> {
    cudarc::get_lib_name_candidates(name)
}

/// `Ok` when one of `cudarc`'s candidate names for NVRTC loads; the answer is kept for the life
/// of the process (the loader's search path does not change under it).
#[cfg(feature = "nvrtc")]
pub(crate) fn require_nvrtc() -> Result<()> {
    static FOUND: OnceLock<bool> = OnceLock::new();
    let names = candidates("nvrtc");
    if *FOUND.get_or_init(|| first_loadable(&names, None).is_some()) {
        Ok(())
    } else {
        Err(Error::NvrtcUnavailable { searched: names })
    }
}

/// `Ok` when the CUDA driver loads for tile (`TILE_LIBCUDA` honoured) and one of `cudarc`'s
/// candidate names for it loads as a driver (it exports `cuDeviceGet`, the first entry point
/// `cudarc` asks for); kept for the life of the process.
///
/// # Errors
///
/// [`Error::Driver`] without a driver; [`Error::CudarcDriverUnavailable`] when `cudarc` would
/// not find one.
#[cfg(feature = "cudarc")]
pub(crate) fn require_cudarc_driver() -> Result<()> {
    static FOUND: OnceLock<bool> = OnceLock::new();
    cuda_sys::driver()?;
    let names = candidates("cuda");
    if *FOUND.get_or_init(|| first_loadable(&names, Some(c"cuDeviceGet")).is_some()) {
        Ok(())
    } else {
        Err(Error::CudarcDriverUnavailable { searched: names })
    }
}

/// The first of `names` that the dynamic loader opens, and that exports `symbol` when one is
/// given (closed again at once: `cudarc` opens it for itself), or `None`.
pub(crate) fn first_loadable<'n>(
    names: &'n [String],
    symbol: Option<&std::ffi::CStr>,
) -> Option<&'n str> {
    names.iter().map(String::as_str).find(|name| {
        // SAFETY: opening a shared library runs its initialisers. The names are `cudarc`'s for
        // CUDA's own libraries, whose initialisers have no preconditions; a file of another
        // library under such a name is the installation's fault, as for `cudarc` itself.
        let Ok(lib) = (unsafe { libloading::Library::new(*name) }) else {
            return false;
        };
        symbol.is_none_or(|symbol| {
            // SAFETY: the symbol is only looked up, never called. The type is a pointer's:
            // `libloading` refuses any type of another size, whatever the library holds.
            unsafe { lib.get::<*mut std::ffi::c_void>(symbol.to_bytes_with_nul()) }.is_ok()
        })
    })
}

#[cfg(all(test, feature = "nvrtc"))]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nvrtc_is_an_error_that_names_the_files_and_the_fix() {
        let names = vec!["libtile-test-no-such-nvrtc.so".to_owned()];
        assert_eq!(first_loadable(&names, None), None);
        let msg = Error::NvrtcUnavailable { searched: names }.to_string();
        for part in [
            "NVRTC (libnvrtc.so) could not be loaded",
            "libtile-test-no-such-nvrtc.so",
            "LD_LIBRARY_PATH",
            "nvidia-cuda-nvrtc",
            "PTX or a cubin",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
        assert!(!msg.contains('\n'), "one line: {msg:?}");
    }

    #[test]
    fn the_search_uses_cudarcs_names_for_nvrtc() {
        let names = candidates("nvrtc");
        assert!(names.iter().any(|n| n == "libnvrtc.so"), "{names:?}");
        // Whatever this machine has, the probe answers without panicking and agrees with the
        // names it was given.
        match first_loadable(&names, None) {
            Some(found) => assert!(names.iter().any(|n| n == found)),
            None => assert!(require_nvrtc().is_err()),
        }
    }
}

#[cfg(all(test, feature = "cudarc"))]
mod driver_tests {
    use super::*;

    #[test]
    fn a_library_without_the_drivers_entry_points_is_not_taken_for_the_driver() {
        let names = ["libtile-test-no-such-cuda.so", "libc.so.6"].map(String::from);
        assert_eq!(first_loadable(&names, None), Some("libc.so.6"));
        assert_eq!(first_loadable(&names, Some(c"cuDeviceGet")), None);
        // A symbol the library does export is found (the lookup's type must be pointer-sized:
        // a probe that asked for another type would refuse every library, the driver too).
        assert_eq!(first_loadable(&names, Some(c"malloc")), Some("libc.so.6"));
        let msg = Error::CudarcDriverUnavailable {
            searched: names.to_vec(),
        }
        .to_string();
        for part in [
            "cudarc cannot load the CUDA driver",
            "libc.so.6",
            "TILE_LIBCUDA",
            "LD_LIBRARY_PATH",
        ] {
            assert!(msg.contains(part), "{part:?} missing from {msg:?}");
        }
    }
}
