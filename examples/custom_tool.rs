//! A custom tool: defines `word_count`, registers it for one agent, and lets a scripted model call it.
//! `cargo run --example custom_tool`.
//!
//! A tool declares its name, description and JSON-schema parameters, and decides per call whether the
//! call may overlap others (`Parallel`) or must run alone (`Exclusive`, the default). Whatever it
//! returns — success or error — is what the model sees; it never fails the turn.

use std::sync::Arc;

use async_trait::async_trait;
use dsh::MessageId;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::script::{Gates, ScriptEntry, ScriptProvider};
use dsh::llm::types::Message;
use dsh::session::event::EventData;
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh_actors::{AgentSpec, Host};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Counts the words of `text`.
struct WordCount;

#[async_trait]
impl Tool for WordCount {
    fn name(&self) -> &str {
        "word_count"
    }

    fn description(&self) -> &str {
        "Counts the words in a text."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"]
        })
    }

    /// Pure computation: safe to run beside other calls.
    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Parallel
    }

    async fn execute(&self, call: ToolInvocation, _cancel: CancellationToken) -> ToolOutput {
        match call
            .arguments
            .json()
            .and_then(|v| v.get("text"))
            .and_then(Value::as_str)
        {
            Some(text) => ToolOutput::text(text.split_whitespace().count().to_string()),
            None => ToolOutput::error("word_count needs a string `text`", None),
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The scripted model asks for the tool, then answers with what it got back.
    let script = ScriptProvider::new(
        [
            ScriptEntry::tool_calls([("call-1", "word_count", r#"{"text":"one two three"}"#)]),
            ScriptEntry::text("It has 3 words."),
        ],
        Gates::new(),
    );
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(script));
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let host = Host::builder(store).providers(providers).start().await?;

    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(WordCount));
    let mut spec = AgentSpec::new(AgentConfig::new("script", "demo"));
    spec.tools = tools;
    let agent = host.create(spec).await?;

    agent
        .followup(Message::user_text(MessageId::mint(), "How many words?"))
        .await?;
    agent.when_idle().await?;
    for event in agent.log().await? {
        match &event.data {
            EventData::ToolCall(c) => println!("tool/call   {} {}", c.name, c.arguments),
            EventData::ToolResult(r) => println!("tool/result {:?}", r.message.content),
            EventData::AssistantMessage(a) if !a.message.text().is_empty() => {
                println!("assistant   {}", a.message.text());
            }
            _ => {}
        }
    }
    host.shutdown().await;
    Ok(())
}
