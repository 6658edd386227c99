//! The built-in tools `dsh chat` and `dsh run` give the model: `read_file` and `list_dir`, which see
//! only the working directory, and `shell`, which runs `sh -c` there and is off unless enabled.
//!
//! The core (`dsh`) stays I/O-free, so the tools live here, beside the binary. What must stay true:
//! a file tool never reads outside its root. Both resolve every path through one capability handle
//! (`cap_std::fs::Dir`) opened on the root, so `..`, absolute paths and symlinks that lead out fail
//! inside the kernel-backed resolver rather than in a string check we could get wrong. An absolute path
//! that lies lexically under the root is accepted by stripping the root prefix and resolving the rest
//! through the same handle. Every output is bounded; every failure is an error result the model sees.
//!
//! `read_file` and `list_dir` only read, so their calls run in parallel; `shell` may change anything
//! and is exclusive.

mod list_dir;
mod read_file;
mod shell;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use dsh::session::event::ToolErrorInfo;
use dsh::tools::{ToolArgs, ToolOutput, ToolRegistry};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use list_dir::ListDirTool;
pub use read_file::ReadFileTool;
pub use shell::{ShellConfig, ShellTool};

/// Why the built-in tools could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolsError {
    #[error("cannot open the working directory {path}: {cause}")]
    /// The working directory could not be opened.
    Root {
        /// The directory.
        path: PathBuf,
        /// The operating system's reason.
        cause: String,
    },
}

/// The working directory as the file tools see it: a capability handle plus the root's canonical
/// path (only used to accept absolute paths that point inside it).
#[derive(Debug)]
pub struct Root {
    dir: Dir,
    /// Invariant: canonical (absolute, no symlinks), so a lexical prefix test against it is exact.
    path: PathBuf,
}

impl Root {
    /// Opens `path` as the root every file tool resolves through.
    ///
    /// # Errors
    /// `ToolsError::Root` when the directory cannot be opened.
    pub fn open(path: &Path) -> Result<Root, ToolsError> {
        let root_err = |e: std::io::Error| ToolsError::Root {
            path: path.to_path_buf(),
            cause: e.to_string(),
        };
        let canonical = std::fs::canonicalize(path).map_err(root_err)?;
        let dir = Dir::open_ambient_dir(&canonical, ambient_authority()).map_err(root_err)?;
        Ok(Root {
            dir,
            path: canonical,
        })
    }

    /// The canonical path of the root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path relative to the root that `dir` should resolve: relative paths as given, absolute paths
    /// only when they lie under the root (the rest of the check is the handle's).
    fn relative(&self, requested: &str) -> Result<PathBuf, ToolFailure> {
        if requested.is_empty() {
            return Ok(PathBuf::from("."));
        }
        let p = Path::new(requested);
        if !p.is_absolute() {
            return Ok(p.to_path_buf());
        }
        // A lexical strip: `..` components left in the remainder are still refused by the handle.
        match p.strip_prefix(&self.path) {
            Ok(rest) if rest.as_os_str().is_empty() => Ok(PathBuf::from(".")),
            Ok(rest) => Ok(rest.to_path_buf()),
            Err(_) => Err(ToolFailure::outside(requested)),
        }
    }
}

/// The built-in tools for a working directory: `read_file` and `list_dir` always, `shell` when
/// `shell` is given.
///
/// # Errors
/// `ToolsError::Root` when the working directory cannot be opened.
pub fn builtin(cwd: &Path, shell: Option<ShellConfig>) -> Result<ToolRegistry, ToolsError> {
    let root = Arc::new(Root::open(cwd)?);
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(ReadFileTool::new(Arc::clone(&root))));
    tools.register(Arc::new(ListDirTool::new(Arc::clone(&root))));
    if let Some(config) = shell {
        tools.register(Arc::new(ShellTool::new(root.path().to_path_buf(), config)));
    }
    Ok(tools)
}

/// A tool failure: the model sees `Error: <message>`, the log records `{name, code}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolFailure {
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl ToolFailure {
    pub(crate) fn new(code: &'static str, message: impl Into<String>) -> ToolFailure {
        ToolFailure {
            code,
            message: message.into(),
        }
    }

    fn outside(requested: &str) -> ToolFailure {
        ToolFailure::new(
            "OUTSIDE_ROOT",
            format!("{requested}: the path leads outside the working directory"),
        )
    }

    /// Maps an I/O error on `requested`, recognising cap-std's refusal of an escaping path.
    pub(crate) fn io(requested: &str, e: &std::io::Error) -> ToolFailure {
        // cap-primitives reports every escape (`..`, an absolute symlink target, a symlink leading
        // out) as PermissionDenied with this text; a real permission problem has the OS's text.
        if e.kind() == std::io::ErrorKind::PermissionDenied
            && e.to_string().contains("outside of the filesystem")
        {
            return ToolFailure::outside(requested);
        }
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => "NOT_FOUND",
            std::io::ErrorKind::PermissionDenied => "PERMISSION_DENIED",
            _ => "IO",
        };
        ToolFailure::new(code, format!("{requested}: {e}"))
    }

    pub(crate) fn into_output(self, tool: &str) -> ToolOutput {
        ToolOutput::error(
            &self.message,
            Some(ToolErrorInfo {
                name: tool.to_string(),
                code: self.code.to_string(),
            }),
        )
    }
}

/// The arguments object of a call, or the failure the model should see.
pub(crate) fn args_object(args: &ToolArgs) -> Result<&serde_json::Map<String, Value>, ToolFailure> {
    match args {
        ToolArgs::Json(Value::Object(map)) => Ok(map),
        ToolArgs::Json(other) => Err(ToolFailure::new(
            "INVALID_ARGUMENTS",
            format!("arguments must be a JSON object, got {}", json_kind(other)),
        )),
        ToolArgs::Raw(_) => Err(ToolFailure::new(
            "INVALID_ARGUMENTS",
            "arguments are not valid JSON",
        )),
    }
}

/// A string argument; `None` when absent or null.
pub(crate) fn opt_str<'a>(
    map: &'a serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, ToolFailure> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(ToolFailure::new(
            "INVALID_ARGUMENTS",
            format!("`{key}` must be a string, got {}", json_kind(other)),
        )),
    }
}

/// A non-negative integer argument; `None` when absent or null.
pub(crate) fn opt_u64(
    map: &serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<u64>, ToolFailure> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64()),
        Some(other) => Err(ToolFailure::new(
            "INVALID_ARGUMENTS",
            format!(
                "`{key}` must be a non-negative integer, got {}",
                json_kind(other)
            ),
        )),
    }
}

/// Refuses keys the schema does not declare, so a typo is not silently ignored.
pub(crate) fn no_other_keys(
    map: &serde_json::Map<String, Value>,
    known: &[&str],
) -> Result<(), ToolFailure> {
    match map.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(ToolFailure::new(
            "INVALID_ARGUMENTS",
            format!("unknown argument `{k}` (expected {})", known.join(", ")),
        )),
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Runs blocking file work on tokio's blocking pool and waits for it, unless the call is cancelled
/// first: then the call ends at once with `CANCELLED` and the work is left to finish on its own (it
/// can no longer hold up the turn, and `dsh` does not wait for it at exit).
pub(crate) async fn blocking<T: Send + 'static>(
    cancel: &CancellationToken,
    work: impl FnOnce() -> Result<T, ToolFailure> + Send + 'static,
) -> Result<T, ToolFailure> {
    let task = tokio::task::spawn_blocking(work);
    tokio::select! {
        joined = task => match joined {
            Ok(result) => result,
            Err(e) => Err(ToolFailure::new("IO", format!("the file operation failed: {e}"))),
        },
        () = cancel.cancelled() => Err(ToolFailure::new("CANCELLED", "the call was cancelled")),
    }
}

/// `s` cut to at most `bytes_max` bytes on a character boundary.
pub(crate) fn cut_utf8(s: &str, bytes_max: usize) -> &str {
    if s.len() <= bytes_max {
        return s;
    }
    let mut end = bytes_max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_inside_the_root_are_made_relative() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = Root::open(tmp.path()).expect("open root");
        let inside = root.path().join("a/b.txt");
        assert_eq!(
            root.relative(inside.to_str().expect("utf-8 path")),
            Ok(PathBuf::from("a/b.txt"))
        );
        assert_eq!(
            root.relative(root.path().to_str().expect("utf-8 path")),
            Ok(PathBuf::from("."))
        );
        assert_eq!(root.relative(""), Ok(PathBuf::from(".")));
        assert_eq!(
            root.relative("/etc/passwd").map_err(|f| f.code),
            Err("OUTSIDE_ROOT")
        );
    }

    /// A file operation that never returns (a read of a FIFO on the old code) cannot hold up a
    /// cancelled call.
    #[tokio::test]
    async fn cancellation_ends_a_blocked_file_operation() {
        let cancel = CancellationToken::new();
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let call = blocking(&cancel, move || {
            let _ = blocked.recv();
            Ok(())
        });
        cancel.cancel();
        assert_eq!(call.await.map_err(|f| f.code), Err("CANCELLED"));
        drop(release);
    }

    #[test]
    fn cut_utf8_never_splits_a_character() {
        assert_eq!(cut_utf8("héllo", 2), "h");
        assert_eq!(cut_utf8("héllo", 3), "hé");
        assert_eq!(cut_utf8("abc", 10), "abc");
    }
}

/// Helpers shared by the built-in tools' unit tests.
#[cfg(test)]
mod test_support {
    use dsh::SessionId;
    use dsh::llm::types::ContentBlock;
    use dsh::tools::{ToolArgs, ToolInvocation, ToolOutput};
    use serde_json::Value;

    /// A call of tool `name` with `args`, as the pool would hand it over.
    pub(super) fn call(name: &str, args: Value) -> ToolInvocation {
        ToolInvocation {
            session_id: SessionId::new("t").expect("valid id"),
            turn: 1,
            step: 1,
            call_id: "c1".into(),
            name: name.into(),
            arguments: ToolArgs::Json(args),
        }
    }

    /// The output's text blocks joined (other blocks in their debug form).
    pub(super) fn text_of(out: &ToolOutput) -> String {
        out.content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => text.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    /// Asserts that asking for `path` was refused as `OUTSIDE_ROOT` without showing `secret`.
    #[track_caller]
    pub(super) fn assert_outside_root(out: &ToolOutput, path: &str, secret: &str) {
        assert!(out.is_error, "{path}: {}", text_of(out));
        assert_eq!(
            out.error.as_ref().map(|e| e.code.as_str()),
            Some("OUTSIDE_ROOT"),
            "{path}: {}",
            text_of(out)
        );
        assert!(!text_of(out).contains(secret), "{path}");
    }
}
