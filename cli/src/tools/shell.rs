//! `shell`: runs `sh -c COMMAND` in the working directory, with a timeout and bounded output. Off
//! unless the user enables it (`--shell`, or `shell = true` in `dsh.toml`), because a shell can do
//! anything the user can.
//!
//! The command runs in a process group of its own with stdin closed and the API-key variables removed from
//! its environment (the model must not be able to print the key). When the command exits, times out
//! or the turn is cancelled, the whole group is killed, so a background child cannot hold the output
//! pipes open or outlive the call. If `dsh` itself dies (even by SIGKILL), `sh` gets a parent-death
//! signal and the watcher that leads the group kills the rest of it (`die_with_parent`, `Watched`).
//!
//! What cannot be contained: a process that leaves the group (`setsid`, `setpgid`) escapes every
//! group kill, on a timeout as on `dsh`'s death; so does one that double-forks out of the group. Only
//! a PID namespace or a cgroup would hold those, and `dsh` sets up neither.
//!
//! Each output stream keeps at most `output_bytes_max` bytes; the rest
//! is read and counted, never stored, so a chatty command cannot exhaust memory or block on a full pipe.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

use crate::tools::{ToolFailure, args_object, cut_utf8, no_other_keys, opt_str, opt_u64};

const NAME: &str = "shell";

/// Variables never passed to the command: the model could otherwise read the API key.
const SECRET_VARS: [&str; 2] = ["DEEPSEEK_API_KEY", "OPENAI_API_KEY"];

/// Settings of the shell tool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShellConfig {
    /// The timeout of a call that names none. 120 s.
    pub timeout_ms: u64,
    /// The largest timeout a call may ask for. 600 s, the runtime's own bound on a tool call.
    pub timeout_ms_max: u64,
    /// Bytes kept of each of stdout and stderr. 32 KiB, so a call's result stays well under
    /// `Limits::tool_result_bytes_max`.
    pub output_bytes_max: usize,
}

impl Default for ShellConfig {
    fn default() -> ShellConfig {
        ShellConfig {
            timeout_ms: 120_000,
            timeout_ms_max: 600_000,
            output_bytes_max: 32 << 10,
        }
    }
}

/// Runs shell commands in the working directory.
#[derive(Debug)]
pub struct ShellTool {
    cwd: PathBuf,
    config: ShellConfig,
}

impl ShellTool {
    /// The tool, running commands in `cwd`.
    pub fn new(cwd: PathBuf, config: ShellConfig) -> ShellTool {
        ShellTool { cwd, config }
    }

    fn parse(&self, args: &ToolArgs) -> Result<(String, u64), ToolFailure> {
        let map = args_object(args)?;
        no_other_keys(map, &["command", "timeout_ms"])?;
        let command = opt_str(map, "command")?
            .filter(|c| !c.trim().is_empty())
            .ok_or_else(|| ToolFailure::new("INVALID_ARGUMENTS", "`command` is required"))?
            .to_string();
        let timeout_ms = opt_u64(map, "timeout_ms")?.unwrap_or(self.config.timeout_ms);
        if timeout_ms == 0 || timeout_ms > self.config.timeout_ms_max {
            return Err(ToolFailure::new(
                "INVALID_ARGUMENTS",
                format!(
                    "`timeout_ms` is {timeout_ms}, it must be within 1..={}",
                    self.config.timeout_ms_max
                ),
            ));
        }
        Ok((command, timeout_ms))
    }
}

/// How the command ended.
#[derive(Debug, PartialEq, Eq)]
enum Ending {
    Exited(std::process::ExitStatus),
    TimedOut(u64),
    Cancelled,
}

/// One captured stream: the kept prefix and how many bytes there were in all.
#[derive(Debug, Default)]
struct Captured {
    kept: Vec<u8>,
    n_bytes: u64,
}

async fn capture(stream: Option<impl AsyncRead + Unpin>, bytes_max: usize) -> Captured {
    let mut out = Captured::default();
    let Some(mut stream) = stream else {
        return out;
    };
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => {
                let room = bytes_max.saturating_sub(out.kept.len());
                out.kept.extend_from_slice(&buf[..n.min(room)]);
                out.n_bytes += n as u64;
            }
        }
    }
}

/// Makes the command's `sh` die with `dsh`: a parent-death signal (SIGKILL) set in the child before
/// `exec`. The signal fires when the thread that spawned the child exits; the spawn happens on a
/// tokio worker thread, which lives until the runtime shuts down, so in practice: when `dsh` exits.
fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before `exec` and only makes two system calls
    // through rustix (`prctl`, `getppid`), which are async-signal-safe: no allocation, no lock, no
    // access to state another thread could hold. Its error is built from a raw errno (no
    // allocation either).
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))?;
            // `dsh` may have died between the fork and the prctl: then the signal never comes.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(
                    rustix::io::Errno::SRCH.raw_os_error(),
                ));
            }
            Ok(())
        });
    }
}

/// The process group a command runs in, led by a watcher that kills the group when `dsh` dies (the
/// parent-death signal reaches only `sh`, not what it starts). The watcher reads a pipe whose only
/// writer is `lifeline`, held by `dsh`: when `dsh` exits, however it exits, the kernel closes it,
/// the read ends and the watcher runs `kill -KILL 0`. The watcher starts first, so there is no
/// moment when the command runs unwatched.
struct Watched {
    /// The group's id (the watcher's pid).
    pgid: u32,
    watcher: tokio::process::Child,
    lifeline: std::io::PipeWriter,
}

impl Watched {
    /// Starts the watcher in a new process group. `None` when it cannot start (out of processes,
    /// no pipe); the command then leads its own group, unwatched.
    fn start() -> Option<Watched> {
        let (reader, lifeline) = std::io::pipe().ok()?;
        let watcher = tokio::process::Command::new("sh")
            .args(["-c", "read -r _; kill -KILL 0"])
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .ok()?;
        Some(Watched {
            pgid: watcher.id()?,
            watcher,
            lifeline,
        })
    }

    /// Ends the watcher with the rest of the group (already killed) and reaps it.
    async fn finish(mut self) {
        drop(self.lifeline);
        let _ = self.watcher.wait().await;
    }
}

/// Kills the command's whole process group (led by its watcher, or by `sh` when it has none).
fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    // ESRCH (the group is already gone) is the expected outcome after a clean exit.
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
}

#[async_trait]
impl Tool for ShellTool {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "Run a command with `sh -c` in the working directory (stdin closed). Returns stdout, stderr \
         and the exit status; each stream is cut at 32 KiB. Default timeout 120 s."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command"},
                "timeout_ms": {"type": "integer", "minimum": 1, "maximum": self.config.timeout_ms_max,
                               "description": "Kill the command after this many milliseconds"}
            },
            "required": ["command"],
            "additionalProperties": false
        })
    }

    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Exclusive
    }

    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        let (command, timeout_ms) = match self.parse(&call.arguments) {
            Ok(p) => p,
            Err(f) => return f.into_output(NAME),
        };
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c")
            .arg(&command)
            .current_dir(&self.cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let watched = Watched::start();
        // i32::try_from cannot fail for a pid; 0 (a group of its own) is the unwatched fallback.
        cmd.process_group(
            watched
                .as_ref()
                .and_then(|w| i32::try_from(w.pgid).ok())
                .unwrap_or(0),
        );
        for var in SECRET_VARS {
            cmd.env_remove(var);
        }
        die_with_parent(&mut cmd);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                if let Some(w) = watched {
                    kill_group(Some(w.pgid));
                    w.finish().await;
                }
                return ToolFailure::new("SPAWN", format!("cannot start sh: {e}"))
                    .into_output(NAME);
            }
        };
        let pid = watched.as_ref().map(|w| w.pgid).or(child.id());
        let bytes_max = self.config.output_bytes_max;
        let stdout = tokio::spawn(capture(child.stdout.take(), bytes_max));
        let stderr = tokio::spawn(capture(child.stderr.take(), bytes_max));
        let ending = tokio::select! {
            status = child.wait() => match status {
                Ok(s) => Ending::Exited(s),
                Err(e) => {
                    kill_group(pid);
                    if let Some(w) = watched {
                        w.finish().await;
                    }
                    return ToolFailure::new("IO", format!("waiting for the command failed: {e}"))
                        .into_output(NAME);
                }
            },
            () = tokio::time::sleep(Duration::from_millis(timeout_ms)) => Ending::TimedOut(timeout_ms),
            () = cancel.cancelled() => Ending::Cancelled,
        };
        // Also after a clean exit: background children would keep the pipes open.
        kill_group(pid);
        if !matches!(ending, Ending::Exited(_)) {
            let _ = child.wait().await;
        }
        if let Some(w) = watched {
            w.finish().await;
        }
        let stdout = stdout.await.unwrap_or_default();
        let stderr = stderr.await.unwrap_or_default();
        render(&ending, &stdout, &stderr, bytes_max)
    }
}

fn render(ending: &Ending, stdout: &Captured, stderr: &Captured, bytes_max: usize) -> ToolOutput {
    let mut text = String::new();
    for (label, cap) in [("stdout", stdout), ("stderr", stderr)] {
        if cap.n_bytes == 0 {
            continue;
        }
        if label == "stderr" {
            text.push_str("[stderr]\n");
        }
        let shown = String::from_utf8_lossy(&cap.kept);
        let shown = cut_utf8(&shown, bytes_max);
        text.push_str(shown);
        if !shown.ends_with('\n') {
            text.push('\n');
        }
        if cap.n_bytes > cap.kept.len() as u64 {
            text.push_str(&format!(
                "[{label} cut: showed {} of {} bytes]\n",
                cap.kept.len(),
                cap.n_bytes
            ));
        }
    }
    use std::os::unix::process::ExitStatusExt;
    let (status_line, meta, failure) = match ending {
        Ending::Exited(s) => match (s.code(), s.signal()) {
            (Some(code), _) => (
                format!("[exit status {code}]"),
                json!({"exit_code": code}),
                None,
            ),
            (None, signal) => (
                format!("[killed by signal {}]", signal.unwrap_or(0)),
                json!({"exit_code": null, "signal": signal}),
                None,
            ),
        },
        Ending::TimedOut(ms) => (
            format!("[timed out after {ms} ms; the command was killed]"),
            json!({"exit_code": null, "timed_out": true}),
            Some("TIMEOUT"),
        ),
        Ending::Cancelled => (
            "[cancelled; the command was killed]".to_string(),
            json!({"exit_code": null, "cancelled": true}),
            Some("ABORTED"),
        ),
    };
    text.push_str(&status_line);
    let mut out = match failure {
        None => ToolOutput::text(text),
        Some(code) => ToolFailure::new(code, text).into_output(NAME),
    };
    out.meta = Some(meta);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::test_support::text_of;

    fn call(args: Value) -> ToolInvocation {
        crate::tools::test_support::call(NAME, args)
    }

    fn tool(dir: &std::path::Path) -> ShellTool {
        ShellTool::new(dir.to_path_buf(), ShellConfig::default())
    }

    #[tokio::test]
    async fn runs_in_the_working_directory_and_reports_both_streams() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("here.txt"), "").expect("write");
        let out = tool(tmp.path())
            .execute(
                call(json!({"command": "ls; echo oops >&2; exit 3"})),
                CancellationToken::new(),
            )
            .await;
        assert!(!out.is_error);
        assert_eq!(text_of(&out), "here.txt\n[stderr]\noops\n[exit status 3]");
        assert_eq!(out.meta, Some(json!({"exit_code": 3})));
    }

    #[tokio::test]
    async fn the_api_key_is_not_in_the_environment() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // The variable may or may not be set in the test's environment; either way the command
        // must not see it.
        let out = tool(tmp.path())
            .execute(
                call(json!({"command": "echo \"[${DEEPSEEK_API_KEY-unset}][${OPENAI_API_KEY-unset}]\""})),
                CancellationToken::new(),
            )
            .await;
        assert_eq!(text_of(&out), "[unset][unset]\n[exit status 0]");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_command_and_its_children() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let out = tool(tmp.path())
            .execute(
                call(json!({"command": "echo started; sleep 30 & sleep 30; echo never", "timeout_ms": 200})),
                CancellationToken::new(),
            )
            .await;
        assert!(out.is_error);
        assert_eq!(out.error.as_ref().map(|e| e.code.as_str()), Some("TIMEOUT"));
        assert_eq!(
            text_of(&out),
            "Error: started\n[timed out after 200 ms; the command was killed]"
        );
    }

    #[tokio::test]
    async fn cancellation_kills_the_command() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let cancel = CancellationToken::new();
        let t = tool(tmp.path());
        let run = t.execute(call(json!({"command": "sleep 30"})), cancel.clone());
        cancel.cancel();
        let out = run.await;
        assert_eq!(out.error.as_ref().map(|e| e.code.as_str()), Some("ABORTED"));
        assert_eq!(text_of(&out), "Error: [cancelled; the command was killed]");
    }

    #[tokio::test]
    async fn output_is_bounded_and_background_children_do_not_hold_the_call() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let t = ShellTool::new(
            tmp.path().to_path_buf(),
            ShellConfig {
                output_bytes_max: 10,
                ..ShellConfig::default()
            },
        );
        let out = t
            .execute(
                call(json!({"command": "printf '%s' 0123456789abcdef; (sleep 30 &)"})),
                CancellationToken::new(),
            )
            .await;
        assert_eq!(
            text_of(&out),
            "0123456789\n[stdout cut: showed 10 of 16 bytes]\n[exit status 0]"
        );
    }

    #[tokio::test]
    async fn bad_arguments_are_error_results() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let t = tool(tmp.path());
        for (args, text) in [
            (json!({}), "Error: `command` is required"),
            (json!({"command": " "}), "Error: `command` is required"),
            (
                json!({"command": "true", "timeout_ms": 0}),
                "Error: `timeout_ms` is 0, it must be within 1..=600000",
            ),
            (
                json!({"command": "true", "cwd": "/"}),
                "Error: unknown argument `cwd` (expected command, timeout_ms)",
            ),
        ] {
            let out = t
                .execute(call(args.clone()), CancellationToken::new())
                .await;
            assert!(out.is_error, "{args}");
            assert_eq!(text_of(&out), text, "{args}");
        }
    }
}
