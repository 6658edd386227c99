//! The runtime's two error types: `InputError`, why an agent refused (or could not finish) an input
//! call, and `HostError`, why a host operation failed.
//!
//! Both are leaves of the crate's module graph: every other module may name them, they name nothing
//! of the runtime. A refused call changed nothing unless its variant says otherwise.

use dsh::SessionId;
use dsh::inbox::AdmitError;
use dsh::session::store::StoreError;

/// Why an input call on an `AgentHandle` was refused. Nothing was written unless the variant says
/// otherwise.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The agent's inbox refused the input (too large, too many pending, unknown message id, ...).
    #[error("input refused: {0}")]
    Refused(#[from] AdmitError),
    /// No agent with this id is registered.
    #[error("agent {id} not found")]
    NotFound {
        /// The agent asked for.
        id: SessionId,
    },
    /// An agent with this id already exists.
    #[error("agent {id} already exists")]
    AlreadyExists {
        /// The agent that exists.
        id: SessionId,
    },
    /// The agent refuses all input: its store failed, or it exceeded its restart intensity.
    #[error("agent {id} refuses input: {reason}")]
    Failed {
        /// The failed agent.
        id: SessionId,
        /// Why it failed, as reported to observers.
        reason: String,
    },
    /// The agent was disposed (or its host shut down); its log stays stored.
    #[error("agent {id} was disposed")]
    Disposed {
        /// The disposed agent.
        id: SessionId,
    },
    /// The agent stopped (crashed) between receiving the input and acknowledging it, so the input
    /// may or may not be durable.
    #[error(
        "agent {id} stopped before acknowledging; the input may or may not be durable (check its log)"
    )]
    Interrupted {
        /// The agent that stopped.
        id: SessionId,
    },
    /// `run_maintenance` was called while the agent had active work.
    #[error("agent {id} already has active work")]
    Busy {
        /// The busy agent.
        id: SessionId,
    },
    /// A manual compaction did not start (nothing to compact, or the log could not be read back).
    #[error("agent {id} did not compact: {reason}")]
    NotCompacted {
        /// The agent.
        id: SessionId,
        /// Why.
        reason: String,
    },
    /// Reading the agent's log back from the store failed.
    #[error("agent {id}: {reason}")]
    Store {
        /// The agent whose log was read.
        id: SessionId,
        /// The store's failure, as text.
        reason: String,
    },
}

/// Why a host operation (`create`, `resume`, `open`, `dispose`, `restart`, starting the host) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// An agent with this id is live, or a session with this id is stored.
    #[error("agent {id} already exists")]
    AlreadyExists {
        /// The id that is taken.
        id: SessionId,
    },
    /// No live agent (or, for `resume`, no stored session) has this id.
    #[error("agent {id} not found")]
    NotFound {
        /// The id asked for.
        id: SessionId,
    },
    /// The stored log cannot become an agent (it failed validation after repair).
    #[error("agent {id} cannot resume: {reason}")]
    Resume {
        /// The agent that cannot resume.
        id: SessionId,
        /// What is wrong with its log.
        reason: String,
    },
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The actor runtime failed to start an actor (the host's or an agent's).
    #[error("the runtime failed to start an actor: {0}")]
    Spawn(String),
    /// The host is shut down and starts no more agents.
    #[error("the host is shut down")]
    ShutDown,
}
