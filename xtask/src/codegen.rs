//! `cargo xtask codegen [--check]`: generate the `cuda-sys` bindings from a pinned `cuda.h`,
//! tile-py's bindings of XLA's FFI C API from the `c_api.h` of a pinned `jaxlib` wheel, and
//! tile-capi's C header from its Rust source.
//!
//! Inputs, all pinned here (the wheels) or in `xtask/Cargo.toml` (bindgen, `=X.Y.Z`):
//!
//! - the PyPI wheel `nvidia-cuda-runtime` at [`WHEEL_VERSION`], checked against [`WHEEL_SHA256`];
//!   it ships `nvidia/cu13/include/cuda.h` and `cudaTypedefs.h`;
//! - the PyPI wheel `jaxlib` at `xla_ffi::XLA_WHEEL_VERSION`, checked against its SHA-256; it
//!   ships `jaxlib/include/xla/ffi/api/c_api.h`;
//! - bindgen (library), run against the system libclang for [`CLANG_TARGET`];
//! - cbindgen (library, `=X.Y.Z` in `xtask/Cargo.toml`), with `tile-capi/cbindgen.toml`.
//!
//! Outputs, committed: `cuda-sys/src/bindings.rs` (types, constants and `PFN_*` function-pointer
//! types, no function declarations), `cuda-sys/src/result_names.rs` (the `CUresult` name table)
//! , `tile-py/src/xla_ffi_sys.rs` (the FFI C API's types and constants) and
//! `tile-capi/include/tile.h` (the C API's declarations).
//!
//! With `--check` the files are regenerated under `target/codegen/check/` and compared with the
//! committed ones; any difference is an error that names the file.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, bail, ensure};
use bindgen::callbacks::{EnumVariantValue, ParseCallbacks};

/// PyPI distribution that ships the CUDA headers.
const WHEEL_NAME: &str = "nvidia-cuda-runtime";
/// Pinned version of [`WHEEL_NAME`]: CUDA 13.0, so that nothing needs a driver newer than 580.
const WHEEL_VERSION: &str = "13.0.96";
/// Platform tag asked of pip, so that every host downloads the same file.
const WHEEL_PLATFORM: &str = "manylinux_2_17_x86_64";
/// File name pip saves for [`WHEEL_VERSION`] on [`WHEEL_PLATFORM`].
const WHEEL_FILE: &str =
    "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl";
/// SHA-256 of [`WHEEL_FILE`].
const WHEEL_SHA256: &str = "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548";
/// Folder of the headers inside the wheel.
const WHEEL_INCLUDE_DIR: &str = "nvidia/cu13/include";
/// `CUDA_VERSION` that the pinned `cuda.h` must define.
const EXPECTED_CUDA_VERSION: u32 = 13000;
/// Target the headers are parsed for (the layout of the generated types).
const CLANG_TARGET: &str = "x86_64-unknown-linux-gnu";

/// Generated files, relative to the workspace root.
const BINDINGS_RS: &str = "cuda-sys/src/bindings.rs";
const RESULT_NAMES_RS: &str = "cuda-sys/src/result_names.rs";

/// The bindgen settings both generated files share: the pinned target and Rust version, types
/// and constants only, enums as newtypes of their integer type, the derives and layout tests,
/// no header comment, no formatter (rustfmt runs after).
fn base_builder(header: &Path) -> Result<bindgen::Builder> {
    Ok(bindgen::Builder::default()
        .header(header.to_string_lossy())
        .clang_arg(format!("--target={CLANG_TARGET}"))
        .rust_target(bindgen::RustTarget::stable(88, 0).map_err(|e| anyhow::anyhow!("{e}"))?)
        .rust_edition(bindgen::RustEdition::Edition2024)
        .with_codegen_config(bindgen::CodegenConfig::TYPES | bindgen::CodegenConfig::VARS)
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .translate_enum_integer_types(true)
        .prepend_enum_name(false)
        .derive_debug(true)
        .derive_copy(true)
        .derive_default(true)
        .layout_tests(true)
        .disable_header_comment()
        .formatter(bindgen::Formatter::None))
}

/// Regenerate the bindings, or with `check` compare a fresh generation with the committed files.
pub fn run(check: bool) -> Result<()> {
    let root = workspace_root();
    let cache = root.join("target/codegen");
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;

    let bindgen_version = pinned_version(&root, "bindgen")?;
    let wheel = fetch_wheel(&cache)?;
    let include = extract_headers(&wheel, &cache)?;
    let mut files = generate(&root, &include, &bindgen_version)?;
    files.push(xla_ffi::generate(&root, &cache, &bindgen_version)?);
    files.push(c_header(&root)?);

    if check {
        let staging = cache.join("check");
        std::fs::create_dir_all(&staging)?;
        let mut stale = Vec::new();
        for (rel, text) in &files {
            let copy = staging.join(Path::new(rel).file_name().expect("file name"));
            std::fs::write(&copy, text)?;
            let committed = std::fs::read_to_string(root.join(rel)).unwrap_or_default();
            if let Some(summary) = diff_summary(&committed, text) {
                stale.push(format!(
                    "{rel} is out of date: {summary}\n  fresh copy: {}",
                    copy.display()
                ));
            }
        }
        if !stale.is_empty() {
            bail!(
                "generated bindings differ from the committed files; run `cargo xtask codegen`\n{}",
                stale.join("\n")
            );
        }
        eprintln!(
            "codegen: {} up to date",
            files.iter().map(|(r, _)| *r).collect::<Vec<_>>().join(", ")
        );
    } else {
        for (rel, text) in &files {
            let path = root.join(rel);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            eprintln!("codegen: wrote {rel} ({} bytes)", text.len());
        }
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The exact version of the dependency `name` pinned (`"=X.Y.Z"`) in `xtask/Cargo.toml`.
fn pinned_version(root: &Path, name: &str) -> Result<String> {
    let manifest = std::fs::read_to_string(root.join("xtask/Cargo.toml"))?;
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{name} ")))
        .with_context(|| format!("no {name} dependency in xtask/Cargo.toml"))?;
    let start = line
        .find("\"=")
        .with_context(|| format!("{name} must be pinned exactly (\"=X.Y.Z\")"))?
        + 2;
    let end = start
        + line[start..]
            .find('"')
            .with_context(|| format!("unterminated {name} version"))?;
    Ok(line[start..end].to_string())
}

/// The C API's header.
const TILE_H: &str = "tile-capi/include/tile.h";

/// Runs cbindgen on the tile-capi crate with `tile-capi/cbindgen.toml`; returns `(path,
/// contents)` of [`TILE_H`].
fn c_header(root: &Path) -> Result<(&'static str, String)> {
    let version = pinned_version(root, "cbindgen")?;
    let crate_dir = root.join("tile-capi");
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .map_err(|e| anyhow::anyhow!("reading tile-capi/cbindgen.toml: {e}"))?;
    config.header = Some(format!(
        "/* generated by `cargo xtask codegen` from the tile-capi crate with cbindgen {version} \
         — do not edit */"
    ));
    let bindings = cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .map_err(|e| anyhow::anyhow!("cbindgen failed on tile-capi: {e}"))?;
    let mut out = Vec::new();
    bindings.write(&mut out);
    Ok((TILE_H, String::from_utf8(out)?))
}

fn sha256(path: &Path) -> Result<String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())",
        ])
        .arg(path)
        .output()
        .context("running python3 to hash the wheel")?;
    ensure!(
        out.status.success(),
        "hashing {} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?.trim().to_string())
}

/// A pinned PyPI wheel that ships headers: what pip is asked for and what it must save.
struct PinnedWheel {
    name: &'static str,
    version: &'static str,
    /// Extra `pip download` arguments that select one file on every host (platform, Python).
    select: &'static [&'static str],
    file: &'static str,
    sha256: &'static str,
}

/// Download the pinned wheel into `cache` unless a copy with the right hash is already there.
fn fetch_wheel(cache: &Path) -> Result<PathBuf> {
    fetch_pinned(
        cache,
        &PinnedWheel {
            name: WHEEL_NAME,
            version: WHEEL_VERSION,
            select: &["--platform", WHEEL_PLATFORM],
            file: WHEEL_FILE,
            sha256: WHEEL_SHA256,
        },
    )
}

/// Download `pin` into `cache` unless a copy with the right hash is already there.
fn fetch_pinned(cache: &Path, pin: &PinnedWheel) -> Result<PathBuf> {
    let (name, version) = (pin.name, pin.version);
    let wheel = cache.join(pin.file);
    if wheel.exists() && sha256(&wheel)? == pin.sha256 {
        return Ok(wheel);
    }
    eprintln!("codegen: downloading {name}=={version} from PyPI");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .args(pin.select)
        .arg(format!("{name}=={version}"))
        .arg("-d")
        .arg(cache)
        .status()
        .context("running `python3 -m pip download`")?;
    ensure!(
        status.success(),
        "pip download of {name}=={version} failed ({status})"
    );
    ensure!(wheel.exists(), "pip did not produce {}", wheel.display());
    let found = sha256(&wheel)?;
    if found != pin.sha256 {
        let _ = std::fs::remove_file(&wheel);
        bail!("{}: sha256 {found}, expected {}", pin.file, pin.sha256);
    }
    Ok(wheel)
}

/// Extract `members` of `wheel` under `dest`.
fn unzip(wheel: &Path, dest: &Path, members: &[String]) -> Result<()> {
    let status = Command::new("python3")
        .args([
            "-c",
            "import sys, zipfile\nwith zipfile.ZipFile(sys.argv[1]) as z:\n    for m in sys.argv[3:]:\n        z.extract(m, sys.argv[2])",
        ])
        .arg(wheel)
        .arg(dest)
        .args(members)
        .status()
        .context("running python3 to unzip the wheel")?;
    ensure!(
        status.success(),
        "extracting headers from {} failed",
        wheel.display()
    );
    Ok(())
}

/// Extract `cuda.h` and `cudaTypedefs.h` from the wheel; returns the folder that holds them.
fn extract_headers(wheel: &Path, cache: &Path) -> Result<PathBuf> {
    let dest = cache.join(format!("{WHEEL_NAME}-{WHEEL_VERSION}"));
    let members = ["cuda.h", "cudaTypedefs.h"].map(|h| format!("{WHEEL_INCLUDE_DIR}/{h}"));
    unzip(wheel, &dest, &members)?;
    Ok(dest.join(WHEEL_INCLUDE_DIR))
}

/// Collects the `CUresult` constants while bindgen parses `cuda.h`.
#[derive(Debug, Default)]
struct ResultCodes(Arc<Mutex<BTreeMap<u32, String>>>);

impl ParseCallbacks for ResultCodes {
    fn enum_variant_name(
        &self,
        enum_name: Option<&str>,
        variant: &str,
        value: EnumVariantValue,
    ) -> Option<String> {
        let is_result =
            enum_name.is_some_and(|n| n.trim_start_matches("enum ") == "cudaError_enum");
        let code = match value {
            EnumVariantValue::Unsigned(v) => u32::try_from(v).ok(),
            EnumVariantValue::Signed(v) => u32::try_from(v).ok(),
            EnumVariantValue::Boolean(_) => None,
        };
        if let (true, Some(code)) = (is_result, code) {
            // The first name declared for a value wins.
            self.0
                .lock()
                .unwrap()
                .entry(code)
                .or_insert_with(|| variant.to_string());
        }
        None
    }

    /// cuda.h indents code samples in its comments, which rustdoc would take for doctests, and
    /// marks comments that follow a member with `<`; both are dropped.
    fn process_comment(&self, comment: &str) -> Option<String> {
        let comment = comment.trim_start().strip_prefix('<').unwrap_or(comment);
        let lines: Vec<&str> = comment.lines().map(str::trim).collect();
        Some(lines.join("\n"))
    }
}

/// Run bindgen and render both generated files, formatted. Returns `(path, contents)` pairs.
fn generate(
    root: &Path,
    include: &Path,
    bindgen_version: &str,
) -> Result<Vec<(&'static str, String)>> {
    let cuda_h = std::fs::read_to_string(include.join("cuda.h"))?;
    let define = format!("#define CUDA_VERSION {EXPECTED_CUDA_VERSION}");
    ensure!(
        cuda_h.lines().any(|l| l.trim() == define),
        "cuda.h does not say `{define}`"
    );

    let clang = bindgen::clang_version();
    eprintln!("codegen: bindgen {bindgen_version}, {}", clang.full);

    let wrapper = include.join("tile_cuda_sys_wrapper.h");
    std::fs::write(
        &wrapper,
        "#include \"cuda.h\"\n#include \"cudaTypedefs.h\"\n",
    )?;

    let codes = Arc::new(Mutex::new(BTreeMap::new()));
    let bindings = base_builder(&wrapper)?
        .clang_arg(format!("-I{}", include.display()))
        .allowlist_type("CU.*")
        .allowlist_type("cu.*")
        // Legacy default stream only: no per-thread (`_ptsz`/`_ptds`) variants.
        .allowlist_type("PFN_cu[A-Za-z0-9]*_v[0-9]+")
        .allowlist_var("CU_.*")
        .allowlist_var("CUDA_.*")
        .generate_comments(true)
        .parse_callbacks(Box::new(ResultCodes(Arc::clone(&codes))))
        .generate()
        .map_err(|e| anyhow::anyhow!("bindgen failed on cuda.h: {e}"))?
        .to_string();

    let stamp = format!(
        "// generated by `cargo xtask codegen` from cuda.h of {WHEEL_NAME} {WHEEL_VERSION} with \
         bindgen {bindgen_version} — do not edit\n"
    );

    let mut out = stamp.clone();
    out.push_str(
        "\n#![allow(\n    non_camel_case_types,\n    non_snake_case,\n    non_upper_case_globals,\n    \
         missing_docs,\n    unsafe_op_in_unsafe_fn,\n    clippy::all,\n    clippy::pedantic,\n    \
         clippy::undocumented_unsafe_blocks,\n    rustdoc::all\n)]\n\n",
    );
    out.push_str(&bindings);
    let compact: String = bindings.split_whitespace().collect();
    if !compact.contains("pubtypeCUresult=") && !compact.contains("asCUresult;") {
        out.push_str("\n/// Error codes returned by every driver API call.\npub type CUresult = cudaError_enum;\n");
    }

    let codes = std::mem::take(&mut *codes.lock().unwrap());
    ensure!(
        codes.get(&0).map(String::as_str) == Some("CUDA_SUCCESS")
            && codes.get(&1).map(String::as_str) == Some("CUDA_ERROR_INVALID_VALUE"),
        "did not find the CUresult constants in cuda.h"
    );
    let mut names = stamp;
    names.push_str(
        "\n/// The name `cuda.h` gives a `CUresult` code, as `cuGetErrorName` would return it\n\
         /// (`1` → `\"CUDA_ERROR_INVALID_VALUE\"`), or `None` for a code it does not define.\n\
         ///\n\
         /// Needs no driver: the table is compiled in from the pinned `cuda.h`.\n\
         pub fn result_name(code: u32) -> Option<&'static str> {\n    Some(match code {\n",
    );
    for (code, name) in &codes {
        writeln!(names, "        {code} => \"{name}\",")?;
    }
    names.push_str("        _ => return None,\n    })\n}\n");

    Ok(vec![
        (BINDINGS_RS, rustfmt(root, &out)?),
        (RESULT_NAMES_RS, rustfmt(root, &names)?),
    ])
}

/// Format `source` with the toolchain's rustfmt, with the configuration `cargo fmt` would use.
fn rustfmt(root: &Path, source: &str) -> Result<String> {
    let rustfmt = std::env::var_os("RUSTFMT").unwrap_or_else(|| "rustfmt".into());
    let mut child = Command::new(rustfmt)
        .args(["--edition", "2024", "--emit", "stdout"])
        .current_dir(root.join("cuda-sys/src"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running rustfmt (install it with `rustup component add rustfmt`)")?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let input = source.to_string();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output()?;
    writer.join().expect("rustfmt writer thread")?;
    ensure!(
        out.status.success(),
        "rustfmt failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `None` when equal, else a one-line summary of where `committed` and `fresh` first differ.
fn diff_summary(committed: &str, fresh: &str) -> Option<String> {
    if committed == fresh {
        return None;
    }
    if committed.is_empty() {
        return Some("missing or empty".to_string());
    }
    let (old, new): (Vec<&str>, Vec<&str>) = (committed.lines().collect(), fresh.lines().collect());
    let first = old
        .iter()
        .zip(&new)
        .position(|(a, b)| a != b)
        .unwrap_or(old.len().min(new.len()));
    let differing =
        old.iter().zip(&new).filter(|(a, b)| a != b).count() + old.len().abs_diff(new.len());
    let show = |lines: &[&str]| {
        lines
            .get(first)
            .map_or("<end of file>".to_string(), |l| format!("{l:?}"))
    };
    Some(format!(
        "{differing} line(s) differ ({} committed, {} generated); first at line {}:\n    committed: {}\n    generated: {}",
        old.len(),
        new.len(),
        first + 1,
        show(&old),
        show(&new)
    ))
}

/// tile-py's bindings of XLA's FFI C API (`xla/ffi/api/c_api.h`), from the pinned `jaxlib` wheel:
/// the version whose handler ABI tile-py's XLA handler is written against.
mod xla_ffi {
    use std::path::Path;

    use anyhow::{Result, ensure};

    use super::{PinnedWheel, base_builder, fetch_pinned, rustfmt, unzip};

    /// The `jaxlib` wheel whose `c_api.h` is bound.
    pub(super) const XLA_WHEEL_NAME: &str = "jaxlib";
    /// Pinned version of [`XLA_WHEEL_NAME`]: the jaxlib tile_py.jax is tested with.
    pub(super) const XLA_WHEEL_VERSION: &str = "0.11.2";
    /// File name pip saves for [`XLA_WHEEL_VERSION`] (CPython 3.12, manylinux 2.27): any build
    /// ships the same header, one is named so that every host downloads the same file.
    const XLA_WHEEL_FILE: &str = "jaxlib-0.11.2-cp312-cp312-manylinux_2_27_x86_64.whl";
    /// SHA-256 of [`XLA_WHEEL_FILE`].
    pub(super) const XLA_WHEEL_SHA256: &str =
        "6338a1f0956f60d02529404ac33a8070015a52635cdb6bbb15d0d199757077bb";
    /// The header inside the wheel.
    const C_API_H: &str = "jaxlib/include/xla/ffi/api/c_api.h";
    /// The API version the pinned header must declare (`XLA_FFI_API_MAJOR`, `_MINOR`).
    const EXPECTED_API: (u32, u32) = (0, 4);
    /// The generated file, relative to the workspace root.
    const XLA_FFI_SYS_RS: &str = "tile-py/src/xla_ffi_sys.rs";

    /// Runs bindgen on the pinned `c_api.h`; returns `(path, contents)`.
    pub(super) fn generate(
        root: &Path,
        cache: &Path,
        bindgen_version: &str,
    ) -> Result<(&'static str, String)> {
        let wheel = fetch_pinned(
            cache,
            &PinnedWheel {
                name: XLA_WHEEL_NAME,
                version: XLA_WHEEL_VERSION,
                select: &[
                    "--platform",
                    "manylinux_2_27_x86_64",
                    "--python-version",
                    "3.12",
                    "--implementation",
                    "cp",
                    "--abi",
                    "cp312",
                ],
                file: XLA_WHEEL_FILE,
                sha256: XLA_WHEEL_SHA256,
            },
        )?;
        let dest = cache.join(format!("{XLA_WHEEL_NAME}-{XLA_WHEEL_VERSION}"));
        unzip(&wheel, &dest, &[C_API_H.to_string()])?;
        let header = dest.join(C_API_H);
        let text = std::fs::read_to_string(&header)?;
        for (name, want) in [
            ("XLA_FFI_API_MAJOR", EXPECTED_API.0),
            ("XLA_FFI_API_MINOR", EXPECTED_API.1),
        ] {
            let define = format!("#define {name} {want}");
            ensure!(
                text.lines().any(|l| l.trim() == define),
                "c_api.h does not say `{define}`"
            );
        }
        let bindings = base_builder(&header)?
            .allowlist_type("XLA_FFI_.*")
            .allowlist_var("XLA_FFI_.*")
            // The `<name>_STRUCT_SIZE` constants are anonymous enums: plain constants.
            .constified_enum(".*_STRUCT_SIZE")
            .generate_comments(false)
            .generate()
            .map_err(|e| anyhow::anyhow!("bindgen failed on c_api.h: {e}"))?
            .to_string();
        let mut out = format!(
            "// generated by `cargo xtask codegen` from {C_API_H} of {XLA_WHEEL_NAME} \
             {XLA_WHEEL_VERSION} with bindgen {bindgen_version} — do not edit\n"
        );
        out.push_str(
            "\n#![allow(\n    non_camel_case_types,\n    non_snake_case,\n    \
             non_upper_case_globals,\n    dead_code,\n    missing_docs,\n    \
             unsafe_op_in_unsafe_fn,\n    clippy::all,\n    clippy::pedantic,\n    \
             clippy::undocumented_unsafe_blocks,\n    rustdoc::all\n)]\n\n",
        );
        out.push_str(&bindings);
        Ok((XLA_FFI_SYS_RS, rustfmt(root, &out)?))
    }
}
