//! Hook points: async trait objects registered per host or per agent, consulted by the turn machine.
//!
//! Hooks act through the data they return, never by reaching into the agent: `pre_step` returns the
//! batch to enter (or a rejection), `request` returns a replacement call configuration (it cannot touch
//! the messages, which come from the log), `request_error` returns a recovery decision, `turn_stopping`
//! returns input to steer into next-step, and the tool hooks return an allow/deny decision and a
//! (possibly rewritten) output. The runtime runs each hook outside the agent's message handler and
//! feeds the answer back, so a slow hook never delays a steer or a cancel.
//!
//! One function per hook point (`run_pre_step`, `run_request`, `run_request_error`,
//! `run_pre_execute`, `run_post_execute`, `run_turn_stopping`) runs the registered hooks of that point
//! with its composition rule, and contains a panic as a failure:
//!
//! | point | composition |
//! |---|---|
//! | `pre_step` | in order, each sees the batch the previous one entered; the first `Reject` wins |
//! | `request` | chained: each gets the configuration the previous one returned |
//! | `request_error` | in order; the first answer that is not `Delegate` wins |
//! | `pre_execute` | in order; the first `Deny` wins |
//! | `post_execute` | chained: each gets the output the previous one returned |
//! | `turn_stopping` | every hook runs; steers and injects concatenate, the first cancel wins |
//!
//! A hook that fails (returns `Err` or panics) stops its point at once. For every point but the tool
//! hooks the turn then ends `error` (code `UNKNOWN` unless the hook returned an `LlmFailure`); a failed
//! tool hook makes the call's result an error result (`ToolOutput::hook_failed`), and the body does
//! not run if `pre_execute` failed. A point with no hook registered is never run: the turn machine
//! knows which points have hooks (`HookPoints`) and takes the neutral answer itself.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use async_trait::async_trait;
use futures::FutureExt;
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
    /// The agent.
    pub session_id: SessionId,
    /// The running turn.
    pub turn: u64,
    /// The proposed step for `pre_step`, otherwise the current (last entered) step; 0 before any.
    pub step: u64,
    /// Fires when the turn is cancelled.
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
    /// Where the failure happened.
    pub hook: HookCtx,
    /// The provider that served the failed attempt.
    pub provider: String,
    /// What went wrong.
    pub failure: LlmFailure,
    /// The serving provider's retry policy (`None`: no provider served the request).
    pub retry_policy: Option<RetryPolicy>,
    /// Every `llm/retry` already recorded in this turn and step, oldest first.
    pub retries: Vec<LlmRetry>,
    /// A uniform random number in [0, 1] for jitter, drawn by the runtime (so the policy stays pure).
    pub random: f64,
    /// The id a retry takes when it starts a new chain, minted by the runtime (a UUID v4, see
    /// `dsh::ids::mint_retry_id`) so the policy mints none. A retry that continues a chain keeps the
    /// chain's id and ignores this one.
    pub new_retry_id: String,
}

/// A retry the runtime records and waits for: `llm/retry`, a cancellable wait of `delay_ms`, then
/// `llm/retry-started` and a new attempt in the same step.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledRetry {
    /// Names the chain of retries this one belongs to (logged in `llm/retry`).
    pub retry_id: String,
    /// `normal` or `always`.
    pub mode: String,
    /// Identifies the policy that scheduled the retry.
    pub policy_key: String,
    /// The retry's number in its chain, from 1.
    pub retry: u64,
    /// The chain's budget (`None`: unbounded, mode `always`).
    pub max_retries: Option<u64>,
    /// The wait before the new attempt.
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
    /// Messages steered into next-step.
    pub steer: Vec<Message>,
    /// Messages injected into next-step.
    pub inject: Vec<Message>,
    /// Cancel the turn with this cause.
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
    /// Run the body.
    Allow,
    /// The body does not run; the model sees an error result with this reason.
    Deny {
        /// What the model is told.
        reason: String,
    },
}

/// Observes and polices tool calls. `pre_execute` runs one call at a time in model order before the
/// body is dispatched; `post_execute` runs in model order when the result is committed.
#[async_trait]
pub trait ToolHook: Send + Sync + 'static {
    /// Allows or denies `call` before its body runs.
    ///
    /// # Errors
    /// A failure makes the call's result an error result; the body does not run.
    async fn pre_execute(
        &self,
        ctx: &HookCtx,
        call: &ToolInvocation,
    ) -> Result<PreExecute, HookError> {
        let _ = (ctx, call);
        Ok(PreExecute::Allow)
    }

    /// Observes or rewrites the output of `call` before it is committed.
    ///
    /// # Errors
    /// A failure makes the call's result an error result instead of `output`.
    async fn post_execute(
        &self,
        ctx: &HookCtx,
        call: &ToolInvocation,
        output: ToolOutput,
    ) -> Result<ToolOutput, HookError> {
        let _ = (ctx, call);
        Ok(output)
    }
}

/// The hooks in force for one agent (host hooks first, then the agent's own).
#[derive(Clone, Default)]
pub struct Hooks {
    /// Consulted before each step is entered.
    pub pre_step: Vec<Arc<dyn PreStepHook>>,
    /// Consulted before each request attempt.
    pub request: Vec<Arc<dyn RequestHook>>,
    /// Consulted after each failed attempt.
    pub request_error: Vec<Arc<dyn RequestErrorHook>>,
    /// Consulted when a turn is about to close.
    pub turn_stopping: Vec<Arc<dyn TurnStoppingHook>>,
    /// Consulted around each tool call.
    pub tool: Vec<Arc<dyn ToolHook>>,
}

impl Hooks {
    /// No hooks.
    pub fn new() -> Hooks {
        Hooks::default()
    }

    /// Which points have at least one hook.
    pub fn points(&self) -> HookPoints {
        HookPoints {
            pre_step: !self.pre_step.is_empty(),
            request: !self.request.is_empty(),
            request_error: !self.request_error.is_empty(),
            turn_stopping: !self.turn_stopping.is_empty(),
            tool: !self.tool.is_empty(),
        }
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

/// Which hook points have hooks registered. The turn machine asks the runtime to run a point only
/// when it has one; otherwise it takes the point's neutral answer itself (enter the batch, keep the
/// configuration, delegate, allow, keep the output, stop), with no round trip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HookPoints {
    /// `pre_step` hooks exist.
    pub pre_step: bool,
    /// `request` hooks exist.
    pub request: bool,
    /// `request_error` hooks exist.
    pub request_error: bool,
    /// `turn_stopping` hooks exist.
    pub turn_stopping: bool,
    /// Tool hooks exist (`pre_execute` and `post_execute`).
    pub tool: bool,
}

impl HookPoints {
    /// Every point has hooks (every point is run by the runtime).
    pub const ALL: HookPoints = HookPoints {
        pre_step: true,
        request: true,
        request_error: true,
        turn_stopping: true,
        tool: true,
    };
}

/// The text of a panic payload.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a hook panicked".to_string()
    }
}

/// Runs `work`, turning a panic into a `HookError` (`hook panicked: <message>`).
async fn contained<T>(
    work: impl std::future::Future<Output = Result<T, HookError>>,
) -> Result<T, HookError> {
    match AssertUnwindSafe(work).catch_unwind().await {
        Ok(result) => result,
        Err(panic) => Err(HookError::Message(format!(
            "hook panicked: {}",
            panic_message(&*panic)
        ))),
    }
}

/// Runs the `pre_step` hooks on the claimed batch: in order, each sees the batch the previous one
/// entered; the first `Reject` wins.
///
/// # Errors
/// The first hook that fails or panics; the hooks after it do not run.
pub async fn run_pre_step(
    hooks: Vec<Arc<dyn PreStepHook>>,
    ctx: HookCtx,
    messages: Vec<Arc<Message>>,
) -> Result<PreStepDecision, HookError> {
    contained(async move {
        let mut batch = messages;
        for hook in hooks {
            match hook.pre_step(&ctx, batch).await? {
                PreStepDecision::Enter(entered) => batch = entered,
                PreStepDecision::Reject => return Ok(PreStepDecision::Reject),
            }
        }
        Ok(PreStepDecision::Enter(batch))
    })
    .await
}

/// Runs the `request` hooks, chained: each gets the configuration the previous one returned.
///
/// # Errors
/// The first hook that fails or panics; the hooks after it do not run.
pub async fn run_request(
    hooks: Vec<Arc<dyn RequestHook>>,
    ctx: HookCtx,
    config: LlmCallConfig,
) -> Result<LlmCallConfig, HookError> {
    contained(async move {
        let mut config = config;
        for hook in hooks {
            config = hook.request(&ctx, config).await?;
        }
        Ok(config)
    })
    .await
}

/// Runs the `request_error` hooks in order; the first answer that is not `Delegate` wins, and
/// `Delegate` is the answer when every hook delegates.
///
/// # Errors
/// The first hook that fails or panics; the hooks after it do not run.
pub async fn run_request_error(
    hooks: Vec<Arc<dyn RequestErrorHook>>,
    ctx: RequestErrorCtx,
) -> Result<Recovery, HookError> {
    contained(async move {
        for hook in hooks {
            match hook.request_error(&ctx).await? {
                Recovery::Delegate => {}
                decided => return Ok(decided),
            }
        }
        Ok(Recovery::Delegate)
    })
    .await
}

/// Runs the `pre_execute` tool hooks on one call in order; the first `Deny` wins.
///
/// # Errors
/// The first hook that fails or panics; the hooks after it do not run (the call then gets an error
/// result and its body does not run).
pub async fn run_pre_execute(
    hooks: Vec<Arc<dyn ToolHook>>,
    ctx: HookCtx,
    call: ToolInvocation,
) -> Result<PreExecute, HookError> {
    contained(async move {
        for hook in hooks {
            if let deny @ PreExecute::Deny { .. } = hook.pre_execute(&ctx, &call).await? {
                return Ok(deny);
            }
        }
        Ok(PreExecute::Allow)
    })
    .await
}

/// Runs the `post_execute` tool hooks on one call's output, chained: each gets the output the
/// previous one returned.
///
/// # Errors
/// The first hook that fails or panics; the hooks after it do not run (the call's result is then an
/// error result, not the body's output).
pub async fn run_post_execute(
    hooks: Vec<Arc<dyn ToolHook>>,
    ctx: HookCtx,
    call: ToolInvocation,
    output: ToolOutput,
) -> Result<ToolOutput, HookError> {
    contained(async move {
        let mut output = output;
        for hook in hooks {
            output = hook.post_execute(&ctx, &call, output).await?;
        }
        Ok(output)
    })
    .await
}

/// Runs every `turn_stopping` hook in order and merges their actions: steers and injects
/// concatenate in hook order, the first cancel wins.
///
/// # Errors
/// The first hook that fails or panics; the hooks after it do not run.
pub async fn run_turn_stopping(
    hooks: Vec<Arc<dyn TurnStoppingHook>>,
    ctx: HookCtx,
) -> Result<TurnStoppingAction, HookError> {
    contained(async move {
        let mut all = TurnStoppingAction::default();
        for hook in hooks {
            let action = hook.turn_stopping(&ctx).await?;
            all.steer.extend(action.steer);
            all.inject.extend(action.inject);
            if all.cancel.is_none() {
                all.cancel = action.cancel;
            }
        }
        Ok(all)
    })
    .await
}
