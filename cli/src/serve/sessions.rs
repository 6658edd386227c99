//! Session resources of the HTTP API: create, list, get, the model-visible messages, export and
//! import (SPEC §13).
//!
//! Listing reads the store (every session with a durable event) and adds live agents that have not
//! written yet; a live agent's status comes from its handle without waking it. Export reads the
//! durable log as stored; import validates the whole body first and commits all or nothing.

use std::collections::HashSet;
use std::io::Cursor;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use dsh::SessionId;
use dsh::limits::Limits;
use dsh::session::Session;
use dsh::session::store::jsonl::{ImportOptions, export, import_with};
use dsh::session::store::{EncodedEvent, StoreError};
use dsh::turn::Status;
use dsh_actors::AgentHandle;
use serde::{Deserialize, Serialize};

use super::body::{JsonBody, read_bytes};
use super::error::ApiError;
use super::state::{AppState, ReadTarget, parse_session_id};

/// The most sessions one list page holds.
pub const LIST_LIMIT_MAX: usize = 1000;
/// The page size when `limit` is not given.
pub const LIST_LIMIT_DEFAULT: usize = 100;

/// `POST /v1/sessions` body; every field optional.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The session id (minted when absent).
    pub id: Option<String>,
    /// The system prompt (the server's default when absent).
    pub system: Option<String>,
    /// The provider; must be the one the server runs.
    pub provider: Option<String>,
    /// The model id.
    pub model: Option<String>,
    /// Output cap per model request.
    pub max_tokens: Option<u64>,
}

/// `201` answer of a create (and of an import, with `events`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Created {
    /// The session id.
    pub id: String,
    /// Events imported (imports only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<usize>,
}

/// `GET /v1/sessions` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Page size, 1..=1000 (default 100).
    pub limit: Option<usize>,
    /// Start after this session id (the previous page's `next`).
    pub after: Option<String>,
}

/// One row of a session list.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionRow {
    /// The session id.
    pub id: String,
    /// `idle` or `running`.
    pub status: &'static str,
    /// Events in its log.
    pub events: u64,
    /// Unix epoch milliseconds of its last event, if it has one.
    pub last_activity: Option<i64>,
}

/// `GET /v1/sessions` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionList {
    /// This page.
    pub sessions: Vec<SessionRow>,
    /// The `after` of the next page, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Pending input counts of a session.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Pending {
    /// Messages waiting for their own turn.
    pub next_turn: usize,
    /// Messages waiting for the next step boundary.
    pub next_step: usize,
}

/// `GET /v1/sessions/{id}` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionInfo {
    /// The session id.
    pub id: String,
    /// `idle` or `running`.
    pub status: &'static str,
    /// Durable events in its log.
    pub events: u64,
    /// Its pending input.
    pub pending: Pending,
}

/// `POST /v1/sessions/import` query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ImportQuery {
    /// Store the session under this id instead of its header's.
    pub id: Option<String>,
}

/// The public name of a status.
pub fn status_name(status: Status) -> &'static str {
    match status {
        Status::Running => "running",
        _ => "idle",
    }
}

/// `POST /v1/sessions`.
#[utoipa::path(post, path = "/v1/sessions", request_body = CreateSession, responses((status = 201, description = "Created", body = Created), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 409, description = "The id exists", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned or server draining", body = crate::serve::error::ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<CreateSession>,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    state.accepting()?;
    let defaults = &state.inner.defaults;
    if let Some(p) = &body.provider
        && p != &defaults.provider
    {
        return Err(ApiError::bad_request(format!(
            "field `provider`: this server runs provider `{}`, not `{p}`",
            defaults.provider
        )));
    }
    if body.max_tokens == Some(0) {
        return Err(ApiError::bad_request(
            "field `max_tokens`: must be at least 1",
        ));
    }
    let mut spec = defaults.spec();
    if let Some(model) = body.model.filter(|m| !m.trim().is_empty()) {
        spec.config.model = model;
    }
    if body.max_tokens.is_some() {
        spec.config.max_tokens = body.max_tokens;
    }
    if body.system.is_some() {
        spec.config.system = body.system;
    }
    if let Some(id) = &body.id {
        let id =
            SessionId::new(id).map_err(|e| ApiError::bad_request(format!("field `id`: {e}")))?;
        spec = spec.with_id(id);
    }
    let handle = state
        .host()
        .create(spec)
        .await
        .map_err(|e| ApiError::from_host(&e))?;
    let id = handle.id().to_string();
    tracing::info!(session = %id, "session created");
    Ok((StatusCode::CREATED, Json(Created { id, events: None })))
}

/// `GET /v1/sessions`.
#[utoipa::path(get, path = "/v1/sessions", params(ListQuery), responses((status = 200, description = "A page of sessions", body = SessionList), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<SessionList>, ApiError> {
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("query: {}", e.body_text())))?;
    let limit = query.limit.unwrap_or(LIST_LIMIT_DEFAULT);
    if !(1..=LIST_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "field `limit`: {limit} is out of range 1..={LIST_LIMIT_MAX}"
        )));
    }
    let stored = state
        .store()
        .list()
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    let mut rows: Vec<(String, u64, Option<i64>)> = Vec::with_capacity(stored.len());
    let mut seen = HashSet::with_capacity(stored.len());
    for s in stored {
        seen.insert(s.header.id.to_string());
        rows.push((s.header.id.to_string(), s.n_events, s.last_time));
    }
    let mut live: Vec<String> = state
        .host()
        .list()
        .iter()
        .map(ToString::to_string)
        .collect();
    live.sort();
    rows.extend(
        live.into_iter()
            .filter(|id| !seen.contains(id))
            .map(|id| (id, 0, None)),
    );
    let start = match &query.after {
        Some(after) => rows
            .iter()
            .position(|(id, _, _)| id == after)
            .map(|i| i + 1)
            .ok_or_else(|| ApiError::bad_request(format!("field `after`: no session {after}")))?,
        None => 0,
    };
    let page: Vec<_> = rows.iter().skip(start).take(limit).collect();
    let next = (start + page.len() < rows.len())
        .then(|| page.last().map(|(id, _, _)| id.clone()))
        .flatten();
    let mut sessions = Vec::with_capacity(page.len());
    for (id, n_events, last) in page {
        sessions.push(row(&state, id, *n_events, *last).await);
    }
    Ok(Json(SessionList { sessions, next }))
}

/// One list row, with the live status when the agent is live.
async fn row(state: &AppState, id: &str, n_events: u64, last: Option<i64>) -> SessionRow {
    let live = SessionId::new(id).ok().and_then(|id| state.host().get(&id));
    let (status, events) = match live {
        Some(handle) => match handle.status().await {
            Ok(s) => (status_name(s.status), s.durable_seq.max(n_events)),
            Err(_) => ("idle", n_events),
        },
        None => ("idle", n_events),
    };
    SessionRow {
        id: id.to_string(),
        status,
        events,
        last_activity: last,
    }
}

/// `GET /v1/sessions/{id}`.
#[utoipa::path(get, path = "/v1/sessions/{id}", params(("id" = String, Path, description = "The session id")), responses((status = 200, description = "The session", body = SessionInfo), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    match state.read_target(&id).await? {
        ReadTarget::Live(handle) => info(&handle).await.map(Json),
        ReadTarget::Elsewhere(stored) => Ok(Json(stored_info(&stored))),
    }
}

/// The `GET /v1/sessions/{id}` answer of a session another node hosts, from its durable log: it
/// is `running` while its last turn is open; its host's pending input is not known here (0).
fn stored_info(stored: &dsh::session::store::Inspection) -> SessionInfo {
    let last_start = stored.events.iter().rposition(|e| e.kind() == "turn/start");
    let last_end = stored.events.iter().rposition(|e| e.kind() == "turn/end");
    let running = match (last_start, last_end) {
        (Some(start), Some(end)) => start > end,
        (Some(_), None) => true,
        _ => false,
    };
    SessionInfo {
        id: stored.header.id.to_string(),
        status: if running { "running" } else { "idle" },
        events: stored.events.last().map_or(0, |e| e.seq + 1),
        pending: Pending {
            next_turn: 0,
            next_step: 0,
        },
    }
}

/// The `GET /v1/sessions/{id}` answer of a live agent.
async fn info(handle: &AgentHandle) -> Result<SessionInfo, ApiError> {
    let s = handle
        .status()
        .await
        .map_err(|e| ApiError::from_input(&e, "id"))?;
    Ok(SessionInfo {
        id: handle.id().to_string(),
        status: status_name(s.status),
        events: s.durable_seq,
        pending: Pending {
            next_turn: s.n_pending_turn,
            next_step: s.n_pending_step,
        },
    })
}

/// `GET /v1/sessions/{id}/messages`: the model-visible history derived from the log.
#[utoipa::path(get, path = "/v1/sessions/{id}/messages", params(("id" = String, Path, description = "The session id")), responses((status = 200, description = "`{messages: [...]}`: the model-visible messages", body = Object), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody)))]
pub async fn messages(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (sid, log) = match state.read_target(&id).await? {
        ReadTarget::Live(handle) => {
            let log = handle
                .log()
                .await
                .map_err(|e| ApiError::from_input(&e, "id"))?;
            (handle.id().clone(), log)
        }
        ReadTarget::Elsewhere(stored) => (stored.header.id.clone(), stored.events),
    };
    let session = Session::from_events(sid, log).map_err(|(seq, e)| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "corrupt",
            format!("the log is invalid at seq {seq}: {e}"),
        )
    })?;
    let messages = session.derive_messages();
    Ok(Json(serde_json::json!({ "messages": messages })).into_response())
}

/// `GET /v1/sessions/{id}/export`: the durable log as DSH v0 JSON lines.
#[utoipa::path(get, path = "/v1/sessions/{id}/export", params(("id" = String, Path, description = "The session id")), responses((status = 200, description = "DSH v0 JSON lines", content_type = "application/x-ndjson", body = String), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody)))]
pub async fn export_session(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = parse_session_id(&id)?;
    let inspected = state
        .store()
        .inspect(&id)
        .await
        .map_err(|e| ApiError::from_store(&e))?;
    let mut out = Vec::new();
    export(&inspected.header, &inspected.events, &mut out).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "export_failed",
            e.to_string(),
        )
    })?;
    Ok((
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from(out),
    )
        .into_response())
}

/// `POST /v1/sessions/import[?id=ID]`: a DSH v0 JSON lines body into the store, all or nothing.
#[utoipa::path(post, path = "/v1/sessions/import", params(ImportQuery), request_body(content = String, content_type = "application/x-ndjson", description = "DSH v0 JSON lines"), responses((status = 201, description = "Imported", body = Created), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 409, description = "The id exists", body = crate::serve::error::ErrorBody), (status = 413, description = "Body or message too large", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned or server draining", body = crate::serve::error::ErrorBody)))]
pub async fn import_session(
    State(state): State<AppState>,
    query: Result<Query<ImportQuery>, axum::extract::rejection::QueryRejection>,
    req: Request,
) -> Result<(StatusCode, Json<Created>), ApiError> {
    state.accepting()?;
    let Query(query) =
        query.map_err(|e| ApiError::bad_request(format!("query: {}", e.body_text())))?;
    let session_id = match &query.id {
        Some(s) => {
            Some(SessionId::new(s).map_err(|e| ApiError::bad_request(format!("field `id`: {e}")))?)
        }
        None => None,
    };
    let bytes = read_bytes(req, &()).await?;
    let options = ImportOptions {
        session_id,
        cwd: None,
    };
    let imported = import_with(&mut Cursor::new(&bytes[..]), &Limits::DEFAULT, &options)
        .map_err(|e| ApiError::bad_request(format!("body: {e}")))?;
    if imported.events.is_empty() {
        return Err(ApiError::bad_request("body: the log holds no events"));
    }
    let id = imported.header.id.clone();
    let store = state.store();
    let conflict = |e: StoreError| ApiError::from_store(&e);
    if store.header(&id).await.map_err(conflict)?.is_some() || state.host().get(&id).is_some() {
        return Err(ApiError::from_store(&StoreError::AlreadyExists { id }));
    }
    store.create(&imported.header).await.map_err(conflict)?;
    let encoded: Vec<EncodedEvent> = EncodedEvent::encode_all(&imported.events);
    let n = encoded.len();
    store.append(&id, encoded).await.map_err(conflict)?;
    tracing::info!(session = %id, events = n, "session imported");
    Ok((
        StatusCode::CREATED,
        Json(Created {
            id: id.to_string(),
            events: Some(n),
        }),
    ))
}

/// `202` answer of a compact request: the compaction started (its `compaction/start` is durable).
/// Its outcome is the matching `compaction/end` in the event stream (with `error` when it failed,
/// the history then unchanged), written before the session is idle again.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CompactAck {
    /// The compaction's id (`compactionId` of its events).
    pub compaction_id: String,
    /// Seq of its durable `compaction/start`.
    pub seq: u64,
}

/// `POST /v1/sessions/{id}/compact`: a manual compaction (SPEC §15), only between turns; 202 once
/// it started.
#[utoipa::path(post, path = "/v1/sessions/{id}/compact", params(("id" = String, Path, description = "The session id")), responses((status = 202, description = "The compaction started", body = CompactAck), (status = 400, description = "Bad parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody), (status = 409, description = "busy (a turn or another compaction runs) or nothing_to_compact", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned or server draining", body = crate::serve::error::ErrorBody)))]
pub async fn compact(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<CompactAck>), ApiError> {
    state.accepting()?;
    let handle = state.agent(&id).await?;
    let receipt = handle
        .compact()
        .await
        .map_err(|e| ApiError::from_input(&e, "id"))?;
    tracing::debug!(session = %handle.id(), compaction = %receipt.compaction_id, "compaction started");
    Ok((
        StatusCode::ACCEPTED,
        Json(CompactAck {
            compaction_id: receipt.compaction_id,
            seq: receipt.seq,
        }),
    ))
}
