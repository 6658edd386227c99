//! Several nodes on one PostgreSQL database (SPEC §14): input for a session another node hosts,
//! and the node's inbox worker that applies such input and takes sessions over.
//!
//! Input (followup, steer, inject, cancel) for a session whose live lease another node holds is
//! made durable in the database's inbox (`PostgresStore::inbox_put`); that commit is its
//! acknowledgement. A message then waits for its host to apply it, so that the answer is the same
//! as for a local session — 202 `{message_id, seq}` with the seq of the splice — and a repeated
//! message id meets its row and gets 200 with the first answer. Should no host apply it within
//! `wait_max` (two lease periods and five seconds: time for a takeover), the answer is still 202,
//! with `pending: true` and `seq` 0, since the input is durable and will be applied. A cancel is
//! answered 202 as soon as it is durable.
//!
//! The inbox worker of each node hears `dsh_inbox` notifications and applies the pending rows of
//! the sessions it hosts, in order, each once: a message whose id the log already shows spliced
//! (a host that crashed between its append and marking the row) is only marked. Every
//! `scan_every` it also asks the database for sessions with pending rows whose lease is free,
//! expired or its own, and takes them: resuming one takes its lease with a higher epoch and
//! repairs its log (`PostgresStore::load`), so a dead node's sessions with pending input are
//! hosted again about one lease period after it stopped renewing. Once a minute it deletes inbox
//! rows settled more than an hour ago.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::http::StatusCode;
use dashmap::DashMap;
use dsh::llm::types::Message;
use dsh::session::event::CancelCause;
use dsh::session::store::postgres::{InboxKind, InboxOutcome, PostgresStore};
use dsh::{MessageId, SessionId};
use dsh_actors::AgentHandle;
use tokio::task::JoinHandle;

use super::error::ApiError;
use super::input::{InputAck, InputKind, send_input};
use super::state::AppState;

/// Sessions whose pending inbox rows the worker asks for at most per scan.
const SCAN_SESSIONS_MAX: u32 = 256;

/// How long settled inbox rows are kept as the record a repeated message id is answered from.
const INBOX_KEEP: Duration = Duration::from_secs(3600);

/// How often a node deletes the settled rows older than `INBOX_KEEP`.
const INBOX_GC_EVERY: Duration = Duration::from_secs(60);

fn inbox_kind(kind: InputKind) -> InboxKind {
    match kind {
        InputKind::Followup => InboxKind::Followup,
        InputKind::Steer => InboxKind::Steer,
        InputKind::Inject => InboxKind::Inject,
    }
}

/// How long a request waits for the host to apply its input.
fn wait_max(pg: &PostgresStore) -> Duration {
    pg.lease_ttl() * 2 + Duration::from_secs(5)
}

/// The refusal a host recorded, as the answer the waiting request gives.
fn refusal(why: &str) -> ApiError {
    // Recorded as "STATUS CODE: message" by `apply`.
    let mut parts = why.splitn(2, ' ');
    let status = parts
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok());
    let rest = parts.next().unwrap_or(why);
    match (status, rest.split_once(": ")) {
        (Some(status), Some((code, message))) => {
            let code: &'static str = match code {
                "bad_request" => "bad_request",
                "too_large" => "too_large",
                "duplicate_id" => "duplicate_id",
                "not_found" => "not_found",
                _ => "refused",
            };
            ApiError::new(status, code, message.to_string())
        }
        _ => ApiError::new(StatusCode::CONFLICT, "refused", why.to_string()),
    }
}

/// Waits until row `n` of `id`'s inbox is settled or `wait_max` passed.
async fn settled(
    pg: &PostgresStore,
    id: &SessionId,
    n: u64,
    mut outcome: InboxOutcome,
) -> Result<InboxOutcome, ApiError> {
    let deadline = Instant::now() + wait_max(pg);
    let mut pause = Duration::from_millis(2);
    while outcome == InboxOutcome::Pending && Instant::now() < deadline {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
        outcome = pg
            .inbox_outcome(id, n)
            .await
            .map_err(|e| ApiError::from_store(&e))?;
    }
    Ok(outcome)
}

/// Input for a session another node hosts: durable in the inbox, then answered like a local input
/// once the host applied it. See the module docs.
///
/// # Errors
/// As a local input: 404, 503 `store_unavailable`, or the host's refusal of the message.
pub async fn send_remote(
    state: &AppState,
    pg: &PostgresStore,
    id: &SessionId,
    kind: InputKind,
    message: Message,
) -> Result<(StatusCode, Json<InputAck>), ApiError> {
    let started = Instant::now();
    let body = serde_json::to_string(&message).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "encode_error",
            e.to_string(),
        )
    })?;
    let put = pg
        .inbox_put(id, message.id.as_str(), inbox_kind(kind), &body)
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    state
        .inner
        .metrics
        .input(kind.name(), Some(started.elapsed()));
    tracing::debug!(session = %id, n = put.n, fresh = put.fresh, "input queued for the host");
    let status = if put.fresh {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    match settled(pg, id, put.n, put.outcome).await? {
        InboxOutcome::Applied { seq } => Ok((
            status,
            Json(InputAck {
                message_id: message.id.to_string(),
                seq: seq.unwrap_or(0),
                pending: None,
            }),
        )),
        InboxOutcome::Refused(why) => Err(refusal(&why)),
        InboxOutcome::Pending => Ok((
            status,
            Json(InputAck {
                message_id: message.id.to_string(),
                seq: 0,
                pending: Some(true),
            }),
        )),
    }
}

/// A cancel for a session another node hosts: 202 once durable in the inbox.
///
/// # Errors
/// 404, or 503 `store_unavailable`.
pub async fn cancel_remote(
    state: &AppState,
    pg: &PostgresStore,
    id: &SessionId,
    keep_inbox: bool,
) -> Result<(), ApiError> {
    let input_id = format!("cancel-{}", MessageId::mint());
    let body = serde_json::json!({ "keep_inbox": keep_inbox }).to_string();
    pg.inbox_put(id, &input_id, InboxKind::Cancel, &body)
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    state.inner.metrics.input("cancel", None);
    Ok(())
}

/// Sessions the worker is applying now; `true` asks for one more pass (a notification arrived
/// during the pass).
type Applying = DashMap<SessionId, Arc<AtomicBool>>;

/// Starts the inbox worker of a node on a PostgreSQL store; `None` on another store. It ends when
/// the server's streams end (the host stopped).
pub fn start(state: &AppState) -> Option<JoinHandle<()>> {
    let pg = state.cluster()?.clone();
    let state = state.clone();
    Some(tokio::spawn(async move {
        let mut notes = pg.inbox_listen();
        let scan_every =
            (pg.lease_ttl() / 4).clamp(Duration::from_millis(100), Duration::from_secs(1));
        let mut tick = tokio::time::interval(scan_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let applying: Arc<Applying> = Arc::new(DashMap::new());
        let mut last_gc = Instant::now();
        loop {
            tokio::select! {
                () = state.inner.streams_end.cancelled() => return,
                note = notes.recv() => {
                    let Some(id) = note else { return };
                    // Only the host applies; a session nobody hosts is found by the scan.
                    if pg.held_epoch(&id).is_some() {
                        spawn_apply(&state, &pg, &applying, id);
                    }
                }
                _ = tick.tick() => {
                    if state.is_draining() {
                        continue;
                    }
                    if last_gc.elapsed() >= INBOX_GC_EVERY {
                        last_gc = Instant::now();
                        match pg.inbox_gc(INBOX_KEEP).await {
                            Ok(n) if n > 0 => tracing::debug!(n, "settled inbox rows deleted"),
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "deleting settled inbox rows failed"),
                        }
                    }
                    match pg.inbox_unhosted(SCAN_SESSIONS_MAX).await {
                        Ok(ids) => {
                            for id in ids {
                                spawn_apply(&state, &pg, &applying, id);
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "scanning the inbox failed"),
                    }
                }
            }
        }
    }))
}

/// Applies `id`'s pending rows on a task of its own, unless a pass is running (which is then asked
/// to look again).
fn spawn_apply(state: &AppState, pg: &Arc<PostgresStore>, applying: &Arc<Applying>, id: SessionId) {
    let again = Arc::new(AtomicBool::new(true));
    match applying.entry(id.clone()) {
        dashmap::mapref::entry::Entry::Occupied(o) => {
            o.get().store(true, Ordering::SeqCst);
            return;
        }
        dashmap::mapref::entry::Entry::Vacant(v) => {
            v.insert(Arc::clone(&again));
        }
    }
    let (state, pg, applying) = (state.clone(), Arc::clone(pg), Arc::clone(applying));
    tokio::spawn(async move {
        loop {
            again.store(false, Ordering::SeqCst);
            if let Err(e) = apply(&state, &pg, &id).await {
                tracing::debug!(session = %id, error = %e, "inbox rows left pending for now");
            }
            // Leave only when no notification came during the pass.
            if applying
                .remove_if(&id, |_, a| !a.load(Ordering::SeqCst))
                .is_some()
            {
                return;
            }
        }
    });
}

/// Applies `id`'s pending inbox rows in order, taking the session when it is free. Stops at the
/// first row that cannot be applied now (a full inbox, an agent restarting), leaving it and the
/// rest pending for the next pass.
async fn apply(state: &AppState, pg: &PostgresStore, id: &SessionId) -> Result<(), ApiError> {
    if state.is_draining() {
        return Ok(());
    }
    let handle = match state.agent(id.as_str()).await {
        Ok(handle) => handle,
        // Another node holds a live lease: it applies them.
        Err(e) if e.code == "hosted_elsewhere" => return Ok(()),
        // The session was deleted: its input can never be applied.
        Err(e) if e.status == StatusCode::NOT_FOUND => {
            let why = format!("{} {}: {}", e.status.as_u16(), e.code, e.message);
            for row in pg
                .inbox_pending(id)
                .await
                .map_err(|e| ApiError::from_store(&e))?
            {
                pg.inbox_settle(id, row.n, &InboxOutcome::Refused(why.clone()))
                    .await
                    .map_err(|e| ApiError::from_store(&e))?;
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let _guard = state.lock_input(id).await;
    let pending = pg
        .inbox_pending(id)
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    for row in pending {
        let outcome = match row.kind {
            InboxKind::Cancel => {
                let keep_inbox = serde_json::from_str::<serde_json::Value>(&row.body)
                    .ok()
                    .and_then(|v| v.get("keep_inbox").and_then(serde_json::Value::as_bool))
                    .unwrap_or(false);
                handle
                    .cancel(CancelCause::User, keep_inbox)
                    .await
                    .map_err(|e| ApiError::from_input(&e, "id"))?;
                tracing::debug!(session = %id, n = row.n, "inbox cancel applied");
                InboxOutcome::Applied { seq: None }
            }
            kind => match serde_json::from_str::<Message>(&row.body) {
                Err(e) => InboxOutcome::Refused(format!("400 bad_request: message: {e}")),
                Ok(message) => apply_message(state, &handle, kind, message).await?,
            },
        };
        pg.inbox_settle(id, row.n, &outcome)
            .await
            .map_err(|e| ApiError::from_store(&e))?;
    }
    Ok(())
}

/// Applies one message unless the log shows it spliced already; its outcome, or the error that
/// leaves it pending.
async fn apply_message(
    state: &AppState,
    handle: &AgentHandle,
    kind: InboxKind,
    message: Message,
) -> Result<InboxOutcome, ApiError> {
    let kind = match kind {
        InboxKind::Steer => InputKind::Steer,
        InboxKind::Inject => InputKind::Inject,
        _ => InputKind::Followup,
    };
    let message_id = message.id.clone();
    let applied = &state.inner.applied;
    let first = applied
        .lookup(handle.id(), &message_id, || handle.log())
        .await
        .map_err(|e| ApiError::from_input(&e, "id"))?;
    if let Some(seq) = first {
        return Ok(InboxOutcome::Applied { seq: Some(seq) });
    }
    match send_input(handle, kind, message).await {
        Ok(seq) => {
            applied.applied(handle.id(), &message_id, seq);
            tracing::debug!(session = %handle.id(), seq, "inbox input applied");
            Ok(InboxOutcome::Applied { seq: Some(seq) })
        }
        // Transient: a full inbox, a store or agent that cannot take it now.
        Err(e)
            if e.status == StatusCode::TOO_MANY_REQUESTS
                || e.status == StatusCode::SERVICE_UNAVAILABLE
                || e.status.is_server_error() =>
        {
            Err(e)
        }
        Err(e) => Ok(InboxOutcome::Refused(format!(
            "{} {}: {}",
            e.status.as_u16(),
            e.code,
            e.message
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_refusal_is_answered_with_its_status_and_code() {
        let e = refusal("413 too_large: field `message`: 3 MB, the limit is 1 MB");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.code, "too_large");
        assert_eq!(e.message, "field `message`: 3 MB, the limit is 1 MB");
        let e = refusal("404 not_found: session s1 not found");
        assert_eq!((e.status, e.code), (StatusCode::NOT_FOUND, "not_found"));
        // An unknown code keeps its status under a generic code; a malformed record is a 409.
        let e = refusal("400 weird_code: x");
        assert_eq!((e.status, e.code), (StatusCode::BAD_REQUEST, "refused"));
        let e = refusal("garbage");
        assert_eq!((e.status, e.code), (StatusCode::CONFLICT, "refused"));
        assert_eq!(e.message, "garbage");
    }
}
