//! Conformance tests of the actor runtime (`dsh-actors`) against the original's catalogue
//! (`reference/agent-loop.md` §11): real hosts, real actors, the scripted provider and the in-memory
//! store, asserting exact event sequences from the log. Gates make every interleaving deterministic;
//! nothing sleeps for timing.

mod runtime_support;

use std::sync::Arc;

use dsh::llm::script::ScriptEntry;
use dsh::session::event::{CancelCause, EventData, TurnEndReason};
use dsh_actors::Observed;
use runtime_support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_turn_logs_the_exact_sequence() {
    let w = World::new(vec![ScriptEntry::text("ok")]).await;
    w.agent.followup(user("hi")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    let mut want = vec![
        "agent/inbox/spliced",
        "turn/start",
        "agent/inbox/spliced",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
    ];
    want.extend(["assistant/chunk"; 6]);
    want.extend(["assistant/message", "step/end", "turn/end"]);
    assert_kinds(&log, &want);
    assert_eq!(reasons(&log), [TurnEndReason::Completed]);
    assert_valid(&log);
    // The store holds exactly the same log.
    assert_eq!(w.stored().await, log);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_round_trip_and_the_second_request_carries_the_result() {
    let w = World::with_tools(
        vec![
            ScriptEntry::tool_calls([("c1", "echo", r#"{"text":"ping"}"#)]),
            ScriptEntry::text("done"),
        ],
        vec![TestTool::parallel("echo")],
    )
    .await;
    w.agent.followup(user("go")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    assert_kinds(
        &skeleton(&log),
        &[
            "turn/start",
            "step/start",
            "user/message",
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end",
            "step/start",
            "assistant/message",
            "step/end",
            "turn/end",
        ],
    );
    let requests = w.script.requests();
    assert_eq!(requests.len(), 2);
    let last = requests[1].messages.last().unwrap();
    assert_eq!(tool_result_text(last), "echo: ping");
    assert_valid(&log);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_during_streaming_joins_the_next_step() {
    let w = World::new(vec![
        ScriptEntry::text("Hello").gate("g1", 2),
        ScriptEntry::text("ok"),
    ])
    .await;
    w.agent.followup(user("hi")).await.unwrap();
    w.wait_for("assistant/chunk", 2).await;
    w.agent.steer(user("also this")).await.unwrap();
    w.gates.open("g1");
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    let shape: Vec<&str> = log
        .iter()
        .map(|e| e.kind())
        .filter(|k| {
            k.starts_with("turn/")
                || k.starts_with("step/")
                || k.starts_with("agent/inbox/")
                || *k == "user/message"
                || *k == "assistant/message"
        })
        .collect();
    assert_eq!(
        shape,
        [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "agent/inbox/spliced", // the steer, mid-stream
            "assistant/message",
            "step/end",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    assert_eq!(user_texts(&log), ["hi", "also this"]);
    assert_valid(&log);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_stream_finalizes_the_prefix_and_the_next_turn_sees_it() {
    let w = World::new(vec![ScriptEntry::hang("partial"), ScriptEntry::text("ok")]).await;
    w.agent.followup(user("hi")).await.unwrap();
    w.wait_for("assistant/chunk", 2).await;
    w.agent.cancel(CancelCause::User, false).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    let n = log.len();
    assert_kinds(
        &log[n - 3..],
        &["assistant/message", "step/end", "turn/end"],
    );
    let EventData::AssistantMessage(a) = &log[n - 3].data else {
        panic!("not an assistant message")
    };
    assert_eq!(a.interrupted, Some(true));
    assert_eq!(a.message.text(), "partial");
    assert_eq!(
        reasons(&log),
        [TurnEndReason::Aborted {
            reason: CancelCause::User
        }]
    );
    w.agent.followup(user("again")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let texts: Vec<String> = w.script.requests()[1]
        .messages
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(texts, ["hi", "partial", "again"]);
    assert_valid(&w.log().await);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_see_durable_events_in_seq_order_and_live_status() {
    let w = World::new(vec![ScriptEntry::text("ok")]).await;
    let mut sub = w.agent.subscribe();
    w.agent.followup(user("hi")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    let mut seqs = Vec::new();
    let mut statuses = Vec::new();
    while let Some(obs) = sub.try_next() {
        match obs {
            dsh_actors::Observation::Item(Observed::Event { event, .. }) => seqs.push(event.seq),
            dsh_actors::Observation::Item(Observed::Live {
                event: dsh::turn::LiveEvent::Status(s),
                ..
            }) => statuses.push(s),
            _ => {}
        }
    }
    assert_eq!(seqs, (0..log.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        statuses,
        [dsh::turn::Status::Running, dsh::turn::Status::Idle]
    );
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_repairs_the_open_turn_and_keeps_pending_input() {
    let w = World::with_tools(
        vec![
            ScriptEntry::tool_calls([("c1", "slow", "{}")]),
            ScriptEntry::text("after restart"),
        ],
        vec![TestTool::gated("slow", "never")],
    )
    .await;
    w.agent.followup(user("go")).await.unwrap();
    w.wait_for("tool/call", 1).await;
    w.agent.inject(user("pending context")).await.unwrap();
    let agent = w.host.restart(w.agent.id()).await.unwrap();
    let log = agent.log().await.unwrap();
    let tail: Vec<&str> = log.iter().rev().take(4).map(|e| e.kind()).collect();
    assert_eq!(
        tail,
        ["session/end-seed", "turn/end", "step/end", "tool/result"]
    );
    let EventData::ToolResult(r) = &log[log.len() - 4].data else {
        panic!()
    };
    assert_eq!(r.error.as_ref().unwrap().code, "TOOL_OUTCOME_UNKNOWN");
    assert_eq!(reasons(&log).last(), Some(&TurnEndReason::Interrupted));
    assert_eq!(agent.status().await.unwrap().n_pending_step, 1);
    agent.followup(user("continue")).await.unwrap();
    agent.when_idle().await.unwrap();
    let log = agent.log().await.unwrap();
    assert_eq!(user_texts(&log), ["go", "pending context", "continue"]);
    assert_valid(&log);
    let _ = Arc::clone(&w.store);
    w.host.shutdown().await;
}
