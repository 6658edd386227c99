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
//!    user cancel (pending input discarded), then waits until the agent is idle. With a ramp, a
//!    driver task is spawned only when its agent's first input is due, so the process holds only
//!    the drivers of the agents at work (a million sleeping tasks would outweigh the agents).
//! 4. Wait until every agent hibernated (`--hibernate-ms`), read the resident set size again: the
//!    difference divided by the agents is `bytes_per_agent` (after glibc's `malloc_trim`, as
//!    `tests/memory.rs` measures; `bytes_per_agent_untrimmed` before it).
//! 5. With `--wake-sample K`, wake K hibernated agents (a seeded sample, one at a time) with one
//!    followup each: `wake_ack_ms` times the followup until durable, `wake_turn_ms` until its turn
//!    ended (the log read back included).
//! 6. Measure the store's own ceiling: as many appenders as agents append batches of the run's mean
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
//! `--nodes N` (PostgreSQL only, `nodes.rs`) runs the workload on 1, 2, …, N processes at once on
//! one database, each a `dsh sim` of its own, and reports turns/s for each count (SPEC §14).
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
use dsh::session::store::postgres::{PostgresConfig, PostgresStore};
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore, StoreStats};
use dsh::session::store::{EncodedEvent, SessionStore, StoreError};
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::{AgentConfig, LiveEvent};
use dsh::{MessageId, SessionId};
use futures::{FutureExt, StreamExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::{CliError, Config, SimArgs};
use dsh_actors::{
    AgentHandle, AgentSpec, DEFAULT_CHUNK_LINGER, Host, HostConfig, HostError, InputError,
    Observation, Observed, Subscription,
};

mod ceiling;
mod driver;
mod memory;
mod nodes;
mod plan;
mod progress;
mod report;

use ceiling::*;
use driver::*;
use memory::*;
use plan::*;
use progress::*;
use report::*;

pub use plan::{SimPlan, StoreChoice};
pub use report::{CeilingReport, Percentiles, SimReport};

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
/// Drivers spawned that have not yet run: the spawner waits for one to start before it spawns
/// more. Spawned all at once, 10,000 drivers would fill tokio's global queue, and every task woken
/// meanwhile that overflowed a worker's local queue (an acknowledged input's driver, an agent
/// whose input became durable) would wait behind all of them.
const DRIVERS_UNSTARTED_MAX: usize = 256;
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
    /// `--agents` out of range.
    #[error("--agents is {agents}, it must be within 1..={agents_max}")]
    Agents {
        /// The value given.
        agents: usize,
        /// The largest allowed.
        agents_max: usize,
    },
    /// `--turns` out of range.
    #[error("--turns is {turns}, it must be within 1..={turns_max}")]
    Turns {
        /// The value given.
        turns: usize,
        /// The largest allowed.
        turns_max: usize,
    },
    /// A probability flag outside [0, 1].
    #[error("--{flag} is {value}, it must be within 0..=1")]
    Rate {
        /// The flag's name.
        flag: &'static str,
        /// The value given.
        value: f64,
    },
    #[error("--reply-tokens is {reply_tokens}, it must be within 1..={reply_tokens_max}")]
    /// `--reply-tokens` out of range.
    ReplyTokens {
        /// The value given.
        reply_tokens: u64,
        /// The largest allowed.
        reply_tokens_max: u32,
    },
    #[error("--{flag} is {value_ms} ms, the limit is {value_ms_max} ms")]
    /// A duration flag over its limit.
    Duration {
        /// The flag's name.
        flag: &'static str,
        /// The value given.
        value_ms: u64,
        /// The largest allowed.
        value_ms_max: u64,
    },
    /// `--store` names no store.
    #[error("--store is {store:?}; it must be sqlite, memory or postgres://…")]
    Store {
        /// The value given.
        store: String,
    },
    /// The simulated model refused its configuration.
    #[error("simulated model: {0}")]
    Model(#[from] dsh::llm::sim::SimError),
    /// The store failed.
    #[error("session store: {0}")]
    StoreFailed(#[from] StoreError),
    /// The host failed to start or to open an agent.
    #[error("host: {0}")]
    Host(#[from] HostError),
    /// An agent refused input.
    #[error("agent {agent_idx}: {error}")]
    Input {
        /// The agent's index.
        agent_idx: usize,
        /// Why it refused.
        error: InputError,
    },
    /// An agent failed.
    #[error("agent {agent}: {reason}")]
    AgentFailed {
        /// The agent's id.
        agent: String,
        /// Why it failed.
        reason: String,
    },
    /// The run's directory could not be made.
    #[error("{path}: {cause}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The operating system's reason.
        cause: String,
    },
    /// A task of the run panicked or failed.
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
    if args.nodes > 1 {
        return nodes::run(args, &plan, out).await;
    }
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
    Postgres(Arc<PostgresStore>),
}

impl SimStore {
    fn shared(&self) -> Arc<dyn SessionStore> {
        match self {
            SimStore::Sqlite(s) => Arc::clone(s) as Arc<dyn SessionStore>,
            SimStore::Memory(s) => Arc::clone(s) as Arc<dyn SessionStore>,
            SimStore::Postgres(s) => Arc::clone(s) as Arc<dyn SessionStore>,
        }
    }

    /// Commit groups (fsyncs) so far; `None` for the memory store, which has none.
    fn n_groups(&self) -> Option<u64> {
        match self {
            SimStore::Sqlite(s) => Some(s.stats().n_groups),
            SimStore::Memory(_) => None,
            SimStore::Postgres(s) => Some(s.stats().n_groups),
        }
    }

    /// The SQLite store's writer counters so far; `None` on the other stores: the PostgreSQL
    /// store's WAL and work are the server's, and the memory store has no writer.
    fn sqlite_stats(&self) -> Option<StoreStats> {
        match self {
            SimStore::Sqlite(s) => Some(s.stats()),
            SimStore::Memory(_) | SimStore::Postgres(_) => None,
        }
    }

    /// Append requests the store committed so far.
    fn n_appends(&self) -> u64 {
        match self {
            SimStore::Sqlite(s) => s.stats().n_requests_committed,
            SimStore::Memory(s) => s.n_appends(),
            SimStore::Postgres(s) => s.stats().n_requests_committed,
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

/// Whether `id` names a session this run creates (`sim-*` agents, `ceiling-*` appenders; with a
/// node tag, only this process's `sim-TAG-*` and `ceiling-TAG-*`).
fn is_sim_session(plan: &SimPlan, id: &SessionId) -> bool {
    id.as_str().starts_with(&plan.agent_prefix()) || id.as_str().starts_with(&plan.ceiling_prefix())
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
        StoreChoice::Memory | StoreChoice::Postgres => None,
    };
    let store = match (&run_dir, plan.store_url.as_deref()) {
        (Some(dir), _) => SimStore::Sqlite(Arc::new(SqliteStore::open(
            &dir.path,
            SqliteConfig::default(),
        )?)),
        (None, Some(url)) if plan.store == StoreChoice::Postgres => {
            let store = PostgresStore::open(url, PostgresConfig::default()).await?;
            if let Some(old) = store
                .list()
                .await?
                .iter()
                .find(|s| is_sim_session(&plan, &s.header.id))
            {
                let id = old.header.id.clone();
                store.close().await?;
                return Err(SimError::Task(format!(
                    "the database already holds session {id} of an earlier run: use an empty database"
                )));
            }
            SimStore::Postgres(Arc::new(store))
        }
        _ => SimStore::Memory(Arc::new(MemoryStore::new())),
    };
    let mut result = simulate_on(&plan, &store, progress).await;
    if let (Some(dir), Ok(report)) = (&run_dir, &mut result) {
        // One sync timed on the same disk, right after the run, to set the syncs per turn against.
        let path = dir.path.clone();
        report.sync_ms = tokio::task::spawn_blocking(move || sync_time(&path))
            .await
            .ok()
            .and_then(Result::ok);
    }
    match &store {
        SimStore::Sqlite(s) => s.close().await?,
        SimStore::Postgres(s) => {
            // Like the sqlite run directory: the run's sessions go unless kept.
            if !plan.keep_store {
                for summary in s.list().await? {
                    if is_sim_session(&plan, &summary.header.id) {
                        s.delete(&summary.header.id).await?;
                    }
                }
            }
            s.close().await?;
        }
        SimStore::Memory(_) => {}
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
            chunk_linger: Duration::from_millis(plan.chunk_linger_ms),
            agent_threads: plan.agent_threads,
            ..HostConfig::default()
        })
        .start()
        .await?;
    let result = run_agents(plan, store, &host, progress).await;
    progress.phase("shutting down");
    host.shutdown().await;
    result
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
