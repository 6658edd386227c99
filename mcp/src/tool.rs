//! `McpTool`: one tool of an MCP server as a dsh `Tool` named `SERVER__TOOL`.

use std::sync::Arc;

use async_trait::async_trait;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::connect::McpToolInfo;
use crate::content;
use crate::server::McpServer;

/// The separator between a server's name and its tool's name.
pub const SEPARATOR: &str = "__";

/// A tool of an MCP server, called over the server's shared connection.
pub struct McpTool {
    server: Arc<McpServer>,
    info: McpToolInfo,
    /// `SERVER__TOOL`.
    full_name: String,
}

impl McpTool {
    /// The tool `info` of `server`.
    pub fn new(server: Arc<McpServer>, info: McpToolInfo) -> McpTool {
        let full_name = format!("{}{SEPARATOR}{}", server.name(), info.name);
        McpTool {
            server,
            info,
            full_name,
        }
    }
}

#[async_trait]
impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.full_name
    }

    fn description(&self) -> &str {
        &self.info.description
    }

    fn parameters(&self) -> Value {
        self.info.input_schema.clone()
    }

    /// Read-only tools (the server's `readOnlyHint`) run in parallel, the rest exclusively.
    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        if self.info.read_only {
            ExecutionMode::Parallel
        } else {
            ExecutionMode::Exclusive
        }
    }

    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        let arguments = match call.arguments {
            ToolArgs::Json(Value::Object(map)) => Some(map),
            ToolArgs::Json(_) | ToolArgs::Raw(_) => {
                return content::failure("INVALID_ARGUMENTS", "arguments must be a JSON object");
            }
        };
        self.server.call(&self.info.name, arguments, &cancel).await
    }
}
