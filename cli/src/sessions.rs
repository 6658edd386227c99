//! `dsh sessions`: the stored sessions as a table (id, events, last activity, first prompt), or as
//! JSON lines with `--json`. Reads only; without a store it lists nothing.
//!
//! A session that cannot be read (a damaged page, a damaged row, an invalid header) does not hide the
//! others: every readable session is listed, each damaged one is named on stderr, and the exit status
//! is 1 when there was any.

use std::io::Write;
use std::process::ExitCode;

use dsh::session::event::EventData;
use serde_json::json;

use crate::render::{snippet, utc};
use crate::stored::{close, inspect_stored, open_existing};
use crate::{CliError, Config, SessionsArgs};

/// Characters of the first prompt shown in the table.
const PROMPT_SHOWN_MAX: usize = 50;

/// Runs `dsh sessions`: exit 0 when every session was read, 1 when some were damaged (they are
/// named on stderr, the rest are listed).
///
/// # Errors
/// `CliError::Failed` when the store cannot be opened or its session table cannot be read at all.
pub async fn run(args: SessionsArgs, config: Config) -> Result<ExitCode, CliError> {
    let Some(store) = open_existing(&config).await? else {
        if !args.json {
            eprintln!("no sessions in {}", config.data_dir.display());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let listed = rows(&store).await;
    close(store).await?;
    let (rows, damaged) = listed?;
    write(&args, &config, &rows, damaged.is_empty())?;
    if damaged.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for (id, reason) in &damaged {
        eprintln!("dsh: session {id} cannot be read: {reason}");
    }
    eprintln!(
        "dsh: {} damaged session{} not listed",
        damaged.len(),
        if damaged.len() == 1 { "" } else { "s" }
    );
    Ok(ExitCode::FAILURE)
}

/// Writes the readable sessions to stdout, as a table or as JSON lines; says on stderr that there
/// are none when the store holds none at all (`all_read`: no session was damaged).
fn write(
    args: &SessionsArgs,
    config: &Config,
    rows: &[Row],
    all_read: bool,
) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let write_err = |e: std::io::Error| CliError::output("writing the list", e);
    if args.json {
        for r in rows {
            let line = json!({
                "id": r.id,
                "events": r.n_events,
                "created_at": r.created_at,
                "last_time": r.last_time,
                "first_prompt": r.first_prompt,
            });
            writeln!(out, "{line}").map_err(write_err)?;
        }
        return Ok(());
    }
    if rows.is_empty() {
        if all_read {
            eprintln!("no sessions in {}", config.data_dir.display());
        }
        return Ok(());
    }
    let id_width = rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
    writeln!(
        out,
        "{:<id_width$}  {:>7}  {:<19}  FIRST PROMPT",
        "ID", "EVENTS", "LAST ACTIVITY (UTC)"
    )
    .map_err(write_err)?;
    for r in rows {
        let prompt = r
            .first_prompt
            .as_deref()
            .map(|p| snippet(p, PROMPT_SHOWN_MAX))
            .unwrap_or_default();
        writeln!(
            out,
            "{:<id_width$}  {:>7}  {:<19}  {prompt}",
            r.id,
            r.n_events,
            r.last_time.map(utc).unwrap_or_default(),
        )
        .map_err(write_err)?;
    }
    Ok(())
}

/// One readable session, as listed.
struct Row {
    id: String,
    n_events: u64,
    created_at: u64,
    last_time: Option<i64>,
    first_prompt: Option<String>,
}

/// The readable sessions, and the damaged ones (id, why) — those the survey could not read and those
/// whose log does not scan.
async fn rows(
    store: &crate::stored::Opened,
) -> Result<(Vec<Row>, Vec<(String, String)>), CliError> {
    let survey = store
        .survey()
        .await
        .map_err(|e| CliError::Failed(format!("listing sessions: {e}")))?;
    let mut damaged: Vec<(String, String)> = survey
        .damaged
        .into_iter()
        .map(|d| (d.id, d.reason))
        .collect();
    let mut rows = Vec::with_capacity(survey.sessions.len());
    for s in survey.sessions {
        let inspected = match inspect_stored(store.store(), &s.header.id).await {
            Ok(inspected) => inspected,
            Err(e) => {
                damaged.push((s.header.id.to_string(), e.to_string()));
                continue;
            }
        };
        rows.push(Row {
            id: s.header.id.to_string(),
            n_events: s.n_events,
            created_at: s.header.created_at,
            last_time: s.last_time,
            first_prompt: inspected.events.iter().find_map(|e| match &e.data {
                EventData::UserMessage(m) => Some(m.text()),
                _ => None,
            }),
        });
    }
    Ok((rows, damaged))
}
