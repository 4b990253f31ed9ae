//! Keeps ARCHITECTURE.md from drifting (a test, run by `cargo xtask test`): its module map must list exactly the source files of
//! the crates it maps, and every repository path it names (with an optional `::test_name`) must
//! exist.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// The source folders the module map covers, and the subfolders left out of it (unit-test
/// modules, which the invariant table names instead).
const MAPPED: &[&str] = &[
    "cuda-sys/src",
    "tile-dlpack/src",
    "tile-launch/src",
    "tile-capi/src",
    "tile-py/src",
    "tile-py/python/tile_py",
];
const UNMAPPED: &[&str] = &["tile-dlpack/src/tests"];

fn check(root: &Path) -> Result<()> {
    let text = std::fs::read_to_string(root.join("ARCHITECTURE.md"))
        .context("cannot read ARCHITECTURE.md")?;
    let map = section(&text, "## Module map").context("ARCHITECTURE.md has no `## Module map`")?;
    let listed: BTreeSet<String> = code_spans(map)
        .filter(|s| is_source_path(s))
        .map(str::to_owned)
        .collect();
    let mut on_disk = BTreeSet::new();
    for dir in MAPPED {
        collect(root, &root.join(dir), &mut on_disk)?;
    }
    let mut problems = Vec::new();
    for f in on_disk.difference(&listed) {
        problems.push(format!("`{f}` exists but the module map does not list it"));
    }
    for f in listed.difference(&on_disk) {
        problems.push(format!("the module map lists `{f}`, which does not exist"));
    }
    for span in code_spans(&text) {
        let (path, item) = span.split_once("::").unwrap_or((span, ""));
        if !is_repo_path(path) {
            continue;
        }
        let file = root.join(path);
        if !file.exists() {
            problems.push(format!(
                "ARCHITECTURE.md names `{path}`, which does not exist"
            ));
            continue;
        }
        let item = item.split(['(', ':', ' ']).next().unwrap_or("");
        if !item.is_empty() && file.is_file() {
            let body = std::fs::read_to_string(&file)?;
            let defined = [format!("fn {item}("), format!("def {item}(")]
                .iter()
                .any(|d| body.contains(d.as_str()));
            if !defined {
                problems.push(format!(
                    "ARCHITECTURE.md names `{path}::{item}`, not defined there"
                ));
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    bail!(
        "ARCHITECTURE.md has drifted from the code:\n  {}",
        problems.join("\n  ")
    )
}

/// The text of the section that starts with the line `heading`, up to the next `## `.
fn section<'a>(text: &'a str, heading: &str) -> Option<&'a str> {
    let start = text.find(&format!("\n{heading}\n"))? + 1;
    let rest = &text[start + heading.len()..];
    Some(rest.find("\n## ").map_or(rest, |end| &rest[..end]))
}

/// Every inline code span (`` `...` ``) of `text`.
fn code_spans(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

fn is_repo_path(s: &str) -> bool {
    let top = s.split('/').next().unwrap_or("");
    s.contains('/')
        && !s.contains(' ')
        && matches!(
            top,
            "cuda-sys"
                | "tile-dlpack"
                | "tile-launch"
                | "tile-capi"
                | "tile-py"
                | "xtask"
                | "bench"
                | "fuzz"
        )
}

fn is_source_path(s: &str) -> bool {
    is_repo_path(s)
        && MAPPED.iter().any(|d| s.starts_with(&format!("{d}/")))
        && (s.ends_with(".rs") || s.ends_with(".py") || s.ends_with(".pyi"))
}

fn collect(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let rel = path
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        if path.is_dir() {
            if !UNMAPPED.contains(&rel.as_str()) && !rel.ends_with("__pycache__") {
                collect(root, &path, out)?;
            }
        } else if is_source_path(&rel) {
            out.insert(rel);
        }
    }
    Ok(())
}

#[test]
fn architecture_md_matches_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    if let Err(e) = check(root) {
        panic!("{e:#}");
    }
}
