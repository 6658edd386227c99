//! `SqliteStore`: the default session store — one SQLite database under the data directory holding
//! every session, written by one writer with group commit across all sessions.
//!
//! Files in the data directory (created 0700): `sessions.sqlite3` (+ its `-wal` and `-shm`, WAL mode,
//! `synchronous=FULL`) and `sessions.lock`, which the open store holds an exclusive lock on, so that
//! exactly one process writes the database and the in-memory next-seq cache below cannot go stale.
//!
//! Schema: `sessions(id PRIMARY KEY, created_at, header)` — one row per materialized session, its
//! header as JSON, rowid order = materialization order — and `events(session_id, seq, kind, json)`
//! with primary key `(session_id, seq)`, the event's v0 JSON as the record and its type in `kind`.
//! `events` is a rowid table on purpose: rows land in append order at the end of the table b-tree,
//! and only the small primary-key index is ordered by session. A `WITHOUT ROWID` table ordered by
//! session would dirty one leaf page per appending session in every commit and write ~1 KiB rows
//! into overflow pages; with 1,024 appenders that measured 3–5x slower.
//!
//! The write path. `create` only registers a header in memory; the first `append` commits the header
//! together with the events. Every write — append, load repair, delete — is validated by the caller's
//! task against the per-session next seq kept in memory (loaded from the database on first touch),
//! reserved, and queued on a bounded channel (plus a byte budget). One async *writer* task
//! (`sqlite/writer.rs`) owns the queue and the write connection: it takes everything queued (all
//! sessions), runs one blocking commit job on tokio's blocking pool — one `BEGIN IMMEDIATE …
//! COMMIT`, so one WAL fsync for the whole group — answers every request, and only then takes the
//! next group; requests that arrive during a commit form the next group. There is no timer: a lone
//! append is committed at once. The commit runs under `spawn_blocking`, never on a thread of our
//! own, so tests with tokio's paused clock keep working (STYLE §5, tokio#5115).
//!
//! Poisoning. If anything in a commit fails (a write, `COMMIT`, the fsync, a checkpoint), that group's
//! waiters get `Io` and the store refuses every later write with `Poisoned`: after a failed fsync the
//! kernel may have dropped the dirty pages, so retrying and calling the data safe would be a lie.
//! Reads keep working. (Whether the failed group is on disk after a crash is unknown — its waiters were
//! told it failed, not that it was lost.) The writer checkpoints the WAL itself (`wal_autocheckpoint`
//! is off), on a connection of its own beside the commits, so that a failed checkpoint sync poisons
//! too instead of being ignored by SQLite.
//!
//! The read path (`sqlite/read.rs`). `load`, `inspect`, `list` and `header` read through a small
//! pool of query-only connections on the blocking pool (WAL lets them run beside the writer). `load`
//! and `inspect` scan the rows with `scan::Scanner` in `Damage::Corrupt` mode: SQLite cannot tear a
//! committed transaction, so an unreadable row is damage to acknowledged input, never a torn tail —
//! the session is refused as `Corrupt`, naming every damaged seq, and nothing is deleted. `load` then
//! commits the repair (the closers of an open last turn) through the same group commit, and returns
//! only once it is durable. `survey` (and `list`) read each session's summary on its own, so a damaged
//! page costs only the sessions on it.
//!
//! Read-only stores (`open_read_only`, for the commands that only look) have no writer and take no
//! lock; their connections are opened `SQLITE_OPEN_READ_ONLY` (`sqlite/open.rs`, `ReadOnlyMode`), so
//! they never checkpoint or delete the `-wal` and `-shm` a crash left, and they read a store the user
//! can only read.
//!
//! Files: `open.rs` (the directory, the lock, connections, schema), `read.rs` (reads, scans, listing),
//! `writer.rs` (the writer task and its commit jobs), `vfs.rs` (fault injection).
//!
//! Fault injection: with `SqliteConfig::fault_injection` every connection goes through the VFS in
//! `sqlite/vfs.rs`, and `SqliteStore::faults` makes SQLite's own `xSync` fail or wait. The VFS is
//! compiled only with the `fault-injection` cargo feature (enabled for this package's tests through
//! its dev-dependency on itself; release builds leave it out); without it, asking for fault injection
//! is an `Io` error at open.

mod open;
mod read;
#[cfg(feature = "fault-injection")]
mod vfs;
mod writer;

pub use self::read::{DamagedSession, Survey};
#[cfg(feature = "fault-injection")]
pub use self::vfs::{IoOp, IoRecord, WriteFault};

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use async_trait::async_trait;
use rusqlite::Connection;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::{error, warn};

use crate::ids::SessionId;
use crate::limits::Limits;
use crate::session::event::SessionHeader;
use crate::session::store::scan::check_batch;
use crate::session::store::{
    EncodedEvent, Inspection, LoadedSession, SessionStore, SessionSummary, StoreError,
};

use self::writer::{Materialize, Op, Request};

/// The database file inside the data directory.
pub const DB_FILE_NAME: &str = "sessions.sqlite3";
/// The lock file inside the data directory; an open store holds an exclusive lock on it.
pub const LOCK_FILE_NAME: &str = "sessions.lock";

/// How a `SqliteStore` is set up. `SqliteConfig::default()` is what the runtime uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SqliteConfig {
    /// Bounds on what is written and read (`event_bytes_max` per record, `session_events_max` per
    /// load).
    pub limits: Limits,
    /// Write requests (appends, repairs, deletes) queued for the writer at most; a caller finding the
    /// queue full waits. 8,192: well above the number of agents that append at the same moment, so
    /// the queue only fills when the disk falls behind.
    pub queue_requests_max: usize,
    /// The most requests one commit group takes, however many are queued. 1,024: a group of
    /// agents' turn batches is then tens of milliseconds of the writer's CPU, so the first agents
    /// of a burst hear that their events are durable and go on with their turns while the writer
    /// commits the next group, instead of every agent waiting for one group of everything queued
    /// (in a 10,000-agent burst, groups of 8,192 left the runtime idle for a fifth of the burst and
    /// put the input-ack p99 at 0.67 s; BENCHMARKS.md, "jemalloc and smaller commit groups"). A
    /// group's fsync is a fraction of a millisecond against that, so the store's ceiling is
    /// unchanged.
    pub group_requests_max: usize,
    /// Event bytes queued for the writer at most (a batch larger than this waits until it is alone).
    /// 64 MiB. At most `u32::MAX`.
    pub queue_bytes_max: usize,
    /// Read connections kept open between reads. 4: reads are short, and each idle connection holds
    /// a page cache.
    pub readers_idle_max: usize,
    /// WAL bytes written after which a passive checkpoint starts, on its own connection, beside the
    /// commits. Counted as SQLite writes them: every frame a commit adds to the WAL, a page and its
    /// 24-byte header (`StoreStats::n_wal_bytes_committed`), which is 1.6 (a 10,000-agent burst)
    /// to 14 (100,000 ramped agents) times the events' own JSON; a lone agent's text turn writes
    /// ~43 KiB of WAL for ~5 KB of events. After the checkpoint and its catch-up SQLite writes the
    /// WAL over from its beginning, so this also bounds the `-wal` file, and a commit then
    /// overwrites blocks the file already has instead of growing it: an fsync that need not write
    /// a new size (a lone agent's turn 0.87× as long once it does, BENCHMARKS.md). 64 MiB: with
    /// 16 MiB the catch-ups, each holding the commits for a few milliseconds, came often enough
    /// to double the wake-latency p99 at 100,000 ramped agents.
    pub checkpoint_after_bytes: u64,
    /// WAL bytes written after which the writer, between two groups, checkpoints the whole WAL
    /// and truncates it (`wal_checkpoint(TRUNCATE)`), holding the next group back while it runs.
    /// The passive checkpoints beside the commits never let SQLite start the WAL over while
    /// commits keep coming (each ends behind the commits made while it ran), so without this the
    /// `-wal` file grows with everything ever written under sustained load (8.3 GB in a
    /// 400,000-agent `dsh sim`). Counted as `checkpoint_after_bytes` is. 256 MiB.
    pub wal_restart_after_bytes: u64,
    /// How long the writer makes the `-wal` file, at most, by writing its blocks (zeros) ahead of
    /// SQLite while it has nothing to commit, so that a commit overwrites blocks the file already
    /// has. An `fdatasync` after an append must also write out the file's new size and blocks: here
    /// it took 175–184 µs p50 against 71–96 µs for an overwrite (4 KiB, ext4), and `fallocate`
    /// does not help (its unwritten extents are converted at the write, 143–186 µs). SQLite
    /// appends to the WAL until a checkpoint lets it start over, so without this a fresh store's
    /// commits cost about twice what they cost once the WAL has been around once (a lone agent's
    /// SQLite commit 342 µs p50 before its first WAL reset, 188 µs after; BENCHMARKS.md). The
    /// writer keeps the file ahead of SQLite's end of the WAL by as many bytes as SQLite has
    /// written to it since the open (at least 2 MiB), in 1 MiB chunks, each synced, once a whole
    /// chunk is due; so a short-lived store writes 1–2 MiB of zeros, not this much, and a commit
    /// that arrives meanwhile waits for at most one chunk. The zeros are no WAL frames: SQLite's
    /// recovery stops at the first frame whose checksum fails, as it does at the stale frames of
    /// a WAL it started over.
    /// Never past `checkpoint_after_bytes`: after a checkpoint SQLite starts the WAL over and
    /// reuses the blocks it wrote itself. 64 MiB (so `checkpoint_after_bytes` bounds it); 0 turns
    /// it off.
    pub wal_prefill_bytes: u64,
    /// Route every file operation through a wrapping VFS whose `xSync` tests can make fail or wait
    /// (`SqliteStore::faults`). Off in production; needs a build with the `fault-injection` feature
    /// (`open` refuses it otherwise).
    pub fault_injection: bool,
    /// With `fault_injection`: record every write, truncate and sync SQLite issues, from the open on
    /// (`FaultInjector::record`), to replay power losses. Off in production.
    pub record_io: bool,
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig {
            limits: Limits::DEFAULT,
            queue_requests_max: 8_192,
            group_requests_max: 1_024,
            queue_bytes_max: 64 << 20,
            readers_idle_max: 4,
            checkpoint_after_bytes: 64 << 20,
            wal_restart_after_bytes: 256 << 20,
            wal_prefill_bytes: 64 << 20,
            fault_injection: false,
            record_io: false,
        }
    }
}

/// Counters of what the writer did, for tests and reports. Monotonic.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Read jobs run on the read connections (loads, inspections, lists, the id lookups of
    /// `create` and of the first call about a session not yet in memory).
    pub n_reads: u64,
    /// Write requests accepted into the queue (appends, repairs, deletes).
    pub n_requests_queued: u64,
    /// Commit groups (transactions) the writer ran, successful or not.
    pub n_groups: u64,
    /// Requests in groups that committed.
    pub n_requests_committed: u64,
    /// Events in groups that committed.
    pub n_events_committed: u64,
    /// Event JSON bytes in groups that committed.
    pub n_bytes_committed: u64,
    /// WAL bytes the groups that committed wrote (frames of a page and its header, from SQLite's
    /// WAL hook; the events' JSON bytes when the hook could not be installed).
    pub n_wal_bytes_committed: u64,
    /// WAL checkpoints the writer ran.
    pub n_checkpoints: u64,
    /// Times a checkpoint beside the commits synced the database file after copying pages into
    /// it (so the catch-up that holds the commits syncs only its own pages).
    pub n_database_syncs: u64,
    /// Times the writer checkpointed the whole WAL and truncated it (`wal_restart_after_bytes`).
    pub n_wal_restarts: u64,
    /// Times SQLite started the WAL over from its beginning at a commit, without truncating it,
    /// because a checkpoint and its catch-up had copied all of it (no reader still reading it).
    pub n_wal_resets: u64,
    /// Catch-ups the writer ran between two groups: the frames committed while a checkpoint pass
    /// ran beside the commits, copied while the commits wait (`checkpoint_after_bytes`).
    pub n_catch_ups: u64,
    /// Wall time (nanoseconds) the writer held the commits for its catch-ups and WAL restarts:
    /// what those add to the acknowledgements that waited behind them.
    pub commits_held_ns: u64,
    /// Bytes (zeros) the writer wrote at the `-wal` file's end ahead of SQLite
    /// (`wal_prefill_bytes`), in chunks of at most 1 MiB, each synced.
    pub n_wal_prefill_bytes: u64,
    /// Chunks of `n_wal_prefill_bytes` written and synced.
    pub n_wal_prefill_chunks: u64,
    /// Wall time (nanoseconds) of those chunks' writes and syncs. The writer runs them only
    /// with nothing queued; a request that arrives meanwhile waits for the chunk to finish.
    pub wal_prefill_ns: u64,
    /// CPU time (nanoseconds, its threads' own clocks) the writer spent in its blocking jobs:
    /// commit groups, checkpoints, catch-ups, WAL restarts and prefill chunks. The store's own
    /// work, apart from the runtime's and from time waiting for the disk.
    pub writer_cpu_ns: u64,
}

#[derive(Default)]
struct Counters {
    n_reads: AtomicU64,
    n_requests_queued: AtomicU64,
    n_groups: AtomicU64,
    n_requests_committed: AtomicU64,
    n_events_committed: AtomicU64,
    n_bytes_committed: AtomicU64,
    n_wal_bytes_committed: AtomicU64,
    n_checkpoints: AtomicU64,
    n_database_syncs: AtomicU64,
    n_wal_restarts: AtomicU64,
    n_wal_resets: AtomicU64,
    n_catch_ups: AtomicU64,
    commits_held_ns: AtomicU64,
    n_wal_prefill_bytes: AtomicU64,
    n_wal_prefill_chunks: AtomicU64,
    wal_prefill_ns: AtomicU64,
    writer_cpu_ns: AtomicU64,
}

/// Makes SQLite's own fsync fail or wait, for tests. Only exists on a store opened with
/// `SqliteConfig::fault_injection`, in a build with the `fault-injection` feature.
#[cfg(feature = "fault-injection")]
#[derive(Clone)]
pub struct FaultInjector {
    vfs: Vfs,
}

#[cfg(feature = "fault-injection")]
impl FaultInjector {
    /// While set, every `xSync` returns `SQLITE_IOERR_FSYNC` without syncing.
    pub fn fail_syncs(&self, fail: bool) {
        self.vfs.set_fail_syncs(fail);
    }

    /// While set, every `xSync` blocks (its blocking-pool thread waits) until cleared.
    pub fn hold_syncs(&self, hold: bool) {
        self.vfs.set_hold_syncs(hold);
    }

    /// `xSync` calls so far.
    pub fn n_syncs(&self) -> u64 {
        self.vfs.n_syncs()
    }

    /// `xSync` calls that were failed on purpose.
    pub fn n_syncs_failed(&self) -> u64 {
        self.vfs.n_syncs_failed()
    }

    /// `xSync` calls waiting right now because syncs are held.
    pub fn n_syncs_waiting(&self) -> u64 {
        self.vfs.n_syncs_waiting()
    }

    /// Fails every `xSync` from the `n`-th one (0-based, as counted by `n_syncs`) on; `u64::MAX`
    /// stops failing them.
    pub fn fail_syncs_from(&self, n: u64) {
        self.vfs.set_fail_syncs_from(n);
    }

    /// Fails every `xWrite` from the `n`-th one (0-based, as counted by `n_writes`) on with `fault`;
    /// `u64::MAX` stops failing them.
    pub fn fail_writes_from(&self, n: u64, fault: WriteFault) {
        self.vfs.set_fail_writes_from(n, fault);
    }

    /// `xWrite` calls so far (failed ones included).
    pub fn n_writes(&self) -> u64 {
        self.vfs.n_writes()
    }

    /// `xWrite` calls that were failed on purpose.
    pub fn n_writes_failed(&self) -> u64 {
        self.vfs.n_writes_failed()
    }

    /// Puts `mark` into the I/O record (`SqliteConfig::record_io`), between the operations issued
    /// before and after this call; nothing without recording.
    pub fn mark(&self, mark: u64) {
        self.vfs.mark(mark);
    }

    /// A copy of the I/O record so far (`SqliteConfig::record_io`; empty without it).
    pub fn record(&self) -> IoRecord {
        self.vfs.record()
    }
}

#[cfg(feature = "fault-injection")]
impl std::fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultInjector")
            .field("vfs", &self.vfs.name())
            .finish()
    }
}

/// The fault VFS a connection was opened through, kept alive as long as the connection.
#[cfg(feature = "fault-injection")]
type Vfs = Arc<vfs::FaultVfs>;

/// Without the `fault-injection` feature no connection goes through a VFS of ours, so there is
/// nothing to keep alive: an `Option<Vfs>` is always `None`.
#[cfg(not(feature = "fault-injection"))]
enum Vfs {}

/// The name a VFS is registered under, for `Connection::open_with_flags_and_vfs`.
#[cfg(feature = "fault-injection")]
fn vfs_name(vfs: &Vfs) -> &str {
    vfs.name()
}

/// The name a VFS is registered under (there is none without the `fault-injection` feature).
#[cfg(not(feature = "fault-injection"))]
fn vfs_name(vfs: &Vfs) -> &str {
    match *vfs {}
}

/// A connection that keeps the fault VFS it was opened through alive, and closes explicitly.
struct Db {
    /// Invariant: `Some` until `Drop`.
    conn: Option<Connection>,
    /// Declared after `conn`: the VFS must outlive the connection (`sqlite/vfs.rs`).
    #[cfg(feature = "fault-injection")]
    vfs: Option<Vfs>,
}

impl Db {
    /// Wraps a connection opened through `vfs` (our fault VFS, if any), keeping it alive as long.
    fn new(conn: Connection, vfs: Option<&Vfs>) -> Db {
        // Without the feature there is no VFS of ours to keep (an `Option<Vfs>` is always `None`).
        #[cfg(not(feature = "fault-injection"))]
        let _ = vfs;
        Db {
            conn: Some(conn),
            #[cfg(feature = "fault-injection")]
            vfs: vfs.cloned(),
        }
    }
}

impl Deref for Db {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
            .as_ref()
            .expect("a Db holds its connection until dropped")
    }
}

impl DerefMut for Db {
    fn deref_mut(&mut self) -> &mut Connection {
        self.conn
            .as_mut()
            .expect("a Db holds its connection until dropped")
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take()
            && let Err((conn, e)) = conn.close()
        {
            warn!(error = %e, "closing a store connection failed; leaking it");
            // An unclosed handle may still refer to the VFS: keep both alive forever.
            std::mem::forget(conn);
            #[cfg(feature = "fault-injection")]
            std::mem::forget(self.vfs.take());
        }
    }
}

/// What the store knows about one session id. The map is authoritative once an id is in it; an id
/// not in it is whatever the database says.
#[derive(Debug)]
enum Slot {
    /// `create`d; nothing durable yet. The header rides with the first append.
    Registered { header: SessionHeader },
    /// Stored, or its first append is queued.
    Active {
        header: SessionHeader,
        /// The seq the next queued append must start at.
        ///
        /// Invariant: one past the last seq of every write accepted into the queue for this session
        /// (so equal to the stored end once the queue has drained, because only this process writes —
        /// the lock file).
        next_seq: u64,
    },
    /// A delete is queued and not yet committed: the session is gone for every caller.
    Deleted,
}

/// The session map. It holds one entry (the header, a few hundred bytes) per session touched since
/// the store opened — created, appended, loaded or asked about — and loses it on delete; it is not
/// evicted otherwise, so its size follows the number of sessions in use, not the history length.
struct Sessions {
    slots: HashMap<SessionId, Slot>,
    /// Bumped whenever an id leaves `slots`, so that `touch`, which reads the database without the
    /// lock, can tell that the answer it read may predate a committed delete.
    epoch: u64,
}

/// State shared by the store handle, the writer task and the blocking jobs.
struct Shared {
    dir: PathBuf,
    db_path: PathBuf,
    config: SqliteConfig,
    sessions: Mutex<Sessions>,
    /// Why writes are refused. Set once, by the writer, when a commit or sync fails; never cleared.
    poison: OnceLock<String>,
    closed: AtomicBool,
    /// Opened by `open_read_only`: no writer, no lock; every write is refused.
    read_only: bool,
    /// Idle read connections, at most `config.readers_idle_max`.
    readers: Mutex<Vec<Db>>,
    vfs: Option<Vfs>,
    counters: Counters,
}

impl Shared {
    /// A writable store's state before anything is read: no sessions known, not poisoned, no
    /// idle readers, counters at zero.
    fn new(dir: &Path, db_path: PathBuf, config: SqliteConfig, vfs: Option<Vfs>) -> Shared {
        Shared {
            dir: dir.to_path_buf(),
            db_path,
            config,
            sessions: Mutex::new(Sessions {
                slots: HashMap::new(),
                epoch: 0,
            }),
            poison: OnceLock::new(),
            closed: AtomicBool::new(false),
            read_only: false,
            readers: Mutex::new(Vec::new()),
            vfs,
            counters: Counters::default(),
        }
    }

    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        // No code panics while holding this lock with the map half-updated; recover the guard.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn writable(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        if self.read_only {
            return Err(io_error(
                "write",
                format!("the store in {} was opened read-only", self.dir.display()),
            ));
        }
        match self.poison.get() {
            Some(cause) => Err(StoreError::Poisoned {
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    fn readable(&self) -> Result<(), StoreError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    fn poison(&self, cause: String) {
        if self.poison.set(cause.clone()).is_ok() {
            error!(%cause, path = %self.db_path.display(), "session store poisoned: refusing writes");
        }
    }

    fn take_reader(&self) -> rusqlite::Result<Db> {
        let idle = self
            .readers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match idle {
            Some(db) => Ok(db),
            None if self.read_only => open::open_read_only_connection(&self.db_path),
            None => open::open_reader(&self.db_path, self.vfs.as_ref()),
        }
    }

    fn put_reader(&self, db: Db) {
        if self.closed.load(Ordering::SeqCst) {
            return;
        }
        let mut idle = self.readers.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.config.readers_idle_max {
            idle.push(db);
        }
    }
}

/// The default session store. See the module docs.
pub struct SqliteStore {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Request>,
    /// The queue's byte budget, `config.queue_bytes_max` permits.
    bytes: Arc<Semaphore>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("db_path", &self.shared.db_path)
            .finish_non_exhaustive()
    }
}

fn io_error(op: &'static str, cause: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        op,
        cause: cause.to_string(),
    }
}

/// A rusqlite error with SQLite's extended code, which tells a failed fsync (1034) from other I/O.
fn describe(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => {
            format!("{e} (sqlite extended code {})", f.extended_code)
        }
        _ => e.to_string(),
    }
}

fn sql_error(op: &'static str, e: &rusqlite::Error) -> StoreError {
    io_error(op, describe(e))
}

impl SqliteStore {
    /// The database file.
    pub fn db_path(&self) -> &Path {
        &self.shared.db_path
    }

    /// The fault injector, when the store was opened with `SqliteConfig::fault_injection`.
    #[cfg(feature = "fault-injection")]
    pub fn faults(&self) -> Option<FaultInjector> {
        self.shared.vfs.as_ref().map(|vfs| FaultInjector {
            vfs: Arc::clone(vfs),
        })
    }

    /// Why no session can be created now: the store is closed, or read-only.
    fn can_create(&self) -> Result<(), StoreError> {
        self.shared.readable()?;
        if self.shared.read_only {
            return self.shared.writable();
        }
        Ok(())
    }

    /// Registers `header`'s session unless the session map already holds its id (registered,
    /// stored, or — for `create` — found in the database by `touch`).
    fn register(&self, header: &SessionHeader) -> Result<(), StoreError> {
        let id = &header.id;
        let mut sessions = self.shared.sessions();
        match sessions.slots.get(id) {
            Some(Slot::Registered { .. } | Slot::Active { .. }) => {
                Err(StoreError::AlreadyExists { id: id.clone() })
            }
            // Absent, or its delete is queued: a first append is queued after that delete.
            None | Some(Slot::Deleted) => {
                sessions.slots.insert(
                    id.clone(),
                    Slot::Registered {
                        header: header.clone(),
                    },
                );
                Ok(())
            }
        }
    }

    /// What the writer has done so far.
    pub fn stats(&self) -> StoreStats {
        let c = &self.shared.counters;
        StoreStats {
            n_reads: c.n_reads.load(Ordering::SeqCst),
            n_requests_queued: c.n_requests_queued.load(Ordering::SeqCst),
            n_groups: c.n_groups.load(Ordering::SeqCst),
            n_requests_committed: c.n_requests_committed.load(Ordering::SeqCst),
            n_events_committed: c.n_events_committed.load(Ordering::SeqCst),
            n_bytes_committed: c.n_bytes_committed.load(Ordering::SeqCst),
            n_wal_bytes_committed: c.n_wal_bytes_committed.load(Ordering::SeqCst),
            n_checkpoints: c.n_checkpoints.load(Ordering::SeqCst),
            n_database_syncs: c.n_database_syncs.load(Ordering::SeqCst),
            n_wal_restarts: c.n_wal_restarts.load(Ordering::SeqCst),
            n_wal_resets: c.n_wal_resets.load(Ordering::SeqCst),
            n_catch_ups: c.n_catch_ups.load(Ordering::SeqCst),
            commits_held_ns: c.commits_held_ns.load(Ordering::Relaxed),
            n_wal_prefill_bytes: c.n_wal_prefill_bytes.load(Ordering::SeqCst),
            n_wal_prefill_chunks: c.n_wal_prefill_chunks.load(Ordering::SeqCst),
            wal_prefill_ns: c.wal_prefill_ns.load(Ordering::Relaxed),
            writer_cpu_ns: c.writer_cpu_ns.load(Ordering::Relaxed),
        }
    }

    /// Why writes are refused, if the store is poisoned.
    pub fn poisoned(&self) -> Option<&str> {
        self.shared.poison.get().map(String::as_str)
    }

    /// Commits everything queued, stops the writer, closes every connection and releases the lock
    /// file. Later calls on this store return `Closed`. Idempotent.
    ///
    /// # Errors
    /// `Io` when the writer task failed.
    pub async fn close(&self) -> Result<(), StoreError> {
        let was_closed = self.shared.closed.swap(true, Ordering::SeqCst);
        if !was_closed {
            let (reply, answer) = oneshot::channel();
            let close = Request {
                op: Op::Close,
                reply,
                _bytes: None,
            };
            if self.tx.send(close).await.is_ok() {
                // An error means the writer is already gone, which is what we want.
                let _ = answer.await;
            }
        }
        let task = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            task.await
                .map_err(|e| io_error("close", format!("the writer task failed: {e}")))?;
        }
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let idle = std::mem::take(
                &mut *shared
                    .readers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            );
            drop(idle);
        })
        .await
        .map_err(|e| io_error("close", format!("closing read connections failed: {e}")))?;
        Ok(())
    }

    /// Every stored session that can be read, like `list`, and the ones that cannot (a damaged
    /// page, an invalid header) with the reason, so that one damaged session does not hide the
    /// others.
    ///
    /// # Errors
    /// `Closed`; `Io` when the session table cannot be read at all.
    pub async fn survey(&self) -> Result<Survey, StoreError> {
        let mut survey = self
            .read("list", |conn, _| read::list_sessions(conn))
            .await?;
        let sessions = self.shared.sessions();
        survey
            .sessions
            .retain(|s| !matches!(sessions.slots.get(&s.header.id), Some(Slot::Deleted)));
        survey.damaged.retain(|d| {
            !matches!(
                SessionId::new(&d.id)
                    .ok()
                    .and_then(|id| sessions.slots.get(&id)),
                Some(Slot::Deleted)
            )
        });
        Ok(survey)
    }

    /// Waits for room in the queue (request slot and byte budget). Cancel-safe: nothing is reserved
    /// in the session map yet.
    async fn room(
        &self,
        n_bytes: usize,
    ) -> Result<(mpsc::Permit<'_, Request>, Option<OwnedSemaphorePermit>), StoreError> {
        let bytes = if n_bytes == 0 {
            None
        } else {
            // A batch larger than the whole budget waits until it is alone in the queue.
            let n = n_bytes.min(self.shared.config.queue_bytes_max);
            let n = u32::try_from(n).expect("queue_bytes_max <= u32::MAX, checked in open");
            Some(
                Arc::clone(&self.bytes)
                    .acquire_many_owned(n)
                    .await
                    .map_err(|_| StoreError::Closed)?,
            )
        };
        let permit = self.tx.reserve().await.map_err(|_| StoreError::Closed)?;
        Ok((permit, bytes))
    }

    /// Waits for the writer's answer to a queued request.
    async fn answer(
        &self,
        rx: oneshot::Receiver<Result<(), StoreError>>,
    ) -> Result<(), StoreError> {
        match rx.await {
            Ok(result) => result,
            // The writer dropped the request unanswered: it stopped (closed, or its job panicked).
            Err(_) => Err(match self.shared.poison.get() {
                Some(cause) => StoreError::Poisoned {
                    cause: cause.clone(),
                },
                None => StoreError::Closed,
            }),
        }
    }
}

#[async_trait]
impl SessionStore for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
        self.can_create()?;
        self.touch(&header.id).await?;
        self.register(header)
    }

    async fn create_minted(&self, header: &SessionHeader) -> Result<(), StoreError> {
        self.can_create()?;
        // No `touch`: a minted id is in the database only if 122 random bits repeated.
        self.register(header)
    }

    async fn append(&self, id: &SessionId, events: Vec<EncodedEvent>) -> Result<(), StoreError> {
        self.shared.writable()?;
        check_batch(id, &events, &self.shared.config.limits)?;
        let n_bytes: usize = events.iter().map(|e| e.json.len()).sum();
        let (permit, bytes) = self.room(n_bytes).await?;
        self.touch(id).await?;
        let (reply, answer) = oneshot::channel();
        {
            let mut sessions = self.shared.sessions();
            let not_found = || StoreError::NotFound { id: id.clone() };
            let expected = match sessions.slots.get(id) {
                None | Some(Slot::Deleted) => return Err(not_found()),
                Some(Slot::Registered { .. }) => 0,
                Some(Slot::Active { next_seq, .. }) => *next_seq,
            };
            let Some(first) = events.first().map(|e| e.seq) else {
                // Nothing to write; the id is known.
                return Ok(());
            };
            if first != expected {
                return Err(StoreError::SeqMismatch {
                    id: id.clone(),
                    expected,
                    got: first,
                });
            }
            // A log that a load would refuse must never be written.
            let end = first.saturating_add(events.len() as u64);
            let n_events_max = self.shared.config.limits.session_events_max as u64;
            if end > n_events_max {
                return Err(StoreError::LogTooLong {
                    id: id.clone(),
                    n_events_max,
                });
            }
            let Some(slot) = sessions.slots.get_mut(id) else {
                return Err(not_found());
            };
            let materialize = match slot {
                Slot::Deleted => return Err(not_found()),
                Slot::Registered { header } => {
                    let json = serde_json::to_string(header)
                        .map_err(|e| io_error("append", format!("session header: {e}")))?;
                    let created_at = i64::try_from(header.created_at).unwrap_or(i64::MAX);
                    let header = header.clone();
                    *slot = Slot::Active {
                        header,
                        next_seq: end,
                    };
                    Some(Materialize { created_at, json })
                }
                Slot::Active { next_seq, .. } => {
                    *next_seq = end;
                    None
                }
            };
            permit.send(Request {
                op: Op::Append {
                    id: id.clone(),
                    materialize,
                    events,
                },
                reply,
                _bytes: bytes,
            });
            self.shared
                .counters
                .n_requests_queued
                .fetch_add(1, Ordering::SeqCst);
        }
        self.answer(answer).await
    }

    async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        let (header, scanned) = self.scan(id).await?;
        if !scanned.needs_repair() {
            return Ok(LoadedSession {
                header,
                events: scanned.events,
                n_repaired: 0,
            });
        }
        self.shared.writable()?;
        let closers = scanned.encoded_closers();
        let n_bytes: usize = closers.iter().map(|e| e.json.len()).sum();
        let (permit, bytes) = self.room(n_bytes).await?;
        let (reply, answer) = oneshot::channel();
        {
            let mut sessions = self.shared.sessions();
            match sessions.slots.get_mut(id) {
                None | Some(Slot::Deleted) => return Err(StoreError::NotFound { id: id.clone() }),
                Some(Slot::Registered { .. }) => {
                    // Only reachable if the session was deleted and re-created while we read.
                    return Err(StoreError::SeqMismatch {
                        id: id.clone(),
                        expected: 0,
                        got: scanned.raw_end,
                    });
                }
                Some(Slot::Active { next_seq, .. }) => {
                    if *next_seq != scanned.raw_end {
                        // Someone appended after we read: repairing would cut their events.
                        return Err(StoreError::SeqMismatch {
                            id: id.clone(),
                            expected: *next_seq,
                            got: scanned.raw_end,
                        });
                    }
                    *next_seq = (scanned.events.len() + closers.len()) as u64;
                }
            }
            permit.send(Request {
                // The repair only appends the closers: SQLite's scan never finds a torn tail to cut
                // (an unreadable row is `Corrupt`).
                op: Op::Append {
                    id: id.clone(),
                    materialize: None,
                    events: closers,
                },
                reply,
                _bytes: bytes,
            });
            self.shared
                .counters
                .n_requests_queued
                .fetch_add(1, Ordering::SeqCst);
        }
        self.answer(answer).await?;
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
        let survey = self.survey().await?;
        for d in &survey.damaged {
            warn!(session = %d.id, reason = %d.reason, "not listing a session that cannot be read");
        }
        Ok(survey.sessions)
    }

    async fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.shared.writable()?;
        let (permit, _) = self.room(0).await?;
        self.touch(id).await?;
        let (reply, answer) = oneshot::channel();
        {
            let mut sessions = self.shared.sessions();
            match sessions.slots.get(id) {
                None | Some(Slot::Deleted) => return Ok(false),
                Some(Slot::Registered { .. }) => {
                    // Nothing durable to delete.
                    sessions.slots.remove(id);
                    sessions.epoch += 1;
                    return Ok(true);
                }
                Some(Slot::Active { .. }) => {
                    sessions.slots.insert(id.clone(), Slot::Deleted);
                }
            }
            permit.send(Request {
                op: Op::Delete { id: id.clone() },
                reply,
                _bytes: None,
            });
            self.shared
                .counters
                .n_requests_queued
                .fetch_add(1, Ordering::SeqCst);
        }
        self.answer(answer).await?;
        Ok(true)
    }

    async fn header(&self, id: &SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.shared.readable()?;
        self.touch(id).await?;
        let sessions = self.shared.sessions();
        Ok(match sessions.slots.get(id) {
            Some(Slot::Registered { header } | Slot::Active { header, .. }) => Some(header.clone()),
            None | Some(Slot::Deleted) => None,
        })
    }
}
