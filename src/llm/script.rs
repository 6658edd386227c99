//! The `script` provider: replays scripted model replies, the `model` entries of scenario files
//! (SPEC §9), for conformance tests and deterministic examples.
//!
//! Each `stream()` call consumes the next `ScriptEntry` (a shared cursor: an entry stays consumed
//! across agent restarts because the provider outlives the agent) and records the request, so a test
//! can assert exactly what the model was sent. What each entry streams:
//!
//! - `{"text": s}`: `block-start`(text, 0), one `text-delta` per character, `block-end` with the whole
//!   text, `usage{inputTokens:10, outputTokens:<characters>}`, `finish{stop}`.
//! - `{"max_tokens": s}`: the same, ending `finish{max-tokens}`.
//! - `{"tool_calls": [{id, name, arguments}]}`: per call i, `block-start`(tool-call, i), a
//!   `tool-call-delta` with id, name and the first half of the arguments, one with the id and the
//!   rest, `block-end` with the whole call; then `usage{10,5}` and `finish{tool-calls}`. A `"text"`
//!   beside `tool_calls` is streamed first as block 0 (as for a text entry, without its usage and
//!   finish), and the calls then take indexes 1, 2, ….
//! - `{"error": {code, message, status?, retry_after_ms?, request_id?}}`: exactly one chunk,
//!   `finish{error, failure}`.
//! - `{"hang": s}`: `block-start`(text, 0) and one `text-delta` with `s` (nothing at all when `s` is
//!   empty), then waits for cancellation and ends `finish{aborted, ABORTED}`.
//! - `{"chunks": [...]}`: the given chunks verbatim. A missing final `finish` is *not* added: the
//!   runtime must cope with a provider that breaks the contract.
//!
//! Any entry may carry `"gate": name, "gate_after_chunks": n` (default 0): after n chunks (every chunk
//! counts, `block-start` included) the stream waits until the gate is opened in the shared `Gates`.
//! When n equals the number of chunks the wait comes after the last one, before the stream ends; a
//! larger n never waits. Cancellation ends a stream promptly wherever it is — before the next chunk,
//! while gated, while hanging — with `finish{aborted}` (or, after a `finish` was already streamed, by
//! just ending). A script that runs out answers `finish{error, {code:"UNKNOWN", message:"script
//! exhausted"}}`.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::llm::provider::{ChunkStream, Provider};
use crate::llm::types::{
    BlockType, ContentBlock, FinishReason, LlmFailure, LlmRequest, StreamChunk, TokenUsage, codes,
};

/// Why a script entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// An entry with no reply kind, or with two that cannot go together.
    #[error(
        "script entry has {n_kinds} reply kinds ({kinds}); it needs exactly one of text, max_tokens, tool_calls, error, hang, chunks (text may accompany tool_calls)"
    )]
    ReplyKinds {
        /// How many reply kinds the entry has.
        n_kinds: usize,
        /// Their names, comma-separated.
        kinds: String,
    },
    /// `gate_after_chunks` without a `gate` to wait on.
    #[error("script entry has gate_after_chunks {gate_after_chunks} but no gate")]
    GateAfterWithoutGate {
        /// The value given.
        gate_after_chunks: usize,
    },
    /// A `gate` of "".
    #[error("script entry gate name is empty")]
    EmptyGate,
    /// An `error` entry whose failure could not be built (an empty code, for example).
    #[error("script error entry is invalid: {reason}")]
    InvalidFailure {
        /// What is wrong with it.
        reason: String,
    },
}

/// One scripted tool call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// The call id (what `tool_behaviour` keys on and the tool result answers).
    pub id: String,
    /// The tool called.
    pub name: String,
    /// The raw argument string, streamed in two halves.
    pub arguments: String,
}

/// The failure an `error` entry finishes with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedFailure {
    /// The failure code (`SERVER`, `RATE_LIMIT`, ...), which the request-error policy decides on.
    pub code: String,
    /// The failure message.
    pub message: String,
    /// The HTTP status a real provider would have seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The provider's `Retry-After`, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The provider's request id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

impl ScriptedFailure {
    fn failure(&self) -> LlmFailure {
        LlmFailure {
            message: self.message.clone(),
            code: self.code.clone(),
            status: self.status,
            provider_retry_after_ms: self.retry_after_ms,
            request_id: self.request_id.clone(),
        }
    }
}

/// What an entry replies. See the module docs for the chunks of each.
#[derive(Clone, Debug, PartialEq)]
pub enum ScriptReply {
    /// `{"text": s}`: `s` streamed one character per delta, `finish{stop}`.
    Text(String),
    /// `{"max_tokens": s}`: as `Text`, ending `finish{max-tokens}`.
    MaxTokens(String),
    /// `{"tool_calls": [...]}`, optionally with a `text` streamed first.
    ToolCalls {
        /// Text streamed as block 0 before the calls.
        text: Option<String>,
        /// The calls, in block order.
        calls: Vec<ScriptToolCall>,
    },
    /// `{"error": {...}}`: one `finish{error}` chunk.
    Error(ScriptedFailure),
    /// `{"hang": s}`: `s` streamed, then the stream waits for cancellation.
    Hang(String),
    /// `{"chunks": [...]}`: these chunks verbatim.
    Chunks(Vec<StreamChunk>),
}

/// One scripted reply plus its optional gate. JSON: `{"text": "Hello", "gate": "g1",
/// "gate_after_chunks": 2}`; unknown fields are an error.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawEntry", into = "RawEntry")]
pub struct ScriptEntry {
    /// What the entry streams.
    pub reply: ScriptReply,
    /// The gate the stream waits on, and after how many chunks.
    ///
    /// Invariant: a gate name is non-empty.
    gate: Option<(String, usize)>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_tokens: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<ScriptToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<ScriptedFailure>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hang: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chunks: Option<Vec<StreamChunk>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gate_after_chunks: Option<usize>,
}

impl TryFrom<RawEntry> for ScriptEntry {
    type Error = ScriptError;

    fn try_from(raw: RawEntry) -> Result<ScriptEntry, ScriptError> {
        let present = [
            ("text", raw.text.is_some() && raw.tool_calls.is_none()),
            ("max_tokens", raw.max_tokens.is_some()),
            ("tool_calls", raw.tool_calls.is_some()),
            ("error", raw.error.is_some()),
            ("hang", raw.hang.is_some()),
            ("chunks", raw.chunks.is_some()),
        ];
        let kinds: Vec<&str> = present
            .iter()
            .filter(|(_, p)| *p)
            .map(|(k, _)| *k)
            .collect();
        if kinds.len() != 1 {
            return Err(ScriptError::ReplyKinds {
                n_kinds: kinds.len(),
                kinds: kinds.join(", "),
            });
        }
        let reply = if let Some(calls) = raw.tool_calls {
            ScriptReply::ToolCalls {
                text: raw.text,
                calls,
            }
        } else if let Some(text) = raw.text {
            ScriptReply::Text(text)
        } else if let Some(text) = raw.max_tokens {
            ScriptReply::MaxTokens(text)
        } else if let Some(failure) = raw.error {
            failure
                .failure()
                .validate()
                .map_err(|reason| ScriptError::InvalidFailure { reason })?;
            ScriptReply::Error(failure)
        } else if let Some(text) = raw.hang {
            ScriptReply::Hang(text)
        } else if let Some(chunks) = raw.chunks {
            ScriptReply::Chunks(chunks)
        } else {
            unreachable!("exactly one reply kind was counted above");
        };
        let gate = match (raw.gate, raw.gate_after_chunks) {
            (None, None) => None,
            (None, Some(n)) => {
                return Err(ScriptError::GateAfterWithoutGate {
                    gate_after_chunks: n,
                });
            }
            (Some(name), _) if name.is_empty() => return Err(ScriptError::EmptyGate),
            (Some(name), n) => Some((name, n.unwrap_or(0))),
        };
        Ok(ScriptEntry { reply, gate })
    }
}

impl From<ScriptEntry> for RawEntry {
    fn from(entry: ScriptEntry) -> RawEntry {
        let mut raw = RawEntry {
            text: None,
            max_tokens: None,
            tool_calls: None,
            error: None,
            hang: None,
            chunks: None,
            gate: None,
            gate_after_chunks: None,
        };
        match entry.reply {
            ScriptReply::Text(t) => raw.text = Some(t),
            ScriptReply::MaxTokens(t) => raw.max_tokens = Some(t),
            ScriptReply::ToolCalls { text, calls } => {
                raw.text = text;
                raw.tool_calls = Some(calls);
            }
            ScriptReply::Error(f) => raw.error = Some(f),
            ScriptReply::Hang(t) => raw.hang = Some(t),
            ScriptReply::Chunks(c) => raw.chunks = Some(c),
        }
        if let Some((name, n)) = entry.gate {
            raw.gate = Some(name);
            raw.gate_after_chunks = (n != 0).then_some(n);
        }
        raw
    }
}

impl ScriptEntry {
    fn of(reply: ScriptReply) -> ScriptEntry {
        ScriptEntry { reply, gate: None }
    }

    /// `{"text": text}`
    pub fn text(text: impl Into<String>) -> ScriptEntry {
        ScriptEntry::of(ScriptReply::Text(text.into()))
    }

    /// `{"max_tokens": text}`
    pub fn max_tokens(text: impl Into<String>) -> ScriptEntry {
        ScriptEntry::of(ScriptReply::MaxTokens(text.into()))
    }

    /// `{"tool_calls": [{id, name, arguments}, …]}`
    pub fn tool_calls<'a>(
        calls: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>,
    ) -> ScriptEntry {
        ScriptEntry::of(ScriptReply::ToolCalls {
            text: None,
            calls: calls
                .into_iter()
                .map(|(id, name, arguments)| ScriptToolCall {
                    id: id.into(),
                    name: name.into(),
                    arguments: arguments.into(),
                })
                .collect(),
        })
    }

    /// `{"error": {code, message}}`
    pub fn error(code: &str, message: &str) -> ScriptEntry {
        ScriptEntry::of(ScriptReply::Error(ScriptedFailure {
            code: code.into(),
            message: message.into(),
            status: None,
            retry_after_ms: None,
            request_id: None,
        }))
    }

    /// `{"hang": text}`
    pub fn hang(text: impl Into<String>) -> ScriptEntry {
        ScriptEntry::of(ScriptReply::Hang(text.into()))
    }

    /// `{"chunks": [...]}`
    pub fn chunks(chunks: Vec<StreamChunk>) -> ScriptEntry {
        ScriptEntry::of(ScriptReply::Chunks(chunks))
    }

    /// Holds the stream after `after_chunks` chunks until `name` is opened.
    ///
    /// # Panics
    /// When `name` is empty (a test's own literal).
    pub fn gate(mut self, name: &str, after_chunks: usize) -> ScriptEntry {
        assert!(!name.is_empty(), "a gate needs a name");
        self.gate = Some((name.to_owned(), after_chunks));
        self
    }

    /// The gate name and chunk count, if gated.
    pub fn gate_spec(&self) -> Option<(&str, usize)> {
        self.gate.as_ref().map(|(n, k)| (n.as_str(), *k))
    }

    /// The chunks this entry streams before it ends (or, for `hang`, before it waits).
    pub fn planned_chunks(&self) -> Vec<StreamChunk> {
        let mut out = Vec::new();
        match &self.reply {
            ScriptReply::Text(text) => {
                push_text_block(0, text, &mut out);
                push_end(
                    usage(10, text.chars().count()),
                    FinishReason::Stop,
                    &mut out,
                );
            }
            ScriptReply::MaxTokens(text) => {
                push_text_block(0, text, &mut out);
                push_end(
                    usage(10, text.chars().count()),
                    FinishReason::MaxTokens,
                    &mut out,
                );
            }
            ScriptReply::ToolCalls { text, calls } => {
                let mut first = 0;
                if let Some(text) = text {
                    push_text_block(0, text, &mut out);
                    first = 1;
                }
                for (i, call) in calls.iter().enumerate() {
                    let index = u32::try_from(first + i).unwrap_or(u32::MAX);
                    let n_chars = call.arguments.chars().count();
                    let split = call
                        .arguments
                        .char_indices()
                        .nth(n_chars / 2)
                        .map_or(call.arguments.len(), |(at, _)| at);
                    out.push(StreamChunk::BlockStart {
                        index,
                        block_type: BlockType::ToolCall,
                    });
                    out.push(StreamChunk::ToolCallDelta {
                        index,
                        id: call.id.clone(),
                        name: Some(call.name.clone()),
                        arguments_delta: call.arguments[..split].to_owned(),
                    });
                    out.push(StreamChunk::ToolCallDelta {
                        index,
                        id: call.id.clone(),
                        name: None,
                        arguments_delta: call.arguments[split..].to_owned(),
                    });
                    out.push(StreamChunk::BlockEnd {
                        index,
                        block: ContentBlock::ToolCall {
                            id: call.id.clone(),
                            name: call.name.clone(),
                            arguments: call.arguments.clone(),
                        },
                    });
                }
                push_end(usage(10, 5), FinishReason::ToolCalls, &mut out);
            }
            ScriptReply::Error(failure) => out.push(StreamChunk::finish(FinishReason::Error {
                failure: failure.failure(),
            })),
            ScriptReply::Hang(text) => {
                if !text.is_empty() {
                    out.push(StreamChunk::BlockStart {
                        index: 0,
                        block_type: BlockType::Text,
                    });
                    out.push(StreamChunk::TextDelta {
                        index: 0,
                        text: text.clone(),
                    });
                }
            }
            ScriptReply::Chunks(chunks) => out.clone_from(chunks),
        }
        out
    }
}

fn usage(input: u64, output: usize) -> TokenUsage {
    TokenUsage {
        input_tokens: input,
        output_tokens: output as u64,
        ..TokenUsage::default()
    }
}

fn push_text_block(index: u32, text: &str, out: &mut Vec<StreamChunk>) {
    out.push(StreamChunk::BlockStart {
        index,
        block_type: BlockType::Text,
    });
    let mut buf = [0u8; 4];
    for c in text.chars() {
        out.push(StreamChunk::TextDelta {
            index,
            text: c.encode_utf8(&mut buf).to_owned(),
        });
    }
    out.push(StreamChunk::BlockEnd {
        index,
        block: ContentBlock::Text { text: text.into() },
    });
}

fn push_end(usage: TokenUsage, reason: FinishReason, out: &mut Vec<StreamChunk>) {
    out.push(StreamChunk::Usage { usage });
    out.push(StreamChunk::finish(reason));
}

/// One named one-shot gate.
#[derive(Default)]
struct Gate {
    open: AtomicBool,
    notify: Notify,
}

/// A cloneable registry of named one-shot gates, shared by script streams and scenario tool
/// behaviours. A gate is created closed on first mention; once opened it stays open; a gate never
/// opened stays closed.
#[derive(Clone, Default)]
pub struct Gates {
    by_name: Arc<Mutex<HashMap<String, Arc<Gate>>>>,
}

impl fmt::Debug for Gates {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let map = self.lock();
        let mut names: Vec<(&String, bool)> = map
            .iter()
            .map(|(k, g)| (k, g.open.load(Ordering::Acquire)))
            .collect();
        names.sort();
        f.debug_map().entries(names).finish()
    }
}

impl Gates {
    /// A set with no gate open.
    pub fn new() -> Gates {
        Gates::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Gate>>> {
        // The map is only inserted into; a panic elsewhere cannot leave it half-updated.
        self.by_name
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn gate(&self, name: &str) -> Arc<Gate> {
        self.lock().entry(name.to_owned()).or_default().clone()
    }

    /// Opens `name` and wakes every waiter. Opening twice is harmless.
    pub fn open(&self, name: &str) {
        let gate = self.gate(name);
        gate.open.store(true, Ordering::Release);
        gate.notify.notify_waiters();
    }

    /// Whether `name` has been opened.
    pub fn is_open(&self, name: &str) -> bool {
        self.lock()
            .get(name)
            .is_some_and(|g| g.open.load(Ordering::Acquire))
    }

    /// Resolves once `name` is open (at once if it already is).
    pub async fn wait(&self, name: &str) {
        let gate = self.gate(name);
        loop {
            let notified = gate.notify.notified();
            tokio::pin!(notified);
            // Registered before the check, so an `open` between the check and the await still wakes us.
            notified.as_mut().enable();
            if gate.open.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// The scripted provider. Clones share the cursor, the request record and the gates.
#[derive(Clone)]
pub struct ScriptProvider {
    name: String,
    entries: Arc<Mutex<VecDeque<ScriptEntry>>>,
    requests: Arc<Mutex<Vec<LlmRequest>>>,
    gates: Gates,
}

impl fmt::Debug for ScriptProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptProvider")
            .field("name", &self.name)
            .field("n_remaining", &self.remaining())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Both guarded values stay consistent under a panic: one push or pop at a time.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ScriptProvider {
    /// A provider named `script` replaying `entries` in order.
    pub fn new(entries: impl IntoIterator<Item = ScriptEntry>, gates: Gates) -> ScriptProvider {
        ScriptProvider {
            name: "script".into(),
            entries: Arc::new(Mutex::new(entries.into_iter().collect())),
            requests: Arc::new(Mutex::new(Vec::new())),
            gates,
        }
    }

    /// The same provider under another route name.
    pub fn named(mut self, name: impl Into<String>) -> ScriptProvider {
        self.name = name.into();
        self
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<LlmRequest> {
        lock(&self.requests).clone()
    }

    /// Entries not yet consumed.
    pub fn remaining(&self) -> usize {
        lock(&self.entries).len()
    }

    /// The gates this provider's entries wait on (shared with whoever opens them).
    pub fn gates(&self) -> &Gates {
        &self.gates
    }
}

impl Provider for ScriptProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn stream(&self, request: LlmRequest, cancel: CancellationToken) -> ChunkStream {
        lock(&self.requests).push(request);
        let entry = lock(&self.entries).pop_front();
        let play = match entry {
            Some(entry) => Play {
                chunks: entry.planned_chunks().into(),
                hang: matches!(entry.reply, ScriptReply::Hang(_)),
                gate: entry.gate,
                n_emitted: 0,
                finished: false,
                ended: false,
                gates: self.gates.clone(),
                cancel,
            },
            None => Play {
                chunks: VecDeque::from([StreamChunk::finish(FinishReason::Error {
                    failure: LlmFailure::new(codes::UNKNOWN, "script exhausted"),
                })]),
                hang: false,
                gate: None,
                n_emitted: 0,
                finished: false,
                ended: false,
                gates: self.gates.clone(),
                cancel,
            },
        };
        Box::pin(futures::stream::unfold(play, |mut play| async move {
            let chunk = play.next().await?;
            Some((chunk, play))
        }))
    }
}

/// One scripted stream in progress.
struct Play {
    chunks: VecDeque<StreamChunk>,
    hang: bool,
    gate: Option<(String, usize)>,
    n_emitted: usize,
    /// A `finish` chunk was yielded: a cancel now just ends the stream.
    finished: bool,
    /// Nothing more will be yielded.
    ended: bool,
    gates: Gates,
    cancel: CancellationToken,
}

impl Play {
    fn abort(&mut self) -> Option<StreamChunk> {
        self.ended = true;
        if self.finished {
            return None;
        }
        self.finished = true;
        Some(StreamChunk::finish(FinishReason::Aborted {
            failure: LlmFailure::new(codes::ABORTED, "request aborted by caller"),
        }))
    }

    async fn next(&mut self) -> Option<StreamChunk> {
        if self.ended {
            return None;
        }
        if let Some((name, after)) = &self.gate
            && *after == self.n_emitted
        {
            let name = name.clone();
            self.gate = None;
            tokio::select! {
                biased;
                () = self.cancel.cancelled() => return self.abort(),
                () = self.gates.wait(&name) => {}
            }
        }
        if self.cancel.is_cancelled() {
            return self.abort();
        }
        if let Some(chunk) = self.chunks.pop_front() {
            self.n_emitted += 1;
            if chunk.is_finish() {
                self.finished = true;
            }
            return Some(chunk);
        }
        if self.hang && !self.finished {
            self.cancel.cancelled().await;
            return self.abort();
        }
        self.ended = true;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<ScriptEntry, String> {
        serde_json::from_value(v).map_err(|e| e.to_string())
    }

    fn chunks(v: serde_json::Value) -> Vec<StreamChunk> {
        serde_json::from_value(v).expect("valid chunks")
    }

    fn req() -> LlmRequest {
        LlmRequest {
            config: Default::default(),
            system: None,
            tools: vec![],
            messages: vec![],
            session_id: None,
        }
    }

    async fn collect(p: &ScriptProvider) -> Vec<StreamChunk> {
        p.stream(req(), CancellationToken::new()).collect().await
    }

    #[test]
    fn text_entry_streams_one_delta_per_character() {
        let e = parse(json!({"text": "Hé!"})).expect("valid");
        assert_eq!(
            e.planned_chunks(),
            chunks(json!([
                {"type":"block-start","index":0,"blockType":"text"},
                {"type":"text-delta","index":0,"text":"H"},
                {"type":"text-delta","index":0,"text":"é"},
                {"type":"text-delta","index":0,"text":"!"},
                {"type":"block-end","index":0,"block":{"type":"text","text":"Hé!"}},
                {"type":"usage","usage":{"inputTokens":10,"outputTokens":3}},
                {"type":"finish","reason":{"kind":"stop"}}
            ]))
        );
        let e = parse(json!({"max_tokens": "ab"})).expect("valid");
        assert_eq!(
            e.planned_chunks().last(),
            Some(&StreamChunk::finish(FinishReason::MaxTokens))
        );
    }

    #[test]
    fn tool_calls_entry_splits_arguments_in_two_deltas_after_optional_text() {
        let e = parse(json!({"text":"ok","tool_calls":[{"id":"c1","name":"read","arguments":"{\"path\":\"a\"}"}]})).expect("valid");
        assert_eq!(
            e.planned_chunks()[4..],
            chunks(json!([
                {"type":"block-start","index":1,"blockType":"tool-call"},
                {"type":"tool-call-delta","index":1,"id":"c1","name":"read","argumentsDelta":"{\"path"},
                {"type":"tool-call-delta","index":1,"id":"c1","argumentsDelta":"\":\"a\"}"},
                {"type":"block-end","index":1,"block":{"type":"tool-call","id":"c1","name":"read","arguments":"{\"path\":\"a\"}"}},
                {"type":"usage","usage":{"inputTokens":10,"outputTokens":5}},
                {"type":"finish","reason":{"kind":"tool-calls"}}
            ]))[..]
        );
    }

    #[test]
    fn error_entry_is_one_finish_chunk() {
        let e = parse(json!({"error":{"code":"RATE_LIMIT","message":"slow down","status":429,"retry_after_ms":1500}})).expect("valid");
        assert_eq!(
            e.planned_chunks(),
            chunks(
                json!([{"type":"finish","reason":{"kind":"error","failure":{"message":"slow down","code":"RATE_LIMIT","status":429,"providerRetryAfterMs":1500}}}])
            )
        );
    }

    #[test]
    fn bad_entries_are_refused() {
        for (bad, want) in [
            (json!({"text":"a","hang":"b"}), "2 reply kinds"),
            (json!({}), "0 reply kinds"),
            (json!({"text":"a","bogus":1}), "unknown field"),
            (json!({"text":"a","gate_after_chunks":2}), "no gate"),
            (json!({"text":"a","gate":""}), "gate name is empty"),
            (
                json!({"error":{"code":"X","message":""}}),
                "message must not be empty",
            ),
            (
                json!({"error":{"code":"X","message":"m","status":42}}),
                "status 42",
            ),
            (
                json!({"error":{"code":"X","message":"m","extra":1}}),
                "unknown field",
            ),
            (
                json!({"tool_calls":[{"id":"c","name":"n"}]}),
                "missing field",
            ),
        ] {
            let err = parse(bad.clone()).expect_err("invalid");
            assert!(err.contains(want), "{bad}: {err}");
        }
    }

    #[test]
    fn entries_round_trip_through_json() {
        for v in [
            json!({"text":"Hello","gate":"g1","gate_after_chunks":2}),
            json!({"text":"t","tool_calls":[{"id":"c1","name":"read","arguments":"{}"}]}),
            json!({"hang":"partial","gate":"g"}),
            json!({"chunks":[{"type":"usage","usage":{"inputTokens":1,"outputTokens":1}}]}),
        ] {
            let e = parse(v.clone()).expect("valid");
            assert_eq!(serde_json::to_value(&e).expect("serializable"), v);
        }
    }

    #[tokio::test]
    async fn consumes_entries_in_order_records_requests_and_reports_exhaustion() {
        let p = ScriptProvider::new(
            [ScriptEntry::text("a"), ScriptEntry::error("SERVER", "x")],
            Gates::new(),
        );
        assert_eq!(collect(&p).await.len(), 5);
        assert_eq!(collect(&p).await.len(), 1);
        assert_eq!(
            collect(&p).await,
            vec![StreamChunk::finish(FinishReason::Error {
                failure: LlmFailure::new("UNKNOWN", "script exhausted")
            })]
        );
        assert_eq!(p.requests().len(), 3);
        assert_eq!(p.remaining(), 0);
    }

    #[tokio::test]
    async fn raw_chunks_are_verbatim_without_an_added_finish() {
        let raw = chunks(json!([{"type":"block-start","index":0,"blockType":"text"}]));
        let p = ScriptProvider::new([ScriptEntry::chunks(raw.clone())], Gates::new());
        assert_eq!(collect(&p).await, raw);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_holds_the_stream_after_n_chunks_until_opened() {
        let gates = Gates::new();
        let p = ScriptProvider::new([ScriptEntry::text("abc").gate("g1", 2)], gates.clone());
        let mut s = p.stream(req(), CancellationToken::new());
        assert!(matches!(
            s.next().await,
            Some(StreamChunk::BlockStart { .. })
        ));
        assert!(matches!(
            s.next().await,
            Some(StreamChunk::TextDelta { .. })
        ));
        let held = tokio::time::timeout(std::time::Duration::from_secs(3600), s.next()).await;
        assert!(held.is_err(), "the stream must wait at the gate");
        assert!(!gates.is_open("g1"));
        gates.open("g1");
        assert!(gates.is_open("g1"));
        let rest: Vec<_> = s.collect().await;
        assert_eq!(rest.len(), 5);
        assert_eq!(rest.last(), Some(&StreamChunk::finish(FinishReason::Stop)));
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_ends_a_gated_or_hanging_stream_with_aborted() {
        let aborted = StreamChunk::finish(FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "request aborted by caller"),
        });
        let p = ScriptProvider::new(
            [
                ScriptEntry::text("abc").gate("never", 1),
                ScriptEntry::hang("part"),
                ScriptEntry::hang(""),
            ],
            Gates::new(),
        );
        for expected_before in [1usize, 2, 0] {
            let cancel = CancellationToken::new();
            let mut s = p.stream(req(), cancel.clone());
            let mut got = Vec::new();
            for _ in 0..expected_before {
                got.push(s.next().await.expect("chunk"));
            }
            let waiting =
                tokio::time::timeout(std::time::Duration::from_secs(3600), s.next()).await;
            assert!(waiting.is_err(), "stream must wait");
            cancel.cancel();
            assert_eq!(s.next().await, Some(aborted.clone()));
            assert_eq!(s.next().await, None);
        }
    }

    #[tokio::test]
    async fn gate_opened_before_waiting_does_not_block() {
        let gates = Gates::new();
        gates.open("g");
        gates.wait("g").await;
        let p = ScriptProvider::new([ScriptEntry::text("a").gate("g", 0)], gates);
        assert_eq!(collect(&p).await.len(), 5);
    }
}
