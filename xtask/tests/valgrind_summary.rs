//! `.ci/valgrind_summary.py`, which turns a passing memcheck run's expected leak records into one
//! line, run on logs in valgrind's format.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs the script on `log` and `out`; returns (exit code, stdout).
fn summary(name: &str, log: &str, out: &str) -> (Option<i32>, String) {
    // One directory per call: the tests run in parallel.
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("xtask-vg-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (log_path, out_path) = (dir.join("x.log"), dir.join("x.out"));
    std::fs::write(&log_path, log).unwrap();
    std::fs::write(&out_path, out).unwrap();
    let r = Command::new("python3")
        .arg(root().join(".ci/valgrind_summary.py"))
        .arg(name)
        .args([&log_path, &out_path])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (r.status.code(), String::from_utf8(r.stdout).unwrap())
}

const LOG: &str = "\
==17085== 16 bytes in 1 blocks are definitely lost in loss record 1 of 92
==17085==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==17085==    by 0x252363: alloc (alloc.rs:95)
==17085== 
==17085== 1,024 bytes in 3 blocks are definitely lost in loss record 2 of 92
==17085==    at 0x48417B4: malloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
==17085== 
==17085== 288 bytes in 1 blocks are possibly lost in loss record 3 of 92
==17085==    at 0x4846A73: calloc (in /usr/libexec/valgrind/vgpreload_memcheck-amd64-linux.so)
";

#[test]
fn expected_leak_records_become_one_line() {
    let out = "running 5 tests\n.....\ntest result: ok. 5 passed; 0 failed; 0 ignored\n";
    let (code, stdout) = summary("faults", LOG, out);
    assert_eq!(code, Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    let line = lines[0];
    assert!(line.starts_with("valgrind faults: no memory errors; test result: ok. 5 passed"));
    assert!(
        line.contains(
            "expected leak records: 2 definitely lost (4 blocks), 1 possibly lost (1 blocks)"
        ),
        "{line}"
    );
    assert!(line.ends_with("x.log)"), "{line}");
}

#[test]
fn a_run_without_leaks_says_none() {
    let (code, stdout) = summary("dlpack", "", "test result: ok. 9 passed\n");
    assert_eq!(code, Some(0));
    assert!(stdout.contains("expected leak records: none"), "{stdout}");
}

#[test]
fn a_log_with_errors_is_printed_whole_and_fails() {
    let log = format!("{LOG}==17085== ERROR SUMMARY: 3 errors from 3 contexts\n");
    let (code, stdout) = summary("faults", &log, "");
    assert_eq!(code, Some(1));
    assert!(stdout.contains("loss record 3 of 92"), "{stdout}");
    assert!(
        stdout.contains("ci: valgrind: faults: errors in"),
        "{stdout}"
    );
}
