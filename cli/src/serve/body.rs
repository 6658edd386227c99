//! `JsonBody<T>`: a request body read within its bound and parsed so that every error names the
//! field it is about (`field `message.content[0].text`: invalid type: …`), as SPEC §13 asks of a 400.
//!
//! axum's own `Json` extractor answers with plain text and often without the field; this one reads
//! the bytes (the router's `DefaultBodyLimit` bounds them: past it the answer is 413 `too_large`)
//! and parses with `serde_path_to_error`, whose path names the field. An empty body is `{}`, so a
//! request whose fields are all optional needs none.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body of type `T`, parsed with field-naming errors.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_bytes(req, state).await?;
        parse(&bytes).map(JsonBody)
    }
}

/// Reads the whole body, mapping an overflow of the body limit to 413.
///
/// # Errors
/// 413 `too_large` past the limit, 400 when the body cannot be read.
pub async fn read_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                close: true,
                ..ApiError::too_large(format!("the body is too large: {}", rejection.body_text()))
            }
        } else {
            ApiError::bad_request(format!(
                "the body cannot be read: {}",
                rejection.body_text()
            ))
        }
    })
}

/// Parses a JSON body; an empty body reads as `{}`.
///
/// # Errors
/// 400 `bad_request` naming the field (or `body` when the error is not about one field).
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let whole = matches!(
            inner.classify(),
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof
        );
        if whole || path.is_empty() || path == "." || path == "?" {
            ApiError::bad_request(format!("body: {inner}"))
        } else {
            ApiError::bad_request(format!("field `{path}`: {inner}"))
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("body: {e}")))?;
    Ok(value)
}
