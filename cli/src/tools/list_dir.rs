//! `list_dir`: the entries of one directory under the working directory.
//!
//! The path resolves through the root's capability handle (see `tools`). Entries are sorted by name,
//! directories marked with a trailing `/` and symlinks with `@` (never followed: a listing must not
//! reveal what a link outside the root points at), files with their size. At most `ENTRIES_MAX` are
//! shown and at most `ENTRIES_SCAN_MAX` read, so a huge directory costs bounded memory.

use std::sync::Arc;

use async_trait::async_trait;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::tools::{Root, ToolFailure, args_object, blocking, no_other_keys, opt_str};

/// Entries shown by one call.
pub const ENTRIES_MAX: usize = 1_000;
/// Entries read from the directory at most (the listing says when there were more).
pub const ENTRIES_SCAN_MAX: usize = 10_000;

const NAME: &str = "list_dir";

/// Lists a directory under the working directory.
#[derive(Debug)]
pub struct ListDirTool {
    root: Arc<Root>,
}

impl ListDirTool {
    /// The tool over `root`.
    pub fn new(root: Arc<Root>) -> ListDirTool {
        ListDirTool { root }
    }
}

/// One entry as shown.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    name: String,
    shown: String,
}

struct Listing {
    entries: Vec<Entry>,
    /// Whether the directory held more than `ENTRIES_SCAN_MAX` entries.
    truncated_scan: bool,
}

fn list(root: &Root, requested: &str) -> Result<Listing, ToolFailure> {
    let rel = root.relative(requested)?;
    let io = |e: std::io::Error| ToolFailure::io(requested, &e);
    let meta = root.dir.metadata(&rel).map_err(io)?;
    if !meta.is_dir() {
        return Err(ToolFailure::new(
            "NOT_A_DIRECTORY",
            format!("{requested}: is not a directory (use read_file)"),
        ));
    }
    let mut entries = Vec::new();
    let mut truncated_scan = false;
    for entry in root.dir.read_dir(&rel).map_err(io)? {
        if entries.len() == ENTRIES_SCAN_MAX {
            truncated_scan = true;
            break;
        }
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let file_type = entry.file_type().map_err(io)?;
        let shown = if file_type.is_symlink() {
            format!("{name}@")
        } else if file_type.is_dir() {
            format!("{name}/")
        } else {
            match entry.metadata() {
                Ok(m) => format!("{name}  ({} bytes)", m.len()),
                Err(_) => name.clone(),
            }
        };
        entries.push(Entry { name, shown });
    }
    entries.sort();
    Ok(Listing {
        entries,
        truncated_scan,
    })
}

#[async_trait]
impl Tool for ListDirTool {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "List a directory under the working directory (default: the working directory itself). \
         Directories end in `/`, symlinks in `@`; files show their size."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory path, relative to the working directory (default \".\")"}
            },
            "additionalProperties": false
        })
    }

    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Parallel
    }

    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        let requested = match args_object(&call.arguments).and_then(|map| {
            no_other_keys(map, &["path"])?;
            Ok(opt_str(map, "path")?.unwrap_or(".").to_string())
        }) {
            Ok(p) => p,
            Err(f) => return f.into_output(NAME),
        };
        let root = Arc::clone(&self.root);
        let shown_path = requested.clone();
        let listed = blocking(&cancel, move || list(&root, &requested)).await;
        match listed {
            Err(f) => f.into_output(NAME),
            Ok(listing) => render(&shown_path, listing),
        }
    }
}

fn render(path: &str, listing: Listing) -> ToolOutput {
    let n_entries = listing.entries.len();
    let mut text = String::new();
    for entry in listing.entries.iter().take(ENTRIES_MAX) {
        text.push_str(&entry.shown);
        text.push('\n');
    }
    if n_entries == 0 {
        text.push_str("[empty directory]");
    } else if listing.truncated_scan {
        text.push_str(&format!(
            "[showing {} of more than {ENTRIES_SCAN_MAX} entries]",
            n_entries.min(ENTRIES_MAX)
        ));
    } else if n_entries > ENTRIES_MAX {
        text.push_str(&format!("[showing {ENTRIES_MAX} of {n_entries} entries]"));
    }
    let mut out = ToolOutput::text(text);
    out.meta = Some(json!({"path": path, "entries": n_entries, "more": listing.truncated_scan}));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::{assert_outside_root, text_of};

    fn call(args: Value) -> ToolInvocation {
        crate::tools::test_support::call(NAME, args)
    }

    #[tokio::test]
    async fn lists_sorted_and_marks_kinds() {
        let outside = tempfile::tempdir().expect("tempdir");
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        std::fs::write(root.join("b.txt"), "12345").expect("write");
        std::fs::create_dir(root.join("a")).expect("mkdir");
        std::fs::create_dir(root.join("empty")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), root.join("c-out")).expect("symlink");
        let tool = ListDirTool::new(Arc::new(Root::open(root).expect("root")));
        let out = tool
            .execute(call(json!({})), CancellationToken::new())
            .await;
        assert!(!out.is_error);
        assert_eq!(text_of(&out), "a/\nb.txt  (5 bytes)\nc-out@\nempty/\n");
        assert_eq!(
            out.meta,
            Some(json!({"path": ".", "entries": 4, "more": false}))
        );
        let out = tool
            .execute(call(json!({"path": "empty"})), CancellationToken::new())
            .await;
        assert_eq!(text_of(&out), "[empty directory]");
        let out = tool
            .execute(call(json!({"path": "b.txt"})), CancellationToken::new())
            .await;
        assert_eq!(
            out.error.as_ref().map(|e| e.code.as_str()),
            Some("NOT_A_DIRECTORY")
        );
    }

    /// `..`, absolute paths and a symlink to a directory outside all fail with OUTSIDE_ROOT.
    #[tokio::test]
    async fn every_escape_fails() {
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret.txt"), "x").expect("write");
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(tmp.path().join("sub")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("out")).expect("symlink");
        let tool = ListDirTool::new(Arc::new(Root::open(tmp.path()).expect("root")));
        let outside_abs = outside.path().to_str().expect("utf-8").to_string();
        for path in [
            "..",
            "sub/../..",
            "/",
            "/etc",
            outside_abs.as_str(),
            "out",
            "out/",
        ] {
            let out = tool
                .execute(call(json!({"path": path})), CancellationToken::new())
                .await;
            assert_outside_root(&out, path, "secret");
        }
    }

    #[tokio::test]
    async fn long_listings_are_bounded() {
        let tmp = tempfile::tempdir().expect("tempdir");
        for i in 0..(ENTRIES_MAX + 5) {
            std::fs::write(tmp.path().join(format!("f{i:05}")), "").expect("write");
        }
        let tool = ListDirTool::new(Arc::new(Root::open(tmp.path()).expect("root")));
        let out = tool
            .execute(call(json!({})), CancellationToken::new())
            .await;
        let text = text_of(&out);
        assert_eq!(text.lines().count(), ENTRIES_MAX + 1);
        assert!(text.starts_with("f00000  (0 bytes)\n"));
        assert!(text.ends_with("[showing 1000 of 1005 entries]"));
    }
}
