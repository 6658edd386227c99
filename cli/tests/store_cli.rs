//! The read commands against a store in trouble, run as a user runs them (the built binary in a
//! temporary working directory, its data directory `./.dsh`, a scripted model):
//!
//! - after a crash, `check`, `sessions`, `show` and `export` read the acknowledged turns from the
//!   `-wal` and leave every file of the data directory byte-identical;
//! - they read a store the user can only read (run as `nobody` through `setpriv` when the tests run
//!   as root, whom file permissions do not bind);
//! - a damaged row is corruption: `check` names every damaged seq, `run` refuses to continue the
//!   session and deletes nothing, `sessions` lists the readable sessions, names the damaged one on
//!   stderr and exits 1.

mod sandbox;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use dsh::SessionId;
use dsh::session::event::SessionHeader;
use dsh::session::store::sqlite::{DB_FILE_NAME, SqliteConfig, SqliteStore};
use dsh::session::store::{EncodedEvent, SessionStore};
use sandbox::{Run, Sandbox, dsh_bin, scrub};
use serde_json::Value;

/// A string that occurs nowhere in a store but in the prompt that carries it.
const MARKER: &str = "ZQXJMARKZQXJ";

impl Sandbox {
    /// `dsh ARGS` as a user who can only read the data directory: the directories are made 0555 and
    /// the files 0444, and when the tests run as root (whom permission bits do not bind) `dsh` runs
    /// as `nobody` through `setpriv`. The permissions are restored before this returns.
    fn run_as_reader(&self, args: &[&str]) -> Run {
        use std::os::unix::fs::PermissionsExt;
        let set = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .expect("set permissions");
        };
        let files: Vec<PathBuf> = std::fs::read_dir(self.data_dir())
            .expect("a data directory")
            .map(|e| e.expect("a directory entry").path())
            .collect();
        for f in &files {
            set(f, 0o444);
        }
        set(&self.data_dir(), 0o555);
        set(self.path(), 0o555);
        let mut cmd = if rustix::process::geteuid().is_root() {
            let mut cmd = Command::new("setpriv");
            cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(dsh_bin());
            cmd
        } else {
            Command::new(dsh_bin())
        };
        cmd.args(args)
            .current_dir(self.path())
            .env("NO_COLOR", "1")
            .env("HOME", self.path())
            .stdin(Stdio::null());
        scrub(&mut cmd);
        let out = cmd
            .output()
            .expect("dsh runs (as nobody through setpriv, when root)");
        set(self.path(), 0o700);
        set(&self.data_dir(), 0o700);
        for f in &files {
            set(f, 0o600);
        }
        Run::from(out)
    }

    /// `dsh run --session ID PROMPT` against a model that answers `answer`.
    fn converse(&self, id: &str, prompt: &str, answer: &str) {
        let script = self.path().join(format!("{id}.json"));
        std::fs::write(&script, serde_json::json!([{ "text": answer }]).to_string())
            .expect("write the script");
        let script = script.to_str().expect("utf-8 path");
        let r = self.run(&["run", "--session", id, "--script", script, prompt]);
        assert_eq!(r.code, Some(0), "{r:#?}");
    }

    /// Every file of the data directory with its bytes.
    fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(self.data_dir())
            .expect("a data directory")
            .map(|e| {
                let e = e.expect("a directory entry");
                let bytes = std::fs::read(e.path()).expect("read a store file");
                (e.file_name().to_string_lossy().into_owned(), bytes)
            })
            .collect()
    }

    /// The seqs of the stored events of `id` whose JSON holds `needle`, read with `dsh export`.
    fn seqs_holding(&self, id: &str, needle: &str) -> Vec<u64> {
        let r = self.run(&["export", id]);
        assert_eq!(r.code, Some(0), "{r:#?}");
        r.stdout
            .lines()
            .skip(1)
            .filter(|l| l.contains(needle))
            .map(|l| {
                let event: Value = serde_json::from_str(l).expect("an event line is JSON");
                event["seq"].as_u64().expect("a seq")
            })
            .collect()
    }
}

/// A data directory as a crash leaves it: sessions `first` and `second` checkpointed into the
/// database file by clean runs, then `third` (a copy of `first`'s log) acknowledged by a writer
/// that dies before closing — its rows only in the `-wal`, the `-shm` as the writer left it.
fn crashed() -> Sandbox {
    let sb = Sandbox::new();
    sb.converse("first", "hello first", "Hi first!");
    sb.converse("second", "hello second", "Hi second!");
    let crashed = Sandbox::new();
    std::fs::create_dir(crashed.data_dir()).expect("a data directory");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store =
            SqliteStore::open(&sb.data_dir(), SqliteConfig::default()).expect("open the store");
        let first = SessionId::new("first").expect("an id");
        let events = store.load(&first).await.expect("load first").events;
        let third = SessionId::new("third").expect("an id");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        store
            .create(&SessionHeader::new(third.clone(), now_ms))
            .await
            .expect("create third");
        let encoded: Vec<EncodedEvent> = events.iter().map(EncodedEvent::encode).collect();
        store.append(&third, encoded).await.expect("append third");
        for (name, bytes) in sb.snapshot() {
            std::fs::write(crashed.data_dir().join(name), bytes).expect("copy a store file");
        }
        store.close().await.expect("close the store");
    });
    crashed
}

/// After a crash, every read command sees the turns acknowledged only in the `-wal` and leaves the
/// data directory byte-identical, `-wal` and `-shm` included. (Before, the first read command
/// checkpointed the WAL and deleted `-wal` and `-shm`.)
#[test]
fn read_commands_leave_a_crashed_store_byte_identical() {
    let sb = crashed();
    let before = sb.snapshot();
    let names: Vec<&str> = before.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "sessions.lock",
            "sessions.sqlite3",
            "sessions.sqlite3-shm",
            "sessions.sqlite3-wal"
        ]
    );

    let r = sb.run(&["check", "third"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(r.stdout.starts_with("session third: valid, "), "{r:#?}");
    assert!(sb.snapshot() == before, "dsh check changed the store");

    let r = sb.run(&["sessions", "--json"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let ids: Vec<String> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json")["id"].to_string())
        .collect();
    assert_eq!(ids, [r#""first""#, r#""second""#, r#""third""#]);
    assert!(sb.snapshot() == before, "dsh sessions changed the store");

    let r = sb.run(&["show", "third"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(r.stdout.contains("hello first"), "{r:#?}");
    assert!(sb.snapshot() == before, "dsh show changed the store");

    let r = sb.run(&["export", "third"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert!(r.stdout.contains("Hi first!"), "{r:#?}");
    assert!(sb.snapshot() == before, "dsh export changed the store");
}

/// Every read command works on a store the user can only read, cleanly closed or left by a crash,
/// and changes nothing. (Before, the read connection was opened read-write, and on a cleanly closed
/// store SQLite refused it: "attempt to write a readonly database".)
#[test]
fn read_commands_work_on_a_store_the_user_can_only_read() {
    let clean = Sandbox::new();
    clean.converse("first", "hello first", "Hi first!");
    for sb in [clean, crashed()] {
        let before = sb.snapshot();
        let r = sb.run_as_reader(&["sessions", "--json"]);
        assert_eq!(r.code, Some(0), "{r:#?}");
        assert!(r.stdout.starts_with(r#"{"id":"first","#), "{r:#?}");
        let r = sb.run_as_reader(&["check", "first"]);
        assert_eq!(r.code, Some(0), "{r:#?}");
        assert!(r.stdout.starts_with("session first: valid, "), "{r:#?}");
        let r = sb.run_as_reader(&["show", "first"]);
        assert_eq!(r.code, Some(0), "{r:#?}");
        assert!(r.stdout.contains("hello first"), "{r:#?}");
        let r = sb.run_as_reader(&["export", "first"]);
        assert_eq!(r.code, Some(0), "{r:#?}");
        assert!(r.stdout.contains("Hi first!"), "{r:#?}");
        assert!(sb.snapshot() == before, "a read command changed the store");
    }
}

/// Two sessions; every row of `second` that holds the prompt is damaged in the database file (a
/// quote written into the JSON string). Returns the damaged seqs.
fn damaged() -> (Sandbox, Vec<u64>) {
    let sb = Sandbox::new();
    sb.converse("first", "hello first", "Hi first!");
    sb.converse("second", &format!("hello {MARKER}"), "Hi second!");
    let seqs = sb.seqs_holding("second", MARKER);
    assert!(!seqs.is_empty());
    let db = sb.data_dir().join(DB_FILE_NAME);
    let bytes = std::fs::read(&db).expect("read the database");
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes.as_slice();
    let mut n_found = 0;
    while let Some(at) = rest
        .windows(MARKER.len())
        .position(|w| w == MARKER.as_bytes())
    {
        out.extend_from_slice(&rest[..at]);
        out.push(b'"');
        out.extend(std::iter::repeat_n(b'x', MARKER.len() - 1));
        rest = &rest[at + MARKER.len()..];
        n_found += 1;
    }
    out.extend_from_slice(rest);
    assert_eq!(
        n_found,
        seqs.len(),
        "the marker is in the database file once per row"
    );
    std::fs::write(&db, out).expect("write the database");
    (sb, seqs)
}

/// `damaged rows (seq 0, 4)`: how the store names the damaged seqs.
fn named(seqs: &[u64]) -> String {
    let list: Vec<String> = seqs.iter().map(u64::to_string).collect();
    format!(
        "{} damaged row{} (seq {}); the first: ",
        seqs.len(),
        if seqs.len() == 1 { "" } else { "s" },
        list.join(", ")
    )
}

/// A damaged row is corruption, wherever it lies: `check` names every damaged seq and exits 1, and
/// `run` refuses to continue the session and writes nothing. (Before, a damaged row after the last
/// `turn/end` was a torn tail that `run` deleted for good.)
#[test]
fn a_damaged_row_is_named_by_check_and_refused_by_run() {
    let (sb, seqs) = damaged();
    let r = sb.run(&["check", "second"]);
    assert_eq!((r.code, r.stdout.as_str()), (Some(1), ""), "{r:#?}");
    let expected = format!(
        "dsh: invalid: stored session second failed validation at seq {}: {}",
        seqs[0],
        named(&seqs)
    );
    assert!(r.stderr.starts_with(&expected), "{expected:?} {r:#?}");
    assert!(
        r.stderr
            .ends_with("(a committed row cannot tear, so this session cannot be continued)\n"),
        "{r:#?}"
    );

    let db = std::fs::read(sb.data_dir().join(DB_FILE_NAME)).expect("read the database");
    let script = sb.path().join("more.json");
    std::fs::write(&script, r#"[{"text":"more"}]"#).expect("write the script");
    let script = script.to_str().expect("utf-8 path");
    let r = sb.run(&["run", "--session", "second", "--script", script, "more"]);
    assert_eq!(r.code, Some(1), "{r:#?}");
    assert!(r.stderr.contains(&named(&seqs)), "{r:#?}");
    assert!(
        std::fs::read(sb.data_dir().join(DB_FILE_NAME)).expect("read the database") == db,
        "a refused run changed the database"
    );
    // The healthy session is untouched.
    let r = sb.run(&["check", "first"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
}

/// `sessions` lists every readable session, names the damaged one on stderr and exits 1, as a table
/// and as JSON lines. (Before, it listed the damaged session with its error in the prompt column
/// and exited 0.)
#[test]
fn sessions_lists_the_readable_and_names_the_damaged() {
    let (sb, seqs) = damaged();
    let damage = format!(
        "dsh: session second cannot be read: invalid: stored session second failed validation at \
         seq {}: {}",
        seqs[0],
        named(&seqs)
    );
    let r = sb.run(&["sessions"]);
    assert_eq!(r.code, Some(1), "{r:#?}");
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{r:#?}");
    assert!(lines[0].starts_with("ID "), "{r:#?}");
    assert!(lines[1].starts_with("first "), "{r:#?}");
    assert!(lines[1].ends_with("  hello first"), "{r:#?}");
    let errors: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(errors.len(), 2, "{r:#?}");
    assert!(errors[0].starts_with(&damage), "{damage:?} {r:#?}");
    assert_eq!(errors[1], "dsh: 1 damaged session not listed");

    let r = sb.run(&["sessions", "--json"]);
    assert_eq!(r.code, Some(1), "{r:#?}");
    let rows: Vec<Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(rows.len(), 1, "{r:#?}");
    assert_eq!(rows[0]["id"], "first");
    assert!(r.stderr.starts_with(&damage), "{r:#?}");
}
