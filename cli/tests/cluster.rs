//! The cluster harness (SPEC §14): N real `dsh serve` processes on one fresh PostgreSQL database,
//! driven over HTTP — followups, steers and cancels to every session through every node — while
//! nodes are killed (SIGKILL, then started again as a new node) and paused past their lease
//! (SIGSTOP, then SIGCONT). Afterwards, once every inbox row is settled: every acknowledged input
//! is in its session exactly once (one splice inserted it, at the seq the answer gave), no message
//! id was inserted twice, every log's seqs are contiguous, and `dsh check` passes every session.
//!
//! The ordinary test suite runs a short schedule (about 25 s). A long one is the same test with
//! `DSH_CLUSTER_SECS` (length of the chaos, default 12), `DSH_CLUSTER_NODES` (3),
//! `DSH_CLUSTER_SESSIONS` (6) and `DSH_CLUSTER_TTL_MS` (1,000) set, for example:
//!
//! ```text
//! DSH_CLUSTER_SECS=300 nice -n 19 cargo test -p dsh-cli --test cluster -- --nocapture
//! ```
//!
//! It prints one line of figures (kills, pauses, inputs sent, acknowledged, through another node's
//! inbox, lease takes, lost).

mod cluster_support;
#[path = "../../tests/store_postgres/db.rs"]
mod pg_db;
mod sandbox;
mod serve_support;

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::{assert_contiguous, log_of, signal, spliced, start_node};
use pg_db::TestDb;
use rustix::process::Signal;
use sandbox::Sandbox;
use serde_json::json;
use serve_support::{Server, dsh_bin};

/// Turns of about a tenth of a second: inputs meet running turns, queued input and idle agents.
const CLUSTER_SIM: &str = "provider = \"sim\"\n[sim]\nseed = 7\nttft_ms = 5\ntokens_per_sec = 300\nreply_tokens_min = 10\nreply_tokens_max = 40\ntool_call_probability = 0.0\n";

/// A small deterministic generator (xorshift64*), so a schedule repeats from its seed.
struct Rng(u64);

impl Rng {
    fn with_seed(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `range` (non-empty).
    fn range(&mut self, range: std::ops::Range<u64>) -> u64 {
        range.start + self.next() % (range.end - range.start)
    }

    fn index(&mut self, len: usize) -> usize {
        self.range(0..len as u64) as usize
    }

    fn bool(&mut self) -> bool {
        self.next() & 1 == 1
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One node slot: its current process (none while killed) and how many it has had.
struct Slot {
    server: Option<Server>,
    base: String,
    generation: u32,
    dir: Sandbox,
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    sent: u64,
    /// Message id → (session, seq answered, answered `pending`).
    acked: HashMap<String, (String, u64, bool)>,
    cancels_acked: u64,
    failed: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_under_kills_and_pauses_loses_no_acknowledged_input() {
    let Some(db) = TestDb::create("a_cluster_under_kills_and_pauses").await else {
        return;
    };
    let n_nodes = env_u64("DSH_CLUSTER_NODES", 3).max(2) as usize;
    let n_sessions = env_u64("DSH_CLUSTER_SESSIONS", 6).max(1) as usize;
    let chaos_secs = env_u64("DSH_CLUSTER_SECS", 12);
    let ttl_ms = env_u64("DSH_CLUSTER_TTL_MS", 1_000).max(300);
    let url = db.url.clone();
    let ttl = Duration::from_millis(ttl_ms);

    let mut slots = Vec::new();
    for i in 0..n_nodes {
        let dir = Sandbox::new();
        let server = start_node(dir.path(), CLUSTER_SIM, &url, &format!("n{i}-g0"), ttl_ms);
        slots.push(Slot {
            base: server.base.clone(),
            server: Some(server),
            generation: 0,
            dir,
        });
    }
    let bases: Arc<Mutex<Vec<Option<String>>>> = Arc::new(Mutex::new(
        slots.iter().map(|s| Some(s.base.clone())).collect(),
    ));
    let client = reqwest::Client::builder()
        .timeout(ttl * 2 + Duration::from_secs(8))
        .build()
        .expect("a client");
    let sessions: Vec<String> = (0..n_sessions).map(|i| format!("c{i}")).collect();
    for (i, id) in sessions.iter().enumerate() {
        let base = &slots[i % n_nodes].base;
        let resp = client
            .post(format!("{base}/v1/sessions"))
            .header("content-type", "application/json")
            .body(json!({ "id": id }).to_string())
            .send()
            .await
            .expect("create a session");
        assert_eq!(resp.status().as_u16(), 201, "create {id}");
    }

    // Clients: each sends inputs one after another to a random session through a random node.
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..3u64 {
        let (bases, tally, stop, client, sessions) = (
            Arc::clone(&bases),
            Arc::clone(&tally),
            Arc::clone(&stop),
            client.clone(),
            sessions.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut rng = Rng::with_seed(c + 1);
            let mut k = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                k += 1;
                let live: Vec<String> = bases
                    .lock()
                    .expect("bases")
                    .iter()
                    .flatten()
                    .cloned()
                    .collect();
                let Some(base) = (!live.is_empty()).then(|| live[rng.index(live.len())].clone())
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let session = &sessions[rng.index(sessions.len())];
                let roll = rng.range(0..100);
                if roll < 8 {
                    let sent = client
                        .post(format!("{base}/v1/sessions/{session}/cancel"))
                        .header("content-type", "application/json")
                        .body(json!({ "keep_inbox": rng.bool() }).to_string())
                        .send()
                        .await;
                    let mut t = tally.lock().expect("tally");
                    match sent {
                        Ok(r) if r.status().as_u16() == 202 => t.cancels_acked += 1,
                        _ => t.failed += 1,
                    }
                    continue;
                }
                let kind = if roll < 30 { "steer" } else { "followup" };
                let id = format!("m{c}-{k}");
                tally.lock().expect("tally").sent += 1;
                let sent = client
                    .post(format!("{base}/v1/sessions/{session}/{kind}"))
                    .header("content-type", "application/json")
                    .body(json!({ "id": id, "text": format!("{kind} {id}") }).to_string())
                    .send()
                    .await;
                let answer = match sent {
                    Ok(r) if r.status().as_u16() == 202 => r.json::<serde_json::Value>().await.ok(),
                    _ => None,
                };
                let mut t = tally.lock().expect("tally");
                match answer {
                    Some(a) => {
                        let seq = a["seq"].as_u64().unwrap_or(0);
                        let pending = a["pending"].as_bool().unwrap_or(false);
                        t.acked.insert(id, (session.clone(), seq, pending));
                    }
                    None => t.failed += 1,
                }
            }
        }));
    }

    // Chaos: every so often kill a node (and start it again as a new node) or pause one past its
    // lease; never more than one node down at once, so the cluster keeps a majority of hosts.
    let mut rng = Rng::with_seed(42);
    let (mut n_kills, mut n_pauses) = (0u64, 0u64);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(chaos_secs) {
        tokio::time::sleep(Duration::from_millis(rng.range(400..1_200))).await;
        let victim = rng.index(n_nodes);
        if rng.bool() {
            bases.lock().expect("bases")[victim] = None;
            if let Some(mut server) = slots[victim].server.take() {
                let _ = server.child.kill();
                let _ = server.child.wait();
            }
            n_kills += 1;
            tokio::time::sleep(Duration::from_millis(rng.range(100..600))).await;
            let slot = &mut slots[victim];
            slot.generation += 1;
            let server = start_node(
                slot.dir.path(),
                CLUSTER_SIM,
                &url,
                &format!("n{victim}-g{}", slot.generation),
                ttl_ms,
            );
            slot.base = server.base.clone();
            slot.server = Some(server);
            bases.lock().expect("bases")[victim] = Some(slot.base.clone());
        } else {
            let Some(server) = slots[victim].server.as_ref() else {
                continue;
            };
            signal(server, Signal::STOP);
            n_pauses += 1;
            tokio::time::sleep(ttl + Duration::from_millis(rng.range(200..800))).await;
            if let Some(server) = slots[victim].server.as_ref() {
                signal(server, Signal::CONT);
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for c in clients {
        c.await.expect("a client task");
    }

    // Settle: every inbox row applied or refused (a pending one would be an input nobody hosts).
    let db_client = db.client().await;
    let deadline = Instant::now() + ttl * 4 + Duration::from_secs(20);
    loop {
        let row = db_client
            .query_one("SELECT count(*) FROM dsh_inbox WHERE outcome IS NULL", &[])
            .await
            .expect("count pending");
        let pending: i64 = row.get(0);
        if pending == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{pending} inbox rows still pending"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused = db_client
        .query(
            "SELECT input_id, outcome FROM dsh_inbox WHERE outcome <> 'applied'",
            &[],
        )
        .await
        .expect("refused rows");
    assert!(
        refused.is_empty(),
        "refused: {:?}",
        refused
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
            .collect::<Vec<_>>()
    );

    // Every log: contiguous, each acknowledged message spliced exactly once where the answer said,
    // no message spliced twice, and `dsh check` passes.
    let tally = std::mem::take(&mut *tally.lock().expect("tally"));
    let reader = slots
        .iter()
        .find_map(|s| s.server.as_ref())
        .expect("a node");
    let mut lost = 0u64;
    let mut spliced_total = 0usize;
    for id in &sessions {
        let log = log_of(reader, id).await;
        assert_contiguous(&log);
        let splices = spliced(&log);
        spliced_total += splices.len();
        let mut seen: HashMap<&str, u64> = HashMap::new();
        for (m, seq) in &splices {
            assert!(
                seen.insert(m.as_str(), *seq).is_none(),
                "{id}: message {m} spliced twice"
            );
        }
        for (m, (session, seq, pending)) in &tally.acked {
            if session != id {
                continue;
            }
            match seen.get(m.as_str()) {
                None => lost += 1,
                Some(at) if !pending => assert_eq!(at, seq, "{id}: {m} answered seq {seq}"),
                Some(_) => {}
            }
        }
        let check = Command::new(dsh_bin())
            .args(["check", "--store", &url, id])
            .env_remove("DSH_STORE")
            .output()
            .expect("dsh check runs");
        assert!(
            check.status.success(),
            "dsh check {id}: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
    }
    let n_pending_answers = tally.acked.values().filter(|a| a.2).count();
    let row = db_client
        .query_one(
            "SELECT (SELECT count(*) FROM dsh_inbox), \
                    (SELECT coalesce(sum(epoch), 0)::bigint FROM dsh_leases)",
            &[],
        )
        .await
        .expect("figures");
    let (n_inbox, n_takes): (i64, i64) = (row.get(0), row.get(1));
    eprintln!(
        "cluster: nodes {n_nodes}, sessions {n_sessions}, chaos {chaos_secs} s, lease {ttl_ms} ms: \
         kills {n_kills}, pauses {n_pauses}, inputs sent {}, acknowledged {} ({} answered pending), \
         cancels acknowledged {}, not acknowledged {}, through another node's inbox {n_inbox}, \
         lease takes {n_takes}, splices {spliced_total}, lost {lost}",
        tally.sent,
        tally.acked.len(),
        n_pending_answers,
        tally.cancels_acked,
        tally.failed
    );
    assert_eq!(lost, 0, "acknowledged inputs missing from their logs");
    assert!(
        tally.acked.len() as u64 > tally.sent / 4,
        "too few inputs acknowledged"
    );
    assert!(n_kills + n_pauses > 0);
    assert!(n_inbox > 0, "no input went through another node's inbox");
    assert!(n_takes > n_sessions as i64, "no session changed hosts");
}
