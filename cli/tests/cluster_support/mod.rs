//! Helpers for tests with several `dsh serve` nodes on one PostgreSQL database (SPEC §14): start a
//! node with a name and a lease period, signal it (SIGKILL, SIGSTOP, SIGCONT), and read a session's
//! log as JSON values — the events in seq order and the message ids its inbox splices inserted.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::serve_support::{Server, serve_command};

/// Starts `dsh serve` on `url` as node `name` with leases of `ttl_ms`.
pub fn start_node(dir: &Path, config: &str, url: &str, name: &str, ttl_ms: u64) -> Server {
    let mut cmd = serve_command(dir, config, &["--listen", "127.0.0.1:0", "--store", url]);
    cmd.env("DSH_NODE_ID", name)
        .env("DSH_LEASE_TTL_MS", ttl_ms.to_string());
    Server::start_with(cmd)
}

/// Sends `signal` to the node's process.
pub fn signal(server: &Server, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(server.child.id() as i32).expect("a pid");
    rustix::process::kill_process(pid, signal).expect("signal the node");
}

/// Kills the node at once (SIGKILL) and reaps it.
pub fn kill(server: &mut Server) {
    let _ = server.child.kill();
    let _ = server.child.wait();
}

/// The session's log through `server`'s export, one JSON value per event (the header line left
/// out), in seq order.
pub async fn log_of(server: &Server, id: &str) -> Vec<Value> {
    let resp = server
        .client
        .get(server.url(&format!("/v1/sessions/{id}/export")))
        .send()
        .await
        .expect("export");
    assert_eq!(resp.status().as_u16(), 200, "export {id}");
    let text = resp.text().await.expect("an export body");
    text.lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON line"))
        .filter(|v| v.get("seq").is_some() && v.get("type").is_some())
        .collect()
}

/// The `type` of each event.
pub fn types(log: &[Value]) -> Vec<&str> {
    log.iter()
        .map(|e| e["type"].as_str().unwrap_or("?"))
        .collect()
}

/// Every message id an `agent/inbox/spliced` event inserted, with that event's seq, in log order.
pub fn spliced(log: &[Value]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for e in log {
        if e["type"] == "agent/inbox/spliced" {
            let seq = e["seq"].as_u64().expect("a seq");
            for m in e["data"]["inserted"].as_array().into_iter().flatten() {
                out.push((m["id"].as_str().unwrap_or("?").to_string(), seq));
            }
        }
    }
    out
}

/// How many times each message id was inserted by a splice.
pub fn splice_counts(log: &[Value]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (id, _) in spliced(log) {
        *counts.entry(id).or_insert(0) += 1;
    }
    counts
}

/// Asserts the log's seqs are 0, 1, 2, … with none twice.
pub fn assert_contiguous(log: &[Value]) {
    let seqs: Vec<u64> = log.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>(), "seqs");
}
