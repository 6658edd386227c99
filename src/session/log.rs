//! Append rules — contiguous seq, surface metadata, `sourceEventSeqs`, message shapes — and the
//! incremental folds a running agent reads: derived messages, last turn, request header and context.
//!
//! `Session::append` validates a draft completely before the log changes; `Session::from_events`
//! validates a log read back from a store the same way (the second half of a paired assertion: the
//! writer checked these events once already).

use std::sync::Arc;

use crate::ids::SessionId;
use crate::llm::types::{ContentBlock, History, Message, RequestHeader, Role};
use crate::session::event::{Event, EventData, KNOWN_EVENT_TYPES, RequestContext, SurfaceOp};
use crate::session::surface::{Surface, SurfaceChange};

/// An event not yet in a log: everything but `seq` and `time`, which `Session::append` assigns.
#[derive(Clone, Debug, PartialEq)]
pub struct EventDraft {
    /// The event's type and payload.
    pub data: EventData,
    /// The seqs of the events this one is derived from (`sourceEventSeqs`).
    pub source_event_seqs: Option<Vec<u64>>,
    /// How the event changes the surface, for a surface-eligible event.
    pub surface_op: Option<SurfaceOp>,
}

impl EventDraft {
    /// A log-only event (no surface metadata).
    pub fn log(data: EventData) -> EventDraft {
        EventDraft {
            data,
            source_event_seqs: None,
            surface_op: None,
        }
    }

    /// A surface event appended at the tail, citing `sources` when given.
    pub fn append(data: EventData, sources: Option<Vec<u64>>) -> EventDraft {
        EventDraft {
            data,
            source_event_seqs: sources,
            surface_op: Some(SurfaceOp::Append),
        }
    }
}

/// Why an event was not appended. The log is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// A surface-eligible event came without its `surfaceOp`.
    #[error("event {kind:?} is surface-eligible and requires a surfaceOp marker")]
    MissingSurfaceOp {
        /// The event's type.
        kind: String,
    },
    /// A log-only event carried surface metadata.
    #[error("event {kind:?} is not surface-eligible and cannot carry {field}")]
    NotSurfaceEligible {
        /// The event's type.
        kind: String,
        /// The field it must not carry (`surfaceOp` or `sourceEventSeqs`).
        field: &'static str,
    },
    /// `sourceEventSeqs` does not name earlier events properly.
    #[error("sourceEventSeqs {reason}")]
    BadSources {
        /// What is wrong with them.
        reason: String,
    },
    /// A surface replacement names a range that is not current surface nodes.
    #[error("surface replace: {reason}")]
    BadReplace {
        /// What is wrong with the range.
        reason: String,
    },
    /// The payload breaks a rule of its type.
    #[error("event {kind:?} has an invalid payload: {reason}")]
    BadPayload {
        /// The event's type.
        kind: String,
        /// The rule it breaks.
        reason: String,
    },
    /// The event's seq is not the next one of the log.
    #[error("session event seq {seq} is not contiguous; expected {expected}")]
    NotContiguous {
        /// The seq the event carries.
        seq: u64,
        /// The seq the log expects next.
        expected: u64,
    },
    /// The event's JSON is over `Limits::event_bytes_max`.
    #[error("event is {bytes} bytes, the limit is {bytes_max}")]
    TooLarge {
        /// The event's JSON size.
        bytes: usize,
        /// The limit.
        bytes_max: usize,
    },
}

/// The room `Session::reserve_for_turn` makes before an agent's first turn: a short text turn's
/// markers, request header, a few dozen chunks and the message.
pub const FIRST_TURN_EVENTS: u64 = 48;

/// One agent's log in memory with its incremental folds.
#[derive(Debug, Clone)]
pub struct Session {
    id: SessionId,
    /// Invariant: `events[i].seq == i`.
    events: Vec<Event>,
    surface: Surface,
    /// The surface projected to messages, skipping content-less assistant messages.
    ///
    /// Invariant: equals `project(surface.nodes)`; rebuilt from scratch when a replacement commits,
    /// extended in place by appends.
    messages: History,
    /// `turn` of the last `turn/start`, or 0.
    last_turn: u64,
    /// Seq of the last `turn/start`, if any (how many events a turn takes: `reserve_for_turn`).
    last_turn_seq: Option<u64>,
    /// The canonical form of the last `request/header` event's header.
    ///
    /// Invariant: equals `fold_request_header(events, None)`; a request is rebuilt from it and the
    /// surface, so it must be the canonical form (an empty `tools` or `system` is absent). Boxed: a
    /// `Session` is embedded in the runtime's per-agent state and should stay small.
    header: Option<Box<RequestHeader>>,
    /// Index of the last `request/context` event.
    context_idx: Option<usize>,
}

impl Session {
    /// An empty log.
    pub fn new(id: SessionId) -> Session {
        Session {
            id,
            events: Vec::new(),
            surface: Surface::default(),
            messages: History::new(),
            last_turn: 0,
            last_turn_seq: None,
            header: None,
            context_idx: None,
        }
    }

    /// A log read back from a store or an import: every event is validated as `append` would (seq,
    /// surface rules, payload shapes) and the folds are built.
    ///
    /// # Errors
    /// The first invalid event, with its seq.
    pub fn from_events(id: SessionId, events: Vec<Event>) -> Result<Session, (u64, AppendError)> {
        let mut session = Session::new(id);
        session.events.reserve_exact(events.len());
        for event in events {
            let seq = event.seq;
            session.push_checked(event).map_err(|e| (seq, e))?;
        }
        Ok(session)
    }

    /// The session's id.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// The whole log, in seq order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Drops from memory the payloads of the `assistant/chunk` events with seq in `from..to`: each
    /// then points at the shared `AssistantChunk::elided()` placeholder. Nothing in a live session
    /// reads a chunk back once its message is assembled (the surface, the history and the request
    /// header never cite one), but the events are no longer the log: the caller must answer log
    /// reads from the store, where the chunks are (so elide only durable events). Also gives back
    /// the events vector's spare capacity when it is more than a third of it, keeping a quarter of
    /// its length as headroom, so an agent idle after a turn does not keep the slack of its last
    /// doubling. The headroom is what keeps this rare: trimmed to the length itself, the next
    /// turn's first append doubled the vector again and the turn's end trimmed it back, so every
    /// turn reallocated (copied or remapped) the whole log. Now the vector reallocates once per
    /// quarter of growth, as geometric growth does. Returns how many payloads were dropped.
    pub fn elide_chunks(&mut self, from: u64, to: u64) -> usize {
        let end = usize::try_from(to)
            .unwrap_or(usize::MAX)
            .min(self.events.len());
        let start = usize::try_from(from).unwrap_or(usize::MAX).min(end);
        let elided = crate::session::event::AssistantChunk::elided();
        let mut n = 0;
        for event in &mut self.events[start..end] {
            if let EventData::AssistantChunk(chunk) = &mut event.data
                && !Arc::ptr_eq(chunk, &elided)
            {
                *chunk = Arc::clone(&elided);
                n += 1;
            }
        }
        let len = self.events.len();
        if self.events.capacity() - len > self.events.capacity() / 3 {
            self.events.shrink_to(len + len / 4);
        }
        n
    }

    /// The events vector's capacity (tests: how often the log is reallocated).
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.events.capacity()
    }

    /// Gives the log up (for hibernation: the events are dropped, the store keeps them).
    pub fn into_events(self) -> Vec<Event> {
        self.events
    }

    /// Makes room for the turn about to start, so its events do not grow the log by doubling from
    /// a small vector (four reallocations and copies for a fresh agent's first turn, each into
    /// fresh memory when many agents start at once): as many events as the last turn took with
    /// the inputs that followed it, or `FIRST_TURN_EVENTS` before the first. A log with room
    /// already is left alone, and one without grows as a push would (at least doubling).
    pub fn reserve_for_turn(&mut self) {
        let expected = self
            .last_turn_seq
            .map_or(FIRST_TURN_EVENTS, |seq| self.next_seq().saturating_sub(seq));
        self.events
            .reserve(usize::try_from(expected).unwrap_or(0).max(1));
    }

    /// The seq the next appended event receives (= number of events).
    pub fn next_seq(&self) -> u64 {
        self.events.len() as u64
    }

    /// The last event, if any.
    pub fn last(&self) -> Option<&Event> {
        self.events.last()
    }

    /// Validates `draft` against the log and appends it with the next seq and `time`.
    ///
    /// # Errors
    /// `AppendError` naming the broken rule; the log and every fold are unchanged.
    pub fn append(&mut self, draft: EventDraft, time: i64) -> Result<&Event, AppendError> {
        let event = Event {
            seq: self.next_seq(),
            time,
            data: draft.data,
            ignorable: false,
            source_event_seqs: draft.source_event_seqs,
            surface_op: draft.surface_op,
            raw_data: None,
        };
        self.push_checked(event)?;
        Ok(self.events.last().expect("an event was just pushed"))
    }

    /// Appends an event that already has its seq and time (replaying a tail written while the log was
    /// not in memory), with the same validation as `append`.
    ///
    /// # Errors
    /// `AppendError` naming the broken rule; the log is unchanged.
    pub fn push_event(&mut self, event: Event) -> Result<(), AppendError> {
        self.push_checked(event)
    }

    fn push_checked(&mut self, event: Event) -> Result<(), AppendError> {
        let expected = self.next_seq();
        if event.seq != expected {
            return Err(AppendError::NotContiguous {
                seq: event.seq,
                expected,
            });
        }
        check_payload(&event)?;
        let change = self.surface.plan(&event, &self.events)?;
        // Validated: from here on nothing can fail, so the folds stay consistent with the log.
        self.surface.apply(&change, event.seq);
        match change {
            SurfaceChange::None => {}
            SurfaceChange::Append => {
                if let Some(m) = project(&event) {
                    self.messages.push(Arc::clone(m));
                }
            }
            SurfaceChange::Replace { .. } => {}
        }
        match &event.data {
            EventData::TurnStart(t) => {
                self.last_turn = t.turn;
                self.last_turn_seq = Some(event.seq);
            }
            EventData::RequestHeader(h) => {
                self.header = Some(Box::new(h.header.clone().canonical()));
            }
            EventData::RequestContext(_) => self.context_idx = Some(self.events.len()),
            _ => {}
        }
        self.events.push(event);
        if matches!(change, SurfaceChange::Replace { .. }) {
            self.rebuild_messages();
        }
        Ok(())
    }

    fn rebuild_messages(&mut self) {
        let events = &self.events;
        self.messages = self
            .surface
            .nodes
            .iter()
            .filter_map(|&seq| events.get(seq as usize).and_then(project).cloned())
            .collect();
    }

    /// The surface fold (nodes and replace generation).
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// The model-visible history: the surface projected to messages (content-less assistant messages
    /// skipped). Each call returns a fresh vector over shared messages.
    pub fn derive_messages(&self) -> Vec<Arc<Message>> {
        self.messages.to_vec()
    }

    /// The model-visible history without copying.
    pub fn messages(&self) -> &History {
        &self.messages
    }

    /// The model-visible history as a snapshot that later appends do not change: one `Arc` clone,
    /// whatever the length (what a request carries).
    pub fn history(&self) -> History {
        self.messages.clone()
    }

    /// The number of the last `turn/start` in the log, or 0.
    pub fn last_turn(&self) -> u64 {
        self.last_turn
    }

    /// The canonical header of the last `request/header` event, if any.
    pub fn request_header(&self) -> Option<&RequestHeader> {
        self.header.as_deref()
    }

    /// The payload of the last `request/context` event, if any.
    pub fn request_context(&self) -> Option<&RequestContext> {
        match self.context_idx.map(|i| &self.events[i].data) {
            Some(EventData::RequestContext(c)) => Some(c),
            _ => None,
        }
    }
}

/// The canonical header of the last `request/header` event in `events`, or `from` when there is none
/// (`foldRequestHeader`, `reference/session-llm.md` §4.3).
pub fn fold_request_header(events: &[Event], from: Option<RequestHeader>) -> Option<RequestHeader> {
    events
        .iter()
        .rev()
        .find_map(|e| match &e.data {
            EventData::RequestHeader(h) => Some(h.header.clone().canonical()),
            _ => None,
        })
        .or_else(|| from.map(RequestHeader::canonical))
}

/// Whether two headers describe the same request envelope: equal canonical forms (§4.3). Every field
/// counts, the adapter-default markers included, and tools compare in order; an empty `tools` or
/// `system` equals an absent one.
pub fn header_equals(a: &RequestHeader, b: &RequestHeader) -> bool {
    a.clone().canonical() == b.clone().canonical()
}

/// The message an event contributes to derived history: `user/message` and `tool/result` messages,
/// and `assistant/message` messages that have content.
pub fn project(event: &Event) -> Option<&Arc<Message>> {
    match &event.data {
        EventData::UserMessage(m) => Some(m),
        EventData::AssistantMessage(a) if !a.message.content.is_empty() => Some(&a.message),
        EventData::ToolResult(r) => Some(&r.message),
        _ => None,
    }
}

/// Shape checks the type system does not already enforce (§1.9 and §1.5).
fn check_payload(event: &Event) -> Result<(), AppendError> {
    let bad = |reason: String| AppendError::BadPayload {
        kind: event.kind().to_string(),
        reason,
    };
    match &event.data {
        EventData::UserMessage(m) if m.role != Role::User => {
            return Err(bad("user/message must have role user".into()));
        }
        EventData::AssistantMessage(a) => {
            let m = &a.message;
            if m.role != Role::Assistant {
                return Err(bad("assistant/message must have role assistant".into()));
            }
            let src = &m.source;
            let named = |k| src.str_field(k).is_some_and(|v: &str| !v.is_empty());
            if src.kind() != "model" || !named("provider") || !named("model") {
                return Err(bad(
                    "assistant message source must be {kind:model, provider, model}".into(),
                ));
            }
            if a.interrupted == Some(false) {
                return Err(bad("interrupted must be true when present".into()));
            }
        }
        EventData::ToolResult(r) => {
            let m = &r.message;
            if m.role != Role::User {
                return Err(bad("tool result message must have role user".into()));
            }
            let call_id = match (m.source.kind(), m.source.str_field("callId")) {
                ("tool", Some(id)) if !id.is_empty() => id,
                _ => return Err(bad("tool result source must be {kind:tool, callId}".into())),
            };
            match m.content.as_slice() {
                [ContentBlock::ToolResult { tool_call_id, .. }] if tool_call_id == call_id => {}
                [ContentBlock::ToolResult { .. }] => {
                    return Err(bad("tool-result toolCallId must equal source.callId".into()));
                }
                _ => {
                    return Err(bad(
                        "tool result content must be one tool-result block".into()
                    ));
                }
            }
        }
        EventData::RequestHeader(h) => {
            let c = &h.header.config;
            if c.provider.is_empty() || c.model.is_empty() {
                return Err(bad("request/header config lacks provider/model".into()));
            }
            if c.reasoning_effort.as_deref() == Some("") {
                return Err(bad("request/header has an invalid reasoningEffort".into()));
            }
            if let Some(d) = &h.header.adapter_defaults {
                let ok = d
                    .reasoning_effort
                    .is_none_or(|v| v && c.reasoning_effort.is_some())
                    && d.max_tokens.is_none_or(|v| v && c.max_tokens.is_some());
                if !ok {
                    return Err(bad("request/header has invalid adapterDefaults".into()));
                }
            }
        }
        EventData::LlmRetry(r) => {
            r.failure.validate().map_err(bad)?;
        }
        EventData::TurnEnd(t) => {
            if let crate::session::event::TurnEndReason::Error { error } = &t.reason {
                error.validate().map_err(bad)?;
            }
        }
        EventData::Other { kind, .. } => {
            // An `Other` event is written as `{type: kind, data}`; the reader types it again by `kind`.
            // A typed kind here would bypass its payload checks, and a kind the reader refuses (an
            // unknown one without `ignorable`, or a retired one) would make the log unreadable.
            if TYPED_KINDS.contains(&kind.as_str()) {
                return Err(bad(format!(
                    "{kind} must be appended with its typed payload"
                )));
            }
            if RETIRED_KINDS.contains(&kind.as_str()) {
                return Err(bad(format!("{kind} is a retired event type")));
            }
            if !event.ignorable && !KNOWN_EVENT_TYPES.contains(&kind.as_str()) {
                return Err(bad(format!(
                    "{kind:?} is not a known event type, and the reader refuses unknown types that are not ignorable"
                )));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The kinds `EventData` has a typed variant for.
const TYPED_KINDS: &[&str] = &[
    "agent/inbox/spliced",
    "turn/start",
    "turn/end",
    "step/start",
    "step/end",
    "user/message",
    "request/header",
    "request/context",
    "assistant/chunk",
    "assistant/message",
    "tool/call",
    "tool/result",
    "llm/retry",
    "llm/retry-started",
    "session/end-seed",
];

/// Kinds the original removed; its reader refuses or reinterprets them (`reference/session-llm.md` §5.7).
const RETIRED_KINDS: &[&str] = &["request/header-delta", "mode/set", "steering/message"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MessageId;
    use crate::llm::types::MessageSource;
    use crate::session::event::{AssistantMessageEvent, StepRef, ToolResultEvent, TurnStart};

    fn sid() -> SessionId {
        SessionId::new("s1").unwrap()
    }

    fn user(id: &str, text: &str) -> EventDraft {
        EventDraft::append(
            EventData::UserMessage(Arc::new(Message::user_text(
                MessageId::new(id).unwrap(),
                text,
            ))),
            None,
        )
    }

    fn assistant(content: Vec<ContentBlock>) -> EventData {
        EventData::AssistantMessage(Box::new(AssistantMessageEvent {
            turn: 1,
            step: 1,
            message: Arc::new(Message {
                id: MessageId::new("a1").unwrap(),
                role: Role::Assistant,
                content,
                source: MessageSource::model("p", "m"),
            }),
            usage: None,
            interrupted: None,
        }))
    }

    fn tool_result(call: &str, text: &str) -> EventData {
        EventData::ToolResult(Box::new(ToolResultEvent {
            turn: 1,
            step: 1,
            message: Arc::new(Message {
                id: MessageId::new(&format!("r-{call}")).unwrap(),
                role: Role::User,
                content: vec![ContentBlock::ToolResult {
                    tool_call_id: call.into(),
                    content: vec![ContentBlock::text(text)],
                    is_error: Some(false),
                }],
                source: MessageSource::tool(call),
            }),
            error: None,
            meta: None,
        }))
    }

    #[test]
    fn derives_history_from_the_surface_only() {
        let mut s = Session::new(sid());
        s.append(
            EventDraft::log(EventData::TurnStart(TurnStart { turn: 1 })),
            0,
        )
        .unwrap();
        s.append(user("u1", "hi"), 0).unwrap();
        s.append(
            EventDraft::log(EventData::StepStart(StepRef { turn: 1, step: 1 })),
            0,
        )
        .unwrap();
        s.append(
            EventDraft::append(
                assistant(vec![
                    ContentBlock::text("x"),
                    ContentBlock::ToolCall {
                        id: "c1".into(),
                        name: "t".into(),
                        arguments: "{}".into(),
                    },
                ]),
                Some(vec![]),
            ),
            0,
        )
        .unwrap();
        s.append(EventDraft::append(tool_result("c1", "ok"), None), 0)
            .unwrap();
        let roles: Vec<Role> = s.derive_messages().iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
        assert_eq!(s.surface().nodes, [1, 3, 4]);
        assert_eq!(s.last_turn(), 1);
    }

    #[test]
    fn replace_shadows_a_range_and_rebuilds_history() {
        let mut s = Session::new(sid());
        s.append(user("u1", "a"), 0).unwrap();
        s.append(user("u2", "b"), 0).unwrap();
        s.append(user("u3", "c"), 0).unwrap();
        let summary = EventDraft {
            data: EventData::UserMessage(Arc::new(Message::user_text(
                MessageId::new("sum").unwrap(),
                "summary",
            ))),
            source_event_seqs: Some(vec![0, 1]),
            surface_op: Some(SurfaceOp::Replace { start: 0, end: 1 }),
        };
        s.append(summary, 0).unwrap();
        assert_eq!(s.surface().nodes, [3, 2]);
        assert_eq!(s.surface().replace_generation, 1);
        let texts: Vec<String> = s.derive_messages().iter().map(|m| m.text()).collect();
        assert_eq!(texts, ["summary", "c"]);
        // Replacing "start after end" in surface order is refused and changes nothing.
        let bad = EventDraft {
            data: EventData::UserMessage(Arc::new(Message::user_text(
                MessageId::new("x").unwrap(),
                "x",
            ))),
            source_event_seqs: Some(vec![2, 3]),
            surface_op: Some(SurfaceOp::Replace { start: 2, end: 3 }),
        };
        assert_eq!(
            s.append(bad, 0).unwrap_err(),
            AppendError::BadReplace {
                reason: "start seq 2 (index 1) is after end seq 3 (index 0)".into()
            }
        );
        assert_eq!(s.next_seq(), 4);
    }

    #[test]
    fn surface_markers_are_mandatory_and_exclusive() {
        let mut s = Session::new(sid());
        let no_op = EventDraft::log(EventData::UserMessage(Arc::new(Message::user_text(
            MessageId::new("u").unwrap(),
            "x",
        ))));
        assert!(matches!(
            s.append(no_op, 0),
            Err(AppendError::MissingSurfaceOp { .. })
        ));
        let marked = EventDraft {
            data: EventData::TurnStart(TurnStart { turn: 1 }),
            source_event_seqs: None,
            surface_op: Some(SurfaceOp::Append),
        };
        assert!(matches!(
            s.append(marked, 0),
            Err(AppendError::NotSurfaceEligible { .. })
        ));
        assert_eq!(s.next_seq(), 0);
    }

    #[test]
    fn empty_assistant_messages_stay_on_the_surface_but_derive_to_nothing() {
        let mut s = Session::new(sid());
        s.append(EventDraft::append(assistant(vec![]), Some(vec![])), 0)
            .unwrap();
        assert_eq!(s.surface().nodes, [0]);
        assert!(s.derive_messages().is_empty());
    }

    #[test]
    fn tool_result_rewrites_may_change_only_content() {
        let mut s = Session::new(sid());
        s.append(EventDraft::append(tool_result("c1", "long"), None), 0)
            .unwrap();
        let rewrite = |data| EventDraft {
            data,
            source_event_seqs: Some(vec![0]),
            surface_op: Some(SurfaceOp::Replace { start: 0, end: 0 }),
        };
        assert!(matches!(
            s.clone().append(rewrite(tool_result("c2", "short")), 0),
            Err(AppendError::BadReplace { .. })
        ));
        s.append(rewrite(tool_result("c1", "short")), 0).unwrap();
        assert_eq!(s.surface().nodes, [1]);
    }

    #[test]
    fn from_events_rejects_a_gap() {
        let mut s = Session::new(sid());
        s.append(user("u1", "a"), 0).unwrap();
        let mut events = s.events().to_vec();
        let mut second = events[0].clone();
        second.seq = 5;
        events.push(second);
        let err = Session::from_events(sid(), events).unwrap_err();
        assert_eq!(
            err,
            (
                5,
                AppendError::NotContiguous {
                    seq: 5,
                    expected: 1
                }
            )
        );
    }
}

/// The original's `Session` catalogue (`reference/session-llm.md` §9.1), its derived-history cache
/// (§9.4) and request-header folds (§9.11), where Rust has an analogue.
///
/// Facts the type system already gives (not tests): §9.1 1 (`surface()` hands out a shared borrow of
/// the one fold), 12 and 32–33 (an appended or seeded event is moved into the log, so the caller keeps
/// nothing to mutate later), 16 (derived messages are `Arc<Message>` with no interior mutability),
/// 17, 20, 26–28 and 35–36 (`EventData` cannot hold BigInt, functions, symbols, NaN or class
/// instances; only the JSON reader sees such text, and it refuses it), 40 and 42–43 (`events()` and the
/// header are shared borrows: frozen by the borrow checker), §9.11 12 (`request_context()` returns a
/// shared borrow). JavaScript-only mechanics with no analogue: 24, 25, 30, 34 and 37 (getters read
/// once), 29 (null-prototype objects). No analogue in the pure core: 8 and §9.9 3–4 (`session/end-seed`
/// is written by the runtime on resume, not by `Session`), 41 (deep nesting is bounded where JSON
/// enters: `session::store::jsonl` refuses it before parsing), 47–72 (the Cordis store: lifecycle,
/// scopes, dispatch and observers belong to the actor runtime), 74 (there is no todo fold).
#[cfg(test)]
mod catalogue_tests {
    use super::*;
    use crate::ids::MessageId;
    use crate::llm::types::{AdapterDefaults, LlmCallConfig, MessageSource, ToolSchema};
    use crate::session::event::{
        CancelCause, HeaderReason, RequestHeaderEvent, StepRef, TurnEnd, TurnEndReason, TurnStart,
    };
    use serde_json::json;

    fn sid() -> SessionId {
        SessionId::new("s1").unwrap()
    }

    fn parse(json: &str) -> Event {
        Event::from_json(json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    /// Parses JSON event lines, giving each the seq of its position (`SEQ` in the text).
    fn log(lines: &[&str]) -> Vec<Event> {
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| parse(&l.replace("SEQ", &i.to_string())))
            .collect()
    }

    fn draft_of(e: Event) -> EventDraft {
        EventDraft {
            data: e.data,
            source_event_seqs: e.source_event_seqs,
            surface_op: e.surface_op,
        }
    }

    /// Appends a JSON line (its seq is assigned by the session).
    fn append(s: &mut Session, line: &str) -> Result<Event, AppendError> {
        let e = parse(&line.replace("SEQ", &s.next_seq().to_string()));
        s.append(draft_of(e), 7).cloned()
    }

    fn user_msg(id: &str, text: &str, source: MessageSource) -> Arc<Message> {
        Arc::new(Message {
            id: MessageId::new(id).unwrap(),
            role: Role::User,
            content: vec![ContentBlock::text(text)],
            source,
        })
    }

    const TURN_START: &str = r#"{"type":"turn/start","seq":SEQ,"time":0,"data":{"turn":1}}"#;
    const STEP_START: &str =
        r#"{"type":"step/start","seq":SEQ,"time":0,"data":{"turn":1,"step":1}}"#;
    const STEP_END: &str = r#"{"type":"step/end","seq":SEQ,"time":0,"data":{"turn":1,"step":1}}"#;
    const USER: &str = r#"{"type":"user/message","seq":SEQ,"time":0,"data":{"id":"u1","role":"user","content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#;
    const CHUNK: &str = r#"{"type":"assistant/chunk","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"x"}}}"#;
    const ASSISTANT_CALLS: &str = r#"{"type":"assistant/message","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"message":{"id":"a1","role":"assistant","content":[{"type":"text","text":"x"},{"type":"tool-call","id":"c1","name":"read","arguments":"{}"}],"source":{"kind":"model","provider":"p","model":"m"}}},"sourceEventSeqs":[3],"surfaceOp":"append"}"#;
    const CALL: &str = r#"{"type":"tool/call","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"callId":"c1","name":"read","arguments":"{}"}}"#;
    const RESULT: &str = r#"{"type":"tool/result","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"message":{"id":"r1","role":"user","content":[{"type":"tool-result","toolCallId":"c1","content":[{"type":"text","text":"ok"}],"isError":false}],"source":{"kind":"tool","callId":"c1"}}},"sourceEventSeqs":[5],"surfaceOp":"append"}"#;
    const TURN_END: &str =
        r#"{"type":"turn/end","seq":SEQ,"time":0,"data":{"turn":1,"reason":{"kind":"completed"}}}"#;
    const EMPTY_ASSISTANT: &str = r#"{"type":"assistant/message","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"message":{"id":"a0","role":"assistant","content":[],"source":{"kind":"model","provider":"p","model":"m"}},"usage":{"inputTokens":3,"outputTokens":0}},"sourceEventSeqs":[],"surfaceOp":"append"}"#;

    fn full_turn() -> Vec<Event> {
        log(&[
            TURN_START,
            USER,
            STEP_START,
            CHUNK,
            ASSISTANT_CALLS,
            CALL,
            RESULT,
            STEP_END,
            TURN_END,
        ])
    }

    /// The from-scratch derivation: fold the surface offline, project every node.
    fn scratch(events: &[Event]) -> Vec<Arc<Message>> {
        let folded = crate::session::surface::fold_surface(events).unwrap();
        folded
            .nodes
            .iter()
            .filter_map(|&seq| project(&events[seq as usize]).cloned())
            .collect()
    }

    /// §9.1 2. derives message history from the event log
    /// Room for a turn is made once, before its `turn/start`: `FIRST_TURN_EVENTS` for the first,
    /// then as many as the last turn took with what followed it; a log with room is left alone.
    #[test]
    fn a_turn_is_given_the_room_the_last_one_took() {
        let mut s = Session::new(sid());
        s.reserve_for_turn();
        assert_eq!(s.capacity(), FIRST_TURN_EVENTS as usize);
        // The first turn: 100 events, so the vector grows past its first room by pushing.
        append(&mut s, TURN_START).expect("turn/start");
        for _ in 1..100 {
            append(&mut s, CHUNK).expect("chunk");
        }
        let before = s.capacity();
        assert!(before >= 100);
        // The second turn expects 100 events more, and gets them before its first push.
        s.reserve_for_turn();
        assert!(s.capacity() >= 200, "capacity {}", s.capacity());
        let room = s.capacity();
        append(&mut s, &TURN_START.replace(r#""turn":1"#, r#""turn":2"#)).expect("turn/start");
        for _ in 1..100 {
            append(&mut s, &CHUNK.replace(r#""turn":1"#, r#""turn":2"#)).expect("chunk");
        }
        assert_eq!(s.capacity(), room, "the turn fit in the room made for it");
        // A log that already has the room is not reallocated.
        s.reserve_for_turn();
        let again = s.capacity();
        s.reserve_for_turn();
        assert_eq!(s.capacity(), again);
    }

    #[test]
    fn derives_message_history_from_the_log() {
        let s = Session::from_events(sid(), full_turn()).unwrap();
        let messages = s.derive_messages();
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
        assert_eq!(
            messages[1].content.len(),
            2,
            "the assistant keeps text and tool call"
        );
        assert_eq!(
            messages[1].tool_calls().map(|c| c.id).collect::<Vec<_>>(),
            ["c1"]
        );
        assert!(matches!(
            messages[2].content.as_slice(),
            [ContentBlock::ToolResult { tool_call_id, .. }] if tool_call_id == "c1"
        ));
        assert!(
            messages
                .iter()
                .all(|m| m.text() != "x" || m.role == Role::Assistant),
            "no chunk"
        );
    }

    /// §9.1 3 and 4. turn-end reasons round-trip through JSON and through a replay of the log
    #[test]
    fn turn_end_reasons_round_trip() {
        let reasons = [
            TurnEndReason::MaxTokens,
            TurnEndReason::Aborted {
                reason: CancelCause::User,
            },
            TurnEndReason::Aborted {
                reason: CancelCause::Hook {
                    reason: "stop".into(),
                },
            },
            TurnEndReason::Blocked,
            TurnEndReason::Interrupted,
            TurnEndReason::Error {
                error: crate::llm::types::LlmFailure::new("SERVER", "boom"),
            },
        ];
        for reason in reasons {
            let mut s = Session::new(sid());
            s.append(
                EventDraft::log(EventData::TurnStart(TurnStart { turn: 1 })),
                1,
            )
            .unwrap();
            let end = s
                .append(
                    EventDraft::log(EventData::TurnEnd(Box::new(TurnEnd {
                        turn: 1,
                        reason: reason.clone(),
                    }))),
                    2,
                )
                .unwrap()
                .clone();
            assert_eq!(parse(&end.to_json()), end);
            let replayed = Session::from_events(sid(), s.events().to_vec()).unwrap();
            assert_eq!(replayed.events(), s.events());
            assert_eq!(
                replayed.events()[1].data,
                EventData::TurnEnd(Box::new(TurnEnd { turn: 1, reason }))
            );
        }
    }

    /// §9.1 5 and 6. injected context and user prompts derive verbatim as user messages, ids and
    /// sources kept
    #[test]
    fn injected_context_and_prompts_are_user_messages() {
        let mut s = Session::new(sid());
        let context = user_msg("ctx-1", "context", MessageSource::plugin("@x/ctx"));
        let prompt = user_msg("m-1", "prompt", MessageSource::user());
        for m in [&context, &prompt] {
            s.append(
                EventDraft::append(EventData::UserMessage(Arc::clone(m)), None),
                0,
            )
            .unwrap();
        }
        assert_eq!(s.derive_messages(), [context.clone(), prompt]);
        assert!(
            s.events()[0]
                .to_json()
                .contains(r#""source":{"kind":"plugin","plugin":"@x/ctx"}"#)
        );
    }

    /// §9.1 7, 22–23 and §9.9 3. a log replayed from its events derives the same history and
    /// continues at the same seq
    #[test]
    fn replays_identically_from_a_seeded_log() {
        let events = full_turn();
        let mut live = Session::new(sid());
        for e in events.clone() {
            live.append(draft_of(e), 0).unwrap();
        }
        let replayed = Session::from_events(sid(), events).unwrap();
        assert_eq!(replayed.derive_messages(), live.derive_messages());
        assert_eq!(replayed.next_seq(), 9);
        assert_eq!(replayed.last_turn(), 1);
    }

    /// §9.1 9 and 10. malformed shapes are refused on load with their specific reasons
    #[test]
    fn refuses_malformed_shapes_on_load() {
        // Refused by the reader (the payload does not even type).
        let unreadable = [
            // pre-provider request header
            r#"{"type":"request/header","seq":0,"time":0,"data":{"header":{"config":{"model":"m"}},"reason":"initial"}}"#,
            // string header
            r#"{"type":"request/header","seq":0,"time":0,"data":{"header":"h","reason":"initial"}}"#,
            // flat old assistant payload
            r#"{"type":"assistant/message","seq":0,"time":0,"data":{"turn":1,"step":1,"content":[],"provenance":{"provider":"p","model":"m"}},"surfaceOp":"append"}"#,
            // null data, null source, non-array content
            r#"{"type":"user/message","seq":0,"time":0,"data":null,"surfaceOp":"append"}"#,
            r#"{"type":"user/message","seq":0,"time":0,"data":{"id":"u","role":"user","content":[],"source":null},"surfaceOp":"append"}"#,
            r#"{"type":"user/message","seq":0,"time":0,"data":{"id":"u","role":"user","content":"hi","source":{"kind":"user"}},"surfaceOp":"append"}"#,
        ];
        for line in unreadable {
            assert!(Event::from_json(line).is_err(), "{line} accepted");
        }
        // Refused by `from_events` with the original's reasons.
        let refused = [
            (
                r#"{"type":"request/header","seq":0,"time":0,"data":{"header":{"config":{"provider":"","model":"m"}},"reason":"initial"}}"#,
                "request/header config lacks provider/model",
            ),
            (
                r#"{"type":"user/message","seq":0,"time":0,"data":{"id":"u","role":"assistant","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
                "user/message must have role user",
            ),
            (
                r#"{"type":"assistant/message","seq":0,"time":0,"data":{"turn":1,"step":1,"message":{"id":"a","role":"user","content":[],"source":{"kind":"model","provider":"p","model":"m"}}},"surfaceOp":"append"}"#,
                "assistant/message must have role assistant",
            ),
            (
                r#"{"type":"assistant/message","seq":0,"time":0,"data":{"turn":1,"step":1,"message":{"id":"a","role":"assistant","content":[],"source":{"kind":"user"}}},"surfaceOp":"append"}"#,
                "assistant message source must be {kind:model, provider, model}",
            ),
            (
                r#"{"type":"tool/result","seq":0,"time":0,"data":{"turn":1,"step":1,"message":{"id":"r","role":"user","content":[{"type":"tool-result","toolCallId":"c","content":[]}],"source":{"kind":"user"}}},"surfaceOp":"append"}"#,
                "tool result source must be {kind:tool, callId}",
            ),
            (
                r#"{"type":"tool/result","seq":0,"time":0,"data":{"turn":1,"step":1,"message":{"id":"r","role":"user","content":[{"type":"text","text":"x"}],"source":{"kind":"tool","callId":"c"}}},"surfaceOp":"append"}"#,
                "tool result content must be one tool-result block",
            ),
            (
                r#"{"type":"tool/result","seq":0,"time":0,"data":{"turn":1,"step":1,"message":{"id":"r","role":"user","content":[{"type":"tool-result","toolCallId":"d","content":[]}],"source":{"kind":"tool","callId":"c"}}},"surfaceOp":"append"}"#,
                "tool-result toolCallId must equal source.callId",
            ),
        ];
        for (line, reason) in refused {
            let e = parse(line);
            let kind = e.kind().to_string();
            assert_eq!(
                Session::from_events(sid(), vec![e]).unwrap_err(),
                (
                    0,
                    AppendError::BadPayload {
                        kind,
                        reason: reason.into()
                    }
                ),
                "{line}"
            );
        }
        // A plugin type of the original with `data: null` is data, not a shape error.
        let plugin = parse(r#"{"type":"session/title","seq":0,"time":0,"data":null}"#);
        assert!(Session::from_events(sid(), vec![plugin]).is_ok());
    }

    /// §9.1 11. plugin-owned block types and source kinds are kept without validation
    #[test]
    fn plugin_blocks_and_sources_are_kept_verbatim() {
        let line = r#"{"type":"user/message","seq":SEQ,"time":0,"data":{"content":[{"type":"image","attachment":{"id":"x","mime":"image/png"}},{"type":"x-plugin","v":[1,{"a":null}]}],"source":{"kind":"x-plugin","extra":true},"role":"user","id":"u"},"surfaceOp":"append"}"#;
        let mut s = Session::new(sid());
        let e = append(&mut s, line).unwrap();
        assert_eq!(
            e.to_json(),
            line.replace("SEQ", "0")
                .replace(r#""time":0"#, r#""time":7"#)
        );
        assert_eq!(s.derive_messages()[0].source.kind(), "x-plugin");
    }

    /// §9.1 14. a non-empty reasoning effort round-trips; an empty or non-string one is refused
    #[test]
    fn reasoning_effort_is_opaque_but_non_empty() {
        let header = |effort: &str| {
            format!(
                r#"{{"type":"request/header","seq":0,"time":0,"data":{{"header":{{"config":{{"provider":"p","model":"m","reasoningEffort":{effort}}}}},"reason":"initial"}}}}"#
            )
        };
        let ok = parse(&header(r#""max-ish""#));
        assert_eq!(ok.to_json(), header(r#""max-ish""#));
        assert!(Session::from_events(sid(), vec![ok]).is_ok());
        assert_eq!(
            Session::from_events(sid(), vec![parse(&header(r#""""#))])
                .unwrap_err()
                .1,
            AppendError::BadPayload {
                kind: "request/header".into(),
                reason: "request/header has an invalid reasoningEffort".into()
            }
        );
        assert!(Event::from_json(&header("1")).is_err());
    }

    /// §9.1 15. adapter-default markers round-trip and invalid ones are refused
    #[test]
    fn adapter_default_markers_are_checked() {
        let header = |config: &str, defaults: &str| {
            format!(
                r#"{{"type":"request/header","seq":0,"time":0,"data":{{"header":{{"config":{{"provider":"p","model":"m"{config}}},"adapterDefaults":{defaults}}},"reason":"initial"}}}}"#
            )
        };
        let ok = header(r#","maxTokens":100"#, r#"{"maxTokens":true}"#);
        assert_eq!(parse(&ok).to_json(), ok);
        assert!(Session::from_events(sid(), vec![parse(&ok)]).is_ok());
        let invalid = AppendError::BadPayload {
            kind: "request/header".into(),
            reason: "request/header has invalid adapterDefaults".into(),
        };
        for (config, defaults) in [
            (r#","maxTokens":100"#, r#"{"maxTokens":false}"#),
            ("", r#"{"reasoningEffort":true}"#),
            ("", r#"{"maxTokens":true}"#),
        ] {
            let e = parse(&header(config, defaults));
            assert_eq!(
                Session::from_events(sid(), vec![e]).unwrap_err().1,
                invalid,
                "{defaults}"
            );
        }
        assert!(Event::from_json(&header(r#","maxTokens":100"#, r#"{"unknown":true}"#)).is_err());
        // `adapterDefaults: null` reads as absent and `[]` as `{}` (serde's derived structs accept
        // both; the original refuses them), but the event keeps its payload as written, so neither
        // is dropped or rewritten on the next write.
        let null = parse(&header(r#","maxTokens":100"#, "null"));
        assert!(null.to_json().contains(r#""adapterDefaults":null"#));
        let array = parse(&header(r#","maxTokens":100"#, "[]"));
        assert!(array.to_json().contains(r#""adapterDefaults":[]"#));
    }

    /// §9.1 16 and §9.4 2–3. a derived history is a fresh vector: changing it, or appending later,
    /// leaves the session and other snapshots as they were; the messages themselves are shared
    #[test]
    fn derived_history_is_a_detached_snapshot() {
        let mut s = Session::from_events(sid(), log(&[USER])).unwrap();
        let mut held = s.derive_messages();
        held.reverse();
        held.clear();
        assert_eq!(s.derive_messages().len(), 1);
        let before = s.derive_messages();
        append(&mut s, &USER.replace("u1", "u2")).unwrap();
        assert_eq!(before.len(), 1, "a held snapshot never grows");
        let after = s.derive_messages();
        assert_eq!(after.len(), 2);
        assert!(
            Arc::ptr_eq(&before[0], &after[0]),
            "message objects are shared"
        );
        // A replace rebuilds the history; the held snapshot keeps its two messages.
        let summary = USER.replace("u1", "sum").replace(
            r#""surfaceOp":"append""#,
            r#""sourceEventSeqs":[0,1],"surfaceOp":{"op":"replace","start":0,"end":1}"#,
        );
        append(&mut s, &summary).unwrap();
        assert_eq!(after.len(), 2);
        assert_eq!(s.derive_messages().len(), 1);
        assert_eq!(s.derive_messages(), scratch(s.events()));
    }

    /// §9.1 18, 22 and 39. surface markers are mandatory on message events and forbidden elsewhere,
    /// on append and on load
    #[test]
    fn surface_markers_on_append_and_load() {
        let unmarked = USER.replace(r#","surfaceOp":"append""#, "");
        let mut s = Session::new(sid());
        let missing = AppendError::MissingSurfaceOp {
            kind: "user/message".into(),
        };
        assert_eq!(append(&mut s, &unmarked), Err(missing.clone()));
        assert_eq!(
            Session::from_events(sid(), log(&[&unmarked])).unwrap_err(),
            (0, missing)
        );
        let marked =
            r#"{"type":"turn/start","seq":SEQ,"time":0,"data":{"turn":1},"surfaceOp":"append"}"#;
        let refused = AppendError::NotSurfaceEligible {
            kind: "turn/start".into(),
            field: "surfaceOp",
        };
        assert_eq!(append(&mut s, marked), Err(refused.clone()));
        assert_eq!(
            Session::from_events(sid(), log(&[marked])).unwrap_err(),
            (0, refused)
        );
        assert_eq!(s.next_seq(), 0);
    }

    /// §9.1 19. dense arrays and nested objects append fine
    #[test]
    fn nested_json_data_appends() {
        let mut s = Session::new(sid());
        let data = json!({"todos": [{"content": "a", "status": "pending", "x": [[1, null], {"y": true}]}]});
        let draft = EventDraft::log(EventData::Other {
            kind: "todo/write".into(),
            data: data.clone(),
        });
        let e = s.append(draft, 1).unwrap().clone();
        assert_eq!(parse(&e.to_json()), e);
        assert_eq!(
            e.data,
            EventData::Other {
                kind: "todo/write".into(),
                data
            }
        );
    }

    /// §9.1 21 and 31. a stored log must be contiguous, and a failure names the seq of the event
    #[test]
    fn load_errors_name_the_event() {
        let mut events = log(&[USER, USER]);
        events[1].seq = 5;
        assert_eq!(
            Session::from_events(sid(), events).unwrap_err(),
            (
                5,
                AppendError::NotContiguous {
                    seq: 5,
                    expected: 1
                }
            )
        );
        let bad_replace = USER.replace(
            r#""surfaceOp":"append""#,
            r#""sourceEventSeqs":[0],"surfaceOp":{"op":"replace","start":3,"end":3}"#,
        );
        assert_eq!(
            Session::from_events(sid(), log(&[USER, &bad_replace])).unwrap_err(),
            (
                1,
                AppendError::BadReplace {
                    reason: "start seq 3 not found in surface".into()
                }
            )
        );
    }

    /// §9.1 23. a well-formed seed loads as it is
    #[test]
    fn well_formed_seed_loads() {
        let events = log(&[TURN_START, USER, TURN_END]);
        let s = Session::from_events(sid(), events.clone()).unwrap();
        assert_eq!(s.events(), events);
        assert_eq!(s.next_seq(), 3);
    }

    /// §9.1 38 and 46. invalid envelope fields and surface metadata shapes are refused by the reader;
    /// `ignorable: true` is accepted
    #[test]
    fn invalid_envelopes_are_refused() {
        let refused = [
            r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1},"extra":1}"#,
            r#"{"type":1,"seq":0,"time":0,"data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":"0","time":0,"data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":0.5,"time":0,"data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":-1,"time":0,"data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":0,"time":"0","data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":0,"time":0.5,"data":{"turn":1}}"#,
            r#"{"type":"turn/start","seq":0,"time":0}"#,
            r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1},"ignorable":false}"#,
            r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1},"ignorable":"yes"}"#,
            r#"{"type":"user/message","seq":0,"time":0,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"invalid"}"#,
            r#"{"type":"user/message","seq":0,"time":0,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":{"op":"replace","start":-1,"end":0}}"#,
            r#"{"type":"user/message","seq":0,"time":0,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"sourceEventSeqs":[0,-1],"surfaceOp":"append"}"#,
            r#"{"type":"session/title","seq":0,"time":0,"data":{"x":NaN}}"#,
        ];
        for line in refused {
            assert!(Event::from_json(line).is_err(), "{line} accepted");
        }
        let ignorable =
            r#"{"type":"turn/start","seq":0,"time":0,"data":{"turn":1},"ignorable":true}"#;
        assert_eq!(parse(ignorable).to_json(), ignorable);
    }

    /// Appends cannot smuggle a typed kind, a retired kind or an unknown kind past the payload checks
    /// as `EventData::Other`: the reader would type it again (bypassing nothing), refuse it, or
    /// reinterpret it, so the log would not read back as written. (Before, all three were appended.)
    #[test]
    fn other_events_must_be_plugin_types() {
        let mut s = Session::new(sid());
        for kind in [
            "turn/start",
            "request/header",
            "request/header-delta",
            "mode/set",
            "steering/message",
            "future/thing",
        ] {
            let draft = EventDraft::log(EventData::Other {
                kind: kind.into(),
                data: json!({"turn": 1}),
            });
            assert!(
                matches!(s.append(draft, 0), Err(AppendError::BadPayload { .. })),
                "{kind} appended as Other"
            );
        }
        assert_eq!(s.next_seq(), 0);
        // A stored unknown event marked ignorable is kept (a reader may skip it, never refuse it).
        let ignorable =
            parse(r#"{"type":"future/thing","seq":0,"time":0,"data":{},"ignorable":true}"#);
        assert!(Session::from_events(sid(), vec![ignorable]).is_ok());
    }

    /// §9.1 65 (and 64). a refused candidate publishes no surface transition; the next append works
    #[test]
    fn refused_candidate_leaves_every_fold_unchanged() {
        let mut s = Session::from_events(
            sid(),
            log(&[TURN_START, USER, USER.replace("u1", "u2").as_str()]),
        )
        .unwrap();
        let bad = USER.replace(
            r#""surfaceOp":"append""#,
            r#""surfaceOp":{"op":"replace","start":1,"end":2}"#,
        );
        assert!(append(&mut s, &bad).is_err());
        assert_eq!(s.surface().nodes, [1, 2]);
        assert_eq!(s.surface().replace_generation, 0);
        assert_eq!(s.derive_messages().len(), 2);
        assert_eq!(s.next_seq(), 3);
        append(&mut s, &USER.replace("u1", "u3")).unwrap();
        assert_eq!(s.surface().nodes, [1, 2, 3]);
    }

    /// §9.1 73, 75 and 76. todo/write is a log-only whole-list snapshot that replays identically
    #[test]
    fn todo_write_is_log_only() {
        let todo = r#"{"type":"todo/write","seq":SEQ,"time":0,"data":{"todos":[{"content":"a","status":"pending"}]}}"#;
        let mut s = Session::from_events(sid(), log(&[TURN_START])).unwrap();
        let e = append(&mut s, todo).unwrap();
        assert!(s.surface().nodes.is_empty());
        assert!(s.derive_messages().is_empty());
        assert_eq!(e.surface_op, None);
        let replayed = Session::from_events(sid(), s.events().to_vec()).unwrap();
        assert_eq!(replayed.events(), s.events());
    }

    /// §9.4 1 and 4–6. the incremental history equals a from-scratch derivation after every append,
    /// projects each appended event as the full derivation projects its node, shares the logged
    /// message, and projects nothing for boundaries and empty assistant messages
    #[test]
    fn derived_cache_matches_scratch_as_the_log_grows() {
        let lines = [
            TURN_START,
            USER,
            STEP_START,
            CHUNK,
            ASSISTANT_CALLS,
            CALL,
            RESULT,
            EMPTY_ASSISTANT,
            STEP_END,
            TURN_END,
        ];
        let mut s = Session::new(sid());
        for line in lines {
            let e = append(&mut s, line).unwrap();
            assert_eq!(
                s.derive_messages(),
                scratch(s.events()),
                "after seq {}",
                e.seq
            );
            match project(&e) {
                Some(m) => {
                    let last = s.derive_messages().last().cloned().unwrap();
                    assert!(
                        Arc::ptr_eq(m, &last),
                        "projection reuses the logged message"
                    );
                    assert!(Arc::ptr_eq(e.data.message().unwrap(), m));
                }
                None => assert!(
                    !matches!(e.kind(), "user/message" | "tool/result")
                        && (e.kind() != "assistant/message"
                            || e.data.message().unwrap().content.is_empty())
                ),
            }
        }
        assert_eq!(s.derive_messages().len(), 3);
    }

    fn header(
        provider: &str,
        system: Option<&str>,
        tools: Option<Vec<ToolSchema>>,
    ) -> RequestHeader {
        RequestHeader {
            config: LlmCallConfig {
                provider: provider.into(),
                model: "m".into(),
                ..LlmCallConfig::default()
            },
            adapter_defaults: None,
            system: system.map(str::to_string),
            tools,
        }
    }

    fn tool(name: &str, description: &str) -> ToolSchema {
        ToolSchema {
            name: name.into(),
            description: description.into(),
            parameters: json!({"type": "object"}),
        }
    }

    /// §9.11 1. canonical form: empty optional fields are absent, populated ones kept
    #[test]
    fn canonical_header_drops_empty_fields() {
        let mut h = header("p", Some(""), Some(vec![]));
        h.adapter_defaults = Some(AdapterDefaults::default());
        assert_eq!(h.clone().canonical(), header("p", None, None));
        let mut full = header("p", Some("sys"), Some(vec![tool("a", "d")]));
        full.config.max_tokens = Some(10);
        full.adapter_defaults = Some(AdapterDefaults {
            reasoning_effort: None,
            max_tokens: Some(true),
        });
        assert_eq!(full.clone().canonical(), full);
    }

    /// §9.11 2 and 3. equality compares every canonical field, the markers included, tools in order;
    /// absent and empty tools are equal
    #[test]
    fn header_equality() {
        let base = header("p", Some("sys"), Some(vec![tool("a", "d"), tool("b", "d")]));
        assert!(header_equals(&base, &base.clone()));
        let mut variants = vec![
            header("q", Some("sys"), Some(vec![tool("a", "d"), tool("b", "d")])),
            header(
                "p",
                Some("other"),
                Some(vec![tool("a", "d"), tool("b", "d")]),
            ),
            header("p", Some("sys"), Some(vec![tool("b", "d"), tool("a", "d")])),
            header(
                "p",
                Some("sys"),
                Some(vec![tool("a", "changed"), tool("b", "d")]),
            ),
            header("p", Some("sys"), Some(vec![tool("a", "d")])),
        ];
        let mut model = base.clone();
        model.config.model = "n".into();
        variants.push(model);
        let mut effort = base.clone();
        effort.config.reasoning_effort = Some("high".into());
        variants.push(effort.clone());
        let mut marked = effort;
        marked.adapter_defaults = Some(AdapterDefaults {
            reasoning_effort: Some(true),
            max_tokens: None,
        });
        variants.push(marked);
        for v in &variants {
            assert!(!header_equals(&base, v), "{v:?}");
        }
        assert!(header_equals(
            &header("p", None, None),
            &header("p", Some(""), Some(vec![]))
        ));
    }

    fn header_event(h: RequestHeader, reason: HeaderReason) -> EventDraft {
        EventDraft::log(EventData::RequestHeader(Box::new(RequestHeaderEvent {
            header: h,
            reason,
        })))
    }

    /// §9.11 4 and 5. the fold takes the latest snapshot in canonical form, or the supplied baseline
    /// when there is none. (Before, `Session::request_header` returned the stored header, so a header
    /// logged with `tools: []` did not equal the canonical one a request is built from.)
    #[test]
    fn header_fold_takes_the_latest_canonical_snapshot() {
        let baseline = header("base", Some(""), None);
        assert_eq!(
            fold_request_header(&[], Some(baseline)),
            Some(header("base", None, None))
        );
        assert_eq!(fold_request_header(&[], None), None);
        let mut s = Session::new(sid());
        s.append(
            EventDraft::log(EventData::TurnStart(TurnStart { turn: 1 })),
            0,
        )
        .unwrap();
        s.append(
            header_event(
                header("p", Some("sys"), Some(vec![tool("a", "d")])),
                HeaderReason::Initial,
            ),
            0,
        )
        .unwrap();
        s.append(
            EventDraft::log(EventData::StepStart(StepRef { turn: 1, step: 1 })),
            0,
        )
        .unwrap();
        s.append(
            header_event(header("p", None, Some(vec![])), HeaderReason::Change),
            0,
        )
        .unwrap();
        s.append(
            EventDraft::log(EventData::StepEnd(StepRef { turn: 1, step: 1 })),
            0,
        )
        .unwrap();
        let want = header("p", None, None);
        assert_eq!(s.request_header(), Some(&want));
        assert_eq!(fold_request_header(s.events(), None), Some(want.clone()));
        let replayed = Session::from_events(sid(), s.events().to_vec()).unwrap();
        assert_eq!(replayed.request_header(), Some(&want));
    }

    /// §9.11 6 and 7. request/header-delta and the fallback reason are refused on load; an append
    /// cannot express them (no variant) or smuggle them (see `other_events_must_be_plugin_types`)
    #[test]
    fn retired_header_shapes_are_refused() {
        let delta = r#"{"type":"request/header-delta","seq":0,"time":0,"data":{}}"#;
        let fallback = r#"{"type":"request/header","seq":0,"time":0,"data":{"header":{"config":{"provider":"p","model":"m"}},"reason":"fallback"}}"#;
        assert!(Event::from_json(delta).is_err());
        assert!(Event::from_json(fallback).is_err());
        let mut s = Session::new(sid());
        let smuggled = EventDraft::log(EventData::Other {
            kind: "request/header-delta".into(),
            data: json!({}),
        });
        assert!(s.append(smuggled, 0).is_err());
    }

    /// §9.11 8–11. the request context is absent before any record, folds a seeded log to its last
    /// record, advances across appends (skipping other events) and takes the last of a batch
    #[test]
    fn request_context_fold() {
        let ctx = |model: &str, window: Option<u64>| {
            EventDraft::log(EventData::RequestContext(RequestContext {
                provider: "p".into(),
                model: model.into(),
                context_window: window,
            }))
        };
        let mut s = Session::new(sid());
        assert_eq!(s.request_context(), None);
        s.append(
            EventDraft::log(EventData::TurnStart(TurnStart { turn: 1 })),
            0,
        )
        .unwrap();
        s.append(ctx("a", Some(1000)), 0).unwrap();
        assert_eq!(s.request_context().map(|c| c.model.as_str()), Some("a"));
        s.append(
            EventDraft::log(EventData::StepStart(StepRef { turn: 1, step: 1 })),
            0,
        )
        .unwrap();
        assert_eq!(s.request_context().map(|c| c.model.as_str()), Some("a"));
        s.append(ctx("b", None), 0).unwrap();
        s.append(ctx("c", None), 0).unwrap();
        assert_eq!(
            s.request_context()
                .map(|c| (c.model.as_str(), c.context_window)),
            Some(("c", None))
        );
        let seeded = Session::from_events(sid(), s.events().to_vec()).unwrap();
        assert_eq!(seeded.request_context(), s.request_context());
    }
}
