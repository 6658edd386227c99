//! The model-facing vocabulary: messages, content blocks, stream chunks, finish reasons, usage,
//! failures, call configuration and the request header.
//!
//! These types are also the wire format of the session log (`reference/session-llm.md` §6), so their
//! serde shapes are fixed: camelCase keys in the order the original writes them, optional keys omitted
//! (never `null`), and anything a plugin may extend (message sources, content blocks of unknown type) is
//! kept verbatim so a log read and written again is unchanged.

use std::fmt;
use std::sync::Arc;

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Number, Value};

use crate::ids::{MessageId, SessionId};

/// Who speaks a message. `system` never comes from the log; it exists for completeness of the format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions to the model (in requests only; the log carries the system prompt in headers).
    System,
    /// The user, injected context, and tool results.
    User,
    /// The model.
    Assistant,
}

/// One immutable message: a user prompt, injected context, a tool result (role `user`) or an assistant
/// reply. Its `id` is minted once and preserved through inbox, log and requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    /// Minted once; the same through inbox, log and requests.
    pub id: MessageId,
    /// Who speaks it.
    pub role: Role,
    /// Its blocks, in order.
    pub content: Vec<ContentBlock>,
    /// Where it came from (user, plugin, tool, model).
    pub source: MessageSource,
}

/// A user message (role `user`). The alias documents intent; admission checks the role.
pub type UserMessage = Message;

impl Message {
    /// A user-role message with one text block and source `{kind:"user"}`.
    pub fn user_text(id: MessageId, text: impl Into<String>) -> Message {
        Message {
            id,
            role: Role::User,
            content: vec![ContentBlock::Text { text: text.into() }],
            source: MessageSource::user(),
        }
    }

    /// The concatenated text of the message's `text` blocks.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for block in &self.content {
            if let ContentBlock::Text { text } = block {
                out.push_str(text);
            }
        }
        out
    }

    /// The message's `tool-call` blocks, in order.
    pub fn tool_calls(&self) -> impl Iterator<Item = ToolCallBlock<'_>> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => Some(ToolCallBlock {
                id,
                name,
                arguments,
            }),
            _ => None,
        })
    }
}

/// A borrowed view of one `tool-call` content block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolCallBlock<'a> {
    /// The call id, which the tool result answers.
    pub id: &'a str,
    /// The tool called.
    pub name: &'a str,
    /// The raw JSON argument string the model produced.
    pub arguments: &'a str,
}

/// Where a message came from: a JSON object with a non-empty string `kind` (`user`, `plugin`, `tool`,
/// `model`, or a plugin's own kind) and whatever other keys its producer set, kept verbatim.
///
/// Invariant: the map holds a `kind` key whose value is a non-empty string.
#[derive(Clone, Debug, PartialEq)]
pub struct MessageSource(Map<String, Value>);

impl MessageSource {
    /// Validates a source object.
    ///
    /// # Errors
    /// When `kind` is missing or not a non-empty string.
    pub fn from_map(map: Map<String, Value>) -> Result<MessageSource, String> {
        match map.get("kind") {
            Some(Value::String(k)) if !k.is_empty() => Ok(MessageSource(map)),
            _ => Err("message source must have a non-empty string kind".to_string()),
        }
    }

    fn with_kind(kind: &str) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("kind".into(), Value::String(kind.into()));
        map
    }

    /// `{kind:"user"}`
    pub fn user() -> MessageSource {
        MessageSource(Self::with_kind("user"))
    }

    /// `{kind:"plugin", plugin}`
    pub fn plugin(plugin: &str) -> MessageSource {
        let mut map = Self::with_kind("plugin");
        map.insert("plugin".into(), Value::String(plugin.into()));
        MessageSource(map)
    }

    /// `{kind:"tool", callId}`
    pub fn tool(call_id: &str) -> MessageSource {
        let mut map = Self::with_kind("tool");
        map.insert("callId".into(), Value::String(call_id.into()));
        MessageSource(map)
    }

    /// `{kind:"model", provider, model}`
    pub fn model(provider: &str, model: &str) -> MessageSource {
        let mut map = Self::with_kind("model");
        map.insert("provider".into(), Value::String(provider.into()));
        map.insert("model".into(), Value::String(model.into()));
        MessageSource(map)
    }

    /// The source's `kind` (`user`, `plugin`, `tool`, `model`, or a plugin's own).
    pub fn kind(&self) -> &str {
        match self.0.get("kind") {
            Some(Value::String(k)) => k,
            // The invariant guarantees a string kind; an empty string keeps this total.
            _ => "",
        }
    }

    /// A string field of the source (`callId`, `provider`, `model`, `plugin`, ...).
    pub fn str_field(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(Value::as_str)
    }

    /// The whole source object, every key as written.
    pub fn as_map(&self) -> &Map<String, Value> {
        &self.0
    }

    /// Returns a copy with `key` set (used to attach `replayState` to a model source).
    pub fn with(mut self, key: &str, value: Value) -> MessageSource {
        if key != "kind" {
            self.0.insert(key.into(), value);
        }
        self
    }
}

impl Serialize for MessageSource {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl<'de> Deserialize<'de> for MessageSource {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(d)?;
        MessageSource::from_map(map).map_err(D::Error::custom)
    }
}

/// One block of message content. The four types the runtime understands are typed; any other block
/// (`image`, plugin blocks) is kept verbatim as `Other`.
#[derive(Clone, Debug, PartialEq)]
pub enum ContentBlock {
    /// `{type:"text", text}`
    Text {
        /// The visible text.
        text: String,
    },
    /// `{type:"reasoning", text}` — the model's thinking, distinct from visible text.
    Reasoning {
        /// The reasoning text.
        text: String,
    },
    /// `{type:"tool-call", id, name, arguments}` — `arguments` is the raw JSON string the model produced.
    ToolCall {
        /// The call id, which the tool result answers.
        id: String,
        /// The tool called.
        name: String,
        /// The raw JSON argument string, unparsed.
        arguments: String,
    },
    /// `{type:"tool-result", toolCallId, content, isError?}`
    ToolResult {
        /// The id of the call this answers.
        tool_call_id: String,
        /// What the tool returned.
        content: Vec<ContentBlock>,
        /// `Some(true)` when the tool failed; absent in the log when not set.
        is_error: Option<bool>,
    },
    /// Any other block, verbatim. Invariant: has a string `type` that is none of the four above, or
    /// one of them with a key set the typed variants do not cover.
    Other(Map<String, Value>),
}

impl ContentBlock {
    /// A `text` block.
    pub fn text(text: impl Into<String>) -> ContentBlock {
        ContentBlock::Text { text: text.into() }
    }

    /// The block's `type` tag.
    pub fn type_tag(&self) -> &str {
        match self {
            ContentBlock::Text { .. } => "text",
            ContentBlock::Reasoning { .. } => "reasoning",
            ContentBlock::ToolCall { .. } => "tool-call",
            ContentBlock::ToolResult { .. } => "tool-result",
            ContentBlock::Other(map) => map.get("type").and_then(Value::as_str).unwrap_or(""),
        }
    }
}

impl Serialize for ContentBlock {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ContentBlock::Text { text } => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("type", "text")?;
                m.serialize_entry("text", text)?;
                m.end()
            }
            ContentBlock::Reasoning { text } => {
                let mut m = s.serialize_map(Some(2))?;
                m.serialize_entry("type", "reasoning")?;
                m.serialize_entry("text", text)?;
                m.end()
            }
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => {
                let mut m = s.serialize_map(Some(4))?;
                m.serialize_entry("type", "tool-call")?;
                m.serialize_entry("id", id)?;
                m.serialize_entry("name", name)?;
                m.serialize_entry("arguments", arguments)?;
                m.end()
            }
            ContentBlock::ToolResult {
                tool_call_id,
                content,
                is_error,
            } => {
                let mut m = s.serialize_map(Some(3 + usize::from(is_error.is_some())))?;
                m.serialize_entry("type", "tool-result")?;
                m.serialize_entry("toolCallId", tool_call_id)?;
                m.serialize_entry("content", content)?;
                if let Some(e) = is_error {
                    m.serialize_entry("isError", e)?;
                }
                m.end()
            }
            ContentBlock::Other(map) => map.serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for ContentBlock {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = Map::<String, Value>::deserialize(d)?;
        ContentBlock::from_map(map).map_err(D::Error::custom)
    }
}

impl ContentBlock {
    /// Converts a JSON object into a block: typed when its `type` and exact key set match one of the
    /// four known shapes, verbatim otherwise.
    ///
    /// # Errors
    /// When `type` is missing or not a string, or a known type has a field of the wrong JSON type.
    pub fn from_map(map: Map<String, Value>) -> Result<ContentBlock, String> {
        let tag = match map.get("type") {
            Some(Value::String(t)) => t.as_str(),
            _ => return Err("content block must have a string type".into()),
        };
        let keys: Vec<&str> = map.keys().map(String::as_str).collect();
        let str_of = |k: &str| -> Result<String, String> {
            match map.get(k) {
                Some(Value::String(v)) => Ok(v.clone()),
                _ => Err(format!("{tag} block field {k} must be a string")),
            }
        };
        let exact =
            |want: &[&str]| keys.len() == want.len() && want.iter().all(|k| map.contains_key(*k));
        match tag {
            "text" if exact(&["type", "text"]) => Ok(ContentBlock::Text {
                text: str_of("text")?,
            }),
            "reasoning" if exact(&["type", "text"]) => Ok(ContentBlock::Reasoning {
                text: str_of("text")?,
            }),
            "tool-call" if exact(&["type", "id", "name", "arguments"]) => {
                Ok(ContentBlock::ToolCall {
                    id: str_of("id")?,
                    name: str_of("name")?,
                    arguments: str_of("arguments")?,
                })
            }
            "tool-result"
                if exact(&["type", "toolCallId", "content"])
                    || exact(&["type", "toolCallId", "content", "isError"]) =>
            {
                let content = match map.get("content") {
                    Some(Value::Array(items)) => items
                        .iter()
                        .map(|v| match v {
                            Value::Object(o) => ContentBlock::from_map(o.clone()),
                            _ => Err("tool-result content entries must be objects".to_string()),
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    _ => return Err("tool-result block content must be an array".into()),
                };
                let is_error = match map.get("isError") {
                    None => None,
                    Some(Value::Bool(b)) => Some(*b),
                    Some(_) => return Err("tool-result block isError must be a boolean".into()),
                };
                Ok(ContentBlock::ToolResult {
                    tool_call_id: str_of("toolCallId")?,
                    content,
                    is_error,
                })
            }
            "text" | "reasoning" | "tool-call" | "tool-result" => Err(format!(
                "{tag} block has unexpected keys [{}]",
                keys.join(", ")
            )),
            _ => Ok(ContentBlock::Other(map)),
        }
    }
}

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

/// The provider-facing call configuration (`LlmCallConfig`). Numbers that the original may write as
/// fractions (`temperature`) are kept as JSON numbers so a log round-trips byte for byte.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LlmCallConfig {
    /// The provider's registered name (its route).
    pub provider: String,
    /// The model id (empty: the provider's default).
    pub model: String,
    /// How hard the model should think (`off`, `low`, `high`, `max`, or the provider's words).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// Sampling temperature, as the JSON number written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<Number>,
    /// The output cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
}

/// Which header fields a provider filled in by default (rather than the caller).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdapterDefaults {
    /// `Some(true)`: the reasoning effort is the provider's default, not the caller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<bool>,
    /// `Some(true)`: the output cap is the provider's default, not the caller's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<bool>,
}

/// A tool as the model sees it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSchema {
    /// The name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: Value,
}

/// The non-history request envelope (`EpochHeader`): logged as `request/header` before a request when
/// it changed, so every request can be rebuilt from the log alone.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestHeader {
    /// The call configuration.
    pub config: LlmCallConfig,
    /// Which of its fields the provider filled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_defaults: Option<AdapterDefaults>,
    /// The system prompt (absent when empty, in canonical form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The tools offered (absent when none, in canonical form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ToolSchema>>,
}

impl RequestHeader {
    /// The canonical form: empty `system`, empty `tools` and marker-less `adapterDefaults` are absent.
    pub fn canonical(mut self) -> RequestHeader {
        if self.system.as_deref() == Some("") {
            self.system = None;
        }
        if self.tools.as_ref().is_some_and(Vec::is_empty) {
            self.tools = None;
        }
        if let Some(d) = &self.adapter_defaults
            && d.reasoning_effort != Some(true)
            && d.max_tokens != Some(true)
        {
            self.adapter_defaults = None;
        }
        self
    }
}

/// One request attempt as handed to a `Provider`.
#[derive(Clone, Debug, PartialEq)]
pub struct LlmRequest {
    /// The call configuration.
    pub config: LlmCallConfig,
    /// The system prompt, if any.
    pub system: Option<String>,
    /// The tools offered.
    pub tools: Vec<ToolSchema>,
    /// The model-visible history, derived from the session surface. Shared with the session's cache.
    pub messages: Vec<Arc<Message>>,
    /// The session the request is made for, if any (the simulator mixes it into its seed).
    pub session_id: Option<SessionId>,
}
