//! Finding the real MCP servers the tests run against, and small helpers around them.
//!
//! The servers are installed by `mcp/tests/install-servers.sh` into `<project>/.mcp-servers/`
//! (`DSH_MCP_SERVERS_DIR` overrides the folder). When Node.js or a package is missing, a test prints
//! one line saying it was skipped and returns; with `CI=true` it panics instead, so CI cannot pass
//! without them.

#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use dsh::SessionId;
use dsh::llm::types::ContentBlock;
use dsh::tools::{ToolArgs, ToolInvocation, ToolOutput};
use dsh_mcp::ServerEntry;
use serde_json::Value;

/// The folder the install script fills.
pub fn servers_dir() -> PathBuf {
    match std::env::var_os("DSH_MCP_SERVERS_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.mcp-servers"),
    }
}

/// Skips (prints one line, returns `None`) or, under `CI=true`, panics when `what` is missing.
fn need(path: PathBuf, what: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    let message = format!(
        "{what} is not installed at {} (run mcp/tests/install-servers.sh)",
        path.display()
    );
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{message}");
    }
    eprintln!("skipped: {message}");
    None
}

/// `node` and the everything server's entry point, or `None` (skipped) when missing.
pub fn everything() -> Option<(String, String)> {
    let node = match which("node") {
        Some(node) => node,
        None => need(
            PathBuf::from("/nonexistent/node"),
            "Node.js (`node` on PATH)",
        )?,
    };
    let index = need(
        servers_dir()
            .join("node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
        "@modelcontextprotocol/server-everything",
    )?;
    Some((path_str(&node), path_str(&index)))
}

/// The `mcp-server-time` program, or `None` (skipped) when missing.
pub fn time_server() -> Option<String> {
    need(
        servers_dir().join("python/bin/mcp-server-time"),
        "mcp-server-time (PyPI)",
    )
    .map(|p| path_str(&p))
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("test paths are UTF-8").to_string()
}

/// A stdio entry with the given timeouts.
pub fn stdio_entry(command: &str, args: &[&str], call_timeout_ms: Option<u64>) -> ServerEntry {
    ServerEntry {
        command: Some(command.to_string()),
        args: Some(args.iter().map(|a| a.to_string()).collect()),
        call_timeout_ms,
        startup_timeout_ms: Some(60_000),
        ..ServerEntry::default()
    }
}

/// A call of `name` with `args`, as the tool pool hands it over.
pub fn invocation(name: &str, call_id: &str, args: Value) -> ToolInvocation {
    ToolInvocation {
        session_id: SessionId::new("t").expect("valid id"),
        turn: 1,
        step: 1,
        call_id: call_id.into(),
        name: name.into(),
        arguments: ToolArgs::Json(args),
    }
}

/// The output's text blocks joined.
pub fn text_of(out: &ToolOutput) -> String {
    out.content
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } => text.clone(),
            other => format!("{other:?}"),
        })
        .collect()
}

/// The error code of an output (`None` for a success).
pub fn code_of(out: &ToolOutput) -> Option<&str> {
    out.error.as_ref().map(|e| e.code.as_str())
}

/// What a stdio server receives, line by line: the server runs behind `tee` into a FIFO that a
/// thread reads (reopening it when a restarted server's `tee` opens it again).
pub struct Wire {
    /// The FIFO's folder (kept alive with the test).
    _dir: tempfile::TempDir,
    /// The FIFO.
    pub fifo: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Wire {
    /// A FIFO and the thread that reads it.
    pub fn new() -> Wire {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("wire");
        let status = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(status.success(), "mkfifo failed");
        let (tx, lines) = mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            loop {
                let Ok(file) = std::fs::File::open(&path) else {
                    return;
                };
                for line in std::io::BufReader::new(file).lines() {
                    let Ok(line) = line else { break };
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
        });
        Wire {
            _dir: dir,
            fifo,
            lines,
        }
    }

    /// A stdio entry running `node index` behind `tee` into this wire.
    pub fn entry(&self, node: &str, index: &str, call_timeout_ms: Option<u64>) -> ServerEntry {
        let fifo = path_str(&self.fifo);
        stdio_entry(
            "sh",
            &["-c", "tee \"$0\" | \"$1\" \"$2\" stdio", &fifo, node, index],
            call_timeout_ms,
        )
    }

    /// Waits for (and returns) the next message the server received that contains `needle`.
    pub fn wait_for(&self, needle: &str) -> Value {
        loop {
            // The bound is a hang guard, not a timing assertion.
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|e| panic!("waiting for `{needle}` on the wire: {e}"));
            if line.contains(needle) {
                return serde_json::from_str(&line).expect("a JSON-RPC line");
            }
        }
    }
}

/// Kills `pid` and its children with SIGKILL.
pub fn kill_tree(pid: u32) {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace() {
        if let Ok(child) = child.parse() {
            kill_tree(child);
        }
    }
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Waits until process `pid` has exited (a pidfd becomes readable when it does).
pub fn wait_exit(pid: u32) {
    let Some(pid) = rustix::process::Pid::from_raw(pid as i32) else {
        return;
    };
    let fd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::SRCH) => return,
        Err(e) => panic!("pidfd_open: {e}"),
    };
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    // The bound is a hang guard: the process must be gone long before.
    let limit = rustix::event::Timespec {
        tv_sec: 60,
        tv_nsec: 0,
    };
    let ready = rustix::event::poll(&mut fds, Some(&limit)).expect("poll");
    assert_eq!(ready, 1, "process {pid:?} still runs");
}
