//! `dsh sim` end to end: parses the command line exactly as the binary does, runs the simulation in
//! this process (the `dsh` binary belongs to another package of the workspace, so it is not built for
//! this test), and checks the `--json` object the binary would print: its shape (SPEC §10) and that
//! its counts add up — against each other, and against the sessions the run left in its store.
//! Nothing here asserts a time.

use std::path::Path;

use clap::Parser;
use dsh::session::invariant;
use dsh::session::store::SessionStore;
use dsh::session::store::sqlite::{SqliteConfig, SqliteStore};
use dsh_cli::{Cli, Command, Config};
use serde_json::Value;

/// Runs `dsh --data-dir <data_dir> sim <flags>` and returns the JSON object it printed.
async fn sim_json(data_dir: &Path, flags: &[&str]) -> Value {
    let out = sim_output(data_dir, flags)
        .await
        .unwrap_or_else(|e| panic!("dsh sim {flags:?} failed: {e}"));
    let text = String::from_utf8(out).expect("the report is UTF-8");
    assert_eq!(
        text.lines().count(),
        1,
        "--json prints exactly one line:\n{text}"
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

async fn sim_output(data_dir: &Path, flags: &[&str]) -> Result<Vec<u8>, String> {
    let data_dir = data_dir.to_str().expect("a UTF-8 temp path");
    let mut argv = vec!["dsh", "--data-dir", data_dir, "sim"];
    argv.extend_from_slice(flags);
    let cli = Cli::try_parse_from(&argv).map_err(|e| e.to_string())?;
    let config = Config::resolve(&cli.global).map_err(|e| e.to_string())?;
    let Command::Sim(args) = cli.command else {
        return Err("not the sim subcommand".into());
    };
    let mut out = Vec::new();
    dsh_cli::sim::run(&args, &config, &mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(out)
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not an unsigned integer in {v}"))
}

fn f(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

/// The keys SPEC §10 requires, with their types; each latency is `{p50, p99, max}` (plus `n`).
fn assert_shape(v: &Value) {
    for key in ["agents", "turns", "peak_rss_bytes", "bytes_per_agent"] {
        u(v, key);
    }
    for key in ["turns_per_sec", "events_per_sec"] {
        assert!(f(v, key) > 0.0, "{key} must be positive in {v}");
    }
    for key in [
        "step_latency_ms",
        "ack_latency_ms",
        "arrival_ack_ms",
        "steer_to_claim_ms",
        "cancel_to_idle_ms",
        "wake_ack_ms",
        "wake_turn_ms",
    ] {
        let p = &v[key];
        let n = u(p, "n");
        for q in ["p50", "p99", "max"] {
            if n == 0 {
                assert!(p[q].is_null(), "{key}.{q} is null without samples: {p}");
            } else {
                assert!(p[q].as_f64().is_some(), "{key}.{q} is a number: {p}");
            }
        }
        if n > 0 {
            assert!(
                f(p, "p50") <= f(p, "p99") && f(p, "p99") <= f(p, "max"),
                "{p}"
            );
        }
    }
}

fn n_samples(v: &Value, key: &str) -> u64 {
    u(&v[key], "n")
}

/// Sums the stored events of the simulated agents and checks every log.
async fn stored_agent_events(store_dir: &Path) -> (usize, u64) {
    let store = SqliteStore::open(store_dir, SqliteConfig::default()).expect("reopen the store");
    let sessions = store.list().await.expect("list");
    let mut n_agents = 0;
    let mut n_events = 0;
    for summary in sessions
        .iter()
        .filter(|s| s.header.id.as_str().starts_with("sim-"))
    {
        n_agents += 1;
        n_events += summary.n_events;
        let loaded = store.load(&summary.header.id).await.expect("load");
        assert_eq!(
            loaded.n_repaired, 0,
            "a finished run leaves nothing to repair"
        );
        assert_eq!(invariant::check(&loaded.events), Ok(()));
        let turn_ends = loaded
            .events
            .iter()
            .filter(|e| e.kind() == "turn/end")
            .count();
        assert_eq!(turn_ends, 2, "{}: two turns each", summary.header.id);
    }
    store.close().await.expect("close");
    (n_agents, n_events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_agents_two_turns_add_up_against_the_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "50",
            "--turns",
            "2",
            "--json",
            "--keep-store",
            "--hibernate-ms",
            "20",
            "--ceiling-ms",
            "100",
        ],
    )
    .await;
    assert_shape(&v);
    assert_eq!(u(&v, "agents"), 50);
    assert_eq!(
        u(&v, "turns"),
        100,
        "turns = agents x turns without cancels"
    );
    assert_eq!(u(&v, "followups"), 100);
    assert_eq!(u(&v, "turns_started_by_followup"), 100);
    assert_eq!(u(&v, "turns_started_by_steer"), 0);
    assert_eq!(v["turn_ends"], serde_json::json!({"completed": 100}));
    assert_eq!(n_samples(&v, "ack_latency_ms"), 100, "one ack per followup");
    assert_eq!(
        n_samples(&v, "arrival_ack_ms"),
        50,
        "one per agent: its first followup"
    );
    assert_eq!(
        n_samples(&v, "step_latency_ms"),
        100,
        "one step per text turn"
    );
    assert_eq!(n_samples(&v, "steer_to_claim_ms"), 0);
    assert_eq!(n_samples(&v, "cancel_to_idle_ms"), 0);
    assert_eq!(u(&v, "observer_lagged"), 0);
    assert_eq!(u(&v, "hibernated_agents"), 50);
    assert_eq!(
        u(&v, "observed_agents"),
        50,
        "small runs observe every agent"
    );
    assert_eq!(v["store"], "sqlite");
    // Rates are the counts over the same duration.
    let secs = f(&v, "duration_ms") / 1000.0;
    let events = u(&v, "events");
    assert!((f(&v, "events_per_sec") * secs - events as f64).abs() < 1.0);
    assert!((f(&v, "turns_per_sec") * secs - 100.0).abs() < 1e-6);
    assert!(u(&v, "peak_rss_bytes") >= u(&v, "rss_hibernated_bytes"));
    let ceiling = &v["store_ceiling"];
    assert_eq!(u(ceiling, "appenders"), 50);
    assert!(u(ceiling, "events") > 0 && f(ceiling, "events_per_sec") > 0.0);
    let ratio = f(&v, "store_ceiling_ratio");
    assert!((ratio - f(&v, "events_per_sec") / f(ceiling, "events_per_sec")).abs() < 1e-9);
    // The store's writer did work during the turns, and it is part of the process's CPU.
    let (process, writer) = (f(&v, "turns_cpu_ms"), f(&v, "store_writer_cpu_ms"));
    assert!(
        writer > 0.0 && writer < process,
        "writer {writer} ms within the process's {process} ms"
    );
    // Every commit group wrote whole WAL frames (a 4 KiB page and its 24-byte header), one page
    // at least.
    let (wal, groups) = (u(&v, "store_wal_bytes"), u(&v, "store_groups"));
    const FRAME: u64 = 4096 + 24;
    assert!(
        wal % FRAME == 0 && wal >= groups * FRAME,
        "{wal} WAL bytes in {groups} groups"
    );
    // The WAL's catch-ups are counted on SQLite (this small run writes far less than the 64 MiB
    // a checkpoint waits for, so it holds the commits for none).
    assert_eq!(u(&v, "store_catch_ups"), 0);
    assert_eq!(f(&v, "store_commits_held_ms"), 0.0);
    // Nor does its WAL start over or get truncated.
    assert_eq!(u(&v, "store_wal_resets"), 0);
    assert_eq!(u(&v, "store_wal_truncations"), 0);
    // The writer writes the WAL's blocks ahead of SQLite only by about what SQLite wrote to it
    // since the open (at least 2 MiB past its end), and the chunks took time if there were any.
    let prefill = u(&v, "store_wal_prefill_bytes");
    assert!(
        prefill <= 2 * wal + (3 << 20),
        "{prefill} bytes ahead of {wal}"
    );
    assert_eq!(prefill > 0, f(&v, "store_wal_prefill_ms") > 0.0);

    // The store the run kept holds exactly the events the report counted, in valid logs.
    let store_dir = v["store_dir"]
        .as_str()
        .expect("--keep-store reports the directory");
    let store_dir = Path::new(store_dir);
    assert!(
        store_dir.starts_with(dir.path()),
        "{store_dir:?} is under the data directory"
    );
    assert!(
        store_dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("sim-")),
        "{store_dir:?} is a fresh sim-* directory"
    );
    let (n_agents, n_events) = stored_agent_events(store_dir).await;
    assert_eq!(n_agents, 50);
    assert_eq!(n_events, events);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keep_store_the_run_leaves_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "5",
            "--json",
            "--hibernate-ms",
            "10",
            "--ceiling-ms",
            "20",
        ],
    )
    .await;
    assert_eq!(u(&v, "turns"), 5);
    assert!(v["store_dir"].is_null());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .expect("the data directory exists")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The human report names what the writer did to the WAL on SQLite: its catch-ups, and how often
/// the WAL started over in place or was truncated (none of either in a run this small); the memory
/// store has no WAL and no such lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_text_report_says_how_the_wal_started_over_on_sqlite_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let report = |store: &'static str| {
        let dir = dir.path().to_path_buf();
        async move {
            let flags = [
                "--agents",
                "5",
                "--hibernate-ms",
                "10",
                "--ceiling-ms",
                "0",
                "--store",
                store,
            ];
            let out = sim_output(&dir, &flags)
                .await
                .unwrap_or_else(|e| panic!("dsh sim --store {store} failed: {e}"));
            String::from_utf8(out).expect("the report is UTF-8")
        }
    };
    let sqlite = report("sqlite").await;
    let lines: Vec<&str> = sqlite
        .lines()
        .filter(|l| l.trim_start().starts_with("WAL "))
        .map(str::trim)
        .collect();
    assert!(
        lines.contains(&"WAL starts over          0 in place, 0 truncated"),
        "{sqlite}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("WAL catch-ups")),
        "{sqlite}"
    );
    let memory = report("memory").await;
    assert!(!memory.contains("WAL "), "{memory}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_steer_is_acknowledged_and_claimed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "20",
            "--turns",
            "2",
            "--steer-rate",
            "1",
            "--store",
            "memory",
            "--json",
            "--hibernate-ms",
            "10",
            "--ceiling-ms",
            "0",
        ],
    )
    .await;
    assert_shape(&v);
    assert_eq!(u(&v, "steers"), 40);
    assert_eq!(
        u(&v, "steers_claimed"),
        40,
        "no cancel: every steer is claimed"
    );
    assert_eq!(u(&v, "steers_discarded"), 0);
    assert_eq!(n_samples(&v, "steer_to_claim_ms"), 40);
    assert_eq!(n_samples(&v, "ack_latency_ms"), 80, "followups and steers");
    assert!(f(&v, "turns_cpu_ms") > 0.0);
    assert!(
        v["store_writer_cpu_ms"].is_null()
            && v["store_wal_bytes"].is_null()
            && v["store_catch_ups"].is_null()
            && v["store_wal_resets"].is_null()
            && v["store_wal_truncations"].is_null()
            && v["store_commits_held_ms"].is_null()
            && v["store_wal_prefill_bytes"].is_null()
            && v["store_wal_prefill_ms"].is_null(),
        "the memory store has no writer and no WAL"
    );
    // A steer either joins its turn or, if that turn already ended, starts one of its own.
    assert_eq!(
        u(&v, "turns"),
        40 + u(&v, "turns_started_by_steer"),
        "turns = followup turns + turns started by a late steer: {v}"
    );
    assert_eq!(u(&v, "turns_started_by_followup"), 40);
    assert_eq!(v["turn_ends"]["completed"], u(&v, "turns"));
    assert!(v["store_ceiling"].is_null(), "--ceiling-ms 0 skips it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cancel_is_measured_to_idle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "20",
            "--turns",
            "2",
            "--cancel-rate",
            "1",
            "--steer-rate",
            "1",
            "--latency-ms",
            "60000",
            "--store",
            "memory",
            "--json",
            "--hibernate-ms",
            "1000",
            "--ceiling-ms",
            "0",
        ],
    )
    .await;
    assert_shape(&v);
    assert_eq!(u(&v, "cancels"), 40);
    assert_eq!(n_samples(&v, "cancel_to_idle_ms"), 40);
    // The model waits a minute before its first token, so no turn completes: each one is aborted.
    // No agent hibernates between its turns (1 s), so every followup starts its turn at once. (A
    // cancel that reaches a woken agent still reading its log back would discard the followup
    // before its turn starts; with `--hibernate-ms 10` a loaded machine made all 40 do that.)
    let turns = u(&v, "turns");
    assert_eq!(turns, 40, "{v}");
    assert_eq!(v["turn_ends"], serde_json::json!({ "aborted": turns }));
    assert_eq!(u(&v, "turns_started_by_followup"), turns);
    assert_eq!(u(&v, "turns_started_by_steer"), 0);
    // A steer is discarded by the cancel behind it, unless it was claimed together with its
    // followup at the first step of a turn (after a wake).
    assert_eq!(u(&v, "steers_discarded") + u(&v, "steers_claimed"), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_steps_are_counted_per_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "10",
            "--tool-rate",
            "1",
            "--tool-ms",
            "1",
            "--store",
            "memory",
            "--json",
            "--hibernate-ms",
            "10",
            "--ceiling-ms",
            "0",
        ],
    )
    .await;
    // The simulated model calls a tool on every step until three tool steps in a row, then answers.
    assert_eq!(u(&v, "turns"), 10);
    assert_eq!(n_samples(&v, "step_latency_ms"), 40);
    assert_eq!(v["turn_ends"], serde_json::json!({"completed": 10}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sample_of_agents_is_observed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "30",
            "--turns",
            "2",
            "--steer-rate",
            "1",
            "--observe-agents",
            "7",
            "--store",
            "memory",
            "--json",
            "--hibernate-ms",
            "10",
            "--ceiling-ms",
            "0",
        ],
    )
    .await;
    assert_eq!(u(&v, "observed_agents"), 7);
    assert_eq!(
        n_samples(&v, "ack_latency_ms"),
        120,
        "every agent's acks are measured"
    );
    assert_eq!(u(&v, "steers"), 60);
    assert_eq!(
        u(&v, "steers_claimed"),
        14,
        "steers are followed on observed agents only"
    );
    assert_eq!(n_samples(&v, "steer_to_claim_ms"), 14);
    assert_eq!(u(&v, "turns_started_by_followup"), 14);
    let ends: u64 = v["turn_ends"]
        .as_object()
        .expect("an object")
        .values()
        .map(|n| n.as_u64().expect("a count"))
        .sum();
    assert_eq!(ends, 14 + u(&v, "turns_started_by_steer"));
}

/// Per simulated agent in the kept store: how many turns its log ended.
async fn turn_ends_per_agent(store_dir: &Path) -> Vec<usize> {
    let store = SqliteStore::open(store_dir, SqliteConfig::default()).expect("reopen the store");
    let mut ends = Vec::new();
    for summary in store.list().await.expect("list") {
        if !summary.header.id.as_str().starts_with("sim-") {
            continue;
        }
        let loaded = store.load(&summary.header.id).await.expect("load");
        assert_eq!(
            loaded.n_repaired, 0,
            "a finished run leaves nothing to repair"
        );
        assert_eq!(invariant::check(&loaded.events), Ok(()));
        ends.push(
            loaded
                .events
                .iter()
                .filter(|e| e.kind() == "turn/end")
                .count(),
        );
    }
    store.close().await.expect("close");
    ends
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_sample_wakes_that_many_hibernated_agents_once_each() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "20",
            "--ramp-ms",
            "50",
            "--wake-sample",
            "5",
            "--json",
            "--keep-store",
            "--hibernate-ms",
            "10",
            "--ceiling-ms",
            "0",
        ],
    )
    .await;
    assert_shape(&v);
    assert_eq!(u(&v["config"], "wake_sample"), 5);
    assert_eq!(u(&v, "hibernated_agents"), 20);
    assert_eq!(
        u(&v, "turns"),
        20,
        "the run's turns leave the wakes out (they come after the run)"
    );
    assert_eq!(n_samples(&v, "ack_latency_ms"), 20);
    assert_eq!(
        n_samples(&v, "arrival_ack_ms"),
        20,
        "one per agent: its first followup"
    );
    // With one followup per agent and no steers, each input's time from its due time includes
    // its time from the call, so every rank of the one is at least that of the other.
    for q in ["p50", "p99", "max"] {
        assert!(
            f(&v["ack_latency_ms"], q) <= f(&v["arrival_ack_ms"], q),
            "{q}: {v}"
        );
    }
    for key in ["wake_ack_ms", "wake_turn_ms"] {
        assert_eq!(n_samples(&v, key), 5, "{key}");
    }
    // Each woken agent's turn is timed from the same call as its ack, so ends no earlier.
    for q in ["p50", "p99", "max"] {
        assert!(
            f(&v["wake_ack_ms"], q) <= f(&v["wake_turn_ms"], q),
            "{q}: {v}"
        );
    }
    let store_dir = v["store_dir"]
        .as_str()
        .expect("--keep-store reports the directory");
    let mut ends = turn_ends_per_agent(Path::new(store_dir)).await;
    ends.sort_unstable();
    let mut expected = vec![1; 15];
    expected.extend([2; 5]);
    assert_eq!(ends, expected, "five distinct agents got one more turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_sample_larger_than_the_fleet_wakes_every_agent_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "3",
            "--wake-sample",
            "10",
            "--json",
            "--keep-store",
            "--hibernate-ms",
            "10",
            "--ceiling-ms",
            "0",
        ],
    )
    .await;
    assert_eq!(u(&v["config"], "wake_sample"), 3);
    assert_eq!(n_samples(&v, "wake_ack_ms"), 3);
    assert_eq!(n_samples(&v, "wake_turn_ms"), 3);
    let store_dir = v["store_dir"].as_str().expect("kept");
    assert_eq!(
        turn_ends_per_agent(Path::new(store_dir)).await,
        vec![2, 2, 2]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_wake_sample_nothing_is_woken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v = sim_json(
        dir.path(),
        &[
            "--agents",
            "4",
            "--store",
            "memory",
            "--json",
            "--hibernate-ms",
            "10",
            "--ceiling-ms",
            "0",
        ],
    )
    .await;
    assert_eq!(u(&v["config"], "wake_sample"), 0);
    for key in ["wake_ack_ms", "wake_turn_ms"] {
        assert_eq!(
            v[key],
            serde_json::json!({"p50": null, "p99": null, "max": null, "n": 0}),
            "{key}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_are_refused_before_anything_is_created() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data_dir = dir.path().join("data");
    for (flags, needle) in [
        (vec!["--tool-rate", "1.5"], "--tool-rate is 1.5"),
        (vec!["--steer-rate", "NaN"], "--steer-rate is NaN"),
        (vec!["--cancel-rate=-0.1"], "--cancel-rate is -0.1"),
        (vec!["--agents", "0"], "--agents is 0"),
        (vec!["--turns", "0"], "--turns is 0"),
        (vec!["--store", "postgres"], "--store is \"postgres\""),
        (vec!["--reply-tokens", "0"], "--reply-tokens is 0"),
        (vec!["--ceiling-ms", "600000"], "--ceiling-ms is 600000 ms"),
    ] {
        let err = sim_output(&data_dir, &flags)
            .await
            .expect_err("a bad flag is refused");
        assert!(err.contains(needle), "{flags:?}: {err}");
    }
    assert!(!data_dir.exists(), "nothing was created");
}
