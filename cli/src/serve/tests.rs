//! Tests of `dsh serve` answers that need a store failing underneath a running server: the store's
//! fault injection (failing fsyncs) exists only in test builds, so these run the router in-process,
//! still over real HTTP on 127.0.0.1, rather than driving the built binary.

use std::sync::Arc;
use std::time::Duration;

use dsh::SessionId;
use dsh::llm::provider::{Provider, ProviderRegistry};
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::session::store::SessionStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh_actors::{Host, InputError};
use serde_json::{Value, json};

use super::error::ApiError;
use super::events::DEFAULT_MAX_STREAMS;
use super::metered::MeteredStore;
use super::metrics::ServerMetrics;
use super::router::router;
use super::state::{AgentDefaults, AppState, ServerSettings};

/// A server on 127.0.0.1 over a store with fault injection; returns its base URL, the store and
/// the state.
async fn start(dir: &std::path::Path) -> (String, Arc<SqliteStore>, AppState) {
    let config = SqliteConfig {
        fault_injection: true,
        ..SqliteConfig::default()
    };
    let store = Arc::new(SqliteStore::open(dir, config).expect("store"));
    let provider: Arc<dyn Provider> = Arc::new(
        SimProvider::new(SimConfig::instant(1))
            .expect("sim")
            .named("sim"),
    );
    let mut providers = ProviderRegistry::new();
    providers.register(provider);
    let metrics = Arc::new(ServerMetrics::new());
    let metered = MeteredStore::new(
        Arc::clone(&store) as Arc<dyn SessionStore>,
        metrics.store.clone(),
    );
    let host = Host::builder(Arc::new(metered) as Arc<dyn SessionStore>)
        .providers(providers)
        .start()
        .await
        .expect("host");
    let defaults = AgentDefaults {
        provider: "sim".into(),
        model: "sim".into(),
        max_tokens: None,
        system: None,
        cwd: None,
    };
    let settings = ServerSettings {
        keep_alive: Duration::from_secs(15),
        drain_timeout: Duration::from_secs(1),
        max_streams: DEFAULT_MAX_STREAMS,
    };
    let state = AppState::new(
        host,
        crate::stored::Opened::Sqlite(Arc::clone(&store)),
        defaults,
        None,
        settings,
        metrics,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let app = router(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), store, state)
}

/// Sends a JSON request; the status and the body as JSON (`Null` when not JSON).
async fn call(base: &str, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let client = reqwest::Client::new();
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = client.request(method, format!("{base}{path}"));
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let resp = req.send().await.expect("send");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_poisoned_store_is_503_for_input_creation_and_readiness() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, store, state) = start(dir.path()).await;
    assert_eq!(call(&base, "GET", "/readyz", None).await.0, 200);
    let (status, _) = call(&base, "POST", "/v1/sessions", Some(json!({"id": "a"}))).await;
    assert_eq!(status, 201);
    let faults = store.faults().expect("fault injection");
    faults.fail_syncs(true);

    let (status, body) = call(
        &base,
        "POST",
        "/v1/sessions/a/followup",
        Some(json!({"text": "one"})),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    assert!(store.poisoned().is_some());

    let (status, body) = call(&base, "GET", "/readyz", None).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "store_unavailable");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("a message")
            .starts_with("the store refuses writes: "),
        "{body}"
    );

    // A new session cannot become durable either: its first input is refused the same way.
    let (status, _) = call(&base, "POST", "/v1/sessions", Some(json!({"id": "b"}))).await;
    assert_eq!(status, 201);
    let (status, body) = call(
        &base,
        "POST",
        "/v1/sessions/b/followup",
        Some(json!({"text": "two", "id": "m-1"})),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    // The idempotent retry of a refused input is refused again, not acknowledged.
    let (status, _) = call(
        &base,
        "POST",
        "/v1/sessions/b/followup",
        Some(json!({"text": "two", "id": "m-1"})),
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(state.n_input_locks(), 0);
    state.host().shutdown().await;
}

#[test]
fn an_interrupted_input_is_503_interrupted() {
    let id = SessionId::new("a").expect("id");
    let e = ApiError::from_input(&InputError::Interrupted { id }, "message");
    assert_eq!(e.status.as_u16(), 503);
    assert_eq!(e.code, "interrupted");
    assert_eq!(
        e.message,
        "agent a stopped before acknowledging; the input may or may not be durable (check its log)"
    );
}

#[test]
fn a_fenced_store_error_is_503_hosted_elsewhere_with_the_lease_time_left() {
    use axum::response::IntoResponse;
    let id = SessionId::new("a").expect("id");
    for (left, secs) in [
        (Some(Duration::from_millis(2_300)), "3"),
        (Some(Duration::from_millis(10)), "1"),
        (None, "1"),
    ] {
        let e = ApiError::from_store(&dsh::session::store::StoreError::Fenced {
            id: id.clone(),
            reason: "hosted by node n1 (lease epoch 4, 2.3 s left)".to_string(),
            left,
        });
        assert_eq!(e.status.as_u16(), 503);
        assert_eq!(e.code, "hosted_elsewhere");
        assert_eq!(
            e.message,
            "session a is hosted by node n1 (lease epoch 4, 2.3 s left); retry after its lease ends"
        );
        let response = e.into_response();
        assert_eq!(response.headers()["retry-after"], secs, "{left:?}");
    }
}
