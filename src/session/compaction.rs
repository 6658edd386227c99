//! Compaction decisions (SPEC §15, `reference/session-llm.md` §8): the payloads of the four
//! `compaction/*` events, token estimation, the model-free tool-result pruner, where a compaction
//! splits the surface, the summariser request, what its answer may be, and the checkpoint message
//! that replaces the shadowed span. Everything here is pure: the turn machine (`turn::compaction`)
//! appends what these functions build, and the runtime only runs the summariser's stream.
//!
//! Compaction never deletes or edits events: a replacing surface event (`surfaceOp:{op:"replace"}`)
//! shadows a contiguous span of surface nodes, which then disappear from the derived messages only.
//! The summarising compaction writes, in this order: `compaction/start` (the lock), then — once the
//! summary arrived — `compaction/summary`, the replacing `user/message` (the checkpoint: preamble,
//! `<compacted-summary>`, the summary's text blocks, `</compacted-summary>`) and `compaction/end`;
//! a failure after the start writes only `compaction/end {error}` and leaves the surface untouched.
//! The pruner writes `compaction/prune` and a replacing `tool/result` per oversized result.
//!
//! **Token estimation** (the original's token meter is not part of the reference, so this is ours,
//! documented and tested): a text counts one token per started group of four Unicode code points
//! (`ceil(chars / 4)`); a message counts `MESSAGE_OVERHEAD_TOKENS` (8) plus its blocks — text and
//! reasoning by their text, a tool call by its name and argument string, a tool result by its inner
//! blocks, any other block (an image, a plugin block) by its JSON text. The request envelope counts
//! its system prompt and the JSON text of every tool schema. The figure reproduces the one data point
//! the original's snapshots give (a 1,031-character prompt: `shadowedTokenCount` 266). It is a
//! heuristic: it decides when to compact and records a shadow price, never what a provider bills.
//!
//! **Where a compaction splits**: the surface is cut only at a *balanced* boundary, one that no tool
//! call crosses (an assistant message's calls and the results answering them stay on one side), so
//! the surface divides into indivisible units. The shadowed span is always a head of the surface and
//! the newest unit is always kept; with a retained budget the kept tail is the longest run of newest
//! units that fits it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::MessageId;
use crate::llm::types::{
    ContentBlock, FinishReason, LlmCallConfig, LlmFailure, LlmRequest, Message, MessageSource,
    RequestPurpose, Role, TokenUsage, codes,
};
use crate::session::event::{Event, EventData, SurfaceOp, ToolResultEvent};
use crate::session::log::{Session, project};

/// The checkpoint preamble, verbatim from the original (§8.2).
pub const PREAMBLE: &str = "This is an automatically generated checkpoint condensing an earlier span of the conversation to free up context. Treat the captured context as established background and build on it without restating it. Continue the task directly from the messages that follow, without acknowledging this checkpoint.";
/// Opens the summary inside the checkpoint (after the preamble and a blank line).
pub const SUMMARY_OPEN: &str = "<compacted-summary>";
/// Closes the summary inside the checkpoint.
pub const SUMMARY_CLOSE: &str = "</compacted-summary>";
/// `source.plugin` of a checkpoint message.
pub const CHECKPOINT_PLUGIN: &str = "compact";
/// `source.plugin` of the summariser's final instruction message.
pub const SUMMARISER_PLUGIN: &str = "dsh-compaction-basic";
/// The summariser's output cap (§8.4).
pub const SUMMARY_MAX_TOKENS: u64 = 8192;
/// What the summariser is asked to write (the original's text is not part of the reference; this
/// asks for the same structured checkpoint).
pub const SUMMARISER_INSTRUCTION: &str = "Write a checkpoint of the conversation above so that work can continue from it without the original messages. Capture, in structured sections: the task and the user's goals and constraints; decisions made and why; facts established (file paths, names, values, tool results that matter); work completed; work in progress and the exact next steps; open questions. Be concise and factual, keep identifiers verbatim, and do not address the user. Output only the checkpoint text.";
/// A tool result whose text exceeds this many code points is pruned (§8.3).
pub const PRUNE_THRESHOLD_CHARS: usize = 8192;
/// Code points kept from the start of a pruned result.
pub const PRUNE_HEAD_CHARS: usize = 4096;
/// Code points kept from the end of a pruned result.
pub const PRUNE_TAIL_CHARS: usize = 1024;
/// What replaces the middle of a pruned result.
pub const PRUNE_MARKER: &str = "\n\n[... tool result middle pruned ...]\n\n";
/// The tokens every message costs beyond its content (see the module docs).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 8;
/// Code points per estimated token.
pub const CHARS_PER_TOKEN: u64 = 4;

/// How an agent compacts (SPEC §15). `context_window` `None` means no automatic compaction.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactionSettings {
    /// The model's context window in tokens: configured, else `known_context_window`, else `None`.
    pub context_window: Option<u64>,
    /// Compaction starts before a step once the estimate passes `context_window × threshold_ratio`.
    /// Invariant (checked by `validate`): in (0, 1].
    pub threshold_ratio: f64,
    /// The recent tail kept verbatim: `context_window × retain_ratio` tokens. Invariant: in [0, 1).
    pub retain_ratio: f64,
    /// Compact automatically (pressure before a step, `CONTEXT_WINDOW_EXCEEDED`); manual compaction
    /// works either way.
    pub auto: bool,
}

impl Default for CompactionSettings {
    fn default() -> CompactionSettings {
        CompactionSettings {
            context_window: None,
            threshold_ratio: 0.8,
            retain_ratio: 0.16,
            auto: true,
        }
    }
}

impl CompactionSettings {
    /// Checks the ratios.
    ///
    /// # Errors
    /// A sentence naming the setting out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.threshold_ratio > 0.0 && self.threshold_ratio <= 1.0) {
            return Err(format!(
                "threshold_ratio must be in (0, 1], got {}",
                self.threshold_ratio
            ));
        }
        if !(self.retain_ratio >= 0.0 && self.retain_ratio < 1.0) {
            return Err(format!(
                "retain_ratio must be in [0, 1), got {}",
                self.retain_ratio
            ));
        }
        if self.context_window == Some(0) {
            return Err("context_window must be positive".to_string());
        }
        Ok(())
    }

    /// `floor(context_window × threshold_ratio)`: the estimate above which a step compacts first.
    pub fn threshold_tokens(&self) -> Option<u64> {
        self.context_window
            .map(|w| (w as f64 * self.threshold_ratio).floor() as u64)
    }

    /// `floor(context_window × retain_ratio)`: the recent tail kept verbatim.
    pub fn retain_tokens(&self) -> Option<u64> {
        self.context_window
            .map(|w| (w as f64 * self.retain_ratio).floor() as u64)
    }
}

/// The context window of a few known models (used when none is configured).
pub fn known_context_window(model: &str) -> Option<u64> {
    const TABLE: &[(&str, u64)] = &[
        ("deepseek-chat", 128_000),
        ("deepseek-reasoner", 128_000),
        ("deepseek-v4-flash", 128_000),
        ("deepseek-v4-pro", 128_000),
        ("gpt-4o", 128_000),
        ("gpt-4o-mini", 128_000),
        ("gpt-4.1", 1_047_576),
        ("gpt-4.1-mini", 1_047_576),
        ("o3", 200_000),
        ("o4-mini", 200_000),
    ];
    TABLE.iter().find(|(m, _)| *m == model).map(|(_, w)| *w)
}

// -------------------------------------------------------------------------------------------------
// Payloads.

/// `{start, end}`: the first and last shadowed seq, in surface order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqRange {
    /// The first shadowed seq.
    pub start: u64,
    /// The last shadowed seq.
    pub end: u64,
}

/// `compaction/start`: the durable lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionStart {
    /// A UUID naming the compaction.
    pub compaction_id: String,
    /// The command that asked for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_command_id: Option<String>,
    /// The open turn (automatic), or `null` (manual, between turns). Always written.
    pub turn: Option<u64>,
}

/// `compaction/summary`: the summary and what it shadows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionSummary {
    /// The compaction's id.
    pub compaction_id: String,
    /// The command that asked for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_command_id: Option<String>,
    /// The summary's text blocks.
    pub summary: Vec<ContentBlock>,
    /// What the summariser returned, when it differs from `summary` or is recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_output: Option<Vec<ContentBlock>>,
    /// `Some(true)`: the summary came from a one-shot stream call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_stream_call: Option<bool>,
    /// The first and last shadowed seq.
    pub shadowed_range: SeqRange,
    /// The shadowed nodes, in surface order.
    pub shadowed_seqs: Vec<u64>,
    /// Their estimated size (the module's token estimate).
    pub shadowed_token_count: u64,
    /// The summariser's route.
    pub provider: String,
    /// The summariser's model.
    pub model: String,
    /// The summariser's output cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// What the summariser reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
}

/// `compaction/end`: releases the lock; `error` when the compaction failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionEnd {
    /// The compaction's id.
    pub compaction_id: String,
    /// The command that asked for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_command_id: Option<String>,
    /// The start's `turn`, repeated.
    pub turn: Option<u64>,
    /// Why it failed (an error chain, outermost first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `compaction/prune`: the shadow price of one pruned tool result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompactionPrune {
    /// The pruned result's seq, twice.
    pub shadowed_range: SeqRange,
    /// The pruned result's seq.
    pub shadowed_seqs: Vec<u64>,
    /// Its estimated size before pruning.
    pub shadowed_token_count: u64,
}

/// One of the four `compaction/*` events, read (they are kept verbatim as `EventData::Other`).
#[derive(Clone, Debug, PartialEq)]
pub enum CompactionEvent {
    /// `compaction/start`
    Start(CompactionStart),
    /// `compaction/summary`
    Summary(Box<CompactionSummary>),
    /// `compaction/end`
    End(CompactionEnd),
    /// `compaction/prune`
    Prune(CompactionPrune),
}

impl CompactionEvent {
    /// Reads `event` if it is a `compaction/*` event.
    ///
    /// # Errors
    /// When it is one but its payload does not have the shape of §1.4.
    pub fn read(event: &Event) -> Option<Result<CompactionEvent, String>> {
        let EventData::Other { kind, data } = &event.data else {
            return None;
        };
        fn typed<T: serde::de::DeserializeOwned>(kind: &str, data: &Value) -> Result<T, String> {
            T::deserialize(data).map_err(|e| format!("{kind} payload: {e}"))
        }
        Some(match kind.as_str() {
            "compaction/start" => typed(kind, data).map(CompactionEvent::Start),
            "compaction/summary" => {
                typed(kind, data).map(|s| CompactionEvent::Summary(Box::new(s)))
            }
            "compaction/end" => typed(kind, data).map(CompactionEvent::End),
            "compaction/prune" => typed(kind, data).map(CompactionEvent::Prune),
            _ => return None,
        })
    }

    /// The event's payload in the log's form (keys in the original's order).
    pub fn into_data(self) -> EventData {
        fn other<T: Serialize>(kind: &str, payload: &T) -> EventData {
            EventData::Other {
                kind: kind.to_string(),
                // Our own payloads: string keys, finite numbers.
                data: serde_json::to_value(payload).expect("compaction payloads serialize"),
            }
        }
        match self {
            CompactionEvent::Start(p) => other("compaction/start", &p),
            CompactionEvent::Summary(p) => other("compaction/summary", &p),
            CompactionEvent::End(p) => other("compaction/end", &p),
            CompactionEvent::Prune(p) => other("compaction/prune", &p),
        }
    }
}

/// Whether `message` is a compaction checkpoint (`source {kind:"plugin", plugin:"compact"}`), and
/// its `compactionId` if so.
pub fn checkpoint_id(message: &Message) -> Option<&str> {
    (message.source.kind() == "plugin"
        && message.source.str_field("plugin") == Some(CHECKPOINT_PLUGIN))
    .then(|| message.source.str_field("compactionId").unwrap_or(""))
}

// -------------------------------------------------------------------------------------------------
// Token estimation.

/// `ceil(code points / 4)`.
pub fn estimate_text(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(CHARS_PER_TOKEN)
}

/// The estimate of one content block (see the module docs).
pub fn estimate_block(block: &ContentBlock) -> u64 {
    match block {
        ContentBlock::Text { text } | ContentBlock::Reasoning { text } => estimate_text(text),
        ContentBlock::ToolCall {
            name, arguments, ..
        } => estimate_text(name) + estimate_text(arguments),
        ContentBlock::ToolResult { content, .. } => content.iter().map(estimate_block).sum(),
        ContentBlock::Other(map) => estimate_text(&serde_json::to_string(map).unwrap_or_default()),
    }
}

/// The estimate of one message: the overhead plus its blocks.
pub fn estimate_message(message: &Message) -> u64 {
    MESSAGE_OVERHEAD_TOKENS + message.content.iter().map(estimate_block).sum::<u64>()
}

/// The estimate of a surface node: its message's, or 0 for a node that projects to none (a
/// content-less assistant message).
fn estimate_node(event: &Event) -> u64 {
    project(event).map_or(0, |m| estimate_message(m))
}

/// The estimate of what the next request of `session` sends: the envelope of the latest
/// `request/header` (system prompt and tool schemas) plus the derived messages.
pub fn measure(session: &Session) -> u64 {
    let envelope = session.request_header().map_or(0, |h| {
        h.system.as_deref().map_or(0, estimate_text)
            + h.tools.as_ref().map_or(0, |tools| {
                tools
                    .iter()
                    .map(|t| estimate_text(&serde_json::to_string(t).unwrap_or_default()))
                    .sum()
            })
    });
    envelope
        + session
            .messages()
            .iter()
            .map(|m| estimate_message(m))
            .sum::<u64>()
}

// -------------------------------------------------------------------------------------------------
// The split.

/// A head of the surface to summarise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryPlan {
    /// The shadowed nodes, in surface order. Invariant: non-empty, a head of the surface ending at
    /// a balanced boundary.
    pub shadowed: Vec<u64>,
    /// Their estimate.
    pub token_count: u64,
}

impl SummaryPlan {
    /// The first and last shadowed seq (the replacement's `start` and `end`).
    pub fn range(&self) -> SeqRange {
        SeqRange {
            start: self.shadowed[0],
            end: self.shadowed[self.shadowed.len() - 1],
        }
    }
}

/// The positions `i` (0 < i < n) of the surface where a cut leaves every tool call on the same side
/// as the results answering it, ascending.
fn balanced_boundaries(nodes: &[&Event]) -> Vec<usize> {
    let mut crossed = vec![false; nodes.len() + 1];
    let mut opened: Vec<(String, usize)> = Vec::new();
    for (idx, event) in nodes.iter().enumerate() {
        let Some(message) = event.data.message() else {
            continue;
        };
        for call in message.tool_calls() {
            opened.push((call.id.to_string(), idx));
        }
        if let EventData::ToolResult(r) = &event.data
            && let Some(call_id) = r.message.source.str_field("callId")
            && let Some(&(_, from)) = opened.iter().find(|(id, _)| id == call_id)
        {
            for c in &mut crossed[from + 1..=idx] {
                *c = true;
            }
        }
    }
    // A call still unanswered is not crossed by any cut: repair or a later step answers it, after
    // every cut point.
    (1..nodes.len()).filter(|&i| !crossed[i]).collect()
}

/// The head of `session`'s surface a compaction summarises: everything before the kept tail, where
/// the tail is the longest run of newest whole units within `retain_tokens` (`None`: only the newest
/// unit is kept), and always at least the newest unit. `None` when the surface is one unit.
pub fn plan_head(session: &Session, retain_tokens: Option<u64>) -> Option<SummaryPlan> {
    let events = session.events();
    let nodes: Vec<&Event> = session
        .surface()
        .nodes
        .iter()
        .map(|&seq| &events[seq as usize])
        .collect();
    let boundaries = balanced_boundaries(&nodes);
    let newest_unit = *boundaries.last()?;
    let cut = match retain_tokens {
        None => newest_unit,
        Some(budget) => {
            let mut tail = 0u64;
            let mut cut = newest_unit;
            let mut at = nodes.len();
            for &b in boundaries.iter().rev() {
                tail += nodes[b..at].iter().map(|e| estimate_node(e)).sum::<u64>();
                at = b;
                if tail > budget {
                    break;
                }
                cut = b;
            }
            cut
        }
    };
    let shadowed: Vec<u64> = nodes[..cut].iter().map(|e| e.seq).collect();
    let token_count = nodes[..cut].iter().map(|e| estimate_node(e)).sum();
    Some(SummaryPlan {
        shadowed,
        token_count,
    })
}

// -------------------------------------------------------------------------------------------------
// The pruner.

/// One oversized tool result to rewrite.
#[derive(Clone, Debug, PartialEq)]
pub struct PrunePlan {
    /// The `compaction/prune` payload (the shadow price).
    pub prune: CompactionPrune,
    /// The replacing `tool/result` payload: the original's with only the inner content cut.
    pub replacement: ToolResultEvent,
}

/// Cuts `text` to its first `PRUNE_HEAD_CHARS` code points, the marker and its last
/// `PRUNE_TAIL_CHARS` code points (code points, so no character is ever split).
pub fn prune_text(text: &str) -> String {
    let n = text.chars().count();
    let head: String = text.chars().take(PRUNE_HEAD_CHARS).collect();
    let tail: String = text
        .chars()
        .skip(n.saturating_sub(PRUNE_TAIL_CHARS))
        .collect();
    format!("{head}{PRUNE_MARKER}{tail}")
}

/// The pruned inner content of a tool result, or `None` when its text is within the threshold. The
/// text blocks' texts are cut as one text, which takes the first text block's position; other
/// blocks keep theirs.
fn prune_content(content: &[ContentBlock]) -> Option<Vec<ContentBlock>> {
    let joined: String = content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    if joined.chars().count() <= PRUNE_THRESHOLD_CHARS {
        return None;
    }
    let mut pruned = Some(prune_text(&joined));
    Some(
        content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { .. } => pruned.take().map(ContentBlock::text),
                other => Some(other.clone()),
            })
            .collect(),
    )
}

/// Every oversized `tool/result` on `session`'s surface, in surface order, with its rewrite. A
/// rewritten result is within the threshold, so a second pass finds nothing.
pub fn plan_prunes(session: &Session) -> Vec<(u64, PrunePlan)> {
    let events = session.events();
    let mut out = Vec::new();
    for &seq in &session.surface().nodes {
        let event = &events[seq as usize];
        let EventData::ToolResult(r) = &event.data else {
            continue;
        };
        let [
            ContentBlock::ToolResult {
                tool_call_id,
                content,
                is_error,
            },
        ] = r.message.content.as_slice()
        else {
            continue;
        };
        let Some(pruned) = prune_content(content) else {
            continue;
        };
        let message = Message {
            content: vec![ContentBlock::ToolResult {
                tool_call_id: tool_call_id.clone(),
                content: pruned,
                is_error: *is_error,
            }],
            ..(*r.message).clone()
        };
        let replacement = ToolResultEvent {
            message: Arc::new(message),
            ..(**r).clone()
        };
        out.push((
            seq,
            PrunePlan {
                prune: CompactionPrune {
                    shadowed_range: SeqRange {
                        start: seq,
                        end: seq,
                    },
                    shadowed_seqs: vec![seq],
                    shadowed_token_count: estimate_message(&r.message),
                },
                replacement,
            },
        ));
    }
    out
}

/// The surface op of a rewrite of the single node `seq`.
pub fn replace_one(seq: u64) -> SurfaceOp {
    SurfaceOp::Replace {
        start: seq,
        end: seq,
    }
}

// -------------------------------------------------------------------------------------------------
// The summariser.

/// The summariser request of §8.4: the route of the latest `request/header` (else `fallback`), the
/// conversation's own system prompt and tools from that header, the shadowed messages verbatim and
/// a final instruction message (id `instruction_id`), `maxTokens` `SUMMARY_MAX_TOKENS`, purpose
/// compaction.
pub fn summary_request(
    session: &Session,
    plan: &SummaryPlan,
    fallback: (&str, &str),
    instruction_id: MessageId,
) -> LlmRequest {
    let header = session.request_header();
    let (provider, model) = header.map_or(fallback, |h| {
        (h.config.provider.as_str(), h.config.model.as_str())
    });
    let events = session.events();
    let mut messages: Vec<Arc<Message>> = plan
        .shadowed
        .iter()
        .filter_map(|&seq| project(&events[seq as usize]).cloned())
        .collect();
    messages.push(Arc::new(Message {
        id: instruction_id,
        role: Role::User,
        content: vec![ContentBlock::text(SUMMARISER_INSTRUCTION)],
        source: MessageSource::plugin(SUMMARISER_PLUGIN),
    }));
    LlmRequest {
        config: LlmCallConfig {
            provider: provider.to_string(),
            model: model.to_string(),
            max_tokens: Some(SUMMARY_MAX_TOKENS),
            ..LlmCallConfig::default()
        },
        system: header.and_then(|h| h.system.clone()),
        tools: header.and_then(|h| h.tools.clone()).unwrap_or_default(),
        messages: messages.into(),
        session_id: Some(session.id().clone()),
        purpose: Some(RequestPurpose::Compaction),
    }
}

/// What the summariser's answer is worth (§8.4): its text blocks (reasoning and tool calls dropped),
/// or the failure — the stream's own, `MAX_TOKENS` for a cut checkpoint, `UNSUPPORTED_CONTENT` for
/// an image, `EMPTY_RESPONSE` when no text is non-blank.
///
/// # Errors
/// The failure, as above.
pub fn summary_outcome(
    finish: &FinishReason,
    blocks: Vec<ContentBlock>,
) -> Result<Vec<ContentBlock>, LlmFailure> {
    if let Some(failure) = finish.failure() {
        return Err(failure.clone());
    }
    if *finish == FinishReason::MaxTokens {
        return Err(LlmFailure::new(
            "MAX_TOKENS",
            "the summary hit its output cap (an incomplete checkpoint)",
        ));
    }
    if blocks.iter().any(|b| b.type_tag() == "image") {
        return Err(LlmFailure::new(
            codes::UNSUPPORTED_CONTENT,
            "the summariser returned an image",
        ));
    }
    let text: Vec<ContentBlock> = blocks
        .into_iter()
        .filter(|b| matches!(b, ContentBlock::Text { .. }))
        .collect();
    if !text
        .iter()
        .any(|b| matches!(b, ContentBlock::Text { text } if !text.trim().is_empty()))
    {
        return Err(LlmFailure::new(
            codes::EMPTY_RESPONSE,
            "the summariser returned no text",
        ));
    }
    Ok(text)
}

/// The checkpoint that replaces the shadowed span: `[preamble + "\n\n<compacted-summary>", …summary,
/// "</compacted-summary>"]`, source `{kind:"plugin", plugin:"compact", compactionId}`.
pub fn checkpoint_message(id: MessageId, compaction_id: &str, summary: &[ContentBlock]) -> Message {
    let mut content = Vec::with_capacity(summary.len() + 2);
    content.push(ContentBlock::text(format!("{PREAMBLE}\n\n{SUMMARY_OPEN}")));
    content.extend(summary.iter().cloned());
    content.push(ContentBlock::text(SUMMARY_CLOSE));
    Message {
        id,
        role: Role::User,
        content,
        source: MessageSource::plugin(CHECKPOINT_PLUGIN)
            .with("compactionId", Value::String(compaction_id.to_string())),
    }
}

/// The error chain written into `compaction/end.error` for a failure.
pub fn error_chain(context: &str, failure: &LlmFailure) -> String {
    format!(
        "CompactionError: {context}: {}: {}",
        failure.code, failure.message
    )
}

#[cfg(test)]
mod tests;
