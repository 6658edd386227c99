//! `AgentMsg`: everything an agent actor's mailbox carries, in one closed enum.
//!
//! Commands from outside (the handle) are imperative and carry a reply channel; reports from the
//! agent's children and tasks are past-tense facts carrying the `ticket` of the effect they answer.

use dsh::MessageId;
use dsh::hooks::{HookError, PreExecute, PreStepDecision, Recovery, TurnStoppingAction};
use dsh::llm::types::{LlmCallConfig, Message, StreamChunk};
use dsh::session::Event;
use dsh::session::event::CancelCause;
use dsh::session::store::StoreError;
use dsh::tools::ToolOutput;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::error::InputError;
use crate::observe::StatusReport;

/// A reply channel. A closed one is normal (the caller gave up waiting).
pub type Reply<T> = oneshot::Sender<T>;

/// Where a manual compaction started: its id and the seq of its durable `compaction/start`. Its
/// outcome is the matching `compaction/end` (with `error` when it failed), written before the agent
/// is idle again (`when_idle`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompactReceipt {
    /// The compaction's id (`compactionId`).
    pub compaction_id: String,
    /// Seq of its `compaction/start`.
    pub seq: u64,
}

/// Everything an agent actor's mailbox carries.
pub enum AgentMsg {
    // From the handle: acked once the input is durable, with the seq of its `agent/inbox/spliced`.
    /// A prompt for its own turn (next-turn), waking the agent.
    Followup {
        /// The prompt.
        msg: Message,
        /// Acknowledged once the input is durable, with the seq of its splice.
        reply: Reply<Result<Option<u64>, InputError>>,
    },
    /// Input for the nearest step boundary (next-step), waking the agent.
    Steer {
        /// The input.
        msg: Message,
        /// Acknowledged once the input is durable, with the seq of its splice.
        reply: Reply<Result<Option<u64>, InputError>>,
    },
    /// Input for the next boundary of whatever turn runs next, not waking the agent.
    Inject {
        /// The input.
        msg: Message,
        /// Acknowledged once the input is durable, with the seq of its splice.
        reply: Reply<Result<Option<u64>, InputError>>,
    },
    /// Abort the active turn or maintenance task, and (unless `keep_inbox`) discard pending input.
    Cancel {
        /// Why.
        cause: CancelCause,
        /// Keep the pending input.
        keep_inbox: bool,
        /// Acknowledged once the discard is durable.
        reply: Reply<Result<(), InputError>>,
    },
    /// Discard one pending message.
    Remove {
        /// The message.
        id: MessageId,
        /// Whether it was pending, once the discard is durable.
        reply: Reply<Result<bool, InputError>>,
    },
    /// Swap one pending message for another in place.
    Replace {
        /// The pending message.
        id: MessageId,
        /// Its replacement.
        msg: Message,
        /// Whether it was pending, once the swap is durable.
        reply: Reply<Result<bool, InputError>>,
    },
    /// Answer once the agent is idle and everything is durable.
    WhenIdle {
        /// Answered then.
        reply: Reply<()>,
    },
    /// Report the agent's state.
    Status {
        /// The report.
        reply: Reply<StatusReport>,
    },
    /// The in-memory log (read back from the store if hibernated).
    Log {
        /// The log.
        reply: Reply<Result<Vec<Event>, InputError>>,
    },
    /// Enter maintenance if idle.
    BeginMaintenance {
        /// The maintenance task's cancellation token, or why the agent is busy.
        reply: Reply<Result<CancellationToken, InputError>>,
    },
    /// Leave maintenance.
    EndMaintenance,
    /// Compact by hand if idle; answered once `compaction/start` is durable.
    Compact {
        /// The receipt, or why nothing started.
        reply: Reply<Result<CompactReceipt, InputError>>,
    },

    // From the session writer.
    /// Events with seq below `through_seq` are durable.
    Durable {
        /// The first seq not yet durable.
        through_seq: u64,
    },
    /// The store failed a write: the agent refuses input from now on.
    WriterFailed {
        /// The failure.
        error: StoreError,
    },

    // From tasks and children, answering effects.
    /// The log was read back after hibernation.
    LogLoaded {
        /// The `LoadLog` effect answered.
        ticket: u64,
        /// The events, or why they could not be read.
        result: Result<Vec<Event>, String>,
    },
    /// The log was read back for a `Log` caller.
    LogReadForCaller {
        /// The events, or why they could not be read.
        result: Result<Vec<Event>, String>,
        /// The caller.
        reply: Reply<Result<Vec<Event>, InputError>>,
    },
    /// The `pre_step` hooks decided.
    PreStepDone {
        /// The hook call answered.
        ticket: u64,
        /// Their decision, or the first failure.
        result: Result<PreStepDecision, HookError>,
    },
    /// The `request` hooks chose the call configuration.
    RequestConfigured {
        /// The hook call answered.
        ticket: u64,
        /// The configuration, or the first failure.
        result: Result<LlmCallConfig, HookError>,
    },
    /// One chunk of attempt `ticket`.
    Chunk {
        /// The attempt.
        ticket: u64,
        /// The chunk.
        chunk: StreamChunk,
    },
    /// Several chunks of attempt `ticket` that the provider had ready at once, in stream order:
    /// handled exactly as that many `Chunk` messages in a row, for one mailbox trip.
    Chunks {
        /// The attempt.
        ticket: u64,
        /// The chunks, in stream order.
        chunks: Vec<StreamChunk>,
    },
    /// The stream of attempt `ticket` has kept the agent's held chunks back for the linger: hand
    /// them to the writer now (observers see them once durable).
    FlushChunks {
        /// The attempt.
        ticket: u64,
    },
    /// The stream of attempt `ticket` ended.
    StreamEnded {
        /// The attempt.
        ticket: u64,
    },
    /// The `request_error` hooks decided about a failed attempt.
    RecoveryDecided {
        /// The hook call answered.
        ticket: u64,
        /// The recovery, or the first failure.
        result: Result<Recovery, HookError>,
    },
    /// The backoff timer of `ticket` fired.
    TimerFired {
        /// The timer.
        ticket: u64,
    },
    /// The `pre_execute` hooks decided about one call.
    PreExecuteDone {
        /// The tool batch.
        ticket: u64,
        /// The call.
        idx: usize,
        /// The decision, or the first failure.
        decision: Result<PreExecute, HookError>,
    },
    /// A tool body finished (or was killed, timed out or panicked).
    ToolFinished {
        /// The tool batch.
        ticket: u64,
        /// The call.
        idx: usize,
        /// Its output.
        output: ToolOutput,
    },
    /// The `post_execute` hooks produced the output to commit.
    PostExecuteDone {
        /// The tool batch.
        ticket: u64,
        /// The call.
        idx: usize,
        /// The output, or the first failure.
        output: Result<ToolOutput, HookError>,
    },
    /// The `turn_stopping` hooks answered.
    TurnStoppingDone {
        /// The hook call answered.
        ticket: u64,
        /// Their merged action, or the first failure.
        result: Result<TurnStoppingAction, HookError>,
    },
    /// The idle timer armed at convergence fired.
    HibernateCheck,
    /// Test-only: make the agent actor fail as a bug would.
    #[cfg(feature = "fault-injection")]
    Panic,
    /// Test-only: make the agent's tool pool fail as a bug would.
    #[cfg(feature = "fault-injection")]
    PanicToolPool,
}

impl AgentMsg {
    /// Whether this message only looks at the agent: looking is not activity, so polling `status`
    /// never keeps an agent awake.
    pub(crate) fn is_looking(&self) -> bool {
        matches!(
            self,
            AgentMsg::Status { .. }
                | AgentMsg::WhenIdle { .. }
                | AgentMsg::Log { .. }
                | AgentMsg::LogReadForCaller { .. }
                | AgentMsg::HibernateCheck
        )
    }
}
