//! The route table of `dsh serve` (SPEC §13), its body limits, and the per-request tracing span.
//!
//! `/v1` routes sit behind the bearer-token check; `/healthz`, `/readyz` and `/metrics` do not, so
//! a load balancer or scraper needs no token. Every request runs inside a span with its request id,
//! method, path and, for a session's routes, the session id, so every event its handler (and an
//! event stream's body) logs names the session.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::serve::{ListenerExt, TapIo};
use tracing::Instrument;

use super::error::ApiError;
use super::state::AppState;
use super::{auth, events, input, metrics, openapi, page, sessions};

/// The largest JSON body accepted (a message is at most 1 MiB; this leaves room for its JSON).
pub const BODY_BYTES_MAX: usize = 2 << 20;
/// The largest import body (a session as JSON lines).
pub const IMPORT_BYTES_MAX: usize = 256 << 20;

/// The whole router over `state`.
pub fn router(state: AppState) -> Router {
    // The `/v1` routes are written out whole rather than nested under `/v1`: a nested route
    // rewrites every request's URI to strip the prefix, which no handler here needs.
    let v1 = Router::new()
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/v1/sessions/import",
            post(sessions::import_session).layer(DefaultBodyLimit::max(IMPORT_BYTES_MAX)),
        )
        .route("/v1/sessions/{id}", get(sessions::get))
        .route("/v1/sessions/{id}/followup", post(input::followup))
        .route("/v1/sessions/{id}/steer", post(input::steer))
        .route("/v1/sessions/{id}/inject", post(input::inject))
        .route("/v1/sessions/{id}/cancel", post(input::cancel))
        .route(
            "/v1/sessions/{id}/inbox/{message_id}",
            put(input::replace).delete(input::remove),
        )
        .route("/v1/sessions/{id}/events", get(events::events))
        .route("/v1/sessions/{id}/messages", get(sessions::messages))
        .route("/v1/sessions/{id}/export", get(sessions::export_session))
        .route("/v1/sessions/{id}/compact", post(sessions::compact))
        .route("/v1/openapi.json", get(openapi::openapi_json))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .merge(v1)
        .route("/", get(page::index))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(middleware::from_fn(request_span))
        .with_state(state)
}

/// The connections `listener` accepts, with `TCP_NODELAY` set: an event stream writes a chunk as
/// soon as events are durable, and Nagle's algorithm would hold one back while the previous one is
/// unacknowledged.
pub fn no_delay(
    listener: tokio::net::TcpListener,
) -> TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    fn set(tcp: &mut tokio::net::TcpStream) {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY on a connection");
        }
    }
    listener.tap_io(set as fn(&mut tokio::net::TcpStream))
}

/// Numbers requests for their spans.
static REQUEST_IDS: AtomicU64 = AtomicU64::new(1);

/// The session id a `/v1/sessions/{id}…` path names (`import` is a route, not a session).
pub fn path_session(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let id = rest.split('/').next()?;
    (!id.is_empty() && id != "import").then_some(id)
}

/// Middleware: runs the request inside a span with its id, method, path and session id.
async fn request_span(req: Request, next: Next) -> Response {
    let id = REQUEST_IDS.fetch_add(1, Ordering::Relaxed);
    let path = req.uri().path();
    let span = tracing::info_span!(
        "request",
        id,
        method = %req.method(),
        path = %path,
        session = tracing::field::Empty,
    );
    if let Some(session) = path_session(path) {
        span.record("session", tracing::field::display(session));
    }
    async move {
        let response = next.run(req).await;
        tracing::debug!(status = response.status().as_u16(), "answered");
        response
    }
    .instrument(span)
    .await
}

/// 404 for any path the API does not have.
async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// `GET /healthz`: the process answers.
#[utoipa::path(get, path = "/healthz",  responses((status = 200, description = "Alive", body = String)))]
pub async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

/// `GET /readyz`: 200 while the store takes writes and the server is not draining, else 503.
#[utoipa::path(get, path = "/readyz",  responses((status = 200, description = "Ready", body = String), (status = 503, description = "Store poisoned or server draining", body = crate::serve::error::ErrorBody)))]
pub async fn readyz(State(state): State<AppState>) -> Response {
    if state.is_draining() {
        return ApiError::draining().into_response();
    }
    if let Some(why) = state.store().poisoned() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("the store refuses writes: {why}"),
        )
        .into_response();
    }
    (StatusCode::OK, "ready\n").into_response()
}
