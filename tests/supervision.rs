//! Supervision: every way a part of an agent can fail is contained and recovered as SPEC §7 says.
//! - a tool actor panics → an error result the model sees, the turn continues;
//! - a stream actor panics → a failure offered to `request_error` (retried here, or the turn errors);
//! - the session writer fails → the agent refuses input with a clear error, observers are told;
//! - the agent actor panics → the host restarts it from its log (repair included, pending input kept)
//!   under the restart intensity, then marks it failed and tells observers.

mod runtime_support;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dsh::hooks::{HookError, Hooks, Recovery, RequestErrorCtx, RequestErrorHook};
use dsh::llm::provider::{ChunkStream, Provider, ProviderRegistry};
use dsh::llm::script::ScriptEntry;
use dsh::llm::types::{LlmRequest, StreamChunk};
use dsh::session::event::{EventData, TurnEndReason};
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::turn::AgentConfig;
use dsh_actors::{AgentSpec, Host, HostConfig, InputError, Observation, Observed};
use futures::Stream;
use runtime_support::*;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_becomes_an_error_result_and_the_turn_continues() {
    let w = World::with_tools(
        vec![
            ScriptEntry::tool_calls([("c1", "boom", "{}"), ("c2", "echo", "{}")]),
            ScriptEntry::text("recovered"),
        ],
        vec![TestTool::panicking("boom"), TestTool::parallel("echo")],
    )
    .await;
    w.agent.followup(user("go")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    let results: Vec<(String, bool, Option<String>)> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) => Some((
                tool_result_text(&r.message),
                r.error.is_some(),
                r.error.as_ref().map(|e| e.code.clone()),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2);
    assert!(
        results[0].0.starts_with("Error: tool panicked"),
        "{results:?}"
    );
    assert_eq!(results[0].2.as_deref(), Some("TOOL_PANICKED"));
    assert_eq!(results[1].0, "echo: ok");
    assert_eq!(
        w.script.requests().len(),
        2,
        "the model saw the error and answered"
    );
    assert_eq!(reasons(&log), [TurnEndReason::Completed]);
    assert_valid(&log);
    w.host.shutdown().await;
}

/// A provider whose first `n_panics` streams panic when polled, then answer "fine".
struct PanickyProvider {
    n_panics: usize,
    calls: AtomicUsize,
}

impl Provider for PanickyProvider {
    fn name(&self) -> &str {
        "panicky"
    }
    fn stream(&self, _request: LlmRequest, _cancel: CancellationToken) -> ChunkStream {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        if call < self.n_panics {
            Box::pin(PanicStream)
        } else {
            let chunks = ScriptEntry::text("fine").planned_chunks();
            Box::pin(futures::stream::iter(chunks))
        }
    }
}

struct PanicStream;

impl Stream for PanicStream {
    type Item = StreamChunk;
    fn poll_next(
        self: Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<StreamChunk>> {
        panic!("provider bug")
    }
}

struct RetryOnce;

#[async_trait::async_trait]
impl RequestErrorHook for RetryOnce {
    async fn request_error(&self, ctx: &RequestErrorCtx) -> Result<Recovery, HookError> {
        assert!(
            ctx.failure.message.contains("provider bug"),
            "{:?}",
            ctx.failure
        );
        Ok(if ctx.retries.is_empty() {
            Recovery::Retry
        } else {
            Recovery::Delegate
        })
    }
}

async fn panicky_host(n_panics: usize, hooks: Hooks) -> (Host, dsh_actors::AgentHandle) {
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(PanickyProvider {
        n_panics,
        calls: AtomicUsize::new(0),
    }));
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let host = Host::builder(store)
        .providers(providers)
        .hooks(hooks)
        .start()
        .await
        .unwrap();
    let agent = host
        .create(AgentSpec::new(AgentConfig::new("panicky", "m")))
        .await
        .unwrap();
    (host, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_stream_is_a_failure_offered_to_request_error() {
    let mut hooks = Hooks::new();
    hooks.request_error.push(Arc::new(RetryOnce));
    let (host, agent) = panicky_host(1, hooks).await;
    agent.followup(user("hi")).await.unwrap();
    agent.when_idle().await.unwrap();
    let log = agent.log().await.unwrap();
    assert_eq!(reasons(&log), [TurnEndReason::Completed]);
    // One step: the failed attempt's finish chunk, then the retried attempt.
    assert_eq!(
        kinds(&log).iter().filter(|k| **k == "step/start").count(),
        1
    );
    let messages: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::AssistantMessage(a) => Some(a.message.text()),
            _ => None,
        })
        .collect();
    assert_eq!(messages, ["fine"]);
    assert_valid(&log);

    // Without a recovery hook the turn ends with the failure.
    let (host2, agent2) = panicky_host(1, Hooks::new()).await;
    agent2.followup(user("hi")).await.unwrap();
    agent2.when_idle().await.unwrap();
    let log = agent2.log().await.unwrap();
    match &reasons(&log)[..] {
        [TurnEndReason::Error { error }] => {
            assert_eq!(error.code, "UNKNOWN");
            assert!(error.message.contains("provider bug"), "{error:?}");
        }
        other => panic!("{other:?}"),
    }
    assert_valid(&log);
    host.shutdown().await;
    host2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_store_makes_the_agent_refuse_input() {
    let w = World::new(vec![ScriptEntry::text("ok")]).await;
    let mut sub = w.agent.subscribe();
    w.store.set_fail_appends(true);
    let err = w.agent.followup(user("hi")).await.unwrap_err();
    assert!(
        matches!(&err, InputError::Failed { reason, .. } if reason.contains("store")),
        "{err}"
    );
    let err = w.agent.inject(user("more")).await.unwrap_err();
    assert!(matches!(err, InputError::Failed { .. }), "{err}");
    let failed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match sub.next().await {
                Some(Observation::Item(Observed::Failed { reason, .. })) => return reason,
                Some(_) => {}
                None => panic!("subscription closed"),
            }
        }
    })
    .await
    .unwrap();
    assert!(failed.contains("store"), "{failed}");
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_agent_restarts_from_its_log_then_fails_past_the_intensity() {
    let config = HostConfig {
        restart_max: 3,
        restart_window: Duration::from_secs(60),
        ..HostConfig::default()
    };
    let w = World::build(
        vec![
            ScriptEntry::text("one"),
            ScriptEntry::hang("thinking"),
            ScriptEntry::text("three"),
            ScriptEntry::text("four"),
        ],
        Vec::new(),
        Hooks::new(),
        config,
    )
    .await;
    let mut sub = w.host.subscribe();
    w.agent.followup(user("first")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    // A turn left open mid-stream, and input pending behind it.
    w.agent.followup(user("second")).await.unwrap();
    w.wait_for("assistant/chunk", 9).await;
    w.agent.followup(user("third")).await.unwrap();
    w.agent.inject_panic().await.unwrap();

    // Restart 1: the open turn is repaired, "third" is still pending, and the handle keeps working.
    let restarted = next_matching(&mut sub, |o| matches!(o, Observed::Restarted { .. })).await;
    assert!(restarted);
    let log = w.agent.log().await.unwrap();
    assert_eq!(
        reasons(&log),
        [TurnEndReason::Completed, TurnEndReason::Interrupted]
    );
    assert_valid(&log);
    let status = w.agent.status().await.unwrap();
    assert_eq!(status.n_pending_turn, 1);
    w.agent.followup(user("fourth")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.agent.log().await.unwrap();
    assert_eq!(user_texts(&log), ["first", "second", "third", "fourth"]);
    assert_eq!(
        reasons(&log)[2..],
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    assert_valid(&log);

    // Restarts 2 and 3 succeed; the 4th failure within the window marks the agent failed.
    for _ in 0..2 {
        w.agent.inject_panic().await.unwrap();
        assert!(next_matching(&mut sub, |o| matches!(o, Observed::Restarted { .. })).await);
    }
    w.agent.inject_panic().await.unwrap();
    assert!(next_matching(&mut sub, |o| matches!(o, Observed::Failed { .. })).await);
    let err = w.agent.followup(user("refused")).await.unwrap_err();
    assert!(
        matches!(&err, InputError::Failed { reason, .. } if reason.contains("restarted 3 times")),
        "{err}"
    );
    w.host.shutdown().await;
}

async fn next_matching(
    sub: &mut dsh_actors::Subscription,
    want: impl Fn(&Observed) -> bool,
) -> bool {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match sub.next().await {
                Some(Observation::Item(o)) if want(&o) => return true,
                Some(_) => {}
                None => return false,
            }
        }
    })
    .await
    .unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// Supervision under fire (RELIABILITY.md §6)
// ---------------------------------------------------------------------------------------------

/// What is injected into one agent of the fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fire {
    /// Nothing: this agent's turns must complete as if nothing happened elsewhere.
    Clean,
    /// Every call of its tool panics.
    Tool,
    /// Its `pre_step` hook panics.
    Hook,
    /// Every other stream of its provider panics when polled.
    Stream,
    /// The store panics inside its session writer's append, from its 4th append on.
    Writer,
    /// The agent actor itself panics this many times between turns.
    Restarts(u32),
}

/// The plan: which agent gets what.
type FirePlan = Arc<std::collections::HashMap<dsh::SessionId, Fire>>;

fn fire_of(plan: &FirePlan, id: &dsh::SessionId) -> Fire {
    plan.get(id).copied().unwrap_or(Fire::Clean)
}

/// A tool that answers after a millisecond, or panics for `Fire::Tool` agents.
struct FireTool(FirePlan);

#[async_trait::async_trait]
impl dsh::tools::Tool for FireTool {
    fn name(&self) -> &str {
        "work"
    }
    fn description(&self) -> &str {
        "works for a millisecond"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"what": {"type": "string"}}})
    }
    fn execution_mode(&self, _args: &dsh::tools::ToolArgs) -> dsh::tools::ExecutionMode {
        dsh::tools::ExecutionMode::Parallel
    }
    async fn execute(
        &self,
        call: dsh::tools::ToolInvocation,
        _cancel: CancellationToken,
    ) -> dsh::tools::ToolOutput {
        if fire_of(&self.0, &call.session_id) == Fire::Tool {
            panic!("injected tool panic in {}", call.session_id);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        dsh::tools::ToolOutput::text("done")
    }
}

/// A `pre_step` hook that enters every step as proposed, or panics for `Fire::Hook` agents.
struct FireHook(FirePlan);

#[async_trait::async_trait]
impl dsh::hooks::PreStepHook for FireHook {
    async fn pre_step(
        &self,
        ctx: &dsh::hooks::HookCtx,
        messages: Vec<Arc<dsh::llm::types::Message>>,
    ) -> Result<dsh::hooks::PreStepDecision, HookError> {
        if fire_of(&self.0, &ctx.session_id) == Fire::Hook {
            panic!("injected hook panic in {}", ctx.session_id);
        }
        Ok(dsh::hooks::PreStepDecision::Enter(messages))
    }
}

/// The simulated model, except that every other stream panics when polled (provider `fire`, used
/// only by `Fire::Stream` agents).
struct FireProvider {
    sim: dsh::llm::sim::SimProvider,
    calls: AtomicUsize,
}

impl Provider for FireProvider {
    fn name(&self) -> &str {
        "fire"
    }
    fn stream(&self, request: LlmRequest, cancel: CancellationToken) -> ChunkStream {
        if self.calls.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
            Box::pin(PanicStream)
        } else {
            self.sim.stream(request, cancel)
        }
    }
}

/// A memory store whose `append` panics for `Fire::Writer` agents from their 4th append on.
struct FireStore {
    inner: MemoryStore,
    plan: FirePlan,
    appends: std::sync::Mutex<std::collections::HashMap<dsh::SessionId, usize>>,
}

#[async_trait::async_trait]
impl SessionStore for FireStore {
    fn name(&self) -> &'static str {
        "fire"
    }
    async fn create(
        &self,
        header: &dsh::session::event::SessionHeader,
    ) -> Result<(), dsh::session::store::StoreError> {
        self.inner.create(header).await
    }
    async fn append(
        &self,
        id: &dsh::SessionId,
        events: Vec<dsh::session::store::EncodedEvent>,
    ) -> Result<(), dsh::session::store::StoreError> {
        if fire_of(&self.plan, id) == Fire::Writer {
            let n = {
                let mut appends = self.appends.lock().unwrap();
                let n = appends.entry(id.clone()).or_default();
                *n += 1;
                *n
            };
            if n > 3 {
                panic!("injected store panic in the session writer of {id}");
            }
        }
        self.inner.append(id, events).await
    }
    async fn load(
        &self,
        id: &dsh::SessionId,
    ) -> Result<dsh::session::store::LoadedSession, dsh::session::store::StoreError> {
        self.inner.load(id).await
    }
    async fn inspect(
        &self,
        id: &dsh::SessionId,
    ) -> Result<dsh::session::store::Inspection, dsh::session::store::StoreError> {
        self.inner.inspect(id).await
    }
    async fn list(
        &self,
    ) -> Result<Vec<dsh::session::store::SessionSummary>, dsh::session::store::StoreError> {
        self.inner.list().await
    }
    async fn delete(&self, id: &dsh::SessionId) -> Result<bool, dsh::session::store::StoreError> {
        self.inner.delete(id).await
    }
    async fn header(
        &self,
        id: &dsh::SessionId,
    ) -> Result<Option<dsh::session::event::SessionHeader>, dsh::session::store::StoreError> {
        self.inner.header(id).await
    }
}

/// What one agent of the fleet saw.
struct Outcome {
    fire: Fire,
    /// Wall time of each turn (followup to idle) that completed.
    turn_ms: Vec<f64>,
    /// The error that made it refuse input, if any.
    refused: Option<InputError>,
    log: Vec<dsh::session::Event>,
}

const FIRE_TURNS: usize = 3;
const FIRE_RESTART_MAX: u32 = 3;

/// Runs `n_agents` agents for `FIRE_TURNS` turns each, all at once, with the faults of `plan`;
/// checks containment and returns every agent's outcome.
async fn under_fire(n_agents: usize, plan: FirePlan) -> Vec<Outcome> {
    let sim = dsh::llm::sim::SimProvider::new(dsh::llm::sim::SimConfig {
        tool_call_probability: 0.5,
        reply_tokens_min: 4,
        reply_tokens_max: 16,
        ..dsh::llm::sim::SimConfig::instant(7)
    })
    .unwrap();
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(sim.clone()));
    providers.register(Arc::new(FireProvider {
        sim,
        calls: AtomicUsize::new(0),
    }));
    let mut tools = dsh::tools::ToolRegistry::new();
    tools.register(Arc::new(FireTool(Arc::clone(&plan))));
    let mut hooks = Hooks::new();
    hooks.pre_step.push(Arc::new(FireHook(Arc::clone(&plan))));
    let store = Arc::new(FireStore {
        inner: MemoryStore::new(),
        plan: Arc::clone(&plan),
        appends: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let host = Host::builder(store as Arc<dyn SessionStore>)
        .providers(providers)
        .tools(tools)
        .hooks(hooks)
        .config(HostConfig {
            restart_max: FIRE_RESTART_MAX,
            restart_window: Duration::from_secs(600),
            hibernate_after: None,
            ..HostConfig::default()
        })
        .start()
        .await
        .unwrap();
    let mut drivers = Vec::new();
    for i in 0..n_agents {
        let id = dsh::SessionId::new(&format!("fire-{i}")).unwrap();
        let fire = fire_of(&plan, &id);
        let provider = if fire == Fire::Stream { "fire" } else { "sim" };
        let agent = host
            .create(AgentSpec::new(AgentConfig::new(provider, "m")).with_id(id))
            .await
            .unwrap();
        drivers.push(tokio::spawn(async move {
            let mut outcome = Outcome {
                fire,
                turn_ms: Vec::new(),
                refused: None,
                log: Vec::new(),
            };
            for turn in 0..FIRE_TURNS {
                if let Fire::Restarts(n) = fire
                    && turn == 1
                {
                    let mut sub = agent.subscribe();
                    for _ in 0..n {
                        // Delivered to the live instance (a restarting one is retried), then wait
                        // for the host's verdict before the next panic.
                        let deadline = std::time::Instant::now() + Duration::from_secs(20);
                        while agent.inject_panic().await.is_err() {
                            assert!(std::time::Instant::now() < deadline, "{}", agent.id());
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        let verdict = next_matching(&mut sub, |o| {
                            matches!(o, Observed::Restarted { .. } | Observed::Failed { .. })
                        })
                        .await;
                        assert!(verdict, "{}: no restart or failure observed", agent.id());
                    }
                }
                let started = std::time::Instant::now();
                if let Err(e) = agent.followup(user(&format!("turn {turn}"))).await {
                    outcome.refused = Some(e);
                    break;
                }
                match agent.when_idle_for(Duration::from_secs(60)).await {
                    Ok(true) => outcome.turn_ms.push(started.elapsed().as_secs_f64() * 1e3),
                    Ok(false) => panic!("{}: hung under fire ({fire:?})", agent.id()),
                    Err(e) => {
                        outcome.refused = Some(e);
                        break;
                    }
                }
            }
            outcome.log = agent.log().await.unwrap_or_default();
            outcome
        }));
    }
    let mut outcomes = Vec::new();
    for driver in drivers {
        outcomes.push(driver.await.expect("a driver task panicked"));
    }
    host.shutdown().await;
    for (i, o) in outcomes.iter().enumerate() {
        let id = format!("fire-{i}");
        if !o.log.is_empty()
            && let Err(v) = dsh::session::invariant::check(&o.log)
        {
            panic!("{id} ({:?}): {v}", o.fire);
        }
        match o.fire {
            Fire::Clean | Fire::Tool | Fire::Hook | Fire::Stream => {
                // Contained: the agent itself keeps working; only its own turns may end in error.
                assert!(o.refused.is_none(), "{id} ({:?}): {:?}", o.fire, o.refused);
                assert_eq!(reasons(&o.log).len(), FIRE_TURNS, "{id} ({:?})", o.fire);
                if o.fire == Fire::Clean {
                    assert!(
                        reasons(&o.log)
                            .iter()
                            .all(|r| *r == TurnEndReason::Completed),
                        "{id}: a clean agent was hit: {:?}",
                        reasons(&o.log)
                    );
                }
            }
            Fire::Writer => {
                assert!(
                    matches!(&o.refused, Some(InputError::Failed { reason, .. }) if reason.contains("writer") || reason.contains("store")),
                    "{id}: a panic in the session writer must fail the agent: {:?}",
                    o.refused
                );
            }
            Fire::Restarts(n) if n <= FIRE_RESTART_MAX => {
                assert!(o.refused.is_none(), "{id} ({:?}): {:?}", o.fire, o.refused);
                assert_eq!(reasons(&o.log).len(), FIRE_TURNS, "{id}");
            }
            Fire::Restarts(_) => {
                assert!(
                    matches!(&o.refused, Some(InputError::Failed { reason, .. }) if reason.contains("restarted")),
                    "{id}: past the restart intensity the agent must fail: {:?}",
                    o.refused
                );
            }
        }
    }
    outcomes
}

/// The seeded plan: a `fault_share` of the agents get one fault each, spread over every kind.
fn fire_plan(n_agents: usize, fault_share: f64, seed: u64) -> FirePlan {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kinds = [
        Fire::Tool,
        Fire::Hook,
        Fire::Stream,
        Fire::Writer,
        Fire::Restarts(FIRE_RESTART_MAX),
        Fire::Restarts(FIRE_RESTART_MAX + 1),
    ];
    let mut plan = std::collections::HashMap::new();
    for i in 0..n_agents {
        if rng.random_bool(fault_share) {
            let fire = kinds[rng.random_range(0..kinds.len())];
            plan.insert(dsh::SessionId::new(&format!("fire-{i}")).unwrap(), fire);
        }
    }
    Arc::new(plan)
}

fn p99(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return 0.0;
    }
    let idx = ((ms.len() as f64) * 0.99).ceil() as usize;
    ms[idx.clamp(1, ms.len()) - 1]
}

/// Panics injected into tools, hooks, streams, session writers and agent actors of a fleet (a third
/// of the agents): every failure stays with its agent, the restart intensity holds, and the clean
/// agents complete every turn. Prints the clean agents' turn-latency p99 with and without the
/// faults (a figure, not an assertion). `DSH_FIRE_AGENTS` sets the fleet (default 120; RELIABILITY.md
/// §6 runs 1,000), `DSH_FIRE_SEED` the plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn supervision_under_fire_contains_every_failure() {
    let n_agents: usize = std::env::var("DSH_FIRE_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120);
    let seed: u64 = std::env::var("DSH_FIRE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let plan = fire_plan(n_agents, 1.0 / 3.0, seed);
    for kind in ["Tool", "Hook", "Stream", "Writer", "Restarts"] {
        assert!(
            plan.values().any(|f| format!("{f:?}").starts_with(kind)),
            "the plan has no {kind} fault; pick another seed"
        );
    }
    let baseline = under_fire(n_agents, Arc::new(std::collections::HashMap::new())).await;
    let fired = under_fire(n_agents, Arc::clone(&plan)).await;
    let clean_ms = |outcomes: &[Outcome], only_clean_in: &FirePlan| -> Vec<f64> {
        outcomes
            .iter()
            .enumerate()
            .filter(|(i, _)| {
                let id = dsh::SessionId::new(&format!("fire-{i}")).unwrap();
                fire_of(only_clean_in, &id) == Fire::Clean
            })
            .flat_map(|(_, o)| o.turn_ms.iter().copied())
            .collect()
    };
    let n_faulted = plan.len();
    let n_failed = fired.iter().filter(|o| o.refused.is_some()).count();
    let n_tool_panics = fired
        .iter()
        .flat_map(|o| &o.log)
        .filter(|e| matches!(&e.data, EventData::ToolResult(r) if r.error.as_ref().is_some_and(|e| e.code == "TOOL_PANICKED")))
        .count();
    eprintln!(
        "supervision under fire: {n_agents} agents, {n_faulted} faulted, {n_failed} failed as \
         planned, {n_tool_panics} tool panics contained; clean agents' turn p99: {:.1} ms without \
         faults, {:.1} ms with",
        p99(clean_ms(&baseline, &plan)),
        p99(clean_ms(&fired, &plan))
    );
}

/// Regression: a store that panics inside `append` used to kill the session writer's append task
/// silently, so the agent waited for an acknowledgement forever and every input hung. The panic is
/// now a failed append: the input gets a clear error and the agent refuses the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_panicking_in_append_fails_the_agent_instead_of_hanging() {
    let id = dsh::SessionId::new("fire-0").unwrap();
    let plan: FirePlan = Arc::new([(id.clone(), Fire::Writer)].into_iter().collect());
    let store = Arc::new(FireStore {
        inner: MemoryStore::new(),
        plan,
        appends: std::sync::Mutex::new(std::collections::HashMap::new()),
    });
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(
        dsh::llm::sim::SimProvider::new(dsh::llm::sim::SimConfig::instant(1)).unwrap(),
    ));
    let host = Host::builder(store as Arc<dyn SessionStore>)
        .providers(providers)
        .start()
        .await
        .unwrap();
    let agent = host
        .create(AgentSpec::new(AgentConfig::new("sim", "m")).with_id(id))
        .await
        .unwrap();
    let mut first_error = None;
    for turn in 0..6 {
        let result = tokio::time::timeout(
            Duration::from_secs(10),
            agent.followup(user(&format!("turn {turn}"))),
        )
        .await
        .expect("an input hung behind a panicked append");
        match result {
            Ok(()) => {
                let idle = agent.when_idle_for(Duration::from_secs(10)).await;
                assert!(!matches!(idle, Ok(false)), "the agent hung");
            }
            Err(e) => {
                first_error = Some(e);
                break;
            }
        }
    }
    let err = first_error.expect("the 4th append panics, so some input must fail");
    assert!(
        matches!(&err, InputError::Failed { reason, .. } if reason.contains("the store panicked: injected store panic")),
        "{err}"
    );
    let again = agent.followup(user("still there?")).await.unwrap_err();
    assert!(matches!(again, InputError::Failed { .. }), "{again}");
    host.shutdown().await;
}
