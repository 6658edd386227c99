//! `dsh sim`: hosts N agents against the simulated model, drives each through T turns at once, and
//! reports what a user sizing a deployment needs — turns/s, durable events/s against the store's own
//! ceiling measured in the same run, latency percentiles and memory per hibernated agent.
//!
//! One run, in order:
//! 1. Open a fresh store: `sqlite` in a new directory `<data-dir>/sim-<uuid>` (on the same disk as
//!    the user's real store, so fsync costs are the real ones; never the user's sessions), removed at
//!    the end unless `--keep-store`; or `memory`.
//! 2. Start a host over the `sim` provider (`--latency-ms`, `--tokens-per-sec`, `--reply-tokens`,
//!    `--tool-rate`, `--seed`) with one simulated tool (`--tool-ms`, cooperative with cancellation)
//!    Read the resident set size, then create the agents one after the other (the creation rate is
//!    reported), and subscribe to a sample of them (`--observe-agents`, spread evenly; all of them
//!    in small runs): observing costs an agent a copy of each event and a channel send, which must
//!    not be billed to the runtime at 10,000 agents.
//! 3. Run one driver task per agent (all at once, or each after a seeded delay within `--ramp-ms`,
//!    which spreads arrivals the way real users do): for each of its turns it sends a followup, with `--steer-rate`
//!    probability a steer right behind it (the turn is running by then: a followup is acknowledged
//!    once durable, after the idle agent already started the turn), with `--cancel-rate` probability a
//!    user cancel (pending input discarded), then waits until the agent is idle.
//! 4. Wait until every agent hibernated (`--hibernate-ms`), read the resident set size again: the
//!    difference divided by the agents is `bytes_per_agent` (after glibc's `malloc_trim`, as
//!    `tests/memory.rs` measures; `bytes_per_agent_untrimmed` before it).
//! 5. Measure the store's own ceiling: as many appenders as agents append batches of the run's mean
//!    size and event bytes straight to the same store, with no runtime in between, for
//!    `--ceiling-ms`.
//!
//! What each latency measures (wall time, `Instant`, nothing asserted):
//! - `ack_latency_ms`: a `followup` or `steer` call, from the call to its return (input durable).
//! - `step_latency_ms`: from a step's `step/start` to its `step/end`, each observed once durable, on
//!   the observed agents. It includes model and tool time (none with the default knobs).
//! - `steer_to_claim_ms`: from the `steer` call to the `agent/inbox/claimed` notification of that
//!   message, on the observed agents. A steer waits for the step boundary, so a paced model's
//!   remaining stream time is in it.
//! - `cancel_to_idle_ms`: from the `cancel` call until `when_idle` resolves (stream closed, tools
//!   drained, `turn/end` durable).
//!
//! The live progress line goes to stderr, and only when stderr is a terminal, so `--json` output on
//! stdout is exactly one JSON object.

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dashmap::DashMap;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::sim::{REPLY_TOKENS_MAX, SimConfig, SimProvider, SplitMix64};
use dsh::llm::types::Message;
use dsh::session::event::{CancelCause, EventData, SessionHeader};
use dsh::session::store::memory::MemoryStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh::session::store::{EncodedEvent, SessionStore, StoreError};
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::{AgentConfig, LiveEvent};
use dsh::{MessageId, SessionId};
use futures::{FutureExt, StreamExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::{CliError, Config, SimArgs};
use dsh_actors::{
    AgentHandle, AgentSpec, Host, HostConfig, HostError, InputError, Observation, Observed,
    Subscription,
};

/// The most agents one run hosts. 1,000,000: far above what one machine's memory holds at the
/// targets, low enough that a typo cannot make the process try to allocate the impossible.
pub const AGENTS_MAX: usize = 1_000_000;
/// The most turns per agent. 1,000,000.
pub const TURNS_MAX: usize = 1_000_000;
/// The longest store-ceiling burst. 60 s.
pub const CEILING_MS_MAX: u64 = 60_000;
/// The longest hibernation delay. 1 hour.
pub const HIBERNATE_MS_MAX: u64 = 3_600_000;
/// Items one observed agent's subscription buffers before the observer is told it lagged. 512: an
/// agent publishes ~40 events and notifications per text turn, so this is over ten turns of slack
/// for an observer thread waiting for a core (and more than a short run's whole output, so small
/// runs never lag). Every observed agent's buffer is allocated in full when it is subscribed; that
/// memory is measured and left out of `bytes_per_agent`.
const OBSERVER_BUFFER_MAX: usize = 512;
/// Rounds of pre-encoded events each ceiling appender can append at most.
const CEILING_ROUNDS_MAX: usize = 256;
/// How long the hibernation wait polls at most before it reports what it has.
const HIBERNATE_POLLS_MAX: u32 = 50;
/// The simulated tool's name.
const TOOL_NAME: &str = "wait";

/// Why `dsh sim` failed. Flag errors change nothing (no directory is created).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    #[error("--agents is {agents}, it must be within 1..={agents_max}")]
    Agents { agents: usize, agents_max: usize },
    #[error("--turns is {turns}, it must be within 1..={turns_max}")]
    Turns { turns: usize, turns_max: usize },
    #[error("--{flag} is {value}, it must be within 0..=1")]
    Rate { flag: &'static str, value: f64 },
    #[error("--reply-tokens is {reply_tokens}, it must be within 1..={reply_tokens_max}")]
    ReplyTokens {
        reply_tokens: u64,
        reply_tokens_max: u32,
    },
    #[error("--{flag} is {value_ms} ms, the limit is {value_ms_max} ms")]
    Duration {
        flag: &'static str,
        value_ms: u64,
        value_ms_max: u64,
    },
    #[error("--store is {store:?}; it must be sqlite or memory")]
    Store { store: String },
    #[error("simulated model: {0}")]
    Model(#[from] dsh::llm::sim::SimError),
    #[error("session store: {0}")]
    StoreFailed(#[from] StoreError),
    #[error("host: {0}")]
    Host(#[from] HostError),
    #[error("agent {agent_idx}: {error}")]
    Input { agent_idx: usize, error: InputError },
    #[error("agent {agent}: {reason}")]
    AgentFailed { agent: String, reason: String },
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: String },
    #[error("a simulation task failed: {0}")]
    Task(String),
}

impl From<SimError> for CliError {
    fn from(e: SimError) -> CliError {
        match e {
            SimError::Agents { .. }
            | SimError::Turns { .. }
            | SimError::Rate { .. }
            | SimError::ReplyTokens { .. }
            | SimError::Duration { .. }
            | SimError::Store { .. }
            | SimError::Model(_) => CliError::Usage(e.to_string()),
            e => CliError::Failed(e.to_string()),
        }
    }
}

/// Which store a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreChoice {
    Sqlite,
    Memory,
}

impl StoreChoice {
    fn parse(s: &str) -> Result<StoreChoice, SimError> {
        match s {
            "sqlite" => Ok(StoreChoice::Sqlite),
            "memory" => Ok(StoreChoice::Memory),
            other => Err(SimError::Store {
                store: other.to_string(),
            }),
        }
    }
}

/// The checked flags of one run.
#[derive(Clone, Debug, Serialize)]
pub struct SimPlan {
    pub agents: usize,
    pub turns_per_agent: usize,
    pub store: StoreChoice,
    pub latency_ms: u64,
    pub tokens_per_sec: u64,
    pub reply_tokens: u32,
    pub tool_rate: f64,
    pub tool_ms: u64,
    pub steer_rate: f64,
    pub cancel_rate: f64,
    pub seed: u64,
    pub hibernate_ms: u64,
    pub ceiling_ms: u64,
    pub keep_store: bool,
    /// Agents whose events are observed for the step and steer latencies (at most `agents`).
    pub observe_agents: usize,
    /// Each agent starts after a seeded delay within `0..ramp_ms` (0: all at once).
    pub ramp_ms: u64,
}

impl SimPlan {
    /// Checks every flag before anything is created.
    ///
    /// # Errors
    /// A `SimError` naming the first flag out of range.
    pub fn from_args(args: &SimArgs) -> Result<SimPlan, SimError> {
        if !(1..=AGENTS_MAX).contains(&args.agents) {
            return Err(SimError::Agents {
                agents: args.agents,
                agents_max: AGENTS_MAX,
            });
        }
        if !(1..=TURNS_MAX).contains(&args.turns) {
            return Err(SimError::Turns {
                turns: args.turns,
                turns_max: TURNS_MAX,
            });
        }
        for (flag, value) in [
            ("tool-rate", args.tool_rate),
            ("steer-rate", args.steer_rate),
            ("cancel-rate", args.cancel_rate),
        ] {
            // `contains` is false for NaN, so NaN is refused too.
            if !(0.0..=1.0).contains(&value) {
                return Err(SimError::Rate { flag, value });
            }
        }
        let reply_tokens = u32::try_from(args.reply_tokens)
            .ok()
            .filter(|n| (1..=REPLY_TOKENS_MAX).contains(n))
            .ok_or(SimError::ReplyTokens {
                reply_tokens: args.reply_tokens,
                reply_tokens_max: REPLY_TOKENS_MAX,
            })?;
        for (flag, value_ms, value_ms_max) in [
            ("hibernate-ms", args.hibernate_ms, HIBERNATE_MS_MAX),
            ("ceiling-ms", args.ceiling_ms, CEILING_MS_MAX),
            ("latency-ms", args.latency_ms, HIBERNATE_MS_MAX),
            ("tool-ms", args.tool_ms, HIBERNATE_MS_MAX),
            ("ramp-ms", args.ramp_ms, HIBERNATE_MS_MAX),
        ] {
            if value_ms > value_ms_max {
                return Err(SimError::Duration {
                    flag,
                    value_ms,
                    value_ms_max,
                });
            }
        }
        Ok(SimPlan {
            agents: args.agents,
            turns_per_agent: args.turns,
            store: StoreChoice::parse(&args.store)?,
            latency_ms: args.latency_ms,
            tokens_per_sec: args.tokens_per_sec,
            reply_tokens,
            tool_rate: args.tool_rate,
            tool_ms: args.tool_ms,
            steer_rate: args.steer_rate,
            cancel_rate: args.cancel_rate,
            seed: args.seed,
            hibernate_ms: args.hibernate_ms,
            ceiling_ms: args.ceiling_ms,
            keep_store: args.keep_store,
            observe_agents: args.observe_agents.min(args.agents),
            ramp_ms: args.ramp_ms,
        })
    }

    fn model(&self) -> SimConfig {
        SimConfig {
            seed: self.seed,
            ttft_ms: self.latency_ms,
            tokens_per_sec: self.tokens_per_sec,
            reply_tokens_min: self.reply_tokens,
            reply_tokens_max: self.reply_tokens,
            tool_call_probability: self.tool_rate,
            ..SimConfig::instant(self.seed)
        }
    }
}

/// p50, p99 and max of one latency, in milliseconds; `null` when nothing was measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
    /// How many samples were taken.
    pub n: u64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `samples_ns` (sorted in place).
    pub fn of(samples_ns: &mut [u64]) -> Percentiles {
        samples_ns.sort_unstable();
        let n = samples_ns.len();
        let rank = |p: f64| -> Option<f64> {
            if n == 0 {
                return None;
            }
            let idx = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
            Some(ms(samples_ns[idx]))
        };
        Percentiles {
            p50: rank(0.50),
            p99: rank(0.99),
            max: rank(1.0),
            n: n as u64,
        }
    }
}

fn ms(ns: u64) -> f64 {
    // Microsecond resolution is all a report needs.
    (ns / 1_000) as f64 / 1_000.0
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The store's own group-commit ceiling, measured in the same run.
#[derive(Clone, Debug, Serialize)]
pub struct CeilingReport {
    pub events_per_sec: f64,
    pub appenders: usize,
    pub events: u64,
    /// Events per append (the run's mean, rounded, at least 1).
    pub batch_events: usize,
    /// Bytes of one event's JSON (the run's mean).
    pub event_bytes: usize,
    pub duration_ms: f64,
}

/// Everything `dsh sim` reports. `--json` prints it as one object (SPEC §10 names the required keys).
#[derive(Clone, Debug, Serialize)]
pub struct SimReport {
    pub agents: usize,
    /// Turns that ended, over all agents (`host.metrics()`).
    pub turns: u64,
    pub turns_per_agent: usize,
    /// From the first input sent to the last agent idle.
    pub duration_ms: f64,
    pub turns_per_sec: f64,
    /// Events acknowledged durable by the store during the run.
    pub events: u64,
    pub events_per_sec: f64,
    pub store: StoreChoice,
    /// Where the sqlite store is, when `--keep-store` kept it.
    pub store_dir: Option<PathBuf>,
    pub store_ceiling: Option<CeilingReport>,
    /// Appends the runtime made during the run (each one batch of one agent's events).
    pub store_appends: u64,
    /// Commit groups (one fsync each) the sqlite store made during the run.
    pub store_groups: Option<u64>,
    /// `events_per_sec` / `store_ceiling.events_per_sec`.
    pub store_ceiling_ratio: Option<f64>,
    pub agents_created_per_sec: f64,
    /// `VmHWM` once the agents hibernated: the most resident memory the process had during the run
    /// (before the store-ceiling burst).
    pub peak_rss_bytes: Option<u64>,
    /// `VmRSS` before the agents were created.
    pub rss_before_bytes: Option<u64>,
    /// `VmRSS` after the agents hibernated, once the allocator returned its free memory (glibc
    /// `malloc_trim`): what the agents hold, not what the run's transient logs left behind.
    pub rss_hibernated_bytes: Option<u64>,
    /// (`rss_hibernated_bytes` - `rss_before_bytes` - `observer_bytes`) / `agents`.
    pub bytes_per_agent: Option<u64>,
    /// The same before the allocator returned its free memory: what a process that just ran this
    /// load actually keeps resident.
    pub bytes_per_agent_untrimmed: Option<u64>,
    /// `VmRSS` growth while the observed agents were subscribed (their subscription buffers).
    pub observer_bytes: u64,
    pub hibernated_agents: usize,
    pub step_latency_ms: Percentiles,
    pub ack_latency_ms: Percentiles,
    pub steer_to_claim_ms: Percentiles,
    pub cancel_to_idle_ms: Percentiles,
    pub followups: u64,
    pub steers: u64,
    /// Steers of the observed agents claimed at a step boundary.
    pub steers_claimed: u64,
    /// Steers of the observed agents a cancel discarded before a step boundary claimed them.
    pub steers_discarded: u64,
    pub cancels: u64,
    /// Turns of the observed agents whose first claimed message was a followup, or a steer (a
    /// steer that arrived after the turn it chased had ended starts a turn of its own).
    pub turns_started_by_followup: u64,
    pub turns_started_by_steer: u64,
    /// `turn/end` reasons of the observed agents, by kind.
    pub turn_ends: BTreeMap<String, u64>,
    /// How many agents were observed (step, steer and turn-end figures come from them).
    pub observed_agents: usize,
    /// Observations the host-wide observer missed (its samples are then incomplete).
    pub observer_lagged: u64,
    pub config: SimPlan,
}

impl SimReport {
    /// The human-readable report.
    ///
    /// # Errors
    /// When `out` cannot be written.
    pub fn render(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let c = &self.config;
        writeln!(
            out,
            "dsh sim: {} agents x {} turns, store {}, model: first token {} ms, {} tokens/s, {} tokens/reply, tool rate {}, tool {} ms; steer rate {}, cancel rate {}, seed {}",
            self.agents,
            c.turns_per_agent,
            store_name(c.store),
            c.latency_ms,
            if c.tokens_per_sec == 0 {
                "unpaced".to_string()
            } else {
                c.tokens_per_sec.to_string()
            },
            c.reply_tokens,
            c.tool_rate,
            c.tool_ms,
            c.steer_rate,
            c.cancel_rate,
            c.seed,
        )?;
        writeln!(
            out,
            "  turns           {:>10} in {:.3} s   {:>12.0} turns/s",
            self.turns,
            self.duration_ms / 1000.0,
            self.turns_per_sec
        )?;
        write!(
            out,
            "  durable events  {:>10}              {:>12.0} events/s",
            self.events, self.events_per_sec
        )?;
        match (&self.store_ceiling, self.store_ceiling_ratio) {
            (Some(ceiling), Some(ratio)) => writeln!(
                out,
                "   ({:.0} % of the store's ceiling, {:.0} events/s with {} appenders)",
                ratio * 100.0,
                ceiling.events_per_sec,
                ceiling.appenders
            )?,
            _ => writeln!(out)?,
        }
        writeln!(
            out,
            "  store appends   {:>10}{}",
            self.store_appends,
            self.store_groups.map_or_else(String::new, |g| format!(
                " in {g} commit groups ({:.1} appends/group)",
                self.store_appends as f64 / g.max(1) as f64
            ))
        )?;
        writeln!(
            out,
            "  agents created  {:>10.0} /s",
            self.agents_created_per_sec
        )?;
        writeln!(
            out,
            "  latency (ms)              p50        p99        max          n"
        )?;
        for (name, p) in [
            ("step", &self.step_latency_ms),
            ("input ack", &self.ack_latency_ms),
            ("steer -> claim", &self.steer_to_claim_ms),
            ("cancel -> idle", &self.cancel_to_idle_ms),
        ] {
            let cell = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
            writeln!(
                out,
                "    {name:<16} {:>10} {:>10} {:>10} {:>10}",
                cell(p.p50),
                cell(p.p99),
                cell(p.max),
                p.n
            )?;
        }
        let mib = |b: Option<u64>| {
            b.map_or_else(
                || "unknown".to_string(),
                |b| format!("{:.1} MiB", b as f64 / (1 << 20) as f64),
            )
        };
        let bytes =
            |b: Option<u64>| b.map_or_else(|| "unknown".to_string(), |b| format!("{b} bytes"));
        writeln!(
            out,
            "  memory: peak RSS {}; {} per hibernated agent, {} before the allocator returned free memory ({} of {} hibernated)",
            mib(self.peak_rss_bytes),
            bytes(self.bytes_per_agent),
            bytes(self.bytes_per_agent_untrimmed),
            self.hibernated_agents,
            self.agents
        )?;
        writeln!(
            out,
            "  inputs: {} followups, {} steers ({} claimed, {} discarded by a cancel), {} cancels",
            self.followups, self.steers, self.steers_claimed, self.steers_discarded, self.cancels
        )?;
        let ends: Vec<String> = self
            .turn_ends
            .iter()
            .map(|(k, v)| format!("{v} {k}"))
            .collect();
        writeln!(
            out,
            "  turn ends ({} observed agents): {}",
            self.observed_agents,
            ends.join(", ")
        )?;
        if self.observer_lagged > 0 {
            writeln!(
                out,
                "  note: the observer missed {} notifications; step and steer samples are incomplete",
                self.observer_lagged
            )?;
        }
        if let Some(dir) = &self.store_dir {
            writeln!(out, "  store kept in {}", dir.display())?;
        }
        Ok(())
    }
}

fn store_name(store: StoreChoice) -> &'static str {
    match store {
        StoreChoice::Sqlite => "sqlite",
        StoreChoice::Memory => "memory",
    }
}

/// Runs `dsh sim` and writes the report (or `--json` object) to `out`.
///
/// # Errors
/// `CliError::Usage` for a flag out of range (nothing created), `CliError::Failed` when the store,
/// the host or an agent failed, or the report cannot be written (`OutputClosed` for a closed pipe).
pub async fn run(
    args: &SimArgs,
    config: &Config,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, CliError> {
    let plan = SimPlan::from_args(args)?;
    let progress = Progress::start(std::io::stderr().is_terminal());
    let report = simulate(&plan, &config.data_dir, &progress).await;
    progress.finish().await;
    let report = report?;
    let written = if args.json {
        serde_json::to_writer(&mut *out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        report.render(out)
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| CliError::output("cannot write the report", e))?;
    Ok(ExitCode::SUCCESS)
}

/// The store of one run, kept concretely for its counters.
enum SimStore {
    Sqlite(Arc<SqliteStore>),
    Memory(Arc<MemoryStore>),
}

impl SimStore {
    fn shared(&self) -> Arc<dyn SessionStore> {
        match self {
            SimStore::Sqlite(s) => Arc::clone(s) as Arc<dyn SessionStore>,
            SimStore::Memory(s) => Arc::clone(s) as Arc<dyn SessionStore>,
        }
    }

    /// Commit groups (fsyncs) so far; `None` for the memory store, which has none.
    fn n_groups(&self) -> Option<u64> {
        match self {
            SimStore::Sqlite(s) => Some(s.stats().n_groups),
            SimStore::Memory(_) => None,
        }
    }

    /// Append requests the store committed so far.
    fn n_appends(&self) -> u64 {
        match self {
            SimStore::Sqlite(s) => s.stats().n_requests_committed,
            SimStore::Memory(s) => s.n_appends(),
        }
    }
}

/// A directory made for one run; removed on drop unless kept.
struct RunDir {
    path: PathBuf,
    keep: bool,
}

impl RunDir {
    fn create(data_dir: &Path, keep: bool) -> Result<RunDir, SimError> {
        let io = |path: &Path, e: std::io::Error| SimError::Io {
            path: path.to_path_buf(),
            cause: e.to_string(),
        };
        std::fs::create_dir_all(data_dir).map_err(|e| io(data_dir, e))?;
        let path = data_dir.join(format!("sim-{}", uuid::Uuid::new_v4().simple()));
        // `create_dir` (not `_all`) fails if the name exists: a run never reuses a directory.
        std::fs::create_dir(&path).map_err(|e| io(&path, e))?;
        Ok(RunDir { path, keep })
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep {
            // Best effort: a leftover directory is named sim-* and holds only simulated sessions.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The simulated tool: waits `--tool-ms` (or until cancelled) and answers.
struct WaitTool {
    duration: Duration,
}

#[async_trait::async_trait]
impl Tool for WaitTool {
    fn name(&self) -> &str {
        TOOL_NAME
    }

    fn description(&self) -> &str {
        "Waits a moment, as a tool that does real work would."
    }

    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "properties": {"note": {"type": "string", "maxLength": 16}},
            "required": ["note"]
        })
    }

    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Parallel
    }

    async fn execute(&self, _call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        if !self.duration.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(self.duration) => {}
                () = cancel.cancelled() => return ToolOutput::error("cancelled", None),
            }
        }
        ToolOutput::text("done")
    }
}

/// SplitMix64, seeded per agent so that which turns get a steer or a cancel depends only on
/// `--seed` and the agent's index.
fn agent_rng(seed: u64, agent_idx: usize) -> SplitMix64 {
    SplitMix64::new(seed ^ (agent_idx as u64).wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// What one driver measured.
#[derive(Default)]
struct DriverTally {
    ack_ns: Vec<u64>,
    cancel_to_idle_ns: Vec<u64>,
    followups: u64,
    steers: u64,
    cancels: u64,
}

/// Steers sent and not yet claimed or discarded: message id → when `steer` was called.
type SteersInFlight = Arc<DashMap<MessageId, Instant>>;

async fn drive(
    agent: AgentHandle,
    agent_idx: usize,
    plan: Arc<SimPlan>,
    steers: Option<SteersInFlight>,
    progress: Arc<Counters>,
) -> Result<DriverTally, SimError> {
    let fail = |error| SimError::Input { agent_idx, error };
    let mut rng = agent_rng(plan.seed, agent_idx);
    let mut tally = DriverTally {
        ack_ns: Vec::with_capacity(plan.turns_per_agent),
        ..DriverTally::default()
    };
    if plan.ramp_ms > 0 {
        let delay_ms = rng.next_u64() % plan.ramp_ms;
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    }
    for turn_idx in 0..plan.turns_per_agent {
        let prompt = Message::user_text(
            MessageId::mint(),
            format!("Turn {}: tell me how the log stays durable.", turn_idx + 1),
        );
        let started = Instant::now();
        agent.followup(prompt).await.map_err(fail)?;
        tally.ack_ns.push(ns(started.elapsed()));
        tally.followups += 1;
        if rng.chance(plan.steer_rate) {
            let id = MessageId::mint();
            let steer = Message::user_text(id.clone(), "Also mention group commit.");
            let started = Instant::now();
            if let Some(steers) = &steers {
                steers.insert(id, started);
            }
            agent.steer(steer).await.map_err(fail)?;
            tally.ack_ns.push(ns(started.elapsed()));
            tally.steers += 1;
        }
        if rng.chance(plan.cancel_rate) {
            let started = Instant::now();
            agent.cancel(CancelCause::User, false).await.map_err(fail)?;
            agent.when_idle().await.map_err(fail)?;
            tally.cancel_to_idle_ns.push(ns(started.elapsed()));
            tally.cancels += 1;
        }
        agent.when_idle().await.map_err(fail)?;
        progress.turns_driven.fetch_add(1, Ordering::Relaxed);
    }
    Ok(tally)
}

/// What the host-wide observer saw.
#[derive(Default)]
struct ObserverTally {
    step_ns: Vec<u64>,
    steer_to_claim_ns: Vec<u64>,
    steers_claimed: u64,
    steers_discarded: u64,
    turns_started_by_followup: u64,
    turns_started_by_steer: u64,
    turn_ends: BTreeMap<String, u64>,
    lagged: u64,
    failures: Vec<(String, String)>,
}

struct Observer {
    tally: ObserverTally,
    steers: SteersInFlight,
    /// Per agent: when its open step's `step/start` was observed.
    step_started: HashMap<SessionId, Instant>,
    /// Per agent: the turn of its last observed claim, and whether only steers were claimed in it
    /// so far. A followup is only ever claimed at its turn's first step, so a turn that claims one
    /// was started by it, even when a steer's claim in the same step was observed first.
    last_claim: HashMap<SessionId, (u64, bool)>,
}

impl Observer {
    fn observe(&mut self, item: Observation) {
        let now = Instant::now();
        match item {
            Observation::Lagged(n) => self.tally.lagged += n,
            Observation::Item(Observed::Event { agent, event }) => match &event.data {
                EventData::StepStart(_) => {
                    self.step_started.insert(agent, now);
                }
                EventData::StepEnd(_) => {
                    if let Some(started) = self.step_started.remove(&agent) {
                        self.tally.step_ns.push(ns(now - started));
                    }
                }
                EventData::TurnEnd(end) => {
                    *self
                        .tally
                        .turn_ends
                        .entry(end.reason.kind().to_string())
                        .or_default() += 1;
                }
                _ => {}
            },
            Observation::Item(Observed::Live { agent, event }) => match event {
                LiveEvent::InboxClaimed { message, turn } => {
                    let steer = self.steers.remove(&message.id);
                    if let Some((_, sent)) = &steer {
                        self.tally.steers_claimed += 1;
                        self.tally.steer_to_claim_ns.push(ns(now - *sent));
                    }
                    let is_steer = steer.is_some();
                    match self.last_claim.get_mut(&agent) {
                        Some((last_turn, only_steers)) if *last_turn == turn => {
                            if *only_steers && !is_steer {
                                *only_steers = false;
                                self.tally.turns_started_by_steer -= 1;
                                self.tally.turns_started_by_followup += 1;
                            }
                        }
                        _ => {
                            self.last_claim.insert(agent, (turn, is_steer));
                            if is_steer {
                                self.tally.turns_started_by_steer += 1;
                            } else {
                                self.tally.turns_started_by_followup += 1;
                            }
                        }
                    }
                }
                LiveEvent::InboxDiscarded(message) if self.steers.remove(&message.id).is_some() => {
                    self.tally.steers_discarded += 1;
                }
                _ => {}
            },
            Observation::Item(Observed::Failed { agent, reason }) => {
                self.tally.failures.push((agent.to_string(), reason));
            }
            Observation::Item(Observed::Restarted { .. }) => {}
        }
    }
}

/// Runs the observer on a thread of its own: as one task among 20,000 agents and drivers it would
/// be polled too rarely to keep up, and lag (losing samples) instead of measuring. It stops once
/// `stop` fires and everything already buffered is read.
fn spawn_observer(
    subscriptions: Vec<Subscription>,
    steers: SteersInFlight,
    stop: CancellationToken,
) -> Result<std::thread::JoinHandle<ObserverTally>, SimError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SimError::Task(format!("observer runtime: {e}")))?;
    let streams = subscriptions.into_iter().map(|sub| {
        Box::pin(futures::stream::unfold(sub, |mut sub| async move {
            sub.next().await.map(|item| (item, sub))
        }))
    });
    let mut items = futures::stream::select_all(streams);
    std::thread::Builder::new()
        .name("dsh-sim-observer".into())
        .spawn(move || {
            runtime.block_on(async move {
                let mut observer = Observer {
                    tally: ObserverTally::default(),
                    steers,
                    step_started: HashMap::new(),
                    last_claim: HashMap::new(),
                };
                loop {
                    tokio::select! {
                        biased;
                        item = items.next() => match item {
                            Some(item) => observer.observe(item),
                            None => break,
                        },
                        () = stop.cancelled() => {
                            // Everything published before the stop is buffered: drain it.
                            while let Some(Some(item)) = items.next().now_or_never() {
                                observer.observe(item);
                            }
                            break;
                        }
                    }
                }
                observer.tally
            })
        })
        .map_err(|e| SimError::Task(format!("observer thread: {e}")))
}

/// Counters the progress line reads.
#[derive(Default)]
struct Counters {
    turns_driven: AtomicU64,
    turns_total: AtomicU64,
    agents_created: AtomicU64,
    agents_total: AtomicU64,
}

/// The live progress line on stderr.
struct Progress {
    counters: Arc<Counters>,
    phase: Arc<Mutex<&'static str>>,
    metrics_events: Arc<AtomicU64>,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Progress {
    fn start(draw: bool) -> Progress {
        let counters = Arc::new(Counters::default());
        let phase = Arc::new(Mutex::new("starting"));
        let metrics_events = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let task = draw.then(|| {
            let counters = Arc::clone(&counters);
            let phase = Arc::clone(&phase);
            let events = Arc::clone(&metrics_events);
            let stop = stop.clone();
            tokio::spawn(async move {
                let started = Instant::now();
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                loop {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    let phase = *phase
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let line = progress_line(
                        phase,
                        &counters,
                        events.load(Ordering::Relaxed),
                        started.elapsed(),
                    );
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "\r\x1b[2K{line}");
                    let _ = err.flush();
                }
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "\r\x1b[2K");
                let _ = err.flush();
            })
        });
        Progress {
            counters,
            phase,
            metrics_events,
            stop,
            task: Mutex::new(task),
        }
    }

    fn phase(&self, phase: &'static str) {
        *self
            .phase
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = phase;
    }

    async fn finish(&self) {
        self.stop.cancel();
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

fn progress_line(phase: &str, c: &Counters, events: u64, elapsed: Duration) -> String {
    const WIDTH: usize = 30;
    let (done, total) = match phase {
        "creating agents" => (
            c.agents_created.load(Ordering::Relaxed),
            c.agents_total.load(Ordering::Relaxed),
        ),
        _ => (
            c.turns_driven.load(Ordering::Relaxed),
            c.turns_total.load(Ordering::Relaxed),
        ),
    };
    let filled = if total == 0 {
        0
    } else {
        (done.min(total) as usize * WIDTH) / total as usize
    };
    format!(
        "[{}{}] {done}/{total} {phase}  {events} durable events  {:.1} s",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        elapsed.as_secs_f64()
    )
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    fn malloc_trim(pad: usize) -> std::os::raw::c_int;
}

/// Returns the allocator's free memory to the OS (glibc), so that RSS shows live memory. The same
/// measure as `tests/memory.rs`.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` has no preconditions: it only releases free memory of the allocator's
    // arenas to the OS, takes the arena locks itself, and may be called from any thread at any time.
    unsafe {
        malloc_trim(0);
    }
}

/// Reads `VmRSS` and `VmHWM` (bytes) from `/proc/self/status`; `None` where there is no procfs.
fn memory_status() -> (Option<u64>, Option<u64>) {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return (None, None);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().strip_suffix("kB"))
            .and_then(|kb| kb.trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn per_sec(n: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

/// Runs the whole simulation of `plan`, with the sqlite store under `data_dir`.
///
/// # Errors
/// `SimError` when the store cannot be opened, the host or an agent fails, or a task panics.
async fn simulate(
    plan: &SimPlan,
    data_dir: &Path,
    progress: &Progress,
) -> Result<SimReport, SimError> {
    let plan = Arc::new(plan.clone());
    let run_dir = match plan.store {
        StoreChoice::Sqlite => Some(RunDir::create(data_dir, plan.keep_store)?),
        StoreChoice::Memory => None,
    };
    let store = match &run_dir {
        Some(dir) => SimStore::Sqlite(Arc::new(SqliteStore::open(
            &dir.path,
            SqliteConfig::default(),
        )?)),
        None => SimStore::Memory(Arc::new(MemoryStore::new())),
    };
    let result = simulate_on(&plan, &store, progress).await;
    if let SimStore::Sqlite(s) = &store {
        s.close().await?;
    }
    let mut report = result?;
    report.store_dir = run_dir.as_ref().filter(|d| d.keep).map(|d| d.path.clone());
    Ok(report)
}

async fn simulate_on(
    plan: &Arc<SimPlan>,
    store: &SimStore,
    progress: &Progress,
) -> Result<SimReport, SimError> {
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(SimProvider::new(plan.model())?));
    let mut tools = ToolRegistry::new();
    if plan.tool_rate > 0.0 {
        tools.register(Arc::new(WaitTool {
            duration: Duration::from_millis(plan.tool_ms),
        }));
    }
    let mut limits = dsh::limits::Limits::DEFAULT;
    limits.subscriber_buffer_max = OBSERVER_BUFFER_MAX;
    let host = Host::builder(store.shared())
        .providers(providers)
        .tools(tools)
        .config(HostConfig {
            limits,
            hibernate_after: Some(Duration::from_millis(plan.hibernate_ms)),
            ..HostConfig::default()
        })
        .start()
        .await?;
    let result = run_agents(plan, store, &host, progress).await;
    progress.phase("shutting down");
    host.shutdown().await;
    result
}

async fn run_agents(
    plan: &Arc<SimPlan>,
    store: &SimStore,
    host: &Host,
    progress: &Progress,
) -> Result<SimReport, SimError> {
    let counters = Arc::clone(&progress.counters);
    counters
        .agents_total
        .store(plan.agents as u64, Ordering::Relaxed);
    counters.turns_total.store(
        (plan.agents as u64).saturating_mul(plan.turns_per_agent as u64),
        Ordering::Relaxed,
    );

    let steers: SteersInFlight = Arc::new(DashMap::new());
    trim_heap();
    let (rss_before_bytes, _) = memory_status();
    progress.phase("creating agents");
    let created_at = Instant::now();
    let mut agents = Vec::with_capacity(plan.agents);
    let mut config = AgentConfig::new("sim", "sim-1");
    config.system = Some("You are a simulated agent under load.".to_string());
    for agent_idx in 0..plan.agents {
        let id = SessionId::new(&format!("sim-{agent_idx:07}"))
            .map_err(|e| SimError::Task(format!("agent id: {e}")))?;
        agents.push(
            host.create(AgentSpec::new(config.clone()).with_id(id))
                .await?,
        );
        counters.agents_created.fetch_add(1, Ordering::Relaxed);
    }
    let agents_created_per_sec = per_sec(plan.agents as u64, created_at.elapsed());

    // Only a sample of agents is observed: observing costs each observed agent a copy of every
    // event and a channel send, which would otherwise be measured as the runtime's own cost.
    let observed: Vec<bool> = {
        let mut observed = vec![false; plan.agents];
        for k in 0..plan.observe_agents {
            observed[k * plan.agents / plan.observe_agents] = true;
        }
        observed
    };
    let (rss_unobserved_bytes, _) = memory_status();
    let subscriptions: Vec<Subscription> = agents
        .iter()
        .zip(&observed)
        .filter(|(_, observed)| **observed)
        .map(|(agent, _)| agent.subscribe())
        .collect();
    let (rss_observed_bytes, _) = memory_status();
    let observer_bytes = match (rss_unobserved_bytes, rss_observed_bytes) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => 0,
    };
    let stop_observing = CancellationToken::new();
    let observer = spawn_observer(subscriptions, Arc::clone(&steers), stop_observing.clone())?;

    progress.phase("turns");
    let appends_before = store.n_appends();
    let groups_before = store.n_groups();
    let turns_before = host.metrics().turns();
    let events_before = host.metrics().events();
    let metrics_mirror = Arc::clone(&progress.metrics_events);
    let mirror_stop = CancellationToken::new();
    let mirror = {
        let host = host.clone();
        let stop = mirror_stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            while !stop.is_cancelled() {
                tokio::select! {
                    () = stop.cancelled() => {}
                    _ = tick.tick() => metrics_mirror.store(host.metrics().events(), Ordering::Relaxed),
                }
            }
        })
    };
    let started = Instant::now();
    let drivers: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(agent_idx, agent)| {
            tokio::spawn(drive(
                agent.clone(),
                agent_idx,
                Arc::clone(plan),
                observed[agent_idx].then(|| Arc::clone(&steers)),
                Arc::clone(&counters),
            ))
        })
        .collect();
    let mut tallies = Vec::with_capacity(drivers.len());
    let mut first_error = None;
    for driver in drivers {
        match driver.await {
            Ok(Ok(tally)) => tallies.push(tally),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(SimError::Task(e.to_string()));
            }
        }
    }
    let elapsed = started.elapsed();
    mirror_stop.cancel();
    let _ = mirror.await;
    let turns = host.metrics().turns() - turns_before;
    let events = host.metrics().events() - events_before;
    let appends = store.n_appends().saturating_sub(appends_before);
    let store_groups = store
        .n_groups()
        .zip(groups_before)
        .map(|(after, before)| after.saturating_sub(before));
    stop_observing.cancel();
    let observed = tokio::task::spawn_blocking(move || observer.join())
        .await
        .map_err(|e| SimError::Task(e.to_string()))?
        .map_err(|_| SimError::Task("the observer thread panicked".into()))?;
    if let Some((agent, reason)) = observed.failures.first() {
        return Err(SimError::AgentFailed {
            agent: agent.clone(),
            reason: reason.clone(),
        });
    }
    if let Some(e) = first_error {
        return Err(e);
    }

    progress.phase("hibernating");
    let hibernated_agents = wait_hibernated(&agents, plan.hibernate_ms).await?;
    // The run's peak, before the ceiling burst adds its own sessions (all in RAM for `memory`).
    let (rss_untrimmed_bytes, peak_rss_bytes) = memory_status();
    trim_heap();
    let (rss_hibernated_bytes, _) = memory_status();
    let per_agent = |after: Option<u64>| match (rss_before_bytes, after) {
        (Some(before), Some(after)) => {
            Some(after.saturating_sub(before).saturating_sub(observer_bytes) / plan.agents as u64)
        }
        _ => None,
    };
    let bytes_per_agent = per_agent(rss_hibernated_bytes);
    let bytes_per_agent_untrimmed = per_agent(rss_untrimmed_bytes);

    let store_ceiling = if plan.ceiling_ms == 0 {
        None
    } else {
        progress.phase("measuring the store ceiling");
        let event_bytes = mean_event_bytes(&store.shared(), agents[0].id()).await?;
        let batch_events = (events as f64 / appends.max(1) as f64).round().max(1.0) as usize;
        Some(
            store_ceiling(
                &store.shared(),
                plan.agents,
                batch_events,
                event_bytes,
                Duration::from_millis(plan.ceiling_ms),
            )
            .await?,
        )
    };

    let mut ack_ns = Vec::new();
    let mut cancel_to_idle_ns = Vec::new();
    let (mut followups, mut steers_sent, mut cancels) = (0, 0, 0);
    for t in tallies {
        ack_ns.extend(t.ack_ns);
        cancel_to_idle_ns.extend(t.cancel_to_idle_ns);
        followups += t.followups;
        steers_sent += t.steers;
        cancels += t.cancels;
    }
    let mut observed = observed;
    let events_per_sec = per_sec(events, elapsed);
    Ok(SimReport {
        agents: plan.agents,
        turns,
        turns_per_agent: plan.turns_per_agent,
        duration_ms: elapsed.as_secs_f64() * 1000.0,
        turns_per_sec: per_sec(turns, elapsed),
        events,
        events_per_sec,
        store: plan.store,
        store_dir: None,
        store_appends: appends,
        store_groups,
        store_ceiling_ratio: store_ceiling
            .as_ref()
            .filter(|c| c.events_per_sec > 0.0)
            .map(|c| events_per_sec / c.events_per_sec),
        store_ceiling,
        agents_created_per_sec,
        peak_rss_bytes,
        rss_before_bytes,
        rss_hibernated_bytes,
        bytes_per_agent,
        bytes_per_agent_untrimmed,
        observer_bytes,
        hibernated_agents,
        step_latency_ms: Percentiles::of(&mut observed.step_ns),
        ack_latency_ms: Percentiles::of(&mut ack_ns),
        steer_to_claim_ms: Percentiles::of(&mut observed.steer_to_claim_ns),
        cancel_to_idle_ms: Percentiles::of(&mut cancel_to_idle_ns),
        followups,
        steers: steers_sent,
        steers_claimed: observed.steers_claimed,
        steers_discarded: observed.steers_discarded,
        cancels,
        turns_started_by_followup: observed.turns_started_by_followup,
        turns_started_by_steer: observed.turns_started_by_steer,
        turn_ends: observed.turn_ends,
        observed_agents: plan.observe_agents,
        observer_lagged: observed.lagged,
        config: (**plan).clone(),
    })
}

/// Waits until every agent reports `hibernated`. A `status` call counts as activity and restarts an
/// agent's idle clock, so each poll waits two hibernation delays after the previous one. Returns how
/// many hibernated.
async fn wait_hibernated(agents: &[AgentHandle], hibernate_ms: u64) -> Result<usize, SimError> {
    let pause = Duration::from_millis(hibernate_ms.saturating_mul(2).saturating_add(20));
    let mut awake: Vec<usize> = (0..agents.len()).collect();
    for _ in 0..HIBERNATE_POLLS_MAX {
        if awake.is_empty() {
            break;
        }
        tokio::time::sleep(pause).await;
        let statuses =
            futures::future::join_all(awake.iter().map(|&idx| agents[idx].status())).await;
        let mut still = Vec::new();
        for (idx, status) in awake.iter().zip(statuses) {
            let status = status.map_err(|error| SimError::Input {
                agent_idx: *idx,
                error,
            })?;
            if !status.hibernated {
                still.push(*idx);
            }
        }
        awake = still;
    }
    Ok(agents.len() - awake.len())
}

/// The mean JSON size of one agent's events.
async fn mean_event_bytes(
    store: &Arc<dyn SessionStore>,
    id: &SessionId,
) -> Result<usize, SimError> {
    let loaded = store.load(id).await?;
    let n = loaded.events.len().max(1);
    let bytes: usize = loaded.events.iter().map(|e| e.to_json().len()).sum();
    Ok((bytes / n).max(1))
}

/// An `assistant/chunk` event of about `event_bytes` bytes at `seq`, inside turn 1, step 1.
fn ceiling_event(seq: u64, event_bytes: usize) -> EncodedEvent {
    let head = format!(
        r#"{{"type":"assistant/chunk","seq":{seq},"time":1700000000000,"data":{{"turn":1,"step":1,"chunk":{{"type":"text-delta","index":0,"text":""#
    );
    let tail = r#""}}}"#;
    let n_text = event_bytes.saturating_sub(head.len() + tail.len()).max(1);
    let mut json = String::with_capacity(head.len() + n_text + tail.len());
    json.push_str(&head);
    json.extend(std::iter::repeat_n('x', n_text));
    json.push_str(tail);
    EncodedEvent {
        seq,
        kind: "assistant/chunk".to_string(),
        json: Bytes::from(json),
    }
}

/// The store's own ceiling: `n_appenders` tasks, each appending `batch_events`-event batches to
/// its own session as fast as the store acknowledges them, until `duration` has passed (or each
/// did `CEILING_ROUNDS_MAX` rounds). Events are encoded before the clock starts.
async fn store_ceiling(
    store: &Arc<dyn SessionStore>,
    n_appenders: usize,
    batch_events: usize,
    event_bytes: usize,
    duration: Duration,
) -> Result<CeilingReport, SimError> {
    let opening = [
        r#"{"type":"turn/start","seq":0,"time":1700000000000,"data":{"turn":1}}"#,
        r#"{"type":"step/start","seq":1,"time":1700000000000,"data":{"turn":1,"step":1}}"#,
    ];
    let opening: Vec<EncodedEvent> = opening
        .iter()
        .enumerate()
        .map(|(seq, json)| EncodedEvent {
            seq: seq as u64,
            kind: if seq == 0 { "turn/start" } else { "step/start" }.to_string(),
            json: Bytes::from_static(json.as_bytes()),
        })
        .collect();
    let first_seq = opening.len() as u64;
    let events: Arc<Vec<EncodedEvent>> = Arc::new(
        (0..(CEILING_ROUNDS_MAX * batch_events) as u64)
            .map(|i| ceiling_event(first_seq + i, event_bytes))
            .collect(),
    );
    let ids: Vec<SessionId> = (0..n_appenders)
        .map(|i| SessionId::new(&format!("ceiling-{i:07}")))
        .collect::<Result<_, _>>()
        .map_err(|e| SimError::Task(format!("ceiling id: {e}")))?;
    let setups = ids.iter().map(|id| {
        let store = Arc::clone(store);
        let id = id.clone();
        let opening = opening.clone();
        tokio::spawn(async move {
            store.create(&SessionHeader::new(id.clone(), 0)).await?;
            store.append(&id, opening).await
        })
    });
    for setup in futures::future::join_all(setups).await {
        setup.map_err(|e| SimError::Task(e.to_string()))??;
    }

    let started = Instant::now();
    let deadline = started + duration;
    let appenders: Vec<_> = ids
        .into_iter()
        .map(|id| {
            let store = Arc::clone(store);
            let events = Arc::clone(&events);
            tokio::spawn(async move {
                let mut n = 0u64;
                for batch in events.chunks(batch_events) {
                    if Instant::now() >= deadline {
                        break;
                    }
                    store.append(&id, batch.to_vec()).await?;
                    n += batch.len() as u64;
                }
                Ok::<u64, StoreError>(n)
            })
        })
        .collect();
    let mut total = 0u64;
    for appender in appenders {
        total += appender
            .await
            .map_err(|e| SimError::Task(e.to_string()))??;
    }
    let elapsed = started.elapsed();
    Ok(CeilingReport {
        events_per_sec: per_sec(total, elapsed),
        appenders: n_appenders,
        events: total,
        batch_events,
        event_bytes,
        duration_ms: elapsed.as_secs_f64() * 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut samples: Vec<u64> = (1..=100).map(|i| i * 1_000_000).collect();
        let p = Percentiles::of(&mut samples);
        assert_eq!(
            p,
            Percentiles {
                p50: Some(50.0),
                p99: Some(99.0),
                max: Some(100.0),
                n: 100
            }
        );
        let mut one = vec![2_500_000];
        let p = Percentiles::of(&mut one);
        assert_eq!((p.p50, p.p99, p.max), (Some(2.5), Some(2.5), Some(2.5)));
        assert_eq!(
            Percentiles::of(&mut []),
            Percentiles {
                p50: None,
                p99: None,
                max: None,
                n: 0
            }
        );
    }

    #[test]
    fn a_ceiling_event_has_the_asked_size_and_parses() {
        let e = ceiling_event(7, 400);
        assert_eq!(e.json.len(), 400);
        let text = std::str::from_utf8(&e.json).expect("utf-8");
        let event = dsh::session::Event::from_json(text).expect("a valid event");
        assert_eq!((event.seq, event.kind()), (7, "assistant/chunk"));
    }

    #[test]
    fn the_rng_is_certain_at_the_ends() {
        let mut rng = agent_rng(1, 3);
        assert!((0..1000).all(|_| !rng.chance(0.0)));
        assert!((0..1000).all(|_| rng.chance(1.0)));
    }
}
