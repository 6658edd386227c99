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
//! Compaction (§8.5): a `compaction/start` may not open while another is open; a numeric `turn`
//! must be the open turn, `null` requires no open turn; `compaction/summary` and `compaction/end`
//! name the open compaction (id and `sourceCommandId`); at most one summary, whose `shadowedSeqs`
//! are non-empty with `shadowedRange` their first and last and a `shadowedTokenCount` that is a safe
//! integer; `end.turn` repeats the start's; an `end` without `error` needs the summary; a replacing
//! checkpoint `user/message` (source plugin `compact`) belongs to the open compaction, after its
//! summary (outside any compaction one is accepted, as the original's own snapshots write one
//! without a bracket); `turn/start` and `turn/end` may not occur while a compaction is open; `compaction/prune`
//! lies inside a turn. An open compaction followed by `session/end-seed` is stale (its process
//! died): the marker closes it. So is one whose turn crash repair closes: a `turn/end
//! {interrupted}` (written only by repair, just before the end-seed of the next loop instance) ends
//! the lock with the turn.
//!
//! `Tracker` checks one event at a time (for debug builds of the runtime); `check` folds a whole log.

use crate::session::compaction::{CompactionEvent, checkpoint_id};
use crate::session::event::{Event, EventData, SurfaceOp, TurnEndReason};
use crate::session::repair::TOOL_NOT_STARTED;

/// The first event that breaks a relational rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invariant violated at seq {seq}: {reason}")]
pub struct Violation {
    /// The seq of the event that breaks the rule.
    pub seq: u64,
    /// The rule, and how it is broken.
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
    /// The compaction between its `compaction/start` and `compaction/end`, if any (the lock).
    open_compaction: Option<OpenCompaction>,
}

/// The lock of one compaction in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
struct OpenCompaction {
    id: String,
    source_command_id: Option<String>,
    /// The start's `turn` (`None`: manual, between turns).
    owner: Option<u64>,
    summarised: bool,
}

/// The largest integer JavaScript represents exactly (`Number.MAX_SAFE_INTEGER`).
const SAFE_INTEGER_MAX: u64 = (1 << 53) - 1;

impl Tracker {
    /// The trace of an empty log: no turn open, turn 1 next.
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
    /// Every rule is checked before anything changes, so a violation leaves the trace as it was.
    ///
    /// # Errors
    /// The violation; the trace is unchanged.
    pub fn push(&mut self, event: &Event) -> Result<(), Violation> {
        let seq = event.seq;
        self.advance(event)
            .map_err(|reason| Violation { seq, reason })?;
        self.last_seq = Some(seq);
        Ok(())
    }

    /// Checks `event` and applies it to the open turn and step (everything but `last_seq`); the
    /// reason when it breaks a rule, with nothing changed.
    fn advance(&mut self, event: &Event) -> Result<(), String> {
        if let Some(last) = self.last_seq
            && event.seq <= last
        {
            return Err(format!("seq must strictly increase (after {last})"));
        }
        let kind = event.kind();
        if let Some(read) = CompactionEvent::read(event) {
            return self.compaction(read?);
        }
        match &event.data {
            EventData::TurnStart(t) => {
                self.no_compaction_open("turn/start")?;
                self.turn_start(t.turn)
            }
            EventData::TurnEnd(t) => {
                if t.reason == TurnEndReason::Interrupted {
                    // Crash repair closes a dead lifecycle's turn, and its lock with it.
                    self.turn_end(t.turn)?;
                    self.open_compaction = None;
                    return Ok(());
                }
                self.no_compaction_open("turn/end")?;
                self.turn_end(t.turn)
            }
            EventData::SessionEndSeed => {
                // A lock still open here belongs to a dead process lifecycle: stale.
                self.open_compaction = None;
                Ok(())
            }
            EventData::UserMessage(m) => match (checkpoint_id(m), event.surface_op) {
                (Some(id), Some(SurfaceOp::Replace { .. })) => self.checkpoint(id),
                _ => Ok(()),
            },
            EventData::StepStart(s) => self.step_start(s.turn, s.step),
            EventData::StepEnd(s) => {
                self.names_open_step(kind, s.turn, s.step)?;
                self.pending_calls.clear();
                self.open_step = None;
                self.next_step = s.step + 1;
                Ok(())
            }
            EventData::AssistantChunk(c) => self.names_open_step(kind, c.turn, c.step),
            EventData::AssistantMessage(a) => self.names_open_step(kind, a.turn, a.step),
            EventData::LlmRetry(r) => self.names_open_step(kind, r.turn, r.step),
            EventData::LlmRetryStarted(r) => self.names_open_step(kind, r.turn, r.step),
            EventData::ToolCall(c) => {
                self.names_open_step(kind, c.turn, c.step)?;
                self.pending_calls.push(c.call_id.clone());
                Ok(())
            }
            EventData::ToolResult(r) => self.tool_result(event, r),
            EventData::RequestHeader(_) | EventData::RequestContext(_) => self.turn_enclosed(kind),
            EventData::Other { kind, .. } if kind == "todo/write" => self.turn_enclosed(kind),
            _ => Ok(()),
        }
    }

    fn no_compaction_open(&self, kind: &str) -> Result<(), String> {
        match &self.open_compaction {
            Some(c) => Err(format!("{kind} while compaction {} is open", c.id)),
            None => Ok(()),
        }
    }

    /// A `compaction/*` event (§8.5).
    fn compaction(&mut self, event: CompactionEvent) -> Result<(), String> {
        match event {
            CompactionEvent::Start(start) => {
                if let Some(open) = &self.open_compaction {
                    return Err(format!(
                        "compaction/start {} while compaction {} is open",
                        start.compaction_id, open.id
                    ));
                }
                match (start.turn, self.open_turn) {
                    (Some(t), open) if open != Some(t) => {
                        return Err(format!(
                            "compaction/start owned by turn {t} but open turn is {open:?}"
                        ));
                    }
                    (None, Some(open)) => {
                        return Err(format!(
                            "compaction/start with turn null while turn {open} is open"
                        ));
                    }
                    _ => {}
                }
                self.open_compaction = Some(OpenCompaction {
                    id: start.compaction_id,
                    source_command_id: start.source_command_id,
                    owner: start.turn,
                    summarised: false,
                });
                Ok(())
            }
            CompactionEvent::Summary(summary) => {
                let open = self.matching("compaction/summary", &summary.compaction_id)?;
                if open.source_command_id != summary.source_command_id {
                    return Err(
                        "compaction/summary sourceCommandId does not match its start".into(),
                    );
                }
                if open.summarised {
                    return Err(format!(
                        "compaction {} has a second compaction/summary",
                        open.id
                    ));
                }
                check_shadowed(
                    "compaction/summary",
                    &summary.shadowed_seqs,
                    summary.shadowed_range,
                    summary.shadowed_token_count,
                )?;
                if let Some(open) = self.open_compaction.as_mut() {
                    open.summarised = true;
                }
                Ok(())
            }
            CompactionEvent::End(end) => {
                let open = self.matching("compaction/end", &end.compaction_id)?;
                if open.source_command_id != end.source_command_id {
                    return Err("compaction/end sourceCommandId does not match its start".into());
                }
                if open.owner != end.turn {
                    return Err(format!(
                        "compaction/end turn {:?} does not match its start's {:?}",
                        end.turn, open.owner
                    ));
                }
                if end.error.is_none() && !open.summarised {
                    return Err(format!(
                        "compaction/end without error for compaction {} that has no summary",
                        open.id
                    ));
                }
                self.open_compaction = None;
                Ok(())
            }
            CompactionEvent::Prune(prune) => {
                self.turn_enclosed("compaction/prune")?;
                check_shadowed(
                    "compaction/prune",
                    &prune.shadowed_seqs,
                    prune.shadowed_range,
                    prune.shadowed_token_count,
                )
            }
        }
    }

    /// The open compaction, which `kind` names by `id`.
    fn matching(&self, kind: &str, id: &str) -> Result<&OpenCompaction, String> {
        match &self.open_compaction {
            Some(open) if open.id == id => Ok(open),
            Some(open) => Err(format!(
                "{kind} for compaction {id} but compaction {} is open",
                open.id
            )),
            None => Err(format!("{kind} for compaction {id} with none open")),
        }
    }

    /// A replacing checkpoint message written while a compaction is open belongs to it, after its
    /// summary. Outside any compaction it is not refused: the original's own snapshots append such
    /// a replacement without a bracket (a test's surface `replace`), and the original loads them.
    fn checkpoint(&self, id: &str) -> Result<(), String> {
        if self.open_compaction.is_none() {
            return Ok(());
        }
        let open = self.matching("compaction checkpoint user/message", id)?;
        if !open.summarised {
            return Err(format!(
                "compaction checkpoint for compaction {id} before its summary"
            ));
        }
        Ok(())
    }

    /// `turn/start`: no turn open, and the number is the next one.
    fn turn_start(&mut self, turn: u64) -> Result<(), String> {
        if let Some(open) = self.open_turn {
            return Err(format!("turn/start {turn} while turn {open} is still open"));
        }
        if turn != self.next_turn {
            return Err(format!("expected turn {}, got {turn}", self.next_turn));
        }
        self.open_turn = Some(turn);
        self.next_step = 1;
        Ok(())
    }

    /// `turn/end`: it closes the open turn, whose steps are all closed.
    fn turn_end(&mut self, turn: u64) -> Result<(), String> {
        if self.open_turn != Some(turn) {
            return Err(format!(
                "turn/end {turn} does not match open turn {:?}",
                self.open_turn
            ));
        }
        if let Some(step) = self.open_step {
            return Err(format!("turn/end {turn} while step {step} is still open"));
        }
        self.open_turn = None;
        self.next_turn = turn + 1;
        Ok(())
    }

    /// `step/start`: inside the open turn, no step open, and the number is the next one.
    fn step_start(&mut self, turn: u64, step: u64) -> Result<(), String> {
        if self.open_turn != Some(turn) {
            return Err(format!(
                "step/start for turn {turn} but open turn is {:?}",
                self.open_turn
            ));
        }
        if let Some(open) = self.open_step {
            return Err(format!("step/start {step} while step {open} is still open"));
        }
        if step != self.next_step {
            return Err(format!(
                "expected step {} in turn {turn}, got {step}",
                self.next_step
            ));
        }
        self.open_step = Some(step);
        Ok(())
    }

    /// A `tool/result`: a surface replacement needs an open turn; an appended result names the open
    /// step and answers a call logged in it (or is a `TOOL_NOT_STARTED` repair result).
    fn tool_result(
        &mut self,
        event: &Event,
        r: &crate::session::event::ToolResultEvent,
    ) -> Result<(), String> {
        if let Some(SurfaceOp::Replace { .. }) = event.surface_op {
            if self.open_turn.is_none() {
                return Err(
                    "tool/result surface replacement appended outside any open turn".to_string(),
                );
            }
            return Ok(());
        }
        self.names_open_step(event.kind(), r.turn, r.step)?;
        let call_id = r.message.source.str_field("callId").unwrap_or("");
        let not_started =
            r.error.as_ref().is_some_and(|e| e.code == TOOL_NOT_STARTED) && is_error_result(r);
        match self.pending_calls.iter().position(|c| c == call_id) {
            Some(i) => {
                self.pending_calls.remove(i);
                Ok(())
            }
            None if not_started => Ok(()),
            None => Err(format!(
                "tool/result for call {call_id:?} has no prior tool/call in this step"
            )),
        }
    }

    /// An event of `kind` for `turn`/`step` names the open step.
    fn names_open_step(&self, kind: &str, turn: u64, step: u64) -> Result<(), String> {
        match (self.open_turn, self.open_step) {
            (Some(t), Some(s)) if t == turn && s == step => Ok(()),
            (Some(t), Some(s)) => Err(format!(
                "{kind} names turn {turn}/step {step}, open is turn {t}/step {s}"
            )),
            _ => Err(format!(
                "{kind} for turn {turn}/step {step} with no open step"
            )),
        }
    }

    /// A core execution event of `kind` lies inside a turn.
    fn turn_enclosed(&self, kind: &str) -> Result<(), String> {
        if self.open_turn.is_none() {
            return Err(format!(
                "{kind} appended outside any open turn (core execution events must be turn-enclosed)"
            ));
        }
        Ok(())
    }
}

/// `shadowedSeqs` is non-empty, `shadowedRange` is its first and last, the count a safe integer.
fn check_shadowed(
    kind: &str,
    seqs: &[u64],
    range: crate::session::compaction::SeqRange,
    token_count: u64,
) -> Result<(), String> {
    let (Some(&first), Some(&last)) = (seqs.first(), seqs.last()) else {
        return Err(format!("{kind} shadowedSeqs must not be empty"));
    };
    if range.start != first || range.end != last {
        return Err(format!(
            "{kind} shadowedRange {}..{} is not the first and last of shadowedSeqs ({first}..{last})",
            range.start, range.end
        ));
    }
    if token_count > SAFE_INTEGER_MAX {
        return Err(format!(
            "{kind} shadowedTokenCount {token_count} is not a safe integer"
        ));
    }
    Ok(())
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

/// The original's invariant catalogue (`reference/session-llm.md` §9.7). Cases about the Cordis
/// companion's lifecycle (1 global registration under a scope, 4 observer containment, 17 listener
/// removal) have no analogue: `check` and `Tracker` are pure folds with nothing to register.
#[cfg(test)]
mod catalogue_tests {
    use super::*;

    /// Parses JSON event lines, giving each the seq of its position (`SEQ` in the text).
    fn log(lines: &[String]) -> Vec<Event> {
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let json = l.replace("SEQ", &i.to_string());
                Event::from_json(&json).unwrap_or_else(|e| panic!("{json}: {e}"))
            })
            .collect()
    }

    fn ts(turn: u64) -> String {
        format!(r#"{{"type":"turn/start","seq":SEQ,"time":0,"data":{{"turn":{turn}}}}}"#)
    }
    fn te(turn: u64) -> String {
        format!(
            r#"{{"type":"turn/end","seq":SEQ,"time":0,"data":{{"turn":{turn},"reason":{{"kind":"completed"}}}}}}"#
        )
    }
    fn ss(turn: u64, step: u64) -> String {
        format!(
            r#"{{"type":"step/start","seq":SEQ,"time":0,"data":{{"turn":{turn},"step":{step}}}}}"#
        )
    }
    fn se(turn: u64, step: u64) -> String {
        format!(
            r#"{{"type":"step/end","seq":SEQ,"time":0,"data":{{"turn":{turn},"step":{step}}}}}"#
        )
    }
    fn chunk(turn: u64, step: u64) -> String {
        format!(
            r#"{{"type":"assistant/chunk","seq":SEQ,"time":0,"data":{{"turn":{turn},"step":{step},"chunk":{{"type":"text-delta","index":0,"text":"x"}}}}}}"#
        )
    }
    fn assistant(turn: u64, step: u64) -> String {
        format!(
            r#"{{"type":"assistant/message","seq":SEQ,"time":0,"data":{{"turn":{turn},"step":{step},"message":{{"id":"a","role":"assistant","content":[],"source":{{"kind":"model","provider":"p","model":"m"}}}}}},"sourceEventSeqs":[],"surfaceOp":"append"}}"#
        )
    }
    fn call(turn: u64, step: u64, id: &str) -> String {
        format!(
            r#"{{"type":"tool/call","seq":SEQ,"time":0,"data":{{"turn":{turn},"step":{step},"callId":"{id}","name":"t","arguments":"{{}}"}}}}"#
        )
    }
    fn result(turn: u64, step: u64, id: &str, tail: &str) -> String {
        format!(
            r#"{{"type":"tool/result","seq":SEQ,"time":0,"data":{{"turn":{turn},"step":{step},"message":{{"id":"r","role":"user","content":[{{"type":"tool-result","toolCallId":"{id}","content":[],"isError":false}}],"source":{{"kind":"tool","callId":"{id}"}}}}}},{tail}}}"#
        )
    }
    fn appended_result(turn: u64, step: u64, id: &str) -> String {
        result(turn, step, id, r#""surfaceOp":"append""#)
    }
    fn not_started(turn: u64, step: u64, id: &str) -> String {
        format!(
            r#"{{"type":"tool/result","seq":SEQ,"time":0,"data":{{"turn":{turn},"step":{step},"message":{{"id":"r","role":"user","content":[{{"type":"tool-result","toolCallId":"{id}","content":[],"isError":true}}],"source":{{"kind":"tool","callId":"{id}"}}}},"error":{{"name":"ToolNotStartedError","code":"TOOL_NOT_STARTED"}}}},"surfaceOp":"append"}}"#
        )
    }
    fn user() -> String {
        r#"{"type":"user/message","seq":SEQ,"time":0,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#.into()
    }
    fn plugin(kind: &str) -> String {
        format!(r#"{{"type":"{kind}","seq":SEQ,"time":0,"data":{{"todos":[]}}}}"#)
    }
    fn header() -> String {
        r#"{"type":"request/header","seq":SEQ,"time":0,"data":{"header":{"config":{"provider":"p","model":"m"}},"reason":"initial"}}"#.into()
    }
    fn context() -> String {
        r#"{"type":"request/context","seq":SEQ,"time":0,"data":{"provider":"p","model":"m"}}"#
            .into()
    }
    fn end_seed() -> String {
        r#"{"type":"session/end-seed","seq":SEQ,"time":0,"data":{}}"#.into()
    }

    fn violation(lines: &[String]) -> (u64, String) {
        let v = check(&log(lines)).expect_err("the log must be refused");
        (v.seq, v.reason)
    }

    /// Case 2: accepts a well-formed turn, step, and tool sequence (user/message before step/start is
    /// allowed)
    #[test]
    fn accepts_a_well_formed_turn_step_and_tool_sequence() {
        let lines = [
            ts(1),
            user(),
            ss(1, 1),
            chunk(1, 1),
            assistant(1, 1),
            call(1, 1, "c1"),
            appended_result(1, 1, "c1"),
            se(1, 1),
            ss(1, 2),
            se(1, 2),
            te(1),
            ts(2),
            te(2),
        ];
        assert_eq!(check(&log(&lines)), Ok(()));
    }

    /// Case 3: does not advance committed trace state when an event is refused — the refused event can be
    /// offered again once it is valid, and the state is exactly as before.
    #[test]
    fn a_refused_event_leaves_the_trace_unchanged() {
        let events = log(&[ts(1), se(1, 1), ts(1)]);
        let mut tracker = Tracker::new();
        tracker.push(&events[0]).unwrap();
        let before = format!("{tracker:?}");
        assert!(tracker.push(&events[1]).is_err());
        assert_eq!(format!("{tracker:?}"), before);
        assert_eq!(tracker.open_turn(), Some(1));
        assert_eq!(tracker.open_step(), None);
    }

    /// Case 5: rejects non-monotonic event sequence numbers
    #[test]
    fn rejects_non_monotonic_seqs() {
        let mut events = log(&[ts(1), se(1, 1)]);
        events[1].seq = 0;
        let v = check(&events).unwrap_err();
        assert_eq!(
            v,
            Violation {
                seq: 0,
                reason: "seq must strictly increase (after 0)".into()
            }
        );
    }

    /// Case 6: enforces turn numbering and core execution enclosure
    #[test]
    fn enforces_turn_numbering_and_enclosure() {
        assert_eq!(
            violation(&[ts(1), ts(2)]),
            (1, "turn/start 2 while turn 1 is still open".into())
        );
        assert_eq!(
            violation(&[ts(1), te(2)]),
            (1, "turn/end 2 does not match open turn Some(1)".into())
        );
        assert_eq!(violation(&[ts(2)]), (0, "expected turn 1, got 2".into()));
        assert_eq!(
            violation(&[ts(1), te(1), ts(3)]),
            (2, "expected turn 2, got 3".into())
        );
        // Core execution events inside an open turn (a step need not be open).
        assert_eq!(
            check(&log(&[
                ts(1),
                plugin("todo/write"),
                header(),
                context(),
                te(1)
            ])),
            Ok(())
        );
        for outside in [context(), header(), plugin("todo/write")] {
            let (seq, reason) = violation(&[outside]);
            assert_eq!(seq, 0);
            assert!(
                reason.ends_with(
                    "appended outside any open turn (core execution events must be turn-enclosed)"
                ),
                "{reason}"
            );
        }
        // Idle user messages and plugin events are unconstrained.
        assert_eq!(
            check(&log(&[
                user(),
                plugin("session/title"),
                ts(1),
                te(1),
                user()
            ])),
            Ok(())
        );
    }

    /// Case 7: enforces open-step identity and numbering
    #[test]
    fn enforces_open_step_identity_and_numbering() {
        assert_eq!(
            violation(&[ts(1), ss(2, 1)]),
            (1, "step/start for turn 2 but open turn is Some(1)".into())
        );
        assert_eq!(
            violation(&[ts(1), ss(1, 1), ss(1, 2)]),
            (2, "step/start 2 while step 1 is still open".into())
        );
        assert_eq!(
            violation(&[ts(1), ss(1, 1), te(1)]),
            (2, "turn/end 1 while step 1 is still open".into())
        );
        assert_eq!(
            violation(&[ts(1), ss(1, 1), se(1, 2)]),
            (
                2,
                "step/end names turn 1/step 2, open is turn 1/step 1".into()
            )
        );
        assert_eq!(
            violation(&[ts(1), ss(1, 1), assistant(1, 2)]),
            (
                2,
                "assistant/message names turn 1/step 2, open is turn 1/step 1".into()
            )
        );
        assert_eq!(
            violation(&[ts(1), ss(1, 2)]),
            (1, "expected step 1 in turn 1, got 2".into())
        );
        assert_eq!(
            violation(&[ts(1), ss(1, 1), se(1, 1), ss(1, 3)]),
            (3, "expected step 2 in turn 1, got 3".into())
        );
        // Step numbers restart with each turn.
        assert_eq!(
            check(&log(&[
                ts(1),
                ss(1, 1),
                se(1, 1),
                te(1),
                ts(2),
                ss(2, 1),
                se(2, 1),
                te(2)
            ])),
            Ok(())
        );
    }

    /// Case 8: requires step-scoped stream and tool events to name the open step
    #[test]
    fn stream_and_tool_events_need_the_open_step() {
        assert_eq!(
            violation(&[ts(1), chunk(1, 1)]),
            (
                1,
                "assistant/chunk for turn 1/step 1 with no open step".into()
            )
        );
        assert_eq!(
            violation(&[ts(1), ss(1, 1), appended_result(1, 1, "c9")]),
            (
                2,
                "tool/result for call \"c9\" has no prior tool/call in this step".into()
            )
        );
        assert_eq!(
            violation(&[ts(1), call(1, 1, "c1")]),
            (1, "tool/call for turn 1/step 1 with no open step".into())
        );
    }

    /// Case 9: keeps fresh tool-result appends open-step checked — an append-origin result outside a step
    /// is refused
    #[test]
    fn appended_result_outside_a_step_is_refused() {
        assert_eq!(
            violation(&[
                ts(1),
                ss(1, 1),
                call(1, 1, "c1"),
                se(1, 1),
                appended_result(1, 1, "c1")
            ]),
            (4, "tool/result for turn 1/step 1 with no open step".into())
        );
    }

    /// Case 10: treats a validated tool-result replacement as a turn-enclosed rewrite — a content-only
    /// replacement in a later turn is accepted
    #[test]
    fn result_replacement_in_a_later_turn_is_accepted() {
        let lines = [
            ts(1),
            ss(1, 1),
            call(1, 1, "c1"),
            appended_result(1, 1, "c1"),
            se(1, 1),
            te(1),
            ts(2),
            result(
                1,
                1,
                "c1",
                r#""sourceEventSeqs":[3],"surfaceOp":{"op":"replace","start":3,"end":3}"#,
            ),
            te(2),
        ];
        assert_eq!(check(&log(&lines)), Ok(()));
    }

    /// Case 11: rejects a tool-result replacement outside a turn
    #[test]
    fn result_replacement_outside_a_turn_is_refused() {
        let lines = [
            ts(1),
            ss(1, 1),
            call(1, 1, "c1"),
            appended_result(1, 1, "c1"),
            se(1, 1),
            te(1),
            result(
                1,
                1,
                "c1",
                r#""sourceEventSeqs":[3],"surfaceOp":{"op":"replace","start":3,"end":3}"#,
            ),
        ];
        assert_eq!(
            violation(&lines),
            (
                6,
                "tool/result surface replacement appended outside any open turn".into()
            )
        );
    }

    /// Case 12: allows not-started repair results and unresolved calls at step end
    #[test]
    fn not_started_results_and_unanswered_calls_are_legal() {
        assert_eq!(
            check(&log(&[
                ts(1),
                ss(1, 1),
                not_started(1, 1, "c1"),
                se(1, 1),
                te(1)
            ])),
            Ok(())
        );
        assert_eq!(
            check(&log(&[ts(1), ss(1, 1), call(1, 1, "c1"), se(1, 1), te(1)])),
            Ok(())
        );
        // The exemption needs both marks: an error result that is not TOOL_NOT_STARTED still needs
        // its call.
        let unknown = not_started(1, 1, "c1").replace("TOOL_NOT_STARTED", "TOOL_OUTCOME_UNKNOWN");
        assert!(check(&log(&[ts(1), ss(1, 1), unknown])).is_err());
    }

    /// Case 13: does not let a result in a later step satisfy an earlier call
    #[test]
    fn later_step_result_cannot_answer_an_earlier_call() {
        assert_eq!(
            violation(&[
                ts(1),
                ss(1, 1),
                call(1, 1, "c1"),
                se(1, 1),
                ss(1, 2),
                appended_result(1, 2, "c1")
            ]),
            (
                5,
                "tool/result for call \"c1\" has no prior tool/call in this step".into()
            )
        );
    }

    /// Case 14: tracks each session independently — two trackers share nothing, and a bad log is refused.
    #[test]
    fn trackers_are_independent() {
        let a = log(&[ts(1), ss(1, 1)]);
        let b = log(&[ts(1)]);
        let mut ta = Tracker::new();
        let mut tb = Tracker::new();
        ta.push(&a[0]).unwrap();
        tb.push(&b[0]).unwrap();
        ta.push(&a[1]).unwrap();
        assert_eq!((ta.open_step(), tb.open_step()), (Some(1), None));
        assert!(check(&log(&[ts(1), ts(1)])).is_err());
    }

    /// Case 15: rebuilds trace state for sessions that exist when the checker starts — a tracker fed a
    /// prefix continues exactly as `check` over the whole log.
    #[test]
    fn a_tracker_rebuilt_from_a_prefix_continues_like_the_whole_check() {
        let events = log(&[
            ts(1),
            ss(1, 1),
            call(1, 1, "c1"),
            se(1, 1),
            ss(1, 2),
            appended_result(1, 2, "c1"),
        ]);
        for cut in 0..events.len() {
            let mut tracker = Tracker::new();
            for e in &events[..cut] {
                tracker.push(e).unwrap();
            }
            let rest: Result<(), Violation> =
                events[cut..].iter().try_for_each(|e| tracker.push(e));
            assert_eq!(rest, check(&events), "cut at {cut}");
        }
    }

    /// Case 16: accepts end-seed whether or not a turn is open — the marker moves no cursor
    #[test]
    fn end_seed_is_accepted_anywhere() {
        assert_eq!(
            check(&log(&[
                end_seed(),
                ts(1),
                end_seed(),
                ss(1, 1),
                end_seed(),
                se(1, 1),
                te(1),
                end_seed()
            ])),
            Ok(())
        );
        assert!(!is_balanced(&log(&[ts(1), end_seed()])));
    }

    fn cstart(id: &str, turn: &str) -> String {
        format!(
            r#"{{"type":"compaction/start","seq":SEQ,"time":0,"data":{{"compactionId":"{id}","turn":{turn}}}}}"#
        )
    }
    fn csummary(id: &str, seqs: &str, range: (u64, u64)) -> String {
        format!(
            r#"{{"type":"compaction/summary","seq":SEQ,"time":0,"data":{{"compactionId":"{id}","summary":[{{"type":"text","text":"s"}}],"shadowedRange":{{"start":{},"end":{}}},"shadowedSeqs":{seqs},"shadowedTokenCount":9,"provider":"p","model":"m"}}}}"#,
            range.0, range.1
        )
    }
    fn cend(id: &str, turn: &str, error: bool) -> String {
        let error = if error { r#","error":"x""# } else { "" };
        format!(
            r#"{{"type":"compaction/end","seq":SEQ,"time":0,"data":{{"compactionId":"{id}","turn":{turn}{error}}}}}"#
        )
    }
    fn checkpoint(id: &str) -> String {
        format!(
            r#"{{"type":"user/message","seq":SEQ,"time":0,"data":{{"content":[],"source":{{"kind":"plugin","plugin":"compact","compactionId":"{id}"}},"role":"user","id":"k"}},"sourceEventSeqs":[0],"surfaceOp":{{"op":"replace","start":0,"end":0}}}}"#
        )
    }
    fn interrupted(turn: u64) -> String {
        format!(
            r#"{{"type":"turn/end","seq":SEQ,"time":0,"data":{{"turn":{turn},"reason":{{"kind":"interrupted"}}}}}}"#
        )
    }

    /// §8.5: a well-formed manual bracket, an automatic one inside a turn, and a failed one.
    #[test]
    fn accepts_compaction_brackets() {
        let ok = [
            user(),
            cstart("a", "null"),
            csummary("a", "[0]", (0, 0)),
            checkpoint("a"),
            cend("a", "null", false),
            ts(1),
            cstart("b", "1"),
            cend("b", "1", true),
            te(1),
        ];
        assert_eq!(check(&log(&ok)), Ok(()));
        // A checkpoint replacement outside any bracket, as the original's snapshots write one.
        assert_eq!(check(&log(&[user(), checkpoint("x")])), Ok(()));
    }

    /// §8.5: every rule names the event that breaks it.
    #[test]
    fn rejects_broken_compaction_brackets() {
        let cases: Vec<(Vec<String>, &str)> = vec![
            (
                vec![cstart("a", "null"), cstart("b", "null")],
                "compaction/start b while compaction a is open",
            ),
            (
                vec![ts(1), cstart("a", "null")],
                "compaction/start with turn null while turn 1 is open",
            ),
            (
                vec![cstart("a", "1")],
                "compaction/start owned by turn 1 but open turn is None",
            ),
            (
                vec![cstart("a", "null"), cend("b", "null", true)],
                "compaction/end for compaction b but compaction a is open",
            ),
            (
                vec![cstart("a", "null"), cend("a", "null", false)],
                "compaction/end without error for compaction a that has no summary",
            ),
            (
                vec![ts(1), cstart("a", "1"), cend("a", "null", true)],
                "compaction/end turn None does not match its start's Some(1)",
            ),
            (
                vec![
                    cstart("a", "null"),
                    csummary("a", "[1]", (1, 1)),
                    csummary("a", "[1]", (1, 1)),
                ],
                "compaction a has a second compaction/summary",
            ),
            (
                vec![cstart("a", "null"), csummary("a", "[]", (1, 1))],
                "compaction/summary shadowedSeqs must not be empty",
            ),
            (
                vec![cstart("a", "null"), csummary("a", "[1,2]", (1, 1))],
                "compaction/summary shadowedRange 1..1 is not the first and last of shadowedSeqs (1..2)",
            ),
            (
                vec![cstart("a", "null"), checkpoint("a")],
                "compaction checkpoint for compaction a before its summary",
            ),
            (
                vec![cstart("b", "null"), checkpoint("a")],
                "compaction checkpoint user/message for compaction a but compaction b is open",
            ),
            (
                vec![cstart("a", "null"), ts(1)],
                "turn/start while compaction a is open",
            ),
            (
                vec![ts(1), cstart("a", "1"), te(1)],
                "turn/end while compaction a is open",
            ),
        ];
        for (lines, want) in cases {
            let (_, reason) = violation(&lines);
            assert_eq!(reason, want, "{lines:?}");
        }
    }

    /// §8.5: an unmatched start before `session/end-seed` is stale, so is one whose turn repair
    /// closes; a new compaction may start after it.
    #[test]
    fn a_lock_before_the_end_seed_is_stale() {
        let manual = [
            cstart("a", "null"),
            end_seed(),
            cstart("b", "null"),
            cend("b", "null", true),
        ];
        assert_eq!(check(&log(&manual)), Ok(()));
        let automatic = [
            ts(1),
            cstart("a", "1"),
            interrupted(1),
            end_seed(),
            ts(2),
            cstart("b", "2"),
            cend("b", "2", true),
            te(2),
        ];
        assert_eq!(check(&log(&automatic)), Ok(()));
        // Without the end-seed the lock is live: busy.
        let (seq, _) = violation(&[cstart("a", "null"), cstart("b", "null")]);
        assert_eq!(seq, 1);
    }
}
