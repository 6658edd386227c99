//! `Session`: one agent's append-only log in memory, with the folds the runtime reads from it.
//!
//! The log is the single source of truth. Everything else about a conversation — the model-visible
//! history (the surface), the current turn number, the request header in force, the pending inbox — is
//! a fold over it. `Session` keeps the events and the incremental folds; it does no I/O and reads no
//! clock (the caller passes `time`).
//!
//! What must stay true: seqs are contiguous from 0; every surface-type event carries a `surfaceOp` and
//! no other event does; `sourceEventSeqs` only cite earlier events; a replace only shadows current
//! surface nodes (and a `tool/result` replace rewrites exactly one `tool/result`, changing only its
//! content). `append` checks all of it before the log changes, and `from_events` checks it again for a
//! log read back from a store (assertions in pairs).
//!
//! Who calls this: the agent runtime (`dsh-actors`) appends through its session writer path; stores
//! hand loaded logs to `Session::from_events`; `dsh check`/`show` read folds.

pub mod compaction;
pub mod consumed;
pub mod event;
pub mod invariant;
pub mod log;
pub mod repair;
pub mod store;
pub mod surface;

pub use event::{Event, EventData, SessionHeader, SurfaceOp};
pub use log::{AppendError, EventDraft, Session};
