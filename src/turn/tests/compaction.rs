//! Compaction in the turn machine: the exact events of each trigger (manual, pressure, overflow),
//! a failed summary, a cancel during compaction, and a crash between `compaction/start` and
//! `compaction/end`; the messages derived afterwards.

use serde_json::{Value, json};

use super::*;
use crate::llm::types::RequestPurpose;
use crate::session::compaction::{PREAMBLE, SUMMARISER_PLUGIN, SUMMARY_MAX_TOKENS};
use crate::session::repair::interrupted_turn_closers;

/// The harness with compaction settings changed by `settings`.
fn with_settings(
    script: Vec<Reply>,
    tools: &[(&str, crate::tools::ExecutionMode)],
    settings: impl FnOnce(&mut CompactionSettings),
) -> Harness {
    let mut h = Harness::with_tools(script, tools);
    let mut config = (*h.core.config).clone();
    settings(&mut config.compaction);
    h.core.config = Arc::new(config);
    h
}

fn data(e: &Event) -> Value {
    serde_json::from_str::<Value>(&e.to_json()).unwrap()["data"].clone()
}

/// The kinds from the first event of `kind` on.
fn kinds_from<'a>(h: &'a Harness, kind: &str) -> Vec<&'a str> {
    let kinds = h.kinds();
    let at = kinds.iter().position(|k| *k == kind).expect("kind present");
    kinds[at..].to_vec()
}

fn derived_texts(h: &Harness) -> Vec<String> {
    h.core
        .session()
        .unwrap()
        .messages()
        .iter()
        .map(|m| m.text())
        .collect()
}

fn checkpoint_text(summary: &str) -> String {
    format!("{PREAMBLE}\n\n<compacted-summary>{summary}</compacted-summary>")
}

fn compact(h: &mut Harness) {
    h.core.compact_now(0).unwrap();
    h.pump();
}

#[test]
fn manual_compaction_writes_the_bracket_and_replaces_the_head() {
    let mut h = Harness::new(vec![text("one"), text("two"), text("the summary")]);
    h.followup("first");
    h.followup("second");
    let before = h.events().len();
    compact(&mut h);
    let seq = before as u64;
    assert_eq!(
        h.kinds()[before..],
        [
            "compaction/start",
            "compaction/summary",
            "user/message",
            "compaction/end"
        ]
    );
    let id = match &h.compactions[..] {
        [Ok(started)] => {
            assert_eq!(started.seq, seq);
            started.compaction_id.clone()
        }
        other => panic!("{other:?}"),
    };
    let e = &h.events()[before..];
    assert_eq!(data(&e[0]), json!({"compactionId": id, "turn": null}));
    // The surface was [first, one, second, two]: every unit but the newest is shadowed.
    let shadowed: Vec<u64> = h.core.session().unwrap().events()[..before]
        .iter()
        .filter(|e| e.surface_op.is_some())
        .map(|e| e.seq)
        .take(3)
        .collect();
    let d = data(&e[1]);
    assert_eq!(d["compactionId"], json!(id));
    assert_eq!(
        d["summary"],
        json!([{"type": "text", "text": "the summary"}])
    );
    assert_eq!(d["llmStreamCall"], json!(true));
    assert_eq!(d["shadowedSeqs"], json!(shadowed));
    assert_eq!(
        d["shadowedRange"],
        json!({"start": shadowed[0], "end": shadowed[2]})
    );
    assert_eq!(d["provider"], json!("p"));
    assert_eq!(d["maxTokens"], json!(SUMMARY_MAX_TOKENS));
    let keys: Vec<&str> = d.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "compactionId",
            "summary",
            "rawOutput",
            "llmStreamCall",
            "shadowedRange",
            "shadowedSeqs",
            "shadowedTokenCount",
            "provider",
            "model",
            "maxTokens",
            "usage"
        ]
    );
    // The checkpoint: the original's content, source, provenance and surface op.
    let mut sources = vec![seq, seq + 1];
    sources.extend(&shadowed);
    assert_eq!(e[2].source_event_seqs, Some(sources));
    assert_eq!(
        e[2].surface_op,
        Some(crate::session::event::SurfaceOp::Replace {
            start: shadowed[0],
            end: shadowed[2]
        })
    );
    let m = data(&e[2]);
    assert_eq!(
        m["content"],
        json!([
            {"type": "text", "text": format!("{PREAMBLE}\n\n<compacted-summary>")},
            {"type": "text", "text": "the summary"},
            {"type": "text", "text": "</compacted-summary>"}
        ])
    );
    assert_eq!(
        m["source"],
        json!({"kind": "plugin", "plugin": "compact", "compactionId": id})
    );
    assert_eq!(data(&e[3]), json!({"compactionId": id, "turn": null}));
    assert_eq!(
        derived_texts(&h),
        [checkpoint_text("the summary"), "two".to_string()]
    );
    // The summariser request (§8.4).
    let r = h.requests.last().unwrap();
    assert_eq!(r.purpose, Some(RequestPurpose::Compaction));
    assert_eq!(r.config.max_tokens, Some(SUMMARY_MAX_TOKENS));
    let texts: Vec<String> = r.messages.iter().map(|m| m.text()).collect();
    assert_eq!(texts[..3], ["first", "one", "second"]);
    let last = r.messages.last().unwrap();
    assert_eq!(last.source.str_field("plugin"), Some(SUMMARISER_PLUGIN));
    assert!(h.core.is_idle());
    h.check();
}

#[test]
fn manual_compaction_refuses_a_single_unit_and_a_busy_agent() {
    let mut h = Harness::new(vec![Reply::Hang(vec![])]);
    compact(&mut h);
    assert_eq!(h.compactions, [Err(CompactRefusal::NothingToCompact)]);
    assert!(h.events().is_empty(), "a refused compaction writes nothing");
    assert!(h.core.is_idle());
    h.followup("first");
    assert!(h.hanging.is_some());
    assert!(h.core.compact_now(0).is_err(), "busy while a turn runs");
}

#[test]
fn a_failed_summary_is_logged_and_changes_nothing() {
    let mut h = Harness::new(vec![text("one"), text("two"), error("RATE_LIMIT")]);
    h.followup("first");
    h.followup("second");
    let messages = derived_texts(&h);
    let before = h.events().len();
    compact(&mut h);
    assert_eq!(h.kinds()[before..], ["compaction/start", "compaction/end"]);
    let end = data(&h.events()[before + 1]);
    assert_eq!(end["turn"], Value::Null);
    assert_eq!(
        end["error"],
        json!("CompactionError: summary: RATE_LIMIT: boom")
    );
    assert_eq!(derived_texts(&h), messages);
    assert_eq!(h.core.session().unwrap().surface().replace_generation, 0);
    assert!(h.core.is_idle());
    h.check();
}

#[test]
fn a_cancel_during_a_manual_compaction_ends_it_with_an_error() {
    let mut h = Harness::new(vec![text("one"), text("two"), Reply::Hang(vec![])]);
    h.followup("first");
    h.followup("second");
    let before = h.events().len();
    compact(&mut h);
    assert!(h.hanging.is_some());
    assert!(!h.core.is_idle(), "maintenance while the summary streams");
    h.cancel(true);
    assert_eq!(h.hanging, None, "the summariser stream was closed");
    assert_eq!(h.kinds()[before..], ["compaction/start", "compaction/end"]);
    assert_eq!(
        data(&h.events()[before + 1])["error"],
        json!("CompactionError: cancelled: ABORTED: the compaction was cancelled")
    );
    assert!(h.core.is_idle());
    h.check();
}

/// A long first prompt (158 estimated tokens) with a 200-token window (threshold 160).
fn long_prompt() -> String {
    "x".repeat(600)
}

#[test]
fn pressure_compacts_before_the_step_and_enters_it_afterwards() {
    let mut h = with_settings(vec![text("one"), text("S"), text("two")], &[], |s| {
        s.context_window = Some(200)
    });
    h.followup(&long_prompt());
    h.followup("second");
    let skeleton = h.skeleton();
    let turn2 = skeleton.iter().rposition(|k| *k == "turn/start").unwrap();
    assert_eq!(
        skeleton[turn2..],
        [
            "turn/start",
            "compaction/start",
            "compaction/summary",
            "user/message",
            "compaction/end",
            "step/start",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    let start = h
        .events()
        .iter()
        .find(|e| e.kind() == "compaction/start")
        .unwrap();
    assert_eq!(data(start)["turn"], json!(2));
    let summary = h
        .events()
        .iter()
        .find(|e| e.kind() == "compaction/summary")
        .unwrap();
    // Only the long prompt is shadowed: the retained tail (32 tokens) holds "one".
    assert_eq!(data(summary)["shadowedSeqs"], json!([4]));
    assert_eq!(data(summary)["shadowedTokenCount"], json!(158));
    let req = h.requests.last().unwrap();
    let texts: Vec<String> = req.messages.iter().map(|m| m.text()).collect();
    assert_eq!(texts, [checkpoint_text("S"), "one".into(), "second".into()]);
    h.check();
}

#[test]
fn pressure_prunes_large_tool_results_first() {
    let big = "y".repeat(10_000);
    let mut h = with_settings(
        vec![calls(&[("c1", "echo")]), text("done"), text("after")],
        &[("echo", crate::tools::ExecutionMode::Parallel)],
        |s| s.context_window = Some(3_000),
    );
    // The tool answers with a 10,000-character text (2,508 tokens > 2,400 before step 2).
    h.auto_tools = false;
    h.followup("go");
    let (ticket, idx, _) = h.running.remove(0);
    h.core
        .on_tool_finished(ticket, idx, ToolOutput::text(big.clone()), 0);
    h.pump();
    h.followup("more");
    let kinds = kinds_from(&h, "compaction/prune");
    assert_eq!(
        kinds[..3],
        ["compaction/prune", "tool/result", "step/start"]
    );
    let prune = h
        .events()
        .iter()
        .find(|e| e.kind() == "compaction/prune")
        .unwrap();
    let result_seq = h
        .events()
        .iter()
        .find(|e| e.kind() == "tool/result")
        .unwrap()
        .seq;
    assert_eq!(
        data(prune)["shadowedSeqs"],
        json!([result_seq]),
        "the prune prices the original result"
    );
    let rewrite = &h.events()[prune.seq as usize + 1];
    assert_eq!(rewrite.source_event_seqs, Some(vec![result_seq]));
    let EventData::ToolResult(r) = &rewrite.data else {
        panic!()
    };
    let ContentBlock::ToolResult { content, .. } = &r.message.content[0] else {
        panic!()
    };
    let ContentBlock::Text { text } = &content[0] else {
        panic!()
    };
    assert_eq!(
        *text,
        format!(
            "{}\n\n[... tool result middle pruned ...]\n\n{}",
            "y".repeat(4096),
            "y".repeat(1024)
        )
    );
    assert!(
        !h.kinds().contains(&"compaction/start"),
        "pruning was enough"
    );
    h.check();
}

#[test]
fn overflow_compacts_inside_the_step_and_retries_once() {
    let mut h = Harness::with_tools(
        vec![
            calls(&[("c1", "echo")]),
            text("done"),
            error(codes::CONTEXT_WINDOW_EXCEEDED),
            text("S"),
            text("ok"),
        ],
        &[("echo", crate::tools::ExecutionMode::Parallel)],
    );
    h.followup(&long_prompt());
    h.followup("more");
    let kinds = kinds_from(&h, "compaction/start");
    let mut want = vec![
        "compaction/start",
        "compaction/summary",
        "user/message",
        "compaction/end",
    ];
    want.extend(["assistant/chunk"; 6]);
    want.extend(["assistant/message", "step/end", "turn/end"]);
    assert_eq!(kinds, want);
    let at = h
        .kinds()
        .iter()
        .position(|k| *k == "compaction/start")
        .unwrap();
    assert_eq!(
        h.kinds()[at - 1],
        "assistant/chunk",
        "after the failed attempt"
    );
    assert_eq!(data(&h.events()[at])["turn"], json!(2));
    // Everything but the newest unit (the prompt "more") is shadowed.
    assert_eq!(
        derived_texts(&h),
        [checkpoint_text("S"), "more".into(), "ok".into()]
    );
    assert_eq!(h.turn_end_reasons()[1], TurnEndReason::Completed);
    assert!(h.hook_runs.iter().all(|r| r != "RequestError"));
    h.check();
}

#[test]
fn overflow_without_a_head_to_compact_fails_as_before() {
    let mut h = Harness::new(vec![error(codes::CONTEXT_WINDOW_EXCEEDED)]);
    h.followup("only");
    assert!(!h.kinds().contains(&"compaction/start"));
    assert!(matches!(
        &h.turn_end_reasons()[0],
        TurnEndReason::Error { error } if error.code == codes::CONTEXT_WINDOW_EXCEEDED
    ));
    h.check();
}

#[test]
fn a_cancel_during_a_pressure_compaction_ends_it_and_the_turn() {
    let mut h = with_settings(vec![text("one"), Reply::Hang(vec![])], &[], |s| {
        s.context_window = Some(200)
    });
    h.followup(&long_prompt());
    h.followup("second");
    assert!(h.hanging.is_some());
    h.cancel(false);
    assert_eq!(
        kinds_from(&h, "compaction/start"),
        ["compaction/start", "compaction/end", "turn/end"]
    );
    assert_eq!(h.turn_end_reasons()[1], ABORTED_USER);
    h.check();
}

#[test]
fn a_crash_between_start_and_end_leaves_a_stale_lock_after_the_end_seed() {
    let mut h = with_settings(vec![text("one"), Reply::Hang(vec![])], &[], |s| {
        s.context_window = Some(200)
    });
    h.followup(&long_prompt());
    h.followup("second");
    // The crash: the log as stored ends with the unmatched compaction/start of turn 2.
    let mut stored = h.events().to_vec();
    assert_eq!(stored.last().unwrap().kind(), "compaction/start");
    let closers = interrupted_turn_closers(&stored);
    stored.extend(closers);
    let kinds: Vec<&str> = stored.iter().map(Event::kind).collect();
    assert_eq!(kinds[kinds.len() - 2..], ["compaction/start", "turn/end"]);
    let config = (*h.core.config).clone();
    let mut core = AgentCore::resume(
        SessionId::new("a1").unwrap(),
        config,
        ToolRegistry::new(),
        stored,
        0,
    )
    .unwrap();
    core.wire(wiring(crate::hooks::HookPoints::ALL));
    let mut h2 = Harness::new(vec![text("S")]);
    h2.core = core;
    h2.pump();
    assert_eq!(h2.kinds().last(), Some(&"session/end-seed"));
    invariant::check(h2.events()).expect("the lock before the end-seed is stale");
    // A new compaction may start.
    compact(&mut h2);
    assert!(matches!(h2.compactions[..], [Ok(_)]));
    assert_eq!(kinds_from(&h2, "session/end-seed").len(), 5);
    h2.check();
}
