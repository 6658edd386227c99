//! The read path every store shares: stored rows in seq order in, a validated log out — or the
//! reason it cannot be trusted.
//!
//! A backend feeds `Scanner::push` one stored row at a time (seq, the `kind` column, the event JSON)
//! and calls `finish`. The scanner parses each row, checks that seqs are contiguous from 0 and that the
//! row agrees with its own event, and stops accepting at the first row that does not. Whether that row
//! is a *torn tail* or *corruption* is decided as in `reference/session-llm.md` §5.6: if any later row
//! holds a `turn/end`, the damage sits before a committed turn end and the log is `Corrupt`; otherwise
//! everything from the bad row on is a torn tail that `load` cuts (durably) and `inspect` reports.
//! Unlike a JSON-lines file, a store row also names its type in the `kind` column, so a refused row
//! whose own `kind` says `turn/end` is a damaged committed turn end: `Corrupt` as well.
//!
//! That rule fits a store whose last write can be half done (the memory store stands in for one).
//! SQLite cannot tear a committed transaction, so there an unreadable row is never a torn tail, only
//! real damage to acknowledged input: with `Damage::Corrupt` the scanner refuses the log whatever
//! follows the bad row, and names every damaged seq (the scan reads on to the end to find them all).
//! The accepted prefix is then validated again with `Session::from_events` (the second half of the
//! paired assertion: the session writer validated these events before they were appended), and the
//! closers for an open tail turn are computed with `session::repair::interrupted_turn_closers`.
//!
//! What must stay true: nothing read from disk can panic here; each row is bounded by
//! `Limits::event_bytes_max` (a backend passes the stored length and may withhold the bytes of a row
//! that is too long), and a log by `Limits::session_events_max`.
//!
//! `check_batch` is the write side's first check, the same in every store: a batch's seqs are
//! contiguous and each record fits `Limits::event_bytes_max` (so that nothing is written that a load
//! would refuse).
//!
//! Called by `sqlite/` (with `Damage::Corrupt`) and `memory.rs` (with `Damage::TornTail`), in
//! `append`, `load` and `inspect`.

use crate::ids::SessionId;
use crate::limits::Limits;
use crate::session::event::Event;
use crate::session::log::Session;
use crate::session::repair::interrupted_turn_closers;
use crate::session::store::{EncodedEvent, StoreError};

/// One stored row as a backend read it. Fields are options because a damaged database can hold a
/// `NULL` or a value of the wrong type in any column.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowRef<'a> {
    /// The row's `seq` column, when it holds a non-negative integer.
    pub seq: Option<u64>,
    /// The row's `kind` column, when it holds text.
    pub kind: Option<&'a str>,
    /// The stored length of the event JSON in bytes.
    pub bytes: u64,
    /// The event JSON; `None` when the column is not text or the backend withheld a row longer than
    /// `Limits::event_bytes_max`.
    pub json: Option<&'a [u8]>,
}

/// A stored log, scanned and validated.
#[derive(Debug)]
pub(crate) struct Scanned {
    /// The valid prefix, seqs contiguous from 0, validated by `Session::from_events`.
    pub events: Vec<Event>,
    /// The first bad row of a torn tail (its position in the log) and why it was refused.
    pub torn_tail: Option<(u64, String)>,
    /// One past the greatest seq stored, torn rows included: what the store's next seq is before a
    /// repair. A repair is only committed if the stored end is still this.
    pub raw_end: u64,
    /// The events that close an open tail turn (empty for a balanced log).
    pub closers: Vec<Event>,
}

impl Scanned {
    /// The closers as store records.
    pub fn encoded_closers(&self) -> Vec<EncodedEvent> {
        EncodedEvent::encode_all(&self.closers)
    }

    /// Whether a `load` has anything to write: a tail to cut or closers to append.
    pub fn needs_repair(&self) -> bool {
        self.torn_tail.is_some() || !self.closers.is_empty()
    }
}

/// What an unreadable row means to the backend that stored it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Damage {
    /// The last write may be half done: a bad row with no committed `turn/end` after it starts a
    /// torn tail that `load` cuts (the memory store, which models such a backend).
    TornTail,
    /// Committed writes cannot tear (SQLite): any bad row is corruption, and the scan lists them all.
    Corrupt,
}

/// How many damaged seqs a `Damage::Corrupt` scan names in its error; the rest are counted.
const DAMAGED_NAMED_MAX: usize = 16;

/// The damaged rows a `Damage::Corrupt` scan found after the first refused one.
#[derive(Debug, Default)]
struct DamagedRows {
    /// The first damaged seqs, ascending, at most `DAMAGED_NAMED_MAX`.
    named: Vec<u64>,
    /// Damaged seqs in all (missing seqs included).
    n: u64,
    /// The seq the next row should carry: one past the last row with a valid seq.
    cursor: u64,
}

impl DamagedRows {
    /// Records seqs `from..to` as damaged.
    fn note(&mut self, from: u64, to: u64) {
        let n = to.saturating_sub(from);
        self.n = self.n.saturating_add(n);
        let room = DAMAGED_NAMED_MAX.saturating_sub(self.named.len()) as u64;
        self.named.extend(from..from.saturating_add(n.min(room)));
    }

    /// Checks one row on its own (its neighbours may be damaged): missing seqs before it and the row
    /// itself are noted.
    fn check(&mut self, row: &RowRef<'_>, limits: &Limits) {
        let Some(seq) = row.seq else {
            // A row whose seq is unreadable stands where the next seq should be.
            self.note(self.cursor, self.cursor.saturating_add(1));
            return;
        };
        if seq > self.cursor {
            self.note(self.cursor, seq);
        }
        if check_row(seq, row, limits).is_err() {
            self.note(seq, seq.saturating_add(1));
        }
        self.cursor = seq.saturating_add(1);
    }

    /// `seq 3, 4, 9` (and how many more).
    fn describe(&self) -> String {
        let list: Vec<String> = self.named.iter().map(u64::to_string).collect();
        let more = self.n.saturating_sub(self.named.len() as u64);
        let mut text = format!(
            "{} damaged row{} (seq {}",
            self.n,
            if self.n == 1 { "" } else { "s" },
            list.join(", ")
        );
        if more > 0 {
            text.push_str(&format!(" and {more} more"));
        }
        text.push(')');
        text
    }
}

/// Scans one session's rows in seq order. See the module docs.
pub(crate) struct Scanner<'l> {
    id: SessionId,
    limits: &'l Limits,
    damage: Damage,
    /// With `Damage::Corrupt`, once a row is refused: every damaged seq from there on.
    damaged: DamagedRows,
    /// The accepted prefix.
    ///
    /// Invariant: `events[i].seq == i`, so `events.len()` is the seq the next good row must carry.
    events: Vec<Event>,
    /// The first refused row: its position in the log and the reason. Once set, no row is accepted.
    issue: Option<(u64, String)>,
    /// Whether the row of `issue` or a later one holds a `turn/end` (which makes the issue
    /// corruption).
    turn_end_after_issue: bool,
    /// One past the greatest seq seen in any row.
    raw_end: u64,
    n_rows: u64,
}

impl<'l> Scanner<'l> {
    /// A scanner for session `id`, reading within `limits`, treating a bad row as `damage` says.
    pub fn new(id: SessionId, limits: &'l Limits, damage: Damage) -> Scanner<'l> {
        Scanner {
            id,
            limits,
            damage,
            damaged: DamagedRows::default(),
            events: Vec::new(),
            issue: None,
            turn_end_after_issue: false,
            raw_end: 0,
            n_rows: 0,
        }
    }

    /// How many rows a backend should read at most: one more than the limit, so that a log over the
    /// limit is noticed rather than silently cut.
    pub fn rows_to_read_max(limits: &Limits) -> u64 {
        (limits.session_events_max as u64).saturating_add(1)
    }

    /// Takes the next stored row (rows must come in ascending seq order).
    ///
    /// # Errors
    /// `LogTooLong` when the log holds more rows than `Limits::session_events_max`.
    pub fn push(&mut self, row: RowRef<'_>) -> Result<(), StoreError> {
        self.n_rows += 1;
        let n_events_max = self.limits.session_events_max as u64;
        if self.n_rows > n_events_max {
            return Err(StoreError::LogTooLong {
                id: self.id.clone(),
                n_events_max,
            });
        }
        if let Some(seq) = row.seq {
            self.raw_end = self.raw_end.max(seq.saturating_add(1));
        }
        if self.issue.is_some() {
            if holds_turn_end(&row) {
                self.turn_end_after_issue = true;
            }
            if self.damage == Damage::Corrupt {
                self.damaged.check(&row, self.limits);
            }
            return Ok(());
        }
        let position = self.events.len() as u64;
        match self.accept(position, &row) {
            Ok(event) => self.events.push(event),
            Err(reason) => {
                self.issue = Some((position, reason));
                self.turn_end_after_issue = holds_turn_end(&row);
                if self.damage == Damage::Corrupt {
                    self.damaged.cursor = position;
                    self.damaged.check(&row, self.limits);
                }
            }
        }
        Ok(())
    }

    /// Parses and checks one row that should sit at `position`.
    fn accept(&self, position: u64, row: &RowRef<'_>) -> Result<Event, String> {
        match row.seq {
            Some(seq) if seq == position => check_row(seq, row, self.limits),
            Some(seq) => Err(format!(
                "seq {position} is missing: the next stored row has seq {seq}"
            )),
            None => Err(format!("the row after seq {position} has no valid seq")),
        }
    }

    /// Classifies the damage, validates the prefix and computes the closers.
    ///
    /// # Errors
    /// `Corrupt` when a refused row lies before a later `turn/end`, or the prefix fails
    /// `Session::from_events`.
    pub fn finish(self) -> Result<Scanned, StoreError> {
        let corrupt = |seq: u64, reason: String| StoreError::Corrupt {
            id: self.id.clone(),
            seq,
            reason,
        };
        if let Some((seq, reason)) = &self.issue
            && self.damage == Damage::Corrupt
        {
            return Err(corrupt(
                *seq,
                format!(
                    "{}; the first: {reason} (a committed row cannot tear, so this session cannot be continued)",
                    self.damaged.describe()
                ),
            ));
        }
        if let Some((seq, reason)) = &self.issue
            && self.turn_end_after_issue
        {
            return Err(corrupt(
                *seq,
                format!("{reason} (a later row holds a committed turn/end)"),
            ));
        }
        let session = Session::from_events(self.id.clone(), self.events)
            .map_err(|(seq, e)| corrupt(seq, e.to_string()))?;
        let events = session.into_events();
        let closers = interrupted_turn_closers(&events);
        Ok(Scanned {
            events,
            torn_tail: self.issue,
            raw_end: self.raw_end,
            closers,
        })
    }
}

/// Checks a batch before it is written: contiguous seqs, each record within the size limit.
///
/// # Errors
/// `SeqMismatch` naming the first seq out of line, `EventTooLarge` naming the first record too long.
pub(crate) fn check_batch(
    id: &SessionId,
    events: &[EncodedEvent],
    limits: &Limits,
) -> Result<(), StoreError> {
    let Some(first) = events.first() else {
        return Ok(());
    };
    for (i, event) in events.iter().enumerate() {
        let expected = first.seq.saturating_add(i as u64);
        if event.seq != expected {
            return Err(StoreError::SeqMismatch {
                id: id.clone(),
                expected,
                got: event.seq,
            });
        }
        if event.json.len() > limits.event_bytes_max {
            return Err(StoreError::EventTooLarge {
                id: id.clone(),
                seq: event.seq,
                bytes: event.json.len(),
                bytes_max: limits.event_bytes_max,
            });
        }
    }
    Ok(())
}

/// Parses and checks one row stored at `seq`: within the size limit, text, a valid event carrying
/// that seq, and the `kind` column agreeing with it.
fn check_row(seq: u64, row: &RowRef<'_>, limits: &Limits) -> Result<Event, String> {
    let bytes_max = limits.event_bytes_max as u64;
    if row.bytes > bytes_max {
        return Err(format!(
            "the stored event is {} bytes, the limit is {bytes_max}",
            row.bytes
        ));
    }
    let Some(json) = row.json else {
        return Err("the stored event is not text".to_string());
    };
    let event = Event::from_json_bytes(json).map_err(|e| e.to_string())?;
    if event.seq != seq {
        return Err(format!(
            "the row for seq {seq} holds an event with seq {}",
            event.seq
        ));
    }
    match row.kind {
        Some(kind) if kind == event.kind() => Ok(event),
        Some(kind) => Err(format!(
            "the kind column says {kind:?} but the event is {:?}",
            event.kind()
        )),
        None => Err("the kind column is not text".to_string()),
    }
}

/// Whether a row after the first refused one records a committed turn end: its `kind` column says
/// so, or its JSON parses to a `turn/end`. Either is enough — when in doubt we refuse to drop data.
fn holds_turn_end(row: &RowRef<'_>) -> bool {
    if row.kind == Some("turn/end") {
        return true;
    }
    row.json
        .and_then(|json| std::str::from_utf8(json).ok())
        .and_then(|text| Event::from_json(text).ok())
        .is_some_and(|event| event.kind() == "turn/end")
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = r#"{"type":"turn/start","seq":0,"time":10,"data":{"turn":1}}"#;
    const E1: &str =
        r#"{"type":"turn/end","seq":1,"time":11,"data":{"turn":1,"reason":{"kind":"completed"}}}"#;
    const T2: &str = r#"{"type":"turn/start","seq":2,"time":12,"data":{"turn":2}}"#;
    const E2: &str =
        r#"{"type":"turn/end","seq":3,"time":13,"data":{"turn":2,"reason":{"kind":"completed"}}}"#;

    fn row<'a>(seq: u64, kind: &'a str, json: &'a str) -> RowRef<'a> {
        RowRef {
            seq: Some(seq),
            kind: Some(kind),
            bytes: json.len() as u64,
            json: Some(json.as_bytes()),
        }
    }

    fn scan(rows: &[RowRef<'_>], limits: &Limits) -> Result<Scanned, StoreError> {
        let mut scanner = Scanner::new(SessionId::new("s").unwrap(), limits, Damage::TornTail);
        for r in rows {
            scanner.push(*r)?;
        }
        scanner.finish()
    }

    #[test]
    fn balanced_log_needs_no_repair() {
        let s = scan(
            &[row(0, "turn/start", T1), row(1, "turn/end", E1)],
            &Limits::DEFAULT,
        )
        .unwrap();
        assert_eq!(s.events.len(), 2);
        assert_eq!(s.raw_end, 2);
        assert!(!s.needs_repair());
    }

    #[test]
    fn garbage_after_the_last_turn_end_is_a_torn_tail() {
        let s = scan(
            &[
                row(0, "turn/start", T1),
                row(1, "turn/end", E1),
                row(2, "turn/start", "{\"type\":\"turn/st"),
                row(3, "turn/start", T1),
            ],
            &Limits::DEFAULT,
        )
        .unwrap();
        assert_eq!(s.events.len(), 2);
        assert_eq!(s.raw_end, 4);
        let (seq, reason) = s.torn_tail.unwrap();
        assert_eq!(seq, 2);
        assert!(reason.contains("invalid event"), "{reason}");
        assert!(s.closers.is_empty());
    }

    fn scan_strict(rows: &[RowRef<'_>]) -> Result<Scanned, StoreError> {
        let limits = Limits::DEFAULT;
        let mut scanner = Scanner::new(SessionId::new("s").unwrap(), &limits, Damage::Corrupt);
        for r in rows {
            scanner.push(*r)?;
        }
        scanner.finish()
    }

    /// With `Damage::Corrupt` (SQLite), garbage after the last turn end is not a torn tail: the log
    /// is refused at the first bad seq.
    #[test]
    fn a_committed_store_refuses_garbage_after_the_last_turn_end() {
        let err = scan_strict(&[
            row(0, "turn/start", T1),
            row(1, "turn/end", E1),
            row(2, "turn/start", "{\"type\":\"turn/st"),
        ])
        .unwrap_err();
        let StoreError::Corrupt { seq, reason, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!(seq, 2);
        assert!(
            reason.starts_with("1 damaged row (seq 2); the first: invalid event"),
            "{reason}"
        );
    }

    /// Every damaged seq is named: bad rows, a missing seq, a row whose seq is unreadable; good rows
    /// between them are not.
    #[test]
    fn a_committed_store_names_every_damaged_seq() {
        let t2 = row(2, "turn/start", T2);
        let mut no_seq = row(0, "turn/start", T1);
        no_seq.seq = None;
        let err = scan_strict(&[
            row(0, "turn/start", T1),
            row(1, "turn/end", "x"),
            t2,
            row(5, "turn/end", "y"),
            no_seq,
        ])
        .unwrap_err();
        let StoreError::Corrupt { seq, reason, .. } = err else {
            panic!("{err:?}")
        };
        assert_eq!(seq, 1);
        assert!(
            reason.starts_with("5 damaged rows (seq 1, 3, 4, 5, 6); the first: "),
            "{reason}"
        );
        let rows: Vec<String> = (0..40).map(|i| format!("bad{i}")).collect();
        let mut all = vec![row(0, "turn/start", T1)];
        all.extend(
            rows.iter()
                .enumerate()
                .map(|(i, j)| row(i as u64 + 1, "turn/end", j)),
        );
        let err = scan_strict(&all).unwrap_err().to_string();
        assert!(
            err.contains("40 damaged rows (seq 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 and 24 more)"),
            "{err}"
        );
    }

    #[test]
    fn damage_before_a_later_turn_end_is_corruption() {
        let err = scan(
            &[
                row(0, "turn/start", T1),
                row(1, "turn/end", "not json"),
                row(2, "turn/start", T2),
                row(3, "turn/end", E2),
            ],
            &Limits::DEFAULT,
        )
        .unwrap_err();
        match err {
            StoreError::Corrupt { seq, reason, .. } => {
                assert_eq!(seq, 1);
                assert!(reason.contains("committed turn/end"), "{reason}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    #[test]
    fn a_gap_is_named_by_the_missing_seq() {
        let err = scan(
            &[
                row(0, "turn/start", T1),
                row(2, "turn/start", T2),
                row(3, "turn/end", E2),
            ],
            &Limits::DEFAULT,
        )
        .unwrap_err();
        assert_eq!(
            err,
            StoreError::Corrupt {
                id: SessionId::new("s").unwrap(),
                seq: 1,
                reason: "seq 1 is missing: the next stored row has seq 2 (a later row holds a \
                         committed turn/end)"
                    .into()
            }
        );
    }

    #[test]
    fn a_kind_column_that_disagrees_is_refused() {
        // The kind column says step/start but the JSON is a turn/start: refused; nothing at or after
        // it is a turn end, so it is a torn tail.
        let s = scan(
            &[
                row(0, "turn/start", T1),
                row(1, "turn/end", E1),
                row(2, "step/start", T2),
            ],
            &Limits::DEFAULT,
        )
        .unwrap();
        assert_eq!(s.events.len(), 2);
        let (seq, reason) = s.torn_tail.unwrap();
        assert_eq!(seq, 2);
        assert_eq!(
            reason,
            "the kind column says \"step/start\" but the event is \"turn/start\""
        );
        assert!(s.closers.is_empty());
    }

    #[test]
    fn a_damaged_row_that_is_a_turn_end_is_corruption() {
        // The last row is refused, and either its kind column or its JSON says turn/end.
        for last in [row(1, "turn/end", "{garbage"), row(1, "step/end", E1)] {
            let err = scan(&[row(0, "turn/start", T1), last], &Limits::DEFAULT).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt { seq: 1, .. }), "{err:?}");
        }
    }

    #[test]
    fn rows_over_the_limits_are_refused() {
        let limits = Limits {
            session_events_max: 2,
            event_bytes_max: 80,
            ..Limits::DEFAULT
        };
        let err = scan(
            &[
                row(0, "turn/start", T1),
                row(1, "turn/end", E1),
                row(2, "turn/start", T2),
            ],
            &limits,
        )
        .unwrap_err();
        assert_eq!(
            err,
            StoreError::LogTooLong {
                id: SessionId::new("s").unwrap(),
                n_events_max: 2
            }
        );
        let big = RowRef {
            bytes: 81,
            json: None,
            ..row(1, "step/start", "")
        };
        let s = scan(&[row(0, "turn/start", T1), big], &limits).unwrap();
        assert_eq!(
            s.torn_tail,
            Some((1, "the stored event is 81 bytes, the limit is 80".into()))
        );
    }

    #[test]
    fn an_invalid_prefix_is_corruption() {
        // A turn/end whose error payload fails validation is refused by `Session::from_events`.
        let bad = r#"{"type":"turn/end","seq":1,"time":11,"data":{"turn":1,"reason":{"kind":"error","error":{"message":"","code":"X"}}}}"#;
        let err = scan(
            &[row(0, "turn/start", T1), row(1, "turn/end", bad)],
            &Limits::DEFAULT,
        )
        .unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { seq: 1, .. }), "{err:?}");
    }
}
