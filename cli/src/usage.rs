//! Argument errors as one line. clap reports a bad command line with its usage block over several
//! lines; `dsh` promises one `dsh: …` line on stderr for every failure (SPEC §10), so the error's
//! first line and clap's tip are kept, the rest is replaced by a hint naming the subcommand's help,
//! and the exit status stays clap's (2). `--help` and `--version` print as clap prints them.

use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};

use crate::text::error_line;

/// Prints `e` (a failed parse of the command line `args`) and returns the exit status: help and
/// version as clap prints them, any argument error as one `dsh:` line with a `see dsh … --help`
/// hint.
pub fn report(e: &clap::Error, args: &[String]) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        // A failed write of help text has nowhere better to go.
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    eprintln!("dsh: {}", one_line(e, args));
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}

/// The one-line form of an argument error: clap's message, its tip if any, and the help hint.
pub fn one_line(e: &clap::Error, args: &[String]) -> String {
    let rendered = e.render().to_string();
    let message = match e.kind() {
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand => {
            "a subcommand is required".to_string()
        }
        ErrorKind::MissingRequiredArgument => {
            let missing = match e.get(ContextKind::InvalidArg) {
                Some(ContextValue::Strings(names)) => names.join(", "),
                _ => String::new(),
            };
            format!("the following required arguments were not provided: {missing}")
        }
        _ => rendered
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("invalid arguments")
            .trim_start_matches("error: ")
            .trim()
            .to_string(),
    };
    let tip = rendered
        .lines()
        .map(str::trim)
        .find_map(|l| l.strip_prefix("tip: "))
        .map(|t| format!("; tip: {t}"))
        .unwrap_or_default();
    format!(
        "{} (see {} --help)",
        error_line(&format!("{message}{tip}")),
        command_path(e, args)
    )
}

/// `dsh` or `dsh SUBCOMMAND`: read from the usage line clap attached to the error, else the first
/// argument that names a subcommand.
fn command_path(e: &clap::Error, args: &[String]) -> String {
    let usage = match e.get(ContextKind::Usage) {
        Some(ContextValue::StyledStr(s)) => s.to_string(),
        _ => String::new(),
    };
    let words: Vec<&str> = usage
        .trim()
        .trim_start_matches("Usage:")
        .split_whitespace()
        .take_while(|w| !w.starts_with(['[', '<', '-']))
        .collect();
    // The first word is the program as invoked; the rest name the subcommand.
    if words.len() > 1 {
        return format!("dsh {}", words[1..].join(" "));
    }
    let command = <crate::Cli as clap::CommandFactory>::command();
    args.iter()
        .skip(1)
        .find(|a| command.find_subcommand(a.as_str()).is_some())
        .map_or_else(|| "dsh".to_string(), |sub| format!("dsh {sub}"))
}
