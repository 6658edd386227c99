//! The PostgreSQL schema and its versioned migrations, run by every `PostgresStore::open`.
//!
//! `dsh_schema(version)` records each migration applied. `migrate` runs in one transaction under a
//! transaction-level advisory lock, so nodes starting together apply each migration exactly once; a
//! database whose recorded version is newer than this program knows is refused rather than written.
//!
//! Tables (version 1):
//! - `dsh_sessions(id PRIMARY KEY, ord, created_at, header)`: one row per session, its header as
//!   JSON; `ord` (a sequence) is creation order, which `list` follows.
//! - `dsh_events(session_id, seq, kind, json)`, primary key `(session_id, seq)`: each event as its
//!   exact v0 JSON text (`text`, never `jsonb`, which would reorder keys), its type beside it.
//! - `dsh_leases(session_id PRIMARY KEY, node_id, epoch, expires_at)`: who hosts a session (SPEC
//!   §14). `node_id` is `NULL` once released; `epoch` only grows.
//!
//! Version 2:
//! - `dsh_inbox(session_id, n, input_id, kind, body, from_node, created_at, outcome, seq)`, primary
//!   key `(session_id, n)`, unique `(session_id, input_id)`: input for a session hosted by another
//!   node, durable until its host applies it (SPEC §14). `n` numbers one session's inputs in commit
//!   order (an insert takes the session's advisory lock, so `n` is assigned and committed in one
//!   order); `outcome` is `NULL` while pending, then `applied` (with the splice's `seq`) or
//!   `refused: …`. The rows stay as the record of what was answered: a repeated `input_id` meets
//!   its row and is answered from it.

use tokio_postgres::Client;

/// The migrations, in order: (version, SQL). Append only; never edit one that has shipped.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE dsh_sessions (
         id text PRIMARY KEY,
         ord bigserial NOT NULL UNIQUE,
         created_at bigint NOT NULL,
         header text NOT NULL
     );
     CREATE TABLE dsh_events (
         session_id text NOT NULL,
         seq bigint NOT NULL CHECK (seq >= 0),
         kind text NOT NULL,
         json text NOT NULL,
         PRIMARY KEY (session_id, seq)
     );
     CREATE TABLE dsh_leases (
         session_id text PRIMARY KEY,
         node_id text,
         epoch bigint NOT NULL,
         expires_at timestamptz NOT NULL
     );
     CREATE INDEX dsh_leases_node ON dsh_leases (node_id);",
    ),
    (
        2,
        "CREATE TABLE dsh_inbox (
             session_id text NOT NULL,
             n bigint NOT NULL CHECK (n >= 1),
             input_id text NOT NULL,
             kind text NOT NULL,
             body text NOT NULL,
             from_node text NOT NULL,
             created_at timestamptz NOT NULL DEFAULT now(),
             outcome text,
             seq bigint,
             PRIMARY KEY (session_id, n),
             UNIQUE (session_id, input_id)
         );
         CREATE INDEX dsh_inbox_pending ON dsh_inbox (session_id, n) WHERE outcome IS NULL;",
    ),
];

/// The advisory lock key that serializes migrations between nodes ("dsh-rs" in ASCII).
const MIGRATION_LOCK: i64 = 0x0000_6473_682d_7273;

/// The schema version this program writes.
pub(super) fn current_version() -> i32 {
    MIGRATIONS.last().map_or(0, |(v, _)| *v)
}

/// Brings the database to `current_version`, applying what is missing in one transaction.
/// Returns the versions applied.
///
/// # Errors
/// A description when the database cannot be read or written, or its schema is newer than ours.
pub(super) async fn migrate(client: &mut Client) -> Result<Vec<i32>, String> {
    let tx = client.transaction().await.map_err(|e| e.to_string())?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| e.to_string())?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS dsh_schema (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await
    .map_err(|e| e.to_string())?;
    let row = tx
        .query_one("SELECT coalesce(max(version), 0) FROM dsh_schema", &[])
        .await
        .map_err(|e| e.to_string())?;
    let stored: i32 = row.try_get(0).map_err(|e| e.to_string())?;
    let known = current_version();
    if stored > known {
        return Err(format!(
            "the database's dsh schema is version {stored}, newer than this program's {known}: \
             upgrade dsh"
        ));
    }
    let mut applied = Vec::new();
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > stored) {
        tx.batch_execute(sql)
            .await
            .map_err(|e| format!("migration {version}: {e}"))?;
        tx.execute("INSERT INTO dsh_schema (version) VALUES ($1)", &[version])
            .await
            .map_err(|e| format!("migration {version}: {e}"))?;
        applied.push(*version);
    }
    tx.commit().await.map_err(|e| e.to_string())?;
    Ok(applied)
}
