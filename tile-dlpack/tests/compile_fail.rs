//! Misuse of the ownership states does not compile.

use std::io::IsTerminal;

#[test]
#[cfg_attr(
    miri,
    ignore = "runs the compiler (trybuild spawns cargo), which Miri cannot"
)]
fn misuse_does_not_compile() {
    // trybuild colours its report whenever `TERM` is set, also into a file or a pipe; a report
    // that is not read on a terminal stays plain text.
    if !std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        // SAFETY: this binary's only test sets the variable before trybuild starts, and nothing
        // else in the process reads or writes the environment meanwhile.
        unsafe { std::env::set_var("NO_COLOR", "1") };
    }
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
