//! `dsh-actors`: the dsh-rs runtime. A `Host` supervises many agents; each agent is an actor whose
//! mailbox is its inbox, with children for the LLM stream, the session writer and the tool pool. The
//! `dsh` binary (package `dsh-cli`) drives it from the command line.
//!
//! Entry points: `Host::builder(store)` → `Host::create(AgentSpec)` → `AgentHandle` (`followup`,
//! `steer`, `inject`, `cancel`, `when_idle`, `subscribe`, ...).

pub mod agent;
pub mod host;
mod llm_stream;
pub mod observe;
mod session_writer;
mod tool_pool;

pub use agent::handle::{AgentHandle, InputError, InputReceipt};
pub use agent::msg::StatusReport;
pub use host::{AgentSpec, Host, HostBuilder, HostConfig, HostError, Metrics};
pub use observe::{Observation, Observed, Subscription};
