//! The `dsh` command line, tested as a user runs it: the built binary, in a temporary working
//! directory with its own data directory, with a scripted model (`--script`) so every answer is
//! exact. `dsh chat` runs in a pseudo-terminal (rexpect), so Ctrl-C is a real SIGINT from the
//! terminal driver and streamed text is read as the user would see it.
//!
//! The binary is this package's own (`CARGO_BIN_EXE_dsh`, or `DSH_BIN` when set). Waits are for
//! output or files, never for time; rexpect's timeout only turns a hang into a failure.

mod sandbox;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sandbox::{Run, Sandbox};
use serde_json::Value;

/// Bounds a pty read: a hang fails the test instead of blocking it forever.
const PTY_TIMEOUT_MS: u64 = 60_000;

impl Sandbox {
    /// Writes `text` to the file `name` in the working directory.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).expect("write a test file");
        p
    }

    /// A script file of model entries.
    fn script(&self, name: &str, entries: Value) -> PathBuf {
        self.write(name, &entries.to_string())
    }

    /// Every file under the data directory with its bytes (empty when there is none).
    fn snapshot(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        snapshot_into(&self.data_dir(), &self.data_dir(), &mut out);
        out
    }

    /// The events of a stored session, read back through `dsh export`.
    fn events(&self, id: &str) -> Vec<Value> {
        let r = self.run(&["export", id]);
        assert_eq!(r.code, Some(0), "export {id}: {}", r.stderr);
        r.stdout
            .lines()
            .skip(1)
            .map(|l| serde_json::from_str(l).expect("an event line is JSON"))
            .collect()
    }
}

fn snapshot_into(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Vec<u8>>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let p = entry.path();
        if p.is_dir() {
            snapshot_into(root, &p, out);
        } else {
            let rel = p.strip_prefix(root).unwrap_or(&p).to_path_buf();
            out.insert(rel, std::fs::read(&p).unwrap_or_default());
        }
    }
}

impl Run {
    /// Asserts a failure reported as exactly one `dsh: ...` line containing `needle`.
    #[track_caller]
    fn assert_one_line_error(&self, code: i32, needle: &str) {
        assert_eq!(self.code, Some(code), "{self:#?}");
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "expected one line on stderr: {self:#?}");
        assert!(lines[0].starts_with("dsh: "), "{self:#?}");
        assert!(
            lines[0].contains(needle),
            "{needle:?} not in {:?}",
            lines[0]
        );
        assert_eq!(self.stdout, "", "{self:#?}");
    }
}

/// `type` of each event.
fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The text of each claimed user message, with its turn and step.
fn claimed_prompts(events: &[Value]) -> Vec<(u64, u64, String)> {
    let (mut turn, mut step) = (0, 0);
    let mut out = Vec::new();
    for e in events {
        match e["type"].as_str() {
            Some("turn/start") => turn = e["data"]["turn"].as_u64().unwrap_or(0),
            Some("step/start") => step = e["data"]["step"].as_u64().unwrap_or(0),
            Some("user/message") => out.push((
                turn,
                step,
                e["data"]["content"][0]["text"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )),
            _ => {}
        }
    }
    out
}

fn turn_end_kinds(events: &[Value]) -> Vec<String> {
    of_type(events, "turn/end")
        .iter()
        .map(|e| {
            e["data"]["reason"]["kind"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// dsh run

#[test]
fn run_prints_the_final_text_and_exits_0() {
    let sb = Sandbox::new();
    let script = sb.script(
        "s.json",
        serde_json::json!([
            {"text": "Let me look.", "tool_calls": [{"id": "c1", "name": "list_dir", "arguments": "{}"}]},
            {"text": "There is one file."}
        ]),
    );
    let r = sb.run(&[
        "run",
        "--script",
        script.to_str().expect("utf-8"),
        "what is here?",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(r.stdout, "There is one file.\n");
    let id = r
        .stderr
        .trim()
        .strip_prefix("session: ")
        .expect("the minted id is printed on stderr")
        .to_string();
    assert!(id.starts_with("s-"), "{id}");
    let events = sb.events(&id);
    assert_eq!(turn_end_kinds(&events), ["completed"]);
    assert_eq!(of_type(&events, "step/start").len(), 2);
    let result = of_type(&events, "tool/result");
    assert_eq!(result.len(), 1);
    let size = std::fs::metadata(&script).expect("stat").len();
    assert_eq!(
        result[0]["data"]["message"]["content"][0]["content"][0]["text"],
        format!(".dsh/\ns.json  ({size} bytes)\n")
    );
}

#[test]
fn run_continues_a_named_session() {
    let sb = Sandbox::new();
    let s1 = sb.script("a.json", serde_json::json!([{"text": "one"}]));
    let s2 = sb.script("b.json", serde_json::json!([{"text": "two"}]));
    let r = sb.run(&[
        "run",
        "--session",
        "work",
        "--script",
        s1.to_str().expect("utf-8"),
        "first",
    ]);
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(0), "one\n", "")
    );
    let r = sb.run(&[
        "run",
        "--session",
        "work",
        "--script",
        s2.to_str().expect("utf-8"),
        "second",
    ]);
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(0), "two\n", "")
    );
    let events = sb.events("work");
    assert_eq!(
        claimed_prompts(&events),
        [(1, 1, "first".to_string()), (2, 1, "second".to_string())]
    );
    // The second request carried the first exchange: history came from the store.
    assert_eq!(turn_end_kinds(&events), ["completed", "completed"]);
}

#[test]
fn run_max_tokens_exits_0_with_a_warning() {
    let sb = Sandbox::new();
    let script = sb.script("s.json", serde_json::json!([{"max_tokens": "cut sho"}]));
    let r = sb.run(&[
        "run",
        "--session",
        "m",
        "--script",
        script.to_str().expect("utf-8"),
        "go",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(r.stdout, "cut sho\n");
    assert_eq!(
        r.stderr,
        "dsh: warning: the reply hit the max-tokens limit and may be cut short\n"
    );
    assert_eq!(turn_end_kinds(&sb.events("m")), ["max-tokens"]);
}

#[test]
fn run_error_exits_2_with_code_and_message() {
    let sb = Sandbox::new();
    let script = sb.script(
        "s.json",
        serde_json::json!([{"error": {"code": "AUTH", "message": "the key was refused", "status": 401}}]),
    );
    let r = sb.run(&[
        "run",
        "--session",
        "e",
        "--script",
        script.to_str().expect("utf-8"),
        "go",
    ]);
    assert_eq!(r.code, Some(2), "{r:#?}");
    assert_eq!(r.stdout, "");
    assert_eq!(r.stderr, "dsh: the turn failed: AUTH the key was refused\n");
    let events = sb.events("e");
    assert_eq!(turn_end_kinds(&events), ["error"]);
    assert_eq!(
        of_type(&events, "turn/end")[0]["data"]["reason"]["error"]["code"],
        "AUTH"
    );
}

/// A signal cancels the running turn: it ends `aborted` (durably) and `dsh run` exits 3.
#[test]
fn run_signal_aborts_the_turn_and_exits_3() {
    for signal in ["INT", "TERM"] {
        let sb = Sandbox::new();
        // The tool call tells the test the turn is running; the model then hangs until cancelled.
        let script = sb.script(
            "s.json",
            serde_json::json!([
                {"tool_calls": [{"id": "c1", "name": "shell", "arguments": "{\"command\":\"touch ready\"}"}]},
                {"hang": "partial answ"}
            ]),
        );
        let mut child = sb
            .command(&[
                "run",
                "--shell",
                "--session",
                "h",
                "--script",
                script.to_str().expect("utf-8"),
                "go",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("dsh runs");
        let ready = sb.path().join("ready");
        while !ready.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("dsh exited before the turn ran: {status}");
            }
            std::thread::yield_now();
        }
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success());
        let r = Run::from(child.wait_with_output().expect("dsh ends"));
        assert_eq!(r.code, Some(3), "SIG{signal}: {r:#?}");
        assert_eq!(r.stdout, "");
        assert_eq!(
            r.stderr,
            "dsh: the turn ended aborted (cancelled by the user)\n"
        );
        let events = sb.events("h");
        assert_eq!(turn_end_kinds(&events), ["aborted"], "SIG{signal}");
        assert_eq!(
            of_type(&events, "turn/end")[0]["data"]["reason"]["reason"]["kind"],
            "user"
        );
    }
}

#[test]
fn the_shell_tool_is_off_unless_enabled() {
    let sb = Sandbox::new();
    let entries = serde_json::json!([
        {"tool_calls": [{"id": "c1", "name": "shell", "arguments": "{\"command\":\"echo hi > made.txt\"}"}]},
        {"text": "ok"}
    ]);
    let script = sb.script("s.json", entries.clone());
    let r = sb.run(&[
        "run",
        "--session",
        "off",
        "--script",
        script.to_str().expect("utf-8"),
        "go",
    ]);
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "ok\n"), "{r:#?}");
    assert!(!sb.path().join("made.txt").exists());
    let events = sb.events("off");
    let result = &of_type(&events, "tool/result")[0]["data"];
    assert_eq!(result["message"]["content"][0]["isError"], true);

    let r = sb.run(&[
        "run",
        "--shell",
        "--session",
        "on",
        "--script",
        script.to_str().expect("utf-8"),
        "go",
    ]);
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "ok\n"), "{r:#?}");
    assert_eq!(
        std::fs::read_to_string(sb.path().join("made.txt")).expect("made"),
        "hi\n"
    );
    let events = sb.events("on");
    let result = &of_type(&events, "tool/result")[0]["data"];
    assert_eq!(
        result["message"]["content"][0]["content"][0]["text"],
        "[exit status 0]"
    );

    // `shell = true` in dsh.toml enables it too.
    std::fs::remove_file(sb.path().join("made.txt")).expect("rm");
    sb.write("dsh.toml", "shell = true\n");
    let r = sb.run(&[
        "run",
        "--session",
        "toml",
        "--script",
        script.to_str().expect("utf-8"),
        "go",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(sb.path().join("made.txt").exists());
}

#[test]
fn the_file_tools_cannot_leave_the_working_directory() {
    let sb = Sandbox::new();
    let outside = tempfile::tempdir().expect("tempdir");
    std::fs::write(outside.path().join("secret"), "top secret").expect("write");
    std::os::unix::fs::symlink(outside.path().join("secret"), sb.path().join("link"))
        .expect("symlink");
    let abs = outside.path().join("secret");
    let calls: Vec<Value> = [
        "../secret",
        "link",
        abs.to_str().expect("utf-8"),
        "/etc/hostname",
    ]
    .iter()
    .enumerate()
    .map(|(i, p)| {
        serde_json::json!({"id": format!("c{i}"), "name": "read_file",
                               "arguments": serde_json::json!({"path": p}).to_string()})
    })
    .collect();
    let script = sb.script(
        "s.json",
        serde_json::json!([{"tool_calls": calls}, {"text": "done"}]),
    );
    let r = sb.run(&[
        "run",
        "--session",
        "esc",
        "--script",
        script.to_str().expect("utf-8"),
        "go",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let events = sb.events("esc");
    let results = of_type(&events, "tool/result");
    assert_eq!(results.len(), 4);
    for r in results {
        assert_eq!(r["data"]["error"]["code"], "OUTSIDE_ROOT", "{r}");
        assert!(!r.to_string().contains("top secret"));
    }
}

// ---------------------------------------------------------------------------------------------
// bad input: one line, non-zero exit, nothing written

#[test]
fn bad_input_is_one_line_and_writes_nothing() {
    let sb = Sandbox::new();
    let good = sb.script("good.json", serde_json::json!([{"text": "x"}]));
    let good = good.to_str().expect("utf-8");
    sb.write("bad.json", "[{\"txet\": 1}]");
    sb.write("notes.txt", "hello\n");
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["run", "--provider", "openai", "hi"],
            64,
            "no API key: set DEEPSEEK_API_KEY or OPENAI_API_KEY, or try --provider sim",
        ),
        (
            vec!["chat", "--provider", "openai"],
            64,
            "try --provider sim",
        ),
        (
            vec!["run", "--provider", "gpt", "hi"],
            64,
            "unknown provider `gpt`",
        ),
        (
            vec!["run", "--provider", "script", "hi"],
            64,
            "pass --script FILE",
        ),
        (
            vec!["run", "--script", "missing.json", "hi"],
            64,
            "script missing.json: No such file",
        ),
        (
            vec!["run", "--script", "bad.json", "hi"],
            64,
            "script bad.json: not a JSON array of model entries",
        ),
        (
            vec!["run", "--session", "../etc", "--script", good, "hi"],
            64,
            "--session: session id \"../etc\" has a character that is not allowed",
        ),
        (
            vec!["run", "--script", good, " "],
            64,
            "the prompt is empty",
        ),
        (vec!["show", "nope"], 1, "session nope not found"),
        (
            vec!["show", "dir/missing.jsonl"],
            1,
            "dir/missing.jsonl: no such file",
        ),
        (
            vec!["show", "bad id!"],
            1,
            "is neither a file nor a valid session id",
        ),
        (vec!["show", "notes.txt"], 1, "invalid: notes.txt: line 1"),
        (vec!["check", "nope"], 1, "session nope not found"),
        (vec!["check", "notes.txt"], 1, "invalid: notes.txt: line 1"),
        (vec!["export", "nope"], 1, "session nope not found"),
        (vec!["export", "a/b"], 64, "invalid session id"),
        (
            vec!["import", "missing.jsonl"],
            1,
            "missing.jsonl: No such file",
        ),
        (vec!["import", "notes.txt"], 1, "invalid: notes.txt: line 1"),
        (
            vec!["import", "notes.txt", "--id", "a b"],
            64,
            "--id: session id",
        ),
        (
            vec!["--config", "missing.toml", "sessions"],
            64,
            "config missing.toml: no such file",
        ),
    ];
    for (args, code, needle) in cases {
        let r = sb.run(&args);
        r.assert_one_line_error(code, needle);
        assert!(
            !sb.data_dir().exists(),
            "{args:?} created the data directory"
        );
    }
    // With a store present, failures leave it byte for byte as it was.
    let r = sb.run(&["run", "--session", "keep", "--script", good, "hi"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let before = sb.snapshot();
    assert!(!before.is_empty());
    sb.write("exists.jsonl", &sb.run(&["export", "keep"]).stdout);
    for (args, code, needle) in [
        (
            vec!["import", "exists.jsonl"],
            1,
            "session keep already exists",
        ),
        (vec!["import", "notes.txt"], 1, "invalid: notes.txt"),
        (vec!["show", "nope"], 1, "session nope not found"),
        (
            vec!["export", "nope", "-o", "out.jsonl"],
            1,
            "session nope not found",
        ),
        (
            vec!["export", "keep", "-o", "no/such/dir/out.jsonl"],
            1,
            "no/such/dir/out.jsonl",
        ),
        (
            vec!["run", "--session", "keep", "--provider", "openai", "hi"],
            64,
            "no API key",
        ),
    ] {
        let r = sb.run(&args);
        r.assert_one_line_error(code, needle);
        assert_eq!(sb.snapshot(), before, "{args:?} changed the store");
    }
    assert!(!sb.path().join("out.jsonl").exists());
}

#[test]
fn dsh_log_turns_on_diagnostics_on_stderr_and_a_bad_filter_is_one_line() {
    let sb = Sandbox::new();
    let script = sb.script("s.json", serde_json::json!([{"text": "fine"}]));
    let script = script.to_str().expect("utf-8");
    let r = Run::from(
        sb.command(&["run", "--script", script, "hi"])
            .env("DSH_LOG", "dsh_actors=debug")
            .output()
            .expect("dsh runs"),
    );
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(r.stdout, "fine\n", "diagnostics stay off stdout: {r:#?}");
    assert!(
        r.stderr.contains("turn ended") && r.stderr.contains("completed"),
        "{r:#?}"
    );
    assert!(
        !r.stderr.contains("hi\""),
        "no message content below trace: {r:#?}"
    );

    let before = sb.snapshot();
    let r = Run::from(
        sb.command(&["sessions"])
            .env("DSH_LOG", "dsh_actors=[")
            .output()
            .expect("dsh runs"),
    );
    r.assert_one_line_error(64, "DSH_LOG");
    assert_eq!(sb.snapshot(), before);
}

#[test]
fn a_store_that_cannot_open_is_one_line() {
    let sb = Sandbox::new();
    sb.write("not-a-dir", "x");
    let script = sb.script("s.json", serde_json::json!([{"text": "x"}]));
    let r = sb.run(&[
        "--data-dir",
        "not-a-dir",
        "run",
        "--script",
        script.to_str().expect("utf-8"),
        "hi",
    ]);
    r.assert_one_line_error(1, "cannot open the store in not-a-dir");
    let r = sb.run(&["--data-dir", "not-a-dir", "sessions"]);
    r.assert_one_line_error(1, "not-a-dir is not a directory");
    assert_eq!(
        std::fs::read_to_string(sb.path().join("not-a-dir")).expect("read"),
        "x"
    );
}

// ---------------------------------------------------------------------------------------------
// configuration

#[test]
fn malformed_configuration_names_the_key_and_writes_nothing() {
    for (toml, needle) in [
        ("modle = \"x\"\n", "config dsh.toml: unknown key `modle`"),
        (
            "max_tokens = \"many\"\n",
            "config dsh.toml: key `max_tokens`: expected a positive integer, got string",
        ),
        (
            "[sim]\nseeed = 1\n",
            "config dsh.toml: key `sim.seeed`: unknown field `seeed`",
        ),
        (
            "[openai]\nidle_timeout_ms = 0\n",
            "config dsh.toml: key `openai.idle_timeout_ms`",
        ),
        (
            "provider = \"sim\"\nthis is = not toml = \n",
            "config dsh.toml: line 2:",
        ),
    ] {
        let sb = Sandbox::new();
        sb.write("dsh.toml", toml);
        for args in [vec!["sessions"], vec!["run", "--provider", "sim", "hi"]] {
            let r = sb.run(&args);
            r.assert_one_line_error(64, needle);
            assert!(!sb.data_dir().exists());
        }
    }
}

/// Flags over environment over `dsh.toml` over defaults, shown with the data directory and the
/// provider.
#[test]
fn flags_beat_environment_beat_the_file() {
    let sb = Sandbox::new();
    sb.write(
        "dsh.toml",
        "data_dir = \"from-file\"\nprovider = \"sim\"\n[sim]\nttft_ms = 0\ntokens_per_sec = 0\n",
    );
    let script = sb.script("s.json", serde_json::json!([{"text": "scripted"}]));
    let script = script.to_str().expect("utf-8");
    // The file alone: its data_dir and its provider (sim answers without a key).
    let r = sb.run(&["run", "--session", "a", "hi"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(sb.path().join("from-file/sessions.sqlite3").is_file());
    // Environment over the file.
    let r = Run::from(
        sb.command(&["run", "--session", "b", "--script", script, "hi"])
            .env("DSH_DATA_DIR", "from-env")
            .output()
            .expect("dsh runs"),
    );
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), "scripted\n"),
        "{r:#?}"
    );
    assert!(sb.path().join("from-env/sessions.sqlite3").is_file());
    // A flag over both.
    let r = Run::from(
        sb.command(&[
            "--data-dir",
            "from-flag",
            "run",
            "--session",
            "c",
            "--script",
            script,
            "hi",
        ])
        .env("DSH_DATA_DIR", "from-env")
        .output()
        .expect("dsh runs"),
    );
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(sb.path().join("from-flag/sessions.sqlite3").is_file());
    // DSH_PROVIDER=openai beats the file's sim: without a key that is refused.
    let r = Run::from(
        sb.command(&["run", "hi"])
            .env("DSH_PROVIDER", "openai")
            .output()
            .expect("dsh runs"),
    );
    r.assert_one_line_error(64, "no API key");
    // --config names another file.
    sb.write("other.toml", "data_dir = \"other-dir\"\n");
    let r = sb.run(&[
        "--config",
        "other.toml",
        "run",
        "--session",
        "d",
        "--script",
        script,
        "hi",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(sb.path().join("other-dir/sessions.sqlite3").is_file());
    // The default: ./.dsh.
    std::fs::remove_file(sb.path().join("dsh.toml")).expect("rm");
    let r = sb.run(&["run", "--session", "e", "--script", script, "hi"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(sb.data_dir().join("sessions.sqlite3").is_file());
}

// ---------------------------------------------------------------------------------------------
// sessions, show, check, export, import

/// Two sessions with a tool call each, for the read-side commands.
fn populated() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("a.txt", "alpha\nbeta\n");
    let script = sb.script(
        "s.json",
        serde_json::json!([
            {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}]},
            {"text": "It says alpha and beta."}
        ]),
    );
    let r = sb.run(&[
        "run",
        "--session",
        "first",
        "--script",
        script.to_str().expect("utf-8"),
        "read a.txt please",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let script = sb.script("t.json", serde_json::json!([{"text": "Hi!"}]));
    let r = sb.run(&[
        "run",
        "--session",
        "second",
        "--script",
        script.to_str().expect("utf-8"),
        "hello",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    sb
}

#[test]
fn sessions_lists_a_table_or_json_lines() {
    let sb = Sandbox::new();
    let r = sb.run(&["sessions"]);
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), ""));
    assert_eq!(r.stderr, "no sessions in .dsh\n");
    let r = sb.run(&["sessions", "--json"]);
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(0), "", "")
    );
    assert!(
        !sb.data_dir().exists(),
        "listing created the data directory"
    );

    let sb = populated();
    let r = sb.run(&["sessions"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", r.stdout);
    assert!(lines[0].starts_with("ID    "), "{}", lines[0]);
    assert!(
        lines[0].ends_with("EVENTS  LAST ACTIVITY (UTC)  FIRST PROMPT"),
        "{}",
        lines[0]
    );
    let n_first = sb.events("first").len();
    let n_second = sb.events("second").len();
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cols[0], "first");
    assert_eq!(cols[1], n_first.to_string());
    assert!(lines[1].ends_with("  read a.txt please"), "{}", lines[1]);
    assert!(lines[2].starts_with("second"), "{}", lines[2]);
    assert!(lines[2].ends_with("  hello"), "{}", lines[2]);

    let r = sb.run(&["sessions", "--json"]);
    let rows: Vec<Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["id"], "first");
    assert_eq!(rows[0]["events"], n_first as u64);
    assert_eq!(rows[0]["first_prompt"], "read a.txt please");
    assert_eq!(rows[1]["id"], "second");
    assert_eq!(rows[1]["events"], n_second as u64);
    assert!(rows[1]["last_time"].as_i64().is_some());
}

#[test]
fn show_prints_a_transcript_or_raw_lines() {
    let sb = populated();
    let before = sb.snapshot();
    let r = sb.run(&["show", "first"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let body: Vec<&str> = r.stdout.lines().skip(1).collect();
    assert_eq!(
        body,
        [
            "",
            "── turn 1 ──",
            "> read a.txt please",
            "→ read_file {\"path\":\"a.txt\"}",
            "← read_file:",
            "         1\talpha",
            "         2\tbeta",
            "   · step 2",
            "It says alpha and beta.",
            "── end of turn 1: completed ──",
        ]
    );
    assert!(
        r.stdout.starts_with("session first  created "),
        "{}",
        r.stdout
    );
    assert_eq!(r.stderr, "");

    let raw = sb.run(&["show", "--raw", "first"]);
    let export = sb.run(&["export", "first"]);
    let export_events: Vec<&str> = export.stdout.lines().skip(1).collect();
    assert_eq!(raw.stdout.lines().collect::<Vec<_>>(), export_events);

    // The same transcript from an exported file.
    let file = sb.write("first.jsonl", &export.stdout);
    let from_file = sb.run(&["show", file.to_str().expect("utf-8")]);
    assert_eq!(from_file.stdout, r.stdout);
    assert_eq!(sb.snapshot(), before, "show wrote to the store");
}

/// A log whose last turn is open (the process died mid-tool-call), as the original would leave it.
fn open_turn_log(export: &str) -> String {
    let mut out = String::new();
    for line in export.lines() {
        out.push_str(line);
        out.push('\n');
        if line.contains("\"type\":\"tool/call\"") {
            break;
        }
    }
    out
}

#[test]
fn check_validates_and_reports_repairs_without_writing() {
    let sb = populated();
    let before = sb.snapshot();
    let n = sb.events("first").len();
    let r = sb.run(&["check", "first"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(
        r.stdout,
        format!(
            "session first: valid, {n} events, 1 turns\nrepair: nothing to do (every turn is closed)\ntorn tail: none\n"
        )
    );
    let export = sb.run(&["export", "first"]).stdout;

    // An open last turn: check says what a load appends.
    let open = sb.write("open.jsonl", &open_turn_log(&export));
    let r = sb.run(&["check", open.to_str().expect("utf-8")]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[1],
        "repair: the last turn is open; a load appends 3 events: tool/result (TOOL_OUTCOME_UNKNOWN), step/end, turn/end (interrupted)"
    );
    // A torn tail: a final line cut short.
    let torn = sb.write("torn.jsonl", &format!("{export}{{\"type\":\"turn/st"));
    let r = sb.run(&["check", torn.to_str().expect("utf-8")]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(
        r.stdout
            .contains(&format!("torn tail: from line {}: the final line (", n + 2)),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("bytes) is not newline-terminated (1 line) (cut on load)"),
        "{}",
        r.stdout
    );
    // Damage before the last turn/end is corruption: invalid, exit 1, one line.
    let damaged = export.replacen("\"type\":\"step/start\"", "\"type\":\"step/start\",", 1);
    let bad = sb.write("bad.jsonl", &damaged);
    let r = sb.run(&["check", bad.to_str().expect("utf-8")]);
    r.assert_one_line_error(1, "the damage is inside the committed log");
    assert_eq!(sb.snapshot(), before, "check wrote to the store");
}

#[test]
fn export_then_import_round_trips_byte_for_byte() {
    let sb = populated();
    let export = sb.run(&["export", "first"]);
    assert_eq!(export.code, Some(0), "{export:#?}");
    assert!(
        export
            .stdout
            .starts_with("{\"type\":\"session\",\"version\":0,\"id\":\"first\"")
    );
    let r = sb.run(&["export", "first", "-o", "out/first.jsonl"]);
    r.assert_one_line_error(1, "out/first.jsonl");
    std::fs::create_dir(sb.path().join("out")).expect("mkdir");
    let r = sb.run(&["export", "first", "-o", "out/first.jsonl"]);
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(0), "", "")
    );
    let file = std::fs::read_to_string(sb.path().join("out/first.jsonl")).expect("exported");
    assert_eq!(file, export.stdout);
    let leftovers: Vec<_> = std::fs::read_dir(sb.path().join("out"))
        .expect("ls")
        .collect();
    assert_eq!(leftovers.len(), 1, "a temporary file was left behind");

    // Into a fresh store, under its own id; then under another id beside it.
    let other = Sandbox::new();
    let path = other.write("first.jsonl", &file);
    let r = other.run(&["import", path.to_str().expect("utf-8")]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let n = file.lines().count() - 1;
    assert_eq!(r.stdout, format!("imported session first ({n} events)\n"));
    assert_eq!(other.run(&["export", "first"]).stdout, file);
    let r = other.run(&["import", path.to_str().expect("utf-8"), "--id", "copy"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let copy = other.run(&["export", "copy"]).stdout;
    assert_eq!(
        copy,
        file.replacen("\"id\":\"first\"", "\"id\":\"copy\"", 1)
    );

    // An open turn is imported as it is (no repair): export gives it back unchanged.
    let open = other.write(
        "open.jsonl",
        &open_turn_log(&file).replacen("\"id\":\"first\"", "\"id\":\"open\"", 1),
    );
    let r = other.run(&["import", open.to_str().expect("utf-8")]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let back = other.run(&["export", "open"]);
    assert_eq!(back.stdout, std::fs::read_to_string(&open).expect("read"));
    assert_eq!(
        back.stderr,
        "note: the last turn is open; it was exported as stored (a load closes it)\n"
    );
}

// ---------------------------------------------------------------------------------------------
// dsh chat, in a pseudo-terminal

/// `dsh chat --session SESSION` in a pseudo-terminal, replaying `entries` (written to `s.json`)
/// with the script provider.
fn spawn_chat(sb: &Sandbox, session: &str, entries: Value) -> rexpect::session::PtySession {
    let script = sb.script("s.json", entries);
    let script = script.to_str().expect("utf-8");
    let mut cmd = sb.command(&["chat", "--session", session, "--script", script]);
    cmd.stdin(Stdio::inherit());
    rexpect::session::spawn_command(cmd, Some(PTY_TIMEOUT_MS)).expect("dsh chat starts in a pty")
}

fn quit(mut chat: rexpect::session::PtySession) {
    chat.send_line("/quit").expect("send /quit");
    chat.exp_eof().expect("chat exits");
    let status = chat.process().wait().expect("wait for chat");
    assert!(
        matches!(status, rexpect::process::WaitStatus::Exited(_, 0)),
        "{status:?}"
    );
}

/// The answer streams (text before the gate shows while the model is held); a line typed while the
/// model works is a steer that joins the running turn: one turn, two steps.
#[test]
fn chat_streams_and_a_typed_line_steers_the_running_turn() {
    let sb = Sandbox::new();
    let mut chat = spawn_chat(
        &sb,
        "c1",
        serde_json::json!([
            {"text": "Hello there", "gate": "g1", "gate_after_chunks": 3},
            {"text": "Got it"}
        ]),
    );
    chat.exp_string("> ").expect("prompt");
    chat.send_line("hi").expect("send");
    chat.exp_string("He")
        .expect("the first two characters stream before the gate");
    chat.send_line("also this").expect("send");
    chat.exp_string("(steer: joins the running turn at its next step)")
        .expect("steer acknowledged");
    chat.send_line("/open g1").expect("send");
    chat.exp_string("llo there")
        .expect("the rest of the first answer");
    chat.exp_string("Got it").expect("the second step's answer");
    chat.exp_string("> ").expect("the prompt comes back");
    quit(chat);
    let events = sb.events("c1");
    assert_eq!(
        of_type(&events, "turn/start").len(),
        1,
        "{:?}",
        kinds(&events)
    );
    assert_eq!(of_type(&events, "step/start").len(), 2);
    assert_eq!(
        claimed_prompts(&events),
        [(1, 1, "hi".to_string()), (1, 2, "also this".to_string())]
    );
    assert_eq!(turn_end_kinds(&events), ["completed"]);
}

/// `/queue TEXT` is a followup: its own turn after the running one.
#[test]
fn chat_queue_becomes_its_own_turn() {
    let sb = Sandbox::new();
    let mut chat = spawn_chat(
        &sb,
        "q",
        serde_json::json!([
            {"text": "first answer", "gate": "g", "gate_after_chunks": 3},
            {"text": "second answer"}
        ]),
    );
    chat.exp_string("> ").expect("prompt");
    chat.send_line("one").expect("send");
    chat.exp_string("fi").expect("streaming");
    chat.send_line("/queue two").expect("send");
    chat.exp_string("(queued as its own turn)").expect("queued");
    chat.send_line("/open g").expect("send");
    chat.exp_string("rst answer").expect("first answer");
    chat.exp_string("second answer").expect("second turn");
    chat.exp_string("> ").expect("prompt");
    quit(chat);
    let events = sb.events("q");
    assert_eq!(
        claimed_prompts(&events),
        [(1, 1, "one".to_string()), (2, 1, "two".to_string())]
    );
    assert_eq!(turn_end_kinds(&events), ["completed", "completed"]);
}

/// Ctrl-C while the model works cancels the turn (it ends `aborted`) and the prompt comes back;
/// Ctrl-C at the idle prompt exits cleanly.
#[test]
fn chat_ctrl_c_aborts_the_turn_then_exits_at_the_prompt() {
    let sb = Sandbox::new();
    let mut chat = spawn_chat(
        &sb,
        "cc",
        serde_json::json!([{"hang": "working on it"}, {"text": "fresh start"}]),
    );
    chat.exp_string("> ").expect("prompt");
    chat.send_line("go").expect("send");
    chat.exp_string("working on it")
        .expect("streamed before the hang");
    chat.send_control('c').expect("ctrl-c");
    chat.exp_string("[aborted (cancelled by the user)]")
        .expect("turn aborted");
    chat.exp_string("> ").expect("the prompt comes back");
    chat.send_line("again").expect("send");
    chat.exp_string("fresh start").expect("a new turn runs");
    chat.exp_string("> ").expect("prompt");
    chat.send_control('c').expect("ctrl-c at the prompt");
    chat.exp_eof().expect("chat exits");
    let status = chat.process().wait().expect("wait");
    assert!(
        matches!(status, rexpect::process::WaitStatus::Exited(_, 0)),
        "{status:?}"
    );
    let events = sb.events("cc");
    assert_eq!(turn_end_kinds(&events), ["aborted", "completed"]);
    let interrupted = of_type(&events, "assistant/message");
    assert_eq!(interrupted[0]["data"]["interrupted"], true);
    assert_eq!(
        interrupted[0]["data"]["message"]["content"][0]["text"],
        "working on it"
    );
}

/// End of input exits once the running turn is done; a minted id is printed on stderr.
#[test]
fn chat_from_a_pipe_answers_then_exits_at_end_of_input() {
    let sb = Sandbox::new();
    let script = sb.script("s.json", serde_json::json!([{"text": "piped answer"}]));
    let mut child = sb
        .command(&["chat", "--script", script.to_str().expect("utf-8")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dsh chat runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"hello\n").expect("write");
    }
    let r = Run::from(child.wait_with_output().expect("chat ends"));
    assert_eq!(r.code, Some(0), "{r:#?}");
    // End of input may be read before or after the answer ends; the prompt shows only in the latter.
    assert!(
        r.stdout == "> piped answer\n" || r.stdout == "> piped answer\n> \n",
        "{:?}",
        r.stdout
    );
    let first = r.stderr.lines().next().unwrap_or("");
    assert!(first.starts_with("session: s-"), "{}", r.stderr);
}

/// The read-side commands open the store read-only, without its lock: they work while a chat owns
/// it, and see what the chat has made durable.
#[test]
fn reading_commands_work_while_a_chat_holds_the_store() {
    let sb = Sandbox::new();
    let mut chat = spawn_chat(
        &sb,
        "held",
        serde_json::json!([{"text": "Held answer", "gate": "g1", "gate_after_chunks": 2}]),
    );
    chat.exp_string("> ").expect("prompt");
    chat.send_line("hello while held").expect("send");
    chat.exp_string("H").expect("the answer starts streaming");
    let r = sb.run(&["sessions"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(r.stdout.contains("held"), "{}", r.stdout);
    let r = sb.run(&["show", "held"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(r.stdout.contains("hello while held"), "{}", r.stdout);
    // The chat's script file serves as the import: whatever it holds, writing needs the lock.
    let script = sb.path().join("s.json");
    let r = sb.run(&["import", script.to_str().expect("utf-8")]);
    assert_ne!(r.code, Some(0), "writing still needs the lock: {r:#?}");
    chat.send_line("/open g1").expect("send");
    chat.exp_string("> ").expect("the prompt comes back");
    quit(chat);
}

// ---------------------------------------------------------------------------------------------
// hostile use (issue 10)

/// How long a hang guard waits before it acts: far beyond any healthy run.
const HANG_GUARD: std::time::Duration = std::time::Duration::from_secs(60);

/// A hang guard: runs `on_hang` if it is not disarmed within `HANG_GUARD`. The test itself waits
/// on the process or file it cares about; the guard only turns a hang into a failure.
struct Watchdog {
    disarm: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<bool>,
}

impl Watchdog {
    fn arm(on_hang: impl FnOnce() + Send + 'static) -> Watchdog {
        let (disarm, disarmed) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let fired = matches!(
                disarmed.recv_timeout(HANG_GUARD),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            );
            if fired {
                on_hang();
            }
            fired
        });
        Watchdog { disarm, thread }
    }

    /// Stops the guard; whether it had fired.
    fn disarm(self) -> bool {
        let _ = self.disarm.send(());
        self.thread.join().expect("the watchdog thread")
    }
}

/// Sends SIGKILL to `pid`.
fn kill_pid(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Waits for a child that must end by itself; a hang guard kills it and fails the test if it has
/// not ended (the bug this guards against is a process that never exits).
fn wait_bounded(child: std::process::Child, what: &str) -> Run {
    let pid = child.id();
    let guard = Watchdog::arm(move || kill_pid(pid));
    let out = child.wait_with_output().expect("collect the output");
    let hung = guard.disarm();
    let run = Run::from(out);
    assert!(
        !hung,
        "{what}: still running after {HANG_GUARD:?}, killed: {run:#?}"
    );
    run
}

/// A `dsh` invocation with piped output, hang-guarded.
fn run_bounded(cmd: &mut Command, what: &str) -> Run {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dsh runs");
    wait_bounded(child, what)
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
}

/// A single tool call, then a final text.
fn one_call(sb: &Sandbox, tool: &str, args: Value, answer: &str) -> PathBuf {
    sb.script(
        "s.json",
        serde_json::json!([
            {"tool_calls": [{"id": "c1", "name": tool, "arguments": args.to_string()}]},
            {"text": answer}
        ]),
    )
}

/// Item 1: `read_file` on a FIFO used to block the turn forever (and the process after it).
#[test]
fn read_file_refuses_a_fifo_without_blocking() {
    let sb = Sandbox::new();
    mkfifo(&sb.path().join("fifo"));
    let script = one_call(
        &sb,
        "read_file",
        serde_json::json!({"path": "fifo"}),
        "done",
    );
    let r = run_bounded(
        &mut sb.command(&[
            "run",
            "--session",
            "f",
            "--script",
            script.to_str().expect("utf-8"),
            "read it",
        ]),
        "dsh run reading a FIFO",
    );
    assert_eq!((r.code, r.stdout.as_str()), (Some(0), "done\n"), "{r:#?}");
    let events = sb.events("f");
    let result = &of_type(&events, "tool/result")[0]["data"];
    assert_eq!(result["error"]["code"], "NOT_A_FILE", "{result}");
    assert_eq!(
        result["message"]["content"][0]["content"][0]["text"],
        "Error: fifo: is not a regular file (a FIFO, socket or device); only regular files are read"
    );
}

/// Item 2, as it was found: the shell tool reads `dsh`'s own environment block through `/proc`.
#[test]
fn the_shell_tool_cannot_read_the_api_key() {
    const CANARY: &str = "sk-canary-7f3a9c1e5b";
    let sb = Sandbox::new();
    let command = "tr '\\0' '\\n' </proc/$PPID/environ; echo ---; tr '\\0' '\\n' </proc/self/environ; \
                   echo ---; env; echo ---; cat /proc/$PPID/cmdline";
    let script = one_call(
        &sb,
        "shell",
        serde_json::json!({"command": command}),
        "looked",
    );
    for var in ["DEEPSEEK_API_KEY", "OPENAI_API_KEY"] {
        let session = format!("k-{}", var.to_lowercase().replace('_', "-"));
        let r = Run::from(
            sb.command(&[
                "run",
                "--shell",
                "--session",
                &session,
                "--script",
                script.to_str().expect("utf-8"),
                "look",
            ])
            .env(var, CANARY)
            .output()
            .expect("dsh runs"),
        );
        assert_eq!((r.code, r.stdout.as_str()), (Some(0), "looked\n"), "{r:#?}");
        assert!(!r.stderr.contains(CANARY), "{r:#?}");
        let export = sb.run(&["export", &session]);
        assert_eq!(export.code, Some(0), "{export:#?}");
        let text = export.stdout;
        // The command did read dsh's environment block (PATH is in it), but not the key.
        let output = text
            .lines()
            .find(|l| l.contains("\"type\":\"tool/result\""))
            .expect("a tool result");
        assert!(output.contains("PATH="), "{output}");
        assert!(
            !text.contains(CANARY),
            "{var} leaked into the log: {output}"
        );
        assert!(
            !text.contains(var),
            "{var} is still named in the environment: {output}"
        );
    }
}

/// Item 3: `export -o` used to rename over a symlink or a FIFO, replacing the link or node.
#[test]
fn export_refuses_a_target_that_is_not_a_regular_file() {
    let sb = populated();
    let outside = tempfile::tempdir().expect("tempdir");
    let target = outside.path().join("target.txt");
    std::fs::write(&target, "keep me").expect("write");
    std::os::unix::fs::symlink(&target, sb.path().join("link.jsonl")).expect("symlink");
    mkfifo(&sb.path().join("fifo.jsonl"));
    std::fs::create_dir(sb.path().join("dir.jsonl")).expect("mkdir");
    for (name, kind) in [
        ("link.jsonl", "a symbolic link"),
        ("fifo.jsonl", "a FIFO"),
        ("dir.jsonl", "a directory"),
    ] {
        let r = sb.run(&["export", "first", "-o", name]);
        r.assert_one_line_error(
            1,
            &format!("{name}: exists and is not a regular file ({kind}); refusing to replace it"),
        );
    }
    use std::os::unix::fs::FileTypeExt;
    let meta = |n: &str| std::fs::symlink_metadata(sb.path().join(n)).expect("stat");
    assert!(meta("link.jsonl").file_type().is_symlink());
    assert!(meta("fifo.jsonl").file_type().is_fifo());
    assert!(meta("dir.jsonl").is_dir());
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "keep me");
    // A regular file is still replaced whole.
    sb.write("plain.jsonl", "old");
    let r = sb.run(&["export", "first", "-o", "plain.jsonl"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(
        std::fs::read_to_string(sb.path().join("plain.jsonl")).expect("read"),
        sb.run(&["export", "first"]).stdout
    );
}

/// Item 4: an answer that cannot be written is an error; a closed pipe stays a quiet exit.
#[test]
fn run_fails_when_its_answer_cannot_be_written() {
    let sb = Sandbox::new();
    let script = sb.script("s.json", serde_json::json!([{"text": "the answer"}]));
    let script = script.to_str().expect("utf-8");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let r = Run::from(
        sb.command(&["run", "--session", "full", "--script", script, "hi"])
            .stdout(full)
            .output()
            .expect("dsh runs"),
    );
    assert_eq!(r.code, Some(1), "{r:#?}");
    assert_eq!(
        r.stderr,
        "dsh: writing the answer: No space left on device (os error 28)\n"
    );

    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let r = Run::from(
        sb.command(&["run", "--session", "closed", "--script", script, "hi"])
            .stdout(writer)
            .output()
            .expect("dsh runs"),
    );
    assert_eq!((r.code, r.stderr.as_str()), (Some(0), ""), "{r:#?}");
}

/// Item 8: escapes in model text, tool arguments and paths are shown, never sent to the terminal.
#[test]
fn terminal_escapes_are_shown_not_obeyed() {
    let sb = Sandbox::new();
    let hostile = "title\u{1b}]0;pwned\u{7}clear\u{1b}[2J\u{9b}1m";
    let script = sb.script(
        "s.json",
        serde_json::json!([
            {"text": format!("think {hostile}"),
             "tool_calls": [{"id": "c1", "name": "read_file",
                             "arguments": serde_json::json!({"path": hostile}).to_string()}]},
            {"text": format!("answer {hostile}")}
        ]),
    );
    let script = script.to_str().expect("utf-8");
    let shown = "title^[]0;pwned^Gclear^[[2J\\u{9b}1m";
    let r = sb.run(&["run", "--session", "esc", "--script", script, "hi"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let show = sb.run(&["show", "esc"]);
    assert_eq!(show.code, Some(0), "{show:#?}");
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    assert!(!show.stdout.chars().any(bad), "{:?}", show.stdout);
    assert!(
        show.stdout.contains(&format!("answer {shown}")),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains(&format!("think {shown}")),
        "{}",
        show.stdout
    );
    assert!(
        show.stdout.contains(&format!("Error: {shown}: ")),
        "{}",
        show.stdout
    );
    // --raw stays exact.
    let raw = sb.run(&["show", "--raw", "esc"]);
    assert!(
        raw.stdout.contains("answer title\\u001b]0;pwned\\u0007"),
        "{}",
        raw.stdout
    );

    // dsh chat renders the streamed answer the same way.
    let mut child = sb
        .command(&["chat", "--session", "esc2", "--script", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dsh chat runs");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"hi\n").expect("write");
    }
    let r = wait_bounded(child, "dsh chat");
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(!r.stdout.chars().any(bad), "{:?}", r.stdout);
    assert!(
        r.stdout.contains(&format!("answer {shown}")),
        "{}",
        r.stdout
    );
}

/// Item 9: an error that echoes a 5 MB value is one bounded line.
#[test]
fn error_lines_are_bounded() {
    let sb = populated();
    let export = sb.run(&["export", "first"]).stdout;
    let mut lines = export.lines();
    let mut header: Value = serde_json::from_str(lines.next().expect("header")).expect("JSON");
    header["id"] = Value::String("x".repeat(5 << 20));
    let mut file = header.to_string();
    for l in lines {
        file.push('\n');
        file.push_str(l);
    }
    file.push('\n');
    sb.write("huge.jsonl", &file);
    let before = sb.snapshot();
    for args in [
        vec!["import", "huge.jsonl"],
        vec!["show", "huge.jsonl"],
        vec!["check", "huge.jsonl"],
    ] {
        let r = sb.run(&args);
        assert_eq!(
            r.code,
            Some(1),
            "{args:?}: {}",
            &r.stderr[..r.stderr.len().min(300)]
        );
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}");
        assert!(r.stderr.starts_with("dsh: "), "{args:?}");
        assert!(
            r.stderr.chars().count() <= 420,
            "{args:?}: {} chars",
            r.stderr.len()
        );
        // The echoed id itself is cut (at the source, by the importer), not only the whole line.
        assert!(
            r.stderr.contains(&format!("\"{}…\"", "x".repeat(200))),
            "{args:?}: {}",
            r.stderr
        );
    }
    assert_eq!(sb.snapshot(), before);
    // An echoed argument too.
    let long_id = "y".repeat(100_000);
    let r = sb.run(&["export", &long_id]);
    assert_eq!(r.code, Some(64), "{}", &r.stderr[..r.stderr.len().min(300)]);
    assert!(r.stderr.chars().count() <= 420, "{} chars", r.stderr.len());
}

/// Item 10: an over-long input line is refused without holding it whole; the next line is read.
#[test]
fn chat_refuses_an_over_long_line_and_reads_on() {
    let sb = Sandbox::new();
    let script = sb.script("s.json", serde_json::json!([{"text": "short answer"}]));
    let mut child = sb
        .command(&["chat", "--script", script.to_str().expect("utf-8")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dsh chat runs");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || {
        use std::io::Write;
        let long = vec![b'a'; 3 << 20];
        stdin.write_all(&long).expect("write");
        stdin.write_all(b"\nhello\n").expect("write");
    });
    let r = wait_bounded(child, "dsh chat");
    writer.join().expect("writer");
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(
        r.stdout.starts_with(
            "> \n[cannot read input: the line is 3145728 bytes, over the limit of 1048576; it was not sent]\nshort answer\n"
        ),
        "{:?}",
        r.stdout
    );
}

/// Item 11: errors inside `[sim]` and `[openai]` name the dotted key, and every error the value.
#[test]
fn configuration_errors_name_the_dotted_key_and_the_value() {
    for (toml, want) in [
        (
            "[sim]\nseed = \"x\"\n",
            "dsh: config dsh.toml: key `sim.seed`: invalid type: string \"x\", expected u64\n",
        ),
        (
            "[openai]\nconnect_timeout_ms = true\n",
            "dsh: config dsh.toml: key `openai.connect_timeout_ms`: invalid type: boolean `true`, expected u64\n",
        ),
        (
            "max_tokens = 0\n",
            "dsh: config dsh.toml: key `max_tokens`: expected a positive integer, got integer 0\n",
        ),
    ] {
        let sb = Sandbox::new();
        sb.write("dsh.toml", toml);
        let r = sb.run(&["sessions"]);
        assert_eq!((r.code, r.stderr.as_str()), (Some(64), want), "{toml}");
    }
}

/// Item 12: a bad command line is one `dsh:` line with a hint, exit 2.
#[test]
fn argument_errors_are_one_line_with_a_hint() {
    let sb = Sandbox::new();
    for (args, want) in [
        (
            vec!["run"],
            "dsh: the following required arguments were not provided: <PROMPT> (see dsh run --help)",
        ),
        (
            vec!["run", "--bogus", "hi"],
            "dsh: unexpected argument '--bogus' found; tip: to pass '--bogus' as a value, use '-- --bogus' (see dsh run --help)",
        ),
        (
            vec!["run", "--max-tokens", "0", "hi"],
            "dsh: invalid value '0' for '--max-tokens <N>': 0 is not in 1..18446744073709551615 (see dsh run --help)",
        ),
        (
            vec!["frobnicate"],
            "dsh: unrecognized subcommand 'frobnicate' (see dsh --help)",
        ),
        (vec![], "dsh: a subcommand is required (see dsh --help)"),
    ] {
        let r = sb.run(&args);
        assert_eq!(r.code, Some(2), "{args:?}: {r:#?}");
        assert_eq!(r.stderr, format!("{want}\n"), "{args:?}");
        assert_eq!(r.stdout, "");
    }
    let help = sb.run(&["run", "--help"]);
    assert_eq!(help.code, Some(0));
    assert!(help.stdout.contains("Usage: dsh run"), "{help:#?}");
}

/// Item 15: SIGKILL of `dsh` used to leave the shell command running to finish its side effects.
#[test]
fn shell_commands_die_with_dsh() {
    use rustix::process::{Pid, WaitOptions};
    // Orphans of this test process are re-parented to it, so it can wait for them.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid())).expect("subreaper");
    let sb = Sandbox::new();
    let pid_fifo = sb.path().join("pid");
    mkfifo(&pid_fifo);
    // The write blocks until this test reads, so the command is known to run when `$$` arrives.
    let command = "echo $$ > pid; sleep 30; touch marker";
    let script = one_call(
        &sb,
        "shell",
        serde_json::json!({"command": command}),
        "slept",
    );
    let mut child = sb
        .command(&[
            "run",
            "--shell",
            "--script",
            script.to_str().expect("utf-8"),
            "go",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("dsh runs");
    // If the command never starts, the guard opens the FIFO for writing: the read then ends empty.
    let unblock = pid_fifo.clone();
    let guard = Watchdog::arm(move || {
        let _ = std::fs::OpenOptions::new().write(true).open(unblock);
    });
    let text = std::fs::read_to_string(&pid_fifo).expect("read the pid");
    assert!(!guard.disarm(), "the command never started");
    let sh: i32 = text.trim().parse().expect("a pid");
    // The group's id: field 5 of /proc/PID/stat (after the parenthesised command name).
    let stat = std::fs::read_to_string(format!("/proc/{sh}/stat")).expect("sh runs");
    let pgid: i32 = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.split(' ').nth(2))
        .and_then(|f| f.parse().ok())
        .expect("a process group id");
    child.kill().expect("SIGKILL dsh");
    child.wait().expect("reap dsh");
    // Every process of the command's group is now this process's child: wait for each to end.
    // None may end by exiting: each must have been killed (a hang guard kills what is left, and
    // then the test fails).
    let group = Pid::from_raw(pgid).expect("a pid");
    let guard = Watchdog::arm(move || {
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
    });
    let mut reaped = Vec::new();
    loop {
        match rustix::process::waitpgid(group, WaitOptions::empty()) {
            Ok(Some((pid, status))) => reaped.push((pid.as_raw_nonzero().get(), status)),
            Ok(None) => {}
            Err(rustix::io::Errno::CHILD) => break,
            Err(e) => panic!("waitpgid: {e}"),
        }
    }
    assert!(
        !guard.disarm(),
        "the command's group outlived dsh: {reaped:?}"
    );
    assert!(reaped.iter().any(|(pid, _)| *pid == sh), "{reaped:?}");
    for (pid, status) in &reaped {
        assert!(
            status.terminating_signal().is_some(),
            "{pid} was not killed: {status:?} (sh {sh}, all {reaped:?})"
        );
    }
    assert!(!sb.path().join("marker").exists());
}

/// Item 16: each retry is announced on stderr, and the whole sequence is bounded.
#[test]
fn retries_are_announced_and_bounded() {
    let sb = Sandbox::new();
    let script = sb.script(
        "s.json",
        serde_json::json!([
            {"error": {"code": "TIMEOUT", "message": "no bytes for 300 s"}},
            {"text": "recovered"}
        ]),
    );
    let script = script.to_str().expect("utf-8");
    let r = sb.run(&["run", "--session", "r1", "--script", script, "hi"]);
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (Some(0), "recovered\n"),
        "{r:#?}"
    );
    let line = r
        .stderr
        .lines()
        .find(|l| l.contains("retrying"))
        .unwrap_or("");
    assert!(
        line.starts_with("dsh: retrying in 0.")
            && line.ends_with(" s after TIMEOUT (attempt 2 of 6)"),
        "{r:#?}"
    );

    let r = sb.run(&[
        "run",
        "--session",
        "r2",
        "--retry-timeout-ms",
        "1",
        "--script",
        script,
        "hi",
    ]);
    assert_eq!(r.code, Some(2), "{r:#?}");
    assert!(
        r.stderr.contains("dsh: not retrying TIMEOUT: the retries of this request have taken 0 s (limit 0 s; retry_timeout_ms in dsh.toml)"),
        "{r:#?}"
    );
    assert!(
        r.stderr
            .contains("dsh: the turn failed: TIMEOUT no bytes for 300 s"),
        "{r:#?}"
    );
    assert_eq!(turn_end_kinds(&sb.events("r2")), ["error"]);
    assert!(of_type(&sb.events("r2"), "llm/retry").is_empty());
}

/// Issue 14: `export --zstd` writes the original's default layout (`session.jsonl.zstd`), and
/// `import`, `show FILE` and `check FILE` read it as they read the plain log.
#[test]
fn zstd_export_imports_shows_and_checks_like_the_plain_log() {
    let sb = populated();
    let plain = sb.run(&["export", "first"]).stdout;
    let plain_path = sb.write("first.jsonl", &plain);
    let r = sb.run(&["export", "first", "--zstd", "-o", "first.jsonl.zstd"]);
    assert_eq!(
        (r.code, r.stdout.as_str(), r.stderr.as_str()),
        (Some(0), "", "")
    );
    let zst_path = sb.path().join("first.jsonl.zstd");
    let bytes = std::fs::read(&zst_path).expect("exported");
    assert_eq!(bytes[..4], [0x28, 0xB5, 0x2F, 0xFD], "zstd magic bytes");
    let (plain_arg, zst_arg) = (
        plain_path.to_str().expect("utf-8"),
        zst_path.to_str().expect("utf-8"),
    );
    for cmd in ["show", "check"] {
        let from_plain = sb.run(&[cmd, plain_arg]);
        let from_zstd = sb.run(&[cmd, zst_arg]);
        assert_eq!(from_plain.code, Some(0), "{cmd}: {from_plain:#?}");
        assert_eq!(
            (from_zstd.code, from_zstd.stdout.replace(zst_arg, plain_arg)),
            (from_plain.code, from_plain.stdout.clone()),
            "{cmd} of the zstd file"
        );
    }
    let other = Sandbox::new();
    let r = other.run(&["import", zst_arg]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(other.run(&["export", "first"]).stdout, plain);
}

/// `dsh compact ID` (SPEC §15): the summariser answers from the script; the older exchange becomes a
/// checkpoint, the log keeps every event, and the next run's request starts with the checkpoint. A
/// missing session and a session with nothing to compact are one-line errors that write nothing.
#[test]
fn compact_replaces_the_older_history_with_a_checkpoint() {
    let sb = Sandbox::new();
    let answers = sb.script(
        "a.json",
        serde_json::json!([{"text": "one"}, {"text": "two"}]),
    );
    let summary = sb.script("s.json", serde_json::json!([{"text": "the summary"}]));
    let answers = answers.to_str().expect("utf-8");
    let summary = summary.to_str().expect("utf-8");
    let failing = sb.script(
        "f.json",
        serde_json::json!([{"error": {"code": "AUTH", "message": "no", "status": 401}}]),
    );
    let failing = failing.to_str().expect("utf-8");
    let r = sb.run(&["compact", "missing", "--script", summary]);
    r.assert_one_line_error(1, "missing");
    // A history of one message (the prompt of a failed turn) has nothing to compact.
    let r = sb.run(&["run", "--session", "one", "--script", failing, "alone"]);
    assert_eq!(r.code, Some(2), "{r:#?}");
    let n_one = sb.events("one").len();
    let r = sb.run(&["compact", "one", "--script", summary]);
    r.assert_one_line_error(1, "nothing to compact");
    assert!(
        !kinds(&sb.events("one")[n_one..])
            .iter()
            .any(|k| k.starts_with("compaction/")),
        "a refused compaction writes no compaction event"
    );
    let r = sb.run(&["run", "--session", "w", "--script", answers, "first"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let r = sb.run(&["run", "--session", "w", "--script", answers, "second"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let n = sb.events("w").len();
    let r = sb.run(&["compact", "w", "--script", summary]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(
        r.stdout.starts_with("compacted 3 messages (~"),
        "{}",
        r.stdout
    );
    let events = sb.events("w");
    let added: Vec<String> = kinds(&events[n..]);
    assert_eq!(
        added,
        [
            "session/end-seed",
            "compaction/start",
            "compaction/summary",
            "user/message",
            "compaction/end"
        ]
    );
    let checkpoint = &events[n + 3];
    assert_eq!(checkpoint["data"]["source"]["plugin"], "compact");
    assert_eq!(checkpoint["data"]["content"][1]["text"], "the summary");
    assert_eq!(checkpoint["surfaceOp"]["op"], "replace");
    let r = sb.run(&["check", "w"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
}
