//! The scenario corpus (`tests/scenarios/*.json`, SPEC §9) run with the check, one world per file, and
//! the runner's own tests: every way a scenario can be wrong gives a typed error naming where.
//!
//! Each corpus log must also satisfy the session invariants (`session::invariant::check`) and be
//! balanced: a scenario is a claim about behaviour, and no behaviour may leave an invalid log.
//! Only `*.json` directly in `tests/scenarios/` runs: a scenario that shows a disagreement with the
//! reference not yet fixed would wait in `tests/scenarios/pending/` with a note (none does today).

use std::path::{Path, PathBuf};

use dsh::scenario::{ExpectMode, Scenario, ScenarioError};
use dsh_cli::scenario::{load_file, render_log, run_files, run_scenario};
use serde_json::{Value, json};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

fn corpus_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .expect("tests/scenarios exists")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

async fn run_one(path: &Path) -> Result<usize, String> {
    let scenario = load_file(path).map_err(|e| e.to_string())?;
    if scenario.expect.is_none() {
        return Err("a corpus scenario needs an expect section".into());
    }
    let log = run_scenario(&scenario).await.map_err(|e| e.to_string())?;
    if let Err(e) = scenario.check(&log) {
        return Err(format!("{e}\n--- log ---\n{}", render_log(&log)));
    }
    if let Err(v) = dsh::session::invariant::check(&log) {
        return Err(format!("the log breaks a session invariant: {v}"));
    }
    if !dsh::session::invariant::is_balanced(&log) {
        return Err("the log ends inside a turn".into());
    }
    Ok(log.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_corpus_scenario_matches_its_expectation() {
    let files = corpus_files();
    assert!(
        files.len() >= 60,
        "the corpus holds {} scenarios, it needs at least 60",
        files.len()
    );
    let mut failures = Vec::new();
    for path in &files {
        if let Err(e) = run_one(path).await {
            failures.push(format!("{}:\n{e}", path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios failed:\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

#[test]
fn corpus_names_are_numbered_and_unique() {
    let mut numbers = std::collections::BTreeSet::new();
    let mut names = std::collections::BTreeSet::new();
    for path in corpus_files() {
        let file = path
            .file_name()
            .and_then(|f| f.to_str())
            .unwrap_or_default();
        let number = file.split('-').next().unwrap_or_default();
        assert!(
            number.len() == 3 && number.chars().all(|c| c.is_ascii_digit()),
            "{file}: corpus files are named NNN-name.json"
        );
        assert!(numbers.insert(number.to_string()), "{file}: number reused");
        let scenario = load_file(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(names.insert(scenario.name.clone()), "{file}: name reused");
    }
}

// -------------------------------------------------------------------------------------------------
// Ways a scenario can be wrong.

/// A valid base scenario to break one piece at a time.
fn base() -> Value {
    json!({
        "name": "base",
        "agent": {"max_parallel_tool_calls": 2, "max_tokens": null},
        "tools": [{"name": "read", "mode": "parallel"}],
        "model": [
            {"tool_calls": [{"id": "c1", "name": "read", "arguments": "{}"}], "gate": "g1"},
            {"text": "ok"}
        ],
        "tool_behaviour": {"c1": {"result": "file a", "gate": "g2"}},
        "hooks": {
            "pre_step": [{"turn": 1, "step": 1, "decision": "rewrite", "messages": ["x"]}],
            "turn_stopping": [{"turn": 1, "steer": "more"}],
            "request_error": {"retries": 2}
        },
        "actions": [
            {"followup": "hi", "id": "m1"},
            {"wait_for": {"type": "assistant/chunk", "count": 1}},
            {"cancel": {"cause": "user", "keep_inbox": false}},
            {"open": "g1"},
            {"wait_idle": true}
        ],
        "expect": [{"type": "agent/inbox/spliced", "data": {"target": "next-turn"}}],
        "expect_mode": "subsequence"
    })
}

fn push(array: &mut Value, item: Value) {
    array
        .as_array_mut()
        .expect("the base has this array")
        .push(item);
}

fn parse(v: &Value) -> Result<Scenario, ScenarioError> {
    Scenario::from_value(v)
}

/// Applies `edit` to the base scenario and asserts the parse fails with `want` at `path`.
#[track_caller]
fn assert_refused(edit: impl FnOnce(&mut Value), field_error: bool, path: &str, want: &str) {
    let mut v = base();
    edit(&mut v);
    match parse(&v) {
        Ok(_) => panic!("accepted a scenario that should fail at {path}: {v}"),
        Err(ScenarioError::Field { path: p, reason }) if field_error => {
            assert_eq!(p, path, "{reason}");
            assert!(reason.contains(want), "{p}: {reason} (wanted {want:?})");
        }
        Err(ScenarioError::Invalid { path: p, reason }) if !field_error => {
            assert_eq!(p, path, "{reason}");
            assert!(reason.contains(want), "{p}: {reason} (wanted {want:?})");
        }
        Err(other) => panic!("wrong error for {path}: {other:?}"),
    }
}

#[test]
fn the_base_scenario_is_valid() {
    let s = parse(&base()).expect("valid");
    assert_eq!(s.expect_mode, ExpectMode::Subsequence);
    assert_eq!(s.actions.len(), 5);
    assert_eq!(
        s.gates().into_iter().collect::<Vec<_>>(),
        ["g1".to_string(), "g2".to_string()]
    );
}

#[test]
fn an_unknown_field_is_refused_at_every_level() {
    let unknown = "unknown field `bogus`";
    assert_refused(|v| v["bogus"] = json!(1), true, "scenario", unknown);
    assert_refused(|v| v["agent"]["bogus"] = json!(1), true, "agent", unknown);
    assert_refused(
        |v| v["tools"][0]["bogus"] = json!(1),
        true,
        "tools[0]",
        unknown,
    );
    assert_refused(
        |v| v["model"][1]["bogus"] = json!(1),
        true,
        "model[1]",
        unknown,
    );
    assert_refused(
        |v| v["model"][0]["tool_calls"][0]["bogus"] = json!(1),
        true,
        "model[0]",
        unknown,
    );
    assert_refused(
        |v| v["tool_behaviour"]["c1"]["bogus"] = json!(1),
        true,
        "tool_behaviour.c1",
        unknown,
    );
    assert_refused(
        |v| {
            v["tool_behaviour"]["c1"]["error"] =
                json!({"message": "m", "name": "N", "code": "C", "bogus": 1})
        },
        true,
        "tool_behaviour.c1.error",
        unknown,
    );
    assert_refused(|v| v["hooks"]["bogus"] = json!(1), true, "hooks", unknown);
    assert_refused(
        |v| v["hooks"]["pre_step"][0]["bogus"] = json!(1),
        true,
        "hooks.pre_step[0]",
        unknown,
    );
    assert_refused(
        |v| v["hooks"]["turn_stopping"][0]["bogus"] = json!(1),
        true,
        "hooks.turn_stopping[0]",
        unknown,
    );
    assert_refused(
        |v| v["hooks"]["request_error"]["bogus"] = json!(1),
        true,
        "hooks.request_error",
        unknown,
    );
    assert_refused(
        |v| v["actions"][0]["bogus"] = json!(1),
        true,
        "actions[0]",
        unknown,
    );
    assert_refused(
        |v| v["actions"][1]["wait_for"]["bogus"] = json!(1),
        true,
        "actions[1]",
        unknown,
    );
    assert_refused(
        |v| v["actions"][2]["cancel"]["bogus"] = json!(1),
        true,
        "actions[2]",
        unknown,
    );
    assert_refused(
        |v| v["expect"][0]["bogus"] = json!(1),
        true,
        "expect[0]",
        unknown,
    );
}

#[test]
fn wrong_types_and_missing_fields_are_refused_with_their_path() {
    assert_refused(|v| v["name"] = json!(3), true, "name", "invalid type");
    assert_refused(
        |v| {
            v.as_object_mut().map(|o| o.remove("name"));
        },
        true,
        "scenario",
        "missing field `name`",
    );
    assert_refused(
        |v| {
            v.as_object_mut().map(|o| o.remove("actions"));
        },
        true,
        "scenario",
        "missing field `actions`",
    );
    assert_refused(
        |v| v["agent"]["max_parallel_tool_calls"] = json!("ten"),
        true,
        "agent",
        "invalid type",
    );
    assert_refused(
        |v| v["tools"][0]["mode"] = json!("sometimes"),
        true,
        "tools[0]",
        "unknown variant",
    );
    assert_refused(|v| v["tools"] = json!({}), true, "tools", "invalid type");
    assert_refused(
        |v| v["model"][1] = json!({"text": 5}),
        true,
        "model[1]",
        "invalid type",
    );
    assert_refused(
        |v| v["model"][1] = json!({"text": "a", "hang": "b"}),
        true,
        "model[1]",
        "2 reply kinds",
    );
    assert_refused(
        |v| v["tool_behaviour"]["c1"]["delay_ms"] = json!(-1),
        true,
        "tool_behaviour.c1",
        "invalid value",
    );
    assert_refused(
        |v| v["hooks"]["pre_step"][0]["decision"] = json!("maybe"),
        true,
        "hooks.pre_step[0]",
        "unknown variant",
    );
    assert_refused(
        |v| v["hooks"]["request_error"] = json!({}),
        true,
        "hooks.request_error",
        "missing field `retries`",
    );
    assert_refused(
        |v| v["actions"][2]["cancel"]["cause"] = json!("boredom"),
        true,
        "actions[2].cancel.cause",
        "cause must be",
    );
    assert_refused(
        |v| v["actions"][1]["wait_for"]["count"] = json!("two"),
        true,
        "actions[1]",
        "invalid type",
    );
    assert_refused(
        |v| v["expect_mode"] = json!("fuzzy"),
        true,
        "expect_mode",
        "unknown variant",
    );
    assert_refused(
        |v| v["expect"][0] = json!({"data": {}}),
        true,
        "expect[0]",
        "missing field `type`",
    );
    assert!(matches!(
        Scenario::parse("{\"name\": "),
        Err(ScenarioError::Json { .. })
    ));
    assert!(matches!(
        Scenario::parse("[1, 2]"),
        Err(ScenarioError::Field { .. })
    ));
}

#[test]
fn semantic_errors_are_refused_with_their_path() {
    assert_refused(|v| v["name"] = json!("  "), false, "name", "name is empty");
    assert_refused(
        |v| v["actions"][3] = json!({"open": "g9"}),
        false,
        "actions[3]",
        "open \"g9\": no model entry, tool or hook waits on a gate of that name",
    );
    assert_refused(
        |v| v["actions"][3] = json!({"remove": "never-sent"}),
        false,
        "actions[3]",
        "no earlier action sent a message with that id",
    );
    assert_refused(
        |v| v["actions"][0] = json!({"remove": "m1"}),
        false,
        "actions[0]",
        "no earlier action sent",
    );
    assert_refused(
        |v| v["actions"][3] = json!({"replace": "nope", "with": "x"}),
        false,
        "actions[3]",
        "no earlier action sent",
    );
    assert_refused(
        |v| v["actions"][3] = json!({"replace": "m1"}),
        false,
        "actions[3]",
        "replace and with go together",
    );
    assert_refused(
        |v| v["actions"][1]["wait_for"]["count"] = json!(0),
        false,
        "actions[1]",
        "wait_for count 0",
    );
    assert_refused(
        |v| v["actions"][1]["wait_for"]["type"] = json!("assistant/chunks"),
        false,
        "actions[1]",
        "no such event type",
    );
    assert_refused(
        |v| v["actions"][0] = json!({"followup": "a", "steer": "b"}),
        false,
        "actions[0]",
        "exactly one verb",
    );
    assert_refused(
        |v| v["actions"][0] = json!({}),
        false,
        "actions[0]",
        "found 0",
    );
    assert_refused(
        |v| v["actions"][3] = json!({"open": "g1", "id": "x"}),
        false,
        "actions[3]",
        "id belongs to",
    );
    assert_refused(
        |v| v["actions"][4] = json!({"wait_idle": false}),
        false,
        "actions[4]",
        "must be true",
    );
    assert_refused(
        |v| v["actions"][0]["id"] = json!(""),
        false,
        "actions[0].id",
        "not a valid message id",
    );
    assert_refused(
        |v| v["agent"]["max_parallel_tool_calls"] = json!(0),
        false,
        "agent.max_parallel_tool_calls",
        "at least 1",
    );
    assert_refused(
        |v| v["agent"]["max_tokens"] = json!(0),
        false,
        "agent.max_tokens",
        "at least 1",
    );
    assert_refused(
        |v| {
            push(
                &mut v["tools"],
                json!({"name": "read", "mode": "exclusive"}),
            )
        },
        false,
        "tools[1]",
        "declared twice",
    );
    assert_refused(
        |v| v["tool_behaviour"]["c7"] = json!({"result": "x"}),
        false,
        "tool_behaviour.c7",
        "no model entry makes a tool call with id \"c7\"",
    );
    assert_refused(
        |v| v["tool_behaviour"]["c1"]["error"] = json!("boom"),
        false,
        "tool_behaviour.c1",
        "result and error exclude each other",
    );
    assert_refused(
        |v| v["tool_behaviour"]["c1"]["gate"] = json!(""),
        false,
        "tool_behaviour.c1.gate",
        "gate name is empty",
    );
    assert_refused(
        |v| v["hooks"]["pre_step"][0]["turn"] = json!(0),
        false,
        "hooks.pre_step[0]",
        "count from 1",
    );
    assert_refused(
        |v| {
            push(
                &mut v["hooks"]["pre_step"],
                json!({"turn": 1, "step": 1, "decision": "reject"}),
            );
        },
        false,
        "hooks.pre_step[1]",
        "a second entry for turn 1 step 1",
    );
    assert_refused(
        |v| v["hooks"]["pre_step"][0] = json!({"turn": 1, "step": 1, "decision": "rewrite"}),
        false,
        "hooks.pre_step[0]",
        "a rewrite needs messages",
    );
    assert_refused(
        |v| {
            v["hooks"]["pre_step"][0] =
                json!({"turn": 1, "step": 1, "decision": "reject", "messages": []});
        },
        false,
        "hooks.pre_step[0]",
        "messages belong to a rewrite",
    );
    assert_refused(
        |v| v["hooks"]["turn_stopping"][0] = json!({"turn": 1, "steer": "a", "inject": "b"}),
        false,
        "hooks.turn_stopping[0]",
        "exactly one of steer, inject and cancel",
    );
    assert_refused(
        |v| v["hooks"]["request_error"]["jitter_ratio"] = json!(2.0),
        false,
        "hooks.request_error",
        "jitterRatio",
    );
    assert_refused(
        |v| v["expect"][0]["type"] = json!("turn/begin"),
        false,
        "expect[0]",
        "no event of type \"turn/begin\"",
    );
    assert_refused(
        |v| v["action_timeout_ms"] = json!(0),
        false,
        "action_timeout_ms",
        "at least 1",
    );
}

// -------------------------------------------------------------------------------------------------
// Running and checking.

fn simple(expect: Value, mode: &str) -> Scenario {
    Scenario::from_value(&json!({
        "name": "simple",
        "model": [{"text": "ok"}],
        "actions": [{"followup": "hi", "id": "m1"}, {"wait_idle": true}],
        "expect": expect,
        "expect_mode": mode
    }))
    .expect("valid")
}

fn mismatch(e: ScenarioError) -> dsh::scenario::Mismatch {
    match e {
        ScenarioError::Mismatch(m) => *m,
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatch_names_the_scenario_the_index_the_expected_entry_and_the_actual_event() {
    let s = simple(
        json!([
            {"type": "agent/inbox/spliced"},
            {"type": "turn/start", "data": {"turn": 1}},
            {"type": "agent/inbox/spliced", "data": {"removedCount": 1}},
            {"type": "step/start", "data": {"turn": 1, "step": 2}}
        ]),
        "whole",
    );
    let log = run_scenario(&s).await.expect("runs");
    let m = mismatch(s.check(&log).expect_err("step 2 is wrong"));
    assert_eq!(m.scenario, "simple");
    assert_eq!(m.expect_idx, 3);
    assert_eq!(m.event_idx, Some(3));
    assert_eq!(m.detail, "data.step: expected 2, got 1");
    assert_eq!(
        m.expected,
        json!({"type": "step/start", "data": {"turn": 1, "step": 2}})
    );
    assert_eq!(
        m.actual,
        Some(json!({"type": "step/start", "seq": 3, "time": 0, "data": {"turn": 1, "step": 1}}))
    );
    let shown = ScenarioError::Mismatch(Box::new(m)).to_string();
    assert!(
        shown.starts_with("scenario \"simple\": expect[3] vs event 3: data.step"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_mode_refuses_a_log_longer_or_shorter_than_expected() {
    let s = simple(json!([{"type": "agent/inbox/spliced"}]), "whole");
    let log = run_scenario(&s).await.expect("runs");
    let m = mismatch(s.check(&log).expect_err("too short an expectation"));
    assert_eq!((m.expect_idx, m.event_idx), (1, Some(1)));
    assert_eq!(m.expected, Value::Null);
    assert!(
        m.detail.contains("events after the last expected one"),
        "{}",
        m.detail
    );

    let mut entries: Vec<Value> = log.iter().map(|e| json!({"type": e.kind()})).collect();
    entries.push(json!({"type": "turn/start"}));
    let s = simple(Value::Array(entries), "whole");
    let m = mismatch(s.check(&log).expect_err("too long an expectation"));
    assert_eq!((m.expect_idx, m.event_idx), (log.len(), None));
    assert_eq!(m.actual, None);
    assert!(m.detail.contains("the log ends after"), "{}", m.detail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subsequence_mode_skips_events_but_keeps_order() {
    let s = simple(
        json!([
            {"type": "turn/start", "data": {"turn": 1}},
            {"type": "assistant/message", "data": {"message": {"content": [{"type": "text", "text": "ok"}]}}},
            {"type": "turn/end", "data": {"reason": {"kind": "completed"}}}
        ]),
        "subsequence",
    );
    let log = run_scenario(&s).await.expect("runs");
    s.check(&log).expect("matches as a subsequence");

    let s = simple(
        json!([
            {"type": "turn/end"},
            {"type": "turn/start"}
        ]),
        "subsequence",
    );
    let m = mismatch(s.check(&log).expect_err("out of order"));
    assert_eq!(m.expect_idx, 1);
    assert_eq!(m.event_idx, None);
    assert!(
        m.detail.contains("no turn/start event from index"),
        "{}",
        m.detail
    );

    let s = simple(
        json!([{"type": "turn/end", "data": {"reason": {"kind": "aborted"}}}]),
        "subsequence",
    );
    let m = mismatch(s.check(&log).expect_err("wrong reason"));
    assert_eq!(m.expect_idx, 0);
    assert_eq!(m.event_idx, Some(log.len() - 1));
    assert!(
        m.detail
            .contains("data.reason.kind: expected \"aborted\", got \"completed\""),
        "{}",
        m.detail
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_without_expect_runs_but_cannot_be_checked() {
    let s = Scenario::from_value(&json!({
        "name": "no expect",
        "model": [{"text": "ok"}],
        "actions": [{"followup": "hi"}]
    }))
    .expect("valid");
    let log = run_scenario(&s).await.expect("runs");
    assert_eq!(log.last().map(|e| e.kind()), Some("turn/end"));
    assert!(matches!(
        s.check(&log),
        Err(ScenarioError::NoExpect { scenario }) if scenario == "no expect"
    ));
    // Printed with time 0, one event per line, seqs from 0.
    let printed = render_log(&log);
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), log.len());
    for (i, line) in lines.iter().enumerate() {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(v["seq"], json!(i));
        assert_eq!(v["time"], json!(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hang_times_out_naming_the_action_and_what_it_waited_for() {
    let s = Scenario::from_value(&json!({
        "name": "hangs",
        "model": [{"text": "Hello", "gate": "never", "gate_after_chunks": 2}],
        "actions": [
            {"followup": "hi"},
            {"wait_for": {"type": "assistant/chunk", "count": 3}}
        ],
        "action_timeout_ms": 300
    }))
    .expect("valid");
    match run_scenario(&s).await {
        Err(ScenarioError::Timeout {
            scenario,
            at,
            timeout_ms,
            waiting,
        }) => {
            assert_eq!(scenario, "hangs");
            assert_eq!(at, "actions[1] (wait_for 3 assistant/chunk)");
            assert_eq!(timeout_ms, 300);
            assert_eq!(waiting, "the log holds 2 of 3 assistant/chunk events");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_never_ends_times_out_at_the_final_wait_for_idle() {
    let s = Scenario::from_value(&json!({
        "name": "never idle",
        "model": [{"hang": "partial"}],
        "actions": [{"followup": "hi"}],
        "action_timeout_ms": 300
    }))
    .expect("valid");
    match run_scenario(&s).await {
        Err(ScenarioError::Timeout { at, .. }) => assert_eq!(at, "the final wait for idle"),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_the_runtime_refuses_fails_naming_it() {
    let s = Scenario::from_value(&json!({
        "name": "duplicate id",
        "actions": [
            {"inject": "a", "id": "same"},
            {"inject": "b", "id": "same"}
        ]
    }))
    .expect("valid: the id is pending only at run time");
    match run_scenario(&s).await {
        Err(ScenarioError::Action {
            scenario,
            action_idx,
            action,
            reason,
        }) => {
            assert_eq!(scenario, "duplicate id");
            assert_eq!(action_idx, 1);
            assert_eq!(action, "inject \"b\" as same");
            assert!(reason.contains("already pending"), "{reason}");
        }
        other => panic!("expected an action error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_fails_on_a_mismatch_and_on_an_invalid_file_and_passes_a_good_one() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let good = dir.path().join("good.json");
    let bad = dir.path().join("bad.json");
    let broken = dir.path().join("broken.json");
    let body = |reason: &str| {
        json!({
            "name": format!("reason {reason}"),
            "model": [{"text": "ok"}],
            "actions": [{"followup": "hi"}],
            "expect": [{"type": "turn/end", "data": {"reason": {"kind": reason}}}],
            "expect_mode": "subsequence"
        })
        .to_string()
    };
    std::fs::write(&good, body("completed")).expect("write");
    std::fs::write(&bad, body("blocked")).expect("write");
    std::fs::write(&broken, "{\"name\": \"x\", \"actions\": [], \"extra\": 1}").expect("write");
    assert!(run_files(true, std::slice::from_ref(&good)).await.is_ok());
    let err = run_files(true, &[good.clone(), bad.clone(), broken.clone()])
        .await
        .expect_err("two fail");
    let shown = err.to_string();
    assert!(
        shown.starts_with("2 of 3 scenarios failed; the first: "),
        "{shown}"
    );
    assert!(shown.contains("bad.json"), "{shown}");
    assert!(shown.contains("expect[0]"), "{shown}");
    // Without --check a mismatching scenario only runs.
    assert!(run_files(false, &[bad]).await.is_ok());
    let err = run_files(false, &[broken]).await.expect_err("invalid");
    assert!(err.to_string().contains("unknown field `extra`"), "{err}");
}

#[test]
fn the_spec_example_parses_as_written() {
    // SPEC 9's example, verbatim: the format is an interface, so its own example must stay valid.
    let example = r#"{
      "name": "steer during streaming joins the next step",
      "agent": {"max_parallel_tool_calls": 10, "max_tokens": null},
      "tools": [{"name": "read", "mode": "parallel"}, {"name": "write", "mode": "exclusive"}],
      "model": [
        {"text": "Hello", "gate": "g1", "gate_after_chunks": 2},
        {"tool_calls": [{"id": "c1", "name": "read", "arguments": "{\"path\":\"a\"}"}]},
        {"error": {"code": "RATE_LIMIT", "message": "slow down", "status": 429}},
        {"max_tokens": "trunc"},
        {"hang": "partial"}
      ],
      "tool_behaviour": {"c1": {"result": "file a", "delay_ms": 5, "gate": "g2", "error": null,
                                "panic": false, "additional_contexts": [], "concludes_turn": false}},
      "hooks": {"pre_step": [{"turn": 1, "step": 1, "decision": "reject"}],
                "turn_stopping": [{"turn": 1, "steer": "one more"}],
                "request_error": {"retries": 2}},
      "actions": [
        {"followup": "hi", "id": "m1"},
        {"wait_for": {"type": "assistant/chunk", "count": 2}},
        {"steer": "also this"},
        {"open": "g1"},
        {"cancel": {"cause": "user", "keep_inbox": false}},
        {"inject": "context"},
        {"remove": "m1"},
        {"wait_idle": true},
        {"restart": true}
      ],
      "expect": [{"type": "turn/start", "data": {"turn": 1}}, {"type": "agent/inbox/spliced"}]
    }"#;
    let s = Scenario::parse(example).expect("the SPEC example is valid");
    assert_eq!(s.model.len(), 5);
    assert_eq!(s.actions.len(), 9);
    assert_eq!(s.expect_mode, ExpectMode::Whole);
    assert_eq!(s.hooks.pre_step.len(), 1);
    assert!(s.hooks.request_error.is_some());
}
