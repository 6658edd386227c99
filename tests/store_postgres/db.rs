//! `TestDb`: a database of a test's own on the test server, created fresh and dropped at the end.
//! Shared by the store tests (`tests/store_postgres/mod.rs`) and the CLI's PostgreSQL and cluster
//! tests (`cli/tests/store_postgres.rs`, `cli/tests/cluster.rs`, through `#[path]`).
//!
//! Without a server (`DSH_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432/postgres`)
//! `create` prints one line saying the test skipped and how to run it; with `CI=true` it panics.

#![allow(dead_code)]

use std::time::Duration;

use tokio_postgres::NoTls;

/// A database of this test's own, dropped (with its connections) when this goes out of scope.
pub struct TestDb {
    admin_url: String,
    name: String,
    /// The URL of the test's database.
    pub url: String,
}

impl TestDb {
    /// A fresh database, or `None` (after one line on stderr) when no server is reachable outside
    /// CI. Panics under `CI=true` when none is.
    pub async fn create(test: &str) -> Option<TestDb> {
        let admin_url = std::env::var("DSH_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
        let connected = tokio::time::timeout(
            Duration::from_secs(5),
            tokio_postgres::connect(&admin_url, NoTls),
        )
        .await;
        let (client, connection) = match connected {
            Ok(Ok(pair)) => pair,
            failed => {
                let why = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                assert!(
                    std::env::var("CI").as_deref() != Ok("true"),
                    "{test}: PostgreSQL is not reachable at {admin_url} ({why}) and CI=true"
                );
                eprintln!(
                    "{test}: skipped: PostgreSQL not reachable at {admin_url} ({why}); run a server on 127.0.0.1:5432 (trust auth) or set DSH_TEST_POSTGRES"
                );
                return None;
            }
        };
        tokio::spawn(connection);
        let name = format!("dsh_test_{}", uuid::Uuid::new_v4().simple());
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        let url = match admin_url.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{name}"),
            None => panic!("DSH_TEST_POSTGRES must be a postgres://…/DB URL"),
        };
        Some(TestDb {
            admin_url,
            name,
            url,
        })
    }

    /// A plain client on the test database, for looking at rows and breaking things.
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        client
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        // Its own thread and runtime: this may run inside a runtime, or while a test panics.
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
