//! Crash repair: the closers for a turn left open at the tail of a log (`reference/session-llm.md`
//! §3.3), as a pure function from events to the events to append.
//!
//! Pending calls are registered from the *assistant content* (`tool-call` blocks), not from `tool/call`
//! events: a call the model asked for but the runtime never recorded as started gets
//! `TOOL_NOT_STARTED`; one recorded as started but without a durable result gets
//! `TOOL_OUTCOME_UNKNOWN` (the model must not retry it blindly). Then the open step and turn are closed,
//! the turn with reason `interrupted`. Seqs continue the log; `time` is the last event's, never invented.
//!
//! Called by the stores' `load` (which persists the closers) and `inspect` (which only reports them).

use std::sync::Arc;

use crate::ids::MessageId;
use crate::llm::types::{ContentBlock, Message, MessageSource, Role};
use crate::session::event::{
    Event, EventData, StepRef, SurfaceOp, ToolErrorInfo, ToolResultEvent, TurnEnd, TurnEndReason,
};

/// `TOOL_NOT_STARTED`
pub const TOOL_NOT_STARTED: &str = "TOOL_NOT_STARTED";
/// `TOOL_OUTCOME_UNKNOWN`
pub const TOOL_OUTCOME_UNKNOWN: &str = "TOOL_OUTCOME_UNKNOWN";

const OUTCOME_UNKNOWN_TEXT: &str = "The tool call was interrupted after it was recorded, but no result was durably recorded. Its outcome is unknown. Decide whether to retry from the tool semantics: retry only if the operation is read-only or idempotent; if it may have side effects, first verify external state or ask the user. Do not retry blindly.";
const NOT_STARTED_TEXT: &str = "The tool call was interrupted before the Harness recorded it as started. Retry it if it is still needed.";

struct Pending {
    call_id: String,
    step: u64,
    call_seq: Option<u64>,
}

/// The synthetic events that close an open tail turn, with seqs continuing the log and `time` copied
/// from the last event; empty for a balanced or empty log.
pub fn interrupted_turn_closers(events: &[Event]) -> Vec<Event> {
    let mut open_turn: Option<u64> = None;
    let mut open_step: Option<u64> = None;
    // Insertion-ordered: the transcript order of the calls.
    let mut pending: Vec<Pending> = Vec::new();
    for event in events {
        match &event.data {
            EventData::TurnStart(t) => {
                open_turn = Some(t.turn);
                open_step = None;
                pending.clear();
            }
            EventData::TurnEnd(_) => {
                open_turn = None;
                open_step = None;
                pending.clear();
            }
            EventData::StepStart(s) => open_step = Some(s.step),
            EventData::StepEnd(_) => {
                pending.clear();
                open_step = None;
            }
            EventData::AssistantMessage(a) => {
                for call in a.message.tool_calls() {
                    if let Some(p) = pending.iter_mut().find(|p| p.call_id == call.id) {
                        p.step = a.step;
                    } else {
                        pending.push(Pending {
                            call_id: call.id.to_string(),
                            step: a.step,
                            call_seq: None,
                        });
                    }
                }
            }
            EventData::ToolCall(c) => {
                if let Some(p) = pending.iter_mut().find(|p| p.call_id == c.call_id) {
                    p.call_seq = Some(event.seq);
                }
            }
            EventData::ToolResult(r) => {
                if let Some(call_id) = r.message.source.str_field("callId") {
                    pending.retain(|p| p.call_id != call_id);
                }
            }
            _ => {}
        }
    }
    let (Some(turn), Some(last)) = (open_turn, events.last()) else {
        return Vec::new();
    };
    let time = last.time;
    let mut seq = last.seq + 1;
    let mut out = Vec::new();
    for p in pending {
        let (name, code, text, sources) = match p.call_seq {
            Some(call_seq) => (
                "ToolOutcomeUnknownError",
                TOOL_OUTCOME_UNKNOWN,
                OUTCOME_UNKNOWN_TEXT,
                Some(vec![call_seq]),
            ),
            None => (
                "ToolNotStartedError",
                TOOL_NOT_STARTED,
                NOT_STARTED_TEXT,
                None,
            ),
        };
        let id = format!("interrupted-tool-result-{}-{seq}", p.call_id);
        let message = Message {
            // A call id is bounded by the event size limit, not the message id limit; fall back to a
            // minted id rather than fail the repair.
            id: MessageId::new(&id).unwrap_or_else(|_| MessageId::mint()),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: p.call_id.clone(),
                content: vec![ContentBlock::text(text)],
                is_error: Some(true),
            }],
            source: MessageSource::tool(&p.call_id),
        };
        out.push(Event {
            seq,
            time,
            data: EventData::ToolResult(ToolResultEvent {
                turn,
                step: p.step,
                message: Arc::new(message),
                error: Some(ToolErrorInfo {
                    name: name.into(),
                    code: code.into(),
                }),
                meta: None,
            }),
            ignorable: false,
            source_event_seqs: sources,
            surface_op: Some(SurfaceOp::Append),
        });
        seq += 1;
    }
    if let Some(step) = open_step {
        out.push(Event {
            seq,
            time,
            data: EventData::StepEnd(StepRef { turn, step }),
            ignorable: false,
            source_event_seqs: None,
            surface_op: None,
        });
        seq += 1;
    }
    out.push(Event {
        seq,
        time,
        data: EventData::TurnEnd(TurnEnd {
            turn,
            reason: TurnEndReason::Interrupted,
        }),
        ignorable: false,
        source_event_seqs: None,
        surface_op: None,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(lines: &[&str]) -> Vec<Event> {
        lines.iter().map(|l| Event::from_json(l).unwrap()).collect()
    }

    const T1: &str = r#"{"type":"turn/start","seq":0,"time":10,"data":{"turn":1}}"#;
    const S1: &str = r#"{"type":"step/start","seq":1,"time":11,"data":{"turn":1,"step":1}}"#;
    const A1: &str = r#"{"type":"assistant/message","seq":2,"time":12,"data":{"turn":1,"step":1,"message":{"id":"a","role":"assistant","content":[{"type":"tool-call","id":"call-a","name":"t","arguments":"{}"},{"type":"tool-call","id":"call-b","name":"t","arguments":"{}"}],"source":{"kind":"model","provider":"p","model":"m"}}},"sourceEventSeqs":[],"surfaceOp":"append"}"#;

    #[test]
    fn balanced_and_empty_logs_need_nothing() {
        assert!(interrupted_turn_closers(&[]).is_empty());
        let log = parse(&[
            T1,
            r#"{"type":"turn/end","seq":1,"time":11,"data":{"turn":1,"reason":{"kind":"completed"}}}"#,
        ]);
        assert!(interrupted_turn_closers(&log).is_empty());
    }

    #[test]
    fn closes_an_open_turn_without_a_step() {
        let closers = interrupted_turn_closers(&parse(&[T1]));
        assert_eq!(
            closers.iter().map(Event::to_json).collect::<Vec<_>>(),
            [
                r#"{"type":"turn/end","seq":1,"time":10,"data":{"turn":1,"reason":{"kind":"interrupted"}}}"#
            ]
        );
    }

    #[test]
    fn unknown_outcome_for_recorded_calls_not_started_for_the_rest() {
        let log = parse(&[
            T1,
            S1,
            A1,
            r#"{"type":"tool/call","seq":3,"time":13,"data":{"turn":1,"step":1,"callId":"call-a","name":"t","arguments":"{}"}}"#,
        ]);
        let closers = interrupted_turn_closers(&log);
        let json: Vec<String> = closers.iter().map(Event::to_json).collect();
        assert_eq!(json.len(), 4);
        assert_eq!(
            json[0],
            format!(
                r#"{{"type":"tool/result","seq":4,"time":13,"data":{{"turn":1,"step":1,"message":{{"id":"interrupted-tool-result-call-a-4","role":"user","content":[{{"type":"tool-result","toolCallId":"call-a","content":[{{"type":"text","text":"{OUTCOME_UNKNOWN_TEXT}"}}],"isError":true}}],"source":{{"kind":"tool","callId":"call-a"}}}},"error":{{"name":"ToolOutcomeUnknownError","code":"TOOL_OUTCOME_UNKNOWN"}}}},"sourceEventSeqs":[3],"surfaceOp":"append"}}"#
            )
        );
        assert!(json[1].contains(r#""code":"TOOL_NOT_STARTED""#));
        assert!(!json[1].contains("sourceEventSeqs"));
        assert_eq!(
            json[2],
            r#"{"type":"step/end","seq":6,"time":13,"data":{"turn":1,"step":1}}"#
        );
        assert_eq!(
            json[3],
            r#"{"type":"turn/end","seq":7,"time":13,"data":{"turn":1,"reason":{"kind":"interrupted"}}}"#
        );
    }

    #[test]
    fn answered_calls_and_closed_steps_get_nothing() {
        let log = parse(&[
            T1,
            S1,
            A1,
            r#"{"type":"step/end","seq":3,"time":13,"data":{"turn":1,"step":1}}"#,
        ]);
        let closers = interrupted_turn_closers(&log);
        assert_eq!(closers.len(), 1);
        assert_eq!(closers[0].kind(), "turn/end");
        assert_eq!(closers[0].seq, 4);
    }

    #[test]
    fn a_tool_call_without_assistant_content_is_ignored() {
        let log = parse(&[
            T1,
            S1,
            r#"{"type":"tool/call","seq":2,"time":13,"data":{"turn":1,"step":1,"callId":"x","name":"t","arguments":"{}"}}"#,
        ]);
        let kinds: Vec<String> = interrupted_turn_closers(&log)
            .iter()
            .map(|e| e.kind().to_string())
            .collect();
        assert_eq!(kinds, ["step/end", "turn/end"]);
    }
}
