//! `dsh`: the domain core of dsh-rs.
//!
//! A session log is the truth about a conversation; the model's history, an agent's inbox and its turn
//! state are folds over it. This crate holds those folds and the rules that keep a log valid — append,
//! surface, invariant check, crash repair — plus the pure state machines the actor runtime drives: the
//! inbox (`inbox`), the turn/step machine (`turn`), the tool scheduler (`tools::schedule`), stream
//! assembly (`llm::assembler`) and the retry policy (`llm::retry`). Its only I/O lives in the stores
//! (`session::store`) and the model providers (`llm::openai`, `llm::sim`, `llm::script`).
//!
//! Nothing here spawns actors or knows the actor framework: `dsh-actors` drives these types. Time enters as an
//! argument.

#![warn(missing_docs)]

pub mod hooks;
pub mod ids;
pub mod inbox;
pub mod limits;
pub mod llm;
pub mod scenario;
pub mod session;
pub mod tools;
pub mod turn;

pub use ids::{MessageId, SessionId};
pub use limits::Limits;
