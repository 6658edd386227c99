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
