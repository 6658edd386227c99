//! The relational invariant checker (`reference/session-llm.md` §3.2), shared by tests, `dsh check` and
//! debug builds of the runtime.
//!
//! OWNER: session helper (issue 2, item 3).

use crate::session::event::Event;

/// The first event that breaks a relational rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invariant violated at seq {seq}: {reason}")]
pub struct Violation {
    pub seq: u64,
    pub reason: String,
}

/// Checks every relational rule over a whole log; returns the first violation.
///
/// # Errors
/// The first violation with its seq and reason.
pub fn check(events: &[Event]) -> Result<(), Violation> {
    let _ = events;
    todo!("session helper")
}
