//! `cargo xtask doc [--open]`: the library crates' API documentation with the features docs.rs
//! builds it with, read from each crate's `[package.metadata.docs.rs] features`, so that what a
//! feature adds (tile-launch's `cudarc_interop`, `Library::from_cuda_source`) is documented
//! here as it will be there. A plain `cargo doc` builds default features only.

use anyhow::{Context, Result};

use crate::{cargo, run_cmd};

/// The crates documented on docs.rs (published), in dependency order.
pub(crate) const LIBRARY_CRATES: &[&str] = &["tile-cuda-sys", "tile-dlpack", "tile-launch"];

pub(crate) fn run(open: bool) -> Result<()> {
    let features = docs_rs_features(&metadata()?)?;
    // One `cargo doc` per crate: `--features crate/feature` is not applied to a selected
    // package that is also its own dev-dependency (tile-launch), a plain `--features` is.
    for (krate, features) in &features {
        let mut cmd = cargo();
        cmd.args(["doc", "--no-deps", "-p", krate]);
        if !features.is_empty() {
            cmd.args(["--features", &features.join(",")]);
        }
        // The top layer, opened once everything below it is built.
        if open && *krate == "tile-launch" {
            cmd.arg("--open");
        }
        run_cmd(&mut cmd)?;
    }
    Ok(())
}

/// `cargo metadata` of the workspace's own packages.
fn metadata() -> Result<serde_json::Value> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(crate::workspace_root())
        .output()
        .context("cannot run cargo metadata")?;
    anyhow::ensure!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("cargo metadata printed no JSON")
}

/// Each of [`LIBRARY_CRATES`] with its docs.rs features (`[package.metadata.docs.rs] features`).
fn docs_rs_features(metadata: &serde_json::Value) -> Result<Vec<(&'static str, Vec<String>)>> {
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    LIBRARY_CRATES
        .iter()
        .map(|&krate| {
            let package = packages
                .iter()
                .find(|p| p["name"] == krate)
                .with_context(|| format!("{krate} is not a workspace package"))?;
            let features = match package["metadata"]["docs"]["rs"]["features"].as_array() {
                None => Vec::new(),
                Some(list) => list
                    .iter()
                    .map(|f| {
                        f.as_str().map(str::to_owned).with_context(|| {
                            format!("{krate}: docs.rs feature {f} is not a string")
                        })
                    })
                    .collect::<Result<_>>()?,
            };
            Ok((krate, features))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_docs_carry_the_features_docs_rs_documents() {
        let features = docs_rs_features(&metadata().unwrap()).unwrap();
        let of = |krate: &str| &features.iter().find(|(k, _)| *k == krate).unwrap().1;
        assert_eq!(of("tile-launch"), &["cudarc", "nvrtc"]);
        assert_eq!(of("tile-dlpack"), &["cudarc"]);
        assert!(of("tile-cuda-sys").is_empty());
    }

    #[test]
    fn a_crate_without_docs_rs_metadata_adds_no_feature() {
        let metadata = serde_json::json!({"packages": [
            {"name": "tile-cuda-sys", "metadata": null},
            {"name": "tile-dlpack", "metadata": {"docs": {"rs": {"features": ["cudarc"]}}}},
            {"name": "tile-launch", "metadata": {"docs": {"rs": {"features": ["a", "b"]}}}},
        ]});
        let got = docs_rs_features(&metadata).unwrap();
        assert_eq!(
            got,
            [
                ("tile-cuda-sys", vec![]),
                ("tile-dlpack", vec!["cudarc".to_owned()]),
                ("tile-launch", vec!["a".to_owned(), "b".to_owned()]),
            ]
        );
    }
}
