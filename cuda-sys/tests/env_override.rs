//! `driver()` honours `TILE_LIBCUDA` and caches its error. The only test in its binary, because
//! `driver()` reads the environment once per process.

use cuda_sys::{LIBCUDA_ENV, LoadError, driver};

#[test]
fn tile_libcuda_pointing_nowhere_is_a_clean_cached_error() {
    let path = "/nonexistent/tile-test/libcuda.so.1";
    // SAFETY: this binary holds this one test, which runs before anything reads the environment;
    // no other thread of the process reads or writes it.
    unsafe { std::env::set_var(LIBCUDA_ENV, path) };

    let first = driver().unwrap_err();
    assert!(
        matches!(&first, LoadError::LibraryNotFound { path: p, .. } if p.to_str() == Some(path)),
        "{first:?}"
    );
    assert!(first.to_string().contains(path), "{first}");
    assert_eq!(driver().unwrap_err(), first, "the error is cached");
}
