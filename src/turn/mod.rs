//! The agent core: one agent's phase, inbox, log and turn/step machine as a pure state machine
//! (`reference/agent-loop.md` §2–§8, with the deliberate differences of SPEC §3).
//!
//! `AgentCore` never waits and never does I/O. Every input — a handle call, a hook's answer, a stream
//! chunk, a finished tool, a durability report — is a method call that appends the events it implies
//! to the in-memory log and queues `Effect`s: work for the runtime to start (run hooks, open a stream,
//! run a tool, arm a timer) and notifications to publish. The runtime (`dsh-actors`) executes the
//! effects in order and feeds the outcomes back as further calls, tagged with the effect's `ticket`;
//! an outcome whose ticket is no longer awaited (a stream or hook abandoned by a cancel) is ignored.
//! This is the raft-rs "Ready" loop: the core decides, the runtime does, and reports back.
//!
//! Durability: the core tracks how far the log is durable (`on_durable`). It dispatches a model request
//! or a tool body only after every event before it is durable (the checkpoints of SPEC §6), and every
//! input method returns the seq through which the caller's acknowledgement must wait.
//!
//! What must stay true (checked by `session::invariant` in tests): turns and steps balance on every
//! path; every `tool/call` gets exactly one `tool/result` in its step; an input is exactly one of
//! claimed into a `user/message`, discarded by a logged splice, or still pending.
//!
//! Nothing from the outside world is read here: time enters as the `now` argument of every input,
//! and the runtime lends the rest when it takes the core up (`Wiring`): which hook points have hooks
//! (a point without one is answered by the core itself, with no effect), the provider registry (a
//! route is resolved once; a missing one fails with `NO_ADAPTER` here), and the source of message ids.
//!
//! Files: `mod.rs` the phases, inputs from the handle and the turn/step skeleton; `effect.rs` what
//! the core asks of the runtime; `request.rs` a step's request attempts, stream and recovery;
//! `tools.rs` a step's tool batch; `compaction.rs` compaction's triggers and bracket (SPEC §15).

mod compaction;
mod effect;
mod request;
#[cfg(test)]
mod tests;
mod tools;

use std::mem;
use std::sync::Arc;

use serde_json::Number;

use self::compaction::Compaction;
pub use self::compaction::{CompactRefusal, CompactionStarted};
pub use self::effect::{Effect, HookCall, ResolvedProvider, ResolvedTool};
use self::request::Attempt;
use self::tools::ToolBatch;
use crate::hooks::HookPoints;
use crate::hooks::{HookError, PreStepDecision, ScheduledRetry, TurnStoppingAction};
use crate::ids::{MessageId, MessageIds, SessionId};
use crate::inbox::{AdmitError, Inbox};
use crate::limits::Limits;
use crate::llm::provider::ProviderRegistry;
use crate::llm::types::{History, LlmFailure, LlmRequest, Message, codes};
use crate::session::compaction::CompactionSettings;
use crate::session::event::{
    CancelCause, Event, EventData, InboxSpliced, InboxTarget, StepRef, TurnEnd, TurnEndReason,
    TurnStart,
};
use crate::session::log::{EventDraft, Session};
use crate::tools::ToolRegistry;

/// The per-agent settings the turn machine reads.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentConfig {
    /// The provider route of the first request (a `request` hook may re-route).
    pub provider: String,
    /// The model of the first request.
    pub model: String,
    /// Output cap per request; `None` lets the provider's default apply.
    pub max_tokens: Option<u64>,
    /// Sampling temperature; `None` lets the provider's default apply.
    pub temperature: Option<Number>,
    /// Reasoning effort (`low`, `medium`, `high`); `None` lets the provider's default apply.
    pub reasoning_effort: Option<String>,
    /// The system prompt (logged in `request/header`).
    pub system: Option<String>,
    /// Bodies running at once in a parallel tool group; 1 = serial. Invariant: >= 1.
    pub max_parallel_tool_calls: usize,
    /// The bounds the machine enforces (message sizes, inbox, tool results).
    pub limits: Limits,
    /// When and how the agent compacts its history (SPEC §15).
    pub compaction: CompactionSettings,
}

impl AgentConfig {
    /// The settings of an agent on `provider` and `model`, everything else at its default.
    pub fn new(provider: &str, model: &str) -> AgentConfig {
        AgentConfig {
            provider: provider.to_string(),
            model: model.to_string(),
            max_tokens: None,
            temperature: None,
            reasoning_effort: None,
            system: None,
            max_parallel_tool_calls: 10,
            limits: Limits::DEFAULT,
            compaction: CompactionSettings::default(),
        }
    }
}

/// The public status: `running` while an activation runs, `idle` otherwise (maintenance included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// No activation runs.
    Idle,
    /// An activation runs.
    Running,
}

/// A live (never persisted) notification for observers.
#[derive(Clone, Debug, PartialEq)]
pub enum LiveEvent {
    /// `agent/status`, only on change.
    Status(Status),
    /// `agent/inbox/inserted`
    InboxInserted(Arc<Message>),
    /// `agent/inbox/claimed`
    InboxClaimed {
        /// The claimed message.
        message: Arc<Message>,
        /// The turn that claimed it.
        turn: u64,
    },
    /// `agent/inbox/discarded`
    InboxDiscarded(Arc<Message>),
    /// `agent/error`: a turn failed (never for cancellation). `step` is the last entered step.
    Error {
        /// The failed turn.
        turn: u64,
        /// Its last entered step.
        step: u64,
        /// What went wrong.
        error: LlmFailure,
    },
}

/// Why `begin_maintenance` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent {id} already has active work")]
pub struct Busy {
    /// The busy agent.
    pub id: SessionId,
}

/// Why a log could not become an agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// An event does not replay.
    #[error("log is invalid at seq {seq}: {reason}")]
    InvalidLog {
        /// The first event that does not replay.
        seq: u64,
        /// Why.
        reason: String,
    },
    /// The inbox splices do not replay.
    #[error("inbox cannot be rebuilt: {0}")]
    Inbox(
        /// Why.
        String,
    ),
    /// The last turn is open.
    #[error("the log's last turn {turn} is still open (repair it before resuming)")]
    OpenTurn {
        /// The open turn.
        turn: u64,
    },
}

/// `Some(seq)`: acknowledge once events through `seq` are durable; `None`: nothing was written.
pub type Ack = Option<u64>;

/// The log, in memory or dropped while the agent hibernates.
#[derive(Debug)]
enum Log {
    Live(Session),
    /// The events are only in the store. `tail` holds inbox splices appended since, with seqs
    /// `next_seq - tail.len() ..`.
    Hibernated {
        next_seq: u64,
        tail: Vec<Event>,
    },
}

/// Cancellation state of one activation or maintenance task. `cause` is first-wins.
#[derive(Debug, Default)]
struct Activity {
    cause: Option<CancelCause>,
    /// A wake arrived that this activity cannot deliver: replay it at convergence.
    wake_requested: bool,
}

#[derive(Debug)]
enum Phase {
    Idle,
    Maintenance(Activity),
    Running(Box<Run>),
}

/// One running activation.
#[derive(Debug)]
struct Run {
    activity: Activity,
    /// The current turn (the last logged one before the first `turn/start`).
    turn: u64,
    /// The last entered step of the turn (0 before any).
    step: u64,
    turn_open: bool,
    step_open: bool,
    /// How the turn ends if it stops now; `None` while tools owe another request.
    turn_ends: Option<TurnEndReason>,
    /// A step of this turn hit max-tokens: the turn's reason is `max-tokens` (SPEC §3, difference 1).
    max_tokens_seen: bool,
    /// This activation already recovered from a `CONTEXT_WINDOW_EXCEEDED` by compacting (at most
    /// once per activation, §8.2).
    overflow_recovered: bool,
    /// Where the next claim reads: next-turn (first step) or next-step.
    target: InboxTarget,
    stage: Stage,
}

#[derive(Debug)]
enum Stage {
    /// Between two synchronous transitions (never observed by an input).
    Transition,
    Loading {
        ticket: u64,
    },
    PreStep {
        ticket: u64,
        proposed: u64,
    },
    Request {
        ticket: u64,
        messages: History,
    },
    Checkpoint {
        through: u64,
        provider: ResolvedProvider,
        request: Box<LlmRequest>,
    },
    Streaming(Box<Attempt>),
    Recovery {
        ticket: u64,
        failure: LlmFailure,
        provider: String,
    },
    Backoff {
        ticket: u64,
        retry: ScheduledRetry,
    },
    Tools(Box<ToolBatch>),
    /// A compaction runs inside the turn (`AgentCore::compaction`); it continues the turn when it
    /// ends.
    Compacting,
    TurnStopping {
        ticket: u64,
    },
}

/// One agent's state machine. See the module docs.
#[derive(Debug)]
pub struct AgentCore {
    id: SessionId,
    /// Shared with the host's record of the agent.
    config: Arc<AgentConfig>,
    tools: ToolRegistry,
    log: Log,
    inbox: Inbox,
    phase: Phase,
    /// The last turn number in the log (kept while hibernated).
    last_turn: u64,
    /// Events below this seq were handed to the writer.
    sent_seq: u64,
    /// Every event with seq < `durable_seq` is on stable storage.
    durable_seq: u64,
    /// `assistant/chunk` payloads below this seq may be elided from the in-memory log
    /// (`elide_durable_chunks`): the whole log is then read from the store.
    elided_through: u64,
    /// This loop instance logged a `request/header` already.
    header_logged: bool,
    next_ticket: u64,
    effects: Vec<Effect>,
    /// What the runtime lent this core (`None` until it is wired, and again once it hibernates: no
    /// hooks, no providers, no ids). Boxed: a dormant core keeps only the pointer's worth.
    wiring: Option<Box<Wiring>>,
    /// The compaction in progress, between its `compaction/start` and `compaction/end`.
    ///
    /// Invariant: `Some` only while the phase is `Running` with stage `Compacting` (automatic) or
    /// `Maintenance` (manual).
    compaction: Option<Box<Compaction>>,
    /// The read-back a manual compaction of a hibernated agent waits for (its ticket).
    manual_load: Option<u64>,
}

/// What the runtime lends the core when an actor takes it up: which hook points have hooks, the
/// provider registry, and where new message ids come from. The core consults it and never does I/O
/// with it: it reads a provider's facts and hands the provider on in `Effect::StartStream`.
#[derive(Clone)]
pub struct Wiring {
    /// Which hook points the runtime runs.
    pub hooks: HookPoints,
    /// The providers requests are routed to.
    pub providers: ProviderRegistry,
    /// The source of the ids of assistant messages and tool results.
    pub ids: MessageIds,
}

impl std::fmt::Debug for Wiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wiring")
            .field("hooks", &self.hooks)
            .field("providers", &self.providers.names().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl AgentCore {
    /// A fresh agent with an empty log.
    pub fn new(
        id: SessionId,
        config: impl Into<Arc<AgentConfig>>,
        tools: ToolRegistry,
    ) -> AgentCore {
        let config = config.into();
        AgentCore {
            log: Log::Live(Session::new(id.clone())),
            id,
            config,
            tools,
            inbox: Inbox::new(),
            phase: Phase::Idle,
            last_turn: 0,
            sent_seq: 0,
            durable_seq: 0,
            elided_through: 0,
            header_logged: false,
            next_ticket: 1,
            effects: Vec::new(),
            wiring: None,
            compaction: None,
            manual_load: None,
        }
    }

    /// An agent over a durable log read back from the store (already repaired: no open turn). The
    /// pending inbox is rebuilt and does not wake the agent. A non-empty log is marked with
    /// `session/end-seed` (a new loop instance begins), as the original does on resume.
    ///
    /// # Errors
    /// `ResumeError` when the log is invalid, its inbox splices do not replay, or a turn is open.
    pub fn resume(
        id: SessionId,
        config: impl Into<Arc<AgentConfig>>,
        tools: ToolRegistry,
        events: Vec<Event>,
        now: i64,
    ) -> Result<AgentCore, ResumeError> {
        let config = config.into();
        if !crate::session::invariant::is_balanced(&events) {
            let turn = events
                .iter()
                .rev()
                .find_map(|e| match &e.data {
                    EventData::TurnStart(t) => Some(t.turn),
                    _ => None,
                })
                .unwrap_or(0);
            return Err(ResumeError::OpenTurn { turn });
        }
        let inbox = Inbox::rebuild(&events, 0).map_err(|e| ResumeError::Inbox(e.to_string()))?;
        let ends_with_seed = matches!(events.last(), Some(e) if e.kind() == "session/end-seed");
        let non_empty = !events.is_empty();
        let session = Session::from_events(id.clone(), events).map_err(|(seq, e)| {
            ResumeError::InvalidLog {
                seq,
                reason: e.to_string(),
            }
        })?;
        let durable = session.next_seq();
        let mut core = AgentCore {
            last_turn: session.last_turn(),
            log: Log::Live(session),
            id,
            config,
            tools,
            inbox,
            phase: Phase::Idle,
            sent_seq: durable,
            durable_seq: durable,
            elided_through: 0,
            header_logged: false,
            next_ticket: 1,
            effects: Vec::new(),
            wiring: None,
            compaction: None,
            manual_load: None,
        };
        if non_empty && !ends_with_seed {
            core.append(EventDraft::log(EventData::SessionEndSeed), now);
        }
        Ok(core)
    }

    /// The agent's id.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// The agent's settings.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The shared configuration.
    pub fn config_arc(&self) -> &Arc<AgentConfig> {
        &self.config
    }

    /// The tools the agent's model may call.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The pending input.
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// `running` while an activation runs.
    pub fn status(&self) -> Status {
        match self.phase {
            Phase::Running(_) => Status::Running,
            _ => Status::Idle,
        }
    }

    /// No activity at all (not running, not in maintenance).
    pub fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Idle)
    }

    /// The log is dropped from memory (only the store holds it).
    pub fn is_hibernated(&self) -> bool {
        matches!(self.log, Log::Hibernated { .. })
    }

    /// The turn number of the last `turn/start` (or the current turn).
    pub fn last_turn(&self) -> u64 {
        match &self.phase {
            Phase::Running(run) => run.turn.max(self.last_turn),
            _ => self.last_turn,
        }
    }

    /// The last entered step of the running turn (0 when idle or before the first step).
    pub fn current_step(&self) -> u64 {
        self.running().map_or(0, |run| run.step)
    }

    /// The seq the next event will get.
    pub fn next_seq(&self) -> u64 {
        match &self.log {
            Log::Live(s) => s.next_seq(),
            Log::Hibernated { next_seq, .. } => *next_seq,
        }
    }

    /// The ticket of the tool batch in progress, if any.
    pub fn tool_batch_ticket(&self) -> Option<u64> {
        match self.running().map(|run| &run.stage) {
            Some(Stage::Tools(b)) => Some(b.ticket),
            _ => None,
        }
    }

    /// Every event with seq below this is durable.
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// Drops the payloads of the durable `assistant/chunk` events from the in-memory log while the
    /// agent is idle (every message assembled; nothing reads a chunk back), keeping them only in
    /// the store: ~200 bytes each, two thirds of a text turn's events. Call it once everything is
    /// durable; from then on `elided_through` tells that the log must be read from the store.
    pub fn elide_durable_chunks(&mut self) {
        if !self.is_idle() || self.elided_through >= self.durable_seq {
            return;
        }
        if let Log::Live(s) = &mut self.log {
            s.elide_chunks(self.elided_through, self.durable_seq);
            self.elided_through = self.durable_seq;
        }
    }

    /// In-memory `assistant/chunk` events below this seq may have lost their payloads
    /// (`elide_durable_chunks`): read those events from the store; from this seq on the in-memory
    /// log is whole. 0 when nothing was elided.
    pub fn elided_through(&self) -> u64 {
        self.elided_through
    }

    /// The in-memory log, unless hibernated. Its `assistant/chunk` events below
    /// `elided_through` may be placeholders.
    pub fn session(&self) -> Option<&Session> {
        match &self.log {
            Log::Live(s) => Some(s),
            Log::Hibernated { .. } => None,
        }
    }

    /// Events appended but not yet handed to the writer, in seq order.
    pub fn unsent(&self) -> &[Event] {
        let from = self.sent_seq;
        match &self.log {
            Log::Live(s) => &s.events()[from as usize..],
            Log::Hibernated { next_seq, tail } => {
                let tail_start = next_seq - tail.len() as u64;
                &tail[(from.max(tail_start) - tail_start) as usize..]
            }
        }
    }

    /// The events returned by `unsent` were handed to the writer.
    pub fn mark_sent(&mut self) {
        self.sent_seq = self.next_seq();
    }

    /// Lends the core what it needs from the runtime (see `Wiring`); the actor does this each time it
    /// takes the core up, before feeding it any input.
    pub fn wire(&mut self, wiring: Wiring) {
        self.wiring = Some(Box::new(wiring));
    }

    /// Takes the queued effects.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        mem::take(&mut self.effects)
    }

    /// Moves the queued effects into `into`, by swapping buffers when `into` is empty: a driver
    /// that keeps the buffer it gets back and hands it in next time reuses two buffers instead of
    /// allocating one for every call that queues effects. Effects already in `into` stay first.
    pub fn swap_effects(&mut self, into: &mut Vec<Effect>) {
        if into.is_empty() {
            mem::swap(&mut self.effects, into);
        } else {
            into.append(&mut self.effects);
        }
    }

    /// Frees the effect queue's buffer if it is empty (an idle agent need not keep the room of its
    /// last turn's busiest message: an effect is 344 bytes).
    pub fn release_effects(&mut self) {
        if self.effects.is_empty() {
            self.effects = Vec::new();
        }
    }

    // ---------------------------------------------------------------------------------------------
    // Inputs from the agent handle.

    /// `followup`: a prompt for its own turn (next-turn), waking the agent.
    ///
    /// # Errors
    /// `AdmitError` when the message is refused; nothing changed.
    pub fn followup(&mut self, msg: Message, now: i64) -> Result<Ack, AdmitError> {
        self.send(msg, InboxTarget::NextTurn, true, now)
    }

    /// `steer`: input for the nearest step boundary (next-step), waking the agent.
    ///
    /// # Errors
    /// `AdmitError` when the message is refused; nothing changed.
    pub fn steer(&mut self, msg: Message, now: i64) -> Result<Ack, AdmitError> {
        self.send(msg, InboxTarget::NextStep, true, now)
    }

    /// `inject`: input for the next boundary of whatever turn runs next (next-step), not waking.
    ///
    /// # Errors
    /// `AdmitError` when the message is refused; nothing changed.
    pub fn inject(&mut self, msg: Message, now: i64) -> Result<Ack, AdmitError> {
        self.send(msg, InboxTarget::NextStep, false, now)
    }

    fn send(
        &mut self,
        msg: Message,
        target: InboxTarget,
        wakeup: bool,
        now: i64,
    ) -> Result<Ack, AdmitError> {
        // Classified before touching the inbox: a wake that lands after the active work was aborted
        // never joins it (agent-loop.md §2.2).
        let waking_after_abort = wakeup && self.activity().is_some_and(|a| a.cause.is_some());
        let target = if waking_after_abort {
            InboxTarget::NextTurn
        } else {
            target
        };
        let splice = self
            .inbox
            .plan_append(target, Arc::new(msg), &self.config.limits)?;
        let seq = self.apply_splice(splice, now);
        if wakeup {
            self.wake(waking_after_abort, now);
        }
        Ok(Some(seq))
    }

    /// `cancel`: without `keep_inbox` durably discards all pending input (and a latched wake); aborts
    /// the active turn or maintenance task with `cause` (first cause wins).
    pub fn cancel(&mut self, cause: CancelCause, keep_inbox: bool, now: i64) -> Ack {
        let mut ack = None;
        if !keep_inbox {
            for splice in self.inbox.plan_clear() {
                ack = Some(self.apply_splice(splice, now));
            }
            if let Some(a) = self.activity_mut() {
                a.wake_requested = false;
            }
        }
        let first = match self.activity_mut() {
            Some(a) if a.cause.is_none() => {
                a.cause = Some(cause);
                true
            }
            _ => false,
        };
        if first {
            self.effects.push(Effect::CancelToken);
            if matches!(self.phase, Phase::Running(_)) {
                self.abort_now(now);
            } else if self.compaction.is_some() || self.manual_load.is_some() {
                // A manual compaction: it fails (logged) and the maintenance ends.
                self.manual_load = None;
                self.abort_compaction(now);
                self.end_maintenance(now);
            }
        }
        ack.or(self.pending_ack())
    }

    /// `remove`: durable cancellation of one pending message. Returns whether it was pending.
    pub fn remove(&mut self, id: &MessageId, now: i64) -> (bool, Ack) {
        match self.inbox.plan_remove(id) {
            Some(splice) => (true, Some(self.apply_splice(splice, now))),
            None => (false, None),
        }
    }

    /// `replace`: swaps one pending message for another in place. Returns whether it was pending.
    ///
    /// # Errors
    /// `AdmitError` when the replacement is refused; nothing changed.
    pub fn replace(
        &mut self,
        id: &MessageId,
        msg: Message,
        now: i64,
    ) -> Result<(bool, Ack), AdmitError> {
        match self
            .inbox
            .plan_replace(id, Arc::new(msg), &self.config.limits)?
        {
            Some(splice) => Ok((true, Some(self.apply_splice(splice, now)))),
            None => Ok((false, None)),
        }
    }

    /// Enters maintenance (status stays idle; waking input is deferred until it ends).
    ///
    /// # Errors
    /// `Busy` unless the agent is idle.
    pub fn begin_maintenance(&mut self) -> Result<(), Busy> {
        if !self.is_idle() {
            return Err(Busy {
                id: self.id.clone(),
            });
        }
        self.phase = Phase::Maintenance(Activity::default());
        self.effects.push(Effect::NewCancelToken);
        Ok(())
    }

    /// Leaves maintenance; a wake deferred meanwhile is replayed if input is pending.
    pub fn end_maintenance(&mut self, now: i64) {
        if let Phase::Maintenance(a) = mem::replace(&mut self.phase, Phase::Idle)
            && a.wake_requested
            && self.inbox.has_pending()
        {
            self.start_activation(now);
        }
    }

    /// Drops the in-memory log (and the wiring: the actor that wakes the agent wires it again) if the
    /// agent is idle and everything is durable. Returns whether it hibernated.
    pub fn hibernate(&mut self) -> bool {
        let next_seq = self.next_seq();
        if !self.is_idle() || self.durable_seq < next_seq || self.sent_seq < next_seq {
            return false;
        }
        // Everything is durable: an earlier hibernation's tail (inbox splices appended since) is
        // in the store too, and the next read-back finds it there.
        self.log = Log::Hibernated {
            next_seq,
            tail: Vec::new(),
        };
        self.wiring = None;
        // Nothing the turns grew stays with a dormant core: its allocations would sit among the
        // turns' freed memory and keep those pages resident.
        self.inbox.shrink_to_fit();
        self.effects = Vec::new();
        true
    }

    // ---------------------------------------------------------------------------------------------
    // Reports from the runtime.

    /// Events with seq < `through_seq` are durable.
    pub fn on_durable(&mut self, through_seq: u64, now: i64) {
        if through_seq <= self.durable_seq {
            return;
        }
        self.durable_seq = through_seq;
        if self.compaction.is_some() {
            self.dispatch_summariser_if_durable(now);
        }
        let Phase::Running(run) = &mut self.phase else {
            return;
        };
        match &mut run.stage {
            Stage::Checkpoint { through, .. } if *through < through_seq => {
                let Stage::Checkpoint {
                    provider, request, ..
                } = mem::replace(&mut run.stage, Stage::Transition)
                else {
                    unreachable!("matched above")
                };
                self.start_stream(provider.0, *request);
            }
            Stage::Tools(_) => self.on_tool_checkpoint(through_seq, now),
            _ => {}
        }
    }

    /// The log was read back after hibernation.
    pub fn on_log_loaded(&mut self, ticket: u64, loaded: Result<Vec<Event>, String>, now: i64) {
        let for_manual = self.manual_load == Some(ticket);
        if !for_manual
            && !self.awaiting(|s| matches!(s, Stage::Loading { ticket: t } if *t == ticket))
        {
            return;
        }
        self.manual_load = None;
        let Log::Hibernated { next_seq, tail } = mem::replace(
            &mut self.log,
            Log::Hibernated {
                next_seq: 0,
                tail: Vec::new(),
            },
        ) else {
            unreachable!("loading implies hibernated")
        };
        let tail_start = next_seq - tail.len() as u64;
        let rebuilt = loaded.and_then(|events| {
            let mut session = Session::from_events(
                self.id.clone(),
                events.into_iter().take(tail_start as usize).collect(),
            )
            .map_err(|(seq, e)| format!("log invalid at seq {seq}: {e}"))?;
            if session.next_seq() != tail_start {
                return Err(format!(
                    "log read back ends before seq {tail_start} (it has {} events)",
                    session.next_seq()
                ));
            }
            for e in tail {
                session
                    .push_event(e)
                    .map_err(|e| format!("tail does not replay: {e}"))?;
            }
            Ok(session)
        });
        match rebuilt {
            Ok(session) if for_manual => {
                self.log = Log::Live(session);
                self.on_manual_log_loaded(Ok(()), now);
            }
            Ok(session) => {
                self.log = Log::Live(session);
                self.begin_turn(now);
            }
            Err(reason) if for_manual => {
                self.log = Log::Hibernated {
                    next_seq,
                    tail: Vec::new(),
                };
                self.on_manual_log_loaded(Err(reason), now);
            }
            Err(reason) => {
                // Keep the counters so nothing is reused; the runtime restarts from the store.
                self.log = Log::Hibernated {
                    next_seq,
                    tail: Vec::new(),
                };
                self.effects.push(Effect::Fatal { reason });
            }
        }
    }

    /// The `pre_step` hooks decided.
    pub fn on_pre_step(
        &mut self,
        ticket: u64,
        result: Result<PreStepDecision, HookError>,
        now: i64,
    ) {
        let Some(proposed) = self.running().and_then(|run| match run.stage {
            Stage::PreStep {
                ticket: t,
                proposed,
            } if t == ticket => Some(proposed),
            _ => None,
        }) else {
            return;
        };
        let messages = match result {
            Err(e) => return self.fail_turn(e.to_failure(), now),
            Ok(PreStepDecision::Reject) => {
                return self.end_turn(TurnEndReason::Blocked, false, now);
            }
            Ok(PreStepDecision::Enter(messages)) => messages,
        };
        for m in &messages {
            if let Err(e) = Inbox::admit(m, &self.config.limits) {
                let failure = LlmFailure::new(
                    codes::UNKNOWN,
                    format!("pre_step entered an invalid message {}: {e}", m.id),
                );
                return self.fail_turn(failure, now);
            }
        }
        let run = self.run_mut();
        if messages.is_empty() {
            if let Some(reason) = run.turn_ends.clone() {
                return self.end_turn(reason, true, now);
            }
            if run.step == 0 {
                return self.end_turn(TurnEndReason::Completed, false, now);
            }
        }
        if let Some(messages) = self.compact_under_pressure(proposed, messages, now) {
            self.enter_step(proposed, messages, now);
        }
    }

    /// Opens step `proposed` with the entered batch and starts its first attempt.
    fn enter_step(&mut self, proposed: u64, messages: Vec<Arc<Message>>, now: i64) {
        let run = self.run_mut();
        run.step = proposed;
        run.step_open = true;
        let turn = run.turn;
        // A tool source that changed since the last step (an MCP server's list) is taken in here,
        // so the whole step — its header, its request, its calls — sees one tool set.
        self.tools.refresh();
        self.append(
            EventDraft::log(EventData::StepStart(StepRef {
                turn,
                step: proposed,
            })),
            now,
        );
        for m in messages {
            self.append(EventDraft::append(EventData::UserMessage(m), None), now);
        }
        self.start_attempt(now);
    }

    /// The `turn_stopping` hooks answered.
    pub fn on_turn_stopping(
        &mut self,
        ticket: u64,
        result: Result<TurnStoppingAction, HookError>,
        now: i64,
    ) {
        if !self.awaiting(|s| matches!(s, Stage::TurnStopping { ticket: t } if *t == ticket)) {
            return;
        }
        // The stage stays `TurnStopping` until the hooks' input is applied, so a cancel they asked
        // for takes the turn-stopping abort path.
        let action = match result {
            Ok(a) => a,
            Err(e) => return self.fail_turn(e.to_failure(), now),
        };
        for msg in action.steer.into_iter().chain(action.inject) {
            match self
                .inbox
                .plan_append(InboxTarget::NextStep, Arc::new(msg), &self.config.limits)
            {
                Ok(splice) => {
                    self.apply_splice(splice, now);
                }
                Err(e) => {
                    let failure = LlmFailure::new(
                        codes::UNKNOWN,
                        format!("turn_stopping steered an invalid message: {e}"),
                    );
                    return self.fail_turn(failure, now);
                }
            }
        }
        if let Some(cause) = action.cancel {
            self.cancel(cause, false, now);
            return;
        }
        self.run_mut().stage = Stage::Transition;
        if self.inbox.next_step().is_empty() {
            let reason = self
                .run_mut()
                .turn_ends
                .clone()
                .unwrap_or(TurnEndReason::Completed);
            self.end_turn(reason, true, now);
        } else {
            self.run_mut().target = InboxTarget::NextStep;
            self.propose_step(now);
        }
    }

    // ---------------------------------------------------------------------------------------------
    // The machine.

    fn ticket(&mut self) -> u64 {
        let t = self.next_ticket;
        self.next_ticket += 1;
        t
    }

    fn activity(&self) -> Option<&Activity> {
        match &self.phase {
            Phase::Idle => None,
            Phase::Maintenance(a) => Some(a),
            Phase::Running(run) => Some(&run.activity),
        }
    }

    fn activity_mut(&mut self) -> Option<&mut Activity> {
        match &mut self.phase {
            Phase::Idle => None,
            Phase::Maintenance(a) => Some(a),
            Phase::Running(run) => Some(&mut run.activity),
        }
    }

    fn running(&self) -> Option<&Run> {
        match &self.phase {
            Phase::Running(run) => Some(run),
            _ => None,
        }
    }

    fn run_mut(&mut self) -> &mut Run {
        match &mut self.phase {
            Phase::Running(run) => run,
            _ => panic!("the turn machine stepped while not running"),
        }
    }

    fn awaiting(&self, pred: impl FnOnce(&Stage) -> bool) -> bool {
        self.running().is_some_and(|run| pred(&run.stage))
    }

    fn batch_mut(&mut self, ticket: u64) -> Option<&mut ToolBatch> {
        match &mut self.phase {
            Phase::Running(run) => match &mut run.stage {
                Stage::Tools(b) if b.ticket == ticket => Some(b),
                _ => None,
            },
            _ => None,
        }
    }

    /// The hook points the runtime runs (none until wired).
    fn hook_points(&self) -> HookPoints {
        self.wiring.as_ref().map(|w| w.hooks).unwrap_or_default()
    }

    /// A fresh id for a message the machine writes.
    fn mint_id(&self) -> MessageId {
        match &self.wiring {
            Some(w) => w.ids.next_id(),
            None => panic!(
                "agent {}: the turn machine wrote a message before it was wired",
                self.id
            ),
        }
    }

    fn session_ref(&self) -> &Session {
        match &self.log {
            Log::Live(s) => s,
            Log::Hibernated { .. } => panic!("the turn machine read a hibernated log"),
        }
    }

    /// Appends an event built by the machine. A refused event is a bug in the machine (the data that
    /// enters from outside is validated before it gets here), so it panics and the supervisor restarts
    /// the agent from its durable log.
    fn append(&mut self, draft: EventDraft, now: i64) -> u64 {
        match &mut self.log {
            Log::Live(s) => {
                let seq = match s.append(draft, now) {
                    Ok(e) => e.seq,
                    Err(e) => panic!(
                        "agent {}: the turn machine built an invalid event: {e}",
                        self.id
                    ),
                };
                if let EventData::TurnStart(t) = &s.events()[seq as usize].data {
                    self.last_turn = t.turn;
                }
                seq
            }
            Log::Hibernated { next_seq, tail } => {
                assert!(
                    draft.surface_op.is_none() && draft.source_event_seqs.is_none(),
                    "only log-only events are appended while hibernated"
                );
                let seq = *next_seq;
                tail.push(Event {
                    seq,
                    time: now,
                    data: draft.data,
                    ignorable: false,
                    source_event_seqs: None,
                    surface_op: None,
                    raw_data: None,
                });
                *next_seq += 1;
                seq
            }
        }
    }

    /// Appends a planned inbox splice, applies it, and notifies. Returns its seq.
    fn apply_splice(&mut self, splice: InboxSpliced, now: i64) -> u64 {
        let inserted = splice.inserted.clone();
        let discard = splice.outcome.is_some();
        let seq = self.append(
            EventDraft::log(EventData::InboxSpliced(splice.clone())),
            now,
        );
        let removed = match self.inbox.apply(&splice) {
            Ok(r) => r,
            Err(e) => panic!("agent {}: a planned splice did not apply: {e}", self.id),
        };
        if discard {
            for m in removed {
                self.effects
                    .push(Effect::Notify(LiveEvent::InboxDiscarded(m)));
            }
        }
        for m in inserted {
            self.effects
                .push(Effect::Notify(LiveEvent::InboxInserted(m)));
        }
        seq
    }

    fn pending_ack(&self) -> Ack {
        let next = self.next_seq();
        (self.durable_seq < next).then(|| next - 1)
    }

    fn wake(&mut self, after_abort: bool, now: i64) {
        match &mut self.phase {
            Phase::Idle => self.start_activation(now),
            Phase::Maintenance(a) => {
                if a.cause != Some(CancelCause::Disposed) {
                    a.wake_requested = true;
                }
            }
            Phase::Running(run) => {
                if after_abort && run.activity.cause != Some(CancelCause::Disposed) {
                    run.activity.wake_requested = true;
                }
            }
        }
    }

    fn start_activation(&mut self, now: i64) {
        self.phase = Phase::Running(Box::new(Run {
            activity: Activity::default(),
            turn: self.last_turn,
            step: 0,
            turn_open: false,
            step_open: false,
            turn_ends: None,
            max_tokens_seen: false,
            overflow_recovered: false,
            target: InboxTarget::NextTurn,
            stage: Stage::Transition,
        }));
        self.effects.push(Effect::NewCancelToken);
        self.effects
            .push(Effect::Notify(LiveEvent::Status(Status::Running)));
        if self.is_hibernated() {
            let ticket = self.ticket();
            self.run_mut().stage = Stage::Loading { ticket };
            self.load_log(ticket, now);
        } else {
            self.begin_turn(now);
        }
    }

    /// Asks for the hibernated log back (`Effect::LoadLog`), answered by `on_log_loaded`; or, when
    /// the store holds nothing of it below the tail (an agent that hibernated before its first
    /// event: every one `dsh sim` creates, every session a server creates ahead of its first
    /// prompt), answers at once: a read would return only events the tail already holds, which
    /// `on_log_loaded` drops. No store read, no deferral until the waking splice is durable.
    fn load_log(&mut self, ticket: u64, now: i64) {
        let nothing_stored = matches!(
            &self.log,
            Log::Hibernated { next_seq, tail } if *next_seq == tail.len() as u64
        );
        if nothing_stored {
            self.on_log_loaded(ticket, Ok(Vec::new()), now);
        } else {
            self.effects.push(Effect::LoadLog { ticket });
        }
    }

    fn begin_turn(&mut self, now: i64) {
        let turn = self.last_turn + 1;
        if let Log::Live(s) = &mut self.log {
            s.reserve_for_turn();
        }
        self.append(
            EventDraft::log(EventData::TurnStart(TurnStart { turn })),
            now,
        );
        let run = self.run_mut();
        run.turn = turn;
        run.step = 0;
        run.turn_open = true;
        run.step_open = false;
        run.turn_ends = None;
        run.max_tokens_seen = false;
        run.target = InboxTarget::NextTurn;
        self.propose_step(now);
    }

    fn propose_step(&mut self, now: i64) {
        let run = self.run_mut();
        let at_turn_start = run.target == InboxTarget::NextTurn;
        let (turn, proposed) = (run.turn, run.step + 1);
        let (splices, claimed) = self.inbox.plan_claim(at_turn_start);
        for splice in splices {
            self.apply_splice(splice, now);
        }
        for message in &claimed {
            self.effects.push(Effect::Notify(LiveEvent::InboxClaimed {
                message: Arc::clone(message),
                turn,
            }));
        }
        let ticket = self.ticket();
        self.run_mut().stage = Stage::PreStep { ticket, proposed };
        if self.hook_points().pre_step {
            self.effects.push(Effect::RunHooks(HookCall::PreStep {
                ticket,
                turn,
                step: proposed,
                messages: claimed,
            }));
        } else {
            self.on_pre_step(ticket, Ok(PreStepDecision::Enter(claimed)), now);
        }
    }

    fn abort_cause(&mut self) -> CancelCause {
        self.run_mut()
            .activity
            .cause
            .clone()
            .unwrap_or(CancelCause::User)
    }

    fn finish_step(&mut self, step_end: Option<TurnEndReason>, now: i64) {
        let run = self.run_mut();
        if step_end == Some(TurnEndReason::MaxTokens) {
            run.max_tokens_seen = true;
        }
        let max_tokens_seen = run.max_tokens_seen;
        run.turn_ends = step_end.map(|r| {
            if max_tokens_seen {
                TurnEndReason::MaxTokens
            } else {
                r
            }
        });
        let (turn, step) = (run.turn, run.step);
        run.step_open = false;
        let stopping = run.turn_ends.is_some();
        self.append(
            EventDraft::log(EventData::StepEnd(StepRef { turn, step })),
            now,
        );
        if stopping && self.inbox.next_step().is_empty() {
            let ticket = self.ticket();
            self.run_mut().stage = Stage::TurnStopping { ticket };
            if self.hook_points().turn_stopping {
                self.effects.push(Effect::RunHooks(HookCall::TurnStopping {
                    ticket,
                    turn,
                    step,
                }));
            } else {
                self.on_turn_stopping(ticket, Ok(TurnStoppingAction::default()), now);
            }
            return;
        }
        self.run_mut().target = InboxTarget::NextStep;
        self.propose_step(now);
    }

    fn fail_turn(&mut self, failure: LlmFailure, now: i64) {
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        self.effects.push(Effect::Notify(LiveEvent::Error {
            turn,
            step,
            error: failure.clone(),
        }));
        self.end_turn(TurnEndReason::Error { error: failure }, false, now);
    }

    /// Closes the open step (if any) and the turn; then either starts the next turn of this
    /// activation (`may_continue` and input pending) or converges to idle.
    fn end_turn(&mut self, reason: TurnEndReason, may_continue: bool, now: i64) {
        let run = self.run_mut();
        run.stage = Stage::Transition;
        let (turn, step) = (run.turn, run.step);
        if run.step_open {
            run.step_open = false;
            self.append(
                EventDraft::log(EventData::StepEnd(StepRef { turn, step })),
                now,
            );
        }
        let run = self.run_mut();
        if run.turn_open {
            run.turn_open = false;
            self.append(
                EventDraft::log(EventData::TurnEnd(Box::new(TurnEnd {
                    turn,
                    reason: reason.clone(),
                }))),
                now,
            );
            self.effects.push(Effect::TurnEnded { turn, reason });
        }
        if may_continue && self.inbox.has_pending() {
            // A fresh controller for the next turn: an old latch is stale, the live driver claims
            // the queued work itself.
            let run = self.run_mut();
            run.activity = Activity::default();
            self.effects.push(Effect::NewCancelToken);
            self.begin_turn(now);
        } else {
            self.converge(now);
        }
    }

    fn converge(&mut self, now: i64) {
        let Phase::Running(run) = mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        self.effects
            .push(Effect::Notify(LiveEvent::Status(Status::Idle)));
        if run.activity.wake_requested && self.inbox.has_pending() {
            self.start_activation(now);
        }
    }

    /// The running activation was just aborted: take the abort path of its current stage.
    fn abort_now(&mut self, now: i64) {
        let cause = self.abort_cause();
        let reason = TurnEndReason::Aborted {
            reason: cause.clone(),
        };
        let stage = mem::replace(&mut self.run_mut().stage, Stage::Transition);
        match stage {
            Stage::Loading { .. } => self.converge(now),
            Stage::Transition
            | Stage::PreStep { .. }
            | Stage::Request { .. }
            | Stage::Checkpoint { .. }
            | Stage::Recovery { .. }
            | Stage::TurnStopping { .. } => self.end_turn(reason, false, now),
            Stage::Backoff { ticket, .. } => {
                self.effects.push(Effect::CancelTimer { ticket });
                self.end_turn(reason, false, now);
            }
            Stage::Streaming(attempt) => {
                self.abort_attempt(*attempt, now);
                self.end_turn(reason, false, now);
            }
            Stage::Tools(batch) => self.abort_tools(batch, now),
            Stage::Compacting => {
                self.abort_compaction(now);
                self.end_turn(reason, false, now);
            }
        }
    }
}
