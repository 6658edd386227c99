//! Why a model request failed: `LlmFailure`, serialisable into the log, and the failure `codes`
//! (`reference/session-llm.md` §6.6) that the request-error policy decides on.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Serialisable facts about a failed model request.
///
/// Invariant (checked by `validate`): non-empty `message` and `code`, `status` in 100..=599,
/// `provider_retry_after_ms` > 0, `request_id` non-empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LlmFailure {
    /// What happened, for people (never an API key or a URL's password).
    pub message: String,
    /// One of `codes`, or a provider's own; what the request-error policy decides on.
    pub code: String,
    /// The HTTP status, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// How long the provider asked us to wait (`Retry-After`), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_retry_after_ms: Option<u64>,
    /// The provider's id for the request, for its support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl LlmFailure {
    /// A failure with `code` and `message`; an empty one becomes `UNKNOWN` or `LLM request
    /// failed`, so the invariant holds.
    pub fn new(code: &str, message: impl Into<String>) -> LlmFailure {
        let message = message.into();
        LlmFailure {
            message: if message.is_empty() {
                "LLM request failed".into()
            } else {
                message
            },
            code: if code.is_empty() {
                codes::UNKNOWN.into()
            } else {
                code.into()
            },
            status: None,
            provider_retry_after_ms: None,
            request_id: None,
        }
    }

    /// Checks the invariant.
    ///
    /// # Errors
    /// A sentence naming the first field that breaks it.
    pub fn validate(&self) -> Result<(), String> {
        if self.message.is_empty() {
            return Err("failure message must not be empty".into());
        }
        if self.code.is_empty() {
            return Err("failure code must not be empty".into());
        }
        if let Some(s) = self.status
            && !(100..=599).contains(&s)
        {
            return Err(format!("failure status {s} is not in 100..=599"));
        }
        if self.provider_retry_after_ms == Some(0) {
            return Err("failure providerRetryAfterMs must be positive".into());
        }
        if self.request_id.as_deref() == Some("") {
            return Err("failure requestId must not be empty".into());
        }
        Ok(())
    }
}

impl fmt::Display for LlmFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Failure codes (`reference/session-llm.md` §6.6).
pub mod codes {
    /// Nothing more specific is known.
    pub const UNKNOWN: &str = "UNKNOWN";
    /// No provider is registered under the request's name.
    pub const NO_ADAPTER: &str = "NO_ADAPTER";
    /// The credential was refused (HTTP 401, 403).
    pub const AUTH: &str = "AUTH";
    /// The account is out of quota or balance (terminal, unlike `RATE_LIMIT`).
    pub const QUOTA: &str = "QUOTA";
    /// Too many requests for now (HTTP 429).
    pub const RATE_LIMIT: &str = "RATE_LIMIT";
    /// The request does not fit the model's context window.
    pub const CONTEXT_WINDOW_EXCEEDED: &str = "CONTEXT_WINDOW_EXCEEDED";
    /// The server refused the request as malformed (HTTP 400, 413).
    pub const INVALID_REQUEST: &str = "INVALID_REQUEST";
    /// The server failed (HTTP 5xx).
    pub const SERVER: &str = "SERVER";
    /// The connection failed or broke.
    pub const TRANSPORT: &str = "TRANSPORT";
    /// The server went quiet past a bound.
    pub const TIMEOUT: &str = "TIMEOUT";
    /// The caller cancelled the request.
    pub const ABORTED: &str = "ABORTED";
    /// The stream ended before its end marker.
    pub const STREAM_CLOSED: &str = "STREAM_CLOSED";
    /// The stream broke its format or a bound.
    pub const MALFORMED_RESPONSE: &str = "MALFORMED_RESPONSE";
    /// A reply with no content.
    pub const EMPTY_RESPONSE: &str = "EMPTY_RESPONSE";
    /// No credential is configured for the provider.
    pub const MISSING_CREDENTIAL: &str = "MISSING_CREDENTIAL";
    /// The credential cannot be sent (it does not fit a header).
    pub const INVALID_CREDENTIAL: &str = "INVALID_CREDENTIAL";
    /// The request holds content the provider cannot take (images on a text path).
    pub const UNSUPPORTED_CONTENT: &str = "UNSUPPORTED_CONTENT";
    /// The request's reasoning effort is not one the endpoint accepts.
    pub const UNSUPPORTED_REASONING_EFFORT: &str = "UNSUPPORTED_REASONING_EFFORT";
}
