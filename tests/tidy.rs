//! Tidy checks that keep the code base honest: every source file explains itself (`//!` first), the
//! domain core (`src/`) never names the actor framework — the dependency points one way — the
//! runtime (`actors/`) carries nothing of the command line, exports no module, and its modules import
//! each other without a circle.

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

/// `dsh-actors` exports the runtime's API at its root and no module: the agent actor's mailbox
/// (`AgentMsg`) and every other internal stays private.
#[test]
fn the_runtime_exports_no_module() {
    let lib = fs::read_to_string(root().join("actors/src/lib.rs")).unwrap_or_default();
    assert!(
        lib.contains("pub use "),
        "actors/src/lib.rs exports nothing"
    );
    let exported: Vec<&str> = lib
        .lines()
        .filter(|l| l.starts_with("pub mod ") || (l.starts_with("pub use ") && l.contains("msg")))
        .collect();
    assert!(
        exported.is_empty(),
        "actors/src/lib.rs exports internals: {exported:#?}"
    );
}

/// The module of a file under `actors/src`, as a path: `host`, `agent`, `agent::msg`.
fn actor_module(file: &Path) -> String {
    let relative = file
        .strip_prefix(root().join("actors/src"))
        .unwrap_or(file)
        .with_extension("");
    let parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|p| p != "mod")
        .collect();
    parts.join("::")
}

/// The modules `text` (the source of `module`) names through `crate::` or `self::` paths, mapped to
/// the longest known module each path starts with.
fn named_modules(module: &str, text: &str, modules: &[String]) -> Vec<String> {
    let mut named = Vec::new();
    for (prefix, base) in [
        ("crate::", String::new()),
        ("self::", format!("{module}::")),
    ] {
        for (at, _) in text.match_indices(prefix) {
            let path: String = text[at + prefix.len()..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let full = format!("{base}{path}");
            let target = modules
                .iter()
                .filter(|m| full == **m || full.starts_with(&format!("{m}::")))
                .max_by_key(|m| m.len());
            if let Some(target) = target
                && target != module
                && !named.contains(target)
            {
                named.push(target.clone());
            }
        }
    }
    named
}

/// The runtime's modules import each other one way (host → agent → children; handle → slot; every
/// layer → error, observe, runtime), so each can be read, and changed, without the ones above it.
#[test]
fn the_runtime_modules_import_no_circle() {
    let mut files = Vec::new();
    rust_files(&root().join("actors/src"), &mut files);
    let modules: Vec<String> = files
        .iter()
        .map(|f| actor_module(f))
        .filter(|m| m != "lib")
        .collect();
    let edges: Vec<(String, Vec<String>)> = files
        .iter()
        .filter(|f| actor_module(f) != "lib")
        .map(|f| {
            let module = actor_module(f);
            let text = fs::read_to_string(f).unwrap_or_default();
            let named = named_modules(&module, &text, &modules);
            (module, named)
        })
        .collect();
    assert!(edges.len() > 5, "found only {} modules", edges.len());
    // Depth-first search from every module; a module met again on the current path closes a circle.
    fn visit(
        module: &str,
        edges: &[(String, Vec<String>)],
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut circle = path[at..].to_vec();
            circle.push(module.to_string());
            return Some(circle);
        }
        if done.iter().any(|m| m == module) {
            return None;
        }
        path.push(module.to_string());
        let next = edges
            .iter()
            .find(|(m, _)| m == module)
            .map(|(_, n)| n.clone())
            .unwrap_or_default();
        for n in next {
            if let Some(circle) = visit(&n, edges, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.push(module.to_string());
        None
    }
    let mut done = Vec::new();
    for (module, _) in &edges {
        let circle = visit(module, &edges, &mut Vec::new(), &mut done);
        assert_eq!(
            circle, None,
            "actors/src modules import each other in a circle"
        );
    }
}

/// The production part of a source file: everything before its inline `#[cfg(test)] mod tests`.
fn production_part(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find("#[cfg(test)]") {
        let at = from + at;
        let rest = text[at + "#[cfg(test)]".len()..].trim_start();
        if rest.starts_with("mod tests {") {
            return &text[..at];
        }
        from = at + 1;
    }
    text
}

/// The pure modules: `turn` (its tests aside), `inbox`, the tool schedule, the stream assembler and
/// the retry policy.
fn pure_modules() -> Vec<PathBuf> {
    let mut files = Vec::new();
    rust_files(&root().join("src/turn"), &mut files);
    files.retain(|p| !p.ends_with("src/turn/tests.rs"));
    for file in [
        "src/inbox.rs",
        "src/tools/schedule.rs",
        "src/llm/assembler.rs",
        "src/llm/retry.rs",
    ] {
        files.push(root().join(file));
    }
    files
}

/// Ids and time enter the pure modules as arguments (`now`, the `Wiring`'s `MessageIds`, the
/// `RequestErrorCtx`'s `new_retry_id`): they name no async runtime, mint no id and read no clock.
#[test]
fn the_pure_modules_take_ids_and_time_as_arguments() {
    const FORBIDDEN: [&str; 6] = [
        "tokio",
        "uuid",
        "SystemTime",
        "Instant::now",
        "::mint(",
        "mint_retry_id(",
    ];
    let files = pure_modules();
    assert!(files.len() >= 8, "found only {} files", files.len());
    let mut offenders = Vec::new();
    for path in &files {
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let relative = path.strip_prefix(root()).unwrap_or(path);
        for word in FORBIDDEN {
            if production_part(&text).contains(word) {
                offenders.push(format!("{}: {word}", relative.display()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "pure modules name a runtime, an id source or a clock: {offenders:#?}"
    );
}

/// The agent actor and its children only carry out what the core decided: every tool error result
/// and every failure of an attempt is built in `dsh` (`ToolOutput::aborted` and its siblings, the
/// turn machine), never in the actor shell.
#[test]
fn the_actor_shell_builds_no_tool_error_or_llm_failure() {
    let mut files = Vec::new();
    rust_files(&root().join("actors/src"), &mut files);
    assert!(files.len() > 5, "found only {} files", files.len());
    let offenders: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let text = fs::read_to_string(p).unwrap_or_default();
            let found: Vec<&str> = ["ToolErrorInfo", "LlmFailure", "ToolOutput::error("]
                .into_iter()
                .filter(|word| production_part(&text).contains(word))
                .collect();
            (!found.is_empty()).then(|| format!("{}: {found:?}", p.display()))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "the actor shell builds tool errors or failures: {offenders:#?}"
    );
}
