//! `SessionWriterActor`: the sole writer of one agent's log.
//!
//! It receives encoded events in seq order from its agent and hands them to the store, at most one
//! append in flight: events that arrive meanwhile form the next batch, so a busy agent's events are
//! batched naturally and the store's group commit shares one sync among all agents. The append
//! reports its outcome straight to the agent — `Durable { through_seq }`, or `WriterFailed` (the
//! agent then refuses input: after a failed sync nothing later can be trusted to be durable). The
//! writer polls each append once where it starts it: a store that takes the batch at once (the
//! memory store) is done there, with no task and no further message. An append that must wait (for
//! SQLite's group commit, PostgreSQL's round trip) goes on in a task of its own, which tells the
//! writer it may start the next batch (`Flushed`) once the agent was told.
//!
//! A panic inside the store's `append` is caught around the call and reported as a failed append
//! (`StoreError::Io`), so the agent fails with a clear error instead of waiting for an
//! acknowledgement that never comes.
//!
//! Every append (the task's and the graceful stop's) runs under the agent's `WriteFence` (lent by its
//! registry slot) and only while the fence is still at the epoch the writer was created in. A restart
//! `seal`s the fence before reading the log back: it waits for the append holding it, and any append
//! of the killed instance that had not yet taken the fence (a task spawned but not yet polled, a
//! writer still draining) is then refused, so no late write lands after the new instance loaded the
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
    pub(crate) fence: Arc<WriteFence>,
    /// The fence's epoch when the writer was created: appends are refused once a restart moved it.
    pub(crate) epoch: u64,
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
        let epoch = state.args.epoch;
        let metrics = Arc::clone(&state.args.metrics);
        let mut append =
            Box::pin(
                async move { append(&fence, epoch, &*store, &id, batch, &agent, &metrics).await },
            );
        // A store that takes the batch at once (in memory, or an append refused before it waits)
        // is done here, with no task and no `Flushed`: the agent hears `Durable` straight from
        // this handler. Otherwise the append goes on in a task, which polls it again with its own
        // waker (every future re-registers at each poll, so the first poll's no-op waker loses no
        // wake-up).
        let first_poll = append
            .as_mut()
            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
        match first_poll {
            std::task::Poll::Ready(ok) => Self::flushed(state, ok),
            std::task::Poll::Pending => {
                let myself = myself.clone();
                state.in_flight = Some(tokio::spawn(async move {
                    let ok = append.await;
                    let _ = myself.cast(WriterMsg::Flushed { ok });
                    ok
                }));
            }
        }
    }

    /// The append in flight finished; after a failure nothing more is written.
    fn flushed(state: &mut WriterState, ok: bool) {
        state.in_flight = None;
        if !ok {
            state.failed = true;
            state.pending.clear();
        }
    }
}

/// An agent's write fence: a lock held by every append, around the epoch of the agent's current
/// instance. It lives in the agent's registry slot, so it outlives the actors that use it.
#[derive(Debug, Default)]
pub(crate) struct WriteFence {
    /// Held by every append and by a seal.
    held: tokio::sync::Mutex<()>,
    /// The epoch; changed only by a seal, under `held`, and readable without it (see `epoch`).
    current: std::sync::atomic::AtomicU64,
}

impl WriteFence {
    /// The current epoch (a new writer appends only while the fence is still at it). Read without
    /// waiting for an append that holds the lock, so an agent starts its writer without suspending:
    /// a writer created while a seal waits for that append gets the epoch being sealed and is
    /// refused, as a writer of the instance being replaced must be.
    pub(crate) fn epoch(&self) -> u64 {
        self.current.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits for the append holding the fence to finish, then refuses every later append of a writer
    /// created before now. A restart seals before it reads the log back.
    pub(crate) async fn seal(&self) {
        let _held = self.held.lock().await;
        self.current
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Appends `batch` to `id`'s log under `fence` and reports the outcome to `agent`: `Durable` through
/// the batch's last seq, or `WriterFailed`. Returns whether the store took it. Refused (a failed
/// append, the store untouched) when a restart sealed the fence after `epoch`.
async fn append(
    fence: &WriteFence,
    epoch: u64,
    store: &dyn SessionStore,
    id: &SessionId,
    batch: Vec<EncodedEvent>,
    agent: &ActorRef<AgentMsg>,
    metrics: &Metrics,
) -> bool {
    let through_seq = batch.last().map_or(0, |e| e.seq + 1);
    let n = batch.len() as u64;
    let held = fence.held.lock().await;
    let outcome = if fence.epoch() == epoch {
        // A store that panics is a failed append, not a lost one: without this the task died
        // silently, `Flushed` never came, and the agent waited for `Durable` forever.
        std::panic::AssertUnwindSafe(store.append(id, batch))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| {
                Err(StoreError::Io {
                    op: "append",
                    cause: format!("the store panicked: {}", panic_text(&*panic)),
                })
            })
    } else {
        Err(StoreError::Io {
            op: "append",
            cause: "the agent was restarted: its log was read back without this write".into(),
        })
    };
    drop(held);
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
            // Nothing waits unless an append is in flight: keep the batch as it is, no copy.
            WriterMsg::Append(events) if state.pending.is_empty() => state.pending = events,
            WriterMsg::Append(events) => state.pending.extend(events),
            WriterMsg::Flushed { ok } => Self::flushed(state, ok),
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
            let a = &state.args;
            // Fenced and panic-safe like the task's; the outcome goes to the stopping agent.
            append(
                &a.fence, a.epoch, &*a.store, &a.id, batch, &a.agent, &a.metrics,
            )
            .await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dsh::SessionId;
    use dsh::session::event::TurnStart;
    use dsh::session::store::memory::MemoryStore;
    use dsh::session::store::{
        EncodedEvent, Inspection, LoadedSession, SessionStore, SessionSummary, StoreError,
    };
    use dsh::session::{EventData, EventDraft, Session, SessionHeader};
    use ractor::{Actor, ActorProcessingErr, ActorRef};
    use tokio::sync::mpsc;

    use super::{SessionWriterActor, WriteFence, WriterArgs, WriterMsg};
    use crate::agent::msg::AgentMsg;
    use crate::runtime::Metrics;

    /// Stands in for the agent: forwards what the writer reports (`Durable` through seq, or the
    /// failure's text).
    struct Probe;

    impl Actor for Probe {
        type Msg = AgentMsg;
        type State = mpsc::UnboundedSender<Result<u64, String>>;
        type Arguments = mpsc::UnboundedSender<Result<u64, String>>;

        async fn pre_start(
            &self,
            _: ActorRef<AgentMsg>,
            tx: Self::Arguments,
        ) -> Result<Self::State, ActorProcessingErr> {
            Ok(tx)
        }

        async fn handle(
            &self,
            _: ActorRef<AgentMsg>,
            msg: AgentMsg,
            tx: &mut Self::State,
        ) -> Result<(), ActorProcessingErr> {
            let _ = match msg {
                AgentMsg::Durable { through_seq } => tx.send(Ok(through_seq)),
                AgentMsg::WriterFailed { error } => tx.send(Err(error.to_string())),
                _ => Ok(()),
            };
            Ok(())
        }
    }

    /// The epoch is read without waiting: while an append holds the fence and a seal waits for it,
    /// a new writer gets the epoch being sealed (so its appends are refused once the seal lands),
    /// and after the seal the next one.
    #[tokio::test]
    async fn the_epoch_is_read_at_once_and_moves_only_when_the_seal_lands() {
        let fence = Arc::new(WriteFence::default());
        let append = fence.held.lock().await;
        let sealing = tokio::spawn({
            let fence = Arc::clone(&fence);
            async move { fence.seal().await }
        });
        tokio::task::yield_now().await;
        assert!(!sealing.is_finished(), "the seal waits for the append");
        assert_eq!(fence.epoch(), 0, "read while the append holds the fence");
        drop(append);
        sealing.await.expect("sealed");
        assert_eq!(fence.epoch(), 1);
    }

    /// The killed instance's writer was still alive when the restart sealed the fence (a restart
    /// waits for the agent, not its children, and an append task may not have run yet): its append
    /// is refused and the store is untouched, while a writer of the new instance appends.
    #[tokio::test]
    async fn an_append_of_the_instance_before_a_restart_is_refused() {
        let id = SessionId::new("fenced").expect("valid id");
        let store = Arc::new(MemoryStore::new());
        store
            .create(&SessionHeader::new(id.clone(), 0))
            .await
            .expect("created");
        let mut session = Session::new(id.clone());
        let draft = EventDraft::log(EventData::TurnStart(TurnStart { turn: 1 }));
        let event = session.append(draft, 1).expect("valid").clone();
        let fence = Arc::new(WriteFence::default());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (probe, _) = Actor::spawn(None, Probe, tx).await.expect("probe");
        let writer = |epoch| WriterArgs {
            store: Arc::clone(&store) as Arc<dyn SessionStore>,
            id: id.clone(),
            agent: probe.clone(),
            fence: Arc::clone(&fence),
            epoch,
            metrics: Arc::new(Metrics::default()),
        };
        let (old, _) = Actor::spawn(None, SessionWriterActor, writer(fence.epoch()))
            .await
            .expect("old writer");
        fence.seal().await;
        let batch = vec![EncodedEvent::encode(&event)];
        old.cast(WriterMsg::Append(batch.clone())).expect("cast");
        let report = rx.recv().await.expect("a report");
        assert!(
            report.as_ref().is_err_and(|e| e.contains("restarted")),
            "{report:?}"
        );
        assert!(store.load(&id).await.expect("load").events.is_empty());

        let (new, _) = Actor::spawn(None, SessionWriterActor, writer(fence.epoch()))
            .await
            .expect("new writer");
        new.cast(WriterMsg::Append(batch)).expect("cast");
        assert_eq!(rx.recv().await, Some(Ok(1)));
        let events = store.load(&id).await.expect("load").events;
        assert_eq!(events.len(), 2, "the turn start and its repair closer");
        old.stop(None);
        new.stop(None);
        probe.stop(None);
    }

    /// Records the tokio task each append finished on, over a memory store that can be made to wait.
    struct TaskRecording {
        inner: MemoryStore,
        tasks: std::sync::Mutex<Vec<Option<tokio::task::Id>>>,
    }

    /// The writer only appends; the rest is never called (the test reads through `inner`).
    #[async_trait::async_trait]
    impl SessionStore for TaskRecording {
        fn name(&self) -> &'static str {
            "task-recording"
        }
        async fn append(
            &self,
            id: &SessionId,
            events: Vec<EncodedEvent>,
        ) -> Result<(), StoreError> {
            let appended = self.inner.append(id, events).await;
            if let Ok(mut tasks) = self.tasks.lock() {
                tasks.push(tokio::task::try_id());
            }
            appended
        }
        async fn create(&self, _: &SessionHeader) -> Result<(), StoreError> {
            unreachable!("the writer only appends")
        }
        async fn load(&self, _: &SessionId) -> Result<LoadedSession, StoreError> {
            unreachable!("the writer only appends")
        }
        async fn inspect(&self, _: &SessionId) -> Result<Inspection, StoreError> {
            unreachable!("the writer only appends")
        }
        async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
            unreachable!("the writer only appends")
        }
        async fn delete(&self, _: &SessionId) -> Result<bool, StoreError> {
            unreachable!("the writer only appends")
        }
        async fn header(&self, _: &SessionId) -> Result<Option<SessionHeader>, StoreError> {
            unreachable!("the writer only appends")
        }
    }

    /// Three appends one after another, each acknowledged before the next is sent: over a store
    /// that takes them at once they all run in the writer's own task (no task per append); over
    /// a store that makes them wait each goes on in a task of its own, and all are durable in
    /// order either way.
    #[tokio::test]
    async fn an_append_the_store_takes_at_once_runs_in_the_writer_and_one_that_waits_in_a_task() {
        for delay_ms in [0, 1] {
            let id = SessionId::new("tasks").expect("valid id");
            let store = Arc::new(TaskRecording {
                inner: MemoryStore::new(),
                tasks: std::sync::Mutex::new(Vec::new()),
            });
            store.inner.set_append_delay_ms(delay_ms);
            store
                .inner
                .create(&SessionHeader::new(id.clone(), 0))
                .await
                .expect("created");
            let (tx, mut rx) = mpsc::unbounded_channel();
            let (probe, _) = Actor::spawn(None, Probe, tx).await.expect("probe");
            let fence = Arc::new(WriteFence::default());
            let args = WriterArgs {
                store: Arc::clone(&store) as Arc<dyn SessionStore>,
                id: id.clone(),
                agent: probe.clone(),
                fence: Arc::clone(&fence),
                epoch: fence.epoch(),
                metrics: Arc::new(Metrics::default()),
            };
            let (writer, _) = Actor::spawn(None, SessionWriterActor, args)
                .await
                .expect("writer");
            let mut session = Session::new(id.clone());
            for turn in 1..=3 {
                let draft = EventDraft::log(EventData::TurnStart(TurnStart { turn }));
                let event = session.append(draft, 1).expect("valid").clone();
                writer
                    .cast(WriterMsg::Append(vec![EncodedEvent::encode(&event)]))
                    .expect("cast");
                assert_eq!(rx.recv().await, Some(Ok(turn)), "delay {delay_ms} ms");
            }
            let tasks = store.tasks.lock().expect("not poisoned").clone();
            assert_eq!(tasks.len(), 3);
            assert!(tasks.iter().all(Option::is_some), "{tasks:?}");
            let distinct: std::collections::HashSet<_> = tasks.iter().collect();
            let want = if delay_ms == 0 { 1 } else { 3 };
            assert_eq!(distinct.len(), want, "delay {delay_ms} ms: {tasks:?}");
            // Stored in order (the load then closes the open turn: a fourth event, its repair).
            let stored = store.inner.load(&id).await.expect("load").events;
            let starts: Vec<u64> = stored
                .iter()
                .filter_map(|e| match &e.data {
                    EventData::TurnStart(t) => Some(t.turn),
                    _ => None,
                })
                .collect();
            assert_eq!(starts, [1, 2, 3]);
            assert_eq!(stored.len(), 4);
            writer.stop(None);
            probe.stop(None);
        }
    }
}
