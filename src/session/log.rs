//! Append rules: contiguous seq, surface metadata, `sourceEventSeqs`, and the incremental folds.
//!
//! OWNER: session helper (issue 2, item 3). The signatures below are the contract the turn machine and
//! the stores are written against; keep them, extend freely.

use std::sync::Arc;

use crate::ids::SessionId;
use crate::llm::types::{Message, RequestHeader};
use crate::session::event::{Event, EventData, RequestContext, SurfaceOp};
use crate::session::surface::Surface;

/// An event not yet in a log: everything but `seq` and `time`, which `Session::append` assigns.
#[derive(Clone, Debug, PartialEq)]
pub struct EventDraft {
    pub data: EventData,
    pub source_event_seqs: Option<Vec<u64>>,
    pub surface_op: Option<SurfaceOp>,
}

impl EventDraft {
    /// A log-only event (no surface metadata).
    pub fn log(data: EventData) -> EventDraft {
        EventDraft {
            data,
            source_event_seqs: None,
            surface_op: None,
        }
    }

    /// A surface event appended at the tail, citing `sources` when given.
    pub fn append(data: EventData, sources: Option<Vec<u64>>) -> EventDraft {
        EventDraft {
            data,
            source_event_seqs: sources,
            surface_op: Some(SurfaceOp::Append),
        }
    }
}

/// Why an event was not appended. The log is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    #[error("event {kind:?} is surface-eligible and requires a surfaceOp marker")]
    MissingSurfaceOp { kind: String },
    #[error("event {kind:?} is not surface-eligible and cannot carry {field}")]
    NotSurfaceEligible { kind: String, field: &'static str },
    #[error("sourceEventSeqs {reason}")]
    BadSources { reason: String },
    #[error("surface replace: {reason}")]
    BadReplace { reason: String },
    #[error("event {kind:?} has an invalid message: {reason}")]
    BadMessage { kind: String, reason: String },
    #[error("session event seq {seq} is not contiguous; expected {expected}")]
    NotContiguous { seq: u64, expected: u64 },
    #[error("event is {bytes} bytes, the limit is {bytes_max}")]
    TooLarge { bytes: usize, bytes_max: usize },
}

/// One agent's log in memory with its incremental folds.
#[derive(Debug)]
pub struct Session {
    id: SessionId,
    /// Invariant: `events[i].seq == i`.
    events: Vec<Event>,
    surface: Surface,
}

impl Session {
    /// An empty log.
    pub fn new(id: SessionId) -> Session {
        let _ = (&id,);
        todo!("session helper")
    }

    /// A log read back from a store or an import: every event is validated as `append` would (seq,
    /// surface rules, message shapes) and the folds are built.
    ///
    /// # Errors
    /// The first invalid event, with its seq.
    pub fn from_events(id: SessionId, events: Vec<Event>) -> Result<Session, (u64, AppendError)> {
        let _ = (id, events);
        todo!("session helper")
    }

    pub fn id(&self) -> &SessionId {
        &self.id
    }

    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The seq the next appended event receives (= number of events).
    pub fn next_seq(&self) -> u64 {
        self.events.len() as u64
    }

    /// Validates `draft` against the log and appends it with the next seq and `time`.
    ///
    /// # Errors
    /// `AppendError` naming the broken rule; the log and every fold are unchanged.
    pub fn append(&mut self, draft: EventDraft, time: i64) -> Result<&Event, AppendError> {
        let _ = (draft, time);
        todo!("session helper")
    }

    /// The surface fold (nodes and replace generation).
    pub fn surface(&self) -> &Surface {
        &self.surface
    }

    /// The model-visible history: the surface projected to messages (empty assistant messages
    /// skipped). Cached; each call returns a fresh vector over shared messages.
    pub fn derive_messages(&self) -> Vec<Arc<Message>> {
        todo!("session helper")
    }

    /// The number of the last `turn/start` in the log, or 0.
    pub fn last_turn(&self) -> u64 {
        todo!("session helper")
    }

    /// The canonical header of the last `request/header` event, if any.
    pub fn request_header(&self) -> Option<&RequestHeader> {
        todo!("session helper")
    }

    /// The payload of the last `request/context` event, if any.
    pub fn request_context(&self) -> Option<&RequestContext> {
        todo!("session helper")
    }
}
