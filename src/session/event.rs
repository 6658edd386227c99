//! The durable event: the v0 envelope and every payload the runtime writes (`reference/session-llm.md`
//! §1.2–§1.7), with a lossless JSON codec.
//!
//! Envelope keys, in this order: `type, seq, time, data, ignorable?, sourceEventSeqs?, surfaceOp?`;
//! the envelope is closed (any other key is refused, as the original refuses it). Payload structs
//! use camelCase keys in the original's order and omit absent optionals, so an event we write, parsed
//! and written again, is byte-identical.
//!
//! Payloads are open, as the original's are (SPEC §17): a key the runtime does not know is ignored by
//! the typed view and kept, with everything else, in `Event::raw_data`, the payload text as read,
//! which is what is written back. It is kept only when the typed payload would be written as other
//! bytes (checked on every read without allocating), so the common event carries one null pointer.
//! Known keys are still read strictly: a wrong type is refused. Types owned by plugins of the original (known
//! names in `KNOWN_EVENT_TYPES`) and unknown types marked `ignorable: true` are kept verbatim as
//! `EventData::Other`; an unknown type without the mark is refused by the reader.
//!
//! Who calls this: `session::log` builds events, the stores encode and decode them, `dsh export/import`
//! move them between processes.

use std::sync::Arc;

use serde::de::Error as _;
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Number, Value};

use crate::ids::SessionId;
use crate::llm::types::{LlmFailure, Message, RequestHeader, StreamChunk, TokenUsage};

/// Every event type name the original harness knows (its generated `KNOWN_SESSION_EVENT_TYPES`). A
/// reader refuses any other type unless the record is marked `ignorable: true`.
pub const KNOWN_EVENT_TYPES: &[&str] = &[
    "agent-preset/selected",
    "agent/inbox/spliced",
    "approval/asked",
    "approval/decided",
    "approval/policy",
    "assistant/chunk",
    "assistant/message",
    "command/done",
    "command/run",
    "compaction/end",
    "compaction/prune",
    "compaction/start",
    "compaction/summary",
    "feedback/record",
    "goal/change",
    "hook/invoked",
    "hook/result",
    "llm/retry",
    "llm/retry-started",
    "permission/preset",
    "plan/mode",
    "request/context",
    "request/header",
    "sandbox/mode",
    "schedule/change",
    "session/end-seed",
    "session/title",
    "session/title-llm-request",
    "step/end",
    "step/start",
    "subagent/descriptor",
    "team/member",
    "team/message/delivered",
    "team/message/queued",
    "team/task",
    "todo/write",
    "tool-workflow/agent-end",
    "tool-workflow/agent-start",
    "tool-workflow/run-end",
    "tool-workflow/run-start",
    "tool/call",
    "tool/code-dispatch",
    "tool/code-dispatch-start",
    "tool/result",
    "turn/end",
    "turn/start",
    "user/message",
    "web/deepseek-search-llm-request",
];

/// True for the three types whose events form the model-visible surface.
pub fn is_surface_type(kind: &str) -> bool {
    matches!(kind, "user/message" | "assistant/message" | "tool/result")
}

/// One entry of a session log.
///
/// Equality is that of what the runtime reads: `raw_data` (unknown keys, key order) does not count.
#[derive(Clone, Debug)]
pub struct Event {
    /// Position in the log. Invariant (enforced by `Session::append` and the loader): equals the number
    /// of events before it, so seqs are contiguous from 0.
    pub seq: u64,
    /// Unix epoch milliseconds when the event was appended. Not monotonic (clocks step back).
    pub time: i64,
    /// The event's type and payload.
    pub data: EventData,
    /// Only ever `true` when present: a reader that does not know the type may skip the event.
    pub ignorable: bool,
    /// Earlier seqs this event cites. Only on surface types.
    pub source_event_seqs: Option<Vec<u64>>,
    /// How the event changes the surface. Present exactly on surface types.
    pub surface_op: Option<SurfaceOp>,
    /// The `data` exactly as it was read, kept only when writing the typed payload would give other
    /// bytes: keys the runtime does not know (the original ignores and keeps them), keys in another
    /// order, or tool names where schemas are now written. `None` for every event the runtime builds
    /// (except repair closers, written in the original's order) and for every event read back in the
    /// order we write. When present it is what is written, so such an event is copied byte for byte;
    /// the typed `data` is always its reading. Boxed so the common event pays one pointer.
    pub raw_data: Option<Box<RawData>>,
}

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        self.seq == other.seq
            && self.time == other.time
            && self.data == other.data
            && self.ignorable == other.ignorable
            && self.source_event_seqs == other.source_event_seqs
            && self.surface_op == other.surface_op
    }
}

/// A payload's JSON text exactly as read (see `Event::raw_data`).
#[derive(Clone, Debug)]
pub struct RawData(Box<RawValue>);

impl RawData {
    /// Keeps `json`, which must be one JSON value.
    ///
    /// # Errors
    /// When `json` is not one valid JSON value.
    pub fn new(json: String) -> Result<RawData, serde_json::Error> {
        RawValue::from_string(json).map(RawData)
    }

    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for RawData {
    fn eq(&self, other: &RawData) -> bool {
        self.get() == other.get()
    }
}

impl Event {
    /// The event's `type` string.
    pub fn kind(&self) -> &str {
        self.data.kind()
    }

    /// Serializes the event as one line of v0 JSON (no trailing newline).
    pub fn to_json(&self) -> String {
        // Serialization of our own types cannot fail: every map key is a string and every number is
        // finite (`Number` cannot hold NaN).
        serde_json::to_string(self).expect("events always serialize")
    }

    /// `to_json` as UTF-8 bytes, written into a buffer sized for a typical event (a streamed
    /// chunk's line is ~135 bytes, over `serde_json`'s 128-byte start, so it grew once per event).
    pub fn to_json_bytes(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(256);
        self.write_json(&mut buf);
        buf
    }

    /// Appends `to_json`'s bytes to `buf` (what `EncodedEvent::encode_all` writes a batch with).
    /// The envelope is written by hand and only the payload goes through serde: the bytes are
    /// exactly `serde_json`'s for `Event`'s `Serialize` (`write_json_writes_what_serde_writes`
    /// checks every event of the original's corpus).
    pub fn write_json(&self, buf: &mut Vec<u8>) {
        // As `to_json`: our own types always serialize, and a `Vec` never fails a write.
        const SERIALIZES: &str = "events always serialize";
        let mut n = itoa::Buffer::new();
        buf.extend_from_slice(br#"{"type":"#);
        match self.data.known_kind() {
            // The runtime's own type names need no escaping.
            Some(kind) => {
                buf.push(b'"');
                buf.extend_from_slice(kind.as_bytes());
                buf.push(b'"');
            }
            None => serde_json::to_writer(&mut *buf, self.kind()).expect(SERIALIZES),
        }
        buf.extend_from_slice(br#","seq":"#);
        buf.extend_from_slice(n.format(self.seq).as_bytes());
        buf.extend_from_slice(br#","time":"#);
        buf.extend_from_slice(n.format(self.time).as_bytes());
        buf.extend_from_slice(br#","data":"#);
        match &self.raw_data {
            Some(raw) => serde_json::to_writer(&mut *buf, &raw.0).expect(SERIALIZES),
            None if self.write_delta_data(buf) => {}
            None => serde_json::to_writer(&mut *buf, &TypedData(&self.data)).expect(SERIALIZES),
        }
        if self.ignorable {
            buf.extend_from_slice(br#","ignorable":true"#);
        }
        if let Some(seqs) = &self.source_event_seqs {
            buf.extend_from_slice(br#","sourceEventSeqs":["#);
            for (i, seq) in seqs.iter().enumerate() {
                if i > 0 {
                    buf.push(b',');
                }
                buf.extend_from_slice(n.format(*seq).as_bytes());
            }
            buf.push(b']');
        }
        if let Some(op) = &self.surface_op {
            buf.extend_from_slice(br#","surfaceOp":"#);
            serde_json::to_writer(&mut *buf, op).expect(SERIALIZES);
        }
        buf.push(b'}');
    }

    /// Writes the payload of the most common event of a log, an `assistant/chunk` with a text or
    /// reasoning delta, without serde's per-field machinery (it is most of a turn's events, and
    /// `serde_json` spent ~235 ns on each ~135-byte line). The bytes are exactly what `serde_json`
    /// writes (`the_delta_fast_path_writes_what_serde_writes` checks it, with every escape);
    /// returns false, writing nothing, for any other payload.
    fn write_delta_data(&self, buf: &mut Vec<u8>) -> bool {
        let EventData::AssistantChunk(c) = &self.data else {
            return false;
        };
        let (kind, index, text): (&[u8], u32, &str) = match &c.chunk {
            StreamChunk::TextDelta { index, text } => (b"text-delta", *index, text),
            StreamChunk::ReasoningDelta { index, text } => (b"reasoning-delta", *index, text),
            _ => return false,
        };
        let mut n = itoa::Buffer::new();
        buf.extend_from_slice(br#"{"turn":"#);
        buf.extend_from_slice(n.format(c.turn).as_bytes());
        buf.extend_from_slice(br#","step":"#);
        buf.extend_from_slice(n.format(c.step).as_bytes());
        buf.extend_from_slice(br#","chunk":{"type":""#);
        buf.extend_from_slice(kind);
        buf.extend_from_slice(br#"","index":"#);
        buf.extend_from_slice(n.format(index).as_bytes());
        buf.extend_from_slice(br#","text":"#);
        // A string always serializes, and a `Vec` never fails a write.
        serde_json::to_writer(&mut *buf, text).expect("a string always serializes");
        buf.extend_from_slice(b"}}");
        true
    }

    /// Parses one v0 event.
    ///
    /// # Errors
    /// `EventParseError` naming what was wrong: bad JSON, an envelope key that is missing or extra, an
    /// unknown type without `ignorable: true`, or a payload that does not match its type.
    pub fn from_json(json: &str) -> Result<Event, EventParseError> {
        serde_json::from_str(json).map_err(|e| EventParseError(e.to_string()))
    }

    /// Parses one v0 event from bytes (UTF-8 is checked as the strings are read).
    ///
    /// # Errors
    /// As `from_json`, and when the bytes are not UTF-8.
    pub fn from_json_bytes(json: &[u8]) -> Result<Event, EventParseError> {
        serde_json::from_slice(json).map_err(|e| EventParseError(e.to_string()))
    }
}

/// Every log of the original's corpus (`tests/fixtures/dsh-logs/*.jsonl`) with its path, as the
/// events this reader accepts. For tests.
#[cfg(test)]
pub(crate) fn fixture_logs() -> Vec<(std::path::PathBuf, Vec<Event>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dsh-logs");
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            let text = std::fs::read_to_string(&path).unwrap();
            let events = text
                .lines()
                .filter_map(|l| Event::from_json(l).ok())
                .collect();
            logs.push((path, events));
        }
    }
    assert!(
        logs.len() > 10,
        "the corpus is missing from {}",
        dir.display()
    );
    logs
}

/// Why a JSON text is not a valid v0 event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid event: {0}")]
pub struct EventParseError(pub String);

/// `"append"` or `{"op":"replace","start":S,"end":E}` where S and E are seqs of current surface nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SurfaceOp {
    /// The event's content is appended to the surface.
    Append,
    /// The event's content replaces the surface nodes from seq `start` to seq `end`.
    Replace {
        /// The seq of the first surface node replaced.
        start: u64,
        /// The seq of the last surface node replaced.
        end: u64,
    },
}

impl Serialize for SurfaceOp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SurfaceOp::Append => s.serialize_str("append"),
            SurfaceOp::Replace { start, end } => {
                let mut m = s.serialize_map(Some(3))?;
                m.serialize_entry("op", "replace")?;
                m.serialize_entry("start", start)?;
                m.serialize_entry("end", end)?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for SurfaceOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Replace {
            op: String,
            start: u64,
            end: u64,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Str(String),
            Replace(Replace),
        }
        match Raw::deserialize(d).map_err(|_| D::Error::custom("invalid surfaceOp"))? {
            Raw::Str(s) if s == "append" => Ok(SurfaceOp::Append),
            Raw::Replace(r) if r.op == "replace" => Ok(SurfaceOp::Replace {
                start: r.start,
                end: r.end,
            }),
            _ => Err(D::Error::custom("invalid surfaceOp")),
        }
    }
}

/// The payload of an event, which also determines its `type`.
///
/// Payloads larger than a few words are boxed: a log is a `Vec<Event>`, and its element size is the
/// largest variant's, so boxing the rare large ones (and the chunk, whose inline form is large) keeps
/// every log in memory, and every move of an event, small.
#[derive(Clone, Debug, PartialEq)]
pub enum EventData {
    /// `agent/inbox/spliced`
    InboxSpliced(InboxSpliced),
    /// `turn/start`
    TurnStart(TurnStart),
    /// `turn/end`
    TurnEnd(Box<TurnEnd>),
    /// `step/start`
    StepStart(StepRef),
    /// `step/end`
    StepEnd(StepRef),
    /// `user/message` — the message itself is the payload.
    UserMessage(Arc<Message>),
    /// `request/header`
    RequestHeader(Box<RequestHeaderEvent>),
    /// `request/context`
    RequestContext(RequestContext),
    /// `assistant/chunk`
    AssistantChunk(Arc<AssistantChunk>),
    /// `assistant/message`
    AssistantMessage(Box<AssistantMessageEvent>),
    /// `tool/call`
    ToolCall(Box<ToolCallEvent>),
    /// `tool/result`
    ToolResult(Box<ToolResultEvent>),
    /// `llm/retry`
    LlmRetry(Box<LlmRetry>),
    /// `llm/retry-started`
    LlmRetryStarted(LlmRetryStarted),
    /// `session/end-seed` (payload `{}`)
    SessionEndSeed,
    /// Any other type, payload verbatim: a plugin type of the original, or an ignorable unknown one.
    Other {
        /// The event's `type`.
        kind: String,
        /// The event's `data`, as written.
        data: Value,
    },
}

impl EventData {
    /// The event's v0 `type` tag, e.g. `turn/start`.
    pub fn kind(&self) -> &str {
        match self {
            EventData::Other { kind, .. } => kind,
            known => known.known_kind().unwrap_or_default(),
        }
    }

    /// The `type` of every event but `Other`'s, as a `&'static str` (so a store's `kind` column
    /// costs no allocation); `None` for `Other`.
    pub fn known_kind(&self) -> Option<&'static str> {
        Some(match self {
            EventData::InboxSpliced(_) => "agent/inbox/spliced",
            EventData::TurnStart(_) => "turn/start",
            EventData::TurnEnd(_) => "turn/end",
            EventData::StepStart(_) => "step/start",
            EventData::StepEnd(_) => "step/end",
            EventData::UserMessage(_) => "user/message",
            EventData::RequestHeader(_) => "request/header",
            EventData::RequestContext(_) => "request/context",
            EventData::AssistantChunk(_) => "assistant/chunk",
            EventData::AssistantMessage(_) => "assistant/message",
            EventData::ToolCall(_) => "tool/call",
            EventData::ToolResult(_) => "tool/result",
            EventData::LlmRetry(_) => "llm/retry",
            EventData::LlmRetryStarted(_) => "llm/retry-started",
            EventData::SessionEndSeed => "session/end-seed",
            EventData::Other { .. } => return None,
        })
    }

    /// The message this event contributes to the surface, if it is a surface type.
    pub fn message(&self) -> Option<&Arc<Message>> {
        match self {
            EventData::UserMessage(m) => Some(m),
            EventData::AssistantMessage(a) => Some(&a.message),
            EventData::ToolResult(r) => Some(&r.message),
            _ => None,
        }
    }
}

/// Which pending queue an inbox splice changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InboxTarget {
    /// The queue of prompts that start the next turn.
    NextTurn,
    /// The queue of steering messages that join the next step of the running turn.
    NextStep,
}

/// `outcome` of a splice that discarded messages (cancel, remove, replace). Claims carry none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SpliceOutcome {
    /// The removed messages were cancelled, not delivered.
    Canceled,
}

/// `agent/inbox/spliced`: one normalized splice of one pending queue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxSpliced {
    /// The queue spliced.
    pub target: InboxTarget,
    /// The position in the queue where the splice starts.
    pub start: u64,
    /// Present only when > 0.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub removed_count: Option<u64>,
    /// The messages inserted at `start`.
    pub inserted: Vec<Arc<Message>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// Why removed messages left the queue; present only for a discard.
    pub outcome: Option<SpliceOutcome>,
}

/// `turn/start`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnStart {
    /// The turn's number, from 1.
    pub turn: u64,
}

/// `turn/end`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TurnEnd {
    /// The number of the turn that ended.
    pub turn: u64,
    /// Why it ended.
    pub reason: TurnEndReason,
}

/// Why a turn ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum TurnEndReason {
    /// The model finished without asking for more tools.
    Completed,
    /// The model's output hit its token limit.
    MaxTokens,
    /// A pre-step hook rejected the next step.
    Blocked,
    /// The turn was cancelled.
    Aborted {
        /// Who or what cancelled it.
        reason: CancelCause,
    },
    /// The model call failed and was not retried.
    Error {
        /// The final failure.
        error: LlmFailure,
    },
    /// Written only by crash repair for a turn left open in the log.
    Interrupted,
}

impl TurnEndReason {
    /// The reason's `kind` tag.
    pub fn kind(&self) -> &'static str {
        match self {
            TurnEndReason::Completed => "completed",
            TurnEndReason::MaxTokens => "max-tokens",
            TurnEndReason::Blocked => "blocked",
            TurnEndReason::Aborted { .. } => "aborted",
            TurnEndReason::Error { .. } => "error",
            TurnEndReason::Interrupted => "interrupted",
        }
    }
}

/// Why a turn was cancelled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum CancelCause {
    /// The user cancelled (Ctrl-C, a cancel request).
    User,
    /// The parent agent cancelled its sub-agent.
    Parent,
    /// A hook cancelled the turn.
    Hook {
        /// The hook's reason.
        reason: String,
    },
    /// The agent was disposed with the turn running.
    Disposed,
    /// Only in logs converted from the original's old `{kind:"aborted"}` shape.
    Legacy,
}

/// `step/start` and `step/end`
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepRef {
    /// The turn the step belongs to.
    pub turn: u64,
    /// The step's number within the turn, from 1.
    pub step: u64,
}

/// Why a `request/header` was logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HeaderReason {
    /// The first request of a conversation.
    Initial,
    /// The first request of a new loop instance over an existing log (restart, resume).
    Resume,
    /// The header differs from the one in force.
    Change,
}

/// `request/header`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestHeaderEvent {
    /// The header in force from this request on.
    pub header: RequestHeader,
    /// Why it was logged.
    pub reason: HeaderReason,
}

/// `request/context`: route capacity metadata, logged when it changes. Not part of reconstruction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestContext {
    /// The provider of the route.
    pub provider: String,
    /// The model of the route.
    pub model: String,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// The model's context window in tokens, when the provider reports it.
    pub context_window: Option<u64>,
}

/// `assistant/chunk`: one raw stream chunk, in arrival order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AssistantChunk {
    /// The turn the chunk belongs to.
    pub turn: u64,
    /// The step the chunk belongs to.
    pub step: u64,
    /// The chunk as the provider stream delivered it.
    pub chunk: StreamChunk,
}

impl AssistantChunk {
    /// The one payload every elided chunk of a live agent's in-memory log points at
    /// (`Session::elide_chunks`): the chunk itself is in the stored log only. Never written, never
    /// answered to anyone; compare with `Arc::ptr_eq`.
    pub fn elided() -> Arc<AssistantChunk> {
        static ELIDED: std::sync::OnceLock<Arc<AssistantChunk>> = std::sync::OnceLock::new();
        Arc::clone(ELIDED.get_or_init(|| {
            Arc::new(AssistantChunk {
                turn: 0,
                step: 0,
                chunk: StreamChunk::Usage {
                    usage: TokenUsage::default(),
                },
            })
        }))
    }
}

/// `assistant/message`: the assembled message of one successful (or interrupted) attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessageEvent {
    /// The turn of the attempt.
    pub turn: u64,
    /// The step of the attempt.
    pub step: u64,
    /// The assembled message.
    pub message: Arc<Message>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// Token usage the provider reported for the attempt, if any.
    pub usage: Option<TokenUsage>,
    /// Only ever `Some(true)`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub interrupted: Option<bool>,
}

/// `tool/call`: a started (or synthetic never-started) tool invocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCallEvent {
    /// The turn of the call.
    pub turn: u64,
    /// The step of the call.
    pub step: u64,
    /// The call's id, as the model gave it.
    pub call_id: String,
    /// The tool's name.
    pub name: String,
    /// The raw argument string as the model produced it.
    pub arguments: String,
}

/// Internal failure identity on a tool result (`{name, code}`), e.g. `AbortError/ABORTED`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolErrorInfo {
    /// The error class, e.g. `AbortError`.
    pub name: String,
    /// The error code, e.g. `ABORTED`.
    pub code: String,
}

/// `tool/result`
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResultEvent {
    /// The turn of the call answered.
    pub turn: u64,
    /// The step of the call answered.
    pub step: u64,
    /// The result message (a `tool-result` block answering the call).
    pub message: Arc<Message>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// The internal failure identity, when the tool failed.
    pub error: Option<ToolErrorInfo>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// Tool-specific metadata, verbatim.
    pub meta: Option<Value>,
}

/// `llm/retry`: a retry was scheduled inside the open step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmRetry {
    /// Identifies this retry, shared with its `llm/retry-started`.
    pub retry_id: String,
    /// The turn being retried.
    pub turn: u64,
    /// The step being retried.
    pub step: u64,
    /// The provider whose failure is retried.
    pub provider: String,
    /// `normal` or `always`.
    pub mode: String,
    /// The key of the retry policy applied.
    pub policy_key: String,
    /// The retry's number, from 1.
    pub retry: u64,
    /// Present in `normal` mode only.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub max_retries: Option<u64>,
    /// Milliseconds; the original may write fractions.
    pub delay_ms: Number,
    /// The failure that is retried.
    pub failure: LlmFailure,
}

/// `llm/retry-started`: the scheduled retry's wait ended and the request is re-issued.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmRetryStarted {
    /// The `retry_id` of the `llm/retry` that scheduled this retry.
    pub retry_id: String,
    /// The turn being retried.
    pub turn: u64,
    /// The step being retried.
    pub step: u64,
    /// The retry's number, from 1.
    pub retry: u64,
}

#[derive(Serialize, Deserialize)]
struct EmptyPayload {}

/// Deserializes an optional key that, when present, must hold a value: the format omits absent
/// optionals and never writes `null`, so a `null` is refused instead of being read as absent (which
/// would drop the key on the next write). With `#[serde(default)]`, an absent key is `None`. A
/// `Value` field keeps a present `null` as `Some(Value::Null)`: there `null` is data.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let n = 4
            + usize::from(self.ignorable)
            + usize::from(self.source_event_seqs.is_some())
            + usize::from(self.surface_op.is_some());
        let mut m = s.serialize_map(Some(n))?;
        m.serialize_entry("type", self.kind())?;
        m.serialize_entry("seq", &self.seq)?;
        m.serialize_entry("time", &self.time)?;
        match &self.raw_data {
            Some(raw) => m.serialize_entry("data", &raw.0)?,
            None => m.serialize_entry("data", &TypedData(&self.data))?,
        }
        if self.ignorable {
            m.serialize_entry("ignorable", &true)?;
        }
        if let Some(seqs) = &self.source_event_seqs {
            m.serialize_entry("sourceEventSeqs", seqs)?;
        }
        if let Some(op) = &self.surface_op {
            m.serialize_entry("surfaceOp", op)?;
        }
        m.end()
    }
}

/// The typed payload of an event, serialized in the original's key order.
struct TypedData<'a>(&'a EventData);

impl Serialize for TypedData<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            EventData::InboxSpliced(d) => d.serialize(s),
            EventData::TurnStart(d) => d.serialize(s),
            EventData::TurnEnd(d) => d.serialize(s),
            EventData::StepStart(d) | EventData::StepEnd(d) => d.serialize(s),
            EventData::UserMessage(d) => d.serialize(s),
            EventData::RequestHeader(d) => d.serialize(s),
            EventData::RequestContext(d) => d.serialize(s),
            EventData::AssistantChunk(d) => d.serialize(s),
            EventData::AssistantMessage(d) => d.serialize(s),
            EventData::ToolCall(d) => d.serialize(s),
            EventData::ToolResult(d) => d.serialize(s),
            EventData::LlmRetry(d) => d.serialize(s),
            EventData::LlmRetryStarted(d) => d.serialize(s),
            EventData::SessionEndSeed => EmptyPayload {}.serialize(s),
            EventData::Other { data, .. } => data.serialize(s),
        }
    }
}

/// A `Write` that checks that what is written is exactly `expected`, failing at the first difference.
struct SameBytes<'a> {
    expected: &'a [u8],
}

impl std::io::Write for SameBytes<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.expected.strip_prefix(buf) {
            Some(rest) => {
                self.expected = rest;
                Ok(buf.len())
            }
            None => Err(std::io::ErrorKind::InvalidData.into()),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// True when serializing `data` gives exactly `raw`, so the raw text need not be kept.
fn writes_as(data: &EventData, raw: &str) -> bool {
    let mut same = SameBytes {
        expected: raw.as_bytes(),
    };
    serde_json::to_writer(&mut same, &TypedData(data)).is_ok() && same.expected.is_empty()
}

/// Reads a typed payload, which must be a JSON object on the wire (serde's derived structs would
/// also accept an array of fields by position, which would be written back as an object).
struct ObjectOnly<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> serde::de::DeserializeSeed<'de> for ObjectOnly<T> {
    type Value = T;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for ObjectOnly<T> {
    type Value = T;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
    }
}

/// Reads the payload of an event of type `kind` from `d`. An unknown type is read as `Other`; whether
/// it may be kept (known plugin type, or marked ignorable) is the caller's check.
fn data_from<'de, D: Deserializer<'de>>(kind: &str, d: D) -> Result<EventData, D::Error> {
    fn typed<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        kind: &str,
        d: D,
    ) -> Result<T, D::Error> {
        serde::de::DeserializeSeed::deserialize(ObjectOnly(std::marker::PhantomData), d)
            .map_err(|e| D::Error::custom(format!("{kind} payload: {e}")))
    }
    Ok(match kind {
        "agent/inbox/spliced" => EventData::InboxSpliced(typed(kind, d)?),
        "turn/start" => EventData::TurnStart(typed(kind, d)?),
        "turn/end" => EventData::TurnEnd(typed(kind, d)?),
        "step/start" => EventData::StepStart(typed(kind, d)?),
        "step/end" => EventData::StepEnd(typed(kind, d)?),
        "user/message" => EventData::UserMessage(typed(kind, d)?),
        "request/header" => EventData::RequestHeader(typed(kind, d)?),
        "request/context" => EventData::RequestContext(typed(kind, d)?),
        "assistant/chunk" => EventData::AssistantChunk(typed(kind, d)?),
        "assistant/message" => EventData::AssistantMessage(typed(kind, d)?),
        "tool/call" => EventData::ToolCall(typed(kind, d)?),
        "tool/result" => EventData::ToolResult(typed(kind, d)?),
        "llm/retry" => EventData::LlmRetry(typed(kind, d)?),
        "llm/retry-started" => EventData::LlmRetryStarted(typed(kind, d)?),
        "session/end-seed" => {
            let _: EmptyPayload = typed(kind, d)?;
            EventData::SessionEndSeed
        }
        _ => EventData::Other {
            kind: kind.to_string(),
            data: Value::deserialize(d)
                .map_err(|e| D::Error::custom(format!("{kind} payload: {e}")))?,
        },
    })
}

/// Refuses an `Other` event whose type is neither known nor marked ignorable.
fn check_kept(data: &EventData, ignorable: bool) -> Result<(), String> {
    match data {
        EventData::Other { kind, .. }
            if !ignorable && !KNOWN_EVENT_TYPES.contains(&kind.as_str()) =>
        {
            Err(format!(
                "event type {kind:?} is unknown and not marked ignorable"
            ))
        }
        _ => Ok(()),
    }
}

/// Parses the payload of an event of type `kind`.
///
/// # Errors
/// When `kind` is unknown and the event is not ignorable, or the payload does not match the type.
pub fn parse_data(kind: &str, data: &str, ignorable: bool) -> Result<EventData, String> {
    let mut de = serde_json::Deserializer::from_str(data);
    let parsed = data_from(kind, &mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| format!("{kind} payload: {e}"))?;
    check_kept(&parsed, ignorable)?;
    Ok(parsed)
}

struct EventVisitor;

impl<'de> serde::de::Visitor<'de> for EventVisitor {
    type Value = Event;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an event object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Event, A::Error> {
        fn dup<E: serde::de::Error>(field: &'static str) -> E {
            E::duplicate_field(field)
        }
        let mut kind: Option<std::borrow::Cow<'de, str>> = None;
        let mut seq = None;
        let mut time = None;
        let mut data: Option<&'de RawValue> = None;
        let mut ignorable: Option<bool> = None;
        let mut source_event_seqs: Option<Vec<u64>> = None;
        let mut surface_op: Option<SurfaceOp> = None;
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "type" if kind.is_some() => return Err(dup("type")),
                "type" => kind = Some(map.next_value()?),
                "seq" if seq.is_some() => return Err(dup("seq")),
                "seq" => seq = Some(map.next_value::<u64>()?),
                "time" if time.is_some() => return Err(dup("time")),
                "time" => time = Some(map.next_value::<i64>()?),
                "data" if data.is_some() => return Err(dup("data")),
                "data" => data = Some(map.next_value::<&'de RawValue>()?),
                "ignorable" if ignorable.is_some() => return Err(dup("ignorable")),
                "ignorable" => ignorable = Some(map.next_value()?),
                "sourceEventSeqs" if source_event_seqs.is_some() => {
                    return Err(dup("sourceEventSeqs"));
                }
                "sourceEventSeqs" => source_event_seqs = Some(map.next_value()?),
                "surfaceOp" if surface_op.is_some() => return Err(dup("surfaceOp")),
                "surfaceOp" => surface_op = Some(map.next_value()?),
                other => {
                    return Err(A::Error::unknown_field(
                        other,
                        &[
                            "type",
                            "seq",
                            "time",
                            "data",
                            "ignorable",
                            "sourceEventSeqs",
                            "surfaceOp",
                        ],
                    ));
                }
            }
        }
        let kind = kind.ok_or_else(|| A::Error::missing_field("type"))?;
        let seq = seq.ok_or_else(|| A::Error::missing_field("seq"))?;
        let time = time.ok_or_else(|| A::Error::missing_field("time"))?;
        let ignorable = match ignorable {
            None => false,
            Some(true) => true,
            Some(false) => return Err(A::Error::custom("ignorable must be true when present")),
        };
        let raw = data.ok_or_else(|| A::Error::missing_field("data"))?;
        let data = parse_data(&kind, raw.get(), ignorable).map_err(A::Error::custom)?;
        let raw_data = (!writes_as(&data, raw.get())).then(|| Box::new(RawData(raw.to_owned())));
        Ok(Event {
            seq,
            time,
            data,
            ignorable,
            source_event_seqs,
            surface_op,
            raw_data,
        })
    }
}

impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EventVisitor)
    }
}

/// Immutable creation metadata of a session, kept beside its log (the export header line).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionHeader {
    /// Always 0 (the v0 format).
    pub version: u32,
    /// The session's id.
    pub id: SessionId,
    /// Unix epoch milliseconds.
    pub created_at: u64,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// The working directory the session runs in (absolute).
    pub cwd: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// The session this one was forked from (its lineage).
    pub parent_session: Option<String>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// How many leading events were inherited through a fork seed (the durable fork boundary).
    pub seed_length: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// Only `subagent`, for a delegated session (presentation metadata); absent otherwise.
    pub origin: Option<String>,
    #[serde(default)]
    /// How deep in a delegation chain the session is: 0 at top level, a child is its parent + 1.
    pub delegation_depth: u64,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    /// The agent preset the session was composed from, if any.
    pub agent_preset: Option<String>,
}

impl SessionHeader {
    /// A minimal header `{version: 0, id, createdAt}`.
    pub fn new(id: SessionId, created_at_ms: u64) -> SessionHeader {
        SessionHeader {
            version: 0,
            id,
            created_at: created_at_ms,
            cwd: None,
            parent_session: None,
            seed_length: None,
            origin: None,
            delegation_depth: 0,
            agent_preset: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// `Event::to_json_bytes` writes text and reasoning delta payloads by hand: byte for byte
        /// what serde writes, for any text (quotes, backslashes, control characters, non-ASCII),
        /// any numbers and any envelope keys.
        #[test]
        fn the_delta_fast_path_writes_what_serde_writes(
            seq in proptest::prelude::any::<u64>(),
            time in proptest::prelude::any::<i64>(),
            turn in proptest::prelude::any::<u64>(),
            step in proptest::prelude::any::<u64>(),
            index in proptest::prelude::any::<u32>(),
            text in proptest::prop_oneof![".*", "[\\x00-\\x1f\"\\\\\u{7f}\u{2028}a\u{e9}\u{1F600}]{0,12}"],
            reasoning in proptest::prelude::any::<bool>(),
            ignorable in proptest::prelude::any::<bool>(),
            sourced in proptest::prelude::any::<bool>(),
        ) {
            let chunk = if reasoning {
                StreamChunk::ReasoningDelta { index, text }
            } else {
                StreamChunk::TextDelta { index, text }
            };
            let event = Event {
                seq,
                time,
                data: EventData::AssistantChunk(Arc::new(AssistantChunk { turn, step, chunk })),
                ignorable,
                source_event_seqs: sourced.then(|| vec![seq]),
                surface_op: None,
                raw_data: None,
            };
            let serde = serde_json::to_vec(&event).unwrap();
            proptest::prop_assert_eq!(event.to_json_bytes(), serde.clone());
            proptest::prop_assert_eq!(Event::from_json_bytes(&serde).unwrap(), event);
        }
    }

    proptest::proptest! {
        /// `write_json` writes the envelope by hand: byte for byte what serde writes, for any
        /// numbers, optional keys and type name (an `Other` event's is escaped).
        #[test]
        fn the_envelope_fast_path_writes_what_serde_writes(
            seq in proptest::prelude::any::<u64>(),
            time in proptest::prelude::any::<i64>(),
            turn in proptest::prelude::any::<u64>(),
            other in proptest::option::of("[a-z\"\\\\/\\x00-\\x1f\u{e9}]{1,12}"),
            ignorable in proptest::prelude::any::<bool>(),
            seqs in proptest::option::of(
                proptest::collection::vec(proptest::prelude::any::<u64>(), 0..4)
            ),
            op in proptest::option::of(proptest::option::of((
                proptest::prelude::any::<u64>(),
                proptest::prelude::any::<u64>()
            ))),
        ) {
            let data = match other {
                Some(kind) => EventData::Other { kind, data: serde_json::json!({"turn": turn}) },
                None => EventData::TurnStart(TurnStart { turn }),
            };
            let event = Event {
                seq,
                time,
                data,
                ignorable,
                source_event_seqs: seqs,
                surface_op: op.map(|r| match r {
                    Some((start, end)) => SurfaceOp::Replace { start, end },
                    None => SurfaceOp::Append,
                }),
                raw_data: None,
            };
            proptest::prop_assert_eq!(event.to_json_bytes(), serde_json::to_vec(&event).unwrap());
        }
    }

    /// The hand-written envelope against serde over every event of the original's logs (every
    /// type, raw payloads, `sourceEventSeqs`, `surfaceOp`, ignorable unknown types).
    #[test]
    fn write_json_writes_what_serde_writes() {
        let (mut n, mut n_raw, mut n_sourced) = (0, 0, 0);
        for (path, events) in fixture_logs() {
            for event in events {
                assert_eq!(
                    event.to_json_bytes(),
                    serde_json::to_vec(&event).unwrap(),
                    "{}: seq {}",
                    path.display(),
                    event.seq
                );
                n += 1;
                n_raw += usize::from(event.raw_data.is_some());
                n_sourced += usize::from(event.source_event_seqs.is_some());
            }
        }
        assert!(
            n > 1_000 && n_raw > 0 && n_sourced > 0,
            "{n} events, {n_raw} raw, {n_sourced} sourced"
        );
    }

    /// Issue 14 item 4: keys the runtime does not know are kept in place, byte for byte, where the
    /// original keeps them; known keys are still read strictly.
    #[test]
    fn unknown_payload_keys_are_kept_in_place() {
        let lines = [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1,"origin":"x"}}"#,
            r#"{"type":"request/header","seq":1,"time":1,"data":{"header":{"config":{"provider":"p","model":"m","topP":0.5},"system":"s","tools":[{"name":"t","description":"d","parameters":{},"strict":true}],"messagePrefix":[]},"reason":"initial"}}"#,
            r#"{"type":"user/message","seq":2,"time":1,"data":{"content":[{"type":"text","text":"hi","cache":true}],"meta":{"ui":1},"source":{"kind":"user"},"role":"user","id":"u"},"surfaceOp":"append"}"#,
            r#"{"type":"tool/result","seq":3,"time":1,"data":{"turn":1,"step":1,"message":{"source":{"kind":"tool","callId":"c"},"content":[{"type":"tool-result","toolCallId":"c","content":[],"isError":false}],"role":"user","id":"r"},"elapsedMs":3},"surfaceOp":"append"}"#,
            r#"{"type":"request/header","seq":4,"time":1,"data":{"header":{"config":{"provider":"p","model":"m"},"tools":["read","bash"]},"reason":"resume"}}"#,
        ];
        for line in lines {
            let event = Event::from_json(line).unwrap();
            assert!(event.raw_data.is_some(), "{line}");
            assert_eq!(event.to_json(), line);
        }
        let header = Event::from_json(lines[1]).unwrap();
        let EventData::RequestHeader(h) = &header.data else {
            panic!("not a header");
        };
        assert_eq!(h.header.config.model, "m");
        let names = Event::from_json(lines[4]).unwrap();
        let EventData::RequestHeader(h) = &names.data else {
            panic!("not a header");
        };
        let tools: Vec<&str> = h
            .header
            .tools
            .iter()
            .flatten()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(tools, ["read", "bash"]);
        // A known key of the wrong type is still refused.
        for bad in [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":"1","origin":"x"}}"#,
            r#"{"type":"request/header","seq":0,"time":1,"data":{"header":{"config":{"provider":"p","model":7}},"reason":"initial"}}"#,
            r#"{"type":"user/message","seq":0,"time":1,"data":{"content":[{"type":"text","text":1}],"source":{"kind":"user"},"role":"user","id":"u","meta":1},"surfaceOp":"append"}"#,
            r#"{"type":"request/header","seq":0,"time":1,"data":{"header":{"config":{"provider":"p","model":"m"},"tools":[7]},"reason":"initial"}}"#,
        ] {
            assert!(Event::from_json(bad).is_err(), "{bad} accepted");
        }
        let err = Event::from_json(r#"{"type":"request/header","seq":0,"time":1,"data":{"header":{"config":{"provider":"p","model":"m"},"tools":["a",7]},"reason":"initial"}}"#).unwrap_err();
        assert!(
            err.0.starts_with(
                "request/header payload: tools[1] must be a tool schema or a tool name"
            ),
            "{err}"
        );
    }

    /// Issue 14 item 5: the messages the runtime builds are written in the original's key order, so
    /// reading them back keeps no raw copy.
    #[test]
    fn messages_are_written_in_the_originals_key_order() {
        let user = Message::user_text(crate::ids::MessageId::new("u").unwrap(), "hi");
        assert_eq!(
            serde_json::to_string(&user).unwrap(),
            r#"{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"},"role":"user","id":"u"}"#
        );
        let assistant = Message {
            id: crate::ids::MessageId::new("a").unwrap(),
            role: crate::llm::types::Role::Assistant,
            content: vec![crate::llm::types::ContentBlock::text("ok")],
            source: crate::llm::types::MessageSource::model("p", "m"),
        };
        assert_eq!(
            serde_json::to_string(&assistant).unwrap(),
            r#"{"role":"assistant","content":[{"type":"text","text":"ok"}],"source":{"kind":"model","provider":"p","model":"m"},"id":"a"}"#
        );
        let result = Message {
            id: crate::ids::MessageId::new("r").unwrap(),
            role: crate::llm::types::Role::User,
            content: vec![crate::llm::types::ContentBlock::ToolResult {
                tool_call_id: "c".into(),
                content: vec![],
                is_error: Some(false),
            }],
            source: crate::llm::types::MessageSource::tool("c"),
        };
        let line = format!(
            r#"{{"type":"tool/result","seq":0,"time":1,"data":{{"turn":1,"step":1,"message":{}}},"surfaceOp":"append"}}"#,
            serde_json::to_string(&result).unwrap()
        );
        assert!(line.contains(r#""message":{"source":{"kind":"tool","callId":"c"},"content":[{"type":"tool-result","toolCallId":"c","content":[],"isError":false}],"role":"user","id":"r"}"#));
        assert!(Event::from_json(&line).unwrap().raw_data.is_none());
    }

    #[test]
    fn envelope_round_trips_byte_for_byte() {
        let lines = [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"user/message","seq":1,"time":2,"data":{"id":"m1","role":"user","content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            r#"{"type":"assistant/chunk","seq":2,"time":3,"data":{"turn":1,"step":1,"chunk":{"type":"tool-call-delta","index":0,"id":"c1","name":"read","argumentsDelta":"{\"a\""}}}"#,
            r#"{"type":"assistant/message","seq":3,"time":3,"data":{"turn":1,"step":1,"message":{"id":"a","role":"assistant","content":[{"type":"image","attachment":{"x":1}}],"source":{"kind":"model","provider":"p","model":"m"}},"usage":{"inputTokens":1,"outputTokens":2}},"sourceEventSeqs":[2],"surfaceOp":{"op":"replace","start":1,"end":1}}"#,
            r#"{"type":"turn/end","seq":4,"time":5,"data":{"turn":1,"reason":{"kind":"aborted","reason":{"kind":"hook","reason":"x"}}}}"#,
            r#"{"type":"session/title","seq":5,"time":5,"data":{"title":"t","z":1,"a":[1.5,2]}}"#,
            r#"{"type":"future/thing","seq":6,"time":5,"data":null,"ignorable":true}"#,
            r#"{"type":"session/end-seed","seq":7,"time":5,"data":{}}"#,
        ];
        for line in lines {
            let event = Event::from_json(line).unwrap();
            assert_eq!(event.to_json(), line);
        }
    }

    #[test]
    fn reader_refuses_unknown_types_and_envelope_keys() {
        let bad = [
            r#"{"type":"future/thing","seq":0,"time":1,"data":{}}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"extra":1}"#,
            r#"{"type":"turn/start","seq":0,"time":1}"#,
            r#"{"type":"turn/start","seq":0.5,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"ignorable":false}"#,
        ];
        for line in bad {
            assert!(Event::from_json(line).is_err(), "{line} accepted");
        }
    }
}

/// A present optional key must hold a value: `null` is refused instead of being read as absent,
/// because reading it as absent would drop the key on the next write (the original never writes
/// `null` for an absent optional, and its envelope check refuses `ignorable: null`). Where `null` is
/// data (`meta` is any JSON value) it is kept.
#[cfg(test)]
mod null_tests {
    use super::*;

    #[test]
    fn null_optionals_are_refused_and_null_data_is_kept() {
        let refused = [
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"ignorable":null}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"sourceEventSeqs":null}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1},"surfaceOp":null}"#,
            r#"{"type":"assistant/message","seq":0,"time":1,"data":{"turn":1,"step":1,"message":{"id":"a","role":"assistant","content":[],"source":{"kind":"model","provider":"p","model":"m"}},"usage":null},"surfaceOp":"append"}"#,
            r#"{"type":"request/context","seq":0,"time":1,"data":{"provider":"p","model":"m","contextWindow":null}}"#,
            r#"{"type":"agent/inbox/spliced","seq":0,"time":1,"data":{"target":"next-turn","start":0,"removedCount":null,"inserted":[]}}"#,
        ];
        for line in refused {
            assert!(Event::from_json(line).is_err(), "{line} accepted");
        }
        // A typed payload written as an array would come back as an object.
        let err =
            Event::from_json(r#"{"type":"turn/start","seq":0,"time":1,"data":[1]}"#).unwrap_err();
        assert!(
            err.0
                .starts_with("turn/start payload: invalid type: sequence, expected a JSON object"),
            "{err}"
        );
        let kept = r#"{"type":"tool/result","seq":0,"time":1,"data":{"turn":1,"step":1,"message":{"id":"r","role":"user","content":[{"type":"tool-result","toolCallId":"c","content":[]}],"source":{"kind":"tool","callId":"c"}},"meta":null},"surfaceOp":"append"}"#;
        let event = Event::from_json(kept).unwrap();
        assert_eq!(event.to_json(), kept);
        let EventData::ToolResult(r) = &event.data else {
            panic!("not a tool/result");
        };
        assert_eq!(r.meta, Some(Value::Null));
    }
}
