//! Append rules — contiguous seq, surface metadata, `sourceEventSeqs`, message shapes — and the
//! incremental folds a running agent reads: derived messages, last turn, request header and context.
//!
//! `Session::append` validates a draft completely before the log changes; `Session::from_events`
//! validates a log read back from a store the same way (the second half of a paired assertion: the
//! writer checked these events once already).

use std::sync::Arc;

use crate::ids::SessionId;
use crate::llm::types::{ContentBlock, Message, RequestHeader, Role};
use crate::session::event::{Event, EventData, RequestContext, SurfaceOp};
use crate::session::surface::{Surface, SurfaceChange};

/// An event not yet in a log: everything but `seq` and `time`, which `Session::append` assigns.
#[derive(Clone, Debug, PartialEq)]
pub struct EventDraft {
    pub data: EventData,
    pub source_event_seqs: Option<Vec<u64>>,
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
    #[error("event {kind:?} is surface-eligible and requires a surfaceOp marker")]
    MissingSurfaceOp { kind: String },
    #[error("event {kind:?} is not surface-eligible and cannot carry {field}")]
    NotSurfaceEligible { kind: String, field: &'static str },
    #[error("sourceEventSeqs {reason}")]
    BadSources { reason: String },
    #[error("surface replace: {reason}")]
    BadReplace { reason: String },
    #[error("event {kind:?} has an invalid payload: {reason}")]
    BadPayload { kind: String, reason: String },
    #[error("session event seq {seq} is not contiguous; expected {expected}")]
    NotContiguous { seq: u64, expected: u64 },
    #[error("event is {bytes} bytes, the limit is {bytes_max}")]
    TooLarge { bytes: usize, bytes_max: usize },
}

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
    messages: Vec<Arc<Message>>,
    /// `turn` of the last `turn/start`, or 0.
    last_turn: u64,
    /// Index of the last `request/header` event.
    header_idx: Option<usize>,
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
            messages: Vec::new(),
            last_turn: 0,
            header_idx: None,
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

    pub fn id(&self) -> &SessionId {
        &self.id
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Gives the log up (for hibernation: the events are dropped, the store keeps them).
    pub fn into_events(self) -> Vec<Event> {
        self.events
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
            EventData::TurnStart(t) => self.last_turn = t.turn,
            EventData::RequestHeader(_) => self.header_idx = Some(self.events.len()),
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
        self.messages.clone()
    }

    /// The model-visible history without copying.
    pub fn messages(&self) -> &[Arc<Message>] {
        &self.messages
    }

    /// The number of the last `turn/start` in the log, or 0.
    pub fn last_turn(&self) -> u64 {
        self.last_turn
    }

    /// The canonical header of the last `request/header` event, if any.
    pub fn request_header(&self) -> Option<&RequestHeader> {
        match self.header_idx.map(|i| &self.events[i].data) {
            Some(EventData::RequestHeader(h)) => Some(&h.header),
            _ => None,
        }
    }

    /// The payload of the last `request/context` event, if any.
    pub fn request_context(&self) -> Option<&RequestContext> {
        match self.context_idx.map(|i| &self.events[i].data) {
            Some(EventData::RequestContext(c)) => Some(c),
            _ => None,
        }
    }
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
        _ => {}
    }
    Ok(())
}

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
        EventData::AssistantMessage(AssistantMessageEvent {
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
        })
    }

    fn tool_result(call: &str, text: &str) -> EventData {
        EventData::ToolResult(ToolResultEvent {
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
        })
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
