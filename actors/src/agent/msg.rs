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
use dsh::turn::{ProviderFacts, Status};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::agent::handle::InputError;
use crate::observe::Subscription;

/// A reply channel. A closed one is normal (the caller gave up waiting).
pub type Reply<T> = oneshot::Sender<T>;

/// A snapshot of an agent for `status()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusReport {
    pub status: Status,
    /// No activity (not running, not in maintenance) and every event durable.
    pub idle: bool,
    pub hibernated: bool,
    pub last_turn: u64,
    pub next_seq: u64,
    pub durable_seq: u64,
    pub n_pending_turn: usize,
    pub n_pending_step: usize,
    /// Set when the agent refuses input (its store failed).
    pub failed: Option<String>,
}

impl StatusReport {
    /// The report of `core` (`failed`: why the agent refuses input, if it does).
    pub(crate) fn of(core: &dsh::turn::AgentCore, failed: Option<String>) -> StatusReport {
        let inbox = core.inbox();
        StatusReport {
            status: core.status(),
            idle: core.is_idle() && core.durable_seq() == core.next_seq(),
            hibernated: core.is_hibernated(),
            last_turn: core.last_turn(),
            next_seq: core.next_seq(),
            durable_seq: core.durable_seq(),
            n_pending_turn: inbox.next_turn().len(),
            n_pending_step: inbox.next_step().len(),
            failed,
        }
    }
}

pub enum AgentMsg {
    // From the handle: acked once the input is durable, with the seq of its `agent/inbox/spliced`.
    Followup {
        msg: Message,
        reply: Reply<Result<Option<u64>, InputError>>,
    },
    Steer {
        msg: Message,
        reply: Reply<Result<Option<u64>, InputError>>,
    },
    Inject {
        msg: Message,
        reply: Reply<Result<Option<u64>, InputError>>,
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
    Subscribe {
        reply: Reply<Subscription>,
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
    HibernateCheck {
        epoch: u64,
    },
    /// Test-only: make the agent actor fail as a bug would.
    #[cfg(feature = "fault-injection")]
    Panic,
    /// Test-only: make the agent's tool pool fail as a bug would.
    #[cfg(feature = "fault-injection")]
    PanicToolPool,
}
