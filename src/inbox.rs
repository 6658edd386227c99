//! The inbox: an agent's two durable queues of pending user messages, `next-turn` and `next-step`
//! (`reference/agent-loop.md` §3).
//!
//! The inbox is a projection of the log. Every change is one `agent/inbox/spliced` event (a normalized
//! array splice of one queue), and the in-memory lists only ever change by applying such an event. So
//! each operation comes in two halves, the way a raft core hands its caller a `Ready`:
//!
//! 1. **plan** (`plan_append`, `plan_splice`, `plan_claim`, ...): checks the input against the limits
//!    and the current lists and returns the splice payload(s) to persist, changing nothing;
//! 2. **apply**: once the runtime has appended the planned splice to the log, it calls [`Inbox::apply`]
//!    with the same payload, which validates it again and changes the lists.
//!
//! A planned splice is computed against the lists as they are when it is planned, so it stays valid
//! only until something else is applied. Plans that return several splices (`plan_clear`,
//! `plan_claim`) change one queue each, so they stay valid when applied in the order returned.
//!
//! What must stay true: no message id is pending twice, in either queue or across the two
//! (`Inbox::apply` refuses a splice that would break it, so a hand-edited log cannot either).
//!
//! Who calls this: the agent actor (`dsh-actors`) plans on input calls and at step boundaries, and
//! rebuilds the inbox from the log when it loads a session ([`Inbox::rebuild`]). Replaying does not
//! wake the agent; the runtime decides that.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use crate::ids::MessageId;
use crate::limits::Limits;
use crate::llm::types::{ContentBlock, Message, Role};
use crate::session::event::{Event, EventData, InboxSpliced, InboxTarget, SpliceOutcome};

/// Why a message was not admitted into the inbox. Nothing was planned and nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmitError {
    /// Only user messages can be sent to an agent.
    #[error(
        "message {id:?} has role {}, only user messages can be sent to an agent",
        role_name(*.role)
    )]
    NotUserRole {
        /// The refused message.
        id: MessageId,
        /// Its role.
        role: Role,
    },
    /// The message has more content blocks than the limit.
    #[error("message {id:?} has {n_blocks} content blocks, the limit is {blocks_max}")]
    TooManyBlocks {
        /// The refused message.
        id: MessageId,
        /// Its blocks.
        n_blocks: usize,
        /// The limit.
        blocks_max: usize,
    },
    /// The message nests JSON deeper than the limit.
    #[error("message {id:?} nests json deeper than {depth_max} levels")]
    TooDeep {
        /// The refused message.
        id: MessageId,
        /// The limit.
        depth_max: usize,
    },
    /// The message is larger than the limit.
    #[error("message {id:?} is {bytes} bytes, the limit is {bytes_max}")]
    TooLarge {
        /// The refused message.
        id: MessageId,
        /// Its size.
        bytes: usize,
        /// The limit.
        bytes_max: usize,
    },
    /// A message with this id is already pending.
    #[error("message {id:?} is already pending")]
    AlreadyPending {
        /// The refused message.
        id: MessageId,
    },
    /// The inbox cannot take the messages without passing its bound.
    #[error(
        "inbox holds {n_pending} messages and cannot take {n_inserted} more, the limit is {pending_max}"
    )]
    InboxFull {
        /// Messages pending now.
        n_pending: usize,
        /// Messages that would be added.
        n_inserted: usize,
        /// The limit.
        pending_max: usize,
    },
}

/// Why a splice cannot be applied to the current lists. The lists are unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InboxError {
    /// The splice starts past the end of its list.
    #[error(
        "invalid inbox splice: start {start} is past the end of {} (length {len})",
        target_name(*.target)
    )]
    StartOutOfRange {
        /// The list.
        target: InboxTarget,
        /// Where the splice starts.
        start: u64,
        /// The list's length.
        len: usize,
    },
    /// The splice removes past the end of its list.
    #[error(
        "invalid inbox splice: removing {n_removed} from start {start} overruns {} (length {len})",
        target_name(*.target)
    )]
    RemovedOutOfRange {
        /// The list.
        target: InboxTarget,
        /// Where the splice starts.
        start: u64,
        /// How many it removes.
        n_removed: u64,
        /// The list's length.
        len: usize,
    },
    /// The splice inserts a message whose id is already pending.
    #[error("message {id:?} is already pending")]
    AlreadyPending {
        /// The duplicate.
        id: MessageId,
    },
    /// A splice read from the log does not apply.
    #[error("invalid persisted inbox splice at session seq {seq}: {reason}")]
    InvalidPersisted {
        /// The splice event's seq.
        seq: u64,
        /// Why it does not apply.
        reason: Box<InboxError>,
    },
}

/// The pending input of one agent.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inbox {
    /// Prompts; each becomes the sole ordinary prompt of its own turn, oldest first.
    ///
    /// Invariant: no id here is in `next_step`, and none repeats.
    next_turn: VecDeque<Arc<Message>>,
    /// Input for the nearest step boundary; all of it is claimed at once.
    ///
    /// Invariant: no id here is in `next_turn`, and none repeats.
    next_step: VecDeque<Arc<Message>>,
    /// The ids of every pending message, so a duplicate check costs one lookup however long a replayed
    /// log makes the lists.
    ///
    /// Invariant: exactly the ids in `next_turn` and `next_step`.
    ids: HashSet<MessageId>,
}

impl Inbox {
    /// An empty inbox.
    pub fn new() -> Inbox {
        Inbox::default()
    }

    /// Replays every `agent/inbox/spliced` event with `seq >= from_seq` (a fork's inherited prefix lies
    /// below `from_seq` and is ignored), validating each splice exactly as [`Inbox::apply`] does.
    ///
    /// # Errors
    /// `InboxError::InvalidPersisted` naming the seq of the first splice that does not fit the lists
    /// built so far.
    pub fn rebuild(events: &[Event], from_seq: u64) -> Result<Inbox, InboxError> {
        let mut inbox = Inbox::new();
        for event in events.iter().filter(|e| e.seq >= from_seq) {
            if let EventData::InboxSpliced(splice) = &event.data {
                inbox
                    .apply(splice)
                    .map_err(|reason| InboxError::InvalidPersisted {
                        seq: event.seq,
                        reason: Box::new(reason),
                    })?;
            }
        }
        Ok(inbox)
    }

    /// Gives back the spare capacity of the queues and the id set (all of it once they are
    /// empty): a hibernating agent keeps nothing its last turn grew.
    pub fn shrink_to_fit(&mut self) {
        self.next_turn.shrink_to_fit();
        self.next_step.shrink_to_fit();
        self.ids.shrink_to_fit();
    }

    /// The `next-turn` queue, oldest first.
    pub fn next_turn(&self) -> &VecDeque<Arc<Message>> {
        &self.next_turn
    }

    /// The `next-step` queue, oldest first.
    pub fn next_step(&self) -> &VecDeque<Arc<Message>> {
        &self.next_step
    }

    /// One of the two queues.
    pub fn queue(&self, target: InboxTarget) -> &VecDeque<Arc<Message>> {
        match target {
            InboxTarget::NextTurn => &self.next_turn,
            InboxTarget::NextStep => &self.next_step,
        }
    }

    /// Whether either list holds a message.
    pub fn has_pending(&self) -> bool {
        !self.next_turn.is_empty() || !self.next_step.is_empty()
    }

    /// Messages pending in both queues together.
    pub fn n_pending(&self) -> usize {
        self.next_turn.len() + self.next_step.len()
    }

    /// Where message `id` is pending: its queue and index. `next-turn` is searched first.
    pub fn locate(&self, id: &MessageId) -> Option<(InboxTarget, usize)> {
        if !self.ids.contains(id) {
            return None;
        }
        [InboxTarget::NextTurn, InboxTarget::NextStep]
            .into_iter()
            .find_map(|target| {
                let idx = self.queue(target).iter().position(|m| &m.id == id)?;
                Some((target, idx))
            })
    }

    /// Checks one message against the limits: role `user`, at most `content_blocks_max` blocks, JSON
    /// nesting at most `json_depth_max` (the top-level object counts as 1), and serialized size at
    /// most `message_bytes_max`. The depth is measured without recursion before anything is
    /// serialized, so a hostile message cannot exhaust the stack.
    ///
    /// # Errors
    /// The first limit the message breaks, in the order above.
    pub fn admit(msg: &Message, limits: &Limits) -> Result<(), AdmitError> {
        if msg.role != Role::User {
            return Err(AdmitError::NotUserRole {
                id: msg.id.clone(),
                role: msg.role,
            });
        }
        if msg.content.len() > limits.content_blocks_max {
            return Err(AdmitError::TooManyBlocks {
                id: msg.id.clone(),
                n_blocks: msg.content.len(),
                blocks_max: limits.content_blocks_max,
            });
        }
        if json_depth_exceeds(msg, limits.json_depth_max) {
            return Err(AdmitError::TooDeep {
                id: msg.id.clone(),
                depth_max: limits.json_depth_max,
            });
        }
        let bytes = serialized_len(msg);
        if bytes > limits.message_bytes_max {
            return Err(AdmitError::TooLarge {
                id: msg.id.clone(),
                bytes,
                bytes_max: limits.message_bytes_max,
            });
        }
        Ok(())
    }

    /// Plans appending `msg` at the end of `target` (`followup`, `steer`, `inject`).
    ///
    /// # Errors
    /// `admit`'s errors, `AlreadyPending` when the id is pending in either queue, `InboxFull` when
    /// `pending_inputs_max` messages are already pending.
    pub fn plan_append(
        &self,
        target: InboxTarget,
        msg: Arc<Message>,
        limits: &Limits,
    ) -> Result<InboxSpliced, AdmitError> {
        let start = self.queue(target).len();
        self.plan_insert_one(target, start, msg, limits)
    }

    /// Plans inserting `msg` at the front of `target`.
    ///
    /// # Errors
    /// As [`Inbox::plan_append`].
    pub fn plan_prepend(
        &self,
        target: InboxTarget,
        msg: Arc<Message>,
        limits: &Limits,
    ) -> Result<InboxSpliced, AdmitError> {
        self.plan_insert_one(target, 0, msg, limits)
    }

    fn plan_insert_one(
        &self,
        target: InboxTarget,
        start: usize,
        msg: Arc<Message>,
        limits: &Limits,
    ) -> Result<InboxSpliced, AdmitError> {
        Inbox::admit(&msg, limits)?;
        if self.ids.contains(&msg.id) {
            return Err(AdmitError::AlreadyPending { id: msg.id.clone() });
        }
        self.check_room(0, 1, limits)?;
        Ok(InboxSpliced {
            target,
            start: as_u64(start),
            removed_count: None,
            inserted: vec![msg],
            outcome: None,
        })
    }

    /// Plans the public splice of `target`, with array-splice semantics: a negative `start` counts
    /// from the end (clamped to 0), a `start` past the end is clamped to the length, a negative
    /// `delete_count` removes nothing and a large one removes up to the end. Removed messages are
    /// discarded, so the splice is marked `canceled` when it removes any.
    ///
    /// Returns `None` (no event) when the splice would neither remove nor insert anything.
    ///
    /// # Errors
    /// `admit`'s errors for any inserted message, `AlreadyPending` when an inserted id would be pending
    /// twice afterwards, `InboxFull` when the splice grows the inbox past `pending_inputs_max`.
    pub fn plan_splice(
        &self,
        target: InboxTarget,
        start: i64,
        delete_count: i64,
        inserted: Vec<Arc<Message>>,
        limits: &Limits,
    ) -> Result<Option<InboxSpliced>, AdmitError> {
        let queue = self.queue(target);
        let len = queue.len();
        let start_idx = normalize_start(start, len);
        let n_removed = normalize_delete_count(delete_count, len - start_idx);
        if n_removed == 0 && inserted.is_empty() {
            return Ok(None);
        }
        for msg in &inserted {
            Inbox::admit(msg, limits)?;
        }
        let removed = queue.range(start_idx..start_idx + n_removed);
        if let Some(id) = first_duplicate(&self.ids, removed, &inserted) {
            return Err(AdmitError::AlreadyPending { id });
        }
        self.check_room(n_removed, inserted.len(), limits)?;
        Ok(Some(InboxSpliced {
            target,
            start: as_u64(start_idx),
            removed_count: (n_removed > 0).then_some(as_u64(n_removed)),
            inserted,
            outcome: (n_removed > 0).then_some(SpliceOutcome::Canceled),
        }))
    }

    /// Plans the durable cancellation of pending message `id`; `None` when it is not pending.
    pub fn plan_remove(&self, id: &MessageId) -> Option<InboxSpliced> {
        let (target, idx) = self.locate(id)?;
        Some(InboxSpliced {
            target,
            start: as_u64(idx),
            removed_count: Some(1),
            inserted: Vec::new(),
            outcome: Some(SpliceOutcome::Canceled),
        })
    }

    /// Plans replacing pending message `id` by `msg` at the same place (the old one is discarded);
    /// `Ok(None)` when `id` is not pending. `msg` may keep the old id.
    ///
    /// # Errors
    /// `admit`'s errors, `AlreadyPending` when `msg`'s id is pending as another message.
    pub fn plan_replace(
        &self,
        id: &MessageId,
        msg: Arc<Message>,
        limits: &Limits,
    ) -> Result<Option<InboxSpliced>, AdmitError> {
        let Some((target, idx)) = self.locate(id) else {
            return Ok(None);
        };
        Inbox::admit(&msg, limits)?;
        if &msg.id != id && self.ids.contains(&msg.id) {
            return Err(AdmitError::AlreadyPending { id: msg.id.clone() });
        }
        Ok(Some(InboxSpliced {
            target,
            start: as_u64(idx),
            removed_count: Some(1),
            inserted: vec![msg],
            outcome: Some(SpliceOutcome::Canceled),
        }))
    }

    /// Plans the durable cancellation of everything pending: the `next-step` splice first, then the
    /// `next-turn` one, each only when its queue is not empty.
    pub fn plan_clear(&self) -> Vec<InboxSpliced> {
        [InboxTarget::NextStep, InboxTarget::NextTurn]
            .into_iter()
            .filter_map(|target| {
                let len = self.queue(target).len();
                (len > 0).then(|| InboxSpliced {
                    target,
                    start: 0,
                    removed_count: Some(as_u64(len)),
                    inserted: Vec::new(),
                    outcome: Some(SpliceOutcome::Canceled),
                })
            })
            .collect()
    }

    /// Plans the step-boundary claim: all of `next-step`, then — only at a turn's first step
    /// (`at_turn_start`) — the first `next-turn` message. Claims are pure deletions without an
    /// outcome (the messages are consumed, not discarded).
    ///
    /// Returns the splices (only non-empty ones, `next-step` first) and the claimed messages in order
    /// `[next-step messages..., first next-turn message]`.
    pub fn plan_claim(&self, at_turn_start: bool) -> (Vec<InboxSpliced>, Vec<Arc<Message>>) {
        let mut splices = Vec::with_capacity(2);
        let mut claimed: Vec<Arc<Message>> = self.next_step.iter().cloned().collect();
        if !self.next_step.is_empty() {
            splices.push(claim_splice(InboxTarget::NextStep, self.next_step.len()));
        }
        if at_turn_start && let Some(first) = self.next_turn.front() {
            splices.push(claim_splice(InboxTarget::NextTurn, 1));
            claimed.push(first.clone());
        }
        (splices, claimed)
    }

    /// Validates `splice` against the current lists (`start <= len`, `start + removedCount <= len`,
    /// no id pending twice afterwards) and applies it. The inserted messages are the splice's own
    /// (the logged snapshot), shared, not copied.
    ///
    /// Returns the removed messages in order.
    ///
    /// # Errors
    /// `StartOutOfRange`, `RemovedOutOfRange` or `AlreadyPending`; the lists are unchanged.
    pub fn apply(&mut self, splice: &InboxSpliced) -> Result<Vec<Arc<Message>>, InboxError> {
        let target = splice.target;
        let queue = self.queue(target);
        let len = queue.len();
        let start = match usize::try_from(splice.start) {
            Ok(start) if start <= len => start,
            _ => {
                return Err(InboxError::StartOutOfRange {
                    target,
                    start: splice.start,
                    len,
                });
            }
        };
        let n_removed_u64 = splice.removed_count.unwrap_or(0);
        let n_removed = match usize::try_from(n_removed_u64) {
            Ok(n) if n <= len - start => n,
            _ => {
                return Err(InboxError::RemovedOutOfRange {
                    target,
                    start: splice.start,
                    n_removed: n_removed_u64,
                    len,
                });
            }
        };
        let removed = queue.range(start..start + n_removed);
        if let Some(id) = first_duplicate(&self.ids, removed, &splice.inserted) {
            return Err(InboxError::AlreadyPending { id });
        }

        let queue = match target {
            InboxTarget::NextTurn => &mut self.next_turn,
            InboxTarget::NextStep => &mut self.next_step,
        };
        let removed: Vec<Arc<Message>> = queue.drain(start..start + n_removed).collect();
        insert_at(queue, start, &splice.inserted);
        for msg in &removed {
            self.ids.remove(&msg.id);
        }
        for msg in &splice.inserted {
            self.ids.insert(msg.id.clone());
        }
        debug_assert_eq!(self.ids.len(), self.n_pending());
        Ok(removed)
    }

    /// Checks that removing `n_removed` and inserting `n_inserted` keeps the inbox within
    /// `pending_inputs_max`. A splice that does not grow the inbox always fits, so an inbox rebuilt
    /// over a larger limit can still be drained.
    fn check_room(
        &self,
        n_removed: usize,
        n_inserted: usize,
        limits: &Limits,
    ) -> Result<(), AdmitError> {
        let n_pending = self.n_pending();
        let n_after = (n_pending - n_removed).saturating_add(n_inserted);
        if n_inserted > n_removed && n_after > limits.pending_inputs_max {
            return Err(AdmitError::InboxFull {
                n_pending,
                n_inserted,
                pending_max: limits.pending_inputs_max,
            });
        }
        Ok(())
    }
}

/// The wire name of a role, for error messages.
fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
    }
}

/// The wire name of a queue, for error messages.
fn target_name(target: InboxTarget) -> &'static str {
    match target {
        InboxTarget::NextTurn => "next-turn",
        InboxTarget::NextStep => "next-step",
    }
}

fn claim_splice(target: InboxTarget, n_removed: usize) -> InboxSpliced {
    InboxSpliced {
        target,
        start: 0,
        removed_count: Some(as_u64(n_removed)),
        inserted: Vec::new(),
        outcome: None,
    }
}

/// A queue length or index as the `u64` of the event payload. Lengths are bounded by memory, far
/// below `u64::MAX`.
fn as_u64(n: usize) -> u64 {
    u64::try_from(n).expect("a queue length fits in u64")
}

/// Array-splice start: negative counts from the end (clamped at 0), past the end clamps to `len`.
fn normalize_start(start: i64, len: usize) -> usize {
    if start < 0 {
        let back = usize::try_from(start.unsigned_abs()).unwrap_or(usize::MAX);
        len.saturating_sub(back)
    } else {
        usize::try_from(start).map_or(len, |s| s.min(len))
    }
}

/// Array-splice delete count: negative removes nothing, more than `room` removes `room`.
fn normalize_delete_count(delete_count: i64, room: usize) -> usize {
    usize::try_from(delete_count.max(0)).map_or(room, |d| d.min(room))
}

/// The first inserted id that would be pending twice after the splice: already pending and not among
/// the removed messages, or repeated within `inserted`.
fn first_duplicate<'a>(
    pending: &HashSet<MessageId>,
    removed: impl Iterator<Item = &'a Arc<Message>> + Clone,
    inserted: &[Arc<Message>],
) -> Option<MessageId> {
    // A single insert (every append, prepend and replace) cannot repeat itself, so only a splice
    // inserting several messages pays for the set of ids already seen.
    let mut seen: Option<HashSet<&MessageId>> =
        (inserted.len() > 1).then(|| HashSet::with_capacity(inserted.len()));
    let mut removed_ids: Option<HashSet<&MessageId>> = None;
    for msg in inserted {
        if let Some(seen) = seen.as_mut()
            && !seen.insert(&msg.id)
        {
            return Some(msg.id.clone());
        }
        if pending.contains(&msg.id) {
            // Only an insert that collides with a pending id needs the removed set, so it is built
            // lazily: the common append never pays for it.
            let removed_ids =
                removed_ids.get_or_insert_with(|| removed.clone().map(|m| &m.id).collect());
            if !removed_ids.contains(&msg.id) {
                return Some(msg.id.clone());
            }
        }
    }
    None
}

/// Inserts `items` before position `at`, moving the shorter side of the queue.
fn insert_at(queue: &mut VecDeque<Arc<Message>>, at: usize, items: &[Arc<Message>]) {
    if items.is_empty() {
        return;
    }
    if at == queue.len() {
        queue.extend(items.iter().cloned());
    } else if at == 0 {
        for msg in items.iter().rev() {
            queue.push_front(msg.clone());
        }
    } else {
        let tail = queue.split_off(at);
        queue.extend(items.iter().cloned());
        queue.extend(tail);
    }
}

/// True when the JSON serialization of `msg` nests deeper than `depth_max` (the message object is
/// level 1). Walks the message with an explicit stack and stops at the first level past the bound,
/// so the work is bounded by the message size and the stack by `depth_max`, not by the input.
fn json_depth_exceeds(msg: &Message, depth_max: usize) -> bool {
    enum Node<'a> {
        Block(&'a ContentBlock),
        Value(&'a serde_json::Value),
    }
    // The message object (level 1) always holds the `content` array and the `source` object (level
    // 2); the blocks and the source's values sit at level 3.
    if depth_max < 2 {
        return true;
    }
    // The common prompt (text blocks, a flat source) is at most 3 deep; decide it without the stack.
    let flat = msg.content.iter().all(|b| {
        matches!(
            b,
            ContentBlock::Text { .. }
                | ContentBlock::Reasoning { .. }
                | ContentBlock::ToolCall { .. }
        )
    }) && msg
        .source
        .as_map()
        .values()
        .all(|v| !v.is_array() && !v.is_object());
    if flat {
        return !msg.content.is_empty() && depth_max < 3;
    }
    let mut stack: Vec<(Node<'_>, usize)> = Vec::new();
    for block in &msg.content {
        stack.push((Node::Block(block), 3));
    }
    for value in msg.source.as_map().values() {
        stack.push((Node::Value(value), 3));
    }
    while let Some((node, depth)) = stack.pop() {
        match node {
            Node::Block(block) => {
                if depth > depth_max {
                    return true;
                }
                match block {
                    ContentBlock::Text { .. }
                    | ContentBlock::Reasoning { .. }
                    | ContentBlock::ToolCall { .. } => {}
                    ContentBlock::ToolResult { content, .. } => {
                        // The `content` array is one level below the block, its blocks two.
                        if depth + 1 > depth_max {
                            return true;
                        }
                        stack.extend(content.iter().map(|b| (Node::Block(b), depth + 2)));
                    }
                    ContentBlock::Other(map) => {
                        stack.extend(map.values().map(|v| (Node::Value(v), depth + 1)));
                    }
                }
            }
            Node::Value(value) => match value {
                serde_json::Value::Array(items) => {
                    if depth > depth_max {
                        return true;
                    }
                    stack.extend(items.iter().map(|v| (Node::Value(v), depth + 1)));
                }
                serde_json::Value::Object(map) => {
                    if depth > depth_max {
                        return true;
                    }
                    stack.extend(map.values().map(|v| (Node::Value(v), depth + 1)));
                }
                _ => {}
            },
        }
    }
    false
}

/// The length of `msg` serialized as compact JSON, counted without building the bytes.
fn serialized_len(msg: &Message) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Serializing our own types into a writer that never fails cannot fail: every key is a string and
    // `serde_json::Number` cannot hold a non-finite float.
    serde_json::to_writer(&mut counter, msg).expect("a message always serializes");
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::types::MessageSource;
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    fn id(s: &str) -> MessageId {
        MessageId::new(s).expect("test ids are valid")
    }

    fn msg(s: &str) -> Arc<Message> {
        Arc::new(Message::user_text(id(s), format!("text of {s}")))
    }

    fn event(seq: u64, splice: InboxSpliced) -> Event {
        Event {
            seq,
            time: 0,
            data: EventData::InboxSpliced(splice),
            ignorable: false,
            source_event_seqs: None,
            surface_op: None,
            raw_data: None,
        }
    }

    fn splice_json(splice: &InboxSpliced) -> String {
        serde_json::to_string(splice).expect("splices serialize")
    }

    fn ids_of(list: &[Arc<Message>]) -> Vec<&str> {
        list.iter().map(|m| m.id.as_str()).collect()
    }

    fn queue_ids(queue: &VecDeque<Arc<Message>>) -> Vec<&str> {
        queue.iter().map(|m| m.id.as_str()).collect()
    }

    /// Plans with `plan`, applies, and returns what the splice removed.
    fn apply_ok(inbox: &mut Inbox, splice: &InboxSpliced) -> Vec<Arc<Message>> {
        inbox.apply(splice).expect("a fresh plan applies")
    }

    /// `shrink_to_fit` gives back what a drained inbox grew: both queues and the id set end with no
    /// capacity at all, and what is still pending stays as it was.
    #[test]
    fn shrink_to_fit_gives_back_the_capacity_of_a_drained_inbox() {
        let limits = Limits::DEFAULT;
        let mut inbox = Inbox::new();
        for i in 0..40 {
            for target in [InboxTarget::NextTurn, InboxTarget::NextStep] {
                let splice = inbox
                    .plan_append(target, msg(&format!("{target:?}-{i}")), &limits)
                    .expect("room");
                apply_ok(&mut inbox, &splice);
            }
        }
        for splice in inbox.plan_clear() {
            apply_ok(&mut inbox, &splice);
        }
        assert!(!inbox.has_pending());
        assert!(inbox.next_turn.capacity() >= 40 && inbox.next_step.capacity() >= 40);
        // Grown (not `>= 80`: a hash set's capacity after removals counts only the slots it can
        // reuse at once, which depends on where the random hashes put the tombstones).
        assert!(inbox.ids.capacity() > 0);
        inbox.shrink_to_fit();
        assert_eq!(
            (
                inbox.next_turn.capacity(),
                inbox.next_step.capacity(),
                inbox.ids.capacity()
            ),
            (0, 0, 0)
        );

        let splice = inbox
            .plan_append(InboxTarget::NextTurn, msg("kept"), &limits)
            .expect("room");
        apply_ok(&mut inbox, &splice);
        let before = inbox.clone();
        inbox.shrink_to_fit();
        assert_eq!(inbox, before);
        assert_eq!(queue_ids(inbox.next_turn()), ["kept"]);
    }

    /// agent.spec: "rejects an invalid durable splice during reconstruction".
    #[test]
    fn rejects_an_invalid_durable_splice_during_reconstruction() {
        let bad = InboxSpliced {
            target: InboxTarget::NextTurn,
            start: 1,
            removed_count: None,
            inserted: vec![msg("m1")],
            outcome: None,
        };
        let err =
            Inbox::rebuild(&[event(0, bad.clone())], 0).expect_err("start 1 on an empty list");
        assert_eq!(
            err.to_string(),
            "invalid persisted inbox splice at session seq 0: invalid inbox splice: start 1 is past \
             the end of next-turn (length 0)"
        );
        assert_eq!(
            err,
            InboxError::InvalidPersisted {
                seq: 0,
                reason: Box::new(InboxError::StartOutOfRange {
                    target: InboxTarget::NextTurn,
                    start: 1,
                    len: 0
                })
            }
        );

        // A removal past the end and a duplicate id are refused the same way, naming their seq.
        let ok = InboxSpliced {
            start: 0,
            ..bad.clone()
        };
        let overrun = InboxSpliced {
            target: InboxTarget::NextTurn,
            start: 0,
            removed_count: Some(2),
            inserted: Vec::new(),
            outcome: None,
        };
        let err =
            Inbox::rebuild(&[event(0, ok.clone()), event(1, overrun)], 0).expect_err("overrun");
        assert_eq!(
            err.to_string(),
            "invalid persisted inbox splice at session seq 1: invalid inbox splice: removing 2 from \
             start 0 overruns next-turn (length 1)"
        );
        let dup = InboxSpliced {
            target: InboxTarget::NextStep,
            ..ok.clone()
        };
        let err = Inbox::rebuild(&[event(3, ok.clone()), event(4, dup)], 0).expect_err("duplicate");
        assert_eq!(
            err.to_string(),
            "invalid persisted inbox splice at session seq 4: message \"m1\" is already pending"
        );

        // A fork's inherited prefix (below the seed boundary) is not replayed.
        let rebuilt = Inbox::rebuild(&[event(0, bad), event(1, ok)], 1).expect("prefix ignored");
        assert_eq!(queue_ids(rebuilt.next_turn()), ["m1"]);
    }

    /// agent.spec: "replaces a pending message by identity across both lists".
    #[test]
    fn replaces_a_pending_message_by_identity_across_both_lists() {
        let limits = Limits::DEFAULT;
        let mut inbox = Inbox::new();
        let mut inserted = Vec::new();
        let mut discarded = Vec::new();
        for (target, m) in [
            (InboxTarget::NextTurn, msg("original")),
            (InboxTarget::NextStep, msg("nextStep")),
        ] {
            let splice = inbox.plan_append(target, m, &limits).expect("fresh ids");
            inserted.extend(splice.inserted.iter().cloned());
            apply_ok(&mut inbox, &splice);
        }

        assert_eq!(
            inbox.plan_replace(&id("missing"), msg("x"), &limits),
            Ok(None)
        );

        for (old, new) in [("original", "replacement"), ("nextStep", "editedStep")] {
            let splice = inbox
                .plan_replace(&id(old), msg(new), &limits)
                .expect("admitted")
                .expect("pending");
            inserted.extend(splice.inserted.iter().cloned());
            discarded.extend(apply_ok(&mut inbox, &splice));
        }
        assert_eq!(ids_of(&discarded), ["original", "nextStep"]);
        assert_eq!(
            ids_of(&inserted),
            ["original", "nextStep", "replacement", "editedStep"]
        );
        assert_eq!(queue_ids(inbox.next_turn()), ["replacement"]);
        assert_eq!(queue_ids(inbox.next_step()), ["editedStep"]);

        let dup = inbox.plan_replace(&id("replacement"), msg("editedStep"), &limits);
        assert_eq!(
            dup,
            Err(AdmitError::AlreadyPending {
                id: id("editedStep")
            })
        );
        assert_eq!(
            dup.expect_err("duplicate").to_string(),
            "message \"editedStep\" is already pending"
        );

        // Replacing a message by a new version with the same id is allowed.
        let same = Arc::new(Message::user_text(id("replacement"), "edited text"));
        let splice = inbox
            .plan_replace(&id("replacement"), same.clone(), &limits)
            .expect("admitted")
            .expect("pending");
        assert_eq!(
            splice_json(&splice),
            r#"{"target":"next-turn","start":0,"removedCount":1,"inserted":[{"content":[{"type":"text","text":"edited text"}],"source":{"kind":"user"},"role":"user","id":"replacement"}],"outcome":"canceled"}"#
        );
        apply_ok(&mut inbox, &splice);
        assert_eq!(inbox.next_turn().front(), Some(&same));
    }

    /// agent.spec: "normalizes splice coordinates, rejects duplicate identities, and reports missing
    /// removals". The original's NaN coordinates have no `i64` counterpart; the extreme values stand
    /// in for them (both normalize to an insert at 0).
    #[test]
    fn normalizes_splice_coordinates_rejects_duplicates_and_reports_missing_removals() {
        let limits = Limits::DEFAULT;
        let target = InboxTarget::NextTurn;
        let mut inbox = Inbox::new();

        let first = inbox
            .plan_splice(target, i64::MIN, i64::MIN, vec![msg("a")], &limits)
            .expect("admitted")
            .expect("inserts");
        assert_eq!(
            (first.start, first.removed_count, first.outcome),
            (0, None, None)
        );
        apply_ok(&mut inbox, &first);

        let past_end = inbox
            .plan_splice(target, i64::MAX, 5, vec![msg("b"), msg("c")], &limits)
            .expect("admitted")
            .expect("inserts");
        assert_eq!(
            (past_end.start, past_end.removed_count, past_end.outcome),
            (1, None, None)
        );
        apply_ok(&mut inbox, &past_end);
        assert_eq!(queue_ids(inbox.next_turn()), ["a", "b", "c"]);

        let last = inbox
            .plan_splice(target, -1, 1, Vec::new(), &limits)
            .expect("admitted")
            .expect("removes");
        assert_eq!(
            splice_json(&last),
            r#"{"target":"next-turn","start":2,"removedCount":1,"inserted":[],"outcome":"canceled"}"#
        );
        assert_eq!(ids_of(&apply_ok(&mut inbox, &last)), ["c"]);

        // Nothing removed and nothing inserted: no event.
        assert_eq!(
            inbox.plan_splice(target, 0, 0, Vec::new(), &limits),
            Ok(None)
        );
        assert_eq!(
            inbox.plan_splice(target, 1, -7, Vec::new(), &limits),
            Ok(None)
        );
        assert_eq!(
            inbox.plan_splice(InboxTarget::NextStep, -3, 9, Vec::new(), &limits),
            Ok(None)
        );

        // A gone id reports a missing removal.
        assert_eq!(inbox.plan_remove(&id("c")), None);
        let remove_b = inbox.plan_remove(&id("b")).expect("pending");
        assert_eq!(
            splice_json(&remove_b),
            r#"{"target":"next-turn","start":1,"removedCount":1,"inserted":[],"outcome":"canceled"}"#
        );
        assert_eq!(ids_of(&apply_ok(&mut inbox, &remove_b)), ["b"]);

        // Duplicates across lists and within one splice are refused; re-inserting what the same
        // splice removes is not a duplicate.
        assert_eq!(
            inbox.plan_splice(InboxTarget::NextStep, 0, 0, vec![msg("a")], &limits),
            Err(AdmitError::AlreadyPending { id: id("a") })
        );
        assert_eq!(
            inbox.plan_splice(target, 0, 0, vec![msg("d"), msg("d")], &limits),
            Err(AdmitError::AlreadyPending { id: id("d") })
        );
        let swap = inbox
            .plan_splice(target, -100, i64::MAX, vec![msg("a")], &limits)
            .expect("admitted")
            .expect("replaces");
        assert_eq!(
            (swap.start, swap.removed_count, swap.outcome),
            (0, Some(1), Some(SpliceOutcome::Canceled))
        );
        assert_eq!(ids_of(&apply_ok(&mut inbox, &swap)), ["a"]);
        assert_eq!(queue_ids(inbox.next_turn()), ["a"]);
    }

    /// agent.spec: "clears both pending lists as durable cancellations".
    #[test]
    fn clears_both_pending_lists_as_durable_cancellations() {
        let limits = Limits::DEFAULT;
        let mut inbox = Inbox::new();
        for (target, m) in [
            (InboxTarget::NextTurn, msg("turn")),
            (InboxTarget::NextStep, msg("step")),
        ] {
            let splice = inbox.plan_append(target, m, &limits).expect("fresh");
            apply_ok(&mut inbox, &splice);
        }
        let splices = inbox.plan_clear();
        assert_eq!(
            splices.iter().map(splice_json).collect::<Vec<_>>(),
            [
                r#"{"target":"next-step","start":0,"removedCount":1,"inserted":[],"outcome":"canceled"}"#,
                r#"{"target":"next-turn","start":0,"removedCount":1,"inserted":[],"outcome":"canceled"}"#,
            ]
        );
        let discarded: Vec<_> = splices
            .iter()
            .flat_map(|s| apply_ok(&mut inbox, s))
            .collect();
        assert_eq!(ids_of(&discarded), ["step", "turn"]);
        assert!(!inbox.has_pending());
        assert_eq!(inbox.plan_clear(), Vec::new());
    }

    fn filled(next_step: &[&str], next_turn: &[&str]) -> Inbox {
        let limits = Limits::DEFAULT;
        let mut inbox = Inbox::new();
        for (target, ids) in [
            (InboxTarget::NextStep, next_step),
            (InboxTarget::NextTurn, next_turn),
        ] {
            for s in ids {
                let splice = inbox.plan_append(target, msg(s), &limits).expect("fresh");
                apply_ok(&mut inbox, &splice);
            }
        }
        inbox
    }

    /// §3.3 claim: at a turn's first step, all of next-step and then the first next-turn prompt, as
    /// pure deletions without an outcome.
    #[test]
    fn claim_at_turn_start_takes_all_next_step_then_the_first_prompt() {
        let mut inbox = filled(&["s1", "s2"], &["t1", "t2"]);
        let (splices, claimed) = inbox.plan_claim(true);
        assert_eq!(
            splices.iter().map(splice_json).collect::<Vec<_>>(),
            [
                r#"{"target":"next-step","start":0,"removedCount":2,"inserted":[]}"#,
                r#"{"target":"next-turn","start":0,"removedCount":1,"inserted":[]}"#,
            ]
        );
        assert_eq!(ids_of(&claimed), ["s1", "s2", "t1"]);
        let removed: Vec<_> = splices
            .iter()
            .flat_map(|s| apply_ok(&mut inbox, s))
            .collect();
        assert_eq!(removed, claimed);
        assert_eq!(queue_ids(inbox.next_turn()), ["t2"]);
        assert!(inbox.next_step().is_empty());
        assert_eq!(inbox.n_pending(), 1);
    }

    /// §3.3 claim: at later steps only next-step is claimed; queued prompts wait for their own turns.
    #[test]
    fn claim_inside_a_turn_takes_only_next_step() {
        let inbox = filled(&["s1"], &["t1"]);
        let (splices, claimed) = inbox.plan_claim(false);
        assert_eq!(
            splices.iter().map(splice_json).collect::<Vec<_>>(),
            [r#"{"target":"next-step","start":0,"removedCount":1,"inserted":[]}"#]
        );
        assert_eq!(ids_of(&claimed), ["s1"]);

        let only_prompts = filled(&[], &["t1", "t2"]);
        assert_eq!(only_prompts.plan_claim(false), (Vec::new(), Vec::new()));
        let (splices, claimed) = only_prompts.plan_claim(true);
        assert_eq!(
            splices.iter().map(splice_json).collect::<Vec<_>>(),
            [r#"{"target":"next-turn","start":0,"removedCount":1,"inserted":[]}"#]
        );
        assert_eq!(ids_of(&claimed), ["t1"]);

        assert_eq!(Inbox::new().plan_claim(true), (Vec::new(), Vec::new()));
    }

    #[test]
    fn locate_searches_next_turn_first() {
        let inbox = filled(&["s1", "s2"], &["t1"]);
        assert_eq!(inbox.locate(&id("s2")), Some((InboxTarget::NextStep, 1)));
        assert_eq!(inbox.locate(&id("t1")), Some((InboxTarget::NextTurn, 0)));
        assert_eq!(inbox.locate(&id("nope")), None);
        let prepend = inbox
            .plan_prepend(InboxTarget::NextStep, msg("s0"), &Limits::DEFAULT)
            .expect("fresh");
        assert_eq!((prepend.target, prepend.start), (InboxTarget::NextStep, 0));
    }

    #[test]
    fn admission_refuses_each_limit_with_its_numbers() {
        let limits = Limits {
            content_blocks_max: 2,
            message_bytes_max: 120,
            json_depth_max: 6,
            pending_inputs_max: 2,
            ..Limits::DEFAULT
        };
        let mut assistant = Message::user_text(id("a1"), "hi");
        assistant.role = Role::Assistant;
        let err = Inbox::admit(&assistant, &limits);
        assert_eq!(
            err,
            Err(AdmitError::NotUserRole {
                id: id("a1"),
                role: Role::Assistant
            })
        );
        assert_eq!(
            err.expect_err("assistant").to_string(),
            "message \"a1\" has role assistant, only user messages can be sent to an agent"
        );

        let mut blocks = Message::user_text(id("b1"), "x");
        blocks.content = vec![ContentBlock::text("1"); 3];
        let err = Inbox::admit(&blocks, &limits).expect_err("3 blocks");
        assert_eq!(
            err.to_string(),
            "message \"b1\" has 3 content blocks, the limit is 2"
        );

        let big = Message::user_text(id("big"), "x".repeat(100));
        let bytes = serde_json::to_vec(&big).expect("serializes").len();
        assert_eq!(
            Inbox::admit(&big, &limits),
            Err(AdmitError::TooLarge {
                id: id("big"),
                bytes,
                bytes_max: 120
            })
        );
        // Exactly at the limit is admitted (same id length, so the same overhead).
        let fits = Message::user_text(id("fit"), "x".repeat(120 - (bytes - 100)));
        assert_eq!(serde_json::to_vec(&fits).expect("serializes").len(), 120);
        assert_eq!(Inbox::admit(&fits, &limits), Ok(()));

        // Level 1 message, 2 content, 3 block, 4.. the nested arrays.
        let deep = |n_arrays: usize| {
            let mut value = Value::Null;
            for _ in 0..n_arrays {
                value = Value::Array(vec![value]);
            }
            let mut map = Map::new();
            map.insert("type".into(), json!("x"));
            map.insert("v".into(), value);
            let mut m = Message::user_text(id("deep"), "");
            m.content = vec![ContentBlock::Other(map)];
            m
        };
        assert_eq!(Inbox::admit(&deep(3), &limits), Ok(()));
        assert_eq!(
            Inbox::admit(&deep(4), &limits),
            Err(AdmitError::TooDeep {
                id: id("deep"),
                depth_max: 6
            })
        );

        let mut inbox = Inbox::new();
        for s in ["p1", "p2"] {
            let splice = inbox
                .plan_append(InboxTarget::NextTurn, msg(s), &limits)
                .expect("room");
            apply_ok(&mut inbox, &splice);
        }
        let full = inbox.plan_append(InboxTarget::NextStep, msg("p3"), &limits);
        assert_eq!(
            full,
            Err(AdmitError::InboxFull {
                n_pending: 2,
                n_inserted: 1,
                pending_max: 2
            })
        );
        assert_eq!(
            full.expect_err("full").to_string(),
            "inbox holds 2 messages and cannot take 1 more, the limit is 2"
        );
        // A splice that does not grow the inbox still fits.
        assert!(
            inbox
                .plan_splice(InboxTarget::NextTurn, 0, 1, vec![msg("p3")], &limits)
                .expect("same size")
                .is_some()
        );
        // Refused plans changed nothing.
        assert_eq!(queue_ids(inbox.next_turn()), ["p1", "p2"]);
    }

    /// A message nested far deeper than any stack allows is refused by the depth check without being
    /// serialized (serialization would recurse once per level).
    #[test]
    fn admission_refuses_a_hostile_depth_without_recursing() {
        let n_levels = 200_000;
        let mut value = Value::Null;
        for _ in 0..n_levels {
            value = Value::Array(vec![value]);
        }
        let mut map = Map::new();
        map.insert("type".into(), json!("x"));
        map.insert("v".into(), value);
        let mut m = Message::user_text(id("deep"), "");
        m.content = vec![ContentBlock::Other(map)];
        assert_eq!(
            Inbox::admit(&m, &Limits::DEFAULT),
            Err(AdmitError::TooDeep {
                id: id("deep"),
                depth_max: 128
            })
        );
        // Dismantle iteratively: the derived drop would recurse once per level.
        let Some(ContentBlock::Other(mut map)) = m.content.pop() else {
            unreachable!("built above")
        };
        let mut value = map.remove("v");
        while let Some(Value::Array(mut items)) = value {
            value = items.pop();
        }
    }

    /// The nesting depth of a JSON text, scanning brackets outside strings.
    fn text_depth(text: &str) -> usize {
        let (mut depth, mut depth_max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
        for c in text.chars() {
            if in_string {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => in_string = true,
                '[' | '{' => {
                    depth += 1;
                    depth_max = depth_max.max(depth);
                }
                ']' | '}' => depth -= 1,
                _ => {}
            }
        }
        depth_max
    }

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            "[a-z\\[\\]{}\"\\\\]{0,4}".prop_map(Value::String),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(6, 32, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::vec(("[a-c]", inner), 0..3)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn block() -> impl Strategy<Value = ContentBlock> {
        let leaf = prop_oneof![
            "[a-z]{0,3}".prop_map(ContentBlock::text),
            json_value().prop_map(|v| {
                let mut map = Map::new();
                map.insert("type".into(), json!("custom"));
                map.insert("v".into(), v);
                ContentBlock::Other(map)
            }),
        ];
        leaf.prop_recursive(3, 12, 3, |inner| {
            prop::collection::vec(inner, 0..3).prop_map(|content| ContentBlock::ToolResult {
                tool_call_id: "c".into(),
                content,
                is_error: None,
            })
        })
    }

    proptest! {
        /// The structural depth walk agrees with the depth of the serialized text at every bound.
        #[test]
        fn depth_walk_matches_the_serialized_text(
            blocks in prop::collection::vec(block(), 0..4),
            source_extra in json_value(),
        ) {
            let mut m = Message::user_text(id("m"), "");
            m.content = blocks;
            let mut source = MessageSource::user().as_map().clone();
            source.insert("extra".into(), source_extra);
            m.source = MessageSource::from_map(source).expect("has kind");
            let depth = text_depth(&serde_json::to_string(&m).expect("serializes"));
            for depth_max in 0..depth + 2 {
                prop_assert_eq!(json_depth_exceeds(&m, depth_max), depth > depth_max, "bound {}", depth_max);
            }
        }
    }

    /// One operation of the model test.
    #[derive(Clone, Debug)]
    enum Op {
        Append(InboxTarget, u8),
        Prepend(InboxTarget, u8),
        Splice(InboxTarget, i64, i64, Vec<u8>),
        Remove(u8),
        Replace(u8, u8),
        Clear,
        Claim(bool),
    }

    fn target() -> impl Strategy<Value = InboxTarget> {
        prop_oneof![Just(InboxTarget::NextTurn), Just(InboxTarget::NextStep)]
    }

    fn op() -> impl Strategy<Value = Op> {
        let n = 0u8..8;
        prop_oneof![
            3 => (target(), n.clone()).prop_map(|(t, n)| Op::Append(t, n)),
            1 => (target(), n.clone()).prop_map(|(t, n)| Op::Prepend(t, n)),
            2 => (target(), -8i64..8, -2i64..5, prop::collection::vec(n.clone(), 0..3))
                .prop_map(|(t, s, d, ins)| Op::Splice(t, s, d, ins)),
            1 => (target(), any::<i64>(), any::<i64>()).prop_map(|(t, s, d)| Op::Splice(t, s, d, vec![])),
            1 => n.clone().prop_map(Op::Remove),
            1 => (n.clone(), n).prop_map(|(a, b)| Op::Replace(a, b)),
            1 => Just(Op::Clear),
            2 => any::<bool>().prop_map(Op::Claim),
        ]
    }

    /// The plain model: two `Vec`s and the rules written out directly.
    #[derive(Default)]
    struct Model {
        next_turn: Vec<Arc<Message>>,
        next_step: Vec<Arc<Message>>,
    }

    impl Model {
        fn list(&mut self, t: InboxTarget) -> &mut Vec<Arc<Message>> {
            match t {
                InboxTarget::NextTurn => &mut self.next_turn,
                InboxTarget::NextStep => &mut self.next_step,
            }
        }
        fn all(&self) -> impl Iterator<Item = &Arc<Message>> {
            self.next_turn.iter().chain(&self.next_step)
        }
        fn pending(&self, id: &MessageId) -> bool {
            self.all().any(|m| &m.id == id)
        }
        fn n(&self) -> usize {
            self.next_turn.len() + self.next_step.len()
        }
    }

    const PENDING_MAX: usize = 6;

    /// For one operation: what the inbox planned, the messages the model says the plan removes, and
    /// the refusal the model expects.
    type Expected = (
        Result<Vec<InboxSpliced>, AdmitError>,
        Vec<Arc<Message>>,
        Option<AdmitError>,
    );

    proptest! {
        /// Every operation leaves the live inbox equal to a plain model, refused operations change
        /// nothing, and replaying the applied splices (through the JSON codec) rebuilds the same inbox.
        #[test]
        fn inbox_matches_a_vec_model_and_rebuilds_from_its_splices(
            ops in prop::collection::vec(op(), 1..60)
        ) {
            let limits = Limits { pending_inputs_max: PENDING_MAX, ..Limits::DEFAULT };
            let mut inbox = Inbox::new();
            let mut model = Model::default();
            let mut events: Vec<Event> = Vec::new();
            let mut version = 0u64;
            let mut fresh = |n: u8| {
                version += 1;
                Arc::new(Message::user_text(id(&format!("m{n}")), format!("v{version}")))
            };

            for op in ops {
                let before = inbox.clone();
                // (splices planned, removed messages the model expects, refusal the model expects)
                let (planned, expect_removed, expect_err): Expected = match op {
                    Op::Append(t, n) | Op::Prepend(t, n) => {
                        let m = fresh(n);
                        let front = matches!(op, Op::Prepend(..));
                        let planned = if front {
                            inbox.plan_prepend(t, m.clone(), &limits)
                        } else {
                            inbox.plan_append(t, m.clone(), &limits)
                        };
                        let err = if model.pending(&m.id) {
                            Some(AdmitError::AlreadyPending { id: m.id.clone() })
                        } else if model.n() >= PENDING_MAX {
                            Some(AdmitError::InboxFull { n_pending: model.n(), n_inserted: 1, pending_max: PENDING_MAX })
                        } else {
                            let list = model.list(t);
                            if front { list.insert(0, m) } else { list.push(m) }
                            None
                        };
                        (planned.map(|s| vec![s]), Vec::new(), err)
                    }
                    Op::Splice(t, start, delete_count, ref ins) => {
                        let ins: Vec<_> = ins.iter().map(|&n| fresh(n)).collect();
                        let planned = inbox.plan_splice(t, start, delete_count, ins.clone(), &limits);
                        let n_all = model.n();
                        let len = i128::try_from(model.list(t).len()).expect("small");
                        let s = if start < 0 { (len + i128::from(start)).max(0) } else { i128::from(start).min(len) };
                        let d = i128::from(delete_count).clamp(0, len - s);
                        let (s, d) = (usize::try_from(s).expect("in range"), usize::try_from(d).expect("in range"));
                        let mut removed = Vec::new();
                        let mut err = None;
                        if d > 0 || !ins.is_empty() {
                            let list = model.list(t).clone();
                            let kept: Vec<&Arc<Message>> = list[..s].iter().chain(&list[s + d..]).collect();
                            let other = match t { InboxTarget::NextTurn => model.next_step.clone(), InboxTarget::NextStep => model.next_turn.clone() };
                            let mut seen: Vec<&MessageId> = Vec::new();
                            for m in &ins {
                                let dup = seen.contains(&&m.id)
                                    || kept.iter().any(|k| k.id == m.id)
                                    || other.iter().any(|o| o.id == m.id);
                                if dup && err.is_none() {
                                    err = Some(AdmitError::AlreadyPending { id: m.id.clone() });
                                }
                                seen.push(&m.id);
                            }
                            if err.is_none() && ins.len() > d && n_all - d + ins.len() > PENDING_MAX {
                                err = Some(AdmitError::InboxFull { n_pending: n_all, n_inserted: ins.len(), pending_max: PENDING_MAX });
                            }
                            if err.is_none() {
                                removed = model.list(t).splice(s..s + d, ins.iter().cloned()).collect();
                            }
                        }
                        (planned.map(|s| s.into_iter().collect()), removed, err)
                    }
                    Op::Remove(n) => {
                        let target_id = id(&format!("m{n}"));
                        let planned = inbox.plan_remove(&target_id);
                        let mut removed = Vec::new();
                        for t in [InboxTarget::NextTurn, InboxTarget::NextStep] {
                            let list = model.list(t);
                            if let Some(idx) = list.iter().position(|m| m.id == target_id) {
                                removed.push(list.remove(idx));
                                break;
                            }
                        }
                        (Ok(planned.into_iter().collect()), removed, None)
                    }
                    Op::Replace(old, new) => {
                        let old_id = id(&format!("m{old}"));
                        let m = fresh(new);
                        let planned = inbox.plan_replace(&old_id, m.clone(), &limits);
                        let mut removed = Vec::new();
                        let mut err = None;
                        if model.pending(&old_id) {
                            if m.id != old_id && model.pending(&m.id) {
                                err = Some(AdmitError::AlreadyPending { id: m.id.clone() });
                            } else {
                                for t in [InboxTarget::NextTurn, InboxTarget::NextStep] {
                                    let list = model.list(t);
                                    if let Some(idx) = list.iter().position(|x| x.id == old_id) {
                                        removed.push(std::mem::replace(&mut list[idx], m));
                                        break;
                                    }
                                }
                            }
                        }
                        (planned.map(|s| s.into_iter().collect()), removed, err)
                    }
                    Op::Clear => {
                        let mut removed = std::mem::take(&mut model.next_step);
                        removed.append(&mut model.next_turn);
                        (Ok(inbox.plan_clear()), removed, None)
                    }
                    Op::Claim(at_turn_start) => {
                        let (splices, claimed) = inbox.plan_claim(at_turn_start);
                        let mut removed = std::mem::take(&mut model.next_step);
                        if at_turn_start && !model.next_turn.is_empty() {
                            removed.push(model.next_turn.remove(0));
                        }
                        prop_assert_eq!(&claimed, &removed);
                        (Ok(splices), removed, None)
                    }
                };
                // Planning never changes the inbox.
                prop_assert_eq!(&inbox, &before);
                match (planned, expect_err) {
                    (Err(got), Some(want)) => prop_assert_eq!(got, want),
                    (Err(got), None) => prop_assert!(false, "refused {:?}: {}", op, got),
                    (Ok(_), Some(want)) => prop_assert!(false, "accepted {:?}, model refused: {}", op, want),
                    (Ok(splices), None) => {
                        let mut removed = Vec::new();
                        for splice in splices {
                            removed.extend(inbox.apply(&splice).expect("a fresh plan applies"));
                            let seq = u64::try_from(events.len()).expect("small");
                            events.push(event(seq, splice));
                        }
                        prop_assert_eq!(&removed, &expect_removed);
                    }
                }
                prop_assert_eq!(inbox.next_turn().iter().collect::<Vec<_>>(), model.next_turn.iter().collect::<Vec<_>>());
                prop_assert_eq!(inbox.next_step().iter().collect::<Vec<_>>(), model.next_step.iter().collect::<Vec<_>>());
                prop_assert_eq!(inbox.n_pending(), model.n());
                prop_assert_eq!(inbox.has_pending(), model.n() > 0);
            }

            let reread: Vec<Event> = events
                .iter()
                .map(|e| Event::from_json(&e.to_json()).expect("round-trips"))
                .collect();
            prop_assert_eq!(Inbox::rebuild(&reread, 0).expect("valid log"), inbox);
        }
    }
}
