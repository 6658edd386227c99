//! The streamed chunk grammar (`reference/session-llm.md` §6.4): `StreamChunk`, the block types it
//! opens, why a stream finished, and the token usage it reports. Their serde shapes are the session
//! log's (`assistant/chunk` events), and reading them back is on the hot path of a resume.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::{ContentBlock, LlmFailure};

/// The kind of block a `block-start` chunk opens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum BlockType {
    /// `text`: visible text.
    Text,
    /// `reasoning`: the model's thinking.
    Reasoning,
    /// `tool-call`: one tool call.
    ToolCall,
    /// A block type the runtime does not assemble (kept verbatim in the log).
    Other(String),
}

impl BlockType {
    /// The type as the log writes it (`text`, `reasoning`, `tool-call`, or the other name).
    pub fn as_str(&self) -> &str {
        match self {
            BlockType::Text => "text",
            BlockType::Reasoning => "reasoning",
            BlockType::ToolCall => "tool-call",
            BlockType::Other(s) => s,
        }
    }
}

impl Serialize for BlockType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for BlockType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(match s.as_str() {
            "text" => BlockType::Text,
            "reasoning" => BlockType::Reasoning,
            "tool-call" => BlockType::ToolCall,
            "" => return Err(D::Error::custom("blockType must not be empty")),
            _ => BlockType::Other(s),
        })
    }
}

/// One streamed chunk (the original's chunk grammar, `reference/session-llm.md` §6.4).
///
/// Deserialized through a flat record (`RawChunk`) rather than serde's internally tagged enums, which
/// buffer every field before dispatching: chunks are most of a log, so reading a log back (a wake,
/// a resume) is mostly parsing them.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum StreamChunk {
    /// A block opens at `index` (0, 1, 2, … in order).
    BlockStart {
        /// The block's position in the reply.
        index: u32,
        /// What kind of block it is.
        #[serde(rename = "blockType")]
        block_type: BlockType,
    },
    /// More text for the text block at `index`.
    TextDelta {
        /// The block addressed.
        index: u32,
        /// The text appended.
        text: String,
    },
    /// More reasoning for the reasoning block at `index`.
    ReasoningDelta {
        /// The block addressed.
        index: u32,
        /// The reasoning appended.
        text: String,
    },
    /// More of the tool call at `index`.
    ToolCallDelta {
        /// The block addressed.
        index: u32,
        /// The call id (repeated on every delta).
        id: String,
        /// The tool name, when this delta carries it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The piece of the argument string appended.
        #[serde(rename = "argumentsDelta")]
        arguments_delta: String,
    },
    /// The block at `index` is complete; `block` is all of it.
    BlockEnd {
        /// The block closed.
        index: u32,
        /// The whole block, deltas concatenated.
        block: ContentBlock,
    },
    /// The response's token counts (at most one per stream).
    Usage {
        /// The counts.
        usage: TokenUsage,
    },
    /// The stream's last chunk: why it ended.
    Finish {
        /// Why.
        reason: FinishReason,
        /// Opaque provider state, kept on the assistant message's source as `replayState`.
        #[serde(
            rename = "replayState",
            default,
            skip_serializing_if = "Option::is_none"
        )]
        replay_state: Option<Value>,
    },
}

/// Every field any chunk type has; `StreamChunk::deserialize` checks that exactly the fields of the
/// named type are present.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawChunk<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(default)]
    index: Option<u32>,
    #[serde(rename = "blockType", default)]
    block_type: Option<BlockType>,
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "argumentsDelta", default)]
    arguments_delta: Option<String>,
    #[serde(default)]
    block: Option<ContentBlock>,
    #[serde(default)]
    usage: Option<TokenUsage>,
    #[serde(default)]
    reason: Option<FinishReason>,
    #[serde(rename = "replayState", default)]
    replay_state: Option<Value>,
}

impl<'de> Deserialize<'de> for StreamChunk {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = RawChunk::deserialize(d)?;
        let kind = r.kind.as_ref();
        // Which optional fields are present, in declaration order.
        let present = [
            r.index.is_some(),
            r.block_type.is_some(),
            r.text.is_some(),
            r.id.is_some(),
            r.name.is_some(),
            r.arguments_delta.is_some(),
            r.block.is_some(),
            r.usage.is_some(),
            r.reason.is_some(),
            r.replay_state.is_some(),
        ];
        let only = |allowed: &[usize]| {
            present
                .iter()
                .enumerate()
                .all(|(i, p)| !*p || allowed.contains(&i))
        };
        let missing = |field: &str| D::Error::custom(format!("{kind} chunk lacks {field}"));
        let chunk = match kind {
            "block-start" if only(&[0, 1]) => StreamChunk::BlockStart {
                index: r.index.ok_or_else(|| missing("index"))?,
                block_type: r.block_type.ok_or_else(|| missing("blockType"))?,
            },
            "text-delta" if only(&[0, 2]) => StreamChunk::TextDelta {
                index: r.index.ok_or_else(|| missing("index"))?,
                text: r.text.ok_or_else(|| missing("text"))?,
            },
            "reasoning-delta" if only(&[0, 2]) => StreamChunk::ReasoningDelta {
                index: r.index.ok_or_else(|| missing("index"))?,
                text: r.text.ok_or_else(|| missing("text"))?,
            },
            "tool-call-delta" if only(&[0, 3, 4, 5]) => StreamChunk::ToolCallDelta {
                index: r.index.ok_or_else(|| missing("index"))?,
                id: r.id.ok_or_else(|| missing("id"))?,
                name: r.name,
                arguments_delta: r.arguments_delta.ok_or_else(|| missing("argumentsDelta"))?,
            },
            "block-end" if only(&[0, 6]) => StreamChunk::BlockEnd {
                index: r.index.ok_or_else(|| missing("index"))?,
                block: r.block.ok_or_else(|| missing("block"))?,
            },
            "usage" if only(&[7]) => StreamChunk::Usage {
                usage: r.usage.ok_or_else(|| missing("usage"))?,
            },
            "finish" if only(&[8, 9]) => StreamChunk::Finish {
                reason: r.reason.ok_or_else(|| missing("reason"))?,
                replay_state: r.replay_state,
            },
            "block-start" | "text-delta" | "reasoning-delta" | "tool-call-delta" | "block-end"
            | "usage" | "finish" => {
                return Err(D::Error::custom(format!(
                    "{kind} chunk has a field of another chunk type"
                )));
            }
            other => {
                return Err(D::Error::custom(format!("unknown chunk type {other:?}")));
            }
        };
        Ok(chunk)
    }
}

impl StreamChunk {
    /// A `finish` chunk without replay state.
    pub fn finish(reason: FinishReason) -> StreamChunk {
        StreamChunk::Finish {
            reason,
            replay_state: None,
        }
    }

    /// Whether this is the `finish` chunk.
    pub fn is_finish(&self) -> bool {
        matches!(self, StreamChunk::Finish { .. })
    }
}

/// Why a stream finished.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum FinishReason {
    /// The model finished its reply.
    Stop,
    /// The model asks for tool calls.
    ToolCalls,
    /// The output cap cut the reply.
    MaxTokens,
    /// The request failed.
    Error {
        /// What failed.
        failure: LlmFailure,
    },
    /// The request was cancelled.
    Aborted {
        /// Why (code `ABORTED`).
        failure: LlmFailure,
    },
}

impl FinishReason {
    /// The failure carried by an `error` or `aborted` finish.
    pub fn failure(&self) -> Option<&LlmFailure> {
        match self {
            FinishReason::Error { failure } | FinishReason::Aborted { failure } => Some(failure),
            _ => None,
        }
    }
}

/// Token counts of one response. Disjoint: `input_tokens` excludes cached input.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenUsage {
    /// Input tokens not served from a cache.
    pub input_tokens: u64,
    /// Output tokens (reasoning included).
    pub output_tokens: u64,
    /// Input tokens read from the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read_tokens: Option<u64>,
    /// Input tokens written to the provider's prompt cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<u64>,
    /// The part of `output_tokens` spent reasoning, when the provider says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}
