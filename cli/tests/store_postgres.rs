//! `--store` / `DSH_STORE` selection in the commands that open a store, against a real PostgreSQL
//! server: `run` writes a session there (and continues it in a second process, the first having
//! released its lease), `sessions`, `check` and `export` read it, `import` writes one; and a bad
//! store URL is one clear line, before anything is opened.
//!
//! The test creates a database of its own and drops it. Without a server (`DSH_TEST_POSTGRES`,
//! default `postgres://postgres@127.0.0.1:5432/postgres`) it prints one line saying it skipped;
//! with `CI=true` it fails instead.

mod sandbox;

use std::time::Duration;

use sandbox::Sandbox;
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
