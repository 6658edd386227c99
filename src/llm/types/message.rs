//! Messages: who speaks (`Role`), where a message came from (`MessageSource`, kept verbatim), and
//! its content blocks (`ContentBlock`: the four typed shapes, anything else verbatim). Their serde
//! shapes are the session log's.

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::ids::MessageId;

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
///
/// Serialized with its keys in the order the original writes them, which depends on who made the
/// message: `role, content, source, id` for the model's, `source, content, role, id` for a tool
/// result, `content, source, role, id` for every other user message. Unknown keys are ignored when
/// read (the session log keeps them, see `session::event`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
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

impl Serialize for Message {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(4))?;
        if self.role == Role::Assistant {
            m.serialize_entry("role", &self.role)?;
            m.serialize_entry("content", &self.content)?;
            m.serialize_entry("source", &self.source)?;
        } else if self.source.kind() == "tool" {
            m.serialize_entry("source", &self.source)?;
            m.serialize_entry("content", &self.content)?;
            m.serialize_entry("role", &self.role)?;
        } else {
            m.serialize_entry("content", &self.content)?;
            m.serialize_entry("source", &self.source)?;
            m.serialize_entry("role", &self.role)?;
        }
        m.serialize_entry("id", &self.id)?;
        m.end()
    }
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

    /// The bytes of what the model reads in the message: its text and reasoning, tool-call
    /// arguments and tool-result content (nested), not its ids or keys. A size for estimates, kept
    /// summed by `History` so that a request's size costs nothing to know at any length.
    pub fn text_bytes(&self) -> u64 {
        content_text_bytes(&self.content)
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

fn content_text_bytes(content: &[ContentBlock]) -> u64 {
    content
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } | ContentBlock::Reasoning { text } => text.len() as u64,
            ContentBlock::ToolCall { arguments, .. } => arguments.len() as u64,
            ContentBlock::ToolResult { content, .. } => content_text_bytes(content),
            ContentBlock::Other(_) => 0,
        })
        .sum()
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
    /// Any other block, verbatim. Invariant: has a string `type` that is none of the four above.
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
        // Known keys are read strictly; keys the runtime does not know are ignored, as the original
        // ignores them (a session log keeps them verbatim beside the typed view).
        let has = |want: &[&str]| want.iter().all(|k| map.contains_key(*k));
        match tag {
            "text" if has(&["text"]) => Ok(ContentBlock::Text {
                text: str_of("text")?,
            }),
            "reasoning" if has(&["text"]) => Ok(ContentBlock::Reasoning {
                text: str_of("text")?,
            }),
            "tool-call" if has(&["id", "name", "arguments"]) => Ok(ContentBlock::ToolCall {
                id: str_of("id")?,
                name: str_of("name")?,
                arguments: str_of("arguments")?,
            }),
            "tool-result" if has(&["toolCallId", "content"]) => {
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
                "{tag} block lacks a required key (has [{}])",
                keys.join(", ")
            )),
            _ => Ok(ContentBlock::Other(map)),
        }
    }
}
