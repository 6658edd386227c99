//! `SessionWriterActor`: the sole writer of one agent's log.
//!
//! It receives encoded events in seq order from its agent and hands them to the store, at most one
//! append in flight: events that arrive meanwhile form the next batch, so a busy agent's events are
//! batched naturally and the store's group commit shares one sync among all agents. The task that
//! runs an append reports its outcome straight to the agent — `Durable { through_seq }`, or
//! `WriterFailed` (the agent then refuses input: after a failed sync nothing later can be trusted to
//! be durable) — and only then tells the writer it may start the next batch (`Flushed`).
//!
//! A panic inside the store's `append` is caught in the append task and reported as a failed append
//! (`StoreError::Io`), so the agent fails with a clear error instead of waiting for an
//! acknowledgement that never comes.
//!
//! An append in flight holds the agent's write fence (lent by its registry slot), so a restart can
//! wait for it before reading the log back: no late write can land after the new instance loaded the
//! log. The writer knows nothing else of the slot.

use std::sync::Arc;

use dsh::SessionId;
use dsh::session::store::{EncodedEvent, SessionStore, StoreError};
use futures::FutureExt;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::task::JoinHandle;
use tracing::debug;

use crate::agent::msg::AgentMsg;
use crate::runtime::Metrics;

/// What the writer's mailbox carries.
pub(crate) enum WriterMsg {
    /// From the agent: events to write, contiguous with everything sent before.
    Append(Vec<EncodedEvent>),
    /// From the append task: the append in flight finished (the agent was already told how).
    Flushed {
        /// Whether the store took it; after a failure the writer writes nothing more.
        ok: bool,
    },
}

/// The writer; stateless, everything lives in `WriterState`.
pub(crate) struct SessionWriterActor;

/// What the agent gives its writer when it spawns it.
pub(crate) struct WriterArgs {
    /// The store the agent's log lives in.
    pub(crate) store: Arc<dyn SessionStore>,
    /// The agent, whose log this is.
    pub(crate) id: SessionId,
    /// Where append outcomes are reported.
    pub(crate) agent: ActorRef<AgentMsg>,
    /// The agent's write fence, held while an append is in flight.
    pub(crate) fence: Arc<tokio::sync::Mutex<()>>,
    /// The host's counters (durable events).
    pub(crate) metrics: Arc<Metrics>,
}

/// What changes.
pub(crate) struct WriterState {
    args: WriterArgs,
    /// Events received while an append was in flight: the next batch, in seq order.
    pending: Vec<EncodedEvent>,
    /// The append in flight; its task returns whether the store took it.
    in_flight: Option<JoinHandle<bool>>,
    /// An append failed: nothing more is written.
    failed: bool,
}

impl SessionWriterActor {
    /// Starts an append of everything pending, unless one is in flight (it starts when that one
    /// reports `Flushed`) or an earlier append failed.
    fn flush(myself: &ActorRef<WriterMsg>, state: &mut WriterState) {
        if state.in_flight.is_some() || state.pending.is_empty() || state.failed {
            return;
        }
        let batch = std::mem::take(&mut state.pending);
        let store = Arc::clone(&state.args.store);
        let id = state.args.id.clone();
        let agent = state.args.agent.clone();
        let fence = Arc::clone(&state.args.fence);
        let metrics = Arc::clone(&state.args.metrics);
        let myself = myself.clone();
        state.in_flight = Some(tokio::spawn(async move {
            // Held while the append is in flight: a restart takes it before reading the log back.
            let _fence = fence.lock_owned().await;
            let ok = append(&*store, &id, batch, &agent, &metrics).await;
            let _ = myself.cast(WriterMsg::Flushed { ok });
            ok
        }));
    }
}

/// Appends `batch` to `id`'s log and reports the outcome to `agent`: `Durable` through the batch's
/// last seq, or `WriterFailed`. Returns whether the store took it.
async fn append(
    store: &dyn SessionStore,
    id: &SessionId,
    batch: Vec<EncodedEvent>,
    agent: &ActorRef<AgentMsg>,
    metrics: &Metrics,
) -> bool {
    let through_seq = batch.last().map_or(0, |e| e.seq + 1);
    let n = batch.len() as u64;
    // A store that panics is a failed append, not a lost one: without this the task died silently,
    // `Flushed` never came, and the agent waited for `Durable` forever (every later input hung).
    let outcome = std::panic::AssertUnwindSafe(store.append(id, batch))
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            Err(StoreError::Io {
                op: "append",
                cause: format!("the store panicked: {}", panic_text(&*panic)),
            })
        });
    match outcome {
        Ok(()) => {
            metrics.events_durable(n);
            // A stopped agent no longer waits for acknowledgements: nothing to tell.
            let _ = agent.cast(AgentMsg::Durable { through_seq });
            true
        }
        Err(error) => {
            debug!(agent = %id, %error, "append failed");
            let _ = agent.cast(AgentMsg::WriterFailed { error });
            false
        }
    }
}

/// The text of a panic payload.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "no message"
    }
}

impl Actor for SessionWriterActor {
    type Msg = WriterMsg;
    type State = WriterState;
    type Arguments = WriterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<WriterMsg>,
        args: WriterArgs,
    ) -> Result<WriterState, ActorProcessingErr> {
        Ok(WriterState {
            args,
            pending: Vec::new(),
            in_flight: None,
            failed: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<WriterMsg>,
        msg: WriterMsg,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            WriterMsg::Append(events) => state.pending.extend(events),
            WriterMsg::Flushed { ok } => {
                state.in_flight = None;
                if !ok {
                    state.failed = true;
                    state.pending.clear();
                }
            }
        }
        Self::flush(&myself, state);
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<WriterMsg>,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        // Drained: finish the append in flight, then write what is left, so a graceful stop leaves
        // every event the agent produced durable.
        if let Some(h) = state.in_flight.take()
            && !h.await.unwrap_or(false)
        {
            state.failed = true;
        }
        if !state.failed && !state.pending.is_empty() {
            let batch = std::mem::take(&mut state.pending);
            let n = batch.len() as u64;
            if state.args.store.append(&state.args.id, batch).await.is_ok() {
                state.args.metrics.events_durable(n);
            }
        }
        Ok(())
    }
}
