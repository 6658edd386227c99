//! The request half of a step: the call configuration (`request` hooks, `request/header` and
//! `request/context`), the durability checkpoint, the stream of an attempt, and what a failed attempt
//! becomes (`request_error` hooks, backoff, retry).
//!
//! The provider of a route is resolved here, once, from the runtime's registry: a route with no
//! provider fails the attempt with `NO_ADAPTER` without asking the runtime for anything, as the
//! original's runtime reports it (a single error finish chunk).

use std::mem;
use std::sync::Arc;

use crate::hooks::{HookError, Recovery};
use crate::llm::assembler::BlockAssembler;
use crate::llm::provider::{ModelInfo, Provider};
use crate::llm::retry::{RetryPolicy, js_number};
use crate::llm::types::{
    AdapterDefaults, FinishReason, History, LlmCallConfig, LlmFailure, LlmRequest, Message,
    MessageSource, RequestHeader, Role, StreamChunk, ToolSchema, codes,
};
use crate::session::event::{
    AssistantChunk, AssistantMessageEvent, EventData, HeaderReason, LlmRetry, LlmRetryStarted,
    RequestContext, RequestHeaderEvent, TurnEndReason,
};
use crate::session::log::EventDraft;
use crate::tools::schedule::PlannedCall;

use super::{AgentCore, Effect, HookCall, Phase, ResolvedProvider, Stage};

/// One request attempt: its stream, assembled as it arrives.
/// The room an attempt's chunk seqs get at its first chunk (256 bytes): a short reply's chunks.
const CHUNK_SEQS_ROOM: usize = 32;

#[derive(Debug)]
pub(super) struct Attempt {
    ticket: u64,
    /// The route name.
    provider: String,
    /// The serving provider's retry policy, offered to `request_error` hooks on failure.
    retry_policy: Option<RetryPolicy>,
    /// The model asked.
    model: String,
    assembler: BlockAssembler,
    /// Seqs of this attempt's `assistant/chunk` events.
    chunk_seqs: Vec<u64>,
    /// Bytes of text, reasoning and arguments received. Invariant: at most
    /// `Limits::assistant_bytes_max` are accepted; past it the attempt fails.
    n_bytes: usize,
    /// The finish chunk arrived (or the attempt was cut).
    finished: bool,
}

impl AgentCore {
    /// The `request` hooks chose the call configuration (or failed).
    pub fn on_request_configured(
        &mut self,
        ticket: u64,
        result: Result<LlmCallConfig, HookError>,
        now: i64,
    ) {
        if !self.awaiting(|s| matches!(s, Stage::Request { ticket: t, .. } if *t == ticket)) {
            return;
        }
        let Stage::Request { messages, .. } =
            mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("checked above")
        };
        match result {
            Ok(config) => self.configure_request(config, messages, now),
            Err(e) => self.fail_turn(e.to_failure(), now),
        }
    }

    /// Resolves the route of `config`, logs the header and context it implies, and dispatches the
    /// request once everything before it is durable.
    fn configure_request(&mut self, mut config: LlmCallConfig, messages: History, now: i64) {
        if config.provider.is_empty() || config.model.is_empty() {
            let failure = LlmFailure::new(
                codes::UNKNOWN,
                format!(
                    "agent {} has no provider/model: set the agent's provider and model or supply both via a request hook",
                    self.id
                ),
            );
            return self.fail_turn(failure, now);
        }
        let provider = self
            .wiring
            .as_ref()
            .and_then(|w| w.providers.get(&config.provider))
            .cloned();
        let model_info = provider
            .as_ref()
            .map(|p| p.model_info(&config.model))
            .unwrap_or_default();
        let mut defaults = AdapterDefaults::default();
        if config.max_tokens.is_none()
            && let Some(m) = model_info.default_max_tokens
        {
            config.max_tokens = Some(m);
            defaults.max_tokens = Some(true);
        }
        let tools = self.tools.schemas();
        self.log_request_config(&config, defaults, &tools, &model_info, now);
        let Some(provider) = provider else {
            return self.fail_no_adapter(&config, now);
        };
        let request = LlmRequest {
            config,
            system: self.config.system.clone().filter(|s| !s.is_empty()),
            tools,
            messages,
            session_id: Some(self.id.clone()),
            purpose: None,
        };
        // Checkpoint: everything before the request is durable before it is dispatched.
        let through = self.next_seq() - 1;
        if self.durable_seq > through {
            self.start_stream(provider, request);
        } else {
            self.run_mut().stage = Stage::Checkpoint {
                through,
                provider: ResolvedProvider(provider),
                request: Box::new(request),
            };
        }
    }

    /// Logs `request/header` when this loop instance has none yet or the header changed, and
    /// `request/context` when the route or its window changed.
    fn log_request_config(
        &mut self,
        config: &LlmCallConfig,
        defaults: AdapterDefaults,
        tools: &[ToolSchema],
        model_info: &ModelInfo,
        now: i64,
    ) {
        let header = RequestHeader {
            config: config.clone(),
            adapter_defaults: Some(defaults),
            system: self.config.system.clone(),
            tools: Some(tools.to_vec()),
        }
        .canonical();
        let session = self.session_ref();
        let reason = if !self.header_logged {
            Some(if session.request_header().is_some() {
                HeaderReason::Resume
            } else {
                HeaderReason::Initial
            })
        } else if session.request_header() != Some(&header) {
            Some(HeaderReason::Change)
        } else {
            None
        };
        let context = RequestContext {
            provider: config.provider.clone(),
            model: config.model.clone(),
            context_window: model_info.context_window,
        };
        let context_changed = session.request_context() != Some(&context);
        if let Some(reason) = reason {
            self.header_logged = true;
            self.append(
                EventDraft::log(EventData::RequestHeader(Box::new(RequestHeaderEvent {
                    header,
                    reason,
                }))),
                now,
            );
        }
        if context_changed {
            self.append(EventDraft::log(EventData::RequestContext(context)), now);
        }
    }

    /// No provider serves the route of `config`: the attempt fails with a single `NO_ADAPTER` error
    /// finish, logged as if a stream had sent it.
    fn fail_no_adapter(&mut self, config: &LlmCallConfig, now: i64) {
        let ticket = self.begin_attempt(&config.provider, &config.model, None);
        let failure = LlmFailure::new(
            codes::NO_ADAPTER,
            format!("no provider registered for route {:?}", config.provider),
        );
        self.on_chunk(
            ticket,
            StreamChunk::finish(FinishReason::Error { failure }),
            now,
        );
    }

    /// One chunk of attempt `ticket`.
    pub fn on_chunk(&mut self, ticket: u64, chunk: StreamChunk, now: i64) {
        if self.is_summariser(ticket) {
            return self.on_summary_chunk(chunk, now);
        }
        let Phase::Running(run) = &mut self.phase else {
            return;
        };
        let Stage::Streaming(attempt) = &mut run.stage else {
            return;
        };
        if attempt.ticket != ticket || attempt.finished {
            return;
        }
        attempt.n_bytes += match &chunk {
            StreamChunk::TextDelta { text, .. } | StreamChunk::ReasoningDelta { text, .. } => {
                text.len()
            }
            StreamChunk::ToolCallDelta {
                arguments_delta, ..
            } => arguments_delta.len(),
            _ => 0,
        };
        let bytes_max = self.config.limits.assistant_bytes_max;
        let chunk = if attempt.n_bytes > bytes_max && !chunk.is_finish() {
            // Cut the stream: the assembled message must fit in one event record.
            self.effects.push(Effect::CancelStream { ticket });
            StreamChunk::finish(FinishReason::Error {
                failure: LlmFailure::new(
                    codes::MALFORMED_RESPONSE,
                    format!("the response exceeded {bytes_max} bytes"),
                ),
            })
        } else {
            chunk
        };
        let Phase::Running(run) = &mut self.phase else {
            return;
        };
        let Stage::Streaming(attempt) = &mut run.stage else {
            return;
        };
        let is_finish = chunk.is_finish();
        attempt.assembler.push(&chunk);
        let (turn, step) = (run.turn, run.step);
        let seq = self.append(
            EventDraft::log(EventData::AssistantChunk(std::sync::Arc::new(
                AssistantChunk { turn, step, chunk },
            ))),
            now,
        );
        let Stage::Streaming(attempt) = &mut self.run_mut().stage else {
            unreachable!("still streaming")
        };
        if attempt.chunk_seqs.capacity() == 0 {
            // A short reply's seqs in one allocation rather than four doublings from four.
            attempt.chunk_seqs.reserve_exact(CHUNK_SEQS_ROOM);
        }
        attempt.chunk_seqs.push(seq);
        if is_finish {
            attempt.finished = true;
            self.complete_attempt(now);
        }
    }

    /// The stream of attempt `ticket` failed outside the provider's contract (its actor died): the
    /// attempt fails as if the stream had sent an `UNKNOWN` error finish.
    pub fn on_stream_failed(&mut self, ticket: u64, reason: &str, now: i64) {
        let failure = LlmFailure::new(codes::UNKNOWN, format!("the llm stream failed: {reason}"));
        let chunk = StreamChunk::finish(FinishReason::Error { failure });
        self.on_chunk(ticket, chunk, now);
    }

    /// Attempt `ticket`'s stream ended (after its finish chunk, or without one).
    pub fn on_stream_end(&mut self, ticket: u64, now: i64) {
        if self.is_summariser(ticket) {
            return self.on_summary_stream_end(now);
        }
        if self.awaiting(|s| matches!(s, Stage::Streaming(a) if a.ticket == ticket && !a.finished))
        {
            self.complete_attempt(now);
        }
    }

    /// The `request_error` hooks decided about a failed attempt.
    pub fn on_recovery(&mut self, ticket: u64, result: Result<Recovery, HookError>, now: i64) {
        if !self.awaiting(|s| matches!(s, Stage::Recovery { ticket: t, .. } if *t == ticket)) {
            return;
        }
        let Stage::Recovery {
            failure, provider, ..
        } = mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("checked above")
        };
        match result {
            Err(e) => self.fail_turn(e.to_failure(), now),
            Ok(Recovery::Delegate) => self.fail_turn(failure, now),
            Ok(Recovery::Retry) => self.start_attempt(now),
            Ok(Recovery::Backoff(retry)) => {
                let run = self.run_mut();
                let (turn, step) = (run.turn, run.step);
                self.append(
                    EventDraft::log(EventData::LlmRetry(Box::new(LlmRetry {
                        retry_id: retry.retry_id.clone(),
                        turn,
                        step,
                        provider,
                        mode: retry.mode.clone(),
                        policy_key: retry.policy_key.clone(),
                        retry: retry.retry,
                        max_retries: retry.max_retries,
                        delay_ms: js_number(retry.delay_ms),
                        failure,
                    }))),
                    now,
                );
                let ticket = self.ticket();
                let delay_ms = retry.delay_ms;
                self.run_mut().stage = Stage::Backoff { ticket, retry };
                self.effects.push(Effect::StartTimer { ticket, delay_ms });
            }
        }
    }

    /// A timer armed by `StartTimer` fired.
    pub fn on_timer(&mut self, ticket: u64, now: i64) {
        if !self.awaiting(|s| matches!(s, Stage::Backoff { ticket: t, .. } if *t == ticket)) {
            return;
        }
        let Stage::Backoff { retry, .. } =
            mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("checked above")
        };
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        self.append(
            EventDraft::log(EventData::LlmRetryStarted(LlmRetryStarted {
                retry_id: retry.retry_id,
                turn,
                step,
                retry: retry.retry,
            })),
            now,
        );
        self.start_attempt(now);
    }

    fn seed_config(&self) -> LlmCallConfig {
        let session = self.session_ref();
        let logged = session.request_header();
        if self.header_logged
            && let Some(h) = logged
        {
            // Later requests start from the header in force, minus what the provider defaulted, so a
            // route chosen by a hook persists and defaults re-materialize for the current route.
            let mut c = h.config.clone();
            if let Some(d) = &h.adapter_defaults {
                if d.reasoning_effort == Some(true) {
                    c.reasoning_effort = None;
                }
                if d.max_tokens == Some(true) {
                    c.max_tokens = None;
                }
            }
            return c;
        }
        let mut c = LlmCallConfig {
            provider: self.config.provider.clone(),
            model: self.config.model.clone(),
            reasoning_effort: self.config.reasoning_effort.clone(),
            temperature: self.config.temperature.clone(),
            max_tokens: self.config.max_tokens,
            stop: None,
        };
        if c.reasoning_effort.is_none()
            && let Some(h) = logged
            && h.config.provider == c.provider
            && h.config.model == c.model
            && h.adapter_defaults
                .as_ref()
                .is_none_or(|d| d.reasoning_effort != Some(true))
        {
            c.reasoning_effort = h.config.reasoning_effort.clone();
        }
        c
    }

    /// Starts a request attempt in the entered step: the `request` hooks shape its configuration.
    pub(super) fn start_attempt(&mut self, now: i64) {
        let messages = self.session_ref().history();
        let config = self.seed_config();
        let ticket = self.ticket();
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        run.stage = Stage::Request { ticket, messages };
        if self.hook_points().request {
            self.effects.push(Effect::RunHooks(HookCall::Request {
                ticket,
                turn,
                step,
                config,
            }));
        } else {
            self.on_request_configured(ticket, Ok(config), now);
        }
    }

    /// Enters the streaming stage of a new attempt; returns its ticket.
    fn begin_attempt(
        &mut self,
        provider: &str,
        model: &str,
        retry_policy: Option<RetryPolicy>,
    ) -> u64 {
        let ticket = self.ticket();
        self.run_mut().stage = Stage::Streaming(Box::new(Attempt {
            ticket,
            provider: provider.to_string(),
            retry_policy,
            model: model.to_string(),
            assembler: BlockAssembler::new(),
            chunk_seqs: Vec::new(),
            n_bytes: 0,
            finished: false,
        }));
        ticket
    }

    /// Opens the stream of a new attempt on `provider` (everything before it is durable).
    pub(super) fn start_stream(&mut self, provider: Arc<dyn Provider>, request: LlmRequest) {
        let provider_name = request.config.provider.clone();
        let ticket = self.begin_attempt(
            &provider_name,
            &request.config.model,
            provider.retry_policy(),
        );
        self.effects.push(Effect::StartStream {
            ticket,
            provider_name,
            provider: ResolvedProvider(provider),
            request,
        });
    }

    fn step_retries(&self) -> Vec<LlmRetry> {
        let mut out = Vec::new();
        for e in self.session_ref().events().iter().rev() {
            match &e.data {
                EventData::StepStart(_) => break,
                EventData::LlmRetry(r) => out.push((**r).clone()),
                _ => {}
            }
        }
        out.reverse();
        out
    }

    /// The attempt's stream finished: a failure goes to recovery; a message is logged and either
    /// closes the step or starts its tool calls.
    fn complete_attempt(&mut self, now: i64) {
        let Stage::Streaming(attempt) = mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("completing an attempt that is not streaming")
        };
        let finish = attempt.assembler.finish();
        if let Some(failure) = finish.failure() {
            // Overflow recovery (compaction) comes before the `request_error` hooks.
            if let Some((failure, provider, retry_policy)) = self.compact_on_overflow(
                failure.clone(),
                attempt.provider,
                attempt.retry_policy,
                now,
            ) {
                self.recover(failure, provider, retry_policy, now);
            }
            return;
        }
        let content = match attempt.assembler.blocks() {
            Ok(blocks) => blocks,
            Err(e) => return self.fail_turn(LlmFailure::new(codes::UNKNOWN, e.to_string()), now),
        };
        // A tool call needs an id to be answered by: a provider that streamed one without (a broken
        // or hostile server) gave a malformed response, not a call to run.
        if content.iter().any(
            |b| matches!(b, crate::llm::types::ContentBlock::ToolCall { id, .. } if id.is_empty()),
        ) {
            let failure = LlmFailure::new(
                codes::MALFORMED_RESPONSE,
                "the model's response has a tool call without an id",
            );
            return self.fail_turn(failure, now);
        }
        let mut source = MessageSource::model(&attempt.provider, &attempt.model);
        if let Some(state) = attempt.assembler.replay_state() {
            source = source.with("replayState", state);
        }
        let message = Arc::new(Message {
            id: self.mint_id(),
            role: Role::Assistant,
            content,
            source,
        });
        let calls: Vec<PlannedCall> = message
            .tool_calls()
            .map(|c| PlannedCall {
                call_id: c.id.to_string(),
                name: c.name.to_string(),
                arguments: c.arguments.to_string(),
            })
            .collect();
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        self.append(
            EventDraft::append(
                EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                    turn,
                    step,
                    message,
                    usage: attempt.assembler.usage().cloned(),
                    interrupted: None,
                })),
                Some(attempt.chunk_seqs),
            ),
            now,
        );
        if finish == FinishReason::MaxTokens {
            self.finish_step(Some(TurnEndReason::MaxTokens), now);
        } else if calls.is_empty() {
            self.finish_step(Some(TurnEndReason::Completed), now);
        } else {
            self.start_tools(calls, now);
        }
    }

    /// A failed attempt goes to the `request_error` hooks (or, without any, fails the turn).
    pub(super) fn recover(
        &mut self,
        failure: LlmFailure,
        provider: String,
        retry_policy: Option<RetryPolicy>,
        now: i64,
    ) {
        let ticket = self.ticket();
        let retries = self.step_retries();
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        run.stage = Stage::Recovery {
            ticket,
            failure: failure.clone(),
            provider: provider.clone(),
        };
        if !self.hook_points().request_error {
            return self.on_recovery(ticket, Ok(Recovery::Delegate), now);
        }
        self.effects.push(Effect::RunHooks(HookCall::RequestError {
            ticket,
            turn,
            step,
            provider,
            retry_policy,
            failure,
            retries,
        }));
    }

    /// The turn was aborted while attempt `attempt` streamed: close the stream and log what arrived
    /// as an interrupted message.
    pub(super) fn abort_attempt(&mut self, attempt: Attempt, now: i64) {
        if !attempt.finished {
            self.effects.push(Effect::CancelStream {
                ticket: attempt.ticket,
            });
        }
        let blocks = attempt.assembler.interrupted_blocks();
        if blocks.is_empty() {
            return;
        }
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        let message = Message {
            id: self.mint_id(),
            role: Role::Assistant,
            content: blocks,
            source: MessageSource::model(&attempt.provider, &attempt.model),
        };
        self.append(
            EventDraft::append(
                EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                    turn,
                    step,
                    message: Arc::new(message),
                    usage: attempt.assembler.usage().cloned(),
                    interrupted: Some(true),
                })),
                Some(attempt.chunk_seqs),
            ),
            now,
        );
    }
}
