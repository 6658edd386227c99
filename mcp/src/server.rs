//! `McpServer`: one server, one connection (one process for stdio), shared by every agent of a
//! host; its calls; and its restart after a crash.
//!
//! The state lives behind a `std` mutex held only to read or swap it, never across an `await`, so
//! calls run concurrently over the one connection. Opening a connection is serialized by a tokio
//! mutex (callers that arrive meanwhile wait for that attempt, bounded by the startup timeout,
//! instead of starting processes of their own).
//!
//! Failure rules: a connection whose transport closed (the process exited) is retired; the first call
//! after that restarts the server at once, and each failed attempt in a row doubles the wait before
//! the next (`BACKOFF_MIN` to `BACKOFF_MAX`); a call meanwhile fails at once with the reason. A call
//! that times out fails with `TIMEOUT`, and the server is pinged: one that does not answer the ping
//! within the startup timeout is retired too, so a hung server is restarted rather than timing out
//! every call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use dsh::session::event::ToolErrorInfo;
use dsh::tools::ToolOutput;
use rmcp::model::{CallToolRequestParams, CallToolResponse, JsonObject};
use rmcp::service::ServiceError;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::connect::{self, ConnectError, McpToolInfo, Service};
use crate::content;

/// The wait before the second attempt in a row to start a failing server.
pub const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The longest wait between attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A server's state as `dsh mcp list` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerState {
    /// Not connected yet (no call has needed it).
    NotStarted,
    /// Connected.
    Ready,
    /// Down: the last attempt failed or the connection broke; `error` says why.
    Down {
        /// Why.
        error: String,
    },
    /// Shut down with the host.
    Stopped,
}

/// A snapshot of one server for listings.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerStatus {
    /// The configured name.
    pub name: String,
    /// Its state.
    pub state: ServerState,
    /// Its tools as last listed (empty before the first connection).
    pub tools: Vec<McpToolInfo>,
    /// The process id of a running stdio server.
    pub pid: Option<u32>,
}

/// A live connection.
struct Live {
    service: Service,
    opened: Known,
}

/// What a live connection knows besides its service.
struct Known {
    tools: Vec<McpToolInfo>,
    handler: connect::Handler,
    pid: Option<u32>,
    /// Held while the tool list is read again, so a caller that saw the change waits for it.
    relisting: tokio::sync::Mutex<()>,
    /// A stdio server's process group, killed when the connection is dropped. Declared last: it
    /// drops after the service, so the server first sees its input close.
    _group: Option<connect::Group>,
}

enum State {
    NotStarted,
    Ready(Arc<Live>),
    Down {
        error: String,
        failures: u32,
        retry_at: Instant,
    },
    Stopped,
}

/// One configured MCP server, shared by every agent of a host.
pub struct McpServer {
    config: ServerConfig,
    state: Mutex<State>,
    /// Held while a connection is being opened, so there is one attempt at a time.
    opening: tokio::sync::Mutex<()>,
    /// The tools as last listed, kept across a restart for listings.
    tools: Mutex<Vec<McpToolInfo>>,
    /// Moves each time `tools` is replaced (`ToolSource::generation`).
    generation: AtomicU64,
    /// This server, for its connections' handlers.
    me: Weak<McpServer>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.config.name)
            .finish_non_exhaustive()
    }
}

impl McpServer {
    /// A server that connects when first needed (or when `connect` is called).
    pub fn new(config: ServerConfig) -> Arc<McpServer> {
        Arc::new_cyclic(|me| McpServer {
            config,
            state: Mutex::new(State::NotStarted),
            opening: tokio::sync::Mutex::new(()),
            tools: Mutex::new(Vec::new()),
            generation: AtomicU64::new(0),
            me: me.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The configured name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Connects now, unless connected; returns the tools.
    ///
    /// # Errors
    /// The reason the server is unavailable (also kept as its `Down` state).
    pub async fn connect(&self) -> Result<Vec<McpToolInfo>, String> {
        self.live().await.map(|live| live.opened.tools.clone())
    }

    /// The server's state, tools and process id.
    pub fn status(&self) -> ServerStatus {
        let (state, pid) = match &*self.lock() {
            State::NotStarted => (ServerState::NotStarted, None),
            State::Ready(live) => (ServerState::Ready, live.opened.pid),
            State::Down { error, .. } => (
                ServerState::Down {
                    error: error.clone(),
                },
                None,
            ),
            State::Stopped => (ServerState::Stopped, None),
        };
        ServerStatus {
            name: self.config.name.clone(),
            state,
            tools: self.tools_lock().clone(),
            pid,
        }
    }

    /// Whether the server said its tool list changed since it was last read.
    pub fn tools_changed(&self) -> bool {
        match &*self.lock() {
            State::Ready(live) => live.opened.handler.list_changed.load(Ordering::Acquire),
            _ => false,
        }
    }

    /// Reads the tool list again (after `tools_changed`, or at any time), and returns it.
    ///
    /// # Errors
    /// The reason the server is unavailable or the list could not be read.
    pub async fn refresh_tools(&self) -> Result<Vec<McpToolInfo>, String> {
        let live = self.live().await?;
        live.opened
            .handler
            .list_changed
            .store(true, Ordering::Release);
        self.sync_tools(&live).await?;
        Ok(self.tools_lock().clone())
    }

    /// The tools as last listed (what agents see from their next step on).
    pub fn tools(&self) -> Vec<McpToolInfo> {
        self.tools_lock().clone()
    }

    /// Moves each time the tool list is replaced (at each connection and each change read).
    pub fn tools_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Reads the list again if the current connection said it changed (a handler's background
    /// work; a failure is logged and the change stays noted for the next call).
    pub(crate) async fn sync_tools_now(&self) {
        if let Ok(Some(live)) = self.ready() {
            let _ = self.sync_tools(&live).await;
        }
    }

    /// Reads the list again if `live` said it changed; a caller that arrives while another reads it
    /// waits for that read, so once this returns every change noted before it is taken in.
    async fn sync_tools(&self, live: &Live) -> Result<(), String> {
        let flag = &live.opened.handler.list_changed;
        if !flag.load(Ordering::Acquire) {
            return Ok(());
        }
        let _relisting = live.opened.relisting.lock().await;
        if !flag.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        let limit = self.config.startup_timeout;
        let listed = match tokio::time::timeout(
            limit,
            connect::list_tools(&self.config.name, &live.service),
        )
        .await
        {
            Ok(Ok(listed)) => listed,
            failed => {
                flag.store(true, Ordering::Release);
                return Err(match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => ConnectError::Timeout(limit.as_millis()).to_string(),
                });
            }
        };
        tracing::debug!(server = %self.config.name, tools = listed.len(), "tool list changed");
        self.set_tools(listed);
        Ok(())
    }

    /// Replaces the tool list and moves the generation.
    fn set_tools(&self, tools: Vec<McpToolInfo>) {
        *self.tools_lock() = tools;
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Closes the connection (killing a stdio server); later calls fail with `MCP_UNAVAILABLE`.
    pub async fn stop(&self) {
        let previous = std::mem::replace(&mut *self.lock(), State::Stopped);
        // When calls still hold the connection, the last of them drops it, which kills the process.
        if let State::Ready(live) = previous
            && let Ok(mut live) = Arc::try_unwrap(live)
        {
            let _ = live
                .service
                .close_with_timeout(Duration::from_secs(2))
                .await;
        }
    }

    /// Calls `tool` with `arguments`; never fails, never waits past the timeouts, and returns at
    /// once when `cancel` fires (sending `notifications/cancelled` for a call in flight).
    pub async fn call(
        self: &Arc<Self>,
        tool: &str,
        arguments: Option<JsonObject>,
        cancel: &CancellationToken,
    ) -> ToolOutput {
        tokio::select! {
            out = self.call_inner(tool, arguments) => out,
            () = cancel.cancelled() => aborted(),
        }
    }

    async fn call_inner(self: &Arc<Self>, tool: &str, arguments: Option<JsonObject>) -> ToolOutput {
        let live = match self.live().await {
            Ok(live) => live,
            Err(reason) => return content::failure("MCP_UNAVAILABLE", reason),
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = arguments;
        // Dropping this future before the answer (timeout, cancellation) makes rmcp send
        // `notifications/cancelled` for the request.
        let call = live.service.peer().call_tool_once(params);
        let limit = self.config.call_timeout;
        let answer = match tokio::time::timeout(limit, call).await {
            Ok(answer) => {
                // A tool list the server changed during the call is read before the result is
                // returned, so the step after this call sees it (a failure to read it is logged).
                if let Err(e) = self.sync_tools(&live).await {
                    tracing::warn!(server = %self.config.name, "reading the changed tool list: {e}");
                }
                answer
            }
            Err(_) => {
                self.check_alive(live);
                return content::failure(
                    "TIMEOUT",
                    format!(
                        "the MCP server `{}` did not answer `{tool}` within {} ms",
                        self.config.name,
                        limit.as_millis()
                    ),
                );
            }
        };
        match answer {
            Ok(CallToolResponse::Complete(result)) => match serde_json::to_value(&result) {
                Ok(json) => content::output(&json),
                Err(e) => content::failure("MCP_PROTOCOL", format!("unreadable result: {e}")),
            },
            Ok(_) => content::failure(
                "MCP_PROTOCOL",
                format!(
                    "the MCP server `{}` answered `{tool}` with a kind of result dsh does not support",
                    self.config.name
                ),
            ),
            Err(ServiceError::TransportClosed) => {
                let why = format!(
                    "the MCP server `{}` exited or closed the connection during the call; it is restarted at the next call",
                    self.config.name
                );
                self.retire(&live, &why);
                content::failure("MCP_SERVER_EXITED", why)
            }
            Err(e) => content::failure(
                "MCP_ERROR",
                format!(
                    "the MCP server `{}` refused the call: {e}",
                    self.config.name
                ),
            ),
        }
    }

    /// The live connection, opening one when there is none and the backoff allows.
    async fn live(&self) -> Result<Arc<Live>, String> {
        if let Some(live) = self.ready()? {
            return Ok(live);
        }
        let _opening = self.opening.lock().await;
        // Another caller may have opened it (or failed) while this one waited.
        if let Some(live) = self.ready()? {
            return Ok(live);
        }
        let failures = match &*self.lock() {
            State::Down {
                error,
                failures,
                retry_at,
            } => {
                let now = Instant::now();
                if *retry_at > now {
                    return Err(format!(
                        "the MCP server `{}` is down ({error}); the next attempt to start it is in {} ms",
                        self.config.name,
                        (*retry_at - now).as_millis()
                    ));
                }
                *failures
            }
            _ => 0,
        };
        self.open(failures).await
    }

    /// Opens a connection after `failures` failed attempts in a row, recording the outcome.
    async fn open(&self, failures: u32) -> Result<Arc<Live>, String> {
        tracing::debug!(server = %self.config.name, "starting MCP server");
        match connect::connect(&self.config, self.me.clone()).await {
            Ok(opened) => {
                let live = Arc::new(Live {
                    service: opened.service,
                    opened: Known {
                        tools: opened.tools,
                        handler: opened.handler,
                        pid: opened.pid,
                        relisting: tokio::sync::Mutex::new(()),
                        _group: opened.group,
                    },
                });
                self.set_tools(live.opened.tools.clone());
                let mut state = self.lock();
                if matches!(*state, State::Stopped) {
                    return Err(self.stopped());
                }
                *state = State::Ready(Arc::clone(&live));
                Ok(live)
            }
            Err(e) => {
                let error = format!("the MCP server `{}`: {e}", self.config.name);
                tracing::warn!(server = %self.config.name, "{error}");
                let failures = failures.saturating_add(1);
                let mut state = self.lock();
                if !matches!(*state, State::Stopped) {
                    *state = State::Down {
                        error: e.to_string(),
                        failures,
                        retry_at: Instant::now() + backoff(failures),
                    };
                }
                Err(error)
            }
        }
    }

    /// The live connection if there is one whose transport is open; a closed one is retired.
    fn ready(&self) -> Result<Option<Arc<Live>>, String> {
        let mut state = self.lock();
        match &*state {
            State::Ready(live) if !live.service.is_closed() => Ok(Some(Arc::clone(live))),
            State::Ready(_) => {
                *state = retired("the server exited");
                Ok(None)
            }
            State::Stopped => Err(self.stopped()),
            _ => Ok(None),
        }
    }

    /// Retires `live` (if it is still the current connection) so the next call restarts the server.
    fn retire(&self, live: &Arc<Live>, why: &str) {
        let mut state = self.lock();
        if let State::Ready(current) = &*state
            && Arc::ptr_eq(current, live)
        {
            tracing::warn!(server = %self.config.name, "{why}");
            *state = retired(why);
        }
    }

    /// After a timeout: pings the server in the background and retires it when the ping is not
    /// answered within the startup timeout either.
    fn check_alive(self: &Arc<Self>, live: Arc<Live>) {
        let limit = self.config.startup_timeout;
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let ping = live
                .service
                .peer()
                .send_request(rmcp::model::ClientRequest::PingRequest(Default::default()));
            if !matches!(tokio::time::timeout(limit, ping).await, Ok(Ok(_))) {
                me.retire(&live, "the server stopped answering (no answer to a ping)");
            }
        });
    }

    fn stopped(&self) -> String {
        format!("the MCP server `{}` was shut down", self.config.name)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere while it was held; the state is still whole
        // (every write is a single assignment).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tools_lock(&self) -> MutexGuard<'_, Vec<McpToolInfo>> {
        self.tools.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The `Down` state of a connection that broke: restart at the next call, no backoff yet.
fn retired(why: &str) -> State {
    State::Down {
        error: why.to_string(),
        failures: 0,
        retry_at: Instant::now(),
    }
}

/// The wait after `failures` failed attempts in a row: none after the first failure of a working
/// server, then `BACKOFF_MIN` doubling up to `BACKOFF_MAX`.
fn backoff(failures: u32) -> Duration {
    if failures <= 1 {
        return BACKOFF_MIN;
    }
    let factor = 1u32 << failures.saturating_sub(1).min(16);
    BACKOFF_MIN.saturating_mul(factor).min(BACKOFF_MAX)
}

/// The result of a call cancelled with its turn.
fn aborted() -> ToolOutput {
    ToolOutput::error(
        "tool call aborted",
        Some(ToolErrorInfo {
            name: "AbortError".into(),
            code: "ABORTED".into(),
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff(1), Duration::from_millis(250));
        assert_eq!(backoff(2), Duration::from_millis(500));
        assert_eq!(backoff(3), Duration::from_millis(1000));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }
}
