//! `--store` / `DSH_STORE` selection in the commands that open a store, against a real PostgreSQL
//! server: `run` writes a session there (and continues it in a second process, the first having
//! released its lease), `sessions`, `check` and `export` read it, `import` writes one; and a bad
//! store URL is one clear line, before anything is opened. Two `dsh serve` nodes on one database:
//! a session hosted by one is read on the other from the store (info, messages, export, events
//! replayed and followed) and its input there is 503 `hosted_elsewhere` naming the host.
//!
//! The test creates a database of its own and drops it. Without a server (`DSH_TEST_POSTGRES`,
//! default `postgres://postgres@127.0.0.1:5432/postgres`) it prints one line saying it skipped;
//! with `CI=true` it fails instead.

mod sandbox;
mod serve_support;

use std::time::Duration;

use sandbox::Sandbox;
use serve_support::{SLOW_SIM, Server, kinds};
use tokio_postgres::NoTls;

/// A fresh database on the test server, dropped on drop; `None` when no server is reachable
/// outside CI.
struct TestDb {
    admin_url: String,
    name: String,
    url: String,
}

impl TestDb {
    async fn create(test: &str) -> Option<TestDb> {
        let admin_url = std::env::var("DSH_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
        let connected = tokio::time::timeout(
            Duration::from_secs(5),
            tokio_postgres::connect(&admin_url, NoTls),
        )
        .await;
        let Ok(Ok((client, connection))) = connected else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: PostgreSQL is not reachable at {admin_url} and CI=true"
            );
            eprintln!(
                "{test}: skipped: PostgreSQL not reachable at {admin_url}; run a server on 127.0.0.1:5432 (trust auth) or set DSH_TEST_POSTGRES"
            );
            return None;
        };
        tokio::spawn(connection);
        let name = format!("dsh_test_{}", uuid::Uuid::new_v4().simple());
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        let (base, _) = admin_url
            .rsplit_once('/')
            .expect("DSH_TEST_POSTGRES is a postgres://…/DB URL");
        let url = format!("{base}/{name}");
        Some(TestDb {
            admin_url,
            name,
            url,
        })
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let (admin_url, name) = (self.admin_url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let (client, connection) = tokio_postgres::connect(&admin_url, NoTls).await?;
                tokio::spawn(connection);
                client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop the test database {}", self.name);
        }
    }
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
async fn a_session_hosted_by_another_node_is_read_there_and_its_input_is_hosted_elsewhere() {
    let Some(db) = TestDb::create(
        "a_session_hosted_by_another_node_is_read_there_and_its_input_is_hosted_elsewhere",
    )
    .await
    else {
        return;
    };
    let (dir_a, dir_b) = (Sandbox::new(), Sandbox::new());
    let url = db.url.as_str();
    let a = Server::start(dir_a.path(), SLOW_SIM, &["--store", url]);
    let b = Server::start(dir_b.path(), SLOW_SIM, &["--store", url]);
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

    // Input on B for a session A hosts: 503 hosted_elsewhere naming A, with a Retry-After.
    let refused = b
        .client
        .post(b.url("/v1/sessions/h1/followup"))
        .header("content-type", "application/json")
        .body(r#"{"text":"hello from b"}"#)
        .send()
        .await
        .expect("followup on b");
    assert_eq!(refused.status().as_u16(), 503);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=10).contains(&retry_after), "Retry-After {retry_after}");
    let body: serde_json::Value = refused.json().await.expect("a JSON body");
    assert_eq!(body["error"]["code"], "hosted_elsewhere", "{body}");
    let node_a = format!("node-{}-", a.child.id());
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains(&node_a),
        "{body}"
    );

    // B's stream follows what A writes: the cancelled turn's end reaches it through the store.
    let mut on_b = b.events("/v1/sessions/h1/events", None).await;
    let (status, answer) = a.call("POST", "/v1/sessions/h1/cancel", None).await;
    assert_eq!(status, 202, "{answer}");
    let rest_a = on_a.until("turn/end").await;
    let followed = on_b.until("turn/end").await;
    let all_a: Vec<_> = seen_a.iter().chain(rest_a.iter()).cloned().collect();
    assert_eq!(followed, all_a);
    // Nothing was written by B: the log is A's events, and A's input only.
    let log = b
        .client
        .get(b.url("/v1/sessions/h1/export"))
        .send()
        .await
        .expect("export")
        .text()
        .await
        .expect("a body");
    assert!(!log.contains("hello from b"), "{log}");
}
