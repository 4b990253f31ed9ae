//! The stub driver of `bench/profile/cuda_stub.c`, for tests that need a driver's answers without
//! a GPU, run in a child process (this test binary, re-run) so that `TILE_LIBCUDA` names it
//! before the driver is first loaded. The stub's kernels take 7 parameters of 8 bytes.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The environment variable that marks the child process.
pub const CHILD: &str = "TILE_TEST_STUB_CHILD";

/// Whether this process is the child of [`run_child`].
pub fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Builds the stub with `cc` into a fresh directory (one per call: tests of one binary run in
/// parallel) and returns its path.
pub fn build() -> PathBuf {
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tile-stub-driver-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Read from the workspace (not compiled in: the packaged crate does not ship it).
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../bench/profile/cuda_stub.c");
    assert!(
        source.exists(),
        "this test needs the workspace's {}",
        source.display()
    );
    let stub = dir.join("libcuda.so.1");
    let status = Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&stub)
        .arg(&source)
        .status()
        .expect("this test builds a stub driver with `cc`: install a C compiler");
    assert!(status.success(), "cc failed on bench/profile/cuda_stub.c");
    stub
}

/// Runs test `name` of this binary in a child process, with the driver at `driver` (`None`: the
/// one the loader finds), and returns what it printed.
pub fn run_child(name: &str, driver: Option<&PathBuf>) -> Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads", "1", "-q"])
        .env(CHILD, "1")
        .env("RUST_BACKTRACE", "1");
    if let Some(driver) = driver {
        cmd.env("TILE_LIBCUDA", driver);
    }
    let out = cmd.output().unwrap();
    if let Some(driver) = driver {
        std::fs::remove_dir_all(driver.parent().unwrap()).unwrap();
    }
    out
}

/// In the child: the stub driver the process loaded (named by `TILE_LIBCUDA`), opened again to
/// reach its counters and switches.
#[allow(dead_code)] // not every test binary that builds the stub reads it
pub fn loaded() -> libloading::Library {
    let path = std::env::var_os("TILE_LIBCUDA").expect("the child runs on the stub driver");
    // SAFETY: the stub the process already loaded; loading it again runs no initialiser.
    unsafe { libloading::Library::new(path) }.unwrap()
}

/// In the child: the stub's switches and counters (`bench/profile/cuda_stub.c`), on the library
/// the process loaded as its driver.
#[allow(dead_code)] // not every test binary that builds the stub uses every switch
pub struct Switches {
    lib: libloading::Library,
}

#[allow(dead_code)]
impl Switches {
    pub fn open() -> Switches {
        Switches { lib: loaded() }
    }

    fn set(&self, name: &[u8], on: bool) {
        // SAFETY: the stub's `stub_set_*` / `stub_refuse_*` switches take one int.
        unsafe { self.lib.get::<unsafe extern "C" fn(i32)>(name).unwrap()(i32::from(on)) }
    }

    /// `stub_set_busy`: the work enqueued so far has not finished until cleared.
    pub fn busy(&self, on: bool) {
        self.set(b"stub_set_busy\0", on);
    }

    /// `stub_set_capturing`: every stream captures.
    pub fn capturing(&self, on: bool) {
        self.set(b"stub_set_capturing\0", on);
    }

    /// `stub_refuse_user_objects`: `cuUserObjectCreate` fails until cleared.
    pub fn refuse_user_objects(&self, on: bool) {
        self.set(b"stub_refuse_user_objects\0", on);
    }

    /// `stub_destroy_graphs`: the captured graphs' user objects release what they hold.
    pub fn destroy_graphs(&self) {
        // SAFETY: `stub_destroy_graphs` takes nothing.
        unsafe {
            self.lib
                .get::<unsafe extern "C" fn()>(b"stub_destroy_graphs\0")
                .unwrap()()
        }
    }

    /// How many times the stub answered entry point `name`.
    pub fn calls(&self, name: &std::ffi::CStr) -> u64 {
        type Count = unsafe extern "C" fn(*const std::ffi::c_char) -> u64;
        // SAFETY: `stub_driver_calls` takes a C string and returns a count.
        unsafe { self.lib.get::<Count>(b"stub_driver_calls\0").unwrap()(name.as_ptr()) }
    }
}
