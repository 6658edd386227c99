//! Helpers for the `dsh serve` tests: start the built binary on 127.0.0.1 with a free port in a
//! temporary directory (sim provider, no key), talk to it over real HTTP, read its event streams.
//!
//! Waits are for output (the "listening" line, SSE events, the process's exit), never for time.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;

use serde_json::Value;

/// A sim configuration whose turns end at once with a three-word answer and no tool call.
pub const FAST_SIM: &str = "provider = \"sim\"\n[sim]\nseed = 1\nttft_ms = 0\ntokens_per_sec = 0\nreply_tokens_min = 3\nreply_tokens_max = 3\ntool_call_probability = 0.0\n";

/// A sim configuration whose turns stream slowly (about 20 tokens/s, 5,000 tokens): they run until
/// cancelled.
pub const SLOW_SIM: &str = "provider = \"sim\"\n[sim]\nseed = 1\nttft_ms = 0\ntokens_per_sec = 20\nreply_tokens_min = 5000\nreply_tokens_max = 5000\ntool_call_probability = 0.0\n";

/// Environment variables that would leak the developer's setup into a test.
const SCRUBBED_VARS: [&str; 10] = [
    "DSH_LOG",
    "DSH_DATA_DIR",
    "DSH_PROVIDER",
    "DSH_BASE_URL",
    "DSH_MODEL",
    "DSH_CONFIG",
    "DSH_STORE",
    "DSH_TOKEN",
    "DEEPSEEK_API_KEY",
    "OPENAI_API_KEY",
];

/// A running `dsh serve`.
pub struct Server {
    /// The process.
    pub child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Later stderr lines.
    pub stderr: mpsc::Receiver<String>,
    /// An HTTP client.
    pub client: reqwest::Client,
}

/// The `dsh` binary.
pub fn dsh_bin() -> PathBuf {
    match std::env::var_os("DSH_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => PathBuf::from(env!("CARGO_BIN_EXE_dsh")),
    }
}

/// A `dsh serve` command in `dir` with `config` as its `dsh.toml`.
pub fn serve_command(dir: &Path, config: &str, args: &[&str]) -> Command {
    std::fs::write(dir.join("dsh.toml"), config).expect("write dsh.toml");
    let mut cmd = Command::new(dsh_bin());
    cmd.arg("serve")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for var in SCRUBBED_VARS {
        cmd.env_remove(var);
    }
    cmd
}

impl Server {
    /// Starts `dsh serve --listen 127.0.0.1:0 ARGS` in `dir` and waits for its listening line.
    pub fn start(dir: &Path, config: &str, args: &[&str]) -> Server {
        Server::start_with(serve_command(
            dir,
            config,
            &[&["--listen", "127.0.0.1:0"], args].concat(),
        ))
    }

    /// Starts a prepared command and waits for its listening line.
    pub fn start_with(mut cmd: Command) -> Server {
        let mut child = cmd.spawn().expect("spawn dsh serve");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let base = loop {
            let line = rx.recv().expect("dsh serve exited before listening");
            if let Some(addr) = line.strip_prefix("dsh serve: listening on ") {
                break addr.to_string();
            }
        };
        Server {
            child,
            base,
            stderr: rx,
            client: reqwest::Client::new(),
        }
    }

    /// The URL of `path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).expect("a pid");
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    }

    /// Waits for a stderr line containing `needle`.
    pub fn wait_stderr(&self, needle: &str) -> String {
        loop {
            let line = self.stderr.recv().expect("dsh serve closed stderr");
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate();
        self.child.wait().expect("wait for dsh serve")
    }

    /// A JSON request; returns the status and the body as JSON (`Null` when empty or not JSON).
    pub async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
        let mut req = self.client.request(method, self.url(path));
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let resp = req.send().await.expect("send a request");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("read the body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Creates session `id` and sends it one followup, asserting both were accepted (201, then 202
    /// once durable): the start of most tests that need a turn to run.
    pub async fn create_with_followup(&self, id: &str, text: &str) {
        let (status, answer) = self
            .call(
                "POST",
                "/v1/sessions",
                Some(serde_json::json!({ "id": id })),
            )
            .await;
        assert_eq!(status, 201, "create {id}: {answer}");
        let (status, answer) = self
            .call(
                "POST",
                &format!("/v1/sessions/{id}/followup"),
                Some(serde_json::json!({ "text": text })),
            )
            .await;
        assert_eq!(status, 202, "followup to {id}: {answer}");
    }

    /// Opens an event stream.
    pub async fn events(&self, path: &str, last_event_id: Option<u64>) -> SseReader {
        let mut req = self.client.get(self.url(path));
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id.to_string());
        }
        let resp = req.send().await.expect("open the event stream");
        assert_eq!(resp.status().as_u16(), 200, "event stream status");
        assert_eq!(
            resp.headers()["content-type"].to_str().expect("ascii"),
            "text/event-stream"
        );
        SseReader {
            resp,
            buf: String::new(),
            comments: 0,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One server-sent event.
#[derive(Clone, Debug, PartialEq)]
pub struct Sse {
    /// `id:`, if any.
    pub id: Option<u64>,
    /// `event:`.
    pub event: String,
    /// `data:` parsed as JSON.
    pub data: Value,
}

/// Reads server-sent events from a response.
pub struct SseReader {
    resp: reqwest::Response,
    buf: String,
    /// Comment lines seen (keep-alives).
    pub comments: usize,
}

impl SseReader {
    /// The next event, or `None` when the stream ended.
    pub async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                if let Some(ev) = self.parse(&block) {
                    return Some(ev);
                }
                continue;
            }
            let chunk = self.resp.chunk().await.expect("read the stream")?;
            self.buf
                .push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }

    fn parse(&mut self, block: &str) -> Option<Sse> {
        let (mut id, mut event, mut data) = (None, String::from("message"), String::new());
        let mut any = false;
        for line in block.lines() {
            if line.is_empty() {
                continue;
            }
            if line.starts_with(':') {
                self.comments += 1;
                continue;
            }
            let (k, v) = line.split_once(':').unwrap_or((line, ""));
            let v = v.strip_prefix(' ').unwrap_or(v);
            match k {
                "id" => id = Some(v.parse().expect("a numeric id")),
                "event" => event = v.to_string(),
                "data" => data.push_str(v),
                _ => panic!("an unexpected SSE line: {line:?}"),
            }
            any = true;
        }
        any.then(|| Sse {
            id,
            event,
            data: serde_json::from_str(&data).unwrap_or(Value::Null),
        })
    }

    /// Events until (and including) the first of type `kind`.
    pub async fn until(&mut self, kind: &str) -> Vec<Sse> {
        let mut out = Vec::new();
        while let Some(ev) = self.next().await {
            let done = ev.event == kind;
            out.push(ev);
            if done {
                return out;
            }
        }
        panic!("the stream ended before a {kind} event; got {out:?}");
    }

    /// Every event until the stream ends.
    pub async fn rest(&mut self) -> Vec<Sse> {
        let mut out = Vec::new();
        while let Some(ev) = self.next().await {
            out.push(ev);
        }
        out
    }

    /// Waits until a keep-alive comment arrived.
    pub async fn keep_alive(&mut self) {
        while self.comments == 0 {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let _ = self.parse(&block);
                continue;
            }
            let chunk = self.resp.chunk().await.expect("read").expect("stream open");
            self.buf
                .push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }
}

/// The `type`s of events.
pub fn kinds(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.event.as_str()).collect()
}
