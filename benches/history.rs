//! Is a turn's runtime cost flat in the length of the history? (issue 15 item 2)
//!
//! One host on the memory store, the looping text model of the `runtime` bench (it looks at the last
//! message only, so the provider's own cost does not grow with history), two agents:
//!
//! - `long` is driven through `--long` turns (4,900 by default) outside the clock;
//! - `short` is driven through `--short` turns (100 by default) outside the clock;
//! - then both run `--window` more turns (100), **interleaved** (one turn of `short`, one of `long`,
//!   each timed on its own), so both windows see the same machine load. The report is the mean of
//!   each window and their ratio: the mean of turns 4,900–5,000 against turns 100–200.
//!
//! `--only N` runs N turns on one agent and nothing else: run it under
//! `valgrind --tool=callgrind` at N = 100, 200, 4,900 and 5,000; the instructions of turns
//! 100–200 are I(200) − I(100), of turns 4,900–5,000 I(5000) − I(4900) (a repeatable count).
//!
//! `--only N` also prints what the N turns cost the process per turn (`getrusage`: wall, user and
//! kernel CPU, voluntary and involuntary context switches, minor page faults), and `--runtime`
//! picks where the agent and its driver run: `two` (default: a 2-worker runtime, the driver on the
//! thread that blocks on it), `task` (the driver a task on those workers, as `dsh sim`'s are),
//! `pinned` (the agent on a host thread of its own, `HostConfig::agent_threads = 1`), `beside`
//! (pinned, and the driver spawned beside it with `AgentHandle::spawn_beside`) or `one` (a
//! single-threaded runtime: nothing crosses a thread).
//!
//! Run: `cargo bench -p dsh --bench history [-- --long 4900 --short 100 --window 100 --rounds 3]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dsh::ids::MessageId;
use dsh::llm::provider::{ChunkStream, Provider, ProviderRegistry};
use dsh::llm::script::ScriptEntry;
use dsh::llm::types::{LlmRequest, Message, StreamChunk};
use dsh::session::store::memory::MemoryStore;
use dsh::turn::AgentConfig;
use dsh_actors::{AgentHandle, AgentSpec, Host, HostConfig};
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

/// A model that ignores the messages: every request gets the same 20-character text reply.
struct TextLoop {
    chunks: Arc<Vec<StreamChunk>>,
}

impl Provider for TextLoop {
    fn name(&self) -> &str {
        "loop"
    }

    fn stream(&self, _request: LlmRequest, _cancel: CancellationToken) -> ChunkStream {
        let chunks = Arc::clone(&self.chunks);
        Box::pin(futures::stream::iter(0..chunks.len()).map(move |i| chunks[i].clone()))
    }
}

async fn turn(agent: &AgentHandle) {
    let prompt = Message::user_text(MessageId::mint(), "Say something short.");
    agent.followup(prompt).await.expect("followup");
    agent.when_idle().await.expect("idle");
}

async fn timed_turn(agent: &AgentHandle) -> Duration {
    let started = Instant::now();
    turn(agent).await;
    started.elapsed()
}

fn arg(args: &[String], name: &str) -> Option<u64> {
    let i = args.iter().position(|a| a == name)?;
    args.get(i + 1)?.parse().ok()
}

fn mean_us(d: &[Duration]) -> f64 {
    d.iter().map(Duration::as_secs_f64).sum::<f64>() / d.len().max(1) as f64 * 1e6
}

/// The process's resource use so far: (user s, system s, voluntary and involuntary context
/// switches, minor faults).
fn usage() -> (f64, f64, i64, i64, i64) {
    // SAFETY: `rusage` is plain data (integers and `timeval`s), so the all-zero value is valid, and
    // `getrusage` only writes one `rusage` through the pointer, which points at a live local of
    // exactly that type.
    let u = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    (
        secs(u.ru_utime),
        secs(u.ru_stime),
        u.ru_nvcsw,
        u.ru_nivcsw,
        u.ru_minflt,
    )
}

/// `--only`: `n` turns of one agent, then their cost per turn.
async fn only(host: &Host, spec: AgentSpec, n: u64, runtime: &str) {
    let agent = host.create(spec).await.expect("create");
    let before = usage();
    let started = Instant::now();
    let driver = agent.clone();
    let turns = async move {
        for _ in 0..n {
            turn(&driver).await;
        }
    };
    if runtime == "beside" {
        agent.spawn_beside(turns).await.expect("the driver task");
    } else {
        turns.await;
    }
    let wall = started.elapsed().as_secs_f64();
    let after = usage();
    let per = |x: f64| x / n.max(1) as f64;
    println!(
        "ran {n} turns ({runtime}): per turn wall {:.1} µs, user {:.1} µs, system {:.1} µs, \
         context switches {:.2} voluntary + {:.2} involuntary, minor faults {:.2}",
        per(wall) * 1e6,
        per(after.0 - before.0) * 1e6,
        per(after.1 - before.1) * 1e6,
        per((after.2 - before.2) as f64),
        per((after.3 - before.3) as f64),
        per((after.4 - before.4) as f64),
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let only_n = arg(&args, "--only");
    let runtime = args
        .iter()
        .position(|a| a == "--runtime")
        .and_then(|i| args.get(i + 1))
        .map_or("two", String::as_str)
        .to_string();
    assert!(
        ["one", "two", "task", "pinned", "beside"].contains(&runtime.as_str()),
        "--runtime takes one, two, task, pinned or beside, not {runtime:?}"
    );
    let long = arg(&args, "--long").unwrap_or(4_900);
    let short = arg(&args, "--short").unwrap_or(100);
    let window = arg(&args, "--window").unwrap_or(100).max(1);
    let rounds = arg(&args, "--rounds").unwrap_or(3).max(1);
    let rt = if runtime == "one" {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    let on_task = runtime == "task";
    let main = async move {
        let mut providers = ProviderRegistry::new();
        providers.register(Arc::new(TextLoop {
            chunks: Arc::new(ScriptEntry::text("durable logs are fa").planned_chunks()),
        }) as Arc<dyn Provider>);
        let host = Host::builder(Arc::new(MemoryStore::new()))
            .providers(providers)
            .config(HostConfig {
                agent_threads: usize::from(runtime == "pinned" || runtime == "beside"),
                ..HostConfig::default()
            })
            .start()
            .await
            .expect("host");
        let spec = || AgentSpec::new(AgentConfig::new("loop", "loop-1"));
        if let Some(n) = only_n {
            only(&host, spec(), n, &runtime).await;
            host.shutdown().await;
            return;
        }
        println!(
            "history: mean turn of turns {short}..{} vs {long}..{} (memory store, 2 workers, interleaved)",
            short + window,
            long + window
        );
        for round in 1..=rounds {
            let a = host.create(spec()).await.expect("create");
            let b = host.create(spec()).await.expect("create");
            for _ in 0..long {
                turn(&b).await;
            }
            for _ in 0..short {
                turn(&a).await;
            }
            let (mut ta, mut tb) = (Vec::new(), Vec::new());
            for _ in 0..window {
                ta.push(timed_turn(&a).await);
                tb.push(timed_turn(&b).await);
            }
            let (ma, mb) = (mean_us(&ta), mean_us(&tb));
            println!(
                "round {round}: turns {short}..{}: {ma:.1} µs, turns {long}..{}: {mb:.1} µs, ratio {:.3}",
                short + window,
                long + window,
                mb / ma
            );
            host.dispose(a.id()).await.expect("dispose");
            host.dispose(b.id()).await.expect("dispose");
        }
        host.shutdown().await;
    };
    if on_task {
        rt.block_on(rt.spawn(main)).expect("the driver task");
    } else {
        rt.block_on(main);
    }
}
