//! Shared fixtures for runtime tests: a host over an in-memory store with the scripted provider, test
//! tools (echo, gated, panicking), and log helpers that print expected and actual side by side.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use dsh::hooks::Hooks;
use dsh::ids::MessageId;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::script::{Gates, ScriptEntry, ScriptProvider};
use dsh::llm::types::{ContentBlock, Message};
use dsh::session::Event;
use dsh::session::event::{EventData, TurnEndReason};
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh_actors::{AgentHandle, AgentSpec, Host, HostConfig};
use tokio_util::sync::CancellationToken;

pub fn user(text: &str) -> Message {
    Message::user_text(MessageId::mint(), text)
}

pub fn user_id(id: &str, text: &str) -> Message {
    Message::user_text(MessageId::new(id).expect("a valid test id"), text)
}

/// A tool for tests: echoes `text`, waits on a gate, or panics.
pub struct TestTool {
    name: String,
    mode: ExecutionMode,
    gate: Option<(Gates, String)>,
    panics: bool,
    /// Sleeps this long, ignoring cancellation.
    stubborn_ms: u64,
    /// Answers with the name of the thread its body ran on.
    names_its_thread: bool,
}

impl TestTool {
    pub fn parallel(name: &str) -> TestTool {
        TestTool {
            name: name.into(),
            mode: ExecutionMode::Parallel,
            gate: None,
            panics: false,
            stubborn_ms: 0,
            names_its_thread: false,
        }
    }

    /// Answers with the name of the thread its body ran on (`<unnamed>` for none).
    pub fn thread_naming(name: &str) -> TestTool {
        TestTool {
            names_its_thread: true,
            ..TestTool::parallel(name)
        }
    }

    /// Sleeps `ms` and ignores cancellation (to exercise the grace period and timeouts).
    pub fn stubborn(name: &str, ms: u64) -> TestTool {
        TestTool {
            stubborn_ms: ms,
            ..TestTool::parallel(name)
        }
    }

    pub fn exclusive(name: &str) -> TestTool {
        TestTool {
            mode: ExecutionMode::Exclusive,
            ..TestTool::parallel(name)
        }
    }

    /// Waits for gate `gate` (of the world's gates) before answering; cooperative with cancellation.
    pub fn gated(name: &str, gate: &str) -> TestTool {
        TestTool {
            gate: Some((Gates::new(), gate.into())),
            ..TestTool::parallel(name)
        }
    }

    pub fn panicking(name: &str) -> TestTool {
        TestTool {
            panics: true,
            ..TestTool::parallel(name)
        }
    }
}

#[async_trait::async_trait]
impl Tool for TestTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "a test tool"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}})
    }
    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        self.mode
    }
    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        if self.panics {
            panic!("tool {} exploded", self.name);
        }
        if self.names_its_thread {
            let name = std::thread::current()
                .name()
                .unwrap_or("<unnamed>")
                .to_string();
            return ToolOutput::text(name);
        }
        if self.stubborn_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.stubborn_ms)).await;
        }
        if let Some((gates, gate)) = &self.gate {
            tokio::select! {
                () = gates.wait(gate) => {}
                () = cancel.cancelled() => return ToolOutput::error("cancelled", None),
            }
        }
        let text = call
            .arguments
            .json()
            .and_then(|v| v.get("text"))
            .and_then(|v| v.as_str())
            .unwrap_or("ok")
            .to_string();
        ToolOutput::text(format!("{}: {text}", self.name))
    }
}

pub struct World {
    pub host: Host,
    pub agent: AgentHandle,
    pub script: ScriptProvider,
    pub gates: Gates,
    pub store: Arc<MemoryStore>,
}

impl World {
    pub async fn new(entries: Vec<ScriptEntry>) -> World {
        World::build(entries, Vec::new(), Hooks::new(), HostConfig::default()).await
    }

    pub async fn with_tools(entries: Vec<ScriptEntry>, tools: Vec<TestTool>) -> World {
        World::build(entries, tools, Hooks::new(), HostConfig::default()).await
    }

    pub async fn build(
        entries: Vec<ScriptEntry>,
        tools: Vec<TestTool>,
        hooks: Hooks,
        config: HostConfig,
    ) -> World {
        let gates = Gates::new();
        let script = ScriptProvider::new(entries, gates.clone());
        let mut providers = ProviderRegistry::new();
        providers.register(Arc::new(script.clone()));
        let mut registry = ToolRegistry::new();
        for mut tool in tools {
            if let Some((_, name)) = tool.gate.take() {
                tool.gate = Some((gates.clone(), name));
            }
            registry.register(Arc::new(tool));
        }
        let store = Arc::new(MemoryStore::new());
        let host = Host::builder(Arc::clone(&store) as Arc<dyn SessionStore>)
            .providers(providers)
            .tools(registry)
            .hooks(hooks)
            .config(config)
            .start()
            .await
            .expect("host starts");
        let agent = host
            .create(AgentSpec::new(AgentConfig::new("script", "m")))
            .await
            .expect("agent created");
        World {
            host,
            agent,
            script,
            gates,
            store,
        }
    }

    pub async fn log(&self) -> Vec<Event> {
        self.host
            .get(self.agent.id())
            .expect("agent live")
            .log()
            .await
            .expect("log readable")
    }

    pub async fn stored(&self) -> Vec<Event> {
        self.store
            .load(self.agent.id())
            .await
            .expect("stored log")
            .events
    }

    /// Waits until the log holds at least `count` events of `kind`, durably.
    pub async fn wait_for(&self, kind: &str, count: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log().await;
            let nth = log
                .iter()
                .filter(|e| e.kind() == kind)
                .nth(count.saturating_sub(1));
            let n = log.iter().filter(|e| e.kind() == kind).count();
            if let Some(event) = nth {
                let status = self.agent.status().await.expect("status");
                if status.durable_seq > event.seq {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {count} {kind} (have {n})"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

pub fn kinds(log: &[Event]) -> Vec<&str> {
    log.iter().map(Event::kind).collect()
}

#[track_caller]
pub fn assert_kinds(log: &[Event], want: &[&str]) {
    let got = kinds(log);
    if got != want {
        let n = got.len().max(want.len());
        let mut table = String::new();
        for i in 0..n {
            let g = got.get(i).copied().unwrap_or("-");
            let w = want.get(i).copied().unwrap_or("-");
            let mark = if g == w { " " } else { "!" };
            table.push_str(&format!("{mark} {i:>3} {w:<28} {g}\n"));
        }
        panic!("event kinds differ (expected | actual):\n{table}");
    }
}

/// The `skeleton` of a turn answered with text in one step.
pub const TEXT_TURN: [&str; 6] = [
    "turn/start",
    "step/start",
    "user/message",
    "assistant/message",
    "step/end",
    "turn/end",
];

/// The `skeleton` of a turn whose first step calls one tool and whose second answers.
pub const TOOL_TURN: [&str; 11] = [
    "turn/start",
    "step/start",
    "user/message",
    "assistant/message",
    "tool/call",
    "tool/result",
    "step/end",
    "step/start",
    "assistant/message",
    "step/end",
    "turn/end",
];

/// Waits (at most 10 s) until `agent` reports itself hibernated.
pub async fn until_hibernated(agent: &AgentHandle) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !agent.status().await.expect("status").hibernated {
        assert!(tokio::time::Instant::now() < deadline, "never hibernated");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The log without chunks, the request envelope and inbox splices.
pub fn skeleton(log: &[Event]) -> Vec<Event> {
    log.iter()
        .filter(|e| {
            !matches!(
                e.kind(),
                "assistant/chunk" | "request/header" | "request/context" | "agent/inbox/spliced"
            )
        })
        .cloned()
        .collect()
}

pub fn reasons(log: &[Event]) -> Vec<TurnEndReason> {
    log.iter()
        .filter_map(|e| match &e.data {
            EventData::TurnEnd(t) => Some(t.reason.clone()),
            _ => None,
        })
        .collect()
}

pub fn user_texts(log: &[Event]) -> Vec<String> {
    log.iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) => Some(m.text()),
            _ => None,
        })
        .collect()
}

pub fn tool_result_text(m: &Message) -> String {
    match m.content.first() {
        Some(ContentBlock::ToolResult { content, .. }) => content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

#[track_caller]
pub fn assert_valid(log: &[Event]) {
    if let Err(v) = dsh::session::invariant::check(log) {
        panic!("{v}\n{:#?}", kinds(log));
    }
    assert!(
        dsh::session::invariant::is_balanced(log),
        "{:?}",
        kinds(log)
    );
}
