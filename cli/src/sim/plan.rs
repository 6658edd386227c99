//! The checked flags of one `dsh sim` run: `SimPlan` and the store it uses.

use super::*;

/// Which store a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreChoice {
    /// SQLite in a fresh directory under the data directory.
    Sqlite,
    /// In memory.
    Memory,
    /// A PostgreSQL database (`--store postgres://…`, the URL in `SimPlan::store_url`).
    Postgres,
}

impl StoreChoice {
    pub(super) fn parse(s: &str) -> Result<StoreChoice, SimError> {
        match s {
            "sqlite" => Ok(StoreChoice::Sqlite),
            "memory" => Ok(StoreChoice::Memory),
            url if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Ok(StoreChoice::Postgres)
            }
            other => Err(SimError::Store {
                store: other.to_string(),
            }),
        }
    }
}

/// The checked flags of one run.
#[derive(Clone, Debug, Serialize)]
pub struct SimPlan {
    /// Agents hosted (`--agents`).
    pub agents: usize,
    /// Turns each agent runs (`--turns`).
    pub turns_per_agent: usize,
    /// The store (`--store`).
    pub store: StoreChoice,
    /// The database URL of `StoreChoice::Postgres` (never reported: it may hold a password).
    #[serde(skip)]
    pub store_url: Option<String>,
    /// Model time to first token (`--latency-ms`).
    pub latency_ms: u64,
    /// Model pace, 0 unpaced (`--tokens-per-sec`).
    pub tokens_per_sec: u64,
    /// Reply length in tokens (`--reply-tokens`).
    pub reply_tokens: u32,
    /// Probability that a step calls the tool (`--tool-rate`).
    pub tool_rate: f64,
    /// Tool duration (`--tool-ms`).
    pub tool_ms: u64,
    /// Probability that a turn gets a steer (`--steer-rate`).
    pub steer_rate: f64,
    /// Probability that a turn is cancelled (`--cancel-rate`).
    pub cancel_rate: f64,
    /// Seed of the model and the injections (`--seed`).
    pub seed: u64,
    /// Idle time before an agent hibernates (`--hibernate-ms`).
    pub hibernate_ms: u64,
    /// How long the store ceiling is measured, 0 to skip (`--ceiling-ms`).
    pub ceiling_ms: u64,
    /// How long an agent holds its stream's chunks back (`--chunk-linger-ms`).
    pub chunk_linger_ms: u64,
    /// Keep the run's sqlite store (`--keep-store`).
    pub keep_store: bool,
    /// Threads of the host's own the agents are pinned to (`--agent-threads`; 0: none).
    pub agent_threads: usize,
    /// Agents whose events are observed for the step and steer latencies (at most `agents`).
    pub observe_agents: usize,
    /// Each agent starts after a seeded delay within `0..ramp_ms` (0: all at once).
    pub ramp_ms: u64,
    /// Hibernated agents woken one after the other once all hibernated, to time a wake
    /// (`--wake-sample`, at most `agents`).
    pub wake_sample: usize,
    /// Every agent's context window (`--context-window`): its history compacts past 80 % of it.
    pub context_window: Option<u64>,
    /// This process's part of a `--nodes` run: its sessions are `sim-TAG-…` and `ceiling-TAG-…`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_tag: Option<String>,
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
        let linger_ms = args
            .chunk_linger_ms
            .unwrap_or(DEFAULT_CHUNK_LINGER.as_millis() as u64);
        for (flag, value_ms, value_ms_max) in [
            ("hibernate-ms", args.hibernate_ms, HIBERNATE_MS_MAX),
            ("ceiling-ms", args.ceiling_ms, CEILING_MS_MAX),
            ("latency-ms", args.latency_ms, HIBERNATE_MS_MAX),
            ("tool-ms", args.tool_ms, HIBERNATE_MS_MAX),
            ("ramp-ms", args.ramp_ms, HIBERNATE_MS_MAX),
            ("chunk-linger-ms", linger_ms, HIBERNATE_MS_MAX),
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
            store_url: Some(args.store.clone()).filter(|s| s.contains("://")),
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
            chunk_linger_ms: linger_ms,
            keep_store: args.keep_store,
            agent_threads: args.agent_threads,
            observe_agents: args.observe_agents.min(args.agents),
            ramp_ms: args.ramp_ms,
            wake_sample: args.wake_sample.min(args.agents),
            context_window: args.context_window,
            node_tag: match &args.node_tag {
                Some(tag)
                    if tag.is_empty()
                        || tag.len() > 16
                        || !tag.chars().all(|c| c.is_ascii_alphanumeric()) =>
                {
                    return Err(SimError::Task(format!(
                        "--node-tag {tag:?}: 1-16 ASCII letters and digits"
                    )));
                }
                tag => tag.clone(),
            },
        })
    }

    /// The prefix of this run's agent sessions: `sim-` or `sim-TAG-`.
    pub(super) fn agent_prefix(&self) -> String {
        match &self.node_tag {
            Some(tag) => format!("sim-{tag}-"),
            None => "sim-".to_string(),
        }
    }

    /// The prefix of this run's ceiling sessions: `ceiling-` or `ceiling-TAG-`.
    pub(super) fn ceiling_prefix(&self) -> String {
        match &self.node_tag {
            Some(tag) => format!("ceiling-{tag}-"),
            None => "ceiling-".to_string(),
        }
    }

    pub(super) fn model(&self) -> SimConfig {
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

pub(super) fn store_name(store: StoreChoice) -> &'static str {
    match store {
        StoreChoice::Sqlite => "sqlite",
        StoreChoice::Memory => "memory",
        StoreChoice::Postgres => "postgres",
    }
}
