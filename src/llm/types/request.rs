//! What a request is made of: the call configuration, the request header logged before a request
//! when it changed (`request/header`), the tools offered, and `LlmRequest`, one attempt as a
//! provider receives it.

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

use super::History;
use crate::ids::SessionId;

/// The provider-facing call configuration (`LlmCallConfig`). Numbers that the original may write as
/// fractions (`temperature`) are kept as JSON numbers so a log round-trips byte for byte.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
#[serde(rename_all = "camelCase")]
pub struct RequestHeader {
    /// The call configuration.
    pub config: LlmCallConfig,
    /// Which of its fields the provider filled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adapter_defaults: Option<AdapterDefaults>,
    /// The system prompt (absent when empty, in canonical form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The tools offered (absent when none, in canonical form). Older logs of the original list
    /// tools by name only; such an entry reads as a schema with that name, an empty description and
    /// `null` parameters (the log keeps the names as written, see `session::event`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "schemas_or_names"
    )]
    pub tools: Option<Vec<ToolSchema>>,
}

/// Reads `tools` as the original accepts it: each entry a tool schema or a tool's name.
fn schemas_or_names<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<ToolSchema>>, D::Error> {
    use serde::de::Error as _;
    let entries = Vec::<Value>::deserialize(d)?;
    entries
        .into_iter()
        .enumerate()
        .map(|(i, entry)| match entry {
            Value::String(name) => Ok(ToolSchema {
                name,
                description: String::new(),
                parameters: Value::Null,
            }),
            Value::Object(_) => serde_json::from_value(entry)
                .map_err(|e| D::Error::custom(format!("tools[{i}]: {e}"))),
            _ => Err(D::Error::custom(format!(
                "tools[{i}] must be a tool schema or a tool name"
            ))),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
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
    /// The model-visible history, derived from the session surface. Shared with the session's cache
    /// (cloning it is one `Arc` clone, whatever its length).
    pub messages: History,
    /// The session the request is made for, if any (the simulator mixes it into its seed).
    pub session_id: Option<SessionId>,
    /// Why an auxiliary one-shot request is made (`None`: a loop request). The OpenAI-compatible
    /// provider marks a compaction request on the wire (`x-deepseek-harness-compact: 1`).
    pub purpose: Option<RequestPurpose>,
}

/// What an auxiliary (non-loop) request is for (`reference/session-llm.md` §6.3 `purpose`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestPurpose {
    /// The compaction summariser (§8.4).
    Compaction,
}
