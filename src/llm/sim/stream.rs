//! Pacing a planned reply out as chunks: the time to first token, then tokens at
//! `tokens_per_sec` in batches of about 20 ms against a fixed anchor (so sleeps do not drift), every
//! wait racing the cancel token. What is sent was fixed by the plan before the first chunk.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Plan, SimConfig, WORDS};
use crate::llm::provider::ChunkStream;
use crate::llm::types::{
    BlockType, ContentBlock, FinishReason, LlmFailure, StreamChunk, TokenUsage, codes,
};

/// Streams `plan` with `config`'s pacing until it ends or `cancel` fires.
pub(super) fn start(plan: Plan, config: &SimConfig, cancel: CancellationToken) -> ChunkStream {
    let mut segments = Vec::with_capacity(2);
    if plan.reasoning_tokens > 0 {
        segments.push(Segment::Reasoning(plan.reasoning_tokens));
    }
    if plan.text_tokens > 0 {
        segments.push(Segment::Text(plan.text_tokens));
    }
    if plan.call.is_some() {
        segments.push(Segment::Call);
    }
    let tokens_per_sec = config.tokens_per_sec;
    let stream = SimStream {
        batch: tokens_per_sec.div_ceil(50).max(1),
        tokens_per_sec,
        ttft: Duration::from_millis(config.ttft_ms),
        plan,
        segments,
        segment_idx: 0,
        sub: Sub::Start,
        acc: String::new(),
        n_tokens: 0,
        anchor: None,
        cancel,
        ended: false,
    };
    Box::pin(futures::stream::unfold(stream, |mut s| async move {
        let chunk = s.next().await?;
        Some((chunk, s))
    }))
}

#[derive(Clone, Copy, Debug)]
enum Segment {
    Reasoning(u32),
    Text(u32),
    Call,
}

/// Where the current segment is.
#[derive(Clone, Copy, Debug)]
enum Sub {
    Start,
    /// Deltas left to send (a call sends two).
    Body(u32),
    End,
}

struct SimStream {
    plan: Plan,
    segments: Vec<Segment>,
    segment_idx: usize,
    sub: Sub,
    /// The current block's text so far (for its `block-end`).
    acc: String,
    /// Tokens sent, for pacing and usage.
    n_tokens: u64,
    tokens_per_sec: u64,
    /// Tokens per pacing sleep.
    batch: u64,
    ttft: Duration,
    /// When the first chunk went out; `None` before the time to first token elapsed.
    anchor: Option<Instant>,
    cancel: CancellationToken,
    ended: bool,
}

impl SimStream {
    fn abort(&mut self) -> Option<StreamChunk> {
        self.ended = true;
        Some(StreamChunk::finish(FinishReason::Aborted {
            failure: LlmFailure::new(codes::ABORTED, "request aborted by caller"),
        }))
    }

    /// Sleeps until `at` unless cancelled first; false when cancelled.
    async fn sleep_until(&self, at: Instant) -> bool {
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => false,
            () = tokio::time::sleep_until(at) => true,
        }
    }

    /// Counts one token and sleeps when a batch is due; false when cancelled.
    async fn pace(&mut self) -> bool {
        self.n_tokens += 1;
        if self.tokens_per_sec == 0 || !self.n_tokens.is_multiple_of(self.batch) {
            return true;
        }
        let Some(anchor) = self.anchor else {
            return true;
        };
        let due =
            anchor + Duration::from_secs_f64(self.n_tokens as f64 / self.tokens_per_sec as f64);
        self.sleep_until(due).await
    }

    fn word(&mut self) -> &'static str {
        WORDS[self.plan.words.below(WORDS.len() as u64) as usize]
    }

    async fn next(&mut self) -> Option<StreamChunk> {
        if self.ended {
            return None;
        }
        if self.cancel.is_cancelled() {
            return self.abort();
        }
        if self.anchor.is_none() {
            let start = Instant::now();
            if !self.ttft.is_zero() && !self.sleep_until(start + self.ttft).await {
                return self.abort();
            }
            self.anchor = Some(Instant::now());
        }
        let Some(segment) = self.segments.get(self.segment_idx).copied() else {
            return self.finish_chunks();
        };
        let index = self.segment_idx as u32;
        match (segment, self.sub) {
            (segment, Sub::Start) => {
                let (block_type, n) = match segment {
                    Segment::Reasoning(n) => (BlockType::Reasoning, n),
                    Segment::Text(n) => (BlockType::Text, n),
                    Segment::Call => (BlockType::ToolCall, 2),
                };
                self.sub = Sub::Body(n);
                Some(StreamChunk::BlockStart { index, block_type })
            }
            (segment, Sub::Body(left)) => {
                if !self.pace().await {
                    return self.abort();
                }
                self.sub = if left > 1 {
                    Sub::Body(left - 1)
                } else {
                    Sub::End
                };
                match segment {
                    Segment::Reasoning(_) | Segment::Text(_) => {
                        let word = self.word();
                        // A space before every word but the first (not `format!`: this runs once
                        // per simulated token, on the runtime's threads).
                        let mut text = String::with_capacity(word.len() + 1);
                        if !self.acc.is_empty() {
                            text.push(' ');
                        }
                        text.push_str(word);
                        self.acc.push_str(&text);
                        Some(if matches!(segment, Segment::Reasoning(_)) {
                            StreamChunk::ReasoningDelta { index, text }
                        } else {
                            StreamChunk::TextDelta { index, text }
                        })
                    }
                    Segment::Call => {
                        let call = self.plan.call.as_ref()?;
                        let half = call.arguments.len() / 2;
                        // Arguments are JSON text from `serde_json`; split at a char boundary.
                        let split = (0..=half)
                            .rev()
                            .find(|i| call.arguments.is_char_boundary(*i))
                            .unwrap_or(0);
                        Some(if left == 2 {
                            StreamChunk::ToolCallDelta {
                                index,
                                id: call.id.clone(),
                                name: Some(call.name.clone()),
                                arguments_delta: call.arguments[..split].to_owned(),
                            }
                        } else {
                            StreamChunk::ToolCallDelta {
                                index,
                                id: call.id.clone(),
                                name: None,
                                arguments_delta: call.arguments[split..].to_owned(),
                            }
                        })
                    }
                }
            }
            (segment, Sub::End) => {
                self.sub = Sub::Start;
                self.segment_idx += 1;
                let text = std::mem::take(&mut self.acc);
                let block = match segment {
                    Segment::Reasoning(_) => ContentBlock::Reasoning { text },
                    Segment::Text(_) => ContentBlock::Text { text },
                    Segment::Call => {
                        let call = self.plan.call.clone()?;
                        ContentBlock::ToolCall {
                            id: call.id,
                            name: call.name,
                            arguments: call.arguments,
                        }
                    }
                };
                Some(StreamChunk::BlockEnd { index, block })
            }
        }
    }

    /// After the last block: usage, then finish, then the end.
    fn finish_chunks(&mut self) -> Option<StreamChunk> {
        if self.segment_idx == self.segments.len() {
            self.segment_idx += 1;
            let call_tokens = self
                .plan
                .call
                .as_ref()
                .map_or(0, |c| c.arguments.len() as u64 / 4 + 1);
            let reasoning = u64::from(self.plan.reasoning_tokens);
            return Some(StreamChunk::Usage {
                usage: TokenUsage {
                    input_tokens: self.plan.input_tokens,
                    output_tokens: reasoning + u64::from(self.plan.text_tokens) + call_tokens,
                    reasoning_tokens: (reasoning > 0).then_some(reasoning),
                    ..TokenUsage::default()
                },
            });
        }
        self.ended = true;
        Some(StreamChunk::finish(if self.plan.call.is_some() {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        }))
    }
}
