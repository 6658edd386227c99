//! `--store` / `DSH_STORE` selection in the commands that open a store, against a real PostgreSQL
//! server: `run` writes a session there (and continues it in a second process, the first having
//! released its lease), `sessions`, `check` and `export` read it, `import` writes one; and a bad
//! store URL is one clear line, before anything is opened. Two `dsh serve` nodes on one database:
//! a session hosted by one is read on the other from the store (info, messages, export, events
//! replayed and followed), and input sent to the other is made durable in the database's inbox and
//! applied by the host in order, once each (a repeated id gets the first answer); a node killed
//! mid-turn has its session taken over, repaired and continued by the other about one lease after.
//!
//! The test creates a database of its own and drops it. Without a server (`DSH_TEST_POSTGRES`,
//! default `postgres://postgres@127.0.0.1:5432/postgres`) it prints one line saying it skipped;
//! with `CI=true` it fails instead.

mod cluster_support;
#[path = "../../tests/store_postgres/db.rs"]
mod pg_db;
mod sandbox;
mod serve_support;

use std::time::{Duration, Instant};

use cluster_support::{assert_contiguous, kill, log_of, signal, spliced, start_node, types};
use pg_db::TestDb;
use rustix::process::Signal;
use sandbox::Sandbox;
use serde_json::json;
use serve_support::{FAST_SIM, SLOW_SIM, Server, kinds};

/// Two `dsh serve` nodes, `node-a` and `node-b`, each with a directory of its own, on a fresh
/// database named for `test` (`None`: no server, the test skips). Fields drop in declaration order:
/// the nodes stop before their directories go, and the database is dropped last.
struct TwoNodes {
    a: Server,
    b: Server,
    _dirs: (Sandbox, Sandbox),
    db: TestDb,
}

async fn two_nodes(test: &str, config: &str, ttl_ms: u64) -> Option<TwoNodes> {
    let db = TestDb::create(test).await?;
    let dirs = (Sandbox::new(), Sandbox::new());
    let url = db.url.as_str();
    let a = start_node(dirs.0.path(), config, url, "node-a", ttl_ms);
    let b = start_node(dirs.1.path(), config, url, "node-b", ttl_ms);
    Some(TwoNodes {
        a,
        b,
        _dirs: dirs,
        db,
    })
}

#[test]
fn a_bad_store_url_is_one_line_and_opens_nothing() {
    let sb = Sandbox::new();
    for args in [
        vec!["sessions", "--store", "mysql://db"],
        vec!["check", "--store", "nowhere", "s1"],
        vec!["run", "--provider", "sim", "--store", "redis://x", "hello"],
    ] {
        let r = sb.run(&args);
        assert_eq!(r.code, Some(64), "{args:?}: {r:#?}");
        assert_eq!(r.stderr.lines().count(), 1, "{r:#?}");
        assert!(r.stderr.contains("is not a store URL"), "{r:#?}");
    }
    assert!(!sb.data_dir().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_store_command_works_on_postgres() {
    let Some(db) = TestDb::create("every_store_command_works_on_postgres").await else {
        return;
    };
    let sb = Sandbox::new();
    let script = sb.path().join("script.json");
    std::fs::write(
        &script,
        r#"[{"text":"first answer"},{"text":"second answer"}]"#,
    )
    .expect("write the script");
    let script = script.to_str().expect("utf-8 path");
    let url = db.url.as_str();
    let r = sb.run(&[
        "run",
        "--store",
        url,
        "--session",
        "pg1",
        "--script",
        script,
        "hello",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(r.stdout.trim(), "first answer");
    // A second process continues the session: the first released its lease when it closed.
    let r = sb.run(&[
        "run",
        "--store",
        url,
        "--session",
        "pg1",
        "--script",
        script,
        "again",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    // Nothing went to the SQLite store of the data directory.
    assert!(!sb.data_dir().join("sessions.sqlite3").exists());

    let mut listing = sb.command(&["sessions", "--json"]);
    listing.env("DSH_STORE", url);
    let r = sandbox::Run::from(listing.output().expect("dsh runs"));
    assert_eq!(r.code, Some(0), "{r:#?}");
    let rows: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(rows.len(), 1, "{r:#?}");
    assert_eq!(rows[0]["id"], "pg1");

    let r = sb.run(&["check", "--store", url, "pg1"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let r = sb.run(&["export", "--store", url, "pg1"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let exported = r.stdout;
    assert!(exported.contains("again"), "{exported}");
    let file = sb.path().join("pg1.jsonl");
    std::fs::write(&file, &exported).expect("write the export");
    let file = file.to_str().expect("utf-8 path");
    let r = sb.run(&["import", "--store", url, "--id", "pg2", file]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let r = sb.run(&["export", "--store", url, "pg2"]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    // Everything after the header line is the same log.
    assert_eq!(
        r.stdout.lines().skip(1).collect::<Vec<_>>(),
        exported.lines().skip(1).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_hosted_by_another_node_is_read_there_and_takes_input_there() {
    let Some(mut nodes) = two_nodes(
        "a_session_hosted_by_another_node_is_read_there_and_takes_input_there",
        SLOW_SIM,
        10_000,
    )
    .await
    else {
        return;
    };
    let TwoNodes { a, b, db, .. } = &mut nodes;
    a.create_with_followup("h1", "hello from a").await;
    // A runs the (slow) turn and holds the session's lease while it does.
    let mut on_a = a.events("/v1/sessions/h1/events", None).await;
    let seen_a = on_a.until("assistant/chunk").await;
    assert!(kinds(&seen_a).contains(&"turn/start"), "{seen_a:?}");

    // B reads the session from the store, without taking it.
    let (status, info) = b.call("GET", "/v1/sessions/h1", None).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["id"], "h1");
    assert_eq!(info["status"], "running", "{info}");
    assert!(info["events"].as_u64().unwrap_or(0) >= 3, "{info}");
    let (status, messages) = b.call("GET", "/v1/sessions/h1/messages", None).await;
    assert_eq!(status, 200, "{messages}");
    assert!(messages.to_string().contains("hello from a"), "{messages}");
    let export = b
        .client
        .get(b.url("/v1/sessions/h1/export"))
        .send()
        .await
        .expect("export");
    assert_eq!(export.status().as_u16(), 200);
    assert!(
        export
            .text()
            .await
            .expect("a body")
            .contains("hello from a")
    );
    let replayed = b
        .events("/v1/sessions/h1/events?follow=false", None)
        .await
        .rest()
        .await;
    let seqs: Vec<u64> = replayed.iter().filter_map(|e| e.id).collect();
    assert_eq!(
        seqs,
        (0..seqs.len() as u64).collect::<Vec<_>>(),
        "{replayed:?}"
    );
    assert_eq!(
        kinds(&replayed)[..kinds(&seen_a).len().min(replayed.len())],
        kinds(&seen_a)[..kinds(&seen_a).len().min(replayed.len())],
    );
    assert!(kinds(&replayed).contains(&"user/message"), "{replayed:?}");

    // Input on B for a session A hosts is made durable in the database's inbox and applied by A,
    // in order and once each; B answers as for a local session: 202 with the splice's seq.
    let mut acked: Vec<(String, u64)> = Vec::new();
    for (i, path) in ["followup", "steer", "followup", "inject", "followup"]
        .iter()
        .enumerate()
    {
        let id = format!("b{i}");
        let (status, ack) = b
            .call(
                "POST",
                &format!("/v1/sessions/h1/{path}"),
                Some(json!({ "id": id, "text": format!("hello from b {i}") })),
            )
            .await;
        assert_eq!(status, 202, "{path} {id}: {ack}");
        assert_eq!(ack["message_id"], id.as_str(), "{ack}");
        assert!(ack.get("pending").is_none(), "{ack}");
        acked.push((id, ack["seq"].as_u64().expect("a seq")));
    }
    // A repeated id is not applied twice: 200 with the first answer, on B (its inbox row) and on A
    // (its log).
    for node in [&b, &a] {
        let (status, ack) = node
            .call(
                "POST",
                "/v1/sessions/h1/followup",
                Some(json!({ "id": "b0", "text": "again" })),
            )
            .await;
        assert_eq!(status, 200, "{ack}");
        assert_eq!(ack["message_id"], "b0");
        assert_eq!(ack["seq"].as_u64(), Some(acked[0].1), "{ack}");
    }

    // A cancel on B reaches A through the inbox; B's stream follows what A writes.
    let mut on_b = b.events("/v1/sessions/h1/events", None).await;
    let (status, answer) = b
        .call(
            "POST",
            "/v1/sessions/h1/cancel",
            Some(json!({ "keep_inbox": true })),
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    let rest_a = on_a.until("turn/end").await;
    let followed = on_b.until("turn/end").await;
    let all_a: Vec<_> = seen_a.iter().chain(rest_a.iter()).cloned().collect();
    assert_eq!(followed, all_a);
    let (status, answer) = a.call("POST", "/v1/sessions/h1/cancel", None).await;
    assert_eq!(status, 202, "{answer}");

    // The log: B's inputs spliced once each, at the seqs B answered, in the order B took them;
    // seqs contiguous; nothing written by B itself (it never held the lease).
    let log = log_of(b, "h1").await;
    assert_contiguous(&log);
    let from_b: Vec<(String, u64)> = spliced(&log)
        .into_iter()
        .filter(|(id, _)| acked.iter().any(|(b, _)| b == id))
        .collect();
    assert_eq!(from_b, acked, "{:?}", types(&log));
    let db_client = db.client().await;
    let row = db_client
        .query_one(
            "SELECT node_id, epoch FROM dsh_leases WHERE session_id = 'h1'",
            &[],
        )
        .await
        .expect("the lease row");
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("node-a"));
    assert_eq!(row.get::<_, i64>(1), 1, "only A ever held h1");
    let rows = db_client
        .query(
            "SELECT input_id, kind, outcome, seq FROM dsh_inbox WHERE session_id = 'h1' ORDER BY n",
            &[],
        )
        .await
        .expect("the inbox rows");
    let rows: Vec<(String, String, Option<String>, Option<i64>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(rows.len(), 6, "{rows:?}");
    for (row, (id, seq)) in rows.iter().zip(&acked) {
        assert_eq!(
            (&row.0, row.2.as_deref(), row.3),
            (id, Some("applied"), Some(*seq as i64))
        );
    }
    assert_eq!(
        (rows[5].1.as_str(), rows[5].2.as_deref()),
        ("cancel", Some("applied"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_s_session_with_pending_input_is_taken_over_within_a_lease() {
    let ttl_ms = 1_500;
    let Some(mut nodes) = two_nodes(
        "a_killed_node_s_session_with_pending_input_is_taken_over_within_a_lease",
        SLOW_SIM,
        ttl_ms,
    )
    .await
    else {
        return;
    };
    let TwoNodes { a, b, db, .. } = &mut nodes;
    a.create_with_followup("k1", "hello from a").await;
    let mut on_a = a.events("/v1/sessions/k1/events", None).await;
    let before = on_a.until("assistant/chunk").await;

    // A dies mid-turn, holding the lease. Input on B waits in the inbox until the lease expires;
    // then B takes the session over (epoch 2), repairs the open turn and applies the input.
    kill(a);
    let killed = Instant::now();
    let (status, ack) = b
        .call(
            "POST",
            "/v1/sessions/k1/followup",
            Some(json!({ "id": "after-kill", "text": "hello from b" })),
        )
        .await;
    let took = killed.elapsed();
    assert_eq!(status, 202, "{ack}");
    assert!(ack.get("pending").is_none(), "{ack}");
    assert!(
        took >= Duration::from_millis(ttl_ms / 2) && took < Duration::from_millis(3 * ttl_ms),
        "taken over after {took:?}"
    );
    let (status, again) = b
        .call(
            "POST",
            "/v1/sessions/k1/followup",
            Some(json!({ "id": "after-kill", "text": "hello from b" })),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["seq"], ack["seq"]);
    let (status, answer) = b.call("POST", "/v1/sessions/k1/cancel", None).await;
    assert_eq!(status, 202, "{answer}");

    let log = log_of(b, "k1").await;
    assert_contiguous(&log);
    let kinds_before: Vec<&str> = before.iter().map(|e| e.event.as_str()).collect();
    let all = types(&log);
    assert_eq!(all[..kinds_before.len()], kinds_before[..]);
    // After what A wrote (its turn streaming): the closers B's load appended, then B's input and
    // the turn it started, which the cancel ended.
    let seq = ack["seq"].as_u64().expect("a seq") as usize;
    let streamed = all[kinds_before.len()..]
        .iter()
        .take_while(|k| **k == "assistant/chunk")
        .count();
    let after_a = &all[kinds_before.len() + streamed..];
    assert_eq!(
        after_a[..9],
        [
            "step/end",
            "turn/end",
            "session/end-seed",
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "request/header",
        ],
        "{all:?}"
    );
    assert_eq!(
        after_a[after_a.len() - 2..],
        ["step/end", "turn/end"],
        "{all:?}"
    );
    let closed = kinds_before.len() + streamed + 1;
    assert!(
        log[closed].to_string().contains("interrupted"),
        "{}",
        log[closed]
    );
    assert_eq!(seq, kinds_before.len() + streamed + 3);
    let splices = spliced(&log);
    assert_eq!(splices.len(), 2, "{splices:?}");
    assert_eq!(splices[1], ("after-kill".to_string(), seq as u64));
    let row = db
        .client()
        .await
        .query_one(
            "SELECT node_id, epoch FROM dsh_leases WHERE session_id = 'k1'",
            &[],
        )
        .await
        .expect("the lease row");
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("node-b"));
    assert_eq!(row.get::<_, i64>(1), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_on_several_nodes_reports_each_count_of_processes_on_one_database() {
    let Some(db) =
        TestDb::create("sim_on_several_nodes_reports_each_count_of_processes_on_one_database")
            .await
    else {
        return;
    };
    let sb = Sandbox::new();
    let r = sb.run(&[
        "sim",
        "--store",
        db.url.as_str(),
        "--nodes",
        "2",
        "--agents",
        "20",
        "--turns",
        "2",
        "--hibernate-ms",
        "50",
        "--ceiling-ms",
        "200",
        "--json",
    ]);
    assert_eq!(r.code, Some(0), "{r:#?}");
    let report: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("one JSON object");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{report}");
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(row["nodes"].as_u64(), Some(k as u64 + 1), "{row}");
        // Every process ran its own 20 agents x 2 turns.
        assert_eq!(row["turns"].as_u64(), Some(40 * (k as u64 + 1)), "{row}");
        assert!(row["turns_per_sec"].as_f64().unwrap_or(0.0) > 0.0, "{row}");
        assert_eq!(
            row["per_node_turns_per_sec"].as_array().map(Vec::len),
            Some(k + 1)
        );
    }
    assert!(
        report["store_ceiling"]["events_per_sec"]
            .as_f64()
            .unwrap_or(0.0)
            > 0.0,
        "{report}"
    );
    assert!(
        report["store_ceiling_ratio"].as_f64().unwrap_or(0.0) > 0.0,
        "{report}"
    );
    // Each process deleted its own sessions.
    let left = db
        .client()
        .await
        .query_one("SELECT count(*) FROM dsh_sessions", &[])
        .await
        .expect("count sessions");
    assert_eq!(left.get::<_, i64>(0), 0);
    // Without PostgreSQL there is nothing to share: a usage error, before anything runs.
    let r = sb.run(&["sim", "--store", "memory", "--nodes", "2"]);
    assert_eq!(r.code, Some(64), "{r:#?}");
    assert!(
        r.stderr.contains("--nodes needs --store postgres"),
        "{r:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_lease_hands_input_to_the_new_host_when_it_wakes() {
    let ttl_ms = 1_000;
    let Some(mut nodes) = two_nodes(
        "a_node_paused_past_its_lease_hands_input_to_the_new_host_when_it_wakes",
        FAST_SIM,
        ttl_ms,
    )
    .await
    else {
        return;
    };
    let TwoNodes { a, b, db, .. } = &mut nodes;
    a.create_with_followup("p1", "hello from a").await;
    let mut on_a = a.events("/v1/sessions/p1/events", None).await;
    on_a.until("turn/end").await;
    drop(on_a);
    // Nothing in flight on A: its last write committed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A's agent is idle and live (it hibernates only after 30 s). A stops past its lease; input
    // on B waits until the lease lapses, then B takes the session over.
    signal(a, Signal::STOP);
    let (status, on_b) = b
        .call(
            "POST",
            "/v1/sessions/p1/followup",
            Some(json!({ "id": "to-b", "text": "while a sleeps" })),
        )
        .await;
    assert_eq!(status, 202, "{on_b}");
    signal(a, Signal::CONT);
    // A's renewal finds the lease taken (within a third of a lease) and fences the session.
    tokio::time::sleep(Duration::from_millis(ttl_ms)).await;
    // Input on A now: its live agent is stopped, and the input goes to B through the inbox.
    let (status, on_a) = a
        .call(
            "POST",
            "/v1/sessions/p1/followup",
            Some(json!({ "id": "to-a", "text": "a is awake" })),
        )
        .await;
    assert_eq!(status, 202, "{on_a}");
    assert!(on_a["seq"].as_u64() > on_b["seq"].as_u64(), "{on_a} {on_b}");
    let log = log_of(b, "p1").await;
    assert_contiguous(&log);
    let splices = spliced(&log);
    let ours: Vec<(String, u64)> = splices
        .iter()
        .filter(|(id, _)| id.starts_with("to-"))
        .cloned()
        .collect();
    assert_eq!(
        ours,
        vec![
            ("to-b".to_string(), on_b["seq"].as_u64().expect("a seq")),
            ("to-a".to_string(), on_a["seq"].as_u64().expect("a seq")),
        ],
        "{:?}",
        types(&log)
    );
    let row = db
        .client()
        .await
        .query_one(
            "SELECT node_id, epoch FROM dsh_leases WHERE session_id = 'p1'",
            &[],
        )
        .await
        .expect("the lease row");
    assert_eq!(row.get::<_, Option<String>>(0).as_deref(), Some("node-b"));
    assert_eq!(row.get::<_, i64>(1), 2);
}
