//! The command line's failures: one line (and the usage where it helps), exit status 1, no
//! backtrace even under `RUST_BACKTRACE=1`.

use std::process::Command;

/// Runs xtask with `args` and `RUST_BACKTRACE=1`; returns (exit code, stdout, stderr).
fn xtask(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn assert_no_backtrace(stderr: &str) {
    for marker in ["backtrace", "Stack", "Caused by", "Error: "] {
        assert!(!stderr.contains(marker), "{marker:?} in {stderr:?}");
    }
}

#[test]
fn an_unknown_task_is_one_line_then_the_usage() {
    let (code, stdout, stderr) = xtask(&["tset"]);
    assert_eq!(code, Some(1));
    assert!(stdout.is_empty(), "{stdout:?}");
    assert!(
        stderr.starts_with("xtask: unknown task `tset`\n"),
        "{stderr:?}"
    );
    assert!(stderr.contains("usage: cargo xtask <task>"), "{stderr:?}");
    assert_no_backtrace(&stderr);
}

#[test]
fn an_argument_a_task_does_not_take_is_one_line() {
    let (code, _, stderr) = xtask(&["test", "--release"]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "xtask: `cargo xtask test` does not accept the argument `--release` (it takes no \
         arguments); see `cargo xtask --help`\n"
    );
    let (code, _, stderr) = xtask(&["profile", "--launches=0"]);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "xtask: --launches takes a positive integer, got `0`\n"
    );
    assert_no_backtrace(&stderr);
}

#[test]
fn help_goes_to_stdout_and_succeeds() {
    let (code, stdout, stderr) = xtask(&["doc", "--help"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("doc [--open]"), "{stdout:?}");
    assert!(stderr.is_empty(), "{stderr:?}");
}
