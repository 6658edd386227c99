//! Kill soak (RELIABILITY.md §5): a driver process runs agents on the simulated model over a SQLite
//! store — tools, steers, cancels — and prints every input acknowledged to it; the test kills it with
//! `SIGKILL` at a random moment, restarts it over the same store (resuming every session, repair
//! included), and repeats. Afterwards every acknowledged input is in its session exactly once, every
//! session loads and passes the invariant checker, and `dsh check` (the built binary) passes it.
//!
//! The driver is this test binary itself (`kill_soak_driver_entry`, selected by an environment
//! variable), as in `tests/store.rs`. Sizes: `DSH_SOAK_KILLS` (default 12 in the test suite; the full
//! run is `scripts/kill-soak`, 1,000), `DSH_SOAK_KILLS_PER_STORE` (each store directory serves this
//! many consecutive kills, then is verified; default 50), `DSH_SOAK_SEED`.

mod sandbox;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dsh::llm::provider::ProviderRegistry;
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::session::event::{CancelCause, EventData};
use dsh::session::invariant;
use dsh::session::store::SessionStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh::{MessageId, SessionId};
use dsh_actors::{AgentSpec, Host, HostConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sandbox::{dsh_bin, scrub};
use tokio_util::sync::CancellationToken;

const DRIVER_DIR_ENV: &str = "DSH_SOAK_DRIVER_DIR";
const DRIVER_ROUND_ENV: &str = "DSH_SOAK_DRIVER_ROUND";
const N_AGENTS: usize = 4;

fn session(i: usize) -> SessionId {
    SessionId::new(&format!("soak-{i}")).expect("a valid session id")
}

/// A tool that sleeps a few milliseconds, cooperative with cancellation.
struct Nap;

#[async_trait::async_trait]
impl Tool for Nap {
    fn name(&self) -> &str {
        "nap"
    }
    fn description(&self) -> &str {
        "sleeps a few milliseconds"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"note": {"type": "string"}}})
    }
    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        ExecutionMode::Parallel
    }
    async fn execute(&self, _call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(4)) => ToolOutput::text("rested"),
            () = cancel.cancelled() => ToolOutput::error("cancelled", None),
        }
    }
}

fn user(id: &str, text: &str) -> dsh::llm::types::Message {
    dsh::llm::types::Message::user_text(MessageId::new(id).expect("a valid id"), text)
}

/// Not a test on its own: the driver process `kill_soak_loses_no_acknowledged_input` starts (it
/// returns at once without the environment variable). It resumes (or creates) every session, then
/// drives every agent at once — a followup, sometimes a steer behind it or a cancel, wait for idle —
/// printing `ACK session message` after each acknowledged input, until it is killed.
#[test]
fn kill_soak_driver_entry() {
    let Some(dir) = std::env::var_os(DRIVER_DIR_ENV) else {
        return;
    };
    let round: u64 = std::env::var(DRIVER_ROUND_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let store = Arc::new(SqliteStore::open(Path::new(&dir), SqliteConfig::default()).unwrap());
        let mut providers = ProviderRegistry::new();
        let sim = SimConfig {
            tool_call_probability: 0.4,
            reply_tokens_min: 4,
            reply_tokens_max: 32,
            ..SimConfig::instant(round)
        };
        providers.register(Arc::new(SimProvider::new(sim).unwrap()));
        let mut tools = ToolRegistry::new();
        tools.register(Arc::new(Nap));
        let host = Host::builder(store as Arc<dyn SessionStore>)
            .providers(providers)
            .tools(tools)
            .config(HostConfig {
                hibernate_after: None,
                ..HostConfig::default()
            })
            .start()
            .await
            .unwrap();
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let say = |out: &std::sync::Mutex<std::io::Stdout>, line: String| {
            let mut out = out.lock().unwrap();
            writeln!(out, "{line}").unwrap();
            out.flush().unwrap();
        };
        let mut agents = Vec::new();
        for i in 0..N_AGENTS {
            let spec = AgentSpec::new(AgentConfig::new("sim", "m")).with_id(session(i));
            match host.open(spec).await {
                Ok(agent) => agents.push(agent),
                Err(e) => {
                    say(&out, format!("FAIL resume {}: {e}", session(i)));
                    std::process::exit(3);
                }
            }
        }
        say(&out, "READY".into());
        for (i, agent) in agents.into_iter().enumerate() {
            let out = Arc::clone(&out);
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(round * 1_000 + i as u64);
                for n in 0u64.. {
                    let id = format!("r{round}-a{i}-n{n}");
                    match agent.followup(user(&id, "work on this")).await {
                        Ok(()) => say(&out, format!("ACK {i} {id}")),
                        Err(e) => {
                            say(&out, format!("FAIL followup {id}: {e}"));
                            std::process::exit(3);
                        }
                    }
                    match rng.random_range(0..10u32) {
                        0..=2 => {
                            let id = format!("{id}-steer");
                            match agent.steer(user(&id, "and this")).await {
                                Ok(()) => say(&out, format!("ACK {i} {id}")),
                                Err(e) => {
                                    say(&out, format!("FAIL steer {id}: {e}"));
                                    std::process::exit(3);
                                }
                            }
                        }
                        3..=4 => {
                            tokio::time::sleep(Duration::from_millis(rng.random_range(0..5))).await;
                            let keep = rng.random_bool(0.5);
                            if let Err(e) = agent.cancel(CancelCause::User, keep).await {
                                say(&out, format!("FAIL cancel: {e}"));
                                std::process::exit(3);
                            }
                        }
                        _ => {}
                    }
                    let _ = agent.when_idle_for(Duration::from_secs(30)).await;
                }
            });
        }
        // Drive until killed.
        std::future::pending::<()>().await;
    });
}

/// Checks one store after its last kill: every session loads (repair included) and passes the
/// invariant checker, every acknowledged input (`acks`: session index → message ids) is in its
/// session exactly once, and `dsh check` passes every session. Returns the events stored.
async fn verify_store(dir: &Path, acks: &BTreeMap<usize, Vec<String>>) -> usize {
    let store = SqliteStore::open(dir, SqliteConfig::default()).expect("open the soaked store");
    let mut n_events = 0;
    for i in 0..N_AGENTS {
        let id = session(i);
        let mine = acks.get(&i).map(Vec::as_slice).unwrap_or_default();
        let loaded = match store.load(&id).await {
            Ok(loaded) => loaded,
            Err(dsh::session::store::StoreError::NotFound { .. }) => {
                assert!(mine.is_empty(), "{id}: acknowledged inputs but no log");
                continue;
            }
            Err(e) => panic!("{id} does not load after the soak: {e}"),
        };
        if let Err(v) = invariant::check(&loaded.events) {
            panic!("{id} fails the invariants after the soak: {v}");
        }
        let jsons: Vec<String> = loaded.events.iter().map(|e| e.to_json()).collect();
        for message in mine {
            let needle = format!("\"{message}\"");
            assert!(
                jsons.iter().any(|j| j.contains(&needle)),
                "{id}: acknowledged input {message} was lost"
            );
            let n_messages = loaded
                .events
                .iter()
                .filter(
                    |e| matches!(&e.data, EventData::UserMessage(m) if m.id.as_str() == message),
                )
                .count();
            assert!(
                n_messages <= 1,
                "{id}: {message} is in the log {n_messages} times"
            );
        }
        n_events += loaded.events.len();
    }
    store.close().await.expect("close");
    for i in 0..N_AGENTS {
        let mut cmd = Command::new(dsh_bin());
        scrub(&mut cmd);
        let out = cmd
            .arg("--data-dir")
            .arg(dir)
            .args(["check", session(i).as_str()])
            .stdin(Stdio::null())
            .output()
            .expect("run dsh check");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if acks.contains_key(&i) {
            assert!(
                out.status.success() && stdout.contains(": valid,"),
                "dsh check {} failed: {stdout}{stderr}",
                session(i)
            );
        }
    }
    n_events
}

/// Kills the driver at random moments, `DSH_SOAK_KILLS` times (default 12), restarting it over the
/// same store, and verifies each store (`verify_store`) after its last kill.
#[test]
fn kill_soak_loses_no_acknowledged_input() {
    if std::env::var_os(DRIVER_DIR_ENV).is_some() {
        return;
    }
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let n_kills = env("DSH_SOAK_KILLS").unwrap_or(12);
    let per_store = env("DSH_SOAK_KILLS_PER_STORE").unwrap_or(50).max(1);
    let seed = env("DSH_SOAK_SEED").unwrap_or(0x50a6);
    let mut rng = StdRng::seed_from_u64(seed);
    let exe = std::env::current_exe().unwrap();
    let root = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let mut acks: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut n_acks_total = 0usize;
    let mut n_events_total = 0usize;
    for round in 0..n_kills {
        let dir = root.path().join(format!("store-{}", round / per_store));
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "kill_soak_driver_entry",
                "--test-threads=1",
                "-q",
            ])
            .env(DRIVER_DIR_ENV, &dir)
            .env(DRIVER_ROUND_ENV, round.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Kill it after its first acknowledgement plus a random while, so the kill lands anywhere
        // in the turns: mid-stream, mid-tool, mid-commit, mid-repair.
        let mut lines = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("round {round}: the driver acknowledged nothing"));
            let is_ack = line.starts_with("ACK ");
            lines.push(line);
            if is_ack {
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..80_000)));
        child.kill().unwrap();
        let status = child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        if let Some(fail) = lines.iter().find(|l| l.starts_with("FAIL ")) {
            panic!("round {round}: the driver failed: {fail}");
        }
        assert_eq!(status.signal(), Some(9), "round {round}: {status}");
        for line in &lines {
            if let Some(rest) = line.strip_prefix("ACK ")
                && let Some((i, message)) = rest.split_once(' ')
            {
                let i: usize = i.parse().expect("an agent index");
                acks.entry(i).or_default().push(message.to_string());
                n_acks_total += 1;
            }
        }
        if (round + 1) % per_store == 0 || round + 1 == n_kills {
            n_events_total += runtime.block_on(verify_store(&dir, &acks));
            acks.clear();
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
    eprintln!(
        "kill soak: {n_kills} kill points, {n_acks_total} inputs acknowledged, lost: 0, \
         duplicated: 0, {n_events_total} events verified, {:.0} s",
        started.elapsed().as_secs_f64()
    );
}
