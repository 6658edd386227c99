//! Kill soak (RELIABILITY.md §5): a driver process runs agents on the simulated model over a store —
//! SQLite or PostgreSQL — with tools, steers and cancels, and prints every input acknowledged to it;
//! the test kills it with `SIGKILL` at a random moment, restarts it over the same store (resuming
//! every session, repair included), and repeats. Afterwards every acknowledged input is in its
//! session exactly once, every session loads and passes the invariant checker, and `dsh check` (the
//! built binary, `--store` for PostgreSQL) passes it.
//!
//! Three soaks: on SQLite (`kill_soak_loses_no_acknowledged_input`); on PostgreSQL, a database of its
//! own on the test server (`kill_soak_on_postgres_loses_no_acknowledged_input`; skipped with one line
//! without a server, failing under `CI=true`); and on a private PostgreSQL server this test starts
//! (`initdb` + `pg_ctl` in a temporary directory, on a free port, as the `postgres` user when run as
//! root), which every other round is itself killed with `SIGKILL` — the postmaster and every backend —
//! while the driver works, then restarted (crash recovery) before the driver is
//! (`kill_soak_with_the_database_server_killed`). The shared server on 5432 is never stopped.
//!
//! The driver is this test binary itself (`kill_soak_driver_entry`, selected by an environment
//! variable), as in `tests/store.rs`. Sizes: `DSH_SOAK_KILLS` (default 12 on SQLite and 8 on each
//! PostgreSQL soak in the test suite; the full run is `scripts/kill-soak`, 1,000),
//! `DSH_SOAK_KILLS_PER_STORE` (each store directory or database serves this many consecutive kills,
//! then is verified; default 50), `DSH_SOAK_SEED`. `DSH_PG_BIN` names the directory of `initdb` and
//! `pg_ctl` (default: the newest `/usr/lib/postgresql/*/bin`).

mod sandbox;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dsh::llm::provider::ProviderRegistry;
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::session::event::{CancelCause, EventData};
use dsh::session::invariant;
use dsh::session::store::SessionStore;
use dsh::session::store::postgres::{PostgresConfig, PostgresStore};
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh::{MessageId, SessionId};
use dsh_actors::{AgentSpec, Host, HostConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use sandbox::{dsh_bin, scrub};
use tokio_postgres::NoTls;
use tokio_util::sync::CancellationToken;

/// The driver's store: `sqlite:DIR` or a `postgres://…` URL.
const DRIVER_STORE_ENV: &str = "DSH_SOAK_DRIVER_STORE";
const DRIVER_ROUND_ENV: &str = "DSH_SOAK_DRIVER_ROUND";
const N_AGENTS: usize = 4;
/// The PostgreSQL node id of every driver and of the verification: a restarted driver is the same
/// node coming back, so it takes over the leases its killed predecessor held instead of waiting
/// for them to expire.
const PG_NODE: &str = "kill-soak-node";
/// The driver's exit code when the store refused an input (the database server was killed).
const EXIT_REFUSED: i32 = 4;

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

/// An open store of either backend.
enum Opened {
    Sqlite(Arc<SqliteStore>),
    Postgres(Arc<PostgresStore>),
}

impl Opened {
    fn store(&self) -> Arc<dyn SessionStore> {
        match self {
            Opened::Sqlite(s) => Arc::clone(s) as Arc<dyn SessionStore>,
            Opened::Postgres(s) => Arc::clone(s) as Arc<dyn SessionStore>,
        }
    }

    async fn close(&self) {
        match self {
            Opened::Sqlite(s) => s.close().await.expect("close"),
            Opened::Postgres(s) => s.close().await.expect("close"),
        }
    }
}

/// Opens the store a driver or a verification names: `sqlite:DIR` or `postgres://…` (as the
/// fixed node `PG_NODE`).
async fn open_store(spec: &str) -> Result<Opened, String> {
    if let Some(dir) = spec.strip_prefix("sqlite:") {
        let store = SqliteStore::open(Path::new(dir), SqliteConfig::default())
            .map_err(|e| e.to_string())?;
        Ok(Opened::Sqlite(Arc::new(store)))
    } else {
        let config = PostgresConfig {
            node_id: PG_NODE.to_string(),
            ..PostgresConfig::default()
        };
        let store = PostgresStore::open(spec, config)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Opened::Postgres(Arc::new(store)))
    }
}

/// Not a test on its own: the driver process the soaks start (it returns at once without the
/// environment variable). It resumes (or creates) every session, then drives every agent at once —
/// a followup, sometimes a steer behind it or a cancel, wait for idle — printing `ACK session
/// message` after each acknowledged input, until it is killed. An input the host refuses is
/// `REFUSED …` and exit code 4 (expected only once the database server is killed).
#[test]
fn kill_soak_driver_entry() {
    let Ok(spec) = std::env::var(DRIVER_STORE_ENV) else {
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
        let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
        let say = |out: &std::sync::Mutex<std::io::Stdout>, line: String| {
            let mut out = out.lock().unwrap();
            writeln!(out, "{line}").unwrap();
            out.flush().unwrap();
        };
        let store = match open_store(&spec).await {
            Ok(opened) => opened.store(),
            Err(e) => {
                say(&out, format!("FAIL open: {e}"));
                std::process::exit(3);
            }
        };
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
        let host = Host::builder(store)
            .providers(providers)
            .tools(tools)
            .config(HostConfig {
                hibernate_after: None,
                ..HostConfig::default()
            })
            .start()
            .await
            .unwrap();
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
        fn refused(out: &std::sync::Mutex<std::io::Stdout>, line: String) -> ! {
            if let Ok(mut out) = out.lock() {
                let _ = writeln!(out, "REFUSED {line}");
                let _ = out.flush();
            }
            std::process::exit(EXIT_REFUSED);
        }
        for (i, agent) in agents.into_iter().enumerate() {
            let out = Arc::clone(&out);
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(round * 1_000 + i as u64);
                for n in 0u64.. {
                    let id = format!("r{round}-a{i}-n{n}");
                    match agent.followup(user(&id, "work on this")).await {
                        Ok(()) => say(&out, format!("ACK {i} {id}")),
                        Err(e) => refused(&out, format!("followup {id}: {e}")),
                    }
                    match rng.random_range(0..10u32) {
                        0..=2 => {
                            let id = format!("{id}-steer");
                            match agent.steer(user(&id, "and this")).await {
                                Ok(()) => say(&out, format!("ACK {i} {id}")),
                                Err(e) => refused(&out, format!("steer {id}: {e}")),
                            }
                        }
                        3..=4 => {
                            tokio::time::sleep(Duration::from_millis(rng.random_range(0..5))).await;
                            let keep = rng.random_bool(0.5);
                            if let Err(e) = agent.cancel(CancelCause::User, keep).await {
                                refused(&out, format!("cancel: {e}"));
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
async fn verify_store(spec: &str, acks: &BTreeMap<usize, Vec<String>>) -> usize {
    let opened = open_store(spec)
        .await
        .unwrap_or_else(|e| panic!("open the soaked store {spec}: {e}"));
    let store = opened.store();
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
    drop(store);
    opened.close().await;
    for i in 0..N_AGENTS {
        let mut cmd = Command::new(dsh_bin());
        scrub(&mut cmd);
        match spec.strip_prefix("sqlite:") {
            Some(dir) => cmd.arg("--data-dir").arg(dir).arg("check"),
            None => cmd.args(["check", "--store", spec]),
        };
        let out = cmd
            .arg(session(i).as_str())
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

/// Where the soaked stores live: fresh SQLite directories, or fresh databases on a PostgreSQL
/// server (the shared test server or a private one).
trait Stores {
    /// The store spec (`sqlite:DIR` or `postgres://…`) of store number `n`, created empty.
    fn create(&mut self, n: u64) -> String;
    /// Removes store number `n` after its verification.
    fn remove(&mut self, n: u64);
}

struct SqliteDirs(tempfile::TempDir);

impl Stores for SqliteDirs {
    fn create(&mut self, n: u64) -> String {
        format!(
            "sqlite:{}",
            self.0.path().join(format!("store-{n}")).display()
        )
    }
    fn remove(&mut self, n: u64) {
        std::fs::remove_dir_all(self.0.path().join(format!("store-{n}"))).unwrap();
    }
}

/// Databases `NAME_N` made on the server of `admin_url` (a `postgres://…/DB` URL), dropped after
/// their verification and on drop.
struct PgDatabases {
    admin_url: String,
    name: String,
    made: Vec<u64>,
}

impl PgDatabases {
    /// `None` (after one line saying it skipped) when the server does not answer, outside CI.
    fn connect(test: &str, admin_url: String) -> Option<PgDatabases> {
        let reachable = admin_sql(&admin_url, "SELECT 1").is_ok();
        if !reachable {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: PostgreSQL is not reachable at {admin_url} and CI=true"
            );
            eprintln!(
                "{test}: skipped: PostgreSQL not reachable at {admin_url}; run a server on 127.0.0.1:5432 (trust auth) or set DSH_TEST_POSTGRES"
            );
            return None;
        }
        Some(PgDatabases {
            admin_url,
            name: format!(
                "dsh_soak_{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            made: Vec::new(),
        })
    }

    fn url(&self, n: u64) -> String {
        let (base, _) = self
            .admin_url
            .rsplit_once('/')
            .expect("a postgres://…/DB URL");
        format!("{base}/{}_{n}", self.name)
    }
}

impl Stores for PgDatabases {
    fn create(&mut self, n: u64) -> String {
        admin_sql(
            &self.admin_url,
            &format!("CREATE DATABASE {}_{n}", self.name),
        )
        .expect("create the soak database");
        self.made.push(n);
        self.url(n)
    }
    fn remove(&mut self, n: u64) {
        let sql = format!("DROP DATABASE IF EXISTS {}_{n} WITH (FORCE)", self.name);
        admin_sql(&self.admin_url, &sql).expect("drop the soak database");
        self.made.retain(|&m| m != n);
    }
}

impl Drop for PgDatabases {
    fn drop(&mut self) {
        for n in std::mem::take(&mut self.made) {
            let sql = format!("DROP DATABASE IF EXISTS {}_{n} WITH (FORCE)", self.name);
            if admin_sql(&self.admin_url, &sql).is_err() {
                eprintln!("could not drop the soak database {}_{n}", self.name);
            }
        }
    }
}

/// Runs one statement on `url` from a runtime of its own (the soak loop is synchronous).
fn admin_sql(url: &str, sql: &str) -> Result<(), String> {
    let (url, sql) = (url.to_string(), sql.to_string());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        rt.block_on(async move {
            let connect = tokio_postgres::connect(&url, NoTls);
            let (client, connection) = tokio::time::timeout(Duration::from_secs(5), connect)
                .await
                .map_err(|_| "timed out".to_string())?
                .map_err(|e| e.to_string())?;
            tokio::spawn(connection);
            client.batch_execute(&sql).await.map_err(|e| e.to_string())
        })
    })
    .join()
    .map_err(|_| "the admin thread panicked".to_string())?
}

/// A PostgreSQL server of this test's own, in a temporary directory on a free port, which it may
/// kill. Run as the `postgres` user when this process is root (initdb refuses root).
struct PrivatePg {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// `runuser -u USER --` before every server command, when root.
    user: Option<String>,
}

impl PrivatePg {
    /// Initializes and starts a server; `None` (after one line saying it skipped) when no
    /// PostgreSQL binaries are installed, outside CI.
    fn start_new(test: &str) -> Option<PrivatePg> {
        let bin = std::env::var_os("DSH_PG_BIN")
            .map(PathBuf::from)
            .or_else(|| {
                let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
                    .ok()?
                    .flatten()
                    .map(|e| e.path().join("bin"))
                    .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
                    .collect();
                found.sort();
                found.pop()
            });
        let Some(bin) = bin else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: no initdb/pg_ctl found (set DSH_PG_BIN) and CI=true"
            );
            eprintln!(
                "{test}: skipped: no PostgreSQL binaries under /usr/lib/postgresql/*/bin (set DSH_PG_BIN)"
            );
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        // Whether this process is root (`id -u`: no libc dependency needed for one call).
        let uid = Command::new("id").arg("-u").output().unwrap();
        let user = (String::from_utf8_lossy(&uid.stdout).trim() == "0").then(|| {
            let user = std::env::var("DSH_PG_USER").unwrap_or_else(|_| "postgres".to_string());
            let status = Command::new("chown")
                .arg(&user)
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(status.success(), "chown the server directory to {user}");
            user
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pg = PrivatePg {
            dir,
            bin,
            port,
            user,
        };
        let data = pg.data();
        let out = pg
            .command("initdb")
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pg.start();
        Some(pg)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        match &self.user {
            Some(user) => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", user, "--"]).arg(program);
                cmd
            }
            None => Command::new(program),
        }
    }

    fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server and waits until it accepts connections (after a kill: crash recovery).
    fn start(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1",
            self.port,
            self.dir.path().display()
        );
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-o", &options, "-l"])
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", "60", "start"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `SIGKILL`s the postmaster and every process it started (by id, from `postmaster.pid` and
    /// `/proc`), and waits until they are gone.
    fn kill(&self) {
        let Ok(pid_file) = std::fs::read_to_string(self.data().join("postmaster.pid")) else {
            return;
        };
        let Some(postmaster) = pid_file
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<u32>().ok())
        else {
            return;
        };
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid …`: the comm may hold spaces, so read after the last ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(postmaster)
                && let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok())
            {
                pids.push(pid);
            }
        }
        for pid in &pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while pids
            .iter()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
        {
            assert!(Instant::now() < deadline, "the killed server lingers");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills the driver at random moments, `n_kills` times, restarting it over the same store, and
/// verifies each store after its last kill (`verify_store`). With `server`, every other round also
/// kills the database server while the driver works, then restarts it before the next round.
fn soak(test: &str, default_kills: u64, stores: &mut dyn Stores, server: Option<&PrivatePg>) {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let n_kills = env("DSH_SOAK_KILLS").unwrap_or(default_kills);
    let per_store = env("DSH_SOAK_KILLS_PER_STORE").unwrap_or(50).max(1);
    let seed = env("DSH_SOAK_SEED").unwrap_or(0x50a6);
    let mut rng = StdRng::seed_from_u64(seed);
    let exe = std::env::current_exe().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let mut acks: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    let mut n_acks_total = 0usize;
    let mut n_events_total = 0usize;
    let mut n_server_kills = 0usize;
    let mut n_refused = 0usize;
    let mut spec = String::new();
    for round in 0..n_kills {
        if round % per_store == 0 {
            spec = stores.create(round / per_store);
        }
        let kill_server = server.is_some() && round % 2 == 1;
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "kill_soak_driver_entry",
                "--test-threads=1",
                "-q",
            ])
            .env(DRIVER_STORE_ENV, &spec)
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
                .unwrap_or_else(|_| {
                    panic!("{test}: round {round}: the driver acknowledged nothing: {lines:?}")
                });
            let is_ack = line.starts_with("ACK ");
            let failed = line.starts_with("FAIL ");
            lines.push(line);
            if is_ack || failed {
                break;
            }
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..80_000)));
        if kill_server && let Some(server) = server {
            // The database dies under the working driver; let the driver meet the dead server
            // for a while (its inputs are refused, nothing is acknowledged falsely), then kill it.
            server.kill();
            n_server_kills += 1;
            std::thread::sleep(Duration::from_micros(rng.random_range(0..200_000)));
        }
        let _ = child.kill();
        let status = child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        if let Some(fail) = lines.iter().find(|l| l.starts_with("FAIL ")) {
            panic!("{test}: round {round}: the driver failed: {fail}");
        }
        let refused = lines.iter().find(|l| l.starts_with("REFUSED "));
        if kill_server {
            assert!(
                status.signal() == Some(9) || status.code() == Some(EXIT_REFUSED),
                "{test}: round {round}: {status}"
            );
            n_refused += usize::from(refused.is_some());
        } else {
            assert!(refused.is_none(), "{test}: round {round}: {refused:?}");
            assert_eq!(status.signal(), Some(9), "{test}: round {round}: {status}");
        }
        for line in &lines {
            if let Some(rest) = line.strip_prefix("ACK ")
                && let Some((i, message)) = rest.split_once(' ')
            {
                let i: usize = i.parse().expect("an agent index");
                acks.entry(i).or_default().push(message.to_string());
                n_acks_total += 1;
            }
        }
        if kill_server && let Some(server) = server {
            server.start();
        }
        if (round + 1) % per_store == 0 || round + 1 == n_kills {
            n_events_total += runtime.block_on(verify_store(&spec, &acks));
            acks.clear();
            stores.remove(round / per_store);
        }
    }
    eprintln!(
        "{test}: {n_kills} kill points ({n_server_kills} with the database server killed too, \
         {n_refused} of them refusing an input), {n_acks_total} inputs acknowledged, lost: 0, \
         duplicated: 0, {n_events_total} events verified, {:.0} s",
        started.elapsed().as_secs_f64()
    );
}

/// The soak on SQLite: `DSH_SOAK_KILLS` kills (default 12).
#[test]
fn kill_soak_loses_no_acknowledged_input() {
    if std::env::var_os(DRIVER_STORE_ENV).is_some() {
        return;
    }
    let mut dirs = SqliteDirs(tempfile::tempdir().unwrap());
    soak("kill_soak_loses_no_acknowledged_input", 12, &mut dirs, None);
}

/// The soak on PostgreSQL, in databases of its own on the test server (`DSH_TEST_POSTGRES`, default
/// `postgres://postgres@127.0.0.1:5432/postgres`): `DSH_SOAK_KILLS` kills (default 8) of the driver.
#[test]
fn kill_soak_on_postgres_loses_no_acknowledged_input() {
    const TEST: &str = "kill_soak_on_postgres_loses_no_acknowledged_input";
    if std::env::var_os(DRIVER_STORE_ENV).is_some() {
        return;
    }
    let admin_url = std::env::var("DSH_TEST_POSTGRES")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    let Some(mut databases) = PgDatabases::connect(TEST, admin_url) else {
        return;
    };
    soak(TEST, 8, &mut databases, None);
}

/// The soak on a private PostgreSQL server that every other round is killed (`SIGKILL`, postmaster
/// and backends) while the driver works and restarted before the next: `DSH_SOAK_KILLS` kills
/// (default 8) of the driver, half of them with the server's.
#[test]
fn kill_soak_with_the_database_server_killed() {
    const TEST: &str = "kill_soak_with_the_database_server_killed";
    if std::env::var_os(DRIVER_STORE_ENV).is_some() {
        return;
    }
    let Some(server) = PrivatePg::start_new(TEST) else {
        return;
    };
    let mut databases =
        PgDatabases::connect(TEST, server.admin_url()).expect("the private server answers");
    soak(TEST, 8, &mut databases, Some(&server));
    drop(databases);
    drop(server);
}
