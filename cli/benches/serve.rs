//! The same `sim` workload driven through the `Host` API and through `dsh serve`'s HTTP API, in
//! one run (SPEC §12: the server should reach ≥0.7× the host's turns/s).
//!
//! Each run gets a fresh SQLite store and host with the instant `sim` model (20-token replies, no
//! tools). `AGENTS` agents each run `TURNS` turns one after another: a followup, then wait for the
//! turn to end (`when_idle` on the host; the session's event stream over HTTP, which is how an HTTP
//! client learns of it). Reported: turns/s, and the input-ack latency (the followup call, or the
//! `POST …/followup` until its 202) at p50 and p99, and the ratios.
//!
//! `cargo bench -p dsh-cli --bench serve` (`DSH_BENCH_AGENTS`, `DSH_BENCH_TURNS` override the sizes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dsh::MessageId;
use dsh::llm::provider::{Provider, ProviderRegistry};
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::llm::types::Message;
use dsh::session::store::SessionStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh_actors::Host;
use dsh_cli::serve::router::router;
use dsh_cli::serve::state::{AgentDefaults, AppState, ServerSettings};

/// What one run measured.
struct Figures {
    turns: usize,
    elapsed: Duration,
    acks: Vec<Duration>,
}

impl Figures {
    fn turns_per_sec(&self) -> f64 {
        self.turns as f64 / self.elapsed.as_secs_f64()
    }

    fn ack_ms(&mut self, q: f64) -> f64 {
        self.acks.sort();
        let i = ((self.acks.len() as f64 - 1.0) * q).round() as usize;
        self.acks[i].as_secs_f64() * 1000.0
    }
}

fn size(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn defaults() -> AgentDefaults {
    AgentDefaults {
        provider: "sim".into(),
        model: "sim".into(),
        max_tokens: None,
        system: None,
        cwd: None,
    }
}

async fn start_host(dir: &std::path::Path) -> (Host, Arc<SqliteStore>) {
    let mut sim = SimConfig::instant(1);
    sim.reply_tokens_min = 20;
    sim.reply_tokens_max = 20;
    sim.tool_call_probability = 0.0;
    let provider: Arc<dyn Provider> = Arc::new(SimProvider::new(sim).expect("sim").named("sim"));
    let mut providers = ProviderRegistry::new();
    providers.register(provider);
    let store = Arc::new(SqliteStore::open(dir, SqliteConfig::default()).expect("store"));
    let host = Host::builder(Arc::clone(&store) as Arc<dyn SessionStore>)
        .providers(providers)
        .start()
        .await
        .expect("host");
    (host, store)
}

async fn via_host(agents: usize, turns: usize) -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, store) = start_host(dir.path()).await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..agents)
        .map(|_| {
            let host = host.clone();
            tokio::spawn(async move {
                let h = host.create(defaults().spec()).await.expect("create");
                let mut acks = Vec::with_capacity(turns);
                for _ in 0..turns {
                    let t0 = Instant::now();
                    h.followup(Message::user_text(MessageId::mint(), "q"))
                        .await
                        .expect("followup");
                    acks.push(t0.elapsed());
                    h.when_idle().await.expect("idle");
                }
                acks
            })
        })
        .collect();
    let mut acks = Vec::new();
    for t in tasks {
        acks.extend(t.await.expect("agent task"));
    }
    let elapsed = start.elapsed();
    host.shutdown().await;
    store.close().await.expect("close");
    Figures {
        turns: agents * turns,
        elapsed,
        acks,
    }
}

/// Reads an event stream until `n` more `turn/end` events arrived.
async fn turn_ends(resp: &mut reqwest::Response, buf: &mut String, n: usize) {
    let needle = "event: turn/end\n";
    let mut seen = 0;
    loop {
        while let Some(i) = buf.find(needle) {
            buf.drain(..i + needle.len());
            seen += 1;
            if seen == n {
                return;
            }
        }
        let keep = buf.len().saturating_sub(needle.len());
        buf.drain(..buf.floor_char_boundary(keep));
        let chunk = resp
            .chunk()
            .await
            .expect("read")
            .expect("the stream is open");
        buf.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
    }
}

async fn http_agent(base: String, i: usize, turns: usize) -> Vec<Duration> {
    let client = reqwest::Client::new();
    let id = format!("a{i}");
    let created = client
        .post(format!("{base}/v1/sessions"))
        .body(format!("{{\"id\":\"{id}\"}}"))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status().as_u16(), 201);
    let mut events = client
        .get(format!("{base}/v1/sessions/{id}/events"))
        .send()
        .await
        .expect("events");
    let mut buf = String::new();
    let mut acks = Vec::with_capacity(turns);
    for _ in 0..turns {
        let t0 = Instant::now();
        let resp = client
            .post(format!("{base}/v1/sessions/{id}/followup"))
            .body("{\"text\":\"q\"}")
            .send()
            .await
            .expect("followup");
        assert_eq!(resp.status().as_u16(), 202);
        resp.bytes().await.expect("body");
        acks.push(t0.elapsed());
        turn_ends(&mut events, &mut buf, 1).await;
    }
    acks
}

async fn via_http(agents: usize, turns: usize) -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, store) = start_host(dir.path()).await;
    let settings = ServerSettings {
        keep_alive: Duration::from_secs(15),
        drain_timeout: Duration::from_secs(1),
        max_streams: dsh_cli::serve::events::DEFAULT_MAX_STREAMS,
    };
    let metrics = Arc::new(dsh_cli::serve::metrics::ServerMetrics::new());
    let state = AppState::new(
        host.clone(),
        dsh_cli::stored::Opened::Sqlite(Arc::clone(&store)),
        defaults(),
        None,
        settings,
        metrics,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let end = state.inner.streams_end.clone();
    let server = tokio::spawn(async move {
        let stop = end.clone();
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .expect("serve");
    });
    let start = Instant::now();
    let tasks: Vec<_> = (0..agents)
        .map(|i| tokio::spawn(http_agent(base.clone(), i, turns)))
        .collect();
    let mut acks = Vec::new();
    for t in tasks {
        acks.extend(t.await.expect("client task"));
    }
    let elapsed = start.elapsed();
    host.shutdown().await;
    server.abort();
    store.close().await.expect("close");
    Figures {
        turns: agents * turns,
        elapsed,
        acks,
    }
}

fn main() {
    let agents = size("DSH_BENCH_AGENTS", 50);
    let turns = size("DSH_BENCH_TURNS", 20);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut host, mut http) = rt.block_on(async {
        // Warm up both paths once, then measure them back to back.
        via_host(agents.min(5), 2).await;
        via_http(agents.min(5), 2).await;
        (via_host(agents, turns).await, via_http(agents, turns).await)
    });
    println!("sim workload: {agents} agents x {turns} turns, SQLite, instant 20-token replies");
    println!(
        "{:<10} {:>10} {:>14} {:>14}",
        "path", "turns/s", "ack p50 (ms)", "ack p99 (ms)"
    );
    let rows = [("Host API", &mut host), ("HTTP", &mut http)];
    let mut tps = Vec::new();
    for (name, f) in rows {
        let (t, p50, p99) = (f.turns_per_sec(), f.ack_ms(0.5), f.ack_ms(0.99));
        println!("{name:<10} {t:>10.0} {p50:>14.3} {p99:>14.3}");
        tps.push((t, p50, p99));
    }
    println!(
        "HTTP / Host: turns/s {:.2}x, ack p50 {:.2}x, ack p99 {:.2}x",
        tps[1].0 / tps[0].0,
        tps[1].1 / tps[0].1,
        tps[1].2 / tps[0].2
    );
}
