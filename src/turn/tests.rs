//! Unit tests of the turn machine, driven synchronously by a scripted harness: every effect is
//! answered in-line (hooks by closures, streams from a script, tools by hand or automatically), and
//! the log is checked event by event and against `session::invariant`.

use std::collections::VecDeque;

use super::*;
use crate::hooks::{PreExecute, Recovery};
use crate::llm::types::{BlockType, TokenUsage};
use crate::llm::types::{ContentBlock, FinishReason, Role, StreamChunk};
use crate::session::event::HeaderReason;
use crate::session::invariant;
use crate::tools::{ToolArgs, ToolInvocation, ToolOutput};

mod compaction;

fn user(text: &str) -> Message {
    Message::user_text(MessageId::mint(), text)
}

fn user_id(id: &str, text: &str) -> Message {
    Message::user_text(MessageId::new(id).unwrap(), text)
}

fn text_chunks(text: &str, finish: FinishReason) -> Vec<StreamChunk> {
    let mut out = vec![StreamChunk::BlockStart {
        index: 0,
        block_type: BlockType::Text,
    }];
    for c in text.chars() {
        out.push(StreamChunk::TextDelta {
            index: 0,
            text: c.to_string(),
        });
    }
    out.push(StreamChunk::BlockEnd {
        index: 0,
        block: ContentBlock::text(text),
    });
    out.push(StreamChunk::Usage {
        usage: TokenUsage {
            input_tokens: 10,
            output_tokens: text.chars().count() as u64,
            ..TokenUsage::default()
        },
    });
    out.push(StreamChunk::finish(finish));
    out
}

fn text(t: &str) -> Reply {
    Reply::Chunks(text_chunks(t, FinishReason::Stop))
}

fn calls(list: &[(&str, &str)]) -> Reply {
    let mut out = Vec::new();
    for (i, (id, name)) in list.iter().enumerate() {
        let index = i as u32;
        out.push(StreamChunk::BlockStart {
            index,
            block_type: BlockType::ToolCall,
        });
        out.push(StreamChunk::ToolCallDelta {
            index,
            id: (*id).into(),
            name: Some((*name).into()),
            arguments_delta: "{".into(),
        });
        out.push(StreamChunk::ToolCallDelta {
            index,
            id: (*id).into(),
            name: None,
            arguments_delta: "}".into(),
        });
        out.push(StreamChunk::BlockEnd {
            index,
            block: ContentBlock::ToolCall {
                id: (*id).into(),
                name: (*name).into(),
                arguments: "{}".into(),
            },
        });
    }
    out.push(StreamChunk::finish(FinishReason::ToolCalls));
    Reply::Chunks(out)
}

fn error(code: &str) -> Reply {
    Reply::Chunks(vec![StreamChunk::finish(FinishReason::Error {
        failure: LlmFailure::new(code, "boom"),
    })])
}

enum Reply {
    Chunks(Vec<StreamChunk>),
    /// Stream these, then wait for cancellation.
    Hang(Vec<StreamChunk>),
}

struct TestTool {
    name: String,
    mode: crate::tools::ExecutionMode,
}

#[async_trait::async_trait]
impl crate::tools::Tool for TestTool {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "test"
    }
    fn parameters(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    fn execution_mode(&self, _args: &ToolArgs) -> crate::tools::ExecutionMode {
        self.mode
    }
    async fn execute(
        &self,
        call: ToolInvocation,
        _cancel: tokio_util::sync::CancellationToken,
    ) -> ToolOutput {
        ToolOutput::text(format!("ok {}", call.call_id))
    }
}

/// The provider of route `p`: the harness answers its streams from the script, so it never streams.
struct ScriptedRoute;

impl crate::llm::provider::Provider for ScriptedRoute {
    fn name(&self) -> &str {
        "p"
    }

    fn stream(
        &self,
        _request: LlmRequest,
        _cancel: tokio_util::sync::CancellationToken,
    ) -> crate::llm::provider::ChunkStream {
        unreachable!("the harness answers streams from its script")
    }
}

/// `core` wired as the runtime would, with every hook point run by the harness, route `p`, and
/// message ids `m1`, `m2`, ... in minting order.
fn wired(mut core: AgentCore) -> AgentCore {
    core.wire(wiring(crate::hooks::HookPoints::ALL));
    core
}

/// The harness's wiring with `hooks` as the points that have hooks.
fn wiring(hooks: crate::hooks::HookPoints) -> Wiring {
    let mut providers = crate::llm::provider::ProviderRegistry::new();
    providers.register(Arc::new(ScriptedRoute));
    let n = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let ids = MessageIds::from_fn(move || {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        MessageId::new(&format!("m{i}")).expect("a valid id")
    });
    Wiring {
        hooks,
        providers,
        ids,
    }
}

type PreStepFn = Box<dyn FnMut(u64, u64, Vec<Arc<Message>>) -> Result<PreStepDecision, HookError>>;

struct Harness {
    core: AgentCore,
    script: VecDeque<Reply>,
    requests: Vec<LlmRequest>,
    live: Vec<LiveEvent>,
    /// Tools started and not yet finished: (ticket, idx, call id).
    running: Vec<(u64, usize, String)>,
    /// Finish tools as soon as they start.
    auto_tools: bool,
    /// A hanging stream's ticket.
    hanging: Option<u64>,
    timers: Vec<u64>,
    loads: Vec<u64>,
    pre_step: Option<PreStepFn>,
    turn_stopping: VecDeque<TurnStoppingAction>,
    recovery: VecDeque<Recovery>,
    /// Leave events non-durable (to test checkpoints).
    hold_durability: bool,
    tool_contexts: Vec<(String, Message)>,
    concluding: Vec<String>,
    /// The hook points run, in order.
    hook_runs: Vec<String>,
    /// The answers to `compact_now`, in order.
    compactions: Vec<Result<CompactionStarted, CompactRefusal>>,
}

impl Harness {
    fn new(script: Vec<Reply>) -> Harness {
        Harness::with_tools(script, &[])
    }

    fn with_tools(script: Vec<Reply>, tools: &[(&str, crate::tools::ExecutionMode)]) -> Harness {
        let mut registry = ToolRegistry::new();
        for (name, mode) in tools {
            registry.register(Arc::new(TestTool {
                name: (*name).into(),
                mode: *mode,
            }));
        }
        let mut config = AgentConfig::new("p", "m");
        config.max_parallel_tool_calls = 2;
        Harness {
            core: wired(AgentCore::new(
                SessionId::new("a1").unwrap(),
                config,
                registry,
            )),
            script: script.into(),
            requests: Vec::new(),
            live: Vec::new(),
            running: Vec::new(),
            auto_tools: true,
            hanging: None,
            timers: Vec::new(),
            loads: Vec::new(),
            pre_step: None,
            turn_stopping: VecDeque::new(),
            recovery: VecDeque::new(),
            hold_durability: false,
            tool_contexts: Vec::new(),
            concluding: Vec::new(),
            hook_runs: Vec::new(),
            compactions: Vec::new(),
        }
    }

    fn pump(&mut self) {
        loop {
            let effects = self.core.take_effects();
            if effects.is_empty() {
                if !self.hold_durability && self.core.durable_seq() < self.core.next_seq() {
                    self.core.mark_sent();
                    self.core.on_durable(self.core.next_seq(), 0);
                    continue;
                }
                return;
            }
            for e in effects {
                self.execute(e);
            }
        }
    }

    fn execute(&mut self, effect: Effect) {
        if let Effect::RunHooks(call) = &effect {
            let debug = format!("{call:?}");
            let name = debug.split([' ', '{']).next().unwrap_or_default();
            self.hook_runs.push(name.to_string());
        }
        match effect {
            Effect::Notify(e) => self.live.push(e),
            Effect::NewCancelToken
            | Effect::CancelToken
            | Effect::TurnEnded { .. }
            | Effect::CompactionEnded { .. } => {}
            Effect::LoadLog { ticket } => self.loads.push(ticket),
            Effect::RunHooks(HookCall::PreStep {
                ticket,
                turn,
                step,
                messages,
            }) => {
                let decision = match &mut self.pre_step {
                    Some(f) => f(turn, step, messages),
                    None => Ok(PreStepDecision::Enter(messages)),
                };
                self.core.on_pre_step(ticket, decision, 0);
            }
            Effect::RunHooks(HookCall::Request { ticket, config, .. }) => {
                self.core.on_request_configured(ticket, Ok(config), 0);
            }
            Effect::StartStream {
                ticket, request, ..
            } => {
                self.requests.push(request);
                match self.script.pop_front() {
                    Some(Reply::Chunks(chunks)) => {
                        for c in chunks {
                            self.core.on_chunk(ticket, c, 0);
                        }
                        self.core.on_stream_end(ticket, 0);
                    }
                    Some(Reply::Hang(chunks)) => {
                        for c in chunks {
                            self.core.on_chunk(ticket, c, 0);
                        }
                        self.hanging = Some(ticket);
                    }
                    None => panic!("script exhausted"),
                }
            }
            Effect::CancelStream { ticket } => {
                if self.hanging == Some(ticket) {
                    self.hanging = None;
                }
            }
            Effect::RunHooks(HookCall::RequestError { ticket, .. }) => {
                let r = self.recovery.pop_front().unwrap_or(Recovery::Delegate);
                self.core.on_recovery(ticket, Ok(r), 0);
            }
            Effect::StartTimer { ticket, .. } => self.timers.push(ticket),
            Effect::CancelTimer { ticket } => self.timers.retain(|t| *t != ticket),
            Effect::RunHooks(HookCall::PreExecute { ticket, idx, .. }) => {
                self.core
                    .on_pre_execute(ticket, idx, Ok(PreExecute::Allow), 0);
            }
            Effect::StartTool {
                ticket,
                idx,
                invocation,
                ..
            } => {
                if self.auto_tools {
                    let out = self.output_for(&invocation.call_id);
                    self.core.on_tool_finished(ticket, idx, out, 0);
                } else {
                    self.running.push((ticket, idx, invocation.call_id));
                }
            }
            Effect::CancelTools { ticket } => {
                // The pool kills what is left after the grace period.
                let running = std::mem::take(&mut self.running);
                for (t, idx, _) in running {
                    assert_eq!(t, ticket);
                    self.core
                        .on_tool_finished(t, idx, ToolOutput::aborted(None), 0);
                }
            }
            Effect::RunHooks(HookCall::PostExecute {
                ticket,
                idx,
                output,
                ..
            }) => self.core.on_post_execute(ticket, idx, Ok(output), 0),
            Effect::RunHooks(HookCall::TurnStopping { ticket, .. }) => {
                let a = self.turn_stopping.pop_front().unwrap_or_default();
                self.core.on_turn_stopping(ticket, Ok(a), 0);
            }
            Effect::CompactionStarted { result } => self.compactions.push(result),
            Effect::Fatal { reason } => panic!("fatal: {reason}"),
        }
    }

    fn output_for(&self, call_id: &str) -> ToolOutput {
        let mut out = ToolOutput::text(format!("ok {call_id}"));
        for (id, ctx) in &self.tool_contexts {
            if id == call_id {
                out.additional_contexts.push(ctx.clone());
            }
        }
        out.concludes_turn = self.concluding.iter().any(|c| c == call_id);
        out
    }

    /// Finishes the running tool with this call id.
    fn finish_tool(&mut self, call_id: &str) {
        let i = self
            .running
            .iter()
            .position(|(_, _, c)| c == call_id)
            .unwrap_or_else(|| panic!("{call_id} is not running"));
        let (ticket, idx, _) = self.running.remove(i);
        let out = self.output_for(call_id);
        self.core.on_tool_finished(ticket, idx, out, 0);
        self.pump();
    }

    fn followup(&mut self, t: &str) {
        self.core.followup(user(t), 0).unwrap();
        self.pump();
    }

    fn cancel(&mut self, keep_inbox: bool) {
        self.core.cancel(CancelCause::User, keep_inbox, 0);
        self.pump();
    }

    fn events(&self) -> &[Event] {
        self.core.session().expect("live").events()
    }

    fn kinds(&self) -> Vec<&str> {
        self.events().iter().map(Event::kind).collect()
    }

    /// The log without chunks, request envelope and splices.
    fn skeleton(&self) -> Vec<&str> {
        self.kinds()
            .into_iter()
            .filter(|k| {
                !matches!(
                    *k,
                    "assistant/chunk"
                        | "request/header"
                        | "request/context"
                        | "agent/inbox/spliced"
                )
            })
            .collect()
    }

    fn turn_end_reasons(&self) -> Vec<TurnEndReason> {
        self.events()
            .iter()
            .filter_map(|e| match &e.data {
                EventData::TurnEnd(t) => Some(t.reason.clone()),
                _ => None,
            })
            .collect()
    }

    fn statuses(&self) -> Vec<Status> {
        self.live
            .iter()
            .filter_map(|e| match e {
                LiveEvent::Status(s) => Some(*s),
                _ => None,
            })
            .collect()
    }

    fn user_texts(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter_map(|e| match &e.data {
                EventData::UserMessage(m) => Some(m.text()),
                _ => None,
            })
            .collect()
    }

    fn check(&self) {
        invariant::check(self.events()).unwrap();
        assert!(invariant::is_balanced(self.events()), "{:?}", self.kinds());
    }
}

const ABORTED_USER: TurnEndReason = TurnEndReason::Aborted {
    reason: CancelCause::User,
};

#[test]
fn a_simple_turn_logs_the_exact_sequence() {
    let mut h = Harness::new(vec![text("ok")]);
    h.followup("hi");
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
    assert_eq!(h.kinds(), want);
    assert_eq!(h.turn_end_reasons(), [TurnEndReason::Completed]);
    assert_eq!(h.statuses(), [Status::Running, Status::Idle]);
    let EventData::AssistantMessage(a) = &h.events()[13].data else {
        panic!()
    };
    assert_eq!(a.message.text(), "ok");
    assert_eq!(h.events()[13].source_event_seqs, Some((7..13).collect()));
    assert_eq!(
        a.usage,
        Some(TokenUsage {
            input_tokens: 10,
            output_tokens: 2,
            ..TokenUsage::default()
        })
    );
    let roles: Vec<Role> = h.requests[0].messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User]);
    h.check();
}

#[test]
fn tool_calls_round_trip_in_the_same_turn() {
    let mut h = Harness::with_tools(
        vec![calls(&[("c1", "echo")]), text("done")],
        &[("echo", crate::tools::ExecutionMode::Parallel)],
    );
    h.followup("go");
    assert_eq!(
        h.skeleton(),
        [
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
            "turn/end"
        ]
    );
    assert_eq!(h.requests.len(), 2);
    let last = h.requests[1].messages.last().unwrap();
    assert_eq!(
        last.content,
        [ContentBlock::ToolResult {
            tool_call_id: "c1".into(),
            content: vec![ContentBlock::text("ok c1")],
            is_error: Some(false),
        }]
    );
    let call_seq = h.kinds().iter().position(|k| *k == "tool/call").unwrap() as u64;
    let result = h
        .events()
        .iter()
        .find(|e| e.kind() == "tool/result")
        .unwrap();
    assert_eq!(result.source_event_seqs, Some(vec![call_seq]));
    h.check();
}

#[test]
fn a_burst_of_followups_runs_one_turn_each_in_one_activation() {
    let mut h = Harness::new(vec![Reply::Hang(vec![]), text("b"), text("c")]);
    h.followup("a");
    h.followup("b");
    h.followup("c");
    // Turn 1 hangs; cancel it keeping the inbox: b and c park until the next wake.
    h.cancel(true);
    assert_eq!(h.turn_end_reasons(), [ABORTED_USER]);
    h.script.push_back(text("d"));
    h.followup("d");
    assert_eq!(h.user_texts(), ["a", "b", "c", "d"]);
    assert_eq!(
        h.turn_end_reasons()[1..],
        [
            TurnEndReason::Completed,
            TurnEndReason::Completed,
            TurnEndReason::Completed
        ]
    );
    assert_eq!(
        h.statuses(),
        [Status::Running, Status::Idle, Status::Running, Status::Idle]
    );
    h.check();
}

#[test]
fn steer_during_streaming_joins_the_next_step() {
    let mut h = Harness::new(vec![Reply::Hang(
        text_chunks("He", FinishReason::Stop)[..2].to_vec(),
    )]);
    h.followup("hi");
    h.core.steer(user("also this"), 0).unwrap();
    // Finish the hanging stream by hand.
    let ticket = h.hanging.take().unwrap();
    for c in text_chunks("He", FinishReason::Stop).into_iter().skip(2) {
        h.core.on_chunk(ticket, c, 0);
    }
    h.script.push_back(text("ok"));
    h.pump();
    assert_eq!(
        h.skeleton(),
        [
            "turn/start",
            "step/start",
            "user/message",
            "assistant/message",
            "step/end",
            "step/start",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    assert_eq!(h.user_texts(), ["hi", "also this"]);
    assert_eq!(h.requests[1].messages.last().unwrap().text(), "also this");
    h.check();
}

#[test]
fn cancel_mid_stream_finalizes_the_visible_prefix() {
    let mut h = Harness::new(vec![Reply::Hang(vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Text,
        },
        StreamChunk::TextDelta {
            index: 0,
            text: "partial".into(),
        },
    ])]);
    h.followup("hi");
    h.cancel(false);
    let n = h.events().len();
    let kinds = h.kinds();
    assert_eq!(
        kinds[n - 3..],
        ["assistant/message", "step/end", "turn/end"]
    );
    let msg = &h.events()[n - 3];
    let EventData::AssistantMessage(a) = &msg.data else {
        panic!()
    };
    assert_eq!(a.interrupted, Some(true));
    assert_eq!(a.message.content, [ContentBlock::text("partial")]);
    assert_eq!(msg.source_event_seqs.as_ref().map(Vec::len), Some(2));
    assert_eq!(h.turn_end_reasons(), [ABORTED_USER]);
    // The next request contains what the user saw.
    h.script.push_back(text("ok"));
    h.followup("again");
    let texts: Vec<String> = h.requests[1].messages.iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["hi", "partial", "again"]);
    h.check();
}

#[test]
fn cancel_during_tools_drains_commits_and_pairs_the_unstarted() {
    let mut h = Harness::with_tools(
        vec![calls(&[("c1", "r"), ("c2", "r"), ("c3", "r"), ("c4", "r")])],
        &[("r", crate::tools::ExecutionMode::Parallel)],
    );
    h.auto_tools = false;
    h.followup("go");
    // Cap 2: c1 and c2 run.
    assert_eq!(h.running.len(), 2);
    h.finish_tool("c2");
    // c2's result waits for c1; c3 took c2's place in the pool.
    assert_eq!(
        h.running.iter().map(|r| r.2.as_str()).collect::<Vec<_>>(),
        ["c1", "c3"]
    );
    h.core.followup(user("queued"), 0).unwrap();
    h.cancel(false);
    let tail: Vec<&str> = h
        .kinds()
        .into_iter()
        .skip_while(|k| *k != "assistant/message")
        .collect();
    assert_eq!(
        tail,
        [
            "assistant/message",
            "tool/call",
            "tool/call",
            "tool/call",
            "agent/inbox/spliced", // the followup
            "agent/inbox/spliced", // the cancel's clear
            "tool/result",
            "tool/result",
            "tool/result",
            "tool/call",
            "tool/result",
            "step/end",
            "turn/end"
        ]
    );
    let codes: Vec<String> = h
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) => {
                Some(r.error.as_ref().map_or("-".into(), |e| e.code.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        ["ABORTED", "-", "ABORTED", "ABORTED_BEFORE_DISPATCH"]
    );
    assert_eq!(h.turn_end_reasons(), [ABORTED_USER]);
    assert!(
        !h.core.inbox().has_pending(),
        "cancel cleared the queued followup"
    );
    h.check();
}

#[test]
fn a_wake_during_abort_convergence_is_latched_and_replayed() {
    let mut h = Harness::with_tools(
        vec![calls(&[("c1", "w")]), text("B done")],
        &[("w", crate::tools::ExecutionMode::Exclusive)],
    );
    h.auto_tools = false;
    h.followup("A");
    assert_eq!(h.running.len(), 1);
    // Abort without letting the tool drain: the turn converges only when the tool reports.
    h.core.cancel(CancelCause::User, true, 0);
    h.core.followup(user("B"), 0).unwrap();
    assert_eq!(h.core.status(), Status::Running);
    h.running.clear();
    let ticket = h.core.tool_batch_ticket().unwrap();
    h.core
        .on_tool_finished(ticket, 0, ToolOutput::text("late"), 0);
    h.pump();
    assert_eq!(
        h.turn_end_reasons(),
        [ABORTED_USER, TurnEndReason::Completed]
    );
    assert_eq!(h.user_texts(), ["A", "B"]);
    let result = h
        .events()
        .iter()
        .find(|e| e.kind() == "tool/result")
        .unwrap();
    let EventData::ToolResult(r) = &result.data else {
        panic!()
    };
    assert_eq!(
        r.error.as_ref().unwrap().code,
        "ABORTED",
        "a late success counts as aborted"
    );
    h.check();
}

#[test]
fn max_tokens_stays_the_reason_but_later_tools_still_run() {
    let mut h = Harness::with_tools(
        vec![
            Reply::Chunks(text_chunks("trunc", FinishReason::MaxTokens)),
            calls(&[("c1", "t")]),
            text("done"),
        ],
        &[("t", crate::tools::ExecutionMode::Parallel)],
    );
    h.turn_stopping.push_back(TurnStoppingAction {
        steer: vec![user("continue")],
        ..TurnStoppingAction::default()
    });
    h.followup("go");
    assert_eq!(
        h.requests.len(),
        3,
        "the tool result went back to the model"
    );
    assert_eq!(h.turn_end_reasons(), [TurnEndReason::MaxTokens]);
    h.check();
}

#[test]
fn a_rejected_step_blocks_the_turn_and_parks_queued_work() {
    let mut h = Harness::new(vec![text("safe done"), text("wake done")]);
    h.pre_step = Some(Box::new(|_, _, msgs| {
        if msgs.iter().any(|m| m.text() == "secret") {
            Ok(PreStepDecision::Reject)
        } else {
            Ok(PreStepDecision::Enter(msgs))
        }
    }));
    h.core.followup(user("secret"), 0).unwrap();
    h.core.followup(user("safe"), 0).unwrap();
    h.pump();
    assert_eq!(h.skeleton(), ["turn/start", "turn/end"]);
    assert_eq!(h.turn_end_reasons(), [TurnEndReason::Blocked]);
    assert_eq!(
        h.core.inbox().next_turn().len(),
        1,
        "safe waits for the next wake"
    );
    h.followup("wake");
    assert_eq!(h.user_texts(), ["safe", "wake"]);
    h.check();
}

#[test]
fn an_empty_first_batch_is_a_zero_step_completed_turn() {
    let mut h = Harness::new(vec![]);
    h.pre_step = Some(Box::new(|_, _, _| Ok(PreStepDecision::Enter(vec![]))));
    h.followup("x");
    assert_eq!(h.skeleton(), ["turn/start", "turn/end"]);
    assert_eq!(h.turn_end_reasons(), [TurnEndReason::Completed]);
    assert!(h.requests.is_empty());
    h.check();
}

#[test]
fn a_failing_pre_step_ends_the_turn_with_an_error_and_reports_it() {
    let mut h = Harness::new(vec![]);
    h.pre_step = Some(Box::new(|_, _, _| {
        Err(HookError::Message("prompt hook broke".into()))
    }));
    h.followup("x");
    assert_eq!(
        h.turn_end_reasons(),
        [TurnEndReason::Error {
            error: LlmFailure::new("UNKNOWN", "prompt hook broke")
        }]
    );
    assert!(h.live.iter().any(|e| matches!(
        e,
        LiveEvent::Error {
            turn: 1,
            step: 0,
            ..
        }
    )));
    h.check();
}

#[test]
fn a_retry_stays_in_the_same_step_and_cites_only_its_own_chunks() {
    let mut h = Harness::new(vec![error("RATE_LIMIT"), text("recovered")]);
    h.recovery.push_back(Recovery::Backoff(ScheduledRetry {
        retry_id: "r1".into(),
        mode: "normal".into(),
        policy_key: "k".into(),
        retry: 1,
        max_retries: Some(2),
        delay_ms: 450.0,
    }));
    h.followup("go");
    assert_eq!(h.timers.len(), 1);
    let t = h.timers.pop().unwrap();
    h.core.on_timer(t, 0);
    h.pump();
    assert_eq!(
        h.skeleton(),
        [
            "turn/start",
            "step/start",
            "user/message",
            "llm/retry",
            "llm/retry-started",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    let failed_chunk = h
        .kinds()
        .iter()
        .position(|k| *k == "assistant/chunk")
        .unwrap() as u64;
    let msg = h
        .events()
        .iter()
        .find(|e| e.kind() == "assistant/message")
        .unwrap();
    assert!(
        !msg.source_event_seqs
            .as_ref()
            .unwrap()
            .contains(&failed_chunk)
    );
    let EventData::LlmRetry(r) = &h
        .events()
        .iter()
        .find(|e| e.kind() == "llm/retry")
        .unwrap()
        .data
    else {
        panic!()
    };
    assert_eq!(r.delay_ms.to_string(), "450");
    assert_eq!(h.requests.len(), 2);
    assert_eq!(
        h.requests[0].messages, h.requests[1].messages,
        "retries are identical"
    );
    h.check();
}

#[test]
fn an_unrecovered_failure_ends_the_turn_with_the_failure_facts() {
    let mut h = Harness::new(vec![error("AUTH")]);
    h.followup("go");
    assert_eq!(
        h.turn_end_reasons(),
        [TurnEndReason::Error {
            error: LlmFailure::new("AUTH", "boom")
        }]
    );
    assert!(!h.kinds().contains(&"assistant/message"));
    h.check();
}

#[test]
fn cancel_during_a_retry_wait_ends_aborted() {
    let mut h = Harness::new(vec![error("SERVER")]);
    h.recovery.push_back(Recovery::Backoff(ScheduledRetry {
        retry_id: "r1".into(),
        mode: "normal".into(),
        policy_key: "k".into(),
        retry: 1,
        max_retries: Some(5),
        delay_ms: 1.5,
    }));
    h.followup("go");
    h.cancel(false);
    assert!(h.timers.is_empty(), "the timer was cancelled");
    assert_eq!(h.turn_end_reasons(), [ABORTED_USER]);
    assert!(h.kinds().contains(&"llm/retry"));
    assert!(!h.kinds().contains(&"llm/retry-started"));
    h.check();
}

#[test]
fn results_commit_in_model_order_under_reversed_completion() {
    let mut h = Harness::with_tools(
        vec![calls(&[("c1", "r"), ("c2", "r")]), text("done")],
        &[("r", crate::tools::ExecutionMode::Parallel)],
    );
    h.auto_tools = false;
    h.followup("go");
    h.finish_tool("c2");
    assert!(!h.kinds().contains(&"tool/result"));
    h.finish_tool("c1");
    let results: Vec<String> = h
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) => r.message.source.str_field("callId").map(String::from),
            _ => None,
        })
        .collect();
    assert_eq!(results, ["c1", "c2"]);
    h.check();
}

/// The pool refills only after the ready prefix committed (agent-loop.md 8.3: `commitReady`, then
/// `fillPool`), so a freed slot never lets a new `tool/call` overtake the results before it. Found by
/// the scenario `pool-cap-replenishes`.
#[test]
fn the_pool_refills_after_the_ready_prefix_committed() {
    let mut h = Harness::with_tools(
        vec![
            calls(&[("c1", "r"), ("c2", "r"), ("c3", "r"), ("c4", "r")]),
            text("done"),
        ],
        &[("r", crate::tools::ExecutionMode::Parallel)],
    );
    h.auto_tools = false;
    h.followup("go");
    h.finish_tool("c2");
    h.finish_tool("c1");
    h.finish_tool("c3");
    h.finish_tool("c4");
    let tool_events: Vec<(String, String)> = h
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolCall(c) => Some(("call".to_string(), c.call_id.clone())),
            EventData::ToolResult(r) => r
                .message
                .source
                .str_field("callId")
                .map(|c| ("result".to_string(), c.to_string())),
            _ => None,
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("call", "c1"),
        ("call", "c2"),
        ("call", "c3"),
        ("result", "c1"),
        ("result", "c2"),
        ("call", "c4"),
        ("result", "c3"),
        ("result", "c4"),
    ]
    .iter()
    .map(|(k, c)| ((*k).to_string(), (*c).to_string()))
    .collect();
    assert_eq!(tool_events, want);
    h.check();
}

#[test]
fn an_exclusive_call_runs_alone() {
    let mut h = Harness::with_tools(
        vec![
            calls(&[("c1", "r"), ("c2", "w"), ("c3", "r")]),
            text("done"),
        ],
        &[
            ("r", crate::tools::ExecutionMode::Parallel),
            ("w", crate::tools::ExecutionMode::Exclusive),
        ],
    );
    h.auto_tools = false;
    h.followup("go");
    assert_eq!(h.running.len(), 1);
    h.finish_tool("c1");
    assert_eq!(h.running[0].2, "c2");
    h.finish_tool("c2");
    assert_eq!(h.running[0].2, "c3");
    h.finish_tool("c3");
    assert_eq!(h.turn_end_reasons(), [TurnEndReason::Completed]);
    h.check();
}

#[test]
fn additional_contexts_follow_all_results_and_open_the_next_step() {
    let mut h = Harness::with_tools(
        vec![calls(&[("c1", "r"), ("c2", "r")]), text("done")],
        &[("r", crate::tools::ExecutionMode::Parallel)],
    );
    h.tool_contexts.push(("c1".into(), user("ctx-c1")));
    h.tool_contexts.push(("c2".into(), user("ctx-c2")));
    h.followup("go");
    let after_results: Vec<&str> = h
        .kinds()
        .into_iter()
        .skip_while(|k| *k != "tool/result")
        .take(6)
        .collect();
    assert_eq!(
        after_results,
        [
            "tool/result",
            "agent/inbox/spliced",
            "tool/result",
            "agent/inbox/spliced",
            "step/end",
            "agent/inbox/spliced"
        ]
    );
    assert_eq!(h.user_texts(), ["go", "ctx-c1", "ctx-c2"]);
    h.check();
}

#[test]
fn a_concluding_tool_ends_the_turn_without_another_request() {
    let mut h = Harness::with_tools(
        vec![calls(&[("c1", "r")])],
        &[("r", crate::tools::ExecutionMode::Parallel)],
    );
    h.concluding.push("c1".into());
    h.followup("go");
    assert_eq!(h.requests.len(), 1);
    assert_eq!(h.turn_end_reasons(), [TurnEndReason::Completed]);
    h.check();
}

#[test]
fn turn_stopping_steering_continues_the_same_turn() {
    let mut h = Harness::new(vec![text("one"), text("two")]);
    h.turn_stopping.push_back(TurnStoppingAction {
        steer: vec![user("one more")],
        ..TurnStoppingAction::default()
    });
    h.followup("go");
    assert_eq!(h.requests.len(), 2);
    assert_eq!(h.kinds().iter().filter(|k| **k == "turn/start").count(), 1);
    assert_eq!(h.requests[1].messages.last().unwrap().text(), "one more");
    h.check();
}

#[test]
fn idle_inject_stays_pending_and_joins_the_next_turn() {
    let mut h = Harness::new(vec![text("ok")]);
    h.core.inject(user("context"), 0).unwrap();
    h.pump();
    assert_eq!(h.kinds(), ["agent/inbox/spliced"]);
    assert_eq!(h.core.status(), Status::Idle);
    h.followup("prompt");
    assert_eq!(h.user_texts(), ["context", "prompt"]);
    h.check();
}

#[test]
fn idle_cancel_discards_pending_input_durably() {
    let mut h = Harness::new(vec![]);
    h.core.inject(user_id("m1", "context"), 0).unwrap();
    h.cancel(false);
    let EventData::InboxSpliced(s) = &h.events()[1].data else {
        panic!()
    };
    assert_eq!(s.removed_count, Some(1));
    assert_eq!(
        s.outcome,
        Some(crate::session::event::SpliceOutcome::Canceled)
    );
    assert!(!h.core.inbox().has_pending());
}

#[test]
fn requests_wait_for_durability() {
    let mut h = Harness::new(vec![text("ok")]);
    h.hold_durability = true;
    h.followup("hi");
    assert!(h.requests.is_empty(), "dispatch waits for the checkpoint");
    h.hold_durability = false;
    h.pump();
    assert_eq!(h.requests.len(), 1);
}

#[test]
fn a_hibernated_agent_reads_its_log_back_before_the_next_turn() {
    let mut h = Harness::new(vec![text("one"), text("two")]);
    h.followup("a");
    let stored = h.events().to_vec();
    assert!(h.core.hibernate());
    assert!(h.core.session().is_none());
    // As the actor that wakes a dormant agent does.
    h.core.wire(wiring(crate::hooks::HookPoints::ALL));
    h.core.inject(user("ctx"), 0).unwrap();
    h.followup("b");
    let ticket = h.loads.pop().expect("a load was requested");
    h.core.on_log_loaded(ticket, Ok(stored), 0);
    h.pump();
    assert_eq!(h.user_texts(), ["a", "ctx", "b"]);
    let texts: Vec<String> = h.requests[1].messages.iter().map(|m| m.text()).collect();
    assert_eq!(texts, ["a", "one", "ctx", "b"]);
    h.check();
}

/// An agent that hibernated before its first event has nothing in the store below its tail: it
/// wakes without a read (no `LoadLog`) and logs exactly what an agent that never slept logs. Once
/// it has a stored log, the next wake reads it back as before.
#[test]
fn an_agent_that_hibernated_before_its_first_event_wakes_without_a_read() {
    let mut awake = Harness::new(vec![text("one")]);
    awake.core.inject(user("ctx"), 0).unwrap();
    awake.followup("a");

    let mut h = Harness::new(vec![text("one"), text("two")]);
    assert!(h.core.hibernate());
    h.core.wire(wiring(crate::hooks::HookPoints::ALL));
    h.core.inject(user("ctx"), 0).unwrap();
    h.followup("a");
    assert!(
        h.loads.is_empty(),
        "no read for a log the store does not hold"
    );
    assert_eq!(h.requests.len(), 1);
    assert_eq!(h.kinds(), awake.kinds());
    assert_eq!(h.user_texts(), ["ctx", "a"]);
    h.check();

    let stored = h.events().to_vec();
    assert!(h.core.hibernate());
    h.core.wire(wiring(crate::hooks::HookPoints::ALL));
    h.followup("b");
    let ticket = h.loads.pop().expect("a stored log is read back");
    h.core.on_log_loaded(ticket, Ok(stored), 0);
    h.pump();
    assert_eq!(h.user_texts(), ["ctx", "a", "b"]);
    h.check();
}

#[test]
fn resume_marks_the_seed_and_continues_turn_numbers() {
    let mut h = Harness::new(vec![text("one")]);
    h.followup("a");
    let events = h.events().to_vec();
    let mut config = AgentConfig::new("p", "m");
    config.max_parallel_tool_calls = 1;
    let mut h2 = Harness::new(vec![text("two")]);
    h2.core = wired(
        AgentCore::resume(
            SessionId::new("a1").unwrap(),
            config,
            ToolRegistry::new(),
            events.clone(),
            0,
        )
        .unwrap(),
    );
    h2.followup("b");
    assert_eq!(h2.events()[events.len()].kind(), "session/end-seed");
    let headers: Vec<HeaderReason> = h2
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::RequestHeader(r) => Some(r.reason),
            _ => None,
        })
        .collect();
    assert_eq!(headers, [HeaderReason::Initial, HeaderReason::Resume]);
    assert!(
        h2.events()
            .iter()
            .any(|e| matches!(e.data, EventData::TurnStart(TurnStart { turn: 2 })))
    );
    h2.check();
}

#[test]
fn resume_refuses_an_open_turn() {
    let mut h = Harness::new(vec![Reply::Hang(vec![])]);
    h.followup("a");
    let events = h.events().to_vec();
    let err = AgentCore::resume(
        SessionId::new("a1").unwrap(),
        AgentConfig::new("p", "m"),
        ToolRegistry::new(),
        events,
        0,
    )
    .unwrap_err();
    assert_eq!(err, ResumeError::OpenTurn { turn: 1 });
}

#[test]
fn maintenance_defers_a_wake_until_it_ends() {
    let mut h = Harness::new(vec![text("ok")]);
    h.core.begin_maintenance().unwrap();
    h.followup("during");
    assert!(h.requests.is_empty());
    assert_eq!(h.core.status(), Status::Idle);
    h.core.end_maintenance(0);
    h.pump();
    assert_eq!(h.requests.len(), 1);
    h.check();
}

#[test]
fn an_oversized_response_is_cut_and_fails_the_attempt() {
    let mut h = Harness::new(vec![]);
    let mut config = h.core.config().clone();
    config.limits.assistant_bytes_max = 10;
    h.core = wired(AgentCore::new(
        SessionId::new("a1").unwrap(),
        config,
        ToolRegistry::new(),
    ));
    h.script.push_back(Reply::Chunks(text_chunks(
        "this text is too long",
        FinishReason::Stop,
    )));
    h.followup("go");
    match &h.turn_end_reasons()[..] {
        [TurnEndReason::Error { error }] => assert_eq!(error.code, codes::MALFORMED_RESPONSE),
        other => panic!("{other:?}"),
    }
    assert!(!h.kinds().contains(&"assistant/message"));
    h.check();
}

#[test]
fn a_hook_point_with_no_hook_registered_produces_no_effect() {
    let script = || vec![calls(&[("c1", "read")]), text("done")];
    let tools = [("read", crate::tools::ExecutionMode::Parallel)];
    let mut hooked = Harness::with_tools(script(), &tools);
    hooked.followup("go");
    assert_eq!(
        hooked.hook_runs,
        [
            "PreStep",
            "Request",
            "PreExecute",
            "PostExecute",
            "PreStep",
            "Request",
            "TurnStopping"
        ]
    );
    let mut bare = Harness::with_tools(script(), &tools);
    bare.core.wire(wiring(crate::hooks::HookPoints::default()));
    bare.followup("go");
    assert!(bare.hook_runs.is_empty(), "{:?}", bare.hook_runs);
    // The neutral answers the core takes itself log exactly what answered hooks log.
    assert_eq!(bare.kinds(), hooked.kinds());
    bare.check();
}

#[test]
fn a_route_with_no_provider_fails_the_attempt_with_no_adapter_and_opens_no_stream() {
    let mut h = Harness::new(vec![]);
    h.core = wired(AgentCore::new(
        SessionId::new("a1").unwrap(),
        AgentConfig::new("nowhere", "m"),
        ToolRegistry::new(),
    ));
    h.followup("go");
    assert!(h.requests.is_empty());
    assert_eq!(
        h.kinds(),
        [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "request/header",
            "request/context",
            "assistant/chunk",
            "step/end",
            "turn/end"
        ]
    );
    assert_eq!(
        h.turn_end_reasons(),
        [TurnEndReason::Error {
            error: LlmFailure::new(
                codes::NO_ADAPTER,
                "no provider registered for route \"nowhere\""
            )
        }]
    );
    h.check();
}

#[test]
fn the_machine_takes_message_ids_from_its_wiring() {
    let mut h = Harness::with_tools(
        vec![calls(&[("c1", "read")]), text("done")],
        &[("read", crate::tools::ExecutionMode::Parallel)],
    );
    h.followup("go");
    let minted: Vec<(&str, String)> = h
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::AssistantMessage(m) => Some(("assistant", m.message.id.to_string())),
            EventData::ToolResult(r) => Some(("tool", r.message.id.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(
        minted,
        [
            ("assistant", "m1".to_string()),
            ("tool", "m2".to_string()),
            ("assistant", "m3".to_string())
        ]
    );
}

/// A changing tool source for the tests: `add` puts a tool in and moves the generation.
#[derive(Default)]
struct ChangingSource {
    generation: std::sync::atomic::AtomicU64,
    tools: std::sync::Mutex<Vec<Arc<dyn crate::tools::Tool>>>,
}

impl ChangingSource {
    fn add(&self, name: &str) {
        self.tools.lock().unwrap().push(Arc::new(TestTool {
            name: name.into(),
            mode: crate::tools::ExecutionMode::Parallel,
        }));
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl crate::tools::ToolSource for ChangingSource {
    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }
    fn tools(&self) -> Vec<Arc<dyn crate::tools::Tool>> {
        self.tools.lock().unwrap().clone()
    }
}

#[test]
fn a_tool_source_that_changes_mid_turn_is_taken_in_at_the_next_step_with_a_changed_header() {
    let source = Arc::new(ChangingSource::default());
    source.add("read");
    let mut registry = ToolRegistry::new();
    registry.register(Arc::new(TestTool {
        name: "fixed".into(),
        mode: crate::tools::ExecutionMode::Parallel,
    }));
    registry.add_source(Arc::clone(&source) as Arc<dyn crate::tools::ToolSource>);
    let mut h = Harness::new(vec![calls(&[("c1", "read")]), text("done")]);
    h.core = wired(AgentCore::new(
        SessionId::new("a1").unwrap(),
        {
            let mut config = AgentConfig::new("p", "m");
            config.max_parallel_tool_calls = 2;
            config
        },
        registry,
    ));
    // The source changes while step 1's call runs: before step 2's pre_step hook answers.
    let changer = Arc::clone(&source);
    h.pre_step = Some(Box::new(move |_turn, step, messages| {
        if step == 2 {
            changer.add("write");
        }
        Ok(PreStepDecision::Enter(messages))
    }));
    h.followup("go");
    assert_eq!(
        h.kinds(),
        [
            "agent/inbox/spliced",
            "turn/start",
            "agent/inbox/spliced",
            "step/start",
            "user/message",
            "request/header",
            "request/context",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/message",
            "tool/call",
            "tool/result",
            "step/end",
            "step/start",
            "request/header",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/chunk",
            "assistant/message",
            "step/end",
            "turn/end"
        ]
    );
    let headers: Vec<(HeaderReason, Vec<String>)> = h
        .events()
        .iter()
        .filter_map(|e| match &e.data {
            EventData::RequestHeader(r) => Some((
                r.reason,
                r.header
                    .tools
                    .iter()
                    .flatten()
                    .map(|t| t.name.clone())
                    .collect(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        headers,
        [
            (HeaderReason::Initial, vec!["fixed".into(), "read".into()]),
            (
                HeaderReason::Change,
                vec!["fixed".into(), "read".into(), "write".into()]
            )
        ]
    );
    let sent: Vec<Vec<&str>> = h
        .requests
        .iter()
        .map(|r| r.tools.iter().map(|t| t.name.as_str()).collect())
        .collect();
    assert_eq!(
        sent,
        [vec!["fixed", "read"], vec!["fixed", "read", "write"]]
    );
    h.check();
}

/// Once idle and durable, the chunks' payloads leave memory (one shared placeholder), nothing else
/// changes, the in-memory log says from where it must be read from the store, and the next turn
/// runs as usual.
#[test]
fn an_idle_agent_elides_its_durable_chunks() {
    let mut h = Harness::new(vec![text("ok"), text("again")]);
    h.followup("hi");
    let before = h.events().to_vec();
    let next = h.core.next_seq();
    assert_eq!(h.core.durable_seq(), next);
    h.core.elide_durable_chunks();
    assert_eq!(h.core.elided_through(), next);
    let elided = crate::session::event::AssistantChunk::elided();
    for (was, now) in before.iter().zip(h.events()) {
        match (&was.data, &now.data) {
            (EventData::AssistantChunk(_), EventData::AssistantChunk(c)) => {
                assert!(Arc::ptr_eq(c, &elided), "seq {}", now.seq);
            }
            _ => assert_eq!(was, now),
        }
    }
    h.followup("more");
    assert_eq!(h.turn_end_reasons(), vec![TurnEndReason::Completed; 2]);
    // The second turn's chunks are whole until elided in turn.
    let last_chunk = h
        .events()
        .iter()
        .rev()
        .find(|e| e.kind() == "assistant/chunk");
    let Some(EventData::AssistantChunk(c)) = last_chunk.map(|e| &e.data) else {
        panic!("a chunk")
    };
    assert!(!Arc::ptr_eq(c, &elided));
}

/// Trimming the log's spare capacity when an agent goes idle must not undo the vector's geometric
/// growth: trimmed to its length, the next turn's first append doubled it and the turn's end
/// trimmed it back, so every turn reallocated the whole log (a copy or a remap, O(history) a turn).
/// With a quarter of headroom kept, 300 turns reallocate it a few dozen times, and the slack an
/// idle agent keeps stays under half its length.
#[test]
fn eliding_chunks_does_not_reallocate_the_log_every_turn() {
    const TURNS: usize = 300;
    let mut h = Harness::new((0..TURNS).map(|_| text("ok")).collect());
    let mut capacity = 0;
    let mut n_changes = 0;
    for i in 0..TURNS {
        h.followup(&format!("turn {i}"));
        h.core.elide_durable_chunks();
        let session = h.core.session().expect("a live log");
        let (len, now) = (session.events().len(), session.capacity());
        assert!(
            now - len <= len / 2,
            "turn {i}: {len} events, capacity {now}"
        );
        if now != capacity {
            n_changes += 1;
            capacity = now;
        }
    }
    assert_eq!(h.turn_end_reasons(), vec![TurnEndReason::Completed; TURNS]);
    assert!(n_changes < 60, "{n_changes} reallocations in {TURNS} turns");
}

/// A fresh agent's first turn is given its room before its `turn/start` (`Session::reserve_for_turn`)
/// instead of growing the log 4 → 8 → 16 → 32 → 64 by pushing: a short text turn fits, and the
/// vector was allocated once.
#[test]
fn a_fresh_agents_first_turn_fits_the_room_made_for_it() {
    let mut h = Harness::new(vec![text("ok")]);
    h.followup("hello");
    assert_eq!(h.turn_end_reasons(), vec![TurnEndReason::Completed]);
    let session = h.core.session().expect("a live log");
    let len = session.events().len();
    let turn_start = session
        .events()
        .iter()
        .position(|e| e.kind() == "turn/start")
        .expect("a turn/start");
    let room = crate::session::log::FIRST_TURN_EVENTS as usize;
    assert!(len <= turn_start + room, "{len} events");
    assert_eq!(session.capacity(), turn_start + room, "{len} events");
}
