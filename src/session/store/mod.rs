//! The session store: durable logs behind an async trait free of any backend's types.
//!
//! "Acknowledged means durable": `append` resolves only after the batch is on stable storage. The
//! default backend is SQLite (`sqlite/`: one database under the data directory, WAL,
//! `synchronous=FULL`, one writer thread doing group commit across all sessions). `memory.rs` keeps logs
//! in memory for tests and benchmarks. `jsonl.rs` reads and writes DSH v0 JSON lines for
//! `dsh export`/`import`. `postgres/` (the `postgres` cargo feature) keeps logs in PostgreSQL for
//! several machines, with a lease per hosted session fencing every append (SPEC §14).
//!
//! What must stay true: a session's stored events are contiguous from seq 0; an append whose first seq
//! is not the stored next seq is refused; after a failed fsync a store refuses every later write
//! (`StoreError::Poisoned`) — it never retries an fsync and assumes the data is safe.

pub mod jsonl;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
pub(crate) mod scan;
pub mod sqlite;

use async_trait::async_trait;
use bytes::Bytes;

use crate::ids::SessionId;
use crate::session::event::{Event, SessionHeader};

/// One event serialized as v0 JSON, ready for a store. Encoding happens on the caller's thread so
/// the store's single writer thread only does I/O.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedEvent {
    /// The event's seq.
    pub seq: u64,
    /// The event's `type`, kept beside the JSON so a backend can index it without parsing.
    pub kind: String,
    /// The event as `Event::to_json` writes it: what the store keeps.
    pub json: Bytes,
}

impl EncodedEvent {
    /// Serializes `event` for a store.
    pub fn encode(event: &Event) -> EncodedEvent {
        EncodedEvent {
            seq: event.seq,
            kind: event.kind().to_string(),
            json: Bytes::from(event.to_json_bytes()),
        }
    }
}

/// A session read back by `load`: validated, with an open tail turn closed durably.
#[derive(Clone, Debug)]
pub struct LoadedSession {
    /// The session's header.
    pub header: SessionHeader,
    /// The whole log, including any closers this load appended.
    pub events: Vec<Event>,
    /// How many events at the end of `events` are repair closers appended by this load.
    pub n_repaired: usize,
}

/// What `inspect` found, without writing anything.
#[derive(Clone, Debug)]
pub struct Inspection {
    /// The session's header.
    pub header: SessionHeader,
    /// The valid stored prefix.
    pub events: Vec<Event>,
    /// The closers a `load` would append.
    pub closers: Vec<Event>,
    /// A torn tail a `load` would cut: the first bad seq and why. Only a store whose last write can
    /// tear has one (the memory store); in the SQLite store an unreadable row is `Corrupt`.
    pub torn_tail: Option<(u64, String)>,
}

/// One row of `list`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    /// The session's header.
    pub header: SessionHeader,
    /// Events stored (one past the last seq).
    pub n_events: u64,
    /// `time` of the last event, if any.
    pub last_time: Option<i64>,
}

/// Why a store operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No session with this id is stored or registered.
    #[error("session {id} not found")]
    NotFound {
        /// The id asked for.
        id: SessionId,
    },
    /// A session with this id is stored or registered already.
    #[error("session {id} already exists")]
    AlreadyExists {
        /// The id asked for.
        id: SessionId,
    },
    /// An append does not continue the stored log (or a batch is not contiguous).
    #[error("session {id}: append starts at seq {got}, the stored log ends before seq {expected}")]
    SeqMismatch {
        /// The session.
        id: SessionId,
        /// The seq the log expects next.
        expected: u64,
        /// The seq the append carries.
        got: u64,
    },
    /// A sync failed earlier: the store refuses every write from then on.
    #[error("the store refuses writes since a failed sync: {cause}")]
    Poisoned {
        /// The failure that poisoned the store.
        cause: String,
    },
    /// A stored log cannot be trusted: damaged rows, or events that fail validation.
    #[error("stored session {id} failed validation at seq {seq}: {reason}")]
    Corrupt {
        /// The session.
        id: SessionId,
        /// The first damaged or invalid seq.
        seq: u64,
        /// What is wrong (for damaged rows in SQLite: every damaged seq).
        reason: String,
    },
    /// An event's JSON is over `Limits::event_bytes_max`.
    #[error("session {id}: event at seq {seq} is {bytes} bytes, the limit is {bytes_max}")]
    EventTooLarge {
        /// The session.
        id: SessionId,
        /// The event's seq.
        seq: u64,
        /// Its JSON size.
        bytes: usize,
        /// The limit.
        bytes_max: usize,
    },
    /// A log would hold more than `Limits::session_events_max` events.
    #[error("session {id} holds more than {n_events_max} events, the limit")]
    LogTooLong {
        /// The session.
        id: SessionId,
        /// The limit.
        n_events_max: u64,
    },
    /// The backend failed (I/O, SQLite), or the store refuses the operation (read-only).
    #[error("{op} failed: {cause}")]
    Io {
        /// The operation that failed (`append`, `load`, `list`, …).
        op: &'static str,
        /// Why.
        cause: String,
    },
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
    /// This node does not hold the session's lease (another node hosts it, or took it over): it
    /// may not write the session (SPEC §14). Only a store with leases (PostgreSQL) returns it.
    #[error("session {id} is fenced: {reason}")]
    Fenced {
        /// The session.
        id: SessionId,
        /// Who holds the lease, or how it was lost.
        reason: String,
        /// How long the holder's live lease has left, when known: a client may retry after it.
        left: Option<std::time::Duration>,
    },
}

/// A durable home for session logs. Implementations are shared by every agent of a process.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// A short backend name for reports (`sqlite`, `memory`).
    fn name(&self) -> &'static str;

    /// Registers a new session. Nothing is durable until its first `append`, which commits the header
    /// together with the events (a session with no events is not listed).
    ///
    /// # Errors
    /// `AlreadyExists` when a session with this id is stored or registered.
    async fn create(&self, header: &SessionHeader) -> Result<(), StoreError>;

    /// Appends a batch; resolves once it is on stable storage. Batches from many sessions share one
    /// sync.
    ///
    /// # Errors
    /// `NotFound` for an unknown id, `SeqMismatch` when `events[0].seq` is not the stored next seq or
    /// the batch is not contiguous, `EventTooLarge` for a record over `Limits::event_bytes_max`,
    /// `LogTooLong` when the log would exceed `Limits::session_events_max`, `Poisoned` after a failed
    /// sync, `Io` for other failures.
    async fn append(&self, id: &SessionId, events: Vec<EncodedEvent>) -> Result<(), StoreError>;

    /// Reads a session, validates it, and if its last turn is open appends the repair closers
    /// (`session::repair`) durably before returning. In a store whose last write can tear (the memory
    /// store), a torn tail after the last `turn/end` is cut and damage before it is `Corrupt`; in one
    /// whose committed writes cannot tear (SQLite), every unreadable row is `Corrupt` and nothing is
    /// cut.
    ///
    /// # Errors
    /// `NotFound`, `Corrupt`, `LogTooLong`, `Poisoned` (when a repair must be written), `Io`.
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError>;

    /// Like `load` but writes nothing: reports the closers and torn tail a load would write.
    ///
    /// # Errors
    /// `NotFound`, `Corrupt`, `LogTooLong`, `Io`.
    async fn inspect(&self, id: &SessionId) -> Result<Inspection, StoreError>;

    /// Every session with at least one durable event, in creation order.
    ///
    /// # Errors
    /// `Io`.
    async fn list(&self) -> Result<Vec<SessionSummary>, StoreError>;

    /// Deletes a session and its log. Returns whether it existed.
    ///
    /// # Errors
    /// `Poisoned`, `Io`.
    async fn delete(&self, id: &SessionId) -> Result<bool, StoreError>;

    /// The header of a stored or registered session.
    ///
    /// # Errors
    /// `Io`.
    async fn header(&self, id: &SessionId) -> Result<Option<SessionHeader>, StoreError>;

    /// Says this process stops hosting the session (its agent hibernated or was disposed). A store
    /// with leases gives the session's lease up so that another node can take it at once; the
    /// others have nothing to do. Call it only once the session's appends were answered.
    ///
    /// # Errors
    /// `Io` when the lease cannot be given up (it then expires on its own).
    async fn release(&self, id: &SessionId) -> Result<(), StoreError> {
        let _ = id;
        Ok(())
    }

    /// The lease epoch this process holds for `id`: `Some` only in a store with leases
    /// (PostgreSQL) while it holds the session's lease. A caller that releases later (a spawned
    /// release at hibernation) reads it first and passes it to `release_epoch`.
    fn lease_epoch(&self, id: &SessionId) -> Option<u64> {
        let _ = id;
        None
    }

    /// Like `release`, but only while the lease is still held at `epoch`: a lease taken again
    /// since (a quick wake raised the epoch) is kept.
    ///
    /// # Errors
    /// As `release`.
    async fn release_epoch(&self, id: &SessionId, epoch: u64) -> Result<(), StoreError> {
        let _ = (id, epoch);
        Ok(())
    }
}
