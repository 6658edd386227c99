//! The script entry format (SPEC §9 `model` entries): what each entry replies, its optional gate,
//! and the exact chunks it streams (listed in the parent module's docs). Parsing refuses unknown
//! fields and contradictory reply kinds.

use serde::{Deserialize, Serialize};

use crate::llm::types::{
    BlockType, ContentBlock, FinishReason, LlmFailure, StreamChunk, TokenUsage,
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
