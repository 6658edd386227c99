//! `dsh sessions`: the stored sessions as a table (id, events, last activity, first prompt), or as
//! JSON lines with `--json`. Reads only; without a store it lists nothing.

use std::io::Write;
use std::process::ExitCode;

use dsh::session::event::EventData;
use serde_json::json;

use crate::render::{snippet, utc};
use crate::stored::{close, inspect_stored, open_existing};
use crate::{CliError, Config, SessionsArgs};

/// Characters of the first prompt shown in the table.
const PROMPT_SHOWN_MAX: usize = 50;

/// Runs `dsh sessions`.
///
/// # Errors
/// `CliError::Failed` when the store cannot be opened or listed.
pub async fn run(args: SessionsArgs, config: Config) -> Result<ExitCode, CliError> {
    let Some(store) = open_existing(&config)? else {
        if !args.json {
            eprintln!("no sessions in {}", config.data_dir.display());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let rows = rows(&store).await;
    close(store).await?;
    let rows = rows?;
    let mut out = std::io::stdout().lock();
    let write_err = |e: std::io::Error| CliError::output("writing the list", e);
    if args.json {
        for r in &rows {
            let line = json!({
                "id": r.id,
                "events": r.n_events,
                "created_at": r.created_at,
                "last_time": r.last_time,
                "first_prompt": r.first_prompt,
            });
            writeln!(out, "{line}").map_err(write_err)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        eprintln!("no sessions in {}", config.data_dir.display());
        return Ok(ExitCode::SUCCESS);
    }
    let id_width = rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
    writeln!(
        out,
        "{:<id_width$}  {:>7}  {:<19}  FIRST PROMPT",
        "ID", "EVENTS", "LAST ACTIVITY (UTC)"
    )
    .map_err(write_err)?;
    for r in &rows {
        let prompt = match &r.first_prompt {
            Some(p) => snippet(p, PROMPT_SHOWN_MAX),
            None => r.problem.clone().unwrap_or_default(),
        };
        writeln!(
            out,
            "{:<id_width$}  {:>7}  {:<19}  {prompt}",
            r.id,
            r.n_events,
            r.last_time.map(utc).unwrap_or_default(),
        )
        .map_err(write_err)?;
    }
    Ok(ExitCode::SUCCESS)
}

struct Row {
    id: String,
    n_events: u64,
    created_at: u64,
    last_time: Option<i64>,
    first_prompt: Option<String>,
    /// Why the first prompt could not be read.
    problem: Option<String>,
}

async fn rows(store: &dsh::session::store::sqlite::SqliteStore) -> Result<Vec<Row>, CliError> {
    use dsh::session::store::SessionStore;
    let summaries = store
        .list()
        .await
        .map_err(|e| CliError::Failed(format!("listing sessions: {e}")))?;
    let mut rows = Vec::with_capacity(summaries.len());
    for s in summaries {
        let (first_prompt, problem) = match inspect_stored(store, &s.header.id).await {
            Ok(inspected) => (
                inspected.events.iter().find_map(|e| match &e.data {
                    EventData::UserMessage(m) => Some(m.text()),
                    _ => None,
                }),
                None,
            ),
            Err(e) => (None, Some(format!("({e})"))),
        };
        rows.push(Row {
            id: s.header.id.to_string(),
            n_events: s.n_events,
            created_at: s.header.created_at,
            last_time: s.last_time,
            first_prompt,
            problem,
        });
    }
    Ok(rows)
}
