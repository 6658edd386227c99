//! Read-time conversions for logs written by the original harness: its packed chunk rows
//! (`reference/session-llm.md` §4.2) and the older v0 shapes it still reads (§5.7).
//!
//! **Chunk rows** are a storage-only encoding: a run of at least `MIN_RUN` consecutive
//! `assistant/chunk` delta events of one block becomes one line tagged `text-chunks`,
//! `reasoning-chunks` or `tool-call-chunks` (slash-less tags, like the header's `session`, so no reader
//! mistakes a row for an event). `decode_row` validates a row strictly — a malformed row would
//! otherwise silently lose a whole run — and expands it to the exact events it packed;
//! `pack_chunk_runs` is the inverse, for writers that want the compact layout. Rows never enter a
//! `Session`.
//!
//! **Legacy shapes** (`convert_event`) work on one parsed line before it is typed, in the original's
//! order: refuse the retired vocabulary (`request/header-delta`, `mode/set`, a `request/header` with
//! reason `fallback`); drop the obsolete `turn/start.trigger`; upgrade old `turn/end` reasons; turn the
//! removed `steering/message` into a `user/message`; give pre-identity messages the stable id
//! `legacy-message:<sessionId>:<seq>`. Each conversion validates the complete old shape first and
//! refuses anything else, so corruption is never disguised as legacy data. Storage is never rewritten:
//! a converted log is only converted in memory (and written in the current shape if exported again).
//!
//! Who calls this: only the JSON-lines import and export beside it (`jsonl/mod.rs`). The SQLite and
//! memory stores never hold these shapes: they store events in the current shape, written by this
//! runtime, and an imported log is converted before it reaches them.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use crate::llm::types::StreamChunk;
use crate::session::event::{AssistantChunk, Event, EventData};

/// The largest integer a JavaScript number holds exactly (`Number.MAX_SAFE_INTEGER`). The original
/// writes seqs, times and gaps as JS numbers, so values outside ±this bound never come from it.
pub const SAFE_INTEGER_MAX: i64 = (1 << 53) - 1;

/// The fewest members a packed run has. A format constant of the original, not a tunable: shorter
/// runs are stored verbatim because a row's envelope would rival the lines it replaces.
pub const MIN_RUN: usize = 3;

/// Why a stored record could not be converted. The log is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LegacyError {
    /// A packed chunk row breaks a rule of its shape.
    #[error("malformed {tag} storage row: {reason}")]
    MalformedRow {
        /// The row's tag (`text-chunks`, …).
        tag: &'static str,
        /// The first rule it breaks.
        reason: String,
    },
    /// An event of a type the original retired (`request/header-delta`, `mode/set`).
    #[error("seq {seq}: unsupported legacy {kind} event")]
    RetiredType {
        /// The event's seq.
        seq: u64,
        /// Its type.
        kind: String,
    },
    /// A `request/header` with the retired reason `fallback`.
    #[error("seq {seq}: unsupported legacy request/header reason \"fallback\"")]
    FallbackReason {
        /// The event's seq.
        seq: u64,
    },
    /// An old shape that is not exactly the shape the original wrote.
    #[error("seq {seq}: malformed pre-react-loop {kind}: {reason}")]
    Malformed {
        /// The event's seq.
        seq: u64,
        /// Its type.
        kind: &'static str,
        /// The rule of the old shape it breaks.
        reason: &'static str,
    },
    #[error(
        "seq {seq}: a pre-identity tool/result replacement targets seq {target}, which carries no message id to inherit"
    )]
    /// A pre-identity replacement result whose target carries no message id to inherit.
    NoInheritedId {
        /// The replacement's seq.
        seq: u64,
        /// The seq it replaces.
        target: u64,
    },
}

/// The three storage-row tags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowTag {
    /// `text-chunks`: text deltas of one block.
    TextChunks,
    /// `reasoning-chunks`: reasoning deltas of one block.
    ReasoningChunks,
    /// `tool-call-chunks`: argument deltas of one tool call.
    ToolCallChunks,
}

impl RowTag {
    /// Recognises a record's `type`.
    pub fn from_type(tag: &str) -> Option<RowTag> {
        match tag {
            "text-chunks" => Some(RowTag::TextChunks),
            "reasoning-chunks" => Some(RowTag::ReasoningChunks),
            "tool-call-chunks" => Some(RowTag::ToolCallChunks),
            _ => None,
        }
    }

    /// The tag as written in a row's `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            RowTag::TextChunks => "text-chunks",
            RowTag::ReasoningChunks => "reasoning-chunks",
            RowTag::ToolCallChunks => "tool-call-chunks",
        }
    }
}

/// `Some(n)` when `v` is an integer within the JavaScript safe range.
fn safe_int(v: &Value) -> Option<i64> {
    v.as_i64().filter(|n| n.abs() <= SAFE_INTEGER_MAX)
}

fn is_safe(n: i64) -> bool {
    n.abs() <= SAFE_INTEGER_MAX
}

/// True when `map` has exactly the keys `keys`.
fn has_exact_keys(map: &Map<String, Value>, keys: &[&str]) -> bool {
    map.len() == keys.len() && keys.iter().all(|k| map.contains_key(*k))
}

/// True when `map` has every key of `required` and no key outside `required` and `optional`.
fn has_only_keys(map: &Map<String, Value>, required: &[&str], optional: &[&str]) -> bool {
    required.iter().all(|k| map.contains_key(*k))
        && map
            .keys()
            .all(|k| required.contains(&k.as_str()) || optional.contains(&k.as_str()))
}

/// Validates a row-tagged record and expands it to the `assistant/chunk` events it packed, in order.
///
/// # Errors
/// `MalformedRow` naming the first broken rule: envelope keys other than exactly
/// `{type, seq0, time0, data}`, a `seq0` that is not a non-negative safe integer, a `time0` that is not
/// a safe integer, a data key set other than the tag's, `turn`/`step`/`index` that are not non-negative
/// integers, an empty or non-string payload array, `dt` entries that are not safe integers or a `dt`
/// whose length is not members − 1, or member seqs or times that leave the safe-integer range.
pub fn decode_row(tag: RowTag, row: &Map<String, Value>) -> Result<Vec<Event>, LegacyError> {
    let bad = |reason: &str| malformed(tag, reason);
    if !has_exact_keys(row, &["type", "seq0", "time0", "data"]) {
        return Err(bad("envelope must be exactly {type, seq0, time0, data}"));
    }
    let seq0 = row
        .get("seq0")
        .and_then(safe_int)
        .filter(|n| *n >= 0)
        .ok_or_else(|| bad("seq0 must be a non-negative safe integer"))?;
    let time0 = row
        .get("time0")
        .and_then(safe_int)
        .ok_or_else(|| bad("time0 must be a safe integer"))?;
    let Some(Value::Object(data)) = row.get("data") else {
        return Err(bad("data must be an object"));
    };
    let payload_key = payload_key(tag, data)?;
    let (Some(turn), Some(step), Some(index)) = (
        data.get("turn").and_then(Value::as_u64),
        data.get("step").and_then(Value::as_u64),
        data.get("index")
            .and_then(Value::as_u64)
            .and_then(|i| u32::try_from(i).ok()),
    ) else {
        return Err(bad("turn/step/index must be non-negative integers"));
    };
    let members: Vec<&str> = match data.get(payload_key) {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .map(Value::as_str)
            .collect::<Option<Vec<&str>>>()
            .ok_or_else(|| bad(&format!("{payload_key} must be a non-empty string array")))?,
        _ => {
            return Err(bad(&format!(
                "{payload_key} must be a non-empty string array"
            )));
        }
    };
    let dt = member_gaps(tag, data.get("dt"), members.len())?;
    // `members.len() - 1` cannot overflow: `members` is non-empty.
    if !is_safe(seq0.saturating_add(members.len() as i64 - 1)) {
        return Err(bad("member seqs must stay safe integers"));
    }
    let times = member_times(tag, time0, &dt)?;
    let id = data.get("id").and_then(Value::as_str);
    let name = data.get("name").and_then(Value::as_str);
    let seq0 = seq0.unsigned_abs();
    Ok(members
        .into_iter()
        .zip(times)
        .enumerate()
        .map(|(k, (member, time))| {
            let chunk = match tag {
                RowTag::TextChunks => StreamChunk::TextDelta {
                    index,
                    text: member.to_string(),
                },
                RowTag::ReasoningChunks => StreamChunk::ReasoningDelta {
                    index,
                    text: member.to_string(),
                },
                RowTag::ToolCallChunks => StreamChunk::ToolCallDelta {
                    index,
                    id: id.unwrap_or_default().to_string(),
                    name: name.map(str::to_string),
                    arguments_delta: member.to_string(),
                },
            };
            Event {
                seq: seq0 + k as u64,
                time,
                data: EventData::AssistantChunk(std::sync::Arc::new(AssistantChunk {
                    turn,
                    step,
                    chunk,
                })),
                ignorable: false,
                source_event_seqs: None,
                surface_op: None,
                raw_data: None,
            }
        })
        .collect())
}

/// A row of kind `tag` refused for `reason`.
fn malformed(tag: RowTag, reason: &str) -> LegacyError {
    LegacyError::MalformedRow {
        tag: tag.as_str(),
        reason: reason.to_string(),
    }
}

/// Checks a row's `data` key set against its tag; returns the key of its payload array (`args` for
/// tool-call rows, `texts` for text and reasoning rows).
fn payload_key(tag: RowTag, data: &Map<String, Value>) -> Result<&'static str, LegacyError> {
    let bad = |reason: &str| malformed(tag, reason);
    match tag {
        RowTag::ToolCallChunks => {
            let with_name =
                has_exact_keys(data, &["turn", "step", "index", "id", "name", "dt", "args"]);
            if !with_name && !has_exact_keys(data, &["turn", "step", "index", "id", "dt", "args"]) {
                return Err(bad(
                    "data must be exactly {turn, step, index, id, name?, dt, args}",
                ));
            }
            let name_ok = !with_name || data.get("name").is_some_and(Value::is_string);
            if !data.get("id").is_some_and(Value::is_string) || !name_ok {
                return Err(bad("id (and name when present) must be strings"));
            }
            Ok("args")
        }
        RowTag::TextChunks | RowTag::ReasoningChunks => {
            if !has_exact_keys(data, &["turn", "step", "index", "dt", "texts"]) {
                return Err(bad("data must be exactly {turn, step, index, dt, texts}"));
            }
            Ok("texts")
        }
    }
}

/// The `dt` gaps between the times of a row's `n_members` members.
///
/// # Errors
/// `MalformedRow` when `dt` is not an array of safe integers or does not hold `n_members - 1` gaps.
fn member_gaps(tag: RowTag, dt: Option<&Value>, n_members: usize) -> Result<Vec<i64>, LegacyError> {
    let bad = |reason: &str| malformed(tag, reason);
    let dt: Vec<i64> = match dt {
        Some(Value::Array(gaps)) => gaps
            .iter()
            .map(safe_int)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(|| bad("dt must be an array of safe integers"))?,
        _ => return Err(bad("dt must be an array of safe integers")),
    };
    if dt.len() + 1 != n_members {
        return Err(bad(&format!(
            "dt length {} does not match {n_members} members",
            dt.len()
        )));
    }
    Ok(dt)
}

/// The time of each member: `time0`, then each previous time plus its gap.
///
/// # Errors
/// `MalformedRow` when a time leaves the safe-integer range.
fn member_times(tag: RowTag, time0: i64, dt: &[i64]) -> Result<Vec<i64>, LegacyError> {
    let mut times = Vec::with_capacity(dt.len() + 1);
    let mut time = time0;
    times.push(time);
    for gap in dt {
        // Both operands are within ±2^53, so the i64 sum cannot overflow.
        time += gap;
        if !is_safe(time) {
            return Err(malformed(tag, "member times must stay safe integers"));
        }
        times.push(time);
    }
    Ok(times)
}

/// One line of a packed log: an event verbatim, or a run of delta chunks packed into a row.
#[derive(Clone, Debug, PartialEq)]
pub enum StorageRecord<'a> {
    /// An event, written as it is.
    Event(&'a Event),
    /// A run of delta chunks, written as one row.
    Row(ChunkRow),
}

/// A packed run of `assistant/chunk` delta events of one block.
///
/// Invariant (established by `pack_chunk_runs`): at least `MIN_RUN` members; `dt.len()` is one less
/// than the member count; every member seq and time is a safe integer.
#[derive(Clone, Debug, PartialEq)]
pub struct ChunkRow {
    /// Which kind of delta the row packs.
    pub tag: RowTag,
    /// The seq of the first member.
    pub seq0: u64,
    /// The time of the first member.
    pub time0: i64,
    /// The turn of every member.
    pub turn: u64,
    /// The step of every member.
    pub step: u64,
    /// The content block index of every member.
    pub index: u32,
    /// Milliseconds between consecutive members (may be negative: clocks step back).
    pub dt: Vec<i64>,
    /// Tool-call rows only: the call id every member shares.
    pub id: Option<String>,
    /// Tool-call rows only: the name every member carried, if every member carried it.
    pub name: Option<String>,
    /// Each member's text (text/reasoning rows) or argument fragment (tool-call rows).
    pub members: Vec<String>,
}

impl Serialize for ChunkRow {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Data<'a>(&'a ChunkRow);
        impl Serialize for Data<'_> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let r = self.0;
                let mut m = s.serialize_map(None)?;
                m.serialize_entry("turn", &r.turn)?;
                m.serialize_entry("step", &r.step)?;
                m.serialize_entry("index", &r.index)?;
                m.serialize_entry("dt", &r.dt)?;
                if r.tag == RowTag::ToolCallChunks {
                    m.serialize_entry("id", r.id.as_deref().unwrap_or_default())?;
                    if let Some(name) = &r.name {
                        m.serialize_entry("name", name)?;
                    }
                    m.serialize_entry("args", &r.members)?;
                } else {
                    m.serialize_entry("texts", &r.members)?;
                }
                m.end()
            }
        }
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("type", self.tag.as_str())?;
        m.serialize_entry("seq0", &self.seq0)?;
        m.serialize_entry("time0", &self.time0)?;
        m.serialize_entry("data", &Data(self))?;
        m.end()
    }
}

impl Serialize for StorageRecord<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            StorageRecord::Event(e) => e.serialize(s),
            StorageRecord::Row(r) => r.serialize(s),
        }
    }
}

/// The packable view of one event: a plain delta chunk with safe-integer seq and time.
struct Delta<'a> {
    tag: RowTag,
    turn: u64,
    step: u64,
    index: u32,
    /// Tool-call deltas only.
    id: Option<&'a str>,
    /// Tool-call deltas only, when the chunk carried it.
    name: Option<&'a str>,
    /// The text or argument fragment.
    payload: &'a str,
}

impl Delta<'_> {
    /// Whether two deltas belong to one block: everything but the payload is equal.
    fn same_block(&self, other: &Delta<'_>) -> bool {
        (
            self.tag, self.turn, self.step, self.index, self.id, self.name,
        ) == (
            other.tag,
            other.turn,
            other.step,
            other.index,
            other.id,
            other.name,
        )
    }
}

/// `None` for anything but a plain delta chunk with safe-integer seq and time.
fn classify(e: &Event) -> Option<Delta<'_>> {
    if e.ignorable
        || e.surface_op.is_some()
        || e.source_event_seqs.is_some()
        || !is_safe(e.time)
        || e.seq > SAFE_INTEGER_MAX.unsigned_abs()
    {
        return None;
    }
    let EventData::AssistantChunk(c) = &e.data else {
        return None;
    };
    let delta = |tag, index, id, name, payload| Delta {
        tag,
        turn: c.turn,
        step: c.step,
        index,
        id,
        name,
        payload,
    };
    match &c.chunk {
        StreamChunk::TextDelta { index, text } => {
            Some(delta(RowTag::TextChunks, *index, None, None, text))
        }
        StreamChunk::ReasoningDelta { index, text } => {
            Some(delta(RowTag::ReasoningChunks, *index, None, None, text))
        }
        StreamChunk::ToolCallDelta {
            index,
            id,
            name,
            arguments_delta,
        } => Some(delta(
            RowTag::ToolCallChunks,
            *index,
            Some(id.as_str()),
            name.as_deref(),
            arguments_delta,
        )),
        _ => None,
    }
}

/// Packs each run of at least `MIN_RUN` consecutive delta chunks of one block (same kind, turn, step,
/// index, and for tool calls the same id and name; seqs +1; gaps that are safe integers) into one row;
/// every other event passes through verbatim, in order. Pure: `decode_row` of every row restores the
/// exact events.
pub fn pack_chunk_runs(events: &[Event]) -> Vec<StorageRecord<'_>> {
    fn flush<'a>(run: &mut Vec<(&'a Event, Delta<'a>)>, out: &mut Vec<StorageRecord<'a>>) {
        if let [(first_event, first), ..] = run.as_slice()
            && run.len() >= MIN_RUN
        {
            out.push(StorageRecord::Row(ChunkRow {
                tag: first.tag,
                seq0: first_event.seq,
                time0: first_event.time,
                turn: first.turn,
                step: first.step,
                index: first.index,
                dt: run.windows(2).map(|w| w[1].0.time - w[0].0.time).collect(),
                id: first.id.map(str::to_string),
                name: first.name.map(str::to_string),
                members: run.iter().map(|(_, d)| d.payload.to_string()).collect(),
            }));
        } else {
            out.extend(run.iter().map(|(e, _)| StorageRecord::Event(e)));
        }
        run.clear();
    }
    let mut out = Vec::with_capacity(events.len());
    let mut run: Vec<(&Event, Delta<'_>)> = Vec::new();
    for event in events {
        let Some(this) = classify(event) else {
            flush(&mut run, &mut out);
            out.push(StorageRecord::Event(event));
            continue;
        };
        let continues = run.last().is_some_and(|(last, prev)| {
            let gap_ok = event.time.checked_sub(last.time).is_some_and(is_safe);
            event.seq == last.seq + 1 && gap_ok && prev.same_block(&this)
        });
        if !continues {
            flush(&mut run, &mut out);
        }
        run.push((event, this));
    }
    flush(&mut run, &mut out);
    out
}

/// The stable id the original mints for a message stored before messages had ids.
pub fn legacy_message_id(session_id: &str, seq: u64) -> String {
    format!("legacy-message:{session_id}:{seq}")
}

/// Event types the original removed and now refuses to read.
pub const RETIRED_TYPES: &[&str] = &["request/header-delta", "mode/set"];

/// The removed type that is read as `user/message`.
pub const STEERING_TYPE: &str = "steering/message";

/// Applies the read-time conversions to one stored event (a parsed JSON object, not yet typed), in
/// place. `message_id_at(seq)` returns the message id carried by the earlier event at `seq`; a
/// pre-identity `tool/result` replacement inherits its target's id.
///
/// Returns what was converted, or `None` when the event needed nothing. Events that already have the
/// current shape — including malformed current-looking ones, which validation must refuse — are left
/// untouched.
///
/// # Errors
/// `RetiredType` / `FallbackReason` for the retired vocabulary; `Malformed` when an event has an old
/// shape's marker (an obsolete `trigger`, an old reason, a `steering/message`) but not the complete old
/// shape; `NoInheritedId` when a pre-identity replacement's target has no message id.
pub fn convert_event(
    event: &mut Map<String, Value>,
    session_id: &str,
    message_id_at: impl Fn(u64) -> Option<String>,
) -> Result<Option<&'static str>, LegacyError> {
    let Some(seq) = event.get("seq").and_then(Value::as_u64) else {
        // Without a seq there is nothing to anchor a conversion to; validation refuses the event.
        return Ok(None);
    };
    let kind = match event.get("type") {
        Some(Value::String(k)) => k.clone(),
        _ => return Ok(None),
    };
    if RETIRED_TYPES.contains(&kind.as_str()) {
        return Err(LegacyError::RetiredType { seq, kind });
    }
    if kind == "request/header"
        && event
            .get("data")
            .and_then(|d| d.get("reason"))
            .and_then(Value::as_str)
            == Some("fallback")
    {
        return Err(LegacyError::FallbackReason { seq });
    }
    match kind.as_str() {
        "turn/start" => convert_turn_start(event, seq),
        "turn/end" => convert_turn_end(event, seq),
        STEERING_TYPE => convert_steering(event, seq, session_id),
        "user/message" | "assistant/message" | "tool/result" => {
            convert_message(event, &kind, seq, session_id, message_id_at)
        }
        _ => Ok(None),
    }
}

fn data_mut(event: &mut Map<String, Value>) -> Option<&mut Map<String, Value>> {
    match event.get_mut("data") {
        Some(Value::Object(d)) => Some(d),
        _ => None,
    }
}

fn positive_turn(data: &Map<String, Value>) -> bool {
    data.get("turn").and_then(safe_int).is_some_and(|t| t >= 1)
}

/// `turn/start {turn, trigger}` → `{turn}`, after checking the complete old shape.
fn convert_turn_start(
    event: &mut Map<String, Value>,
    seq: u64,
) -> Result<Option<&'static str>, LegacyError> {
    let Some(data) = data_mut(event) else {
        return Ok(None);
    };
    if !data.contains_key("trigger") {
        return Ok(None);
    }
    let trigger_ok = match data.get("trigger") {
        Some(Value::Object(t)) => t
            .get("kind")
            .and_then(Value::as_str)
            .is_some_and(|k| !k.is_empty()),
        _ => false,
    };
    if !positive_turn(data) || !has_exact_keys(data, &["turn", "trigger"]) || !trigger_ok {
        return Err(LegacyError::Malformed {
            seq,
            kind: "turn/start",
            reason: "expected exactly {turn, trigger: {kind, …}}",
        });
    }
    data.shift_remove("trigger");
    Ok(Some("turn/start: obsolete trigger dropped"))
}

/// Old `turn/end` reasons → the current ones.
fn convert_turn_end(
    event: &mut Map<String, Value>,
    seq: u64,
) -> Result<Option<&'static str>, LegacyError> {
    let Some(data) = data_mut(event) else {
        return Ok(None);
    };
    let malformed = |reason| LegacyError::Malformed {
        seq,
        kind: "turn/end",
        reason,
    };
    let reason = match data.get("reason") {
        Some(Value::Object(r)) if r.get("kind").is_some_and(Value::is_string) => r,
        _ => return Err(malformed("expected {turn, reason: {kind, …}}")),
    };
    if !positive_turn(data) || !has_exact_keys(data, &["turn", "reason"]) {
        return Err(malformed("expected {turn, reason: {kind, …}}"));
    }
    let kind = reason.get("kind").and_then(Value::as_str).unwrap_or("");
    let (current, what) = match kind {
        "completed" | "blocked" | "max-tokens" | "interrupted" => {
            if !has_exact_keys(reason, &["kind"]) {
                return Err(malformed(
                    "a completed/blocked/max-tokens/interrupted reason has only a kind",
                ));
            }
            return Ok(None);
        }
        "aborted" if reason.contains_key("reason") => return Ok(None),
        "aborted" => {
            if !has_exact_keys(reason, &["kind"]) {
                return Err(malformed("an old aborted reason has only a kind"));
            }
            (
                serde_json::json!({"kind": "aborted", "reason": {"kind": "legacy"}}),
                "turn/end: reason {kind:aborted} read as aborted{reason:{kind:legacy}}",
            )
        }
        "disposed" => {
            if !has_exact_keys(reason, &["kind"]) {
                return Err(malformed("an old disposed reason has only a kind"));
            }
            (
                serde_json::json!({"kind": "aborted", "reason": {"kind": "disposed"}}),
                "turn/end: reason {kind:disposed} read as aborted{reason:{kind:disposed}}",
            )
        }
        "error" if reason.contains_key("error") => return Ok(None),
        "error" => (
            Value::Object(old_error_reason(reason).ok_or_else(|| {
                malformed(
                    "an old error reason is {kind, step, failure} or {kind, step, message, code?}",
                )
            })?),
            "turn/end: old error reason read as error{error}",
        ),
        // Not an old shape: validation decides.
        _ => return Ok(None),
    };
    data.insert("reason".into(), current);
    Ok(Some(what))
}

/// `{kind:'error', step, failure:{message, code, …}}` or `{kind:'error', step, message, code?}` →
/// `{kind:'error', error:{…}}`.
fn old_error_reason(reason: &Map<String, Value>) -> Option<Map<String, Value>> {
    if reason.get("step").and_then(safe_int).is_none_or(|s| s < 0) {
        return None;
    }
    let mut out = Map::new();
    out.insert("kind".into(), Value::String("error".into()));
    if let Some(Value::Object(failure)) = reason.get("failure")
        && has_exact_keys(reason, &["kind", "step", "failure"])
        && has_only_keys(
            failure,
            &["message", "code"],
            &["status", "providerRetryAfterMs", "requestId"],
        )
        && failure.get("message").is_some_and(Value::is_string)
        && failure.get("code").is_some_and(Value::is_string)
        && failure.get("status").is_none_or(Value::is_number)
        && failure
            .get("providerRetryAfterMs")
            .is_none_or(Value::is_number)
        && failure.get("requestId").is_none_or(Value::is_string)
    {
        out.insert("error".into(), Value::Object(failure.clone()));
        return Some(out);
    }
    let code = reason.get("code");
    let keys: &[&str] = if code.is_none() {
        &["kind", "step", "message"]
    } else {
        &["kind", "step", "message", "code"]
    };
    let message = reason.get("message").and_then(Value::as_str)?;
    if !has_exact_keys(reason, keys) || code.is_some_and(|c| !c.is_string()) {
        return None;
    }
    let mut error = Map::new();
    error.insert("message".into(), Value::String(message.into()));
    error.insert(
        "code".into(),
        code.cloned()
            .unwrap_or_else(|| Value::String(crate::llm::types::codes::UNKNOWN.into())),
    );
    out.insert("error".into(), Value::Object(error));
    Some(out)
}

/// `steering/message {turn, message}` → `user/message` with that message; `{turn, content, source}`
/// → `user/message` with a minted legacy id.
fn convert_steering(
    event: &mut Map<String, Value>,
    seq: u64,
    session_id: &str,
) -> Result<Option<&'static str>, LegacyError> {
    let malformed = LegacyError::Malformed {
        seq,
        kind: STEERING_TYPE,
        reason: "expected {turn, message} or {turn, content, source}",
    };
    let Some(data) = data_mut(event) else {
        return Err(malformed);
    };
    let turn_ok = data.get("turn").and_then(safe_int).is_some();
    let new_data = if turn_ok
        && has_exact_keys(data, &["turn", "message"])
        && data.get("message").is_some_and(Value::is_object)
    {
        data.shift_remove("message").unwrap_or_default()
    } else if turn_ok && has_exact_keys(data, &["turn", "content", "source"]) {
        data.shift_remove("turn");
        data.insert(
            "id".into(),
            Value::String(legacy_message_id(session_id, seq)),
        );
        data.insert("role".into(), Value::String("user".into()));
        Value::Object(std::mem::take(data))
    } else {
        return Err(malformed);
    };
    event.insert("type".into(), Value::String("user/message".into()));
    event.insert("data".into(), new_data);
    Ok(Some("steering/message read as user/message"))
}

/// Wraps a pre-identity message event into the current identified shape.
fn convert_message(
    event: &mut Map<String, Value>,
    kind: &str,
    seq: u64,
    session_id: &str,
    message_id_at: impl Fn(u64) -> Option<String>,
) -> Result<Option<&'static str>, LegacyError> {
    let replace_start = match event.get("surfaceOp") {
        Some(Value::Object(op)) if op.get("op").and_then(Value::as_str) == Some("replace") => {
            op.get("start").and_then(Value::as_u64)
        }
        _ => None,
    };
    let Some(data) = data_mut(event) else {
        return Ok(None);
    };
    let id = legacy_message_id(session_id, seq);
    match kind {
        "user/message" => {
            if data.contains_key("id")
                || data.contains_key("role")
                || data.contains_key("message")
                || !data.contains_key("content")
                || !data.contains_key("source")
            {
                return Ok(None);
            }
            data.insert("id".into(), Value::String(id));
            data.insert("role".into(), Value::String("user".into()));
            Ok(Some(
                "user/message: pre-identity message given a legacy-message id",
            ))
        }
        "assistant/message" => {
            if data.contains_key("message")
                || !data.contains_key("content")
                || !data.contains_key("provenance")
            {
                return Ok(None);
            }
            let content = data.shift_remove("content").unwrap_or_default();
            let provenance = data.shift_remove("provenance");
            let mut source = Map::new();
            source.insert("kind".into(), Value::String("model".into()));
            if let Some(Value::Object(p)) = provenance {
                source.extend(p.into_iter().filter(|(k, _)| k != "kind"));
            }
            let mut message = Map::new();
            message.insert("id".into(), Value::String(id));
            message.insert("role".into(), Value::String("assistant".into()));
            message.insert("content".into(), content);
            message.insert("source".into(), Value::Object(source));
            insert_message(data, message);
            Ok(Some(
                "assistant/message: pre-identity {content, provenance} wrapped as an identified message",
            ))
        }
        _ => {
            if data.contains_key("message")
                || !data.contains_key("callId")
                || !data.contains_key("content")
                || !data.contains_key("isError")
            {
                return Ok(None);
            }
            let id = match replace_start {
                None => id,
                Some(target) => {
                    message_id_at(target).ok_or(LegacyError::NoInheritedId { seq, target })?
                }
            };
            let call_id = data.shift_remove("callId").unwrap_or_default();
            let content = data.shift_remove("content").unwrap_or_default();
            let is_error = data.shift_remove("isError").unwrap_or_default();
            let mut block = Map::new();
            block.insert("type".into(), Value::String("tool-result".into()));
            block.insert("toolCallId".into(), call_id.clone());
            block.insert("content".into(), content);
            block.insert("isError".into(), is_error);
            let mut source = Map::new();
            source.insert("kind".into(), Value::String("tool".into()));
            source.insert("callId".into(), call_id);
            let mut message = Map::new();
            message.insert("id".into(), Value::String(id));
            message.insert("role".into(), Value::String("user".into()));
            message.insert("content".into(), Value::Array(vec![Value::Object(block)]));
            message.insert("source".into(), Value::Object(source));
            insert_message(data, message);
            Ok(Some(
                "tool/result: pre-identity {callId, content, isError} wrapped as an identified message",
            ))
        }
    }
}

/// Puts `message` into `data` right after `turn`/`step`, where the current shape has it, keeping the
/// other keys (`usage`, `interrupted`, `error`, `meta`) after it.
fn insert_message(data: &mut Map<String, Value>, message: Map<String, Value>) {
    let rest = std::mem::take(data);
    let (head, tail): (Vec<_>, Vec<_>) = rest
        .into_iter()
        .partition(|(k, _)| k == "turn" || k == "step");
    data.extend(head);
    data.insert("message".into(), Value::Object(message));
    data.extend(tail);
}

/// The message id carried by a typed event, for `convert_event`'s `message_id_at`.
pub fn message_id_of(event: &Event) -> Option<String> {
    event.data.message().map(|m| m.id.to_string())
}

/// The original's chunk-row catalogue (`reference/session-llm.md` §9.3) and its read-time conversions
/// (§5.7). Chunk-row cases about shapes the type system cannot hold (non-string text, fractional
/// times, malformed chunk data — 8 in part and 10) are covered by the reader refusing such lines;
/// case 11 (non-row values pass through) is the importer's, tested in `tests/session_format.rs`.
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn chunk_event(seq: u64, time: i64, step: u64, chunk: StreamChunk) -> Event {
        Event {
            seq,
            time,
            data: EventData::AssistantChunk(std::sync::Arc::new(AssistantChunk {
                turn: 1,
                step,
                chunk,
            })),
            ignorable: false,
            source_event_seqs: None,
            surface_op: None,
            raw_data: None,
        }
    }

    fn text(seq: u64, time: i64, text: &str) -> Event {
        chunk_event(
            seq,
            time,
            1,
            StreamChunk::TextDelta {
                index: 0,
                text: text.into(),
            },
        )
    }

    fn call_delta(seq: u64, id: &str, name: Option<&str>, args: &str) -> Event {
        chunk_event(
            seq,
            1000 + seq as i64,
            1,
            StreamChunk::ToolCallDelta {
                index: 1,
                id: id.into(),
                name: name.map(str::to_string),
                arguments_delta: args.into(),
            },
        )
    }

    fn lines(events: &[Event]) -> Vec<String> {
        pack_chunk_runs(events)
            .iter()
            .map(|r| serde_json::to_string(r).unwrap())
            .collect()
    }

    /// Decodes written records back to events, as the importer does.
    fn decode_all(lines: &[String]) -> Vec<Event> {
        lines
            .iter()
            .flat_map(|l| {
                let value: Value = serde_json::from_str(l).unwrap();
                let tag = value
                    .get("type")
                    .and_then(Value::as_str)
                    .and_then(RowTag::from_type);
                match (tag, value) {
                    (Some(tag), Value::Object(map)) => decode_row(tag, &map).unwrap(),
                    _ => vec![Event::from_json(l).unwrap()],
                }
            })
            .collect()
    }

    /// Case 1: packs a text-delta run into one text-chunks row and round-trips it
    #[test]
    fn packs_a_text_run_into_one_row() {
        let events: Vec<Event> = ["a", "b", "c", "d", "e"]
            .iter()
            .enumerate()
            .map(|(i, t)| text(i as u64, 1000 + 10 * i as i64, t))
            .collect();
        let out = lines(&events);
        assert_eq!(
            out,
            [
                r#"{"type":"text-chunks","seq0":0,"time0":1000,"data":{"turn":1,"step":1,"index":0,"dt":[10,10,10,10],"texts":["a","b","c","d","e"]}}"#
            ]
        );
        assert_eq!(decode_all(&out), events);
    }

    /// Case 2 and 3: reasoning and tool-call runs use their own tags; a name-less tool-call run has no
    /// `name` on the row or on the decoded chunks
    #[test]
    fn packs_reasoning_and_tool_call_runs() {
        let reasoning: Vec<Event> = (0..3)
            .map(|i| {
                chunk_event(
                    i,
                    5,
                    1,
                    StreamChunk::ReasoningDelta {
                        index: 0,
                        text: format!("r{i}"),
                    },
                )
            })
            .collect();
        let named: Vec<Event> = (3..6)
            .map(|i| call_delta(i, "c1", Some("read"), "{"))
            .collect();
        let nameless: Vec<Event> = (6..9).map(|i| call_delta(i, "c2", None, "}")).collect();
        let events: Vec<Event> = [reasoning, named, nameless].concat();
        let out = lines(&events);
        assert_eq!(
            out,
            [
                r#"{"type":"reasoning-chunks","seq0":0,"time0":5,"data":{"turn":1,"step":1,"index":0,"dt":[0,0],"texts":["r0","r1","r2"]}}"#,
                r#"{"type":"tool-call-chunks","seq0":3,"time0":1003,"data":{"turn":1,"step":1,"index":1,"dt":[1,1],"id":"c1","name":"read","args":["{","{","{"]}}"#,
                r#"{"type":"tool-call-chunks","seq0":6,"time0":1006,"data":{"turn":1,"step":1,"index":1,"dt":[1,1],"id":"c2","args":["}","}","}"]}}"#,
            ]
        );
        let decoded = decode_all(&out);
        assert_eq!(decoded, events);
        assert!(!decoded[6].to_json().contains("name"));
    }

    /// Case 4 and 5: runs shorter than three stay verbatim, and other events stay verbatim between runs
    #[test]
    fn short_runs_and_other_events_stay_verbatim() {
        let events = [text(0, 1, "a"), text(1, 1, "b")];
        assert_eq!(
            lines(&events),
            events.iter().map(Event::to_json).collect::<Vec<_>>()
        );
        let start = chunk_event(
            0,
            1,
            1,
            StreamChunk::BlockStart {
                index: 0,
                block_type: crate::llm::types::BlockType::Text,
            },
        );
        let end = chunk_event(
            4,
            1,
            1,
            StreamChunk::BlockEnd {
                index: 0,
                block: crate::llm::types::ContentBlock::text("abc"),
            },
        );
        let step_end =
            Event::from_json(r#"{"type":"step/end","seq":5,"time":1,"data":{"turn":1,"step":1}}"#)
                .unwrap();
        let events = [
            start,
            text(1, 1, "a"),
            text(2, 1, "b"),
            text(3, 1, "c"),
            end,
            step_end,
        ];
        let out = lines(&events);
        assert_eq!(out.len(), 4);
        assert!(out[1].starts_with(r#"{"type":"text-chunks""#));
        assert_eq!(decode_all(&out), events);
    }

    /// Case 6 and 7: a seq gap, a kind switch, a block-index switch, a step switch, a call-id change or a
    /// name-presence change breaks a run (both halves too short to pack)
    #[test]
    fn run_breakers() {
        let reasoning = |seq| {
            chunk_event(
                seq,
                1,
                1,
                StreamChunk::ReasoningDelta {
                    index: 0,
                    text: "x".into(),
                },
            )
        };
        let other_index = |seq| {
            chunk_event(
                seq,
                1,
                1,
                StreamChunk::TextDelta {
                    index: 2,
                    text: "x".into(),
                },
            )
        };
        let other_step = |seq| {
            chunk_event(
                seq,
                1,
                2,
                StreamChunk::TextDelta {
                    index: 0,
                    text: "x".into(),
                },
            )
        };
        let cases: Vec<Vec<Event>> = vec![
            vec![
                text(0, 1, "a"),
                text(1, 1, "b"),
                text(3, 1, "c"),
                text(4, 1, "d"),
            ],
            vec![text(0, 1, "a"), text(1, 1, "b"), reasoning(2), reasoning(3)],
            vec![
                text(0, 1, "a"),
                text(1, 1, "b"),
                other_index(2),
                other_index(3),
            ],
            vec![
                text(0, 1, "a"),
                text(1, 1, "b"),
                other_step(2),
                other_step(3),
            ],
            vec![
                call_delta(0, "a", None, "x"),
                call_delta(1, "a", None, "x"),
                call_delta(2, "b", None, "x"),
                call_delta(3, "b", None, "x"),
            ],
            vec![
                call_delta(0, "a", Some("n"), "x"),
                call_delta(1, "a", Some("n"), "x"),
                call_delta(2, "a", None, "x"),
                call_delta(3, "a", None, "x"),
            ],
            vec![
                call_delta(0, "a", Some("n"), "x"),
                call_delta(1, "a", Some("n"), "x"),
                call_delta(2, "a", Some("m"), "x"),
                call_delta(3, "a", Some("m"), "x"),
            ],
        ];
        for events in cases {
            let out = lines(&events);
            assert_eq!(out, events.iter().map(Event::to_json).collect::<Vec<_>>());
        }
    }

    /// Case 8: a delta outside the whitelist (marked ignorable, carrying surface metadata, or with a time
    /// outside the safe-integer range) is stored verbatim
    #[test]
    fn off_whitelist_deltas_stay_verbatim() {
        let mut ignorable = text(1, 1, "b");
        ignorable.ignorable = true;
        let mut cited = text(1, 1, "b");
        cited.source_event_seqs = Some(vec![0]);
        let unsafe_time = text(1, SAFE_INTEGER_MAX + 1, "b");
        for odd in [ignorable, cited, unsafe_time] {
            let events = [text(0, 1, "a"), odd, text(2, 1, "c")];
            assert_eq!(
                lines(&events),
                events.iter().map(Event::to_json).collect::<Vec<_>>()
            );
        }
    }

    /// Case 9 and 12: a gap beyond the safe-integer range breaks a run; negative gaps (a clock stepped
    /// back) reconstruct exactly
    #[test]
    fn time_gaps() {
        let events = [
            text(0, -SAFE_INTEGER_MAX, "a"),
            text(1, -SAFE_INTEGER_MAX, "b"),
            text(2, SAFE_INTEGER_MAX - 1, "c"),
            text(3, SAFE_INTEGER_MAX - 1, "d"),
        ];
        let out = lines(&events);
        assert_eq!(out.len(), 4);
        assert_eq!(decode_all(&out), events);
        let back = [
            text(0, 100, "a"),
            text(1, 90, "b"),
            text(2, 95, "c"),
            text(3, 10, "d"),
        ];
        let out = lines(&back);
        assert!(out[0].contains(r#""dt":[-10,5,-85]"#), "{}", out[0]);
        assert_eq!(decode_all(&out), back);
    }

    /// Case 13: every malformed row is refused with `malformed <tag> storage row: …`
    #[test]
    fn malformed_rows_are_refused() {
        let good = json!({"type":"text-chunks","seq0":0,"time0":10,"data":{"turn":1,"step":1,"index":0,"dt":[1],"texts":["a","b"]}});
        let tool = json!({"type":"tool-call-chunks","seq0":0,"time0":10,"data":{"turn":1,"step":1,"index":0,"dt":[1],"id":"c","name":"n","args":["a","b"]}});
        let edit = |base: &Value, f: &dyn Fn(&mut Map<String, Value>)| {
            let mut v = base.clone();
            f(v.as_object_mut().unwrap());
            v
        };
        let data = |f: &'static dyn Fn(&mut Map<String, Value>)| {
            move |m: &mut Map<String, Value>| f(m["data"].as_object_mut().unwrap())
        };
        let big = json!(SAFE_INTEGER_MAX);
        let cases: Vec<(Value, &str)> = vec![
            (
                edit(&good, &|m| {
                    m.insert("extra".into(), json!(1));
                }),
                "envelope must be exactly {type, seq0, time0, data}",
            ),
            (
                edit(&good, &|m| {
                    m.remove("time0");
                }),
                "envelope must be exactly {type, seq0, time0, data}",
            ),
            (
                edit(&good, &|m| {
                    m.insert("seq0".into(), json!(-1));
                }),
                "seq0 must be a non-negative safe integer",
            ),
            (
                edit(&good, &|m| {
                    m.insert("seq0".into(), json!(9007199254740992u64));
                }),
                "seq0 must be a non-negative safe integer",
            ),
            (
                edit(&good, &|m| {
                    m.insert("time0".into(), json!(1.5));
                }),
                "time0 must be a safe integer",
            ),
            (
                edit(&good, &|m| {
                    m.insert("data".into(), json!([1]));
                }),
                "data must be an object",
            ),
            (
                edit(
                    &good,
                    &data(&|d| {
                        d.insert("extra".into(), json!(1));
                    }),
                ),
                "data must be exactly {turn, step, index, dt, texts}",
            ),
            (
                edit(
                    &good,
                    &data(&|d| {
                        d.insert("turn".into(), json!("1"));
                    }),
                ),
                "turn/step/index must be non-negative integers",
            ),
            (
                edit(
                    &good,
                    &data(&|d| {
                        d.insert("texts".into(), json!([]));
                    }),
                ),
                "texts must be a non-empty string array",
            ),
            (
                edit(
                    &good,
                    &data(&|d| {
                        d.insert("texts".into(), json!(["a", 1]));
                    }),
                ),
                "texts must be a non-empty string array",
            ),
            (
                edit(
                    &good,
                    &data(&|d| {
                        d.insert("dt".into(), json!([0.5]));
                    }),
                ),
                "dt must be an array of safe integers",
            ),
            (
                edit(
                    &good,
                    &data(&|d| {
                        d.insert("dt".into(), json!([1, 1]));
                    }),
                ),
                "dt length 2 does not match 2 members",
            ),
            (
                edit(
                    &edit(&good, &|m| {
                        m.insert("seq0".into(), big.clone());
                    }),
                    &|_| {},
                ),
                "member seqs must stay safe integers",
            ),
            (
                edit(
                    &edit(&good, &|m| {
                        m.insert("time0".into(), big.clone());
                    }),
                    &|_| {},
                ),
                "member times must stay safe integers",
            ),
            (
                edit(
                    &tool,
                    &data(&|d| {
                        d.insert("id".into(), json!(1));
                    }),
                ),
                "id (and name when present) must be strings",
            ),
            (
                edit(
                    &tool,
                    &data(&|d| {
                        d.insert("name".into(), json!(null));
                    }),
                ),
                "id (and name when present) must be strings",
            ),
            (
                edit(
                    &tool,
                    &data(&|d| {
                        d.remove("id");
                    }),
                ),
                "data must be exactly {turn, step, index, id, name?, dt, args}",
            ),
        ];
        for (row, reason) in cases {
            let tag = RowTag::from_type(row["type"].as_str().unwrap()).unwrap();
            let err = decode_row(tag, row.as_object().unwrap()).unwrap_err();
            assert_eq!(
                err,
                LegacyError::MalformedRow {
                    tag: tag.as_str(),
                    reason: reason.into()
                },
                "{row}"
            );
            assert!(
                err.to_string()
                    .starts_with(&format!("malformed {} storage row: ", tag.as_str()))
            );
        }
        assert_eq!(
            decode_row(RowTag::TextChunks, good.as_object().unwrap())
                .unwrap()
                .len(),
            2
        );
    }

    fn arb_delta() -> impl Strategy<Value = (u8, u32, u64, bool, String)> {
        (0u8..3, 0u32..2, 1u64..3, any::<bool>(), "[a-c]{0,2}")
    }

    proptest! {
        /// Case 14: packing then decoding reproduces every batch exactly, for any mix of deltas, times in
        /// the full safe-integer range and seq gaps.
        #[test]
        fn pack_then_decode_is_identity(
            deltas in prop::collection::vec(arb_delta(), 0..40),
            times in prop::collection::vec(prop_oneof![-SAFE_INTEGER_MAX..=SAFE_INTEGER_MAX, 0i64..5], 40),
            gaps in prop::collection::vec(prop_oneof![9 => Just(1u64), 1 => 2u64..4], 40),
        ) {
            let mut seq = 0;
            let events: Vec<Event> = deltas
                .iter()
                .enumerate()
                .map(|(i, (kind, index, step, named, payload))| {
                    seq += gaps[i];
                    let chunk = match kind {
                        0 => StreamChunk::TextDelta { index: *index, text: payload.clone() },
                        1 => StreamChunk::ReasoningDelta { index: *index, text: payload.clone() },
                        _ => StreamChunk::ToolCallDelta {
                            index: *index,
                            id: format!("c{index}"),
                            name: named.then(|| "n".to_string()),
                            arguments_delta: payload.clone(),
                        },
                    };
                    chunk_event(seq, times[i], *step, chunk)
                })
                .collect();
            prop_assert_eq!(decode_all(&lines(&events)), events);
        }
    }

    // ---- §5.7 read-time conversions ----

    fn convert(line: &str) -> (Result<Option<&'static str>, LegacyError>, Value) {
        let mut map: Map<String, Value> = serde_json::from_str(line).unwrap();
        let ids = |seq: u64| (seq == 2).then(|| "target-id".to_string());
        let out = convert_event(&mut map, "s1", ids);
        (out, Value::Object(map))
    }

    /// Converts `line` and checks the result is a valid current event with the expected JSON.
    fn converts_to(line: &str, want: &str, what: &str) {
        let (out, value) = convert(line);
        assert_eq!(out, Ok(Some(what)), "{line}");
        assert_eq!(value.to_string(), want);
        let event = Event::from_json(&value.to_string()).unwrap();
        assert_eq!(event.seq, value["seq"].as_u64().unwrap());
    }

    #[test]
    fn pre_identity_messages_get_stable_ids() {
        converts_to(
            r#"{"type":"user/message","seq":4,"time":1,"data":{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            r#"{"type":"user/message","seq":4,"time":1,"data":{"content":[{"type":"text","text":"hi"}],"source":{"kind":"user"},"id":"legacy-message:s1:4","role":"user"},"surfaceOp":"append"}"#,
            "user/message: pre-identity message given a legacy-message id",
        );
        converts_to(
            r#"{"type":"assistant/message","seq":5,"time":1,"data":{"turn":1,"step":1,"content":[{"type":"text","text":"a"}],"provenance":{"provider":"p","model":"m"},"usage":{"inputTokens":1,"outputTokens":2}},"sourceEventSeqs":[],"surfaceOp":"append"}"#,
            r#"{"type":"assistant/message","seq":5,"time":1,"data":{"turn":1,"step":1,"message":{"id":"legacy-message:s1:5","role":"assistant","content":[{"type":"text","text":"a"}],"source":{"kind":"model","provider":"p","model":"m"}},"usage":{"inputTokens":1,"outputTokens":2}},"sourceEventSeqs":[],"surfaceOp":"append"}"#,
            "assistant/message: pre-identity {content, provenance} wrapped as an identified message",
        );
        converts_to(
            r#"{"type":"tool/result","seq":6,"time":1,"data":{"turn":1,"step":1,"callId":"c1","content":[{"type":"text","text":"ok"}],"isError":false},"sourceEventSeqs":[3],"surfaceOp":"append"}"#,
            r#"{"type":"tool/result","seq":6,"time":1,"data":{"turn":1,"step":1,"message":{"id":"legacy-message:s1:6","role":"user","content":[{"type":"tool-result","toolCallId":"c1","content":[{"type":"text","text":"ok"}],"isError":false}],"source":{"kind":"tool","callId":"c1"}}},"sourceEventSeqs":[3],"surfaceOp":"append"}"#,
            "tool/result: pre-identity {callId, content, isError} wrapped as an identified message",
        );
        // A replacement inherits its target's id; a target without one is refused.
        let replacement = |start: u64| {
            format!(
                r#"{{"type":"tool/result","seq":7,"time":1,"data":{{"turn":1,"step":1,"callId":"c1","content":[],"isError":false}},"sourceEventSeqs":[{start}],"surfaceOp":{{"op":"replace","start":{start},"end":{start}}}}}"#
            )
        };
        let (out, value) = convert(&replacement(2));
        assert!(out.unwrap().is_some());
        assert_eq!(value["data"]["message"]["id"], "target-id");
        assert_eq!(
            convert(&replacement(3)).0,
            Err(LegacyError::NoInheritedId { seq: 7, target: 3 })
        );
    }

    #[test]
    fn steering_messages_become_user_messages() {
        converts_to(
            r#"{"type":"steering/message","seq":3,"time":1,"data":{"turn":1,"message":{"id":"m","role":"user","content":[],"source":{"kind":"user"}}},"surfaceOp":"append"}"#,
            r#"{"type":"user/message","seq":3,"time":1,"data":{"id":"m","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            "steering/message read as user/message",
        );
        converts_to(
            r#"{"type":"steering/message","seq":3,"time":1,"data":{"turn":1,"content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            r#"{"type":"user/message","seq":3,"time":1,"data":{"content":[],"source":{"kind":"user"},"id":"legacy-message:s1:3","role":"user"},"surfaceOp":"append"}"#,
            "steering/message read as user/message",
        );
        for data in [
            r#"{"turn":1}"#,
            r#"{"turn":"1","content":[],"source":{}}"#,
            r#"{"turn":1,"message":{},"x":1}"#,
            "null",
        ] {
            let line = format!(r#"{{"type":"steering/message","seq":3,"time":1,"data":{data}}}"#);
            assert!(
                matches!(
                    convert(&line).0,
                    Err(LegacyError::Malformed {
                        seq: 3,
                        kind: STEERING_TYPE,
                        ..
                    })
                ),
                "{data}"
            );
        }
    }

    #[test]
    fn turn_start_trigger_is_dropped_after_checking_the_old_shape() {
        converts_to(
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1,"trigger":{"kind":"message","source":{"kind":"user"}}}}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            "turn/start: obsolete trigger dropped",
        );
        for data in [
            r#"{"turn":0,"trigger":{"kind":"m"}}"#,
            r#"{"turn":1,"trigger":{"kind":""}}"#,
            r#"{"turn":1,"trigger":{"kind":"m"},"x":1}"#,
            r#"{"turn":1,"trigger":"m"}"#,
        ] {
            let line = format!(r#"{{"type":"turn/start","seq":0,"time":1,"data":{data}}}"#);
            assert!(
                matches!(
                    convert(&line).0,
                    Err(LegacyError::Malformed {
                        kind: "turn/start",
                        ..
                    })
                ),
                "{data}"
            );
        }
    }

    #[test]
    fn old_turn_end_reasons_are_upgraded() {
        let end = |reason: &str| {
            format!(
                r#"{{"type":"turn/end","seq":9,"time":1,"data":{{"turn":2,"reason":{reason}}}}}"#
            )
        };
        let cases = [
            (
                r#"{"kind":"aborted"}"#,
                r#"{"kind":"aborted","reason":{"kind":"legacy"}}"#,
                "turn/end: reason {kind:aborted} read as aborted{reason:{kind:legacy}}",
            ),
            (
                r#"{"kind":"disposed"}"#,
                r#"{"kind":"aborted","reason":{"kind":"disposed"}}"#,
                "turn/end: reason {kind:disposed} read as aborted{reason:{kind:disposed}}",
            ),
            (
                r#"{"kind":"error","step":1,"failure":{"message":"m","code":"SERVER","status":503}}"#,
                r#"{"kind":"error","error":{"message":"m","code":"SERVER","status":503}}"#,
                "turn/end: old error reason read as error{error}",
            ),
            (
                r#"{"kind":"error","step":1,"message":"m","code":"AUTH"}"#,
                r#"{"kind":"error","error":{"message":"m","code":"AUTH"}}"#,
                "turn/end: old error reason read as error{error}",
            ),
            (
                r#"{"kind":"error","step":0,"message":"m"}"#,
                r#"{"kind":"error","error":{"message":"m","code":"UNKNOWN"}}"#,
                "turn/end: old error reason read as error{error}",
            ),
        ];
        for (old, new, what) in cases {
            converts_to(&end(old), &end(new), what);
        }
        // Current reasons are untouched.
        for current in [
            r#"{"kind":"completed"}"#,
            r#"{"kind":"aborted","reason":{"kind":"user"}}"#,
            r#"{"kind":"error","error":{"message":"m","code":"X"}}"#,
        ] {
            let (out, value) = convert(&end(current));
            assert_eq!(out, Ok(None));
            assert_eq!(value.to_string(), end(current));
        }
        // Old markers without the complete old shape are refused.
        let malformed = [
            r#"{"kind":"completed","x":1}"#,
            r#"{"kind":"aborted","x":1}"#,
            r#"{"kind":"error","message":"m"}"#,
            r#"{"kind":"error","step":1,"message":"m","code":1}"#,
            r#"{"kind":"error","step":1,"failure":{"message":"m"}}"#,
            "null",
        ];
        for reason in malformed {
            assert!(
                matches!(
                    convert(&end(reason)).0,
                    Err(LegacyError::Malformed {
                        kind: "turn/end",
                        ..
                    })
                ),
                "{reason}"
            );
        }
        let (out, _) =
            convert(r#"{"type":"turn/end","seq":9,"time":1,"data":{"error":"model exploded"}}"#);
        assert!(matches!(
            out,
            Err(LegacyError::Malformed {
                kind: "turn/end",
                ..
            })
        ));
    }

    #[test]
    fn retired_vocabulary_is_refused() {
        let (out, _) = convert(r#"{"type":"request/header-delta","seq":1,"time":1,"data":{}}"#);
        assert_eq!(
            out,
            Err(LegacyError::RetiredType {
                seq: 1,
                kind: "request/header-delta".into()
            })
        );
        let (out, _) =
            convert(r#"{"type":"mode/set","seq":2,"time":1,"data":{},"ignorable":true}"#);
        assert_eq!(
            out,
            Err(LegacyError::RetiredType {
                seq: 2,
                kind: "mode/set".into()
            })
        );
        let (out, _) = convert(
            r#"{"type":"request/header","seq":3,"time":1,"data":{"header":{"config":{"provider":"p","model":"m"}},"reason":"fallback"}}"#,
        );
        assert_eq!(out, Err(LegacyError::FallbackReason { seq: 3 }));
        assert_eq!(
            out.unwrap_err().to_string(),
            "seq 3: unsupported legacy request/header reason \"fallback\""
        );
    }

    #[test]
    fn current_events_are_left_alone() {
        for line in [
            r#"{"type":"user/message","seq":1,"time":1,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            r#"{"type":"user/message","seq":1,"time":1,"data":{"role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#,
            r#"{"type":"turn/start","seq":0,"time":1,"data":{"turn":1}}"#,
            r#"{"type":"session/title","seq":0,"time":1,"data":{"title":"t"}}"#,
        ] {
            let (out, value) = convert(line);
            assert_eq!(out, Ok(None));
            assert_eq!(value.to_string(), line);
        }
    }
}
