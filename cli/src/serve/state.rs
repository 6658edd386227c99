//! `AppState`: what every handler shares — the host, its store, the defaults new agents get, the
//! token, the drain flag — and how a request reaches an agent by id.
//!
//! An agent that is stored but not live (after a server restart) is resumed on first use with the
//! spec its log records (the last `request/header`'s model, system prompt and output cap, the
//! header's working directory), falling back to the server's defaults for what the log does not
//! say; an id that is neither is 404. Inputs to one session are serialised by a per-session lock so
//! that the idempotency check (has this message id been spliced already?) and the send are one
//! step: two concurrent requests with the same id never both apply. A lock lives only while some
//! request holds or waits for it, so the map of locks is as large as the inputs in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use dsh::SessionId;
use dsh::session::log::fold_request_header;
use dsh::session::store::Inspection;
use dsh::session::store::postgres::PostgresStore;
use dsh::turn::AgentConfig;
use dsh_actors::{AgentHandle, AgentSpec, Host, HostError};

use crate::stored::Opened;
use tokio_util::sync::CancellationToken;

use super::applied::AppliedIds;
use super::auth::Token;
use super::error::ApiError;
use super::metrics::ServerMetrics;

/// What a new agent gets unless its create request says otherwise.
#[derive(Clone, Debug)]
pub struct AgentDefaults {
    /// The one registered provider's name.
    pub provider: String,
    /// The model id.
    pub model: String,
    /// Output cap per request.
    pub max_tokens: Option<u64>,
    /// The system prompt.
    pub system: Option<String>,
    /// The working directory recorded in new sessions' headers.
    pub cwd: Option<String>,
}

impl AgentDefaults {
    /// A spec for an agent with these defaults.
    pub fn spec(&self) -> AgentSpec {
        let mut config = AgentConfig::new(&self.provider, &self.model);
        config.max_tokens = self.max_tokens;
        config.system = self.system.clone();
        let mut spec = AgentSpec::new(config);
        spec.cwd = self.cwd.clone();
        spec
    }

    /// The spec that resumes the stored session `stored`: what its log records, else these
    /// defaults. A session recorded with another provider than the server's keeps its system prompt
    /// and output cap but runs the server's provider and model (the only one registered).
    pub fn resumed_spec(&self, stored: &Inspection) -> AgentSpec {
        let mut spec = self.spec();
        if let Some(header) = fold_request_header(&stored.events, None) {
            if header.config.provider == self.provider && !header.config.model.is_empty() {
                spec.config.model = header.config.model;
            }
            spec.config.max_tokens = header.config.max_tokens.or(self.max_tokens);
            spec.config.system = header.system;
        }
        if stored.header.cwd.is_some() {
            spec.cwd = stored.header.cwd.clone();
        }
        spec
    }
}

/// Settings of the server itself (not of its agents).
#[derive(Clone, Debug)]
pub struct ServerSettings {
    /// Interval of the keep-alive comments on event streams.
    pub keep_alive: Duration,
    /// How long running turns may finish after SIGTERM/SIGINT before they are cancelled.
    pub drain_timeout: Duration,
    /// The most event streams open at once; past it a new one gets 503 `too_many_streams`.
    pub max_streams: usize,
}

/// The state every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The shared parts.
    pub inner: Arc<Shared>,
}

/// The parts of `AppState`.
pub struct Shared {
    /// The runtime.
    pub host: Host,
    /// The host's store (for listing, export and import).
    pub store: Opened,
    /// Defaults of new and resumed agents.
    pub defaults: AgentDefaults,
    /// The bearer token every `/v1` request must carry, if one is set.
    pub token: Option<Token>,
    /// Server settings.
    pub settings: ServerSettings,
    /// Set once a drain began: new input gets 503.
    pub draining: AtomicBool,
    /// Cancelled when event streams must end (the host has stopped).
    pub streams_end: CancellationToken,
    /// One permit per event stream that may open (`ServerSettings::max_streams`).
    pub streams: Arc<tokio::sync::Semaphore>,
    /// The figures `/metrics` exports.
    pub metrics: Arc<ServerMetrics>,
    /// Message ids each session's inbox took, for answering a repeated client-chosen id.
    pub applied: AppliedIds,
    /// One lock per session, held across an input's idempotency check and its send.
    input_locks: DashMap<SessionId, Arc<tokio::sync::Mutex<()>>>,
}

impl AppState {
    /// The state over a started host; `metrics` is shared with the store the host writes through
    /// (see `MeteredStore`).
    pub fn new(
        host: Host,
        store: Opened,
        defaults: AgentDefaults,
        token: Option<Token>,
        settings: ServerSettings,
        metrics: Arc<ServerMetrics>,
    ) -> AppState {
        let streams = Arc::new(tokio::sync::Semaphore::new(settings.max_streams));
        AppState {
            inner: Arc::new(Shared {
                host,
                store,
                defaults,
                token,
                settings,
                draining: AtomicBool::new(false),
                streams_end: CancellationToken::new(),
                streams,
                metrics,
                applied: AppliedIds::default(),
                input_locks: DashMap::new(),
            }),
        }
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.inner.host
    }

    /// The store.
    pub fn store(&self) -> &Opened {
        &self.inner.store
    }

    /// The PostgreSQL store when this node is one of several on one database (SPEC §14).
    pub fn cluster(&self) -> Option<&Arc<PostgresStore>> {
        match &self.inner.store {
            Opened::Postgres(pg) => Some(pg),
            Opened::Sqlite(_) => None,
        }
    }

    /// Whether a drain began.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// Refuses new input while draining.
    ///
    /// # Errors
    /// 503 `draining`.
    pub fn accepting(&self) -> Result<(), ApiError> {
        if self.is_draining() {
            Err(ApiError::draining())
        } else {
            Ok(())
        }
    }

    /// Takes the lock that serialises inputs to `id`, waiting for it; released when the guard drops.
    pub async fn lock_input(&self, id: &SessionId) -> InputGuard {
        let lock = Arc::clone(
            self.inner
                .input_locks
                .entry(id.clone())
                .or_default()
                .value(),
        );
        InputGuard {
            guard: Some(lock.lock_owned().await),
            state: self.clone(),
            id: id.clone(),
        }
    }

    /// Sessions with an input lock now (held or waited for).
    pub fn n_input_locks(&self) -> usize {
        self.inner.input_locks.len()
    }

    /// The agent `id`: live, or resumed from the store with the spec its log records.
    ///
    /// # Errors
    /// 400 for an invalid id, 404 when no such session is live or stored, else the host's failure.
    pub async fn agent(&self, id: &str) -> Result<AgentHandle, ApiError> {
        let id = parse_session_id(id)?;
        if let Some(handle) = self.host().get(&id) {
            let Some(pg) = self.cluster() else {
                return Ok(handle);
            };
            // Several nodes (SPEC §14): an agent kept here (hibernated, or failed when its lease
            // was taken over) is stale once another node wrote the session; it is forgotten and
            // read back from the store (which, while that node's lease lives, is hosted_elsewhere).
            let current = pg
                .is_current(&id)
                .await
                .map_err(|e| ApiError::from_store(&e))?;
            if current {
                return Ok(handle);
            }
            if !self.host().evict(&id) {
                // Live here, but another node took the session over (this one was paused past
                // its lease): it can never write again. Stop it — its writes fail at once — and
                // read the session back, instead of refusing this request.
                if !pg.is_fenced(&id) {
                    return Ok(handle);
                }
                let stop = self
                    .host()
                    .config()
                    .stop_timeout
                    .min(Duration::from_secs(2));
                if tokio::time::timeout(stop, self.host().dispose(&id))
                    .await
                    .is_err()
                {
                    return Ok(handle);
                }
            }
            tracing::debug!(session = %id, "a stale agent of another node's session forgotten");
        }
        // Read back from the log: the index of applied ids is rebuilt from it too (another node
        // may have applied ids since this one last indexed the session).
        self.inner.applied.forget(&id);
        let stored = self
            .store()
            .inspect(&id)
            .await
            .map_err(|e| ApiError::from_store(&e))?;
        let spec = self.inner.defaults.resumed_spec(&stored);
        match self.host().resume(&id, spec).await {
            Ok(handle) => Ok(handle),
            Err(HostError::NotFound { .. }) => Err(ApiError::session_not_found(id.as_str())),
            Err(e) => Err(ApiError::from_host(&e)),
        }
    }
}

/// What a read request reads: the live agent, or — when another node hosts the session (SPEC §14)
/// — the durable log straight from the store, without taking the lease.
pub enum ReadTarget {
    /// The agent, live on this node (resumed if it was not).
    Live(AgentHandle),
    /// The session's durable log, hosted by another node.
    Elsewhere(Box<dsh::session::store::Inspection>),
}

impl AppState {
    /// The agent `id` for a read, or its stored log when another node holds its lease.
    ///
    /// # Errors
    /// As `agent`, except that a session hosted elsewhere is read, not refused.
    pub async fn read_target(&self, id: &str) -> Result<ReadTarget, ApiError> {
        let sid = parse_session_id(id)?;
        match self.agent(id).await {
            Ok(handle) => Ok(ReadTarget::Live(handle)),
            Err(e) if e.code == "hosted_elsewhere" => self
                .store()
                .inspect(&sid)
                .await
                .map(|stored| ReadTarget::Elsewhere(Box::new(stored)))
                .map_err(|e| ApiError::from_store(&e)),
            Err(e) => Err(e),
        }
    }
}

/// The input lock of one session, held. Dropping it releases the lock and, when no other request
/// holds or waits for it, removes it from the map.
pub struct InputGuard {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    state: AppState,
    id: SessionId,
}

impl Drop for InputGuard {
    fn drop(&mut self) {
        // Release our reference first: the entry may go only when the map's is the last one. A
        // request that wants the lock clones it under the map's shard lock, which `remove_if`
        // holds while it checks, so an entry someone waits for is never removed.
        drop(self.guard.take());
        self.state
            .inner
            .input_locks
            .remove_if(&self.id, |_, lock| Arc::strong_count(lock) == 1);
    }
}

/// A session id from a path or body.
///
/// # Errors
/// 400 `bad_request` naming the id's problem.
pub fn parse_session_id(id: &str) -> Result<SessionId, ApiError> {
    SessionId::new(id).map_err(|e| ApiError::bad_request(format!("session id: {e}")))
}
