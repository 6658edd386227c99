//! `Host`: the root supervisor and registry of agents.
//!
//! The host owns what every agent shares — the store, the provider registry, host-level tools and
//! hooks, the configuration, host-wide observers and counters — and a registry (`DashMap`) of agents by
//! id. Agent actors are linked to the `HostActor`; when one fails (a panic, or its core found its log
//! unreadable), the host restarts it from its durable log — repair included, pending inbox kept —
//! unless it already restarted `restart_max` times within `restart_window`, in which case the agent is
//! marked failed and observers are told. Handles survive restarts: they reach the agent through its
//! registry slot.
//!
//! Shutdown order: each agent's turn is cancelled (which closes its stream first, then stops its
//! tools), the agent converges, and its writer is drained, so everything an agent produced is durable
//! when `shutdown` returns. Pending input is kept for the next start.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use dsh::SessionId;
use dsh::hooks::{Hooks, RequestErrorHook};
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::retry::{RetryHook, RetryPolicy};
use dsh::session::event::CancelCause;
use dsh::session::store::{SessionStore, StoreError};
use dsh::session::{Event, SessionHeader};
use dsh::tools::ToolRegistry;
use dsh::turn::{AgentConfig, AgentCore};
use futures::FutureExt;
use futures::future::BoxFuture;
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{info, warn};

use crate::agent::{AgentActor, AgentArgs, now_ms};
use crate::error::HostError;
use crate::handle::AgentHandle;
use crate::observe::{Channel, Observed, Subscription};
use crate::runtime::{HostConfig, Metrics, Runtime};
use crate::slot::{AgentSlot, SlotHost, SlotState};
use crate::threads::AgentThreads;

/// How to make (or resume) one agent.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// The agent's id; minted when `None`.
    pub id: Option<SessionId>,
    /// The agent's model route, prompt settings, limits and parallelism, shared by every core the
    /// agent gets (restarts and wakes included).
    pub config: AgentConfig,
    /// This agent's tools, layered over the host's.
    pub tools: ToolRegistry,
    /// This agent's hooks, after the host's (and before the host's default retry, which a
    /// `request_error` hook here turns off unless the host's builder chose it; see `DefaultRetry`).
    pub hooks: Hooks,
    /// Working directory recorded in the session header.
    pub cwd: Option<String>,
}

impl AgentSpec {
    /// A spec with `config`, a minted id, no tools or hooks of its own and no working directory.
    pub fn new(config: AgentConfig) -> AgentSpec {
        AgentSpec {
            id: None,
            config,
            tools: ToolRegistry::new(),
            hooks: Hooks::new(),
            cwd: None,
        }
    }

    /// This spec with the agent's id set to `id`.
    pub fn with_id(mut self, id: SessionId) -> AgentSpec {
        self.id = Some(id);
        self
    }
}

/// How a host retries a failed model request that no `request_error` hook recovered
/// (`HostBuilder::retry`).
///
/// The choice runs as one `RetryHook` after every `request_error` hook of the host and of the
/// agent, so a hook that decides (retry, or give up with a failure) wins and the default decides
/// only when all of them delegated.
///
/// Unless `HostBuilder::retry` is called, the default is `ProviderPolicy` for every agent that has
/// no `request_error` hook (neither the host's nor its own), and off for an agent that has one: a
/// hook installed for that point owns the decision, so an explicitly installed `RetryHook` (the
/// pattern before the default existed) runs alone instead of being followed by a second chain under
/// the default policy. Calling `HostBuilder::retry` applies the choice to every agent, hooks or not.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub enum DefaultRetry {
    /// Each provider's own policy (`Provider::retry_policy`; `RetryPolicy::default()` unless the
    /// provider says otherwise): `RATE_LIMIT`, `SERVER`, `TIMEOUT`, `TRANSPORT` and
    /// `EMPTY_RESPONSE` are retried up to 5 times with exponential backoff.
    #[default]
    ProviderPolicy,
    /// This policy for every provider.
    Policy(RetryPolicy),
    /// No retries: a failure no hook recovers ends the turn `error`.
    Off,
}

impl DefaultRetry {
    /// The hook that carries this choice out, if any.
    fn hook(self) -> Option<Arc<dyn RequestErrorHook>> {
        match self {
            DefaultRetry::ProviderPolicy => Some(Arc::new(RetryHook::new())),
            DefaultRetry::Policy(policy) => Some(Arc::new(RetryHook::with_policy(policy))),
            DefaultRetry::Off => None,
        }
    }
}

/// What the host keeps of one registered agent: what its cores are made of, and nothing of its
/// spec that a core does not need (the id is the slot's; the working directory is in the log).
struct AgentRecord {
    /// The slot every handle of the agent reaches it through.
    slot: Arc<AgentSlot>,
    /// The agent's own tools (`AgentSpec::tools`), layered over the host's at every (re)start.
    tools: ToolRegistry,
    /// The agent's own hooks (`AgentSpec::hooks`), layered over the host's at every (re)start.
    hooks: Hooks,
    /// `AgentSpec::config`, shared with every core of this agent, and with every other agent of
    /// the host made with an equal config (see `Registry::share_config`).
    config: Arc<AgentConfig>,
    /// Restart times within the window.
    restarts: Mutex<VecDeque<Instant>>,
}

/// The registry of a host's agents, shared by the `Host` handles, the `HostActor` and (weakly, as a
/// `SlotHost`) every agent slot.
struct Registry {
    /// What every agent shares.
    runtime: Arc<Runtime>,
    /// The registered agents (live, dormant, restarting or failed), by id.
    agents: DashMap<SessionId, Arc<AgentRecord>>,
    /// The agent each live agent actor runs, so a supervision event finds its record.
    by_actor: DashMap<ActorId, SessionId>,
    /// The `HostActor`, which agent actors are linked to; set once it started.
    host_cell: OnceLock<ActorCell>,
    /// The config of the agent registered last: the next agent with an equal config shares it.
    last_config: Mutex<Option<Arc<AgentConfig>>>,
    /// The threads agent actors are pinned to (`HostConfig::agent_threads`); `None`: the caller's
    /// runtime. Ended when the registry is dropped.
    threads: Option<AgentThreads>,
}

/// A running host. Cheap to clone.
#[derive(Clone)]
pub struct Host {
    registry: Arc<Registry>,
    actor: ActorRef<()>,
}

impl std::fmt::Debug for Host {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Host")
            .field("agents", &self.registry.agents.len())
            .finish_non_exhaustive()
    }
}

/// Builds a host: `Host::builder(store)`, then any of the setters, then `start`. Each setter
/// replaces what an earlier call of the same setter set.
pub struct HostBuilder {
    store: Arc<dyn SessionStore>,
    providers: ProviderRegistry,
    tools: ToolRegistry,
    hooks: Hooks,
    /// `None` until `retry` is called: then the default yields to explicit `request_error` hooks.
    retry: Option<DefaultRetry>,
    config: HostConfig,
}

impl HostBuilder {
    /// The model backends agents may route to (default: none, so every request fails with
    /// `NO_ADAPTER`).
    pub fn providers(mut self, providers: ProviderRegistry) -> HostBuilder {
        self.providers = providers;
        self
    }

    /// Tools every agent has; an agent's own tools (`AgentSpec::tools`) are layered over them.
    pub fn tools(mut self, tools: ToolRegistry) -> HostBuilder {
        self.tools = tools;
        self
    }

    /// Hooks every agent runs, before the agent's own (`AgentSpec::hooks`). `request_error` hooks
    /// given here replace the default retry, unless `retry` is called too (see `DefaultRetry`).
    pub fn hooks(mut self, hooks: Hooks) -> HostBuilder {
        self.hooks = hooks;
        self
    }

    /// How failed model requests are retried when no `request_error` hook recovers them, for every
    /// agent (without this call: each provider's own policy, for agents with no `request_error`
    /// hook; see `DefaultRetry`). `DefaultRetry::Off` turns retries off; `DefaultRetry::Policy`
    /// replaces the policy for every provider.
    pub fn retry(mut self, retry: DefaultRetry) -> HostBuilder {
        self.retry = Some(retry);
        self
    }

    /// Host-wide settings (default: `HostConfig::default()`).
    pub fn config(mut self, config: HostConfig) -> HostBuilder {
        self.config = config;
        self
    }

    /// Starts the host's supervisor actor.
    ///
    /// # Errors
    /// `HostError::Spawn` when the actor cannot start.
    pub async fn start(self) -> Result<Host, HostError> {
        let threads =
            match self.config.agent_threads {
                0 => None,
                n => Some(AgentThreads::start(n).map_err(|e| {
                    HostError::Spawn(format!("cannot start {n} agent threads: {e}"))
                })?),
            };
        let runtime = Arc::new(Runtime {
            observers: Channel::new(self.config.limits.subscriber_buffer_max),
            store: self.store,
            providers: self.providers,
            tools: self.tools,
            hooks: self.hooks,
            retry_yields_to_hooks: self.retry.is_none(),
            retry: self.retry.unwrap_or_default().hook(),
            config: self.config,
            metrics: Arc::new(Metrics::default()),
        });
        let registry = Arc::new(Registry {
            runtime,
            agents: DashMap::new(),
            by_actor: DashMap::new(),
            host_cell: OnceLock::new(),
            last_config: Mutex::new(None),
            threads,
        });
        let (actor, _) = Actor::spawn(
            None,
            HostActor {
                registry: Arc::clone(&registry),
            },
            (),
        )
        .await
        .map_err(|e| HostError::Spawn(e.to_string()))?;
        let _ = registry.host_cell.set(actor.get_cell());
        Ok(Host { registry, actor })
    }
}

impl Host {
    /// A builder of a host whose agents keep their logs in `store`, with no providers, tools or
    /// hooks, the default retry (`DefaultRetry`) and `HostConfig::default()`.
    pub fn builder(store: Arc<dyn SessionStore>) -> HostBuilder {
        HostBuilder {
            store,
            providers: ProviderRegistry::new(),
            tools: ToolRegistry::new(),
            hooks: Hooks::new(),
            retry: None,
            config: HostConfig::default(),
        }
    }

    /// The host's settings, as given to the builder.
    pub fn config(&self) -> &HostConfig {
        &self.registry.runtime.config
    }

    /// The store every agent's log lives in.
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.registry.runtime.store
    }

    /// Counters of the host's work since it started.
    pub fn metrics(&self) -> &Metrics {
        &self.registry.runtime.metrics
    }

    /// How many agents are registered (live, hibernated, restarting or failed); with
    /// `Metrics::agents_hibernated`, how many are awake. Costs the same at any number of agents.
    pub fn n_agents(&self) -> usize {
        self.registry.agents.len()
    }

    /// How many agent actors the host supervises right now: started and not yet reaped. An actor's
    /// end is handled on the host's own actor (its supervision event, which carries the actor's
    /// final state until then), so after a mass hibernation this falls to 0 a moment after every
    /// agent reports itself hibernated. Costs the same at any number of agents.
    pub fn n_actors(&self) -> usize {
        self.registry.by_actor.len()
    }

    /// Creates a new agent with an empty log.
    ///
    /// # Errors
    /// `AlreadyExists` when the id is live or stored; `Store` or `Spawn` failures.
    pub async fn create(&self, spec: AgentSpec) -> Result<AgentHandle, HostError> {
        let id = spec.id.clone().unwrap_or_else(SessionId::mint);
        let record = self.reserve(&id, &spec)?;
        let mut header = SessionHeader::new(id.clone(), now_ms().max(0) as u64);
        header.cwd = spec.cwd.clone();
        let store = &self.registry.runtime.store;
        let created = if spec.id.is_some() {
            store.create(&header).await
        } else {
            store.create_minted(&header).await
        };
        if let Err(e) = created {
            self.registry.agents.remove(&id);
            return Err(match e {
                StoreError::AlreadyExists { id } => HostError::AlreadyExists { id },
                e => HostError::Store(e),
            });
        }
        let tools = self.registry.runtime.tools.layered(&spec.tools);
        let core = AgentCore::new(id.clone(), Arc::clone(&record.config), tools);
        if let Err(e) = self.registry.spawn(&record, core).await {
            self.registry.agents.remove(&id);
            return Err(e);
        }
        Ok(AgentHandle::new(Arc::clone(&record.slot)))
    }

    /// Resumes a stored agent (repairing an interrupted last turn), or returns the live one.
    ///
    /// # Errors
    /// `NotFound` when no such session is stored; `Resume` when its log cannot become an agent.
    pub async fn resume(&self, id: &SessionId, spec: AgentSpec) -> Result<AgentHandle, HostError> {
        if let Some(handle) = self.get(id) {
            return Ok(handle);
        }
        let record = self.reserve(id, &spec)?;
        match self.registry.restore(&record).await {
            Ok(()) => Ok(AgentHandle::new(Arc::clone(&record.slot))),
            Err(e) => {
                self.registry.agents.remove(id);
                Err(e)
            }
        }
    }

    /// Resumes the agent if it is stored, creates it otherwise.
    ///
    /// # Errors
    /// As `resume` and `create`.
    pub async fn open(&self, spec: AgentSpec) -> Result<AgentHandle, HostError> {
        if let Some(id) = &spec.id {
            if let Some(handle) = self.get(id) {
                return Ok(handle);
            }
            if self.registry.runtime.store.header(id).await?.is_some() {
                return self.resume(id, spec.clone()).await;
            }
        }
        self.create(spec).await
    }

    /// Registers `id` with a fresh slot (no actor yet), or refuses a taken id.
    fn reserve(&self, id: &SessionId, spec: &AgentSpec) -> Result<Arc<AgentRecord>, HostError> {
        match self.registry.agents.entry(id.clone()) {
            Entry::Occupied(_) => Err(HostError::AlreadyExists { id: id.clone() }),
            Entry::Vacant(v) => {
                let record = Arc::new(AgentRecord {
                    slot: Arc::new(AgentSlot::new(
                        id.clone(),
                        self.registry.runtime.config.limits.subscriber_buffer_max,
                        Arc::downgrade(&self.registry) as Weak<dyn SlotHost>,
                    )),
                    config: self.registry.share_config(&spec.config),
                    tools: spec.tools.clone(),
                    hooks: spec.hooks.clone(),
                    restarts: Mutex::new(VecDeque::new()),
                });
                v.insert(Arc::clone(&record));
                Ok(record)
            }
        }
    }

    /// The live agent with this id.
    pub fn get(&self, id: &SessionId) -> Option<AgentHandle> {
        self.registry
            .agents
            .get(id)
            .map(|r| AgentHandle::new(Arc::clone(&r.slot)))
    }

    /// Ids of live agents.
    pub fn list(&self) -> Vec<SessionId> {
        self.registry
            .agents
            .iter()
            .map(|r| r.key().clone())
            .collect()
    }

    /// Observes every agent of the host.
    pub fn subscribe(&self) -> Subscription {
        self.registry.runtime.observers.subscribe()
    }

    /// Cancels the agent's turn with cause `disposed` (discarding its pending input), waits for it to
    /// converge, stops it (its writer drained) and removes it from the registry. Its log stays stored.
    ///
    /// # Errors
    /// `NotFound` when the agent is not live.
    pub async fn dispose(&self, id: &SessionId) -> Result<(), HostError> {
        let Some((_, record)) = self.registry.agents.remove(id) else {
            return Err(HostError::NotFound { id: id.clone() });
        };
        self.registry
            .stop_agent(&record, false, self.config().stop_timeout)
            .await;
        // Its writes are drained: a store with leases lets another node take the session now.
        if let Err(e) = self.registry.runtime.store.release(id).await {
            tracing::warn!(agent = %id, error = %e, "releasing the session's lease failed");
        }
        Ok(())
    }

    /// Forgets an agent that is dormant (hibernated) or failed, writing nothing: no cancel, no
    /// lease release. For a server that learned the session's log moved on under another node
    /// (SPEC §14), so that the next use reads it back from the store. Returns whether it was
    /// forgotten; a live or restarting agent is left alone.
    pub fn evict(&self, id: &SessionId) -> bool {
        let removed = self.registry.agents.remove_if(id, |_, record| {
            matches!(
                record.slot.current(),
                SlotState::Dormant | SlotState::Failed(_)
            )
        });
        match removed {
            Some((_, record)) => {
                self.registry.forget_dormant(&record.slot);
                record.slot.set(SlotState::Disposed);
                true
            }
            None => false,
        }
    }

    /// Drops the agent as a crash would — nothing unacknowledged is flushed — and resumes it from the
    /// store, repair included (used by tests and scenario files).
    ///
    /// # Errors
    /// `NotFound` when the agent is not live; `Resume` when its log cannot be resumed.
    pub async fn restart(&self, id: &SessionId) -> Result<AgentHandle, HostError> {
        let record = self
            .registry
            .agents
            .get(id)
            .map(|r| Arc::clone(&r))
            .ok_or_else(|| HostError::NotFound { id: id.clone() })?;
        loop {
            match record.slot.current() {
                SlotState::Live(actor, _) => {
                    // An actor passivating at this moment either finished (look again: dormant)
                    // or gives up its core, which the log below replaces.
                    if !record.slot.begin_restart(actor.get_id()) {
                        continue;
                    }
                    self.registry.by_actor.remove(&actor.get_id());
                    let _ = actor.kill_and_wait(Some(Duration::from_secs(10))).await;
                }
                SlotState::Dormant => {
                    // Nothing runs; forget the dormant core and read the log back like a crash would.
                    self.registry.forget_dormant(&record.slot);
                    record.slot.set(SlotState::Restarting);
                }
                _ => {}
            }
            break;
        }
        self.registry.restore(&record).await?;
        Ok(AgentHandle::new(Arc::clone(&record.slot)))
    }

    /// Stops every agent (streams, then tools, then writers drained) and the host itself. Pending
    /// input stays stored for the next start.
    pub async fn shutdown(&self) {
        let records: Vec<Arc<AgentRecord>> = self
            .registry
            .agents
            .iter()
            .map(|r| Arc::clone(r.value()))
            .collect();
        self.registry.agents.clear();
        let timeout = self.config().stop_timeout;
        let stops = records
            .iter()
            .map(|r| self.registry.stop_agent(r, true, timeout));
        futures::future::join_all(stops).await;
        self.actor.stop(None);
    }
}

impl Registry {
    /// `config` as an `Arc`: the one of the agent registered last if equal (agents made from one
    /// spec, as a fleet usually is, then share one copy), a new one otherwise. Comparing costs a
    /// few string comparisons per registration; a copy per agent costs its strings and limits
    /// (~400 bytes) for as long as the agent is registered, hibernated or not.
    fn share_config(&self, config: &AgentConfig) -> Arc<AgentConfig> {
        let mut last = self
            .last_config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*last {
            Some(shared) if **shared == *config => Arc::clone(shared),
            _ => {
                let shared = Arc::new(config.clone());
                *last = Some(Arc::clone(&shared));
                shared
            }
        }
    }

    /// Drops `slot`'s dormant core, if it has one, and counts it out of the hibernated agents.
    fn forget_dormant(&self, slot: &AgentSlot) {
        if slot.take_dormant().is_some() {
            self.runtime.metrics.agent_woken();
        }
    }

    /// Gives back the live-actor map's room once it holds a small fraction of what it grew to (a
    /// burst of thousands of awake agents that then hibernated), so that the tables of a burst do
    /// not stay resident beside the dormant agents. The fraction leaves room for the next burst
    /// before the map regrows, so the rehash is amortized over many removals.
    fn shrink_by_actor(&self) {
        const ROOM_MIN: usize = 1024;
        let len = self.by_actor.len();
        if len.saturating_mul(8) < self.by_actor.capacity() && self.by_actor.capacity() > ROOM_MIN {
            self.by_actor.shrink_to_fit();
        }
    }

    /// Spawns an agent actor over `core`, linked to the host; it publishes itself `Live` in the slot.
    async fn spawn(&self, record: &Arc<AgentRecord>, core: AgentCore) -> Result<(), HostError> {
        let host_cell = self.host_cell.get().cloned().ok_or(HostError::ShutDown)?;
        let actor = AgentActor {
            runtime: Arc::clone(&self.runtime),
            slot: Arc::clone(&record.slot),
            hooks: self.runtime.agent_hooks(&record.hooks),
            passivated: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        let start = async move {
            Actor::spawn_linked(None, actor, AgentArgs { core }, host_cell)
                .await
                .map(|(agent, _)| agent)
                .map_err(|e| HostError::Spawn(e.to_string()))
        };
        // On an agent thread, the actor's task and every task it spawns stay on that thread.
        let agent = match &self.threads {
            None => start.await?,
            Some(threads) => {
                let thread = threads.place(record.slot.home_thread());
                record.slot.set_home_thread(thread);
                threads.enter(thread, start).await.ok_or_else(|| {
                    HostError::Spawn(format!("the host has no agent thread {thread}"))
                })??
            }
        };
        // The actor published itself as `Live` in `pre_start`: it may already have passivated.
        self.by_actor.insert(agent.get_id(), record.slot.id.clone());
        Ok(())
    }

    /// Reads the agent's log back (after any in-flight write of a previous instance landed), repairs
    /// it, and spawns a new actor over it.
    async fn restore(&self, record: &Arc<AgentRecord>) -> Result<(), HostError> {
        let id = record.slot.id.clone();
        // The previous instance's append in flight lands first; any later one of it is refused.
        record.slot.write_fence.seal().await;
        let loaded = self.runtime.store.load(&id).await.map_err(|e| match e {
            StoreError::NotFound { id } => HostError::NotFound { id },
            e => HostError::Store(e),
        })?;
        let tools = self.runtime.tools.layered(&record.tools);
        let core = AgentCore::resume(
            id.clone(),
            Arc::clone(&record.config),
            tools,
            loaded.events,
            now_ms(),
        )
        .map_err(|e| HostError::Resume {
            id: id.clone(),
            reason: e.to_string(),
        })?;
        self.spawn(record, core).await
    }

    /// Cancels the agent's turn (keeping or discarding its pending input), waits up to `timeout` for
    /// it to converge, stops its actor (the writer drained) and marks the slot disposed.
    async fn stop_agent(&self, record: &Arc<AgentRecord>, keep_inbox: bool, timeout: Duration) {
        if keep_inbox && matches!(record.slot.current(), SlotState::Dormant) {
            // Dormant: no activity, everything durable, pending input kept. Nothing to stop.
            self.forget_dormant(&record.slot);
            record.slot.set(SlotState::Disposed);
            return;
        }
        let handle = AgentHandle::new(Arc::clone(&record.slot));
        if handle
            .cancel(CancelCause::Disposed, keep_inbox)
            .await
            .is_ok()
        {
            let _ = handle.when_idle_for(timeout).await;
        }
        if let SlotState::Live(actor, _) = record.slot.current() {
            self.by_actor.remove(&actor.get_id());
            let _ = actor.stop_and_wait(None, Some(timeout)).await;
        }
        record.slot.set(SlotState::Disposed);
    }

    /// An agent actor failed: restart it under the intensity limit.
    fn on_agent_failed(self: &Arc<Self>, id: SessionId, reason: String) {
        let Some(record) = self.agents.get(&id).map(|r| Arc::clone(&r)) else {
            return;
        };
        let config = &self.runtime.config;
        let allowed = {
            let mut restarts = record
                .restarts
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let now = Instant::now();
            while restarts
                .front()
                .is_some_and(|t| now.duration_since(*t) > config.restart_window)
            {
                restarts.pop_front();
            }
            let allowed = restarts.len() < config.restart_max as usize;
            if allowed {
                restarts.push_back(now);
            }
            allowed
        };
        if !allowed {
            let why = format!(
                "restarted {} times within {:?}; last failure: {reason}",
                config.restart_max, config.restart_window
            );
            warn!(agent = %id, %why, "agent marked failed");
            record.slot.set(SlotState::Failed(why.clone()));
            self.publish(Observed::Failed {
                agent: id,
                reason: why,
            });
            return;
        }
        warn!(agent = %id, %reason, "agent crashed; restarting from its log");
        record.slot.set(SlotState::Restarting);
        let registry = Arc::clone(self);
        tokio::spawn(async move {
            match registry.restore(&record).await {
                Ok(()) => {
                    info!(agent = %id, "agent restarted");
                    registry.publish(Observed::Restarted { agent: id });
                }
                Err(e) => {
                    let why = format!("restart failed: {e}");
                    record.slot.set(SlotState::Failed(why.clone()));
                    registry.publish(Observed::Failed {
                        agent: id,
                        reason: why,
                    });
                }
            }
        });
    }

    /// Tells the agent's observers and the host's.
    fn publish(&self, item: Observed) {
        if let Some(record) = self.agents.get(item.agent()) {
            record.slot.observers.publish(item.clone());
        }
        self.runtime.observers.publish(item);
    }
}

impl SlotHost for Registry {
    fn wake<'a>(
        &'a self,
        slot: &'a Arc<AgentSlot>,
        core: AgentCore,
    ) -> BoxFuture<'a, Result<(), String>> {
        // The caller took the dormant core out of the slot.
        self.runtime.metrics.agent_woken();
        async move {
            let record = self
                .agents
                .get(&slot.id)
                .map(|r| Arc::clone(&r))
                .ok_or_else(|| format!("agent {} is no longer registered", slot.id))?;
            self.spawn(&record, core).await.map_err(|e| e.to_string())
        }
        .boxed()
    }

    fn agent_thread(&self, i: usize) -> Option<tokio::runtime::Handle> {
        self.threads.as_ref()?.handle(i).cloned()
    }

    fn read_log<'a>(&'a self, id: &'a SessionId) -> BoxFuture<'a, Result<Vec<Event>, String>> {
        // Read-only: the agent may wake and open a turn while this reads, which a repairing
        // `load` would close behind its back.
        async move {
            self.runtime
                .store
                .inspect(id)
                .await
                .map(|found| found.events)
                .map_err(|e| e.to_string())
        }
        .boxed()
    }
}

/// The root supervisor: restarts failed agents.
struct HostActor {
    registry: Arc<Registry>,
}

impl Actor for HostActor {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(&self, _myself: ActorRef<()>, _: ()) -> Result<(), ActorProcessingErr> {
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<()>,
        event: SupervisionEvent,
        _state: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        // Never stop the host because an agent ended (ractor's default would).
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                if let Some((_, id)) = self.registry.by_actor.remove(&cell.get_id()) {
                    self.registry.on_agent_failed(id, err.to_string());
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                self.registry.by_actor.remove(&cell.get_id());
                self.registry.shrink_by_actor();
            }
            _ => {}
        }
        Ok(())
    }
}
