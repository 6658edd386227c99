//! Observation: what subscribers of one agent, or of the whole host, receive.
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

use dsh::SessionId;
use dsh::session::Event;
use dsh::turn::LiveEvent;
use tokio::sync::broadcast;

/// One item a subscriber receives.
#[derive(Clone, Debug)]
pub enum Observed {
    /// A durable event of `agent`'s log (already on stable storage).
    Event { agent: SessionId, event: Arc<Event> },
    /// A live notification of `agent`.
    Live { agent: SessionId, event: LiveEvent },
    /// `agent` failed and will not restart (restart intensity exceeded, or its store failed).
    Failed { agent: SessionId, reason: String },
    /// `agent` crashed and was restarted from its durable log.
    Restarted { agent: SessionId },
}

impl Observed {
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

/// A lazily created broadcast channel.
#[derive(Debug)]
pub(crate) struct Channel {
    tx: OnceLock<broadcast::Sender<Observed>>,
    capacity: usize,
}

impl Channel {
    pub(crate) fn new(capacity: usize) -> Channel {
        Channel {
            tx: OnceLock::new(),
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn subscribe(&self) -> Subscription {
        let tx = self.tx.get_or_init(|| broadcast::channel(self.capacity).0);
        Subscription { rx: tx.subscribe() }
    }

    /// Whether anyone listens (cheap; callers skip building items otherwise).
    pub(crate) fn is_observed(&self) -> bool {
        self.tx.get().is_some_and(|tx| tx.receiver_count() > 0)
    }

    pub(crate) fn publish(&self, item: Observed) {
        if let Some(tx) = self.tx.get() {
            // An error means nobody listens right now: nothing to do.
            let _ = tx.send(item);
        }
    }
}
