//! The `openai` provider: any OpenAI-compatible chat-completions endpoint over HTTP with server-sent
//! events, DeepSeek by default (`reference/session-llm.md` §7).
//!
//! One `stream()` call sends exactly one `POST <base path>/chat/completions` and never retries or
//! reconnects: a second request would silently re-send a paid request, so retrying is the
//! request-error policy's decision, made with the failure in hand. Every failure — an HTTP status
//! and its error body, a refused connection, a stall, a malformed or truncated stream — ends the
//! stream in-band with one `finish{error}` carrying the §7.5 code. Cancellation (the token, or
//! dropping the stream) drops the response at once, which closes the connection: every wait for the
//! server races the token, so a consumer polling the stream gets `finish{aborted}` immediately. The
//! stream spawns nothing, so a consumer that cancels and stops polling must drop the stream to
//! release the connection.
//!
//! Time bounds: `connect_timeout_ms` bounds the TCP/TLS connect; `idle_timeout_ms` bounds every wait
//! for the server — the response headers and each body read — but never the consumer's time between
//! chunks, since the body is only read when the consumer asks for the next chunk.
//!
//! Secrets: the API key lives in `ApiKey`, whose `Debug` is redacted and which has no `Display`; a
//! base URL's userinfo is taken out of the URL before it is used or shown (`endpoint.rs`) and sent
//! as HTTP Basic authorization, which then replaces the key. Both headers are marked sensitive, and
//! server text copied into a failure message is scrubbed of the key and the password, so neither
//! reaches a log, an error or the session log. Tracing is at debug level and never includes message
//! content.
//!
//! The parts, one concept each: `config` (what a route is configured with), `endpoint` (the base URL
//! made safe to use and show), `request` (§7.2 body), `stream` (the HTTP exchange), `response`
//! (§7.3–§7.4, SSE payloads to chunks), `errors` (§7.5, refusals to failure codes).

mod config;
mod endpoint;
mod errors;
mod request;
mod response;
mod stream;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::llm::provider::{ChunkStream, ModelInfo, Provider};
use crate::llm::types::LlmRequest;
use config::check_effort;
use endpoint::Endpoint;
use stream::error_chain;

pub use config::{ApiKey, OpenAiConfig, OpenAiError, ReasoningWire, Thinking};
pub use errors::{
    is_context_window_exceeded, is_quota_exceeded, map_http_error, parse_retry_after_ms,
};
pub use request::serialize_request;
pub use response::{ChunkDecoder, FeedOutcome, ResponseError, Translator};

/// DeepSeek's public endpoint, the default `base_url`.
pub const DEFAULT_BASE_URL: &str = "https://api.deepseek.com";
/// The default model id.
pub const DEFAULT_MODEL: &str = "deepseek-v4-flash";
/// The default route name.
pub const DEFAULT_ROUTE: &str = "openai";
/// The largest timeout accepted, in ms (what a JavaScript timer can hold, as the original checks).
pub const TIMEOUT_MS_MAX: u64 = 2_147_483_647;

/// The validated, immutable part of a provider that every stream shares.
struct Inner {
    /// The configuration, as given (its `Debug` redacts the key and the base URL's userinfo).
    config: OpenAiConfig,
    /// The checked base URL: where requests go, how it is shown, and its credentials.
    endpoint: Endpoint,
    /// The HTTP client, shared by every stream (and so its connection pool).
    client: reqwest::Client,
}

/// The OpenAI-compatible provider. Cheap to share; every `stream()` is independent.
#[derive(Clone)]
pub struct OpenAiProvider {
    inner: Arc<Inner>,
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("route", &self.inner.config.route)
            .field("endpoint", &self.inner.endpoint.url().as_str())
            .field("model", &self.inner.config.model)
            .field("api_key", &self.inner.config.api_key)
            .finish()
    }
}

impl OpenAiProvider {
    /// Validates `config` and builds the HTTP client (rustls; no redirects, so a request is never
    /// re-sent elsewhere; no automatic retries of any kind).
    ///
    /// # Errors
    /// An unusable base URL, timeout, route, model or default reasoning effort, or a client that
    /// cannot be built.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiProvider, OpenAiError> {
        if config.route.is_empty() {
            return Err(OpenAiError::Empty { what: "route name" });
        }
        if config.model.is_empty() {
            return Err(OpenAiError::Empty { what: "model" });
        }
        for (what, ms) in [
            ("connect timeout", config.connect_timeout_ms),
            ("idle timeout", config.idle_timeout_ms),
        ] {
            if ms == 0 || ms > TIMEOUT_MS_MAX {
                return Err(OpenAiError::InvalidTimeout {
                    what,
                    ms,
                    ms_max: TIMEOUT_MS_MAX,
                });
            }
        }
        if let Some(effort) = &config.reasoning_effort {
            check_effort(&config, effort)?;
        }
        let endpoint = Endpoint::parse(&config.base_url)?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .redirect(reqwest::redirect::Policy::none())
            // reqwest would re-send on HTTP/2 protocol NACKs; retrying is the request-error policy's call.
            .retry(reqwest::retry::never())
            .tcp_nodelay(true)
            .user_agent(concat!("dsh-rs/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OpenAiError::Client {
                reason: error_chain(&e),
            })?;
        Ok(OpenAiProvider {
            inner: Arc::new(Inner {
                config,
                endpoint,
                client,
            }),
        })
    }

    /// The provider's configuration (its key stays redacted in `Debug`).
    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        &self.inner.config.route
    }

    fn stream(&self, request: LlmRequest, cancel: CancellationToken) -> ChunkStream {
        stream::start(self.inner.clone(), request, cancel)
    }

    fn model_info(&self, model: &str) -> ModelInfo {
        let _ = model;
        ModelInfo {
            context_window: self.inner.config.context_window,
            default_max_tokens: self.inner.config.max_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_validation() {
        let new = |c: OpenAiConfig| OpenAiProvider::new(c).map(|_| ());
        assert_eq!(
            new(OpenAiConfig {
                idle_timeout_ms: 0,
                ..OpenAiConfig::default()
            }),
            Err(OpenAiError::InvalidTimeout {
                what: "idle timeout",
                ms: 0,
                ms_max: TIMEOUT_MS_MAX
            })
        );
        assert!(matches!(
            new(OpenAiConfig {
                base_url: "ftp://x".into(),
                ..OpenAiConfig::default()
            }),
            Err(OpenAiError::InvalidBaseUrl { .. })
        ));
        assert!(matches!(
            new(OpenAiConfig {
                base_url: "not a url".into(),
                ..OpenAiConfig::default()
            }),
            Err(OpenAiError::InvalidBaseUrl { .. })
        ));
        assert_eq!(
            new(OpenAiConfig {
                model: String::new(),
                ..OpenAiConfig::default()
            }),
            Err(OpenAiError::Empty { what: "model" })
        );
        assert!(matches!(
            new(OpenAiConfig {
                thinking: Some(Thinking::Disabled),
                reasoning_effort: Some("high".into()),
                ..OpenAiConfig::default()
            }),
            Err(OpenAiError::UnsupportedReasoningEffort { .. })
        ));
        let p = OpenAiProvider::new(OpenAiConfig {
            base_url: "http://127.0.0.1:9/v1/".into(),
            route: "deepseek".into(),
            ..OpenAiConfig::default()
        })
        .expect("valid");
        assert_eq!(p.name(), "deepseek");
        assert_eq!(
            p.inner.endpoint.url().as_str(),
            "http://127.0.0.1:9/v1/chat/completions"
        );
        let config: OpenAiConfig =
            serde_json::from_value(json!({"model":"x","api_key":"sk-1","idle_timeout_ms":5}))
                .expect("valid");
        assert_eq!(config.idle_timeout_ms, 5);
        assert!(serde_json::from_value::<OpenAiConfig>(json!({"api_key":"sk 1"})).is_err());
        assert!(serde_json::from_value::<OpenAiConfig>(json!({"unknown":1})).is_err());
    }
}
