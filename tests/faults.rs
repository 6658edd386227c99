//! Seeded provider fault schedules (issue 16 item 3, RELIABILITY.md §3).
//!
//! One schedule = one seed. The seed decides, for every model request an agent makes, what a local
//! OpenAI-compatible HTTP server (`support::fake_server`, real sockets on 127.0.0.1) answers — a clean
//! stream (text, or tool calls with random durations), or, at a random SSE event, a fault: 429 with
//! and without `Retry-After`, 5xx, a connection reset before the headers or mid-stream, a stall past
//! the idle timeout (before the headers or mid-stream), a malformed event, a truncated event, an early
//! end without `[DONE]` — and the inputs sent to the running agent meanwhile (followups, steers,
//! cancels, pauses, crash-restarts). The real `openai` provider (the production HTTP client, SSE
//! decoder and chunk translator) talks to the server, inside a real `Host` with a retry policy of
//! tiny backoffs.
//!
//! After each schedule: no panic anywhere in the process (a panic hook counts them, contained ones
//! too), the log passes the invariant checker and is balanced, every `tool/call` has exactly one
//! `tool/result`, no tool body ran twice for one call id, every acknowledged input is accounted
//! for exactly once, and every `llm/retry` is within the policy (number ≤ `maxRetries`, consecutive
//! in its chain, delay ≤ `maxDelayMs`).
//!
//! `cargo test --test faults` runs `FAULT_SCHEDULES` schedules (default 120; the documented full run sets 10000) from seed
//! `FAULT_SEED_BASE` (default 0). A failure prints its seed; `FAULT_SEED=N` replays that one schedule
//! (the same server answers and inputs; the thread interleaving is the machine's).

mod support {
    pub mod fake_server;
}

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dsh::MessageId;
use dsh::llm::openai::{ApiKey, OpenAiConfig, OpenAiProvider};
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::retry::RetryPolicy;
use dsh::llm::types::Message;
use dsh::session::Event;
use dsh::session::event::{CancelCause, EventData};
use dsh::session::invariant;
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh_actors::{AgentSpec, DefaultRetry, Host};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use support::fake_server::{Behaviour, Ending, FakeServer, Step};
use tokio_util::sync::CancellationToken;

/// The retry budget and backoff every schedule runs under: tiny delays, so a schedule is fast.
const MAX_RETRIES: u64 = 3;
const MAX_DELAY_MS: u64 = 8;
/// The client's idle timeout; a stall fault waits past it.
const IDLE_TIMEOUT_MS: u64 = 40;
/// Server answers prepared per schedule; later requests get the server's HTTP 500.
const ANSWERS: usize = 48;

fn policy() -> RetryPolicy {
    RetryPolicy::from_json(&json!({
        "mode": "normal",
        "maxRetries": MAX_RETRIES,
        "backoff": {"initialDelayMs": 1, "maxDelayMs": MAX_DELAY_MS, "jitterRatio": 0.5}
    }))
    .expect("a valid policy")
}

/// Every panic in the process, with where it happened. Contained panics (in actors) count too.
fn panics() -> &'static Mutex<Vec<String>> {
    static PANICS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    PANICS.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(mut v) = panics().lock() {
                v.push(info.to_string());
            }
            default(info);
        }));
        Mutex::new(Vec::new())
    })
}

/// Which fault, if any, one server answer carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    None,
    RateLimit,
    RateLimitRetryAfter,
    Server,
    ResetBeforeHeaders,
    ResetMidStream,
    StallBeforeHeaders,
    StallMidStream,
    Malformed,
    Truncated,
    EarlyEnd,
}

const FAULTS: [Fault; 10] = [
    Fault::RateLimit,
    Fault::RateLimitRetryAfter,
    Fault::Server,
    Fault::ResetBeforeHeaders,
    Fault::ResetMidStream,
    Fault::StallBeforeHeaders,
    Fault::StallMidStream,
    Fault::Malformed,
    Fault::Truncated,
    Fault::EarlyEnd,
];

/// The SSE events of one clean answer: text, or (early in a schedule) tool calls with durations.
fn clean_events(rng: &mut StdRng, seed: u64, answer: usize) -> Vec<Value> {
    let mut events = vec![json!({"choices":[{"delta":{"role":"assistant","content":null}}]})];
    let n_calls = if answer < 24 && rng.random_bool(0.45) {
        rng.random_range(1..=3)
    } else {
        0
    };
    if n_calls == 0 {
        for i in 0..rng.random_range(1..=4) {
            events.push(json!({"choices":[{"delta":{"content":format!("w{i} ")}}]}));
        }
        events.push(json!({"choices":[{"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2}}));
        return events;
    }
    for i in 0..n_calls {
        let name = if rng.random_bool(0.7) {
            "sleepy"
        } else {
            "barrier"
        };
        let ms = rng.random_range(0..25u64);
        let args = json!({ "ms": ms }).to_string();
        let (head, tail) = args.split_at(args.len() / 2);
        events.push(json!({"choices":[{"delta":{"tool_calls":[{"index":i,"id":format!("call_{seed}_{answer}_{i}"),"type":"function","function":{"name":name,"arguments":head}}]}}]}));
        events.push(json!({"choices":[{"delta":{"tool_calls":[{"index":i,"function":{"arguments":tail}}]}}]}));
    }
    events.push(json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}));
    events
}

fn sse_event(v: &Value) -> Vec<u8> {
    format!("data: {v}\n\n").into_bytes()
}

/// One server answer and the fault it carries.
fn answer(rng: &mut StdRng, seed: u64, i: usize) -> (Fault, Behaviour) {
    let fault = if rng.random_bool(0.4) {
        FAULTS[rng.random_range(0..FAULTS.len())]
    } else {
        Fault::None
    };
    let events = clean_events(rng, seed, i);
    let cut = rng.random_range(0..events.len());
    let steps = |events: &[Value]| -> Vec<Step> {
        events.iter().map(|e| Step::Write(sse_event(e))).collect()
    };
    let behaviour = match fault {
        Fault::None => {
            let mut s = steps(&events);
            s.push(Step::Write(b"data: [DONE]\n\n".to_vec()));
            Behaviour::Stream {
                steps: s,
                ending: Ending::Clean,
            }
        }
        Fault::RateLimit => Behaviour::status(
            429,
            r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#,
            &[],
        ),
        Fault::RateLimitRetryAfter => {
            // 0 s falls back to the backoff; 1 s is past the policy's cap, so the chain gives up.
            let after = if rng.random_bool(0.5) { "0" } else { "1" };
            Behaviour::status(
                429,
                r#"{"error":{"message":"slow down","type":"rate_limit_error"}}"#,
                &[("retry-after", after)],
            )
        }
        Fault::Server => {
            let status = [500, 502, 503, 529][rng.random_range(0..4)];
            Behaviour::status(status, r#"{"error":{"message":"overloaded"}}"#, &[])
        }
        Fault::ResetBeforeHeaders => Behaviour::DropBeforeHeaders,
        Fault::StallBeforeHeaders => Behaviour::StallBeforeHeaders,
        Fault::ResetMidStream => Behaviour::Stream {
            steps: steps(&events[..cut]),
            ending: Ending::Disconnect,
        },
        Fault::StallMidStream => Behaviour::Stream {
            steps: steps(&events[..cut]),
            ending: Ending::Stall,
        },
        Fault::Malformed => {
            let mut s = steps(&events[..cut]);
            let bad: &[u8] = match rng.random_range(0..4) {
                0 => b"data: {\"choices\":[{\"delta\":{\"content\":7}}]\n\n",
                1 => b"data: {not json}\n\n",
                2 => {
                    b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":9999999}]}}]}\n\n"
                }
                _ => b"data: \xff\xfe\n\n",
            };
            s.push(Step::Write(bad.to_vec()));
            s.extend(steps(&events[cut..]));
            s.push(Step::Write(b"data: [DONE]\n\n".to_vec()));
            Behaviour::Stream {
                steps: s,
                ending: Ending::Clean,
            }
        }
        Fault::Truncated => {
            let mut s = steps(&events[..cut]);
            let whole = sse_event(&events[cut]);
            let keep = rng.random_range(1..whole.len() - 1);
            s.push(Step::Write(whole[..keep].to_vec()));
            let ending = if rng.random_bool(0.5) {
                Ending::Clean
            } else {
                Ending::Disconnect
            };
            Behaviour::Stream { steps: s, ending }
        }
        Fault::EarlyEnd => Behaviour::Stream {
            steps: steps(&events[..cut]),
            ending: Ending::Clean,
        },
    };
    (fault, behaviour)
}

/// An input sent to the running agent.
#[derive(Clone, Copy, Debug)]
enum Op {
    Followup,
    Steer,
    Cancel { keep_inbox: bool },
    Pause(u64),
    Restart,
}

fn op(rng: &mut StdRng) -> Op {
    match rng.random_range(0..20) {
        0..=5 => Op::Followup,
        6..=8 => Op::Steer,
        9..=10 => Op::Cancel {
            keep_inbox: rng.random_bool(0.5),
        },
        11 => Op::Restart,
        _ => Op::Pause(rng.random_range(0..60)),
    }
}

/// Everything one seed decides.
struct Schedule {
    answers: Vec<(Fault, Behaviour)>,
    ops: Vec<Op>,
}

fn schedule(seed: u64) -> Schedule {
    let mut rng = StdRng::seed_from_u64(seed);
    let answers = (0..ANSWERS).map(|i| answer(&mut rng, seed, i)).collect();
    let n_ops = rng.random_range(1..=8);
    let mut ops = vec![Op::Followup];
    ops.extend((1..n_ops).map(|_| op(&mut rng)));
    Schedule { answers, ops }
}

/// A tool that sleeps the `ms` its arguments name (cooperating with cancellation) and counts how
/// often its body ran for each call id.
struct Sleepy {
    name: &'static str,
    mode: ExecutionMode,
    runs: Arc<Mutex<BTreeMap<String, usize>>>,
}

#[async_trait::async_trait]
impl Tool for Sleepy {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "sleeps ms milliseconds"
    }
    fn parameters(&self) -> Value {
        json!({"type":"object","properties":{"ms":{"type":"integer"}}})
    }
    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        self.mode
    }
    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        *self
            .runs
            .lock()
            .expect("runs lock")
            .entry(call.call_id.clone())
            .or_default() += 1;
        let ms = call
            .arguments
            .json()
            .and_then(|v| v.get("ms"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => ToolOutput::text("slept"),
            () = cancel.cancelled() => ToolOutput::error("cancelled", None),
        }
    }
}

/// The checks every schedule's log must pass; `Err` says which failed.
fn check_log(log: &[Event], sent: &[String], runs: &BTreeMap<String, usize>) -> Result<(), String> {
    invariant::check(log).map_err(|v| format!("invariant: {v}"))?;
    if !invariant::is_balanced(log) {
        return Err("the log ends inside a turn".into());
    }
    // Every tool/call answered exactly once; results without a call only as TOOL_NOT_STARTED.
    let mut calls: BTreeMap<String, usize> = BTreeMap::new();
    let mut results: BTreeMap<String, usize> = BTreeMap::new();
    for e in log {
        match &e.data {
            EventData::ToolCall(c) => *calls.entry(c.call_id.clone()).or_default() += 1,
            EventData::ToolResult(r) if e.surface_op.is_some() => {
                let id = r
                    .message
                    .source
                    .str_field("callId")
                    .unwrap_or("")
                    .to_string();
                let not_started = r
                    .error
                    .as_ref()
                    .is_some_and(|x| x.code == "TOOL_NOT_STARTED");
                if !not_started {
                    *results.entry(id).or_default() += 1;
                }
            }
            _ => {}
        }
    }
    for (id, n) in &calls {
        if *n != 1 {
            return Err(format!("tool/call {id} logged {n} times"));
        }
        if results.get(id) != Some(&1) {
            return Err(format!(
                "tool/call {id} answered {} times",
                results.get(id).copied().unwrap_or(0)
            ));
        }
    }
    if let Some(id) = results.keys().find(|id| !calls.contains_key(*id)) {
        return Err(format!("tool/result for {id} without its tool/call"));
    }
    // No tool body ran twice for one call id, and none ran without its logged call.
    for (id, n) in runs {
        if *n > 1 {
            return Err(format!("the body of call {id} ran {n} times"));
        }
        if !calls.contains_key(id) {
            return Err(format!(
                "the body of call {id} ran without a logged tool/call"
            ));
        }
    }
    // Retries within the policy: numbered 1, 2, … within a chain, never past the budget or the cap.
    let mut chains: BTreeMap<String, u64> = BTreeMap::new();
    for e in log {
        if let EventData::LlmRetry(r) = &e.data {
            let last = chains.entry(r.retry_id.clone()).or_default();
            if r.retry != *last + 1 {
                return Err(format!("retry {} of chain after {}", r.retry, last));
            }
            *last = r.retry;
            if r.retry > MAX_RETRIES || r.max_retries != Some(MAX_RETRIES) {
                return Err(format!("retry {} past the budget", r.retry));
            }
            let delay = r.delay_ms.as_f64().unwrap_or(f64::MAX);
            if !(0.0..=MAX_DELAY_MS as f64).contains(&delay) {
                return Err(format!("retry delay {delay} past the cap"));
            }
        }
    }
    // Every acknowledged input entered once, was discarded by a logged cancel, or is pending.
    let entered: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) => Some(m.id.to_string()),
            _ => None,
        })
        .collect();
    let entered_set: BTreeSet<&String> = entered.iter().collect();
    if entered_set.len() != entered.len() {
        return Err("a message entered twice".into());
    }
    let mut inbox = dsh::inbox::Inbox::new();
    let mut discarded = BTreeSet::new();
    for e in log {
        if let EventData::InboxSpliced(s) = &e.data {
            let removed = inbox.apply(s).map_err(|e| format!("splice replay: {e}"))?;
            if s.outcome.is_some() {
                discarded.extend(removed.iter().map(|m| m.id.to_string()));
            }
        }
    }
    let pending: BTreeSet<String> = inbox
        .next_turn()
        .iter()
        .chain(inbox.next_step().iter())
        .map(|m| m.id.to_string())
        .collect();
    for id in sent {
        let n = usize::from(entered_set.contains(id))
            + usize::from(discarded.contains(id))
            + usize::from(pending.contains(id));
        if n != 1 {
            return Err(format!("acknowledged input {id} accounted {n} times"));
        }
    }
    Ok(())
}

/// What one schedule saw, for the figures.
#[derive(Default)]
struct Seen {
    faults: BTreeMap<String, usize>,
    requests: usize,
    retries: usize,
    tool_runs: usize,
}

async fn run_schedule(seed: u64) -> Result<Seen, String> {
    let Schedule { answers, ops } = schedule(seed);
    let server = FakeServer::start(answers.iter().map(|(_, b)| b.clone()).collect()).await;
    let config = OpenAiConfig {
        base_url: server.base_url(),
        api_key: Some(ApiKey::new("sk-fault-schedules").expect("valid key")),
        connect_timeout_ms: 2_000,
        idle_timeout_ms: IDLE_TIMEOUT_MS,
        ..OpenAiConfig::default()
    };
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(OpenAiProvider::new(config).expect("valid config")));
    let runs = Arc::new(Mutex::new(BTreeMap::new()));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Sleepy {
        name: "sleepy",
        mode: ExecutionMode::Parallel,
        runs: runs.clone(),
    }));
    tools.register(Arc::new(Sleepy {
        name: "barrier",
        mode: ExecutionMode::Exclusive,
        runs: runs.clone(),
    }));
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let host = Host::builder(store)
        .providers(providers)
        .tools(tools)
        .retry(DefaultRetry::Policy(policy()))
        .start()
        .await
        .map_err(|e| format!("host: {e}"))?;
    let mut spec = AgentSpec::new(AgentConfig::new("openai", "fault-model"));
    spec.config.max_parallel_tool_calls = 2;
    let mut agent = host
        .create(spec)
        .await
        .map_err(|e| format!("create: {e}"))?;
    let mut sent = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let id = format!("s{seed}-m{i}");
        let msg = || Message::user_text(MessageId::new(&id).expect("valid id"), "go");
        match *op {
            Op::Followup => {
                agent
                    .followup(msg())
                    .await
                    .map_err(|e| format!("followup: {e}"))?;
                sent.push(id);
            }
            Op::Steer => {
                agent
                    .steer(msg())
                    .await
                    .map_err(|e| format!("steer: {e}"))?;
                sent.push(id);
            }
            Op::Cancel { keep_inbox } => agent
                .cancel(CancelCause::User, keep_inbox)
                .await
                .map_err(|e| format!("cancel: {e}"))?,
            Op::Pause(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            Op::Restart => {
                agent = host
                    .restart(agent.id())
                    .await
                    .map_err(|e| format!("restart: {e}"))?;
            }
        }
    }
    let idle = agent
        .when_idle_for(Duration::from_secs(60))
        .await
        .map_err(|e| format!("when_idle: {e}"))?;
    if !idle {
        return Err("the agent never became idle".into());
    }
    let log = agent.log().await.map_err(|e| format!("log: {e}"))?;
    let runs = runs.lock().expect("runs lock").clone();
    check_log(&log, &sent, &runs)?;
    // A crash now, then resume: the reloaded log passes the same checks.
    let agent = host
        .restart(agent.id())
        .await
        .map_err(|e| format!("final restart: {e}"))?;
    let reloaded = agent.log().await.map_err(|e| format!("log: {e}"))?;
    check_log(&reloaded, &sent, &runs)?;
    host.shutdown().await;
    let requests = server.requests().len();
    let mut seen = Seen {
        requests,
        retries: log
            .iter()
            .filter(|e| matches!(e.data, EventData::LlmRetry(_)))
            .count(),
        tool_runs: runs.values().sum(),
        ..Seen::default()
    };
    for (fault, _) in answers.iter().take(requests) {
        *seen.faults.entry(format!("{fault:?}")).or_default() += 1;
    }
    Ok(seen)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn provider_fault_schedules() {
    let seeds: Vec<u64> = match env_u64("FAULT_SEED") {
        Some(seed) => vec![seed],
        None => {
            let base = env_u64("FAULT_SEED_BASE").unwrap_or(0);
            let n = env_u64("FAULT_SCHEDULES").unwrap_or(120);
            (base..base + n).collect()
        }
    };
    let panics = panics();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let done = Arc::new(AtomicUsize::new(0));
    let mut total = Seen::default();
    let started = std::time::Instant::now();
    // A few schedules at once: each is mostly waiting on sockets and timers.
    let parallel = env_u64("FAULT_PARALLEL").map_or(8, |n| n.max(1) as usize);
    for batch in seeds.chunks(parallel) {
        let before = panics.lock().expect("lock").len();
        let results = rt.block_on(async {
            let tasks: Vec<_> = batch
                .iter()
                .map(|&seed| (seed, tokio::spawn(run_schedule(seed))))
                .collect();
            let mut out = Vec::new();
            for (seed, task) in tasks {
                out.push((seed, task.await));
            }
            out
        });
        for (seed, result) in results {
            match result {
                Ok(Ok(seen)) => {
                    total.requests += seen.requests;
                    total.retries += seen.retries;
                    total.tool_runs += seen.tool_runs;
                    for (k, v) in seen.faults {
                        *total.faults.entry(k).or_default() += v;
                    }
                }
                Ok(Err(why)) => panic!(
                    "fault schedule seed {seed} failed: {why}\nreplay: FAULT_SEED={seed} cargo test --test faults"
                ),
                Err(e) => panic!(
                    "fault schedule seed {seed} panicked: {e}\nreplay: FAULT_SEED={seed} cargo test --test faults"
                ),
            }
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_multiple_of(500) {
                eprintln!(
                    "fault schedules: {n} done, {} requests, {:.0} s",
                    total.requests,
                    started.elapsed().as_secs_f64()
                );
            }
        }
        let after = panics.lock().expect("lock").clone();
        assert_eq!(
            after.len(),
            before,
            "a panic during seeds {batch:?}: {:?}\nreplay each: FAULT_SEED=N cargo test --test faults",
            &after[before..]
        );
    }
    eprintln!(
        "fault schedules: {} schedules, {} requests, {} retries, {} tool bodies, faults served {:?}, {:.1} s",
        done.load(Ordering::Relaxed),
        total.requests,
        total.retries,
        total.tool_runs,
        total.faults,
        started.elapsed().as_secs_f64()
    );
}

/// Found by seed 93: a stream whose tool call never names an id (here a malformed `tool_calls`
/// entry with only an index) used to reach the tool machinery with call id `""`; the turn machine
/// then built an invalid `tool/result` and panicked, and the repair of the log it left could not
/// close the call either, so the session could never resume. Now the response is malformed: the
/// turn ends `error` with `MALFORMED_RESPONSE`, nothing runs, and the agent goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_call_without_an_id_is_a_malformed_response() {
    let before = panics().lock().expect("lock").len();
    let body = [
        json!({"choices":[{"delta":{"role":"assistant","content":null}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":7}]}}]}),
        json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
    ]
    .iter()
    .flat_map(sse_event)
    .chain(b"data: [DONE]\n\n".iter().copied())
    .collect::<Vec<u8>>();
    let text = [
        json!({"choices":[{"delta":{"content":"fine"}}]}),
        json!({"choices":[{"delta":{},"finish_reason":"stop"}]}),
    ]
    .iter()
    .flat_map(sse_event)
    .chain(b"data: [DONE]\n\n".iter().copied())
    .collect::<Vec<u8>>();
    let server = FakeServer::start(vec![Behaviour::sse(body), Behaviour::sse(text)]).await;
    let config = OpenAiConfig {
        base_url: server.base_url(),
        api_key: Some(ApiKey::new("sk-fault-schedules").expect("valid key")),
        ..OpenAiConfig::default()
    };
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(OpenAiProvider::new(config).expect("valid config")));
    let runs = Arc::new(Mutex::new(BTreeMap::new()));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Sleepy {
        name: "sleepy",
        mode: ExecutionMode::Parallel,
        runs: runs.clone(),
    }));
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let host = Host::builder(store)
        .providers(providers)
        .tools(tools)
        .retry(DefaultRetry::Policy(policy()))
        .start()
        .await
        .expect("host");
    let agent = host
        .create(AgentSpec::new(AgentConfig::new("openai", "m")))
        .await
        .expect("create");
    let sent = vec!["a".to_string(), "b".to_string()];
    for id in &sent {
        agent
            .followup(Message::user_text(MessageId::new(id).expect("id"), "go"))
            .await
            .expect("followup");
        assert!(
            agent
                .when_idle_for(Duration::from_secs(30))
                .await
                .expect("alive")
        );
    }
    let log = agent.log().await.expect("log");
    let ends: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::TurnEnd(t) => {
                Some(serde_json::to_value(&t.reason).expect("json")["kind"].to_string())
            }
            _ => None,
        })
        .collect();
    assert_eq!(ends, ["\"error\"", "\"completed\""]);
    let failure = log.iter().find_map(|e| match &e.data {
        EventData::TurnEnd(t) => Some(serde_json::to_value(&t.reason).expect("json")),
        _ => None,
    });
    assert_eq!(
        failure.expect("a turn end")["error"]["code"],
        "MALFORMED_RESPONSE"
    );
    assert!(!log.iter().any(|e| matches!(e.data, EventData::ToolCall(_))));
    assert!(runs.lock().expect("runs").is_empty());
    check_log(&log, &sent, &BTreeMap::new()).expect("a valid log");
    let resumed = host.restart(agent.id()).await.expect("resumes");
    let reloaded = resumed.log().await.expect("log");
    check_log(&reloaded, &sent, &BTreeMap::new()).expect("a valid log after the restart");
    let texts = |l: &[Event]| l.iter().map(Event::to_json).collect::<Vec<_>>();
    assert_eq!(texts(&reloaded[..log.len()]), texts(&log));
    host.shutdown().await;
    assert_eq!(panics().lock().expect("lock").len(), before, "no panic");
}
