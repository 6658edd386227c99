//! `dsh-cli`: the `dsh` command line, its built-in tools and the scenario runner. The library exists
//! for this package's own binary and tests; embedders use `dsh-actors` (the runtime) and `dsh` (the
//! core), which never name this package.
//!
//! The `dsh` subcommands. Names and flags are an interface scripts rely on (SPEC §10): extend them,
//! never rename or drop one.
//!
//! `main` builds a tokio runtime, resolves the configuration (flags over environment over `dsh.toml`
//! over defaults) and dispatches. Every subcommand returns `Result<ExitCode, CliError>`; an error is
//! printed as one line (`dsh: <message>`) and exits 1, unless the subcommand chose another code.

mod chat;
mod check;
mod compact;
pub mod config;
mod live;
mod mcp;
pub mod render;
mod retries;
pub mod run;
pub mod scenario;
pub mod secret;
pub mod serve;
mod sessions;
mod show;
pub mod sim;
pub mod stored;
pub mod text;
pub mod tools;
mod transfer;
pub mod usage;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

pub use config::{CliError, Config};

/// Host many LLM agents in one process: chat, run prompts, inspect sessions, simulate load.
#[derive(Debug, Parser)]
#[command(name = "dsh", version, max_term_width = 100)]
pub struct Cli {
    /// Flags every subcommand accepts.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every subcommand accepts.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Where the store lives (default ./.dsh).
    #[arg(long, global = true, env = "DSH_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Model provider: openai, sim or script.
    #[arg(long, global = true, env = "DSH_PROVIDER", value_name = "NAME")]
    pub provider: Option<String>,
    /// OpenAI-compatible endpoint (default DeepSeek's).
    #[arg(long, global = true, env = "DSH_BASE_URL", value_name = "URL")]
    pub base_url: Option<String>,
    /// Model id.
    #[arg(long, global = true, env = "DSH_MODEL", value_name = "NAME")]
    pub model: Option<String>,
    /// Configuration file (default ./dsh.toml when it exists).
    #[arg(long, global = true, env = "DSH_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The subcommands of `dsh`.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Host N agents against the simulated model and report throughput, latency and memory.
    Sim(SimArgs),
    /// Talk to an agent interactively.
    Chat(ChatArgs),
    /// Run one prompt non-interactively and print the final answer.
    Run(RunArgs),
    /// List stored sessions.
    Sessions(SessionsArgs),
    /// Show a session as a readable transcript (or raw JSON lines).
    Show(ShowArgs),
    /// Validate a session and report what repair would do, writing nothing.
    Check(CheckArgs),
    /// Write a session as DSH v0 JSON lines.
    Export(ExportArgs),
    /// Read a session from DSH v0 JSON lines into the store.
    Import(ImportArgs),
    /// Run scenario files (black-box conformance).
    Scenario(ScenarioArgs),
    /// Model Context Protocol servers (`[mcp_servers.NAME]` in `dsh.toml`).
    Mcp(McpArgs),
    /// Serve the HTTP API and web page of SPEC §13 over a host of agents.
    Serve(serve::ServeArgs),
    /// Compact a stored session's history by hand (SPEC §15): summarise its older messages into a
    /// checkpoint; the log keeps every event.
    Compact(CompactArgs),
}

/// The session and flags of `dsh compact`.
#[derive(Debug, Clone, Args)]
pub struct CompactArgs {
    /// The session id.
    pub id: String,
    /// Answer the summariser from this file (a JSON array of scenario `model` entries) with the
    /// script provider.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
}

/// Flags of `dsh sim`.
#[derive(Debug, Clone, Args)]
pub struct SimArgs {
    /// Number of agents.
    #[arg(long, default_value_t = 1000)]
    pub agents: usize,
    /// Turns per agent.
    #[arg(long, default_value_t = 1)]
    pub turns: usize,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Store: sqlite, memory, or a PostgreSQL URL `postgres://…` (the run's sessions are deleted
    /// afterwards unless `--keep-store`; the database must hold none of an earlier run).
    #[arg(long, default_value = "sqlite")]
    pub store: String,
    /// Model time to first token, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Model tokens per second (0 = as fast as possible).
    #[arg(long, default_value_t = 0)]
    pub tokens_per_sec: u64,
    /// Reply length in tokens.
    #[arg(long, default_value_t = 20)]
    pub reply_tokens: u64,
    /// Probability that a model step calls a tool.
    #[arg(long, default_value_t = 0.0)]
    pub tool_rate: f64,
    /// Tool duration in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub tool_ms: u64,
    /// Probability that a turn receives a steer while it runs.
    #[arg(long, default_value_t = 0.0)]
    pub steer_rate: f64,
    /// Probability that a turn is cancelled while it runs.
    #[arg(long, default_value_t = 0.0)]
    pub cancel_rate: f64,
    /// Seed of the simulated model and the injections.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Idle time after which an agent hibernates, in milliseconds (the report's memory per agent
    /// is measured once all hibernated). A hibernating agent's actor stops (about 25 µs of CPU
    /// each); the default keeps that work after the measured run for runs of up to ~10,000 agents.
    #[arg(long, default_value_t = 1000)]
    pub hibernate_ms: u64,
    /// How long to measure the store's own group-commit ceiling after the run (0 = skip).
    #[arg(long, default_value_t = 1000)]
    pub ceiling_ms: u64,
    /// How long an agent may hold its stream's chunks back from the store so that they join the
    /// next commit that must be durable, in milliseconds (0 = every chunk batch is its own append;
    /// default: the runtime's, 50).
    #[arg(long)]
    pub chunk_linger_ms: Option<u64>,
    /// Keep the run's sqlite store (under the data directory, named sim-*) instead of removing it.
    #[arg(long)]
    pub keep_store: bool,
    /// How many agents (spread evenly) are observed for the step and steer-to-claim latencies.
    #[arg(long, default_value_t = 200)]
    pub observe_agents: usize,
    /// Start each agent after a random delay below this many milliseconds (0 = all at once).
    #[arg(long, default_value_t = 0)]
    pub ramp_ms: u64,
    /// Once every agent hibernated, wake this many of them (a seeded random sample, one after
    /// the other) with one followup each and time the acknowledgement and the whole turn
    /// (`wake_ack_ms`, `wake_turn_ms`; 0 = skip).
    #[arg(long, default_value_t = 0)]
    pub wake_sample: usize,
    /// Give every agent this context window (in estimated tokens) so its history compacts
    /// (SPEC §15); the report counts compactions. Unset: no automatic compaction.
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub context_window: Option<u64>,
    /// Pin the agents to this many threads of the host's own, each a single-threaded runtime (an
    /// agent's actor and children then never change thread; `HostConfig::agent_threads`; `dsh
    /// sim` also runs each agent's driver beside it, `AgentHandle::spawn_beside`). 0: the agents
    /// run on the process's multi-threaded runtime, as any task.
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=256))]
    pub agent_threads: usize,
    /// Several nodes on one PostgreSQL database (SPEC §14): run the same workload on 1, 2, …, N
    /// `dsh sim` processes at once (each with its own agents), and report turns/s for each count.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=8))]
    pub nodes: usize,
    /// Names this process's sessions `sim-TAG-…` (set by `--nodes` for each process it starts).
    #[arg(long, hide = true, value_name = "TAG")]
    pub node_tag: Option<String>,
}

/// The flags of the one agent `dsh chat` and `dsh run` drive: which session, which provider and
/// tools, and what each request asks for, over the configuration's.
#[derive(Debug, Clone, Default, Args)]
pub struct AgentArgs {
    /// Continue this session, or create it under this id.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Allow the model to run shell commands (off by default).
    #[arg(long)]
    pub shell: bool,
    /// Replay this file (a JSON array of scenario `model` entries) with the script provider.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Output cap per model request, in tokens.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens: Option<u64>,
    /// The system prompt.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Give up retrying a failed model request once its retries have taken this long (default
    /// 600000, or `retry_timeout_ms` in dsh.toml).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    pub retry_timeout_ms: Option<u64>,
    /// Only open a stored session (`dsh compact`): a missing one is an error, never created.
    #[arg(skip)]
    pub existing: bool,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// Where a command's sessions are stored.
#[derive(Debug, Clone, Default, Args)]
pub struct StoreArgs {
    /// Store: `sqlite:DIR` (default: the data directory) or `postgres://…` (SPEC §14).
    #[arg(long, env = "DSH_STORE", value_name = "URL")]
    pub store: Option<String>,
}

/// Flags of `dsh chat`.
#[derive(Debug, Clone, Args)]
pub struct ChatArgs {
    /// The agent's flags.
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// The prompt and flags of `dsh run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The prompt.
    pub prompt: String,
    /// The agent's flags.
    #[command(flatten)]
    pub agent: AgentArgs,
}

/// Flags of `dsh sessions`.
#[derive(Debug, Clone, Args)]
pub struct SessionsArgs {
    /// Print JSON lines instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The target and flags of `dsh show`.
#[derive(Debug, Clone, Args)]
pub struct ShowArgs {
    /// A session id, or a file of DSH v0 JSON lines.
    pub target: String,
    /// Print the raw events as JSON lines.
    #[arg(long)]
    pub raw: bool,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The target of `dsh check`.
#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// A session id, or a file of DSH v0 JSON lines.
    pub target: String,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The session and flags of `dsh export`.
#[derive(Debug, Clone, Args)]
pub struct ExportArgs {
    /// The session id.
    pub id: String,
    /// Write to this file instead of stdout.
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Compress with zstd, as the original stores a log (`session.jsonl.zstd`).
    #[arg(long)]
    pub zstd: bool,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// The file and flags of `dsh import`.
#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// A file of DSH v0 JSON lines.
    pub file: PathBuf,
    /// Store it under this id instead of the one in its header.
    #[arg(long, value_name = "ID")]
    pub id: Option<String>,
    /// The store.
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `dsh scenario` and its subcommand.
#[derive(Debug, Clone, Args)]
pub struct ScenarioArgs {
    /// The scenario subcommand.
    #[command(subcommand)]
    pub command: ScenarioCommand,
}

/// The subcommands of `dsh scenario`.
#[derive(Debug, Clone, Subcommand)]
pub enum ScenarioCommand {
    /// Run scenario files and print each resulting log as JSON lines (time fixed to 0).
    Run {
        /// Compare each log with the scenario's `expect` and fail on the first mismatch.
        #[arg(long)]
        check: bool,
        /// Scenario files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

/// Arguments of `dsh mcp`.
#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: McpCommand,
}

/// The `dsh mcp` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum McpCommand {
    /// Start each configured MCP server, print its state and its tools, and stop it again (exit 1
    /// when a server did not come up).
    List {
        /// Print one JSON array instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the parsed command line to completion. `key` is the API key taken from the environment at
/// start-up (`secret::take_api_key`).
pub fn main(cli: Cli, key: secret::StartupKey) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dsh: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let mut config = Config::resolve(&cli.global)?;
        config.api_key = key;
        dispatch(cli.command, config).await
    });
    let code = match result {
        Ok(code) => code,
        Err(CliError::OutputClosed) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dsh: {}", text::error_line(&e.to_string()));
            e.exit_code()
        }
    };
    // A blocking task that never returns (a read of a FIFO) must not keep the process alive:
    // everything durable was closed above, so waiting briefly is enough.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_WAIT);
    code
}

/// How long the process waits at exit for blocking tasks still running.
const RUNTIME_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

async fn dispatch(command: Command, mut config: Config) -> Result<ExitCode, CliError> {
    // The `--store` / `DSH_STORE` of the commands that open a store (`serve` and `sim` have
    // their own).
    config.store = match &command {
        Command::Chat(ChatArgs { agent }) | Command::Run(RunArgs { agent, .. }) => {
            agent.store.store.clone()
        }
        Command::Sessions(SessionsArgs { store, .. })
        | Command::Show(ShowArgs { store, .. })
        | Command::Check(CheckArgs { store, .. })
        | Command::Export(ExportArgs { store, .. })
        | Command::Import(ImportArgs { store, .. }) => store.store.clone(),
        _ => None,
    };
    match command {
        Command::Chat(args) => chat::run(args, config).await,
        Command::Run(args) => run::run(args, config).await,
        Command::Sessions(args) => sessions::run(args, config).await,
        Command::Show(args) => show::run(args, config).await,
        Command::Check(args) => check::run(args, config).await,
        Command::Export(args) => transfer::export_cmd(args, config).await,
        Command::Import(args) => transfer::import_cmd(args, config).await,
        Command::Scenario(ScenarioArgs {
            command: ScenarioCommand::Run { check, files },
        }) => scenario::run_files(check, &files).await,
        Command::Sim(args) => sim::run(&args, &config, &mut std::io::stdout()).await,
        Command::Mcp(args) => mcp::run(args, config).await,
        Command::Serve(args) => serve::run(args, config).await,
        Command::Compact(args) => compact::run(args, config).await,
    }
}
