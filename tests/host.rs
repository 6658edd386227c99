//! The host as an embedder builds it (`Host::builder(store).providers(..).start()`): failed model
//! requests are retried under the provider's policy by default, and the builder turns that off or
//! replaces the policy. `request_error` hooks of the host or the agent replace the default unless
//! the builder chose it, so an explicitly installed `RetryHook` runs alone.
//!
//! Time is paused: the default policy's first delay (500 ms ± 10 %) passes at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use dsh::hooks::{HookError, Hooks, Recovery, RequestErrorCtx, RequestErrorHook};
use dsh::ids::MessageId;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::retry::{RetryHook, RetryPolicy};
use dsh::llm::script::{Gates, ScriptEntry, ScriptProvider};
use dsh::llm::types::Message;
use dsh::session::Event;
use dsh::session::event::{EventData, LlmRetry, TurnEndReason};
use dsh::session::invariant;
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::turn::AgentConfig;
use dsh_actors::{AgentSpec, DefaultRetry, Host, HostBuilder};

/// A builder as the README's embedding example makes it: a store and providers, nothing else.
fn embedder(script: Vec<ScriptEntry>) -> HostBuilder {
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(ScriptProvider::new(script, Gates::new())));
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    Host::builder(store).providers(providers)
}

/// Runs one turn ("hi") on a new agent of `builder`'s host and returns the agent's log.
async fn one_turn(builder: HostBuilder) -> Vec<Event> {
    let host = builder.start().await.expect("the host starts");
    let agent = host
        .create(AgentSpec::new(AgentConfig::new("script", "scripted")))
        .await
        .expect("the agent starts");
    let hi = Message::user_text(MessageId::new("m1").expect("a valid id"), "hi");
    agent.followup(hi).await.expect("the prompt is durable");
    agent.when_idle().await.expect("the agent becomes idle");
    let log = agent.log().await.expect("the log reads back");
    host.shutdown().await;
    assert_eq!(invariant::check(&log), Ok(()));
    log
}

/// The log without the stream's chunks and the request events, which every test shares.
fn skeleton(log: &[Event]) -> Vec<&str> {
    log.iter()
        .map(Event::kind)
        .filter(|k| !matches!(*k, "assistant/chunk" | "request/header" | "request/context"))
        .collect()
}

fn retries(log: &[Event]) -> Vec<&LlmRetry> {
    log.iter()
        .filter_map(|e| match &e.data {
            EventData::LlmRetry(r) => Some(&**r),
            _ => None,
        })
        .collect()
}

fn turn_end(log: &[Event]) -> &TurnEndReason {
    log.iter()
        .find_map(|e| match &e.data {
            EventData::TurnEnd(end) => Some(&end.reason),
            _ => None,
        })
        .expect("the turn ended")
}

fn rate_limit() -> ScriptEntry {
    ScriptEntry::error("RATE_LIMIT", "slow down")
}

/// The turn's events when the first attempt failed and the retry answered "ok".
const RETRIED: [&str; 10] = [
    "agent/inbox/spliced",
    "turn/start",
    "agent/inbox/spliced",
    "step/start",
    "user/message",
    "llm/retry",
    "llm/retry-started",
    "assistant/message",
    "step/end",
    "turn/end",
];

#[tokio::test(start_paused = true)]
async fn an_embedders_agent_retries_a_rate_limit_by_default() {
    let log = one_turn(embedder(vec![rate_limit(), ScriptEntry::text("ok")])).await;
    assert_eq!(skeleton(&log), RETRIED);
    let retry = retries(&log);
    let [retry] = retry.as_slice() else {
        panic!("one llm/retry expected: {retry:?}")
    };
    assert_eq!(
        (retry.turn, retry.step, retry.retry, retry.max_retries),
        (1, 1, 1, Some(5))
    );
    assert_eq!(retry.provider, "script");
    assert_eq!(retry.mode, "normal");
    assert_eq!(retry.policy_key, RetryPolicy::default().policy_key());
    assert_eq!(
        (retry.failure.code.as_str(), retry.failure.message.as_str()),
        ("RATE_LIMIT", "slow down")
    );
    // 500 ms with a jitter of at most 10 %.
    let delay_ms = retry.delay_ms.as_f64().expect("a number");
    assert!((450.0..=550.0).contains(&delay_ms), "{delay_ms}");
    let started: Vec<(u64, &str)> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::LlmRetryStarted(s) => Some((s.retry, s.retry_id.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(started, [(1, retry.retry_id.as_str())]);
    // The runtime supplies the new chain's id: a UUID v4, as the original mints them.
    assert_eq!(
        uuid::Uuid::parse_str(&retry.retry_id).map(|u| u.get_version_num()),
        Ok(4),
        "{}",
        retry.retry_id
    );
    assert_eq!(turn_end(&log), &TurnEndReason::Completed);
}

#[tokio::test(start_paused = true)]
async fn the_builder_turns_the_default_retry_off() {
    let builder = embedder(vec![rate_limit(), ScriptEntry::text("ok")]).retry(DefaultRetry::Off);
    let log = one_turn(builder).await;
    assert_eq!(
        skeleton(&log),
        [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "step/end",
            "turn/end",
        ]
    );
    match turn_end(&log) {
        TurnEndReason::Error { error } => assert_eq!(error.code, "RATE_LIMIT"),
        other => panic!("the turn should end with the failure: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_builder_replaces_the_default_policy() {
    let policy = RetryPolicy::default().with_max_retries(1);
    let builder = embedder(vec![rate_limit(), rate_limit(), ScriptEntry::text("ok")])
        .retry(DefaultRetry::Policy(policy.clone()));
    let log = one_turn(builder).await;
    // One retry under the given policy, and no second chain under the provider's default.
    let retry = retries(&log);
    let [retry] = retry.as_slice() else {
        panic!("one llm/retry expected: {retry:?}")
    };
    assert_eq!((retry.retry, retry.max_retries), (1, Some(1)));
    assert_eq!(retry.policy_key, policy.policy_key());
    match turn_end(&log) {
        TurnEndReason::Error { error } => assert_eq!(error.code, "RATE_LIMIT"),
        other => panic!("the turn should end with the second failure: {other:?}"),
    }
}

/// Lets the next hook decide, counting how often it was asked.
#[derive(Default)]
struct Delegates(AtomicUsize);

#[async_trait::async_trait]
impl RequestErrorHook for Delegates {
    async fn request_error(&self, ctx: &RequestErrorCtx) -> Result<Recovery, HookError> {
        assert_eq!(ctx.failure.code, "RATE_LIMIT");
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Recovery::Delegate)
    }
}

fn hooks_with(hook: Arc<Delegates>) -> Hooks {
    let mut hooks = Hooks::new();
    hooks.request_error.push(hook);
    hooks
}

#[tokio::test(start_paused = true)]
async fn a_hosts_request_error_hook_replaces_the_default_retry() {
    let hook = Arc::new(Delegates::default());
    let builder =
        embedder(vec![rate_limit(), ScriptEntry::text("ok")]).hooks(hooks_with(Arc::clone(&hook)));
    let log = one_turn(builder).await;
    assert_eq!(retries(&log), Vec::<&LlmRetry>::new());
    match turn_end(&log) {
        TurnEndReason::Error { error } => assert_eq!(error.code, "RATE_LIMIT"),
        other => panic!("the turn should end with the failure: {other:?}"),
    }
    assert_eq!(hook.0.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_explicit_retry_policy_runs_once_beside_its_own_hook() {
    // The pattern before the default existed: the embedder installs a `RetryHook` with its policy.
    // It runs alone: no second chain under the provider's policy once it gives up.
    let policy = RetryPolicy::default().with_max_retries(1);
    let mut hooks = Hooks::new();
    hooks
        .request_error
        .push(Arc::new(RetryHook::with_policy(policy.clone())));
    let builder = embedder(vec![rate_limit(), rate_limit(), rate_limit()]).hooks(hooks);
    let log = one_turn(builder).await;
    let keys: Vec<(u64, &str)> = retries(&log)
        .iter()
        .map(|r| (r.retry, r.policy_key.as_str()))
        .collect();
    assert_eq!(keys, [(1, policy.policy_key().as_str())]);
    match turn_end(&log) {
        TurnEndReason::Error { error } => assert_eq!(error.code, "RATE_LIMIT"),
        other => panic!("the turn should end with the second failure: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_agents_request_error_hook_replaces_the_default_for_that_agent_only() {
    let hook = Arc::new(Delegates::default());
    let host = embedder(vec![rate_limit(), rate_limit(), ScriptEntry::text("ok")])
        .start()
        .await
        .expect("the host starts");
    let mut hooked = AgentSpec::new(AgentConfig::new("script", "scripted"));
    hooked.hooks = hooks_with(Arc::clone(&hook));
    let hooked = host.create(hooked).await.expect("the agent starts");
    let hi = || Message::user_text(MessageId::mint(), "hi");
    hooked.followup(hi()).await.expect("durable");
    hooked.when_idle().await.expect("idle");
    let log = hooked.log().await.expect("log");
    assert_eq!(retries(&log), Vec::<&LlmRetry>::new());
    assert!(matches!(turn_end(&log), TurnEndReason::Error { .. }));
    // Another agent of the same host keeps the default: it retries the second scripted failure.
    let plain = host
        .create(AgentSpec::new(AgentConfig::new("script", "scripted")))
        .await
        .expect("the agent starts");
    plain.followup(hi()).await.expect("durable");
    plain.when_idle().await.expect("idle");
    let log = plain.log().await.expect("log");
    assert_eq!(retries(&log).len(), 1);
    assert_eq!(turn_end(&log), &TurnEndReason::Completed);
    host.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_retry_chosen_by_the_builder_runs_after_the_hooks_that_delegate() {
    let hook = Arc::new(Delegates::default());
    let builder = embedder(vec![rate_limit(), ScriptEntry::text("ok")])
        .hooks(hooks_with(Arc::clone(&hook)))
        .retry(DefaultRetry::ProviderPolicy);
    let log = one_turn(builder).await;
    assert_eq!(skeleton(&log), RETRIED);
    assert_eq!(hook.0.load(Ordering::SeqCst), 1);
}

/// Retries at once, recording nothing, the first time it is asked./// Retries at once, recording nothing, the first time it is asked.
struct RetryAtOnce;

#[async_trait::async_trait]
impl RequestErrorHook for RetryAtOnce {
    async fn request_error(&self, ctx: &RequestErrorCtx) -> Result<Recovery, HookError> {
        assert_eq!(ctx.failure.code, "RATE_LIMIT");
        Ok(Recovery::Retry)
    }
}

#[tokio::test(start_paused = true)]
async fn a_hook_that_decides_wins_over_a_retry_chosen_by_the_builder() {
    let mut hooks = Hooks::new();
    hooks.request_error.push(Arc::new(RetryAtOnce));
    let builder = embedder(vec![rate_limit(), ScriptEntry::text("ok")])
        .hooks(hooks)
        .retry(DefaultRetry::ProviderPolicy);
    let log = one_turn(builder).await;
    // The hook's retry records nothing: the default policy was never asked.
    assert_eq!(retries(&log), Vec::<&LlmRetry>::new());
    assert_eq!(turn_end(&log), &TurnEndReason::Completed);
}
