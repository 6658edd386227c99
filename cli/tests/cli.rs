//! The `dsh` command line, tested as a user runs it: the built binary, in a temporary working
//! directory with its own data directory, with a scripted model (`--script`) so every answer is
//! exact. `dsh chat` runs in a pseudo-terminal (rexpect), so Ctrl-C is a real SIGINT from the
//! terminal driver and streamed text is read as the user would see it.
//!
//! The binary is this package's own (`CARGO_BIN_EXE_dsh`, or `DSH_BIN` when set). Waits are for
//! output or files, never for time; rexpect's timeout only turns a hang into a failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// Bounds a pty read: a hang fails the test instead of blocking it forever.
const PTY_TIMEOUT_MS: u64 = 60_000;

/// The `dsh` binary: cargo builds it for this package's integration tests (or `DSH_BIN` names one).
fn dsh_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("DSH_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => PathBuf::from(env!("CARGO_BIN_EXE_dsh")),
    })
}

/// A working directory for one test, with the default data directory `./.dsh` inside it.
struct Sandbox {
    dir: tempfile::TempDir,
}

/// Environment variables that would leak the developer's setup into a test.
const SCRUBBED_VARS: [&str; 9] = [
    "DSH_LOG",
    "DSH_DATA_DIR",
    "DSH_PROVIDER",
    "DSH_BASE_URL",
    "DSH_MODEL",
    "DSH_CONFIG",
    "DEEPSEEK_API_KEY",
    "OPENAI_API_KEY",
    "DEEPSEEK_BASE_URL",
];

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn data_dir(&self) -> PathBuf {
        self.path().join(".dsh")
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path().join(name);
        std::fs::write(&p, text).expect("write a test file");
        p
    }

    /// A script file of model entries.
    fn script(&self, name: &str, entries: Value) -> PathBuf {
        self.write(name, &entries.to_string())
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(dsh_bin());
        cmd.args(args)
            .current_dir(self.path())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        for var in SCRUBBED_VARS {
            cmd.env_remove(var);
        }
        cmd
    }

    fn run(&self, args: &[&str]) -> Run {
        Run::from(self.command(args).output().expect("dsh runs"))
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

/// What a finished `dsh` process left.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
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
            "config dsh.toml: key `sim`: unknown field `seeed`",
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

fn spawn_chat(sb: &Sandbox, args: &[&str]) -> rexpect::session::PtySession {
    let mut cmd = sb.command(&[&["chat"], args].concat());
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
    let script = sb.script(
        "s.json",
        serde_json::json!([
            {"text": "Hello there", "gate": "g1", "gate_after_chunks": 3},
            {"text": "Got it"}
        ]),
    );
    let mut chat = spawn_chat(
        &sb,
        &[
            "--session",
            "c1",
            "--script",
            script.to_str().expect("utf-8"),
        ],
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
    let script = sb.script(
        "s.json",
        serde_json::json!([
            {"text": "first answer", "gate": "g", "gate_after_chunks": 3},
            {"text": "second answer"}
        ]),
    );
    let mut chat = spawn_chat(
        &sb,
        &[
            "--session",
            "q",
            "--script",
            script.to_str().expect("utf-8"),
        ],
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
    let script = sb.script(
        "s.json",
        serde_json::json!([{"hang": "working on it"}, {"text": "fresh start"}]),
    );
    let mut chat = spawn_chat(
        &sb,
        &[
            "--session",
            "cc",
            "--script",
            script.to_str().expect("utf-8"),
        ],
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
    let script = sb.script(
        "s.json",
        serde_json::json!([{"text": "Held answer", "gate": "g1", "gate_after_chunks": 2}]),
    );
    let mut chat = spawn_chat(
        &sb,
        &[
            "--session",
            "held",
            "--script",
            script.to_str().expect("utf-8"),
        ],
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
    let r = sb.run(&["import", script.to_str().expect("utf-8")]);
    assert_ne!(r.code, Some(0), "writing still needs the lock: {r:#?}");
    chat.send_line("/open g1").expect("send");
    chat.exp_string("> ").expect("the prompt comes back");
    quit(chat);
}
