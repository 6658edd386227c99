//! Input to one agent over HTTP: followup, steer, inject (202 `{message_id, seq}` once durable),
//! cancel, and removing or replacing a pending message (SPEC §13).
//!
//! Idempotency: a message id that the log already shows spliced into the inbox is not sent again;
//! the answer is 200 with the first answer (`message_id` and the seq of that `agent/inbox/spliced`
//! event). The log is the record, so this holds across server restarts; `AppliedIds` keeps an index
//! of it so that a repeated id costs a map look-up, not a read of the log. The per-session input
//! lock makes the check and the send one step.
//!
//! Several nodes (SPEC §14): a followup, steer, inject or cancel for a session whose lease another
//! node holds goes to the database's inbox and is applied by that node (`cluster.rs`); the answer
//! is the same.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use dsh::MessageId;
use dsh::llm::types::Message;
use dsh::session::event::CancelCause;
use dsh_actors::AgentHandle;
use serde::{Deserialize, Serialize};

use super::body::JsonBody;
use super::error::ApiError;
use super::state::AppState;

/// Which inbox operation an input request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputKind {
    /// Its own turn, FIFO; wakes the agent.
    Followup,
    /// The nearest step boundary; wakes the agent.
    Steer,
    /// The next boundary of whatever turn runs next; does not wake.
    Inject,
}

impl InputKind {
    /// The kind's name, as in the path.
    pub fn name(self) -> &'static str {
        match self {
            InputKind::Followup => "followup",
            InputKind::Steer => "steer",
            InputKind::Inject => "inject",
        }
    }
}

/// Body of followup/steer/inject and of replacing a pending message: `{text}` or `{message}`, with
/// an optional message `id`.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputBody {
    /// The message id (minted when absent); a repeat of an applied id is not applied again.
    pub id: Option<String>,
    /// Plain text: a user message with one text block.
    pub text: Option<String>,
    /// A whole user message (DSH v0 shape); its `id` is replaced by `id` when that is given. Its
    /// own keys are checked strictly (an unknown one is a 400 naming it); its content blocks are
    /// DSH v0 blocks, where a block type dsh does not know is kept as is.
    #[schema(value_type = Option<Object>)]
    #[serde(default, deserialize_with = "strict_message")]
    pub message: Option<Message>,
}

/// The keys of a DSH v0 message.
const MESSAGE_KEYS: [&str; 4] = ["id", "role", "content", "source"];

/// Reads `message` refusing keys a message does not have. The log reader is lenient (it keeps what
/// logs the original wrote carry); input sent to the server is not a log, and a key dsh would drop
/// (a typo, a field of another API) is better refused than silently lost.
fn strict_message<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Message>, D::Error> {
    use serde::de::Error as _;
    let Some(value) = Option::<serde_json::Map<String, serde_json::Value>>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(key) = value.keys().find(|k| !MESSAGE_KEYS.contains(&k.as_str())) {
        return Err(D::Error::unknown_field(key, &MESSAGE_KEYS));
    }
    Message::deserialize(serde_json::Value::Object(value))
        .map(Some)
        .map_err(D::Error::custom)
}

/// `202`/`200` answer of an input.
#[derive(Debug, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct InputAck {
    /// The message's id.
    pub message_id: String,
    /// Seq of the durable `agent/inbox/spliced` event that queued it.
    pub seq: u64,
    /// Only for input to a session another node hosts (SPEC §14): `true` when the input is
    /// durable in the database's inbox but its host has not applied it yet within the wait, so
    /// `seq` (0) is not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<bool>,
}

/// `POST /v1/sessions/{id}/cancel` body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    /// Keep the pending input (default false: it is durably discarded).
    pub keep_inbox: Option<bool>,
}

/// `202` answer of a cancel.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CancelAck {
    /// Always true: the cancel is recorded.
    pub cancelled: bool,
}

/// `200` answer of removing or replacing a pending message.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct InboxAck {
    /// The id of the message that was pending.
    pub message_id: String,
    /// The replacement's id (replace only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced_by: Option<String>,
}

impl InputBody {
    /// The message this body describes, or a 400 naming the field.
    fn into_message(self) -> Result<Message, ApiError> {
        let id = match &self.id {
            Some(s) => Some(
                MessageId::new(s).map_err(|e| ApiError::bad_request(format!("field `id`: {e}")))?,
            ),
            None => None,
        };
        match (self.text, self.message) {
            (Some(text), None) => Ok(Message::user_text(id.unwrap_or_else(MessageId::mint), text)),
            (None, Some(mut message)) => {
                if let Some(id) = id {
                    message.id = id;
                }
                Ok(message)
            }
            (Some(_), Some(_)) => Err(ApiError::bad_request(
                "field `text`: give either `text` or `message`, not both",
            )),
            (None, None) => Err(ApiError::bad_request(
                "field `text`: missing (give `text` or `message`)",
            )),
        }
    }
}

/// `POST /v1/sessions/{id}/followup`.
#[utoipa::path(post, path = "/v1/sessions/{id}/followup", params(("id" = String, Path, description = "The session id")), request_body = InputBody, responses((status = 202, description = "Durable", body = InputAck), (status = 200, description = "This message id was applied before: the first answer", body = InputAck), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody), (status = 413, description = "Body or message too large", body = crate::serve::error::ErrorBody), (status = 429, description = "Inbox full; see Retry-After", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned or server draining (input for a session another node hosts is made durable in the database and answered as here, SPEC §14)", body = crate::serve::error::ErrorBody)))]
pub async fn followup(
    state: State<AppState>,
    path: Path<String>,
    body: JsonBody<InputBody>,
) -> Result<(StatusCode, Json<InputAck>), ApiError> {
    send(state, path, body, InputKind::Followup).await
}

/// `POST /v1/sessions/{id}/steer`.
#[utoipa::path(post, path = "/v1/sessions/{id}/steer", params(("id" = String, Path, description = "The session id")), request_body = InputBody, responses((status = 202, description = "Durable", body = InputAck), (status = 200, description = "This message id was applied before: the first answer", body = InputAck), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody), (status = 413, description = "Body or message too large", body = crate::serve::error::ErrorBody), (status = 429, description = "Inbox full; see Retry-After", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned or server draining (input for a session another node hosts is made durable in the database and answered as here, SPEC §14)", body = crate::serve::error::ErrorBody)))]
pub async fn steer(
    state: State<AppState>,
    path: Path<String>,
    body: JsonBody<InputBody>,
) -> Result<(StatusCode, Json<InputAck>), ApiError> {
    send(state, path, body, InputKind::Steer).await
}

/// `POST /v1/sessions/{id}/inject`.
#[utoipa::path(post, path = "/v1/sessions/{id}/inject", params(("id" = String, Path, description = "The session id")), request_body = InputBody, responses((status = 202, description = "Durable", body = InputAck), (status = 200, description = "This message id was applied before: the first answer", body = InputAck), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody), (status = 413, description = "Body or message too large", body = crate::serve::error::ErrorBody), (status = 429, description = "Inbox full; see Retry-After", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned or server draining (input for a session another node hosts is made durable in the database and answered as here, SPEC §14)", body = crate::serve::error::ErrorBody)))]
pub async fn inject(
    state: State<AppState>,
    path: Path<String>,
    body: JsonBody<InputBody>,
) -> Result<(StatusCode, Json<InputAck>), ApiError> {
    send(state, path, body, InputKind::Inject).await
}

/// Sends one input: 202 once durable, or 200 with the first answer for an id already applied.
async fn send(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<InputBody>,
    kind: InputKind,
) -> Result<(StatusCode, Json<InputAck>), ApiError> {
    state.accepting()?;
    let started = std::time::Instant::now();
    // Only an id the client chose can repeat; a minted one needs no look-up.
    let client_id = body.id.is_some() || body.message.is_some();
    let message = body.into_message()?;
    let handle = match state.agent(&id).await {
        Ok(handle) => handle,
        // Another node hosts it (SPEC §14): durable in the database's inbox, applied there.
        Err(e) if e.code == "hosted_elsewhere" && state.cluster().is_some() => {
            let sid = super::state::parse_session_id(&id)?;
            if let Some(pg) = state.cluster() {
                return super::cluster::send_remote(&state, pg, &sid, kind, message).await;
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let _guard = state.lock_input(handle.id()).await;
    let message_id = message.id.clone();
    let applied = &state.inner.applied;
    if client_id {
        let first = applied
            .lookup(handle.id(), &message_id, || handle.log())
            .await
            .map_err(|e| ApiError::from_input(&e, "id"))?;
        if let Some(seq) = first {
            return Ok((StatusCode::OK, Json(ack(&message_id, seq))));
        }
    }
    let seq = send_input(&handle, kind, message).await?;
    applied.applied(handle.id(), &message_id, seq);
    state
        .inner
        .metrics
        .input(kind.name(), Some(started.elapsed()));
    tracing::debug!(kind = kind.name(), seq, "input acknowledged");
    Ok((StatusCode::ACCEPTED, Json(ack(&message_id, seq))))
}

/// Sends `message` as `kind`; returns the seq of the durable splice that queued it.
pub(crate) async fn send_input(
    handle: &AgentHandle,
    kind: InputKind,
    message: Message,
) -> Result<u64, ApiError> {
    let sent = match kind {
        InputKind::Followup => handle.followup_receipt(message).await,
        InputKind::Steer => handle.steer_receipt(message).await,
        InputKind::Inject => handle.inject_receipt(message).await,
    };
    sent.map(|receipt| receipt.seq)
        .map_err(|e| ApiError::from_input(&e, "message"))
}

fn ack(id: &MessageId, seq: u64) -> InputAck {
    InputAck {
        message_id: id.to_string(),
        seq,
        pending: None,
    }
}

/// `POST /v1/sessions/{id}/cancel`: 202 once the cancel is recorded.
#[utoipa::path(post, path = "/v1/sessions/{id}/cancel", params(("id" = String, Path, description = "The session id")), request_body = CancelBody, responses((status = 202, description = "Recorded", body = CancelAck), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned or server draining (input for a session another node hosts is made durable in the database and answered as here, SPEC §14)", body = crate::serve::error::ErrorBody)))]
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<CancelBody>,
) -> Result<(StatusCode, Json<CancelAck>), ApiError> {
    let handle = match state.agent(&id).await {
        Ok(handle) => handle,
        // Another node hosts it (SPEC §14): recorded once durable in the database's inbox.
        Err(e) if e.code == "hosted_elsewhere" && state.cluster().is_some() => {
            let sid = super::state::parse_session_id(&id)?;
            if let Some(pg) = state.cluster() {
                super::cluster::cancel_remote(&state, pg, &sid, body.keep_inbox.unwrap_or(false))
                    .await?;
                tracing::debug!(session = %sid, "cancel queued for the host");
                return Ok((StatusCode::ACCEPTED, Json(CancelAck { cancelled: true })));
            }
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    handle
        .cancel(CancelCause::User, body.keep_inbox.unwrap_or(false))
        .await
        .map_err(|e| ApiError::from_input(&e, "id"))?;
    state.inner.metrics.input("cancel", None);
    tracing::debug!(session = %handle.id(), "cancel recorded");
    Ok((StatusCode::ACCEPTED, Json(CancelAck { cancelled: true })))
}

/// The pending message id of an inbox path.
fn pending_id(s: &str) -> Result<MessageId, ApiError> {
    MessageId::new(s).map_err(|e| ApiError::bad_request(format!("message id: {e}")))
}

/// 404 `not_pending`.
fn not_pending(id: &MessageId) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_pending",
        format!("message {id} is not pending"),
    )
}

/// `DELETE /v1/sessions/{id}/inbox/{message_id}`.
#[utoipa::path(delete, path = "/v1/sessions/{id}/inbox/{message_id}", params(("id" = String, Path, description = "The session id"), ("message_id" = String, Path, description = "The pending message id")), responses((status = 200, description = "Removed", body = InboxAck), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session, or the message is not pending", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned, server draining, or the session hosted by another node (`hosted_elsewhere`; see Retry-After)", body = crate::serve::error::ErrorBody)))]
pub async fn remove(
    State(state): State<AppState>,
    Path((id, message_id)): Path<(String, String)>,
) -> Result<Json<InboxAck>, ApiError> {
    state.accepting()?;
    let message_id = pending_id(&message_id)?;
    let handle = state.agent(&id).await?;
    let removed = handle
        .remove(message_id.clone())
        .await
        .map_err(|e| ApiError::from_input(&e, "message_id"))?;
    if !removed {
        return Err(not_pending(&message_id));
    }
    state.inner.metrics.input("remove", None);
    Ok(Json(InboxAck {
        message_id: message_id.to_string(),
        replaced_by: None,
    }))
}

/// `PUT /v1/sessions/{id}/inbox/{message_id}` `{text}` or `{message}`.
#[utoipa::path(put, path = "/v1/sessions/{id}/inbox/{message_id}", params(("id" = String, Path, description = "The session id"), ("message_id" = String, Path, description = "The pending message id")), request_body = InputBody, responses((status = 200, description = "Replaced", body = InboxAck), (status = 400, description = "Bad body or parameter; the message names the field", body = crate::serve::error::ErrorBody), (status = 401, description = "Missing or wrong bearer token", body = crate::serve::error::ErrorBody), (status = 404, description = "No such session, or the message is not pending", body = crate::serve::error::ErrorBody), (status = 413, description = "Body or message too large", body = crate::serve::error::ErrorBody), (status = 503, description = "Store poisoned, server draining, or the session hosted by another node (`hosted_elsewhere`; see Retry-After)", body = crate::serve::error::ErrorBody)))]
pub async fn replace(
    State(state): State<AppState>,
    Path((id, message_id)): Path<(String, String)>,
    JsonBody(body): JsonBody<InputBody>,
) -> Result<Json<InboxAck>, ApiError> {
    state.accepting()?;
    let message_id = pending_id(&message_id)?;
    let message = body.into_message()?;
    let new_id = message.id.to_string();
    let handle = state.agent(&id).await?;
    let _guard = state.lock_input(handle.id()).await;
    let replaced = handle
        .replace(message_id.clone(), message)
        .await
        .map_err(|e| ApiError::from_input(&e, "message"))?;
    // The replacement's splice seq is not known here: the session's applied-id index is rebuilt
    // from the log when next needed.
    state.inner.applied.forget(handle.id());
    if !replaced {
        return Err(not_pending(&message_id));
    }
    state.inner.metrics.input("replace", None);
    Ok(Json(InboxAck {
        message_id: message_id.to_string(),
        replaced_by: Some(new_id),
    }))
}
