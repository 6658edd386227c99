//! `AppliedIds`: which message ids each session's inbox already took, and the seq of the
//! `agent/inbox/spliced` event that took each — what answers a repeated client-chosen id (200 with
//! the first answer) without reading the log again.
//!
//! A session's index is built from its log the first time a client-chosen id reaches it in this
//! process (so it also holds ids applied before a restart), and kept current by every input the
//! server acknowledges afterwards; the input lock of the session is held around both, so no input
//! slips between the read and the update. An index is only a cache of the log: the server keeps at
//! most `SESSIONS_MAX` of them and drops one when it needs room (it is rebuilt when needed), and a
//! replace, whose splice seq the server does not learn, drops the session's index.

use std::collections::HashMap;

use dashmap::DashMap;
use dsh::session::Event;
use dsh::session::event::EventData;
use dsh::{MessageId, SessionId};

/// The most sessions whose index is kept at once.
pub const SESSIONS_MAX: usize = 1024;

/// Per session: applied message id → seq of the splice that inserted it.
#[derive(Default)]
pub struct AppliedIds {
    sessions: DashMap<SessionId, HashMap<MessageId, u64>>,
}

impl AppliedIds {
    /// The seq of the splice that applied `message` to `session`, building the session's index
    /// from `log` (called only when there is none) first. The caller holds the session's input
    /// lock.
    pub async fn lookup<F, Fut, E>(
        &self,
        session: &SessionId,
        message: &MessageId,
        log: F,
    ) -> Result<Option<u64>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Vec<Event>, E>>,
    {
        if let Some(index) = self.sessions.get(session) {
            return Ok(index.get(message).copied());
        }
        let index = index_of(&log().await?);
        let seq = index.get(message).copied();
        self.make_room();
        self.sessions.insert(session.clone(), index);
        Ok(seq)
    }

    /// Records that `message` was applied to `session` by the splice at `seq`, if the session is
    /// indexed.
    pub fn applied(&self, session: &SessionId, message: &MessageId, seq: u64) {
        if let Some(mut index) = self.sessions.get_mut(session) {
            index.entry(message.clone()).or_insert(seq);
        }
    }

    /// Forgets the session's index (it is rebuilt from the log when next needed).
    pub fn forget(&self, session: &SessionId) {
        self.sessions.remove(session);
    }

    /// Sessions indexed now.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is indexed.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Drops one index when the cap is reached.
    fn make_room(&self) {
        if self.sessions.len() >= SESSIONS_MAX {
            let victim = self.sessions.iter().next().map(|e| e.key().clone());
            if let Some(victim) = victim {
                self.sessions.remove(&victim);
            }
        }
    }
}

/// Every message id a splice of `log` inserted, with the seq of the first splice that did.
fn index_of(log: &[Event]) -> HashMap<MessageId, u64> {
    let mut index = HashMap::new();
    for event in log {
        if let EventData::InboxSpliced(s) = &event.data {
            for m in &s.inserted {
                index.entry(m.id.clone()).or_insert(event.seq);
            }
        }
    }
    index
}
