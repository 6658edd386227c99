//! What every agent of a host shares: `Runtime` (store, providers, host-level tools and hooks,
//! configuration, host-wide observers, counters), `HostConfig` and `Metrics`.
//!
//! The host builds one `Runtime` when it starts and hands an `Arc` of it to every agent actor it
//! spawns; nothing in it changes afterwards except the counters and the observer channel. It names no
//! actor, so the host, the agent actor and the session writer can all depend on it without depending
//! on each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use dsh::hooks::{Hooks, RequestErrorHook};
use dsh::limits::Limits;
use dsh::llm::provider::ProviderRegistry;
use dsh::session::store::SessionStore;
use dsh::tools::ToolRegistry;

use crate::observe::Channel;

/// `HostConfig::chunk_linger` by default: a person watching a stream sees it advance 20 times a
/// second, while a paced model (a token every few ms) costs at most 20 syncs a second, not one per
/// token batch.
pub const DEFAULT_CHUNK_LINGER: Duration = Duration::from_millis(50);

/// Host-wide settings.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Every bound on outside data (message sizes, inbox depth, subscriber buffers, tool grace and
    /// timeout, ...). Each agent's core keeps its own copy in its `AgentConfig`.
    pub limits: Limits,
    /// An agent idle this long hibernates: it drops its in-memory log and its actor stops, leaving
    /// a compact core (~5–8 KB) in the registry until the next input wakes it. `None` never
    /// hibernates.
    pub hibernate_after: Option<Duration>,
    /// Restarts allowed within `restart_window` before an agent is marked failed.
    pub restart_max: u32,
    /// The sliding window over which `restart_max` counts an agent's restarts.
    pub restart_window: Duration,
    /// How long `shutdown` and `dispose` wait for an agent to converge after cancelling it.
    pub stop_timeout: Duration,
    /// How long an agent may hold `assistant/chunk` events back from its session writer while its
    /// model stream is still sending, so that they join the next commit that must be durable (the
    /// assembled message, a tool call's checkpoint, the turn's end) instead of costing a sync of
    /// their own. Nothing waits for a chunk to be durable; observers (event streams) see a held
    /// chunk at most this much later. Zero hands every chunk to the writer at once.
    pub chunk_linger: Duration,
    /// Threads of the host's own that agents are pinned to, each a single-threaded tokio runtime:
    /// an agent's actor and everything it spawns (stream, writer, tool pool, hook tasks) run on
    /// one thread, so a turn's messages never hand work between threads; new agents are spread
    /// over the threads round-robin, and a woken or restarted agent returns to its thread. `0`
    /// (the default) runs agents on the tokio runtime that calls the host, as any task. On the
    /// project's 2-core VMs pinning pays off with a driver beside each agent
    /// (`AgentHandle::spawn_beside`), as `dsh sim` runs (BENCHMARKS.md "Agent threads").
    pub agent_threads: usize,
}

impl Default for HostConfig {
    /// The default limits, hibernation after 30 s idle, at most 3 restarts in 10 s, 10 s for an
    /// agent to stop, chunks held back at most `DEFAULT_CHUNK_LINGER`, and agents on the caller's
    /// runtime (no threads of the host's own).
    fn default() -> HostConfig {
        HostConfig {
            limits: Limits::DEFAULT,
            hibernate_after: Some(Duration::from_secs(30)),
            restart_max: 3,
            restart_window: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(10),
            chunk_linger: DEFAULT_CHUNK_LINGER,
            agent_threads: 0,
        }
    }
}

/// Counters of a host's work since it started, for reports (`dsh sim`).
#[derive(Debug, Default)]
pub struct Metrics {
    turns: AtomicU64,
    events: AtomicU64,
    compactions: AtomicU64,
    compactions_failed: AtomicU64,
    /// Agents whose dormant core waits in their slot (passivated, not yet woken or forgotten).
    /// Counted in under the slot's lock before the core is visible, counted out after it is
    /// taken, so it never dips below zero; signed so that a miscount would show as one.
    hibernated: AtomicI64,
}

impl Metrics {
    /// Counts one ended turn (the agent actor calls it on `Effect::TurnEnded`).
    pub(crate) fn turn_ended(&self) {
        self.turns.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `n` events the store acknowledged durable (the session writer calls it).
    pub(crate) fn events_durable(&self, n: u64) {
        self.events.fetch_add(n, Ordering::Relaxed);
    }

    /// Counts one ended compaction (the agent actor calls it on `Effect::CompactionEnded`).
    pub(crate) fn compaction_ended(&self, failed: bool) {
        self.compactions.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.compactions_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An agent passivated: its dormant core waits in its slot.
    pub(crate) fn agent_hibernated(&self) {
        self.hibernated.fetch_add(1, Ordering::Relaxed);
    }

    /// A dormant core left its slot (woken, restarted, evicted or stopped).
    pub(crate) fn agent_woken(&self) {
        self.hibernated.fetch_sub(1, Ordering::Relaxed);
    }

    /// Registered agents that are hibernated now (their actor stopped). Kept as a counter, so
    /// reading it costs the same with a million agents as with one (counting with `status` calls
    /// would ask every agent).
    pub fn agents_hibernated(&self) -> u64 {
        u64::try_from(self.hibernated.load(Ordering::Relaxed)).unwrap_or(0)
    }

    /// Compactions ended since the host started (failed ones included).
    pub fn compactions(&self) -> u64 {
        self.compactions.load(Ordering::Relaxed)
    }

    /// Compactions that ended with an error (the history unchanged) since the host started.
    pub fn compactions_failed(&self) -> u64 {
        self.compactions_failed.load(Ordering::Relaxed)
    }

    /// Turns ended since the host started.
    pub fn turns(&self) -> u64 {
        self.turns.load(Ordering::Relaxed)
    }

    /// Events acknowledged durable by the store since the host started.
    pub fn events(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }
}

/// What every agent of a host shares. Built once by `HostBuilder::start`.
pub(crate) struct Runtime {
    /// Where every agent's log lives.
    pub(crate) store: Arc<dyn SessionStore>,
    /// The model backends, by route name.
    pub(crate) providers: ProviderRegistry,
    /// Host-level tools; an agent's own tools are layered over them.
    pub(crate) tools: ToolRegistry,
    /// Host-level hooks; an agent's own hooks run after them (see `agent_hooks`).
    pub(crate) hooks: Hooks,
    /// The default `request_error` hook, asked after every other one; `None` when the builder
    /// turned retries off.
    pub(crate) retry: Option<Arc<dyn RequestErrorHook>>,
    /// Set when the builder did not choose the retry: then an agent with any `request_error` hook
    /// (the host's or its own) runs without the default.
    pub(crate) retry_yields_to_hooks: bool,
    /// The host's settings.
    pub(crate) config: HostConfig,
    /// Observers of every agent of the host.
    pub(crate) observers: Channel,
    /// Counters, shared with every agent's session writer.
    pub(crate) metrics: Arc<Metrics>,
}

impl Runtime {
    /// The hooks of an agent whose own hooks are `agent`: the host's, then the agent's, then the
    /// default retry hook (if it applies), so it decides only after every explicit `request_error`
    /// hook delegated.
    pub(crate) fn agent_hooks(&self, agent: &Hooks) -> Hooks {
        let mut hooks = self.hooks.layered(agent);
        if let Some(retry) = &self.retry
            && (!self.retry_yields_to_hooks || hooks.request_error.is_empty())
        {
            hooks.request_error.push(Arc::clone(retry));
        }
        hooks
    }
}
