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
//!
//! The parts: `entry` (the entry format and the chunks each entry streams), `gates` (named one-shot
//! gates, shared with the scenario runner's tools and hooks), and this module's `ScriptProvider`,
//! which replays entries in order.

mod entry;
mod gates;

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use crate::llm::provider::{ChunkStream, Provider};
use crate::llm::types::{FinishReason, LlmFailure, LlmRequest, StreamChunk, codes};

pub use entry::{ScriptEntry, ScriptError, ScriptReply, ScriptToolCall, ScriptedFailure};
pub use gates::Gates;

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
                gate: entry.gate_spec().map(|(g, n)| (g.to_owned(), n)),
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
            messages: Default::default(),
            session_id: None,
            purpose: None,
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
