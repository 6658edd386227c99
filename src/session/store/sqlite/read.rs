//! The read path of a `SqliteStore`: read jobs on the blocking pool, the session map filled from
//! the database, scanning a session's rows, and listing sessions.

use std::sync::Arc;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, params};

use super::{Slot, SqliteConfig, SqliteStore, io_error, sql_error};
use crate::ids::SessionId;
use crate::limits::Limits;
use crate::session::event::{Event, SessionHeader};
use crate::session::store::scan::{Damage, RowRef, Scanned, Scanner};
use crate::session::store::{SessionSummary, StoreError};

/// How often `touch` re-reads a session whose map entry changed under it before giving up.
const TOUCH_ATTEMPTS_MAX: u32 = 8;

impl SqliteStore {
    /// Runs `f` with a read connection on the blocking pool.
    pub(super) async fn read<T, F>(&self, op: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &SqliteConfig) -> Result<T, StoreError> + Send + 'static,
    {
        self.shared.readable()?;
        self.shared
            .counters
            .n_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let db = shared.take_reader().map_err(|e| sql_error(op, &e))?;
            let out = f(&db, &shared.config);
            shared.put_reader(db);
            out
        })
        .await
        .map_err(|e| io_error(op, format!("the read job failed: {e}")))?
    }

    /// Makes sure the session map holds `id` if the database does: after this returns, an id absent
    /// from the map is neither registered nor stored.
    pub(super) async fn touch(&self, id: &SessionId) -> Result<(), StoreError> {
        for _ in 0..TOUCH_ATTEMPTS_MAX {
            let epoch = {
                let sessions = self.shared.sessions();
                if sessions.slots.contains_key(id) {
                    return Ok(());
                }
                sessions.epoch
            };
            let key = id.clone();
            let stored = self
                .read("read session", move |conn, _| read_slot(conn, &key))
                .await?;
            let mut sessions = self.shared.sessions();
            if sessions.slots.contains_key(id) {
                return Ok(());
            }
            if sessions.epoch != epoch {
                // A delete committed while we read: our answer may predate it. Read again.
                continue;
            }
            if let Some((header, next_seq)) = stored {
                sessions
                    .slots
                    .insert(id.clone(), Slot::Active { header, next_seq });
            }
            return Ok(());
        }
        Err(io_error(
            "read session",
            format!("session {id} kept changing during {TOUCH_ATTEMPTS_MAX} reads"),
        ))
    }

    /// Reads and scans a session (no writes). A session only registered (nothing stored yet) scans
    /// as an empty log.
    pub(super) async fn scan(
        &self,
        id: &SessionId,
    ) -> Result<(SessionHeader, Scanned), StoreError> {
        self.touch(id).await?;
        let header = {
            let sessions = self.shared.sessions();
            match sessions.slots.get(id) {
                None | Some(Slot::Deleted) => return Err(StoreError::NotFound { id: id.clone() }),
                Some(Slot::Registered { header }) => {
                    return Ok((
                        header.clone(),
                        Scanned {
                            events: Vec::new(),
                            torn_tail: None,
                            raw_end: 0,
                            closers: Vec::new(),
                        },
                    ));
                }
                Some(Slot::Active { header, .. }) => header.clone(),
            }
        };
        let key = id.clone();
        let scanned = self
            .read("load", move |conn, config| {
                scan_rows(conn, &key, &config.limits)
            })
            .await?;
        Ok((header, scanned))
    }
}

/// `read_slot`'s statement: a session's header and last seq.
const READ_SLOT_SQL: &str = "SELECT header, (SELECT max(seq) FROM events WHERE session_id = ?1) \
     FROM sessions WHERE id = ?1";

/// The stored header and next seq of a session, if it is stored.
fn read_slot(
    conn: &Connection,
    id: &SessionId,
) -> Result<Option<(SessionHeader, u64)>, StoreError> {
    let op = "read session";
    let row: Option<(String, Option<i64>)> = conn
        .prepare_cached(READ_SLOT_SQL)
        .and_then(|mut stmt| {
            stmt.query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .map_err(|e| sql_error(op, &e))?;
    let Some((header_json, max_seq)) = row else {
        return Ok(None);
    };
    let header: SessionHeader =
        serde_json::from_str(&header_json).map_err(|e| StoreError::Corrupt {
            id: id.clone(),
            seq: 0,
            reason: format!("the stored session header is invalid: {e}"),
        })?;
    let next_seq = max_seq.map_or(0, |s| u64::try_from(s).map_or(0, |s| s.saturating_add(1)));
    Ok(Some((header, next_seq)))
}

/// Reads a session's rows in seq order (at most one more than the limit) through the scanner.
fn scan_rows(conn: &Connection, id: &SessionId, limits: &Limits) -> Result<Scanned, StoreError> {
    let op = "load";
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, kind, octet_length(json), \
                    CASE WHEN octet_length(json) <= ?2 THEN json END \
             FROM events WHERE session_id = ?1 ORDER BY seq LIMIT ?3",
        )
        .map_err(|e| sql_error(op, &e))?;
    let bytes_max = i64::try_from(limits.event_bytes_max).unwrap_or(i64::MAX);
    let rows_max = i64::try_from(Scanner::rows_to_read_max(limits)).unwrap_or(i64::MAX);
    let mut rows = stmt
        .query(params![id.as_str(), bytes_max, rows_max])
        .map_err(|e| sql_error(op, &e))?;
    let mut scanner = Scanner::new(id.clone(), limits, Damage::Corrupt);
    while let Some(row) = rows.next().map_err(|e| sql_error(op, &e))? {
        let seq = match row.get_ref(0) {
            Ok(ValueRef::Integer(s)) => u64::try_from(s).ok(),
            _ => None,
        };
        let kind = match row.get_ref(1) {
            Ok(ValueRef::Text(k)) => std::str::from_utf8(k).ok(),
            _ => None,
        };
        let bytes = match row.get_ref(2) {
            Ok(ValueRef::Integer(n)) => u64::try_from(n).unwrap_or(0),
            _ => 0,
        };
        let json = match row.get_ref(3) {
            Ok(ValueRef::Text(j)) => Some(j),
            _ => None,
        };
        scanner.push(RowRef {
            seq,
            kind,
            bytes,
            json,
        })?;
    }
    scanner.finish()
}

/// A stored session that `SqliteStore::survey` could not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedSession {
    /// The id as stored, or a description of where the damage is when no id could be read.
    pub id: String,
    /// What could not be read, and SQLite's or the parser's reason.
    pub reason: String,
}

/// What `SqliteStore::survey` found: every session it could read, and the ones it could not.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Survey {
    /// The readable sessions with at least one durable event, in creation order.
    pub sessions: Vec<SessionSummary>,
    /// The sessions whose header or last event could not be read (a damaged page, an invalid
    /// header), in creation order.
    pub damaged: Vec<DamagedSession>,
}

/// The survey behind `list`, in one read transaction. A session that cannot be read is reported in
/// `Survey::damaged` and the scan goes on, so that one damaged page costs only the sessions on it.
///
/// # Errors
/// `Io` when the read transaction cannot start or the session table cannot be read at all.
pub(super) fn list_sessions(conn: &Connection) -> Result<Survey, StoreError> {
    let op = "list";
    let tx = conn
        .unchecked_transaction()
        .map_err(|e| sql_error(op, &e))?;
    let mut survey = Survey::default();
    {
        let mut sessions = tx
            .prepare("SELECT id, header FROM sessions ORDER BY created_at, rowid")
            .map_err(|e| sql_error(op, &e))?;
        let mut last = tx
            .prepare("SELECT seq, json FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1")
            .map_err(|e| sql_error(op, &e))?;
        let mut rows = sessions.query([]).map_err(|e| sql_error(op, &e))?;
        loop {
            let row = match rows.next() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(e) => {
                    // The rest of the session table is unreadable: say so and keep what was read.
                    survey.damaged.push(DamagedSession {
                        id: "the session table".to_string(),
                        reason: format!(
                            "sessions after the {} listed cannot be read: {}",
                            survey.sessions.len() + survey.damaged.len(),
                            super::describe(&e)
                        ),
                    });
                    break;
                }
            };
            match summarize(&mut last, row) {
                Ok(Some(summary)) => survey.sessions.push(summary),
                Ok(None) => {}
                Err(damaged) => survey.damaged.push(damaged),
            }
        }
    }
    tx.finish().map_err(|e| sql_error(op, &e))?;
    Ok(survey)
}

/// One row of the session table as a `SessionSummary` (its last event read with `last`); `None` for
/// a session with no durable event, which is not listed.
fn summarize(
    last: &mut rusqlite::Statement<'_>,
    row: &rusqlite::Row<'_>,
) -> Result<Option<SessionSummary>, DamagedSession> {
    let id: String = row.get(0).map_err(|e| DamagedSession {
        id: "a session".to_string(),
        reason: format!("its id cannot be read: {}", super::describe(&e)),
    })?;
    let damaged = |reason: String| DamagedSession {
        id: id.clone(),
        reason,
    };
    let header_json: String = row.get(1).map_err(|e| {
        damaged(format!(
            "its header cannot be read: {}",
            super::describe(&e)
        ))
    })?;
    let header: SessionHeader = serde_json::from_str(&header_json)
        .map_err(|e| damaged(format!("its stored header is invalid: {e}")))?;
    let tail: Option<(i64, String)> = last
        .query_row([id.as_str()], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .map_err(|e| {
            damaged(format!(
                "its last event cannot be read: {}",
                super::describe(&e)
            ))
        })?;
    // A session whose every row was cut as a torn tail has no durable event: not listed.
    let Some((last_seq, last_json)) = tail else {
        return Ok(None);
    };
    Ok(Some(SessionSummary {
        header,
        n_events: u64::try_from(last_seq).map_or(0, |s| s.saturating_add(1)),
        last_time: Event::from_json(&last_json).ok().map(|e| e.time),
    }))
}

#[cfg(test)]
mod tests {
    use rusqlite::StatementStatus;

    use super::READ_SLOT_SQL;
    use crate::SessionId;
    use crate::session::event::SessionHeader;
    use crate::session::store::SessionStore;
    use crate::session::store::sqlite::{SqliteConfig, SqliteStore};

    /// The id lookup behind `create` runs its cached statement as prepared, whatever id is bound:
    /// without the query planner stability guarantee SQLite re-prepared it at every new id (~55k
    /// instructions a lookup, 13x the lookup itself).
    #[tokio::test]
    async fn an_id_lookup_is_never_prepared_again_for_a_new_id() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), SqliteConfig::default()).unwrap();
        for i in 0..20 {
            let id = SessionId::new(&format!("named-{i}")).unwrap();
            store.create(&SessionHeader::new(id, 0)).await.unwrap();
        }
        let db = store.shared.take_reader().unwrap();
        {
            let stmt = db.prepare_cached(READ_SLOT_SQL).unwrap();
            assert!(
                stmt.get_status(StatementStatus::Run) >= 20,
                "not the connection that read"
            );
            assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
        }
        store.shared.put_reader(db);
        store.close().await.unwrap();
    }
}
