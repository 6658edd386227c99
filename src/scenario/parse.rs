//! Reading a scenario document: section by section, so an error names its path
//! (`actions[3]: unknown field ...`), with unknown fields refused at every level; then the checks
//! the types cannot make (an `open` of a gate nothing waits on, a `remove` of an id no earlier
//! action sent, a `wait_for` with count 0, a `tool_behaviour` for a call no model entry makes, ...).
//! Pure. Error messages are part of the format's interface: tests pin them.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::{
    ACTION_TIMEOUT_MS_DEFAULT, Action, AgentSection, ExpectMode, Expectation, HooksSection, Input,
    PLUGIN_NAME, PreStepAction, PreStepEntry, Scenario, ScenarioError, ToolBehaviour, ToolSpec,
    TurnStoppingDo, TurnStoppingEntry, WRITTEN_EVENT_TYPES, compact,
};
use crate::ids::MessageId;
use crate::llm::retry::{Backoff, DEFAULT_RETRYABLE_CODES, RetryMode, RetryPolicy};
use crate::llm::script::{ScriptEntry, ScriptReply};
use crate::llm::types::{ContentBlock, Message, MessageSource, StreamChunk};
use crate::session::event::{CancelCause, ToolErrorInfo};

// -------------------------------------------------------------------------------------------------
// Raw shapes (serde), one per object of the format.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTop {
    name: Value,
    #[serde(default)]
    description: Option<Value>,
    #[serde(default)]
    agent: Option<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    tool_behaviour: Option<Value>,
    #[serde(default)]
    hooks: Option<Value>,
    actions: Value,
    #[serde(default)]
    expect: Option<Value>,
    #[serde(default)]
    expect_mode: Option<Value>,
    #[serde(default)]
    action_timeout_ms: Option<Value>,
    #[serde(default)]
    mcp_servers: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    #[serde(default)]
    max_parallel_tool_calls: Option<u64>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    system: Option<String>,
    #[serde(default)]
    tool_grace_ms: Option<u64>,
    #[serde(default)]
    tool_timeout_ms: Option<u64>,
    #[serde(default)]
    compaction: Option<RawCompaction>,
}

/// `agent.compaction` (SPEC §15).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCompaction {
    #[serde(default)]
    context_window: Option<u64>,
    #[serde(default)]
    threshold_ratio: Option<f64>,
    #[serde(default)]
    retain_ratio: Option<f64>,
    #[serde(default)]
    auto: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBehaviour {
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    gate: Option<String>,
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    panic: Option<bool>,
    #[serde(default)]
    additional_contexts: Option<Vec<String>>,
    #[serde(default)]
    concludes_turn: Option<bool>,
    #[serde(default)]
    ignore_cancel: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToolError {
    message: String,
    name: String,
    code: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHooks {
    #[serde(default)]
    pre_step: Option<Vec<Value>>,
    #[serde(default)]
    turn_stopping: Option<Vec<Value>>,
    #[serde(default)]
    request_error: Option<Value>,
}

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum RawDecision {
    Enter,
    Reject,
    Rewrite,
    Fail,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPreStep {
    turn: u64,
    step: u64,
    decision: RawDecision,
    #[serde(default)]
    messages: Option<Vec<String>>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    gate: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurnStopping {
    turn: u64,
    #[serde(default)]
    at_stop: Option<u64>,
    #[serde(default)]
    steer: Option<String>,
    #[serde(default)]
    inject: Option<String>,
    #[serde(default)]
    cancel: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequestError {
    retries: u64,
    #[serde(default)]
    initial_delay_ms: Option<u64>,
    #[serde(default)]
    max_delay_ms: Option<u64>,
    #[serde(default)]
    jitter_ratio: Option<f64>,
    #[serde(default)]
    retryable_codes: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAction {
    #[serde(default)]
    followup: Option<String>,
    #[serde(default)]
    steer: Option<String>,
    #[serde(default)]
    inject: Option<String>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    cancel: Option<RawCancel>,
    #[serde(default)]
    remove: Option<String>,
    #[serde(default)]
    replace: Option<String>,
    #[serde(default)]
    with: Option<String>,
    #[serde(default)]
    open: Option<String>,
    #[serde(default)]
    wait_for: Option<RawWaitFor>,
    #[serde(default)]
    wait_idle: Option<bool>,
    #[serde(default)]
    restart: Option<bool>,
    #[serde(default)]
    compact: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCancel {
    #[serde(default)]
    cause: Option<Value>,
    #[serde(default)]
    keep_inbox: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWaitFor {
    #[serde(rename = "type")]
    kind: String,
    count: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpectation {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    seq: Option<Value>,
    #[serde(default)]
    data: Option<Value>,
    #[serde(default, rename = "sourceEventSeqs")]
    source_event_seqs: Option<Value>,
    #[serde(default, rename = "surfaceOp")]
    surface_op: Option<Value>,
}

fn typed<T: DeserializeOwned>(path: &str, v: &Value) -> Result<T, ScenarioError> {
    T::deserialize(v).map_err(|e| ScenarioError::Field {
        path: path.to_string(),
        reason: e.to_string(),
    })
}

fn invalid(path: impl Into<String>, reason: impl Into<String>) -> ScenarioError {
    ScenarioError::Invalid {
        path: path.into(),
        reason: reason.into(),
    }
}

fn message_id(path: &str, id: &str) -> Result<MessageId, ScenarioError> {
    MessageId::new(id).map_err(|e| invalid(path, format!("{id:?} is not a valid message id: {e}")))
}

fn plugin_message(path: &str, id: &str, text: &str) -> Result<Message, ScenarioError> {
    Ok(Message {
        id: message_id(path, id)?,
        role: crate::llm::types::Role::User,
        content: vec![ContentBlock::text(text)],
        source: MessageSource::plugin(PLUGIN_NAME),
    })
}

fn gate_name(path: &str, name: &str) -> Result<String, ScenarioError> {
    if name.is_empty() {
        return Err(invalid(path, "gate name is empty"));
    }
    Ok(name.to_string())
}

/// `"user" | "parent" | "disposed" | {"hook": reason}`
fn parse_cause(path: &str, v: &Value) -> Result<CancelCause, ScenarioError> {
    match v {
        Value::String(s) if s == "user" => Ok(CancelCause::User),
        Value::String(s) if s == "parent" => Ok(CancelCause::Parent),
        Value::String(s) if s == "disposed" => Ok(CancelCause::Disposed),
        Value::Object(m) if m.len() == 1 => match m.get("hook") {
            Some(Value::String(reason)) => Ok(CancelCause::Hook {
                reason: reason.clone(),
            }),
            _ => Err(ScenarioError::Field {
                path: path.to_string(),
                reason: format!("a hook cause is {{\"hook\": reason}}, got {}", compact(v)),
            }),
        },
        _ => Err(ScenarioError::Field {
            path: path.to_string(),
            reason: format!(
                "cause must be \"user\", \"parent\", \"disposed\" or {{\"hook\": reason}}, got {}",
                compact(v)
            ),
        }),
    }
}

/// Every tool-call id a model entry streams (its `tool_calls`, or tool-call chunks of `chunks`).
fn call_ids(entry: &ScriptEntry, out: &mut BTreeSet<String>) {
    match &entry.reply {
        ScriptReply::ToolCalls { calls, .. } => out.extend(calls.iter().map(|c| c.id.clone())),
        ScriptReply::Chunks(chunks) => {
            for chunk in chunks {
                match chunk {
                    StreamChunk::ToolCallDelta { id, .. } => {
                        out.insert(id.clone());
                    }
                    StreamChunk::BlockEnd {
                        block: ContentBlock::ToolCall { id, .. },
                        ..
                    } => {
                        out.insert(id.clone());
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

impl Scenario {
    /// Parses and validates a scenario document.
    ///
    /// # Errors
    /// `Json` for text that is not JSON; `Field` for a wrong type, a missing or an unknown field (with
    /// its path); `Invalid` for fields that parse but contradict each other or the rules above.
    pub fn parse(json: &str) -> Result<Scenario, ScenarioError> {
        let v: Value = serde_json::from_str(json).map_err(|e| ScenarioError::Json {
            reason: e.to_string(),
        })?;
        Scenario::from_value(&v)
    }

    /// As [`Scenario::parse`], from a JSON value.
    ///
    /// # Errors
    /// As [`Scenario::parse`].
    pub fn from_value(v: &Value) -> Result<Scenario, ScenarioError> {
        if !v.is_object() {
            return Err(ScenarioError::Field {
                path: "scenario".into(),
                reason: format!("must be a JSON object, got {}", kind_of(v)),
            });
        }
        let top: RawTop = typed("scenario", v)?;
        let name: String = typed("name", &top.name)?;
        if name.trim().is_empty() {
            return Err(invalid("name", "name is empty"));
        }
        let description = match &top.description {
            None | Some(Value::Null) => None,
            Some(d) => Some(typed::<String>("description", d)?),
        };
        let agent = match &top.agent {
            None | Some(Value::Null) => AgentSection::default(),
            Some(a) => parse_agent(a)?,
        };
        let tools = parse_tools(top.tools.as_ref())?;
        let model = parse_model(top.model.as_ref())?;
        let mut gates = BTreeSet::new();
        let mut calls = BTreeSet::new();
        for entry in &model {
            if let Some((g, _)) = entry.gate_spec() {
                gates.insert(g.to_string());
            }
            call_ids(entry, &mut calls);
        }
        let tool_behaviour = parse_behaviours(top.tool_behaviour.as_ref(), &calls, &mut gates)?;
        let hooks = match &top.hooks {
            None | Some(Value::Null) => HooksSection::default(),
            Some(h) => parse_hooks(h, &mut gates)?,
        };
        let actions = parse_actions(&top.actions, &gates)?;
        let expect = match &top.expect {
            None | Some(Value::Null) => None,
            Some(e) => Some(parse_expect(e)?),
        };
        let expect_mode = match &top.expect_mode {
            None | Some(Value::Null) => ExpectMode::Whole,
            Some(m) => typed("expect_mode", m)?,
        };
        let action_timeout_ms = match &top.action_timeout_ms {
            None | Some(Value::Null) => ACTION_TIMEOUT_MS_DEFAULT,
            Some(t) => typed::<u64>("action_timeout_ms", t)?,
        };
        if action_timeout_ms == 0 {
            return Err(invalid("action_timeout_ms", "must be at least 1"));
        }
        let mcp_servers = match &top.mcp_servers {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(m) => typed("mcp_servers", m)?,
        };
        Ok(Scenario {
            name,
            description,
            agent,
            tools,
            model,
            tool_behaviour,
            hooks,
            actions,
            expect,
            expect_mode,
            action_timeout_ms,
            mcp_servers,
        })
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_agent(v: &Value) -> Result<AgentSection, ScenarioError> {
    let raw: RawAgent = typed("agent", v)?;
    let mut agent = AgentSection::default();
    if let Some(n) = raw.max_parallel_tool_calls {
        if n == 0 {
            return Err(invalid(
                "agent.max_parallel_tool_calls",
                "must be at least 1 (1 = serial)",
            ));
        }
        agent.max_parallel_tool_calls = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if raw.max_tokens == Some(0) {
        return Err(invalid("agent.max_tokens", "must be at least 1 or null"));
    }
    agent.max_tokens = raw.max_tokens;
    if let Some(model) = raw.model {
        if model.is_empty() {
            return Err(invalid("agent.model", "model is empty"));
        }
        agent.model = model;
    }
    agent.system = raw.system;
    agent.tool_grace_ms = raw.tool_grace_ms;
    if raw.tool_timeout_ms == Some(0) {
        return Err(invalid("agent.tool_timeout_ms", "must be at least 1"));
    }
    agent.tool_timeout_ms = raw.tool_timeout_ms;
    if let Some(c) = raw.compaction {
        let defaults = &agent.compaction;
        let settings = crate::session::compaction::CompactionSettings {
            context_window: c.context_window,
            threshold_ratio: c.threshold_ratio.unwrap_or(defaults.threshold_ratio),
            retain_ratio: c.retain_ratio.unwrap_or(defaults.retain_ratio),
            auto: c.auto.unwrap_or(defaults.auto),
        };
        settings
            .validate()
            .map_err(|e| invalid("agent.compaction", e))?;
        agent.compaction = settings;
    }
    Ok(agent)
}

fn parse_tools(v: Option<&Value>) -> Result<Vec<ToolSpec>, ScenarioError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let items: Vec<Value> = typed("tools", v)?;
    let mut tools: Vec<ToolSpec> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("tools[{i}]");
        let tool: ToolSpec = typed(&path, item)?;
        if tool.name.is_empty() {
            return Err(invalid(path, "tool name is empty"));
        }
        if tools.iter().any(|t| t.name == tool.name) {
            return Err(invalid(
                path,
                format!("tool {:?} is declared twice", tool.name),
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn parse_model(v: Option<&Value>) -> Result<Vec<ScriptEntry>, ScenarioError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let items: Vec<Value> = typed("model", v)?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| typed(&format!("model[{i}]"), item))
        .collect()
}

fn parse_behaviours(
    v: Option<&Value>,
    calls: &BTreeSet<String>,
    gates: &mut BTreeSet<String>,
) -> Result<BTreeMap<String, ToolBehaviour>, ScenarioError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(BTreeMap::new());
    };
    let items: BTreeMap<String, Value> = typed("tool_behaviour", v)?;
    let mut out = BTreeMap::new();
    for (call_id, item) in items {
        let path = format!("tool_behaviour.{call_id}");
        let raw: RawBehaviour = typed(&path, &item)?;
        if !calls.contains(&call_id) {
            return Err(invalid(
                path,
                format!("no model entry makes a tool call with id {call_id:?}"),
            ));
        }
        let error = match raw.error {
            None | Some(Value::Null) => None,
            Some(Value::String(m)) => Some((m, None)),
            Some(other) => {
                let e: RawToolError = typed(&format!("{path}.error"), &other)?;
                Some((
                    e.message,
                    Some(ToolErrorInfo {
                        name: e.name,
                        code: e.code,
                    }),
                ))
            }
        };
        let panic = raw.panic.unwrap_or(false);
        if raw.result.is_some() && error.is_some() {
            return Err(invalid(path, "result and error exclude each other"));
        }
        if panic && (raw.result.is_some() || error.is_some()) {
            return Err(invalid(path, "a panicking call has no result or error"));
        }
        let gate = optional_gate(&path, raw.gate, gates)?;
        let contexts = raw
            .additional_contexts
            .unwrap_or_default()
            .iter()
            .enumerate()
            .map(|(i, text)| {
                plugin_message(
                    &format!("{path}.additional_contexts[{i}]"),
                    &format!("{call_id}-context-{i}"),
                    text,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.insert(
            call_id,
            ToolBehaviour {
                result: raw.result,
                delay_ms: raw.delay_ms.unwrap_or(0),
                gate,
                error,
                panic,
                additional_contexts: contexts,
                concludes_turn: raw.concludes_turn.unwrap_or(false),
                ignore_cancel: raw.ignore_cancel.unwrap_or(false),
            },
        );
    }
    Ok(out)
}

fn parse_hooks(v: &Value, gates: &mut BTreeSet<String>) -> Result<HooksSection, ScenarioError> {
    let raw: RawHooks = typed("hooks", v)?;
    let mut hooks = HooksSection::default();
    for (i, item) in raw.pre_step.unwrap_or_default().iter().enumerate() {
        let entry = parse_pre_step(i, item, &hooks.pre_step, gates)?;
        hooks.pre_step.push(entry);
    }
    for (i, item) in raw.turn_stopping.unwrap_or_default().iter().enumerate() {
        hooks.turn_stopping.push(parse_turn_stopping(i, item)?);
    }
    if let Some(v) = raw.request_error.filter(|v| !v.is_null()) {
        hooks.request_error = Some(parse_request_error(&v)?);
    }
    Ok(hooks)
}

/// `hooks.pre_step[i]`, given the entries before it (a turn and step may have one entry only).
fn parse_pre_step(
    i: usize,
    item: &Value,
    earlier: &[PreStepEntry],
    gates: &mut BTreeSet<String>,
) -> Result<PreStepEntry, ScenarioError> {
    let path = format!("hooks.pre_step[{i}]");
    let e: RawPreStep = typed(&path, item)?;
    if e.turn == 0 || e.step == 0 {
        return Err(invalid(path, "turn and step count from 1"));
    }
    if earlier.iter().any(|p| p.turn == e.turn && p.step == e.step) {
        return Err(invalid(
            path,
            format!("a second entry for turn {} step {}", e.turn, e.step),
        ));
    }
    if e.messages.is_some() && e.decision != RawDecision::Rewrite {
        return Err(invalid(path, "messages belong to a rewrite decision"));
    }
    if e.message.is_some() && e.decision != RawDecision::Fail {
        return Err(invalid(path, "message belongs to a fail decision"));
    }
    let action = match e.decision {
        RawDecision::Enter => PreStepAction::Enter,
        RawDecision::Reject => PreStepAction::Reject,
        RawDecision::Fail => {
            PreStepAction::Fail(e.message.unwrap_or_else(|| "pre_step hook failed".into()))
        }
        RawDecision::Rewrite => {
            let Some(texts) = e.messages else {
                return Err(invalid(path, "a rewrite needs messages (possibly [])"));
            };
            let mut messages = Vec::with_capacity(texts.len());
            for (j, text) in texts.iter().enumerate() {
                let id = message_id(&path, &format!("pre-step-{i}-{j}"))?;
                messages.push(Message::user_text(id, text.clone()));
            }
            PreStepAction::Rewrite(messages)
        }
    };
    let gate = optional_gate(&path, e.gate, gates)?;
    Ok(PreStepEntry {
        turn: e.turn,
        step: e.step,
        action,
        gate,
    })
}

/// A gate a tool or hook waits on: checked, and added to the names an `open` may use.
fn optional_gate(
    path: &str,
    gate: Option<String>,
    gates: &mut BTreeSet<String>,
) -> Result<Option<String>, ScenarioError> {
    let Some(g) = gate else {
        return Ok(None);
    };
    let g = gate_name(&format!("{path}.gate"), &g)?;
    gates.insert(g.clone());
    Ok(Some(g))
}

/// `hooks.turn_stopping[i]`.
fn parse_turn_stopping(i: usize, item: &Value) -> Result<TurnStoppingEntry, ScenarioError> {
    let path = format!("hooks.turn_stopping[{i}]");
    let e: RawTurnStopping = typed(&path, item)?;
    let at_stop = e.at_stop.unwrap_or(1);
    if e.turn == 0 || at_stop == 0 {
        return Err(invalid(path, "turn and at_stop count from 1"));
    }
    let id = format!("turn-stopping-{i}");
    let act = match (e.steer, e.inject, e.cancel) {
        (Some(text), None, None) => TurnStoppingDo::Steer(plugin_message(&path, &id, &text)?),
        (None, Some(text), None) => TurnStoppingDo::Inject(plugin_message(&path, &id, &text)?),
        (None, None, Some(cause)) => {
            TurnStoppingDo::Cancel(parse_cause(&format!("{path}.cancel"), &cause)?)
        }
        _ => {
            return Err(invalid(
                path,
                "needs exactly one of steer, inject and cancel",
            ));
        }
    };
    Ok(TurnStoppingEntry {
        turn: e.turn,
        at_stop,
        act,
    })
}

/// `hooks.request_error`: the default policy with the scenario's budget, backoff and codes.
fn parse_request_error(v: &Value) -> Result<RetryPolicy, ScenarioError> {
    let path = "hooks.request_error";
    let e: RawRequestError = typed(path, v)?;
    let defaults = Backoff::default();
    let policy = RetryPolicy {
        mode: RetryMode::Normal {
            max_retries: e.retries,
            retryable_codes: e
                .retryable_codes
                .unwrap_or_else(|| DEFAULT_RETRYABLE_CODES.map(String::from).to_vec()),
        },
        backoff: Backoff {
            initial_delay_ms: e.initial_delay_ms.unwrap_or(defaults.initial_delay_ms),
            max_delay_ms: e.max_delay_ms.unwrap_or(defaults.max_delay_ms),
            jitter_ratio: e.jitter_ratio.unwrap_or(defaults.jitter_ratio),
        },
    };
    policy
        .validate()
        .map_err(|e| invalid(path, e.to_string()))?;
    Ok(policy)
}

fn parse_actions(v: &Value, gates: &BTreeSet<String>) -> Result<Vec<Action>, ScenarioError> {
    let items: Vec<Value> = typed("actions", v)?;
    let mut sent: BTreeSet<String> = BTreeSet::new();
    let mut actions = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("actions[{i}]");
        let raw: RawAction = typed(&path, item)?;
        check_action_shape(&path, &raw)?;
        let action = parse_action(i, &path, raw, &sent, gates)?;
        match &action {
            Action::Followup(m) | Action::Steer(m) | Action::Inject(m) => {
                sent.insert(m.id.to_string());
            }
            Action::Replace { with, .. } => {
                sent.insert(with.id.to_string());
            }
            _ => {}
        }
        actions.push(action);
    }
    Ok(actions)
}

/// Exactly one verb, and `id` and `with` only beside the verbs they belong to.
fn check_action_shape(path: &str, raw: &RawAction) -> Result<(), ScenarioError> {
    let verbs: Vec<&str> = [
        ("followup", raw.followup.is_some()),
        ("steer", raw.steer.is_some()),
        ("inject", raw.inject.is_some()),
        ("cancel", raw.cancel.is_some()),
        ("remove", raw.remove.is_some()),
        ("replace", raw.replace.is_some()),
        ("open", raw.open.is_some()),
        ("wait_for", raw.wait_for.is_some()),
        ("wait_idle", raw.wait_idle.is_some()),
        ("restart", raw.restart.is_some()),
        ("compact", raw.compact.is_some()),
    ]
    .iter()
    .filter(|(_, present)| *present)
    .map(|(verb, _)| *verb)
    .collect();
    if verbs.len() != 1 {
        return Err(invalid(
            path,
            format!(
                "an action has exactly one verb (followup, steer, inject, cancel, remove, replace, open, wait_for, wait_idle, restart, compact), found {}: [{}]",
                verbs.len(),
                verbs.join(", ")
            ),
        ));
    }
    let takes_id = raw.followup.is_some()
        || raw.steer.is_some()
        || raw.inject.is_some()
        || raw.replace.is_some();
    if raw.id.is_some() && !takes_id {
        return Err(invalid(
            path,
            "id belongs to followup, steer, inject or replace",
        ));
    }
    if raw.with.is_some() != raw.replace.is_some() {
        return Err(invalid(path, "replace and with go together"));
    }
    Ok(())
}

/// `actions[i]`, whose shape `check_action_shape` accepted; `sent` holds the message ids earlier
/// actions sent, `gates` every gate something waits on.
fn parse_action(
    i: usize,
    path: &str,
    raw: RawAction,
    sent: &BTreeSet<String>,
    gates: &BTreeSet<String>,
) -> Result<Action, ScenarioError> {
    let input = |text: String| -> Result<Input, ScenarioError> {
        let id = raw.id.clone().unwrap_or_else(|| format!("action-{i}"));
        Ok(Input {
            id: message_id(&format!("{path}.id"), &id)?,
            text,
        })
    };
    if let Some(t) = raw.followup.clone() {
        return Ok(Action::Followup(input(t)?));
    }
    if let Some(t) = raw.steer.clone() {
        return Ok(Action::Steer(input(t)?));
    }
    if let Some(t) = raw.inject.clone() {
        return Ok(Action::Inject(input(t)?));
    }
    if let Some(c) = &raw.cancel {
        return Ok(Action::Cancel {
            cause: match &c.cause {
                None | Some(Value::Null) => CancelCause::User,
                Some(v) => parse_cause(&format!("{path}.cancel.cause"), v)?,
            },
            keep_inbox: c.keep_inbox.unwrap_or(false),
        });
    }
    if let Some(id) = &raw.remove {
        return Ok(Action::Remove(earlier_message(path, "remove", id, sent)?));
    }
    if let Some(id) = &raw.replace {
        let id = earlier_message(path, "replace", id, sent)?;
        let with = raw.with.clone().unwrap_or_default();
        return Ok(Action::Replace {
            id,
            with: input(with)?,
        });
    }
    if let Some(g) = &raw.open {
        if !gates.contains(g) {
            return Err(invalid(
                path,
                format!(
                    "open {g:?}: no model entry, tool or hook waits on a gate of that name (known: [{}])",
                    gates.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        return Ok(Action::Open(g.clone()));
    }
    if let Some(w) = &raw.wait_for {
        return parse_wait_for(path, w);
    }
    parse_flag_action(path, &raw)
}

/// The id of a message an earlier action sent, for `remove` and `replace`.
fn earlier_message(
    path: &str,
    verb: &str,
    id: &str,
    sent: &BTreeSet<String>,
) -> Result<MessageId, ScenarioError> {
    if !sent.contains(id) {
        return Err(invalid(
            path,
            format!("{verb} {id:?}: no earlier action sent a message with that id"),
        ));
    }
    message_id(path, id)
}

/// `wait_for`: at least one event, of a type the runtime writes.
fn parse_wait_for(path: &str, w: &RawWaitFor) -> Result<Action, ScenarioError> {
    if w.count == 0 {
        return Err(invalid(
            path,
            "wait_for count 0 waits for nothing; use at least 1",
        ));
    }
    if !WRITTEN_EVENT_TYPES.contains(&w.kind.as_str()) {
        return Err(invalid(
            path,
            format!(
                "wait_for {:?}: the runtime writes no such event type",
                w.kind
            ),
        ));
    }
    Ok(Action::WaitFor {
        kind: w.kind.clone(),
        count: w.count,
    })
}

/// `wait_idle: true` or `restart: true`, the verbs that are flags.
fn parse_flag_action(path: &str, raw: &RawAction) -> Result<Action, ScenarioError> {
    match (raw.wait_idle, raw.restart, raw.compact) {
        (Some(true), _, _) => Ok(Action::WaitIdle),
        (Some(false), _, _) => Err(invalid(path, "wait_idle must be true")),
        (None, Some(true), _) => Ok(Action::Restart),
        (None, Some(false), _) => Err(invalid(path, "restart must be true")),
        (None, None, Some(true)) => Ok(Action::Compact),
        (None, None, Some(false)) => Err(invalid(path, "compact must be true")),
        (None, None, None) => unreachable!("check_action_shape counted exactly one verb"),
    }
}

pub(super) fn parse_expect(v: &Value) -> Result<Vec<Expectation>, ScenarioError> {
    let items: Vec<Value> = typed("expect", v)?;
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("expect[{i}]");
        let raw: RawExpectation = typed(&path, item)?;
        if !WRITTEN_EVENT_TYPES.contains(&raw.kind.as_str()) {
            return Err(invalid(
                path,
                format!("the runtime writes no event of type {:?}", raw.kind),
            ));
        }
        let mut fields = Map::new();
        for (key, value) in [
            ("seq", raw.seq),
            ("data", raw.data),
            ("sourceEventSeqs", raw.source_event_seqs),
            ("surfaceOp", raw.surface_op),
        ] {
            if let Some(value) = value {
                fields.insert(key.to_string(), value);
            }
        }
        out.push(Expectation {
            kind: raw.kind,
            fields,
            written: item.clone(),
        });
    }
    Ok(out)
}
