//! `dsh run PROMPT`: one prompt, non-interactive, for scripts.
//!
//! The prompt is sent as a followup; the command then waits until the agent is idle and reads the
//! turn that claimed the prompt from the log (the log, not the live stream, is the truth: a
//! subscriber may lag, the log cannot). stdout gets only the assistant's final text; everything else
//! goes to stderr. Exit codes (SPEC §10): 0 completed (max-tokens too, with a warning), 2 `error`
//! (code and message on stderr), 3 `aborted`, 4 `blocked`. SIGINT or SIGTERM cancels the turn
//! (pending input discarded), which then ends `aborted` → 3.

use std::io::Write;
use std::process::ExitCode;

use dsh::MessageId;
use dsh::llm::types::Message;
use dsh::session::event::{CancelCause, Event, EventData, TurnEndReason};
use tokio::signal::unix::{SignalKind, signal};

use crate::live::{self, LiveAgent};
use crate::render::turn_end_note;
use crate::text::echo;
use crate::{CliError, Config, RunArgs};

/// Exit status of a turn that ended `error`.
pub const EXIT_ERROR: u8 = 2;
/// Exit status of a turn that ended `aborted`.
pub const EXIT_ABORTED: u8 = 3;
/// Exit status of a turn that ended `blocked`.
pub const EXIT_BLOCKED: u8 = 4;

/// What became of the prompt.
#[derive(Debug, PartialEq)]
pub(crate) struct Outcome {
    /// The turn that claimed the prompt and how it ended; `None` when the prompt was discarded
    /// before any turn took it (a cancel).
    pub(crate) end: Option<(u64, TurnEndReason)>,
    /// The text of the last assistant message of that turn that had any.
    pub(crate) text: Option<String>,
}

/// Finds the turn that claimed `prompt_id` in `log`, how it ended and its final text.
pub(crate) fn outcome(log: &[Event], prompt_id: &MessageId) -> Outcome {
    let mut turn = 0;
    let mut ours = None;
    let mut text = None;
    for event in log {
        match &event.data {
            EventData::TurnStart(t) => turn = t.turn,
            EventData::UserMessage(m) if &m.id == prompt_id && ours.is_none() => ours = Some(turn),
            EventData::AssistantMessage(a) if Some(a.turn) == ours => {
                let t = a.message.text();
                if !t.is_empty() {
                    text = Some(t);
                }
            }
            EventData::TurnEnd(end) if Some(end.turn) == ours => {
                return Outcome {
                    end: Some((end.turn, end.reason.clone())),
                    text,
                };
            }
            _ => {}
        }
    }
    Outcome { end: None, text }
}

/// Runs `dsh run`.
///
/// # Errors
/// A `CliError` when the agent cannot start or fails; turn outcomes are exit codes, not errors.
pub async fn run(args: RunArgs, config: Config) -> Result<ExitCode, CliError> {
    if args.prompt.trim().is_empty() {
        return Err(CliError::Usage("the prompt is empty".into()));
    }
    // Install the handlers first, so a signal during start-up cannot kill the process mid-write.
    let mut sigint = signal(SignalKind::interrupt())
        .map_err(|e| CliError::Failed(format!("cannot handle SIGINT: {e}")))?;
    let mut sigterm = signal(SignalKind::terminate())
        .map_err(|e| CliError::Failed(format!("cannot handle SIGTERM: {e}")))?;
    let agent = live::start(&config, &args.agent).await?;
    if agent.minted {
        eprintln!("session: {}", agent.id());
    }
    let result = drive(&agent, &args.prompt, &mut sigint, &mut sigterm).await;
    let stopped = agent.stop().await;
    let outcome = result?;
    stopped?;
    report(outcome)
}

async fn drive(
    agent: &LiveAgent,
    prompt: &str,
    sigint: &mut tokio::signal::unix::Signal,
    sigterm: &mut tokio::signal::unix::Signal,
) -> Result<Outcome, CliError> {
    let failed = |e: dsh_actors::InputError| CliError::Failed(e.to_string());
    let prompt_id = MessageId::mint();
    agent
        .handle
        .followup(Message::user_text(prompt_id.clone(), prompt))
        .await
        .map_err(failed)?;
    let idle = agent.handle.when_idle();
    tokio::pin!(idle);
    loop {
        tokio::select! {
            done = &mut idle => {
                done.map_err(failed)?;
                break;
            }
            _ = sigint.recv() => agent.handle.cancel(CancelCause::User, false).await.map_err(failed)?,
            _ = sigterm.recv() => agent.handle.cancel(CancelCause::User, false).await.map_err(failed)?,
        }
    }
    let log = agent.handle.log().await.map_err(failed)?;
    Ok(outcome(&log, &prompt_id))
}

/// The exit status for a turn that ended `reason` (SPEC §10), and the line for stderr, if any.
pub(crate) fn verdict(reason: Option<&TurnEndReason>) -> (u8, Option<String>) {
    match reason {
        None => (
            EXIT_ABORTED,
            Some("dsh: cancelled before a turn took the prompt".into()),
        ),
        Some(TurnEndReason::Completed) => (0, None),
        Some(TurnEndReason::MaxTokens) => (
            0,
            Some("dsh: warning: the reply hit the max-tokens limit and may be cut short".into()),
        ),
        Some(TurnEndReason::Error { error }) => (
            EXIT_ERROR,
            Some(format!(
                "dsh: the turn failed: {} {}",
                echo(&error.code),
                echo(&error.message)
            )),
        ),
        Some(TurnEndReason::Blocked) => (
            EXIT_BLOCKED,
            Some("dsh: the turn was blocked: a hook refused the step".into()),
        ),
        Some(reason @ (TurnEndReason::Aborted { .. } | TurnEndReason::Interrupted)) => (
            EXIT_ABORTED,
            Some(format!(
                "dsh: the turn ended {}",
                turn_end_note(reason).unwrap_or_default()
            )),
        ),
    }
}

/// Prints the answer (stdout) and the verdict line (stderr) and returns the exit status.
///
/// # Errors
/// A failed write or flush of the answer: `CliError::OutputClosed` for a closed pipe (a quiet
/// exit), else `CliError::Failed` (`dsh run … > /dev/full` must not exit 0).
fn report(outcome: Outcome) -> Result<ExitCode, CliError> {
    let reason = outcome.end.as_ref().map(|(_, r)| r);
    let (code, line) = verdict(reason);
    if code == 0
        && let Some(t) = &outcome.text
    {
        write_answer(&mut std::io::stdout().lock(), t)
            .map_err(|e| CliError::output("writing the answer", e))?;
    }
    if let Some(line) = line {
        eprintln!("{line}");
    }
    Ok(ExitCode::from(code))
}

/// Writes the answer and a final newline if it has none, then flushes.
fn write_answer(out: &mut impl Write, text: &str) -> std::io::Result<()> {
    out.write_all(text.as_bytes())?;
    if !text.ends_with('\n') {
        out.write_all(b"\n")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsh::SessionId;
    use dsh::llm::types::{ContentBlock, MessageSource, Role};
    use dsh::session::event::{AssistantMessageEvent, TurnEnd, TurnStart};
    use dsh::session::log::{EventDraft, Session};
    use std::sync::Arc;

    fn assistant(turn: u64, text: &str) -> EventData {
        EventData::AssistantMessage(Box::new(AssistantMessageEvent {
            turn,
            step: 1,
            message: Arc::new(Message {
                id: MessageId::mint(),
                role: Role::Assistant,
                content: vec![ContentBlock::text(text)],
                source: MessageSource::model("script", "m"),
            }),
            usage: None,
            interrupted: None,
        }))
    }

    #[test]
    fn outcome_reads_the_turn_that_claimed_the_prompt() {
        let prompt = MessageId::new("p1").expect("valid id");
        let mut s = Session::new(SessionId::new("s").expect("valid id"));
        let mut push = |d: EventData| {
            let draft = if d.message().is_some() {
                EventDraft::append(d, None)
            } else {
                EventDraft::log(d)
            };
            s.append(draft, 0).map(|_| ()).expect("valid event");
        };
        push(EventData::TurnStart(TurnStart { turn: 1 }));
        push(EventData::UserMessage(Arc::new(Message::user_text(
            MessageId::new("other").expect("valid id"),
            "earlier",
        ))));
        push(assistant(1, "not ours"));
        push(EventData::TurnEnd(Box::new(TurnEnd {
            turn: 1,
            reason: TurnEndReason::Completed,
        })));
        push(EventData::TurnStart(TurnStart { turn: 2 }));
        push(EventData::UserMessage(Arc::new(Message::user_text(
            prompt.clone(),
            "hi",
        ))));
        push(assistant(2, "first"));
        push(assistant(2, ""));
        push(assistant(2, "final"));
        push(EventData::TurnEnd(Box::new(TurnEnd {
            turn: 2,
            reason: TurnEndReason::MaxTokens,
        })));
        let got = outcome(s.events(), &prompt);
        assert_eq!(
            got,
            Outcome {
                end: Some((2, TurnEndReason::MaxTokens)),
                text: Some("final".into())
            }
        );
        let missing = outcome(s.events(), &MessageId::new("nope").expect("valid id"));
        assert_eq!(
            missing,
            Outcome {
                end: None,
                text: None
            }
        );
    }

    #[test]
    fn each_turn_end_has_its_exit_status() {
        use dsh::llm::types::LlmFailure;
        let codes: Vec<u8> = [
            Some(TurnEndReason::Completed),
            Some(TurnEndReason::MaxTokens),
            Some(TurnEndReason::Error {
                error: LlmFailure::new("AUTH", "bad key"),
            }),
            Some(TurnEndReason::Aborted {
                reason: CancelCause::User,
            }),
            Some(TurnEndReason::Blocked),
            Some(TurnEndReason::Interrupted),
            None,
        ]
        .iter()
        .map(|r| verdict(r.as_ref()).0)
        .collect();
        assert_eq!(codes, [0, 0, 2, 3, 4, 3, 3]);
        assert_eq!(
            verdict(Some(&TurnEndReason::Error {
                error: LlmFailure::new("AUTH", "bad key")
            }))
            .1
            .as_deref(),
            Some("dsh: the turn failed: AUTH bad key")
        );
    }
}
