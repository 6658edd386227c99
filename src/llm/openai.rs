//! The `openai` provider: any OpenAI-compatible chat-completions endpoint over HTTP with server-sent
//! events, DeepSeek by default (`reference/session-llm.md` §7).
//!
//! One `stream()` call sends exactly one `POST {base_url}/chat/completions` and never retries or
//! reconnects: a second request would silently re-send a paid request, so retrying is the request-error
//! policy's decision, made with the failure in hand. The body is serialized in §7.2's key order; the
//! response is decoded by `sse::ChunkDecoder`; every failure — an HTTP status and its error body, a
//! refused connection, a stall, a malformed or truncated stream — ends the stream in-band with one
//! `finish{error}` carrying the §7.5 code. Cancellation (the token, or dropping the stream) drops the
//! response at once, which closes the connection: every wait for the server races the token, so a
//! consumer polling the stream gets `finish{aborted}` immediately. The stream spawns nothing, so a
//! consumer that cancels and stops polling must drop the stream to release the connection.
//!
//! Time bounds: `connect_timeout_ms` bounds the TCP/TLS connect; `idle_timeout_ms` bounds every wait
//! for the server — the response headers and each body read — but never the consumer's time between
//! chunks, since the body is only read when the consumer asks for the next chunk.
//!
//! The API key lives in `ApiKey`, whose `Debug` is redacted and which has no `Display`; the header
//! carrying it is marked sensitive, and any server text we copy into a failure message is scrubbed of
//! it, so the key never reaches a log, an error or the session log. Tracing is at debug level and never
//! includes message content.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{self, HeaderMap, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::limits::Limits;
use crate::llm::provider::{ChunkStream, ModelInfo, Provider};
use crate::llm::sse::ChunkDecoder;
use crate::llm::types::{
    ContentBlock, FinishReason, LlmFailure, LlmRequest, Message, Role, StreamChunk, codes,
};

/// DeepSeek's public endpoint, the default `base_url`.
pub const DEFAULT_BASE_URL: &str = "https://api.deepseek.com";
/// The default model id.
pub const DEFAULT_MODEL: &str = "deepseek-v4-flash";
/// The default route name.
pub const DEFAULT_ROUTE: &str = "openai";
/// The largest timeout accepted, in ms (what a JavaScript timer can hold, as the original checks).
pub const TIMEOUT_MS_MAX: u64 = 2_147_483_647;
/// Error bodies are read up to this many bytes; the rest is ignored.
const ERROR_BODY_BYTES_MAX: usize = 64 << 10;
/// Server text copied into a failure message is cut to this many characters.
const SERVER_MESSAGE_CHARS_MAX: usize = 1_000;
/// After `[DONE]`, how long the end of the body is awaited (only by a consumer that polls past the
/// `finish`) before the connection is dropped instead of pooled.
const DRAIN_MS: u64 = 100;
/// Request ids longer than this are ignored rather than logged.
const REQUEST_ID_BYTES_MAX: usize = 256;

/// Why a configuration, key or provider was refused. Nothing was sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenAiError {
    #[error(
        "the API key from {source_name} is blank or has characters an HTTP header cannot carry"
    )]
    InvalidCredential { source_name: String },
    #[error("base url {base_url:?} is not an http or https url: {reason}")]
    InvalidBaseUrl { base_url: String, reason: String },
    #[error("{what} is {ms} ms, it must be in 1..={ms_max}")]
    InvalidTimeout {
        what: &'static str,
        ms: u64,
        ms_max: u64,
    },
    #[error("{what} must not be empty")]
    Empty { what: &'static str },
    #[error("reasoning effort {effort:?} is not supported here (expected one of {supported})")]
    UnsupportedReasoningEffort { effort: String, supported: String },
    #[error("http client could not be built: {reason}")]
    Client { reason: String },
}

/// An API key. Checked once (trimmed, then only printable ASCII without spaces, so it fits a header)
/// and never shown: `Debug` prints `ApiKey(<redacted>)` and there is no `Display`.
///
/// Invariant: non-empty, every byte in `0x21..=0x7E`.
#[derive(Clone)]
pub struct ApiKey(Box<str>);

impl ApiKey {
    /// Validates a key given directly (configuration).
    ///
    /// # Errors
    /// `InvalidCredential` (naming the configuration, never the key) when it is blank or has a
    /// character outside `0x21..=0x7E`.
    pub fn new(raw: &str) -> Result<ApiKey, OpenAiError> {
        ApiKey::from_source(raw, "the provider configuration")
    }

    /// Validates a key read from `source_name` (an environment variable, a file), which the error
    /// names.
    ///
    /// # Errors
    /// As `new`.
    pub fn from_source(raw: &str, source_name: &str) -> Result<ApiKey, OpenAiError> {
        let key = raw.trim();
        if key.is_empty() || !key.bytes().all(|b| (0x21..=0x7E).contains(&b)) {
            return Err(OpenAiError::InvalidCredential {
                source_name: source_name.to_owned(),
            });
        }
        Ok(ApiKey(key.into()))
    }

    /// The secret itself, for the one header that carries it.
    fn expose(&self) -> &str {
        &self.0
    }

    /// Replaces every occurrence of the key in `text` (a server may echo it in an error message).
    fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        if text.contains(self.expose()) {
            Cow::Owned(text.replace(self.expose(), "<redacted>"))
        } else {
            Cow::Borrowed(text)
        }
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

impl<'de> Deserialize<'de> for ApiKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        ApiKey::new(&raw).map_err(serde::de::Error::custom)
    }
}

/// DeepSeek's `thinking` switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Thinking {
    Enabled,
    Disabled,
}

/// How a request's reasoning effort reaches the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReasoningWire {
    /// DeepSeek (§7.2): efforts `off|low|high|max`; `off` → `thinking:{type:"disabled"}`, the others →
    /// `thinking:{type:"enabled"}, reasoning_effort`. Anything else is `UNSUPPORTED_REASONING_EFFORT`.
    #[default]
    Deepseek,
    /// OpenAI: the effort is sent verbatim as `reasoning_effort`; `thinking` is never sent.
    Openai,
    /// Neither field is ever sent (endpoints that reject both).
    Omit,
}

/// Configuration of one `openai` route.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OpenAiConfig {
    /// The route name the provider registers under (`Provider::name`). Default `openai`.
    pub route: String,
    /// The endpoint root; requests go to `{base_url}/chat/completions`. Default DeepSeek's.
    pub base_url: String,
    /// The model used when a request names none. Default `deepseek-v4-flash`.
    pub model: String,
    /// The key. `None` is allowed: each request then ends `MISSING_CREDENTIAL` before any I/O.
    pub api_key: Option<ApiKey>,
    /// Bound on establishing the connection. Default 10 s.
    pub connect_timeout_ms: u64,
    /// Bound on each wait for the server (response headers, each body read). Default 300 s, as the
    /// original's stream watchdog: a reasoning model may think silently for minutes.
    pub idle_timeout_ms: u64,
    /// The output cap sent when a request sets none (`None`: the server's default).
    pub max_tokens: Option<u64>,
    /// The model's context window, reported by `model_info`. Default 1,000,000 (DeepSeek V4).
    pub context_window: Option<u64>,
    /// How reasoning effort is put on the wire.
    pub reasoning_wire: ReasoningWire,
    /// DeepSeek deployment switch: `disabled` refuses any effort but `off`.
    pub thinking: Option<Thinking>,
    /// The effort used when a request sets none.
    pub reasoning_effort: Option<String>,
    /// Bounds on what the server may send.
    pub limits: Limits,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        OpenAiConfig {
            route: DEFAULT_ROUTE.to_owned(),
            base_url: DEFAULT_BASE_URL.to_owned(),
            model: DEFAULT_MODEL.to_owned(),
            api_key: None,
            connect_timeout_ms: 10_000,
            idle_timeout_ms: 300_000,
            max_tokens: None,
            context_window: Some(1_000_000),
            reasoning_wire: ReasoningWire::Deepseek,
            thinking: None,
            reasoning_effort: None,
            limits: Limits::DEFAULT,
        }
    }
}

impl OpenAiConfig {
    /// The default configuration completed from the process environment: the key from
    /// `DEEPSEEK_API_KEY`, else `OPENAI_API_KEY`; the base URL from `DSH_BASE_URL`, else
    /// `DEEPSEEK_BASE_URL`; the model from `DSH_MODEL`. Empty variables count as unset.
    ///
    /// # Errors
    /// `InvalidCredential` naming the variable when the key it holds is unusable.
    pub fn from_env() -> Result<OpenAiConfig, OpenAiError> {
        OpenAiConfig::from_lookup(|name| std::env::var(name).ok())
    }

    /// `from_env` over any variable lookup (tests, layered configuration).
    ///
    /// # Errors
    /// As `from_env`.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<OpenAiConfig, OpenAiError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let mut config = OpenAiConfig::default();
        for name in ["DEEPSEEK_API_KEY", "OPENAI_API_KEY"] {
            if let Some(raw) = get(name) {
                config.api_key = Some(ApiKey::from_source(&raw, name)?);
                break;
            }
        }
        if let Some(url) = get("DSH_BASE_URL").or_else(|| get("DEEPSEEK_BASE_URL")) {
            config.base_url = url.trim().to_owned();
        }
        if let Some(model) = get("DSH_MODEL") {
            config.model = model.trim().to_owned();
        }
        Ok(config)
    }
}

/// The validated, immutable part of a provider that every stream shares.
struct Inner {
    config: OpenAiConfig,
    /// `{base_url}/chat/completions`, parsed.
    endpoint: reqwest::Url,
    /// The base URL as shown in failure messages (no trailing slash).
    base_shown: String,
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
            .field("endpoint", &self.inner.endpoint.as_str())
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
        let base_shown = config.base_url.trim_end_matches('/').to_owned();
        let invalid = |reason: String| OpenAiError::InvalidBaseUrl {
            base_url: config.base_url.clone(),
            reason,
        };
        let endpoint = reqwest::Url::parse(&format!("{base_shown}/chat/completions"))
            .map_err(|e| invalid(e.to_string()))?;
        if !matches!(endpoint.scheme(), "http" | "https") {
            return Err(invalid(format!("scheme {:?}", endpoint.scheme())));
        }
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
                base_shown,
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
        let run = Run {
            inner: self.inner.clone(),
            cancel,
            phase: Phase::Start(Box::new(request)),
            pending: VecDeque::new(),
            decoder: ChunkDecoder::new(&self.inner.config.limits),
            scratch: Vec::new(),
        };
        Box::pin(futures::stream::unfold(run, |mut run| async move {
            let chunk = run.next_chunk().await?;
            Some((chunk, run))
        }))
    }

    fn model_info(&self, model: &str) -> ModelInfo {
        let _ = model;
        ModelInfo {
            context_window: self.inner.config.context_window,
            default_max_tokens: self.inner.config.max_tokens,
        }
    }
}

/// Where one stream is.
enum Phase {
    /// Nothing sent yet.
    Start(Box<LlmRequest>),
    /// Headers received with a 2xx status; the body is being read.
    Body(reqwest::Response),
    /// `[DONE]` arrived and the final chunks are queued; once they are out, the rest of the body is
    /// drained so the connection can be reused.
    Draining(reqwest::Response),
    /// A `finish` was queued (or the stream ended): no more I/O. The response, if any, is dropped,
    /// which closes its connection.
    Ended,
}

/// One stream's state, driven by `next_chunk`.
struct Run {
    inner: Arc<Inner>,
    cancel: CancellationToken,
    phase: Phase,
    /// Chunks decoded but not yet yielded.
    ///
    /// Invariant: once a `finish` is queued, `phase` is `Draining` or `Ended` and nothing is queued
    /// after it, so the stream ends with exactly one `finish`.
    pending: VecDeque<StreamChunk>,
    decoder: ChunkDecoder,
    /// Reused output buffer for the decoder.
    scratch: Vec<StreamChunk>,
}

/// What a wait for the server ended with.
enum Wait<T> {
    Ready(T),
    Cancelled,
    Idle,
}

impl Run {
    async fn next_chunk(&mut self) -> Option<StreamChunk> {
        loop {
            if matches!(self.phase, Phase::Start(_) | Phase::Body(_)) && self.cancel.is_cancelled()
            {
                return Some(self.end(aborted_finish()));
            }
            if let Some(chunk) = self.pending.pop_front() {
                return Some(chunk);
            }
            match std::mem::replace(&mut self.phase, Phase::Ended) {
                Phase::Ended => return None,
                Phase::Draining(response) => {
                    self.drain(response).await;
                    return None;
                }
                Phase::Start(request) => match self.open(&request).await {
                    Ok(response) => self.phase = Phase::Body(response),
                    Err(finish) => return Some(self.end(finish)),
                },
                Phase::Body(mut response) => match self.wait(response.chunk()).await {
                    Wait::Cancelled => return Some(self.end(aborted_finish())),
                    Wait::Idle => return Some(self.end(self.idle_finish("the stream"))),
                    Wait::Ready(Err(e)) => {
                        let failure = LlmFailure::new(
                            codes::TRANSPORT,
                            self.scrub(&format!(
                                "API stream from {} failed: {}",
                                self.inner.base_shown,
                                error_chain(&e)
                            )),
                        );
                        return Some(
                            self.end(StreamChunk::finish(FinishReason::Error { failure })),
                        );
                    }
                    Wait::Ready(Ok(None)) => {
                        let Err(e) = self.decoder.finish() else {
                            // `[DONE]` ends the phase before EOF is ever read.
                            return None;
                        };
                        return Some(self.end(error_finish(e.failure())));
                    }
                    Wait::Ready(Ok(Some(bytes))) => {
                        self.scratch.clear();
                        let result = self.decoder.feed(&bytes, &mut self.scratch);
                        self.pending.extend(self.scratch.drain(..));
                        match result {
                            Ok(outcome) if outcome.done => {
                                tracing::debug!(route = %self.inner.config.route, "openai stream done");
                                // No event is read after `[DONE]`; the body's end only frees the
                                // connection, once the final chunks are out.
                                self.phase = Phase::Draining(response);
                            }
                            Ok(_) => self.phase = Phase::Body(response),
                            Err(e) => {
                                tracing::debug!(route = %self.inner.config.route, error = %e, "openai stream undecodable");
                                self.pending.push_back(error_finish(e.failure()));
                            }
                        }
                    }
                },
            }
        }
    }

    /// Reads what is left of a body after `[DONE]` — normally just the end of the chunked encoding —
    /// so the connection goes back to the pool instead of being closed (no new TLS handshake for the
    /// next request). Bounded by `DRAIN_MS` and `ERROR_BODY_BYTES_MAX`, cancellable; runs only when
    /// the consumer polls past the `finish`, so it never delays a chunk. Dropping the response when
    /// the body has not ended closes the connection, as it must.
    async fn drain(&self, mut response: reqwest::Response) {
        let read_to_end = async {
            let mut n_bytes = 0;
            while let Ok(Some(bytes)) = response.chunk().await {
                n_bytes += bytes.len();
                if n_bytes > ERROR_BODY_BYTES_MAX {
                    break;
                }
            }
        };
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => {}
            _ = tokio::time::timeout(Duration::from_millis(DRAIN_MS), read_to_end) => {}
        }
    }

    /// Queues nothing more: drops pending chunks and the connection, and returns the final chunk.
    fn end(&mut self, finish: StreamChunk) -> StreamChunk {
        self.pending.clear();
        self.phase = Phase::Ended;
        if let StreamChunk::Finish { reason, .. } = &finish
            && let Some(failure) = reason.failure()
        {
            tracing::debug!(route = %self.inner.config.route, code = %failure.code, status = ?failure.status, "openai stream failed");
        }
        finish
    }

    fn scrub(&self, text: &str) -> String {
        match &self.inner.config.api_key {
            Some(key) => key.scrub(text).into_owned(),
            None => text.to_owned(),
        }
    }

    fn idle_finish(&self, what: &str) -> StreamChunk {
        error_finish(LlmFailure::new(
            codes::TIMEOUT,
            format!(
                "idle timeout after {}ms waiting for {what}",
                self.inner.config.idle_timeout_ms
            ),
        ))
    }

    /// Awaits `fut`, bounded by the idle timeout and the cancel token.
    async fn wait<T>(&self, fut: impl Future<Output = T>) -> Wait<T> {
        let idle = Duration::from_millis(self.inner.config.idle_timeout_ms);
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => Wait::Cancelled,
            r = tokio::time::timeout(idle, fut) => match r {
                Ok(v) => Wait::Ready(v),
                Err(_) => Wait::Idle,
            },
        }
    }

    /// Sends the request and returns a 2xx response, or the finish chunk that ends the stream.
    async fn open(&mut self, request: &LlmRequest) -> Result<reqwest::Response, StreamChunk> {
        let config = &self.inner.config;
        let body = serialize_request(config, request).map_err(error_finish)?;
        let Some(key) = &config.api_key else {
            return Err(error_finish(LlmFailure::new(
                codes::MISSING_CREDENTIAL,
                format!(
                    "no API key for provider route {:?}; export DEEPSEEK_API_KEY or OPENAI_API_KEY, \
                     or set api_key in the provider configuration",
                    config.route
                ),
            )));
        };
        let mut auth =
            HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                error_finish(LlmFailure::new(
                    codes::INVALID_CREDENTIAL,
                    "the API key cannot be carried in an HTTP header",
                ))
            })?;
        auth.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, auth);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        tracing::debug!(
            route = %config.route,
            endpoint = %self.inner.endpoint,
            n_messages = request.messages.len(),
            n_tools = request.tools.len(),
            body_bytes = body.len(),
            "openai request"
        );
        let send = self
            .inner
            .client
            .post(self.inner.endpoint.clone())
            .headers(headers)
            .body(body)
            .send();
        let response = match self.wait(send).await {
            Wait::Cancelled => return Err(aborted_finish()),
            Wait::Idle => return Err(self.idle_finish("response headers")),
            Wait::Ready(Err(e)) => {
                let (code, what) = if e.is_timeout() {
                    (codes::TIMEOUT, "timed out")
                } else {
                    (codes::TRANSPORT, "failed")
                };
                let failure = LlmFailure::new(
                    code,
                    self.scrub(&format!(
                        "API request to {} {what}: {}",
                        self.inner.base_shown,
                        error_chain(&e)
                    )),
                );
                return Err(error_finish(failure));
            }
            Wait::Ready(Ok(response)) => response,
        };
        let status = response.status();
        tracing::debug!(route = %config.route, status = status.as_u16(), "openai response headers");
        if status.is_success() {
            if matches!(status.as_u16(), 204 | 205) {
                return Err(error_finish(LlmFailure::new(
                    codes::EMPTY_RESPONSE,
                    "API returned no response body",
                )));
            }
            return Ok(response);
        }
        Err(self.http_failure(response).await)
    }

    /// Reads a bounded error body (each read bounded by the idle timeout) and maps it (§7.5).
    async fn http_failure(&self, mut response: reqwest::Response) -> StreamChunk {
        let status = response.status().as_u16();
        let retry_after_ms = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after_ms(v, SystemTime::now()));
        let request_id = ["x-request-id", "x-deepseek-request-id"]
            .iter()
            .find_map(|name| {
                response
                    .headers()
                    .get(*name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|v| !v.is_empty() && v.len() <= REQUEST_ID_BYTES_MAX)
                    .map(str::to_owned)
            });
        let mut body = Vec::new();
        loop {
            match self.wait(response.chunk()).await {
                Wait::Cancelled => return aborted_finish(),
                // A stalled or broken error body still has a status worth reporting.
                Wait::Idle | Wait::Ready(Err(_)) | Wait::Ready(Ok(None)) => break,
                Wait::Ready(Ok(Some(bytes))) => {
                    let room = ERROR_BODY_BYTES_MAX - body.len();
                    body.extend_from_slice(&bytes[..bytes.len().min(room)]);
                    if body.len() >= ERROR_BODY_BYTES_MAX {
                        break;
                    }
                }
            }
        }
        let mut failure = map_http_error(status, &body);
        failure.message = self.scrub(&failure.message);
        failure.provider_retry_after_ms = retry_after_ms;
        failure.request_id = request_id;
        error_finish(failure)
    }
}

fn error_finish(failure: LlmFailure) -> StreamChunk {
    StreamChunk::finish(FinishReason::Error { failure })
}

fn aborted_finish() -> StreamChunk {
    StreamChunk::finish(FinishReason::Aborted {
        failure: LlmFailure::new(codes::ABORTED, "request aborted by caller"),
    })
}

/// `error: source: source…`, one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

// ---------------------------------------------------------------------------------------------------
// Errors (§7.5)

/// Maps a non-2xx status and its body to a failure (without retry-after and request id).
pub fn map_http_error(status: u16, body: &[u8]) -> LlmFailure {
    let error = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|mut v| v.get_mut("error").map(Value::take));
    let field = |key: &str| -> Option<String> {
        match error.as_ref()?.get(key)? {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    let message = field("message")
        .map(|m| m.chars().take(SERVER_MESSAGE_CHARS_MAX).collect())
        .unwrap_or_else(|| format!("API error (HTTP {status})"));
    let detail = [field("code"), field("type"), field("message")]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    let code = match status {
        401 | 403 => codes::AUTH.to_owned(),
        413 => codes::INVALID_REQUEST.to_owned(),
        _ if is_quota_exceeded(&detail) => codes::QUOTA.to_owned(),
        429 => codes::RATE_LIMIT.to_owned(),
        400 if is_context_window_exceeded(&detail) => codes::CONTEXT_WINDOW_EXCEEDED.to_owned(),
        400 => codes::INVALID_REQUEST.to_owned(),
        s if s >= 500 => codes::SERVER.to_owned(),
        s => format!("HTTP_{s}"),
    };
    let mut failure = LlmFailure::new(&code, message);
    failure.status = (100..=599).contains(&status).then_some(status);
    failure
}

/// Conservative context-overflow wording (§6.6); `detail` is lower-case.
pub fn is_context_window_exceeded(detail: &str) -> bool {
    const PHRASES: [&str; 6] = [
        "context_length_exceeded",
        "context_window_exceeded",
        "maximum context length",
        "too long for this model",
        "context window exceeded",
        "prompt is too long",
    ];
    if PHRASES.iter().any(|p| detail.contains(p)) {
        return true;
    }
    // "exceeds the model context window", "exceeded the context length" — but not "exceeds maximum
    // allowed value".
    detail.find("exceed").is_some_and(|at| {
        let rest = &detail[at..];
        ["context window", "context length", "context size"]
            .iter()
            .any(|p| rest.contains(p))
    })
}

/// Terminal quota wording (§6.6), never plain rate limiting; `detail` is lower-case.
pub fn is_quota_exceeded(detail: &str) -> bool {
    const PHRASES: [&str; 9] = [
        "insufficient_quota",
        "insufficient quota",
        "insufficient balance",
        "insufficient_balance",
        "insufficient credits",
        "insufficient_credits",
        "exceeded your current quota",
        "balance depleted",
        "out of credits",
    ];
    if PHRASES.iter().any(|p| detail.contains(p)) {
        return true;
    }
    ["quota", "usage limit"].iter().any(|subject| {
        ["exceeded", "exhausted", "reached"]
            .iter()
            .any(|verb| detail.contains(&format!("{subject} {verb}")))
    })
}

/// `Retry-After` as ms: all-digit seconds, or an IMF-fixdate HTTP date minus `now`. Zero, past,
/// unparsable and absurd (over `TIMEOUT_MS_MAX`) values give `None`.
pub fn parse_retry_after_ms(value: &str, now: SystemTime) -> Option<u64> {
    let value = value.trim();
    let ms = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        value.parse::<u64>().ok()?.checked_mul(1000)?
    } else {
        let at_secs = parse_http_date(value)?;
        let now_ms = u64::try_from(now.duration_since(UNIX_EPOCH).ok()?.as_millis()).ok()?;
        at_secs.checked_mul(1000)?.checked_sub(now_ms)?
    };
    (ms > 0 && ms <= TIMEOUT_MS_MAX).then_some(ms)
}

/// Parses `Sun, 06 Nov 1994 08:49:37 GMT` (RFC 9110 IMF-fixdate) to Unix seconds.
fn parse_http_date(value: &str) -> Option<u64> {
    let rest = value.split_once(", ")?.1;
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u64 = day.parse().ok()?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? as u64 + 1;
    let year: u64 = year.parse().ok()?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    if !(1..=31).contains(&day) || !(1970..=9999).contains(&year) || *h > 23 || *m > 59 || *s > 60 {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm), for years from 1970.
    let (y, mo) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * mo + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + h * 3600 + m * 60 + s)
}

// ---------------------------------------------------------------------------------------------------
// Request serialization (§7.2)

#[derive(Serialize)]
struct WireRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<WireThinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<WireTool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a serde_json::Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<&'a [String]>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(Serialize)]
struct WireThinking {
    #[serde(rename = "type")]
    kind: Thinking,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum WireMessage<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: Cow<'a, str>,
    },
    Assistant {
        content: Cow<'a, str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reasoning_content: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        tool_calls: Option<Vec<WireToolCall<'a>>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireCallFunction<'a>,
}

#[derive(Serialize)]
struct WireCallFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

const DEEPSEEK_EFFORTS: [&str; 4] = ["off", "low", "high", "max"];

fn check_effort(config: &OpenAiConfig, effort: &str) -> Result<(), OpenAiError> {
    if config.reasoning_wire != ReasoningWire::Deepseek {
        return Ok(());
    }
    let unsupported = |supported: &str| OpenAiError::UnsupportedReasoningEffort {
        effort: effort.chars().take(40).collect(),
        supported: supported.to_owned(),
    };
    if !DEEPSEEK_EFFORTS.contains(&effort) {
        return Err(unsupported("off, low, high, max"));
    }
    if config.thinking == Some(Thinking::Disabled) && effort != "off" {
        return Err(unsupported("off, since thinking is disabled"));
    }
    Ok(())
}

/// Concatenates the text (or reasoning) blocks of `content`, borrowing when there is one.
fn concat<'a>(content: &'a [ContentBlock], reasoning: bool) -> Cow<'a, str> {
    let mut out: Cow<'a, str> = Cow::Borrowed("");
    for block in content {
        let text = match (block, reasoning) {
            (ContentBlock::Text { text }, false) | (ContentBlock::Reasoning { text }, true) => text,
            _ => continue,
        };
        if out.is_empty() {
            out = Cow::Borrowed(text);
        } else {
            out.to_mut().push_str(text);
        }
    }
    out
}

fn has_image(content: &[ContentBlock]) -> bool {
    content.iter().any(|b| match b {
        ContentBlock::Other(_) => b.type_tag() == "image",
        ContentBlock::ToolResult { content, .. } => has_image(content),
        _ => false,
    })
}

fn wire_messages<'a>(message: &'a Message, out: &mut Vec<WireMessage<'a>>) {
    match message.role {
        Role::System => out.push(WireMessage::System {
            content: concat(&message.content, false),
        }),
        Role::Assistant => {
            let calls: Vec<WireToolCall<'a>> = message
                .tool_calls()
                .map(|c| WireToolCall {
                    id: c.id,
                    kind: "function",
                    function: WireCallFunction {
                        name: c.name,
                        arguments: c.arguments,
                    },
                })
                .collect();
            let reasoning = concat(&message.content, true);
            out.push(WireMessage::Assistant {
                content: concat(&message.content, false),
                reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                tool_calls: (!calls.is_empty()).then_some(calls),
            });
        }
        Role::User => {
            let text = concat(&message.content, false);
            let n_results = message
                .content
                .iter()
                .filter(|b| matches!(b, ContentBlock::ToolResult { .. }))
                .count();
            if !text.is_empty() || n_results == 0 {
                out.push(WireMessage::User { content: text });
            }
            for block in &message.content {
                if let ContentBlock::ToolResult {
                    tool_call_id,
                    content,
                    ..
                } = block
                {
                    let text = concat(content, false);
                    out.push(WireMessage::Tool {
                        tool_call_id,
                        content: if text.is_empty() {
                            Cow::Borrowed("(no output)")
                        } else {
                            text
                        },
                    });
                }
            }
        }
    }
}

/// The request body as JSON bytes (§7.2 key order, optional keys omitted).
///
/// # Errors
/// `UNSUPPORTED_CONTENT` for any image (no vision support on this path); `UNSUPPORTED_REASONING_EFFORT`
/// for an effort the endpoint cannot take. Both before any I/O.
pub fn serialize_request(
    config: &OpenAiConfig,
    request: &LlmRequest,
) -> Result<Vec<u8>, LlmFailure> {
    if request.messages.iter().any(|m| has_image(&m.content)) {
        return Err(LlmFailure::new(
            codes::UNSUPPORTED_CONTENT,
            "image content is not supported by the openai provider's text path",
        ));
    }
    let effort = request
        .config
        .reasoning_effort
        .as_deref()
        .or(config.reasoning_effort.as_deref());
    let (thinking, reasoning_effort) = match (config.reasoning_wire, effort) {
        (ReasoningWire::Omit, _) => (None, None),
        (ReasoningWire::Openai, effort) => (None, effort),
        (ReasoningWire::Deepseek, None) => (config.thinking, None),
        (ReasoningWire::Deepseek, Some(effort)) => {
            check_effort(config, effort)
                .map_err(|e| LlmFailure::new(codes::UNSUPPORTED_REASONING_EFFORT, e.to_string()))?;
            if effort == "off" {
                (Some(Thinking::Disabled), None)
            } else {
                (Some(Thinking::Enabled), Some(effort))
            }
        }
    };
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = &request.system {
        messages.push(WireMessage::System {
            content: Cow::Borrowed(system),
        });
    }
    for message in &request.messages {
        wire_messages(message, &mut messages);
    }
    let tools = (!request.tools.is_empty()).then(|| {
        request
            .tools
            .iter()
            .map(|t| WireTool {
                kind: "function",
                function: WireFunction {
                    name: &t.name,
                    description: &t.description,
                    parameters: &t.parameters,
                },
            })
            .collect()
    });
    let model = if request.config.model.is_empty() {
        &config.model
    } else {
        &request.config.model
    };
    let body = WireRequest {
        model,
        messages,
        stream: true,
        stream_options: StreamOptions {
            include_usage: true,
        },
        thinking: thinking.map(|kind| WireThinking { kind }),
        reasoning_effort,
        tools,
        temperature: request.config.temperature.as_ref(),
        max_tokens: request.config.max_tokens.or(config.max_tokens),
        stop: request.config.stop.as_deref(),
    };
    serde_json::to_vec(&body).map_err(|e| {
        LlmFailure::new(
            codes::INVALID_REQUEST,
            format!("request could not be serialized: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MessageId;
    use crate::llm::types::{LlmCallConfig, MessageSource, ToolSchema};
    use serde_json::json;

    fn msg(role: Role, content: Value) -> Arc<Message> {
        Arc::new(Message {
            id: MessageId::new("m").expect("valid id"),
            role,
            content: serde_json::from_value(content).expect("valid blocks"),
            source: if role == Role::Assistant {
                MessageSource::model("openai", "m")
            } else {
                MessageSource::user()
            },
        })
    }

    fn request(messages: Vec<Arc<Message>>) -> LlmRequest {
        LlmRequest {
            config: LlmCallConfig {
                provider: "openai".into(),
                model: "deepseek-v4-flash".into(),
                ..LlmCallConfig::default()
            },
            system: None,
            tools: vec![],
            messages,
            session_id: None,
        }
    }

    fn body(config: &OpenAiConfig, request: &LlmRequest) -> Value {
        serde_json::from_slice(&serialize_request(config, request).expect("serializable"))
            .expect("json")
    }

    fn wire_messages_of(messages: Vec<Arc<Message>>) -> Value {
        body(&OpenAiConfig::default(), &request(messages))["messages"].clone()
    }

    // §9.28.1, §9.28.2
    #[test]
    fn user_text_and_system_history() {
        let out = wire_messages_of(vec![
            msg(Role::System, json!([{"type":"text","text":"be brief"}])),
            msg(
                Role::User,
                json!([{"type":"text","text":"hello "},{"type":"text","text":"world"}]),
            ),
        ]);
        assert_eq!(
            out,
            json!([{"role":"system","content":"be brief"},{"role":"user","content":"hello world"}])
        );
    }

    // §9.28.3, §9.28.4, §9.28.5, §9.28.37–39
    #[test]
    fn assistant_reasoning_and_tool_calls_are_sent_back() {
        let out = wire_messages_of(vec![
            msg(
                Role::Assistant,
                json!([{"type":"reasoning","text":"hm"},{"type":"text","text":"hi"}]),
            ),
            msg(
                Role::Assistant,
                json!([{"type":"reasoning","text":"plan"},{"type":"tool-call","id":"c1","name":"read","arguments":"{\"p\":1}"},{"type":"tool-call","id":"c2","name":"ls","arguments":"{}"}]),
            ),
            msg(Role::Assistant, json!([])),
            msg(Role::Assistant, json!([{"type":"reasoning","text":"only"}])),
        ]);
        assert_eq!(
            out,
            json!([
                {"role":"assistant","content":"hi","reasoning_content":"hm"},
                {"role":"assistant","content":"","reasoning_content":"plan","tool_calls":[
                    {"id":"c1","type":"function","function":{"name":"read","arguments":"{\"p\":1}"}},
                    {"id":"c2","type":"function","function":{"name":"ls","arguments":"{}"}}]},
                {"role":"assistant","content":""},
                {"role":"assistant","content":"","reasoning_content":"only"}
            ])
        );
    }

    // §9.28.6, §9.28.7, §9.28.8, §9.28.9, §9.28.11, §9.28.28
    #[test]
    fn tool_results_become_tool_messages() {
        let out = wire_messages_of(vec![
            msg(
                Role::User,
                json!([{"type":"text","text":"see"},{"type":"tool-result","toolCallId":"c1","content":[{"type":"text","text":"file a"}]}]),
            ),
            msg(
                Role::User,
                json!([{"type":"tool-result","toolCallId":"c2","content":[],"isError":true},{"type":"plugin-note","x":1}]),
            ),
            msg(Role::User, json!([])),
        ]);
        assert_eq!(
            out,
            json!([
                {"role":"user","content":"see"},
                {"role":"tool","tool_call_id":"c1","content":"file a"},
                {"role":"tool","tool_call_id":"c2","content":"(no output)"},
                {"role":"user","content":""}
            ])
        );
    }

    // §9.28.10
    #[test]
    fn image_blocks_are_unsupported_content_even_nested() {
        let image = json!({"type":"image","attachment":{"attachmentId":"sha256:00","mediaType":"image/png","bytes":1,"width":1,"height":1}});
        for content in [
            json!([image.clone()]),
            json!([{"type":"tool-result","toolCallId":"c","content":[image]}]),
        ] {
            let err = serialize_request(
                &OpenAiConfig::default(),
                &request(vec![msg(Role::User, content)]),
            )
            .expect_err("image");
            assert_eq!(err.code, "UNSUPPORTED_CONTENT");
        }
    }

    // §9.28.12, §9.28.13, §9.28.14, §9.28.15, §9.28.16
    #[test]
    fn body_keys_in_order_with_system_params_and_tools() {
        let mut req = request(vec![msg(Role::User, json!([{"type":"text","text":"hi"}]))]);
        let bare = serialize_request(&OpenAiConfig::default(), &req).expect("ok");
        assert_eq!(
            String::from_utf8(bare).expect("utf8"),
            r#"{"model":"deepseek-v4-flash","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#
        );
        req.system = Some("sys".into());
        req.config.temperature = Some(serde_json::Number::from_f64(0.5).expect("finite"));
        req.config.max_tokens = Some(100);
        req.config.stop = Some(vec!["END".into()]);
        req.config.reasoning_effort = Some("high".into());
        req.tools = vec![ToolSchema {
            name: "read".into(),
            description: "reads".into(),
            parameters: json!({"type":"object"}),
        }];
        let text =
            String::from_utf8(serialize_request(&OpenAiConfig::default(), &req).expect("ok"))
                .expect("utf8");
        assert_eq!(
            text,
            r#"{"model":"deepseek-v4-flash","messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"thinking":{"type":"enabled"},"reasoning_effort":"high","tools":[{"type":"function","function":{"name":"read","description":"reads","parameters":{"type":"object"}}}],"temperature":0.5,"max_tokens":100,"stop":["END"]}"#
        );
    }

    // §9.28.17–§9.28.24
    #[test]
    fn thinking_and_effort_mapping() {
        let req = |effort: Option<&str>| {
            let mut r = request(vec![]);
            r.config.reasoning_effort = effort.map(str::to_owned);
            r
        };
        let pick = |config: &OpenAiConfig, effort: Option<&str>| {
            let b = body(config, &req(effort));
            (
                b.get("thinking").cloned(),
                b.get("reasoning_effort").cloned(),
            )
        };
        let base = OpenAiConfig::default();
        for effort in ["low", "high", "max"] {
            assert_eq!(
                pick(&base, Some(effort)),
                (Some(json!({"type":"enabled"})), Some(json!(effort)))
            );
        }
        assert_eq!(
            pick(&base, Some("off")),
            (Some(json!({"type":"disabled"})), None)
        );
        let low_default = OpenAiConfig {
            reasoning_effort: Some("off".into()),
            ..OpenAiConfig::default()
        };
        assert_eq!(
            pick(&low_default, None),
            (Some(json!({"type":"disabled"})), None)
        );
        assert_eq!(
            pick(&low_default, Some("max")),
            (Some(json!({"type":"enabled"})), Some(json!("max")))
        );
        assert_eq!(pick(&base, None), (None, None));
        let enabled = OpenAiConfig {
            thinking: Some(Thinking::Enabled),
            ..OpenAiConfig::default()
        };
        assert_eq!(
            pick(&enabled, None),
            (Some(json!({"type":"enabled"})), None)
        );
        let disabled = OpenAiConfig {
            thinking: Some(Thinking::Disabled),
            ..OpenAiConfig::default()
        };
        let err = serialize_request(&disabled, &req(Some("high"))).expect_err("locked");
        assert_eq!(err.code, "UNSUPPORTED_REASONING_EFFORT");
        let err = serialize_request(&base, &req(Some("medium"))).expect_err("unknown effort");
        assert_eq!(err.code, "UNSUPPORTED_REASONING_EFFORT");
        let openai = OpenAiConfig {
            reasoning_wire: ReasoningWire::Openai,
            ..OpenAiConfig::default()
        };
        assert_eq!(pick(&openai, Some("medium")), (None, Some(json!("medium"))));
        let omit = OpenAiConfig {
            reasoning_wire: ReasoningWire::Omit,
            ..OpenAiConfig::default()
        };
        assert_eq!(pick(&omit, Some("high")), (None, None));
    }

    // §9.29.13, §9.29.14, §9.29.18–22
    #[test]
    fn http_errors_map_to_codes() {
        let err = |status: u16, body: &str| map_http_error(status, body.as_bytes());
        let with_msg = |m: &str| json!({"error":{"message":m}}).to_string();
        for (status, code) in [
            (401, "AUTH"),
            (403, "AUTH"),
            (429, "RATE_LIMIT"),
            (400, "INVALID_REQUEST"),
            (500, "SERVER"),
            (503, "SERVER"),
            (413, "INVALID_REQUEST"),
            (418, "HTTP_418"),
        ] {
            let f = err(status, &with_msg("boom"));
            assert_eq!(
                (f.code.as_str(), f.message.as_str(), f.status),
                (code, "boom", Some(status)),
                "{status}"
            );
        }
        let overflow = json!({"error":{"message":"This request exceeds the model context window","code":"context_length_exceeded"}}).to_string();
        assert_eq!(err(400, &overflow).code, "CONTEXT_WINDOW_EXCEEDED");
        assert_eq!(err(413, &overflow).code, "INVALID_REQUEST");
        assert_eq!(
            err(400, &with_msg("value exceeds maximum allowed value")).code,
            "INVALID_REQUEST"
        );
        let quota = json!({"error":{"message":"You exceeded your current quota","type":"insufficient_quota"}}).to_string();
        assert_eq!(err(429, &quota).code, "QUOTA");
        assert_eq!(err(402, &with_msg("Insufficient Balance")).code, "QUOTA");
        assert_eq!(
            err(429, &with_msg("Rate limit reached for requests")).code,
            "RATE_LIMIT"
        );
        assert_eq!(err(500, r#"{"error":{}}"#).message, "API error (HTTP 500)");
        let f = err(502, "Bad Gateway");
        assert_eq!(
            (f.code.as_str(), f.message.as_str()),
            ("SERVER", "API error (HTTP 502)")
        );
    }

    // §9.29.15–17
    #[test]
    fn retry_after_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after_ms("2", now), Some(2000));
        assert_eq!(
            parse_retry_after_ms("Sun, 06 Nov 1994 08:49:40 GMT", now),
            Some(3000)
        );
        for bad in [
            "0",
            "",
            "-1",
            "1.5",
            "soon",
            "99999999999999999999999",
            "3000000",
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sat, 05 Nov 1994 08:49:40 GMT",
            "Sun, 06 Nov 1994 25:49:40 GMT",
        ] {
            assert_eq!(parse_retry_after_ms(bad, now), None, "{bad}");
        }
        assert_eq!(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        assert_eq!(
            parse_http_date("Tue, 29 Feb 2000 12:00:00 GMT"),
            Some(951_825_600)
        );
    }

    // §7.1, §9.30.3
    #[test]
    fn api_keys_are_validated_and_never_shown() {
        let key = ApiKey::new("  sk-abc123  ").expect("valid after trim");
        assert_eq!(key.expose(), "sk-abc123");
        assert_eq!(format!("{key:?}"), "ApiKey(<redacted>)");
        for bad in ["", "   ", "sk abc", "sk-\u{e9}", "sk-\n1"] {
            let err = ApiKey::from_source(bad, "DEEPSEEK_API_KEY").expect_err("invalid");
            assert_eq!(
                err,
                OpenAiError::InvalidCredential {
                    source_name: "DEEPSEEK_API_KEY".into()
                }
            );
            if !bad.trim().is_empty() {
                assert!(!err.to_string().contains(bad.trim()), "{err}");
            }
        }
        assert_eq!(key.scrub("bad key sk-abc123!"), "bad key <redacted>!");
    }

    // §9.29.54–61
    #[test]
    fn environment_lookup_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let c = OpenAiConfig::from_lookup(env(&[])).expect("ok");
        assert!(c.api_key.is_none());
        assert_eq!(
            (c.base_url.as_str(), c.model.as_str()),
            (DEFAULT_BASE_URL, DEFAULT_MODEL)
        );
        let c = OpenAiConfig::from_lookup(env(&[
            ("DEEPSEEK_API_KEY", ""),
            ("OPENAI_API_KEY", "sk-o"),
            ("DEEPSEEK_BASE_URL", "http://b"),
            ("DSH_MODEL", "m2"),
        ]))
        .expect("ok");
        assert_eq!(c.api_key.as_ref().map(ApiKey::expose), Some("sk-o"));
        assert_eq!((c.base_url.as_str(), c.model.as_str()), ("http://b", "m2"));
        let c = OpenAiConfig::from_lookup(env(&[
            ("DEEPSEEK_API_KEY", "sk-d"),
            ("OPENAI_API_KEY", "sk-o"),
            ("DSH_BASE_URL", "http://a"),
            ("DEEPSEEK_BASE_URL", "http://b"),
        ]))
        .expect("ok");
        assert_eq!(c.api_key.as_ref().map(ApiKey::expose), Some("sk-d"));
        assert_eq!(c.base_url, "http://a");
        let err =
            OpenAiConfig::from_lookup(env(&[("DEEPSEEK_API_KEY", "sk bad")])).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "the API key from DEEPSEEK_API_KEY is blank or has characters an HTTP header cannot carry"
        );
    }

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
            p.inner.endpoint.as_str(),
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
