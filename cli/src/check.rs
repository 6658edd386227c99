//! `dsh check ID|FILE`: validates a session — it parses, passes the invariant check — and reports
//! what a load would do to it (the repair closers of an open last turn, a torn tail it would cut),
//! writing nothing. Exit 0 when valid (repairs needed or not), 1 with the first problem when not.
//! A stored session with unreadable rows is not valid: the error names every damaged seq (a file of
//! JSON lines keeps the torn-tail rule, which only a file whose last write was cut can need).

use std::io::Write;
use std::process::ExitCode;

use dsh::session::event::{EventData, TurnEndReason};

use crate::stored::inspect_target;
use crate::{CheckArgs, CliError, Config};

/// Runs `dsh check`.
///
/// # Errors
/// `CliError::Failed` with the first problem when the session is invalid or cannot be read.
pub async fn run(args: CheckArgs, config: Config) -> Result<ExitCode, CliError> {
    let inspected = inspect_target(&config, &args.target).await?;
    let n_turns = inspected
        .events
        .iter()
        .filter(|e| matches!(e.data, EventData::TurnStart(_)))
        .count();
    let mut out = std::io::stdout().lock();
    let mut lines = vec![format!(
        "{}: valid, {} events, {} turns",
        inspected.origin,
        inspected.events.len(),
        n_turns
    )];
    if inspected.closers.is_empty() {
        lines.push("repair: nothing to do (every turn is closed)".into());
    } else {
        let shown: Vec<String> = inspected.closers.iter().map(closer_text).collect();
        lines.push(format!(
            "repair: the last turn is open; a load appends {} events: {}",
            inspected.closers.len(),
            shown.join(", ")
        ));
    }
    match &inspected.torn_tail {
        None => lines.push("torn tail: none".into()),
        Some(t) => lines.push(format!("torn tail: {t} (cut on load)")),
    }
    for c in &inspected.conversions {
        lines.push(format!("converted: {c}"));
    }
    for line in lines {
        writeln!(out, "{line}").map_err(|e| CliError::output("writing the report", e))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn closer_text(event: &dsh::session::Event) -> String {
    match &event.data {
        EventData::ToolResult(r) => format!(
            "tool/result ({})",
            r.error.as_ref().map_or("result", |e| e.code.as_str())
        ),
        EventData::TurnEnd(t) if t.reason == TurnEndReason::Interrupted => {
            "turn/end (interrupted)".into()
        }
        other => other.kind().to_string(),
    }
}
