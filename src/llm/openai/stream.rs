//! One stream: the single HTTP exchange behind `OpenAiProvider::stream`, as a state machine the
//! consumer drives by polling (`Run::next_chunk`).
//!
//! It sends one `POST`, maps a refusal to a failure (`errors.rs`), feeds a 2xx body to the
//! `ChunkDecoder` (`response.rs`), and ends with exactly one `finish`. Every wait for the server
//! races the cancel token and is bounded by the idle timeout; nothing is spawned, so dropping the
//! stream drops the connection. Text copied from the server or from a transport error into a
//! failure is scrubbed of the API key and of the base URL's password.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use reqwest::header::{self, HeaderMap, HeaderValue};
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::errors::{map_http_error, parse_retry_after_ms};
use super::request::serialize_request;
use super::response::ChunkDecoder;
use crate::llm::provider::ChunkStream;
use crate::llm::types::{FinishReason, LlmFailure, LlmRequest, RequestPurpose, StreamChunk, codes};

/// Error bodies are read up to this many bytes; the rest is ignored.
const ERROR_BODY_BYTES_MAX: usize = 64 << 10;
/// After `[DONE]`, how long the end of the body is awaited (only by a consumer that polls past the
/// `finish`) before the connection is dropped instead of pooled.
const DRAIN_MS: u64 = 100;
/// Request ids longer than this are ignored rather than logged.
const REQUEST_ID_BYTES_MAX: usize = 256;

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

/// Starts one stream of `request`: nothing is sent until the consumer first polls it.
pub(super) fn start(
    inner: Arc<Inner>,
    request: LlmRequest,
    cancel: CancellationToken,
) -> ChunkStream {
    let decoder = ChunkDecoder::new(&inner.config.limits);
    let run = Run {
        inner,
        cancel,
        phase: Phase::Start(Box::new(request)),
        pending: VecDeque::new(),
        decoder,
        scratch: Vec::new(),
    };
    Box::pin(futures::stream::unfold(run, |mut run| async move {
        let chunk = run.next_chunk().await?;
        Some((chunk, run))
    }))
}

impl Run {
    /// The next chunk, or `None` once the stream has ended (always after exactly one `finish`).
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
                Phase::Body(response) => {
                    if let ControlFlow::Break(chunk) = self.read_body(response).await {
                        return chunk;
                    }
                }
            }
        }
    }

    /// Reads one piece of a 2xx body and queues what it decodes. `Break` carries what
    /// `next_chunk` returns at once (the stream's end); `Continue` means the queue or the phase
    /// moved on.
    async fn read_body(
        &mut self,
        mut response: reqwest::Response,
    ) -> ControlFlow<Option<StreamChunk>> {
        let bytes = match self.wait(response.chunk()).await {
            Wait::Cancelled => return ControlFlow::Break(Some(self.end(aborted_finish()))),
            Wait::Idle => {
                return ControlFlow::Break(Some(self.end(self.idle_finish("the stream"))));
            }
            Wait::Ready(Err(e)) => {
                let failure = LlmFailure::new(
                    codes::TRANSPORT,
                    self.scrub(&format!(
                        "API stream from {} failed: {}",
                        self.inner.endpoint,
                        error_chain(&e)
                    )),
                );
                return ControlFlow::Break(Some(self.end(error_finish(failure))));
            }
            Wait::Ready(Ok(None)) => {
                let Err(e) = self.decoder.finish() else {
                    // `[DONE]` ends the phase before EOF is ever read.
                    return ControlFlow::Break(None);
                };
                return ControlFlow::Break(Some(self.end(error_finish(e.failure()))));
            }
            Wait::Ready(Ok(Some(bytes))) => bytes,
        };
        self.scratch.clear();
        let result = self.decoder.feed(&bytes, &mut self.scratch);
        self.pending.extend(self.scratch.drain(..));
        match result {
            Ok(outcome) if outcome.done => {
                tracing::debug!(route = %self.inner.config.route, "openai stream done");
                // No event is read after `[DONE]`; the body's end only frees the connection, once
                // the final chunks are out.
                self.phase = Phase::Draining(response);
            }
            Ok(_) => self.phase = Phase::Body(response),
            Err(e) => {
                tracing::debug!(route = %self.inner.config.route, error = %e, "openai stream undecodable");
                self.pending.push_back(error_finish(e.failure()));
            }
        }
        ControlFlow::Continue(())
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

    /// `text` without the API key or the base URL's password (a server may echo either).
    fn scrub(&self, text: &str) -> String {
        let mut out = match &self.inner.config.api_key {
            Some(key) => key.scrub(text),
            None => std::borrow::Cow::Borrowed(text),
        };
        if let Some(credentials) = self.inner.endpoint.credentials()
            && let std::borrow::Cow::Owned(scrubbed) = credentials.scrub(&out)
        {
            out = std::borrow::Cow::Owned(scrubbed);
        }
        out.into_owned()
    }

    /// The failure for an idle timeout while waiting for `what`.
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
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        if request.purpose == Some(RequestPurpose::Compaction) {
            // The auxiliary compaction call is marked on the wire (§7.2), as the original marks it.
            headers.insert("x-deepseek-harness-compact", HeaderValue::from_static("1"));
        }
        tracing::debug!(
            route = %config.route,
            endpoint = %self.inner.endpoint.url(),
            n_messages = request.messages.len(),
            n_tools = request.tools.len(),
            body_bytes = body.len(),
            "openai request"
        );
        let post = self
            .inner
            .client
            .post(self.inner.endpoint.url().clone())
            .headers(headers);
        let send = self
            .authorize(post)
            .map_err(error_finish)?
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
                        self.inner.endpoint,
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

    /// Adds the one `Authorization` header: HTTP Basic from the base URL's userinfo when it has
    /// any (that credential names this endpoint, so it wins and the key is not sent), else the API
    /// key as a bearer token. Both are marked sensitive, so no debug output of the request shows
    /// them.
    ///
    /// # Errors
    /// `MISSING_CREDENTIAL` when there is neither, `INVALID_CREDENTIAL` when the key cannot be put
    /// in a header.
    fn authorize(
        &self,
        post: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, LlmFailure> {
        let config = &self.inner.config;
        if let Some(credentials) = self.inner.endpoint.credentials() {
            return Ok(post.basic_auth(&credentials.username, credentials.password.as_ref()));
        }
        let Some(key) = &config.api_key else {
            return Err(LlmFailure::new(
                codes::MISSING_CREDENTIAL,
                format!(
                    "no API key for provider route {:?}; export DEEPSEEK_API_KEY or OPENAI_API_KEY, \
                     or set api_key in the provider configuration",
                    config.route
                ),
            ));
        };
        let mut bearer =
            HeaderValue::from_str(&format!("Bearer {}", key.expose())).map_err(|_| {
                LlmFailure::new(
                    codes::INVALID_CREDENTIAL,
                    "the API key cannot be carried in an HTTP header",
                )
            })?;
        bearer.set_sensitive(true);
        Ok(post.header(header::AUTHORIZATION, bearer))
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
pub(super) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
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
