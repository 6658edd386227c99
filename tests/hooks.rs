//! Hooks of every kind registered on a running agent: the composition rule of each hook point
//! (chaining order, first-wins), and what an `Err` and a panic of each does, checked against the exact
//! log and the order in which the hooks were called.

mod runtime_support;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dsh::hooks::{
    HookCtx, HookError, Hooks, PreExecute, PreStepDecision, PreStepHook, Recovery, RequestErrorCtx,
    RequestErrorHook, RequestHook, ToolHook, TurnStoppingAction, TurnStoppingHook,
};
use dsh::llm::script::ScriptEntry;
use dsh::llm::types::{ContentBlock, LlmCallConfig, LlmFailure, LlmRequest, Message};
use dsh::session::Event;
use dsh::session::event::{CancelCause, EventData, ToolErrorInfo, TurnEndReason};
use dsh::tools::{ToolInvocation, ToolOutput};
use dsh_actors::HostConfig;
use runtime_support::*;

/// The order in which hooks were called, as `"<hook> <what it saw>"` lines.
#[derive(Clone, Default)]
struct Trace(Arc<Mutex<Vec<String>>>);

impl Trace {
    fn push(&self, line: String) {
        self.0.lock().expect("trace lock").push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().expect("trace lock").clone()
    }
}

/// What a test hook does once it has recorded its call.
#[derive(Clone)]
enum Act<T> {
    /// Answer this.
    Answer(T),
    /// Fail with this error.
    Fail(HookError),
    /// Panic with this message.
    Panic(&'static str),
}

impl<T: Clone> Act<T> {
    fn run(&self) -> Result<T, HookError> {
        match self {
            Act::Answer(value) => Ok(value.clone()),
            Act::Fail(e) => Err(e.clone()),
            Act::Panic(message) => panic!("{message}"),
        }
    }
}

fn texts(messages: &[Arc<Message>]) -> String {
    messages
        .iter()
        .map(|m| m.text())
        .collect::<Vec<_>>()
        .join(",")
}

/// A `pre_step` hook: records the batch it saw, then appends `adds` (or acts otherwise).
struct PreStep {
    name: &'static str,
    trace: Trace,
    act: Act<Option<&'static str>>,
}

#[async_trait]
impl PreStepHook for PreStep {
    async fn pre_step(
        &self,
        _ctx: &HookCtx,
        mut messages: Vec<Arc<Message>>,
    ) -> Result<PreStepDecision, HookError> {
        self.trace
            .push(format!("{} saw [{}]", self.name, texts(&messages)));
        match self.act.run()? {
            Some(text) => {
                messages.push(Arc::new(user(text)));
                Ok(PreStepDecision::Enter(messages))
            }
            None => Ok(PreStepDecision::Reject),
        }
    }
}

/// A `request` hook: records the stop sequences it saw, then appends its name to them.
struct Request {
    name: &'static str,
    trace: Trace,
    act: Act<()>,
}

#[async_trait]
impl RequestHook for Request {
    async fn request(
        &self,
        _ctx: &HookCtx,
        mut config: LlmCallConfig,
    ) -> Result<LlmCallConfig, HookError> {
        let stop = config.stop.clone().unwrap_or_default();
        self.trace
            .push(format!("{} saw [{}]", self.name, stop.join(",")));
        self.act.run()?;
        config.stop = Some(stop.into_iter().chain([self.name.to_string()]).collect());
        Ok(config)
    }
}

/// A `request_error` hook: records the failure code it saw, then answers.
struct RequestError {
    name: &'static str,
    trace: Trace,
    act: Act<Recovery>,
}

#[async_trait]
impl RequestErrorHook for RequestError {
    async fn request_error(&self, ctx: &RequestErrorCtx) -> Result<Recovery, HookError> {
        self.trace
            .push(format!("{} saw {}", self.name, ctx.failure.code));
        self.act.run()
    }
}

/// A `turn_stopping` hook: records its call, then answers its action the first time and nothing
/// after (so a steered turn stops the next time).
struct TurnStopping {
    name: &'static str,
    trace: Trace,
    act: Mutex<Option<Act<TurnStoppingAction>>>,
}

#[async_trait]
impl TurnStoppingHook for TurnStopping {
    async fn turn_stopping(&self, ctx: &HookCtx) -> Result<TurnStoppingAction, HookError> {
        self.trace
            .push(format!("{} at step {}", self.name, ctx.step));
        let act = self.act.lock().expect("act lock").take();
        match act {
            Some(act) => act.run(),
            None => Ok(TurnStoppingAction::default()),
        }
    }
}

/// A tool hook: `pre_execute` records the call and answers `pre`; `post_execute` records the output
/// text it saw and appends its name (or acts otherwise).
struct Tool {
    name: &'static str,
    trace: Trace,
    pre: Act<PreExecute>,
    post: Act<()>,
}

impl Tool {
    fn new(name: &'static str, trace: &Trace) -> Tool {
        Tool {
            name,
            trace: trace.clone(),
            pre: Act::Answer(PreExecute::Allow),
            post: Act::Answer(()),
        }
    }
}

fn output_text(output: &ToolOutput) -> String {
    output
        .content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

#[async_trait]
impl ToolHook for Tool {
    async fn pre_execute(
        &self,
        _ctx: &HookCtx,
        call: &ToolInvocation,
    ) -> Result<PreExecute, HookError> {
        self.trace
            .push(format!("{} pre {}", self.name, call.call_id));
        self.pre.run()
    }

    async fn post_execute(
        &self,
        _ctx: &HookCtx,
        call: &ToolInvocation,
        mut output: ToolOutput,
    ) -> Result<ToolOutput, HookError> {
        let text = output_text(&output);
        self.trace
            .push(format!("{} post {} saw {text}", self.name, call.call_id));
        self.post.run()?;
        output.content = vec![ContentBlock::text(format!("{text} +{}", self.name))];
        Ok(output)
    }
}

async fn world(entries: Vec<ScriptEntry>, hooks: Hooks) -> World {
    World::build(
        entries,
        vec![TestTool::parallel("echo")],
        hooks,
        HostConfig::default(),
    )
    .await
}

/// Runs one prompt to idle and returns the log.
async fn run(w: &World, prompt: &str) -> Vec<Event> {
    w.agent.followup(user(prompt)).await.expect("accepted");
    w.agent.when_idle().await.expect("idle");
    let log = w.log().await;
    assert_valid(&log);
    log
}

/// What one prompt did on a fresh agent: its log and the requests the model was sent.
struct Ran {
    log: Vec<Event>,
    requests: Vec<LlmRequest>,
}

/// Runs one prompt to idle on a fresh agent with these hooks, then shuts its host down.
async fn run_once(entries: Vec<ScriptEntry>, hooks: Hooks, prompt: &str) -> Ran {
    let w = world(entries, hooks).await;
    let log = run(&w, prompt).await;
    let requests = w.script.requests();
    w.host.shutdown().await;
    Ran { log, requests }
}

/// A hook that fails with `message` and one that panics with `panic`, each with the failure its turn
/// ends with.
fn failing_and_panicking<T>(
    message: &'static str,
    panic: &'static str,
) -> [(Act<T>, LlmFailure); 2] {
    [
        (
            Act::Fail(HookError::Message(message.into())),
            LlmFailure::new("UNKNOWN", message),
        ),
        (
            Act::Panic(panic),
            LlmFailure::new("UNKNOWN", format!("hook panicked: {panic}")),
        ),
    ]
}

/// The skeleton of a turn whose step ends before any request is sent.
const NO_REQUEST: [&str; 5] = [
    "turn/start",
    "step/start",
    "user/message",
    "step/end",
    "turn/end",
];

fn failure_of(log: &[Event]) -> LlmFailure {
    match reasons(log).as_slice() {
        [TurnEndReason::Error { error }] => error.clone(),
        other => panic!("expected one turn ending error, got {other:?}"),
    }
}

/// The one tool result of the log: its text, whether it is an error, and its failure identity.
fn tool_result(log: &[Event]) -> (String, bool, Option<ToolErrorInfo>) {
    let results: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.data {
            EventData::ToolResult(r) => Some(r),
            _ => None,
        })
        .collect();
    let [r] = results.as_slice() else {
        panic!("expected one tool result, got {}", results.len());
    };
    let is_error = matches!(
        r.message.content.first(),
        Some(ContentBlock::ToolResult {
            is_error: Some(true),
            ..
        })
    );
    (tool_result_text(&r.message), is_error, r.error.clone())
}

fn lines(want: &[&str]) -> Vec<String> {
    want.iter().map(|s| (*s).to_string()).collect()
}

// --- pre_step ---------------------------------------------------------------------------------------

fn pre_step(name: &'static str, trace: &Trace, act: Act<Option<&'static str>>) -> Arc<PreStep> {
    Arc::new(PreStep {
        name,
        trace: trace.clone(),
        act,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_step_hooks_chain_in_order_each_seeing_the_batch_the_previous_entered() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.pre_step = vec![
        pre_step("A", &trace, Act::Answer(Some("from A"))),
        pre_step("B", &trace, Act::Answer(Some("from B"))),
    ];
    let Ran { log, .. } = run_once(vec![ScriptEntry::text("ok")], hooks, "hi").await;
    assert_kinds(
        &skeleton(&log),
        &[
            "turn/start",
            "step/start",
            "user/message",
            "user/message",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end",
        ],
    );
    assert_eq!(user_texts(&log), ["hi", "from A", "from B"]);
    assert_eq!(trace.lines(), lines(&["A saw [hi]", "B saw [hi,from A]"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_pre_step_reject_wins_and_later_pre_step_hooks_do_not_run() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.pre_step = vec![
        pre_step("A", &trace, Act::Answer(None)),
        pre_step("B", &trace, Act::Answer(Some("from B"))),
    ];
    let Ran { log, requests } = run_once(vec![ScriptEntry::text("ok")], hooks, "hi").await;
    assert_kinds(&skeleton(&log), &["turn/start", "turn/end"]);
    assert_eq!(reasons(&log), [TurnEndReason::Blocked]);
    assert_eq!(trace.lines(), lines(&["A saw [hi]"]));
    assert!(requests.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_panicking_pre_step_hook_ends_the_turn_error_and_later_hooks_do_not_run() {
    for (act, want) in failing_and_panicking("no step", "pre_step exploded") {
        let trace = Trace::default();
        let mut hooks = Hooks::new();
        hooks.pre_step = vec![
            pre_step("A", &trace, act),
            pre_step("B", &trace, Act::Answer(Some("from B"))),
        ];
        let ran = run_once(vec![ScriptEntry::text("ok")], hooks, "hi").await;
        assert_kinds(&skeleton(&ran.log), &["turn/start", "turn/end"]);
        assert_eq!(failure_of(&ran.log), want);
        assert_eq!(trace.lines(), lines(&["A saw [hi]"]));
        assert!(ran.requests.is_empty());
    }
}

// --- request ----------------------------------------------------------------------------------------

fn request(name: &'static str, trace: &Trace, act: Act<()>) -> Arc<Request> {
    Arc::new(Request {
        name,
        trace: trace.clone(),
        act,
    })
}

fn request_error(name: &'static str, trace: &Trace, act: Act<Recovery>) -> Arc<RequestError> {
    Arc::new(RequestError {
        name,
        trace: trace.clone(),
        act,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_hooks_chain_in_order_and_the_last_configuration_is_sent() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.request = vec![
        request("A", &trace, Act::Answer(())),
        request("B", &trace, Act::Answer(())),
    ];
    let Ran { log, requests } = run_once(vec![ScriptEntry::text("ok")], hooks, "hi").await;
    assert_kinds(&skeleton(&log), &TEXT_TURN);
    assert_eq!(trace.lines(), lines(&["A saw []", "B saw [A]"]));
    let sent = requests;
    assert_eq!(sent[0].config.stop, Some(vec!["A".into(), "B".into()]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_panicking_request_hook_ends_the_turn_error_without_asking_request_error() {
    for (act, want) in failing_and_panicking("no request", "request exploded") {
        let trace = Trace::default();
        let mut hooks = Hooks::new();
        hooks.request = vec![
            request("A", &trace, act),
            request("B", &trace, Act::Answer(())),
        ];
        hooks.request_error = vec![request_error("E", &trace, Act::Answer(Recovery::Retry))];
        let ran = run_once(vec![ScriptEntry::text("ok")], hooks, "hi").await;
        assert_kinds(&skeleton(&ran.log), &NO_REQUEST);
        assert_eq!(failure_of(&ran.log), want);
        assert_eq!(trace.lines(), lines(&["A saw []"]));
        assert!(ran.requests.is_empty());
    }
}

// --- request_error ----------------------------------------------------------------------------------

/// A failed attempt, then a good one.
fn failing_then_ok() -> Vec<ScriptEntry> {
    vec![
        ScriptEntry::error("RATE_LIMITED", "slow down"),
        ScriptEntry::text("ok"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_error_answer_that_is_not_delegate_wins() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.request_error = vec![
        request_error("A", &trace, Act::Answer(Recovery::Delegate)),
        request_error("B", &trace, Act::Answer(Recovery::Retry)),
        request_error("C", &trace, Act::Answer(Recovery::Delegate)),
    ];
    let Ran { log, requests } = run_once(failing_then_ok(), hooks, "hi").await;
    // The failed attempt leaves only its chunk; the retry is a second attempt in the same step.
    assert_kinds(&skeleton(&log), &TEXT_TURN);
    assert_eq!(reasons(&log), [TurnEndReason::Completed]);
    assert_eq!(
        trace.lines(),
        lines(&["A saw RATE_LIMITED", "B saw RATE_LIMITED"])
    );
    assert_eq!(requests.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_every_request_error_hook_delegates_the_turn_ends_with_the_failure() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.request_error = vec![
        request_error("A", &trace, Act::Answer(Recovery::Delegate)),
        request_error("B", &trace, Act::Answer(Recovery::Delegate)),
    ];
    let Ran { log, .. } = run_once(failing_then_ok(), hooks, "hi").await;
    assert_eq!(
        failure_of(&log),
        LlmFailure::new("RATE_LIMITED", "slow down")
    );
    assert_eq!(
        trace.lines(),
        lines(&["A saw RATE_LIMITED", "B saw RATE_LIMITED"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_panicking_request_error_hook_ends_the_turn_with_its_failure() {
    let cases = [
        (
            Act::Fail(HookError::Failure(LlmFailure::new("POLICY", "no retry"))),
            LlmFailure::new("POLICY", "no retry"),
        ),
        (
            Act::Panic("request_error exploded"),
            LlmFailure::new("UNKNOWN", "hook panicked: request_error exploded"),
        ),
    ];
    for (act, want) in cases {
        let trace = Trace::default();
        let mut hooks = Hooks::new();
        hooks.request_error = vec![
            request_error("A", &trace, act),
            request_error("B", &trace, Act::Answer(Recovery::Retry)),
        ];
        let ran = run_once(failing_then_ok(), hooks, "hi").await;
        assert_kinds(&skeleton(&ran.log), &NO_REQUEST);
        assert_eq!(failure_of(&ran.log), want);
        assert_eq!(trace.lines(), lines(&["A saw RATE_LIMITED"]));
        assert_eq!(ran.requests.len(), 1);
    }
}

// --- tool hooks -------------------------------------------------------------------------------------

/// One call of `echo` (which answers `echo: ping`), then a closing text.
fn one_call() -> Vec<ScriptEntry> {
    vec![
        ScriptEntry::tool_calls([("c1", "echo", r#"{"text":"ping"}"#)]),
        ScriptEntry::text("done"),
    ]
}

fn hook_failed(message: &str) -> (String, bool, Option<ToolErrorInfo>) {
    (
        format!("Error: tool hook failed: {message}"),
        true,
        Some(ToolErrorInfo {
            name: "ToolHookError".into(),
            code: "TOOL_HOOK_FAILED".into(),
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_execute_hooks_run_in_order_and_post_execute_hooks_chain_the_output() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.tool = vec![
        Arc::new(Tool::new("A", &trace)),
        Arc::new(Tool::new("B", &trace)),
    ];
    let Ran { log, .. } = run_once(one_call(), hooks, "go").await;
    assert_kinds(&skeleton(&log), &TOOL_TURN);
    assert_eq!(tool_result(&log), ("echo: ping +A +B".into(), false, None));
    assert_eq!(
        trace.lines(),
        lines(&[
            "A pre c1",
            "B pre c1",
            "A post c1 saw echo: ping",
            "B post c1 saw echo: ping +A",
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_pre_execute_deny_wins_and_the_body_never_runs() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.tool = vec![
        Arc::new(Tool::new("A", &trace)),
        Arc::new(Tool {
            pre: Act::Answer(PreExecute::Deny {
                reason: "not now".into(),
            }),
            ..Tool::new("B", &trace)
        }),
        Arc::new(Tool {
            pre: Act::Answer(PreExecute::Deny {
                reason: "never".into(),
            }),
            ..Tool::new("C", &trace)
        }),
    ];
    let Ran { log, .. } = run_once(one_call(), hooks, "go").await;
    assert_kinds(&skeleton(&log), &TOOL_TURN);
    // A denied call's error result still goes through post_execute, like any result.
    assert_eq!(
        tool_result(&log),
        ("Error: not now +A +B +C".into(), true, None)
    );
    assert_eq!(
        trace.lines(),
        lines(&[
            "A pre c1",
            "B pre c1",
            "A post c1 saw Error: not now",
            "B post c1 saw Error: not now +A",
            "C post c1 saw Error: not now +A +B",
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_panicking_pre_execute_hook_gives_the_call_an_error_result_and_the_body_never_runs()
 {
    for (act, want) in failing_and_panicking("no tools today", "pre_execute exploded") {
        let trace = Trace::default();
        let mut hooks = Hooks::new();
        hooks.tool = vec![
            Arc::new(Tool {
                pre: act,
                ..Tool::new("A", &trace)
            }),
            Arc::new(Tool::new("B", &trace)),
        ];
        let ran = run_once(one_call(), hooks, "go").await;
        assert_kinds(&skeleton(&ran.log), &TOOL_TURN);
        assert_eq!(tool_result(&ran.log), hook_failed(&want.message));
        // The failed result is final: no post_execute runs on it.
        assert_eq!(trace.lines(), lines(&["A pre c1"]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_post_execute_hook_makes_the_call_an_error_result() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.tool = vec![
        Arc::new(Tool {
            post: Act::Fail(HookError::Message("output refused".into())),
            ..Tool::new("A", &trace)
        }),
        Arc::new(Tool::new("B", &trace)),
    ];
    let Ran { log, .. } = run_once(one_call(), hooks, "go").await;
    assert_kinds(&skeleton(&log), &TOOL_TURN);
    assert_eq!(tool_result(&log), hook_failed("output refused"));
    assert_eq!(
        trace.lines(),
        lines(&["A pre c1", "B pre c1", "A post c1 saw echo: ping"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_post_execute_hook_makes_the_call_an_error_result() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.tool = vec![
        Arc::new(Tool::new("A", &trace)),
        Arc::new(Tool {
            post: Act::Panic("post_execute exploded"),
            ..Tool::new("B", &trace)
        }),
    ];
    let Ran { log, .. } = run_once(one_call(), hooks, "go").await;
    assert_kinds(&skeleton(&log), &TOOL_TURN);
    // Not the un-hooked `echo: ping`: the panic is the call's result.
    assert_eq!(
        tool_result(&log),
        hook_failed("hook panicked: post_execute exploded")
    );
    assert_eq!(
        trace.lines(),
        lines(&[
            "A pre c1",
            "B pre c1",
            "A post c1 saw echo: ping",
            "B post c1 saw echo: ping +A",
        ])
    );
}

// --- turn_stopping ----------------------------------------------------------------------------------

fn turn_stopping(
    name: &'static str,
    trace: &Trace,
    act: Act<TurnStoppingAction>,
) -> Arc<TurnStopping> {
    Arc::new(TurnStopping {
        name,
        trace: trace.clone(),
        act: Mutex::new(Some(act)),
    })
}

fn steer(text: &str) -> TurnStoppingAction {
    TurnStoppingAction {
        steer: vec![user(text)],
        ..TurnStoppingAction::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_turn_stopping_hook_runs_and_their_steers_concatenate_in_order() {
    let trace = Trace::default();
    let mut hooks = Hooks::new();
    hooks.turn_stopping = vec![
        turn_stopping("A", &trace, Act::Answer(steer("more from A"))),
        turn_stopping("B", &trace, Act::Answer(steer("more from B"))),
    ];
    let Ran { log, .. } = run_once(
        vec![ScriptEntry::text("one"), ScriptEntry::text("two")],
        hooks,
        "hi",
    )
    .await;
    assert_kinds(
        &skeleton(&log),
        &[
            "turn/start",
            "step/start",
            "user/message",
            "assistant/message",
            "step/end",
            "step/start",
            "user/message",
            "user/message",
            "assistant/message",
            "step/end",
            "turn/end",
        ],
    );
    assert_eq!(user_texts(&log), ["hi", "more from A", "more from B"]);
    assert_eq!(
        trace.lines(),
        lines(&["A at step 1", "B at step 1", "A at step 2", "B at step 2"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_turn_stopping_cancel_wins() {
    let trace = Trace::default();
    let cancel = |reason: &str| TurnStoppingAction {
        cancel: Some(CancelCause::Hook {
            reason: reason.into(),
        }),
        ..TurnStoppingAction::default()
    };
    let mut hooks = Hooks::new();
    hooks.turn_stopping = vec![
        turn_stopping("A", &trace, Act::Answer(TurnStoppingAction::default())),
        turn_stopping("B", &trace, Act::Answer(cancel("first"))),
        turn_stopping("C", &trace, Act::Answer(cancel("second"))),
    ];
    let Ran { log, .. } = run_once(vec![ScriptEntry::text("one")], hooks, "hi").await;
    assert_kinds(&skeleton(&log), &TEXT_TURN);
    assert_eq!(
        reasons(&log),
        [TurnEndReason::Aborted {
            reason: CancelCause::Hook {
                reason: "first".into()
            }
        }]
    );
    assert_eq!(
        trace.lines(),
        lines(&["A at step 1", "B at step 1", "C at step 1"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_or_panicking_turn_stopping_hook_ends_the_turn_error_and_later_hooks_do_not_run()
{
    for (act, want) in failing_and_panicking("cannot stop", "turn_stopping exploded") {
        let trace = Trace::default();
        let mut hooks = Hooks::new();
        hooks.turn_stopping = vec![
            turn_stopping("A", &trace, act),
            turn_stopping("B", &trace, Act::Answer(steer("more from B"))),
        ];
        let ran = run_once(vec![ScriptEntry::text("one")], hooks, "hi").await;
        assert_kinds(&skeleton(&ran.log), &TEXT_TURN);
        assert_eq!(failure_of(&ran.log), want);
        assert_eq!(trace.lines(), lines(&["A at step 1"]));
    }
}
