//! `dsh scenario run [--check] FILE...` (SPEC §9): plays scenario files against a real host and prints
//! each resulting log as JSON lines with `time` set to 0; with `--check`, compares each log with its
//! scenario's `expect` and fails naming the first mismatch.
//!
//! Every scenario gets a fresh world: a `Host` over a `MemoryStore`, the `script` provider replaying the
//! scenario's `model`, tools built from `tools` + `tool_behaviour`, and hooks from `hooks`, all sharing
//! one set of `Gates`. Actions run in order, each bounded by the scenario's `action_timeout_ms`, so a
//! scenario that hangs fails with a clear timeout instead of hanging the caller. `wait_for` counts
//! *durable* events (it polls the store without writing), so a `restart` after it keeps everything it
//! saw. The format and the matcher live in `dsh::scenario`; this file only builds worlds and plays them.
//!
//! Output: stdout carries the events only (each log starts again at seq 0), stderr one status line per
//! scenario, so logs can be piped into other tools.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dsh::SessionId;
use dsh::hooks::{
    HookCtx, HookError, Hooks, PreStepDecision, PreStepHook, TurnStoppingAction, TurnStoppingHook,
};
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::script::{Gates, ScriptProvider};
use dsh::llm::types::Message;
use dsh::scenario::{
    Action, PreStepAction, PreStepEntry, Scenario, ScenarioError, ToolBehaviour, ToolMode,
    TurnStoppingDo, TurnStoppingEntry, event_json,
};
use dsh::session::Event;
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh_mcp::{McpServers, ServerEntry, ServerState};
use tokio_util::sync::CancellationToken;

use crate::CliError;
use dsh_actors::{AgentHandle, AgentSpec, DefaultRetry, Host, HostConfig};

/// How often `wait_for` polls the store.
const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// The id of the one agent of every scenario.
const AGENT_ID: &str = "scenario";

/// Runs `dsh scenario run [--check] FILE...`: every file, in order; a failing one does not stop the
/// rest. Returns success when every scenario ran (and, with `check`, matched).
///
/// # Errors
/// `CliError::Failed` naming the first failure (unreadable file, invalid scenario, timeout, mismatch)
/// and how many scenarios failed.
pub async fn run_files(check: bool, files: &[PathBuf]) -> Result<ExitCode, CliError> {
    let mut failures: Vec<String> = Vec::new();
    for file in files {
        match run_file(file, check).await {
            Ok((name, n_events)) => {
                let verdict = if check { "ok" } else { "ran" };
                eprintln!(
                    "scenario {}: {name:?}: {verdict} ({n_events} events)",
                    file.display()
                );
            }
            Err(reason) => {
                eprintln!(
                    "scenario {}: FAILED: {}",
                    file.display(),
                    crate::text::visible(&reason)
                );
                failures.push(format!("{}: {reason}", file.display()));
            }
        }
    }
    match failures.first() {
        None => Ok(ExitCode::SUCCESS),
        Some(first) => Err(CliError::Failed(format!(
            "{} of {} scenarios failed; the first: {}",
            failures.len(),
            files.len(),
            first.lines().next().unwrap_or_default()
        ))),
    }
}

async fn run_file(file: &Path, check: bool) -> Result<(String, usize), String> {
    let scenario = load_file(file).map_err(|e| e.to_string())?;
    let events = run_scenario(&scenario).await.map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    out.write_all(render_log(&events).as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("cannot write the log to stdout: {e}"))?;
    if check {
        scenario.check(&events).map_err(|e| e.to_string())?;
    }
    Ok((scenario.name, events.len()))
}

/// Reads and validates a scenario file.
///
/// # Errors
/// `ScenarioError::Runtime` when the file cannot be read; the parse errors of `Scenario::parse`.
pub fn load_file(path: &Path) -> Result<Scenario, ScenarioError> {
    let text = std::fs::read_to_string(path).map_err(|e| ScenarioError::Runtime {
        scenario: path.display().to_string(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    Scenario::parse(&text)
}

/// The log as `dsh scenario run` prints it: one JSON object per line, `time` set to 0.
pub fn render_log(events: &[Event]) -> String {
    let mut out = String::new();
    for event in events {
        out.push_str(&event_json(event).to_string());
        out.push('\n');
    }
    out
}

/// Plays `scenario` in a fresh world and returns the stored log once the agent is idle.
///
/// # Errors
/// `Runtime` when the world cannot be built or read, `Action` when the runtime refuses an action,
/// `Timeout` when an action (or the final wait for idle) takes longer than `action_timeout_ms`.
pub async fn run_scenario(scenario: &Scenario) -> Result<Vec<Event>, ScenarioError> {
    let mcp = start_mcp_servers(scenario).await?;
    let world = match World::build(scenario, &mcp).await {
        Ok(world) => world,
        Err(e) => {
            mcp.shutdown().await;
            return Err(e);
        }
    };
    let played = world.play(scenario).await;
    let log = match played {
        Ok(()) => world.stored_log(scenario).await,
        Err(e) => Err(e),
    };
    world.host.shutdown().await;
    mcp.shutdown().await;
    log
}

/// Checks and starts the scenario's `mcp_servers`; every one must come up, so a run never depends
/// on a server that happened to be down.
async fn start_mcp_servers(scenario: &Scenario) -> Result<McpServers, ScenarioError> {
    let mut configs = Vec::with_capacity(scenario.mcp_servers.len());
    for (name, entry) in &scenario.mcp_servers {
        let entry: ServerEntry = serde_json::from_value(serde_json::Value::Object(entry.clone()))
            .map_err(|e| ScenarioError::Field {
            path: format!("mcp_servers.{name}"),
            reason: e.to_string(),
        })?;
        let config = entry.check(name).map_err(|e| ScenarioError::Invalid {
            path: format!("mcp_servers.{}", e.key),
            reason: e.reason,
        })?;
        configs.push(config);
    }
    let mcp = McpServers::start(configs).await;
    for status in mcp.statuses() {
        if let ServerState::Down { error } = status.state {
            mcp.shutdown().await;
            return Err(runtime_error(
                scenario,
                format!("the MCP server `{}` did not start: {error}", status.name),
            ));
        }
    }
    Ok(mcp)
}

/// One scenario's world.
struct World {
    host: Host,
    agent: AgentHandle,
    store: Arc<MemoryStore>,
    gates: Gates,
}

fn runtime_error(scenario: &Scenario, reason: impl std::fmt::Display) -> ScenarioError {
    ScenarioError::Runtime {
        scenario: scenario.name.clone(),
        reason: reason.to_string(),
    }
}

impl World {
    async fn build(scenario: &Scenario, mcp: &McpServers) -> Result<World, ScenarioError> {
        let gates = Gates::new();
        let script = ScriptProvider::new(scenario.model.iter().cloned(), gates.clone());
        let mut providers = ProviderRegistry::new();
        providers.register(Arc::new(script));
        let behaviours = Arc::new(scenario.tool_behaviour.clone());
        let mut tools = ToolRegistry::new();
        for spec in &scenario.tools {
            tools.register(Arc::new(ScenarioTool {
                name: spec.name.clone(),
                mode: match spec.mode {
                    ToolMode::Parallel => ExecutionMode::Parallel,
                    ToolMode::Exclusive => ExecutionMode::Exclusive,
                },
                behaviours: Arc::clone(&behaviours),
                gates: gates.clone(),
            }));
        }
        let tools = tools.layered(&mcp.tools());
        let mut hooks = Hooks::new();
        if !scenario.hooks.pre_step.is_empty() {
            hooks.pre_step.push(Arc::new(ScenarioPreStep {
                entries: scenario.hooks.pre_step.clone(),
                gates: gates.clone(),
            }));
        }
        if !scenario.hooks.turn_stopping.is_empty() {
            hooks.turn_stopping.push(Arc::new(ScenarioTurnStopping {
                entries: scenario.hooks.turn_stopping.clone(),
                n_stops: Mutex::new(HashMap::new()),
            }));
        }
        // `request_error: {retries: N}` sets the host's default retry; without it nothing retries.
        let retry = match &scenario.hooks.request_error {
            Some(policy) => DefaultRetry::Policy(policy.clone()),
            None => DefaultRetry::Off,
        };
        let mut config = HostConfig {
            hibernate_after: None,
            ..HostConfig::default()
        };
        if let Some(grace_ms) = scenario.agent.tool_grace_ms {
            config.limits.tool_grace_ms = grace_ms;
        }
        if let Some(timeout_ms) = scenario.agent.tool_timeout_ms {
            config.limits.tool_timeout_ms = timeout_ms;
        }
        let mut agent_config = AgentConfig::new("script", &scenario.agent.model);
        agent_config.max_parallel_tool_calls = scenario.agent.max_parallel_tool_calls;
        agent_config.max_tokens = scenario.agent.max_tokens;
        agent_config.system.clone_from(&scenario.agent.system);
        agent_config.compaction = scenario.agent.compaction.clone();
        agent_config.limits = config.limits.clone();
        let store = Arc::new(MemoryStore::new());
        let host = Host::builder(Arc::clone(&store) as Arc<dyn SessionStore>)
            .providers(providers)
            .tools(tools)
            .hooks(hooks)
            .retry(retry)
            .config(config)
            .start()
            .await
            .map_err(|e| runtime_error(scenario, e))?;
        let id = SessionId::new(AGENT_ID).map_err(|e| runtime_error(scenario, e))?;
        let agent = match host.create(AgentSpec::new(agent_config).with_id(id)).await {
            Ok(agent) => agent,
            Err(e) => {
                host.shutdown().await;
                return Err(runtime_error(scenario, e));
            }
        };
        Ok(World {
            host,
            agent,
            store,
            gates,
        })
    }

    async fn play(&self, scenario: &Scenario) -> Result<(), ScenarioError> {
        let timeout = Duration::from_millis(scenario.action_timeout_ms);
        for (action_idx, action) in scenario.actions.iter().enumerate() {
            let at = format!("actions[{action_idx}] ({action})");
            let refused = |reason: String| ScenarioError::Action {
                scenario: scenario.name.clone(),
                action_idx,
                action: action.to_string(),
                reason,
            };
            let timed_out = |waiting: String| ScenarioError::Timeout {
                scenario: scenario.name.clone(),
                at: at.clone(),
                timeout_ms: scenario.action_timeout_ms,
                waiting,
            };
            let work = self.act(action);
            match tokio::time::timeout(timeout, work).await {
                Ok(Ok(())) => {}
                Ok(Err(reason)) => return Err(refused(reason)),
                Err(_) => return Err(timed_out(self.waiting_for(action).await)),
            }
        }
        match tokio::time::timeout(timeout, self.agent.when_idle()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(runtime_error(scenario, e)),
            Err(_) => Err(ScenarioError::Timeout {
                scenario: scenario.name.clone(),
                at: "the final wait for idle".into(),
                timeout_ms: scenario.action_timeout_ms,
                waiting: "the agent is still running (a gate never opened?)".into(),
            }),
        }
    }

    /// Performs one action; `Err` is the runtime's reason for refusing it.
    async fn act(&self, action: &Action) -> Result<(), String> {
        let e2s = |e: dsh_actors::InputError| e.to_string();
        match action {
            Action::Followup(m) => self.agent.followup(m.message()).await.map_err(e2s),
            Action::Steer(m) => self.agent.steer(m.message()).await.map_err(e2s),
            Action::Inject(m) => self.agent.inject(m.message()).await.map_err(e2s),
            Action::Cancel { cause, keep_inbox } => self
                .agent
                .cancel(cause.clone(), *keep_inbox)
                .await
                .map_err(e2s),
            Action::Remove(id) => self.agent.remove(id.clone()).await.map(drop).map_err(e2s),
            Action::Replace { id, with } => self
                .agent
                .replace(id.clone(), with.message())
                .await
                .map(drop)
                .map_err(e2s),
            Action::Open(gate) => {
                self.gates.open(gate);
                Ok(())
            }
            Action::WaitFor { kind, count } => {
                // First the store must hold the events; then the agent must have been told they are
                // durable, because what it does next depends on that (a tool body starts only after
                // its tool/call is durable). Without the second wait, a cancel right after
                // `wait_for tool/call` could find the call not yet dispatched.
                let seq = loop {
                    if let Some(seq) = self.nth_durable_seq(kind, *count).await? {
                        break seq;
                    }
                    tokio::time::sleep(POLL_INTERVAL).await;
                };
                loop {
                    let status = self.agent.status().await.map_err(e2s)?;
                    if status.durable_seq > seq {
                        return Ok(());
                    }
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
            }
            Action::WaitIdle => self.agent.when_idle().await.map_err(e2s),
            Action::Compact => self.agent.compact().await.map(drop).map_err(e2s),
            Action::Restart => self
                .host
                .restart(self.agent.id())
                .await
                .map(drop)
                .map_err(|e| e.to_string()),
        }
    }

    /// The seq of the `count`-th durable event of `kind`, if the store holds that many.
    async fn nth_durable_seq(&self, kind: &str, count: usize) -> Result<Option<u64>, String> {
        let seqs = self.durable_seqs(kind).await?;
        Ok(seqs.get(count.saturating_sub(1)).copied())
    }

    /// How many durable events of `kind` the store holds (read without repairing anything).
    async fn count_durable(&self, kind: &str) -> Result<usize, String> {
        Ok(self.durable_seqs(kind).await?.len())
    }

    /// The seqs of the durable events of `kind`, in log order (read without repairing anything).
    async fn durable_seqs(&self, kind: &str) -> Result<Vec<u64>, String> {
        let inspection = self
            .store
            .inspect(self.agent.id())
            .await
            .map_err(|e| e.to_string())?;
        Ok(inspection
            .events
            .iter()
            .filter(|e| e.kind() == kind)
            .map(|e| e.seq)
            .collect())
    }

    /// What a timed-out action was still waiting for.
    async fn waiting_for(&self, action: &Action) -> String {
        match action {
            Action::WaitFor { kind, count } => match self.count_durable(kind).await {
                Ok(n) => format!("the log holds {n} of {count} {kind} events"),
                Err(e) => format!("the store cannot be read: {e}"),
            },
            Action::WaitIdle => "the agent is still running (a gate never opened?)".into(),
            _ => "the runtime did not answer".into(),
        }
    }

    async fn stored_log(&self, scenario: &Scenario) -> Result<Vec<Event>, ScenarioError> {
        let inspection = self
            .store
            .inspect(self.agent.id())
            .await
            .map_err(|e| runtime_error(scenario, format!("cannot read the stored log: {e}")))?;
        if !inspection.closers.is_empty() {
            return Err(runtime_error(
                scenario,
                "the stored log ends inside a turn although the agent is idle",
            ));
        }
        Ok(inspection.events)
    }
}

/// A tool whose calls behave as the scenario's `tool_behaviour` says.
struct ScenarioTool {
    name: String,
    mode: ExecutionMode,
    behaviours: Arc<std::collections::BTreeMap<String, ToolBehaviour>>,
    gates: Gates,
}

#[async_trait]
impl Tool for ScenarioTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        "a scenario tool: answers as the scenario's tool_behaviour says"
    }

    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }

    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        self.mode
    }

    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        let Some(b) = self.behaviours.get(&call.call_id) else {
            return ToolOutput::text("ok");
        };
        // An uncooperative tool never sees the cancellation.
        let cancel = if b.ignore_cancel {
            CancellationToken::new()
        } else {
            cancel
        };
        if b.delay_ms > 0 {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(b.delay_ms)) => {}
                () = cancel.cancelled() => return ToolOutput::aborted(None),
            }
        }
        if let Some(gate) = &b.gate {
            tokio::select! {
                () = self.gates.wait(gate) => {}
                () = cancel.cancelled() => return ToolOutput::aborted(None),
            }
        }
        if b.panic {
            // A real unwind the pool must contain, without the panic hook's report on stderr: the
            // panic is scripted, not a bug.
            std::panic::resume_unwind(Box::new(format!(
                "scenario tool {} panics on call {} as scripted",
                self.name, call.call_id
            )));
        }
        let mut out = match &b.error {
            Some((message, info)) => ToolOutput::error(message, info.clone()),
            None => ToolOutput::text(b.result.clone().unwrap_or_else(|| "ok".into())),
        };
        out.additional_contexts.clone_from(&b.additional_contexts);
        out.concludes_turn = b.concludes_turn;
        out
    }
}

/// `hooks.pre_step`: decides the proposed steps its entries name; enters every other batch unchanged.
struct ScenarioPreStep {
    entries: Vec<PreStepEntry>,
    gates: Gates,
}

#[async_trait]
impl PreStepHook for ScenarioPreStep {
    async fn pre_step(
        &self,
        ctx: &HookCtx,
        messages: Vec<Arc<Message>>,
    ) -> Result<PreStepDecision, HookError> {
        let Some(entry) = self
            .entries
            .iter()
            .find(|e| e.turn == ctx.turn && e.step == ctx.step)
        else {
            return Ok(PreStepDecision::Enter(messages));
        };
        if let Some(gate) = &entry.gate {
            tokio::select! {
                () = self.gates.wait(gate) => {}
                // The runtime ends the turn itself; this answer is ignored.
                () = ctx.cancel.cancelled() => return Ok(PreStepDecision::Enter(messages)),
            }
        }
        match &entry.action {
            PreStepAction::Enter => Ok(PreStepDecision::Enter(messages)),
            PreStepAction::Reject => Ok(PreStepDecision::Reject),
            PreStepAction::Rewrite(batch) => Ok(PreStepDecision::Enter(
                batch.iter().cloned().map(Arc::new).collect(),
            )),
            PreStepAction::Fail(message) => Err(HookError::Message(message.clone())),
        }
    }
}

/// `hooks.turn_stopping`: counts how often each turn would stop and acts on the entries for that
/// count.
struct ScenarioTurnStopping {
    entries: Vec<TurnStoppingEntry>,
    /// Turn -> how many times it reached the checkpoint.
    n_stops: Mutex<HashMap<u64, u64>>,
}

#[async_trait]
impl TurnStoppingHook for ScenarioTurnStopping {
    async fn turn_stopping(&self, ctx: &HookCtx) -> Result<TurnStoppingAction, HookError> {
        let at_stop = {
            let mut n = self
                .n_stops
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let count = n.entry(ctx.turn).or_insert(0);
            *count += 1;
            *count
        };
        let mut action = TurnStoppingAction::default();
        for entry in self
            .entries
            .iter()
            .filter(|e| e.turn == ctx.turn && e.at_stop == at_stop)
        {
            match &entry.act {
                TurnStoppingDo::Steer(m) => action.steer.push(m.clone()),
                TurnStoppingDo::Inject(m) => action.inject.push(m.clone()),
                TurnStoppingDo::Cancel(cause) => {
                    if action.cancel.is_none() {
                        action.cancel = Some(cause.clone());
                    }
                }
            }
        }
        Ok(action)
    }
}
