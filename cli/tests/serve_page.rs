//! The web page of `dsh serve`, tested in a real headless browser (Debian's `chromium`): open the
//! page, create an agent, send a prompt to the `sim` model, see the answer stream in while the turn
//! runs, and cancel it with the button.
//!
//! The browser is driven over the Chrome DevTools Protocol on a pipe (`--remote-debugging-pipe`:
//! NUL-terminated JSON on fds 3 and 4, remapped from stdin/stdout by `sh`), so no extra crate is
//! needed. Every wait is a promise evaluated in the page that resolves when the DOM shows the
//! awaited state (a `MutationObserver`), never a sleep. Without chromium the test says that it skips
//! — except under `CI=true`, where it fails. With `DSH_SCREENSHOT=FILE` it saves a PNG of the page.

mod serve_support;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::{Value, json};
use serve_support::Server;

/// A sim model whose turns stream slowly (they run until cancelled).
const STREAMING_SIM: &str = "provider = \"sim\"\n[sim]\nseed = 3\nttft_ms = 0\ntokens_per_sec = 30\nreply_tokens_min = 5000\nreply_tokens_max = 5000\ntool_call_probability = 0.0\n";

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser", "google-chrome"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// A browser driven over the DevTools pipe.
struct Browser {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
    next_id: u64,
    session: Option<String>,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start(bin: &PathBuf) -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" 3<&0 4>&1 </dev/null >/dev/null 2>/dev/null")
            .arg(bin)
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1200,800",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start chromium");
        let to = child.stdin.take().expect("pipe to chromium");
        let from = BufReader::new(child.stdout.take().expect("pipe from chromium"));
        Browser {
            child,
            to,
            from,
            next_id: 1,
            session: None,
            _profile: profile,
        }
    }

    /// Sends one command and returns its result (events in between are skipped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.to
            .write_all(msg.to_string().as_bytes())
            .expect("write to chromium");
        self.to.write_all(b"\0").expect("write to chromium");
        self.to.flush().expect("flush");
        loop {
            let mut buf = Vec::new();
            let n = self
                .from
                .read_until(0, &mut buf)
                .expect("read from chromium");
            assert!(n > 0, "chromium closed the pipe");
            buf.pop();
            let reply: Value = serde_json::from_slice(&buf).expect("a JSON message");
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// Opens `url` in a new tab and attaches to it.
    fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", json!({"url": "about:blank"}));
        let attached = self.call(
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        );
        self.session = Some(
            attached["sessionId"]
                .as_str()
                .expect("a session")
                .to_string(),
        );
        self.call("Page.enable", json!({}));
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Evaluates `expr` in the page, awaiting a promise, and returns its value.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expr, "awaitPromise": true, "returnByValue": true}),
        );
        assert!(r.get("exceptionDetails").is_none(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    /// Waits until `cond` (a JS expression) is truthy in the page, re-checked on every DOM change,
    /// and returns its value.
    fn wait(&mut self, cond: &str) -> Value {
        let expr = format!(
            "new Promise((resolve) => {{
                const check = () => {{ try {{ const v = ({cond}); if (v) {{ obs.disconnect(); resolve(v); }} }} catch (e) {{}} }};
                const obs = new MutationObserver(check);
                const start = () => {{ obs.observe(document, {{subtree: true, childList: true, characterData: true, attributes: true}}); check(); }};
                if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start); else start();
            }})"
        );
        self.eval(&expr)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_page_streams_an_answer_and_cancels_a_running_turn() {
    let Some(bin) = chromium() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium is not installed, and CI=true: the page test must run (apt-get install chromium)"
        );
        eprintln!(
            "SKIPPED the_page_streams_an_answer_and_cancels_a_running_turn: chromium is not installed"
        );
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start(dir.path(), STREAMING_SIM, &[]);
    let mut browser = Browser::start(&bin);
    browser.open(&server.url("/"));
    browser.wait("document.getElementById('new')");

    // A new agent is selected and listed.
    browser.eval("document.getElementById('new').click()");
    let id = browser.wait("document.getElementById('title').textContent.startsWith('s-') && document.getElementById('title').textContent");
    let id = id.as_str().expect("an id").to_string();
    browser.wait(&format!(
        "[...document.querySelectorAll('#agents li')].some(li => li.dataset.id === '{id}')"
    ));

    // A prompt: the user's message shows, the answer streams in while the agent runs.
    browser.eval("document.getElementById('text').value = 'hello from the browser'; document.getElementById('send').requestSubmit()");
    let user = browser.wait(
        "document.querySelector('.msg.user') && document.querySelector('.msg.user').textContent",
    );
    assert_eq!(user, "hello from the browser");
    browser.wait("document.getElementById('state').textContent === 'running'");
    let first = browser.wait("(document.querySelector('.msg.assistant') || {}).textContent");
    let more = browser.wait(&format!(
        "document.querySelector('.msg.assistant').textContent.length > {} && document.querySelector('.msg.assistant').textContent",
        first.as_str().map_or(0, str::len)
    ));
    assert!(
        more.as_str()
            .expect("text")
            .starts_with(first.as_str().expect("text"))
    );
    if let Some(path) = std::env::var_os("DSH_SCREENSHOT") {
        browser.wait("document.querySelector('.msg.assistant').textContent.split(' ').length > 40");
        let shot = browser.call("Page.captureScreenshot", json!({"format": "png"}));
        let png = decode_base64(shot["data"].as_str().expect("png data"));
        std::fs::write(path, png).expect("write the screenshot");
    }

    // Cancel: the turn ends aborted by the user, the agent is idle.
    browser.eval("document.getElementById('cancel').click()");
    let end = browser.wait("(document.querySelector('.turn-end') || {}).textContent");
    assert_eq!(end, "turn 1 ended: aborted (user)");
    browser.wait("document.getElementById('state').textContent === 'idle'");
    let interrupted = browser
        .wait("document.querySelector('.msg.assistant').textContent.endsWith('[interrupted]')");
    assert_eq!(interrupted, true);
    assert!(server.stop().success());
}

/// Decodes standard base64 (the screenshot).
fn decode_base64(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let n =
            chunk.iter().fold(0u32, |acc, &v| (acc << 6) | u32::from(v)) << (6 * (4 - chunk.len()));
        let b = n.to_be_bytes();
        out.extend_from_slice(&b[1..chunk.len()]);
    }
    out
}
