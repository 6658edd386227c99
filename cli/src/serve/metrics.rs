//! `GET /metrics`: the server's figures in the Prometheus text format, kept with
//! `prometheus-client`.
//!
//! Counters the server owns (inputs by kind, the input-ack latency histogram, open event streams)
//! are updated as requests run. Turns by end reason, provider failures by code and the store's
//! commit-latency histogram are kept by the store the host writes through (`MeteredStore`), from
//! what became durable. Figures owned by the runtime and the store (agents live and hibernated,
//! events appended, commit groups) are read when scraped: the host's and the store's counters are
//! the record, and a scrape only brings the exported counters up to them.

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::state::AppState;

/// The label of a per-kind counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `followup`, `steer`, `inject`, `cancel`, `remove`, `replace`.
    pub kind: &'static str,
}

/// The label of the agents gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// `live` (an actor runs it) or `hibernated`.
    pub state: &'static str,
}

/// The label of the turns counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The `turn/end` reason's kind: `completed`, `max-tokens`, `blocked`, `aborted`, `error`,
    /// `interrupted`.
    pub reason: String,
}

/// The label of the provider failures counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    /// The failure's code (`RATE_LIMITED`, `AUTH`, ...), as the log records it.
    pub code: String,
}

/// The figures the store the host writes through keeps (see `MeteredStore`). Cheap to clone: the
/// clones count into the same figures.
#[derive(Clone)]
pub struct StoreFigures {
    /// Durable `turn/end` events, by reason.
    pub turns: Family<ReasonLabel, Counter>,
    /// Provider failures the log records, by code.
    pub provider_failures: Family<CodeLabel, Counter>,
    /// Seconds from an append to its commit.
    pub commit: Histogram,
}

impl StoreFigures {
    /// Counts one durable `turn/end` with reason `reason`.
    pub fn turn_end(&self, reason: &str) {
        self.turns
            .get_or_create(&ReasonLabel {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts one recorded provider failure with code `code`.
    pub fn provider_failure(&self, code: &str) {
        self.provider_failures
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .inc();
    }

    /// Records one commit that took `elapsed`.
    pub fn commit(&self, elapsed: Duration) {
        self.commit.observe(elapsed.as_secs_f64());
    }
}

/// Every exported figure.
pub struct ServerMetrics {
    registry: Registry,
    /// Inputs acknowledged, by kind.
    pub inputs: Family<KindLabel, Counter>,
    /// Seconds from an input request's arrival to its durable acknowledgement.
    pub input_ack: Histogram,
    /// Event streams open now.
    pub sse_subscribers: Gauge<i64, AtomicI64>,
    /// Figures the store the host writes through keeps.
    pub store: StoreFigures,
    agents: Family<StateLabel, Gauge<i64, AtomicI64>>,
    input_locks: Gauge<i64, AtomicI64>,
    events: Counter,
    store_commits: Counter,
    store_appends: Counter,
    /// Serialises scrapes, which bring the read-through counters up to date.
    scrape: tokio::sync::Mutex<()>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics::new()
    }
}

impl ServerMetrics {
    /// A registry with every figure, at zero.
    pub fn new() -> ServerMetrics {
        let mut registry = Registry::with_prefix("dsh");
        let inputs = Family::<KindLabel, Counter>::default();
        registry.register("inputs", "Inputs acknowledged, by kind", inputs.clone());
        let buckets = [
            0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
        ];
        let input_ack = Histogram::new(buckets);
        registry.register(
            "input_ack_seconds",
            "Time from an input request to its durable acknowledgement",
            input_ack.clone(),
        );
        let sse_subscribers = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "sse_subscribers",
            "Event streams open now",
            sse_subscribers.clone(),
        );
        let agents = Family::<StateLabel, Gauge<i64, AtomicI64>>::default();
        registry.register("agents", "Agents hosted, by state", agents.clone());
        let store = store_figures(&mut registry);
        let input_locks = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "input_locks",
            "Sessions whose input lock is held or waited for now",
            input_locks.clone(),
        );
        let events = Counter::default();
        registry.register(
            "events_appended",
            "Events acknowledged durable",
            events.clone(),
        );
        let store_commits = Counter::default();
        registry.register(
            "store_commits",
            "Commit groups the store ran",
            store_commits.clone(),
        );
        let store_appends = Counter::default();
        registry.register(
            "store_appends",
            "Write requests (appends, repairs, deletes) in commit groups that committed",
            store_appends.clone(),
        );
        ServerMetrics {
            registry,
            inputs,
            input_ack,
            sse_subscribers,
            store,
            agents,
            input_locks,
            events,
            store_commits,
            store_appends,
            scrape: tokio::sync::Mutex::new(()),
        }
    }

    /// Counts one acknowledged input of `kind` that took `elapsed`.
    pub fn input(&self, kind: &'static str, elapsed: Option<Duration>) {
        self.inputs.get_or_create(&KindLabel { kind }).inc();
        if let Some(elapsed) = elapsed {
            self.input_ack.observe(elapsed.as_secs_f64());
        }
    }
}

/// Registers the figures the metered store keeps.
fn store_figures(registry: &mut Registry) -> StoreFigures {
    let turns = Family::<ReasonLabel, Counter>::default();
    registry.register("turns", "Turns ended durably, by reason", turns.clone());
    let provider_failures = Family::<CodeLabel, Counter>::default();
    registry.register(
        "provider_failures",
        "Provider failures recorded in the logs (retried or final), by code",
        provider_failures.clone(),
    );
    let buckets = [
        0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0,
    ];
    let commit = Histogram::new(buckets);
    registry.register(
        "store_commit_seconds",
        "Time from an append to its durable commit (group commit wait, transaction and fsync)",
        commit.clone(),
    );
    StoreFigures {
        turns,
        provider_failures,
        commit,
    }
}

/// Raises `counter` to `value` (a scrape of a counter kept elsewhere).
fn raise(counter: &Counter, value: u64) {
    let now = counter.get();
    if value > now {
        counter.inc_by(value - now);
    }
}

/// Brings the read-through figures up to date.
async fn refresh(state: &AppState, m: &ServerMetrics) {
    let host = state.host();
    raise(&m.events, host.metrics().events());
    let (n_groups, n_requests_committed) = state.store().commit_counts();
    raise(&m.store_commits, n_groups);
    raise(&m.store_appends, n_requests_committed);
    // Counts the runtime keeps, so a scrape costs the same at a million agents (asking each
    // agent for its status did not).
    let hibernated = host.metrics().agents_hibernated();
    let hosted = u64::try_from(host.n_agents()).unwrap_or(u64::MAX);
    let live = i64::try_from(hosted.saturating_sub(hibernated)).unwrap_or(i64::MAX);
    let hibernated = i64::try_from(hibernated).unwrap_or(i64::MAX);
    m.input_locks
        .set(i64::try_from(state.n_input_locks()).unwrap_or(i64::MAX));
    m.agents
        .get_or_create(&StateLabel { state: "live" })
        .set(live);
    m.agents
        .get_or_create(&StateLabel {
            state: "hibernated",
        })
        .set(hibernated);
}

/// `GET /metrics`.
#[utoipa::path(get, path = "/metrics",  responses((status = 200, description = "Prometheus (OpenMetrics) text", content_type = "application/openmetrics-text", body = String)))]
pub async fn metrics(State(state): State<AppState>) -> Response {
    let m = &state.inner.metrics;
    let _scrape = m.scrape.lock().await;
    refresh(&state, m).await;
    let mut text = String::new();
    if let Err(e) = encode(&mut text, &m.registry) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}\n"),
        )
            .into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
