//! The writer of `PostgresStore`: one task that owns the write connection and commits everything
//! queued, from every session, in one transaction.
//!
//! `run_writer` waits for a request, takes every request queued behind it (at most
//! `PostgresConfig::group_requests_max`), and commits the group: `BEGIN`, one statement per request
//! sent pipelined (one round trip for the group), `COMMIT` with `synchronous_commit = on` (one WAL
//! flush on the server). Only then does it take the next group, so requests that arrive during a
//! commit form the next group; there is no timer.
//!
//! Each append is fenced in its own statement: it inserts its rows only if this node holds the
//! session's lease at the epoch the append carries (the lease row is locked `FOR SHARE`, so a
//! takeover waits for this transaction, or this statement sees the takeover and inserts nothing)
//! and the stored log ends just before the batch. A request that inserts nothing fails alone — its
//! session is marked fenced — and the rest of the group commits. If a statement or the `COMMIT`
//! itself fails, whether the group is durable is unknown: every waiter gets `Io`, every session in
//! the group is poisoned (writes refused until a `load` takes the lease again and re-reads the
//! truth), the connection is dropped, and the next group reconnects. Sessions outside the group are
//! untouched.
//!
//! Lock order: a group's statements run in session-id byte order, and every statement that locks
//! several lease rows (the renewal, the release at close) locks them in that order too, so the
//! writer and a renewal never wait on each other in a circle (PostgreSQL answered `deadlock
//! detected` to `dsh sim --agents 1000` before).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use futures::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::{Client, Statement};
use tracing::{Instrument, debug, warn};

use super::{HeldState, Shared, pg_error};
use crate::ids::SessionId;
use crate::session::store::{EncodedEvent, StoreError};

/// Inserts a batch if the lease and the log's end allow it: `$1` session, `$2` node, `$3` epoch,
/// `$4`/`$5`/`$6` seqs, kinds and JSON texts, `$7` the first seq.
const INSERT_FENCED: &str = "\
    WITH lease AS (
        SELECT 1 FROM dsh_leases
        WHERE session_id = $1 AND node_id = $2 AND epoch = $3
        FOR SHARE
    ), tail AS (
        SELECT coalesce(max(seq) + 1, 0) AS next FROM dsh_events WHERE session_id = $1
    )
    INSERT INTO dsh_events (session_id, seq, kind, json)
    SELECT $1, t.seq, t.kind, t.json
    FROM unnest($4::bigint[], $5::text[], $6::text[]) AS t(seq, kind, json)
    WHERE EXISTS (SELECT 1 FROM lease) AND (SELECT next FROM tail) = $7";

/// Deletes a session, its events, its inbox rows and its lease if this node holds the lease at
/// `$3`.
const DELETE_FENCED: &str = "\
    WITH lease AS (
        DELETE FROM dsh_leases WHERE session_id = $1 AND node_id = $2 AND epoch = $3 RETURNING 1
    ), events AS (
        DELETE FROM dsh_events WHERE session_id = $1 AND EXISTS (SELECT 1 FROM lease)
    ), inbox AS (
        DELETE FROM dsh_inbox WHERE session_id = $1 AND EXISTS (SELECT 1 FROM lease)
    )
    DELETE FROM dsh_sessions WHERE id = $1 AND EXISTS (SELECT 1 FROM lease)";

#[derive(Debug)]
pub(super) enum Op {
    /// Events appended at the stored end, under the lease epoch the caller holds.
    Append {
        id: SessionId,
        epoch: i64,
        events: Vec<EncodedEvent>,
    },
    /// The session, its log and its lease, under the lease epoch the caller holds.
    Delete { id: SessionId, epoch: i64 },
    /// Give the lease up, after every write queued before it.
    Release { id: SessionId, epoch: i64 },
    /// Stop once everything queued before this is committed.
    Close,
}

impl Op {
    /// The session the operation writes, in byte order (`COLLATE "C"` in SQL); none for `Close`.
    fn session(&self) -> Option<&[u8]> {
        match self {
            Op::Append { id, .. } | Op::Delete { id, .. } | Op::Release { id, .. } => {
                Some(id.as_str().as_bytes())
            }
            Op::Close => None,
        }
    }
}

/// One queued write and the waiter it answers.
pub(super) struct Request {
    pub(super) op: Op,
    pub(super) reply: oneshot::Sender<Result<(), StoreError>>,
}

/// Releases the lease of `$1` held by node `$2` at epoch `$3` (a later take raised the epoch: no-op).
const RELEASE: &str = "\
    UPDATE dsh_leases SET node_id = NULL, expires_at = now()
    WHERE session_id = $1 AND node_id = $2 AND epoch = $3";

/// The write connection and its prepared statements.
pub(super) struct WriterConn {
    client: Client,
    insert: Statement,
    delete: Statement,
    release: Statement,
}

/// Opens the write connection: `synchronous_commit = on` for this session whatever the server's
/// default, and the statements prepared.
pub(super) async fn connect_writer(shared: &Shared) -> Result<WriterConn, String> {
    let client = super::connect(&shared.pg_config, "writer").await?;
    client
        .batch_execute("SET synchronous_commit = on")
        .await
        .map_err(|e| e.to_string())?;
    let insert = client
        .prepare(INSERT_FENCED)
        .await
        .map_err(|e| e.to_string())?;
    let delete = client
        .prepare(DELETE_FENCED)
        .await
        .map_err(|e| e.to_string())?;
    let release = client.prepare(RELEASE).await.map_err(|e| e.to_string())?;
    Ok(WriterConn {
        client,
        insert,
        delete,
        release,
    })
}

/// The writer task. See the module docs.
pub(super) async fn run_writer(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Request>,
    conn: WriterConn,
) {
    let mut conn = Some(conn);
    let group_requests_max = shared.config.group_requests_max;
    while let Some(first) = rx.recv().await {
        let mut group = vec![first];
        while group.len() < group_requests_max {
            match rx.try_recv() {
                Ok(request) => group.push(request),
                Err(_) => break,
            }
        }
        let close_idx = group.iter().position(|r| matches!(r.op, Op::Close));
        let after_close = close_idx.map(|idx| group.split_off(idx));
        if !group.is_empty() {
            let span = tracing::debug_span!("pg_commit", n_requests = group.len());
            commit_group(&shared, &mut conn, group)
                .instrument(span)
                .await;
        }
        if let Some(mut rest) = after_close {
            drop(conn.take());
            let close = rest.remove(0);
            for request in rest {
                let _ = request.reply.send(Err(StoreError::Closed));
            }
            let _ = close.reply.send(Ok(()));
            break;
        }
    }
    debug!(node = %shared.config.node_id, "postgres store writer stopped");
}

/// The owned parameters of one request's statement.
struct Params<'a> {
    id: &'a str,
    epoch: i64,
    seqs: Vec<i64>,
    kinds: Vec<&'a str>,
    jsons: Vec<&'a str>,
    first: i64,
    kind: Kind,
}

/// Which statement a request runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Append,
    Delete,
    Release,
}

/// What one request's statement did, before the commit.
enum Outcome {
    /// Inserted its batch or deleted its session.
    Done,
    /// Inserted or deleted nothing: the lease or the log's end did not allow it.
    Refused,
    /// Could not be sent (not UTF-8, out of range): answered with this error, nothing written.
    Invalid(StoreError),
}

fn params_of(request: &Request) -> Result<Option<Params<'_>>, StoreError> {
    match &request.op {
        Op::Close => Ok(None),
        Op::Delete { id, epoch } | Op::Release { id, epoch } => Ok(Some(Params {
            id: id.as_str(),
            epoch: *epoch,
            seqs: Vec::new(),
            kinds: Vec::new(),
            jsons: Vec::new(),
            first: 0,
            kind: if matches!(request.op, Op::Delete { .. }) {
                Kind::Delete
            } else {
                Kind::Release
            },
        })),
        Op::Append { id, epoch, events } => {
            let invalid = |cause: String| StoreError::Io {
                op: "append",
                cause,
            };
            let mut seqs = Vec::with_capacity(events.len());
            let mut kinds = Vec::with_capacity(events.len());
            let mut jsons = Vec::with_capacity(events.len());
            for e in events {
                seqs.push(
                    i64::try_from(e.seq)
                        .map_err(|_| invalid(format!("seq {} too large", e.seq)))?,
                );
                kinds.push(&*e.kind);
                jsons.push(
                    std::str::from_utf8(&e.json)
                        .map_err(|_| invalid(format!("event {} is not UTF-8", e.seq)))?,
                );
            }
            let first = seqs.first().copied().unwrap_or(0);
            Ok(Some(Params {
                id: id.as_str(),
                epoch: *epoch,
                seqs,
                kinds,
                jsons,
                first,
                kind: Kind::Append,
            }))
        }
    }
}

/// Runs the group's statements in one transaction and commits it.
async fn write_group(
    shared: &Shared,
    conn: &mut WriterConn,
    group: &[Request],
) -> Result<Vec<Outcome>, tokio_postgres::Error> {
    let node = shared.config.node_id.as_str();
    let params: Vec<Result<Option<Params<'_>>, StoreError>> = group.iter().map(params_of).collect();
    let tx = conn.client.transaction().await?;
    let results = {
        let futures = params.iter().map(|p| {
            let tx = &tx;
            let insert = &conn.insert;
            let delete = &conn.delete;
            let release = &conn.release;
            async move {
                match p {
                    Err(e) => Ok(Outcome::Invalid(e.clone())),
                    Ok(None) => Ok(Outcome::Done),
                    Ok(Some(p)) if p.kind == Kind::Release => {
                        // A lease already taken again (a higher epoch) is left alone.
                        tx.execute(release, &[&p.id, &node, &p.epoch]).await?;
                        Ok(Outcome::Done)
                    }
                    Ok(Some(p)) if p.kind == Kind::Delete => {
                        let n = tx.execute(delete, &[&p.id, &node, &p.epoch]).await?;
                        Ok(if n == 1 {
                            Outcome::Done
                        } else {
                            Outcome::Refused
                        })
                    }
                    Ok(Some(p)) => {
                        let n = tx
                            .execute(
                                insert,
                                &[
                                    &p.id, &node, &p.epoch, &p.seqs, &p.kinds, &p.jsons, &p.first,
                                ],
                            )
                            .await?;
                        Ok(if n == p.seqs.len() as u64 {
                            Outcome::Done
                        } else {
                            Outcome::Refused
                        })
                    }
                }
            }
        });
        join_all(futures).await
    };
    let mut outcomes = Vec::with_capacity(results.len());
    for result in results {
        outcomes.push(result?);
    }
    tx.commit().await?;
    Ok(outcomes)
}

/// Commits one group and answers every request. See the module docs for what a failure costs.
async fn commit_group(
    shared: &Arc<Shared>,
    conn: &mut Option<WriterConn>,
    mut group: Vec<Request>,
) {
    shared.counters.n_groups.fetch_add(1, Ordering::SeqCst);
    // Lease rows are locked in session-id order, as the renewal locks them: two transactions
    // locking the same rows in one order cannot deadlock. The sort is stable, so one session's
    // requests keep their order.
    group.sort_by(|a, b| a.op.session().cmp(&b.op.session()));
    let started = Instant::now();
    if conn.as_ref().is_none_or(|c| c.client.is_closed()) {
        match connect_writer(shared).await {
            Ok(c) => *conn = Some(c),
            Err(cause) => {
                *conn = None;
                fail_group(
                    shared,
                    group,
                    &format!("the write connection is lost: {cause}"),
                );
                return;
            }
        }
    }
    let Some(c) = conn.as_mut() else {
        return;
    };
    let outcomes = match write_group(shared, c, &group).await {
        Ok(outcomes) => outcomes,
        Err(e) => {
            *conn = None;
            fail_group(shared, group, &pg_error(&e));
            return;
        }
    };
    let mut n_events = 0u64;
    let mut n_requests = 0u64;
    for (request, outcome) in group.into_iter().zip(outcomes) {
        let answer = match outcome {
            Outcome::Done => {
                n_requests += 1;
                if let Op::Append { events, .. } = &request.op {
                    n_events += events.len() as u64;
                }
                Ok(())
            }
            Outcome::Invalid(e) => Err(e),
            Outcome::Refused => Err(refused(shared, &request.op).await),
        };
        let _ = request.reply.send(answer);
    }
    let c = &shared.counters;
    c.n_requests_committed
        .fetch_add(n_requests, Ordering::SeqCst);
    c.n_events_committed.fetch_add(n_events, Ordering::SeqCst);
    debug!(
        n_requests,
        n_events,
        commit_us = started.elapsed().as_micros() as u64,
        "group committed"
    );
}

/// Answers a whole group with `Io` and poisons each of its sessions.
fn fail_group(shared: &Shared, group: Vec<Request>, cause: &str) {
    warn!(%cause, n_requests = group.len(), "a postgres commit failed; poisoning its sessions");
    for request in group {
        let id = match &request.op {
            Op::Append { id, .. } | Op::Delete { id, .. } | Op::Release { id, .. } => Some(id),
            Op::Close => None,
        };
        if let Some(id) = id {
            shared.set_state(
                id,
                HeldState::Poisoned(format!("a commit of this session failed: {cause}")),
            );
        }
        let _ = request.reply.send(Err(StoreError::Io {
            op: "append",
            cause: cause.to_string(),
        }));
    }
}

/// Why a fenced statement wrote nothing: the lease moved (`Fenced`), or the log did (`SeqMismatch`).
/// Either way the session takes no more writes here until a `load`.
async fn refused(shared: &Shared, op: &Op) -> StoreError {
    let (id, epoch, first) = match op {
        Op::Append { id, epoch, events } => (id, *epoch, events.first().map_or(0, |e| e.seq)),
        Op::Delete { id, epoch } | Op::Release { id, epoch } => (id, *epoch, 0),
        Op::Close => return StoreError::Closed,
    };
    let holder = shared.lease_holder(id).await;
    let ours = matches!(&holder, Ok(Some((Some(node), e))) if *node == shared.config.node_id && *e == epoch);
    if ours && matches!(op, Op::Append { .. }) {
        let expected = shared.stored_end(id).await.unwrap_or(0);
        shared.set_state(
            id,
            HeldState::Poisoned(format!(
                "the stored log ends before seq {expected}, not {first}"
            )),
        );
        return StoreError::SeqMismatch {
            id: id.clone(),
            expected,
            got: first,
        };
    }
    let reason = match holder {
        Ok(Some((Some(node), e))) => {
            format!("node {node} holds its lease at epoch {e}; this node held epoch {epoch}")
        }
        Ok(Some((None, e))) => {
            format!("its lease was released at epoch {e}; this node held epoch {epoch}")
        }
        Ok(None) => "its lease is gone (the session was deleted)".to_string(),
        Err(e) => format!("its lease could not be read after a refused write: {e}"),
    };
    shared.set_state(id, HeldState::Fenced(reason.clone()));
    StoreError::Fenced {
        id: id.clone(),
        reason,
        left: None,
    }
}
