//! The retry policy (`reference/session-llm.md` §6.8–§6.9) as pure functions: configuration with
//! validation, the policy key, and the decision plus backoff for one failure.
//!
//! OWNER: pure-core helper (issue 2, item 5).

/// A validated retry policy.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {}
    }
}
