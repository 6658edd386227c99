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

use std::mem;
use std::sync::Arc;

use serde_json::Number;

use crate::hooks::{
    HookError, PreExecute, PreStepDecision, Recovery, ScheduledRetry, TurnStoppingAction,
};
use crate::ids::{MessageId, SessionId};
use crate::inbox::{AdmitError, Inbox};
use crate::limits::Limits;
use crate::llm::assembler::BlockAssembler;
use crate::llm::provider::ModelInfo;
use crate::llm::retry::js_number;
use crate::llm::types::{
    AdapterDefaults, ContentBlock, FinishReason, LlmCallConfig, LlmFailure, LlmRequest, Message,
    MessageSource, RequestHeader, Role, StreamChunk, codes,
};
use crate::session::event::{
    AssistantChunk, AssistantMessageEvent, CancelCause, Event, EventData, HeaderReason,
    InboxSpliced, InboxTarget, LlmRetry, LlmRetryStarted, RequestContext, RequestHeaderEvent,
    StepRef, ToolCallEvent, ToolErrorInfo, ToolResultEvent, TurnEnd, TurnEndReason, TurnStart,
};
use crate::session::log::{EventDraft, Session};
use crate::tools::schedule::{PlannedCall, SlotState, ToolSchedule};
use crate::tools::{ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};

/// The per-agent settings the turn machine reads.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The provider route of the first request (a `request` hook may re-route).
    pub provider: String,
    pub model: String,
    /// Output cap per request; `None` lets the provider's default apply.
    pub max_tokens: Option<u64>,
    pub temperature: Option<Number>,
    pub reasoning_effort: Option<String>,
    /// The system prompt (logged in `request/header`).
    pub system: Option<String>,
    /// Bodies running at once in a parallel tool group; 1 = serial. Invariant: >= 1.
    pub max_parallel_tool_calls: usize,
    pub limits: Limits,
}

impl AgentConfig {
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
        }
    }
}

/// The public status: `running` while an activation runs, `idle` otherwise (maintenance included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Idle,
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
    InboxClaimed { message: Arc<Message>, turn: u64 },
    /// `agent/inbox/discarded`
    InboxDiscarded(Arc<Message>),
    /// `agent/error`: a turn failed (never for cancellation). `step` is the last entered step.
    Error {
        turn: u64,
        step: u64,
        error: LlmFailure,
    },
}

/// What the provider registry knows about the route a request hook chose.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProviderFacts {
    pub model_info: ModelInfo,
}

/// Work for the runtime and notifications, in the order they arose.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Publish a live notification.
    Notify(LiveEvent),
    /// A new activation, turn or maintenance task begins: make a fresh cancellation token for it.
    NewCancelToken,
    /// Cancel the current token (the turn or maintenance task was aborted).
    CancelToken,
    /// Read the log back from the store (the agent was hibernated); answer `on_log_loaded`.
    LoadLog {
        ticket: u64,
    },
    /// Run the `pre_step` hooks on the claimed batch; answer `on_pre_step`.
    RunPreStep {
        ticket: u64,
        turn: u64,
        step: u64,
        messages: Vec<Arc<Message>>,
    },
    /// Run the `request` hooks on the seed configuration, then resolve the chosen provider; answer
    /// `on_request_configured`.
    RunRequestHook {
        ticket: u64,
        turn: u64,
        step: u64,
        config: LlmCallConfig,
    },
    /// Open a stream on `provider` (events before it are durable); forward chunks to `on_chunk` and
    /// the end to `on_stream_end`. A missing provider must yield a `NO_ADAPTER` error finish.
    StartStream {
        ticket: u64,
        provider: String,
        request: LlmRequest,
    },
    /// Close the stream of attempt `ticket` at once.
    CancelStream {
        ticket: u64,
    },
    /// Offer a failed attempt to the `request_error` hooks; answer `on_recovery`.
    RunRequestError {
        ticket: u64,
        turn: u64,
        step: u64,
        provider: String,
        failure: LlmFailure,
        /// `llm/retry` events already in this turn and step.
        retries: Vec<LlmRetry>,
    },
    /// Arm a timer; answer `on_timer` when it fires.
    StartTimer {
        ticket: u64,
        delay_ms: f64,
    },
    CancelTimer {
        ticket: u64,
    },
    /// Run the `pre_execute` tool hooks for one call; answer `on_pre_execute`.
    RunPreExecute {
        ticket: u64,
        idx: usize,
        invocation: ToolInvocation,
    },
    /// Run one tool body (its `tool/call` is durable); answer `on_tool_finished`.
    StartTool {
        ticket: u64,
        idx: usize,
        invocation: ToolInvocation,
    },
    /// Signal every running tool body of batch `ticket` to stop; after the grace period kill the rest
    /// and answer each with an aborted result.
    CancelTools {
        ticket: u64,
    },
    /// Run the `post_execute` tool hooks on a result about to commit; answer `on_post_execute`.
    RunPostExecute {
        ticket: u64,
        idx: usize,
        invocation: ToolInvocation,
        output: ToolOutput,
    },
    /// Run the `turn_stopping` hooks; answer `on_turn_stopping`.
    RunTurnStopping {
        ticket: u64,
        turn: u64,
        step: u64,
    },
    /// A turn ended with this reason (for reports and `dsh run` exit codes).
    TurnEnded {
        turn: u64,
        reason: TurnEndReason,
    },
    /// The agent cannot continue (its log could not be read back): stop and restart from the store.
    Fatal {
        reason: String,
    },
}

/// Why `begin_maintenance` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("agent {id} already has active work")]
pub struct Busy {
    pub id: SessionId,
}

/// Why a log could not become an agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    #[error("log is invalid at seq {seq}: {reason}")]
    InvalidLog { seq: u64, reason: String },
    #[error("inbox cannot be rebuilt: {0}")]
    Inbox(String),
    #[error("the log's last turn {turn} is still open (repair it before resuming)")]
    OpenTurn { turn: u64 },
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
        messages: Vec<Arc<Message>>,
    },
    Checkpoint {
        through: u64,
        provider: String,
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
    TurnStopping {
        ticket: u64,
    },
}

#[derive(Debug)]
struct Attempt {
    ticket: u64,
    provider: String,
    model: String,
    assembler: BlockAssembler,
    /// Seqs of this attempt's `assistant/chunk` events.
    chunk_seqs: Vec<u64>,
    /// Bytes of text, reasoning and arguments received. Invariant: at most
    /// `Limits::assistant_bytes_max` are accepted; past it the attempt fails.
    n_bytes: usize,
    finished: bool,
}

#[derive(Debug)]
struct ToolBatch {
    ticket: u64,
    schedule: ToolSchedule,
    call_seqs: Vec<Option<u64>>,
    outputs: Vec<Option<ToolOutput>>,
    /// Results that bypass `post_execute` (unknown tool, aborted before dispatch).
    final_result: Vec<bool>,
    /// The call whose `pre_execute` hooks run.
    pre_executing: Option<usize>,
    /// A prepared call waiting for its `tool/call` to be durable: (idx, seq).
    checkpoint: Option<(usize, u64)>,
    /// The call whose `post_execute` hooks run, with its un-hooked output (committed as is if the
    /// turn is cancelled meanwhile).
    post_executing: Option<(usize, ToolOutput)>,
    concluded: bool,
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
    /// This loop instance logged a `request/header` already.
    header_logged: bool,
    next_ticket: u64,
    effects: Vec<Effect>,
}

fn aborted_before_dispatch() -> ToolOutput {
    ToolOutput::error(
        "tool call aborted before dispatch",
        Some(ToolErrorInfo {
            name: "AbortError".into(),
            code: "ABORTED_BEFORE_DISPATCH".into(),
        }),
    )
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
            header_logged: false,
            next_ticket: 1,
            effects: Vec::new(),
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
            header_logged: false,
            next_ticket: 1,
            effects: Vec::new(),
        };
        if non_empty && !ends_with_seed {
            core.append(EventDraft::log(EventData::SessionEndSeed), now);
        }
        Ok(core)
    }

    pub fn id(&self) -> &SessionId {
        &self.id
    }

    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// The shared configuration.
    pub fn config_arc(&self) -> &Arc<AgentConfig> {
        &self.config
    }

    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

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

    /// The ticket of the stream in progress, if any.
    pub fn stream_ticket(&self) -> Option<u64> {
        match self.running().map(|run| &run.stage) {
            Some(Stage::Streaming(a)) if !a.finished => Some(a.ticket),
            _ => None,
        }
    }

    /// Every event with seq below this is durable.
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq
    }

    /// The in-memory log, unless hibernated.
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

    /// Takes the queued effects.
    pub fn take_effects(&mut self) -> Vec<Effect> {
        mem::take(&mut self.effects)
    }

    /// Whether effects are queued.
    pub fn has_effects(&self) -> bool {
        !self.effects.is_empty()
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

    /// Drops the in-memory log if the agent is idle and everything is durable. Returns whether it
    /// hibernated.
    pub fn hibernate(&mut self) -> bool {
        let next_seq = self.next_seq();
        if !self.is_idle() || self.durable_seq < next_seq || self.sent_seq < next_seq {
            return false;
        }
        if let Log::Live(_) = self.log {
            self.log = Log::Hibernated {
                next_seq,
                tail: Vec::new(),
            };
        }
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
                self.start_stream(provider, *request);
            }
            Stage::Tools(batch) => {
                if let Some((idx, seq)) = batch.checkpoint
                    && seq < through_seq
                {
                    batch.checkpoint = None;
                    self.dispatch_tool(idx);
                    self.pump_tools(now);
                }
            }
            _ => {}
        }
    }

    /// The log was read back after hibernation.
    pub fn on_log_loaded(&mut self, ticket: u64, loaded: Result<Vec<Event>, String>, now: i64) {
        if !self.awaiting(|s| matches!(s, Stage::Loading { ticket: t } if *t == ticket)) {
            return;
        }
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
            Ok(session) => {
                self.log = Log::Live(session);
                self.begin_turn(now);
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
        run.step = proposed;
        run.step_open = true;
        let turn = run.turn;
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

    /// The `request` hooks chose the call configuration; `facts` describe the chosen provider (`None`
    /// when no provider of that name is registered).
    pub fn on_request_configured(
        &mut self,
        ticket: u64,
        result: Result<LlmCallConfig, HookError>,
        facts: Option<ProviderFacts>,
        now: i64,
    ) {
        if !self.awaiting(|s| matches!(s, Stage::Request { ticket: t, .. } if *t == ticket)) {
            return;
        }
        let Stage::Request { messages, .. } =
            mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("checked above")
        };
        let mut config = match result {
            Ok(c) => c,
            Err(e) => return self.fail_turn(e.to_failure(), now),
        };
        if config.provider.is_empty() || config.model.is_empty() {
            let failure = LlmFailure::new(
                codes::UNKNOWN,
                format!(
                    "agent {} has no provider/model: set the agent's provider and model or supply both via a request hook",
                    self.id
                ),
            );
            return self.fail_turn(failure, now);
        }
        let model_info = facts.map(|f| f.model_info).unwrap_or_default();
        let mut defaults = AdapterDefaults::default();
        if config.max_tokens.is_none()
            && let Some(m) = model_info.default_max_tokens
        {
            config.max_tokens = Some(m);
            defaults.max_tokens = Some(true);
        }
        let tools = self.tools.schemas();
        let header = RequestHeader {
            config: config.clone(),
            adapter_defaults: Some(defaults),
            system: self.config.system.clone(),
            tools: Some(tools.clone()),
        }
        .canonical();
        let session = self.session_ref();
        let reason = if !self.header_logged {
            Some(if session.request_header().is_some() {
                HeaderReason::Resume
            } else {
                HeaderReason::Initial
            })
        } else if session.request_header() != Some(&header) {
            Some(HeaderReason::Change)
        } else {
            None
        };
        let context = RequestContext {
            provider: config.provider.clone(),
            model: config.model.clone(),
            context_window: model_info.context_window,
        };
        let context_changed = session.request_context() != Some(&context);
        if let Some(reason) = reason {
            self.header_logged = true;
            self.append(
                EventDraft::log(EventData::RequestHeader(Box::new(RequestHeaderEvent {
                    header,
                    reason,
                }))),
                now,
            );
        }
        if context_changed {
            self.append(EventDraft::log(EventData::RequestContext(context)), now);
        }
        let provider = config.provider.clone();
        let request = LlmRequest {
            config,
            system: self.config.system.clone().filter(|s| !s.is_empty()),
            tools,
            messages,
            session_id: Some(self.id.clone()),
        };
        // Checkpoint: everything before the request is durable before it is dispatched.
        let through = self.next_seq() - 1;
        if self.durable_seq > through {
            self.start_stream(provider, request);
        } else {
            self.run_mut().stage = Stage::Checkpoint {
                through,
                provider,
                request: Box::new(request),
            };
        }
    }

    /// One chunk of attempt `ticket`.
    pub fn on_chunk(&mut self, ticket: u64, chunk: StreamChunk, now: i64) {
        let Phase::Running(run) = &mut self.phase else {
            return;
        };
        let Stage::Streaming(attempt) = &mut run.stage else {
            return;
        };
        if attempt.ticket != ticket || attempt.finished {
            return;
        }
        attempt.n_bytes += match &chunk {
            StreamChunk::TextDelta { text, .. } | StreamChunk::ReasoningDelta { text, .. } => {
                text.len()
            }
            StreamChunk::ToolCallDelta {
                arguments_delta, ..
            } => arguments_delta.len(),
            _ => 0,
        };
        let bytes_max = self.config.limits.assistant_bytes_max;
        let chunk = if attempt.n_bytes > bytes_max && !chunk.is_finish() {
            // Cut the stream: the assembled message must fit in one event record.
            self.effects.push(Effect::CancelStream { ticket });
            StreamChunk::finish(FinishReason::Error {
                failure: LlmFailure::new(
                    codes::MALFORMED_RESPONSE,
                    format!("the response exceeded {bytes_max} bytes"),
                ),
            })
        } else {
            chunk
        };
        let Phase::Running(run) = &mut self.phase else {
            return;
        };
        let Stage::Streaming(attempt) = &mut run.stage else {
            return;
        };
        let is_finish = chunk.is_finish();
        attempt.assembler.push(&chunk);
        let (turn, step) = (run.turn, run.step);
        let seq = self.append(
            EventDraft::log(EventData::AssistantChunk(Box::new(AssistantChunk {
                turn,
                step,
                chunk,
            }))),
            now,
        );
        let Stage::Streaming(attempt) = &mut self.run_mut().stage else {
            unreachable!("still streaming")
        };
        attempt.chunk_seqs.push(seq);
        if is_finish {
            attempt.finished = true;
            self.complete_attempt(now);
        }
    }

    /// Attempt `ticket`'s stream ended (after its finish chunk, or without one).
    pub fn on_stream_end(&mut self, ticket: u64, now: i64) {
        if self.awaiting(|s| matches!(s, Stage::Streaming(a) if a.ticket == ticket && !a.finished))
        {
            self.complete_attempt(now);
        }
    }

    /// The `request_error` hooks decided about a failed attempt.
    pub fn on_recovery(&mut self, ticket: u64, result: Result<Recovery, HookError>, now: i64) {
        if !self.awaiting(|s| matches!(s, Stage::Recovery { ticket: t, .. } if *t == ticket)) {
            return;
        }
        let Stage::Recovery {
            failure, provider, ..
        } = mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("checked above")
        };
        match result {
            Err(e) => self.fail_turn(e.to_failure(), now),
            Ok(Recovery::Delegate) => self.fail_turn(failure, now),
            Ok(Recovery::Retry) => self.start_attempt(now),
            Ok(Recovery::Backoff(retry)) => {
                let run = self.run_mut();
                let (turn, step) = (run.turn, run.step);
                self.append(
                    EventDraft::log(EventData::LlmRetry(Box::new(LlmRetry {
                        retry_id: retry.retry_id.clone(),
                        turn,
                        step,
                        provider,
                        mode: retry.mode.clone(),
                        policy_key: retry.policy_key.clone(),
                        retry: retry.retry,
                        max_retries: retry.max_retries,
                        delay_ms: js_number(retry.delay_ms),
                        failure,
                    }))),
                    now,
                );
                let ticket = self.ticket();
                let delay_ms = retry.delay_ms;
                self.run_mut().stage = Stage::Backoff { ticket, retry };
                self.effects.push(Effect::StartTimer { ticket, delay_ms });
            }
        }
    }

    /// A timer armed by `StartTimer` fired.
    pub fn on_timer(&mut self, ticket: u64, now: i64) {
        if !self.awaiting(|s| matches!(s, Stage::Backoff { ticket: t, .. } if *t == ticket)) {
            return;
        }
        let Stage::Backoff { retry, .. } =
            mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("checked above")
        };
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        self.append(
            EventDraft::log(EventData::LlmRetryStarted(LlmRetryStarted {
                retry_id: retry.retry_id,
                turn,
                step,
                retry: retry.retry,
            })),
            now,
        );
        self.start_attempt(now);
    }

    /// The `pre_execute` hooks decided about call `idx`.
    pub fn on_pre_execute(&mut self, ticket: u64, idx: usize, decision: PreExecute, now: i64) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        if batch.pre_executing != Some(idx) {
            return;
        }
        batch.pre_executing = None;
        let aborted = batch.schedule.is_aborted();
        let call = batch.schedule.call(idx).clone();
        let call_seq = batch.call_seqs[idx].expect("a started call has a tool/call seq");
        if aborted {
            self.resolve_tool(idx, aborted_before_dispatch(), true);
            return self.pump_tools(now);
        }
        match decision {
            PreExecute::Deny { reason } => {
                self.resolve_tool(idx, ToolOutput::error(reason, None), false)
            }
            PreExecute::Allow => {
                if self.tools.get(&call.name).is_none() {
                    let out = ToolOutput::error(
                        format!("unknown tool {:?}", call.name),
                        Some(ToolErrorInfo {
                            name: "ToolNotFoundError".into(),
                            code: "UNKNOWN_TOOL".into(),
                        }),
                    );
                    self.resolve_tool(idx, out, true);
                } else if call.arguments.len() > self.config.limits.tool_arguments_bytes_max {
                    let out = ToolOutput::error(
                        format!(
                            "tool arguments are {} bytes, the limit is {}",
                            call.arguments.len(),
                            self.config.limits.tool_arguments_bytes_max
                        ),
                        None,
                    );
                    self.resolve_tool(idx, out, true);
                } else if self.durable_seq > call_seq {
                    self.dispatch_tool(idx);
                } else {
                    // Checkpoint: the tool/call is durable before the body starts.
                    if let Some(batch) = self.batch_mut(ticket) {
                        batch.checkpoint = Some((idx, call_seq));
                    }
                }
            }
        }
        self.pump_tools(now);
    }

    /// Tool call `idx`'s body finished (or was killed after the grace period).
    pub fn on_tool_finished(&mut self, ticket: u64, idx: usize, output: ToolOutput, now: i64) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        if batch.schedule.state(idx) != SlotState::Running {
            return;
        }
        let output = if batch.schedule.is_aborted() && !output.is_error {
            // A successful body that finished after the abort does not count as success.
            ToolOutput {
                additional_contexts: output.additional_contexts,
                ..ToolOutput::error(
                    "tool call aborted",
                    Some(ToolErrorInfo {
                        name: "AbortError".into(),
                        code: "ABORTED".into(),
                    }),
                )
            }
        } else {
            output
        };
        self.resolve_tool(idx, output, false);
        self.pump_tools(now);
    }

    /// The `post_execute` hooks produced the output to commit for call `idx`.
    pub fn on_post_execute(&mut self, ticket: u64, idx: usize, output: ToolOutput, now: i64) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        if !matches!(batch.post_executing, Some((i, _)) if i == idx) {
            return;
        }
        batch.post_executing = None;
        self.commit_tool(idx, output, now);
        self.pump_tools(now);
    }

    /// The tool pool itself failed (not a tool): every logged call gets a `TOOL_OUTCOME_UNKNOWN`
    /// result, every unstarted call a synthetic pair, and the turn ends `error` (SPEC §3, difference 2).
    pub fn on_tool_pool_failed(&mut self, ticket: u64, reason: String, now: i64) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        batch.schedule.abort();
        let Stage::Tools(mut batch) = mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("batch_mut found a batch")
        };
        let unknown = ToolOutput::error(
            format!("tool outcome unknown: the tool pool failed: {reason}"),
            Some(ToolErrorInfo {
                name: "ToolOutcomeUnknownError".into(),
                code: crate::session::repair::TOOL_OUTCOME_UNKNOWN.into(),
            }),
        );
        for idx in 0..batch.schedule.len() {
            let state = batch.schedule.state(idx);
            match state {
                SlotState::Committed => {}
                SlotState::Waiting => {
                    let call = batch.schedule.call(idx).clone();
                    self.write_synthetic_pair(&call, aborted_before_dispatch(), now);
                }
                _ => {
                    let call = batch.schedule.call(idx).clone();
                    let call_seq = batch.call_seqs[idx];
                    self.write_tool_result(&call, call_seq, unknown.clone(), now);
                }
            }
            batch.outputs[idx] = None;
        }
        let failure = LlmFailure::new(codes::UNKNOWN, format!("tool pool failed: {reason}"));
        self.fail_turn(failure, now);
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
            target: InboxTarget::NextTurn,
            stage: Stage::Transition,
        }));
        self.effects.push(Effect::NewCancelToken);
        self.effects
            .push(Effect::Notify(LiveEvent::Status(Status::Running)));
        if self.is_hibernated() {
            let ticket = self.ticket();
            self.run_mut().stage = Stage::Loading { ticket };
            self.effects.push(Effect::LoadLog { ticket });
        } else {
            self.begin_turn(now);
        }
    }

    fn begin_turn(&mut self, now: i64) {
        let turn = self.last_turn + 1;
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
        self.effects.push(Effect::RunPreStep {
            ticket,
            turn,
            step: proposed,
            messages: claimed,
        });
    }

    fn seed_config(&self) -> LlmCallConfig {
        let session = self.session_ref();
        let logged = session.request_header();
        if self.header_logged
            && let Some(h) = logged
        {
            // Later requests start from the header in force, minus what the provider defaulted, so a
            // route chosen by a hook persists and defaults re-materialize for the current route.
            let mut c = h.config.clone();
            if let Some(d) = &h.adapter_defaults {
                if d.reasoning_effort == Some(true) {
                    c.reasoning_effort = None;
                }
                if d.max_tokens == Some(true) {
                    c.max_tokens = None;
                }
            }
            return c;
        }
        let mut c = LlmCallConfig {
            provider: self.config.provider.clone(),
            model: self.config.model.clone(),
            reasoning_effort: self.config.reasoning_effort.clone(),
            temperature: self.config.temperature.clone(),
            max_tokens: self.config.max_tokens,
            stop: None,
        };
        if c.reasoning_effort.is_none()
            && let Some(h) = logged
            && h.config.provider == c.provider
            && h.config.model == c.model
            && h.adapter_defaults
                .as_ref()
                .is_none_or(|d| d.reasoning_effort != Some(true))
        {
            c.reasoning_effort = h.config.reasoning_effort.clone();
        }
        c
    }

    fn start_attempt(&mut self, now: i64) {
        let _ = now;
        let messages = self.session_ref().derive_messages();
        let config = self.seed_config();
        let ticket = self.ticket();
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        run.stage = Stage::Request { ticket, messages };
        self.effects.push(Effect::RunRequestHook {
            ticket,
            turn,
            step,
            config,
        });
    }

    fn start_stream(&mut self, provider: String, request: LlmRequest) {
        let ticket = self.ticket();
        self.run_mut().stage = Stage::Streaming(Box::new(Attempt {
            ticket,
            provider: provider.clone(),
            model: request.config.model.clone(),
            assembler: BlockAssembler::new(),
            chunk_seqs: Vec::new(),
            n_bytes: 0,
            finished: false,
        }));
        self.effects.push(Effect::StartStream {
            ticket,
            provider,
            request,
        });
    }

    fn step_retries(&self) -> Vec<LlmRetry> {
        let mut out = Vec::new();
        for e in self.session_ref().events().iter().rev() {
            match &e.data {
                EventData::StepStart(_) => break,
                EventData::LlmRetry(r) => out.push((**r).clone()),
                _ => {}
            }
        }
        out.reverse();
        out
    }

    fn complete_attempt(&mut self, now: i64) {
        let Stage::Streaming(attempt) = mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("completing an attempt that is not streaming")
        };
        let finish = attempt.assembler.finish();
        if let Some(failure) = finish.failure() {
            let ticket = self.ticket();
            let retries = self.step_retries();
            let run = self.run_mut();
            let (turn, step) = (run.turn, run.step);
            run.stage = Stage::Recovery {
                ticket,
                failure: failure.clone(),
                provider: attempt.provider.clone(),
            };
            self.effects.push(Effect::RunRequestError {
                ticket,
                turn,
                step,
                provider: attempt.provider,
                failure: failure.clone(),
                retries,
            });
            return;
        }
        let content = match attempt.assembler.blocks() {
            Ok(blocks) => blocks,
            Err(e) => return self.fail_turn(LlmFailure::new(codes::UNKNOWN, e.to_string()), now),
        };
        let mut source = MessageSource::model(&attempt.provider, &attempt.model);
        if let Some(state) = attempt.assembler.replay_state() {
            source = source.with("replayState", state);
        }
        let message = Arc::new(Message {
            id: MessageId::mint(),
            role: Role::Assistant,
            content,
            source,
        });
        let calls: Vec<PlannedCall> = message
            .tool_calls()
            .map(|c| PlannedCall {
                call_id: c.id.to_string(),
                name: c.name.to_string(),
                arguments: c.arguments.to_string(),
            })
            .collect();
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        self.append(
            EventDraft::append(
                EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                    turn,
                    step,
                    message,
                    usage: attempt.assembler.usage().cloned(),
                    interrupted: None,
                })),
                Some(attempt.chunk_seqs),
            ),
            now,
        );
        if finish == FinishReason::MaxTokens {
            self.finish_step(Some(TurnEndReason::MaxTokens), now);
        } else if calls.is_empty() {
            self.finish_step(Some(TurnEndReason::Completed), now);
        } else {
            self.start_tools(calls, now);
        }
    }

    fn start_tools(&mut self, calls: Vec<PlannedCall>, now: i64) {
        let ticket = self.ticket();
        let n = calls.len();
        let batch = ToolBatch {
            ticket,
            schedule: ToolSchedule::new(calls, self.config.max_parallel_tool_calls),
            call_seqs: vec![None; n],
            outputs: vec![None; n],
            final_result: vec![false; n],
            pre_executing: None,
            checkpoint: None,
            post_executing: None,
            concluded: false,
        };
        self.run_mut().stage = Stage::Tools(Box::new(batch));
        self.pump_tools(now);
    }

    fn invocation(&self, call: &PlannedCall) -> ToolInvocation {
        let run = self.running().expect("tools run inside a turn");
        ToolInvocation {
            session_id: self.id.clone(),
            turn: run.turn,
            step: run.step,
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: ToolArgs::parse(&call.arguments),
        }
    }

    fn current_batch(&mut self) -> &mut ToolBatch {
        match &mut self.run_mut().stage {
            Stage::Tools(b) => b,
            _ => panic!("no tool batch in progress"),
        }
    }

    /// Commits what can commit and starts what can start, until nothing moves; then, when the batch
    /// is settled, closes the step.
    fn pump_tools(&mut self, now: i64) {
        loop {
            let committed = self.commit_ready_tool(now);
            let started = self.start_next_tool(now);
            if !committed && !started {
                break;
            }
        }
        let batch = self.current_batch();
        let settled = batch.schedule.is_settled()
            && batch.post_executing.is_none()
            && batch.pre_executing.is_none()
            && batch.checkpoint.is_none();
        if settled {
            self.finish_tools(now);
        }
    }

    fn commit_ready_tool(&mut self, now: i64) -> bool {
        let batch = self.current_batch();
        if batch.post_executing.is_some() {
            return false;
        }
        let Some(idx) = batch.schedule.next_commit() else {
            return false;
        };
        let output = batch.outputs[idx]
            .take()
            .expect("a ready call has an output");
        if batch.final_result[idx] || batch.schedule.is_aborted() {
            self.commit_tool(idx, output, now);
        } else {
            let ticket = batch.ticket;
            batch.post_executing = Some((idx, output.clone()));
            let call = batch.schedule.call(idx).clone();
            let invocation = self.invocation(&call);
            self.effects.push(Effect::RunPostExecute {
                ticket,
                idx,
                invocation,
                output,
            });
        }
        true
    }

    fn start_next_tool(&mut self, now: i64) -> bool {
        let tools = self.tools.clone();
        let batch = self.current_batch();
        // A result still in post-execute is part of the ready prefix: the pool refills only after
        // that prefix committed (agent-loop.md 8.3, `commitReady` then `fillPool`), so a new
        // `tool/call` never overtakes a result that was ready before it.
        if batch.pre_executing.is_some()
            || batch.checkpoint.is_some()
            || batch.post_executing.is_some()
        {
            return false;
        }
        let Some(idx) = batch
            .schedule
            .next_start(|c| tools.execution_mode(&c.name, &c.arguments))
        else {
            return false;
        };
        let ticket = batch.ticket;
        let call = batch.schedule.call(idx).clone();
        let seq = self.write_tool_call(&call, now);
        let invocation = self.invocation(&call);
        let batch = self.current_batch();
        batch.call_seqs[idx] = Some(seq);
        batch.pre_executing = Some(idx);
        self.effects.push(Effect::RunPreExecute {
            ticket,
            idx,
            invocation,
        });
        true
    }

    fn dispatch_tool(&mut self, idx: usize) {
        let batch = self.current_batch();
        batch.schedule.dispatched(idx);
        let ticket = batch.ticket;
        let call = batch.schedule.call(idx).clone();
        let invocation = self.invocation(&call);
        self.effects.push(Effect::StartTool {
            ticket,
            idx,
            invocation,
        });
    }

    fn resolve_tool(&mut self, idx: usize, output: ToolOutput, final_result: bool) {
        let batch = self.current_batch();
        batch.schedule.resolved(idx);
        batch.outputs[idx] = Some(output);
        batch.final_result[idx] = final_result;
    }

    /// Truncates an oversized result with a notice the model sees.
    fn bounded(&self, mut output: ToolOutput) -> ToolOutput {
        let bytes_max = self.config.limits.tool_result_bytes_max;
        let bytes = serde_json::to_vec(&output.content).map_or(0, |v| v.len());
        if bytes <= bytes_max {
            return output;
        }
        let mut kept = String::new();
        for block in &output.content {
            if let ContentBlock::Text { text } = block {
                kept.push_str(text);
            }
        }
        let mut cut = bytes_max.saturating_sub(200).min(kept.len());
        while !kept.is_char_boundary(cut) {
            cut -= 1;
        }
        kept.truncate(cut);
        kept.push_str(&format!(
            "\n\n[tool result truncated: it was {bytes} bytes, the limit is {bytes_max}]"
        ));
        output.content = vec![ContentBlock::text(kept)];
        output
    }

    fn write_tool_result(
        &mut self,
        call: &PlannedCall,
        call_seq: Option<u64>,
        output: ToolOutput,
        now: i64,
    ) {
        let output = self.bounded(output);
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        let message = Message {
            id: MessageId::mint(),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: call.call_id.clone(),
                content: output.content,
                is_error: Some(output.is_error),
            }],
            source: MessageSource::tool(&call.call_id),
        };
        self.append(
            EventDraft::append(
                EventData::ToolResult(Box::new(ToolResultEvent {
                    turn,
                    step,
                    message: Arc::new(message),
                    error: output.error,
                    meta: output.meta,
                })),
                call_seq.map(|s| vec![s]),
            ),
            now,
        );
    }

    /// Logs the start of `call` in the current step; returns the `tool/call` seq.
    fn write_tool_call(&mut self, call: &PlannedCall, now: i64) -> u64 {
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        self.append(
            EventDraft::log(EventData::ToolCall(Box::new(ToolCallEvent {
                turn,
                step,
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }))),
            now,
        )
    }

    fn write_synthetic_pair(&mut self, call: &PlannedCall, output: ToolOutput, now: i64) {
        let seq = self.write_tool_call(call, now);
        self.write_tool_result(call, Some(seq), output, now);
    }

    fn commit_tool(&mut self, idx: usize, output: ToolOutput, now: i64) {
        let batch = self.current_batch();
        let call = batch.schedule.call(idx).clone();
        let call_seq = batch.call_seqs[idx];
        batch.schedule.committed(idx);
        batch.concluded |= output.concludes_turn;
        let contexts = output.additional_contexts.clone();
        self.write_tool_result(&call, call_seq, output, now);
        for ctx in contexts {
            match self
                .inbox
                .plan_append(InboxTarget::NextStep, Arc::new(ctx), &self.config.limits)
            {
                Ok(splice) => {
                    self.apply_splice(splice, now);
                }
                Err(e) => {
                    tracing::warn!(agent = %self.id, call = %call.call_id, error = %e, "dropped an invalid additional context");
                }
            }
        }
    }

    fn finish_tools(&mut self, now: i64) {
        let Stage::Tools(batch) = mem::replace(&mut self.run_mut().stage, Stage::Transition) else {
            unreachable!("finishing tools outside a batch")
        };
        if batch.schedule.is_aborted() {
            for idx in batch.schedule.never_started().collect::<Vec<_>>() {
                let call = batch.schedule.call(idx).clone();
                self.write_synthetic_pair(&call, aborted_before_dispatch(), now);
            }
            let cause = self.abort_cause();
            return self.end_turn(TurnEndReason::Aborted { reason: cause }, false, now);
        }
        let step_end = batch.concluded.then_some(TurnEndReason::Completed);
        self.finish_step(step_end, now);
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
            self.effects
                .push(Effect::RunTurnStopping { ticket, turn, step });
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
                if !attempt.finished {
                    self.effects.push(Effect::CancelStream {
                        ticket: attempt.ticket,
                    });
                }
                let blocks = attempt.assembler.interrupted_blocks();
                if !blocks.is_empty() {
                    let run = self.run_mut();
                    let (turn, step) = (run.turn, run.step);
                    let message = Message {
                        id: MessageId::mint(),
                        role: Role::Assistant,
                        content: blocks,
                        source: MessageSource::model(&attempt.provider, &attempt.model),
                    };
                    self.append(
                        EventDraft::append(
                            EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                                turn,
                                step,
                                message: Arc::new(message),
                                usage: attempt.assembler.usage().cloned(),
                                interrupted: Some(true),
                            })),
                            Some(attempt.chunk_seqs),
                        ),
                        now,
                    );
                }
                self.end_turn(reason, false, now);
            }
            Stage::Tools(mut batch) => {
                batch.schedule.abort();
                if let Some(idx) = batch.pre_executing.take() {
                    batch.schedule.resolved(idx);
                    batch.outputs[idx] = Some(aborted_before_dispatch());
                    batch.final_result[idx] = true;
                }
                if let Some((idx, _)) = batch.checkpoint.take() {
                    // Prepared but never dispatched.
                    batch.schedule.resolved(idx);
                    batch.outputs[idx] = Some(aborted_before_dispatch());
                    batch.final_result[idx] = true;
                }
                let post = batch.post_executing.take();
                let running = batch.schedule.n_running() > 0;
                let ticket = batch.ticket;
                self.run_mut().stage = Stage::Tools(batch);
                if let Some((idx, output)) = post {
                    self.commit_tool(idx, output, now);
                }
                if running {
                    self.effects.push(Effect::CancelTools { ticket });
                }
                self.pump_tools(now);
            }
        }
    }
}

#[cfg(test)]
#[path = "turn_tests.rs"]
mod tests;
