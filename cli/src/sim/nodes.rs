//! `dsh sim --nodes N`: the same workload on 1, 2, …, N processes at once on one PostgreSQL
//! database (SPEC §14), each process a `dsh sim` of its own with its own agents (`--node-tag`
//! names its sessions `sim-TAG-…`), reporting turns/s for each count of processes.
//!
//! For each count k, k children run at once with the parent's flags and `--json`; a count's
//! turns/s is the sum of its children's turns over the longest child's run. Only the one-process
//! count measures the database's own ceiling (`--ceiling-ms`), so its events/s is set against a
//! ceiling of the same run. Every child deletes its own sessions at the end unless `--keep-store`.

use std::io::Write;
use std::process::{ExitCode, Stdio};

use serde::Serialize;
use serde_json::Value;

use super::SimError;
use super::plan::{SimPlan, StoreChoice};
use crate::{CliError, SimArgs};

/// One count of processes.
#[derive(Debug, Serialize)]
struct NodesRow {
    /// Processes running at once.
    nodes: usize,
    /// Turns all of them completed.
    turns: u64,
    /// The longest process's run (first input to last agent idle), in ms.
    duration_ms: f64,
    /// `turns` per second of `duration_ms`.
    turns_per_sec: f64,
    /// Durable events per second, summed over the processes.
    events_per_sec: f64,
    /// Each process's own turns/s.
    per_node_turns_per_sec: Vec<f64>,
}

/// The report of a `--nodes` run.
#[derive(Debug, Serialize)]
struct NodesReport {
    /// Agents per process.
    agents_per_node: usize,
    /// Turns per agent.
    turns_per_agent: usize,
    /// One row per count of processes, 1 to N.
    rows: Vec<NodesRow>,
    /// The database's own ceiling measured by the one-process count (`store_ceiling` of its
    /// report), when measured.
    store_ceiling: Option<Value>,
    /// The one-process count's events/s over that ceiling.
    store_ceiling_ratio: Option<f64>,
}

/// The child's flags: the parent's workload with `--json`, a tag and a seed of its own.
fn child_args(args: &SimArgs, tag: &str, seed: u64, ceiling_ms: u64) -> Vec<String> {
    let mut v: Vec<String> = [
        "sim",
        "--json",
        "--agents",
        &args.agents.to_string(),
        "--turns",
        &args.turns.to_string(),
        "--store",
        &args.store,
        "--latency-ms",
        &args.latency_ms.to_string(),
        "--tokens-per-sec",
        &args.tokens_per_sec.to_string(),
        "--reply-tokens",
        &args.reply_tokens.to_string(),
        "--tool-rate",
        &args.tool_rate.to_string(),
        "--tool-ms",
        &args.tool_ms.to_string(),
        "--steer-rate",
        &args.steer_rate.to_string(),
        "--cancel-rate",
        &args.cancel_rate.to_string(),
        "--seed",
        &seed.to_string(),
        "--hibernate-ms",
        &args.hibernate_ms.to_string(),
        "--ceiling-ms",
        &ceiling_ms.to_string(),
        "--observe-agents",
        &args.observe_agents.to_string(),
        "--ramp-ms",
        &args.ramp_ms.to_string(),
        "--agent-threads",
        &args.agent_threads.to_string(),
        "--node-tag",
        tag,
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect();
    if let Some(window) = args.context_window {
        v.push("--context-window".to_string());
        v.push(window.to_string());
    }
    if args.keep_store {
        v.push("--keep-store".to_string());
    }
    v
}

/// Runs k children at once and collects their JSON reports.
async fn run_count(args: &SimArgs, k: usize) -> Result<Vec<Value>, SimError> {
    let exe = std::env::current_exe()
        .map_err(|e| SimError::Task(format!("cannot find the dsh binary: {e}")))?;
    let mut children = Vec::with_capacity(k);
    for i in 0..k {
        let tag = format!("k{k}n{i}");
        let ceiling_ms = if k == 1 { args.ceiling_ms } else { 0 };
        let child = tokio::process::Command::new(&exe)
            .args(child_args(
                args,
                &tag,
                args.seed.wrapping_add(i as u64),
                ceiling_ms,
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SimError::Task(format!("cannot start node {tag}: {e}")))?;
        children.push((tag, child));
    }
    let mut reports = Vec::with_capacity(k);
    for (tag, child) in children {
        let output = child
            .wait_with_output()
            .await
            .map_err(|e| SimError::Task(format!("node {tag}: {e}")))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let last = stderr.lines().last().unwrap_or("").trim().to_string();
            return Err(SimError::Task(format!(
                "node {tag} failed ({}): {last}",
                output.status
            )));
        }
        let report: Value = serde_json::from_slice(&output.stdout)
            .map_err(|e| SimError::Task(format!("node {tag}: its report is not JSON: {e}")))?;
        reports.push(report);
    }
    Ok(reports)
}

fn row_of(k: usize, reports: &[Value]) -> NodesRow {
    let f = |r: &Value, key: &str| r[key].as_f64().unwrap_or(0.0);
    let turns: u64 = reports
        .iter()
        .map(|r| r["turns"].as_u64().unwrap_or(0))
        .sum();
    let duration_ms = reports
        .iter()
        .map(|r| f(r, "duration_ms"))
        .fold(0.0, f64::max);
    NodesRow {
        nodes: k,
        turns,
        duration_ms,
        turns_per_sec: if duration_ms > 0.0 {
            turns as f64 * 1000.0 / duration_ms
        } else {
            0.0
        },
        events_per_sec: reports.iter().map(|r| f(r, "events_per_sec")).sum(),
        per_node_turns_per_sec: reports.iter().map(|r| f(r, "turns_per_sec")).collect(),
    }
}

/// Runs `dsh sim --nodes N`. See the module docs.
///
/// # Errors
/// `CliError::Usage` unless the store is PostgreSQL; `CliError::Failed` when a child fails or the
/// report cannot be written.
pub(super) async fn run(
    args: &SimArgs,
    plan: &SimPlan,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, CliError> {
    if plan.store != StoreChoice::Postgres {
        return Err(CliError::Usage(
            "--nodes needs --store postgres://… (several processes on one database)".to_string(),
        ));
    }
    if plan.node_tag.is_some() {
        return Err(CliError::Usage(
            "--nodes and --node-tag do not go together".to_string(),
        ));
    }
    let mut rows = Vec::with_capacity(args.nodes);
    let mut store_ceiling = None;
    let mut store_ceiling_ratio = None;
    for k in 1..=args.nodes {
        let reports = run_count(args, k).await?;
        if k == 1 {
            store_ceiling = reports[0]
                .get("store_ceiling")
                .filter(|c| !c.is_null())
                .cloned();
            store_ceiling_ratio = reports[0]["store_ceiling_ratio"].as_f64();
        }
        rows.push(row_of(k, &reports));
    }
    let report = NodesReport {
        agents_per_node: plan.agents,
        turns_per_agent: plan.turns_per_agent,
        rows,
        store_ceiling,
        store_ceiling_ratio,
    };
    let written = if args.json {
        serde_json::to_writer(&mut *out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        render(&report, out)
    };
    written
        .and_then(|()| out.flush())
        .map_err(|e| CliError::output("cannot write the report", e))?;
    Ok(ExitCode::SUCCESS)
}

fn render(report: &NodesReport, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "dsh sim --nodes {}: {} agents x {} turns per process, store postgres",
        report.rows.len(),
        report.agents_per_node,
        report.turns_per_agent
    )?;
    for row in &report.rows {
        let per: Vec<String> = row
            .per_node_turns_per_sec
            .iter()
            .map(|t| format!("{t:.0}"))
            .collect();
        writeln!(
            out,
            "  {} node{:<2} {:>10} turns in {:.3} s  {:>10.0} turns/s  {:>10.0} events/s  (per process: {})",
            row.nodes,
            if row.nodes == 1 { "" } else { "s" },
            row.turns,
            row.duration_ms / 1000.0,
            row.turns_per_sec,
            row.events_per_sec,
            per.join(", ")
        )?;
    }
    if let (Some(ceiling), Some(ratio)) = (&report.store_ceiling, report.store_ceiling_ratio) {
        writeln!(
            out,
            "  database ceiling {:>10.0} events/s (measured by the one-process run); that run reached {:.0} %",
            ceiling["events_per_sec"].as_f64().unwrap_or(0.0),
            ratio * 100.0
        )?;
    }
    Ok(())
}
