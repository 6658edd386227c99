//! dsh-mcp: tools from Model Context Protocol servers (SPEC §16), for `dsh chat`, `run`, `serve`
//! and embedders alike.
//!
//! A host configures its servers once (`ServerConfig`, from `[mcp_servers.NAME]` in `dsh.toml`),
//! starts them with `McpServers::start`, and registers `McpServers::tools` in its `ToolRegistry`:
//! every agent of the host then shares one connection — one process for a stdio server — per
//! server. A tool reaches the model as `SERVER__TOOL` with the server's schema; read-only tools run
//! in parallel, the rest exclusively. Calls run concurrently, each bounded by the call timeout; a
//! cancelled call sends `notifications/cancelled` and ends at once; a server that exits or hangs
//! fails its calls with a clear error result and is restarted with backoff (`server`).
//!
//! Built on the official Rust SDK, `rmcp`.

pub mod config;
pub mod connect;
pub mod content;
pub mod server;
pub mod tool;

use std::sync::Arc;

use dsh::tools::{Tool, ToolRegistry, ToolSource};

pub use config::{ConfigError, ServerConfig, ServerEntry, Transport};
pub use connect::{ConnectError, McpToolInfo};
pub use server::{McpServer, ServerState, ServerStatus};
pub use tool::McpTool;

/// The MCP servers of one host.
#[derive(Clone, Debug, Default)]
pub struct McpServers {
    servers: Vec<Arc<McpServer>>,
}

impl McpServers {
    /// Starts every server concurrently and waits for each to connect or fail (each bounded by its
    /// startup timeout). A server that fails stays configured, `Down`, and is tried again at its
    /// next call; its failure is logged and shown by `statuses`.
    pub async fn start(configs: Vec<ServerConfig>) -> McpServers {
        let servers: Vec<Arc<McpServer>> = configs.into_iter().map(McpServer::new).collect();
        let attempts = servers.iter().map(|s| {
            let s = Arc::clone(s);
            async move {
                let _ = s.connect().await;
            }
        });
        futures::future::join_all(attempts).await;
        McpServers { servers }
    }

    /// A set of servers already made (and perhaps connected) by the caller.
    pub fn from_servers(servers: Vec<Arc<McpServer>>) -> McpServers {
        McpServers { servers }
    }

    /// The servers.
    pub fn servers(&self) -> &[Arc<McpServer>] {
        &self.servers
    }

    /// Whether no server is configured.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Every server's tools, as `SERVER__TOOL` tools ready to layer under a host's: each server is
    /// a `ToolSource`, so a list the server changes (`notifications/tools/list_changed`) reaches
    /// every agent at its next step.
    pub fn tools(&self) -> ToolRegistry {
        let mut registry = ToolRegistry::new();
        for server in &self.servers {
            registry.add_source(Arc::new(ServerTools(Arc::clone(server))));
        }
        registry
    }

    /// Each server's name, state and tools, in configuration order.
    pub fn statuses(&self) -> Vec<ServerStatus> {
        self.servers.iter().map(|s| s.status()).collect()
    }

    /// Closes every connection (killing the stdio servers).
    pub async fn shutdown(&self) {
        for server in &self.servers {
            server.stop().await;
        }
    }
}

/// One server's tools as a changing source.
struct ServerTools(Arc<McpServer>);

impl ToolSource for ServerTools {
    fn generation(&self) -> u64 {
        self.0.tools_generation()
    }

    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.0
            .tools()
            .into_iter()
            .map(|info| Arc::new(McpTool::new(Arc::clone(&self.0), info)) as Arc<dyn Tool>)
            .collect()
    }
}
