//! Durability points per turn (SPEC §12, issue 15 item 3), counted, not timed: a store that counts
//! its appends stands in for the disk. The session writer keeps at most one append in flight per
//! agent, so with one agent every append is one commit group, one sync on a real store.
//!
//! A text turn needs two (the followup with the checkpoint before its request; the turn's end). A
//! tool turn of two requests needs four: its three checkpoints of SPEC §6 (before request 1, before
//! the tool body, before request 2) each wait for an event written after the one before, and the
//! turn's end is written after the last. `assistant/chunk` events need none of their own: the agent
//! holds them while its stream runs and they join the next commit that must be durable.
//!
//! Also here: a slow stream's chunks still become durable (and visible to observers) while it
//! runs, after `HostConfig::chunk_linger`; and a crash that loses held chunks leaves a log that
//! repair closes into a valid history.

mod runtime_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dsh::SessionId;
use dsh::hooks::Hooks;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::script::{Gates, ScriptEntry, ScriptProvider};
use dsh::session::SessionHeader;
use dsh::session::event::TurnEndReason;
use dsh::session::store::memory::MemoryStore;
use dsh::session::store::{
    EncodedEvent, Inspection, LoadedSession, SessionStore, SessionSummary, StoreError,
};
use dsh::tools::ToolRegistry;
use dsh::turn::AgentConfig;
use dsh_actors::{AgentHandle, AgentSpec, Host, HostConfig, Observed};
use runtime_support::*;

/// A memory store that counts appends (each one is a commit group: one sync on a durable store)
/// and the kinds of each batch, for the failure message.
struct CountingStore {
    inner: MemoryStore,
    appends: AtomicU64,
    batches: std::sync::Mutex<Vec<Vec<String>>>,
}

impl CountingStore {
    fn new() -> CountingStore {
        CountingStore {
            inner: MemoryStore::new(),
            appends: AtomicU64::new(0),
            batches: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn appends(&self) -> u64 {
        self.appends.load(Ordering::SeqCst)
    }

    /// The kinds of each batch appended since the `from`th.
    fn batches_since(&self, from: u64) -> Vec<Vec<String>> {
        let batches = self.batches.lock().expect("not poisoned");
        batches[usize::try_from(from).expect("small")..].to_vec()
    }
}

#[async_trait]
impl SessionStore for CountingStore {
    fn name(&self) -> &'static str {
        "counting"
    }
    async fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
        self.inner.create(header).await
    }
    async fn append(&self, id: &SessionId, events: Vec<EncodedEvent>) -> Result<(), StoreError> {
        let kinds = events.iter().map(|e| e.kind.to_string()).collect();
        self.batches.lock().expect("not poisoned").push(kinds);
        self.appends.fetch_add(1, Ordering::SeqCst);
        self.inner.append(id, events).await
    }
    async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        self.inner.load(id).await
    }
    async fn inspect(&self, id: &SessionId) -> Result<Inspection, StoreError> {
        self.inner.inspect(id).await
    }
    async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list().await
    }
    async fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.inner.delete(id).await
    }
    async fn header(&self, id: &SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.inner.header(id).await
    }
}

/// A host over a counting store with the scripted provider and an `echo` tool, and one agent.
async fn world(
    entries: Vec<ScriptEntry>,
    config: HostConfig,
) -> (Host, AgentHandle, Arc<CountingStore>, Gates) {
    let gates = Gates::new();
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(ScriptProvider::new(entries, gates.clone())));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(TestTool::parallel("echo")));
    let store = Arc::new(CountingStore::new());
    let host = Host::builder(Arc::clone(&store) as Arc<dyn SessionStore>)
        .providers(providers)
        .tools(tools)
        .hooks(Hooks::new())
        .config(config)
        .start()
        .await
        .expect("host starts");
    let agent = host
        .create(AgentSpec::new(AgentConfig::new("script", "m")))
        .await
        .expect("agent created");
    (host, agent, store, gates)
}

/// Runs `turns` turns one after the other (a followup, then `when_idle`, as `dsh sim` does) and
/// returns the appends each cost, with their batches' kinds.
async fn appends_per_turn(
    agent: &AgentHandle,
    store: &CountingStore,
    turns: usize,
) -> Vec<(u64, Vec<Vec<String>>)> {
    let mut per_turn = Vec::new();
    for i in 0..turns {
        let before = store.appends();
        agent
            .followup(user(&format!("turn {i}")))
            .await
            .expect("accepted");
        agent.when_idle().await.expect("idle");
        per_turn.push((store.appends() - before, store.batches_since(before)));
    }
    let counts: Vec<u64> = per_turn.iter().map(|(n, _)| *n).collect();
    println!("appends per turn: {counts:?}");
    per_turn
}

/// Twenty characters, streamed as the benches' text reply is.
const REPLY: &str = "twenty characters ok";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_turn_syncs_twice() {
    let turns = 20;
    let script = vec![ScriptEntry::text(REPLY); turns];
    let (host, agent, store, _) = world(script, HostConfig::default()).await;
    for (turn, (appends, batches)) in appends_per_turn(&agent, &store, turns)
        .await
        .iter()
        .enumerate()
    {
        assert!(*appends <= 2, "turn {turn}: {appends} syncs: {batches:?}");
    }
    let log = agent.log().await.expect("log");
    assert_eq!(reasons(&log), vec![TurnEndReason::Completed; turns]);
    assert_valid(&log);
    host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_turn_syncs_once_per_checkpoint_and_at_its_end() {
    let turns = 20;
    let mut script = Vec::new();
    for i in 0..turns {
        let id = format!("c{i}");
        script.push(ScriptEntry::tool_calls([(
            id.as_str(),
            "echo",
            r#"{"text":"ping"}"#,
        )]));
        script.push(ScriptEntry::text(REPLY));
    }
    let (host, agent, store, _) = world(script, HostConfig::default()).await;
    for (turn, (appends, batches)) in appends_per_turn(&agent, &store, turns)
        .await
        .iter()
        .enumerate()
    {
        assert!(*appends <= 4, "turn {turn}: {appends} syncs: {batches:?}");
    }
    let log = agent.log().await.expect("log");
    assert_eq!(reasons(&log), vec![TurnEndReason::Completed; turns]);
    assert_valid(&log);
    host.shutdown().await;
}

/// Without the linger every chunk batch costs a sync of its own: the count above is the holding's
/// doing, not the script's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_linger_chunks_cost_syncs_of_their_own() {
    let config = HostConfig {
        chunk_linger: Duration::ZERO,
        ..HostConfig::default()
    };
    let script = vec![
        ScriptEntry::text(REPLY).gate("g", 2),
        ScriptEntry::text(REPLY),
    ];
    let (host, agent, store, gates) = world(script, config).await;
    let before = store.appends();
    agent.followup(user("go")).await.expect("accepted");
    wait_durable(&agent, "assistant/chunk", 2).await;
    gates.open("g");
    agent.when_idle().await.expect("idle");
    let chunk_only = store
        .batches_since(before)
        .iter()
        .filter(|b| b.iter().all(|k| k == "assistant/chunk"))
        .count();
    assert!(chunk_only >= 1, "{:?}", store.batches_since(before));
    host.shutdown().await;
}

/// Waits until `count` events of `kind` are in the agent's log and durable.
async fn wait_durable(agent: &AgentHandle, kind: &str, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = agent.log().await.expect("log");
        if let Some(event) = log.iter().filter(|e| e.kind() == kind).nth(count - 1) {
            let status = agent.status().await.expect("status");
            if status.durable_seq > event.seq {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {count} durable {kind}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// A stream that stalls still shows its chunks: they are handed to the writer after the linger,
/// published to observers once durable, while the stream waits; its end then costs one more sync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_flushes_its_chunks_after_the_linger() {
    let script = vec![ScriptEntry::text(REPLY).gate("g", 3)];
    let (host, agent, store, gates) = world(script, HostConfig::default()).await;
    let mut sub = agent.subscribe();
    agent.followup(user("go")).await.expect("accepted");
    // The three chunks before the gate reach an observer while the stream is held at the gate.
    let mut chunks = 0;
    while chunks < 3 {
        let observed = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .expect("the held chunks are flushed")
            .expect("subscribed");
        if let dsh_actors::Observation::Item(Observed::Event { event, json, .. }) = observed {
            assert_eq!(
                json,
                event.to_json().as_bytes(),
                "published with its stored JSON"
            );
            if event.kind() == "assistant/chunk" {
                chunks += 1;
            }
        }
    }
    let status = agent.status().await.expect("status");
    assert_eq!(
        status.status,
        dsh::turn::Status::Running,
        "the stream still waits"
    );
    let flushed = store.appends();
    gates.open("g");
    agent.when_idle().await.expect("idle");
    assert_eq!(
        store.appends(),
        flushed + 1,
        "the rest and the end in one sync"
    );
    host.shutdown().await;
}

/// A crash while chunks are held loses them (they were never acknowledged to anyone): the log read
/// back ends after the request, repair closes the turn `interrupted`, and the agent goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_that_loses_held_chunks_leaves_a_repairable_log() {
    let config = HostConfig {
        chunk_linger: Duration::from_secs(600),
        ..HostConfig::default()
    };
    let script = vec![
        ScriptEntry::text(REPLY).gate("g", 4),
        ScriptEntry::text("after"),
    ];
    let (host, agent, _store, _gates) = world(script, config).await;
    let mut sub = host.subscribe();
    agent.followup(user("first")).await.expect("accepted");
    // The four chunks before the gate are in the agent's memory, not in the store.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let log = agent.log().await.expect("log");
        if log.iter().filter(|e| e.kind() == "assistant/chunk").count() == 4 {
            let status = agent.status().await.expect("status");
            let first_chunk = log
                .iter()
                .find(|e| e.kind() == "assistant/chunk")
                .expect("a chunk");
            assert!(status.durable_seq <= first_chunk.seq, "chunks are held");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no chunks");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    agent.inject_panic().await.expect("crashed");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let observed = tokio::time::timeout_at(deadline, sub.next())
            .await
            .expect("restarted in time")
            .expect("subscribed");
        if matches!(
            observed,
            dsh_actors::Observation::Item(Observed::Restarted { .. })
        ) {
            break;
        }
    }
    let log = agent.log().await.expect("log");
    assert_kinds(
        &log,
        &[
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "request/header",
            "request/context",
            "step/end",
            "turn/end",
            "session/end-seed",
        ],
    );
    assert_eq!(reasons(&log), [TurnEndReason::Interrupted]);
    assert_valid(&log);
    agent.followup(user("second")).await.expect("accepted");
    agent.when_idle().await.expect("idle");
    let log = agent.log().await.expect("log");
    assert_eq!(
        reasons(&log),
        [TurnEndReason::Interrupted, TurnEndReason::Completed]
    );
    assert_valid(&log);
    host.shutdown().await;
}
