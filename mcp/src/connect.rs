//! Opening one connection to a server: starting the process (or reaching the URL), the MCP
//! handshake and the first tool list, all within the entry's startup timeout.
//!
//! A stdio server is started with dsh's API keys removed from its environment (unless its entry
//! names them), its stderr discarded (so it cannot write over `chat`), `kill_on_drop`, and a
//! parent-death signal, so it dies with `dsh` even when `dsh` is killed with SIGKILL. What it starts
//! in turn (`npx` → `node`, `sh -c` → anything) dies too: the server runs in a process group led by a
//! watcher (`Group`) that kills the group when `dsh` dies, and the group is killed when the
//! connection is dropped (stop, restart, host shutdown).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use rmcp::model::{JsonRpcMessage, ServerNotification, Tool as RmcpTool};
use rmcp::service::{NotificationContext, RunningService, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess, Transport};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::Value;

use crate::config::{API_KEY_VARIABLES, ServerConfig, Transport as Via};
use crate::server::McpServer;

/// The most tools taken from one server (the rest are left out with a warning).
pub const TOOLS_MAX: usize = 512;
/// The longest tool name a model accepts (`NAME__TOOL` included).
pub const TOOL_NAME_BYTES_MAX: usize = 64;
/// How many HTTP requests to one server may be in flight at once.
const HTTP_CONCURRENCY: usize = 64;

/// One tool of a server, as the model will see it (under `SERVER__NAME`).
#[derive(Clone, Debug, PartialEq)]
pub struct McpToolInfo {
    /// The tool's name on its server.
    pub name: String,
    /// Its description (empty when the server gives none).
    pub description: String,
    /// The JSON schema of its arguments object.
    pub input_schema: Value,
    /// The server marks it read-only (`readOnlyHint`): its calls may run in parallel.
    pub read_only: bool,
}

/// The client side of a connection. A `notifications/tools/list_changed` is noted twice: at once by
/// the transport (`Watched`, in the order messages arrive, so before the answer to a call during
/// which the server changed its list), and by this handler, which re-reads the list in the
/// background when the change came outside a call.
#[derive(Clone, Debug, Default)]
pub(crate) struct Handler {
    /// Set when the server said its tool list changed; cleared when the list is read again.
    pub(crate) list_changed: Arc<AtomicBool>,
    /// The server, told to re-read its list.
    pub(crate) server: Weak<McpServer>,
}

impl ClientHandler for Handler {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.list_changed.store(true, Ordering::Release);
        if let Some(server) = self.server.upgrade() {
            server.sync_tools_now().await;
        }
    }
}

/// A transport that notes `notifications/tools/list_changed` as it reads it, before anything after
/// it (the answer to the call that changed the list) reaches a caller.
struct Watched<T> {
    inner: T,
    list_changed: Arc<AtomicBool>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Watched<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await;
        if let Some(JsonRpcMessage::Notification(n)) = &message
            && matches!(
                n.notification,
                ServerNotification::ToolListChangedNotification(_)
            )
        {
            self.list_changed.store(true, Ordering::Release);
        }
        message
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

/// An open connection; dropping it closes the connection and kills a stdio server.
pub(crate) type Service = RunningService<RoleClient, Handler>;

/// Why a connection could not be opened; the text is shown to the model and in `dsh mcp list`.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The process could not be started.
    #[error("cannot start `{command}`: {cause}")]
    Spawn {
        /// The program.
        command: String,
        /// The operating system's reason.
        cause: String,
    },
    /// The bearer token variable is not set.
    #[error("the environment variable {0} (bearer_token_env) is not set")]
    MissingToken(String),
    /// The handshake failed (the process exited, or answered something that is not MCP).
    #[error("the MCP handshake failed: {0}")]
    Handshake(String),
    /// Listing the tools failed.
    #[error("listing the tools failed: {0}")]
    ListTools(String),
    /// Nothing came back in time.
    #[error("no answer within the startup timeout of {0} ms")]
    Timeout(u128),
}

/// Opens a connection to `config`'s server and reads its tools, within the startup timeout.
pub(crate) async fn connect(
    config: &ServerConfig,
    server: Weak<McpServer>,
) -> Result<Opened, ConnectError> {
    let limit = config.startup_timeout;
    match tokio::time::timeout(limit, open_and_list(config, server)).await {
        Ok(result) => result,
        Err(_) => Err(ConnectError::Timeout(limit.as_millis())),
    }
}

/// A connection just opened.
pub(crate) struct Opened {
    /// The running client; dropping it closes the connection.
    pub(crate) service: Service,
    /// The server's tools.
    pub(crate) tools: Vec<McpToolInfo>,
    /// The handler, whose flag says the tool list changed.
    pub(crate) handler: Handler,
    /// The process id of a stdio server.
    pub(crate) pid: Option<u32>,
    /// The process group of a stdio server; dropping it kills the group.
    pub(crate) group: Option<Group>,
}

async fn open_and_list(
    config: &ServerConfig,
    server: Weak<McpServer>,
) -> Result<Opened, ConnectError> {
    let handler = Handler {
        list_changed: Arc::default(),
        server,
    };
    let mut group = None;

    let mut pid = None;
    let service = match &config.transport {
        Via::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args)
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true);
            for key in API_KEY_VARIABLES {
                cmd.env_remove(key);
            }
            cmd.envs(env);
            if let Some(dir) = cwd {
                cmd.current_dir(dir);
            }
            die_with_parent(&mut cmd);
            group = Group::start();
            // A group of its own when the watcher could not start (it is then unwatched, but still
            // killed as a group on drop).
            cmd.process_group(group.as_ref().map_or(0, |g| g.pgid));
            let spawn_err = |e: std::io::Error| ConnectError::Spawn {
                command: command.clone(),
                cause: e.to_string(),
            };
            let (transport, _stderr) = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(spawn_err)?;
            pid = transport.id();
            if group.is_none() {
                group = pid
                    .and_then(|p| i32::try_from(p).ok())
                    .map(Group::unwatched);
            }
            handler
                .clone()
                .serve(Watched {
                    inner: transport,
                    list_changed: Arc::clone(&handler.list_changed),
                })
                .await
                .map_err(|e| ConnectError::Handshake(e.to_string()))?
        }
        Via::Http {
            url,
            bearer_token_env,
        } => {
            let mut http = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .max_concurrent_requests(HTTP_CONCURRENCY);
            if let Some(var) = bearer_token_env {
                let token = std::env::var(var)
                    .ok()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| ConnectError::MissingToken(var.clone()))?;
                http = http.auth_header(token);
            }
            let transport = StreamableHttpClientTransport::from_config(http);
            handler
                .clone()
                .serve(Watched {
                    inner: transport,
                    list_changed: Arc::clone(&handler.list_changed),
                })
                .await
                .map_err(|e| ConnectError::Handshake(e.to_string()))?
        }
    };
    let tools = list_tools(&config.name, &service).await?;
    Ok(Opened {
        service,
        tools,
        handler,
        pid,
        group,
    })
}

/// Reads the server's tool list (every page), keeping what a model can be given.
pub(crate) async fn list_tools(
    server: &str,
    service: &Service,
) -> Result<Vec<McpToolInfo>, ConnectError> {
    let listed = service
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| ConnectError::ListTools(e.to_string()))?;
    let mut tools = Vec::new();
    for tool in listed {
        if tools.len() == TOOLS_MAX {
            tracing::warn!(server, "more than {TOOLS_MAX} tools; the rest are left out");
            break;
        }
        match info_of(server, tool) {
            Ok(info) => tools.push(info),
            Err(reason) => tracing::warn!(server, "a tool is left out: {reason}"),
        }
    }
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    tools.dedup_by(|a, b| a.name == b.name);
    Ok(tools)
}

/// A listed tool as dsh keeps it, or why it cannot be offered to a model.
fn info_of(server: &str, tool: RmcpTool) -> Result<McpToolInfo, String> {
    let name = tool.name.to_string();
    let full = format!("{server}__{name}").len();
    if name.is_empty()
        || full > TOOL_NAME_BYTES_MAX
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "`{}`: a tool name is letters, digits, `_` or `-`, at most {TOOL_NAME_BYTES_MAX} bytes with its server's prefix",
            name.escape_debug()
        ));
    }
    let read_only = tool
        .annotations
        .as_ref()
        .and_then(|a| a.read_only_hint)
        .unwrap_or(false);
    Ok(McpToolInfo {
        name,
        description: tool.description.map(|d| d.to_string()).unwrap_or_default(),
        input_schema: Value::Object((*tool.input_schema).clone()),
        read_only,
    })
}

/// Makes a stdio server die with `dsh`: a parent-death signal (SIGKILL) set in the child before
/// `exec`. The signal fires when the thread that spawned the child exits; spawns happen on a tokio
/// worker thread (or the test's thread), which lives as long as the runtime.
fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before `exec` and only makes two system calls
    // through rustix (`prctl`, `getppid`), which are async-signal-safe: no allocation, no lock, no
    // access to state another thread could hold. Its error is built from a raw errno (no allocation
    // either).
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(|e| std::io::Error::from_raw_os_error(e.raw_os_error()))?;
            // `dsh` may have died between the fork and the prctl: then the signal never comes.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(
                    rustix::io::Errno::SRCH.raw_os_error(),
                ));
            }
            Ok(())
        });
    }
}

/// The process group a stdio server runs in, led by a watcher that kills the group when `dsh`
/// dies: the parent-death signal reaches only the server's own process, not what it starts. The
/// watcher (`sh`) reads a pipe whose only writer is `lifeline`, held by `dsh`; when `dsh` exits,
/// however it exits, the kernel closes it, the read ends and the watcher runs `kill -KILL 0`. The
/// watcher starts first, so the server never runs unwatched. Dropping a `Group` kills the group.
///
/// What cannot be contained: a process that leaves the group (`setsid`, `setpgid`) or double-forks
/// out of it.
pub(crate) struct Group {
    /// The group's id (the watcher's pid, or the server's when there is no watcher).
    pgid: i32,
    /// The watcher; reaped by tokio once dropped.
    _watcher: Option<tokio::process::Child>,
    /// The write end of the watcher's pipe.
    _lifeline: Option<std::io::PipeWriter>,
}

impl Group {
    /// Starts the watcher in a new process group; `None` when it cannot start (out of processes,
    /// no pipe).
    fn start() -> Option<Group> {
        let (reader, lifeline) = std::io::pipe().ok()?;
        let watcher = tokio::process::Command::new("sh")
            .args(["-c", "read -r _; kill -KILL 0"])
            .stdin(std::process::Stdio::from(reader))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .process_group(0)
            .spawn()
            .ok()?;
        let pgid = i32::try_from(watcher.id()?).ok()?;
        Some(Group {
            pgid,
            _watcher: Some(watcher),
            _lifeline: Some(lifeline),
        })
    }

    /// The group the server leads itself (no watcher).
    fn unwatched(pgid: i32) -> Group {
        Group {
            pgid,
            _watcher: None,
            _lifeline: None,
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = rustix::process::Pid::from_raw(self.pgid) {
            // ESRCH (the group is already gone) is the expected outcome after a clean exit.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("pgid", &self.pgid).finish()
    }
}
