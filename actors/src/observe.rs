//! Observation: what subscribers of one agent, or of the whole host, receive, and `StatusReport`,
//! the snapshot `AgentHandle::status` answers.
//!
//! Durable events reach subscribers only once they are on stable storage, in seq order, so nothing an
//! observer saw can be lost by a crash. Live notifications (`agent/status`, `agent/inbox/*`,
//! `agent/error`, and the runtime's own `failed`/`restarted`) are published as they happen.
//!
//! Buffers are bounded (`Limits::subscriber_buffer_max`) and built on `tokio::sync::broadcast`: a
//! subscriber that falls behind is told how many items it missed (`Observation::Lagged`) and never
//! slows the agent. A channel is created only when someone subscribes, so an unobserved agent pays
//! nothing for it.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use dsh::SessionId;
use dsh::session::Event;
use dsh::turn::{AgentCore, LiveEvent, Status};
use tokio::sync::broadcast;

/// One item a subscriber receives.
#[derive(Clone, Debug)]
pub enum Observed {
    /// A durable event of `agent`'s log (already on stable storage).
    Event {
        /// The agent whose log holds the event.
        agent: SessionId,
        /// The event, shared by every subscriber.
        event: Arc<Event>,
        /// The event's v0 JSON, exactly as the store keeps it (encoded once, for the store): a
        /// subscriber that sends the event on (an SSE stream) need not serialise it again.
        json: Bytes,
    },
    /// A live notification of `agent`.
    Live {
        /// The agent it is about.
        agent: SessionId,
        /// `agent/status`, `agent/inbox/*` or `agent/error`; never stored.
        event: LiveEvent,
    },
    /// `agent` failed and will not restart (restart intensity exceeded, or its store failed).
    Failed {
        /// The failed agent.
        agent: SessionId,
        /// Why, in one line.
        reason: String,
    },
    /// `agent` crashed and was restarted from its durable log.
    Restarted {
        /// The restarted agent.
        agent: SessionId,
    },
}

impl Observed {
    /// The agent the item is about.
    pub fn agent(&self) -> &SessionId {
        match self {
            Observed::Event { agent, .. }
            | Observed::Live { agent, .. }
            | Observed::Failed { agent, .. }
            | Observed::Restarted { agent } => agent,
        }
    }
}

/// What `Subscription::next` yields.
#[derive(Clone, Debug)]
pub enum Observation {
    /// The next item, in publication order.
    Item(Observed),
    /// The subscriber fell behind and `n` items were dropped for it.
    Lagged(u64),
}

/// A bounded stream of observations.
#[derive(Debug)]
pub struct Subscription {
    rx: broadcast::Receiver<Observed>,
}

impl Subscription {
    /// The next observation; `None` when the publisher is gone (agent disposed, host shut down).
    pub async fn next(&mut self) -> Option<Observation> {
        match self.rx.recv().await {
            Ok(item) => Some(Observation::Item(item)),
            Err(broadcast::error::RecvError::Lagged(n)) => Some(Observation::Lagged(n)),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// The next observation if one is buffered.
    pub fn try_next(&mut self) -> Option<Observation> {
        match self.rx.try_recv() {
            Ok(item) => Some(Observation::Item(item)),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Some(Observation::Lagged(n)),
            Err(_) => None,
        }
    }
}

/// A snapshot of an agent, as `AgentHandle::status` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    /// The `agent/status` observers last saw: `Idle` or `Running`.
    pub status: Status,
    /// No activity (not running, not in maintenance) and every event durable.
    pub idle: bool,
    /// The agent hibernated: its in-memory log is dropped (its actor may have stopped too).
    pub hibernated: bool,
    /// The turn number of the last `turn/start` (the current turn while one runs).
    pub last_turn: u64,
    /// The seq the next appended event receives (the log's length).
    pub next_seq: u64,
    /// Every event below this seq is on stable storage.
    pub durable_seq: u64,
    /// Messages in the `next-turn` queue.
    pub n_pending_turn: usize,
    /// Messages in the `next-step` queue.
    pub n_pending_step: usize,
    /// Set when the agent refuses input (its store failed).
    pub failed: Option<String>,
}

impl StatusReport {
    /// The report of `core` (`failed`: why the agent refuses input, if it does).
    pub(crate) fn of(core: &AgentCore, failed: Option<String>) -> StatusReport {
        let inbox = core.inbox();
        StatusReport {
            status: core.status(),
            idle: core.is_idle() && core.durable_seq() == core.next_seq(),
            hibernated: core.is_hibernated(),
            last_turn: core.last_turn(),
            next_seq: core.next_seq(),
            durable_seq: core.durable_seq(),
            n_pending_turn: inbox.next_turn().len(),
            n_pending_step: inbox.next_step().len(),
            failed,
        }
    }
}

/// A lazily created broadcast channel.
#[derive(Debug)]
pub(crate) struct Channel {
    tx: OnceLock<broadcast::Sender<Observed>>,
    capacity: usize,
}

impl Channel {
    /// A channel whose subscribers each buffer at most `capacity` items (at least 1).
    pub(crate) fn new(capacity: usize) -> Channel {
        Channel {
            tx: OnceLock::new(),
            capacity: capacity.max(1),
        }
    }

    /// A new subscriber, which sees items published from now on.
    pub(crate) fn subscribe(&self) -> Subscription {
        let tx = self.tx.get_or_init(|| broadcast::channel(self.capacity).0);
        Subscription { rx: tx.subscribe() }
    }

    /// Whether anyone listens (cheap; callers skip building items otherwise).
    pub(crate) fn is_observed(&self) -> bool {
        self.tx.get().is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Sends `item` to every current subscriber; nothing happens when there are none.
    pub(crate) fn publish(&self, item: Observed) {
        if let Some(tx) = self.tx.get() {
            // An error means nobody listens right now: nothing to do.
            let _ = tx.send(item);
        }
    }
}
