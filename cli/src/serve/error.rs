//! `ApiError`: every refusal of the HTTP API, as SPEC §13 shapes it — a status and a body
//! `{"error":{"code":"…","message":"…"}}` — built from the runtime's and the store's typed errors.
//!
//! The mapping is the one place that decides which status a failure gets, so every handler answers
//! the same failure the same way: bad input 400 (the message names the field), unknown session 404,
//! an existing id 409, a body or message over its bound 413, a full inbox 429 with `Retry-After`,
//! and 503 when the store is poisoned or the server drains, or — `hosted_elsewhere`, with
//! `Retry-After` the lease's time left — when another node holds the session's lease (SPEC §14) and
//! the request is one a node cannot hand over (removing or replacing a pending message, `compact`;
//! followups, steers, injects and cancels go through the database's inbox, `cluster.rs`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use dsh::inbox::AdmitError;
use dsh::session::store::StoreError;
use dsh_actors::{HostError, InputError};
use serde::Serialize;

/// Seconds a client is told to wait (`Retry-After`) before sending to a full inbox again.
pub const RETRY_AFTER_SECS: u32 = 1;

/// One refusal: the HTTP status, a stable machine-readable code and a one-line message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status of the answer.
    pub status: StatusCode,
    /// A stable code (`bad_request`, `not_found`, `session_exists`, ...) clients can branch on.
    pub code: &'static str,
    /// What went wrong, for people; names the offending field for bad input.
    pub message: String,
    /// The request's body was left unread (it overflowed its limit), so the connection cannot carry
    /// another request: the answer says `Connection: close` and a client does not reuse it.
    pub close: bool,
    /// Seconds the answer tells the client to wait (`Retry-After`), when it says so.
    pub retry_after: Option<u64>,
}

/// The JSON body of an error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorDetail,
}

/// `{code, message}` inside an error answer.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// The stable code.
    pub code: String,
    /// The one-line message.
    pub message: String,
}

impl ApiError {
    /// An error with this status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            close: false,
            retry_after: None,
        }
    }

    /// 400 `bad_request`: the body or a parameter is malformed; `message` names the field.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    /// 404 `not_found` for an unknown session.
    pub fn session_not_found(id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("session {id} not found"),
        )
    }

    /// 413 `too_large`.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    /// 503 `draining`: the server is shutting down and takes no new input.
    pub fn draining() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "the server is shutting down and takes no new input",
        )
    }

    /// 503 `too_many_streams`: every event-stream slot is taken; retry after `Retry-After`.
    pub fn too_many_streams(max: usize) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_streams",
            format!("{max} event streams are open, the most this server keeps; retry later"),
        )
    }

    /// 503 `hosted_elsewhere`: another node holds the session's lease (SPEC §14), so this node
    /// cannot do this for it now; `Retry-After` is the lease's time left, at least 1 s. Also what
    /// `AppState::agent` returns for such a session, which the input handlers turn into an inbox
    /// row instead (`cluster.rs`).
    pub fn hosted_elsewhere(
        id: &dsh::ids::SessionId,
        reason: &str,
        left: Option<std::time::Duration>,
    ) -> ApiError {
        let secs = left.map_or(1, |l| {
            (l.as_secs() + u64::from(l.subsec_nanos() > 0)).max(1)
        });
        ApiError {
            retry_after: Some(secs),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "hosted_elsewhere",
                format!("session {id} is {reason}; retry after its lease ends"),
            )
        }
    }

    /// The answer for a store failure.
    pub fn from_store(e: &StoreError) -> ApiError {
        match e {
            StoreError::NotFound { id } => ApiError::session_not_found(id.as_str()),
            StoreError::AlreadyExists { id } => ApiError::new(
                StatusCode::CONFLICT,
                "session_exists",
                format!("session {id} already exists"),
            ),
            StoreError::Poisoned { .. } | StoreError::Closed => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                e.to_string(),
            ),
            StoreError::Fenced { id, reason, left } => {
                ApiError::hosted_elsewhere(id, reason, *left)
            }
            StoreError::EventTooLarge { .. } | StoreError::LogTooLong { .. } => {
                ApiError::too_large(e.to_string())
            }
            _ => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store_error",
                e.to_string(),
            ),
        }
    }

    /// The answer for a host failure (creating or resuming an agent).
    pub fn from_host(e: &HostError) -> ApiError {
        match e {
            HostError::AlreadyExists { id } => ApiError::new(
                StatusCode::CONFLICT,
                "session_exists",
                format!("session {id} already exists"),
            ),
            HostError::NotFound { id } => ApiError::session_not_found(id.as_str()),
            HostError::Store(s) => ApiError::from_store(s),
            HostError::ShutDown => ApiError::draining(),
            _ => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "agent_error",
                e.to_string(),
            ),
        }
    }

    /// The answer for a refused input; `field` names the body field that carried the message.
    pub fn from_input(e: &InputError, field: &str) -> ApiError {
        match e {
            InputError::Refused(admit) => ApiError::from_admit(admit, field),
            InputError::NotFound { id } | InputError::Disposed { id } => {
                ApiError::session_not_found(id.as_str())
            }
            InputError::AlreadyExists { id } => ApiError::new(
                StatusCode::CONFLICT,
                "session_exists",
                format!("session {id} already exists"),
            ),
            InputError::Busy { .. } => ApiError::new(StatusCode::CONFLICT, "busy", e.to_string()),
            InputError::NotCompacted { .. } => {
                ApiError::new(StatusCode::CONFLICT, "nothing_to_compact", e.to_string())
            }
            InputError::Failed { .. } | InputError::Store { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                e.to_string(),
            ),
            _ => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "interrupted",
                e.to_string(),
            ),
        }
    }

    /// The answer for a message the inbox refused.
    fn from_admit(e: &AdmitError, field: &str) -> ApiError {
        match e {
            AdmitError::InboxFull { .. } => {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, "inbox_full", e.to_string())
            }
            AdmitError::TooLarge { .. } => ApiError::too_large(format!("field `{field}`: {e}")),
            AdmitError::AlreadyPending { .. } => {
                ApiError::new(StatusCode::CONFLICT, "duplicate_id", e.to_string())
            }
            _ => ApiError::bad_request(format!("field `{field}`: {e}")),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
            },
        };
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        // A full inbox or a full set of streams clears by itself: tell the client when to retry.
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        } else if self.status == StatusCode::TOO_MANY_REQUESTS || self.code == "too_many_streams" {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        response
    }
}
