//! Errors that the public API produces without a GPU or a driver.

use tile_launch::{Error, Library};

/// Reading the file comes before the driver is asked for, so a missing file is reported as
/// such on any machine.
#[test]
fn a_missing_library_file_is_a_read_error_with_its_path() {
    let path = std::env::temp_dir().join("tile-launch-no-such-dir/kernel.cubin");
    let e = Library::from_file(&path).expect_err("no such file");
    match &e {
        Error::ReadFile {
            path: p, source, ..
        } => {
            assert_eq!(p, &path);
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        }
        other => panic!("expected Error::ReadFile, got {other:?}"),
    }
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("cannot read {}: ", path.display())),
        "{text}"
    );
}
