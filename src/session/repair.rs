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

/// The id of the synthetic result for `call_id` at `seq`: `interrupted-tool-result-<callId>-<seq>`.
///
/// A call id comes from the model and is bounded only by the event size, so it may be too long for a
/// message id or hold control characters. Those are dropped and the call id is cut to fit, keeping the
/// id a pure function of the log: `inspect` and `load` must compute the same closers.
fn closer_message_id(call_id: &str, seq: u64) -> MessageId {
    let prefix = "interrupted-tool-result-";
    let suffix = format!("-{seq}");
    let room = crate::limits::Limits::DEFAULT
        .message_id_bytes_max
        .saturating_sub(prefix.len() + suffix.len());
    let mut id = String::from(prefix);
    for c in call_id.chars().filter(|c| !c.is_control()) {
        if id.len() + c.len_utf8() > prefix.len() + room {
            break;
        }
        id.push(c);
    }
    id.push_str(&suffix);
    MessageId::new(&id)
        .expect("the id is non-empty, within the bound and free of control characters")
}

/// The synthetic events that close an open tail turn, with seqs continuing the log and `time` copied
/// from the last event; empty for a balanced or empty log.
pub fn interrupted_turn_closers(events: &[Event]) -> Vec<Event> {
    let tail = open_tail(events);
    let (Some(turn), Some(last)) = (tail.turn, events.last()) else {
        return Vec::new();
    };
    let time = last.time;
    let mut seq = last.seq + 1;
    let mut out = Vec::new();
    for p in &tail.pending {
        out.push(tool_result_closer(p, turn, seq, time));
        seq += 1;
    }
    if let Some(step) = tail.step {
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
        data: EventData::TurnEnd(Box::new(TurnEnd {
            turn,
            reason: TurnEndReason::Interrupted,
        })),
        ignorable: false,
        source_event_seqs: None,
        surface_op: None,
    });
    out
}

/// Where a log leaves off: its open turn and step, and the tool calls of the open step still
/// unanswered.
struct OpenTail {
    turn: Option<u64>,
    step: Option<u64>,
    /// Insertion-ordered: the transcript order of the calls.
    pending: Vec<Pending>,
}

/// Folds a log into its `OpenTail`.
fn open_tail(events: &[Event]) -> OpenTail {
    let mut tail = OpenTail {
        turn: None,
        step: None,
        pending: Vec::new(),
    };
    for event in events {
        match &event.data {
            EventData::TurnStart(t) => {
                tail.turn = Some(t.turn);
                tail.step = None;
                tail.pending.clear();
            }
            EventData::TurnEnd(_) => {
                tail.turn = None;
                tail.step = None;
                tail.pending.clear();
            }
            EventData::StepStart(s) => tail.step = Some(s.step),
            EventData::StepEnd(_) => {
                tail.pending.clear();
                tail.step = None;
            }
            EventData::AssistantMessage(a) => {
                for call in a.message.tool_calls() {
                    if let Some(p) = tail.pending.iter_mut().find(|p| p.call_id == call.id) {
                        p.step = a.step;
                    } else {
                        tail.pending.push(Pending {
                            call_id: call.id.to_string(),
                            step: a.step,
                            call_seq: None,
                        });
                    }
                }
            }
            EventData::ToolCall(c) => {
                if let Some(p) = tail.pending.iter_mut().find(|p| p.call_id == c.call_id) {
                    p.call_seq = Some(event.seq);
                }
            }
            EventData::ToolResult(r) => {
                if let Some(call_id) = r.message.source.str_field("callId") {
                    tail.pending.retain(|p| p.call_id != call_id);
                }
            }
            _ => {}
        }
    }
    tail
}

/// The error `tool/result` at `seq` that answers an unanswered call of turn `turn`:
/// `TOOL_OUTCOME_UNKNOWN` when the call was recorded as started, `TOOL_NOT_STARTED` when not.
fn tool_result_closer(p: &Pending, turn: u64, seq: u64, time: i64) -> Event {
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
    let message = Message {
        id: closer_message_id(&p.call_id, seq),
        role: Role::User,
        content: vec![ContentBlock::ToolResult {
            tool_call_id: p.call_id.clone(),
            content: vec![ContentBlock::text(text)],
            is_error: Some(true),
        }],
        source: MessageSource::tool(&p.call_id),
    };
    Event {
        seq,
        time,
        data: EventData::ToolResult(Box::new(ToolResultEvent {
            turn,
            step: p.step,
            message: Arc::new(message),
            error: Some(ToolErrorInfo {
                name: name.into(),
                code: code.into(),
            }),
            meta: None,
        })),
        ignorable: false,
        source_event_seqs: sources,
        surface_op: Some(SurfaceOp::Append),
    }
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

/// The original's repair catalogue (`reference/session-llm.md` §9.10), all 11 cases, plus the
/// determinism of closer ids.
#[cfg(test)]
mod catalogue_tests {
    use super::*;
    use crate::session::invariant;
    use crate::session::log::Session;

    /// Parses JSON event lines, giving each the seq of its position (`SEQ` in the text).
    fn log(lines: &[&str]) -> Vec<Event> {
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let json = l.replace("SEQ", &i.to_string());
                Event::from_json(&json).unwrap_or_else(|e| panic!("{json}: {e}"))
            })
            .collect()
    }

    fn turn_start(turn: u64) -> String {
        format!(r#"{{"type":"turn/start","seq":SEQ,"time":100,"data":{{"turn":{turn}}}}}"#)
    }
    fn turn_end(turn: u64) -> String {
        format!(
            r#"{{"type":"turn/end","seq":SEQ,"time":100,"data":{{"turn":{turn},"reason":{{"kind":"completed"}}}}}}"#
        )
    }
    fn step_start(turn: u64, step: u64) -> String {
        format!(
            r#"{{"type":"step/start","seq":SEQ,"time":100,"data":{{"turn":{turn},"step":{step}}}}}"#
        )
    }
    fn step_end(turn: u64, step: u64) -> String {
        format!(
            r#"{{"type":"step/end","seq":SEQ,"time":100,"data":{{"turn":{turn},"step":{step}}}}}"#
        )
    }
    fn asks(turn: u64, step: u64, calls: &[&str]) -> String {
        let blocks: Vec<String> = calls
            .iter()
            .map(|c| format!(r#"{{"type":"tool-call","id":"{c}","name":"t","arguments":"{{}}"}}"#))
            .collect();
        format!(
            r#"{{"type":"assistant/message","seq":SEQ,"time":100,"data":{{"turn":{turn},"step":{step},"message":{{"id":"a","role":"assistant","content":[{}],"source":{{"kind":"model","provider":"p","model":"m"}}}}}},"sourceEventSeqs":[],"surfaceOp":"append"}}"#,
            blocks.join(",")
        )
    }
    fn call(turn: u64, step: u64, id: &str) -> String {
        format!(
            r#"{{"type":"tool/call","seq":SEQ,"time":100,"data":{{"turn":{turn},"step":{step},"callId":"{id}","name":"t","arguments":"{{}}"}}}}"#
        )
    }
    fn result(turn: u64, step: u64, id: &str) -> String {
        format!(
            r#"{{"type":"tool/result","seq":SEQ,"time":100,"data":{{"turn":{turn},"step":{step},"message":{{"id":"r-{id}","role":"user","content":[{{"type":"tool-result","toolCallId":"{id}","content":[],"isError":false}}],"source":{{"kind":"tool","callId":"{id}"}}}}}},"surfaceOp":"append"}}"#
        )
    }

    fn kinds(events: &[Event]) -> Vec<(u64, String)> {
        events
            .iter()
            .map(|e| (e.seq, e.kind().to_string()))
            .collect()
    }

    fn k(list: &[(u64, &str)]) -> Vec<(u64, String)> {
        list.iter().map(|(s, t)| (*s, t.to_string())).collect()
    }

    /// The repaired log is valid for the loader and the invariant checker, and balanced.
    fn assert_repairs(events: &[Event], closers: &[Event]) {
        let mut all = events.to_vec();
        all.extend_from_slice(closers);
        assert_eq!(invariant::check(&all), Ok(()));
        assert!(invariant::is_balanced(&all));
        assert!(Session::from_events(crate::ids::SessionId::new("s").unwrap(), all).is_ok());
    }

    /// Case 1: returns nothing for a balanced log (ends on turn/end)
    #[test]
    fn nothing_for_a_balanced_log() {
        let events = log(&[
            &turn_start(1),
            &step_start(1, 1),
            &step_end(1, 1),
            &turn_end(1),
        ]);
        assert_eq!(interrupted_turn_closers(&events), []);
    }

    /// Case 2: returns nothing for an empty log
    #[test]
    fn nothing_for_an_empty_log() {
        assert_eq!(interrupted_turn_closers(&[]), []);
    }

    /// Case 3: closes an open turn with no open step (turn/end {interrupted} only) — seq 1
    #[test]
    fn open_turn_without_a_step_gets_only_turn_end() {
        let events = log(&[&turn_start(1)]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(kinds(&closers), k(&[(1, "turn/end")]));
        assert_eq!(
            closers[0].data,
            EventData::TurnEnd(Box::new(TurnEnd {
                turn: 1,
                reason: TurnEndReason::Interrupted
            }))
        );
        assert_eq!(
            closers[0].time, 100,
            "time is the last event's, never invented"
        );
        assert_repairs(&events, &closers);
    }

    /// Case 4: closes an open step before the turn (step/end then turn/end) — seqs 2, 3
    #[test]
    fn open_step_is_closed_before_the_turn() {
        let events = log(&[&turn_start(1), &step_start(1, 1)]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(kinds(&closers), k(&[(2, "step/end"), (3, "turn/end")]));
        assert_eq!(
            closers[0].data,
            EventData::StepEnd(StepRef { turn: 1, step: 1 })
        );
        assert_repairs(&events, &closers);
    }

    /// Case 5: marks an assistant tool request with no recorded call as not started — tool/result (turn 2,
    /// step 1, isError, TOOL_NOT_STARTED, exact text) → step/end → turn/end, seqs 3..5
    #[test]
    fn requested_but_unrecorded_call_is_not_started() {
        let events = log(&[&turn_start(2), &step_start(2, 1), &asks(2, 1, &["call-1"])]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(
            kinds(&closers),
            k(&[(3, "tool/result"), (4, "step/end"), (5, "turn/end")])
        );
        let EventData::ToolResult(r) = &closers[0].data else {
            panic!("not a tool/result: {:?}", closers[0]);
        };
        assert_eq!((r.turn, r.step), (2, 1));
        assert_eq!(
            r.error,
            Some(ToolErrorInfo {
                name: "ToolNotStartedError".into(),
                code: TOOL_NOT_STARTED.into()
            })
        );
        assert_eq!(
            r.message.content,
            [ContentBlock::ToolResult {
                tool_call_id: "call-1".into(),
                content: vec![ContentBlock::text(NOT_STARTED_TEXT)],
                is_error: Some(true),
            }]
        );
        assert_eq!(r.message.id.as_str(), "interrupted-tool-result-call-1-3");
        assert_eq!(r.message.source, MessageSource::tool("call-1"));
        assert_eq!(closers[0].surface_op, Some(SurfaceOp::Append));
        assert_eq!(closers[0].source_event_seqs, None);
        assert_eq!(
            closers[2].data,
            EventData::TurnEnd(Box::new(TurnEnd {
                turn: 2,
                reason: TurnEndReason::Interrupted
            }))
        );
    }

    /// Case 6: does NOT synthesize a result for a tool-call that already has one
    #[test]
    fn answered_call_gets_no_result() {
        let events = log(&[
            &turn_start(1),
            &step_start(1, 1),
            &asks(1, 1, &["c1"]),
            &call(1, 1, "c1"),
            &result(1, 1, "c1"),
        ]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(kinds(&closers), k(&[(5, "step/end"), (6, "turn/end")]));
        assert_repairs(&events, &closers);
    }

    /// Case 7: does NOT synthesize a result after the owning step already closed — only turn/end at seq 4
    #[test]
    fn call_of_a_closed_step_gets_no_result() {
        let events = log(&[
            &turn_start(1),
            &step_start(1, 1),
            &asks(1, 1, &["c1"]),
            &step_end(1, 1),
        ]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(kinds(&closers), k(&[(4, "turn/end")]));
        assert_repairs(&events, &closers);
    }

    /// Case 8: synthesizes results only for the still-open turn, not a committed earlier turn
    #[test]
    fn only_the_open_turn_is_repaired() {
        let events = log(&[
            &turn_start(1),
            &step_start(1, 1),
            &asks(1, 1, &["old"]),
            &step_end(1, 1),
            &turn_end(1),
            &turn_start(2),
            &step_start(2, 1),
            &asks(2, 1, &["new"]),
        ]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(
            kinds(&closers),
            k(&[(8, "tool/result"), (9, "step/end"), (10, "turn/end")])
        );
        assert_eq!(
            closers[0].data.message().map(|m| m.source.clone()),
            Some(MessageSource::tool("new"))
        );
        assert_eq!(
            closers[2].data,
            EventData::TurnEnd(Box::new(TurnEnd {
                turn: 2,
                reason: TurnEndReason::Interrupted
            }))
        );
        assert_repairs(&events, &closers);
    }

    /// Case 9: synthesizes a result for each of multiple unanswered calls, in log order — only the
    /// unanswered ones (here call-b, then call-d), in transcript order.
    #[test]
    fn every_unanswered_call_in_transcript_order() {
        let events = log(&[
            &turn_start(1),
            &step_start(1, 1),
            &asks(1, 1, &["call-a", "call-b", "call-c", "call-d"]),
            &call(1, 1, "call-a"),
            &result(1, 1, "call-a"),
            &call(1, 1, "call-d"),
            &call(1, 1, "call-c"),
            &result(1, 1, "call-c"),
        ]);
        let closers = interrupted_turn_closers(&events);
        let answered: Vec<(String, String)> = closers
            .iter()
            .filter_map(|e| match &e.data {
                EventData::ToolResult(r) => Some((
                    r.message
                        .source
                        .str_field("callId")
                        .unwrap_or_default()
                        .to_string(),
                    r.error.as_ref().map(|e| e.code.clone()).unwrap_or_default(),
                )),
                _ => None,
            })
            .collect();
        assert_eq!(
            answered,
            [
                ("call-b".to_string(), TOOL_NOT_STARTED.to_string()),
                ("call-d".to_string(), TOOL_OUTCOME_UNKNOWN.to_string())
            ]
        );
        assert_eq!(closers[1].source_event_seqs, Some(vec![5]));
        assert_repairs(&events, &closers);
    }

    /// Case 10: synthesized tool/result carries surfaceOp and sourceEventSeqs when tool/call was logged —
    /// 'append', [3], ToolOutcomeUnknownError/TOOL_OUTCOME_UNKNOWN, text mentions idempotent / verify
    /// external state
    #[test]
    fn recorded_call_gets_outcome_unknown_citing_the_call() {
        let events = log(&[
            &turn_start(1),
            &step_start(1, 1),
            &asks(1, 1, &["c1"]),
            &call(1, 1, "c1"),
        ]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(closers[0].surface_op, Some(SurfaceOp::Append));
        assert_eq!(closers[0].source_event_seqs, Some(vec![3]));
        let EventData::ToolResult(r) = &closers[0].data else {
            panic!("not a tool/result");
        };
        assert_eq!(
            r.error,
            Some(ToolErrorInfo {
                name: "ToolOutcomeUnknownError".into(),
                code: TOOL_OUTCOME_UNKNOWN.into()
            })
        );
        let text = r.message.content.iter().find_map(|b| match b {
            ContentBlock::ToolResult { content, .. } => content.first().cloned(),
            _ => None,
        });
        let Some(ContentBlock::Text { text }) = text else {
            panic!("no text");
        };
        assert!(text.contains("idempotent"), "{text}");
        assert!(text.contains("verify external state"), "{text}");
        assert_repairs(&events, &closers);
    }

    /// Case 11: handles tool/call without a matching assistant/message entry gracefully — no result, just
    /// step/end + turn/end
    #[test]
    fn call_without_assistant_request_gets_no_result() {
        let events = log(&[&turn_start(1), &step_start(1, 1), &call(1, 1, "x")]);
        let closers = interrupted_turn_closers(&events);
        assert_eq!(kinds(&closers), k(&[(3, "step/end"), (4, "turn/end")]));
        // The unanswered `tool/call` is legal: `step/end` clears it.
        assert_repairs(&events, &closers);
    }

    /// `inspect` and `load` must compute the same closers, so a closer's id is a pure function of the
    /// log even for a call id too long (or too odd) for a message id. (Before, such a call got a random
    /// id, different on every computation.)
    #[test]
    fn closer_ids_are_deterministic_for_any_call_id() {
        let long = "c".repeat(400);
        for id in [long.as_str(), "a\u{1}b", "é"] {
            let json_id = serde_json::to_string(id).unwrap();
            let asks_line = asks(1, 1, &["X"]).replace(r#""X""#, &json_id);
            let events = log(&[&turn_start(1), &step_start(1, 1), &asks_line]);
            let first = interrupted_turn_closers(&events);
            let second = interrupted_turn_closers(&events);
            assert_eq!(first, second);
            let message_id = first[0]
                .data
                .message()
                .map(|m| m.id.to_string())
                .unwrap_or_default();
            assert!(
                message_id.starts_with("interrupted-tool-result-"),
                "{message_id}"
            );
            assert!(message_id.ends_with("-3"), "{message_id}");
            assert!(message_id.len() <= crate::limits::Limits::DEFAULT.message_id_bytes_max);
            assert_repairs(&events, &first);
        }
    }
}
