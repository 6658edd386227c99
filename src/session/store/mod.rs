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

use std::borrow::Cow;
use std::cell::RefCell;

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
    /// The event's `type`, kept beside the JSON so a backend can index it without parsing. Borrowed
    /// for every type the runtime writes (no allocation per event), owned for an `Other` event's.
    pub kind: Cow<'static, str>,
    /// The event as `Event::to_json` writes it: what the store keeps.
    pub json: Bytes,
}

/// A batch's JSON is written here first, then copied once into a buffer of its exact size.
#[derive(Default)]
struct Scratch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

/// Scratch capacity kept between batches at most; a larger batch's buffer is given back.
const SCRATCH_KEPT_MAX: usize = 64 * 1024;

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { bytes: Vec::new(), ends: Vec::new() })
    };
}

impl EncodedEvent {
    /// Serializes `event` for a store.
    pub fn encode(event: &Event) -> EncodedEvent {
        EncodedEvent {
            seq: event.seq,
            kind: kind_of(event),
            json: Bytes::from(event.to_json_bytes()),
        }
    }

    /// Serializes `events`, in order, into one buffer of exactly their size that their `json`s
    /// share: one allocation for the bytes and one for the share count per batch, where `encode`
    /// costs two per event (and keeps each line's spare capacity). The bytes are `encode`'s.
    pub fn encode_all(events: &[Event]) -> Vec<EncodedEvent> {
        if events.is_empty() {
            return Vec::new();
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => encode_into(events, &mut scratch),
            // Only a re-entrant call finds it borrowed; it gets a scratch of its own.
            Err(_) => encode_into(events, &mut Scratch::default()),
        })
    }
}

fn kind_of(event: &Event) -> Cow<'static, str> {
    match event.data.known_kind() {
        Some(kind) => Cow::Borrowed(kind),
        None => Cow::Owned(event.kind().to_string()),
    }
}

fn encode_into(events: &[Event], scratch: &mut Scratch) -> Vec<EncodedEvent> {
    scratch.bytes.clear();
    scratch.ends.clear();
    for event in events {
        event.write_json(&mut scratch.bytes);
        scratch.ends.push(scratch.bytes.len());
    }
    let all = Bytes::copy_from_slice(&scratch.bytes);
    let mut start = 0;
    let encoded = events
        .iter()
        .zip(&scratch.ends)
        .map(|(event, &end)| {
            let json = all.slice(start..end);
            start = end;
            EncodedEvent {
                seq: event.seq,
                kind: kind_of(event),
                json,
            }
        })
        .collect();
    if scratch.bytes.capacity() > SCRATCH_KEPT_MAX {
        scratch.bytes = Vec::new();
    }
    if scratch.ends.capacity() > SCRATCH_KEPT_MAX / 64 {
        scratch.ends = Vec::new();
    }
    encoded
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

    /// `create` for an id its caller has just minted at random (`SessionId::mint`: 122 random
    /// bits), which no stored session can have, so a store need not look for it in its storage
    /// (the SQLite store's `create` waits for a read of the database to refuse a stored id). An
    /// id registered in this process is still refused. The default is `create`.
    ///
    /// # Errors
    /// As `create`.
    async fn create_minted(&self, header: &SessionHeader) -> Result<(), StoreError> {
        self.create(header).await
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every log of the original's corpus, as events.
    fn corpus() -> Vec<Vec<Event>> {
        crate::session::event::fixture_logs()
            .into_iter()
            .map(|(_, events)| events)
            .collect()
    }

    #[test]
    fn encode_all_writes_what_encode_writes_event_by_event() {
        let mut n_other = 0;
        for events in corpus() {
            let one_by_one: Vec<EncodedEvent> = events.iter().map(EncodedEvent::encode).collect();
            // The whole log, and the same log cut into the uneven batches an agent sends.
            assert_eq!(EncodedEvent::encode_all(&events), one_by_one);
            let mut batched = Vec::new();
            for batch in events.chunks(7) {
                batched.extend(EncodedEvent::encode_all(batch));
            }
            assert_eq!(batched, one_by_one);
            for (event, encoded) in events.iter().zip(&one_by_one) {
                assert_eq!(encoded.json, event.to_json().as_bytes());
                assert_eq!(encoded.kind, event.kind());
                if matches!(event.data, crate::session::event::EventData::Other { .. }) {
                    n_other += 1;
                    assert!(matches!(encoded.kind, Cow::Owned(_)));
                } else {
                    assert!(matches!(encoded.kind, Cow::Borrowed(_)));
                }
            }
        }
        assert!(
            n_other > 0,
            "the corpus has events of types the runtime does not write"
        );
        assert!(EncodedEvent::encode_all(&[]).is_empty());
    }

    #[test]
    fn a_batch_shares_one_buffer_of_its_exact_size() {
        let events: Vec<Event> = corpus().into_iter().flatten().take(40).collect();
        let encoded = EncodedEvent::encode_all(&events);
        let total: usize = encoded.iter().map(|e| e.json.len()).sum();
        let first = encoded[0].json.as_ptr();
        for (i, e) in encoded.iter().enumerate() {
            let offset = e.json.as_ptr() as usize - first as usize;
            let before: usize = encoded[..i].iter().map(|e| e.json.len()).sum();
            assert_eq!(
                offset, before,
                "event {i} is not where the batch's bytes put it"
            );
        }
        assert_eq!(
            total,
            events.iter().map(|e| e.to_json().len()).sum::<usize>()
        );
    }

    #[test]
    fn a_large_batch_leaves_no_large_scratch_behind() {
        let events: Vec<Event> = corpus().into_iter().flatten().collect();
        let total: usize = events.iter().map(|e| e.to_json().len()).sum();
        assert!(total > SCRATCH_KEPT_MAX, "the corpus is {total} bytes");
        let encoded = EncodedEvent::encode_all(&events);
        assert_eq!(encoded.len(), events.len());
        SCRATCH.with(|cell| {
            let scratch = cell.borrow();
            assert!(scratch.bytes.capacity() <= SCRATCH_KEPT_MAX);
            assert!(scratch.ends.capacity() <= SCRATCH_KEPT_MAX / 64);
        });
    }
}
