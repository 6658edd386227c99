//! Idle memory: 10,000 agents, each with a history, hibernated; reports bytes per hibernated agent
//! (process RSS delta / count). The goal is at most 16 KiB (SPEC §12), independent of history length.
//!
//! The figure is printed (`cargo test --release --test memory -- --nocapture` for the number that
//! matters: debug builds carry larger futures). The assertion is the goal itself, 16 KiB, about twice
//! what either build measures (release 4.6 / 6.7 KB, debug 3.8 / 8.4 KB on 2026-12-01), because RSS
//! on a shared machine is not an exact measure; `a_hibernated_agent_keeps_nothing_of_its_turn`
//! counts the live heap exactly.
//!
//! Also: the live heap of an awake agent after one turn (SPEC §12: at most the original's 29.9 KB),
//! counted exactly by a global allocator that keeps a running total of live bytes. The tests of
//! this binary take `SERIAL` so that one's allocations never land in another's count.

mod runtime_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use dsh::llm::provider::ProviderRegistry;
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::session::store::SessionStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh::turn::AgentConfig;
use dsh_actors::{AgentHandle, AgentSpec, Host, HostConfig};
use runtime_support::user;

/// The system allocator, counting live bytes.
struct Counting;

/// Bytes allocated and not yet freed, process-wide.
static LIVE: AtomicI64 = AtomicI64::new(0);

/// Allocations made (a `realloc` counts as one), process-wide.
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call forwards to `System` with the caller's arguments unchanged; the counter is
// only arithmetic beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (hence `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `dealloc`, and `new_size` is the caller's.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Held by each test: the live-byte count is process-wide.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn live_bytes() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    fn malloc_trim(pad: usize) -> std::os::raw::c_int;
}

/// Returns freed heap to the OS so RSS shows live memory, not what the allocator kept after the
/// turns' transient logs were dropped.
fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` has no preconditions; it only releases free memory at the top of each
    // arena and is safe to call from any thread at any time.
    unsafe {
        malloc_trim(0);
    }
}

fn rss_bytes() -> u64 {
    trim_heap();
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

async fn hibernated(agent: &AgentHandle) -> bool {
    agent.status().await.map(|s| s.hibernated).unwrap_or(false)
}

/// Creates `n` agents that each run `turns` turns, in batches, and waits until all hibernated.
/// Returns the handles (kept alive) and the RSS growth.
async fn populate(host: &Host, n: usize, turns: usize) -> (Vec<AgentHandle>, u64) {
    let before = rss_bytes();
    let mut agents = Vec::with_capacity(n);
    for batch in 0..n.div_ceil(500) {
        let mut fresh = Vec::new();
        for _ in 0..500.min(n - batch * 500) {
            fresh.push(
                host.create(AgentSpec::new(AgentConfig::new("sim", "sim-1")))
                    .await
                    .expect("agent created"),
            );
        }
        for _ in 0..turns {
            let sends = fresh.iter().map(|a| a.followup(user("hello")));
            for r in futures::future::join_all(sends).await {
                r.expect("followup acked");
            }
            for r in futures::future::join_all(fresh.iter().map(|a| a.when_idle())).await {
                r.expect("idle");
            }
        }
        for a in &fresh {
            while !hibernated(a).await {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        agents.extend(fresh);
    }
    let after = rss_bytes();
    (agents, after.saturating_sub(before))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_hibernated_agents_stay_small() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(dir.path(), SqliteConfig::default()).expect("store"));
    // The simulated model keeps nothing per request (the scripted one records every request).
    let sim = SimConfig {
        reply_tokens_min: 8,
        reply_tokens_max: 8,
        ..SimConfig::instant(3)
    };
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(SimProvider::new(sim).expect("sim config")));
    let config = HostConfig {
        hibernate_after: Some(Duration::from_millis(1)),
        ..HostConfig::default()
    };
    let host = Host::builder(Arc::clone(&store) as Arc<dyn SessionStore>)
        .providers(providers)
        .config(config)
        .start()
        .await
        .expect("host");
    // Warm up allocator arenas, the runtime and the store so the measured delta is the agents'.
    // Three turns, so that woken agents read their logs back: an agent that hibernated before its
    // first event wakes without a read, and the read connections' page caches would otherwise
    // first fill during the 3-turn measurement below and be billed to its agents (~14k bytes an
    // agent on 2026-12-02, with 1,287 bytes of live heap).
    let (warm, _) = populate(&host, 500, 3).await;
    drop(warm);

    let n = 10_000;
    let (agents, grown) = populate(&host, n, 1).await;
    let per_agent = grown / n as u64;
    println!(
        "{n} hibernated agents with 1-turn histories: {per_agent} bytes per agent (RSS delta {grown})"
    );

    // History length must not matter: agents with 3 turns each cost about the same.
    let (longer, grown_longer) = populate(&host, 2_000, 3).await;
    let per_agent_longer = grown_longer / 2_000;
    println!("2000 hibernated agents with 3-turn histories: {per_agent_longer} bytes per agent");

    assert!(
        per_agent <= HIBERNATED_RSS_MAX,
        "{per_agent} bytes per hibernated agent (goal 16 KiB)"
    );
    assert!(
        per_agent_longer <= HIBERNATED_RSS_MAX,
        "{per_agent_longer} bytes per hibernated agent with longer histories"
    );
    drop((agents, longer));
    host.shutdown().await;
    store.close().await.expect("store closes");
}

/// Waits until every agent in `agents` reports hibernated.
async fn all_hibernated(agents: &[AgentHandle]) {
    for a in agents {
        while !hibernated(a).await {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Waits (at most 10 s) until the runtime runs no more tasks than `baseline`: an agent reports
/// itself hibernated when it hands its core over, a moment before its actor's task (mailbox,
/// children) is gone, so heap measured right after `all_hibernated` can still hold the last few
/// actors of a burst (a loaded CI machine saw 275 bytes per agent of them).
async fn tasks_ended(baseline: usize) {
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while metrics.num_alive_tasks() > baseline && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits (at most 10 s) until the host has reaped every agent actor: a passivated actor's end
/// reaches the host's own actor as a supervision event carrying the actor's final state, so until
/// the host has handled the burst's events, heap measured after `all_hibernated` and `tasks_ended`
/// still holds them (1,700–2,600 bytes an agent in some runs, 2026-12-02).
async fn actors_reaped(host: &Host) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while host.n_actors() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a hibernated agent keeps, counted exactly (live heap, not RSS): 2,000 agents made as
/// `dsh sim` makes them (one config, a system prompt, created one after the other), hibernated,
/// then one turn each all at once (a burst), hibernated again; then the same with 2,000 more.
/// Nothing of the awake phase may survive hibernation: the live heap after the burst equals the
/// heap after creation, up to the tables that grew with the number of agents awake at once, in at
/// least one of the two windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_agent_keeps_nothing_of_its_turn() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(SqliteStore::open(dir.path(), SqliteConfig::default()).expect("store"));
    let sim = SimConfig {
        reply_tokens_min: 20,
        reply_tokens_max: 20,
        ..SimConfig::instant(7)
    };
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(SimProvider::new(sim).expect("sim config")));
    let host = Host::builder(Arc::clone(&store) as Arc<dyn SessionStore>)
        .providers(providers)
        .config(HostConfig {
            hibernate_after: Some(Duration::from_millis(20)),
            ..HostConfig::default()
        })
        .start()
        .await
        .expect("host");
    // The host's and the store's own tasks: what runs once every agent's actor has stopped.
    let baseline_tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let mut config = AgentConfig::new("sim", "sim-1");
    config.system = Some("You are a simulated agent under load.".to_string());
    let host = &host;
    let burst = |agents: Vec<AgentHandle>| async move {
        let sends = agents.iter().map(|a| a.followup(user("hello")));
        for r in futures::future::join_all(sends).await {
            r.expect("followup acked");
        }
        for r in futures::future::join_all(agents.iter().map(|a| a.when_idle())).await {
            r.expect("idle");
        }
        all_hibernated(&agents).await;
        tasks_ended(baseline_tasks).await;
        actors_reaped(host).await;
        agents
    };
    // Warm up: the runtime's, the store's and the registry's tables grow to their working size,
    // through the same steps as a measured window (created, hibernated, a turn in a burst).
    let mut warm = Vec::new();
    for _ in 0..2_500 {
        warm.push(
            host.create(AgentSpec::new(config.clone()))
                .await
                .expect("agent created"),
        );
    }
    all_hibernated(&warm).await;
    tasks_ended(baseline_tasks).await;
    actors_reaped(host).await;
    let warm = burst(warm).await;
    drop(warm);

    // Measured twice, on two sets of agents: a turn's true leftover is in both windows, while a
    // one-off step of a host-wide buffer (the store's request queue reaching a new depth keeps its
    // blocks; a table doubling) lands in at most one of them. A loaded CI run once saw 71 bytes an
    // agent in a single window, where runs alone see 0–17.
    let n = 2_000;
    let mut windows = Vec::new();
    let mut kept = Vec::new();
    for _ in 0..2 {
        let before = live_bytes();
        let mut agents = Vec::with_capacity(n);
        for _ in 0..n {
            agents.push(
                host.create(AgentSpec::new(config.clone()))
                    .await
                    .expect("agent created"),
            );
        }
        all_hibernated(&agents).await;
        tasks_ended(baseline_tasks).await;
        actors_reaped(host).await;
        let created = (live_bytes() - before) / n as i64;
        let agents = burst(agents).await;
        let after_turn = (live_bytes() - before) / n as i64;
        println!(
            "live heap per hibernated agent: {created} bytes once created, {after_turn} after a turn in a burst of {n}"
        );
        assert!(
            created <= HIBERNATED_HEAP_MAX,
            "{created} bytes of heap per hibernated agent (bound {HIBERNATED_HEAP_MAX})"
        );
        windows.push((created, after_turn));
        kept.push(agents);
    }
    let leftover = windows.iter().map(|(c, a)| a - c).min().unwrap_or(i64::MAX);
    assert!(
        leftover <= TURN_LEFTOVER_MAX,
        "a turn left {leftover} bytes per hibernated agent in both windows (created, after: {windows:?})"
    );
    drop(kept);
    host.shutdown().await;
    store.close().await.expect("store closes");
}

/// RSS per hibernated agent (SPEC §12: 16 KiB).
const HIBERNATED_RSS_MAX: u64 = 16 * 1024;

/// The live heap of one hibernated agent, registry and store entries included (~1,650 bytes
/// measured, of which ~380 are the store's session map doubling inside the measured window; one
/// run of the whole binary went over 2,048, so the bound leaves room for such steps).
const HIBERNATED_HEAP_MAX: i64 = 3_072;
/// What a turn may add to it.
const TURN_LEFTOVER_MAX: i64 = 64;

/// The original's live heap per agent after one turn (SPEC §12).
const ORIGINAL_HEAP_AFTER_ONE_TURN: i64 = 29_900;

/// One awake agent after one 20-token text turn (24 chunks, as the original's figure): its live
/// heap, counted by the allocator, over 200 agents that stay awake. On the memory store the count
/// includes the store's copy of each log (the original's in-memory sessions hold theirs too); on
/// SQLite the log is on disk and only the agent's memory counts.
/// A host over `store` whose agents never hibernate, answering with 20-token replies at once.
async fn awake_host(store: Arc<dyn SessionStore>) -> Host {
    let sim = SimConfig {
        reply_tokens_min: 20,
        reply_tokens_max: 20,
        ..SimConfig::instant(5)
    };
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(SimProvider::new(sim).expect("sim config")));
    let config = HostConfig {
        hibernate_after: None,
        ..HostConfig::default()
    };
    Host::builder(store)
        .providers(providers)
        .config(config)
        .start()
        .await
        .expect("host")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_awake_agent_after_one_turn_holds_little_heap() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    for store_name in ["memory", "sqlite"] {
        let store: Arc<dyn SessionStore> = match store_name {
            "memory" => Arc::new(dsh::session::store::memory::MemoryStore::new()),
            _ => Arc::new(SqliteStore::open(dir.path(), SqliteConfig::default()).expect("store")),
        };
        let host = awake_host(Arc::clone(&store)).await;
        let run = |n: usize| {
            let host = &host;
            async move {
                let mut agents = Vec::with_capacity(n);
                for _ in 0..n {
                    let agent = host
                        .create(AgentSpec::new(AgentConfig::new("sim", "sim-1")))
                        .await
                        .expect("agent created");
                    agent.followup(user("hello")).await.expect("followup acked");
                    agent.when_idle().await.expect("idle");
                    agents.push(agent);
                }
                agents
            }
        };
        // Warm up: the runtime's and the store's own buffers grow to their working size first.
        let warm = run(50).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let n = 200;
        let before = live_bytes();
        let agents = run(n).await;
        // Let finished tasks (stream actors, append tasks) be dropped.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let per_agent = (live_bytes() - before) / n as i64;
        println!(
            "{store_name} store: an awake agent after one turn holds {per_agent} bytes of heap"
        );
        // SQLite: at most the original's 29.9 KB (its log is on disk). The memory store also holds
        // each log's JSON, so only a loose bound against regressions there.
        let bound = if store_name == "sqlite" {
            ORIGINAL_HEAP_AFTER_ONE_TURN
        } else {
            64 * 1024
        };
        assert!(
            per_agent <= bound,
            "{store_name}: {per_agent} bytes of heap per awake agent after one turn (bound {bound})"
        );
        drop((agents, warm));
        host.shutdown().await;
    }
}

/// Allocations per text turn of one agent at most (memory store, 20-token replies, one thread).
/// 2026-12-01: 202 (debug) and 201 (release); 265 with each event encoded on its own, as before
/// batches were encoded into one buffer. 2026-12-02: 181 (debug), after the `sim` model stopped
/// formatting each token (183) and the session writer stopped copying each batch (181).
/// 2026-12-05: 161 (debug and release), after the agent's handler stopped boxing a future per
/// message (170), the stream actor's batch and the attempt's chunk seqs got their room at once
/// (168, 165), and a block's text its first room (161). 2026-12-07: 157, since the session writer
/// finishes an append the memory store takes at once in its handler (no task, no `Flushed`
/// message). A regression of one allocation per event (34 a turn), or of one per token (20), fails
/// it.
const TEXT_TURN_ALLOCS_MAX: u64 = 176;

/// A text turn's allocations, counted exactly by the counting allocator over turns 100–200 of one
/// agent on a current-thread runtime (nothing else runs: the count is the turn's).
#[test]
fn a_text_turn_makes_few_allocations() {
    let _serial = SERIAL.blocking_lock();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let per_turn = rt.block_on(async {
        let host = awake_host(Arc::new(dsh::session::store::memory::MemoryStore::new())).await;
        let agent = host
            .create(AgentSpec::new(AgentConfig::new("sim", "sim-1")))
            .await
            .expect("agent created");
        let turns = |n: usize| {
            let agent = &agent;
            async move {
                for _ in 0..n {
                    agent.followup(user("hello")).await.expect("followup acked");
                    agent.when_idle().await.expect("idle");
                }
            }
        };
        turns(100).await;
        let before = ALLOCS.load(Ordering::Relaxed);
        turns(100).await;
        let per_turn = (ALLOCS.load(Ordering::Relaxed) - before) / 100;
        host.shutdown().await;
        per_turn
    });
    println!("a text turn makes {per_turn} allocations");
    assert!(
        per_turn <= TEXT_TURN_ALLOCS_MAX,
        "a text turn makes {per_turn} allocations (bound {TEXT_TURN_ALLOCS_MAX})"
    );
}
