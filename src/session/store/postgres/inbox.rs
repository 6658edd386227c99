//! The inbox of input for sessions hosted by another node (SPEC §14), in `dsh_inbox`.
//!
//! A node that receives input for a session whose live lease another node holds makes it durable
//! here (`inbox_put`: that commit, with `synchronous_commit = on`, is its acknowledgement) and
//! notifies the channel `dsh_inbox` with the session id in the same transaction. The hosting node
//! hears it (`inbox_listen`), reads the session's pending rows in order (`inbox_pending`), applies
//! each through its agent, and marks it (`inbox_settle`) once the agent's append is durable. A
//! crash between the append and the mark makes the next host apply the row again; the log's
//! idempotency by message id turns that into a no-op that only marks the row. Every node also scans
//! (`inbox_unhosted`) for pending rows of sessions whose lease is free or expired, and takes them
//! over: a session with pending input is never without a host for much longer than a lease.
//!
//! Settled rows are kept for a while (`inbox_gc`) as the record a repeated message id is answered
//! from; deleting a session deletes its rows.
//!
//! Order: an insert takes a transaction-level advisory lock on the session, then numbers its row
//! one past the session's greatest `n`. Inserts to one session are therefore serialized and commit
//! in `n` order, so applying in `n` order is applying in commit order.

use std::sync::Weak;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tracing::{debug, warn};

use super::{PostgresStore, Shared, io_error, pg_error};
use crate::ids::SessionId;
use crate::session::store::StoreError;

/// The notification channel of new inbox rows; the payload is the session id.
pub const INBOX_CHANNEL: &str = "dsh_inbox";

/// What an inbox row asks of the session's agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboxKind {
    /// A followup (`body` is the message's v0 JSON).
    Followup,
    /// A steer (`body` is the message's v0 JSON).
    Steer,
    /// An inject (`body` is the message's v0 JSON).
    Inject,
    /// A cancel (`body` is `{"keep_inbox":BOOL}`).
    Cancel,
}

impl InboxKind {
    /// The kind's name as stored (and as in serve's paths).
    pub fn as_str(self) -> &'static str {
        match self {
            InboxKind::Followup => "followup",
            InboxKind::Steer => "steer",
            InboxKind::Inject => "inject",
            InboxKind::Cancel => "cancel",
        }
    }

    /// The kind a stored name names.
    pub fn parse(s: &str) -> Option<InboxKind> {
        match s {
            "followup" => Some(InboxKind::Followup),
            "steer" => Some(InboxKind::Steer),
            "inject" => Some(InboxKind::Inject),
            "cancel" => Some(InboxKind::Cancel),
            _ => None,
        }
    }
}

/// One pending inbox row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxInput {
    /// Its place in the session's inbox order (from 1).
    pub n: u64,
    /// The message id (or a minted id for a cancel): unique per session.
    pub input_id: String,
    /// What it asks.
    pub kind: InboxKind,
    /// The message's v0 JSON, or the cancel's options.
    pub body: String,
}

/// Where an inbox row stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboxOutcome {
    /// Not applied yet.
    Pending,
    /// Applied; `seq` is the durable splice that queued the message (none for a cancel).
    Applied {
        /// The splice's seq.
        seq: Option<u64>,
    },
    /// The host could not apply it (the agent refused the message); never retried.
    Refused(String),
}

/// The answer of `inbox_put`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxPut {
    /// The row's place in the session's inbox order.
    pub n: u64,
    /// False when a row with this `input_id` was there already (nothing was inserted).
    pub fresh: bool,
    /// The row's outcome now.
    pub outcome: InboxOutcome,
}

fn outcome_of(outcome: Option<String>, seq: Option<i64>) -> InboxOutcome {
    match outcome.as_deref() {
        None => InboxOutcome::Pending,
        Some("applied") => InboxOutcome::Applied {
            seq: seq.and_then(|s| u64::try_from(s).ok()),
        },
        Some(other) => {
            InboxOutcome::Refused(other.strip_prefix("refused: ").unwrap_or(other).to_string())
        }
    }
}

/// Opens a transaction on `client` with `synchronous_commit` set to `synchronous_commit` for it
/// alone.
async fn begin<'a>(
    client: &'a mut deadpool_postgres::Object,
    op: &'static str,
    synchronous_commit: &'static str,
) -> Result<deadpool_postgres::Transaction<'a>, StoreError> {
    let e = |e: tokio_postgres::Error| io_error(op, pg_error(&e));
    let tx = client.transaction().await.map_err(e)?;
    tx.batch_execute(&format!(
        "SET LOCAL synchronous_commit = {synchronous_commit}"
    ))
    .await
    .map_err(e)?;
    Ok(tx)
}

fn to_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PostgresStore {
    /// Makes one input for session `id` durable in the inbox and notifies the hosts; returns its
    /// place and outcome. A row with the same `input_id` already there is returned as it stands
    /// (`fresh: false`) and nothing is written.
    ///
    /// # Errors
    /// `NotFound` when no such session is stored; `Io`; `Closed`.
    pub async fn inbox_put(
        &self,
        id: &SessionId,
        input_id: &str,
        kind: InboxKind,
        body: &str,
    ) -> Result<InboxPut, StoreError> {
        self.shared.readable()?;
        let op = "inbox put";
        let mut client = self.shared.client(op).await?;
        let tx = begin(&mut client, op, "on").await?;
        let e = |e: tokio_postgres::Error| io_error(op, pg_error(&e));
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[&id.as_str()],
        )
        .await
        .map_err(e)?;
        let exists = tx
            .query_opt("SELECT 1 FROM dsh_sessions WHERE id = $1", &[&id.as_str()])
            .await
            .map_err(e)?;
        if exists.is_none() {
            return Err(StoreError::NotFound { id: id.clone() });
        }
        let inserted = tx
            .query_opt(
                "INSERT INTO dsh_inbox (session_id, n, input_id, kind, body, from_node) \
                 SELECT $1, coalesce(max(n), 0) + 1, $2, $3, $4, $5 \
                 FROM dsh_inbox WHERE session_id = $1 \
                 ON CONFLICT (session_id, input_id) DO NOTHING RETURNING n",
                &[
                    &id.as_str(),
                    &input_id,
                    &kind.as_str(),
                    &body,
                    &self.shared.config.node_id,
                ],
            )
            .await
            .map_err(e)?;
        let put = match inserted {
            Some(row) => {
                let n: i64 = row.try_get(0).map_err(|e| io_error(op, e))?;
                tx.execute("SELECT pg_notify($1, $2)", &[&INBOX_CHANNEL, &id.as_str()])
                    .await
                    .map_err(e)?;
                InboxPut {
                    n: u64::try_from(n).unwrap_or(0),
                    fresh: true,
                    outcome: InboxOutcome::Pending,
                }
            }
            None => {
                let row = tx
                    .query_one(
                        "SELECT n, outcome, seq FROM dsh_inbox \
                         WHERE session_id = $1 AND input_id = $2",
                        &[&id.as_str(), &input_id],
                    )
                    .await
                    .map_err(e)?;
                let n: i64 = row.try_get(0).map_err(|e| io_error(op, e))?;
                InboxPut {
                    n: u64::try_from(n).unwrap_or(0),
                    fresh: false,
                    outcome: outcome_of(
                        row.try_get(1).map_err(|e| io_error(op, e))?,
                        row.try_get(2).map_err(|e| io_error(op, e))?,
                    ),
                }
            }
        };
        tx.commit().await.map_err(e)?;
        debug!(session = %id, n = put.n, fresh = put.fresh, kind = kind.as_str(), "inbox row durable");
        Ok(put)
    }

    /// The outcome of row `n` of session `id`'s inbox (`Pending` when there is no such row).
    ///
    /// # Errors
    /// `Io`; `Closed`.
    pub async fn inbox_outcome(&self, id: &SessionId, n: u64) -> Result<InboxOutcome, StoreError> {
        self.shared.readable()?;
        let op = "inbox outcome";
        let client = self.shared.client(op).await?;
        let row = client
            .query_opt(
                "SELECT outcome, seq FROM dsh_inbox WHERE session_id = $1 AND n = $2",
                &[&id.as_str(), &to_i64(n)],
            )
            .await
            .map_err(|e| io_error(op, pg_error(&e)))?;
        Ok(match row {
            None => InboxOutcome::Pending,
            Some(row) => outcome_of(
                row.try_get(0).map_err(|e| io_error(op, e))?,
                row.try_get(1).map_err(|e| io_error(op, e))?,
            ),
        })
    }

    /// Session `id`'s pending inbox rows, in order.
    ///
    /// # Errors
    /// `Io`; `Closed`; `Corrupt` for a row of an unknown kind.
    pub async fn inbox_pending(&self, id: &SessionId) -> Result<Vec<InboxInput>, StoreError> {
        self.shared.readable()?;
        let op = "inbox pending";
        let client = self.shared.client(op).await?;
        let rows = client
            .query(
                "SELECT n, input_id, kind, body FROM dsh_inbox \
                 WHERE session_id = $1 AND outcome IS NULL ORDER BY n",
                &[&id.as_str()],
            )
            .await
            .map_err(|e| io_error(op, pg_error(&e)))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let n: i64 = row.try_get(0).map_err(|e| io_error(op, e))?;
            let kind: &str = row.try_get(2).map_err(|e| io_error(op, e))?;
            let Some(kind) = InboxKind::parse(kind) else {
                return Err(StoreError::Corrupt {
                    id: id.clone(),
                    seq: 0,
                    reason: format!("inbox row {n} has the unknown kind {kind:?}"),
                });
            };
            out.push(InboxInput {
                n: u64::try_from(n).unwrap_or(0),
                input_id: row.try_get(1).map_err(|e| io_error(op, e))?,
                kind,
                body: row.try_get(3).map_err(|e| io_error(op, e))?,
            });
        }
        Ok(out)
    }

    /// Marks row `n` of session `id`'s inbox with `outcome` (`Pending` marks nothing), if no one
    /// marked it first. Committed without waiting for the flush: a mark lost in a crash only makes
    /// the next host find the input in the log and mark it again.
    ///
    /// # Errors
    /// `Io`; `Closed`.
    pub async fn inbox_settle(
        &self,
        id: &SessionId,
        n: u64,
        outcome: &InboxOutcome,
    ) -> Result<(), StoreError> {
        self.shared.readable()?;
        let (text, seq) = match outcome {
            InboxOutcome::Pending => return Ok(()),
            InboxOutcome::Applied { seq } => ("applied".to_string(), seq.map(to_i64)),
            InboxOutcome::Refused(why) => (format!("refused: {why}"), None),
        };
        let op = "inbox settle";
        let mut client = self.shared.client(op).await?;
        let tx = begin(&mut client, op, "off").await?;
        let e = |e: tokio_postgres::Error| io_error(op, pg_error(&e));
        tx.execute(
            "UPDATE dsh_inbox SET outcome = $3, seq = $4 \
             WHERE session_id = $1 AND n = $2 AND outcome IS NULL",
            &[&id.as_str(), &to_i64(n), &text, &seq],
        )
        .await
        .map_err(e)?;
        tx.commit().await.map_err(e)
    }

    /// Sessions with pending inbox rows that this node should host: their lease is free, expired,
    /// absent, or this node's. Oldest pending first, at most `limit`.
    ///
    /// # Errors
    /// `Io`; `Closed`.
    pub async fn inbox_unhosted(&self, limit: u32) -> Result<Vec<SessionId>, StoreError> {
        self.shared.readable()?;
        let op = "inbox scan";
        let client = self.shared.client(op).await?;
        let rows = client
            .query(
                "SELECT i.session_id FROM dsh_inbox i \
                 LEFT JOIN dsh_leases l ON l.session_id = i.session_id \
                 WHERE i.outcome IS NULL AND (l.session_id IS NULL OR l.node_id IS NULL \
                       OR l.node_id = $1 OR l.expires_at < now()) \
                 GROUP BY i.session_id ORDER BY min(i.created_at) LIMIT $2",
                &[&self.shared.config.node_id, &i64::from(limit)],
            )
            .await
            .map_err(|e| io_error(op, pg_error(&e)))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: &str = row.try_get(0).map_err(|e| io_error(op, e))?;
            match SessionId::new(id) {
                Ok(id) => out.push(id),
                Err(e) => warn!(error = %e, "an inbox row names an invalid session id"),
            }
        }
        Ok(out)
    }

    /// Deletes inbox rows settled more than `older_than` ago (pending rows are never deleted);
    /// returns how many. A repeated message id that no longer meets its row is still applied once
    /// — the host finds it in the log — but is answered 202 rather than 200.
    ///
    /// # Errors
    /// `Io`; `Closed`.
    pub async fn inbox_gc(&self, older_than: Duration) -> Result<u64, StoreError> {
        self.shared.readable()?;
        let op = "inbox gc";
        let ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let client = self.shared.client(op).await?;
        client
            .execute(
                "DELETE FROM dsh_inbox WHERE outcome IS NOT NULL \
                 AND created_at < now() - $1::bigint * interval '1 millisecond'",
                &[&ms],
            )
            .await
            .map_err(|e| io_error(op, pg_error(&e)))
    }

    /// Listens on `dsh_inbox` over a connection of its own (reconnecting when it drops) and sends
    /// the session id of every new inbox row. After a reconnect, notifications sent meanwhile are
    /// lost: the periodic `inbox_unhosted` scan is the fallback. Ends when the store closes or the
    /// receiver is dropped.
    pub fn inbox_listen(&self) -> mpsc::Receiver<SessionId> {
        let (tx, rx) = mpsc::channel(1024);
        tokio::spawn(listen(std::sync::Arc::downgrade(&self.shared), tx));
        rx
    }
}

async fn listen(shared: Weak<Shared>, tx: mpsc::Sender<SessionId>) {
    loop {
        let Some(config) = shared.upgrade().and_then(|s| {
            (!s.closed.load(std::sync::atomic::Ordering::SeqCst)).then(|| s.pg_config.clone())
        }) else {
            return;
        };
        match config.connect(tokio_postgres::NoTls).await {
            Ok((client, mut connection)) => {
                let (ntx, mut nrx) = mpsc::unbounded_channel::<String>();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(AsyncMessage::Notification(n)) => {
                                if ntx.send(n.payload().to_string()).is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                            Err(e) => {
                                debug!(error = %e, "the inbox listener's connection ended");
                                return;
                            }
                        }
                    }
                });
                if let Err(e) = client
                    .batch_execute(&format!("LISTEN {INBOX_CHANNEL}"))
                    .await
                {
                    warn!(error = %pg_error(&e), "LISTEN on the inbox channel failed; retrying");
                } else {
                    while let Some(payload) = nrx.recv().await {
                        match SessionId::new(&payload) {
                            Ok(id) => {
                                if tx.send(id).await.is_err() {
                                    driver.abort();
                                    return;
                                }
                            }
                            Err(e) => {
                                warn!(error = %e, "an inbox notification names an invalid id")
                            }
                        }
                    }
                }
                driver.abort();
                drop(client);
            }
            Err(e) => warn!(error = %pg_error(&e), "the inbox listener cannot connect; retrying"),
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
