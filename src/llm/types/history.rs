//! `History`: the model-visible messages of a session as an append-only list that the session and
//! every request made from it share, so taking the history for a request costs the same at turn 5,000
//! as at turn 1 (issue 15: a `Vec<Arc<Message>>` copied per request grew with history).
//!
//! A `History` is a snapshot: a shared chain of segments (8 slots, then 16, 32, … — doubling, so
//! reaching any index walks O(log n) links) and a length. Cloning one is an `Arc` clone.
//! `push` writes the slot at its length: slots are write-once (`OnceLock`), so the first holder to
//! push at an index owns it, and a holder whose slot is already taken (an older snapshot pushing
//! after the session moved on) copies its own messages into a fresh chain first. Snapshots never see
//! each other's pushes: a snapshot reads only below its length. No `unsafe`.

use std::fmt;
use std::sync::{Arc, OnceLock};

use super::Message;

/// Slots in the first segment; each next segment has twice as many.
const FIRST: usize = 8;

struct Segment {
    slots: Box<[OnceLock<Arc<Message>>]>,
    next: OnceLock<Box<Segment>>,
}

impl Segment {
    fn new(capacity: usize) -> Segment {
        Segment {
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
            next: OnceLock::new(),
        }
    }

    /// The next segment, created if no holder created it yet.
    fn next_or_new(&self) -> &Segment {
        self.next
            .get_or_init(|| Box::new(Segment::new(self.slots.len() * 2)))
    }
}

impl Drop for Segment {
    /// Drops the chain iteratively (a long chain is only ~50 links, but no recursion is needed).
    fn drop(&mut self) {
        let mut next = self.next.take();
        while let Some(mut seg) = next {
            next = seg.next.take();
        }
    }
}

/// The model-visible history: messages in order, shared between the session that appends to it and
/// the requests made from it. Cheap to clone (one `Arc`), compared by the messages it holds.
#[derive(Clone, Default)]
pub struct History {
    head: Option<Arc<Segment>>,
    len: usize,
    /// `Message::text_bytes` summed over the messages below `len`.
    text_bytes: u64,
}

impl History {
    /// An empty history (allocates nothing).
    pub fn new() -> History {
        History::default()
    }

    /// The number of messages.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `Message::text_bytes` summed over the messages, kept as they are pushed: O(1).
    pub fn text_bytes(&self) -> u64 {
        self.text_bytes
    }

    /// Whether there are no messages.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `message`. O(log n) (one segment walk); copies this snapshot's messages once if
    /// another holder of the same chain already appended at this length.
    pub fn push(&mut self, message: Arc<Message>) {
        let index = self.len;
        let head = self
            .head
            .get_or_insert_with(|| Arc::new(Segment::new(FIRST)));
        let (mut seg, mut offset) = (&**head, index);
        while offset >= seg.slots.len() {
            offset -= seg.slots.len();
            seg = seg.next_or_new();
        }
        let text_bytes = message.text_bytes();
        match seg.slots[offset].set(message) {
            Ok(()) => {
                self.len += 1;
                self.text_bytes += text_bytes;
            }
            Err(message) => {
                let mut fresh: History = self.iter().cloned().collect();
                fresh.push(message);
                *self = fresh;
            }
        }
    }

    /// The messages in order.
    pub fn iter(&self) -> Iter<'_> {
        let mut segments = Vec::new();
        let mut covered = 0;
        let mut seg = self.head.as_deref();
        while covered < self.len
            && let Some(s) = seg
        {
            segments.push(s);
            covered += s.slots.len();
            seg = s.next.get().map(|b| &**b);
        }
        Iter {
            segments,
            front: 0,
            back: self.len,
        }
    }

    /// The last message, if any.
    pub fn last(&self) -> Option<&Arc<Message>> {
        self.get(self.len.checked_sub(1)?)
    }

    /// The message at `index`, if below the length.
    pub fn get(&self, index: usize) -> Option<&Arc<Message>> {
        if index >= self.len {
            return None;
        }
        let (mut seg, mut offset) = (self.head.as_deref()?, index);
        while offset >= seg.slots.len() {
            offset -= seg.slots.len();
            seg = seg.next.get()?;
        }
        seg.slots[offset].get()
    }

    /// The messages as a vector (shared messages, a fresh vector).
    pub fn to_vec(&self) -> Vec<Arc<Message>> {
        self.iter().cloned().collect()
    }
}

/// The messages of a `History`, in order (or reversed).
pub struct Iter<'a> {
    /// The segments covering `0..back`, in order.
    segments: Vec<&'a Segment>,
    front: usize,
    back: usize,
}

impl<'a> Iter<'a> {
    fn at(&self, index: usize) -> Option<&'a Arc<Message>> {
        // Segment k holds FIRST * (2^k - 1) .. FIRST * (2^(k+1) - 1).
        let k = (index / FIRST + 1).ilog2() as usize;
        let start = FIRST * ((1 << k) - 1);
        self.segments.get(k)?.slots.get(index - start)?.get()
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Arc<Message>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        let item = self.at(self.front);
        self.front += 1;
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.at(self.back)
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a History {
    type Item = &'a Arc<Message>;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl FromIterator<Arc<Message>> for History {
    fn from_iter<I: IntoIterator<Item = Arc<Message>>>(iter: I) -> History {
        let mut h = History::new();
        for m in iter {
            h.push(m);
        }
        h
    }
}

impl From<Vec<Arc<Message>>> for History {
    fn from(messages: Vec<Arc<Message>>) -> History {
        messages.into_iter().collect()
    }
}

impl PartialEq for History {
    fn eq(&self, other: &History) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl PartialEq<[Arc<Message>]> for History {
    fn eq(&self, other: &[Arc<Message>]) -> bool {
        self.len == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<Vec<Arc<Message>>> for History {
    fn eq(&self, other: &Vec<Arc<Message>>) -> bool {
        *self == **other
    }
}

impl fmt::Debug for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MessageId;

    fn msg(i: usize) -> Arc<Message> {
        Arc::new(Message::user_text(MessageId::mint(), format!("m{i}")))
    }

    fn texts(h: &History) -> Vec<String> {
        h.iter().map(|m| m.text()).collect()
    }

    #[test]
    fn push_iterate_and_index_across_segments() {
        let all: Vec<Arc<Message>> = (0..200).map(msg).collect();
        let mut h = History::new();
        for (i, m) in all.iter().enumerate() {
            h.push(Arc::clone(m));
            assert_eq!(h.len(), i + 1);
            assert_eq!(h.last(), Some(m));
        }
        assert_eq!(h, all);
        assert_eq!(h.to_vec(), all);
        for (i, m) in all.iter().enumerate() {
            assert_eq!(h.get(i), Some(m));
        }
        assert_eq!(h.get(200), None);
        let rev: Vec<_> = h.iter().rev().cloned().collect();
        let want: Vec<_> = all.iter().rev().cloned().collect();
        assert_eq!(rev, want);
        assert_eq!(h.iter().len(), 200);
        assert!(History::new().is_empty());
        assert_eq!(History::new().last(), None);
        assert_eq!(History::new().iter().next(), None);
    }

    /// A snapshot keeps its length while the original grows; a snapshot that pushes after the
    /// original did gets a chain of its own, and neither sees the other's message.
    #[test]
    fn snapshots_are_detached() {
        let mut live: History = (0..9).map(msg).collect();
        let snap = live.clone();
        live.push(msg(100));
        assert_eq!(snap.len(), 9);
        assert_eq!(texts(&snap).last().map(String::as_str), Some("m8"));
        let mut forked = snap.clone();
        forked.push(msg(200));
        assert_eq!(texts(&forked)[9], "m200");
        assert_eq!(texts(&live)[9], "m100");
        assert_eq!(snap.len(), 9);
        // The forked chain is its own: pushing on both goes on independently.
        live.push(msg(101));
        forked.push(msg(201));
        assert_eq!(texts(&live)[9..], ["m100", "m101"]);
        assert_eq!(texts(&forked)[9..], ["m200", "m201"]);
        assert_ne!(live, forked);
        assert_eq!(format!("{:?}", History::new()), "[]");
    }

    /// Each snapshot's text size is the sum over its own messages: kept through growth, snapshots
    /// and a fork that copies its chain, and equal to counting afresh.
    #[test]
    fn text_bytes_sums_each_snapshots_own_messages() {
        let counted = |h: &History| h.iter().map(|m| m.text_bytes()).sum::<u64>();
        let mut live: History = (0..9).map(msg).collect();
        assert_eq!(live.text_bytes(), 18);
        let snap = live.clone();
        live.push(msg(100));
        assert_eq!((snap.text_bytes(), live.text_bytes()), (18, 22));
        let mut forked = snap.clone();
        forked.push(msg(2000));
        assert_eq!(forked.text_bytes(), 23);
        for h in [&live, &snap, &forked] {
            assert_eq!(h.text_bytes(), counted(h));
        }
        let call = Message {
            id: MessageId::mint(),
            role: crate::llm::types::Role::Assistant,
            content: vec![
                crate::llm::types::ContentBlock::Reasoning { text: "ab".into() },
                crate::llm::types::ContentBlock::ToolCall {
                    id: "call_1".into(),
                    name: "read".into(),
                    arguments: "{}".into(),
                },
            ],
            source: crate::llm::types::MessageSource::model("sim", "sim-1"),
        };
        assert_eq!(call.text_bytes(), 4);
        assert_eq!(History::new().text_bytes(), 0);
    }

    /// Snapshots read from another thread while the owner appends.
    #[test]
    fn shared_across_threads() {
        let mut live = History::new();
        let mut held = Vec::new();
        for i in 0..100 {
            live.push(msg(i));
            held.push(live.clone());
        }
        let handles: Vec<_> = held
            .into_iter()
            .map(|h| {
                std::thread::spawn(move || (h.len(), h.iter().count(), h.last().map(|m| m.text())))
            })
            .collect();
        for (i, t) in handles.into_iter().enumerate() {
            let (len, count, last) = t.join().expect("no panic");
            assert_eq!((len, count), (i + 1, i + 1));
            assert_eq!(last, Some(format!("m{i}")));
        }
    }
}
