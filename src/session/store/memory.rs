//! `MemoryStore`: the session store trait in memory, for tests and benchmarks.
//!
//! It keeps each event as the JSON its `EncodedEvent` carries and parses it again on `load`, through
//! the same scanner as the SQLite store (`scan.rs`), so a test against it exercises the real codec,
//! validation, torn-tail handling and repair. It models a store whose last write can tear
//! (`Damage::TornTail`: a damaged row with no committed `turn/end` after it is cut), unlike SQLite,
//! where every unreadable row is corruption. Nothing here is durable: an "acknowledged" append is
//! merely in the map.
//!
//! Fault injection for tests: `set_fail_appends(true)` makes every write (append or repair) fail with
//! `Io` and change nothing; `set_append_delay_ms` makes each append wait (on tokio's clock, so paused
//! time applies) after it is applied and before it is acknowledged, like a slow disk;
//! `set_read_delay_ms` makes each `load` and `inspect` wait before it reads, so a read lands late
//! among other work; `insert_raw_row` and `overwrite_raw_row` store a row as given, to damage a log on purpose.
//!
//! What must stay true: the same as every store — a session's rows are contiguous from 0 unless a
//! test damaged them, an append whose first seq is not the stored next seq is refused, a refused
//! call changes nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;

use crate::ids::SessionId;
use crate::limits::Limits;
use crate::session::event::{Event, SessionHeader};
use crate::session::store::scan::{Damage, RowRef, Scanned, Scanner, check_batch};
use crate::session::store::{
    EncodedEvent, Inspection, LoadedSession, SessionStore, SessionSummary, StoreError,
};

/// One stored row, as the SQLite store would hold it.
#[derive(Clone, Debug)]
struct Row {
    seq: u64,
    /// Borrowed for the runtime's own types, so copying rows out of the lock to parse them costs
    /// no allocation (an `Other` event's kind is copied).
    kind: std::borrow::Cow<'static, str>,
    json: Bytes,
}

#[derive(Debug)]
struct MemSession {
    header: SessionHeader,
    /// Set by the first non-empty append: the session's place in `list` order. `None` while only
    /// registered.
    materialized_idx: Option<u64>,
    /// Invariant: ascending by `seq`.
    rows: Vec<Row>,
}

impl MemSession {
    /// One past the greatest stored seq (the next seq an append must start at).
    fn next_seq(&self) -> u64 {
        self.rows.last().map_or(0, |r| r.seq.saturating_add(1))
    }
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<SessionId, MemSession>,
    n_materialized: u64,
}

/// An in-memory session store. See the module docs.
#[derive(Debug)]
pub struct MemoryStore {
    limits: Limits,
    state: Mutex<State>,
    fail_appends: AtomicBool,
    append_delay_ms: AtomicU64,
    read_delay_ms: AtomicU64,
    n_appends: AtomicU64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store with the default limits.
    pub fn new() -> MemoryStore {
        MemoryStore::with_limits(Limits::DEFAULT)
    }

    /// An empty store with the given limits.
    pub fn with_limits(limits: Limits) -> MemoryStore {
        MemoryStore {
            limits,
            state: Mutex::new(State::default()),
            fail_appends: AtomicBool::new(false),
            append_delay_ms: AtomicU64::new(0),
            read_delay_ms: AtomicU64::new(0),
            n_appends: AtomicU64::new(0),
        }
    }

    /// While set, every append and every repair write fails with `Io` and changes nothing.
    pub fn set_fail_appends(&self, fail: bool) {
        self.fail_appends.store(fail, Ordering::SeqCst);
    }

    /// Each append waits this long (tokio time) after it is applied, before it is acknowledged.
    pub fn set_append_delay_ms(&self, delay_ms: u64) {
        self.append_delay_ms.store(delay_ms, Ordering::SeqCst);
    }

    /// Each `load` and `inspect` waits this long (tokio time) before it reads.
    pub fn set_read_delay_ms(&self, delay_ms: u64) {
        self.read_delay_ms.store(delay_ms, Ordering::SeqCst);
    }

    async fn read_delay(&self) {
        let delay_ms = self.read_delay_ms.load(Ordering::SeqCst);
        if delay_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        }
    }

    /// Appends that succeeded so far.
    pub fn n_appends(&self) -> u64 {
        self.n_appends.load(Ordering::SeqCst)
    }

    /// Stores a row exactly as given, after the session's last row, without any check: to damage
    /// a log on purpose in tests (garbage JSON, a wrong `kind`, a gap in the seqs).
    ///
    /// # Errors
    /// `NotFound` for an unknown id; `SeqMismatch` when `seq` is not above the last stored seq (rows
    /// stay in seq order).
    pub fn insert_raw_row(
        &self,
        id: &SessionId,
        seq: u64,
        kind: &str,
        json: impl Into<Bytes>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let state = &mut *state;
        let session = state
            .sessions
            .get_mut(id)
            .ok_or_else(|| StoreError::NotFound { id: id.clone() })?;
        if session.rows.last().is_some_and(|r| r.seq >= seq) {
            return Err(StoreError::SeqMismatch {
                id: id.clone(),
                expected: session.next_seq(),
                got: seq,
            });
        }
        if session.materialized_idx.is_none() {
            session.materialized_idx = Some(state.n_materialized);
            state.n_materialized += 1;
        }
        session.rows.push(Row {
            seq,
            kind: std::borrow::Cow::Owned(kind.to_string()),
            json: json.into(),
        });
        Ok(())
    }

    /// Replaces the stored row with this `seq` (kind and JSON) without any check: to damage a log
    /// in the middle on purpose in tests.
    ///
    /// # Errors
    /// `NotFound` for an unknown id or a seq with no row.
    pub fn overwrite_raw_row(
        &self,
        id: &SessionId,
        seq: u64,
        kind: &str,
        json: impl Into<Bytes>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        let row = state
            .sessions
            .get_mut(id)
            .and_then(|s| s.rows.iter_mut().find(|r| r.seq == seq))
            .ok_or_else(|| StoreError::NotFound { id: id.clone() })?;
        row.kind = std::borrow::Cow::Owned(kind.to_string());
        row.json = json.into();
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock with the state half-updated.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn check_fail(&self, op: &'static str) -> Result<(), StoreError> {
        if self.fail_appends.load(Ordering::SeqCst) {
            return Err(StoreError::Io {
                op,
                cause: "injected failure".to_string(),
            });
        }
        Ok(())
    }

    /// Copies a session's rows out (cheap: `Bytes` are shared) and scans them outside the lock.
    fn scan(&self, id: &SessionId) -> Result<(SessionHeader, Scanned), StoreError> {
        let (header, rows) = {
            let state = self.lock();
            let session = state
                .sessions
                .get(id)
                .ok_or_else(|| StoreError::NotFound { id: id.clone() })?;
            let n_rows_max =
                usize::try_from(Scanner::rows_to_read_max(&self.limits)).unwrap_or(usize::MAX);
            let rows: Vec<Row> = session.rows.iter().take(n_rows_max).cloned().collect();
            (session.header.clone(), rows)
        };
        let mut scanner = Scanner::new(id.clone(), &self.limits, Damage::TornTail);
        for row in &rows {
            let too_long = row.json.len() > self.limits.event_bytes_max;
            scanner.push(RowRef {
                seq: Some(row.seq),
                kind: Some(&row.kind),
                bytes: row.json.len() as u64,
                json: (!too_long).then_some(&row.json[..]),
            })?;
        }
        Ok((header, scanner.finish()?))
    }
}

fn rows_of(events: Vec<EncodedEvent>) -> impl Iterator<Item = Row> {
    events.into_iter().map(|e| Row {
        seq: e.seq,
        kind: e.kind,
        json: e.json,
    })
}

#[async_trait]
impl SessionStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
        let mut state = self.lock();
        if state.sessions.contains_key(&header.id) {
            return Err(StoreError::AlreadyExists {
                id: header.id.clone(),
            });
        }
        state.sessions.insert(
            header.id.clone(),
            MemSession {
                header: header.clone(),
                materialized_idx: None,
                rows: Vec::new(),
            },
        );
        Ok(())
    }

    async fn append(&self, id: &SessionId, events: Vec<EncodedEvent>) -> Result<(), StoreError> {
        check_batch(id, &events, &self.limits)?;
        self.check_fail("append")?;
        {
            let mut state = self.lock();
            let state = &mut *state;
            let session = state
                .sessions
                .get_mut(id)
                .ok_or_else(|| StoreError::NotFound { id: id.clone() })?;
            let Some(first) = events.first().map(|e| e.seq) else {
                return Ok(());
            };
            let expected = session.next_seq();
            if first != expected {
                return Err(StoreError::SeqMismatch {
                    id: id.clone(),
                    expected,
                    got: first,
                });
            }
            let n_events_max = self.limits.session_events_max as u64;
            if first.saturating_add(events.len() as u64) > n_events_max {
                return Err(StoreError::LogTooLong {
                    id: id.clone(),
                    n_events_max,
                });
            }
            if session.materialized_idx.is_none() {
                session.materialized_idx = Some(state.n_materialized);
                state.n_materialized += 1;
            }
            session.rows.extend(rows_of(events));
        }
        self.n_appends.fetch_add(1, Ordering::SeqCst);
        let delay_ms = self.append_delay_ms.load(Ordering::SeqCst);
        if delay_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        }
        Ok(())
    }

    async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        self.read_delay().await;
        let (header, scanned) = self.scan(id)?;
        if !scanned.needs_repair() {
            return Ok(LoadedSession {
                header,
                events: scanned.events,
                n_repaired: 0,
            });
        }
        self.check_fail("repair")?;
        {
            let mut state = self.lock();
            let session = state
                .sessions
                .get_mut(id)
                .ok_or_else(|| StoreError::NotFound { id: id.clone() })?;
            if session.next_seq() != scanned.raw_end {
                // Someone appended after we read: repairing would cut their events.
                return Err(StoreError::SeqMismatch {
                    id: id.clone(),
                    expected: session.next_seq(),
                    got: scanned.raw_end,
                });
            }
            if let Some((cut, _)) = &scanned.torn_tail {
                session.rows.retain(|r| r.seq < *cut);
            }
            session.rows.extend(rows_of(scanned.encoded_closers()));
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
        self.read_delay().await;
        let (header, scanned) = self.scan(id)?;
        Ok(Inspection {
            header,
            events: scanned.events,
            closers: scanned.closers,
            torn_tail: scanned.torn_tail,
        })
    }

    async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        let state = self.lock();
        let mut listed: Vec<(u64, u64, SessionSummary)> = state
            .sessions
            .values()
            .filter_map(|s| {
                let idx = s.materialized_idx?;
                let last = s.rows.last()?;
                let last_time = std::str::from_utf8(&last.json)
                    .ok()
                    .and_then(|j| Event::from_json(j).ok())
                    .map(|e| e.time);
                let summary = SessionSummary {
                    header: s.header.clone(),
                    n_events: last.seq.saturating_add(1),
                    last_time,
                };
                Some((s.header.created_at, idx, summary))
            })
            .collect();
        listed.sort_by_key(|(created_at, idx, _)| (*created_at, *idx));
        Ok(listed.into_iter().map(|(_, _, s)| s).collect())
    }

    async fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        Ok(self.lock().sessions.remove(id).is_some())
    }

    async fn header(&self, id: &SessionId) -> Result<Option<SessionHeader>, StoreError> {
        Ok(self.lock().sessions.get(id).map(|s| s.header.clone()))
    }
}
