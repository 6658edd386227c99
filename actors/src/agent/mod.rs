//! `AgentActor`: one agent. Its mailbox is the agent's inbox of commands; its state is the pure
//! `dsh::turn::AgentCore`, which it drives.
//!
//! The handler decides and sends; it never waits for a model, a tool, a hook or a disk. Every message
//! becomes one call on the core; the core answers with effects, which the actor executes in order:
//! a hook point goes to a task running `dsh::hooks::run_*` (the core only asks for points that have
//! hooks), a stream or a tool to a child — the LLM stream actor, the tool-pool supervisor — events
//! to the session writer, and each task or child reports back with the effect's ticket. So a steer or
//! a cancel is handled the moment it arrives, whatever the model or a tool is doing. The actor builds
//! no result and decides no failure: every tool error result and attempt failure comes from `dsh`.
//!
//! The wake latch of the original is the core's deferred wake: a waking input that arrives while the
//! agent converges from an abort or runs maintenance is recorded and replayed at convergence.
//!
//! Children: the session writer (spawned on first write, stopped at hibernation), one LLM stream actor
//! per request attempt, and the tool pool (spawned for the first tool call). Their failures arrive as
//! supervision events: a stream failure is offered to `request_error`, a tool-pool failure gives every
//! logged call a `TOOL_OUTCOME_UNKNOWN` result and ends the turn `error`, a writer failure makes the
//! agent refuse input.

pub mod msg;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dsh::hooks::{
    HookCtx, Hooks, RequestErrorCtx, run_post_execute, run_pre_execute, run_pre_step, run_request,
    run_request_error, run_turn_stopping,
};
use dsh::ids::MessageIds;
use dsh::llm::types::{LlmRequest, StreamChunk};
use dsh::session::store::EncodedEvent;
use dsh::session::{Event, EventData};
use dsh::tools::ToolInvocation;
use dsh::turn::{
    Ack, AgentCore, Effect, HookCall, LiveEvent, ResolvedProvider, ResolvedTool, Wiring,
};
use futures::FutureExt;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::error::InputError;
use crate::llm_stream::{LlmStreamActor, LlmStreamArgs};
use crate::observe::{Observed, StatusReport};
use crate::runtime::Runtime;
use crate::session_writer::{SessionWriterActor, WriterArgs, WriterMsg};
use crate::slot::{AgentSlot, SlotState};
use crate::tool_pool::{PoolMsg, ToolPoolActor, ToolPoolArgs};

use self::msg::{AgentMsg, CompactReceipt, Reply};

/// Milliseconds since the Unix epoch, the `time` of appended events.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What an agent reads and never changes.
pub(crate) struct AgentActor {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) slot: Arc<AgentSlot>,
    pub(crate) hooks: Hooks,
    /// Set (before the core is handed over) when this actor passivates; see `AgentHandle::request`.
    pub(crate) passivated: Arc<std::sync::atomic::AtomicBool>,
}

pub(crate) struct AgentArgs {
    pub(crate) core: AgentCore,
}

/// An acknowledgement waiting for durability.
struct PendingAck {
    through_seq: u64,
    send: Box<dyn FnOnce(Result<(), InputError>) + Send>,
}

/// What changes.
pub(crate) struct AgentState {
    core: AgentCore,
    myself: ActorRef<AgentMsg>,
    writer: Option<ActorRef<WriterMsg>>,
    pool: Option<ActorRef<PoolMsg>>,
    /// The stream actor of the current attempt: (ticket, actor, its cancellation).
    stream: Option<(u64, ActorRef<()>, CancellationToken)>,
    /// The token of the current turn (or maintenance task).
    token: CancellationToken,
    timer: Option<(u64, tokio::task::JoinHandle<()>)>,
    /// Acks in seq order.
    acks: VecDeque<PendingAck>,
    idle_waiters: Vec<Reply<()>>,
    /// Events handed to the writer, with their encoded JSON, kept for observers until durable.
    publishing: VecDeque<(Arc<Event>, Bytes)>,
    /// Set when the store failed: the agent refuses input.
    failed: Option<String>,
    last_activity: Instant,
    hibernate_armed: bool,
    /// The core went to the registry slot; this actor only stops now.
    passivated: bool,
    /// A read-back (its ticket) that starts once every event below the seq is durable.
    deferred_load: Option<(u64, u64)>,
    /// Unsent events below this seq are all `assistant/chunk`s (so `settle` checks only the rest).
    chunks_through: u64,
    /// Hand every unsent event to the writer at the next `settle`, chunks included: the stream that
    /// sent them asked for it (`FlushChunks`) or ended.
    flush_chunks: bool,
    /// The caller of a manual compaction, answered by the core's `Effect::CompactionStarted`.
    compact_reply: Option<Reply<Result<CompactReceipt, InputError>>>,
    /// The buffer `run_effects` swaps with the core's effect queue (freed, with the core's, when
    /// the agent is idle with everything durable).
    effects: Vec<Effect>,
}

impl AgentState {
    fn id(&self) -> &dsh::SessionId {
        self.core.id()
    }
}

fn same<M>(cell: &ActorCell, actor: Option<&ActorRef<M>>) -> bool {
    actor.is_some_and(|a| a.get_id() == cell.get_id())
}

/// Starts a child of the agent (its stream, tool pool or writer) linked to `supervisor`, without
/// suspending the handler.
///
/// ractor's `spawn_linked` runs the child's `pre_start` inline — under a select with the new cell's
/// signal port, which nothing can have signalled yet — and then spawns the child's processing loop
/// (ractor 0.16, `Actor::start`). The agent's children do nothing in `pre_start` but build their
/// state, so the future is ready at its first poll. Were it ever not (a ractor that starts actors
/// differently), the start fails with that reason instead of being awaited: the agent fails, its
/// supervisor restarts it, and every test that runs a turn shows it.
fn spawn_child<A: Actor>(
    child: A,
    args: A::Arguments,
    supervisor: ActorCell,
) -> Result<ActorRef<A::Msg>, ActorProcessingErr> {
    match Actor::spawn_linked(None, child, args, supervisor).now_or_never() {
        Some(Ok((child, _))) => Ok(child),
        Some(Err(e)) => Err(e.into()),
        None => Err("a child actor did not start at its first poll".into()),
    }
}

fn deliver<T>(reply: Reply<T>, value: T) {
    // A closed reply channel is normal: the caller stopped waiting.
    let _ = reply.send(value);
}

/// Runs a hook point's future on its own task and sends its outcome to the agent, so the handler
/// never waits for a hook. The future contains its own panics (`dsh::hooks::run_*`).
fn spawn_hook<T, F>(
    myself: &ActorRef<AgentMsg>,
    work: F,
    report: impl FnOnce(T) -> AgentMsg + Send + 'static,
) where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    let myself = myself.clone();
    tokio::spawn(async move {
        let outcome = work.await;
        let _ = myself.cast(report(outcome));
    });
}

impl AgentActor {
    fn hook_ctx(&self, state: &AgentState, turn: u64, step: u64) -> HookCtx {
        HookCtx {
            session_id: state.id().clone(),
            turn,
            step,
            cancel: state.token.clone(),
        }
    }

    fn publish(&self, item: Observed) {
        self.slot.observers.publish(item.clone());
        self.runtime.observers.publish(item);
    }

    fn observed(&self) -> bool {
        self.slot.observers.is_observed() || self.runtime.observers.is_observed()
    }

    /// What this actor lends the core it drives (see `dsh::turn::Wiring`).
    fn wiring(&self) -> Wiring {
        Wiring {
            hooks: self.hooks.points(),
            providers: self.runtime.providers.clone(),
            ids: MessageIds::random(),
        }
    }

    /// Reads the log back for the core's `Effect::LoadLog { ticket }`.
    fn load_log(&self, state: &AgentState, ticket: u64) {
        self.read_log_back(state, move |result| AgentMsg::LogLoaded { ticket, result });
    }

    /// Reads the agent's log back from the store on a task and reports it with `report`.
    fn read_log_back(
        &self,
        state: &AgentState,
        report: impl FnOnce(Result<Vec<Event>, String>) -> AgentMsg + Send + 'static,
    ) {
        let store = Arc::clone(&self.runtime.store);
        let id = state.id().clone();
        let myself = state.myself.clone();
        tokio::spawn(async move {
            // A task spawned from a worker takes that worker's LIFO slot and runs before the tasks
            // this handler just woke: without this yield, a caller woken by this handler (the
            // acknowledgement of a hibernated agent's first input) waited for the whole parse
            // (2.3 ms instead of 0.47 ms for ~1,000 events, `wake` bench).
            tokio::task::yield_now().await;
            // `inspect`, never `load`: a load repairs a log whose last turn is open, and this log
            // may be open right now, written by this agent (a read-back whose turn was cancelled
            // can still be running when the next turn starts, even in a later actor).
            let result = store
                .inspect(&id)
                .await
                .map(|found| found.events)
                .map_err(|e| e.to_string());
            let _ = myself.cast(report(result));
        });
    }

    /// Executes the core's effects until none are left. The core's queue and this actor's batch
    /// swap buffers, so no message allocates one.
    fn run_effects(&self, state: &mut AgentState) -> Result<(), ActorProcessingErr> {
        let mut batch = std::mem::take(&mut state.effects);
        let outcome = loop {
            state.core.swap_effects(&mut batch);
            if batch.is_empty() {
                break Ok(());
            }
            // The effects after a fatal one are dropped with the drain, as the agent stops.
            if let Some(fatal) = batch
                .drain(..)
                .find_map(|effect| self.execute(state, effect).err())
            {
                break Err(fatal);
            }
        };
        state.effects = batch;
        outcome
    }

    /// Does what one effect asks: a hook point goes to a task, a stream or a tool to a child, the
    /// rest is done on the spot.
    fn execute(&self, state: &mut AgentState, effect: Effect) -> Result<(), ActorProcessingErr> {
        match effect {
            Effect::Notify(event) => self.notify(state, event),
            Effect::NewCancelToken => state.token = CancellationToken::new(),
            Effect::CancelToken => state.token.cancel(),
            Effect::LoadLog { ticket } => self.load_log_once_durable(state, ticket),
            Effect::RunHooks(call) => self.run_hooks(state, call),
            Effect::StartStream {
                ticket,
                provider_name,
                provider,
                request,
            } => self.start_stream(state, ticket, provider_name, provider, request)?,
            Effect::CancelStream { ticket } => Self::cancel_stream(state, ticket),
            Effect::StartTimer { ticket, delay_ms } => Self::start_timer(state, ticket, delay_ms),
            Effect::CancelTimer { ticket } => Self::cancel_timer(state, ticket),
            Effect::StartTool {
                ticket,
                idx,
                invocation,
                tool,
            } => self.start_tool(state, ticket, idx, invocation, tool)?,
            Effect::CancelTools { ticket } => {
                if let Some(pool) = &state.pool {
                    let _ = pool.cast(PoolMsg::Cancel { ticket });
                }
            }
            Effect::TurnEnded { turn, reason } => {
                debug!(agent = %state.id(), turn, reason = reason.kind(), "turn ended");
                self.runtime.metrics.turn_ended();
            }
            Effect::CompactionStarted { result } => Self::compaction_started(state, result),
            Effect::CompactionEnded { failed } => {
                debug!(agent = %state.id(), failed, "compaction ended");
                self.runtime.metrics.compaction_ended(failed);
            }
            Effect::Fatal { reason } => {
                return Err(format!("agent {}: {reason}", state.id()).into());
            }
        }
        Ok(())
    }

    /// Runs the hooks of one hook point on a task (`dsh::hooks::run_*`, which contains panics); the
    /// task reports the answer with the call's ticket.
    fn run_hooks(&self, state: &AgentState, call: HookCall) {
        match call {
            HookCall::PreStep {
                ticket,
                turn,
                step,
                messages,
            } => {
                let work = run_pre_step(
                    self.hooks.pre_step.clone(),
                    self.hook_ctx(state, turn, step),
                    messages,
                );
                spawn_hook(&state.myself, work, move |result| AgentMsg::PreStepDone {
                    ticket,
                    result,
                });
            }
            HookCall::Request {
                ticket,
                turn,
                step,
                config,
            } => {
                let ctx = self.hook_ctx(state, turn, step);
                let work = run_request(self.hooks.request.clone(), ctx, config);
                spawn_hook(&state.myself, work, move |result| {
                    AgentMsg::RequestConfigured { ticket, result }
                });
            }
            HookCall::RequestError {
                ticket,
                turn,
                step,
                provider,
                retry_policy,
                failure,
                retries,
            } => {
                let ctx = RequestErrorCtx {
                    hook: self.hook_ctx(state, turn, step),
                    provider,
                    failure,
                    retry_policy,
                    retries,
                    random: rand::random::<f64>(),
                    new_retry_id: dsh::ids::mint_retry_id(),
                };
                let work = run_request_error(self.hooks.request_error.clone(), ctx);
                spawn_hook(&state.myself, work, move |result| {
                    AgentMsg::RecoveryDecided { ticket, result }
                });
            }
            HookCall::PreExecute {
                ticket,
                idx,
                invocation,
            } => {
                let ctx = self.hook_ctx(state, invocation.turn, invocation.step);
                let work = run_pre_execute(self.hooks.tool.clone(), ctx, invocation);
                spawn_hook(&state.myself, work, move |decision| {
                    AgentMsg::PreExecuteDone {
                        ticket,
                        idx,
                        decision,
                    }
                });
            }
            HookCall::PostExecute {
                ticket,
                idx,
                invocation,
                output,
            } => {
                let ctx = self.hook_ctx(state, invocation.turn, invocation.step);
                let work = run_post_execute(self.hooks.tool.clone(), ctx, invocation, output);
                spawn_hook(&state.myself, work, move |output| {
                    AgentMsg::PostExecuteDone {
                        ticket,
                        idx,
                        output,
                    }
                });
            }
            HookCall::TurnStopping { ticket, turn, step } => {
                let ctx = self.hook_ctx(state, turn, step);
                let work = run_turn_stopping(self.hooks.turn_stopping.clone(), ctx);
                spawn_hook(&state.myself, work, move |result| {
                    AgentMsg::TurnStoppingDone { ticket, result }
                });
            }
        }
    }

    /// Publishes a live notification (and logs a failed turn).
    fn notify(&self, state: &AgentState, event: LiveEvent) {
        if let LiveEvent::Error { turn, step, error } = &event {
            warn!(agent = %state.id(), turn, step, code = %error.code, "turn failed");
        }
        self.publish(Observed::Live {
            agent: state.id().clone(),
            event,
        });
    }

    /// Starts the log read-back of `ticket` once the waking input is durable: a read running beside
    /// that commit slowed its acknowledgement (SQLite, ~1,000 events: 2.4–3.0 ms; 0.84 ms with the
    /// read later).
    fn load_log_once_durable(&self, state: &mut AgentState, ticket: u64) {
        let through = state.core.next_seq();
        if state.core.durable_seq() < through {
            state.deferred_load = Some((ticket, through));
        } else {
            self.load_log(state, ticket);
        }
    }

    /// Spawns the stream actor of attempt `ticket`.
    fn start_stream(
        &self,
        state: &mut AgentState,
        ticket: u64,
        provider_name: String,
        provider: ResolvedProvider,
        request: LlmRequest,
    ) -> Result<(), ActorProcessingErr> {
        let cancel = state.token.child_token();
        let args = LlmStreamArgs {
            ticket,
            provider: provider.0,
            provider_name,
            request,
            cancel: cancel.clone(),
            agent: state.myself.clone(),
            linger: self.runtime.config.chunk_linger,
        };
        let actor = spawn_child(LlmStreamActor, args, state.myself.get_cell())?;
        state.stream = Some((ticket, actor, cancel));
        Ok(())
    }

    /// Closes the stream of attempt `ticket`, if it is the current one.
    fn cancel_stream(state: &AgentState, ticket: u64) {
        if let Some((t, _, cancel)) = &state.stream
            && *t == ticket
        {
            cancel.cancel();
        }
    }

    /// Arms the backoff timer of `ticket` (replacing any other).
    fn start_timer(state: &mut AgentState, ticket: u64, delay_ms: f64) {
        let delay = Duration::from_secs_f64((delay_ms.max(0.0)) / 1000.0);
        let myself = state.myself.clone();
        let handle = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = myself.cast(AgentMsg::TimerFired { ticket });
        });
        if let Some((_, old)) = state.timer.replace((ticket, handle)) {
            old.abort();
        }
    }

    /// Disarms the timer of `ticket`, if it is the armed one.
    fn cancel_timer(state: &mut AgentState, ticket: u64) {
        if let Some((t, handle)) = state.timer.take() {
            if t == ticket {
                handle.abort();
            } else {
                state.timer = Some((t, handle));
            }
        }
    }

    /// Hands one call's body to the tool pool (spawned on first use).
    fn start_tool(
        &self,
        state: &mut AgentState,
        ticket: u64,
        idx: usize,
        invocation: ToolInvocation,
        tool: ResolvedTool,
    ) -> Result<(), ActorProcessingErr> {
        let pool = self.pool(state)?;
        let cancel = state.token.child_token();
        let run = PoolMsg::Run {
            ticket,
            idx,
            invocation,
            tool: tool.0,
            cancel,
        };
        if pool.cast(run).is_err() {
            state.core.on_tool_pool_failed(
                ticket,
                "the tool pool is not running".to_string(),
                now_ms(),
            );
        }
        Ok(())
    }

    fn pool(&self, state: &mut AgentState) -> Result<ActorRef<PoolMsg>, ActorProcessingErr> {
        if let Some(pool) = &state.pool {
            return Ok(pool.clone());
        }
        let args = ToolPoolArgs {
            agent: state.myself.clone(),
            grace: Duration::from_millis(self.runtime.config.limits.tool_grace_ms),
            timeout: Duration::from_millis(self.runtime.config.limits.tool_timeout_ms),
        };
        let pool = spawn_child(ToolPoolActor, args, state.myself.get_cell())?;
        state.pool = Some(pool.clone());
        Ok(pool)
    }

    fn writer(&self, state: &mut AgentState) -> Result<ActorRef<WriterMsg>, ActorProcessingErr> {
        if let Some(w) = &state.writer {
            return Ok(w.clone());
        }
        let args = WriterArgs {
            store: Arc::clone(&self.runtime.store),
            id: state.id().clone(),
            agent: state.myself.clone(),
            fence: Arc::clone(&self.slot.write_fence),
            epoch: self.slot.write_fence.epoch(),
            metrics: Arc::clone(&self.runtime.metrics),
        };
        let w = spawn_child(SessionWriterActor, args, state.myself.get_cell())?;
        state.writer = Some(w.clone());
        Ok(w)
    }

    /// After every message: run effects, hand new events to the writer, answer what can be answered,
    /// and arm hibernation when idle.
    fn settle(&self, state: &mut AgentState) -> Result<(), ActorProcessingErr> {
        self.run_effects(state)?;
        let flush = std::mem::take(&mut state.flush_chunks);
        if !state.core.unsent().is_empty() && (flush || !self.hold_chunks(state)) {
            let unsent = state.core.unsent();
            let batch: Vec<EncodedEvent> = EncodedEvent::encode_all(unsent);
            if self.observed() {
                state.publishing.extend(
                    unsent
                        .iter()
                        .zip(&batch)
                        .map(|(e, encoded)| (Arc::new(e.clone()), encoded.json.clone())),
                );
            }
            state.core.mark_sent();
            let writer = self.writer(state)?;
            if writer.cast(WriterMsg::Append(batch)).is_err() {
                self.fail(state, "the session writer stopped".to_string());
            }
        }
        if state.core.is_idle() && state.core.durable_seq() == state.core.next_seq() {
            // Chunks are in the store now and no longer read in memory: drop their payloads, and
            // the effect buffers' room (until the next turn).
            state.core.elide_durable_chunks();
            state.effects = Vec::new();
            state.core.release_effects();
            for w in state.idle_waiters.drain(..) {
                deliver(w, ());
            }
        }
        // A core without its log (woken, but its waking input cancelled or removed before the log
        // was read back) arms the timer too: otherwise such an agent stayed awake for good.
        if let Some(after) = self.runtime.config.hibernate_after
            && !state.hibernate_armed
            && state.core.is_idle()
            && !state.passivated
        {
            state.hibernate_armed = true;
            let myself = state.myself.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = myself.cast(AgentMsg::HibernateCheck);
            });
        }
        Ok(())
    }

    /// Whether to keep the unsent events from the writer for now: they are all `assistant/chunk`s
    /// of a stream that is still sending (it asks for a flush after the linger, and its end or any
    /// other event sends them). No acknowledgement or checkpoint waits for a chunk, so a chunk needs
    /// no sync of its own: held, it joins the next commit that must be durable (a text turn then
    /// syncs twice, a tool turn once per checkpoint plus its end). A crash loses only held chunks,
    /// after which the log ends in an open step that repair closes like any other.
    fn hold_chunks(&self, state: &mut AgentState) -> bool {
        if state.stream.is_none() || self.runtime.config.chunk_linger.is_zero() {
            return false;
        }
        let unsent = state.core.unsent();
        let Some(first) = unsent.first() else {
            return false;
        };
        let checked = usize::try_from(state.chunks_through.saturating_sub(first.seq))
            .unwrap_or(usize::MAX)
            .min(unsent.len());
        let all_chunks = unsent[checked..]
            .iter()
            .all(|e| matches!(e.data, EventData::AssistantChunk(_)));
        if all_chunks {
            state.chunks_through = first.seq + unsent.len() as u64;
        }
        all_chunks
    }

    fn on_durable(&self, state: &mut AgentState, through_seq: u64) {
        state.core.on_durable(through_seq, now_ms());
        while state
            .acks
            .front()
            .is_some_and(|a| a.through_seq < through_seq)
        {
            if let Some(ack) = state.acks.pop_front() {
                (ack.send)(Ok(()));
            }
        }
        while state
            .publishing
            .front()
            .is_some_and(|(e, _)| e.seq < through_seq)
        {
            if let Some((event, json)) = state.publishing.pop_front() {
                self.publish(Observed::Event {
                    agent: state.id().clone(),
                    event,
                    json,
                });
            }
        }
        if let Some((ticket, through)) = state.deferred_load
            && state.core.durable_seq() >= through
        {
            state.deferred_load = None;
            self.load_log(state, ticket);
        }
    }

    /// The store failed: refuse input from now on, fail every waiting acknowledgement, tell the host
    /// and observers, and stop.
    fn fail(&self, state: &mut AgentState, reason: String) {
        if state.failed.is_some() {
            return;
        }
        warn!(agent = %state.id(), %reason, "agent refuses input");
        state.failed = Some(reason.clone());
        let id = state.id().clone();
        // The slot first: a caller woken by the failed acknowledgement below must find the agent
        // failed on its next call, not a stopping actor that drops the request (`Interrupted`).
        self.slot.set(SlotState::Failed(reason.clone()));
        for ack in state.acks.drain(..) {
            (ack.send)(Err(InputError::Failed {
                id: id.clone(),
                reason: reason.clone(),
            }));
        }
        self.publish(Observed::Failed { agent: id, reason });
        state.myself.stop(Some("failed".into()));
    }

    fn ack_after<T: Send + 'static>(
        state: &mut AgentState,
        through: Option<u64>,
        reply: Reply<Result<T, InputError>>,
        value: T,
    ) {
        match through {
            Some(seq) if seq >= state.core.durable_seq() => state.acks.push_back(PendingAck {
                through_seq: seq,
                send: Box::new(move |r| deliver(reply, r.map(|()| value))),
            }),
            _ => deliver(reply, Ok(value)),
        }
    }
}

impl AgentActor {
    async fn stop_children(state: &mut AgentState) -> Result<(), ActorProcessingErr> {
        // Streams and tools stop first, then the writer is drained so every event handed to it is
        // written; nothing new arrives since this actor no longer runs.
        if let Some((_, actor, cancel)) = state.stream.take() {
            cancel.cancel();
            actor.stop(None);
        }
        if let Some(pool) = state.pool.take() {
            pool.stop(None);
        }
        if let Some((_, t)) = state.timer.take() {
            t.abort();
        }
        if let Some(w) = state.writer.take() {
            let _ = w.drain_and_wait(Some(Duration::from_secs(30))).await;
        }
        Ok(())
    }

    fn handle_msg(&self, msg: AgentMsg, state: &mut AgentState) -> Result<(), ActorProcessingErr> {
        let now = now_ms();
        if !msg.is_looking() {
            state.last_activity = Instant::now();
        }
        match msg {
            AgentMsg::Followup { msg, reply } => {
                // The answer is the ack itself: the seq of the input's splice.
                Self::command(state, reply, |core| {
                    let ack = core.followup(msg, now)?;
                    Ok((ack, ack))
                });
            }
            AgentMsg::Steer { msg, reply } => {
                // The answer is the ack itself: the seq of the input's splice.
                Self::command(state, reply, |core| {
                    let ack = core.steer(msg, now)?;
                    Ok((ack, ack))
                });
            }
            AgentMsg::Inject { msg, reply } => {
                // The answer is the ack itself: the seq of the input's splice.
                Self::command(state, reply, |core| {
                    let ack = core.inject(msg, now)?;
                    Ok((ack, ack))
                });
            }
            AgentMsg::Cancel {
                cause,
                keep_inbox,
                reply,
            } => Self::command(state, reply, |core| {
                Ok(((), core.cancel(cause, keep_inbox, now)))
            }),
            AgentMsg::Remove { id, reply } => {
                Self::command(state, reply, |core| Ok(core.remove(&id, now)));
            }
            AgentMsg::Replace { id, msg, reply } => {
                Self::command(state, reply, |core| Ok(core.replace(&id, msg, now)?));
            }
            AgentMsg::WhenIdle { reply } => state.idle_waiters.push(reply),
            AgentMsg::Status { reply } => {
                deliver(reply, StatusReport::of(&state.core, state.failed.clone()));
            }
            AgentMsg::Log { reply } => self.answer_log(state, reply),
            AgentMsg::LogReadForCaller { result, reply } => {
                self.answer_log_read(state, result, reply)
            }
            AgentMsg::BeginMaintenance { reply } => self.begin_maintenance(state, reply)?,
            AgentMsg::EndMaintenance => state.core.end_maintenance(now),
            AgentMsg::Compact { reply } => Self::compact(state, reply, now),
            AgentMsg::Durable { through_seq } => self.on_durable(state, through_seq),
            AgentMsg::WriterFailed { error } => {
                self.fail(state, format!("the session store failed: {error}"));
                return Ok(());
            }
            AgentMsg::LogLoaded { ticket, result } => state.core.on_log_loaded(ticket, result, now),
            AgentMsg::PreStepDone { ticket, result } => state.core.on_pre_step(ticket, result, now),
            AgentMsg::RequestConfigured { ticket, result } => {
                state.core.on_request_configured(ticket, result, now);
            }
            AgentMsg::Chunk { ticket, chunk } => state.core.on_chunk(ticket, chunk, now),
            AgentMsg::Chunks { ticket, chunks } => {
                self.on_chunks(state, ticket, chunks, now)?;
            }
            AgentMsg::FlushChunks { ticket } => {
                // A stale attempt's request is moot: its stream is gone, and with it the holding.
                state.flush_chunks = state.stream.as_ref().is_some_and(|(t, ..)| *t == ticket);
            }
            AgentMsg::StreamEnded { ticket } => {
                state.flush_chunks = true;
                state.core.on_stream_end(ticket, now);
            }
            AgentMsg::RecoveryDecided { ticket, result } => {
                state.core.on_recovery(ticket, result, now);
            }
            AgentMsg::TimerFired { ticket } => Self::on_timer_fired(state, ticket, now),
            AgentMsg::PreExecuteDone {
                ticket,
                idx,
                decision,
            } => state.core.on_pre_execute(ticket, idx, decision, now),
            AgentMsg::ToolFinished {
                ticket,
                idx,
                output,
            } => state.core.on_tool_finished(ticket, idx, output, now),
            AgentMsg::PostExecuteDone {
                ticket,
                idx,
                output,
            } => state.core.on_post_execute(ticket, idx, output, now),
            AgentMsg::TurnStoppingDone { ticket, result } => {
                state.core.on_turn_stopping(ticket, result, now);
            }
            #[cfg(feature = "fault-injection")]
            AgentMsg::Panic => panic!("agent {}: injected fault", state.id()),
            #[cfg(feature = "fault-injection")]
            AgentMsg::PanicToolPool => {
                if let Some(pool) = &state.pool {
                    let _ = pool.cast(PoolMsg::Panic);
                }
            }
            AgentMsg::HibernateCheck => {
                if self.hibernate_if_quiet(state) {
                    return Ok(());
                }
            }
        }
        if state.failed.is_some() || state.passivated {
            return Ok(());
        }
        self.settle(state)
    }

    /// Applies one input command to the core and acknowledges it once what it wrote is durable; a
    /// refused command (or an agent that refuses input) is answered at once.
    fn command<T: Send + 'static>(
        state: &mut AgentState,
        reply: Reply<Result<T, InputError>>,
        apply: impl FnOnce(&mut AgentCore) -> Result<(T, Ack), InputError>,
    ) {
        if let Some(reason) = &state.failed {
            let refused = InputError::Failed {
                id: state.id().clone(),
                reason: reason.clone(),
            };
            return deliver(reply, Err(refused));
        }
        match apply(&mut state.core) {
            Ok((value, ack)) => Self::ack_after(state, ack, reply, value),
            Err(e) => deliver(reply, Err(e)),
        }
    }

    /// Answers a `log` call: from memory while the in-memory log is whole; otherwise (hibernated,
    /// or chunk payloads elided) read back from the store, completed by the in-memory tail that is
    /// not durable yet.
    fn answer_log(&self, state: &AgentState, reply: Reply<Result<Vec<Event>, InputError>>) {
        match state.core.session() {
            Some(session) if state.core.elided_through() == 0 => {
                deliver(reply, Ok(session.events().to_vec()));
            }
            _ => self.read_log_back(state, move |result| AgentMsg::LogReadForCaller {
                result,
                reply,
            }),
        }
    }

    /// Answers a `log` call with the log read back from the store, followed by the in-memory events
    /// after it. A read that ended before events whose payloads were since elided is read again
    /// (they are durable, so the next read has them).
    fn answer_log_read(
        &self,
        state: &AgentState,
        result: Result<Vec<Event>, String>,
        reply: Reply<Result<Vec<Event>, InputError>>,
    ) {
        let id = state.id().clone();
        let mut events = match result {
            Ok(events) => events,
            Err(reason) => return deliver(reply, Err(InputError::Store { id, reason })),
        };
        if let Some(session) = state.core.session() {
            let read = events.len() as u64;
            if read < state.core.elided_through() {
                return self.read_log_back(state, move |result| AgentMsg::LogReadForCaller {
                    result,
                    reply,
                });
            }
            let tail = usize::try_from(read).unwrap_or(usize::MAX);
            events.extend(
                session
                    .events()
                    .get(tail..)
                    .unwrap_or_default()
                    .iter()
                    .cloned(),
            );
        }
        deliver(reply, Ok(events));
    }

    /// The backoff timer of `ticket` fired.
    fn on_timer_fired(state: &mut AgentState, ticket: u64, now: i64) {
        if state.timer.as_ref().is_some_and(|(t, _)| *t == ticket) {
            state.timer = None;
        }
        state.core.on_timer(ticket, now);
    }

    /// Enters maintenance if the agent is idle and answers with the maintenance task's token.
    fn begin_maintenance(
        &self,
        state: &mut AgentState,
        reply: Reply<Result<CancellationToken, InputError>>,
    ) -> Result<(), ActorProcessingErr> {
        match state.core.begin_maintenance() {
            Ok(()) => {
                self.run_effects(state)?;
                deliver(reply, Ok(state.token.clone()));
            }
            Err(busy) => deliver(reply, Err(InputError::Busy { id: busy.id })),
        }
        Ok(())
    }

    /// Starts a manual compaction if the agent is idle; the caller is answered when the core
    /// reports the start (`compaction_started`).
    fn compact(state: &mut AgentState, reply: Reply<Result<CompactReceipt, InputError>>, now: i64) {
        if let Some(reason) = &state.failed {
            let refused = InputError::Failed {
                id: state.id().clone(),
                reason: reason.clone(),
            };
            return deliver(reply, Err(refused));
        }
        match state.core.compact_now(now) {
            Ok(()) => state.compact_reply = Some(reply),
            Err(busy) => deliver(reply, Err(InputError::Busy { id: busy.id })),
        }
    }

    /// The core reported whether the manual compaction started: acknowledge its start once durable,
    /// or say why nothing started.
    fn compaction_started(
        state: &mut AgentState,
        result: Result<dsh::turn::CompactionStarted, dsh::turn::CompactRefusal>,
    ) {
        let Some(reply) = state.compact_reply.take() else {
            return;
        };
        match result {
            Ok(started) => {
                let receipt = CompactReceipt {
                    compaction_id: started.compaction_id,
                    seq: started.seq,
                };
                Self::ack_after(state, Some(started.seq), reply, receipt);
            }
            Err(refusal) => {
                let id = state.id().clone();
                let reason = refusal.to_string();
                deliver(reply, Err(InputError::NotCompacted { id, reason }));
            }
        }
    }

    /// Feeds a burst of chunks as if each came alone: a chunk's effects run before the next chunk is
    /// fed (only the hand-off to the writer is shared, which batches what it is given anyway).
    fn on_chunks(
        &self,
        state: &mut AgentState,
        ticket: u64,
        chunks: Vec<StreamChunk>,
        now: i64,
    ) -> Result<(), ActorProcessingErr> {
        for chunk in chunks {
            state.core.on_chunk(ticket, chunk, now);
            self.run_effects(state)?;
        }
        Ok(())
    }

    /// The idle timer fired: if the agent is still quiet, passivate it — hand the compact core to the
    /// registry slot and stop. Returns whether it did.
    fn hibernate_if_quiet(&self, state: &mut AgentState) -> bool {
        state.hibernate_armed = false;
        let after = self.runtime.config.hibernate_after.unwrap_or(Duration::MAX);
        let quiet = state.acks.is_empty()
            && state.idle_waiters.is_empty()
            && state.stream.is_none()
            && state.timer.is_none()
            && state.failed.is_none();
        if !quiet || state.last_activity.elapsed() < after || !state.core.hibernate() {
            return false;
        }
        // Messages queued behind this one are dropped unhandled and resent by their handles to the
        // actor that wakes the agent.
        debug!(agent = %state.id(), "hibernated");
        let placeholder = AgentCore::new(
            state.id().clone(),
            Arc::clone(state.core.config_arc()),
            dsh::tools::ToolRegistry::new(),
        );
        let core = std::mem::replace(&mut state.core, placeholder);
        state.publishing.clear();
        // Nothing is pending anywhere (all durable, no stream, no tool): stop the children outright
        // instead of draining them in `post_stop`.
        if let Some(w) = state.writer.take() {
            w.stop(None);
        }
        if let Some(p) = state.pool.take() {
            p.stop(None);
        }
        self.passivated
            .store(true, std::sync::atomic::Ordering::SeqCst);
        // False when a restart took the agent over meanwhile: it reads the log back instead.
        let metrics = &self.runtime.metrics;
        self.slot
            .passivate(state.myself.get_id(), core, || metrics.agent_hibernated());
        state.passivated = true;
        // Every write is acknowledged: a store with leases gives the session's lease up (SPEC
        // §14); a wake that appends again takes it back first. Spawned only once the core is with
        // the slot, so it never widens the window between `passivated` and `passivate` that a
        // restart reads. The epoch is read now: the spawned release must not give up a lease that
        // a quick wake took again meanwhile (a higher epoch).
        let store = Arc::clone(&self.runtime.store);
        let id = state.id().clone();
        if let Some(epoch) = store.lease_epoch(&id) {
            tokio::spawn(async move {
                if let Err(e) = store.release_epoch(&id, epoch).await {
                    warn!(agent = %id, error = %e, "releasing the session's lease failed");
                }
            });
        }
        state.myself.stop(Some("hibernated".into()));
        true
    }

    fn on_supervision(
        &self,
        event: SupervisionEvent,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                if same(&cell, state.writer.as_ref()) {
                    state.writer = None;
                    self.fail(state, format!("the session writer failed: {err}"));
                    return Ok(());
                }
                if same(&cell, state.pool.as_ref()) {
                    state.pool = None;
                    if let Some(ticket) = state.core.tool_batch_ticket() {
                        state
                            .core
                            .on_tool_pool_failed(ticket, err.to_string(), now_ms());
                    }
                } else if let Some((ticket, actor, _)) = &state.stream
                    && actor.get_id() == cell.get_id()
                {
                    let ticket = *ticket;
                    state.stream = None;
                    state
                        .core
                        .on_stream_failed(ticket, &err.to_string(), now_ms());
                }
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => {
                if same(&cell, state.writer.as_ref()) {
                    state.writer = None;
                } else if same(&cell, state.pool.as_ref()) {
                    state.pool = None;
                } else if let Some((_, actor, _)) = &state.stream
                    && actor.get_id() == cell.get_id()
                {
                    state.stream = None;
                }
            }
            _ => {}
        }
        if state.failed.is_some() || state.passivated {
            return Ok(());
        }
        self.settle(state)
    }
}

impl Actor for AgentActor {
    type Msg = AgentMsg;
    type State = AgentState;
    type Arguments = AgentArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<AgentMsg>,
        args: AgentArgs,
    ) -> Result<AgentState, ActorProcessingErr> {
        let mut core = args.core;
        core.wire(self.wiring());
        // Published here, before any handler can run, so a quick passivation (which sets `Dormant`)
        // can never be overwritten by a late `Live` from the spawner.
        self.slot.set(SlotState::Live(
            myself.clone(),
            Arc::clone(&self.passivated),
        ));
        Ok(AgentState {
            core,
            myself,
            writer: None,
            pool: None,
            stream: None,
            token: CancellationToken::new(),
            timer: None,
            acks: VecDeque::new(),
            idle_waiters: Vec::new(),
            publishing: VecDeque::new(),
            failed: None,
            last_activity: Instant::now(),
            hibernate_armed: false,
            passivated: false,
            deferred_load: None,
            chunks_through: 0,
            flush_chunks: false,
            compact_reply: None,
            effects: Vec::new(),
        })
    }

    async fn post_start(
        &self,
        _myself: ActorRef<AgentMsg>,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        self.settle(state)
    }

    async fn handle(
        &self,
        _myself: ActorRef<AgentMsg>,
        msg: AgentMsg,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        // Synchronous: nothing here waits (children start at once, `spawn_child`), so the actor's
        // task holds no handler state machine and a message allocates none.
        let span = tracing::debug_span!(
            "agent",
            agent = %state.core.id(),
            turn = state.core.last_turn(),
            step = state.core.current_step()
        );
        span.in_scope(|| self.handle_msg(msg, state))
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<AgentMsg>,
        event: SupervisionEvent,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        let span = tracing::debug_span!("agent", agent = %state.core.id());
        span.in_scope(|| self.on_supervision(event, state))
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<AgentMsg>,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        Box::pin(Self::stop_children(state)).await
    }
}
