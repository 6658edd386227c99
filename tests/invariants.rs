//! Property tests of the runtime under random interleavings of followup, steer, inject, cancel,
//! remove and crash-restart, against the seeded simulated model and tools with random delays.
//!
//! After the agent goes idle — and again after a final crash and resume — the log passes every
//! relational invariant, and every acknowledged input is exactly one of: a `user/message`, discarded
//! by a logged cancellation, or still pending. Followups keep their order and each turn takes at most
//! one of them.

mod runtime_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use dsh::MessageId;
use dsh::inbox::Inbox;
use dsh::llm::provider::ProviderRegistry;
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::session::Event;
use dsh::session::event::{CancelCause, EventData, SpliceOutcome};
use dsh::session::store::SessionStore;
use dsh::session::store::memory::MemoryStore;
use dsh::tools::{ExecutionMode, Tool, ToolArgs, ToolInvocation, ToolOutput, ToolRegistry};
use dsh::turn::AgentConfig;
use dsh_actors::{AgentSpec, Host, HostConfig};
use proptest::prelude::*;
use runtime_support::{assert_valid, user_id};
use tokio_util::sync::CancellationToken;

/// A tool that sleeps a delay derived from its call id, cooperating with cancellation.
struct SleepyTool {
    name: &'static str,
    mode: ExecutionMode,
}

#[async_trait::async_trait]
impl Tool for SleepyTool {
    fn name(&self) -> &str {
        self.name
    }
    fn description(&self) -> &str {
        "sleeps a little"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}})
    }
    fn execution_mode(&self, _args: &ToolArgs) -> ExecutionMode {
        self.mode
    }
    async fn execute(&self, call: ToolInvocation, cancel: CancellationToken) -> ToolOutput {
        let ms = call.call_id.bytes().map(u64::from).sum::<u64>() % 4;
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(ms)) => ToolOutput::text("done"),
            () = cancel.cancelled() => ToolOutput::error("cancelled", None),
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Followup,
    Steer,
    Inject,
    Cancel {
        keep_inbox: bool,
    },
    /// Remove the n-th input sent so far (if it is still pending).
    Remove(usize),
    Pause(u8),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Followup),
        2 => Just(Op::Steer),
        2 => Just(Op::Inject),
        1 => any::<bool>().prop_map(|keep_inbox| Op::Cancel { keep_inbox }),
        1 => (0usize..16).prop_map(Op::Remove),
        3 => (0u8..6).prop_map(Op::Pause),
        1 => Just(Op::Restart),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Followup,
    Steer,
    Inject,
}

/// Ids of messages discarded by logged cancellations (splices with `outcome: canceled`), found by
/// replaying the inbox over the log.
fn discarded_ids(log: &[Event]) -> BTreeSet<String> {
    let mut inbox = Inbox::new();
    let mut out = BTreeSet::new();
    for e in log {
        if let EventData::InboxSpliced(s) = &e.data {
            let removed = inbox.apply(s).expect("logged splices replay");
            if s.outcome == Some(SpliceOutcome::Canceled) {
                out.extend(removed.iter().map(|m| m.id.to_string()));
            }
        }
    }
    out
}

/// The live inbox equals the one the log rebuilds.
async fn check_inbox_matches_log(agent: &dsh_actors::AgentHandle, log: &[Event]) {
    let inbox = Inbox::rebuild(log, 0).expect("inbox rebuilds");
    let status = agent.status().await.expect("status");
    assert_eq!(
        (status.n_pending_turn, status.n_pending_step),
        (inbox.next_turn().len(), inbox.next_step().len()),
        "the live inbox differs from the logged one"
    );
}

fn check_accounting(log: &[Event], sent: &[(String, Kind)]) {
    assert_valid(log);
    let entered: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::UserMessage(m) => Some(m.id.to_string()),
            _ => None,
        })
        .collect();
    let entered_set: BTreeSet<&String> = entered.iter().collect();
    assert_eq!(entered_set.len(), entered.len(), "a message entered twice");
    let discarded = discarded_ids(log);
    let pending: BTreeSet<String> = {
        let inbox = Inbox::rebuild(log, 0).expect("inbox rebuilds");
        inbox
            .next_turn()
            .iter()
            .chain(inbox.next_step().iter())
            .map(|m| m.id.to_string())
            .collect()
    };
    for (id, kind) in sent {
        let n = usize::from(entered_set.contains(id))
            + usize::from(discarded.contains(id))
            + usize::from(pending.contains(id));
        assert_eq!(
            n,
            1,
            "acknowledged {kind:?} {id} is entered={} discarded={} pending={}",
            entered_set.contains(id),
            discarded.contains(id),
            pending.contains(id)
        );
    }
    // Followups keep their order, and a turn takes at most one of them.
    let followups: Vec<&String> = sent
        .iter()
        .filter(|(_, k)| *k == Kind::Followup)
        .map(|(id, _)| id)
        .collect();
    let entered_followups: Vec<&String> =
        entered.iter().filter(|id| followups.contains(id)).collect();
    let order: Vec<usize> = entered_followups
        .iter()
        .map(|id| followups.iter().position(|f| f == id).unwrap_or(usize::MAX))
        .collect();
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "followups reordered: {order:?}"
    );
    let mut per_turn: BTreeMap<u64, usize> = BTreeMap::new();
    let mut turn = 0;
    for e in log {
        match &e.data {
            EventData::TurnStart(t) => turn = t.turn,
            EventData::UserMessage(m) if followups.contains(&&m.id.to_string()) => {
                *per_turn.entry(turn).or_default() += 1;
            }
            _ => {}
        }
    }
    assert!(per_turn.values().all(|n| *n == 1), "{per_turn:?}");
}

async fn run_case(ops: Vec<Op>, seed: u64) {
    let mut providers = ProviderRegistry::new();
    let sim = SimConfig {
        seed,
        ttft_ms: 1 + seed % 5,
        tokens_per_sec: 0,
        reply_tokens_min: 1,
        reply_tokens_max: 6,
        tool_call_probability: 0.5,
        max_tool_steps: 2,
        reasoning: seed.is_multiple_of(2),
    };
    providers.register(Arc::new(SimProvider::new(sim).expect("valid sim config")));
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(SleepyTool {
        name: "read",
        mode: ExecutionMode::Parallel,
    }));
    tools.register(Arc::new(SleepyTool {
        name: "write",
        mode: ExecutionMode::Exclusive,
    }));
    let memory = MemoryStore::new();
    // Read-backs (after hibernation) land 2 or 4 ms late among the inputs in two thirds of the cases.
    memory.set_read_delay_ms(2 * (seed % 3));
    let store: Arc<dyn SessionStore> = Arc::new(memory);
    // Half the cases pin the agent to two threads of the host's own (wakes and restarts move it
    // between them), half run it on the test's runtime.
    let config = HostConfig {
        hibernate_after: Some(Duration::from_millis(3)),
        agent_threads: if (seed / 2).is_multiple_of(2) { 0 } else { 2 },
        ..HostConfig::default()
    };
    let host = Host::builder(store)
        .providers(providers)
        .tools(tools)
        .config(config)
        .start()
        .await
        .expect("host starts");
    let mut spec = AgentSpec::new(AgentConfig::new("sim", "sim-1"));
    spec.config.max_parallel_tool_calls = 2;
    let agent = host.create(spec).await.expect("agent created");
    let mut sent: Vec<(String, Kind)> = Vec::new();
    for (i, op) in ops.into_iter().enumerate() {
        let id = format!("m{i}");
        let msg = || user_id(&id, &format!("input {i}"));
        match op {
            Op::Followup => {
                agent.followup(msg()).await.expect("followup acked");
                sent.push((id.clone(), Kind::Followup));
            }
            Op::Steer => {
                agent.steer(msg()).await.expect("steer acked");
                sent.push((id.clone(), Kind::Steer));
            }
            Op::Inject => {
                agent.inject(msg()).await.expect("inject acked");
                sent.push((id.clone(), Kind::Inject));
            }
            Op::Cancel { keep_inbox } => {
                agent
                    .cancel(CancelCause::User, keep_inbox)
                    .await
                    .expect("cancel acked");
            }
            Op::Remove(n) => {
                if let Some((id, _)) = sent.get(n) {
                    let id = MessageId::new(id).expect("test ids are valid");
                    agent.remove(id).await.expect("remove acked");
                }
            }
            Op::Pause(ms) => tokio::time::sleep(Duration::from_millis(u64::from(ms))).await,
            Op::Restart => {
                host.restart(agent.id()).await.expect("restart");
            }
        }
    }
    let idle = agent
        .when_idle_for(Duration::from_secs(30))
        .await
        .expect("agent alive");
    assert!(idle, "agent did not become idle");
    let log = agent.log().await.expect("log");
    check_inbox_matches_log(&agent, &log).await;
    check_accounting(&log, &sent);
    // Liveness: one more wake drains everything pending (no turn fails or is cancelled now).
    agent
        .followup(user_id("final", "final"))
        .await
        .expect("followup acked");
    sent.push(("final".into(), Kind::Followup));
    assert!(
        agent
            .when_idle_for(Duration::from_secs(30))
            .await
            .expect("alive")
    );
    let status = agent.status().await.expect("status");
    assert_eq!(
        (status.n_pending_turn, status.n_pending_step),
        (0, 0),
        "input left pending after a normal wake"
    );
    check_accounting(&agent.log().await.expect("log"), &sent);
    // A crash now, then resume: the repaired log and the accounting still hold.
    let agent = host.restart(agent.id()).await.expect("restart");
    check_accounting(&agent.log().await.expect("log"), &sent);
    host.shutdown().await;
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, max_shrink_iters: 64, .. ProptestConfig::default() })]

    #[test]
    fn acknowledged_input_is_never_lost_or_reordered(ops in prop::collection::vec(op(), 1..28), seed in any::<u64>()) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(run_case(ops, seed));
    }
}
