//! `dsh show ID|FILE`: a session as a readable transcript (`render::transcript`), or with `--raw`
//! its events as JSON lines, exactly as stored. Reads only: an open last turn is shown as it is, and
//! what a load would repair is noted on stderr.

use std::io::Write;
use std::process::ExitCode;

use crate::render::{self, Style};
use crate::stored::inspect_target;
use crate::{CliError, Config, ShowArgs};

/// Runs `dsh show`.
///
/// # Errors
/// `CliError::Failed` when the target is not a readable session.
pub async fn run(args: ShowArgs, config: Config) -> Result<ExitCode, CliError> {
    let inspected = inspect_target(&config, &args.target).await?;
    let write_err = |e: std::io::Error| CliError::output("writing the transcript", e);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.raw {
        for event in &inspected.events {
            out.write_all(event.to_json().as_bytes())
                .map_err(write_err)?;
            out.write_all(b"\n").map_err(write_err)?;
        }
    } else {
        let style = Style::detect(std::io::IsTerminal::is_terminal(&std::io::stdout()));
        render::transcript(&inspected.header, &inspected.events, style, &mut out)
            .map_err(write_err)?;
    }
    out.flush().map_err(write_err)?;
    if !inspected.closers.is_empty() {
        eprintln!(
            "note: the last turn is open (the process stopped mid-turn); loading the session appends {} closing events",
            inspected.closers.len()
        );
    }
    if let Some(torn) = &inspected.torn_tail {
        eprintln!("note: a torn tail is not shown: {torn}");
    }
    Ok(ExitCode::SUCCESS)
}
