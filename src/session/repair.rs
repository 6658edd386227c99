//! Crash repair: the closers for a turn left open at the tail of a log (`reference/session-llm.md`
//! §3.3), as a pure function from events to the events to append.
//!
//! OWNER: session helper (issue 2, item 3).

use crate::session::event::Event;

/// `TOOL_NOT_STARTED`
pub const TOOL_NOT_STARTED: &str = "TOOL_NOT_STARTED";
/// `TOOL_OUTCOME_UNKNOWN`
pub const TOOL_OUTCOME_UNKNOWN: &str = "TOOL_OUTCOME_UNKNOWN";

/// The synthetic events that close an open tail turn, with seqs continuing the log and `time` copied
/// from the last event; empty for a balanced or empty log.
pub fn interrupted_turn_closers(events: &[Event]) -> Vec<Event> {
    let _ = events;
    todo!("session helper")
}
