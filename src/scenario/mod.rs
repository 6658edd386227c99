//! Scenario files (SPEC §9): the black-box conformance format, its semantic validation, and the
//! `expect` matcher. Pure: no I/O, no clock; the runner (`dsh-actors`, `cli/scenario.rs`) builds a
//! world from a `Scenario`, plays its actions, and hands the resulting log back to `Scenario::check`.
//!
//! A scenario is one JSON document; unknown fields are an error at every level, so a typo never turns
//! into a silently ignored setting. Parsing goes section by section so an error names its path
//! (`actions[3]: unknown field ...`). After the types, `Scenario::parse` checks what the types cannot:
//! an `open` of a gate nothing waits on, a `remove` of an id no earlier action sent, a `wait_for` with
//! count 0, a `tool_behaviour` for a call no model entry makes, and so on.
//!
//! The format is an interface others rely on: extend it, never rename or drop a field. Extensions
//! beyond SPEC §9, all optional:
//! - top level: `description` (free text), `action_timeout_ms` (how long one action may take before
//!   the run fails with a timeout; default 10 000); `mcp_servers` (an object of MCP server entries
//!   by name, each as `[mcp_servers.NAME]` in `dsh.toml`, SPEC §16: their tools join `tools` as
//!   `NAME__TOOL`; the runner checks and starts them, the format only requires objects).
//! - `agent`: `model` (default `scripted`), `system`, `tool_grace_ms`, `tool_timeout_ms`, and
//!   `compaction` (SPEC §15: `context_window`, `threshold_ratio`, `retain_ratio`, `auto`, as the
//!   `[compaction]` table of `dsh.toml`).
//! - `actions`: `{"compact": true}` compacts by hand (only while idle; done once its
//!   `compaction/start` is durable). The summariser consumes the next `model` entry. `wait_for` and
//!   `expect` accept the `compaction/*` types.
//! - `tool_behaviour` entries: `error` may be an object `{message, name, code}` (the `tool/result`
//!   then carries `error: {name, code}`); `ignore_cancel: true` makes a gated or delayed tool keep
//!   waiting after its turn is cancelled (an uncooperative tool, so an abort converges only when its
//!   gate opens or the grace period ends).
//! - `hooks.pre_step` entries: decisions `enter` (pass the claimed batch unchanged) and `fail` (the hook
//!   fails with `message`, ending the turn `error`), and `gate` (the hook waits for that gate first,
//!   cooperatively with cancellation).
//! - `hooks.turn_stopping` entries: `cancel: cause` besides `steer`/`inject`, and `at_stop: n` (act at
//!   the n-th time that turn would stop; default 1).
//! - `hooks.request_error`: `initial_delay_ms`, `max_delay_ms`, `jitter_ratio`, `retryable_codes`
//!   override the default policy's backoff and codes, so retries can be fast and deterministic.
//! - `expect` entries may also give `seq`, `sourceEventSeqs` and `surfaceOp`; in an object, an expected
//!   `null` matches a key that is absent (or null).
//!
//! Message ids: an input action without `id` gets `action-<index>`; a `pre_step` rewrite message
//! `pre-step-<entry>-<i>`; a `turn_stopping` message `turn-stopping-<entry>`; a tool's additional
//! context `<call id>-context-<i>`. So every printed log is the same from run to run, apart from the
//! ids the runtime mints (assistant and tool-result messages, retry chains, compaction ids and
//! checkpoint messages).
//!
//! The parts: this module holds the parsed types and `ScenarioError`; `parse` reads and validates
//! a document (`Scenario::parse`); `expect` compares a log with the `expect` section
//! (`Scenario::check`, `match_log`).

mod expect;
mod parse;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::ids::MessageId;
use crate::llm::retry::RetryPolicy;
use crate::llm::script::ScriptEntry;
use crate::llm::types::Message;
use crate::session::Event;
use crate::session::event::{CancelCause, ToolErrorInfo};

pub use expect::{Mismatch, event_json, match_log, subset_match};

/// The event types the runtime writes (SPEC §4): the only ones `wait_for` and `expect` may name.
pub const WRITTEN_EVENT_TYPES: &[&str] = &[
    "agent/inbox/spliced",
    "turn/start",
    "turn/end",
    "step/start",
    "step/end",
    "user/message",
    "request/header",
    "request/context",
    "assistant/chunk",
    "assistant/message",
    "tool/call",
    "tool/result",
    "llm/retry",
    "llm/retry-started",
    "session/end-seed",
    "compaction/start",
    "compaction/summary",
    "compaction/end",
    "compaction/prune",
];

/// How long one action may take unless the scenario says otherwise.
pub const ACTION_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// The model name the agent uses unless `agent.model` says otherwise.
pub const MODEL_DEFAULT: &str = "scripted";

/// The plugin name on messages a scenario's hooks and tools add (`{kind:"plugin", plugin:"scenario"}`).
pub const PLUGIN_NAME: &str = "scenario";

/// Why a scenario could not be read, run or checked.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The document is not JSON at all.
    #[error("scenario is not valid JSON: {reason}")]
    Json {
        /// The JSON parser's message (with line and column).
        reason: String,
    },
    /// A field has the wrong type, is missing, or is unknown.
    #[error("{path}: {reason}")]
    Field {
        /// Where in the document, e.g. `actions[3]` or `hooks.pre_step[0].gate`.
        path: String,
        /// What is wrong there.
        reason: String,
    },
    /// The fields parse but do not make sense together.
    #[error("{path}: {reason}")]
    Invalid {
        /// Where in the document.
        path: String,
        /// Which rule the fields break.
        reason: String,
    },
    /// `Scenario::check` was asked to compare a log, but the scenario has no `expect`.
    #[error("scenario {scenario:?} has no expect section to check against")]
    NoExpect {
        /// The scenario's name.
        scenario: String,
    },
    /// The log differs from `expect`; the mismatch names the first difference.
    #[error("{0}")]
    Mismatch(Box<Mismatch>),
    /// The runtime refused an action (an input error, an unknown agent, ...).
    #[error("scenario {scenario:?}: actions[{action_idx}] ({action}) failed: {reason}")]
    Action {
        /// The scenario's name.
        scenario: String,
        /// Index of the action in `actions`.
        action_idx: usize,
        /// The action as `Action`'s `Display` prints it.
        action: String,
        /// The runtime's error.
        reason: String,
    },
    /// Something the runner waited for did not happen in time: the scenario hangs.
    #[error("scenario {scenario:?}: {at} did not finish within {timeout_ms} ms ({waiting})")]
    Timeout {
        /// The scenario's name.
        scenario: String,
        /// `actions[i] (...)` or `the final wait for idle`.
        at: String,
        /// The bound that ran out (`action_timeout_ms`).
        timeout_ms: u64,
        /// What was still missing.
        waiting: String,
    },
    /// The world could not be built or read (host start, store read).
    #[error("scenario {scenario:?}: {reason}")]
    Runtime {
        /// The scenario's name.
        scenario: String,
        /// What failed.
        reason: String,
    },
}

/// A JSON value on one line, for error messages and reports.
fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| "<unprintable>".to_string())
}

/// The agent's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentSection {
    /// Invariant: at least 1.
    pub max_parallel_tool_calls: usize,
    /// Invariant: at least 1 when set.
    pub max_tokens: Option<u64>,
    /// Invariant: non-empty.
    pub model: String,
    /// The system prompt, if any.
    pub system: Option<String>,
    /// How long a cancelled tool may run on before it is killed (the runtime's default when unset).
    pub tool_grace_ms: Option<u64>,
    /// How long one tool call may run (no bound when unset). Invariant: at least 1 when set.
    pub tool_timeout_ms: Option<u64>,
    /// `agent.compaction` (an extension, SPEC §15): `context_window`, `threshold_ratio`,
    /// `retain_ratio`, `auto`. Invariant: valid (`CompactionSettings::validate`).
    pub compaction: crate::session::compaction::CompactionSettings,
}

impl Default for AgentSection {
    fn default() -> AgentSection {
        AgentSection {
            max_parallel_tool_calls: 10,
            max_tokens: None,
            model: MODEL_DEFAULT.to_string(),
            system: None,
            tool_grace_ms: None,
            tool_timeout_ms: None,
            compaction: crate::session::compaction::CompactionSettings::default(),
        }
    }
}

/// How a scenario tool schedules its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolMode {
    /// Safe to overlap with other parallel calls.
    Parallel,
    /// A barrier: the call runs alone, after everything before it drained.
    Exclusive,
}

/// One tool the agent offers.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// The tool's name, as model entries call it. Invariant: non-empty, unique in `tools`.
    pub name: String,
    /// How its calls are scheduled.
    pub mode: ToolMode,
}

/// What a tool call with this id does. A call without an entry answers `ok` at once.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ToolBehaviour {
    /// The text result (default `ok`).
    pub result: Option<String>,
    /// Slept before anything else.
    pub delay_ms: u64,
    /// Waited for after the delay.
    pub gate: Option<String>,
    /// Makes the result an error: `(message, info)`; the model sees `Error: <message>`.
    pub error: Option<(String, Option<ToolErrorInfo>)>,
    /// Panics after the delay and the gate.
    pub panic: bool,
    /// Messages the call adds for the model after its result (plugin-sourced, ids
    /// `<call id>-context-<i>`).
    pub additional_contexts: Vec<Message>,
    /// The result concludes the turn: the model is not asked again unless next-step has input.
    pub concludes_turn: bool,
    /// Keeps waiting through a cancellation.
    pub ignore_cancel: bool,
}

/// What a `pre_step` entry does at its proposed step.
#[derive(Clone, Debug, PartialEq)]
pub enum PreStepAction {
    /// Enter with the claimed batch unchanged.
    Enter,
    /// Do not enter; the turn ends `blocked`.
    Reject,
    /// Enter with exactly these messages (`[]`: enter nothing).
    Rewrite(Vec<Message>),
    /// The hook fails with this message; the turn ends `error`.
    Fail(String),
}

/// One `hooks.pre_step` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct PreStepEntry {
    /// Invariant: at least 1.
    pub turn: u64,
    /// The proposed step. Invariant: at least 1.
    pub step: u64,
    /// What the hook decides.
    pub action: PreStepAction,
    /// Waited for before deciding.
    pub gate: Option<String>,
}

/// What a `turn_stopping` entry does.
#[derive(Clone, Debug, PartialEq)]
pub enum TurnStoppingDo {
    /// Steer this message in: the turn takes another step with it.
    Steer(Message),
    /// Inject this message: it joins the next boundary of whatever turn runs next.
    Inject(Message),
    /// Cancel the turn with this cause.
    Cancel(CancelCause),
}

/// One `hooks.turn_stopping` entry: acts once, the `at_stop`-th time turn `turn` would stop.
#[derive(Clone, Debug, PartialEq)]
pub struct TurnStoppingEntry {
    /// Invariant: at least 1.
    pub turn: u64,
    /// Which time the turn would stop (1 = the first). Invariant: at least 1.
    pub at_stop: u64,
    /// What the hook does then.
    pub act: TurnStoppingDo,
}

/// The hooks a scenario installs.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct HooksSection {
    /// `hooks.pre_step` entries; at most one per turn and step.
    pub pre_step: Vec<PreStepEntry>,
    /// `hooks.turn_stopping` entries, in document order.
    pub turn_stopping: Vec<TurnStoppingEntry>,
    /// The default request-error policy, with the scenario's budget (and optional backoff knobs).
    pub request_error: Option<RetryPolicy>,
}

/// One user input an action sends.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    /// The message id: the action's `id`, else `action-<index>`.
    pub id: MessageId,
    /// The message text.
    pub text: String,
}

impl Input {
    /// The message the action sends: one text block, source `{kind:"user"}`.
    pub fn message(&self) -> Message {
        Message::user_text(self.id.clone(), self.text.clone())
    }
}

/// One step of a scenario's script, run in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Queue a message as the prompt of its own turn (next-turn queue; wakes an idle agent).
    Followup(Input),
    /// Queue a message for the nearest step boundary of the running turn (idle: starts a turn).
    Steer(Input),
    /// Queue a message for the next boundary of whatever turn runs next (does not wake the agent).
    Inject(Input),
    /// Cancel the running turn.
    Cancel {
        /// Why (default `user`).
        cause: CancelCause,
        /// Whether pending inputs survive the cancellation (otherwise they are discarded).
        keep_inbox: bool,
    },
    /// Take back a queued message an earlier action sent.
    Remove(MessageId),
    /// Replace a queued message an earlier action sent.
    Replace {
        /// The message replaced.
        id: MessageId,
        /// What replaces it.
        with: Input,
    },
    /// Open a gate that a model entry, tool or hook waits on.
    Open(String),
    /// Until the durable log holds at least `count` events of `kind`. Invariant: `count >= 1`.
    WaitFor {
        /// An event type the runtime writes (`WRITTEN_EVENT_TYPES`).
        kind: String,
        /// How many such events. Invariant: at least 1.
        count: usize,
    },
    /// Until the agent is idle.
    WaitIdle,
    /// Stop the agent and resume it from its stored log.
    Restart,
    /// Compact the history by hand (an extension, SPEC §15): only while idle; done once the
    /// compaction's `compaction/start` is durable (its end comes before the agent is idle again).
    Compact,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Followup(i) => write!(f, "followup {:?} as {}", i.text, i.id),
            Action::Steer(i) => write!(f, "steer {:?} as {}", i.text, i.id),
            Action::Inject(i) => write!(f, "inject {:?} as {}", i.text, i.id),
            Action::Cancel { cause, keep_inbox } => {
                write!(f, "cancel {} keep_inbox={keep_inbox}", cause_name(cause))
            }
            Action::Remove(id) => write!(f, "remove {id}"),
            Action::Replace { id, with } => {
                write!(f, "replace {id} with {:?} as {}", with.text, with.id)
            }
            Action::Open(g) => write!(f, "open {g}"),
            Action::WaitFor { kind, count } => write!(f, "wait_for {count} {kind}"),
            Action::WaitIdle => write!(f, "wait_idle"),
            Action::Restart => write!(f, "restart"),
            Action::Compact => write!(f, "compact"),
        }
    }
}

fn cause_name(cause: &CancelCause) -> String {
    match cause {
        CancelCause::User => "user".into(),
        CancelCause::Parent => "parent".into(),
        CancelCause::Disposed => "disposed".into(),
        CancelCause::Hook { reason } => format!("hook({reason:?})"),
        CancelCause::Legacy => "legacy".into(),
    }
}

/// How `expect` is compared with the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ExpectMode {
    /// Event for event: the log has exactly as many events as `expect` has entries.
    #[default]
    Whole,
    /// The entries match events in order, others may come between.
    Subsequence,
}

/// One `expect` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Expectation {
    /// The event type expected.
    pub kind: String,
    /// The parts of the envelope to compare (`data`, `seq`, `sourceEventSeqs`, `surfaceOp`), as given.
    pub fields: Map<String, Value>,
    /// The entry as written, for reports.
    pub written: Value,
}

/// A parsed and validated scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// The scenario's name, used in every report. Invariant: not blank.
    pub name: String,
    /// Free text about what it shows.
    pub description: Option<String>,
    /// The agent's settings.
    pub agent: AgentSection,
    /// The tools the agent offers.
    pub tools: Vec<ToolSpec>,
    /// The scripted model's replies, one per request, in order.
    pub model: Vec<ScriptEntry>,
    /// What each tool call does, by call id; a call without an entry answers `ok` at once.
    pub tool_behaviour: BTreeMap<String, ToolBehaviour>,
    /// The hooks installed.
    pub hooks: HooksSection,
    /// The script, run in order.
    pub actions: Vec<Action>,
    /// What the log must hold afterwards (`None`: the scenario only runs).
    pub expect: Option<Vec<Expectation>>,
    /// How `expect` is compared with the log.
    pub expect_mode: ExpectMode,
    /// How long one action may take before the run fails with a timeout. Invariant: at least 1.
    pub action_timeout_ms: u64,
    /// MCP servers by name, each entry an object as written (the runner checks it; the core knows
    /// no MCP). Empty when the scenario has none.
    pub mcp_servers: BTreeMap<String, Map<String, Value>>,
}

impl Scenario {
    /// Every gate name the scenario's model entries, tools and hooks wait on.
    pub fn gates(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self
            .model
            .iter()
            .filter_map(|e| e.gate_spec().map(|(g, _)| g.to_string()))
            .collect();
        out.extend(self.tool_behaviour.values().filter_map(|b| b.gate.clone()));
        out.extend(self.hooks.pre_step.iter().filter_map(|e| e.gate.clone()));
        out
    }

    /// Compares `events` with `expect`.
    ///
    /// # Errors
    /// `NoExpect` when the scenario has no `expect`; `Mismatch` naming the first difference.
    pub fn check(&self, events: &[Event]) -> Result<(), ScenarioError> {
        let Some(expect) = &self.expect else {
            return Err(ScenarioError::NoExpect {
                scenario: self.name.clone(),
            });
        };
        match_log(expect, self.expect_mode, events).map_err(|mut m| {
            m.scenario.clone_from(&self.name);
            ScenarioError::Mismatch(m)
        })
    }
}
