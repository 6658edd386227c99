//! `dsh-actors`: the dsh-rs runtime. A `Host` supervises many agents; each agent is an actor whose
//! mailbox is its inbox, with children for the LLM stream, the session writer and the tool pool. The
//! `dsh` binary (package `dsh-cli`) drives it from the command line.
//!
//! Entry points: `Host::builder(store)` → `Host::create(AgentSpec)` → `AgentHandle` (`followup`,
//! `steer`, `inject`, `cancel`, `when_idle`, `subscribe`, ...). Failed model requests are retried
//! under each provider's policy unless the builder says otherwise (`HostBuilder::retry`) or
//! `request_error` hooks take over that decision (`DefaultRetry`).
//!
//! Everything an embedder uses is exported here, at the crate root; the modules are private. Their
//! imports form no circle (each arrow: "imports"):
//!
//! ```text
//! host ──> agent ──> session_writer, llm_stream, tool_pool ──> agent::msg
//!   │        └─────> slot ──> agent::msg
//!   └──> handle ──> slot, agent::msg
//! agent::msg ──> error, observe        runtime ──> observe
//! ```
//!
//! `threads` (the host's own agent threads, `HostConfig::agent_threads`) is used by `host` alone.
//! `error`, `observe` and `runtime` are used by every layer and use none of them (save `runtime`'s
//! observer channel). The slot reaches the host only through the `SlotHost` trait, and the session
//! writer receives only its write fence from the slot.

#![warn(missing_docs)]

mod agent;
mod error;
mod handle;
mod host;
mod llm_stream;
mod observe;
mod runtime;
mod session_writer;
mod slot;
mod threads;
mod tool_pool;

pub use error::{HostError, InputError};
pub use handle::{AgentHandle, CompactReceipt, InputReceipt};
pub use host::{AgentSpec, DefaultRetry, Host, HostBuilder};
pub use observe::{Observation, Observed, StatusReport, Subscription};
pub use runtime::{DEFAULT_CHUNK_LINGER, HostConfig, Metrics};
