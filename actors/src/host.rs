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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use dsh::SessionId;
use dsh::hooks::Hooks;
use dsh::limits::Limits;
use dsh::llm::provider::ProviderRegistry;
use dsh::session::event::CancelCause;
use dsh::session::store::{SessionStore, StoreError};
use dsh::session::{Event, SessionHeader};
use dsh::tools::ToolRegistry;
use dsh::turn::{AgentConfig, AgentCore};
use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{info, warn};

use crate::agent::handle::{AgentHandle, AgentSlot, SlotState};
use crate::agent::{AgentActor, AgentArgs, now_ms};
use crate::observe::{Channel, Observed, Subscription};

/// Host-wide settings.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub limits: Limits,
    /// An agent idle this long hibernates: it drops its in-memory log and its actor stops, leaving
    /// a compact core (~5–8 KB) in the registry until the next input wakes it. `None` never
    /// hibernates.
    pub hibernate_after: Option<Duration>,
    /// Restarts allowed within `restart_window` before an agent is marked failed.
    pub restart_max: u32,
    pub restart_window: Duration,
    /// How long `shutdown` and `dispose` wait for an agent to converge after cancelling it.
    pub stop_timeout: Duration,
}

impl Default for HostConfig {
    fn default() -> HostConfig {
        HostConfig {
            limits: Limits::DEFAULT,
            hibernate_after: Some(Duration::from_secs(30)),
            restart_max: 3,
            restart_window: Duration::from_secs(10),
            stop_timeout: Duration::from_secs(10),
        }
    }
}

/// Counters for reports (`dsh sim`).
#[derive(Debug, Default)]
pub struct Metrics {
    turns: AtomicU64,
    events: AtomicU64,
}

impl Metrics {
    pub(crate) fn turn_ended(&self) {
        self.turns.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn events_durable(&self, n: u64) {
        self.events.fetch_add(n, Ordering::Relaxed);
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

/// What every agent of a host shares.
pub(crate) struct Runtime {
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) providers: ProviderRegistry,
    pub(crate) tools: ToolRegistry,
    pub(crate) hooks: Hooks,
    pub(crate) config: HostConfig,
    pub(crate) observers: Channel,
    pub(crate) metrics: Arc<Metrics>,
}

/// How to make (or resume) one agent.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// The agent's id; minted when `None`.
    pub id: Option<SessionId>,
    pub config: AgentConfig,
    /// This agent's tools, layered over the host's.
    pub tools: ToolRegistry,
    /// This agent's hooks, after the host's.
    pub hooks: Hooks,
    /// Working directory recorded in the session header.
    pub cwd: Option<String>,
}

impl AgentSpec {
    pub fn new(config: AgentConfig) -> AgentSpec {
        AgentSpec {
            id: None,
            config,
            tools: ToolRegistry::new(),
            hooks: Hooks::new(),
            cwd: None,
        }
    }

    pub fn with_id(mut self, id: SessionId) -> AgentSpec {
        self.id = Some(id);
        self
    }
}

/// Why a host operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    #[error("agent {id} already exists")]
    AlreadyExists { id: SessionId },
    #[error("agent {id} not found")]
    NotFound { id: SessionId },
    #[error("agent {id} cannot resume: {reason}")]
    Resume { id: SessionId, reason: String },
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("the runtime failed to start an actor: {0}")]
    Spawn(String),
    #[error("the host is shut down")]
    ShutDown,
}

struct AgentRecord {
    slot: Arc<AgentSlot>,
    spec: AgentSpec,
    /// `spec.config`, shared with every core of this agent.
    config: Arc<AgentConfig>,
    /// Restart times within the window.
    restarts: Mutex<VecDeque<Instant>>,
}

pub(crate) struct Registry {
    runtime: Arc<Runtime>,
    agents: DashMap<SessionId, Arc<AgentRecord>>,
    by_actor: DashMap<ActorId, SessionId>,
    host_cell: OnceLock<ActorCell>,
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

/// Builds a host.
pub struct HostBuilder {
    store: Arc<dyn SessionStore>,
    providers: ProviderRegistry,
    tools: ToolRegistry,
    hooks: Hooks,
    config: HostConfig,
}

impl HostBuilder {
    pub fn providers(mut self, providers: ProviderRegistry) -> HostBuilder {
        self.providers = providers;
        self
    }

    pub fn tools(mut self, tools: ToolRegistry) -> HostBuilder {
        self.tools = tools;
        self
    }

    pub fn hooks(mut self, hooks: Hooks) -> HostBuilder {
        self.hooks = hooks;
        self
    }

    pub fn config(mut self, config: HostConfig) -> HostBuilder {
        self.config = config;
        self
    }

    /// Starts the host's supervisor actor.
    ///
    /// # Errors
    /// `HostError::Spawn` when the actor cannot start.
    pub async fn start(self) -> Result<Host, HostError> {
        let runtime = Arc::new(Runtime {
            observers: Channel::new(self.config.limits.subscriber_buffer_max),
            store: self.store,
            providers: self.providers,
            tools: self.tools,
            hooks: self.hooks,
            config: self.config,
            metrics: Arc::new(Metrics::default()),
        });
        let registry = Arc::new(Registry {
            runtime,
            agents: DashMap::new(),
            by_actor: DashMap::new(),
            host_cell: OnceLock::new(),
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
    pub fn builder(store: Arc<dyn SessionStore>) -> HostBuilder {
        HostBuilder {
            store,
            providers: ProviderRegistry::new(),
            tools: ToolRegistry::new(),
            hooks: Hooks::new(),
            config: HostConfig::default(),
        }
    }

    pub fn config(&self) -> &HostConfig {
        &self.registry.runtime.config
    }

    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.registry.runtime.store
    }

    pub fn metrics(&self) -> &Metrics {
        &self.registry.runtime.metrics
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
        let created = self.registry.runtime.store.create(&header).await;
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
        Ok(AgentHandle {
            slot: Arc::clone(&record.slot),
        })
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
            Ok(()) => Ok(AgentHandle {
                slot: Arc::clone(&record.slot),
            }),
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

    fn reserve(&self, id: &SessionId, spec: &AgentSpec) -> Result<Arc<AgentRecord>, HostError> {
        match self.registry.agents.entry(id.clone()) {
            Entry::Occupied(_) => Err(HostError::AlreadyExists { id: id.clone() }),
            Entry::Vacant(v) => {
                let record = Arc::new(AgentRecord {
                    slot: Arc::new(AgentSlot::new(
                        id.clone(),
                        self.registry.runtime.config.limits.subscriber_buffer_max,
                        Arc::downgrade(&self.registry),
                    )),
                    config: Arc::new(spec.config.clone()),
                    spec: spec.clone(),
                    restarts: Mutex::new(VecDeque::new()),
                });
                v.insert(Arc::clone(&record));
                Ok(record)
            }
        }
    }

    /// The live agent with this id.
    pub fn get(&self, id: &SessionId) -> Option<AgentHandle> {
        self.registry.agents.get(id).map(|r| AgentHandle {
            slot: Arc::clone(&r.slot),
        })
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
        Ok(())
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
        match record.slot.current() {
            SlotState::Live(actor, _) => {
                record.slot.set(SlotState::Restarting);
                self.registry.by_actor.remove(&actor.get_id());
                let _ = actor.kill_and_wait(Some(Duration::from_secs(10))).await;
            }
            SlotState::Dormant => {
                // Nothing runs; forget the dormant core and read the log back like a crash would.
                drop(record.slot.take_dormant());
                record.slot.set(SlotState::Restarting);
            }
            _ => {}
        }
        self.registry.restore(&record).await?;
        Ok(AgentHandle {
            slot: Arc::clone(&record.slot),
        })
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
    async fn spawn(&self, record: &Arc<AgentRecord>, core: AgentCore) -> Result<(), HostError> {
        let host_cell = self.host_cell.get().cloned().ok_or(HostError::ShutDown)?;
        let actor = AgentActor {
            runtime: Arc::clone(&self.runtime),
            slot: Arc::clone(&record.slot),
            hooks: self.runtime.hooks.layered(&record.spec.hooks),
            passivated: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        let (agent, _) = Actor::spawn_linked(None, actor, AgentArgs { core }, host_cell)
            .await
            .map_err(|e| HostError::Spawn(e.to_string()))?;
        // The actor published itself as `Live` in `pre_start`: it may already have passivated.
        self.by_actor.insert(agent.get_id(), record.slot.id.clone());
        Ok(())
    }

    /// Spawns an actor over a dormant agent's core (the caller took it from the slot).
    ///
    /// # Errors
    /// Why the actor could not start (the agent is then marked failed by the caller).
    pub(crate) async fn wake(&self, slot: &Arc<AgentSlot>, core: AgentCore) -> Result<(), String> {
        let record = self
            .agents
            .get(&slot.id)
            .map(|r| Arc::clone(&r))
            .ok_or_else(|| format!("agent {} is no longer registered", slot.id))?;
        self.spawn(&record, core).await.map_err(|e| e.to_string())
    }

    /// The durable log of an agent, read straight from the store.
    ///
    /// # Errors
    /// The store's failure, as text.
    pub(crate) async fn read_log(&self, id: &SessionId) -> Result<Vec<Event>, String> {
        // Read-only: the agent may wake and open a turn while this reads, which a repairing
        // `load` would close behind its back.
        self.runtime
            .store
            .inspect(id)
            .await
            .map(|found| found.events)
            .map_err(|e| e.to_string())
    }

    /// Reads the agent's log back (after any in-flight write of a previous instance landed), repairs
    /// it, and spawns a new actor over it.
    async fn restore(&self, record: &Arc<AgentRecord>) -> Result<(), HostError> {
        let id = record.slot.id.clone();
        drop(record.slot.write_fence.lock().await);
        let loaded = self.runtime.store.load(&id).await.map_err(|e| match e {
            StoreError::NotFound { id } => HostError::NotFound { id },
            e => HostError::Store(e),
        })?;
        let tools = self.runtime.tools.layered(&record.spec.tools);
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

    async fn stop_agent(&self, record: &Arc<AgentRecord>, keep_inbox: bool, timeout: Duration) {
        if keep_inbox && matches!(record.slot.current(), SlotState::Dormant) {
            // Dormant: no activity, everything durable, pending input kept. Nothing to stop.
            record.slot.set(SlotState::Disposed);
            return;
        }
        let handle = AgentHandle {
            slot: Arc::clone(&record.slot),
        };
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

    fn publish(&self, item: Observed) {
        if let Some(record) = self.agents.get(item.agent()) {
            record.slot.observers.publish(item.clone());
        }
        self.runtime.observers.publish(item);
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
            }
            _ => {}
        }
        Ok(())
    }
}
