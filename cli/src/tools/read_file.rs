//! `read_file`: a window of lines of one text file under the working directory.
//!
//! The path resolves through the root's capability handle (see `tools`), so nothing outside the
//! working directory can be read. Output is bounded three ways — lines per call, bytes per line, bytes
//! per call — and says how to read on when it stops early, so a model can page through any file
//! without ever pulling it whole into memory or into the log.

use std::io::{BufRead, BufReader};
use std::sync::Arc;

use async_trait::async_trait;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use cap_std::fs::{OpenOptions, OpenOptionsExt};
use rustix::fs::OFlags;

use crate::tools::{Root, ToolFailure, args_object, blocking, no_other_keys, opt_str, opt_u64};

/// Lines returned when the call names no `limit`, and the most it may name.
pub const LINES_MAX: u64 = 2_000;
/// Bytes of one line shown; the rest of the line is replaced by a marker.
pub const LINE_BYTES_MAX: usize = 2_000;
/// Bytes of file text returned by one call (line numbers not counted).
pub const OUTPUT_BYTES_MAX: usize = 64 << 10;
/// Bytes inspected for a NUL to tell a binary file from text.
const SNIFF_BYTES: usize = 8 << 10;

const NAME: &str = "read_file";

/// Reads a window of lines of a text file under the working directory.
#[derive(Debug)]
pub struct ReadFileTool {
    root: Arc<Root>,
}

impl ReadFileTool {
    /// The tool over `root`.
    pub fn new(root: Arc<Root>) -> ReadFileTool {
        ReadFileTool { root }
    }
}

/// What one call asked for.
struct Request {
    path: String,
    /// 1-based first line.
    offset: u64,
    limit: u64,
}

fn parse(args: &ToolArgs) -> Result<Request, ToolFailure> {
    let map = args_object(args)?;
    no_other_keys(map, &["path", "offset", "limit"])?;
    let path = opt_str(map, "path")?
        .ok_or_else(|| ToolFailure::new("INVALID_ARGUMENTS", "`path` is required"))?
        .to_string();
    let offset = opt_u64(map, "offset")?.unwrap_or(1).max(1);
    let limit = opt_u64(map, "limit")?.unwrap_or(LINES_MAX);
    if limit == 0 || limit > LINES_MAX {
        return Err(ToolFailure::new(
            "INVALID_ARGUMENTS",
            format!("`limit` is {limit}, it must be within 1..={LINES_MAX}"),
        ));
    }
    Ok(Request {
        path,
        offset,
        limit,
    })
}

/// What the window held.
#[derive(Debug, PartialEq, Eq)]
struct Window {
    text: String,
    /// Line numbers shown (1-based, inclusive); `None` when the file has no line at `offset`.
    shown: Option<(u64, u64)>,
    /// Whether lines follow the window.
    more: bool,
}

fn read_window(root: &Root, req: &Request) -> Result<Window, ToolFailure> {
    let rel = root.relative(&req.path)?;
    let meta = root
        .dir
        .metadata(&rel)
        .map_err(|e| ToolFailure::io(&req.path, &e))?;
    if meta.is_dir() {
        return Err(ToolFailure::new(
            "IS_DIRECTORY",
            format!("{}: is a directory (use list_dir)", req.path),
        ));
    }
    // Non-blocking, so opening a FIFO returns at once instead of waiting for a writer; only a
    // regular file (checked on the opened handle, so nothing can be swapped in between) is read.
    let mut options = OpenOptions::new();
    options
        .read(true)
        .custom_flags((OFlags::NONBLOCK | OFlags::NOCTTY).bits() as i32);
    let file = root
        .dir
        .open_with(&rel, &options)
        .map_err(|e| ToolFailure::io(&req.path, &e))?;
    let kind = file
        .metadata()
        .map_err(|e| ToolFailure::io(&req.path, &e))?
        .file_type();
    if !kind.is_file() {
        return Err(ToolFailure::new(
            "NOT_A_FILE",
            format!(
                "{}: is not a regular file (a FIFO, socket or device); only regular files are read",
                req.path
            ),
        ));
    }
    let mut reader = BufReader::with_capacity(SNIFF_BYTES, file);
    let head = reader
        .fill_buf()
        .map_err(|e| ToolFailure::io(&req.path, &e))?;
    if memchr::memchr(0, head).is_some() {
        return Err(ToolFailure::new(
            "BINARY_FILE",
            format!(
                "{}: looks like a binary file (it contains NUL bytes)",
                req.path
            ),
        ));
    }
    window(&mut reader, req).map_err(|e| ToolFailure::io(&req.path, &e))
}

/// Reads the requested window from `input`, holding at most one bounded line at a time.
fn window(input: &mut impl BufRead, req: &Request) -> std::io::Result<Window> {
    let mut text = String::new();
    let mut line = Vec::new();
    let mut line_no = 0u64;
    let mut first = None;
    let mut last = 0u64;
    let last_wanted = req.offset.saturating_add(req.limit - 1);
    loop {
        let Some(cut) = read_bounded_line(input, &mut line)? else {
            return Ok(Window {
                text,
                shown: first.map(|f| (f, last)),
                more: false,
            });
        };
        line_no += 1;
        if line_no < req.offset {
            continue;
        }
        if line_no > last_wanted {
            break;
        }
        let shown = String::from_utf8_lossy(&line);
        let entry = if cut {
            format!("{line_no:>6}\t{shown}… [line cut at {LINE_BYTES_MAX} bytes]\n")
        } else {
            format!("{line_no:>6}\t{shown}\n")
        };
        if text.len() + entry.len() > OUTPUT_BYTES_MAX && first.is_some() {
            break;
        }
        text.push_str(&entry);
        first.get_or_insert(line_no);
        last = line_no;
    }
    Ok(Window {
        text,
        shown: first.map(|f| (f, last)),
        more: true,
    })
}

/// Reads one line (without its `\n`) into `buf`, keeping at most `LINE_BYTES_MAX` bytes. Returns
/// `None` at the end of input, else whether the line was cut.
fn read_bounded_line(input: &mut impl BufRead, buf: &mut Vec<u8>) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut n_bytes = 0usize;
    loop {
        let available = match input.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok((n_bytes > 0).then_some(n_bytes > LINE_BYTES_MAX));
        }
        let newline = memchr::memchr(b'\n', available);
        let take = newline.unwrap_or(available.len());
        let room = LINE_BYTES_MAX.saturating_sub(buf.len());
        buf.extend_from_slice(&available[..take.min(room)]);
        n_bytes = n_bytes.saturating_add(take);
        input.consume(take + usize::from(newline.is_some()));
        if newline.is_some() {
            if buf.last() == Some(&b'\r') && n_bytes <= LINE_BYTES_MAX {
                buf.pop();
            }
            return Ok(Some(n_bytes > LINE_BYTES_MAX));
        }
    }
}

#[async_trait]
impl Tool for ReadFileTool {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "Read a text file under the working directory. Returns numbered lines (at most 2000 per \
         call, 64 KiB in all); use `offset` (1-based line) and `limit` to page through long files."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the working directory"},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based, default 1)"},
                "limit": {"type": "integer", "minimum": 1, "maximum": LINES_MAX, "description": "Lines to return (default 2000)"}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Parallel
    }

    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        let req = match parse(&call.arguments) {
            Ok(r) => r,
            Err(f) => return f.into_output(NAME),
        };
        let root = Arc::clone(&self.root);
        let path = req.path.clone();
        let offset = req.offset;
        match blocking(&cancel, move || read_window(&root, &req)).await {
            Err(f) => f.into_output(NAME),
            Ok(w) => render(&path, offset, w),
        }
    }
}

fn render(path: &str, offset: u64, w: Window) -> ToolOutput {
    let (text, meta) = match w.shown {
        None => (
            format!("[{path}: no line {offset} (the file is shorter)]"),
            json!({"path": path, "lines": 0}),
        ),
        Some((first, last)) => {
            let mut text = w.text;
            if w.more {
                text.push_str(&format!(
                    "[showing lines {first}-{last}; more follow: call again with offset {}]",
                    last + 1
                ));
            }
            let meta =
                json!({"path": path, "first_line": first, "last_line": last, "more": w.more});
            (text, meta)
        }
    };
    let mut out = ToolOutput::text(text);
    out.meta = Some(meta);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::{assert_outside_root, text_of};

    fn call(args: Value) -> ToolInvocation {
        crate::tools::test_support::call(NAME, args)
    }

    fn setup() -> (tempfile::TempDir, tempfile::TempDir, ReadFileTool) {
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("secret.txt"), "top secret\n").expect("write");
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path();
        std::fs::write(root.join("a.txt"), "one\ntwo\r\nthree\n").expect("write");
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        std::fs::write(root.join("sub/b.txt"), "bee").expect("write");
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("link-out"))
            .expect("symlink");
        std::os::unix::fs::symlink(outside.path(), root.join("dir-out")).expect("symlink");
        std::os::unix::fs::symlink("sub/b.txt", root.join("link-in")).expect("symlink");
        let tool = ReadFileTool::new(Arc::new(Root::open(root).expect("root")));
        (tmp, outside, tool)
    }

    async fn run(tool: &ReadFileTool, args: Value) -> ToolOutput {
        tool.execute(call(args), CancellationToken::new()).await
    }

    #[tokio::test]
    async fn reads_numbered_lines_and_pages() {
        let (_tmp, _out, tool) = setup();
        let out = run(&tool, json!({"path": "a.txt"})).await;
        assert!(!out.is_error);
        assert_eq!(text_of(&out), "     1\tone\n     2\ttwo\n     3\tthree\n");
        let out = run(&tool, json!({"path": "a.txt", "offset": 2, "limit": 1})).await;
        assert_eq!(
            text_of(&out),
            "     2\ttwo\n[showing lines 2-2; more follow: call again with offset 3]"
        );
        assert_eq!(
            out.meta,
            Some(json!({"path": "a.txt", "first_line": 2, "last_line": 2, "more": true}))
        );
        let out = run(&tool, json!({"path": "a.txt", "offset": 9})).await;
        assert_eq!(text_of(&out), "[a.txt: no line 9 (the file is shorter)]");
        let out = run(&tool, json!({"path": "sub/b.txt"})).await;
        assert_eq!(text_of(&out), "     1\tbee\n");
        let out = run(&tool, json!({"path": "link-in"})).await;
        assert_eq!(
            text_of(&out),
            "     1\tbee\n",
            "a symlink inside the root is followed"
        );
    }

    /// Each way out of the root fails with OUTSIDE_ROOT and reveals nothing.
    #[tokio::test]
    async fn every_escape_fails() {
        let (tmp, outside, tool) = setup();
        let secret = outside.path().join("secret.txt");
        let rel_up = format!(
            "../{}/secret.txt",
            outside
                .path()
                .file_name()
                .and_then(|n| n.to_str())
                .expect("name")
        );
        let sneaky = format!(
            "{}/../x",
            tmp.path().canonicalize().expect("canon").display()
        );
        for path in [
            rel_up.as_str(),
            "sub/../../etc/passwd",
            "/etc/passwd",
            secret.to_str().expect("utf-8"),
            "link-out",
            "dir-out/secret.txt",
            sneaky.as_str(),
        ] {
            let out = run(&tool, json!({"path": path})).await;
            assert_outside_root(&out, path, "top secret");
        }
        assert_eq!(
            std::fs::read_to_string(&secret).expect("read"),
            "top secret\n"
        );
    }

    #[tokio::test]
    async fn bad_arguments_and_odd_files_are_error_results() {
        let (tmp, _out, tool) = setup();
        std::fs::write(tmp.path().join("bin"), b"ab\0cd").expect("write");
        let cases = [
            (json!({}), "INVALID_ARGUMENTS", "Error: `path` is required"),
            (
                json!({"path": 3}),
                "INVALID_ARGUMENTS",
                "Error: `path` must be a string, got a number",
            ),
            (
                json!({"path": "a.txt", "limit": 0}),
                "INVALID_ARGUMENTS",
                "Error: `limit` is 0, it must be within 1..=2000",
            ),
            (
                json!({"path": "a.txt", "pth": 1}),
                "INVALID_ARGUMENTS",
                "Error: unknown argument `pth` (expected path, offset, limit)",
            ),
            (json!({"path": "nope"}), "NOT_FOUND", ""),
            (
                json!({"path": "sub"}),
                "IS_DIRECTORY",
                "Error: sub: is a directory (use list_dir)",
            ),
            (
                json!({"path": "bin"}),
                "BINARY_FILE",
                "Error: bin: looks like a binary file (it contains NUL bytes)",
            ),
        ];
        for (args, code, text) in cases {
            let out = run(&tool, args.clone()).await;
            assert!(out.is_error, "{args}");
            assert_eq!(
                out.error.as_ref().map(|e| e.code.as_str()),
                Some(code),
                "{args}"
            );
            if !text.is_empty() {
                assert_eq!(text_of(&out), text);
            }
        }
        let raw = tool
            .execute(
                ToolInvocation {
                    arguments: ToolArgs::Raw("{oops".into()),
                    ..call(json!({}))
                },
                CancellationToken::new(),
            )
            .await;
        assert_eq!(text_of(&raw), "Error: arguments are not valid JSON");
    }

    #[tokio::test]
    async fn output_is_bounded() {
        let (tmp, _out, tool) = setup();
        let long_line = "x".repeat(LINE_BYTES_MAX * 3);
        std::fs::write(tmp.path().join("long.txt"), format!("{long_line}\nshort\n"))
            .expect("write");
        let out = run(&tool, json!({"path": "long.txt"})).await;
        let text = text_of(&out);
        assert!(text.starts_with(&format!(
            "     1\t{}… [line cut at 2000 bytes]\n",
            "x".repeat(LINE_BYTES_MAX)
        )));
        assert!(text.ends_with("     2\tshort\n"));
        // Many lines: the byte bound stops the window before LINES_MAX and says where to go on.
        let many: String = (0..3_000).map(|i| format!("{i:0>100}\n")).collect();
        std::fs::write(tmp.path().join("many.txt"), many).expect("write");
        let out = run(&tool, json!({"path": "many.txt"})).await;
        let text = text_of(&out);
        let body = text.rsplit_once('[').map(|(b, _)| b).unwrap_or("");
        assert!(body.len() <= OUTPUT_BYTES_MAX, "{} bytes", body.len());
        let meta = out.meta.expect("read_file always sets meta");
        let last = meta["last_line"].as_u64().expect("last_line");
        assert!(last < LINES_MAX && last > 500, "last line {last}");
        assert!(text.ends_with(&format!(
            "more follow: call again with offset {}]",
            last + 1
        )));
    }
}
