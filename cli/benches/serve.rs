//! The same `sim` workload driven through the `Host` API and through `dsh serve`'s HTTP API, in
//! one run (SPEC §12: the server should reach ≥0.7× the host's turns/s).
//!
//! Each run gets a fresh SQLite store and host with the instant `sim` model (20-token replies, no
//! tools). `AGENTS` agents each run `TURNS` turns one after another: a followup, then wait for the
//! turn to end. Three clients: `Host API` waits with `when_idle`; `Host + subscriber` reads every
//! event of its agent from a subscription until the `turn/end` (the same work an HTTP client does
//! to learn of it, and so the fair baseline); `HTTP` reads the session's event stream, through one
//! `reqwest` client shared by every agent and built before the clock starts. Reported: turns/s,
//! the process's CPU time per turn (user + system, every thread: server, runtime, store and
//! client), the input-ack latency (the followup call, or the `POST …/followup` until its 202) at
//! p50 and p99, and the ratios.
//!
//! `cargo bench -p dsh-cli --bench serve` (`DSH_BENCH_AGENTS`, `DSH_BENCH_TURNS` override the sizes,
//! 200 × 50 by default: 10,000 turns, ~3 s a path on a quiet machine; at 1,000 turns the ratio
//! moved 0.49–0.62× between runs; `DSH_BENCH_ONLY=host|host-sub|http` runs one client alone, e.g.
//! under callgrind or strace; `DSH_BENCH_AGENT_THREADS=N` pins every path's agents to N threads of
//! the host's own, `HostConfig::agent_threads`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dsh::MessageId;
use dsh::llm::provider::{Provider, ProviderRegistry};
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::llm::types::Message;
use dsh::session::store::SessionStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh_actors::{Host, Observation, Observed};
use dsh_cli::serve::router::{no_delay, router};
use dsh_cli::serve::state::{AgentDefaults, AppState, ServerSettings};

/// What one run measured.
struct Figures {
    turns: usize,
    elapsed: Duration,
    /// CPU time of the whole process (every thread: runtime, store, client) over the run.
    cpu: Duration,
    acks: Vec<Duration>,
}

impl Figures {
    fn turns_per_sec(&self) -> f64 {
        self.turns as f64 / self.elapsed.as_secs_f64()
    }

    /// Microseconds of CPU (user + system, all threads) per turn.
    fn cpu_us_per_turn(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.turns as f64
    }

    fn ack_ms(&mut self, q: f64) -> f64 {
        self.acks.sort();
        let i = ((self.acks.len() as f64 - 1.0) * q).round() as usize;
        self.acks[i].as_secs_f64() * 1000.0
    }
}

/// CPU time this process used so far (user + system, every thread, exited ones included), from
/// `/proc/self/stat` in clock ticks (`USER_HZ`, 100 on Linux). On a shared machine this is steadier
/// than wall time: what other processes take does not count.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // Fields after the command name (which is in parentheses and may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
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
        .config(dsh_actors::HostConfig {
            agent_threads: size("DSH_BENCH_AGENT_THREADS", 0),
            ..dsh_actors::HostConfig::default()
        })
        .start()
        .await
        .expect("host");
    (host, store)
}

/// How a `Host` client learns that its turn ended.
#[derive(Clone, Copy)]
enum Wait {
    /// `when_idle`.
    Idle,
    /// Reading its agent's events from a subscription up to the `turn/end`.
    Subscriber,
}

async fn via_host(agents: usize, turns: usize, wait: Wait) -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let (host, store) = start_host(dir.path()).await;
    let cpu = process_cpu();
    let start = Instant::now();
    let tasks: Vec<_> = (0..agents)
        .map(|_| {
            let host = host.clone();
            tokio::spawn(async move {
                let h = host.create(defaults().spec()).await.expect("create");
                let mut sub = matches!(wait, Wait::Subscriber).then(|| h.subscribe());
                let mut acks = Vec::with_capacity(turns);
                for _ in 0..turns {
                    let t0 = Instant::now();
                    h.followup(Message::user_text(MessageId::mint(), "q"))
                        .await
                        .expect("followup");
                    acks.push(t0.elapsed());
                    match &mut sub {
                        None => h.when_idle().await.expect("idle"),
                        Some(sub) => loop {
                            match sub.next().await.expect("the subscription is open") {
                                Observation::Item(Observed::Event { event, .. })
                                    if event.kind() == "turn/end" =>
                                {
                                    break;
                                }
                                Observation::Item(_) => {}
                                Observation::Lagged(n) => panic!("the subscriber lagged by {n}"),
                            }
                        },
                    }
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
    let cpu = process_cpu() - cpu;
    host.shutdown().await;
    store.close().await.expect("close");
    Figures {
        turns: agents * turns,
        elapsed,
        cpu,
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

async fn http_agent(
    client: reqwest::Client,
    base: String,
    i: usize,
    turns: usize,
) -> Vec<Duration> {
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
        axum::serve(no_delay(listener), router(state))
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .expect("serve");
    });
    // One client for every agent (its clones share one connection pool), built before the clock
    // starts, as a program driving many agents would: building a `reqwest` client loads the
    // system's root certificates (~150 files), which is set-up, not the server's cost per turn.
    let client = reqwest::Client::new();
    let cpu = process_cpu();
    let start = Instant::now();
    let tasks: Vec<_> = (0..agents)
        .map(|i| tokio::spawn(http_agent(client.clone(), base.clone(), i, turns)))
        .collect();
    let mut acks = Vec::new();
    for t in tasks {
        acks.extend(t.await.expect("client task"));
    }
    let elapsed = start.elapsed();
    let cpu = process_cpu() - cpu;
    host.shutdown().await;
    server.abort();
    store.close().await.expect("close");
    Figures {
        turns: agents * turns,
        elapsed,
        cpu,
        acks,
    }
}

fn main() {
    let agents = size("DSH_BENCH_AGENTS", 200);
    let turns = size("DSH_BENCH_TURNS", 50);
    let only = std::env::var("DSH_BENCH_ONLY").ok();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    if let Some(only) = only {
        let mut f = rt.block_on(async {
            match only.as_str() {
                "host" => via_host(agents, turns, Wait::Idle).await,
                "host-sub" => via_host(agents, turns, Wait::Subscriber).await,
                "http" => via_http(agents, turns).await,
                other => panic!("DSH_BENCH_ONLY: `{other}` is not host, host-sub or http"),
            }
        });
        println!(
            "{only}: {agents} agents x {turns} turns: {:.0} turns/s, {:.0} us CPU/turn, ack p50 {:.3} ms",
            f.turns_per_sec(),
            f.cpu_us_per_turn(),
            f.ack_ms(0.5)
        );
        return;
    }
    let (mut host, mut watching, mut http) = rt.block_on(async {
        // Warm up every path once, then measure them back to back.
        via_host(agents.min(5), 2, Wait::Idle).await;
        via_host(agents.min(5), 2, Wait::Subscriber).await;
        via_http(agents.min(5), 2).await;
        (
            via_host(agents, turns, Wait::Idle).await,
            via_host(agents, turns, Wait::Subscriber).await,
            via_http(agents, turns).await,
        )
    });
    println!("sim workload: {agents} agents x {turns} turns, SQLite, instant 20-token replies");
    println!(
        "{:<18} {:>10} {:>14} {:>14} {:>14}",
        "path", "turns/s", "CPU/turn (us)", "ack p50 (ms)", "ack p99 (ms)"
    );
    let rows = [
        ("Host API", &mut host),
        ("Host + subscriber", &mut watching),
        ("HTTP", &mut http),
    ];
    let mut tps = Vec::new();
    for (name, f) in rows {
        let (t, cpu, p50, p99) = (
            f.turns_per_sec(),
            f.cpu_us_per_turn(),
            f.ack_ms(0.5),
            f.ack_ms(0.99),
        );
        println!("{name:<18} {t:>10.0} {cpu:>14.0} {p50:>14.3} {p99:>14.3}");
        tps.push((t, cpu, p50, p99));
    }
    for (name, base) in [("Host API", tps[0]), ("Host + subscriber", tps[1])] {
        println!(
            "HTTP / {name}: turns/s {:.2}x, CPU/turn {:.2}x, ack p50 {:.2}x, ack p99 {:.2}x",
            tps[2].0 / base.0,
            tps[2].1 / base.1,
            tps[2].2 / base.2,
            tps[2].3 / base.3
        );
    }
}
