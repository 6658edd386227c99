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
use dsh::turn::ProviderFacts;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::error::InputError;
use crate::observe::StatusReport;

/// A reply channel. A closed one is normal (the caller gave up waiting).
pub type Reply<T> = oneshot::Sender<T>;

pub enum AgentMsg {
    // From the handle: acked once the input is durable.
    Followup {
        msg: Message,
        reply: Reply<Result<(), InputError>>,
    },
    Steer {
        msg: Message,
        reply: Reply<Result<(), InputError>>,
    },
    Inject {
        msg: Message,
        reply: Reply<Result<(), InputError>>,
    },
    Cancel {
        cause: CancelCause,
        keep_inbox: bool,
        reply: Reply<Result<(), InputError>>,
    },
    Remove {
        id: MessageId,
        reply: Reply<Result<bool, InputError>>,
    },
    Replace {
        id: MessageId,
        msg: Message,
        reply: Reply<Result<bool, InputError>>,
    },
    WhenIdle {
        reply: Reply<()>,
    },
    Status {
        reply: Reply<StatusReport>,
    },
    /// The in-memory log (read back from the store if hibernated).
    Log {
        reply: Reply<Result<Vec<Event>, InputError>>,
    },
    BeginMaintenance {
        reply: Reply<Result<CancellationToken, InputError>>,
    },
    EndMaintenance,

    // From the session writer.
    Durable {
        through_seq: u64,
    },
    WriterFailed {
        error: StoreError,
    },

    // From tasks and children, answering effects.
    LogLoaded {
        ticket: u64,
        result: Result<Vec<Event>, String>,
    },
    LogReadForCaller {
        result: Result<Vec<Event>, String>,
        reply: Reply<Result<Vec<Event>, InputError>>,
    },
    PreStepDone {
        ticket: u64,
        result: Result<PreStepDecision, HookError>,
    },
    RequestConfigured {
        ticket: u64,
        result: Result<LlmCallConfig, HookError>,
        facts: Option<ProviderFacts>,
    },
    Chunk {
        ticket: u64,
        chunk: StreamChunk,
    },
    /// Several chunks of attempt `ticket` that the provider had ready at once, in stream order:
    /// handled exactly as that many `Chunk` messages in a row, for one mailbox trip.
    Chunks {
        ticket: u64,
        chunks: Vec<StreamChunk>,
    },
    StreamEnded {
        ticket: u64,
    },
    RecoveryDecided {
        ticket: u64,
        result: Result<Recovery, HookError>,
    },
    TimerFired {
        ticket: u64,
    },
    PreExecuteDone {
        ticket: u64,
        idx: usize,
        decision: PreExecute,
    },
    ToolFinished {
        ticket: u64,
        idx: usize,
        output: ToolOutput,
    },
    PostExecuteDone {
        ticket: u64,
        idx: usize,
        output: ToolOutput,
    },
    TurnStoppingDone {
        ticket: u64,
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
