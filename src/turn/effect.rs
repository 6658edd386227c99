//! `Effect`: what the turn machine asks the runtime to do, and the facts the runtime resolves for it.
//!
//! Every effect that expects an answer carries a `ticket`; the runtime feeds the outcome back to the
//! `AgentCore` method the effect names, with that ticket. Effects that run something carry the thing
//! already resolved (the provider of a stream, the tool of a call), so the runtime never looks it up
//! again and never decides what a missing one means: the core did.

use std::fmt;
use std::sync::Arc;

use crate::llm::provider::Provider;
use crate::llm::retry::RetryPolicy;
use crate::llm::types::{LlmCallConfig, LlmFailure, LlmRequest, Message};
use crate::session::event::{LlmRetry, TurnEndReason};
use crate::tools::{Tool, ToolInvocation, ToolOutput};

use super::LiveEvent;

/// A tool the core resolved from the agent's registry for one call.
#[derive(Clone)]
pub struct ResolvedTool(pub Arc<dyn Tool>);

impl fmt::Debug for ResolvedTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResolvedTool").field(&self.0.name()).finish()
    }
}

/// A provider the core resolved from the runtime's registry for one attempt.
#[derive(Clone)]
pub struct ResolvedProvider(pub Arc<dyn Provider>);

impl fmt::Debug for ResolvedProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResolvedProvider")
            .field(&self.0.name())
            .finish()
    }
}

/// Work for the runtime and notifications, in the order they arose.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Publish a live notification.
    Notify(LiveEvent),
    /// A new activation, turn or maintenance task begins: make a fresh cancellation token for it.
    NewCancelToken,
    /// Cancel the current token (the turn or maintenance task was aborted).
    CancelToken,
    /// Run the hooks of one hook point (only emitted when the point has hooks); answer as the
    /// call says.
    RunHooks(HookCall),
    /// Read the log back from the store (the agent was hibernated); answer `on_log_loaded`.
    LoadLog {
        /// Names the answer.
        ticket: u64,
    },
    /// Open a stream on `provider` (events before it are durable); forward chunks to `on_chunk` and
    /// the end to `on_stream_end`.
    StartStream {
        /// The attempt's ticket, carried by every chunk.
        ticket: u64,
        /// The route name, for logs.
        provider_name: String,
        /// The provider serving the route.
        provider: ResolvedProvider,
        /// The request to send.
        request: LlmRequest,
    },
    /// Close the stream of attempt `ticket` at once.
    CancelStream {
        /// The attempt to close.
        ticket: u64,
    },
    /// Arm a timer; answer `on_timer` when it fires.
    StartTimer {
        /// Names the answer.
        ticket: u64,
        /// How long to wait.
        delay_ms: f64,
    },
    /// Disarm the timer of `ticket`, if it has not fired.
    CancelTimer {
        /// The timer to disarm.
        ticket: u64,
    },
    /// Run one tool body (its `tool/call` is durable); answer `on_tool_finished`.
    StartTool {
        /// The tool batch.
        ticket: u64,
        /// The call's index in the batch (model order).
        idx: usize,
        /// The call.
        invocation: ToolInvocation,
        /// The tool that runs it, from the agent's registry.
        tool: ResolvedTool,
    },
    /// Signal every running tool body of batch `ticket` to stop; after the grace period kill the rest
    /// and answer each with an aborted result.
    CancelTools {
        /// The tool batch.
        ticket: u64,
    },
    /// A turn ended with this reason (for reports and `dsh run` exit codes).
    TurnEnded {
        /// The turn that ended.
        turn: u64,
        /// Why.
        reason: TurnEndReason,
    },
    /// The answer to `AgentCore::compact_now`: the manual compaction started (its id and the seq of
    /// its `compaction/start`, to acknowledge once durable), or why it did not.
    CompactionStarted {
        /// The start, or why nothing started.
        result: Result<super::CompactionStarted, super::CompactRefusal>,
    },
    /// A compaction ended (its `compaction/end` is appended), for reports.
    CompactionEnded {
        /// It ended with an `error` (the history unchanged).
        failed: bool,
    },
    /// The agent cannot continue (its log could not be read back): stop and restart from the store.
    Fatal {
        /// Why, for the supervisor's log.
        reason: String,
    },
}

/// One hook point to run, with what its hooks decide on. The runtime runs it with the matching
/// `dsh::hooks::run_*` function off its handler and feeds the answer back with the ticket.
#[derive(Clone, Debug)]
pub enum HookCall {
    /// The `pre_step` hooks on the claimed batch; answer `on_pre_step`.
    PreStep {
        /// Names the answer.
        ticket: u64,
        /// The running turn.
        turn: u64,
        /// The proposed step.
        step: u64,
        /// The claimed batch the hooks decide on.
        messages: Vec<Arc<Message>>,
    },
    /// The `request` hooks on the seed configuration; answer `on_request_configured`.
    Request {
        /// Names the answer.
        ticket: u64,
        /// The running turn.
        turn: u64,
        /// The entered step.
        step: u64,
        /// The configuration the hooks start from.
        config: LlmCallConfig,
    },
    /// The `request_error` hooks, on a failed attempt; answer `on_recovery`.
    RequestError {
        /// Names the answer.
        ticket: u64,
        /// The running turn.
        turn: u64,
        /// The entered step.
        step: u64,
        /// The route of the failed attempt.
        provider: String,
        /// The serving provider's retry policy (`None`: no provider served the attempt).
        retry_policy: Option<RetryPolicy>,
        /// What went wrong.
        failure: LlmFailure,
        /// `llm/retry` events already in this turn and step.
        retries: Vec<LlmRetry>,
    },
    /// The `pre_execute` tool hooks for one call; answer `on_pre_execute`.
    PreExecute {
        /// The tool batch.
        ticket: u64,
        /// The call's index in the batch (model order).
        idx: usize,
        /// The call.
        invocation: ToolInvocation,
    },
    /// The `post_execute` tool hooks on a result about to commit; answer `on_post_execute`.
    PostExecute {
        /// The tool batch.
        ticket: u64,
        /// The call's index in the batch (model order).
        idx: usize,
        /// The call.
        invocation: ToolInvocation,
        /// The body's output, before the hooks.
        output: ToolOutput,
    },
    /// The `turn_stopping` hooks; answer `on_turn_stopping`.
    TurnStopping {
        /// Names the answer.
        ticket: u64,
        /// The running turn.
        turn: u64,
        /// The last entered step.
        step: u64,
    },
}
