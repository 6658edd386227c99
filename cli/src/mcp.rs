//! `dsh mcp list`: each configured MCP server (SPEC §16), its state and its tools, as text or
//! (`--json`) one JSON array.
//!
//! It starts every server as `chat` would (one process or connection each), lists, and stops
//! them. The exit status is 0 when every server came up and 1 when one did not, so a script can
//! check a configuration with it.

use std::io::Write;
use std::process::ExitCode;

use dsh_mcp::{McpServers, ServerState, ServerStatus, Transport};
use serde_json::json;

use crate::text::visible;
use crate::{CliError, Config, McpArgs, McpCommand};

/// The most characters of a tool's description shown in the text listing.
const DESCRIPTION_CHARS_MAX: usize = 100;

/// Runs `dsh mcp ...`.
///
/// # Errors
/// `CliError::OutputClosed` or `Failed` when stdout cannot be written.
pub async fn run(args: McpArgs, config: Config) -> Result<ExitCode, CliError> {
    let McpCommand::List { json } = args.command;
    if config.mcp_servers.is_empty() && !json {
        println!("no MCP servers configured (add [mcp_servers.NAME] to dsh.toml)");
        return Ok(ExitCode::SUCCESS);
    }
    let mcp = McpServers::start(config.mcp_servers.clone()).await;
    let statuses = mcp.statuses();
    mcp.shutdown().await;
    let text = if json {
        let all: Vec<_> = statuses
            .iter()
            .zip(&config.mcp_servers)
            .map(|(s, c)| status_json(s, &c.transport))
            .collect();
        format!("{}\n", serde_json::Value::Array(all))
    } else {
        statuses
            .iter()
            .zip(&config.mcp_servers)
            .map(|(s, c)| status_text(s, &c.transport))
            .collect()
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| CliError::output("writing the list", e))?;
    let all_up = statuses.iter().all(|s| s.state == ServerState::Ready);
    Ok(if all_up {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn transport_name(t: &Transport) -> &'static str {
    match t {
        Transport::Stdio { .. } => "stdio",
        Transport::Http { .. } => "http",
    }
}

/// `NAME (stdio): ready, N tools` and one line per tool, or `NAME (stdio): down: reason`.
fn status_text(s: &ServerStatus, transport: &Transport) -> String {
    let kind = transport_name(transport);
    let mut out = match &s.state {
        ServerState::Ready => format!("{} ({kind}): ready, {} tools\n", s.name, s.tools.len()),
        ServerState::Down { error } => format!("{} ({kind}): down: {}\n", s.name, visible(error)),
        ServerState::NotStarted => format!("{} ({kind}): not started\n", s.name),
        ServerState::Stopped => format!("{} ({kind}): stopped\n", s.name),
    };
    for tool in &s.tools {
        let description: String = tool
            .description
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(DESCRIPTION_CHARS_MAX)
            .collect();
        out.push_str(&format!(
            "  {}__{}  {}  {}\n",
            s.name,
            visible(&tool.name),
            if tool.read_only {
                "read-only"
            } else {
                "exclusive"
            },
            visible(&description)
        ));
    }
    out
}

/// `{name, transport, state, error?, tools: [{name, description, read_only, input_schema}]}`.
fn status_json(s: &ServerStatus, transport: &Transport) -> serde_json::Value {
    let (state, error) = match &s.state {
        ServerState::Ready => ("ready", None),
        ServerState::Down { error } => ("down", Some(error.clone())),
        ServerState::NotStarted => ("not-started", None),
        ServerState::Stopped => ("stopped", None),
    };
    let tools: Vec<_> = s
        .tools
        .iter()
        .map(|t| {
            json!({
                "name": format!("{}__{}", s.name, t.name),
                "description": t.description,
                "read_only": t.read_only,
                "input_schema": t.input_schema,
            })
        })
        .collect();
    let mut v = json!({"name": s.name, "transport": transport_name(transport), "state": state, "tools": tools});
    if let Some(error) = error {
        v["error"] = json!(error);
    }
    v
}
