//! `SessionWriterActor`: the sole writer of one agent's log.
//!
//! It receives encoded events in seq order from its agent and hands them to the store, at most one
//! append in flight: events that arrive meanwhile form the next batch, so a busy agent's events are
//! batched naturally and the store's group commit shares one sync among all agents. Each completed
//! append is reported to the agent as `Durable { through_seq }`; a failure as `WriterFailed` (the
//! agent then refuses input — after a failed sync nothing later can be trusted to be durable).
//!
//! An append in flight holds the agent's write fence (in its registry slot), so a restart can wait for
//! it before reading the log back: no late write can land after the new instance loaded the log.

use std::sync::Arc;

use dsh::SessionId;
use dsh::session::store::{EncodedEvent, SessionStore, StoreError};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::debug;

use crate::agent::msg::AgentMsg;
use crate::runtime::Metrics;
use crate::slot::AgentSlot;

pub(crate) enum WriterMsg {
    /// Events to write, contiguous with everything sent before.
    Append(Vec<EncodedEvent>),
    /// The in-flight append finished.
    Flushed(Result<u64, StoreError>),
}

pub(crate) struct SessionWriterActor;

pub(crate) struct WriterArgs {
    pub(crate) store: Arc<dyn SessionStore>,
    pub(crate) id: SessionId,
    pub(crate) agent: ActorRef<AgentMsg>,
    pub(crate) slot: Arc<AgentSlot>,
    pub(crate) metrics: Arc<Metrics>,
}

pub(crate) struct WriterState {
    args: WriterArgs,
    pending: Vec<EncodedEvent>,
    in_flight: Option<tokio::task::JoinHandle<()>>,
    failed: bool,
}

impl SessionWriterActor {
    fn flush(myself: &ActorRef<WriterMsg>, state: &mut WriterState) {
        if state.in_flight.is_some() || state.pending.is_empty() || state.failed {
            return;
        }
        let batch = std::mem::take(&mut state.pending);
        let through = batch.last().map_or(0, |e| e.seq + 1);
        let n = batch.len();
        let store = Arc::clone(&state.args.store);
        let id = state.args.id.clone();
        let myself = myself.clone();
        let metrics = Arc::clone(&state.args.metrics);
        let fence = Arc::clone(&state.args.slot.write_fence);
        let handle = tokio::spawn(async move {
            // Held while the append is in flight: a restart takes it before reading the log back.
            let _fence = fence.lock_owned().await;
            let result = store.append(&id, batch).await.map(|()| through);
            if result.is_ok() {
                metrics.events_durable(n as u64);
            }
            let _ = myself.cast(WriterMsg::Flushed(result));
        });
        state.in_flight = Some(handle);
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
            WriterMsg::Append(events) => {
                state.pending.extend(events);
                Self::flush(&myself, state);
            }
            WriterMsg::Flushed(result) => {
                state.in_flight = None;
                match result {
                    Ok(through_seq) => {
                        let _ = state.args.agent.cast(AgentMsg::Durable { through_seq });
                        Self::flush(&myself, state);
                    }
                    Err(error) => {
                        debug!(agent = %state.args.id, %error, "append failed");
                        state.failed = true;
                        state.pending.clear();
                        let _ = state.args.agent.cast(AgentMsg::WriterFailed { error });
                    }
                }
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<WriterMsg>,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        // Drained: finish the append in flight, then write what is left, so a graceful stop leaves
        // every event the agent produced durable.
        if let Some(h) = state.in_flight.take() {
            let _ = h.await;
        }
        if !state.failed && !state.pending.is_empty() {
            let batch = std::mem::take(&mut state.pending);
            let n = batch.len();
            if state.args.store.append(&state.args.id, batch).await.is_ok() {
                state.args.metrics.events_durable(n as u64);
            }
        }
        Ok(())
    }
}
