//! The relational invariant checker (`reference/session-llm.md` §3.2), shared by tests, `dsh check` and
//! debug builds of the runtime.
//!
//! Rules, per event: seqs strictly increase; turns open and close in order without nesting; steps open
//! and close inside their turn with consecutive numbers; stream and tool events name the open step; a
//! `tool/result` answers a `tool/call` of the same step (except a `TOOL_NOT_STARTED` repair result); a
//! `tool/result` replacement needs an open turn; `request/header`, `request/context` and `todo/write`
//! must be inside a turn; `llm/retry` and `llm/retry-started` must name the open step. Everything else
//! (idle `user/message`s, plugin events, `session/end-seed`) is unconstrained.
//!
//! `Tracker` checks one event at a time (for debug builds of the runtime); `check` folds a whole log.

use crate::session::event::{Event, EventData, SurfaceOp};
use crate::session::repair::TOOL_NOT_STARTED;

/// The first event that breaks a relational rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invariant violated at seq {seq}: {reason}")]
pub struct Violation {
    pub seq: u64,
    pub reason: String,
}

/// The committed trace state of one log.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    last_seq: Option<u64>,
    open_turn: Option<u64>,
    open_step: Option<u64>,
    next_turn: u64,
    next_step: u64,
    /// Calls logged in the open step and not yet answered.
    pending_calls: Vec<String>,
}

impl Tracker {
    pub fn new() -> Tracker {
        Tracker {
            next_turn: 1,
            next_step: 1,
            ..Tracker::default()
        }
    }

    /// Whether a turn is open.
    pub fn open_turn(&self) -> Option<u64> {
        self.open_turn
    }

    /// Whether a step is open.
    pub fn open_step(&self) -> Option<u64> {
        self.open_step
    }

    /// Checks `event` against the trace and, if it passes, advances the trace.
    ///
    /// # Errors
    /// The violation; the trace is unchanged.
    pub fn push(&mut self, event: &Event) -> Result<(), Violation> {
        let seq = event.seq;
        let fail = |reason: String| Err(Violation { seq, reason });
        if let Some(last) = self.last_seq
            && seq <= last
        {
            return fail(format!("seq must strictly increase (after {last})"));
        }
        let kind = event.kind();
        let names_open_step = |turn: u64, step: u64| -> Result<(), Violation> {
            match (self.open_turn, self.open_step) {
                (Some(t), Some(s)) if t == turn && s == step => Ok(()),
                (Some(t), Some(s)) => Err(Violation {
                    seq,
                    reason: format!(
                        "{kind} names turn {turn}/step {step}, open is turn {t}/step {s}"
                    ),
                }),
                _ => Err(Violation {
                    seq,
                    reason: format!("{kind} for turn {turn}/step {step} with no open step"),
                }),
            }
        };
        let mut next = self.clone();
        match &event.data {
            EventData::TurnStart(t) => {
                if let Some(open) = self.open_turn {
                    return fail(format!(
                        "turn/start {} while turn {open} is still open",
                        t.turn
                    ));
                }
                if t.turn != self.next_turn {
                    return fail(format!("expected turn {}, got {}", self.next_turn, t.turn));
                }
                next.open_turn = Some(t.turn);
                next.next_step = 1;
            }
            EventData::TurnEnd(t) => {
                if self.open_turn != Some(t.turn) {
                    return fail(format!(
                        "turn/end {} does not match open turn {:?}",
                        t.turn, self.open_turn
                    ));
                }
                if let Some(step) = self.open_step {
                    return fail(format!(
                        "turn/end {} while step {step} is still open",
                        t.turn
                    ));
                }
                next.open_turn = None;
                next.next_turn = t.turn + 1;
            }
            EventData::StepStart(s) => {
                if self.open_turn != Some(s.turn) {
                    return fail(format!(
                        "step/start for turn {} but open turn is {:?}",
                        s.turn, self.open_turn
                    ));
                }
                if let Some(open) = self.open_step {
                    return fail(format!(
                        "step/start {} while step {open} is still open",
                        s.step
                    ));
                }
                if s.step != self.next_step {
                    return fail(format!(
                        "expected step {} in turn {}, got {}",
                        self.next_step, s.turn, s.step
                    ));
                }
                next.open_step = Some(s.step);
            }
            EventData::StepEnd(s) => {
                names_open_step(s.turn, s.step)?;
                next.pending_calls.clear();
                next.open_step = None;
                next.next_step = s.step + 1;
            }
            EventData::AssistantChunk(c) => names_open_step(c.turn, c.step)?,
            EventData::AssistantMessage(a) => names_open_step(a.turn, a.step)?,
            EventData::LlmRetry(r) => names_open_step(r.turn, r.step)?,
            EventData::LlmRetryStarted(r) => names_open_step(r.turn, r.step)?,
            EventData::ToolCall(c) => {
                names_open_step(c.turn, c.step)?;
                next.pending_calls.push(c.call_id.clone());
            }
            EventData::ToolResult(r) => match event.surface_op {
                Some(SurfaceOp::Replace { .. }) => {
                    if self.open_turn.is_none() {
                        return fail(
                            "tool/result surface replacement appended outside any open turn".into(),
                        );
                    }
                }
                _ => {
                    names_open_step(r.turn, r.step)?;
                    let call_id = r.message.source.str_field("callId").unwrap_or("");
                    let not_started = r.error.as_ref().is_some_and(|e| e.code == TOOL_NOT_STARTED)
                        && is_error_result(r);
                    match next.pending_calls.iter().position(|c| c == call_id) {
                        Some(i) => {
                            next.pending_calls.remove(i);
                        }
                        None if not_started => {}
                        None => {
                            return fail(format!(
                                "tool/result for call {call_id:?} has no prior tool/call in this step"
                            ));
                        }
                    }
                }
            },
            EventData::RequestHeader(_) | EventData::RequestContext(_)
                if self.open_turn.is_none() =>
            {
                return fail(format!(
                    "{kind} appended outside any open turn (core execution events must be turn-enclosed)"
                ));
            }
            EventData::Other { kind, .. } if kind == "todo/write" && self.open_turn.is_none() => {
                return fail(format!(
                    "{kind} appended outside any open turn (core execution events must be turn-enclosed)"
                ));
            }
            _ => {}
        }
        next.last_seq = Some(seq);
        *self = next;
        Ok(())
    }
}

fn is_error_result(r: &crate::session::event::ToolResultEvent) -> bool {
    use crate::llm::types::ContentBlock;
    matches!(
        r.message.content.first(),
        Some(ContentBlock::ToolResult {
            is_error: Some(true),
            ..
        })
    )
}

/// Checks every relational rule over a whole log; returns the first violation.
///
/// # Errors
/// The first violation with its seq and reason.
pub fn check(events: &[Event]) -> Result<(), Violation> {
    let mut tracker = Tracker::new();
    for event in events {
        tracker.push(event)?;
    }
    Ok(())
}

/// True when the log ends with no open turn (every `turn/start` has its `turn/end`).
pub fn is_balanced(events: &[Event]) -> bool {
    let mut open = false;
    for e in events {
        match e.data {
            EventData::TurnStart(_) => open = true,
            EventData::TurnEnd(_) => open = false,
            _ => {}
        }
    }
    !open
}

#[cfg(test)]
mod tests {
    use super::*;

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

    const TS: &str = r#"{"type":"turn/start","seq":SEQ,"time":0,"data":{"turn":1}}"#;
    const TE: &str =
        r#"{"type":"turn/end","seq":SEQ,"time":0,"data":{"turn":1,"reason":{"kind":"completed"}}}"#;
    const SS: &str = r#"{"type":"step/start","seq":SEQ,"time":0,"data":{"turn":1,"step":1}}"#;
    const SE: &str = r#"{"type":"step/end","seq":SEQ,"time":0,"data":{"turn":1,"step":1}}"#;
    const CALL: &str = r#"{"type":"tool/call","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"callId":"c1","name":"t","arguments":"{}"}}"#;
    const RESULT: &str = r#"{"type":"tool/result","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"message":{"id":"r","role":"user","content":[{"type":"tool-result","toolCallId":"c1","content":[],"isError":false}],"source":{"kind":"tool","callId":"c1"}}},"surfaceOp":"append"}"#;

    #[test]
    fn accepts_a_well_formed_turn() {
        assert_eq!(check(&log(&[TS, SS, CALL, RESULT, SE, TE])), Ok(()));
        // An unanswered call at step/end is legal: the step clears it.
        assert_eq!(check(&log(&[TS, SS, CALL, SE, TE])), Ok(()));
    }

    #[test]
    fn reports_the_first_violation_with_its_seq() {
        let v = check(&log(&[TS, SS, TE])).unwrap_err();
        assert_eq!(v.seq, 2);
        assert_eq!(v.reason, "turn/end 1 while step 1 is still open");
        let v = check(&log(&[TS, TS])).unwrap_err();
        assert_eq!(v.reason, "turn/start 1 while turn 1 is still open");
        let v = check(&log(&[TS, SS, RESULT])).unwrap_err();
        assert_eq!(
            v.reason,
            "tool/result for call \"c1\" has no prior tool/call in this step"
        );
        let v = check(&log(&[SS])).unwrap_err();
        assert_eq!(v.reason, "step/start for turn 1 but open turn is None");
    }

    #[test]
    fn a_result_in_a_later_step_cannot_answer_an_earlier_call() {
        let later = RESULT.replace(r#""step":1,"message""#, r#""step":2,"message""#);
        let ss2 = SS.replace(r#""step":1"#, r#""step":2"#);
        let v = check(&log(&[TS, SS, CALL, SE, &ss2, &later])).unwrap_err();
        assert_eq!(v.seq, 5);
    }
}
