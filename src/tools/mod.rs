//! Tools: the `Tool` trait, its input and output, the registry, and the scheduling rules
//! (`schedule`) the tool-pool actor drives.
//!
//! A tool declares its name, description and JSON-schema parameters, and decides per call whether the
//! call may overlap others (`ExecutionMode::Parallel`) or must run alone (`Exclusive`, a barrier). A
//! tool never fails the turn: an error, a panic, a timeout or bad arguments become an error *result*
//! the model sees.

pub mod registry;
pub mod schedule;

use async_trait::async_trait;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::ids::SessionId;
use crate::llm::types::{ContentBlock, Message, ToolSchema};
use crate::session::event::ToolErrorInfo;

pub use registry::{ToolRegistry, ToolSource};

/// Whether a call may overlap other calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExecutionMode {
    /// Safe to run beside other parallel calls, within the pool cap.
    Parallel,
    /// A barrier: runs alone, after everything before it drained.
    Exclusive,
}

/// A call's arguments as the tool receives them: `{}` for an empty string, the parsed JSON value, or
/// the raw string when it is not valid JSON (the tool then validates or rejects it).
#[derive(Clone, Debug, PartialEq)]
pub enum ToolArgs {
    /// The arguments parsed as JSON (`{}` for an empty string).
    Json(Value),
    /// The raw string, which is not valid JSON.
    Raw(String),
}

impl ToolArgs {
    /// Parses a model's raw argument string leniently, as the original does.
    pub fn parse(raw: &str) -> ToolArgs {
        if raw.trim().is_empty() {
            return ToolArgs::Json(Value::Object(Default::default()));
        }
        match serde_json::from_str(raw) {
            Ok(v) => ToolArgs::Json(v),
            Err(_) => ToolArgs::Raw(raw.to_string()),
        }
    }

    /// The JSON value, if the arguments parsed.
    pub fn json(&self) -> Option<&Value> {
        match self {
            ToolArgs::Json(v) => Some(v),
            ToolArgs::Raw(_) => None,
        }
    }
}

/// One tool call as handed to `Tool::execute`.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInvocation {
    /// The agent.
    pub session_id: SessionId,
    /// The turn of the call.
    pub turn: u64,
    /// The step of the call.
    pub step: u64,
    /// The model's call id.
    pub call_id: String,
    /// The tool called.
    pub name: String,
    /// The call's arguments.
    pub arguments: ToolArgs,
}

/// What a tool call produced.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    /// The model sees this result as an error.
    pub is_error: bool,
    /// The model-facing result content.
    pub content: Vec<ContentBlock>,
    /// Internal failure identity (`{name, code}`), logged on the `tool/result` event.
    pub error: Option<ToolErrorInfo>,
    /// Tool-private presentation payload, logged verbatim.
    pub meta: Option<Value>,
    /// User messages queued to next-step after this call's result, in order.
    pub additional_contexts: Vec<Message>,
    /// The model is not asked again after this step unless next-step has input.
    pub concludes_turn: bool,
}

impl ToolOutput {
    /// A successful text result.
    pub fn text(text: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: vec![ContentBlock::text(text)],
            ..ToolOutput::default()
        }
    }

    /// An error result whose text is `Error: <message>`, as the model sees every tool failure.
    pub fn error(message: impl AsRef<str>, info: Option<ToolErrorInfo>) -> ToolOutput {
        ToolOutput {
            is_error: true,
            content: vec![ContentBlock::text(format!("Error: {}", message.as_ref()))],
            error: info,
            ..ToolOutput::default()
        }
    }

    /// The error result of a call that was running when its turn was aborted: its body returned
    /// after the cancel, or was killed (`detail` says how, when it matters to the model).
    pub fn aborted(detail: Option<&str>) -> ToolOutput {
        let message = match detail {
            Some(detail) => format!("tool call aborted: {detail}"),
            None => "tool call aborted".to_string(),
        };
        ToolOutput::error(message, error_info("AbortError", "ABORTED"))
    }

    /// The error result of a logged call whose body never started because its turn was aborted
    /// first.
    pub fn aborted_before_dispatch() -> ToolOutput {
        ToolOutput::error(
            "tool call aborted before dispatch",
            error_info("AbortError", "ABORTED_BEFORE_DISPATCH"),
        )
    }

    /// The error result of a body that ran past the tool timeout (`timeout_ms`) and was cancelled.
    pub fn timed_out(timeout_ms: u128) -> ToolOutput {
        ToolOutput::error(
            format!("tool call timed out after {timeout_ms}ms"),
            error_info("ToolTimeoutError", "TOOL_TIMEOUT"),
        )
    }

    /// The error result of a body, or a tool hook, that panicked (`reason`: the panic's message).
    pub fn panicked(reason: impl std::fmt::Display) -> ToolOutput {
        ToolOutput::error(
            format!("tool panicked: {reason}"),
            error_info("ToolPanicError", "TOOL_PANICKED"),
        )
    }

    /// The error result of a call to a tool the agent does not have.
    pub fn unknown_tool(name: &str) -> ToolOutput {
        ToolOutput::error(
            format!("unknown tool {name:?}"),
            error_info("ToolNotFoundError", "UNKNOWN_TOOL"),
        )
    }

    /// The error result of a call whose `pre_execute` or `post_execute` hook failed or panicked
    /// (`reason`: the hook's error).
    pub fn hook_failed(reason: impl std::fmt::Display) -> ToolOutput {
        ToolOutput::error(
            format!("tool hook failed: {reason}"),
            error_info("ToolHookError", "TOOL_HOOK_FAILED"),
        )
    }

    /// The result of a logged call whose outcome was lost because the tool pool itself failed.
    pub fn outcome_unknown(reason: &str) -> ToolOutput {
        ToolOutput::error(
            format!("tool outcome unknown: the tool pool failed: {reason}"),
            error_info(
                "ToolOutcomeUnknownError",
                crate::session::repair::TOOL_OUTCOME_UNKNOWN,
            ),
        )
    }
}

/// The failure identity of a tool error result.
fn error_info(name: &str, code: &str) -> Option<ToolErrorInfo> {
    Some(ToolErrorInfo {
        name: name.into(),
        code: code.into(),
    })
}

/// A tool the model can call.
#[async_trait]
pub trait Tool: Send + Sync + 'static {
    /// The name the model calls the tool by.
    fn name(&self) -> &str;
    /// What the tool does, for the model.
    fn description(&self) -> &str;
    /// The JSON schema of the arguments object.
    fn parameters(&self) -> Value;

    /// How this call may be scheduled. The default is the safe choice: exclusive.
    fn execution_mode(&self, args: &ToolArgs) -> ExecutionMode {
        let _ = args;
        ExecutionMode::Exclusive
    }

    /// Runs the call. `cancel` fires when the turn is cancelled; a cooperative tool returns promptly
    /// (its actor is killed after the grace period otherwise).
    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput;

    /// The schema the model sees.
    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name().to_string(),
            description: self.description().to_string(),
            parameters: self.parameters(),
        }
    }
}
