//! Hook points: async trait objects registered per host or per agent, consulted by the turn machine.
//!
//! Hooks act through the data they return, never by reaching into the agent: `pre_step` returns the
//! batch to enter (or a rejection), `request` returns a replacement call configuration (it cannot touch
//! the messages, which come from the log), `request_error` returns a recovery decision, `turn_stopping`
//! returns input to steer into next-step, and the tool hooks return an allow/deny decision and a
//! (possibly rewritten) output. The runtime runs each hook outside the agent's message handler and
//! feeds the answer back, so a slow hook never delays a steer or a cancel.
//!
//! A hook that fails (returns `Err` or panics) ends the turn with `error` (code `UNKNOWN` unless the
//! hook returned an `LlmFailure`), except tool hooks, whose failure becomes the call's error result.

use std::sync::Arc;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::ids::SessionId;
use crate::llm::retry::RetryPolicy;
use crate::llm::types::{LlmCallConfig, LlmFailure, Message};
use crate::session::event::{CancelCause, LlmRetry};
use crate::tools::{ToolInvocation, ToolOutput};

/// Where in the agent a hook is called. `cancel` is the turn's cancellation token: one per turn, the
/// same for every hook, request and tool of that turn.
#[derive(Clone, Debug)]
pub struct HookCtx {
    pub session_id: SessionId,
    pub turn: u64,
    /// The proposed step for `pre_step`, otherwise the current (last entered) step; 0 before any.
    pub step: u64,
    pub cancel: CancellationToken,
}

/// Why a hook failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// Ends the turn `error` with code `UNKNOWN` and this message.
    #[error("{0}")]
    Message(String),
    /// Ends the turn `error` with exactly these failure facts.
    #[error("{0}")]
    Failure(LlmFailure),
}

impl HookError {
    /// The failure recorded in `turn/end`.
    pub fn to_failure(&self) -> LlmFailure {
        match self {
            HookError::Message(m) => LlmFailure::new(crate::llm::types::codes::UNKNOWN, m.clone()),
            HookError::Failure(f) => f.clone(),
        }
    }
}

/// What a `pre_step` hook decided for a proposed step.
#[derive(Clone, Debug, PartialEq)]
pub enum PreStepDecision {
    /// Enter the step with exactly these messages (appended as `user/message`s after `step/start`);
    /// an empty batch enters nothing.
    Enter(Vec<Arc<Message>>),
    /// Do not enter: the turn ends `blocked`; the claimed batch is dropped.
    Reject,
}

/// Decides whether and with what a proposed step is entered. Hooks run in registration order; each
/// sees the batch the previous one entered; the first `Reject` wins.
#[async_trait]
pub trait PreStepHook: Send + Sync + 'static {
    /// # Errors
    /// A failure ends the turn `error`.
    async fn pre_step(
        &self,
        ctx: &HookCtx,
        messages: Vec<Arc<Message>>,
    ) -> Result<PreStepDecision, HookError>;
}

/// Rewrites the call configuration of one request attempt (provider, model, parameters). Hooks chain
/// in registration order.
#[async_trait]
pub trait RequestHook: Send + Sync + 'static {
    /// # Errors
    /// A failure ends the turn `error` (it is not offered to `request_error`).
    async fn request(
        &self,
        ctx: &HookCtx,
        config: LlmCallConfig,
    ) -> Result<LlmCallConfig, HookError>;
}

/// The facts a `request_error` hook decides on.
#[derive(Clone, Debug)]
pub struct RequestErrorCtx {
    pub hook: HookCtx,
    /// The provider that served the failed attempt.
    pub provider: String,
    pub failure: LlmFailure,
    /// The serving provider's retry policy (`None`: no provider served the request).
    pub retry_policy: Option<RetryPolicy>,
    /// Every `llm/retry` already recorded in this turn and step, oldest first.
    pub retries: Vec<LlmRetry>,
    /// A uniform random number in [0, 1] for jitter, drawn by the runtime (so the policy stays pure).
    pub random: f64,
}

/// A retry the runtime records and waits for: `llm/retry`, a cancellable wait of `delay_ms`, then
/// `llm/retry-started` and a new attempt in the same step.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledRetry {
    pub retry_id: String,
    /// `normal` or `always`.
    pub mode: String,
    pub policy_key: String,
    pub retry: u64,
    pub max_retries: Option<u64>,
    pub delay_ms: f64,
}

/// What a `request_error` hook decided.
#[derive(Clone, Debug, PartialEq)]
pub enum Recovery {
    /// Not mine: ask the next hook; when none is left the turn ends `error` with the failure.
    Delegate,
    /// Retry at once, recording nothing.
    Retry,
    /// Retry after a recorded, cancellable wait.
    Backoff(ScheduledRetry),
}

/// Offered every failed attempt (an `error` or `aborted` finish). Hooks run in registration order; the
/// first answer that is not `Delegate` wins.
#[async_trait]
pub trait RequestErrorHook: Send + Sync + 'static {
    /// # Errors
    /// A failure ends the turn `error` (no retry).
    async fn request_error(&self, ctx: &RequestErrorCtx) -> Result<Recovery, HookError>;
}

/// What a `turn_stopping` hook wants: input for next-step (the turn continues while next-step is not
/// empty) and optionally a cancellation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TurnStoppingAction {
    pub steer: Vec<Message>,
    pub inject: Vec<Message>,
    pub cancel: Option<CancelCause>,
}

/// Runs when a turn is about to close with an empty next-step. Serial: every hook runs, in
/// registration order. Data decides: the turn continues only if next-step holds input afterwards.
#[async_trait]
pub trait TurnStoppingHook: Send + Sync + 'static {
    /// # Errors
    /// A failure ends the turn `error`.
    async fn turn_stopping(&self, ctx: &HookCtx) -> Result<TurnStoppingAction, HookError>;
}

/// A tool hook's verdict before a call runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PreExecute {
    Allow,
    /// The body does not run; the model sees an error result with this reason.
    Deny {
        reason: String,
    },
}

/// Observes and polices tool calls. `pre_execute` runs one call at a time in model order before the
/// body is dispatched; `post_execute` runs in model order when the result is committed.
#[async_trait]
pub trait ToolHook: Send + Sync + 'static {
    async fn pre_execute(&self, ctx: &HookCtx, call: &ToolInvocation) -> PreExecute {
        let _ = (ctx, call);
        PreExecute::Allow
    }

    async fn post_execute(
        &self,
        ctx: &HookCtx,
        call: &ToolInvocation,
        output: ToolOutput,
    ) -> ToolOutput {
        let _ = (ctx, call);
        output
    }
}

/// The hooks in force for one agent (host hooks first, then the agent's own).
#[derive(Clone, Default)]
pub struct Hooks {
    pub pre_step: Vec<Arc<dyn PreStepHook>>,
    pub request: Vec<Arc<dyn RequestHook>>,
    pub request_error: Vec<Arc<dyn RequestErrorHook>>,
    pub turn_stopping: Vec<Arc<dyn TurnStoppingHook>>,
    pub tool: Vec<Arc<dyn ToolHook>>,
}

impl Hooks {
    pub fn new() -> Hooks {
        Hooks::default()
    }

    /// `self`'s hooks followed by `other`'s.
    pub fn layered(&self, other: &Hooks) -> Hooks {
        let mut out = self.clone();
        out.pre_step.extend(other.pre_step.iter().cloned());
        out.request.extend(other.request.iter().cloned());
        out.request_error
            .extend(other.request_error.iter().cloned());
        out.turn_stopping
            .extend(other.turn_stopping.iter().cloned());
        out.tool.extend(other.tool.iter().cloned());
        out
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("pre_step", &self.pre_step.len())
            .field("request", &self.request.len())
            .field("request_error", &self.request_error.len())
            .field("turn_stopping", &self.turn_stopping.len())
            .field("tool", &self.tool.len())
            .finish()
    }
}
