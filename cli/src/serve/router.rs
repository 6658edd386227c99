//! The route table of `dsh serve` (SPEC §13), its body limits, and the per-request tracing span.
//!
//! `/v1` routes sit behind the bearer-token check; `/healthz`, `/readyz` and `/metrics` do not, so
//! a load balancer or scraper needs no token. Every request runs inside a span with its request id,
//! method, path and, for a session's routes, the session id, so every event its handler (and an
//! event stream's producer task) logs names the session.

use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
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
    let v1 = Router::new()
        .route("/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/sessions/import",
            post(sessions::import_session).layer(DefaultBodyLimit::max(IMPORT_BYTES_MAX)),
        )
        .route("/sessions/{id}", get(sessions::get))
        .route("/sessions/{id}/followup", post(input::followup))
        .route("/sessions/{id}/steer", post(input::steer))
        .route("/sessions/{id}/inject", post(input::inject))
        .route("/sessions/{id}/cancel", post(input::cancel))
        .route(
            "/sessions/{id}/inbox/{message_id}",
            put(input::replace).delete(input::remove),
        )
        .route("/sessions/{id}/events", get(events::events))
        .route("/sessions/{id}/messages", get(sessions::messages))
        .route("/sessions/{id}/export", get(sessions::export_session))
        .route("/sessions/{id}/compact", post(sessions::compact))
        .route("/openapi.json", get(openapi::openapi_json))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ));
    Router::new()
        .nest("/v1", v1)
        .route("/", get(page::index))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .layer(middleware::from_fn(request_span))
        .with_state(state)
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
