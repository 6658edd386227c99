//! The actor runtime against baselines measured in the same run (STYLE §5: report the ratio, never
//! a bare time). Every model is a looping script: a text turn streams one 20-character text reply
//! (`block-start`, 20 `text-delta`s, `block-end`, `usage`, `finish`); a tool turn first streams one
//! call of the `echo` tool, then that text, so it makes two requests.
//!
//! - `agent_turn`: one agent, sequential turns (followup, then `when_idle`), memory and SQLite
//!   stores (and the text turn on a single-threaded runtime, `-1thread`, and both turns with the
//!   agent on the host's own threads, `HostConfig::agent_threads`, `-pinned`, and with the driver
//!   spawned beside it, `-pinned-beside`), against
//!   `baseline/hand_loop`: one tokio task that pulls the same provider streams, runs
//!   the same tool, and appends the same events (re-sequenced copies of a turn the runtime wrote) to
//!   the same store, durable at the same checkpoints (before each request, before each tool body, at
//!   the end). Both sides start a fresh session every `ROTATE_TURNS` turns, outside the clock, so
//!   history length does not drift with criterion's iteration count.
//! - `turn_history`: the same text turn at history ~0 and ~1,000 turns (flat in history length?).
//! - `agent_lifecycle`: create + dispose one agent (memory store), against a tokio task with a
//!   channel, and a bare ractor actor, each spawned and stopped.
//! - `wake`: one turn of an agent with a ~1,000-event history, awake vs hibernated, against the
//!   store's own `load` of that log (the floor of any wake).
//! - `mailbox`: `AgentHandle::status()` (one message into the agent's mailbox and its reply),
//!   against a raw tokio mpsc send, and a tokio mpsc + oneshot round trip to a task.
//! - `concurrent_turns`: 1,000 agents running one turn each at once, against 1,000 tokio tasks
//!   each running the hand loop's turn, on the same memory store.
//!
//! `DSH_BENCH_CLOCK=cpu` makes `agent_turn` measure the process's CPU time (every thread, user and
//! kernel: `CLOCK_PROCESS_CPUTIME_ID`) instead of the wall clock, so its figures are CPU per turn:
//! steadier than wall time on a shared machine, and they count what hand-offs between threads cost
//! (futex wakes, context switches) where the wall clock would hide it behind an idle core.
//!
//! Run: `cargo bench -p dsh --bench runtime` (one group: append its name).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dsh::SessionId;
use dsh::ids::MessageId;
use dsh::llm::provider::{ChunkStream, Provider, ProviderRegistry};
use dsh::llm::script::ScriptEntry;
use dsh::llm::types::{ContentBlock, LlmRequest, Message, StreamChunk};
use dsh::session::Event;
use dsh::session::event::{EventData, SessionHeader};
use dsh::session::store::memory::MemoryStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh::session::store::{EncodedEvent, SessionStore};
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh_actors::{AgentHandle, AgentSpec, Host, HostConfig};
use futures::StreamExt;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

#[path = "runtime_shape.rs"]
mod shape;

/// Turns on one session before both sides move to a fresh one.
const ROTATE_TURNS: u64 = 64;
/// The text every reply streams, one `text-delta` per character.
const REPLY: &str = "durable logs are fast";
/// Agents in `concurrent_turns`.
const N_CONCURRENT: usize = 1_000;
/// Turns of history in `turn_history` and the target history of `wake` (~34 events a turn).
const HISTORY_TURNS: u64 = 1_000;
const WAKE_HISTORY_TURNS: u64 = 31;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A scripted model that never runs out: in `tools` mode a request whose last message is not a tool
/// result gets one `echo` call, everything else gets the text reply.
struct LoopProvider {
    text: Arc<Vec<StreamChunk>>,
    call: Arc<Vec<StreamChunk>>,
}

impl LoopProvider {
    fn new() -> LoopProvider {
        LoopProvider {
            text: Arc::new(ScriptEntry::text(&REPLY[..20]).planned_chunks()),
            call: Arc::new(
                ScriptEntry::tool_calls([("call_1", "echo", r#"{"text":"ping"}"#)])
                    .planned_chunks(),
            ),
        }
    }

    /// The chunks of one step: the tool call, or the text.
    fn step(&self, call: bool) -> ChunkStream {
        let chunks = if call { &self.call } else { &self.text };
        let chunks = Arc::clone(chunks);
        Box::pin(futures::stream::iter(0..chunks.len()).map(move |i| chunks[i].clone()))
    }
}

impl Provider for LoopProvider {
    fn name(&self) -> &str {
        "loop"
    }

    fn stream(&self, request: LlmRequest, _cancel: CancellationToken) -> ChunkStream {
        let after_tool = request.messages.last().is_some_and(|m| {
            m.content
                .iter()
                .any(|b| matches!(b, ContentBlock::ToolResult { .. }))
        });
        self.step(!request.tools.is_empty() && !after_tool)
    }
}

/// The one tool: answers at once.
struct EchoTool;

#[async_trait::async_trait]
impl Tool for EchoTool {
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> &str {
        "echoes its text"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}})
    }
    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Parallel
    }
    async fn execute(&self, call: ToolInvocation, _cancel: CancellationToken) -> ToolOutput {
        let text = call
            .arguments
            .json()
            .and_then(|v| v.get("text"))
            .and_then(|v| v.as_str())
            .unwrap_or("ok")
            .to_string();
        ToolOutput::text(format!("echo: {text}"))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Text,
    Tools,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Text => "text",
            Mode::Tools => "tools",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum StoreKind {
    Memory,
    Sqlite,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Sqlite => "sqlite",
        }
    }
}

/// A store for one bench, with the temporary directory it lives in.
struct BenchStore {
    store: Arc<dyn SessionStore>,
    sqlite: Option<Arc<SqliteStore>>,
    _dir: Option<tempfile::TempDir>,
}

impl BenchStore {
    fn open(kind: StoreKind, rt: &Runtime) -> BenchStore {
        match kind {
            StoreKind::Memory => BenchStore {
                store: Arc::new(MemoryStore::new()),
                sqlite: None,
                _dir: None,
            },
            StoreKind::Sqlite => {
                // Under the working directory, not /tmp: /tmp may be a tmpfs whose fsync is free.
                let dir = tempfile::tempdir_in(".").expect("tempdir");
                let store = rt.block_on(async {
                    Arc::new(
                        SqliteStore::open(dir.path(), SqliteConfig::default()).expect("open store"),
                    )
                });
                BenchStore {
                    store: Arc::clone(&store) as Arc<dyn SessionStore>,
                    sqlite: Some(store),
                    _dir: Some(dir),
                }
            }
        }
    }

    fn close(self, rt: &Runtime) {
        if let Some(s) = &self.sqlite {
            rt.block_on(s.close()).expect("close store");
        }
    }
}

fn providers() -> (ProviderRegistry, Arc<LoopProvider>) {
    let provider = Arc::new(LoopProvider::new());
    let mut registry = ProviderRegistry::new();
    registry.register(Arc::clone(&provider) as Arc<dyn Provider>);
    (registry, provider)
}

fn tools(mode: Mode) -> ToolRegistry {
    let mut tools = ToolRegistry::new();
    if mode == Mode::Tools {
        tools.register(Arc::new(EchoTool));
    }
    tools
}

async fn host(store: &BenchStore, mode: Mode, hibernate_after: Option<Duration>) -> Host {
    pinned_host(store, mode, hibernate_after, 0).await
}

/// `host` with its agents on `agent_threads` threads of the host's own (`HostConfig::agent_threads`).
async fn pinned_host(
    store: &BenchStore,
    mode: Mode,
    hibernate_after: Option<Duration>,
    agent_threads: usize,
) -> Host {
    Host::builder(Arc::clone(&store.store))
        .providers(providers().0)
        .tools(tools(mode))
        .config(HostConfig {
            hibernate_after,
            agent_threads,
            ..HostConfig::default()
        })
        .start()
        .await
        .expect("host")
}

fn spec() -> AgentSpec {
    AgentSpec::new(AgentConfig::new("loop", "loop-1"))
}

fn prompt() -> Message {
    Message::user_text(MessageId::mint(), "Say something short.")
}

async fn agent_turn(agent: &AgentHandle) {
    agent.followup(prompt()).await.expect("followup");
    agent.when_idle().await.expect("idle");
}

/// The events of the second turn the runtime writes in `mode` (the first carries the one-off
/// `request/header`), to be re-sequenced by the hand loop.
fn capture_template(rt: &Runtime, mode: Mode) -> Vec<Event> {
    rt.block_on(async {
        let store = BenchStore::open(StoreKind::Memory, rt);
        let host = host(&store, mode, None).await;
        let agent = host.create(spec()).await.expect("create");
        agent_turn(&agent).await;
        let first_turn_end = agent.log().await.expect("log").len();
        agent_turn(&agent).await;
        let log = agent.log().await.expect("log");
        host.shutdown().await;
        log[first_turn_end..].to_vec()
    })
}

/// Sets an event's turn number (the template comes from turn 2).
fn set_turn(data: &mut EventData, turn: u64) {
    match data {
        EventData::TurnStart(t) => t.turn = turn,
        EventData::TurnEnd(t) => t.turn = turn,
        EventData::StepStart(s) | EventData::StepEnd(s) => s.turn = turn,
        EventData::AssistantChunk(c) => std::sync::Arc::make_mut(c).turn = turn,
        EventData::AssistantMessage(m) => m.turn = turn,
        EventData::ToolCall(c) => c.turn = turn,
        EventData::ToolResult(r) => r.turn = turn,
        _ => {}
    }
}

/// One session driven by the hand-written loop.
struct HandSession {
    id: SessionId,
    next_seq: u64,
    turn: u64,
}

impl HandSession {
    async fn create(store: &dyn SessionStore) -> HandSession {
        let id = SessionId::mint();
        store
            .create(&SessionHeader::new(id.clone(), 0))
            .await
            .expect("create");
        HandSession {
            id,
            next_seq: 0,
            turn: 0,
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One turn, hand-written: no actors, no turn machine. Copies the template's events with fresh
/// seqs and turn numbers, builds one `assistant/chunk` event per chunk of the provider's real
/// stream, runs the tool, and appends at the durability checkpoints the runtime must honour.
async fn hand_turn(
    store: &dyn SessionStore,
    session: &mut HandSession,
    template: &[Event],
    provider: &LoopProvider,
    mode: Mode,
) {
    session.turn += 1;
    let turn = session.turn;
    // Events since the last checkpoint, encoded in one batch at the checkpoint (as the agent does).
    let mut pending: Vec<Event> = Vec::with_capacity(template.len());
    let mut idx = 0;
    let mut n_requests = 0;
    while idx < template.len() {
        let event = &template[idx];
        if let EventData::AssistantChunk(c) = &event.data {
            // Checkpoint: everything before a request is durable before it is sent.
            let step = c.step;
            store
                .append(&session.id, EncodedEvent::encode_all(&pending))
                .await
                .expect("append");
            pending.clear();
            let mut stream = provider.step(mode == Mode::Tools && n_requests == 0);
            n_requests += 1;
            while let Some(chunk) = stream.next().await {
                let e = Event {
                    seq: session.next_seq,
                    time: now_ms(),
                    data: EventData::AssistantChunk(std::sync::Arc::new(
                        dsh::session::event::AssistantChunk { turn, step, chunk },
                    )),
                    ignorable: false,
                    source_event_seqs: None,
                    surface_op: None,
                    raw_data: None,
                };
                pending.push(e);
                session.next_seq += 1;
            }
            while idx < template.len() && template[idx].kind() == "assistant/chunk" {
                idx += 1;
            }
            continue;
        }
        let mut e = event.clone();
        let shift = session.next_seq as i64 - e.seq as i64;
        e.seq = session.next_seq;
        e.time = now_ms();
        set_turn(&mut e.data, turn);
        if let Some(seqs) = &mut e.source_event_seqs {
            for s in seqs.iter_mut() {
                *s = (*s as i64 + shift) as u64;
            }
        }
        pending.push(e);
        session.next_seq += 1;
        if let EventData::ToolCall(call) = &event.data {
            // Checkpoint: the call is durable before its body starts.
            store
                .append(&session.id, EncodedEvent::encode_all(&pending))
                .await
                .expect("append");
            pending.clear();
            let invocation = ToolInvocation {
                session_id: session.id.clone(),
                turn,
                step: call.step,
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments: ToolArgs::parse(&call.arguments),
            };
            let output = EchoTool.execute(invocation, CancellationToken::new()).await;
            std::hint::black_box(output);
        }
        idx += 1;
    }
    store
        .append(&session.id, EncodedEvent::encode_all(&pending))
        .await
        .expect("append");
}

/// What `agent_turn` measures: the wall clock, or with `DSH_BENCH_CLOCK=cpu` the process's CPU time.
#[derive(Clone, Copy)]
enum Stopwatch {
    Wall(Instant),
    Cpu(Duration),
}

impl Stopwatch {
    fn cpu_clock() -> bool {
        std::env::var("DSH_BENCH_CLOCK").is_ok_and(|v| v == "cpu")
    }

    fn process_cpu() -> Duration {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    }

    fn start() -> Stopwatch {
        if Self::cpu_clock() {
            Stopwatch::Cpu(Self::process_cpu())
        } else {
            Stopwatch::Wall(Instant::now())
        }
    }

    fn elapsed(self) -> Duration {
        match self {
            Stopwatch::Wall(started) => started.elapsed(),
            Stopwatch::Cpu(started) => Self::process_cpu().saturating_sub(started),
        }
    }
}

/// `iters` turns of the hand loop, on a fresh session every `ROTATE_TURNS` turns (outside the clock).
async fn timed_hand_turns(
    store: &dyn SessionStore,
    template: &[Event],
    provider: &LoopProvider,
    mode: Mode,
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let mut session = HandSession::create(store).await;
        let n = (iters - done).min(ROTATE_TURNS);
        let started = Stopwatch::start();
        for _ in 0..n {
            hand_turn(store, &mut session, template, provider, mode).await;
        }
        total += started.elapsed();
        done += n;
    }
    total
}

/// `iters` turns of one agent, on a fresh agent every `ROTATE_TURNS` turns (created and disposed
/// outside the clock). With `beside`, each agent's turns are driven from a task spawned beside it
/// (`AgentHandle::spawn_beside`): on a pinned host, on the agent's own thread.
async fn timed_agent_turns(host: &Host, iters: u64, beside: bool) -> Duration {
    let mut total = Duration::ZERO;
    let mut done = 0;
    while done < iters {
        let agent = host.create(spec()).await.expect("create");
        let n = (iters - done).min(ROTATE_TURNS);
        let driver = agent.clone();
        let turns = async move {
            let started = Stopwatch::start();
            for _ in 0..n {
                agent_turn(&driver).await;
            }
            started.elapsed()
        };
        total += if beside {
            agent.spawn_beside(turns).await.expect("driver task")
        } else {
            turns.await
        };
        done += n;
        host.dispose(agent.id()).await.expect("dispose");
    }
    total
}

fn agent_turn_group(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("agent_turn");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    for mode in [Mode::Text, Mode::Tools] {
        let template = Arc::new(capture_template(&rt, mode));
        for kind in [StoreKind::Memory, StoreKind::Sqlite] {
            let param = format!("{}-{}", mode.name(), kind.name());

            let store = BenchStore::open(kind, &rt);
            let provider = LoopProvider::new();
            g.bench_function(BenchmarkId::new("baseline/hand_loop", &param), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let store = Arc::clone(&store.store);
                    let template = Arc::clone(&template);
                    let provider = &provider;
                    async move { timed_hand_turns(&*store, &template, provider, mode, iters).await }
                });
            });
            store.close(&rt);

            let store = BenchStore::open(kind, &rt);
            let host = rt.block_on(host(&store, mode, None));
            g.bench_function(BenchmarkId::new("dsh/agent", &param), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let host = host.clone();
                    async move { timed_agent_turns(&host, iters, false).await }
                });
            });
            rt.block_on(host.shutdown());
            store.close(&rt);
        }
        // The same turns with the agents pinned to two threads of the host's own (baseline: the
        // `-memory` hand loop above). `-pinned`: the driver (on the bench's thread) hands each
        // input over once, the agent's work never changes thread. `-pinned-beside`: the driver is
        // spawned beside its agent, so its messages and the agent's answers never leave the
        // agent's thread.
        let store = BenchStore::open(StoreKind::Memory, &rt);
        for (suffix, beside) in [("pinned", false), ("pinned-beside", true)] {
            let param = format!("{}-memory-{suffix}", mode.name());
            let host = rt.block_on(pinned_host(&store, mode, None, 2));
            g.bench_function(BenchmarkId::new("dsh/agent", &param), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let host = host.clone();
                    async move { timed_agent_turns(&host, iters, beside).await }
                });
            });
            rt.block_on(host.shutdown());
        }
        // The driver as a task on the runtime's workers (as `dsh sim`'s and a server's are), not
        // on the bench's own thread: unpinned (`-task`) and pinned (`-pinned-task`).
        for (threads, suffix) in [(0, "task"), (2, "pinned-task")] {
            let param = format!("{}-memory-{suffix}", mode.name());
            let host = rt.block_on(pinned_host(&store, mode, None, threads));
            g.bench_function(BenchmarkId::new("dsh/agent", &param), |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let host = host.clone();
                    async move {
                        tokio::spawn(async move { timed_agent_turns(&host, iters, false).await })
                            .await
                            .expect("driver task")
                    }
                });
            });
            rt.block_on(host.shutdown());
        }
    }
    // The same text turn on a single-threaded runtime: no worker wakes another, so the difference
    // to the two-worker figures above is what cross-thread hand-offs cost a lone sequential agent.
    let rt1 = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread runtime");
    let template = Arc::new(capture_template(&rt1, Mode::Text));
    let param = "text-memory-1thread";
    let store = BenchStore::open(StoreKind::Memory, &rt1);
    let provider = LoopProvider::new();
    g.bench_function(BenchmarkId::new("baseline/hand_loop", param), |b| {
        b.to_async(&rt1).iter_custom(|iters| {
            let store = Arc::clone(&store.store);
            let template = Arc::clone(&template);
            let provider = &provider;
            async move { timed_hand_turns(&*store, &template, provider, Mode::Text, iters).await }
        });
    });
    // The actor shape alone: the same messages, spawns and child actor as this turn, with no work
    // (`runtime_shape.rs`). What the agent costs above `hand_loop + actor_shape` is its own work.
    g.bench_function(BenchmarkId::new("baseline/actor_shape", param), |b| {
        b.to_async(&rt1).iter_custom(shape::timed_shape_turns);
    });
    let host = rt1.block_on(host(&store, Mode::Text, None));
    g.bench_function(BenchmarkId::new("dsh/agent", param), |b| {
        b.to_async(&rt1).iter_custom(|iters| {
            let host = host.clone();
            async move { timed_agent_turns(&host, iters, false).await }
        });
    });
    rt1.block_on(host.shutdown());
    g.finish();
}

/// Per-turn cost at the start of a conversation and after `HISTORY_TURNS` turns.
fn turn_history_group(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("turn_history");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    let store = BenchStore::open(StoreKind::Memory, &rt);
    let host = rt.block_on(host(&store, Mode::Text, None));
    for history in [0, HISTORY_TURNS] {
        // A conversation with at least `history` turns, replaced once it grew 20 % past it.
        let current: Arc<tokio::sync::Mutex<Option<(AgentHandle, u64)>>> = Arc::default();
        g.bench_function(
            BenchmarkId::new("dsh/agent_text_memory", format!("history_{history}")),
            |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let host = host.clone();
                    let current = Arc::clone(&current);
                    async move {
                        let mut total = Duration::ZERO;
                        let mut done = 0;
                        let mut slot = current.lock().await;
                        while done < iters {
                            let limit = history + history / 5 + ROTATE_TURNS;
                            if slot.as_ref().is_none_or(|(_, turns)| *turns >= limit) {
                                if let Some((old, _)) = slot.take() {
                                    host.dispose(old.id()).await.expect("dispose");
                                }
                                let agent = host.create(spec()).await.expect("create");
                                for _ in 0..history {
                                    agent_turn(&agent).await;
                                }
                                *slot = Some((agent, history));
                            }
                            let (agent, turns) = slot.as_mut().expect("just set");
                            let n = (iters - done).min(limit - *turns);
                            let started = Instant::now();
                            for _ in 0..n {
                                agent_turn(agent).await;
                            }
                            total += started.elapsed();
                            *turns += n;
                            done += n;
                        }
                        total
                    }
                });
            },
        );
    }
    g.finish();
    rt.block_on(host.shutdown());
    store.close(&rt);
}

struct Nop;

impl ractor::Actor for Nop {
    type Msg = ();
    type State = ();
    type Arguments = ();

    async fn pre_start(
        &self,
        _myself: ractor::ActorRef<()>,
        _args: (),
    ) -> Result<(), ractor::ActorProcessingErr> {
        Ok(())
    }
}

fn lifecycle_group(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("agent_lifecycle");
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    g.bench_function("baseline/tokio_task_channel", |b| {
        b.to_async(&rt).iter(|| async {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(16);
            let task = tokio::spawn(async move { while rx.recv().await.is_some() {} });
            drop(tx);
            task.await.expect("task");
        });
    });
    g.bench_function("baseline/ractor_actor", |b| {
        b.to_async(&rt).iter(|| async {
            let (actor, handle) = ractor::Actor::spawn(None, Nop, ()).await.expect("spawn");
            actor.stop(None);
            handle.await.expect("join");
        });
    });
    let store = BenchStore::open(StoreKind::Memory, &rt);
    let host = rt.block_on(host(&store, Mode::Text, None));
    g.bench_function("dsh/create_dispose", |b| {
        b.to_async(&rt).iter(|| {
            let host = host.clone();
            async move {
                let agent = host.create(spec()).await.expect("create");
                host.dispose(agent.id()).await.expect("dispose");
            }
        });
    });
    g.bench_function("dsh/create", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let host = host.clone();
            async move {
                let mut agents = Vec::with_capacity(iters as usize);
                let started = Instant::now();
                for _ in 0..iters {
                    agents.push(host.create(spec()).await.expect("create"));
                }
                let elapsed = started.elapsed();
                for agent in agents {
                    host.dispose(agent.id()).await.expect("dispose");
                }
                elapsed
            }
        });
    });
    rt.block_on(host.shutdown());
    // Creation on SQLite: an id the host mints (`create_minted`: no lookup) against an id the
    // caller names (`create` looks it up in the database first), on one store, same run.
    let sqlite = BenchStore::open(StoreKind::Sqlite, &rt);
    let sqlite_host = rt.block_on(self::host(&sqlite, Mode::Text, None));
    let named = Arc::new(AtomicU64::new(0));
    for param in ["minted", "named"] {
        g.bench_function(BenchmarkId::new("dsh/create-sqlite", param), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let host = sqlite_host.clone();
                let named = Arc::clone(&named);
                async move {
                    let specs: Vec<AgentSpec> = (0..iters)
                        .map(|_| match param {
                            "named" => {
                                let n = named.fetch_add(1, Ordering::Relaxed);
                                let id = SessionId::new(&format!("named-{n:09}")).expect("an id");
                                spec().with_id(id)
                            }
                            _ => spec(),
                        })
                        .collect();
                    let mut agents = Vec::with_capacity(iters as usize);
                    let started = Instant::now();
                    for spec in specs {
                        agents.push(host.create(spec).await.expect("create"));
                    }
                    let elapsed = started.elapsed();
                    for agent in agents {
                        host.dispose(agent.id()).await.expect("dispose");
                    }
                    elapsed
                }
            });
        });
    }
    g.finish();
    rt.block_on(sqlite_host.shutdown());
    sqlite.close(&rt);
}

/// Waits (outside the clock) until `agent` reports itself hibernated. A status call counts as
/// activity, so polls are spaced well beyond the hibernation delay.
async fn until_hibernated(agent: &AgentHandle, hibernate_after: Duration) {
    for _ in 0..1_000 {
        tokio::time::sleep(hibernate_after * 3).await;
        if agent.status().await.expect("status").hibernated {
            return;
        }
    }
    panic!("agent {} never hibernated", agent.id());
}

fn wake_group(c: &mut Criterion) {
    const N_AGENTS: usize = 32;
    let hibernate_after = Duration::from_millis(2);
    let rt = runtime();
    let mut g = c.benchmark_group("wake");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    g.warm_up_time(Duration::from_secs(1));
    for kind in [StoreKind::Memory, StoreKind::Sqlite] {
        let store = BenchStore::open(kind, &rt);
        let awake_host = rt.block_on(host(&store, Mode::Text, None));
        let sleepy_host = rt.block_on(host(&store, Mode::Text, Some(hibernate_after)));
        let prepare = |host: &Host| {
            rt.block_on(async {
                let mut agents = Vec::with_capacity(N_AGENTS);
                for _ in 0..N_AGENTS {
                    let agent = host.create(spec()).await.expect("create");
                    for _ in 0..WAKE_HISTORY_TURNS {
                        agent_turn(&agent).await;
                    }
                    agents.push(agent);
                }
                agents
            })
        };
        let awake = Arc::new(prepare(&awake_host));
        let sleepy = Arc::new(prepare(&sleepy_host));
        let n_events = rt.block_on(awake[0].log()).expect("log").len();
        eprintln!("wake: {} events of history per agent", n_events);
        let param = format!("{}-{n_events}_events", kind.name());
        let next = Arc::new(AtomicU64::new(0));

        g.bench_function(BenchmarkId::new("baseline/store_load", &param), |b| {
            let store = Arc::clone(&store.store);
            let awake = Arc::clone(&awake);
            let next = Arc::clone(&next);
            b.to_async(&rt).iter(move || {
                let store = Arc::clone(&store);
                let id = awake[next.fetch_add(1, Ordering::Relaxed) as usize % N_AGENTS]
                    .id()
                    .clone();
                async move { std::hint::black_box(store.load(&id).await.expect("load")) }
            });
        });
        g.bench_function(BenchmarkId::new("dsh/awake_turn", &param), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let awake = Arc::clone(&awake);
                let next = Arc::clone(&next);
                async move {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize % N_AGENTS;
                        agent_turn(&awake[i]).await;
                    }
                    started.elapsed()
                }
            });
        });
        g.bench_function(BenchmarkId::new("dsh/hibernated_turn", &param), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let sleepy = Arc::clone(&sleepy);
                let next = Arc::clone(&next);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let agent =
                            &sleepy[next.fetch_add(1, Ordering::Relaxed) as usize % N_AGENTS];
                        until_hibernated(agent, hibernate_after).await;
                        let started = Instant::now();
                        agent_turn(agent).await;
                        total += started.elapsed();
                    }
                    total
                }
            });
        });
        // The wake alone: from the followup of a hibernated agent to its acknowledgement, which
        // needs the log read back (the turn starts, and its first events are durable).
        g.bench_function(
            BenchmarkId::new("dsh/hibernated_followup_ack", &param),
            |b| {
                b.to_async(&rt).iter_custom(|iters| {
                    let sleepy = Arc::clone(&sleepy);
                    let next = Arc::clone(&next);
                    async move {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let agent =
                                &sleepy[next.fetch_add(1, Ordering::Relaxed) as usize % N_AGENTS];
                            until_hibernated(agent, hibernate_after).await;
                            let started = Instant::now();
                            agent.followup(prompt()).await.expect("followup");
                            total += started.elapsed();
                            agent.when_idle().await.expect("idle");
                        }
                        total
                    }
                });
            },
        );
        rt.block_on(awake_host.shutdown());
        rt.block_on(sleepy_host.shutdown());
        store.close(&rt);
    }
    g.finish();
}

fn mailbox_group(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("mailbox");
    g.throughput(Throughput::Elements(1));
    g.sample_size(30);
    g.measurement_time(Duration::from_secs(3));
    g.warm_up_time(Duration::from_secs(1));
    {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(1024);
        rt.spawn(async move { while rx.recv().await.is_some() {} });
        g.bench_function("baseline/tokio_mpsc_send", |b| {
            b.to_async(&rt)
                .iter(|| async { tx.send(1).await.expect("send") });
        });
    }
    {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<u64>>(1024);
        rt.spawn(async move {
            while let Some(reply) = rx.recv().await {
                let _ = reply.send(7);
            }
        });
        g.bench_function("baseline/tokio_mpsc_oneshot_roundtrip", |b| {
            b.to_async(&rt).iter(|| async {
                let (reply, answer) = tokio::sync::oneshot::channel();
                tx.send(reply).await.expect("send");
                answer.await.expect("answer")
            });
        });
    }
    let store = BenchStore::open(StoreKind::Memory, &rt);
    let host = rt.block_on(host(&store, Mode::Text, None));
    let agent = rt.block_on(host.create(spec())).expect("create");
    g.bench_function("dsh/status_roundtrip", |b| {
        b.to_async(&rt)
            .iter(|| async { std::hint::black_box(agent.status().await.expect("status")) });
    });
    g.finish();
    rt.block_on(host.shutdown());
}

fn concurrent_group(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("concurrent_turns");
    g.throughput(Throughput::Elements(N_CONCURRENT as u64));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    g.warm_up_time(Duration::from_secs(1));
    let template = Arc::new(capture_template(&rt, Mode::Text));
    let param = format!("{N_CONCURRENT}_agents_text_memory");
    {
        let store = BenchStore::open(StoreKind::Memory, &rt);
        let provider = Arc::new(LoopProvider::new());
        g.bench_function(BenchmarkId::new("baseline/hand_loop_tasks", &param), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let store = Arc::clone(&store.store);
                let template = Arc::clone(&template);
                let provider = Arc::clone(&provider);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let mut sessions = Vec::with_capacity(N_CONCURRENT);
                        for _ in 0..N_CONCURRENT {
                            sessions.push(HandSession::create(&*store).await);
                        }
                        let started = Instant::now();
                        let tasks: Vec<_> = sessions
                            .into_iter()
                            .map(|mut session| {
                                let store = Arc::clone(&store);
                                let template = Arc::clone(&template);
                                let provider = Arc::clone(&provider);
                                tokio::spawn(async move {
                                    hand_turn(
                                        &*store,
                                        &mut session,
                                        &template,
                                        &provider,
                                        Mode::Text,
                                    )
                                    .await;
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("hand task");
                        }
                        total += started.elapsed();
                    }
                    total
                }
            });
        });
    }
    {
        let store = BenchStore::open(StoreKind::Memory, &rt);
        let host = rt.block_on(host(&store, Mode::Text, None));
        g.bench_function(BenchmarkId::new("dsh/agents", &param), |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let host = host.clone();
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let mut agents = Vec::with_capacity(N_CONCURRENT);
                        for _ in 0..N_CONCURRENT {
                            agents.push(host.create(spec()).await.expect("create"));
                        }
                        let started = Instant::now();
                        let sends = agents.iter().map(|a| a.followup(prompt()));
                        for r in futures::future::join_all(sends).await {
                            r.expect("followup");
                        }
                        for r in
                            futures::future::join_all(agents.iter().map(|a| a.when_idle())).await
                        {
                            r.expect("idle");
                        }
                        total += started.elapsed();
                        for agent in &agents {
                            host.dispose(agent.id()).await.expect("dispose");
                        }
                    }
                    total
                }
            });
        });
        rt.block_on(host.shutdown());
    }
    g.finish();
}

criterion_group!(
    benches,
    agent_turn_group,
    turn_history_group,
    lifecycle_group,
    wake_group,
    mailbox_group,
    concurrent_group
);
criterion_main!(benches);
