//! Bearer-token authentication of `/v1` requests, and where the token comes from.
//!
//! The token is read from `--token-file FILE` (its first line, surrounding whitespace trimmed) or the
//! `DSH_TOKEN` environment variable; it is never logged (`Token`'s `Debug` redacts it). A request is
//! let through only with `Authorization: Bearer TOKEN`, compared in constant time so the answer's
//! timing does not reveal how much of a guess was right.

use std::path::Path;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::state::AppState;

/// The environment variable that may hold the token.
pub const TOKEN_ENV: &str = "DSH_TOKEN";

/// The largest token file read.
const TOKEN_FILE_BYTES_MAX: u64 = 64 << 10;

/// A bearer token. Its `Debug` never shows the secret.
#[derive(Clone)]
pub struct Token(Vec<u8>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from its text; `None` when it is empty after trimming.
    pub fn new(text: &str) -> Option<Token> {
        let t = text.trim();
        (!t.is_empty()).then(|| Token(t.as_bytes().to_vec()))
    }

    /// Whether `candidate` is this token, in time independent of where they differ.
    pub fn matches(&self, candidate: &[u8]) -> bool {
        self.0.ct_eq(candidate).into()
    }
}

/// The token from `--token-file` (over `DSH_TOKEN`), if either is set.
///
/// # Errors
/// A one-line reason when the file cannot be read, is too large, or holds no token.
pub fn load_token(file: Option<&Path>) -> Result<Option<Token>, String> {
    if let Some(path) = file {
        let fail = |why: String| format!("--token-file {}: {why}", path.display());
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        if meta.len() > TOKEN_FILE_BYTES_MAX {
            return Err(fail(format!(
                "the file is {} bytes, the limit is {TOKEN_FILE_BYTES_MAX}",
                meta.len()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        let first = text.lines().next().unwrap_or("");
        return Token::new(first)
            .map(Some)
            .ok_or_else(|| fail("the file holds no token".into()));
    }
    match std::env::var(TOKEN_ENV) {
        Ok(text) => Token::new(&text)
            .map(Some)
            .ok_or_else(|| format!("{TOKEN_ENV} is set but empty")),
        Err(_) => Ok(None),
    }
}

/// Middleware: with a token set, refuses a request without the right bearer token (401).
pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.inner.token else {
        return next.run(req).await;
    };
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
    match presented {
        Some(candidate) if token.matches(candidate) => next.run(req).await,
        _ => {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this server needs `Authorization: Bearer TOKEN`",
            )
            .into_response();
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            response
        }
    }
}
