//! A declared signature checked against the compiled kernel's parameter list when the kernel is
//! looked up: a mismatch in count names both counts. On the stub driver, whose kernels take 7
//! parameters of 8 bytes, so that no GPU is needed.

mod stub;

use tile_launch::{Error, Library, Param, ScalarType, Signature};

/// In the child: looks the stub's kernel up with 1, 5, 7 and 8 declared parameters and prints each
/// outcome on a line.
fn child() {
    let lib = Library::from_ptx("stub").expect("the stub loads anything");
    for n in [1, 5, 7, 8] {
        let sig = Signature::new(vec![Param::scalar(ScalarType::U64); n]);
        match lib.kernel("k", sig) {
            Ok(_) => println!("{n}: ok"),
            Err(e @ Error::Signature { .. }) => println!("{n}: {e}"),
            Err(e) => println!("{n}: other {e}"),
        }
    }
}

#[test]
fn a_signature_of_another_length_names_both_counts() {
    if stub::in_child() {
        return child();
    }
    let driver = stub::build();
    let out = stub::run_child(
        "a_signature_of_another_length_names_both_counts",
        Some(&driver),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{stdout}{stderr}");
    for want in [
        "1: kernel `k`: the signature declares 1 parameter but the kernel takes 7\n",
        "5: kernel `k`: the signature declares 5 parameters but the kernel takes 7\n",
        "7: ok\n",
        "8: kernel `k`: the signature declares 8 parameters but the kernel takes 7\n",
    ] {
        assert!(stdout.contains(want), "{want:?} missing from {stdout:?}");
    }
}
