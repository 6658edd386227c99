//! `fold_consumed_work` (`reference/agent-loop.md` §3.6): which turn last accounted for consumed
//! input, and whether input was dropped unrun after it.
//!
//! A turn *accounts for consumed work* when it entered a model step, or when it claimed input from the
//! inbox and then ended any way but `completed` (the claimed input was used up by a failure, an abort,
//! a pre-step rejection or a crash). A `completed` turn that claimed but never stepped emptied its own
//! claim and accounts for nothing. A pending message cancelled out of the inbox (a `canceled` splice
//! that inserts nothing) after the last accounting turn was *dropped unrun*; a later accounting turn
//! absorbs the drop, and a replacement (a `canceled` splice that inserts) is not a drop.
//!
//! Who calls this: anything that must know whether an agent used its input — the last turn that did,
//! and whether pending input was thrown away since. Pure, one pass over the log.

use std::collections::HashSet;

use crate::session::event::{Event, EventData, SpliceOutcome, TurnEndReason};

/// The fold's result.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConsumedWork {
    /// The `turn/end` event of the last turn that accounted for consumed input.
    pub end: Option<Event>,
    /// True when pending input was cancelled unrun after that turn (or, with no such turn, at all).
    pub dropped_unrun: bool,
}

/// Folds `events` (a session log, in seq order) into the last accounting turn end and whether input
/// was dropped unrun after it. Accepts any sequence; events of other types are ignored.
pub fn fold_consumed_work(events: &[Event]) -> ConsumedWork {
    let mut out = ConsumedWork::default();
    // The turn between its `turn/start` and `turn/end`; a claim outside any turn credits no turn.
    let mut open_turn: Option<u64> = None;
    // Turn numbers are keyed, not just the open turn, so a malformed log (a step naming another
    // turn) is read the way the original reads it.
    let mut stepped: HashSet<u64> = HashSet::new();
    let mut claimed: HashSet<u64> = HashSet::new();
    for event in events {
        match &event.data {
            EventData::TurnStart(start) => open_turn = Some(start.turn),
            EventData::StepStart(step) => {
                stepped.insert(step.turn);
            }
            EventData::InboxSpliced(splice) if splice.removed_count.is_some_and(|n| n > 0) => {
                match splice.outcome {
                    Some(SpliceOutcome::Canceled) => {
                        out.dropped_unrun |= splice.inserted.is_empty();
                    }
                    None => {
                        if let Some(turn) = open_turn {
                            claimed.insert(turn);
                        }
                    }
                }
            }
            EventData::TurnEnd(end) => {
                let accounts = stepped.contains(&end.turn)
                    || (claimed.contains(&end.turn)
                        && !matches!(end.reason, TurnEndReason::Completed));
                if accounts {
                    out.end = Some(event.clone());
                    out.dropped_unrun = false;
                }
                open_turn = None;
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::ids::MessageId;
    use crate::llm::types::{LlmFailure, Message};
    use crate::session::event::{
        CancelCause, InboxSpliced, InboxTarget, StepRef, TurnEnd, TurnStart,
    };

    /// Builds a log with contiguous seqs.
    #[derive(Default)]
    struct Log(Vec<Event>);

    impl Log {
        fn push(mut self, data: EventData) -> Log {
            let seq = u64::try_from(self.0.len()).expect("small");
            self.0.push(Event {
                seq,
                time: 0,
                data,
                ignorable: false,
                source_event_seqs: None,
                surface_op: None,
                raw_data: None,
            });
            self
        }
        fn turn_start(self, turn: u64) -> Log {
            self.push(EventData::TurnStart(TurnStart { turn }))
        }
        fn step(self, turn: u64, step: u64) -> Log {
            let at = StepRef { turn, step };
            self.push(EventData::StepStart(at))
                .push(EventData::StepEnd(at))
        }
        fn turn_end(self, turn: u64, reason: TurnEndReason) -> Log {
            self.push(EventData::TurnEnd(Box::new(TurnEnd { turn, reason })))
        }
        fn splice(
            self,
            removed_count: Option<u64>,
            inserted: &[&str],
            outcome: Option<SpliceOutcome>,
        ) -> Log {
            let inserted = inserted
                .iter()
                .map(|s| Arc::new(Message::user_text(MessageId::new(s).expect("valid"), *s)))
                .collect();
            self.push(EventData::InboxSpliced(InboxSpliced {
                target: InboxTarget::NextTurn,
                start: 0,
                removed_count,
                inserted,
                outcome,
            }))
        }
        fn append(self, id: &str) -> Log {
            self.splice(None, &[id], None)
        }
        fn claim(self) -> Log {
            self.splice(Some(1), &[], None)
        }
        fn cancel(self) -> Log {
            self.splice(Some(1), &[], Some(SpliceOutcome::Canceled))
        }
        fn replace(self, id: &str) -> Log {
            self.splice(Some(1), &[id], Some(SpliceOutcome::Canceled))
        }
        fn fold(&self) -> ConsumedWork {
            fold_consumed_work(&self.0)
        }
        /// The event at `seq`.
        fn at(&self, seq: usize) -> Option<Event> {
            self.0.get(seq).cloned()
        }
    }

    fn error() -> TurnEndReason {
        TurnEndReason::Error {
            error: LlmFailure::new("SERVER", "boom"),
        }
    }

    fn aborted() -> TurnEndReason {
        TurnEndReason::Aborted {
            reason: CancelCause::User,
        }
    }

    /// consumed-work.spec: "reports nothing for a log that consumed no work".
    #[test]
    fn reports_nothing_for_a_log_that_consumed_no_work() {
        assert_eq!(Log::default().fold(), ConsumedWork::default());
        let log = Log::default().append("m1");
        assert_eq!(
            log.fold(),
            ConsumedWork {
                end: None,
                dropped_unrun: false
            }
        );
    }

    /// consumed-work.spec: "reports the latest turn that entered a model step".
    #[test]
    fn reports_the_latest_turn_that_entered_a_model_step() {
        let log = Log::default()
            .append("m1")
            .turn_start(1)
            .claim()
            .step(1, 1)
            .turn_end(1, TurnEndReason::Completed)
            .append("m2")
            .turn_start(2)
            .claim()
            .step(2, 1)
            .turn_end(2, TurnEndReason::MaxTokens);
        let folded = log.fold();
        assert_eq!(folded.end, log.at(11));
        assert!(matches!(
            &folded.end,
            Some(Event { data: EventData::TurnEnd(t), .. })
                if **t == TurnEnd { turn: 2, reason: TurnEndReason::MaxTokens }
        ));
        assert!(!folded.dropped_unrun);
    }

    /// consumed-work.spec: "reports a turn that claimed its input and then failed before any step"
    /// and "...was then stopped before any step".
    #[test]
    fn reports_a_turn_that_claimed_and_then_failed_or_stopped_before_any_step() {
        for reason in [error(), aborted(), TurnEndReason::Interrupted] {
            let log = Log::default()
                .append("m1")
                .turn_start(1)
                .claim()
                .turn_end(1, reason.clone());
            assert_eq!(
                log.fold(),
                ConsumedWork {
                    end: log.at(3),
                    dropped_unrun: false
                },
                "reason {reason:?}"
            );
        }
    }

    /// consumed-work.spec: "ignores a turn stopped, failed, or rejected without taking any input".
    #[test]
    fn ignores_turns_that_took_no_input() {
        for reason in [aborted(), error(), TurnEndReason::Blocked] {
            let log = Log::default().turn_start(1).turn_end(1, reason);
            assert_eq!(log.fold(), ConsumedWork::default());
        }
    }

    /// consumed-work.spec: "reports a turn whose claimed input a pre-step rejection discarded".
    #[test]
    fn reports_a_turn_whose_claim_a_rejection_discarded() {
        let log = Log::default()
            .append("m1")
            .turn_start(1)
            .claim()
            .turn_end(1, TurnEndReason::Blocked);
        assert_eq!(log.fold().end, log.at(3));
    }

    /// consumed-work.spec: "ignores a claim its own turn emptied" (completed, no step).
    #[test]
    fn ignores_a_claim_its_own_turn_emptied() {
        let log = Log::default()
            .append("m1")
            .turn_start(1)
            .claim()
            .turn_end(1, TurnEndReason::Completed);
        assert_eq!(log.fold(), ConsumedWork::default());
    }

    /// consumed-work.spec: "credits a claim with no open turn to no turn at all".
    #[test]
    fn credits_a_claim_with_no_open_turn_to_no_turn() {
        let log = Log::default()
            .append("m1")
            .claim()
            .turn_start(1)
            .turn_end(1, aborted());
        assert_eq!(log.fold(), ConsumedWork::default());
    }

    /// consumed-work.spec: "reports work cancelled out of the inbox after the last accounting turn".
    #[test]
    fn reports_work_cancelled_after_the_last_accounting_turn() {
        let log = Log::default()
            .append("m1")
            .turn_start(1)
            .claim()
            .step(1, 1)
            .turn_end(1, TurnEndReason::Completed)
            .append("m2")
            .cancel();
        assert_eq!(
            log.fold(),
            ConsumedWork {
                end: log.at(5),
                dropped_unrun: true
            }
        );
        // With no accounting turn at all, a cancellation is still a drop.
        assert!(Log::default().append("m1").cancel().fold().dropped_unrun);
    }

    /// consumed-work.spec: "keeps a replacement pending rather than counting it as dropped".
    #[test]
    fn keeps_a_replacement_pending_rather_than_dropped() {
        let log = Log::default().append("m1").replace("m2");
        assert_eq!(log.fold(), ConsumedWork::default());
    }

    /// consumed-work.spec: "lets a later accounting turn absorb an earlier drop".
    #[test]
    fn lets_a_later_accounting_turn_absorb_an_earlier_drop() {
        let log = Log::default()
            .append("m1")
            .cancel()
            .append("m2")
            .turn_start(1)
            .claim()
            .step(1, 1)
            .turn_end(1, TurnEndReason::Completed);
        assert_eq!(
            log.fold(),
            ConsumedWork {
                end: log.at(7),
                dropped_unrun: false
            }
        );
        // A turn that does not account leaves the drop standing.
        let log = Log::default()
            .append("m1")
            .cancel()
            .turn_start(1)
            .turn_end(1, aborted());
        assert!(log.fold().dropped_unrun);
    }
}
