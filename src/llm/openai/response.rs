//! The response stream (`reference/session-llm.md` §7.3–§7.4): each server-sent event's JSON
//! payload translated into `StreamChunk`s, and `ChunkDecoder`, which chains the generic SSE framing
//! (`llm::sse::SseDecoder`) to that translation: bytes in, chunks out.
//!
//! `Translator` emits at most one reasoning and one text block per response, one tool-call block
//! per wire `tool_calls[].index` (several may interleave), indexes allocated in order of first
//! appearance; every `block-end`, the `usage` and the single `finish` are deferred to `[DONE]`. What
//! it accumulates is bounded: blocks per response (`Limits::content_blocks_max`), one call's
//! argument bytes (`Limits::tool_arguments_bytes_max`) and the whole assembled reply
//! (`Limits::event_bytes_max`, since the reply must fit in one log event).
//!
//! Pure and push-based, so it is tested and measured (`benches/sse.rs`) without a socket; the
//! stream (`stream.rs`) feeds it the response body.

use std::borrow::Cow;

use serde::Deserialize;

use crate::limits::Limits;
use crate::llm::sse::{SseDecoder, SseError, SseItem};
use crate::llm::types::{
    BlockType, ContentBlock, FinishReason, LlmFailure, StreamChunk, TokenUsage, codes,
};

/// Why a response stream could not be decoded: its framing broke (`Sse`) or a payload did. Every
/// variant maps to a failure code (`ResponseError::failure`); none carries more than a short prefix
/// of what the server sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResponseError {
    /// The server-sent-events framing broke a bound or ended without `[DONE]`.
    #[error(transparent)]
    Sse(#[from] SseError),
    /// A payload that is not a chat-completions chunk.
    #[error("malformed SSE payload: {shown}")]
    MalformedPayload {
        /// At most the first 120 characters of the payload.
        shown: String,
    },
    /// More content blocks than `Limits::content_blocks_max`.
    #[error("response opened {n_blocks} blocks, the limit is {blocks_max}")]
    TooManyBlocks {
        /// Blocks the response would have opened.
        n_blocks: usize,
        /// The bound.
        blocks_max: usize,
    },
    /// One tool call's arguments over `Limits::tool_arguments_bytes_max`.
    #[error("tool call arguments are at least {bytes} bytes, the limit is {bytes_max}")]
    ToolArgumentsTooLarge {
        /// The arguments' size so far.
        bytes: usize,
        /// The bound.
        bytes_max: usize,
    },
    /// The assembled reply over `Limits::event_bytes_max`.
    #[error("response content is at least {bytes} bytes, the limit is {bytes_max}")]
    ResponseTooLarge {
        /// The reply's size so far.
        bytes: usize,
        /// The bound.
        bytes_max: usize,
    },
}

impl ResponseError {
    /// The in-band failure for this error: `STREAM_CLOSED` for a stream without `[DONE]`,
    /// `MALFORMED_RESPONSE` for everything else (a server that breaks the format or a bound is broken
    /// or hostile; retrying it would send the same paid request again).
    pub fn failure(&self) -> LlmFailure {
        match self {
            ResponseError::Sse(SseError::ClosedWithoutDone) => {
                LlmFailure::new(codes::STREAM_CLOSED, "SSE stream ended without [DONE]")
            }
            other => LlmFailure::new(codes::MALFORMED_RESPONSE, other.to_string()),
        }
    }
}

#[derive(Deserialize)]
struct WireChunk<'a> {
    #[serde(default, borrow)]
    choices: Option<Vec<WireChoice<'a>>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice<'a> {
    #[serde(default, borrow)]
    delta: Option<WireDelta<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<WireToolCall<'a>>>,
}

#[derive(Deserialize)]
struct WireToolCall<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    function: Option<WireFunction<'a>>,
}

#[derive(Deserialize)]
struct WireFunction<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<WirePromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<WireCompletionDetails>,
}

#[derive(Deserialize)]
struct WirePromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WireCompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    /// §7.4: `input = prompt − cacheRead` (DeepSeek's prompt count includes cache hits), the cache
    /// figure from the details object before DeepSeek's own field, optional fields only when present.
    fn to_usage(&self) -> TokenUsage {
        let cache_read = self
            .prompt_tokens_details
            .as_ref()
            .and_then(|d| d.cached_tokens)
            .or(self.prompt_cache_hit_tokens);
        TokenUsage {
            input_tokens: self
                .prompt_tokens
                .unwrap_or(0)
                .saturating_sub(cache_read.unwrap_or(0)),
            output_tokens: self.completion_tokens.unwrap_or(0),
            cache_read_tokens: cache_read,
            cache_write_tokens: None,
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens),
        }
    }
}

/// One block the translator opened, in opening order (its position is its chunk index).
#[derive(Debug, Clone)]
enum OpenBlock {
    Text(String),
    Reasoning(String),
    ToolCall {
        /// The `tool_calls[].index` the server addresses this call by.
        wire_index: u64,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
}

/// Translates one response's JSON payloads into chunks. See the module docs.
#[derive(Debug, Clone)]
pub struct Translator {
    /// Invariant: `blocks.len() <= blocks_max`; `text_idx`/`reasoning_idx` point at blocks of that kind.
    blocks: Vec<OpenBlock>,
    text_idx: Option<u32>,
    reasoning_idx: Option<u32>,
    usage: Option<TokenUsage>,
    finish: Option<FinishReason>,
    /// Bytes of text, reasoning and arguments accumulated over all blocks.
    ///
    /// Invariant: `content_bytes <= content_bytes_max`.
    content_bytes: usize,
    content_bytes_max: usize,
    blocks_max: usize,
    tool_arguments_bytes_max: usize,
}

impl Translator {
    /// A translator for one response, bounded by `limits` (blocks, argument bytes, content bytes).
    pub fn new(limits: &Limits) -> Translator {
        Translator {
            blocks: Vec::new(),
            text_idx: None,
            reasoning_idx: None,
            usage: None,
            finish: None,
            content_bytes: 0,
            content_bytes_max: limits.event_bytes_max,
            blocks_max: limits.content_blocks_max,
            tool_arguments_bytes_max: limits.tool_arguments_bytes_max,
        }
    }

    /// Translates one event payload, appending its chunks (block starts and deltas) to `out`.
    ///
    /// # Errors
    /// `MalformedPayload` when the payload is not a chat-completion chunk, or a bound breach; chunks of
    /// the payload produced before the breach are already in `out`.
    pub fn push_data(
        &mut self,
        payload: &str,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ResponseError> {
        let chunk: WireChunk<'_> =
            serde_json::from_str(payload).map_err(|_| ResponseError::MalformedPayload {
                shown: payload.chars().take(120).collect(),
            })?;
        for choice in chunk.choices.iter().flatten() {
            if let Some(delta) = &choice.delta {
                if let Some(text) = delta.reasoning_content.as_deref()
                    && !text.is_empty()
                {
                    let index = self.open_single(BlockType::Reasoning, out)?;
                    self.append_single(index, text)?;
                    out.push(StreamChunk::ReasoningDelta {
                        index,
                        text: text.to_owned(),
                    });
                }
                if let Some(text) = delta.content.as_deref()
                    && !text.is_empty()
                {
                    let index = self.open_single(BlockType::Text, out)?;
                    self.append_single(index, text)?;
                    out.push(StreamChunk::TextDelta {
                        index,
                        text: text.to_owned(),
                    });
                }
                for (position, call) in delta.tool_calls.iter().flatten().enumerate() {
                    self.tool_call_delta(position, call, out)?;
                }
            }
            if let Some(reason) = choice.finish_reason.as_deref() {
                self.finish = Some(map_finish_reason(reason));
            }
        }
        if let Some(usage) = &chunk.usage {
            self.usage = Some(usage.to_usage());
        }
        Ok(())
    }

    /// Ends the response at `[DONE]`: a `block-end` per opened block in opening order, the usage if
    /// any arrived, then exactly one `finish` (a content-less `stop` is `EMPTY_RESPONSE`).
    pub fn done(&mut self, out: &mut Vec<StreamChunk>) {
        let n_blocks = self.blocks.len();
        for (index, block) in std::mem::take(&mut self.blocks).into_iter().enumerate() {
            let block = match block {
                OpenBlock::Text(text) => ContentBlock::Text { text },
                OpenBlock::Reasoning(text) => ContentBlock::Reasoning { text },
                OpenBlock::ToolCall {
                    id,
                    name,
                    arguments,
                    ..
                } => ContentBlock::ToolCall {
                    id: id.unwrap_or_default(),
                    name: name.unwrap_or_default(),
                    arguments,
                },
            };
            out.push(StreamChunk::BlockEnd {
                index: index_u32(index),
                block,
            });
        }
        if let Some(usage) = self.usage.take() {
            out.push(StreamChunk::Usage { usage });
        }
        let reason = match self.finish.take().unwrap_or(FinishReason::Stop) {
            FinishReason::Stop if n_blocks == 0 => FinishReason::Error {
                failure: LlmFailure::new(
                    codes::EMPTY_RESPONSE,
                    "model returned a completed response with no content",
                ),
            },
            reason => reason,
        };
        out.push(StreamChunk::finish(reason));
    }

    fn open(
        &mut self,
        block: OpenBlock,
        block_type: BlockType,
        out: &mut Vec<StreamChunk>,
    ) -> Result<u32, ResponseError> {
        if self.blocks.len() >= self.blocks_max {
            return Err(ResponseError::TooManyBlocks {
                n_blocks: self.blocks.len() + 1,
                blocks_max: self.blocks_max,
            });
        }
        let index = index_u32(self.blocks.len());
        self.blocks.push(block);
        out.push(StreamChunk::BlockStart { index, block_type });
        Ok(index)
    }

    fn open_single(
        &mut self,
        block_type: BlockType,
        out: &mut Vec<StreamChunk>,
    ) -> Result<u32, ResponseError> {
        let slot = match block_type {
            BlockType::Reasoning => self.reasoning_idx,
            _ => self.text_idx,
        };
        if let Some(index) = slot {
            return Ok(index);
        }
        let block = match block_type {
            BlockType::Reasoning => OpenBlock::Reasoning(String::new()),
            _ => OpenBlock::Text(String::new()),
        };
        let is_reasoning = block_type == BlockType::Reasoning;
        let index = self.open(block, block_type, out)?;
        if is_reasoning {
            self.reasoning_idx = Some(index);
        } else {
            self.text_idx = Some(index);
        }
        Ok(index)
    }

    fn count_content(&mut self, n_bytes: usize) -> Result<(), ResponseError> {
        let bytes = self.content_bytes + n_bytes;
        if bytes > self.content_bytes_max {
            return Err(ResponseError::ResponseTooLarge {
                bytes,
                bytes_max: self.content_bytes_max,
            });
        }
        self.content_bytes = bytes;
        Ok(())
    }

    fn append_single(&mut self, index: u32, text: &str) -> Result<(), ResponseError> {
        self.count_content(text.len())?;
        match self.blocks.get_mut(index as usize) {
            Some(OpenBlock::Text(acc) | OpenBlock::Reasoning(acc)) => acc.push_str(text),
            // `open_single` returns only indexes of text/reasoning blocks.
            _ => unreachable!("single-block index {index} addresses a tool call"),
        }
        Ok(())
    }

    fn tool_call_delta(
        &mut self,
        position: usize,
        call: &WireToolCall<'_>,
        out: &mut Vec<StreamChunk>,
    ) -> Result<(), ResponseError> {
        // A server that omits `index` addresses calls by their position in the array.
        let wire_index = call.index.unwrap_or(position as u64);
        let found = self.blocks.iter().position(
            |b| matches!(b, OpenBlock::ToolCall { wire_index: w, .. } if *w == wire_index),
        );
        let index = match found {
            Some(i) => index_u32(i),
            None => self.open(
                OpenBlock::ToolCall {
                    wire_index,
                    id: None,
                    name: None,
                    arguments: String::new(),
                },
                BlockType::ToolCall,
                out,
            )?,
        };
        let fragment = call
            .function
            .as_ref()
            .and_then(|f| f.arguments.as_deref())
            .unwrap_or("");
        let new_id = call.id.as_deref().filter(|s| !s.is_empty());
        let new_name = call
            .function
            .as_ref()
            .and_then(|f| f.name.as_deref())
            .filter(|s| !s.is_empty());
        let extra = fragment.len() + new_id.map_or(0, str::len) + new_name.map_or(0, str::len);
        self.count_content(extra)?;
        let tool_arguments_bytes_max = self.tool_arguments_bytes_max;
        let Some(OpenBlock::ToolCall {
            id,
            name,
            arguments,
            ..
        }) = self.blocks.get_mut(index as usize)
        else {
            unreachable!("tool-call index {index} addresses another block kind");
        };
        if arguments.len() + fragment.len() > tool_arguments_bytes_max {
            return Err(ResponseError::ToolArgumentsTooLarge {
                bytes: arguments.len() + fragment.len(),
                bytes_max: tool_arguments_bytes_max,
            });
        }
        if let Some(new_id) = new_id {
            *id = Some(new_id.to_owned());
        }
        if let Some(new_name) = new_name {
            *name = Some(new_name.to_owned());
        }
        arguments.push_str(fragment);
        out.push(StreamChunk::ToolCallDelta {
            index,
            id: id.clone().unwrap_or_default(),
            name: name.clone(),
            arguments_delta: fragment.to_owned(),
        });
        Ok(())
    }
}

/// Block positions are bounded by `Limits::content_blocks_max`, far below `u32::MAX`.
fn index_u32(position: usize) -> u32 {
    u32::try_from(position).expect("block count is bounded by content_blocks_max")
}

/// §7.4 finish mapping: `stop`, `tool_calls`, `length`, anything else an error with the wire reason
/// upper-cased as its code.
fn map_finish_reason(reason: &str) -> FinishReason {
    match reason {
        "stop" => FinishReason::Stop,
        "tool_calls" => FinishReason::ToolCalls,
        "length" => FinishReason::MaxTokens,
        other => {
            let shown: String = other.chars().take(120).collect();
            let code = if shown.is_empty() {
                codes::UNKNOWN.to_owned()
            } else {
                shown.to_uppercase()
            };
            FinishReason::Error {
                failure: LlmFailure::new(&code, format!("model stopped: {shown}")),
            }
        }
    }
}

/// What one `ChunkDecoder::feed` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FeedOutcome {
    /// `[DONE]` arrived and the final chunks (ending with `finish`) were emitted.
    pub done: bool,
    /// Comment lines seen (keep-alives).
    pub n_comments: usize,
}

/// `SseDecoder` chained to `Translator`: bytes in, chunks out.
#[derive(Debug, Clone)]
pub struct ChunkDecoder {
    decoder: SseDecoder,
    translator: Translator,
    /// Items of the current feed; kept to reuse its allocation.
    items: Vec<SseItem>,
}

impl ChunkDecoder {
    /// A decoder for one response body, bounded by `limits` (SSE lines and events, and the
    /// translator's bounds).
    pub fn new(limits: &Limits) -> ChunkDecoder {
        ChunkDecoder {
            decoder: SseDecoder::new(limits),
            translator: Translator::new(limits),
            items: Vec::new(),
        }
    }

    /// Decodes and translates `bytes`, appending chunks to `out`. After `done`, later bytes are
    /// ignored.
    ///
    /// # Errors
    /// Any `SseError`; chunks translated before it are already in `out`, and the caller ends the
    /// stream with `ResponseError::failure`.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        out: &mut Vec<StreamChunk>,
    ) -> Result<FeedOutcome, ResponseError> {
        if self.decoder.is_done() {
            return Ok(FeedOutcome {
                done: true,
                n_comments: 0,
            });
        }
        self.items.clear();
        let decoded = self.decoder.feed_into(bytes, &mut self.items);
        let mut outcome = FeedOutcome::default();
        for item in self.items.drain(..) {
            match item {
                SseItem::Data(payload) => self.translator.push_data(&payload, out)?,
                SseItem::Comment(_) => outcome.n_comments += 1,
                SseItem::Done => {
                    self.translator.done(out);
                    outcome.done = true;
                }
            }
        }
        decoded?;
        Ok(outcome)
    }

    /// Ends the body.
    ///
    /// # Errors
    /// `ClosedWithoutDone` unless `[DONE]` arrived.
    pub fn finish(&mut self) -> Result<(), ResponseError> {
        Ok(self.decoder.finish()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn translate(payloads: &[serde_json::Value]) -> Vec<StreamChunk> {
        let mut t = Translator::new(&Limits::DEFAULT);
        let mut out = Vec::new();
        for p in payloads {
            t.push_data(&p.to_string(), &mut out)
                .expect("valid payload");
        }
        t.done(&mut out);
        out
    }

    fn chunks(value: serde_json::Value) -> Vec<StreamChunk> {
        serde_json::from_value(value).expect("valid chunk json")
    }

    fn text_payload(text: &str) -> serde_json::Value {
        json!({"choices":[{"delta":{"content":text}}]})
    }

    // §9.27.1, §7.6 minimal stream
    #[test]
    fn streams_a_text_block_and_defers_finish_to_done() {
        let out = translate(&[
            json!({"choices":[{"delta":{"role":"assistant","content":null,"reasoning_content":""}}]}),
            text_payload("Hel"),
            text_payload("lo"),
            json!({"choices":[{"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}),
        ]);
        assert_eq!(
            out,
            chunks(json!([
                {"type":"block-start","index":0,"blockType":"text"},
                {"type":"text-delta","index":0,"text":"Hel"},
                {"type":"text-delta","index":0,"text":"lo"},
                {"type":"block-end","index":0,"block":{"type":"text","text":"Hello"}},
                {"type":"usage","usage":{"inputTokens":5,"outputTokens":2}},
                {"type":"finish","reason":{"kind":"stop"}}
            ]))
        );
    }

    // §9.27.3, §9.27.5
    #[test]
    fn no_reasoning_block_for_the_empty_signature_or_an_absent_field() {
        let out = translate(&[
            json!({"choices":[{"delta":{"role":"assistant","content":null,"reasoning_content":""}}]}),
            json!({"choices":[{"delta":{"content":"x"}}]}),
        ]);
        assert_eq!(
            out[0],
            StreamChunk::BlockStart {
                index: 0,
                block_type: BlockType::Text
            }
        );
        assert_eq!(out.len(), 4);
    }

    // §9.27.4
    #[test]
    fn streams_reasoning_then_text_as_separate_blocks() {
        let out = translate(&[
            json!({"choices":[{"delta":{"reasoning_content":"think"}}]}),
            json!({"choices":[{"delta":{"reasoning_content":"ing"}}]}),
            text_payload("answer"),
            json!({"choices":[{"delta":{},"finish_reason":"stop"}]}),
        ]);
        assert_eq!(
            out,
            chunks(json!([
                {"type":"block-start","index":0,"blockType":"reasoning"},
                {"type":"reasoning-delta","index":0,"text":"think"},
                {"type":"reasoning-delta","index":0,"text":"ing"},
                {"type":"block-start","index":1,"blockType":"text"},
                {"type":"text-delta","index":1,"text":"answer"},
                {"type":"block-end","index":0,"block":{"type":"reasoning","text":"thinking"}},
                {"type":"block-end","index":1,"block":{"type":"text","text":"answer"}},
                {"type":"finish","reason":{"kind":"stop"}}
            ]))
        );
    }

    // §9.27.6
    #[test]
    fn reassembles_a_tool_call_from_fragmented_argument_deltas() {
        let out = translate(&[
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_00_x","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\""}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":": \"Paris\"}"}}]}}]}),
            json!({"choices":[{"delta":{"content":""},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":28,"completion_tokens":6}}),
        ]);
        assert_eq!(
            out,
            chunks(json!([
                {"type":"block-start","index":0,"blockType":"tool-call"},
                {"type":"tool-call-delta","index":0,"id":"call_00_x","name":"get_weather","argumentsDelta":""},
                {"type":"tool-call-delta","index":0,"id":"call_00_x","name":"get_weather","argumentsDelta":"{\"city\""},
                {"type":"tool-call-delta","index":0,"id":"call_00_x","name":"get_weather","argumentsDelta":": \"Paris\"}"},
                {"type":"block-end","index":0,"block":{"type":"tool-call","id":"call_00_x","name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
                {"type":"usage","usage":{"inputTokens":28,"outputTokens":6}},
                {"type":"finish","reason":{"kind":"tool-calls"}}
            ]))
        );
    }

    // §9.27.7, §9.27.8
    #[test]
    fn parallel_calls_by_wire_index_interleaved_with_text() {
        let out = translate(&[
            text_payload("ok"),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}},{"index":1,"id":"b","function":{"name":"g","arguments":"["}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":"]"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]}}]}),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        ]);
        let ends: Vec<_> = out
            .iter()
            .filter(|c| matches!(c, StreamChunk::BlockEnd { .. }))
            .cloned()
            .collect();
        assert_eq!(
            ends,
            chunks(json!([
                {"type":"block-end","index":0,"block":{"type":"text","text":"ok"}},
                {"type":"block-end","index":1,"block":{"type":"tool-call","id":"a","name":"f","arguments":"{}"}},
                {"type":"block-end","index":2,"block":{"type":"tool-call","id":"b","name":"g","arguments":"[]"}}
            ]))
        );
        assert_eq!(
            out[5],
            StreamChunk::ToolCallDelta {
                index: 2,
                id: "b".into(),
                name: Some("g".into()),
                arguments_delta: "[".into()
            }
        );
        assert_eq!(
            out[6],
            StreamChunk::ToolCallDelta {
                index: 2,
                id: "b".into(),
                name: Some("g".into()),
                arguments_delta: "]".into()
            }
        );
    }

    // §9.27.9, §9.27.10
    #[test]
    fn usage_from_a_trailing_chunk_and_last_usage_wins() {
        let out = translate(&[
            text_payload("x"),
            json!({"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}),
            json!({"choices":[],"usage":null}),
            json!({"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}),
        ]);
        assert_eq!(
            out[out.len() - 2],
            StreamChunk::Usage {
                usage: TokenUsage {
                    input_tokens: 9,
                    output_tokens: 4,
                    ..TokenUsage::default()
                }
            }
        );
    }

    // §9.27.11, §9.27.12
    #[test]
    fn defaults_to_stop_and_omits_missing_usage() {
        let out = translate(&[text_payload("x")]);
        assert_eq!(
            out,
            chunks(json!([
                {"type":"block-start","index":0,"blockType":"text"},
                {"type":"text-delta","index":0,"text":"x"},
                {"type":"block-end","index":0,"block":{"type":"text","text":"x"}},
                {"type":"finish","reason":{"kind":"stop"}}
            ]))
        );
    }

    // §9.27.13, §9.27.14
    #[test]
    fn a_stop_without_blocks_is_empty_response_after_usage() {
        assert_eq!(
            translate(&[json!({})]),
            chunks(
                json!([{"type":"finish","reason":{"kind":"error","failure":{"message":"model returned a completed response with no content","code":"EMPTY_RESPONSE"}}}])
            )
        );
        let out = translate(&[
            json!({"choices":[{"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":0}}),
        ]);
        assert_eq!(out.len(), 2);
        assert!(matches!(out[0], StreamChunk::Usage { .. }));
        assert_eq!(
            out[1].clone(),
            chunks(
                json!([{"type":"finish","reason":{"kind":"error","failure":{"message":"model returned a completed response with no content","code":"EMPTY_RESPONSE"}}}])
            )[0]
        );
    }

    // §9.27.15, §9.27.16
    #[test]
    fn reasoning_only_is_a_stop_and_length_without_blocks_stays_max_tokens() {
        let out = translate(&[
            json!({"choices":[{"delta":{"reasoning_content":"hm"},"finish_reason":"stop"}]}),
        ]);
        assert_eq!(out.last(), Some(&StreamChunk::finish(FinishReason::Stop)));
        let out = translate(&[json!({"choices":[{"delta":{},"finish_reason":"length"}]})]);
        assert_eq!(out, vec![StreamChunk::finish(FinishReason::MaxTokens)]);
    }

    // §9.27.17
    #[test]
    fn malformed_json_is_malformed_response() {
        let mut t = Translator::new(&Limits::DEFAULT);
        let err = t
            .push_data("{not-json", &mut Vec::new())
            .expect_err("invalid");
        assert_eq!(
            err,
            ResponseError::MalformedPayload {
                shown: "{not-json".into()
            }
        );
        let failure = err.failure();
        assert_eq!(failure.code, "MALFORMED_RESPONSE");
        assert_eq!(failure.message, "malformed SSE payload: {not-json");
        // A payload of the wrong shape is malformed too (the original reported a TypeError).
        let err = t
            .push_data("{\"choices\":[null]}", &mut Vec::new())
            .expect_err("bad shape");
        assert_eq!(err.failure().code, "MALFORMED_RESPONSE");
        let long = format!("\"{}", "é".repeat(500));
        let err = t.push_data(&long, &mut Vec::new()).expect_err("invalid");
        assert_eq!(
            err,
            ResponseError::MalformedPayload {
                shown: long.chars().take(120).collect()
            }
        );
    }

    // §9.27.19, §9.27.20
    #[test]
    fn maps_finish_reasons() {
        assert_eq!(map_finish_reason("stop"), FinishReason::Stop);
        assert_eq!(map_finish_reason("tool_calls"), FinishReason::ToolCalls);
        assert_eq!(map_finish_reason("length"), FinishReason::MaxTokens);
        for (wire, code) in [
            ("content_filter", "CONTENT_FILTER"),
            (
                "insufficient_system_resource",
                "INSUFFICIENT_SYSTEM_RESOURCE",
            ),
            ("mystery_reason", "MYSTERY_REASON"),
        ] {
            assert_eq!(
                map_finish_reason(wire),
                FinishReason::Error {
                    failure: LlmFailure::new(code, format!("model stopped: {wire}"))
                }
            );
        }
    }

    // §9.27.21, §9.27.22, §9.27.23
    #[test]
    fn maps_usage_shapes() {
        let full: WireUsage = serde_json::from_value(json!({"prompt_tokens":283,"completion_tokens":69,"prompt_cache_hit_tokens":256,"prompt_cache_miss_tokens":27,"prompt_tokens_details":{"cached_tokens":256},"completion_tokens_details":{"reasoning_tokens":24}})).expect("valid");
        assert_eq!(
            full.to_usage(),
            TokenUsage {
                input_tokens: 27,
                output_tokens: 69,
                cache_read_tokens: Some(256),
                cache_write_tokens: None,
                reasoning_tokens: Some(24)
            }
        );
        let hit: WireUsage = serde_json::from_value(
            json!({"prompt_tokens":10,"completion_tokens":2,"prompt_cache_hit_tokens":8}),
        )
        .expect("valid");
        assert_eq!(
            hit.to_usage(),
            TokenUsage {
                input_tokens: 2,
                output_tokens: 2,
                cache_read_tokens: Some(8),
                ..TokenUsage::default()
            }
        );
        let bare: WireUsage =
            serde_json::from_value(json!({"prompt_tokens":3,"completion_tokens":1}))
                .expect("valid");
        assert_eq!(
            serde_json::to_value(bare.to_usage()).expect("serializable"),
            json!({"inputTokens":3,"outputTokens":1})
        );
    }

    // §9.27.24, §9.27.25, §9.27.26
    #[test]
    fn tool_deltas_without_id_name_or_arguments_fall_back_to_empty_strings() {
        let out = translate(&[
            json!({"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"","function":{}}]}}]}),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        ]);
        assert_eq!(
            out,
            chunks(json!([
                {"type":"block-start","index":0,"blockType":"tool-call"},
                {"type":"tool-call-delta","index":0,"id":"","argumentsDelta":""},
                {"type":"tool-call-delta","index":0,"id":"","argumentsDelta":""},
                {"type":"block-end","index":0,"block":{"type":"tool-call","id":"","name":"","arguments":""}},
                {"type":"finish","reason":{"kind":"tool-calls"}}
            ]))
        );
    }

    #[test]
    fn bounds_blocks_arguments_and_content() {
        let limits = Limits {
            content_blocks_max: 2,
            tool_arguments_bytes_max: 4,
            event_bytes_max: 64,
            ..Limits::DEFAULT
        };
        let mut t = Translator::new(&limits);
        let mut out = Vec::new();
        let three =
            json!({"choices":[{"delta":{"tool_calls":[{"index":0},{"index":1},{"index":2}]}}]});
        assert_eq!(
            t.push_data(&three.to_string(), &mut out),
            Err(ResponseError::TooManyBlocks {
                n_blocks: 3,
                blocks_max: 2
            })
        );
        let mut t = Translator::new(&limits);
        let args = json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"12345"}}]}}]});
        assert_eq!(
            t.push_data(&args.to_string(), &mut out),
            Err(ResponseError::ToolArgumentsTooLarge {
                bytes: 5,
                bytes_max: 4
            })
        );
        let mut t = Translator::new(&limits);
        let big = text_payload(&"x".repeat(65));
        assert_eq!(
            t.push_data(&big.to_string(), &mut out),
            Err(ResponseError::ResponseTooLarge {
                bytes: 65,
                bytes_max: 64
            })
        );
    }

    #[test]
    fn chunk_decoder_emits_chunks_then_done() {
        let mut d = ChunkDecoder::new(&Limits::DEFAULT);
        let mut out = Vec::new();
        let outcome = d
            .feed(b": ping\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n", &mut out)
            .expect("valid");
        assert_eq!(
            outcome,
            FeedOutcome {
                done: true,
                n_comments: 1
            }
        );
        assert_eq!(out.len(), 4);
        assert_eq!(d.finish(), Ok(()));
    }

    // §9.26.4
    #[test]
    fn a_body_without_done_is_stream_closed() {
        let mut d = ChunkDecoder::new(&Limits::DEFAULT);
        let mut out = Vec::new();
        d.feed(b"data: {\"choices\":[]}\n\n", &mut out)
            .expect("valid");
        let err = d.finish().expect_err("no [DONE]");
        assert_eq!(err, ResponseError::Sse(SseError::ClosedWithoutDone));
        let failure = err.failure();
        assert_eq!(failure.code, "STREAM_CLOSED");
        assert_eq!(failure.message, "SSE stream ended without [DONE]");
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        fn event_text() -> impl Strategy<Value = String> {
            proptest::string::string_regex("[a-zé🌍 {}\":,]{0,12}").expect("valid regex")
        }

        fn wire_event() -> impl Strategy<Value = serde_json::Value> {
            prop_oneof![
                event_text().prop_map(|t| json!({"choices":[{"delta":{"content":t}}]})),
                event_text().prop_map(|t| json!({"choices":[{"delta":{"reasoning_content":t}}]})),
                (0u64..3, proptest::option::of("[a-z]{1,4}"), event_text()).prop_map(|(i, name, args)| {
                    let mut f = json!({"arguments": args});
                    if let Some(n) = name {
                        f["name"] = json!(n);
                    }
                    json!({"choices":[{"delta":{"tool_calls":[{"index":i,"id":format!("c{i}"),"function":f}]}}]})
                }),
                Just(json!({"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3}})),
                Just(json!({})),
            ]
        }

        proptest! {
            /// Whatever valid wire deltas arrive, the chunks follow the §6.4 grammar: blocks open
            /// at 0, 1, 2, … before any delta addresses them, deltas match their block's type, each
            /// block ends once (after all deltas) with the concatenation of its deltas, at most one
            /// usage, and exactly one finish, last.
            #[test]
            fn translated_chunks_follow_the_grammar(
                events in proptest::collection::vec(wire_event(), 0..24),
                finish in proptest::option::of(prop_oneof![Just("stop"), Just("length"), Just("tool_calls"), Just("content_filter")]),
            ) {
                let mut t = Translator::new(&Limits::DEFAULT);
                let mut out = Vec::new();
                for e in &events {
                    t.push_data(&e.to_string(), &mut out).expect("valid payload");
                }
                if let Some(reason) = finish {
                    let last = json!({"choices":[{"delta":{},"finish_reason":reason}],"usage":{"prompt_tokens":1,"completion_tokens":1}});
                    t.push_data(&last.to_string(), &mut out).expect("valid payload");
                }
                t.done(&mut out);
                let mut types: Vec<BlockType> = Vec::new();
                let mut acc: Vec<String> = Vec::new();
                let mut ended: Vec<bool> = Vec::new();
                let mut n_usage = 0;
                for (i, c) in out.iter().enumerate() {
                    match c {
                        StreamChunk::BlockStart { index, block_type } => {
                            prop_assert_eq!(*index as usize, types.len());
                            types.push(block_type.clone());
                            acc.push(String::new());
                            ended.push(false);
                        }
                        StreamChunk::TextDelta { index, text } | StreamChunk::ReasoningDelta { index, text } => {
                            let want = if matches!(c, StreamChunk::TextDelta { .. }) { BlockType::Text } else { BlockType::Reasoning };
                            prop_assert_eq!(types.get(*index as usize), Some(&want));
                            prop_assert!(!ended[*index as usize]);
                            acc[*index as usize].push_str(text);
                        }
                        StreamChunk::ToolCallDelta { index, arguments_delta, .. } => {
                            prop_assert_eq!(types.get(*index as usize), Some(&BlockType::ToolCall));
                            prop_assert!(!ended[*index as usize]);
                            acc[*index as usize].push_str(arguments_delta);
                        }
                        StreamChunk::BlockEnd { index, block } => {
                            let i = *index as usize;
                            prop_assert!(!ended[i]);
                            ended[i] = true;
                            let content = match block {
                                ContentBlock::Text { text } | ContentBlock::Reasoning { text } => text,
                                ContentBlock::ToolCall { arguments, .. } => arguments,
                                other => return Err(TestCaseError::fail(format!("unexpected block {other:?}"))),
                            };
                            prop_assert_eq!(block.type_tag(), types[i].as_str());
                            prop_assert_eq!(content, &acc[i]);
                        }
                        StreamChunk::Usage { .. } => n_usage += 1,
                        StreamChunk::Finish { .. } => prop_assert_eq!(i, out.len() - 1),
                    }
                }
                prop_assert!(ended.iter().all(|e| *e));
                prop_assert!(n_usage <= 1);
                prop_assert!(out.last().is_some_and(StreamChunk::is_finish));
                let n_text = types.iter().filter(|t| **t == BlockType::Text).count();
                let n_reasoning = types.iter().filter(|t| **t == BlockType::Reasoning).count();
                prop_assert!(n_text <= 1 && n_reasoning <= 1);
            }

            /// Arbitrary bytes never panic the decoder or the translator.
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let mut d = ChunkDecoder::new(&Limits::DEFAULT);
                let mut out = Vec::new();
                let _ = d.feed(&bytes, &mut out);
                let _ = d.finish();
            }
        }
    }
}
