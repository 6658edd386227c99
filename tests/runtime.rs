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

/// The exact kinds of a text turn of `n_chunks` chunks woken by one followup.
fn text_turn_kinds(n_chunks: usize) -> Vec<&'static str> {
    let mut want = vec![
        "agent/inbox/spliced",
        "turn/start",
        "agent/inbox/spliced",
        "step/start",
        "user/message",
        "request/header",
        "request/context",
    ];
    want.extend(std::iter::repeat_n("assistant/chunk", n_chunks));
    want.extend(["assistant/message", "step/end", "turn/end"]);
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simple_turn_logs_the_exact_sequence() {
    let w = World::new(vec![ScriptEntry::text("ok")]).await;
    w.agent.followup(user("hi")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    let want = text_turn_kinds(6);
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
    assert_kinds(&skeleton(&log), &TOOL_TURN);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_defers_a_wake_and_replays_it_when_it_ends() {
    let w = World::new(vec![ScriptEntry::text("ok")]).await;
    let agent = w.agent.clone();
    let done = w
        .agent
        .run_maintenance(|_token| async move {
            agent.followup(user("during maintenance")).await.unwrap();
            // The wake is deferred: no turn while the task runs.
            let status = agent.status().await.unwrap();
            assert_eq!(status.status, dsh::turn::Status::Idle);
            assert_eq!(status.n_pending_turn, 1);
            "task result"
        })
        .await
        .unwrap();
    assert_eq!(done, "task result");
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    assert_eq!(user_texts(&log), ["during maintenance"]);
    assert_eq!(reasons(&log), [TurnEndReason::Completed]);
    // Maintenance is refused while a turn runs.
    let w2 = World::new(vec![ScriptEntry::hang("")]).await;
    w2.agent.followup(user("busy")).await.unwrap();
    let err = w2.agent.run_maintenance(|_| async {}).await.unwrap_err();
    assert!(matches!(err, dsh_actors::InputError::Busy { .. }), "{err}");
    w.host.shutdown().await;
    w2.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_agent_wakes_with_its_whole_history() {
    let config = dsh_actors::HostConfig {
        hibernate_after: Some(std::time::Duration::from_millis(5)),
        ..dsh_actors::HostConfig::default()
    };
    let w = World::build(
        vec![ScriptEntry::text("one"), ScriptEntry::text("two")],
        Vec::new(),
        dsh::hooks::Hooks::new(),
        config,
    )
    .await;
    w.agent.followup(user("first")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    until_hibernated(&w.agent).await;
    // Input is accepted while hibernated, without reading the log back.
    w.agent.inject(user("context")).await.unwrap();
    assert!(w.agent.status().await.unwrap().hibernated);
    w.agent.followup(user("second")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let texts: Vec<String> = w.script.requests()[1]
        .messages
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(texts, ["first", "one", "context", "second"]);
    assert_valid(&w.stored().await);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hibernated_count_follows_passivation_wakes_and_evictions() {
    let config = dsh_actors::HostConfig {
        hibernate_after: Some(std::time::Duration::from_millis(5)),
        ..dsh_actors::HostConfig::default()
    };
    let w = World::build(
        vec![ScriptEntry::text("one"), ScriptEntry::hang("")],
        Vec::new(),
        dsh::hooks::Hooks::new(),
        config,
    )
    .await;
    let counts = || (w.host.n_agents(), w.host.metrics().agents_hibernated());
    until_hibernated(&w.agent).await;
    assert_eq!(counts(), (1, 1), "a fresh idle agent hibernates");
    w.agent.followup(user("first")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    until_hibernated(&w.agent).await;
    assert_eq!(counts(), (1, 1), "hibernated again after its turn");
    // The woken agent's read-back of its log lands late, so the cancel (which discards the
    // followup) comes before the second turn starts: its core stays without a log (`hibernated`
    // in its status) while its actor is live, and it must passivate again all the same (it stayed
    // awake for good before).
    w.store.set_read_delay_ms(50);
    w.agent.followup(user("second")).await.unwrap();
    assert_eq!(counts(), (1, 0), "woken by the followup");
    assert_eq!(
        w.host.n_actors(),
        1,
        "the woken agent's actor is supervised"
    );
    w.agent.cancel(CancelCause::User, false).await.unwrap();
    w.agent.when_idle().await.unwrap();
    assert_eq!(
        w.script.requests().len(),
        1,
        "the second turn never started"
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while counts() != (1, 1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never passivated again after the cancel: {:?}",
            w.agent.status().await
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert!(w.agent.status().await.unwrap().hibernated);
    // The passivated actor's end reaches the host's own actor a moment later.
    while w.host.n_actors() != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the passivated actor was never reaped"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    assert!(w.host.evict(w.agent.id()));
    assert_eq!(counts(), (0, 0), "an evicted agent is forgotten");
    w.host.shutdown().await;
}

/// A world on `config` whose model answers each prompt with a call of the `where` tool (which
/// answers with the name of the thread it ran on) and then the next of `replies`.
async fn where_world(config: dsh_actors::HostConfig, replies: &[&str]) -> World {
    let script = replies
        .iter()
        .flat_map(|reply| {
            [
                ScriptEntry::tool_calls([("c1", "where", "{}")]),
                ScriptEntry::text(*reply),
            ]
        })
        .collect();
    World::build(
        script,
        vec![TestTool::thread_naming("where")],
        dsh::hooks::Hooks::new(),
        config,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_spawned_beside_a_pinned_agent_runs_on_its_thread() {
    // `AgentHandle::spawn_beside`: on the host thread the agent's actor runs on (where its tool
    // runs), to which a restarted actor returns; unpinned, on the caller's runtime.
    let config = dsh_actors::HostConfig {
        agent_threads: 2,
        ..dsh_actors::HostConfig::default()
    };
    let w = where_world(config, &["done", "restarted"]).await;
    let thread_name = || {
        std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string()
    };
    let mut beside = Vec::new();
    for prompt in ["first", "second"] {
        // The driver itself runs beside the agent: the turn is driven from the agent's thread.
        let agent = w.agent.clone();
        let driver = w.agent.spawn_beside(async move {
            agent.followup(user(prompt)).await.unwrap();
            agent.when_idle().await.unwrap();
            thread_name()
        });
        beside.push(driver.await.unwrap());
        if prompt == "first" {
            w.host.restart(w.agent.id()).await.unwrap();
        }
    }
    let requests = w.script.requests();
    assert_eq!(requests.len(), 4);
    let tools = [1, 3].map(|i| tool_result_text(requests[i].messages.last().unwrap()));
    assert_eq!(beside, tools, "the driver ran where the agent's tool ran");
    assert!(tools[0].starts_with("dsh-agents-"), "{tools:?}");
    assert_eq!(
        tools[0], tools[1],
        "the restarted actor returns to its thread, beside what was spawned there"
    );
    assert_eq!(
        w.agent
            .spawn_beside(async move { thread_name() })
            .await
            .unwrap(),
        tools[1]
    );
    w.host.shutdown().await;

    // Unpinned, beside is the caller's runtime: one of this test's workers.
    let w = World::build(
        vec![ScriptEntry::text("ok")],
        vec![],
        dsh::hooks::Hooks::new(),
        dsh_actors::HostConfig::default(),
    )
    .await;
    let name = w
        .agent
        .spawn_beside(async move { thread_name() })
        .await
        .unwrap();
    assert!(!name.starts_with("dsh-agents-"), "{name}");
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_pinned_agents_alternate_threads_and_a_woken_one_returns_to_its_own() {
    // Creation spreads agents round-robin; waking from hibernation puts the new actor on the thread
    // the last one ran on, so a task spawned beside the agent before it slept is still beside it.
    let config = dsh_actors::HostConfig {
        agent_threads: 2,
        hibernate_after: Some(std::time::Duration::from_millis(5)),
        ..dsh_actors::HostConfig::default()
    };
    let w = World::build(
        vec![ScriptEntry::text("a"), ScriptEntry::text("b")],
        Vec::new(),
        dsh::hooks::Hooks::new(),
        config,
    )
    .await;
    let thread_of = |agent: &dsh_actors::AgentHandle| {
        agent.spawn_beside(async move {
            std::thread::current()
                .name()
                .unwrap_or_default()
                .to_string()
        })
    };
    let mut agents = vec![w.agent.clone()];
    for _ in 0..3 {
        let spec = dsh_actors::AgentSpec::new(dsh::turn::AgentConfig::new("script", "m"));
        agents.push(w.host.create(spec).await.unwrap());
    }
    let mut homes = Vec::new();
    for agent in &agents {
        homes.push(thread_of(agent).await.unwrap());
    }
    assert!(homes[0].starts_with("dsh-agents-"), "{homes:?}");
    assert_ne!(homes[0], homes[1], "{homes:?}");
    assert_eq!((&homes[0], &homes[1]), (&homes[2], &homes[3]), "{homes:?}");
    // Woken twice (round-robin would put the second wake on the other thread).
    let agent = &agents[0];
    for reply in ["a", "b"] {
        until_hibernated(agent).await;
        agent.followup(user(reply)).await.unwrap();
        agent.when_idle().await.unwrap();
        assert_eq!(
            thread_of(agent).await.unwrap(),
            homes[0],
            "woken by {reply:?}"
        );
    }
    for (agent, home) in agents.iter().zip(&homes) {
        assert_eq!(&thread_of(agent).await.unwrap(), home);
    }
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_agents_run_on_the_hosts_threads_across_wakes_and_restarts() {
    // `HostConfig::agent_threads`: the agent's actor and its children (here a tool's body) run on
    // one of the host's own threads, and the turn logs exactly what it logs unpinned.
    let config = dsh_actors::HostConfig {
        agent_threads: 2,
        hibernate_after: Some(std::time::Duration::from_millis(5)),
        ..dsh_actors::HostConfig::default()
    };
    let w = where_world(config, &["done", "woken", "restarted"]).await;
    w.agent.followup(user("first")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    until_hibernated(&w.agent).await;
    // Woken from hibernation: a new actor, again on a host thread.
    w.agent.followup(user("second")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    // Restarted from its log: a new actor, again on a host thread.
    w.host.restart(w.agent.id()).await.unwrap();
    w.agent.followup(user("third")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    let requests = w.script.requests();
    assert_eq!(requests.len(), 6);
    let threads = [1, 3, 5].map(|i| tool_result_text(requests[i].messages.last().unwrap()));
    assert!(threads[0].starts_with("dsh-agents-"), "{threads:?}");
    assert_eq!(
        threads,
        [0; 3].map(|_| threads[0].clone()),
        "woken and restarted, the agent returns to its thread"
    );
    let log = w.stored().await;
    // Each turn from its start (the restart's `session/end-seed` comes before the third).
    let turns: Vec<&[dsh::session::Event]> = log
        .split_inclusive(|e| e.kind() == "turn/end")
        .filter_map(|t| {
            t.iter()
                .position(|e| e.kind() == "turn/start")
                .map(|i| &t[i..])
        })
        .collect();
    assert_eq!(turns.len(), 3);
    assert_eq!(
        log.iter()
            .filter(|e| e.kind() == "session/end-seed")
            .count(),
        1,
        "one restart"
    );
    for turn in turns {
        assert_kinds(&skeleton(turn), &TOOL_TURN);
    }
    assert_eq!(reasons(&log), vec![TurnEndReason::Completed; 3]);
    assert_valid(&log);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_may_send_input_from_the_event_stream_and_nothing_is_lost() {
    // SPEC §3 difference 3: observers receive events after the write and may call any handle method.
    let w = World::new(vec![ScriptEntry::text("one"), ScriptEntry::text("two")]).await;
    let mut sub = w.agent.subscribe();
    let agent = w.agent.clone();
    let observer = tokio::spawn(async move {
        while let Some(obs) = sub.next().await {
            if let dsh_actors::Observation::Item(Observed::Event { event, .. }) = obs
                && event.kind() == "turn/end"
            {
                agent.followup(user("sent by an observer")).await.unwrap();
                return;
            }
        }
    });
    w.agent.followup(user("first")).await.unwrap();
    observer.await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    assert_eq!(user_texts(&log), ["first", "sent by an observer"]);
    assert_eq!(
        reasons(&log),
        [TurnEndReason::Completed, TurnEndReason::Completed]
    );
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_subscriber_is_told_and_never_slows_the_agent() {
    let config = dsh_actors::HostConfig {
        limits: dsh::Limits {
            subscriber_buffer_max: 4,
            ..dsh::Limits::DEFAULT
        },
        ..dsh_actors::HostConfig::default()
    };
    let w = World::build(
        vec![ScriptEntry::text("a long enough answer")],
        Vec::new(),
        dsh::hooks::Hooks::new(),
        config,
    )
    .await;
    let mut sub = w.agent.subscribe();
    w.agent.followup(user("hi")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    match sub.next().await {
        Some(dsh_actors::Observation::Lagged(n)) => assert!(n > 0),
        other => panic!("expected a lag notice, got {other:?}"),
    }
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispose_ends_the_turn_disposed_discards_pending_input_and_keeps_the_log() {
    let w = World::new(vec![ScriptEntry::hang("thinking")]).await;
    w.agent.followup(user("work")).await.unwrap();
    w.wait_for("assistant/chunk", 2).await;
    w.agent.followup(user("queued")).await.unwrap();
    w.host.dispose(w.agent.id()).await.unwrap();
    let log = w.stored().await;
    assert_eq!(
        reasons(&log),
        [TurnEndReason::Aborted {
            reason: CancelCause::Disposed
        }]
    );
    assert!(
        log.iter()
            .any(|e| matches!(&e.data, EventData::InboxSpliced(s) if s.outcome.is_some())),
        "the queued input was discarded durably"
    );
    assert_valid(&log);
    let err = w.agent.followup(user("late")).await.unwrap_err();
    assert!(
        matches!(err, dsh_actors::InputError::Disposed { .. }),
        "{err}"
    );
    assert!(w.host.get(w.agent.id()).is_none());
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_ignores_cancellation_is_killed_after_the_grace_period() {
    let config = dsh_actors::HostConfig {
        limits: dsh::Limits {
            tool_grace_ms: 20,
            ..dsh::Limits::DEFAULT
        },
        ..dsh_actors::HostConfig::default()
    };
    let w = World::build(
        vec![ScriptEntry::tool_calls([
            ("c1", "stubborn", "{}"),
            ("c2", "stubborn", "{}"),
        ])],
        vec![TestTool::stubborn("stubborn", 60_000)],
        dsh::hooks::Hooks::new(),
        config,
    )
    .await;
    w.agent.followup(user("go")).await.unwrap();
    w.wait_for("tool/call", 2).await;
    w.agent.cancel(CancelCause::User, false).await.unwrap();
    assert!(
        w.agent
            .when_idle_for(std::time::Duration::from_secs(10))
            .await
            .unwrap(),
        "the grace period bounds cancellation"
    );
    let log = w.log().await;
    let codes: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) => r.error.as_ref().map(|e| e.code.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(codes, ["ABORTED", "ABORTED"]);
    assert_eq!(
        reasons(&log),
        [TurnEndReason::Aborted {
            reason: CancelCause::User
        }]
    );
    assert_valid(&log);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_pool_failure_answers_every_call_and_ends_the_turn_with_an_error() {
    // SPEC §3 difference 2.
    let w = World::with_tools(
        vec![
            ScriptEntry::tool_calls([("c1", "slow", "{}"), ("c2", "ex", "{}")]),
            ScriptEntry::text("next turn works"),
        ],
        vec![TestTool::gated("slow", "never"), TestTool::exclusive("ex")],
    )
    .await;
    w.agent.followup(user("go")).await.unwrap();
    w.wait_for("tool/call", 1).await;
    w.agent.inject_tool_pool_panic().await.unwrap();
    w.agent.when_idle().await.unwrap();
    let log = w.log().await;
    let results: Vec<(String, String)> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) => Some((
                r.message
                    .source
                    .str_field("callId")
                    .unwrap_or("")
                    .to_string(),
                r.error.as_ref().map(|e| e.code.clone()).unwrap_or_default(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        [
            ("c1".to_string(), "TOOL_OUTCOME_UNKNOWN".to_string()),
            ("c2".to_string(), "ABORTED_BEFORE_DISPATCH".to_string())
        ]
    );
    match &reasons(&log)[..] {
        [TurnEndReason::Error { error }] => assert!(error.message.contains("tool pool failed")),
        other => panic!("{other:?}"),
    }
    assert_valid(&log);
    // The history stays provider-valid: the next turn runs.
    w.agent.followup(user("again")).await.unwrap();
    w.agent.when_idle().await.unwrap();
    assert_eq!(reasons(&w.log().await).len(), 2);
    w.host.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_typed_error_and_changes_nothing() {
    let w = World::new(vec![]).await;
    w.agent.inject(user_id("m1", "first")).await.unwrap();
    let before = w.log().await;
    let err = w.agent.inject(user_id("m1", "again")).await.unwrap_err();
    assert!(matches!(err, dsh_actors::InputError::Refused(_)), "{err}");
    let huge = "x".repeat(dsh::Limits::DEFAULT.message_bytes_max + 1);
    let err = w.agent.followup(user(&huge)).await.unwrap_err();
    assert!(err.to_string().contains("limit"), "{err}");
    let mut assistant = user("not a user message");
    assistant.role = dsh::llm::types::Role::Assistant;
    assert!(w.agent.steer(assistant).await.is_err());
    assert_eq!(w.log().await, before, "refused input wrote nothing");
    assert_eq!(
        w.agent.status().await.unwrap().status,
        dsh::turn::Status::Idle
    );
    w.host.shutdown().await;
}

/// A memory store whose first `n_slow` reads (`load` or `inspect`) take 150 ms, and which counts
/// its reads and the repair closers any `load` wrote.
#[derive(Default)]
struct SlowFirstReads {
    inner: dsh::session::store::memory::MemoryStore,
    n_slow: std::sync::atomic::AtomicUsize,
    n_repaired: std::sync::atomic::AtomicUsize,
    n_reads: std::sync::atomic::AtomicUsize,
}

impl SlowFirstReads {
    async fn maybe_slow(&self) {
        use std::sync::atomic::Ordering;
        self.n_reads.fetch_add(1, Ordering::SeqCst);
        let slow = self
            .n_slow
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if slow {
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        }
    }
}

#[async_trait::async_trait]
impl dsh::session::store::SessionStore for SlowFirstReads {
    fn name(&self) -> &'static str {
        "slow-first-reads"
    }
    async fn create(
        &self,
        header: &dsh::session::event::SessionHeader,
    ) -> Result<(), dsh::session::store::StoreError> {
        self.inner.create(header).await
    }
    async fn append(
        &self,
        id: &dsh::SessionId,
        events: Vec<dsh::session::store::EncodedEvent>,
    ) -> Result<(), dsh::session::store::StoreError> {
        self.inner.append(id, events).await
    }
    async fn load(
        &self,
        id: &dsh::SessionId,
    ) -> Result<dsh::session::store::LoadedSession, dsh::session::store::StoreError> {
        self.maybe_slow().await;
        let loaded = self.inner.load(id).await?;
        self.n_repaired
            .fetch_add(loaded.n_repaired, std::sync::atomic::Ordering::SeqCst);
        Ok(loaded)
    }
    async fn inspect(
        &self,
        id: &dsh::SessionId,
    ) -> Result<dsh::session::store::Inspection, dsh::session::store::StoreError> {
        self.maybe_slow().await;
        self.inner.inspect(id).await
    }
    async fn list(
        &self,
    ) -> Result<Vec<dsh::session::store::SessionSummary>, dsh::session::store::StoreError> {
        self.inner.list().await
    }
    async fn delete(&self, id: &dsh::SessionId) -> Result<bool, dsh::session::store::StoreError> {
        self.inner.delete(id).await
    }
    async fn header(
        &self,
        id: &dsh::SessionId,
    ) -> Result<Option<dsh::session::event::SessionHeader>, dsh::session::store::StoreError> {
        self.inner.header(id).await
    }
}

impl SlowFirstReads {
    /// The log as stored, read past the counters.
    async fn stored(&self, id: &dsh::SessionId) -> Vec<dsh::session::Event> {
        dsh::session::store::SessionStore::load(&self.inner, id)
            .await
            .expect("stored")
            .events
    }
}

/// A host over `store` and `script` whose agents hibernate after 5 ms idle, and one agent.
async fn slow_reads_host(
    store: &Arc<SlowFirstReads>,
    script: &dsh::llm::script::ScriptProvider,
) -> (dsh_actors::Host, dsh_actors::AgentHandle) {
    let mut providers = dsh::llm::provider::ProviderRegistry::new();
    providers.register(Arc::new(script.clone()));
    let host =
        dsh_actors::Host::builder(Arc::clone(store) as Arc<dyn dsh::session::store::SessionStore>)
            .providers(providers)
            .config(dsh_actors::HostConfig {
                hibernate_after: Some(std::time::Duration::from_millis(5)),
                ..dsh_actors::HostConfig::default()
            })
            .start()
            .await
            .expect("host starts");
    let agent = host
        .create(dsh_actors::AgentSpec::new(dsh::turn::AgentConfig::new(
            "script", "m",
        )))
        .await
        .expect("agent created");
    (host, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_read_back_never_writes_into_the_turn_that_followed() {
    // A hibernated agent reads its log back when input wakes it. If that turn is cancelled while
    // the read is slow, the next turn reads again and runs; the first read then lands while the
    // second turn is open in the store. It must not "repair" (close) that live turn: the agent's
    // next append would then collide with the closers and the agent would fail.
    let store = Arc::new(SlowFirstReads::default());
    let gates = dsh::llm::script::Gates::new();
    let script = dsh::llm::script::ScriptProvider::new(
        vec![
            ScriptEntry::text("zero"),
            ScriptEntry::text("held open").gate("g", 1),
        ],
        gates.clone(),
    );
    let (host, agent) = slow_reads_host(&store, &script).await;
    // A first turn, so that the woken agent has a stored log to read back (an agent that
    // hibernated before its first event wakes without a read).
    agent.followup(user("zero")).await.expect("acked");
    agent.when_idle().await.expect("idle");
    until_hibernated(&agent).await;
    store.n_slow.store(1, std::sync::atomic::Ordering::SeqCst);
    agent.followup(user("first")).await.expect("acked");
    agent
        .cancel(CancelCause::User, false)
        .await
        .expect("cancel acked");
    agent.when_idle().await.expect("idle");
    agent.followup(user("second")).await.expect("acked");
    // The second turn streams and holds; the slow first read lands meanwhile.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while script.requests().len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "no request");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    gates.open("g");
    agent.when_idle().await.expect("idle");
    let status = agent.status().await.expect("status");
    assert_eq!(status.failed, None, "the agent failed");
    assert_eq!(
        store.n_repaired.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a read-back repaired a live log"
    );
    let log = store.stored(agent.id()).await;
    assert_valid(&log);
    let ends: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::TurnEnd(t) => Some(format!("{:?}", t.reason)),
            _ => None,
        })
        .collect();
    // The cancel came before the woken turn opened (its log was still being read): it discarded
    // the first prompt with a logged splice, and only the turns before and after it ran.
    assert_eq!(ends, ["Completed", "Completed"], "{:?}", kinds(&log));
    host.shutdown().await;
}

/// An agent that hibernated before its first event wakes without reading the store (there is
/// nothing of its log there) and runs its turn as an awake agent does; hibernated again, its next
/// wake reads the log back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_slept_before_its_first_event_wakes_without_a_read() {
    use std::sync::atomic::Ordering;
    let store = Arc::new(SlowFirstReads::default());
    let script = dsh::llm::script::ScriptProvider::new(
        vec![ScriptEntry::text("ok"), ScriptEntry::text("two")],
        dsh::llm::script::Gates::new(),
    );
    let (host, agent) = slow_reads_host(&store, &script).await;
    until_hibernated(&agent).await;
    let reads = || store.n_reads.load(Ordering::SeqCst);
    let before = reads();
    agent.followup(user("first")).await.expect("acked");
    agent.when_idle().await.expect("idle");
    assert_eq!(reads(), before, "the first wake read the store");
    let log = store.stored(agent.id()).await;
    // Exactly what an agent that never slept logs (`a_simple_turn_logs_the_exact_sequence`).
    let want = text_turn_kinds(6);
    assert_kinds(&log, &want);
    assert_valid(&log);

    until_hibernated(&agent).await;
    agent.followup(user("second")).await.expect("acked");
    agent.when_idle().await.expect("idle");
    assert_eq!(
        reads(),
        before + 1,
        "the second wake reads the log back once"
    );
    let texts: Vec<String> = script.requests()[1]
        .messages
        .iter()
        .map(|m| m.text())
        .collect();
    assert_eq!(texts, ["first", "ok", "second"]);
    let log = store.stored(agent.id()).await;
    assert_valid(&log);
    host.shutdown().await;
}
