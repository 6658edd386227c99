//! `dsh compact ID` and `/compact` in `dsh chat`: a manual compaction (SPEC §15,
//! `reference/session-llm.md` §8.2), only between turns.
//!
//! The agent writes `compaction/start`, asks the summariser, and on success writes
//! `compaction/summary`, the checkpoint `user/message` that replaces the older messages and
//! `compaction/end`; on failure only `compaction/end {error}`, the history unchanged. This module
//! starts it through `AgentHandle::compact`, waits until the agent is idle again and reads the
//! outcome from the log (the log is the truth), by the compaction's id.

use std::process::ExitCode;

use dsh::session::Event;
use dsh::session::compaction::CompactionEvent;
use dsh_actors::AgentHandle;

use crate::live;
use crate::text::error_line;
use crate::{AgentArgs, CliError, CompactArgs, Config};

/// What a finished compaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Compacted {
    /// The compaction's id.
    pub(crate) compaction_id: String,
    /// How many surface nodes the checkpoint replaced.
    pub(crate) n_shadowed: usize,
    /// Their estimated size in tokens.
    pub(crate) shadowed_tokens: u64,
}

impl Compacted {
    /// One line for a person.
    pub(crate) fn line(&self) -> String {
        format!(
            "compacted {} messages (~{} tokens) into a checkpoint (compaction {})",
            self.n_shadowed, self.shadowed_tokens, self.compaction_id
        )
    }
}

/// Compacts the agent of `handle` and waits for the outcome.
///
/// # Errors
/// One line: why it did not start (busy, nothing to compact) or why it failed (its
/// `compaction/end` error).
pub(crate) async fn compact(handle: &AgentHandle) -> Result<Compacted, String> {
    let receipt = handle.compact().await.map_err(|e| e.to_string())?;
    handle.when_idle().await.map_err(|e| e.to_string())?;
    let log = handle.log().await.map_err(|e| e.to_string())?;
    outcome(&log, &receipt.compaction_id)
}

/// The outcome of compaction `id` in `log`.
fn outcome(log: &[Event], id: &str) -> Result<Compacted, String> {
    let mut done = None;
    for event in log.iter().rev() {
        match CompactionEvent::read(event) {
            Some(Ok(CompactionEvent::End(end))) if end.compaction_id == id => {
                if let Some(error) = end.error {
                    return Err(format!("compaction failed: {}", error_line(&error)));
                }
            }
            Some(Ok(CompactionEvent::Summary(s))) if s.compaction_id == id => {
                done = Some(Compacted {
                    compaction_id: id.to_string(),
                    n_shadowed: s.shadowed_seqs.len(),
                    shadowed_tokens: s.shadowed_token_count,
                });
                break;
            }
            _ => {}
        }
    }
    done.ok_or_else(|| format!("compaction {id} did not finish"))
}

/// `dsh compact ID`: prints the outcome on stdout; a compaction that does not start or fails is an
/// error (exit 1), and the session is left as it was.
///
/// # Errors
/// A one-line `CliError`.
pub async fn run(args: CompactArgs, config: Config) -> Result<ExitCode, CliError> {
    let opts = AgentArgs {
        session: Some(args.id),
        script: args.script,
        existing: true,
        ..AgentArgs::default()
    };
    let agent = live::start(&config, &opts).await?;
    let result = compact(&agent.handle).await;
    agent.stop().await?;
    match result {
        Ok(done) => {
            println!("{}", done.line());
            Ok(ExitCode::SUCCESS)
        }
        Err(reason) => Err(CliError::Failed(reason)),
    }
}
