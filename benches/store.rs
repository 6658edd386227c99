//! Durable events/s through the SQLite store with 1, 64 and 1,024 concurrent appenders, each
//! appending batches of 4 realistic ~1 KiB events (`assistant/chunk` text deltas inside an open step),
//! against two baselines measured in the same run:
//!
//! - `baseline/file_per_batch_fsync`: no group commit — each appender writes its batch to its own
//!   file (`write_all`) and `sync_data`s it, on the blocking pool, all appenders at once;
//! - `ceiling/sqlite_one_tx`: the physical ceiling of the store's medium — the same rows inserted by
//!   one raw rusqlite connection (WAL, `synchronous=FULL`, same schema) in one transaction per round,
//!   with no queue, no tasks and no validation.
//!
//! One iteration is one round: every appender appends one batch and awaits its acknowledgement.
//! Batch preparation (formatting the JSON) is outside the timed section. Report the ratio of
//! `dsh/sqlite_group_commit` to each baseline, never a bare time.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dsh::SessionId;
use dsh::session::event::SessionHeader;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh::session::store::{EncodedEvent, SessionStore};

const EVENTS_PER_BATCH: u64 = 4;
const APPENDERS: [usize; 3] = [1, 64, 1024];

/// ~950 bytes of text: with the envelope an event is ~1 KiB of JSON.
fn text() -> String {
    let filler = "the model keeps streaming a long answer about durable logs; ";
    filler.repeat(16)[..950].to_string()
}

fn chunk_event(seq: u64, text: &str) -> EncodedEvent {
    let json = format!(
        r#"{{"type":"assistant/chunk","seq":{seq},"time":{},"data":{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":0,"text":"{text}"}}}}}}"#,
        1_700_000_000_000u64 + seq
    );
    EncodedEvent {
        seq,
        kind: "assistant/chunk".into(),
        json: Bytes::from(json),
    }
}

fn batch(first_seq: u64, text: &str) -> Vec<EncodedEvent> {
    (first_seq..first_seq + EVENTS_PER_BATCH)
        .map(|seq| chunk_event(seq, text))
        .collect()
}

/// Opens a store and materializes `n` sessions with an open turn and step, so that appended chunks
/// form valid logs.
async fn sqlite_fixture(
    dir: &std::path::Path,
    n: usize,
) -> (Arc<SqliteStore>, Arc<Vec<SessionId>>, Arc<Vec<AtomicU64>>) {
    let store = Arc::new(SqliteStore::open(dir, SqliteConfig::default()).expect("open"));
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let id = SessionId::new(&format!("bench-{i}")).expect("valid id");
        store
            .create(&SessionHeader::new(id.clone(), 1_700_000_000_000))
            .await
            .expect("create");
        let opening = [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"step/start","seq":1,"time":2,"data":{"turn":1,"step":1}}"#,
        ];
        let events = opening
            .iter()
            .enumerate()
            .map(|(seq, json)| EncodedEvent {
                seq: seq as u64,
                kind: if seq == 0 { "turn/start" } else { "step/start" }.into(),
                json: Bytes::from(*json),
            })
            .collect();
        store.append(&id, events).await.expect("append");
        ids.push(id);
    }
    let next = (0..n).map(|_| AtomicU64::new(2)).collect();
    (store, Arc::new(ids), Arc::new(next))
}

fn durable_append(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let text = Arc::new(text());
    let event_bytes = chunk_event(1_000_000, &text).json.len();
    eprintln!("store bench: {EVENTS_PER_BATCH} events of ~{event_bytes} bytes per batch");

    let mut g = c.benchmark_group("store_durable_append");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    for n in APPENDERS {
        g.throughput(Throughput::Elements(n as u64 * EVENTS_PER_BATCH));

        // Baseline: one file per appender, write_all + sync_data per batch.
        let dir = tempfile::tempdir().expect("tempdir");
        let files: Arc<Vec<std::sync::Mutex<std::fs::File>>> = Arc::new(
            (0..n)
                .map(|i| {
                    std::sync::Mutex::new(
                        std::fs::File::create(dir.path().join(format!("s-{i}.jsonl")))
                            .expect("create file"),
                    )
                })
                .collect(),
        );
        g.bench_function(BenchmarkId::new("baseline/file_per_batch_fsync", n), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let files = Arc::clone(&files);
                let text = Arc::clone(&text);
                async move {
                    let mut total = Duration::ZERO;
                    for round in 0..iters {
                        let bufs: Vec<Vec<u8>> = (0..n)
                            .map(|_| {
                                let mut buf = Vec::new();
                                for e in batch(round * EVENTS_PER_BATCH, &text) {
                                    buf.extend_from_slice(&e.json);
                                    buf.push(b'\n');
                                }
                                buf
                            })
                            .collect();
                        let started = Instant::now();
                        let tasks: Vec<_> = bufs
                            .into_iter()
                            .enumerate()
                            .map(|(i, buf)| {
                                let files = Arc::clone(&files);
                                tokio::task::spawn_blocking(move || {
                                    let mut file = files[i].lock().expect("file lock");
                                    file.write_all(&buf).expect("write");
                                    file.sync_data().expect("sync");
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("baseline task");
                        }
                        total += started.elapsed();
                    }
                    total
                }
            });
        });
        drop(files);

        // Ceiling: the same rows, one raw transaction per round.
        let raw_dir = tempfile::tempdir().expect("tempdir");
        let raw = Arc::new(std::sync::Mutex::new(raw_connection(raw_dir.path())));
        let raw_round = Arc::new(AtomicU64::new(0));
        g.bench_function(BenchmarkId::new("ceiling/sqlite_one_tx", n), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let raw = Arc::clone(&raw);
                let text = Arc::clone(&text);
                let raw_round = Arc::clone(&raw_round);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let round = raw_round.fetch_add(1, Ordering::Relaxed);
                        let rows: Vec<(usize, Vec<EncodedEvent>)> = (0..n)
                            .map(|i| (i, batch(round * EVENTS_PER_BATCH, &text)))
                            .collect();
                        let raw = Arc::clone(&raw);
                        let started = Instant::now();
                        tokio::task::spawn_blocking(move || {
                            let mut conn = raw.lock().expect("raw lock");
                            let tx = conn.transaction().expect("begin");
                            {
                                let mut insert = tx
                                    .prepare_cached(
                                        "INSERT INTO events (session_id, seq, kind, json) \
                                         VALUES (?1, ?2, ?3, ?4)",
                                    )
                                    .expect("prepare");
                                for (i, events) in &rows {
                                    let id = format!("bench-{i}");
                                    for e in events {
                                        let json = std::str::from_utf8(&e.json).expect("utf-8");
                                        insert
                                            .execute(rusqlite::params![
                                                id,
                                                e.seq as i64,
                                                e.kind,
                                                json
                                            ])
                                            .expect("insert");
                                    }
                                }
                            }
                            tx.commit().expect("commit");
                        })
                        .await
                        .expect("ceiling task");
                        total += started.elapsed();
                    }
                    total
                }
            });
        });

        // The store: n concurrent appenders, group commit.
        let store_dir = tempfile::tempdir().expect("tempdir");
        let (store, ids, next) = runtime.block_on(sqlite_fixture(store_dir.path(), n));
        g.bench_function(BenchmarkId::new("dsh/sqlite_group_commit", n), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let store = Arc::clone(&store);
                let ids = Arc::clone(&ids);
                let next = Arc::clone(&next);
                let text = Arc::clone(&text);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let batches: Vec<Vec<EncodedEvent>> = (0..n)
                            .map(|i| {
                                let first = next[i].fetch_add(EVENTS_PER_BATCH, Ordering::Relaxed);
                                batch(first, &text)
                            })
                            .collect();
                        let started = Instant::now();
                        let tasks: Vec<_> = batches
                            .into_iter()
                            .enumerate()
                            .map(|(i, events)| {
                                let store = Arc::clone(&store);
                                let ids = Arc::clone(&ids);
                                tokio::spawn(async move {
                                    store.append(&ids[i], events).await.expect("append")
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("appender task");
                        }
                        total += started.elapsed();
                    }
                    total
                }
            });
        });
        let stats = store.stats();
        eprintln!(
            "store bench n={n}: {} groups, {} requests, {:.1} requests/group",
            stats.n_groups,
            stats.n_requests_committed,
            stats.n_requests_committed as f64 / stats.n_groups.max(1) as f64
        );
        runtime.block_on(store.close()).expect("close");
    }
    g.finish();
}

fn raw_connection(dir: &std::path::Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(dir.join("raw.sqlite3")).expect("open raw");
    conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get::<_, String>(0))
        .expect("wal");
    conn.execute_batch(
        "PRAGMA synchronous=FULL;
         CREATE TABLE events (
             session_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, json TEXT NOT NULL,
             PRIMARY KEY (session_id, seq)
         );",
    )
    .expect("schema");
    conn
}

criterion_group!(benches, durable_append);
criterion_main!(benches);
