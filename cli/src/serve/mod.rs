//! `dsh serve`: a host behind the HTTP API of SPEC §13, for programs that drive many agents.
//!
//! Start-up checks everything a user can get wrong before anything is written: the listen address,
//! the token (a non-loopback address without one is refused), the store URL (`sqlite:DIR` or the
//! data directory, or `postgres://…` for one of several nodes on one database, SPEC §14:
//! `cluster.rs`) and the provider. Then it
//! opens the store, starts the host, binds, and prints `dsh serve: listening on http://ADDR` on
//! stderr.
//!
//! SIGTERM or SIGINT drains: new input gets 503, running turns may finish for `--drain-timeout`,
//! then the host stops (turns still running end `aborted`), event streams end, the store closes
//! and the process exits 0.

pub mod applied;
pub mod auth;
pub mod body;
pub mod cluster;
pub mod error;
pub mod events;
pub mod input;
pub mod metered;
pub mod metrics;
pub mod openapi;
pub mod page;
pub mod router;
pub mod sessions;
pub mod state;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Args;
use dsh::hooks::Hooks;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::retry::RetryHook;
use dsh::session::store::SessionStore;
use dsh_actors::Host;

use crate::config::StoreUrl;
use crate::live::build_provider;
use crate::tools::{ShellConfig, builtin};
use crate::{CliError, Config};
use metered::MeteredStore;
use metrics::ServerMetrics;
use state::{AgentDefaults, AppState, ServerSettings};

/// The default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";

/// Flags of `dsh serve` (beyond the global ones).
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_LISTEN)]
    pub listen: String,
    /// Store: `sqlite:DIR` (default: the data directory) or `postgres://…` (several nodes on one
    /// database, SPEC §14; `DSH_NODE_ID` names this node, `DSH_LEASE_TTL_MS` sets the lease period,
    /// default 10,000).
    #[arg(long, env = "DSH_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// File whose first line is the bearer token every /v1 request must carry (else `DSH_TOKEN`).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Seconds running turns may finish after SIGTERM/SIGINT before they are cancelled.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub drain_timeout: u64,
    /// Milliseconds between keep-alive comments on idle event streams.
    #[arg(long, value_name = "MS", default_value_t = 15_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_alive_ms: u64,
    /// The most event streams open at once; past it a new one gets 503 with `Retry-After`.
    #[arg(long, value_name = "N", default_value_t = events::DEFAULT_MAX_STREAMS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_streams: usize,
    /// Allow the model to run shell commands (off by default).
    #[arg(long)]
    pub shell: bool,
    /// Pin the agents to this many threads of the host's own, each a single-threaded runtime (an
    /// agent's actor and children then never change thread; `HostConfig::agent_threads`). 0 (the
    /// default): the agents run on the server's multi-threaded runtime, as any task.
    #[arg(long, value_name = "N", default_value_t = 0,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=256))]
    pub agent_threads: usize,
}

/// The store named by `--store` (`sqlite:DIR` or `postgres://…`), or the data directory.
///
/// # Errors
/// `CliError::Usage` for an unknown scheme.
pub fn store_url(store: Option<&str>, config: &Config) -> Result<StoreUrl, CliError> {
    StoreUrl::parse(store, &config.data_dir)
}

/// The listen address, refusing a non-loopback one without a token.
///
/// # Errors
/// `CliError::Usage` for an unparsable address or an unprotected public one.
pub fn listen_addr(listen: &str, has_token: bool) -> Result<SocketAddr, CliError> {
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| CliError::Usage(format!("--listen {listen}: {e} (expected IP:PORT)")))?;
    if !addr.ip().is_loopback() && !has_token {
        return Err(CliError::Usage(format!(
            "refusing to listen on non-loopback {addr} without a token: set --token-file or DSH_TOKEN"
        )));
    }
    Ok(addr)
}

/// Runs `dsh serve` until a signal drains it.
///
/// # Errors
/// A one-line `CliError` for bad flags (nothing written), or a store, host or socket failure.
pub async fn run(args: ServeArgs, config: Config) -> Result<ExitCode, CliError> {
    let token = auth::load_token(args.token_file.as_deref()).map_err(CliError::Usage)?;
    let addr = listen_addr(&args.listen, token.is_some())?;
    store_url(args.store.as_deref(), &config)?;
    if config.provider_name() == "script" {
        return Err(CliError::Usage(
            "dsh serve runs the sim or openai provider, not script".into(),
        ));
    }
    let built = build_provider(&config, None)?;
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::Failed(format!("cannot read the working directory: {e}")))?;
    let shell = (args.shell || config.shell).then(ShellConfig::default);
    let tools = builtin(&cwd, shell).map_err(|e| CliError::Failed(e.to_string()))?;
    // The configured MCP servers: one process or connection each, shared by every agent.
    let mcp = crate::live::start_mcp(&config).await;
    let tools = tools.layered(&mcp.tools());
    let defaults = AgentDefaults {
        provider: built.provider.name().to_string(),
        model: built.model.clone(),
        max_tokens: config.max_tokens,
        system: config.system.clone(),
        cwd: Some(cwd.display().to_string()),
    };
    let mut providers = ProviderRegistry::new();
    providers.register(built.provider);
    let mut hooks = Hooks::new();
    hooks.request_error.push(Arc::new(RetryHook::new()));
    let store = crate::stored::open(&Config {
        store: args.store.clone(),
        ..config.clone()
    })
    .await?;
    let metrics = Arc::new(ServerMetrics::new());
    let metered = MeteredStore::new(store.shared(), metrics.store.clone());
    let host = Host::builder(Arc::new(metered) as Arc<dyn SessionStore>)
        .providers(providers)
        .tools(tools)
        .hooks(hooks)
        .config(dsh_actors::HostConfig {
            agent_threads: args.agent_threads,
            ..dsh_actors::HostConfig::default()
        })
        .start()
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    let settings = ServerSettings {
        keep_alive: Duration::from_millis(args.keep_alive_ms),
        drain_timeout: Duration::from_secs(args.drain_timeout),
        max_streams: args.max_streams,
    };
    let state = AppState::new(host, store.clone(), defaults, token, settings, metrics);
    // Several nodes on one database: apply input other nodes took for sessions hosted here, and
    // take over sessions with pending input whose host is gone (SPEC §14).
    let inbox = cluster::start(&state);
    let served = serve(state, addr).await;
    if let Some(inbox) = inbox {
        inbox.abort();
    }
    mcp.shutdown().await;
    let closed = store
        .close()
        .await
        .map_err(|e| CliError::Failed(format!("closing the store: {e}")));
    served?;
    closed?;
    eprintln!("dsh serve: drained, store closed");
    Ok(ExitCode::SUCCESS)
}

/// Binds, serves until drained, and stops the host.
async fn serve(state: AppState, addr: SocketAddr) -> Result<(), CliError> {
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            state.host().shutdown().await;
            return Err(CliError::Failed(format!("cannot listen on {addr}: {e}")));
        }
    };
    let local = listener
        .local_addr()
        .map_err(|e| CliError::Failed(format!("cannot read the bound address: {e}")))?;
    eprintln!("dsh serve: listening on http://{local}");
    tracing::info!(%local, "listening");
    let app = router::router(state.clone());
    let result = axum::serve(router::no_delay(listener), app)
        .with_graceful_shutdown(drain_on_signal(state.clone()))
        .await
        .map_err(|e| CliError::Failed(format!("serving: {e}")));
    // Already stopped by the drain unless serving failed; stopping twice is harmless.
    state.host().shutdown().await;
    result
}

/// Waits for SIGTERM or SIGINT, then drains: new input is refused, running turns get the drain
/// timeout, the host stops and event streams end. Resolves when the server may close.
async fn drain_on_signal(state: AppState) {
    wait_for_signal().await;
    // Refuse first, then say so: a client that reads the line must find new input refused.
    state.inner.draining.store(true, Ordering::Release);
    eprintln!("dsh serve: draining");
    let timeout = state.inner.settings.drain_timeout;
    let host = state.host().clone();
    let waits = host
        .list()
        .into_iter()
        .filter_map(|id| host.get(&id))
        .map(|h| async move { h.when_idle_for(timeout).await });
    futures::future::join_all(waits).await;
    host.shutdown().await;
    state.inner.streams_end.cancel();
}

/// Resolves on the first SIGTERM or SIGINT (only SIGINT where SIGTERM cannot be watched).
async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT drains");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
