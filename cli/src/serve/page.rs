//! `GET /`: the web page for people (SPEC §13) — every agent with its live status, the selected
//! session's transcript as it streams (text, reasoning, tool calls and results, turn ends), a box
//! that sends a followup (a steer while the agent runs) and a cancel button.
//!
//! One self-contained HTML file (`assets/index.html`, no build step) compiled into the binary. It
//! speaks only the public `/v1` API; it reads event streams with `fetch` rather than `EventSource`
//! so that it can send the bearer token, and resumes with `Last-Event-ID` after a drop.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page, built into the binary.
pub const INDEX_HTML: &str = include_str!("assets/index.html");

/// `GET /`.
#[utoipa::path(get, path = "/", responses(
    (status = 200, description = "The web page", content_type = "text/html", body = String)
))]
pub async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX_HTML,
    )
        .into_response()
}
