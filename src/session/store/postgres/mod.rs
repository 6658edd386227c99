//! `PostgresStore`: session logs in PostgreSQL, shared by several nodes (SPEC §14). Compiled with
//! the `postgres` cargo feature.
//!
//! Client: `tokio-postgres` (the plain async protocol client: pipelined statements, no macros or
//! compile-time database), one dedicated write connection, and a small `deadpool-postgres` pool for
//! reads and lease changes (it reconnects what the server dropped).
//!
//! Schema and migrations: `schema.rs` (versioned, applied by `open` under an advisory lock). Events
//! are stored as their exact v0 JSON text under the primary key `(session_id, seq)`.
//!
//! The write path (`writer.rs`): appends and deletes are validated on the caller's task against the
//! session's next seq kept in memory, queued, and committed in groups across sessions, with
//! `synchronous_commit = on`; an append is acknowledged only after its group's `COMMIT` returned.
//!
//! Leases and fencing. A node writes a session only while it holds the session's lease, a row
//! `(node_id, epoch, expires_at)`. `create` takes it (epoch 1) in the same transaction that stores
//! the header, so unlike SQLite a created session is durable before its first append (it is still
//! not listed until it has an event). `load` — activation — takes it with the epoch raised by one,
//! which is allowed when the lease is free, expired, or already this node's; otherwise `load` fails
//! with `Fenced` naming the holder. `append` and `delete` on a session this node does not hold take
//! the lease the same way first. A background task renews every held lease each third of
//! `lease_ttl`, and marks fenced any the database no longer gives this node. `release` (and
//! `close`, for all) gives a lease up so another node can take it at once. Every append is fenced
//! in its own statement by the epoch it was queued under (`writer.rs`), so a node whose lease was
//! taken over can never append again: that append fails `Fenced`, and so does every later one until
//! a `load` takes the lease back.
//!
//! Failures poison only what they must: a group whose commit failed poisons the sessions in it (its
//! outcome is unknown; a `load` re-reads the truth and clears it), never the whole store.
//!
//! A paused node cannot stall a takeover: every connection sets
//! `idle_in_transaction_session_timeout` to half a lease, so a transaction left open by a node that
//! stopped running is ended by the server (its locks on the lease row go with it).
//!
//! The read path: `load` and `inspect` scan rows with `scan::Scanner` in `Damage::Corrupt` mode (a
//! committed PostgreSQL transaction cannot tear), like the SQLite store.

mod inbox;
mod schema;
mod writer;

pub use self::inbox::{INBOX_CHANNEL, InboxInput, InboxKind, InboxOutcome, InboxPut};

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, ManagerConfig, Pool};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls};
use tracing::{debug, info, warn};

use self::writer::{Op, Request};
use crate::ids::SessionId;
use crate::limits::Limits;
use crate::session::event::{Event, SessionHeader};
use crate::session::store::scan::{Damage, RowRef, Scanner, check_batch};
use crate::session::store::{
    EncodedEvent, Inspection, LoadedSession, SessionStore, SessionSummary, StoreError,
};

/// How a `PostgresStore` is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PostgresConfig {
    /// Bounds on what is written and read.
    pub limits: Limits,
    /// This node's id in the lease table. Default: `node-PID-RANDOM`, unique per process.
    pub node_id: String,
    /// How long a lease lasts without renewal (SPEC §14 `lease_ttl`). 10 s.
    pub lease_ttl: Duration,
    /// Renew held leases in the background (every third of `lease_ttl`). Tests turn it off to
    /// stand for a node that stopped.
    pub renew_leases: bool,
    /// Write requests queued for the writer at most. 8,192.
    pub queue_requests_max: usize,
    /// The most requests one commit group takes, however many are queued: the first agents of a
    /// burst hear that their events are durable while the writer commits the next group, instead of
    /// every agent waiting for one group of everything queued. 1,024.
    pub group_requests_max: usize,
    /// Pooled read connections at most. 4.
    pub readers_max: usize,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        let random = uuid::Uuid::new_v4().simple().to_string();
        PostgresConfig {
            limits: Limits::DEFAULT,
            node_id: format!("node-{}-{}", std::process::id(), &random[..8]),
            lease_ttl: Duration::from_secs(10),
            renew_leases: true,
            queue_requests_max: 8_192,
            group_requests_max: 1_024,
            readers_max: 4,
        }
    }
}

/// Counters of what the writer did. Monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostgresStats {
    /// Commit groups (transactions) run, successful or not.
    pub n_groups: u64,
    /// Requests that committed.
    pub n_requests_committed: u64,
    /// Events that committed.
    pub n_events_committed: u64,
}

#[derive(Default)]
struct Counters {
    n_groups: AtomicU64,
    n_requests_committed: AtomicU64,
    n_events_committed: AtomicU64,
}

/// Whether this node may write a session it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
enum HeldState {
    Writable,
    /// The lease was taken over or lost: every write fails `Fenced` with this reason.
    Fenced(String),
    /// A commit of this session failed, or its log moved: writes fail `Poisoned` until a `load`.
    Poisoned(String),
}

/// A session whose lease this node holds.
#[derive(Debug)]
struct Held {
    epoch: i64,
    /// The seq the next queued append must start at: one past every write queued under `epoch`.
    next_seq: u64,
    state: HeldState,
}

/// State shared by the store handle, the writer and the renewal task.
struct Shared {
    pg_config: tokio_postgres::Config,
    config: PostgresConfig,
    pool: Pool,
    held: Mutex<HashMap<SessionId, Held>>,
    /// Sessions this node released (hibernated), by the epoch it released: while the lease row
    /// still shows that epoch, nobody wrote the session since, and a dormant agent is current.
    released: Mutex<HashMap<SessionId, i64>>,
    /// One lock per session whose lease is being taken (or which is being created): two callers
    /// never race one session's epoch up twice, and takes of different sessions run side by side
    /// (as many as the reader pool has connections). An entry lives while its lock is held or
    /// waited for.
    taking: Mutex<HashMap<SessionId, Arc<tokio::sync::Mutex<()>>>>,
    closed: AtomicBool,
    counters: Counters,
}

fn io_error(op: &'static str, cause: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        op,
        cause: cause.to_string(),
    }
}

/// A PostgreSQL error with its SQLSTATE and the server's message when there is one.
fn pg_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// Opens one connection and drives it on its own task.
async fn connect(config: &tokio_postgres::Config, role: &str) -> Result<Client, String> {
    let (client, connection) = config.connect(NoTls).await.map_err(|e| pg_error(&e))?;
    let role = role.to_string();
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!(%role, error = %e, "a postgres connection ended");
        }
    });
    Ok(client)
}

/// A session's take lock, held (`Shared::taking`).
struct Taking<'a> {
    shared: &'a Shared,
    id: SessionId,
    _guard: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        let mut taking = self
            .shared
            .taking
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The map's reference and this guard's: nobody else holds or waits for the lock (a
        // waiter clones the entry under the map's lock, so it cannot appear meanwhile).
        if taking
            .get(&self.id)
            .is_some_and(|lock| Arc::strong_count(lock) == 2)
        {
            taking.remove(&self.id);
        }
    }
}

impl Shared {
    fn held(&self) -> MutexGuard<'_, HashMap<SessionId, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn released(&self) -> MutexGuard<'_, HashMap<SessionId, i64>> {
        self.released.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until no other take or create of `id` runs on this node, and holds that until the
    /// guard drops.
    async fn taking(&self, id: &SessionId) -> Taking<'_> {
        let lock = {
            let mut taking = self.taking.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(taking.entry(id.clone()).or_default())
        };
        Taking {
            shared: self,
            id: id.clone(),
            _guard: lock.lock_owned().await,
        }
    }

    fn set_state(&self, id: &SessionId, state: HeldState) {
        if let Some(h) = self.held().get_mut(id) {
            h.state = state;
        }
    }

    fn readable(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    async fn client(&self, op: &'static str) -> Result<deadpool_postgres::Object, StoreError> {
        self.pool.get().await.map_err(|e| io_error(op, e))
    }

    /// The lease row of `id`: holder (`None` when released) and epoch.
    async fn lease_holder(&self, id: &SessionId) -> Result<Option<(Option<String>, i64)>, String> {
        let client = self.pool.get().await.map_err(|e| e.to_string())?;
        let row = client
            .query_opt(
                "SELECT node_id, epoch FROM dsh_leases WHERE session_id = $1",
                &[&id.as_str()],
            )
            .await
            .map_err(|e| pg_error(&e))?;
        match row {
            None => Ok(None),
            Some(row) => Ok(Some((
                row.try_get(0).map_err(|e| e.to_string())?,
                row.try_get(1).map_err(|e| e.to_string())?,
            ))),
        }
    }

    /// One past the greatest stored seq of `id`.
    async fn stored_end(&self, id: &SessionId) -> Result<u64, String> {
        let client = self.pool.get().await.map_err(|e| e.to_string())?;
        let row = client
            .query_one(
                "SELECT max(seq) FROM dsh_events WHERE session_id = $1",
                &[&id.as_str()],
            )
            .await
            .map_err(|e| pg_error(&e))?;
        let max: Option<i64> = row.try_get(0).map_err(|e| e.to_string())?;
        Ok(max.map_or(0, |m| u64::try_from(m).map_or(0, |m| m.saturating_add(1))))
    }

    fn ttl_ms(&self) -> i64 {
        i64::try_from(self.config.lease_ttl.as_millis()).unwrap_or(i64::MAX)
    }
}

/// The PostgreSQL session store. See the module docs.
pub struct PostgresStore {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Request>,
    writer: Mutex<Option<JoinHandle<()>>>,
    renewer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("node_id", &self.shared.config.node_id)
            .finish_non_exhaustive()
    }
}

/// How often one append takes a lease again after a release raced it.
const RETAKES_MAX: usize = 4;

/// Renews every lease node `$1` holds by `$2` ms. The rows are locked in session-id byte order
/// first, the order in which the writer's group locks them (see `writer.rs`), so the two cannot
/// deadlock.
const RENEW_LEASES: &str = "\
    WITH mine AS (
        SELECT session_id FROM dsh_leases WHERE node_id = $1
        ORDER BY session_id COLLATE \"C\" FOR NO KEY UPDATE
    )
    UPDATE dsh_leases l SET expires_at = now() + $2::bigint * interval '1 millisecond'
    FROM mine WHERE l.session_id = mine.session_id AND l.node_id = $1
    RETURNING l.session_id, l.epoch";

/// Releases every lease node `$1` holds (a clean close), locking the rows in the same order.
const RELEASE_ALL: &str = "\
    WITH mine AS (
        SELECT session_id FROM dsh_leases WHERE node_id = $1
        ORDER BY session_id COLLATE \"C\" FOR NO KEY UPDATE
    )
    UPDATE dsh_leases l SET node_id = NULL, expires_at = now()
    FROM mine WHERE l.session_id = mine.session_id AND l.node_id = $1";

/// Takes the lease of `id` for `node` (epoch + 1) if it is free, expired or `node`'s already:
/// `$1` session, `$2` node, `$3` ttl in ms.
const TAKE_LEASE: &str = "\
    INSERT INTO dsh_leases (session_id, node_id, epoch, expires_at)
    VALUES ($1, $2, 1, now() + $3::bigint * interval '1 millisecond')
    ON CONFLICT (session_id) DO UPDATE
    SET node_id = EXCLUDED.node_id, epoch = dsh_leases.epoch + 1, expires_at = EXCLUDED.expires_at
    WHERE dsh_leases.node_id IS NULL OR dsh_leases.node_id = EXCLUDED.node_id
       OR dsh_leases.expires_at < now()
    RETURNING epoch";

impl PostgresStore {
    /// Connects to `url` (`postgres://…` or `key=value` settings), migrates the schema and starts
    /// the writer and the lease renewal.
    ///
    /// # Errors
    /// `Io` naming what failed: an invalid URL, an unreachable server, a schema newer than ours.
    pub async fn open(url: &str, config: PostgresConfig) -> Result<PostgresStore, StoreError> {
        let mut pg_config = tokio_postgres::Config::from_str(url)
            .map_err(|e| io_error("open", format!("invalid PostgreSQL URL: {e}")))?;
        if pg_config.get_application_name().is_none() {
            pg_config.application_name(format!("dsh {}", config.node_id));
        }
        // A node paused inside a transaction (SIGSTOP, a long GC-like stall) must not hold the row
        // locks a takeover needs: the server ends such a transaction after half a lease, so the
        // paused node's commit fails (its group is poisoned) and the other node takes over.
        if pg_config.get_options().is_none() {
            let idle_ms = (config.lease_ttl / 2).as_millis().max(250);
            pg_config.options(format!("-c idle_in_transaction_session_timeout={idle_ms}"));
        }
        if config.queue_requests_max == 0
            || config.group_requests_max == 0
            || config.readers_max == 0
        {
            return Err(io_error(
                "open",
                "queue_requests_max, group_requests_max and readers_max must be at least 1",
            ));
        }
        let manager = Manager::from_config(pg_config.clone(), NoTls, ManagerConfig::default());
        let pool = Pool::builder(manager)
            .max_size(config.readers_max)
            .build()
            .map_err(|e| io_error("open", e))?;
        let shared = Arc::new(Shared {
            pg_config,
            config,
            pool,
            held: Mutex::new(HashMap::new()),
            released: Mutex::new(HashMap::new()),
            taking: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let mut migrator = connect(&shared.pg_config, "migrate")
            .await
            .map_err(|e| io_error("open", format!("cannot connect to PostgreSQL: {e}")))?;
        let applied = schema::migrate(&mut migrator)
            .await
            .map_err(|e| io_error("open", format!("schema migration failed: {e}")))?;
        drop(migrator);
        if !applied.is_empty() {
            info!(?applied, "postgres store schema migrated");
        }
        let conn = writer::connect_writer(&shared)
            .await
            .map_err(|e| io_error("open", format!("cannot open the write connection: {e}")))?;
        let (tx, rx) = mpsc::channel(shared.config.queue_requests_max);
        let writer = tokio::spawn(writer::run_writer(Arc::clone(&shared), rx, conn));
        let renewer = shared
            .config
            .renew_leases
            .then(|| tokio::spawn(renew_leases(Arc::downgrade(&shared))));
        Ok(PostgresStore {
            shared,
            tx,
            writer: Mutex::new(Some(writer)),
            renewer: Mutex::new(renewer),
        })
    }

    /// This node's id in the lease table.
    pub fn node_id(&self) -> &str {
        &self.shared.config.node_id
    }

    /// How long a lease lasts without renewal.
    pub fn lease_ttl(&self) -> Duration {
        self.shared.config.lease_ttl
    }

    /// The schema version this program writes.
    pub fn schema_version() -> i32 {
        schema::current_version()
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> PostgresStats {
        let c = &self.shared.counters;
        PostgresStats {
            n_groups: c.n_groups.load(Ordering::SeqCst),
            n_requests_committed: c.n_requests_committed.load(Ordering::SeqCst),
            n_events_committed: c.n_events_committed.load(Ordering::SeqCst),
        }
    }

    /// Write requests queued for the writer and not yet taken into a group.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// The lease epoch this node holds for `id`, if it holds one.
    pub fn held_epoch(&self, id: &SessionId) -> Option<u64> {
        self.shared
            .held()
            .get(id)
            .and_then(|h| u64::try_from(h.epoch).ok())
    }

    /// Whether what this node knows of session `id` is current: it holds the lease and may write,
    /// or it released the lease itself and no node took it since (the lease row still shows the
    /// epoch it released). False after a takeover, a fence or a failed commit: an agent this node
    /// keeps for the session (dormant or failed) is stale and must be read back from the store.
    ///
    /// # Errors
    /// `Io` when the lease row cannot be read; `Closed`.
    pub async fn is_current(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.shared.readable()?;
        if let Some(h) = self.shared.held().get(id) {
            return Ok(h.state == HeldState::Writable);
        }
        let Some(released) = self.shared.released().get(id).copied() else {
            return Ok(false);
        };
        let holder = self
            .shared
            .lease_holder(id)
            .await
            .map_err(|e| io_error("lease", e))?;
        Ok(match holder {
            Some((node, epoch)) => {
                epoch == released && node.is_none_or(|n| n == self.shared.config.node_id)
            }
            None => false,
        })
    }

    /// Whether this node knows it lost `id`'s lease to another node (a takeover after its lease
    /// lapsed): every write of the session here fails `Fenced` until a `load` takes it back.
    pub fn is_fenced(&self, id: &SessionId) -> bool {
        self.shared
            .held()
            .get(id)
            .is_some_and(|h| matches!(h.state, HeldState::Fenced(_)))
    }

    /// Gives up `id`'s lease if this node holds it, at `epoch` when one is given.
    async fn release_held(&self, id: &SessionId, epoch: Option<i64>) -> Result<(), StoreError> {
        self.shared.readable()?;
        // Through the writer, after every write queued before it; a write queued after it finds
        // no lease held and takes it again (a higher epoch), which makes this release a no-op.
        let permit = self.tx.reserve().await.map_err(|_| StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        {
            let mut held = self.shared.held();
            let Some(h) = held.get(id) else {
                return Ok(());
            };
            if epoch.is_some_and(|e| e != h.epoch) {
                // A later take (a quick wake) holds the lease now: it is not this release's.
                debug!(session = %id, held = h.epoch, asked = ?epoch, "release of an older epoch skipped");
                return Ok(());
            }
            let epoch = h.epoch;
            held.remove(id);
            self.shared.released().insert(id.clone(), epoch);
            permit.send(Request {
                op: Op::Release {
                    id: id.clone(),
                    epoch,
                },
                reply,
            });
            debug!(session = %id, epoch, "lease released");
        }
        Self::answer(answer).await
    }

    /// Commits everything queued, stops the writer and the renewal, releases every lease this node
    /// holds, and closes the connections. Later calls return `Closed`. Idempotent.
    ///
    /// # Errors
    /// `Io` when the leases cannot be released (they then expire after `lease_ttl`).
    pub async fn close(&self) -> Result<(), StoreError> {
        let was_closed = self.shared.closed.swap(true, Ordering::SeqCst);
        if was_closed {
            return Ok(());
        }
        let (reply, answer) = oneshot::channel();
        if self
            .tx
            .send(Request {
                op: Op::Close,
                reply,
            })
            .await
            .is_ok()
        {
            let _ = answer.await;
        }
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = writer {
            let _ = task.await;
        }
        let renewer = self
            .renewer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = renewer {
            task.abort();
        }
        let released = async {
            let client = self.shared.client("close").await?;
            client
                .execute(RELEASE_ALL, &[&self.shared.config.node_id])
                .await
                .map_err(|e| io_error("close", pg_error(&e)))
        }
        .await;
        self.shared.held().clear();
        self.shared.pool.close();
        released.map(|_| ())
    }

    /// Takes the lease of `id` (epoch + 1) and records the stored end. `Fenced` when another node
    /// holds a live lease; `NotFound` when no such session is stored.
    async fn take(&self, id: &SessionId) -> Result<(SessionHeader, i64), StoreError> {
        let _taking = self.shared.taking(id).await;
        let op = "take lease";
        let mut client = self.shared.client(op).await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| io_error(op, pg_error(&e)))?;
        // The three statements go out pipelined, one round trip instead of three; the server still
        // runs them in order (the header's row locked before the lease is taken). On `NotFound` or
        // a lease held elsewhere the transaction rolls back, so a lease row the upsert made for no
        // session, or the read of its end, is never kept.
        let (header, lease, end) = futures::future::join3(
            read_header(
                &tx,
                "SELECT header FROM dsh_sessions WHERE id = $1 FOR SHARE",
                id,
                op,
            ),
            take_lease(&tx, &self.shared, id, op),
            tx.query_one(
                "SELECT max(seq) FROM dsh_events WHERE session_id = $1",
                &[&id.as_str()],
            ),
        )
        .await;
        let header = header?.ok_or_else(|| StoreError::NotFound { id: id.clone() })?;
        let Some(epoch) = lease? else {
            let holder = tx
                .query_opt(
                    "SELECT node_id, epoch, greatest(0, extract(epoch FROM expires_at - now()))::float8 \
                     FROM dsh_leases WHERE session_id = $1",
                    &[&id.as_str()],
                )
                .await
                .map_err(|e| io_error(op, pg_error(&e)))?;
            let mut left = None;
            let reason = match holder {
                Some(row) => {
                    let node: Option<String> = row.try_get(0).unwrap_or(None);
                    let epoch: i64 = row.try_get(1).unwrap_or(0);
                    let secs: f64 = row.try_get(2).unwrap_or(0.0);
                    left = Duration::try_from_secs_f64(secs).ok();
                    format!(
                        "hosted by node {} (lease epoch {epoch}, {secs:.1} s left)",
                        node.as_deref().unwrap_or("?")
                    )
                }
                None => "its lease could not be taken".to_string(),
            };
            return Err(StoreError::Fenced {
                id: id.clone(),
                reason,
                left,
            });
        };
        let end = end.map_err(|e| io_error(op, pg_error(&e)))?;
        let max: Option<i64> = end.try_get(0).map_err(|e| io_error(op, e))?;
        tx.commit().await.map_err(|e| io_error(op, pg_error(&e)))?;
        let next_seq = max.map_or(0, |m| u64::try_from(m).map_or(0, |m| m.saturating_add(1)));
        self.shared.held().insert(
            id.clone(),
            Held {
                epoch,
                next_seq,
                state: HeldState::Writable,
            },
        );
        self.shared.released().remove(id);
        debug!(session = %id, epoch, "lease taken");
        Ok((header, epoch))
    }

    /// Makes sure this node holds `id`'s lease (taking it if not).
    async fn ensure_held(&self, id: &SessionId) -> Result<(), StoreError> {
        if self.shared.held().contains_key(id) {
            return Ok(());
        }
        self.take(id).await.map(|_| ())
    }

    /// Reserves `events` at the session's next seq and queues them; returns the answer to await,
    /// or gives the events back when this node does not hold the lease (a release raced).
    async fn queue_append(
        &self,
        id: &SessionId,
        events: Vec<EncodedEvent>,
        expected_end: Option<u64>,
    ) -> Result<Result<oneshot::Receiver<Result<(), StoreError>>, Vec<EncodedEvent>>, StoreError>
    {
        let permit = self.tx.reserve().await.map_err(|_| StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        let mut held = self.shared.held();
        let Some(h) = held.get_mut(id) else {
            return Ok(Err(events));
        };
        match &h.state {
            HeldState::Writable => {}
            HeldState::Fenced(reason) => {
                return Err(StoreError::Fenced {
                    id: id.clone(),
                    reason: reason.clone(),
                    left: None,
                });
            }
            HeldState::Poisoned(cause) => {
                return Err(StoreError::Poisoned {
                    cause: cause.clone(),
                });
            }
        }
        let Some(first) = events.first().map(|e| e.seq) else {
            return Err(io_error("append", "an empty batch cannot be queued"));
        };
        if let Some(end) = expected_end
            && end != h.next_seq
        {
            return Err(StoreError::SeqMismatch {
                id: id.clone(),
                expected: h.next_seq,
                got: end,
            });
        }
        if first != h.next_seq && expected_end.is_none() {
            return Err(StoreError::SeqMismatch {
                id: id.clone(),
                expected: h.next_seq,
                got: first,
            });
        }
        let end = first.saturating_add(events.len() as u64);
        let n_events_max = self.shared.config.limits.session_events_max as u64;
        if end > n_events_max {
            return Err(StoreError::LogTooLong {
                id: id.clone(),
                n_events_max,
            });
        }
        h.next_seq = end;
        permit.send(Request {
            op: Op::Append {
                id: id.clone(),
                epoch: h.epoch,
                events,
            },
            reply,
        });
        Ok(Ok(answer))
    }

    async fn answer(rx: oneshot::Receiver<Result<(), StoreError>>) -> Result<(), StoreError> {
        rx.await.unwrap_or(Err(StoreError::Closed))
    }

    /// Reads the header and scans the rows of `id` (no writes, no lease).
    async fn scan(
        &self,
        id: &SessionId,
    ) -> Result<(SessionHeader, crate::session::store::scan::Scanned), StoreError> {
        self.shared.readable()?;
        let op = "load";
        let client = self.shared.client(op).await?;
        let header = read_header(&client, HEADER, id, op)
            .await?
            .ok_or_else(|| StoreError::NotFound { id: id.clone() })?;
        let limits = &self.shared.config.limits;
        let bytes_max = i32::try_from(limits.event_bytes_max).unwrap_or(i32::MAX);
        let rows_max = i64::try_from(Scanner::rows_to_read_max(limits)).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT seq, kind, octet_length(json), \
                        CASE WHEN octet_length(json) <= $2 THEN json END \
                 FROM dsh_events WHERE session_id = $1 ORDER BY seq LIMIT $3",
                &[&id.as_str(), &bytes_max, &rows_max],
            )
            .await
            .map_err(|e| io_error(op, pg_error(&e)))?;
        let mut scanner = Scanner::new(id.clone(), limits, Damage::Corrupt);
        for row in &rows {
            let seq: Option<i64> = row.try_get(0).ok();
            let kind: Option<&str> = row.try_get(1).ok();
            let bytes: Option<i32> = row.try_get(2).ok().flatten();
            let json: Option<&str> = row.try_get(3).ok().flatten();
            scanner.push(RowRef {
                seq: seq.and_then(|s| u64::try_from(s).ok()),
                kind,
                bytes: bytes.and_then(|b| u64::try_from(b).ok()).unwrap_or(0),
                json: json.map(str::as_bytes),
            })?;
        }
        Ok((header, scanner.finish()?))
    }
}

/// The query of a session's header row.
const HEADER: &str = "SELECT header FROM dsh_sessions WHERE id = $1";

/// Reads session `id`'s header with `sql` (`HEADER`, or it with a row lock) on a connection or in a
/// transaction; `None` when there is no such session.
/// Runs `TAKE_LEASE` for `id` on this node: the new epoch, or `None` when another node holds a
/// live lease.
async fn take_lease<C: deadpool_postgres::GenericClient>(
    client: &C,
    shared: &Shared,
    id: &SessionId,
    op: &'static str,
) -> Result<Option<i64>, StoreError> {
    let row = client
        .query_opt(
            TAKE_LEASE,
            &[&id.as_str(), &shared.config.node_id, &shared.ttl_ms()],
        )
        .await
        .map_err(|e| io_error(op, pg_error(&e)))?;
    row.map(|r| r.try_get(0).map_err(|e| io_error(op, e)))
        .transpose()
}

async fn read_header<C: deadpool_postgres::GenericClient>(
    client: &C,
    sql: &str,
    id: &SessionId,
    op: &'static str,
) -> Result<Option<SessionHeader>, StoreError> {
    let row = client
        .query_opt(sql, &[&id.as_str()])
        .await
        .map_err(|e| io_error(op, pg_error(&e)))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let json: String = row.try_get(0).map_err(|e| io_error(op, e))?;
    parse_header(id, &json).map(Some)
}

fn parse_header(id: &SessionId, json: &str) -> Result<SessionHeader, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt {
        id: id.clone(),
        seq: 0,
        reason: format!("the stored session header is invalid: {e}"),
    })
}

/// Renews every lease this node holds each third of `lease_ttl`; a lease the database no longer
/// gives this node (taken over after it lapsed) is marked fenced, so writes fail at once.
async fn renew_leases(shared: Weak<Shared>) {
    let every = match shared.upgrade() {
        Some(s) => s.config.lease_ttl / 3,
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        let before: Vec<(SessionId, i64)> = shared
            .held()
            .iter()
            .filter(|(_, h)| h.state == HeldState::Writable)
            .map(|(id, h)| (id.clone(), h.epoch))
            .collect();
        let renewed = async {
            let client = shared.pool.get().await.map_err(|e| e.to_string())?;
            client
                .query(RENEW_LEASES, &[&shared.config.node_id, &shared.ttl_ms()])
                .await
                .map_err(|e| pg_error(&e))
        }
        .await;
        let rows = match renewed {
            Ok(rows) => rows,
            Err(e) => {
                warn!(error = %e, "renewing leases failed; retrying");
                continue;
            }
        };
        let mut still: HashMap<String, i64> = HashMap::with_capacity(rows.len());
        for row in &rows {
            if let (Ok(id), Ok(epoch)) = (row.try_get::<_, String>(0), row.try_get::<_, i64>(1)) {
                still.insert(id, epoch);
            }
        }
        let mut held = shared.held();
        for (id, epoch) in before {
            if still.get(id.as_str()) != Some(&epoch)
                && let Some(h) = held.get_mut(&id)
                && h.epoch == epoch
            {
                warn!(session = %id, epoch, "lease lost to another node; fencing");
                h.state =
                    HeldState::Fenced(format!("this node's lease at epoch {epoch} was taken over"));
            }
        }
    }
}

#[async_trait]
impl SessionStore for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
        self.shared.readable()?;
        let op = "create";
        let id = &header.id;
        let json = serde_json::to_string(header).map_err(|e| io_error(op, e))?;
        let created_at = i64::try_from(header.created_at).unwrap_or(i64::MAX);
        let _taking = self.shared.taking(id).await;
        let mut client = self.shared.client(op).await?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| io_error(op, pg_error(&e)))?;
        // Pipelined, one round trip for both; when the session exists, the transaction rolls back
        // and the lease is as it was.
        let (inserted, lease) = futures::future::join(
            tx.execute(
                "INSERT INTO dsh_sessions (id, created_at, header) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO NOTHING",
                &[&id.as_str(), &created_at, &json],
            ),
            // A lease row left by a deleted session of the same id keeps its epoch growing.
            take_lease(&tx, &self.shared, id, op),
        )
        .await;
        if inserted.map_err(|e| io_error(op, pg_error(&e)))? == 0 {
            return Err(StoreError::AlreadyExists { id: id.clone() });
        }
        let Some(epoch) = lease? else {
            return Err(StoreError::AlreadyExists { id: id.clone() });
        };
        tx.commit().await.map_err(|e| io_error(op, pg_error(&e)))?;
        self.shared.held().insert(
            id.clone(),
            Held {
                epoch,
                next_seq: 0,
                state: HeldState::Writable,
            },
        );
        Ok(())
    }

    async fn append(&self, id: &SessionId, events: Vec<EncodedEvent>) -> Result<(), StoreError> {
        self.shared.readable()?;
        check_batch(id, &events, &self.shared.config.limits)?;
        self.ensure_held(id).await?;
        if events.is_empty() {
            return Ok(());
        }
        let mut events = events;
        // A release (hibernation) may race this append between the take and the queueing: take
        // the lease again, a bounded number of times.
        for _ in 0..RETAKES_MAX {
            match self.queue_append(id, events, None).await? {
                Ok(answer) => return Self::answer(answer).await,
                Err(back) => events = back,
            }
            self.ensure_held(id).await?;
        }
        Err(StoreError::Fenced {
            id: id.clone(),
            reason: format!("its lease was released {RETAKES_MAX} times during one append"),
            left: None,
        })
    }

    async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        self.shared.readable()?;
        self.take(id).await?;
        let (header, scanned) = self.scan(id).await?;
        if !scanned.needs_repair() {
            return Ok(LoadedSession {
                header,
                events: scanned.events,
                n_repaired: 0,
            });
        }
        let closers = scanned.encoded_closers();
        match self
            .queue_append(id, closers, Some(scanned.raw_end))
            .await?
        {
            Ok(answer) => Self::answer(answer).await?,
            Err(_) => {
                return Err(StoreError::Fenced {
                    id: id.clone(),
                    reason: "its lease was released during the load".to_string(),
                    left: None,
                });
            }
        }
        let n_repaired = scanned.closers.len();
        let mut events = scanned.events;
        events.extend(scanned.closers);
        Ok(LoadedSession {
            header,
            events,
            n_repaired,
        })
    }

    async fn inspect(&self, id: &SessionId) -> Result<Inspection, StoreError> {
        let (header, scanned) = self.scan(id).await?;
        Ok(Inspection {
            header,
            events: scanned.events,
            closers: scanned.closers,
            torn_tail: scanned.torn_tail,
        })
    }

    async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.shared.readable()?;
        let op = "list";
        let client = self.shared.client(op).await?;
        let rows = client
            .query(
                "SELECT s.id, s.header, e.seq, e.json FROM dsh_sessions s \
                 JOIN LATERAL (SELECT seq, json FROM dsh_events WHERE session_id = s.id \
                               ORDER BY seq DESC LIMIT 1) e ON true \
                 ORDER BY s.ord",
                &[],
            )
            .await
            .map_err(|e| io_error(op, pg_error(&e)))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in &rows {
            let id: String = row.try_get(0).map_err(|e| io_error(op, e))?;
            let header_json: String = row.try_get(1).map_err(|e| io_error(op, e))?;
            let last_seq: i64 = row.try_get(2).map_err(|e| io_error(op, e))?;
            let last_json: String = row.try_get(3).map_err(|e| io_error(op, e))?;
            match serde_json::from_str::<SessionHeader>(&header_json) {
                Ok(header) => out.push(SessionSummary {
                    header,
                    n_events: u64::try_from(last_seq).map_or(0, |s| s.saturating_add(1)),
                    last_time: Event::from_json(&last_json).ok().map(|e| e.time),
                }),
                Err(e) => {
                    warn!(session = %id, error = %e, "not listing a session with an invalid header");
                }
            }
        }
        Ok(out)
    }

    async fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.shared.readable()?;
        match self.ensure_held(id).await {
            Ok(()) => {}
            Err(StoreError::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(e),
        }
        let permit = self.tx.reserve().await.map_err(|_| StoreError::Closed)?;
        let (reply, answer) = oneshot::channel();
        {
            let mut held = self.shared.held();
            let Some(h) = held.get(id) else {
                return Ok(false);
            };
            if let HeldState::Fenced(reason) = &h.state {
                return Err(StoreError::Fenced {
                    id: id.clone(),
                    reason: reason.clone(),
                    left: None,
                });
            }
            let epoch = h.epoch;
            held.remove(id);
            permit.send(Request {
                op: Op::Delete {
                    id: id.clone(),
                    epoch,
                },
                reply,
            });
        }
        Self::answer(answer).await?;
        Ok(true)
    }

    async fn header(&self, id: &SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.shared.readable()?;
        let op = "header";
        let client = self.shared.client(op).await?;
        read_header(&client, HEADER, id, op).await
    }

    async fn release(&self, id: &SessionId) -> Result<(), StoreError> {
        self.release_held(id, None).await
    }

    fn lease_epoch(&self, id: &SessionId) -> Option<u64> {
        self.held_epoch(id)
    }

    async fn release_epoch(&self, id: &SessionId, epoch: u64) -> Result<(), StoreError> {
        self.release_held(id, i64::try_from(epoch).ok()).await
    }
}
