//! Conformance tests of the session stores (`SqliteStore`, `MemoryStore`): durability of every
//! acknowledged append under concurrency and under `SIGKILL`, group commit, poisoning after a failed
//! fsync (injected into SQLite's own VFS), repair on load, damage (in SQLite every unreadable row is
//! corruption; the memory store keeps the torn-tail rule), read-only opens that leave a crashed store
//! byte-identical, listing beside a damaged page, typed errors, and a model-based property test that
//! the SQLite store behaves exactly like the in-memory one.
//!
//! The crash test re-invokes this test binary as a child (`crash_child_process_entry`, selected by an
//! environment variable) and kills it at random moments.

mod store_support;
// The PostgreSQL store against a real server (skipped without one, outside CI).
mod store_postgres;

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dsh::session::event::SessionHeader;
use dsh::session::invariant;
use dsh::session::repair::interrupted_turn_closers;
use dsh::session::store::memory::MemoryStore;
use dsh::session::store::sqlite::{DB_FILE_NAME, SqliteConfig, SqliteStore};
use dsh::session::store::{EncodedEvent, SessionStore, StoreError};
use dsh::session::{Event, Session};
use dsh::{Limits, SessionId};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use store_support::{TurnWriter, encode, fingerprint, kinds, sid, to_json};

const CREATED_AT_MS: u64 = 1_700_000_000_000;

fn header(id: &SessionId) -> SessionHeader {
    SessionHeader::new(id.clone(), CREATED_AT_MS)
}

fn open(dir: &Path) -> SqliteStore {
    SqliteStore::open(dir, SqliteConfig::default()).expect("open the store")
}

fn open_faulty(dir: &Path) -> SqliteStore {
    let config = SqliteConfig {
        fault_injection: true,
        ..SqliteConfig::default()
    };
    SqliteStore::open(dir, config).expect("open the store with fault injection")
}

/// Appends every batch of `n_turns` turns; returns the events written.
async fn write_turns(store: &dyn SessionStore, writer: &mut TurnWriter, n_turns: usize) {
    for _ in 0..n_turns {
        for batch in writer.turn_batches() {
            store
                .append(writer.id(), encode(&batch))
                .await
                .expect("append");
        }
    }
}

/// A log with an open turn: step 1 streamed an assistant message with two tool calls and only the
/// first call was recorded as started.
fn open_turn_events(id: &SessionId) -> Vec<Event> {
    let lines = [
        r#"{"type":"turn/start","seq":0,"time":10,"data":{"turn":1}}"#,
        r#"{"type":"step/start","seq":1,"time":11,"data":{"turn":1,"step":1}}"#,
        r#"{"type":"user/message","seq":2,"time":12,"data":{"id":"u1","role":"user","content":[{"type":"text","text":"read both"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
        r#"{"type":"assistant/chunk","seq":3,"time":13,"data":{"turn":1,"step":1,"chunk":{"type":"finish","reason":{"kind":"tool-calls"}}}}"#,
        r#"{"type":"assistant/message","seq":4,"time":14,"data":{"turn":1,"step":1,"message":{"id":"a1","role":"assistant","content":[{"type":"tool-call","id":"call-a","name":"read","arguments":"{}"},{"type":"tool-call","id":"call-b","name":"read","arguments":"{}"}],"source":{"kind":"model","provider":"p","model":"m"}}},"sourceEventSeqs":[3],"surfaceOp":"append"}"#,
        r#"{"type":"tool/call","seq":5,"time":15,"data":{"turn":1,"step":1,"callId":"call-a","name":"read","arguments":"{}"}}"#,
    ];
    let events: Vec<Event> = lines
        .iter()
        .map(|l| Event::from_json(l).expect("valid test event"))
        .collect();
    Session::from_events(id.clone(), events.clone()).expect("a valid prefix");
    events
}

/// Raw rows of a session straight from the database file: (seq, kind, json).
fn raw_rows(db: &Path, id: &SessionId) -> Vec<(i64, String, String)> {
    let conn = rusqlite::Connection::open(db).expect("open the database directly");
    let mut stmt = conn
        .prepare("SELECT seq, kind, json FROM events WHERE session_id = ?1 ORDER BY seq")
        .expect("prepare");
    stmt.query_map([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows")
}

fn raw_execute(db: &Path, sql: &str, params: impl rusqlite::Params) {
    let conn = rusqlite::Connection::open(db).expect("open the database directly");
    conn.execute(sql, params).expect("raw statement");
}

// ---------------------------------------------------------------------------------------------
// Durability under concurrency
// ---------------------------------------------------------------------------------------------

/// 64 concurrent writers — 48 on sessions of their own and 16 taking turns on 4 shared sessions —
/// each append many batches; after closing and reopening, every session's log is exactly what was
/// acknowledged, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_writers_lose_nothing_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open(dir.path()));
    const N_OWN: usize = 48;
    const N_SHARED_SESSIONS: usize = 4;
    const N_PER_SHARED: usize = 4;
    const N_TURNS: usize = 6;

    let mut writers = Vec::new();
    for w in 0..N_OWN {
        let id = sid(&format!("own-{w}"));
        store.create(&header(&id)).await.unwrap();
        writers.push(Arc::new(tokio::sync::Mutex::new(TurnWriter::new(id, 200))));
    }
    let mut shared = Vec::new();
    for s in 0..N_SHARED_SESSIONS {
        let id = sid(&format!("shared-{s}"));
        store.create(&header(&id)).await.unwrap();
        shared.push(Arc::new(tokio::sync::Mutex::new(TurnWriter::new(id, 200))));
    }

    let mut tasks = Vec::new();
    for writer in writers {
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(async move {
            let mut writer = writer.lock().await;
            write_turns(&*store, &mut writer, N_TURNS).await;
        }));
    }
    for session in &shared {
        for _ in 0..N_PER_SHARED {
            let store = Arc::clone(&store);
            let writer = Arc::clone(session);
            tasks.push(tokio::spawn(async move {
                // Writers of one session take turns: each turn's batches go in order while the
                // session is held, as the session writer actor does.
                for _ in 0..N_TURNS {
                    let mut writer = writer.lock().await;
                    write_turns(&*store, &mut writer, 1).await;
                }
            }));
        }
    }
    assert_eq!(tasks.len(), 64);
    for task in tasks {
        task.await.unwrap();
    }
    let stats = store.stats();
    store.close().await.unwrap();

    let reopened = open(dir.path());
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for w in 0..N_OWN {
        let id = sid(&format!("own-{w}"));
        expected.insert(id.to_string(), Vec::new());
    }
    for s in 0..N_SHARED_SESSIONS {
        expected.insert(format!("shared-{s}"), Vec::new());
    }
    // Every append above was awaited and succeeded, so what was acknowledged is what a fresh
    // writer produces for the same number of turns (turn writers are deterministic).
    let mut n_events_total = 0u64;
    for (name, want) in expected.iter_mut() {
        let id = sid(name);
        let loaded = reopened.load(&id).await.unwrap();
        assert_eq!(loaded.n_repaired, 0, "{name}");
        let turns_expected = if name.starts_with("own") {
            N_TURNS
        } else {
            N_TURNS * N_PER_SHARED
        };
        let mut replay = TurnWriter::new(id.clone(), 200);
        for _ in 0..turns_expected {
            for batch in replay.turn_batches() {
                want.extend(to_json(&batch));
            }
        }
        assert_eq!(to_json(&loaded.events), *want, "{name}");
        assert_eq!(invariant::check(&loaded.events), Ok(()));
        n_events_total += loaded.events.len() as u64;
    }
    assert_eq!(stats.n_events_committed, n_events_total);
    let listed = reopened.list().await.unwrap();
    assert_eq!(listed.len(), N_OWN + N_SHARED_SESSIONS);
    reopened.close().await.unwrap();
}

/// `n_sessions` sessions `{prefix}-{w}`, each written `n_turns` turns by a task of its own, all at
/// once.
async fn write_sessions_at_once(
    store: &Arc<SqliteStore>,
    prefix: &str,
    n_sessions: usize,
    n_turns: usize,
) {
    let mut tasks = Vec::new();
    for w in 0..n_sessions {
        let id = sid(&format!("{prefix}-{w}"));
        store.create(&header(&id)).await.unwrap();
        let store = Arc::clone(store);
        tasks.push(tokio::spawn(async move {
            let mut writer = TurnWriter::new(id, 200);
            write_turns(&*store, &mut writer, n_turns).await;
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// Reopens the store in `dir` and checks that every session `write_sessions_at_once` wrote holds
/// exactly its turns, nothing repaired.
async fn assert_sessions_reload(dir: &Path, prefix: &str, n_sessions: usize, n_turns: usize) {
    let reopened = open(dir);
    for w in 0..n_sessions {
        let id = sid(&format!("{prefix}-{w}"));
        let loaded = reopened.load(&id).await.unwrap();
        let mut replay = TurnWriter::new(id.clone(), 200);
        let mut want = Vec::new();
        for _ in 0..n_turns {
            for batch in replay.turn_batches() {
                want.extend(to_json(&batch));
            }
        }
        assert_eq!(to_json(&loaded.events), want, "{prefix}-{w}");
        assert_eq!(loaded.n_repaired, 0);
    }
    reopened.close().await.unwrap();
}

/// `checkpoint_after_bytes` is the exact count of WAL bytes committed since the last checkpoint
/// at which the next one starts: the frames SQLite wrote, each a page and its header, many times
/// the events' JSON. An append writing exactly that many WAL bytes starts one (which the close
/// waits for), the same append with the bound one byte higher starts none. The append's WAL bytes
/// are measured by a first run with no checkpoint due; a fresh database writes the same frames
/// every time.
#[tokio::test]
async fn a_checkpoint_starts_at_exactly_checkpoint_after_bytes() {
    let id = sid("ck-exact");
    let batch = encode(&TurnWriter::new(id.clone(), 200).turn_batches()[0]);
    let n_bytes: u64 = batch.iter().map(|e| e.json.len() as u64).sum();
    let append_once = |checkpoint_after_bytes: u64| {
        let (id, batch) = (id.clone(), batch.clone());
        async move {
            let dir = tempfile::tempdir().unwrap();
            let config = SqliteConfig {
                checkpoint_after_bytes,
                ..SqliteConfig::default()
            };
            let store = SqliteStore::open(dir.path(), config).expect("open");
            store.create(&header(&id)).await.unwrap();
            store.append(&id, batch).await.unwrap();
            store.close().await.unwrap();
            store.stats()
        }
    };
    let n_wal_bytes = append_once(u64::MAX).await.n_wal_bytes_committed;
    // Whole frames of 4 KiB pages, and more of them than the events' bytes would fill.
    assert_eq!(n_wal_bytes % (4096 + 24), 0, "{n_wal_bytes}");
    assert!(
        n_wal_bytes > n_bytes,
        "{n_wal_bytes} WAL bytes for {n_bytes} event bytes"
    );
    for (checkpoint_after_bytes, n_checkpoints) in [(n_wal_bytes, 1), (n_wal_bytes + 1, 0)] {
        let stats = append_once(checkpoint_after_bytes).await;
        assert_eq!(
            (
                stats.n_groups,
                stats.n_bytes_committed,
                stats.n_wal_bytes_committed,
                stats.n_checkpoints
            ),
            (1, n_bytes, n_wal_bytes, n_checkpoints),
            "checkpoint_after_bytes {checkpoint_after_bytes}"
        );
    }
}

/// A lone session's commits each rewrite whole pages (the leaves and interior pages of the events'
/// B-trees and the database header) for about a kilobyte of events, and the checkpoints count
/// what the WAL takes: with the bound far above all the events' bytes, checkpoints still run every
/// bound's worth of WAL, SQLite starts the WAL over after each (so the next commits overwrite the
/// file instead of growing it), and the `-wal` file never gets far past the bound. Counting the
/// events' bytes instead, as the writer did until 2026-12-07, started no checkpoint here and let
/// the file grow with every commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_sessions_commits_checkpoint_by_the_wal_bytes_they_write() {
    let dir = tempfile::tempdir().unwrap();
    const BOUND: u64 = 1 << 20;
    let id = sid("lone-0");
    let store = open_one_session(dir.path(), BOUND, &id).await;
    let wal_path = dir.path().join(format!("{DB_FILE_NAME}-wal"));
    let mut writer = TurnWriter::new(id.clone(), 200);
    let mut wal_max = 0;
    let n_turns = append_turns_until_wal(&store, &mut writer, 6 * BOUND, || {
        let wal = std::fs::metadata(&wal_path).map_or(0, |m| m.len());
        wal_max = wal_max.max(wal);
    })
    .await;
    let stats = store.stats();
    assert!(stats.n_bytes_committed < BOUND, "{stats:?}");
    assert!(stats.n_checkpoints >= 3, "{stats:?}");
    assert!(stats.n_wal_resets >= 2, "{stats:?}");
    assert_eq!(stats.n_wal_restarts, 0, "{stats:?}");
    // Each checkpoint that came due ended in one catch-up (after one pass or more), which held
    // the commits for a while.
    assert!(
        stats.n_catch_ups >= 1 && stats.n_catch_ups <= stats.n_checkpoints,
        "{stats:?}"
    );
    assert!(stats.commits_held_ns > 0, "{stats:?}");
    assert!(
        wal_max < 3 * BOUND,
        "the -wal file reached {wal_max} bytes: {stats:?}"
    );
    store.close().await.unwrap();
    assert_eq!(store.poisoned(), None);
    assert_sessions_reload(dir.path(), "lone", 1, n_turns).await;
}

/// A fresh store in `dir` whose checkpoints come every `checkpoint_after_bytes` of WAL, holding
/// the one session `id`, created.
async fn open_one_session(dir: &Path, checkpoint_after_bytes: u64, id: &SessionId) -> SqliteStore {
    let config = SqliteConfig {
        checkpoint_after_bytes,
        ..SqliteConfig::default()
    };
    let store = SqliteStore::open(dir, config).expect("open");
    store.create(&header(id)).await.unwrap();
    store
}

/// Appends `writer`'s turns to its session until the store has committed `wal_bytes` of WAL in
/// all, calling `each` after every batch; the turns written.
async fn append_turns_until_wal(
    store: &SqliteStore,
    writer: &mut TurnWriter,
    wal_bytes: u64,
    mut each: impl FnMut(),
) -> usize {
    let id = writer.id().clone();
    let mut n_turns = 0;
    while store.stats().n_wal_bytes_committed < wal_bytes {
        for batch in writer.turn_batches() {
            store.append(&id, encode(&batch)).await.unwrap();
            each();
        }
        n_turns += 1;
    }
    n_turns
}

/// Waits until the writer has written the `-wal` file ahead to at least `len` bytes while it had
/// nothing to commit (`SqliteConfig::wal_prefill_bytes`), and returns the file's length.
async fn wal_prefilled_to(dir: &Path, store: &SqliteStore, len: u64) -> u64 {
    let wal_path = dir.join(format!("{DB_FILE_NAME}-wal"));
    let wal_len = || std::fs::metadata(&wal_path).map_or(0, |m| m.len());
    for _ in 0..2_000 {
        if wal_len() >= len {
            return wal_len();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!(
        "the -wal file is {} bytes, not {len}, after 10 s: {:?}",
        wal_len(),
        store.stats()
    );
}

/// While it has nothing to commit, the writer writes the `-wal` file's blocks ahead of SQLite (so
/// that commits overwrite blocks instead of growing the file): as far ahead of SQLite's end of
/// the WAL as SQLite has written to it since the open, less one chunk, in synced chunks of at most
/// 1 MiB, never past `checkpoint_after_bytes`. The zeros are no frames: a copy of the files taken
/// with the store open, as a crash would leave them, recovers every event; and the store itself
/// reloads everything after its close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_writes_the_wals_blocks_ahead_of_sqlite_while_idle() {
    let dir = tempfile::tempdir().unwrap();
    const CAP: u64 = 8 << 20;
    let id = sid("ahead-0");
    let store = open_one_session(dir.path(), CAP, &id).await;
    let mut writer = TurnWriter::new(id.clone(), 200);
    let mut n_turns = append_turns_until_wal(&store, &mut writer, 2 << 20, || {}).await;
    let written = store.stats().n_wal_bytes_committed;
    // No checkpoint yet, so SQLite's end of the WAL is past everything it wrote since the open.
    assert_eq!(store.stats().n_checkpoints, 0);
    let wal_len = wal_prefilled_to(dir.path(), &store, 2 * written - (1 << 20)).await;
    let stats = store.stats();
    assert!(wal_len <= CAP, "{wal_len} {stats:?}");
    assert!(stats.n_wal_prefill_bytes > 0, "{stats:?}");
    assert!(
        stats.n_wal_prefill_bytes <= stats.n_wal_prefill_chunks << 20,
        "{stats:?}"
    );
    assert!(stats.wal_prefill_ns > 0, "{stats:?}");

    // What a crash now would leave: the database, its WAL (frames, then zeros) and no index.
    let crashed = tempfile::tempdir().unwrap();
    for suffix in ["", "-wal"] {
        let name = format!("{DB_FILE_NAME}{suffix}");
        std::fs::copy(dir.path().join(&name), crashed.path().join(&name)).unwrap();
    }
    assert_sessions_reload(crashed.path(), "ahead", 1, n_turns).await;

    // Once SQLite's end plus what it wrote passes the bound, the writer writes ahead to the bound
    // and no further.
    n_turns += append_turns_until_wal(&store, &mut writer, 5 << 20, || {}).await;
    assert_eq!(store.stats().n_checkpoints, 0);
    let full = wal_prefilled_to(dir.path(), &store, CAP).await;
    let before = store.stats().n_wal_prefill_bytes;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(full, CAP);
    assert_eq!(store.stats().n_wal_prefill_bytes, before);
    store.close().await.unwrap();
    assert_eq!(store.poisoned(), None);
    assert_sessions_reload(dir.path(), "ahead", 1, n_turns).await;
}

/// A store that writes little writes little ahead (2 MiB past SQLite's end of the WAL, less what
/// is short of a whole chunk), and `wal_prefill_bytes: 0` writes nothing ahead at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_writes_little_writes_two_mib_ahead_and_none_when_off() {
    for prefill in [SqliteConfig::default().wal_prefill_bytes, 0] {
        let dir = tempfile::tempdir().unwrap();
        let config = SqliteConfig {
            wal_prefill_bytes: prefill,
            ..SqliteConfig::default()
        };
        let store = SqliteStore::open(dir.path(), config).expect("open");
        let id = sid("little-0");
        store.create(&header(&id)).await.unwrap();
        let batch = TurnWriter::new(id.clone(), 200).turn_batches().remove(0);
        store.append(&id, encode(&batch)).await.unwrap();
        let written = store.stats().n_wal_bytes_committed;
        if prefill > 0 {
            wal_prefilled_to(dir.path(), &store, 1 << 20).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let wal_len = std::fs::metadata(dir.path().join(format!("{DB_FILE_NAME}-wal")))
                .map_or(0, |m| m.len());
            let stats = store.stats();
            // Towards 2 MiB past SQLite's end of the WAL (its header, the open's frames and, if
            // the writer first looked after it, the append's): one or two whole chunks.
            assert!(
                wal_len <= (2 << 20) + written + (64 << 10),
                "{wal_len} {stats:?}"
            );
            let chunks = stats.n_wal_prefill_chunks;
            assert!((1..=2).contains(&chunks), "{stats:?}");
            assert_eq!(stats.n_wal_prefill_bytes, chunks << 20, "{stats:?}");
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let stats = store.stats();
            assert_eq!(stats.n_wal_prefill_bytes, 0, "{stats:?}");
            assert_eq!(stats.n_wal_prefill_chunks, 0, "{stats:?}");
            let wal = std::fs::metadata(dir.path().join(format!("{DB_FILE_NAME}-wal")))
                .map_or(0, |m| m.len());
            assert!(wal < 1 << 20, "{wal} {stats:?}");
        }
        store.close().await.unwrap();
    }
}

/// Checkpoints run beside the commits on their own connection: with a checkpoint due after every
/// group, concurrent writers still lose nothing, the rows reach the database file itself, and a
/// close waits for the running checkpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_beside_the_commits_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = SqliteConfig {
        checkpoint_after_bytes: 1,
        ..SqliteConfig::default()
    };
    let store = Arc::new(SqliteStore::open(dir.path(), config).expect("open"));
    write_sessions_at_once(&store, "ck", 16, 4).await;
    let stats = store.stats();
    assert!(stats.n_checkpoints >= 1, "{stats:?}");
    assert!(stats.n_checkpoints <= stats.n_groups, "{stats:?}");
    assert_eq!(stats.n_wal_restarts, 0, "{stats:?}");
    store.close().await.unwrap();
    assert_eq!(store.poisoned(), None);
    assert_sessions_reload(dir.path(), "ck", 16, 4).await;
}

/// Under commits that never pause, a passive checkpoint alone never lets SQLite start the WAL over
/// (each ends behind the commits made while it ran): its catch-up between two groups does (a
/// reset, at the next commit, which a truncation due meanwhile waits for: CI once saw every
/// catch-up followed by a truncation and no reset), and where none happened the writer truncates
/// the WAL every `wal_restart_after_bytes`.
/// The WAL starts over once per bound's worth of bytes at least, the `-wal` file stays near the
/// bound while many times the bound is written, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_is_truncated_every_wal_restart_after_bytes_under_sustained_commits() {
    let dir = tempfile::tempdir().unwrap();
    const BOUND: u64 = 64 << 10;
    let config = SqliteConfig {
        checkpoint_after_bytes: 16 << 10,
        wal_restart_after_bytes: BOUND,
        ..SqliteConfig::default()
    };
    let store = Arc::new(SqliteStore::open(dir.path(), config).expect("open"));
    write_sessions_at_once(&store, "wal", 16, 50).await;
    let stats = store.stats();
    // What a group can add past the bound: one batch of every session at most (each session's
    // task waits for its batch before writing the next).
    let group_max = 16 * (8 << 10);
    assert!(stats.n_bytes_committed > 32 * BOUND, "{stats:?}");
    let starts_over = stats.n_wal_restarts + stats.n_wal_resets;
    assert!(
        starts_over >= stats.n_bytes_committed / (BOUND + group_max),
        "{stats:?}"
    );
    // No reader here: the catch-up after each checkpoint lets SQLite start the WAL over in place,
    // at the next commit (the last catch-up may have none after it).
    assert!(stats.n_catch_ups >= 1, "{stats:?}");
    assert!(stats.n_wal_resets + 1 >= stats.n_catch_ups, "{stats:?}");
    // The WAL holds the pages of the commits since the last restart only: ~0.5 MB here, against
    // ~20 MB (about four WAL bytes an event byte) when nothing truncates it.
    let wal = std::fs::metadata(dir.path().join(format!("{DB_FILE_NAME}-wal")))
        .map(|m| m.len())
        .unwrap_or(0);
    let written_wal_at_least = stats.n_bytes_committed;
    assert!(
        wal < written_wal_at_least / 2,
        "wal {wal} bytes after {stats:?}"
    );
    store.close().await.unwrap();
    assert_eq!(store.poisoned(), None);
    assert_sessions_reload(dir.path(), "wal", 16, 50).await;
}

/// Everything queued while a commit runs forms exactly one next group (one transaction, one sync),
/// including several in-order batches of one session; a batch refused for its seq is answered at
/// once and does not disturb the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_queued_during_a_commit_form_one_group() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(open_faulty(dir.path()));
    let faults = store.faults().unwrap();
    let ids: Vec<SessionId> = (0..64).map(|i| sid(&format!("g-{i}"))).collect();
    for id in &ids {
        store.create(&header(id)).await.unwrap();
    }
    let mut writers: Vec<TurnWriter> = ids
        .iter()
        .map(|id| TurnWriter::new(id.clone(), 50))
        .collect();
    let mut turns: Vec<Vec<Vec<Event>>> = writers.iter_mut().map(|w| w.turn_batches()).collect();

    // Group 1: one append, held inside its fsync.
    faults.hold_syncs(true);
    let first = {
        let store = Arc::clone(&store);
        let batch = encode(&turns[0][0]);
        let id = ids[0].clone();
        tokio::spawn(async move { store.append(&id, batch).await })
    };
    while faults.n_syncs_waiting() == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(store.stats().n_groups, 1);

    // While it is held: 62 sessions append one batch each, and session 63 appends its first three
    // batches in order (each reserved before the next is issued).
    let mut tasks = Vec::new();
    for i in 1..63 {
        let store = Arc::clone(&store);
        let batch = encode(&turns[i][0]);
        let id = ids[i].clone();
        tasks.push(tokio::spawn(async move { store.append(&id, batch).await }));
    }
    let last = ids[63].clone();
    let in_order: Vec<Vec<EncodedEvent>> = turns[63].drain(..3).map(|b| encode(&b)).collect();
    let store_63 = Arc::clone(&store);
    let pipelined = tokio::spawn(async move {
        let [a, b, c]: [Vec<EncodedEvent>; 3] = in_order.try_into().unwrap();
        let (ra, rb, rc) = tokio::join!(
            store_63.append(&last, a),
            store_63.append(&last, b),
            store_63.append(&last, c)
        );
        [ra, rb, rc]
    });
    // A batch with the wrong seq is refused before it is queued.
    let wrong = store.append(&ids[5], encode(&turns[5][2])).await;
    assert!(
        matches!(
            &wrong,
            Err(StoreError::SeqMismatch {
                expected: 0 | 1,
                got: 5,
                ..
            })
        ),
        "{wrong:?}"
    );
    while store.stats().n_requests_queued < 1 + 62 + 3 {
        tokio::task::yield_now().await;
    }
    faults.hold_syncs(false);

    first.await.unwrap().unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    for r in pipelined.await.unwrap() {
        r.unwrap();
    }
    let stats = store.stats();
    assert_eq!(stats.n_groups, 2, "{stats:?}");
    assert_eq!(stats.n_requests_committed, 66);
    store.close().await.unwrap();

    let reopened = open(dir.path());
    let loaded = reopened.load(&ids[63]).await.unwrap();
    let want: Vec<String> = writers[63].events()[..loaded.events.len() - loaded.n_repaired]
        .iter()
        .map(Event::to_json)
        .collect();
    assert_eq!(
        to_json(&loaded.events[..loaded.events.len() - loaded.n_repaired]),
        want
    );
    assert_eq!(loaded.events.len() - loaded.n_repaired, 1 + 4 + 11);
    reopened.close().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Poisoning after a failed fsync
// ---------------------------------------------------------------------------------------------

/// A failed fsync (reported by SQLite itself through the fault VFS) fails that batch's waiter with
/// `Io`, then every later write is refused with `Poisoned`; reads keep working; reopening shows only
/// what was acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_fsync_poisons_writes_but_not_reads() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_faulty(dir.path());
    let faults = store.faults().unwrap();
    let a = sid("a");
    let b = sid("b");
    store.create(&header(&a)).await.unwrap();
    store.create(&header(&b)).await.unwrap();
    let mut wa = TurnWriter::new(a.clone(), 100);
    write_turns(&store, &mut wa, 1).await;
    let acked = to_json(wa.events());
    // Session b has an open turn, so loading it needs a repair write.
    store
        .append(&b, encode(&open_turn_events(&b)))
        .await
        .unwrap();

    faults.fail_syncs(true);
    let next = wa.turn_batches();
    let failed = store.append(&a, encode(&next[0])).await;
    match &failed {
        Err(StoreError::Io {
            op: "commit",
            cause,
        }) => {
            assert!(cause.contains("extended code 1034"), "{cause}");
        }
        other => panic!("expected the failed commit's Io error, got {other:?}"),
    }
    assert!(faults.n_syncs_failed() >= 1);
    assert!(store.poisoned().is_some());
    faults.fail_syncs(false);

    // Every later write is refused, whatever the session.
    let cause = store.poisoned().unwrap().to_string();
    let poisoned = StoreError::Poisoned {
        cause: cause.clone(),
    };
    assert_eq!(
        store.append(&a, encode(&next[1])).await,
        Err(poisoned.clone())
    );
    assert_eq!(
        store.append(&b, encode(&open_turn_events(&b)[..1])).await,
        Err(poisoned.clone())
    );
    assert_eq!(store.delete(&a).await, Err(poisoned.clone()));
    assert_eq!(store.load(&b).await.map(|_| ()), Err(poisoned.clone()));
    assert!(
        poisoned
            .to_string()
            .contains("refuses writes since a failed sync")
    );

    // Reads still work and see exactly the acknowledged log.
    let loaded = store.load(&a).await.unwrap();
    assert_eq!(to_json(&loaded.events), acked);
    let inspected = store.inspect(&b).await.unwrap();
    assert_eq!(inspected.events.len(), 6);
    assert_eq!(inspected.closers.len(), 4);
    assert_eq!(store.list().await.unwrap().len(), 2);
    store.close().await.unwrap();

    let reopened = open(dir.path());
    assert_eq!(to_json(&reopened.load(&a).await.unwrap().events), acked);
    // A fresh store is not poisoned: the repair of b is written now.
    assert_eq!(reopened.load(&b).await.unwrap().n_repaired, 4);
    reopened.close().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Repair on load, torn tail vs corruption
// ---------------------------------------------------------------------------------------------

/// An open tail turn gets its closers — `TOOL_OUTCOME_UNKNOWN` for the recorded call,
/// `TOOL_NOT_STARTED` for the other, `step/end`, `turn/end{interrupted}` — appended durably by
/// `load`; `inspect` reports them without writing.
#[tokio::test]
async fn load_appends_the_closers_of_an_open_turn_durably() {
    let dir = tempfile::tempdir().unwrap();
    let id = sid("open");
    let events = open_turn_events(&id);
    let store = open(dir.path());
    store.create(&header(&id)).await.unwrap();
    store.append(&id, encode(&events)).await.unwrap();

    let inspection = store.inspect(&id).await.unwrap();
    let closers = to_json(&inspection.closers);
    assert_eq!(closers, to_json(&interrupted_turn_closers(&events)));
    assert_eq!(
        kinds(&inspection.closers),
        ["tool/result", "tool/result", "step/end", "turn/end"]
    );
    assert!(closers[0].contains(r#""code":"TOOL_OUTCOME_UNKNOWN""#));
    assert!(closers[0].contains(r#""sourceEventSeqs":[5]"#));
    assert!(closers[0].contains(r#""id":"interrupted-tool-result-call-a-6""#));
    assert!(closers[1].contains(r#""code":"TOOL_NOT_STARTED""#));
    assert_eq!(
        closers[2],
        r#"{"type":"step/end","seq":8,"time":15,"data":{"turn":1,"step":1}}"#
    );
    assert_eq!(
        closers[3],
        r#"{"type":"turn/end","seq":9,"time":15,"data":{"turn":1,"reason":{"kind":"interrupted"}}}"#
    );
    assert_eq!(inspection.torn_tail, None);
    // `inspect` wrote nothing.
    assert_eq!(raw_rows(store.db_path(), &id).len(), 6);

    let loaded = store.load(&id).await.unwrap();
    assert_eq!(loaded.n_repaired, 4);
    let mut want = to_json(&events);
    want.extend(closers.iter().cloned());
    assert_eq!(to_json(&loaded.events), want);
    assert_eq!(invariant::check(&loaded.events), Ok(()));
    // Appends continue after the closers.
    assert_eq!(
        store.append(&id, encode(&events[..1])).await,
        Err(StoreError::SeqMismatch {
            id: id.clone(),
            expected: 10,
            got: 0
        })
    );
    let db = store.db_path().to_path_buf();
    store.close().await.unwrap();
    let stored: Vec<String> = raw_rows(&db, &id).into_iter().map(|r| r.2).collect();
    assert_eq!(stored, want);

    let reopened = open(dir.path());
    let again = reopened.load(&id).await.unwrap();
    assert_eq!(again.n_repaired, 0);
    assert_eq!(to_json(&again.events), want);
    reopened.close().await.unwrap();
}

/// SQLite cannot tear a committed transaction, so garbage after the last `turn/end` is damage to
/// acknowledged input, not a torn tail: `load` and `inspect` refuse the session as `Corrupt` naming
/// every damaged seq, and nothing is deleted — not by this store, nor after a reopen. (Before, `load`
/// cut those rows for good with only a warning.)
#[tokio::test]
async fn a_damaged_row_after_the_last_turn_end_is_corruption_and_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let id = sid("torn");
    let store = open(dir.path());
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 40);
    write_turns(&store, &mut writer, 1).await;
    let n = writer.events().len() as i64;
    // The next turn's first two batches, then a damaged row and one more after it.
    let next = writer.turn_batches();
    store.append(&id, encode(&next[0])).await.unwrap();
    store.append(&id, encode(&next[1])).await.unwrap();
    let db = store.db_path().to_path_buf();
    store.close().await.unwrap();
    let damaged_at = n + 5;
    raw_execute(
        &db,
        "INSERT INTO events (session_id, seq, kind, json) VALUES (?1, ?2, 'assistant/chunk', ?3)",
        rusqlite::params![
            id.as_str(),
            damaged_at,
            r#"{"type":"assistant/chunk","seq":"#
        ],
    );
    raw_execute(
        &db,
        "INSERT INTO events (session_id, seq, kind, json) VALUES (?1, ?2, 'assistant/chunk', 'x')",
        rusqlite::params![id.as_str(), damaged_at + 1],
    );
    let stored = raw_rows(&db, &id);
    assert_eq!(stored.len() as i64, damaged_at + 2);

    let expected = Err(StoreError::Corrupt {
        id: id.clone(),
        seq: damaged_at as u64,
        reason: format!(
            "2 damaged rows (seq {damaged_at}, {}); the first: invalid event: EOF while parsing a \
             value at line 1 column 32 (a committed row cannot tear, so this session cannot be \
             continued)",
            damaged_at + 1
        ),
    });
    for _ in 0..2 {
        let store = open(dir.path());
        assert_eq!(store.inspect(&id).await.map(|_| ()), expected);
        assert_eq!(store.load(&id).await.map(|_| ()), expected);
        store.close().await.unwrap();
        assert_eq!(raw_rows(&db, &id), stored);
    }
}

/// Damage before the last `turn/end` — a flipped byte, or a missing row — is `Corrupt` naming the
/// seq, for `load` and `inspect` alike, and nothing is written.
#[tokio::test]
async fn damage_before_the_last_turn_end_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let id = sid("damaged");
    let store = open(dir.path());
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 40);
    write_turns(&store, &mut writer, 2).await;
    let db = store.db_path().to_path_buf();
    store.close().await.unwrap();
    let before = raw_rows(&db, &id);

    // A byte flipped inside row 7 (the assistant chunk's JSON loses its closing brace).
    let (_, _, json7) = &before[7];
    let flipped = format!("{}]", &json7[..json7.len() - 1]);
    raw_execute(
        &db,
        "UPDATE events SET json = ?3 WHERE session_id = ?1 AND seq = ?2",
        rusqlite::params![id.as_str(), 7, flipped],
    );
    let store = open(dir.path());
    for result in [
        store.load(&id).await.map(|_| ()),
        store.inspect(&id).await.map(|_| ()),
    ] {
        match result {
            Err(StoreError::Corrupt { seq: 7, reason, .. }) => {
                assert!(
                    reason.starts_with("1 damaged row (seq 7); the first: invalid event: "),
                    "{reason}"
                );
            }
            other => panic!("expected Corrupt at seq 7, got {other:?}"),
        }
    }
    store.close().await.unwrap();
    assert_eq!(raw_rows(&db, &id).len(), before.len());

    // A missing row instead.
    raw_execute(
        &db,
        "UPDATE events SET json = ?3 WHERE session_id = ?1 AND seq = ?2",
        rusqlite::params![id.as_str(), 7, json7],
    );
    raw_execute(
        &db,
        "DELETE FROM events WHERE session_id = ?1 AND seq = 3",
        [id.as_str()],
    );
    let store = open(dir.path());
    assert_eq!(
        store.load(&id).await.map(|_| ()),
        Err(StoreError::Corrupt {
            id: id.clone(),
            seq: 3,
            reason: "1 damaged row (seq 3); the first: seq 3 is missing: the next stored row has \
                     seq 4 (a committed row cannot tear, so this session cannot be continued)"
                .into()
        })
    );
    store.close().await.unwrap();
    assert_eq!(raw_rows(&db, &id).len(), before.len() - 1);
}

/// `create_minted` registers a session without reading the database (`create` reads it to refuse
/// an id that is stored): 100 minted ids cost no read, and each session is then written and read
/// back like any other. An id registered or stored in this process is still refused.
#[tokio::test]
async fn a_minted_id_is_created_without_reading_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let before = store.stats().n_reads;
    let ids: Vec<SessionId> = (0..100).map(|_| SessionId::mint()).collect();
    for id in &ids {
        store.create_minted(&header(id)).await.unwrap();
    }
    assert_eq!(
        store.stats().n_reads,
        before,
        "a minted create read the database"
    );
    let named = sid("named");
    store.create(&header(&named)).await.unwrap();
    assert_eq!(store.stats().n_reads, before + 1, "create looks the id up");

    let mut writer = TurnWriter::new(ids[0].clone(), 30);
    write_turns(&store, &mut writer, 2).await;
    let loaded = store.load(&ids[0]).await.unwrap();
    assert_eq!(to_json(&loaded.events), to_json(writer.events()));
    for id in [&ids[0], &ids[1], &named] {
        assert_eq!(
            store.create_minted(&header(id)).await,
            Err(StoreError::AlreadyExists { id: id.clone() })
        );
    }
    store.close().await.unwrap();
}

/// `StoreStats::writer_cpu_ns` counts the CPU the writer's blocking jobs spend: nothing before a
/// write, more after each, and never more than the process used meanwhile.
#[tokio::test]
async fn the_writers_cpu_time_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert_eq!(store.stats().writer_cpu_ns, 0, "nothing written yet");
    let process = || {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
    };
    let process_before = process();
    let id = sid("cpu");
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 30);
    write_turns(&store, &mut writer, 5).await;
    let after_five = store.stats().writer_cpu_ns;
    assert!(after_five > 0, "five turns of commits cost no CPU");
    write_turns(&store, &mut writer, 5).await;
    let after_ten = store.stats().writer_cpu_ns;
    assert!(after_ten > after_five, "{after_ten} after {after_five}");
    assert!(after_ten <= process() - process_before);
    store.close().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Typed errors, for both stores
// ---------------------------------------------------------------------------------------------

/// Seq mismatch, a gap inside a batch, an unknown session, a duplicate create, an oversized event:
/// each is its typed error and changes nothing.
async fn typed_errors_change_nothing(store: &dyn SessionStore) {
    let id = sid("typed");
    let unknown = sid("nobody");
    assert_eq!(store.create(&header(&id)).await, Ok(()));
    assert_eq!(
        store.create(&header(&id)).await,
        Err(StoreError::AlreadyExists { id: id.clone() })
    );
    let mut writer = TurnWriter::new(id.clone(), 30);
    let batches = writer.turn_batches();
    // The first append must start at 0.
    assert_eq!(
        store.append(&id, encode(&batches[1])).await,
        Err(StoreError::SeqMismatch {
            id: id.clone(),
            expected: 0,
            got: 1
        })
    );
    store.append(&id, encode(&batches[0])).await.unwrap();
    assert_eq!(
        store.create(&header(&id)).await,
        Err(StoreError::AlreadyExists { id: id.clone() })
    );
    // A batch that skips ahead, one that repeats, and one with a gap inside.
    assert_eq!(
        store.append(&id, encode(&batches[2])).await,
        Err(StoreError::SeqMismatch {
            id: id.clone(),
            expected: 1,
            got: 5
        })
    );
    assert_eq!(
        store.append(&id, encode(&batches[0])).await,
        Err(StoreError::SeqMismatch {
            id: id.clone(),
            expected: 1,
            got: 0
        })
    );
    let mut gap = encode(&batches[1]);
    gap.remove(1);
    assert_eq!(
        store.append(&id, gap).await,
        Err(StoreError::SeqMismatch {
            id: id.clone(),
            expected: 2,
            got: 3
        })
    );
    // An event over the size limit.
    let mut big = encode(&batches[1]);
    big[0].json = vec![b' '; Limits::DEFAULT.event_bytes_max + 1].into();
    assert_eq!(
        store.append(&id, big).await,
        Err(StoreError::EventTooLarge {
            id: id.clone(),
            seq: 1,
            bytes: Limits::DEFAULT.event_bytes_max + 1,
            bytes_max: Limits::DEFAULT.event_bytes_max
        })
    );
    // Unknown sessions.
    assert_eq!(
        store.append(&unknown, encode(&batches[0])).await,
        Err(StoreError::NotFound {
            id: unknown.clone()
        })
    );
    assert_eq!(
        store.load(&unknown).await.map(|_| ()),
        Err(StoreError::NotFound {
            id: unknown.clone()
        })
    );
    assert_eq!(
        store.inspect(&unknown).await.map(|_| ()),
        Err(StoreError::NotFound {
            id: unknown.clone()
        })
    );
    assert_eq!(store.header(&unknown).await, Ok(None));
    assert_eq!(store.delete(&unknown).await, Ok(false));
    // Nothing changed: the log is the one good batch, and the next good batch still fits.
    let loaded = store.inspect(&id).await.unwrap();
    assert_eq!(to_json(&loaded.events), to_json(&batches[0]));
    store.append(&id, encode(&batches[1])).await.unwrap();
    assert_eq!(store.inspect(&id).await.unwrap().events.len(), 5);
    assert_eq!(store.header(&id).await, Ok(Some(header(&id))));
}

#[tokio::test]
async fn sqlite_typed_errors_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    typed_errors_change_nothing(&store).await;
    store.close().await.unwrap();
    // Also across a reopen: the stored session exists, the unknown one does not.
    let store = open(dir.path());
    let id = sid("typed");
    assert_eq!(
        store.create(&header(&id)).await,
        Err(StoreError::AlreadyExists { id: id.clone() })
    );
    assert_eq!(store.inspect(&id).await.unwrap().events.len(), 5);
    store.close().await.unwrap();
}

#[tokio::test]
async fn memory_typed_errors_change_nothing() {
    typed_errors_change_nothing(&MemoryStore::new()).await;
}

/// A log longer than `session_events_max` is never written, and a stored one is refused on load
/// (before it is read into memory whole).
#[tokio::test]
async fn logs_are_bounded_by_session_events_max() {
    let dir = tempfile::tempdir().unwrap();
    let id = sid("long");
    let store = open(dir.path());
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 10);
    write_turns(&store, &mut writer, 1).await; // 27 events
    store.close().await.unwrap();
    let small = SqliteConfig {
        limits: Limits {
            session_events_max: 20,
            ..Limits::DEFAULT
        },
        ..SqliteConfig::default()
    };
    let store = SqliteStore::open(dir.path(), small.clone()).unwrap();
    let too_long = StoreError::LogTooLong {
        id: id.clone(),
        n_events_max: 20,
    };
    assert_eq!(store.load(&id).await.map(|_| ()), Err(too_long.clone()));
    let other = sid("other");
    store.create(&header(&other)).await.unwrap();
    let mut w = TurnWriter::new(other.clone(), 10);
    let batches: Vec<Vec<Event>> = w.turn_batches();
    for batch in &batches[..4] {
        store.append(&other, encode(batch)).await.unwrap(); // 1 + 4 + 11 + 3 = 19 events
    }
    assert_eq!(
        store.append(&other, encode(&batches[4])).await,
        Err(StoreError::LogTooLong {
            id: other.clone(),
            n_events_max: 20
        })
    );
    assert_eq!(store.inspect(&other).await.unwrap().events.len(), 19);
    store.close().await.unwrap();

    let memory = MemoryStore::with_limits(small.limits);
    memory.create(&header(&other)).await.unwrap();
    for batch in &batches[..4] {
        memory.append(&other, encode(batch)).await.unwrap();
    }
    assert_eq!(
        memory.append(&other, encode(&batches[4])).await,
        Err(StoreError::LogTooLong {
            id: other.clone(),
            n_events_max: 20
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Sessions: create, list, delete, header; the data directory
// ---------------------------------------------------------------------------------------------

/// `create` is lazy (a session without events is not listed and vanishes on reopen); `list` is in
/// creation order with counts and last times; `delete` removes a session for good and frees its id.
#[tokio::test]
async fn create_list_delete_and_header() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let (a, b, c) = (sid("a"), sid("b"), sid("c"));
    for id in [&b, &a, &c] {
        store.create(&header(id)).await.unwrap();
    }
    assert_eq!(store.list().await.unwrap(), []);
    assert_eq!(store.header(&c).await, Ok(Some(header(&c))));
    let mut wb = TurnWriter::new(b.clone(), 20);
    let mut wa = TurnWriter::new(a.clone(), 20);
    write_turns(&store, &mut wb, 1).await;
    write_turns(&store, &mut wa, 2).await;
    let listed = store.list().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|s| (s.header.id.to_string(), s.n_events, s.last_time))
            .collect::<Vec<_>>(),
        [
            ("b".to_string(), 27, Some(wb.events().last().unwrap().time)),
            ("a".to_string(), 54, Some(wa.events().last().unwrap().time)),
        ]
    );

    assert_eq!(store.delete(&b).await, Ok(true));
    assert_eq!(store.delete(&b).await, Ok(false));
    assert_eq!(
        store.load(&b).await.map(|_| ()),
        Err(StoreError::NotFound { id: b.clone() })
    );
    assert_eq!(store.list().await.unwrap().len(), 1);
    // The id is free again; its new log starts at 0.
    store.create(&header(&b)).await.unwrap();
    let mut wb2 = TurnWriter::new(b.clone(), 20);
    write_turns(&store, &mut wb2, 1).await;
    store.close().await.unwrap();

    let store = open(dir.path());
    assert_eq!(store.header(&c).await, Ok(None), "c never had an event");
    let names: Vec<String> = store
        .list()
        .await
        .unwrap()
        .iter()
        .map(|s| s.header.id.to_string())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(store.load(&b).await.unwrap().events.len(), 27);
    assert_eq!(store.load(&a).await.unwrap().events.len(), 54);
    store.close().await.unwrap();
}

/// The data directory is created private, a second open of the same directory is refused while the
/// first is open, a database that is not ours is refused, and a closed store answers `Closed`.
#[tokio::test]
async fn the_data_directory_is_private_and_exclusive() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("nested").join("data");
    let store = open(&dir);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let db_mode = std::fs::metadata(store.db_path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(db_mode, 0o600);
    match SqliteStore::open(&dir, SqliteConfig::default()) {
        Err(StoreError::Io { op: "open", cause }) => {
            assert!(cause.contains("in use by another process"), "{cause}");
        }
        other => panic!("expected the second open to be refused, got {other:?}"),
    }
    store.close().await.unwrap();
    store.close().await.unwrap();
    let id = sid("x");
    assert_eq!(store.create(&header(&id)).await, Err(StoreError::Closed));
    assert_eq!(store.list().await, Err(StoreError::Closed));
    // Closed means released: it opens again.
    open(&dir).close().await.unwrap();

    let foreign = root.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    let conn = rusqlite::Connection::open(foreign.join("sessions.sqlite3")).unwrap();
    conn.execute_batch("CREATE TABLE t (x)").unwrap();
    drop(conn);
    match SqliteStore::open(&foreign, SqliteConfig::default()) {
        Err(StoreError::Io { op: "open", cause }) => {
            assert!(cause.contains("is not a dsh session store"), "{cause}");
        }
        other => panic!("expected a foreign database to be refused, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Time control
// ---------------------------------------------------------------------------------------------

/// With tokio's clock paused, a commit (on the blocking pool) holds the clock: an hour-long timer
/// racing an append or a load never fires first.
#[tokio::test(start_paused = true)]
async fn commits_hold_a_paused_clock() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    let id = sid("paused");
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 50);
    let started = tokio::time::Instant::now();
    for batch in writer.turn_batches() {
        tokio::select! {
            biased;
            result = store.append(&id, encode(&batch)) => result.unwrap(),
            () = tokio::time::sleep(Duration::from_secs(3600)) => panic!("the clock jumped during a commit"),
        }
    }
    tokio::select! {
        biased;
        result = store.load(&id) => assert_eq!(result.unwrap().events.len(), 27),
        () = tokio::time::sleep(Duration::from_secs(3600)) => panic!("the clock jumped during a load"),
    }
    assert_eq!(started.elapsed(), Duration::ZERO);
    store.close().await.unwrap();
}

/// The memory store's slow-disk delay runs on tokio's clock, after the append is applied.
#[tokio::test(start_paused = true)]
async fn memory_store_delay_and_failure_injection() {
    let store = Arc::new(MemoryStore::new());
    let id = sid("mem");
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 20);
    let batches = writer.turn_batches();

    store.set_fail_appends(true);
    assert_eq!(
        store.append(&id, encode(&batches[0])).await,
        Err(StoreError::Io {
            op: "append",
            cause: "injected failure".into()
        })
    );
    assert!(store.inspect(&id).await.unwrap().events.is_empty());
    store.set_fail_appends(false);

    store.set_append_delay_ms(250);
    let started = tokio::time::Instant::now();
    let append = {
        let store = Arc::clone(&store);
        let batch = encode(&batches[0]);
        let id = id.clone();
        tokio::spawn(async move { store.append(&id, batch).await })
    };
    tokio::task::yield_now().await;
    // Applied (visible) before it is acknowledged.
    assert_eq!(store.inspect(&id).await.unwrap().events.len(), 1);
    assert!(!append.is_finished());
    append.await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::from_millis(250));
    assert_eq!(store.n_appends(), 1);

    // A repair write fails the same way, and changes nothing.
    store.set_append_delay_ms(0);
    store.append(&id, encode(&batches[1])).await.unwrap();
    store.set_fail_appends(true);
    assert_eq!(
        store.load(&id).await.map(|_| ()),
        Err(StoreError::Io {
            op: "repair",
            cause: "injected failure".into()
        })
    );
    assert_eq!(store.inspect(&id).await.unwrap().closers.len(), 2);
    store.set_fail_appends(false);
    assert_eq!(store.load(&id).await.unwrap().n_repaired, 2);
}

/// The memory store parses what it stored: damage behaves as in SQLite.
#[tokio::test]
async fn memory_store_damage_is_torn_tail_or_corruption() {
    let store = MemoryStore::new();
    let id = sid("mem-damage");
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 20);
    write_turns(&store, &mut writer, 1).await;
    store
        .insert_raw_row(&id, 27, "turn/start", r#"{"type":"turn/sta"#)
        .unwrap();
    let inspection = store.inspect(&id).await.unwrap();
    assert_eq!(inspection.torn_tail.as_ref().map(|t| t.0), Some(27));
    let loaded = store.load(&id).await.unwrap();
    assert_eq!(loaded.events.len(), 27);
    assert_eq!(store.inspect(&id).await.unwrap().torn_tail, None);

    store
        .overwrite_raw_row(&id, 3, "user/message", "not json")
        .unwrap();
    assert!(matches!(
        store.load(&id).await,
        Err(StoreError::Corrupt { seq: 3, .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Crash: SIGKILL mid-write
// ---------------------------------------------------------------------------------------------

const CRASH_CHILD_ENV: &str = "DSH_STORE_CRASH_CHILD_DIR";
const CRASH_SESSIONS: usize = 6;
const CRASH_TEXT_BYTES: usize = 120;

fn crash_session(i: usize) -> SessionId {
    sid(&format!("crash-{i}"))
}

/// One acknowledged batch as the child reported it.
#[derive(Debug)]
struct Ack {
    session: usize,
    first_seq: u64,
    end_seq: u64,
    fingerprint: u64,
}

fn parse_ack(line: &str) -> Option<Ack> {
    let mut parts = line.strip_prefix("ACK ")?.split(' ');
    let ack = Ack {
        session: parts.next()?.parse().ok()?,
        first_seq: parts.next()?.parse().ok()?,
        end_seq: parts.next()?.parse().ok()?,
        fingerprint: parts.next()?.parse().ok()?,
    };
    parts.next().is_none().then_some(ack)
}

/// Not a test on its own: the body of the child process that `crash_sigkill_mid_write_loses_no_ack`
/// starts (it returns at once when the environment variable is absent). It resumes every session
/// (load, repair included), then writes realistic turns on all of them concurrently forever,
/// printing `ACK session first_seq end_seq fingerprint` after each acknowledged append.
#[test]
fn crash_child_process_entry() {
    let Some(dir) = std::env::var_os(CRASH_CHILD_ENV) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = Arc::new(open(Path::new(&dir)));
        let mut writers = Vec::new();
        for i in 0..CRASH_SESSIONS {
            let id = crash_session(i);
            let writer = match store.load(&id).await {
                Ok(loaded) => TurnWriter::resume(id, loaded.events, CRASH_TEXT_BYTES),
                Err(StoreError::NotFound { .. }) => {
                    store.create(&header(&id)).await.unwrap();
                    TurnWriter::new(id, CRASH_TEXT_BYTES)
                }
                Err(e) => panic!("child could not resume {id}: {e}"),
            };
            writers.push(writer);
        }
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        {
            let mut out = out.lock().unwrap();
            writeln!(out, "READY").unwrap();
            out.flush().unwrap();
        }
        for (i, mut writer) in writers.into_iter().enumerate() {
            let store = Arc::clone(&store);
            let out = Arc::clone(&out);
            tokio::spawn(async move {
                loop {
                    for batch in writer.turn_batches() {
                        let encoded = encode(&batch);
                        let fp = fingerprint(encoded.iter().map(|e| &e.json[..]));
                        let first = batch[0].seq;
                        let end = batch.last().unwrap().seq + 1;
                        let result = store.append(writer.id(), encoded).await;
                        let mut out = out.lock().unwrap();
                        if let Err(e) = result {
                            // Tell the parent, which fails the test, rather than idle until killed.
                            writeln!(out, "FAIL {e}").unwrap();
                            out.flush().unwrap();
                            std::process::exit(3);
                        }
                        writeln!(out, "ACK {i} {first} {end} {fp}").unwrap();
                        out.flush().unwrap();
                    }
                }
            });
        }
        // Write until killed.
        std::future::pending::<()>().await;
    });
}

/// Checks a store directory after a kill: every acknowledged batch is there byte for byte, every
/// log loads (repair included) and passes the invariant checker, and a second load is identical.
async fn verify_after_crash(dir: &Path, acks: &[Ack]) -> (usize, usize) {
    let store = open(dir);
    let mut n_events = 0;
    let mut n_repaired = 0;
    for i in 0..CRASH_SESSIONS {
        let id = crash_session(i);
        let mine: Vec<&Ack> = acks.iter().filter(|a| a.session == i).collect();
        let loaded = match store.load(&id).await {
            Ok(loaded) => loaded,
            Err(StoreError::NotFound { .. }) => {
                assert!(mine.is_empty(), "{id}: acknowledged batches but no log");
                continue;
            }
            Err(e) => panic!("{id}: load failed after a crash: {e}"),
        };
        assert_eq!(invariant::check(&loaded.events), Ok(()), "{id}");
        let jsons = to_json(&loaded.events);
        for ack in mine {
            let end = usize::try_from(ack.end_seq).unwrap();
            assert!(
                end <= jsons.len(),
                "{id}: acknowledged through seq {} but the log has {} events",
                ack.end_seq,
                jsons.len()
            );
            let first = usize::try_from(ack.first_seq).unwrap();
            let fp = fingerprint(jsons[first..end].iter().map(|j| j.as_bytes()));
            assert_eq!(
                fp, ack.fingerprint,
                "{id}: batch {first}..{end} differs from the ack"
            );
        }
        let again = store.load(&id).await.unwrap();
        assert_eq!(again.n_repaired, 0, "{id}: repair is not idempotent");
        assert_eq!(to_json(&again.events), jsons, "{id}: second load differs");
        n_events += jsons.len();
        n_repaired += loaded.n_repaired;
    }
    store.close().await.unwrap();
    (n_events, n_repaired)
}

/// Kills a child process that writes turns on several sessions at a random moment, at least 50
/// times, and checks after each kill that no acknowledged event was lost (`verify_after_crash`).
/// Each data directory serves 5 consecutive children, so recovery of an already-recovered store is
/// exercised too. `DSH_STORE_CRASH_KILLS` and `DSH_STORE_CRASH_SEED` override the count and seed.
#[test]
fn crash_sigkill_mid_write_loses_no_ack() {
    if std::env::var_os(CRASH_CHILD_ENV).is_some() {
        return;
    }
    let n_kills: usize = std::env::var("DSH_STORE_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let seed: u64 = std::env::var("DSH_STORE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_cafe);
    let mut rng = StdRng::seed_from_u64(seed);
    let exe = std::env::current_exe().unwrap();
    let root = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut all_acks: Vec<Ack> = Vec::new();
    let mut n_acks_total = 0;
    let mut n_repaired_total = 0;
    let mut n_events_last = 0;
    for round in 0..n_kills {
        let dir = root.path().join(format!("gen-{}", round / 5));
        if round % 5 == 0 {
            all_acks.clear();
        }
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_process_entry",
                "--test-threads=1",
                "-q",
            ])
            .env(CRASH_CHILD_ENV, &dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait until the child has resumed every session and acknowledged its first append, so
        // that the kill lands while it writes.
        let mut lines = Vec::new();
        loop {
            let line = lines_rx
                .recv()
                .unwrap_or_else(|_| panic!("round {round}: the child exited before writing"));
            let is_ack = line.starts_with("ACK ");
            lines.push(line);
            if is_ack {
                break;
            }
        }
        // Let it write for a random while (0–40 ms), then kill it mid-write.
        std::thread::sleep(Duration::from_micros(rng.random_range(0..40_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(lines_rx.try_iter());
        if let Some(fail) = lines.iter().find(|l| l.starts_with("FAIL ")) {
            panic!("round {round}: the child failed: {fail}");
        }
        assert_eq!(
            status.signal(),
            Some(9),
            "round {round}: the child was not killed by SIGKILL: {status}"
        );
        let acks: Vec<Ack> = lines.iter().filter_map(|l| parse_ack(l)).collect();
        n_acks_total += acks.len();
        all_acks.extend(acks);
        let (n_events, n_repaired) = runtime.block_on(verify_after_crash(&dir, &all_acks));
        n_events_last = n_events;
        n_repaired_total += n_repaired;
    }
    eprintln!(
        "crash test: {n_kills} kills, {n_acks_total} acknowledged batches, {n_repaired_total} \
         repair closers written, {n_events_last} events in the last store"
    );
}

// ---------------------------------------------------------------------------------------------
// Model-based: SQLite behaves exactly like the memory store
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum ModelOp {
    Create(usize),
    /// Append the next `n` pending events; `skew` shifts their seqs (a wrong batch).
    Append {
        session: usize,
        n: usize,
        skew: i8,
    },
    Load(usize),
    Inspect(usize),
    Delete(usize),
    Header(usize),
    List,
    Reopen,
}

fn model_op() -> impl Strategy<Value = ModelOp> {
    let s = 0..3usize;
    prop_oneof![
        2 => s.clone().prop_map(ModelOp::Create),
        8 => (s.clone(), 1..7usize, prop_oneof![6 => Just(0i8), 1 => Just(-1i8), 1 => Just(1i8)])
            .prop_map(|(session, n, skew)| ModelOp::Append { session, n, skew }),
        2 => s.clone().prop_map(ModelOp::Load),
        1 => s.clone().prop_map(ModelOp::Inspect),
        1 => s.clone().prop_map(ModelOp::Delete),
        1 => s.clone().prop_map(ModelOp::Header),
        1 => Just(ModelOp::List),
        1 => Just(ModelOp::Reopen),
    ]
}

/// What the test feeds one session: a writer and the events generated but not yet appended.
struct Feed {
    writer: TurnWriter,
    pending: VecDeque<Event>,
}

impl Feed {
    fn new(id: SessionId) -> Feed {
        Feed {
            writer: TurnWriter::new(id, 30),
            pending: VecDeque::new(),
        }
    }

    fn take(&mut self, n: usize) -> Vec<Event> {
        while self.pending.len() < n {
            let batches = self.writer.turn_batches();
            self.pending.extend(batches.into_iter().flatten());
        }
        self.pending.iter().take(n).cloned().collect()
    }
}

fn run_model(ops: &[ModelOp]) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let mut sqlite = open(dir.path());
        let memory = MemoryStore::new();
        let ids: Vec<SessionId> = (0..3).map(|i| sid(&format!("m-{i}"))).collect();
        let mut feeds: Vec<Feed> = ids.iter().map(|id| Feed::new(id.clone())).collect();
        for op in ops {
            match op.clone() {
                ModelOp::Create(s) => {
                    let h = header(&ids[s]);
                    let (a, b) = (sqlite.create(&h).await, memory.create(&h).await);
                    prop_assert_eq!(&a, &b, "{:?}", op);
                    if a.is_ok() {
                        feeds[s] = Feed::new(ids[s].clone());
                    }
                }
                ModelOp::Append { session, n, skew } => {
                    let events = feeds[session].take(n);
                    let mut batch = encode(&events);
                    for e in &mut batch {
                        e.seq = e.seq.saturating_add_signed(i64::from(skew));
                    }
                    let (a, b) = (
                        sqlite.append(&ids[session], batch.clone()).await,
                        memory.append(&ids[session], batch).await,
                    );
                    prop_assert_eq!(&a, &b, "{:?}", op);
                    if a.is_ok() {
                        feeds[session].pending.drain(..n);
                    }
                }
                ModelOp::Load(s) => {
                    let (a, b) = (sqlite.load(&ids[s]).await, memory.load(&ids[s]).await);
                    let view = |r: &Result<dsh::session::store::LoadedSession, StoreError>| {
                        r.as_ref()
                            .map(|l| (to_json(&l.events), l.n_repaired, l.header.clone()))
                            .map_err(Clone::clone)
                    };
                    prop_assert_eq!(view(&a), view(&b), "{:?}", op);
                    if let Ok(loaded) = a
                        && loaded.n_repaired > 0
                    {
                        // The log moved on by the closers: continue from it.
                        feeds[s] = Feed {
                            writer: TurnWriter::resume(ids[s].clone(), loaded.events, 30),
                            pending: VecDeque::new(),
                        };
                    }
                }
                ModelOp::Inspect(s) => {
                    let view = |r: Result<dsh::session::store::Inspection, StoreError>| {
                        r.map(|i| (to_json(&i.events), to_json(&i.closers), i.torn_tail))
                    };
                    let (a, b) = (
                        view(sqlite.inspect(&ids[s]).await),
                        view(memory.inspect(&ids[s]).await),
                    );
                    prop_assert_eq!(a, b, "{:?}", op);
                }
                ModelOp::Delete(s) => {
                    let (a, b) = (sqlite.delete(&ids[s]).await, memory.delete(&ids[s]).await);
                    prop_assert_eq!(&a, &b, "{:?}", op);
                }
                ModelOp::Header(s) => {
                    let (a, b) = (sqlite.header(&ids[s]).await, memory.header(&ids[s]).await);
                    prop_assert_eq!(a, b, "{:?}", op);
                }
                ModelOp::List => {
                    let (a, b) = (sqlite.list().await, memory.list().await);
                    prop_assert_eq!(a, b, "{:?}", op);
                }
                ModelOp::Reopen => {
                    sqlite.close().await.unwrap();
                    sqlite = open(dir.path());
                    // Registrations without events are memory only: they vanish on reopen.
                    let listed = memory.list().await.unwrap();
                    for id in &ids {
                        if !listed.iter().any(|s| &s.header.id == id) {
                            memory.delete(id).await.unwrap();
                        }
                    }
                }
            }
        }
        sqlite.close().await.unwrap();
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 48,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Any sequence of creates, appends (good and wrong), loads, inspections, deletes, lists and
    /// reopens gives the same answers from the SQLite store as from the memory store.
    #[test]
    fn sqlite_store_behaves_like_the_memory_store(ops in proptest::collection::vec(model_op(), 1..40)) {
        run_model(&ops)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Damage anywhere: corruption before the last turn end, a torn tail after it
// ---------------------------------------------------------------------------------------------

async fn damage_one_row(
    n_turns: usize,
    n_open_batches: usize,
    pick: prop::sample::Index,
    cut: prop::sample::Index,
    garbage: bool,
) -> Result<(), TestCaseError> {
    let store = MemoryStore::new();
    let id = sid("damage");
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 20);
    write_turns(&store, &mut writer, n_turns).await;
    for batch in writer.turn_batches().into_iter().take(n_open_batches) {
        store.append(&id, encode(&batch)).await.unwrap();
    }
    let n_stored = store.inspect(&id).await.unwrap().events.len();
    let events: Vec<Event> = writer.events()[..n_stored].to_vec();
    let r = pick.index(events.len());
    let json = events[r].to_json();
    let damaged = if garbage {
        bytes::Bytes::from_static(b"\x00garbage")
    } else {
        bytes::Bytes::copy_from_slice(&json.as_bytes()[..cut.index(json.len())])
    };
    store
        .overwrite_raw_row(&id, r as u64, events[r].kind(), damaged)
        .unwrap();
    let last_turn_end = events.iter().rposition(|e| e.kind() == "turn/end");
    if last_turn_end.is_some_and(|t| r <= t) {
        for _ in 0..2 {
            let result = store.load(&id).await.map(|_| ());
            prop_assert!(
                matches!(&result, Err(StoreError::Corrupt { seq, .. }) if *seq == r as u64),
                "damage at {} before the turn end at {:?}: {:?}",
                r,
                last_turn_end,
                result
            );
        }
    } else {
        let prefix = &events[..r];
        let mut expected = to_json(prefix);
        expected.extend(to_json(&interrupted_turn_closers(prefix)));
        let loaded = store.load(&id).await.unwrap();
        prop_assert_eq!(to_json(&loaded.events), expected.clone());
        prop_assert_eq!(invariant::check(&loaded.events), Ok(()));
        let again = store.load(&id).await.unwrap();
        prop_assert_eq!(again.n_repaired, 0);
        prop_assert_eq!(to_json(&again.events), expected);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// A row damaged anywhere (garbage, or cut short) makes the log `Corrupt` at that seq when it
    /// lies at or before the last `turn/end`; after it, `load` cuts the tail from that row, closes
    /// the turn the cut leaves open, and a second load is identical.
    #[test]
    fn damage_is_corruption_before_the_last_turn_end_and_a_torn_tail_after(
        n_turns in 0..3usize,
        n_open_batches in 0..5usize,
        pick in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
        garbage in any::<bool>(),
    ) {
        prop_assume!(n_turns + n_open_batches > 0);
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(damage_one_row(n_turns, n_open_batches, pick, cut, garbage))?;
    }
}

/// Every file of a directory by name, with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect()
}

/// A store read-only opens after a crash — its acknowledged turns only in the `-wal`, the `-shm`
/// as the dead writer left it — reads everything and leaves every file byte-identical: no
/// checkpoint, no deleted `-wal`/`-shm`, no rebuilt WAL index. (Before, the read connection was
/// opened read-write, and closing it checkpointed the WAL and deleted both files.)
#[tokio::test]
async fn a_read_only_open_leaves_a_crashed_store_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = tempfile::tempdir().unwrap();
    let id = sid("after-crash");
    let store = open(dir.path());
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 40);
    write_turns(&store, &mut writer, 2).await;
    // The files as a SIGKILL leaves them, copied while the writer still has them open.
    for (name, bytes) in files(dir.path()) {
        std::fs::write(crashed.path().join(name), bytes).unwrap();
    }
    store.close().await.unwrap();
    let before = files(crashed.path());
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
    assert!(!before["sessions.sqlite3-wal"].is_empty());

    for _ in 0..2 {
        let reader = SqliteStore::open_read_only(crashed.path(), SqliteConfig::default()).unwrap();
        let listed = reader.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].n_events, writer.events().len() as u64);
        let inspection = reader.inspect(&id).await.unwrap();
        assert_eq!(to_json(&inspection.events), to_json(writer.events()));
        reader.close().await.unwrap();
        drop(reader);
        assert!(
            files(crashed.path()) == before,
            "a read-only open changed the files"
        );
    }
}

/// A store closed cleanly has no `-wal`: a read-only open reads the database file as it is and
/// creates nothing beside it.
#[tokio::test]
async fn a_read_only_open_of_a_clean_store_creates_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let id = sid("clean");
    let store = open(dir.path());
    store.create(&header(&id)).await.unwrap();
    let mut writer = TurnWriter::new(id.clone(), 40);
    write_turns(&store, &mut writer, 1).await;
    store.close().await.unwrap();
    let before = files(dir.path());
    assert_eq!(before.len(), 2, "{:?}", before.keys());
    let reader = SqliteStore::open_read_only(dir.path(), SqliteConfig::default()).unwrap();
    assert_eq!(
        to_json(&reader.inspect(&id).await.unwrap().events),
        to_json(writer.events())
    );
    reader.close().await.unwrap();
    drop(reader);
    assert!(
        files(dir.path()) == before,
        "a read-only open changed the files"
    );
}

/// One damaged page — the leaf holding the last rows of the session written last — costs only that
/// session: `survey` lists the others and names it with SQLite's reason, `list` returns the others,
/// and they still load. (Before, `list` failed as a whole.)
#[tokio::test]
async fn one_damaged_page_costs_only_the_session_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let ids = [sid("first"), sid("second"), sid("damaged")];
    let store = open(dir.path());
    for id in &ids {
        store.create(&header(id)).await.unwrap();
        write_turns(&store, &mut TurnWriter::new(id.clone(), 6_000), 1).await;
    }
    let db = store.db_path().to_path_buf();
    store.close().await.unwrap();
    let (page_size, page): (i64, i64) = {
        let conn = rusqlite::Connection::open(&db).unwrap();
        let page_size = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        // dbstat's `path` orders pages as the b-tree does: the last leaf is the table's end.
        let page = conn
            .query_row(
                "SELECT pageno FROM dbstat WHERE name = 'events' AND pagetype = 'leaf' \
                 ORDER BY path DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        (page_size, page)
    };
    let mut bytes = std::fs::read(&db).unwrap();
    let start = usize::try_from((page - 1) * page_size).unwrap();
    bytes[start..start + usize::try_from(page_size).unwrap()].fill(0xAB);
    std::fs::write(&db, bytes).unwrap();

    let store = open(dir.path());
    let survey = store.survey().await.unwrap();
    let listed: Vec<&str> = survey
        .sessions
        .iter()
        .map(|s| s.header.id.as_str())
        .collect();
    assert_eq!(listed, ["first", "second"]);
    assert_eq!(survey.damaged.len(), 1, "{:?}", survey.damaged);
    assert_eq!(survey.damaged[0].id, "damaged");
    assert!(
        survey.damaged[0]
            .reason
            .starts_with("its last event cannot be read: database disk image is malformed"),
        "{}",
        survey.damaged[0].reason
    );
    let listed = store.list().await.unwrap();
    assert_eq!(listed, survey.sessions);
    for id in &ids[..2] {
        assert_eq!(store.load(id).await.unwrap().n_repaired, 0);
    }
    assert!(matches!(
        store.load(&ids[2]).await,
        Err(StoreError::Io { op: "load", .. })
    ));
    store.close().await.unwrap();
}

#[tokio::test]
async fn a_read_only_store_reads_beside_the_writer_and_refuses_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let id = sid("open");
    let events = open_turn_events(&id);
    let store = open(dir.path());
    store.create(&header(&id)).await.unwrap();
    store.append(&id, encode(&events)).await.unwrap();

    // No lock is taken: the writer still owns the directory.
    let reader = SqliteStore::open_read_only(dir.path(), SqliteConfig::default()).unwrap();
    let listed = reader.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    let inspection = reader.inspect(&id).await.unwrap();
    assert_eq!(to_json(&inspection.events), to_json(&events));
    assert_eq!(inspection.closers.len(), 4);
    let refused = |r: Result<_, StoreError>| matches!(r, Err(StoreError::Io { cause, .. }) if cause.contains("read-only"));
    assert!(refused(reader.append(&id, encode(&events[..1])).await));
    assert!(refused(reader.create(&header(&sid("new"))).await));
    assert!(refused(reader.delete(&id).await.map(|_| ())));
    // A load would repair the open turn: refused, nothing written.
    assert!(refused(reader.load(&id).await.map(|_| ())));
    assert_eq!(raw_rows(store.db_path(), &id).len(), 6);
    reader.close().await.unwrap();

    // An empty directory holds no store.
    let empty = tempfile::tempdir().unwrap();
    assert!(SqliteStore::open_read_only(empty.path(), SqliteConfig::default()).is_err());
    store.close().await.unwrap();
}
