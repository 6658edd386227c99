//! Starting one live agent for `dsh chat` and `dsh run`: the provider, the built-in tools and the
//! configured MCP servers' tools, the store, the host, and the agent itself (resumed when
//! `--session` names a stored one).
//!
//! Everything that can be refused — the session id, the script file, the provider's key and
//! settings, the working directory — is checked before the store is opened, so a bad invocation
//! writes nothing. The key is never printed: the provider's `Debug` redacts it and no error here
//! includes it.

use std::path::Path;
use std::sync::Arc;

use dsh::SessionId;
use dsh::hooks::Hooks;
use dsh::llm::openai::{self, OpenAiConfig, OpenAiProvider};
use dsh::llm::provider::{Provider, ProviderRegistry};
use dsh::llm::retry::SequenceBound;
use dsh::llm::script::{Gates, ScriptEntry, ScriptProvider};
use dsh::llm::sim::SimProvider;
use dsh::turn::AgentConfig;

use crate::retries::AnnouncedRetries;
use crate::secret::StartupKey;
use crate::tools::{ShellConfig, builtin};
use crate::{AgentArgs, CliError, Config};
use dsh_actors::AgentHandle;
use dsh_actors::{AgentSpec, Host};
use dsh_mcp::{McpServers, ServerState};

/// The largest script file read (a script is test data, never this large in practice).
const SCRIPT_BYTES_MAX: u64 = 64 << 20;

/// A running host with the one agent the command drives.
pub struct LiveAgent {
    /// The host running the agent.
    pub host: Host,
    /// The agent.
    pub handle: AgentHandle,
    /// The script provider's gates (`/open` in chat), when the script provider is in use.
    pub gates: Option<Gates>,
    /// Whether the session id was minted by this command (then it is printed).
    pub minted: bool,
    /// The provider's route name.
    pub provider: String,
    /// The model id in use.
    pub model: String,
    store: crate::stored::Opened,
    /// The MCP servers whose tools the host offers; stopped with it.
    mcp: McpServers,
}

impl LiveAgent {
    /// The agent's session id.
    pub fn id(&self) -> &SessionId {
        self.handle.id()
    }

    /// Stops the host (every turn cancelled and converged, every write drained) and closes the store.
    ///
    /// # Errors
    /// `CliError::Failed` when the store does not close cleanly.
    pub async fn stop(self) -> Result<(), CliError> {
        self.host.shutdown().await;
        self.mcp.shutdown().await;
        self.store
            .close()
            .await
            .map_err(|e| CliError::Failed(format!("closing the store: {e}")))
    }
}

/// A provider ready to register, with the model it defaults to.
pub(crate) struct Built {
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) model: String,
    pub(crate) gates: Option<Gates>,
}

pub(crate) fn build_provider(config: &Config, script: Option<&Path>) -> Result<Built, CliError> {
    let name = if script.is_some() {
        "script"
    } else {
        config.provider_name()
    };
    match (name, script) {
        ("script", Some(path)) => {
            let entries = read_script(path)?;
            let gates = Gates::new();
            let provider = ScriptProvider::new(entries, gates.clone()).named("script");
            Ok(Built {
                provider: Arc::new(provider),
                model: config.model.clone().unwrap_or_else(|| "script".into()),
                gates: Some(gates),
            })
        }
        ("script", None) => Err(CliError::Usage(
            "the script provider replays a file: pass --script FILE".into(),
        )),
        ("sim", _) => {
            let provider = SimProvider::new(config.sim.clone())
                .map_err(|e| CliError::Usage(format!("sim: {e}")))?
                .named("sim");
            Ok(Built {
                provider: Arc::new(provider),
                model: config.model.clone().unwrap_or_else(|| "sim".into()),
                gates: None,
            })
        }
        _ => {
            // The key variables were taken out of the environment at start-up (`secret`).
            let mut oc =
                OpenAiConfig::from_env().map_err(|e| CliError::Usage(format!("openai: {e}")))?;
            oc.api_key = match &config.api_key {
                StartupKey::Key(key) => Some(key.clone()),
                StartupKey::Invalid(reason) => {
                    return Err(CliError::Usage(format!("openai: {reason}")));
                }
                StartupKey::Unset => None,
            };
            if let Some(url) = &config.base_url {
                oc.base_url = url.clone();
            }
            // A base URL with userinfo carries its own credential (sent as HTTP Basic).
            if !oc.has_credential() {
                return Err(CliError::Usage(
                    "no API key: set DEEPSEEK_API_KEY or OPENAI_API_KEY, or try --provider sim"
                        .into(),
                ));
            }
            if let Some(model) = &config.model {
                oc.model = model.clone();
            }
            if let Some(ms) = config.openai.connect_timeout_ms {
                oc.connect_timeout_ms = ms;
            }
            if let Some(ms) = config.openai.idle_timeout_ms {
                oc.idle_timeout_ms = ms;
            }
            oc.route = openai::DEFAULT_ROUTE.to_string();
            let model = oc.model.clone();
            let provider =
                OpenAiProvider::new(oc).map_err(|e| CliError::Usage(format!("openai: {e}")))?;
            Ok(Built {
                provider: Arc::new(provider),
                model,
                gates: None,
            })
        }
    }
}

/// Reads a script file: a JSON array of SPEC §9 `model` entries.
fn read_script(path: &Path) -> Result<Vec<ScriptEntry>, CliError> {
    let fail = |reason: String| CliError::Usage(format!("script {}: {reason}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
    if meta.len() > SCRIPT_BYTES_MAX {
        return Err(fail(format!(
            "the file is {} bytes, the limit is {SCRIPT_BYTES_MAX}",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| fail(format!("not a JSON array of model entries: {e}")))
}

/// Checks the request, then opens the store, starts a host and opens the agent.
///
/// # Errors
/// A one-line `CliError` for a bad id, script, provider setting or working directory (nothing
/// written), or for a store or agent that cannot start.
pub async fn start(config: &Config, opts: &AgentArgs) -> Result<LiveAgent, CliError> {
    let id = match &opts.session {
        Some(s) => Some(SessionId::new(s).map_err(|e| CliError::Usage(format!("--session: {e}")))?),
        None => None,
    };
    let built = build_provider(config, opts.script.as_deref())?;
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::Failed(format!("cannot read the working directory: {e}")))?;
    let shell = (opts.shell || config.shell).then(ShellConfig::default);
    let tools = builtin(&cwd, shell).map_err(|e| CliError::Failed(e.to_string()))?;
    let mcp = start_mcp(config).await;
    let tools = tools.layered(&mcp.tools());
    let provider_name = built.provider.name().to_string();
    let mut providers = ProviderRegistry::new();
    providers.register(built.provider);
    let mut hooks = Hooks::new();
    let bound = opts
        .retry_timeout_ms
        .or(config.retry_timeout_ms)
        .map_or_else(SequenceBound::default, |ms_max| SequenceBound { ms_max });
    hooks
        .request_error
        .push(Arc::new(AnnouncedRetries::new(bound)));

    let opened = open_host(config, providers, tools, hooks).await;
    let (host, store) = match opened {
        Ok(both) => both,
        Err(e) => {
            mcp.shutdown().await;
            return Err(e);
        }
    };
    let mut agent_config = AgentConfig::new(&provider_name, &built.model);
    agent_config.max_tokens = opts.max_tokens.or(config.max_tokens);
    agent_config.system = opts.system.clone().or_else(|| config.system.clone());
    agent_config.compaction = config.compaction.clone();
    let mut spec = AgentSpec::new(agent_config);
    spec.cwd = Some(cwd.display().to_string());
    let minted = id.is_none();
    let opened = match id {
        Some(id) if opts.existing => host.resume(&id.clone(), spec.with_id(id)).await,
        Some(id) => host.open(spec.with_id(id)).await,
        None => host.create(spec).await,
    };
    let handle = match opened {
        Ok(h) => h,
        Err(e) => {
            host.shutdown().await;
            mcp.shutdown().await;
            let _ = store.close().await;
            return Err(CliError::Failed(e.to_string()));
        }
    };
    Ok(LiveAgent {
        host,
        handle,
        gates: built.gates,
        minted,
        provider: provider_name,
        model: built.model,
        store,
        mcp,
    })
}

/// Opens the store and starts the host on it.
async fn open_host(
    config: &Config,
    providers: ProviderRegistry,
    tools: dsh::tools::ToolRegistry,
    hooks: Hooks,
) -> Result<(Host, crate::stored::Opened), CliError> {
    let store = crate::stored::open(config).await?;
    let host = Host::builder(store.shared())
        .providers(providers)
        .tools(tools)
        .hooks(hooks)
        .start()
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    Ok((host, store))
}

/// Starts the configured MCP servers (one process or connection each, shared by the host). A
/// server that does not come up is reported on stderr in one line and left out: its tools are not
/// offered, and the session goes on with the rest.
pub(crate) async fn start_mcp(config: &Config) -> McpServers {
    let mcp = McpServers::start(config.mcp_servers.clone()).await;
    for status in mcp.statuses() {
        if let ServerState::Down { error } = &status.state {
            eprintln!(
                "dsh: MCP server `{}` is unavailable: {}",
                status.name,
                crate::text::error_line(error)
            );
        }
    }
    mcp
}
