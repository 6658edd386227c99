//! Every bound on data that an outside party controls, in one value.
//!
//! Callers (a handle, a provider stream, a tool, a file being imported) are untrusted: each thing they
//! can make us hold in memory or write to disk has a limit here, with its default and the reason for
//! it. Limits are checked where outside data enters (`inbox` admission, the SSE reader, tool result
//! commit, the log reader) and a breach is a typed error that changes nothing — except tool results,
//! which are truncated with a notice the model sees, because the model must still get an answer.
//!
//! Relations between bounds are asserted at compile time below.

use serde::{Deserialize, Serialize};

/// The bounds on outside data. `Limits::DEFAULT` is what every constructor uses unless told otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// One user message (all its blocks, serialized as JSON). 1 MiB: a long prompt plus pasted files;
    /// larger inputs belong in a tool the model can page through.
    pub message_bytes_max: usize,
    /// Content blocks in one message. 512: generous for mixed text/image prompts, small enough that a
    /// degenerate message of empty blocks cannot blow up serialization work.
    pub content_blocks_max: usize,
    /// One tool call's argument string as produced by the model. 1 MiB.
    pub tool_arguments_bytes_max: usize,
    /// One tool result's content (serialized). 256 KiB; beyond it the result is truncated and the model
    /// sees a notice saying how much was cut.
    pub tool_result_bytes_max: usize,
    /// One server-sent-events line from a provider. 1 MiB: a single token delta is tiny; a line this long
    /// is a broken or hostile server.
    pub sse_line_bytes_max: usize,
    /// One server-sent-events event (all its `data:` lines joined). 4 MiB.
    pub sse_event_bytes_max: usize,
    /// Nesting depth of any JSON value we accept from outside (messages, tool arguments, imported
    /// events). 128: deeper values are refused before they can exhaust a recursive serializer's stack.
    pub json_depth_max: usize,
    /// Bytes in a session id. 128.
    pub session_id_bytes_max: usize,
    /// Bytes in a message id. 256.
    pub message_id_bytes_max: usize,
    /// Pending inputs per agent, both queues together. 1,024: a caller that floods an agent faster than
    /// it can run turns gets `InboxFull` instead of unbounded memory.
    pub pending_inputs_max: usize,
    /// Events buffered per subscriber before it is told it lagged. 1,024.
    pub subscriber_buffer_max: usize,
    /// Text, reasoning and tool-call arguments in one assistant response. 4 MiB: far beyond any model's
    /// output cap; a stream past it is cut and treated as a failed attempt, so the assembled message
    /// always fits in one event record.
    pub assistant_bytes_max: usize,
    /// One event record in the store (serialized). 8 MiB; must exceed every bound on a single payload.
    pub event_bytes_max: usize,
    /// Events in one session log. 4,000,000: a log past this is refused on load rather than read into
    /// memory whole.
    pub session_events_max: usize,
    /// Time a cancelled tool call gets to finish before its actor is killed and its result recorded as
    /// aborted. 2 s.
    pub tool_grace_ms: u64,
    /// Wall-clock bound on one tool call. 10 min; past it the call is cancelled and its result is a
    /// timeout error the model sees.
    pub tool_timeout_ms: u64,
}

impl Limits {
    /// Every bound at its default, each with its reason on the field above.
    pub const DEFAULT: Limits = Limits {
        message_bytes_max: 1 << 20,
        content_blocks_max: 512,
        tool_arguments_bytes_max: 1 << 20,
        tool_result_bytes_max: 256 << 10,
        sse_line_bytes_max: 1 << 20,
        sse_event_bytes_max: 4 << 20,
        json_depth_max: 128,
        session_id_bytes_max: 128,
        message_id_bytes_max: 256,
        pending_inputs_max: 1024,
        subscriber_buffer_max: 1024,
        assistant_bytes_max: 4 << 20,
        event_bytes_max: 8 << 20,
        session_events_max: 4_000_000,
        tool_grace_ms: 2_000,
        tool_timeout_ms: 600_000,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

// A single payload must always fit in one event record, or a valid input could become an
// unwritable event.
const _: () = assert!(Limits::DEFAULT.tool_result_bytes_max < Limits::DEFAULT.event_bytes_max);
const _: () = assert!(Limits::DEFAULT.message_bytes_max < Limits::DEFAULT.event_bytes_max);
const _: () = assert!(Limits::DEFAULT.tool_arguments_bytes_max < Limits::DEFAULT.event_bytes_max);
const _: () = assert!(Limits::DEFAULT.sse_line_bytes_max <= Limits::DEFAULT.sse_event_bytes_max);
const _: () = assert!(Limits::DEFAULT.sse_event_bytes_max < Limits::DEFAULT.event_bytes_max);
const _: () = assert!(Limits::DEFAULT.assistant_bytes_max < Limits::DEFAULT.event_bytes_max);

/// The most characters of an outside value an error message repeats. 200: enough to recognise a
/// value, bounded so a hostile 5 MB id cannot make a 5 MB error line.
pub const ECHO_CHARS_MAX: usize = 200;

/// `value` as an error message may repeat it: cut after [`ECHO_CHARS_MAX`] characters, with `…`
/// marking the cut.
pub fn echo(value: &str) -> String {
    match value.char_indices().nth(ECHO_CHARS_MAX) {
        Some((cut, _)) => format!("{}…", &value[..cut]),
        None => value.to_string(),
    }
}

#[cfg(test)]
mod echo_tests {
    use super::{ECHO_CHARS_MAX, echo};

    #[test]
    fn an_echo_keeps_short_values_and_cuts_long_ones_on_a_character() {
        assert_eq!(echo("abc"), "abc");
        let long = "é".repeat(ECHO_CHARS_MAX + 5);
        let cut = echo(&long);
        assert_eq!(cut.chars().count(), ECHO_CHARS_MAX + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(
            echo(&"x".repeat(ECHO_CHARS_MAX)),
            "x".repeat(ECHO_CHARS_MAX)
        );
    }
}
