//! Tidy checks that keep the code base honest: every source file explains itself (`//!` first), the
//! domain core (`src/`) never names the actor framework — the dependency points one way — and the
//! runtime (`actors/`) carries nothing of the command line.

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_source_file_opens_with_a_module_doc() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    rust_files(&root().join("actors/src"), &mut files);
    rust_files(&root().join("cli/src"), &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|p| {
            let text = fs::read_to_string(p).unwrap_or_default();
            !text.trim_start().starts_with("//!")
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "files without a leading //! doc: {missing:#?}"
    );
}

#[test]
fn the_core_knows_nothing_about_ractor() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    let offenders: Vec<String> = files
        .iter()
        .filter(|p| fs::read_to_string(p).unwrap_or_default().contains("ractor"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "src/ names ractor: {offenders:#?}");
    let manifest = fs::read_to_string(root().join("Cargo.toml")).unwrap_or_default();
    let core_deps = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap_or_default();
    assert!(
        !core_deps.contains("ractor"),
        "the dsh package depends on ractor"
    );
}

/// The `[dependencies]` table of a manifest, as text.
fn dependencies_of(manifest: &Path) -> String {
    let text = fs::read_to_string(manifest).unwrap_or_default();
    text.split("\n[dependencies]")
        .nth(1)
        .and_then(|s| s.split("\n[").next())
        .unwrap_or_default()
        .to_string()
}

/// An embedder of the runtime compiles no argument parser, config format, capability filesystem or
/// log formatter: those belong to the `dsh` binary's package (`cli/`).
#[test]
fn the_runtime_builds_without_the_command_line() {
    let deps = dependencies_of(&root().join("actors/Cargo.toml"));
    assert!(!deps.is_empty(), "actors/Cargo.toml has no [dependencies]");
    for crate_name in ["clap", "toml", "cap-std", "tracing-subscriber", "dsh-cli"] {
        let named = deps.lines().any(|l| {
            l.trim_start().starts_with(&format!("{crate_name}."))
                || l.trim_start().starts_with(&format!("{crate_name} "))
        });
        assert!(!named, "dsh-actors depends on {crate_name}");
    }
    let mut files = Vec::new();
    rust_files(&root().join("actors/src"), &mut files);
    let offenders: Vec<String> = files
        .iter()
        .filter(|p| {
            fs::read_to_string(p)
                .unwrap_or_default()
                .contains("dsh_cli")
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "actors/src names dsh_cli: {offenders:#?}"
    );
}
