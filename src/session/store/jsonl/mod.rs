//! DSH v0 JSON lines: `dsh export` / `dsh import`, the format that moves a session between dsh-rs and
//! the original harness (`reference/session-llm.md` §5.6).
//!
//! A log is a header line `{"type":"session","version":0,"id":…,"createdAt":…,"cwd"?:…,
//! "parentSession"?:…,"seedLength"?:…,"origin"?:…,"delegationDepth":<int>,"agentPreset"?:…}` (keys in
//! that order, optional keys omitted, never `null`) followed by one record per line, each ending in
//! `\n`: an event exactly as `Event::to_json` writes it, or — in logs the original wrote — a packed
//! chunk row that stands for a run of `assistant/chunk` events (`jsonl/legacy.rs`, used only here).
//!
//! `export` writes one event per line, so `export(import(x)) == x` byte for byte for every log dsh-rs
//! writes, and for every log the original wrote one event per line and that needed no conversion:
//! payload keys the runtime does not know, and keys in another order, are kept as written
//! (`Event::raw_data`), as the original keeps them (SPEC §17). `import` trusts nothing: every line is bounded (`Limits::event_bytes_max`), the nesting
//! depth is checked without recursion before serde sees a line (`Limits::json_depth_max`), the event
//! count is bounded (`Limits::session_events_max`), rows are decoded strictly, the original's old
//! shapes are converted (and each conversion reported), unknown non-ignorable types and other format
//! versions are refused, and the result is validated with `Session::from_events` and
//! `invariant::check`. Every refusal is a typed `ImportError` naming the line (the header is line 1).
//!
//! A log compressed with zstd (the original's default `session.jsonl.zstd`, `jsonl/zstd.rs`) is
//! recognised by its magic bytes and read the same way, under the same bounds on the decompressed
//! lines; `zstd::export_zstd` writes that layout.
//!
//! Damage follows the original's scanner: the first line that cannot be read as records — not JSON,
//! not UTF-8, too long or too deep, a malformed row, a seq gap — stops the log there. If any later line
//! is a `turn/end`, the damage is inside the committed log and the import fails (`Corrupt`); otherwise
//! everything from that line on is a torn tail, cut and reported in `Imported::torn_tail`. A final line
//! without its `\n` was never completely written and is always a torn tail. A line that *is* a readable
//! record but not a valid event is an error wherever it is. An open tail turn is kept as it is: the
//! store closes it (`session::repair`) when it loads the session.

pub mod legacy;
pub mod zstd;

use std::borrow::Cow;
use std::io::{self, BufRead, Write};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::ids::SessionId;
use crate::limits::Limits;
use crate::session::event::{Event, EventData, KNOWN_EVENT_TYPES, SessionHeader};
use crate::session::invariant::{self, Violation};
use crate::session::log::{AppendError, Session};

use self::legacy::{LegacyError, RowTag, SAFE_INTEGER_MAX};

/// How a caller wants an import adjusted. The default changes nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportOptions {
    /// Import under this id instead of the header's (which must still be a string). Lets a log whose
    /// id is not a valid dsh-rs session id — or a snapshot's `{{sessionId}}` placeholder — be imported,
    /// and a copy of a session be imported beside the original.
    pub session_id: Option<SessionId>,
    /// Replace the header's `cwd` (which must then be absent or a string). Must be absolute.
    pub cwd: Option<String>,
}

/// A session read from JSON lines: validated, in the current shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Imported {
    /// The header line, with `ImportOptions` applied.
    pub header: SessionHeader,
    /// Contiguous from seq 0; valid for `Session::from_events` and `invariant::check`. The last turn
    /// may be open.
    pub events: Vec<Event>,
    /// The read-time legacy conversions applied, one entry per converted record, each naming its line
    /// and seq (`line 3 (seq 1): turn/start: obsolete trigger dropped`). Empty for a current log.
    pub conversions: Vec<String>,
    /// What was cut after the last committed record, if anything.
    pub torn_tail: Option<TornTail>,
}

/// A damaged or incomplete tail that `import` cut.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    /// The first line cut (1-based; the header is line 1).
    pub line: usize,
    /// Why that line could not be read.
    pub reason: String,
    /// Lines cut, that one included.
    pub n_lines: usize,
}

/// Why an import was refused. Nothing was imported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ImportError {
    /// The input could not be read.
    #[error("reading line {line} failed: {cause}")]
    Read {
        /// The line being read (1-based; the header is line 1).
        line: usize,
        /// The I/O error.
        cause: String,
    },
    /// There is no header line.
    #[error("the input is empty: a log starts with a session header line")]
    Empty,
    /// A zstd-compressed log whose stream is damaged, or whose decompressed text breaks a bound.
    #[error(transparent)]
    Decompress(#[from] zstd::DecompressError),
    /// The header line is torn, too long or invalid.
    #[error("line 1: {reason}")]
    Header {
        /// What is wrong with it.
        reason: String,
    },
    /// The log is in a format version other than v0.
    #[error("line 1: the log uses format v{version}, but this build reads only v0: {}", version_hint(*.version))]
    UnsupportedVersion {
        /// The header's version.
        version: i64,
    },
    /// A record of a type this build does not know, not marked ignorable.
    #[error(
        "line {line} (seq {seq}): event type {kind:?} is unknown to this build and not marked ignorable; refusing to interpret the log"
    )]
    UnknownType {
        /// The record's line.
        line: usize,
        /// Its seq.
        seq: u64,
        /// Its type.
        kind: String,
    },
    /// An old shape that cannot be converted.
    #[error("line {line}: {source}")]
    Legacy {
        /// The record's line.
        line: usize,
        /// Why it cannot be converted.
        #[source]
        source: LegacyError,
    },
    /// A readable record that is not a valid event.
    #[error("line {line} (seq {seq}): {reason}")]
    Invalid {
        /// The record's line.
        line: usize,
        /// Its seq.
        seq: u64,
        /// Why it is not a valid event.
        reason: String,
    },
    /// A damaged line before a committed `turn/end`: the committed log itself is damaged.
    #[error(
        "line {line}: {reason}; a turn/end follows at line {turn_end_line}, so the damage is inside the committed log"
    )]
    Corrupt {
        /// The first damaged line.
        line: usize,
        /// Why it could not be read.
        reason: String,
        /// The line of the later `turn/end`.
        turn_end_line: usize,
    },
    /// The log holds more than `Limits::session_events_max` events.
    #[error("line {line}: the log holds more than {events_max} events, the limit")]
    TooManyEvents {
        /// The line that went over the limit.
        line: usize,
        /// The limit.
        events_max: usize,
    },
    /// An event the log refuses (`Session::from_events`).
    #[error("line {line} (seq {seq}): {source}")]
    Rejected {
        /// The event's line.
        line: usize,
        /// Its seq.
        seq: u64,
        /// Why the log refuses it.
        #[source]
        source: AppendError,
    },
    /// The log breaks a relational invariant (`invariant::check`).
    #[error("line {line}: {source}")]
    Invariant {
        /// The line of the first event that breaks it.
        line: usize,
        /// The rule broken.
        #[source]
        source: Violation,
    },
}

fn version_hint(version: i64) -> &'static str {
    if version > 0 {
        "the log was written by a newer harness"
    } else {
        "the log is older than v0, and this build has no upgrade path for it"
    }
}

/// Writes `header` and `events` as DSH v0 JSON lines, one event per line, each line ending in `\n`.
///
/// # Errors
/// The first write error of `out`.
pub fn export(header: &SessionHeader, events: &[Event], out: &mut impl Write) -> io::Result<()> {
    let mut w = io::BufWriter::new(out);
    write_header(&mut w, header)?;
    for event in events {
        serde_json::to_writer(&mut w, event)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

/// Like `export`, but packs runs of delta chunks into chunk rows as the original writes by default
/// (`reference/session-llm.md` §4.2): a much smaller file that both harnesses read.
///
/// # Errors
/// The first write error of `out`.
pub fn export_packed(
    header: &SessionHeader,
    events: &[Event],
    out: &mut impl Write,
) -> io::Result<()> {
    let mut w = io::BufWriter::new(out);
    write_header(&mut w, header)?;
    for record in legacy::pack_chunk_runs(events) {
        serde_json::to_writer(&mut w, &record)?;
        w.write_all(b"\n")?;
    }
    w.flush()
}

fn write_header(w: &mut impl Write, header: &SessionHeader) -> io::Result<()> {
    #[derive(serde::Serialize)]
    struct HeaderLine<'a> {
        #[serde(rename = "type")]
        tag: &'static str,
        #[serde(flatten)]
        header: &'a SessionHeader,
    }
    serde_json::to_writer(
        &mut *w,
        &HeaderLine {
            tag: "session",
            header,
        },
    )?;
    w.write_all(b"\n")
}

/// Reads a DSH v0 JSON-lines log.
///
/// # Errors
/// `ImportError` naming the line and the reason; see the module documentation.
pub fn import(input: &mut impl BufRead, limits: &Limits) -> Result<Imported, ImportError> {
    import_with(input, limits, &ImportOptions::default())
}

/// `import` with `options` applied to the header.
///
/// # Errors
/// `ImportError` naming the line and the reason; see the module documentation.
pub fn import_with(
    input: &mut impl BufRead,
    limits: &Limits,
    options: &ImportOptions,
) -> Result<Imported, ImportError> {
    let head = loop {
        match input.fill_buf() {
            Ok(head) => break head,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(read_error(1)(e)),
        }
    };
    if zstd::is_zstd(head) {
        let decompressed = zstd::Decompressed::new(input, limits).map_err(read_error(1))?;
        let mut reader = io::BufReader::new(decompressed);
        let mut imported = import_lines(&mut reader, limits, options)?;
        if reader.get_ref().cut_short() && imported.torn_tail.is_none() {
            imported.torn_tail = Some(TornTail {
                line: imported.events.len() + 2,
                reason: "the last zstd frame is incomplete: its write was cut short".into(),
                n_lines: 0,
            });
        }
        return Ok(imported);
    }
    import_lines(input, limits, options)
}

/// `import_with` on the plain (decompressed) lines.
fn import_lines(
    input: &mut impl BufRead,
    limits: &Limits,
    options: &ImportOptions,
) -> Result<Imported, ImportError> {
    let mut buf = Vec::new();
    let (header, header_conversion) = read_header(input, &mut buf, limits, options)?;
    let mut scan = Scan {
        limits,
        session_id: header.id.clone(),
        events: Vec::new(),
        lines: Vec::new(),
        conversions: header_conversion.into_iter().collect(),
        issue: None,
    };
    let torn_tail = scan_records(input, &mut buf, &mut scan)?;
    let Scan {
        events,
        lines,
        conversions,
        ..
    } = scan;
    let line_of = |seq: u64| {
        usize::try_from(seq)
            .ok()
            .and_then(|i| lines.get(i))
            .map_or(0, |&l| l as usize)
    };
    let session = Session::from_events(header.id.clone(), events).map_err(|(seq, source)| {
        ImportError::Rejected {
            line: line_of(seq),
            seq,
            source,
        }
    })?;
    let events = session.into_events();
    invariant::check(&events).map_err(|source| ImportError::Invariant {
        line: line_of(source.seq),
        source,
    })?;
    Ok(Imported {
        header,
        events,
        conversions,
        torn_tail,
    })
}

/// A read error on `line`, as an `ImportError`; a zstd log that cannot be decompressed is
/// `Decompress`, at the line where decoding stopped.
fn read_error(line: usize) -> impl Fn(io::Error) -> ImportError {
    move |e: io::Error| {
        if let Some(d) = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<zstd::DecompressError>())
        {
            return ImportError::Decompress(d.clone());
        }
        ImportError::Read {
            line,
            cause: e.to_string(),
        }
    }
}

/// Reads and parses the header line (line 1); returns the header and the legacy conversion applied
/// to it, if any.
///
/// # Errors
/// `Empty` for no input, `Header` for a header line that is torn, too long or invalid, `Read`.
fn read_header(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    limits: &Limits,
    options: &ImportOptions,
) -> Result<(SessionHeader, Option<String>), ImportError> {
    let header_bad = |reason: String| ImportError::Header { reason };
    match read_line(input, buf, limits.event_bytes_max).map_err(read_error(1))? {
        LineRead::Eof => Err(ImportError::Empty),
        LineRead::Torn { n_bytes, .. } => Err(header_bad(format!(
            "the header line ({n_bytes} bytes) is not newline-terminated: nothing was committed"
        ))),
        LineRead::TooLong { n_bytes } => Err(header_bad(format!(
            "the header line is {n_bytes} bytes, the limit is {}",
            limits.event_bytes_max
        ))),
        LineRead::Complete => parse_header(buf, limits, options),
    }
}

/// Reads every record line after the header into `scan`; returns the torn tail to cut, if any (the
/// scanner's, plus a final line without its `\n`).
///
/// # Errors
/// What `Scan` refuses (corruption before a committed `turn/end`, an invalid record), `Read`.
fn scan_records(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    scan: &mut Scan<'_>,
) -> Result<Option<TornTail>, ImportError> {
    let bytes_max = scan.limits.event_bytes_max;
    let mut line = 1;
    let mut torn_final: Option<(usize, String)> = None;
    loop {
        line += 1;
        match read_line(input, buf, bytes_max).map_err(read_error(line))? {
            LineRead::Eof => break,
            LineRead::Torn { n_bytes, too_long } => {
                let size = if too_long {
                    format!("{n_bytes} bytes, over the limit of {bytes_max}")
                } else {
                    format!("{n_bytes} bytes")
                };
                torn_final = Some((
                    line,
                    format!("the final line ({size}) is not newline-terminated"),
                ));
                break;
            }
            LineRead::TooLong { n_bytes } => scan.line_issue(
                line,
                format!("the line is {n_bytes} bytes, the limit is {bytes_max}"),
            )?,
            LineRead::Complete => scan.consume(line, buf)?,
        }
    }
    let torn_tail = match (scan.issue.take(), torn_final) {
        (Some(mut issue), final_line) => {
            issue.n_lines += usize::from(final_line.is_some());
            Some(issue)
        }
        (None, Some((line, reason))) => Some(TornTail {
            line,
            reason,
            n_lines: 1,
        }),
        (None, None) => None,
    };
    if let Some(torn) = &torn_tail {
        tracing::warn!(
            line = torn.line,
            n_lines = torn.n_lines,
            reason = %torn.reason,
            "import cut a torn tail after the last committed turn/end"
        );
    }
    Ok(torn_tail)
}

/// What `read_line` found.
enum LineRead {
    /// No more input.
    Eof,
    /// A line ending in `\n` is in the buffer (without the `\n`).
    Complete,
    /// A line ending in `\n` was longer than the bound; it was consumed but not kept.
    TooLong { n_bytes: usize },
    /// The input ended inside a line: it was never completely written.
    Torn { n_bytes: usize, too_long: bool },
}

/// Reads one line into `buf` without ever holding more than `bytes_max` bytes of it.
fn read_line(
    input: &mut impl BufRead,
    buf: &mut Vec<u8>,
    bytes_max: usize,
) -> io::Result<LineRead> {
    buf.clear();
    let mut n_bytes = 0usize;
    let mut too_long = false;
    loop {
        let available = match input.fill_buf() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(if n_bytes == 0 {
                LineRead::Eof
            } else {
                LineRead::Torn { n_bytes, too_long }
            });
        }
        let newline = memchr::memchr(b'\n', available);
        let take = newline.unwrap_or(available.len());
        if !too_long {
            if buf.len() + take > bytes_max {
                too_long = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&available[..take]);
            }
        }
        n_bytes = n_bytes.saturating_add(take);
        input.consume(take + usize::from(newline.is_some()));
        if newline.is_some() {
            return Ok(if too_long {
                LineRead::TooLong { n_bytes }
            } else {
                LineRead::Complete
            });
        }
    }
}

/// The deepest nesting of arrays and objects in a JSON text, counted without recursion and without
/// parsing; counting stops as soon as it passes `stop_above`. Brackets inside strings do not count
/// (string contents are skipped with `memchr`, they are most of a log's bytes).
pub fn json_nesting_depth(bytes: &[u8], stop_above: usize) -> usize {
    let mut depth = 0usize;
    let mut deepest = 0usize;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        i += 1;
        match b {
            b'"' => loop {
                // Inside a string: jump to the next quote or backslash.
                let Some(j) = bytes
                    .get(i..)
                    .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
                else {
                    return deepest;
                };
                i += j + 1;
                if bytes[i - 1] == b'"' {
                    break;
                }
                // A backslash escapes the next byte, whatever it is.
                i += 1;
            },
            b'[' | b'{' => {
                depth += 1;
                if depth > deepest {
                    deepest = depth;
                    if deepest > stop_above {
                        return deepest;
                    }
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Parses and validates the header line (§1.1, §5.6); returns the header and, when a legacy header
/// shape was read, what was converted.
fn parse_header(
    bytes: &[u8],
    limits: &Limits,
    options: &ImportOptions,
) -> Result<(SessionHeader, Option<String>), ImportError> {
    let bad = header_bad;
    let map = header_map(bytes, limits)?;
    let header_id = match map.get("id") {
        Some(Value::String(s)) => s.as_str(),
        Some(v) => {
            let got = crate::limits::echo(&v.to_string());
            return Err(bad(format!("header id must be a string, got {got}")));
        }
        None => return Err(bad("the session header has no id".into())),
    };
    let id = match &options.session_id {
        Some(id) => id.clone(),
        None => SessionId::new(header_id).map_err(|e| {
            bad(format!(
                "header id {:?} is not a valid session id: {e}",
                crate::limits::echo(header_id)
            ))
        })?,
    };
    let created_at = header_count(&map, "createdAt")?
        .ok_or_else(|| bad("the session header has no createdAt".into()))?;
    let cwd = header_string(&map, "cwd")?;
    let cwd = options.cwd.clone().or(cwd);
    if let Some(cwd) = &cwd
        && !is_absolute_path(cwd)
    {
        return Err(bad(format!("cwd must be an absolute path, got {cwd:?}")));
    }
    let origin = header_string(&map, "origin")?;
    if let Some(origin) = &origin
        && origin != "subagent"
    {
        return Err(bad(format!("origin must be \"subagent\", got {origin:?}")));
    }
    let (delegation_depth, conversion) = match header_count(&map, "delegationDepth")? {
        Some(depth) => (depth, None),
        // Headers written before delegation existed: absent means top level (§1.1).
        None => (
            0,
            Some("line 1: header without delegationDepth read as delegationDepth 0".to_string()),
        ),
    };
    let header = SessionHeader {
        version: 0,
        id,
        created_at,
        cwd,
        parent_session: header_string(&map, "parentSession")?,
        seed_length: header_count(&map, "seedLength")?,
        origin,
        delegation_depth,
        agent_preset: header_string(&map, "agentPreset")?,
    };
    Ok((header, conversion))
}

/// A header refused for `reason`.
/// A refused header. The reason may repeat values from the header (an id, a key, a number): each
/// is cut by `limits::echo` where it is formatted, and the whole reason is bounded here too, so no
/// value from the file, however long, makes an unbounded error line.
fn header_bad(reason: String) -> ImportError {
    const REASON_CHARS_MAX: usize = 4 * crate::limits::ECHO_CHARS_MAX;
    let reason = match reason.char_indices().nth(REASON_CHARS_MAX) {
        Some((cut, _)) => format!("{}…", &reason[..cut]),
        None => reason,
    };
    ImportError::Header { reason }
}

/// The header line as a JSON object, after the checks that come before its fields: nesting depth,
/// JSON, `type` `session`, `version` 0 (checked before any other structure: a newer format may
/// differ in anything), no retired policy fields, no unknown key.
fn header_map(bytes: &[u8], limits: &Limits) -> Result<Map<String, Value>, ImportError> {
    const KEYS: &[&str] = &[
        "type",
        "version",
        "id",
        "createdAt",
        "cwd",
        "parentSession",
        "seedLength",
        "origin",
        "delegationDepth",
        "agentPreset",
    ];
    let bad = header_bad;
    if json_nesting_depth(bytes, limits.json_depth_max) > limits.json_depth_max {
        return Err(bad(format!(
            "the header nests JSON deeper than {} levels",
            limits.json_depth_max
        )));
    }
    let map: Map<String, Value> = match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => map,
        Ok(_) => return Err(bad("the first line is not a session header".into())),
        Err(e) => {
            return Err(bad(format!(
                "the header line is not valid JSON: {}",
                strip_position(&e.to_string())
            )));
        }
    };
    if map.get("type").and_then(Value::as_str) != Some("session") {
        return Err(bad(
            "the first line is not a session header (its type is not \"session\")".into(),
        ));
    }
    match map.get("version") {
        None => return Err(bad("the session header has no version".into())),
        Some(v) => match v.as_i64() {
            Some(0) => {}
            Some(version) => return Err(ImportError::UnsupportedVersion { version }),
            None => return Err(bad(format!("header version must be an integer, got {v}"))),
        },
    }
    if map.contains_key("sandboxMode") || map.contains_key("approvalPolicy") {
        return Err(bad(
            "session header uses retired policy baseline fields (sandboxMode/approvalPolicy)"
                .into(),
        ));
    }
    if let Some(key) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(bad(format!(
            "the session header has an unknown key {key:?}"
        )));
    }
    Ok(map)
}

/// The header field `key` as a non-negative safe integer (`None` when absent).
fn header_count(map: &Map<String, Value>, key: &str) -> Result<Option<u64>, ImportError> {
    match map.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .filter(|n| *n <= SAFE_INTEGER_MAX.unsigned_abs())
            .map(Some)
            .ok_or_else(|| {
                header_bad(format!(
                    "{key} must be a non-negative safe integer, got {v}"
                ))
            }),
    }
}

/// The header field `key` as a string (`None` when absent).
fn header_string(map: &Map<String, Value>, key: &str) -> Result<Option<String>, ImportError> {
    match map.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(header_bad(format!("{key} must be a string, got {v}"))),
    }
}

/// An absolute path on any platform the original runs on: `/…`, `\\server\…`, or `C:\…` / `C:/…`.
fn is_absolute_path(p: &str) -> bool {
    let b = p.as_bytes();
    p.starts_with('/')
        || p.starts_with("\\\\")
        || (b.len() >= 3
            && b[0].is_ascii_alphabetic()
            && b[1] == b':'
            && matches!(b[2], b'\\' | b'/'))
}

/// Removes serde_json's " at line L column C" suffix: every record is one line of the log, and the
/// position refers to the payload text, which would only mislead next to our own line numbers.
fn strip_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(i)
            if message[i + 9..]
                .split(" column ")
                .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) =>
        {
            &message[..i]
        }
        _ => message,
    }
}

/// The event lines of one import.
struct Scan<'l> {
    limits: &'l Limits,
    session_id: SessionId,
    /// Invariant: `events[i].seq == i` (a record whose seq breaks this becomes the issue instead).
    events: Vec<Event>,
    /// `lines[i]` is the line `events[i]` was read from (a row yields several events on one line).
    lines: Vec<u32>,
    conversions: Vec<String>,
    /// The first line that could not be read as records. Once set, later lines are only checked for a
    /// `turn/end`, which makes the damage fatal.
    issue: Option<TornTail>,
}

/// A record's `type` only, for scanning past damage.
#[derive(Deserialize)]
struct TypeOnly<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
}

impl Scan<'_> {
    /// Records a line that could not be read as records: the start of a torn tail, unless a `turn/end`
    /// follows.
    fn line_issue(&mut self, line: usize, reason: String) -> Result<(), ImportError> {
        match &mut self.issue {
            Some(issue) => issue.n_lines += 1,
            None => {
                self.issue = Some(TornTail {
                    line,
                    reason,
                    n_lines: 1,
                });
            }
        }
        Ok(())
    }

    fn consume(&mut self, line: usize, bytes: &[u8]) -> Result<(), ImportError> {
        if let Some(issue) = &mut self.issue {
            let depth_ok =
                json_nesting_depth(bytes, self.limits.json_depth_max) <= self.limits.json_depth_max;
            let is_turn_end = depth_ok
                && serde_json::from_slice::<TypeOnly<'_>>(bytes)
                    .is_ok_and(|t| t.kind == "turn/end");
            if is_turn_end {
                return Err(ImportError::Corrupt {
                    line: issue.line,
                    reason: issue.reason.clone(),
                    turn_end_line: line,
                });
            }
            issue.n_lines += 1;
            return Ok(());
        }
        match self.decode(line, bytes)? {
            Ok(()) => Ok(()),
            Err(reason) => self.line_issue(line, reason),
        }
    }

    fn expected_seq(&self) -> u64 {
        self.events.len() as u64
    }

    fn push(&mut self, line: usize, event: Event) -> Result<(), ImportError> {
        if self.events.len() >= self.limits.session_events_max {
            return Err(ImportError::TooManyEvents {
                line,
                events_max: self.limits.session_events_max,
            });
        }
        self.events.push(event);
        self.lines.push(u32::try_from(line).unwrap_or(u32::MAX));
        Ok(())
    }

    /// Reads one complete line. `Ok(Err(reason))` when the line cannot be read as records (a torn-tail
    /// candidate); `Err` when it is a readable record that is not acceptable.
    fn decode(&mut self, line: usize, bytes: &[u8]) -> Result<Result<(), String>, ImportError> {
        let depth_max = self.limits.json_depth_max;
        if json_nesting_depth(bytes, depth_max) > depth_max {
            return Ok(Err(format!(
                "the line nests JSON deeper than {depth_max} levels"
            )));
        }
        let text = match std::str::from_utf8(bytes) {
            Ok(t) => t,
            Err(e) => {
                return Ok(Err(format!(
                    "the line is not valid UTF-8 (byte {})",
                    e.valid_up_to()
                )));
            }
        };
        let expected = self.expected_seq();
        // Fast path: a record in the current shape parses directly (keys the runtime does not know
        // are kept, as the original keeps them). Every legacy shape fails this parse (missing ids,
        // old reasons), except the retired types when marked ignorable and a `turn/start` with the
        // obsolete `trigger`, which reads with an unknown key: a `turn/start` carrying any unknown key
        // takes the conversion path, which drops `trigger` and keeps any other key.
        if let Ok(event) = Event::from_json(text)
            && !legacy::RETIRED_TYPES.contains(&event.kind())
            && event.kind() != legacy::STEERING_TYPE
            && !(matches!(event.data, EventData::TurnStart(_)) && event.raw_data.is_some())
        {
            if event.seq != expected {
                return self.seq_gap(line, expected, Some(event.seq), event.kind() == "turn/end");
            }
            self.push(line, event)?;
            return Ok(Ok(()));
        }
        let map = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            Ok(_) => return Ok(Err("the line is not a JSON object".into())),
            Err(e) => {
                return Ok(Err(format!(
                    "the line is not valid JSON: {}",
                    strip_position(&e.to_string())
                )));
            }
        };
        let kind = map.get("type").and_then(Value::as_str).unwrap_or_default();
        if let Some(tag) = RowTag::from_type(kind) {
            return self.decode_chunk_row(line, tag, &map);
        }
        self.decode_old_shape(line, map)
    }

    /// A packed chunk row of the original (`legacy::decode_row`): expanded into its events.
    fn decode_chunk_row(
        &mut self,
        line: usize,
        tag: RowTag,
        map: &Map<String, Value>,
    ) -> Result<Result<(), String>, ImportError> {
        // Check the member count before expanding: a row of empty strings packs an event into
        // three bytes, so a single line could otherwise expand to millions of events.
        let n_members = map
            .get("data")
            .and_then(|d| {
                d.get(if tag == RowTag::ToolCallChunks {
                    "args"
                } else {
                    "texts"
                })
            })
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        if self.events.len().saturating_add(n_members) > self.limits.session_events_max {
            return Err(ImportError::TooManyEvents {
                line,
                events_max: self.limits.session_events_max,
            });
        }
        let events = match legacy::decode_row(tag, map) {
            Ok(events) => events,
            Err(e) => return Ok(Err(e.to_string())),
        };
        let expected = self.expected_seq();
        let seq0 = events.first().map(|e| e.seq);
        if seq0 != Some(expected) {
            return self.seq_gap(line, expected, seq0, false);
        }
        for event in events {
            self.push(line, event)?;
        }
        Ok(Ok(()))
    }

    /// A record that is not in the current shape: converted from an old shape the original still
    /// reads (`legacy::convert_event`, reported in `conversions`), or refused.
    fn decode_old_shape(
        &mut self,
        line: usize,
        mut map: Map<String, Value>,
    ) -> Result<Result<(), String>, ImportError> {
        let expected = self.expected_seq();
        let seq = map.get("seq").and_then(Value::as_u64);
        if seq != Some(expected) {
            let is_turn_end = map.get("type").and_then(Value::as_str) == Some("turn/end");
            return self.seq_gap(line, expected, seq, is_turn_end);
        }
        let events = &self.events;
        let converted = legacy::convert_event(&mut map, self.session_id.as_str(), |target| {
            usize::try_from(target)
                .ok()
                .and_then(|i| events.get(i))
                .and_then(legacy::message_id_of)
        })
        .map_err(|source| ImportError::Legacy { line, source })?;
        if let Some(what) = converted {
            self.conversions
                .push(format!("line {line} (seq {expected}): {what}"));
        }
        let kind = map.get("type").and_then(Value::as_str).unwrap_or_default();
        let ignorable = map.get("ignorable") == Some(&Value::Bool(true));
        if !KNOWN_EVENT_TYPES.contains(&kind) && !ignorable && !kind.is_empty() {
            return Err(ImportError::UnknownType {
                line,
                seq: expected,
                kind: kind.to_string(),
            });
        }
        let text = Value::Object(map).to_string();
        let event = Event::from_json(&text).map_err(|e| ImportError::Invalid {
            line,
            seq: expected,
            reason: strip_position(&e.to_string()).to_string(),
        })?;
        self.push(line, event)?;
        Ok(Ok(()))
    }

    /// A record whose seq does not continue the log: a torn-tail candidate, unless the record itself
    /// is a `turn/end` (then the damage is inside the committed log).
    fn seq_gap(
        &self,
        line: usize,
        expected: u64,
        got: Option<u64>,
        is_turn_end: bool,
    ) -> Result<Result<(), String>, ImportError> {
        let got = got.map_or_else(|| "no seq".to_string(), |s| format!("seq {s}"));
        let reason = format!("seq gap: expected seq {expected}, got {got}");
        if is_turn_end {
            return Err(ImportError::Corrupt {
                line,
                reason,
                turn_end_line: line,
            });
        }
        Ok(Err(reason))
    }
}

#[cfg(test)]
mod tests {
    use super::legacy::LegacyError;
    use super::*;

    const HEADER: &str =
        r#"{"type":"session","version":0,"id":"s1","createdAt":5,"delegationDepth":0}"#;
    const TS: &str = r#"{"type":"turn/start","seq":SEQ,"time":1,"data":{"turn":TURN}}"#;
    const TE: &str = r#"{"type":"turn/end","seq":SEQ,"time":1,"data":{"turn":TURN,"reason":{"kind":"completed"}}}"#;
    const USER: &str = r#"{"type":"user/message","seq":SEQ,"time":1,"data":{"id":"uSEQ","role":"user","content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#;
    const TITLE: &str = r#"{"type":"session/title","seq":SEQ,"time":1,"data":{"title":"t"}}"#;

    /// Builds a log text: the header, then each event template with `SEQ` set to its position and
    /// `TURN` to the number of `turn/start`s so far.
    fn text(header: &str, events: &[&str]) -> String {
        let mut out = format!("{header}\n");
        let mut turn = 0;
        for (i, e) in events.iter().enumerate() {
            if e.contains("turn/start") {
                turn += 1;
            }
            out.push_str(
                &e.replace("SEQ", &i.to_string())
                    .replace("TURN", &turn.to_string()),
            );
            out.push('\n');
        }
        out
    }

    fn run(text: &str) -> Result<Imported, ImportError> {
        import(&mut text.as_bytes(), &Limits::DEFAULT)
    }

    fn run_with(
        text: &str,
        limits: &Limits,
        options: &ImportOptions,
    ) -> Result<Imported, ImportError> {
        import_with(&mut text.as_bytes(), limits, options)
    }

    fn export_string(imported: &Imported) -> String {
        let mut out = Vec::new();
        export(&imported.header, &imported.events, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    fn header_err(header: &str) -> ImportError {
        run(&text(header, &[])).unwrap_err()
    }

    fn header_reason(header: &str) -> String {
        match header_err(header) {
            ImportError::Header { reason } => reason,
            other => panic!("not a header error: {other:?}"),
        }
    }

    #[test]
    fn export_writes_the_v0_layout() {
        let mut header = SessionHeader::new(SessionId::new("s1").unwrap(), 5);
        header.cwd = Some("/w".into());
        header.seed_length = Some(2);
        header.origin = Some("subagent".into());
        header.delegation_depth = 1;
        header.agent_preset = Some("minimal".into());
        header.parent_session = Some("p".into());
        let events = run(&text(HEADER, &[TS, USER, TE])).unwrap().events;
        let mut out = Vec::new();
        export(&header, &events, &mut out).unwrap();
        let out = String::from_utf8(out).unwrap();
        let mut lines = out.lines();
        assert_eq!(
            lines.next(),
            Some(
                r#"{"type":"session","version":0,"id":"s1","createdAt":5,"cwd":"/w","parentSession":"p","seedLength":2,"origin":"subagent","delegationDepth":1,"agentPreset":"minimal"}"#
            )
        );
        assert_eq!(
            lines.next(),
            Some(r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#)
        );
        assert_eq!(lines.count(), 2);
        assert!(out.ends_with("}\n"));
        // A minimal header still writes delegationDepth, and omits absent optionals.
        let mut out = Vec::new();
        export(
            &SessionHeader::new(SessionId::new("s1").unwrap(), 5),
            &[],
            &mut out,
        )
        .unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), format!("{HEADER}\n"));
    }

    #[test]
    fn import_then_export_is_byte_identical() {
        let ignorable = r#"{"type":"future/kind","seq":SEQ,"time":1,"data":{"z":[1,{"y":null}]},"ignorable":true}"#;
        let log = text(
            r#"{"type":"session","version":0,"id":"s1","createdAt":5,"cwd":"C:\\work","delegationDepth":2}"#,
            &[USER, TITLE, ignorable, TS, USER, TE, TS],
        );
        let imported = run(&log).unwrap();
        assert_eq!(imported.events.len(), 7);
        assert_eq!(imported.conversions, Vec::<String>::new());
        assert_eq!(imported.torn_tail, None);
        assert_eq!(export_string(&imported), log);
        // An open tail turn is kept as it is: the store repairs it on load.
        assert!(!invariant::is_balanced(&imported.events));
    }

    #[test]
    fn header_is_validated() {
        assert_eq!(run(""), Err(ImportError::Empty));
        assert!(
            matches!(run(HEADER), Err(ImportError::Header { reason }) if reason.contains("not newline-terminated"))
        );
        assert!(header_reason("{").starts_with("the header line is not valid JSON: "));
        assert_eq!(
            header_reason("[1]"),
            "the first line is not a session header"
        );
        assert_eq!(
            header_reason(&TS.replace("SEQ", "0").replace("TURN", "1")),
            "the first line is not a session header (its type is not \"session\")"
        );
        assert_eq!(
            header_reason(r#"{"type":"session","id":"s1","createdAt":1,"delegationDepth":0}"#),
            "the session header has no version"
        );
        assert_eq!(
            header_reason(&HEADER.replace(r#""version":0"#, r#""version":"0""#)),
            "header version must be an integer, got \"0\""
        );
        let newer = header_err(&HEADER.replace(r#""version":0"#, r#""version":1"#));
        assert_eq!(newer, ImportError::UnsupportedVersion { version: 1 });
        assert_eq!(
            newer.to_string(),
            "line 1: the log uses format v1, but this build reads only v0: the log was written by a newer harness"
        );
        // The version is checked before anything else: a newer header may look like anything.
        assert_eq!(
            header_err(r#"{"type":"session","version":3,"whatever":[]}"#),
            ImportError::UnsupportedVersion { version: 3 }
        );
        assert!(
            header_err(&HEADER.replace(r#""version":0"#, r#""version":-1"#))
                .to_string()
                .contains("older than v0")
        );
        let cases = [
            (
                HEADER.replace(
                    r#","delegationDepth":0"#,
                    r#","delegationDepth":0,"sandboxMode":"x""#,
                ),
                "session header uses retired policy baseline fields (sandboxMode/approvalPolicy)",
            ),
            (
                HEADER.replace(
                    r#","delegationDepth":0"#,
                    r#","delegationDepth":0,"extra":1"#,
                ),
                "the session header has an unknown key \"extra\"",
            ),
            (
                HEADER.replace(r#""id":"s1""#, r#""id":"../x""#),
                "header id \"../x\" is not a valid session id: session id \"../x\" has a character that is not allowed at byte 0",
            ),
            (
                HEADER.replace(r#""id":"s1""#, r#""id":1"#),
                "header id must be a string, got 1",
            ),
            (
                HEADER.replace(
                    r#""id":"s1""#,
                    &format!(r#""id":"{}""#, "a/".repeat(2_500_000)),
                ),
                &format!(
                    "header id \"{}…\" is not a valid session id: session id is 5000000 bytes, the limit is 128",
                    "a/".repeat(100)
                ),
            ),
            (
                HEADER.replace(r#""createdAt":5"#, r#""createdAt":-5"#),
                "createdAt must be a non-negative safe integer, got -5",
            ),
            (
                HEADER.replace(r#""createdAt":5"#, r#""createdAt":"5""#),
                "createdAt must be a non-negative safe integer, got \"5\"",
            ),
            (
                HEADER.replace(r#""createdAt":5"#, r#""createdAt":9007199254740992"#),
                "createdAt must be a non-negative safe integer, got 9007199254740992",
            ),
            (
                HEADER.replace(r#","createdAt":5"#, ""),
                "the session header has no createdAt",
            ),
            (
                HEADER.replace(
                    r#","delegationDepth":0"#,
                    r#","cwd":"work","delegationDepth":0"#,
                ),
                "cwd must be an absolute path, got \"work\"",
            ),
            (
                HEADER.replace(r#","delegationDepth":0"#, r#","cwd":1,"delegationDepth":0"#),
                "cwd must be a string, got 1",
            ),
            (
                HEADER.replace(
                    r#","delegationDepth":0"#,
                    r#","parentSession":2,"delegationDepth":0"#,
                ),
                "parentSession must be a string, got 2",
            ),
            (
                HEADER.replace(
                    r#","delegationDepth":0"#,
                    r#","seedLength":1.5,"delegationDepth":0"#,
                ),
                "seedLength must be a non-negative safe integer, got 1.5",
            ),
            (
                HEADER.replace(
                    r#","delegationDepth":0"#,
                    r#","origin":"fork","delegationDepth":0"#,
                ),
                "origin must be \"subagent\", got \"fork\"",
            ),
            (
                HEADER.replace(r#""delegationDepth":0"#, r#""delegationDepth":-1"#),
                "delegationDepth must be a non-negative safe integer, got -1",
            ),
            (
                HEADER.replace(
                    r#""delegationDepth":0"#,
                    r#""delegationDepth":0,"agentPreset":null"#,
                ),
                "agentPreset must be a string, got null",
            ),
        ];
        for (header, reason) in cases {
            assert_eq!(header_reason(&header), reason, "{header}");
        }
    }

    #[test]
    fn header_options_and_legacy_depth() {
        let placeholder = r#"{"type":"session","version":0,"id":"{{sessionId}}","createdAt":5,"cwd":"{{cwd}}/w"}"#;
        assert!(header_reason(placeholder).contains("is not a valid session id"));
        let options = ImportOptions {
            session_id: Some(SessionId::new("fixture").unwrap()),
            cwd: Some("/fixture/w".into()),
        };
        let pre_identity = r#"{"type":"user/message","seq":0,"time":1,"data":{"content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#;
        let imported = run_with(
            &text(placeholder, &[pre_identity]),
            &Limits::DEFAULT,
            &options,
        )
        .unwrap();
        assert_eq!(imported.header.id.as_str(), "fixture");
        assert_eq!(imported.header.cwd.as_deref(), Some("/fixture/w"));
        assert_eq!(imported.header.delegation_depth, 0);
        assert_eq!(
            imported.conversions,
            [
                "line 1: header without delegationDepth read as delegationDepth 0",
                "line 2 (seq 0): user/message: pre-identity message given a legacy-message id"
            ]
        );
        assert_eq!(
            imported.events[0].data.message().unwrap().id.as_str(),
            "legacy-message:fixture:0"
        );
        // An override must itself be valid.
        let bad_cwd = ImportOptions {
            session_id: None,
            cwd: Some("rel".into()),
        };
        assert!(run_with(&text(HEADER, &[]), &Limits::DEFAULT, &bad_cwd).is_err());
    }

    #[test]
    fn unknown_retired_and_invalid_events_are_refused_with_their_line() {
        let unknown = text(
            HEADER,
            &[
                USER,
                r#"{"type":"future/kind","seq":SEQ,"time":1,"data":{}}"#,
            ],
        );
        assert_eq!(
            run(&unknown),
            Err(ImportError::UnknownType {
                line: 3,
                seq: 1,
                kind: "future/kind".into()
            })
        );
        let delta = text(
            HEADER,
            &[r#"{"type":"request/header-delta","seq":SEQ,"time":1,"data":{}}"#],
        );
        assert_eq!(
            run(&delta),
            Err(ImportError::Legacy {
                line: 2,
                source: LegacyError::RetiredType {
                    seq: 0,
                    kind: "request/header-delta".into()
                }
            })
        );
        let placeholder_tools = text(
            HEADER,
            &[
                TS,
                r#"{"type":"request/header","seq":SEQ,"time":1,"data":{"header":{"config":{"provider":"p","model":"m"},"tools":"{{tools}}"},"reason":"initial"}}"#,
            ],
        );
        let err = run(&placeholder_tools).unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 3 (seq 1): invalid event: request/header payload: invalid type: string \"{{tools}}\", expected a sequence"
        );
        // Valid records that break the append rules or the relational invariants.
        let unmarked = text(HEADER, &[&USER.replace(r#","surfaceOp":"append""#, "")]);
        assert_eq!(
            run(&unmarked),
            Err(ImportError::Rejected {
                line: 2,
                seq: 0,
                source: AppendError::MissingSurfaceOp {
                    kind: "user/message".into()
                }
            })
        );
        let nested = text(HEADER, &[TS, TS]);
        let err = run(&nested).unwrap_err();
        assert!(
            matches!(&err, ImportError::Invariant { line: 3, source } if source.seq == 1),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "line 3: invariant violated at seq 1: turn/start 2 while turn 1 is still open"
        );
    }

    #[test]
    fn damage_after_the_last_turn_end_is_a_torn_tail() {
        let good = text(HEADER, &[TS, USER, TE]);
        // A final line without its newline.
        let torn = format!("{good}{}", &USER.replace("SEQ", "3")[..20]);
        let imported = run(&torn).unwrap();
        assert_eq!(imported.events.len(), 3);
        assert_eq!(
            imported.torn_tail,
            Some(TornTail {
                line: 5,
                reason: "the final line (20 bytes) is not newline-terminated".into(),
                n_lines: 1
            })
        );
        // Even a complete record is not committed without its newline.
        let unterminated = format!("{good}{}", USER.replace("SEQ", "3"));
        assert_eq!(run(&unterminated).unwrap().events.len(), 3);
        // Garbage lines, a seq gap, a non-object and an open turn's partial record.
        for (tail, reason, n_lines) in [
            (
                "@@@\n\x01\x02\n",
                "the line is not valid JSON: expected value",
                2,
            ),
            (
                &format!("{}\n", USER.replace("SEQ", "7")),
                "seq gap: expected seq 3, got seq 7",
                1,
            ),
            ("\"junk\"\n", "the line is not a JSON object", 1),
            (
                "\n",
                "the line is not valid JSON: EOF while parsing a value",
                1,
            ),
            (
                &format!(
                    "{}\n{}\n",
                    TS.replace("SEQ", "3").replace("TURN", "2"),
                    "{\"type\":\"user/mes"
                ),
                "the line is not valid JSON: EOF while parsing a string",
                1,
            ),
        ] {
            let imported = run(&format!("{good}{tail}")).unwrap();
            let torn = imported.torn_tail.expect("a torn tail");
            assert_eq!(
                (torn.reason.as_str(), torn.n_lines),
                (reason, n_lines),
                "{tail:?}"
            );
            assert!(imported.events.len() == 3 || imported.events.len() == 4);
        }
    }

    #[test]
    fn damage_before_a_turn_end_is_an_error() {
        let lines = [TS, USER, TE, TS, USER, TE];
        let good = text(HEADER, &lines);
        let mut broken: Vec<&str> = good.lines().collect();
        broken[3] = "{\"type\":\"turn/end\",\"seq\":2,";
        let broken = broken.join("\n") + "\n";
        assert_eq!(
            run(&broken),
            Err(ImportError::Corrupt {
                line: 4,
                reason: "the line is not valid JSON: EOF while parsing a value".into(),
                turn_end_line: 7
            })
        );
        // A seq gap on a turn/end is fatal at once.
        let gap = good.replace(
            r#""seq":5,"time":1,"data":{"turn":2,"reason""#,
            r#""seq":9,"time":1,"data":{"turn":2,"reason""#,
        );
        assert!(matches!(
            run(&gap),
            Err(ImportError::Corrupt {
                line: 7,
                turn_end_line: 7,
                ..
            })
        ));
    }

    #[test]
    fn limits_bound_every_line() {
        let good = text(HEADER, &[TS, USER, TE]);
        // A line over the byte bound is never held in memory; at the tail it is cut.
        let long_title = format!(
            r#"{{"type":"session/title","seq":3,"time":1,"data":{{"title":"{}"}}}}"#,
            "x".repeat(300)
        );
        let limits = Limits {
            event_bytes_max: 200,
            ..Limits::DEFAULT
        };
        let imported = run_with(
            &format!("{good}{long_title}\n"),
            &limits,
            &ImportOptions::default(),
        )
        .unwrap();
        assert_eq!(
            imported.torn_tail,
            Some(TornTail {
                line: 5,
                reason: format!("the line is {} bytes, the limit is 200", long_title.len()),
                n_lines: 1
            })
        );
        // Before a turn/end it is an error.
        let text2 = text(
            HEADER,
            &[TS, &long_title.replace(r#""seq":3"#, r#""seq":SEQ"#), TE],
        );
        assert!(matches!(
            run_with(&text2, &limits, &ImportOptions::default()),
            Err(ImportError::Corrupt {
                line: 3,
                turn_end_line: 4,
                ..
            })
        ));
        // A header over the bound.
        let small = Limits {
            event_bytes_max: 10,
            ..Limits::DEFAULT
        };
        assert!(
            matches!(run_with(&good, &small, &ImportOptions::default()), Err(ImportError::Header { reason }) if reason.contains("the limit is 10"))
        );
        // Nesting is bounded before serde sees the line.
        let deep = format!(
            r#"{{"type":"session/title","seq":3,"time":1,"data":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        let imported = run(&format!("{good}{deep}\n")).unwrap();
        assert_eq!(
            imported.torn_tail.unwrap().reason,
            "the line nests JSON deeper than 128 levels"
        );
        let shallow = Limits {
            json_depth_max: 3,
            ..Limits::DEFAULT
        };
        let err = run_with(
            &text(HEADER, &[TS, USER, TE]),
            &shallow,
            &ImportOptions::default(),
        )
        .unwrap_err();
        assert!(
            matches!(err, ImportError::Corrupt { line: 3, .. }),
            "{err:?}"
        );
        // The event count is bounded, rows included.
        let few = Limits {
            session_events_max: 2,
            ..Limits::DEFAULT
        };
        assert_eq!(
            run_with(&good, &few, &ImportOptions::default()),
            Err(ImportError::TooManyEvents {
                line: 4,
                events_max: 2
            })
        );
        let row = r#"{"type":"text-chunks","seq0":0,"time0":1,"data":{"turn":1,"step":1,"index":0,"dt":[0,0],"texts":["a","b","c"]}}"#;
        assert_eq!(
            run_with(
                &format!("{HEADER}\n{row}\n"),
                &few,
                &ImportOptions::default()
            ),
            Err(ImportError::TooManyEvents {
                line: 2,
                events_max: 2
            })
        );
    }

    #[test]
    fn nesting_depth_ignores_brackets_in_strings() {
        assert_eq!(
            json_nesting_depth(br#"{"a":[1,{"b":"[[[{{{\"]]"}]}"#, 100),
            3
        );
        assert_eq!(
            json_nesting_depth(b"[[[[[", 2),
            3,
            "counting stops past the bound"
        );
        assert_eq!(json_nesting_depth(b"1", 2), 0);
        assert_eq!(
            json_nesting_depth(br#"["\\", [["a\"]"]]]"#, 9),
            3,
            "escaped backslash, then quote"
        );
        assert_eq!(json_nesting_depth(br#"[["unterminated [[[["#, 9), 2);
        assert_eq!(json_nesting_depth(br#"["ends in a backslash \"#, 9), 1);
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[\\[\\]{}\"\\\\a-z]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(8, 64, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[\\[{\"a-z]{0,3}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn true_depth(v: &Value) -> usize {
        match v {
            Value::Array(items) => 1 + items.iter().map(true_depth).max().unwrap_or(0),
            Value::Object(map) => 1 + map.values().map(true_depth).max().unwrap_or(0),
            _ => 0,
        }
    }

    proptest::proptest! {
        /// The byte scan agrees with the parsed value's depth, brackets and escapes in strings and
        /// keys included.
        #[test]
        fn nesting_depth_matches_the_parsed_depth(v in arb_json()) {
            let text = v.to_string();
            proptest::prop_assert_eq!(json_nesting_depth(text.as_bytes(), usize::MAX), true_depth(&v));
        }
    }

    #[test]
    fn packed_rows_import_as_their_events() {
        let log = text(
            HEADER,
            &[
                TS,
                r#"{"type":"step/start","seq":SEQ,"time":1,"data":{"turn":1,"step":1}}"#,
                r#"{"type":"assistant/chunk","seq":SEQ,"time":1,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"a"}}}"#,
                r#"{"type":"assistant/chunk","seq":SEQ,"time":2,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"b"}}}"#,
                r#"{"type":"assistant/chunk","seq":SEQ,"time":4,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"c"}}}"#,
                r#"{"type":"step/end","seq":SEQ,"time":1,"data":{"turn":1,"step":1}}"#,
                TE,
            ],
        );
        let plain = run(&log).unwrap();
        let mut packed = Vec::new();
        export_packed(&plain.header, &plain.events, &mut packed).unwrap();
        let packed = String::from_utf8(packed).unwrap();
        assert!(packed.contains(r#"{"type":"text-chunks","seq0":2,"time0":1,"data":{"turn":1,"step":1,"index":0,"dt":[1,2],"texts":["a","b","c"]}}"#));
        assert_eq!(packed.lines().count(), 6);
        let imported = run(&packed).unwrap();
        assert_eq!(imported.events, plain.events);
        assert_eq!(export_string(&imported), log);
        // A malformed row is damage: fatal before a turn/end, a torn tail after the last one.
        let bad = packed.replace(r#""dt":[1,2]"#, r#""dt":[1]"#);
        assert_eq!(
            run(&bad),
            Err(ImportError::Corrupt {
                line: 4,
                reason: "malformed text-chunks storage row: dt length 1 does not match 3 members"
                    .into(),
                turn_end_line: 6
            })
        );
    }

    #[test]
    fn crlf_lines_and_read_errors() {
        let crlf = text(HEADER, &[TS, USER, TE]).replace('\n', "\r\n");
        assert_eq!(run(&crlf).unwrap().events.len(), 3);
        struct Failing(usize);
        impl io::Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let header = format!("{HEADER}\n");
                if self.0 < header.len() {
                    let n = (header.len() - self.0).min(buf.len());
                    buf[..n].copy_from_slice(&header.as_bytes()[self.0..self.0 + n]);
                    self.0 += n;
                    return Ok(n);
                }
                Err(io::Error::other("disk gone"))
            }
        }
        let err = import(&mut io::BufReader::new(Failing(0)), &Limits::DEFAULT).unwrap_err();
        assert_eq!(
            err,
            ImportError::Read {
                line: 2,
                cause: "disk gone".into()
            }
        );
    }
}
