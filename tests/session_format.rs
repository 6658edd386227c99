//! The session format end to end: logs shaped the way the runtime writes them, their repair, their
//! JSON-lines export and import, damage to the files, and the original harness's own logs.
//!
//! - `generate` builds random *valid* logs from a tape of random numbers, following the event grammar
//!   of `reference/session-llm.md` §1.7: turns and steps, user messages, inbox splices, request
//!   headers, failed attempts with retries, streamed chunks, assistant messages citing them, tool
//!   calls and results in model order, aborts and interrupted messages, compaction (`user/message`
//!   replacements) and tool-result pruning (content-only `tool/result` rewrites). Every event goes
//!   through `Session::append`, so a generator bug or an append bug fails the test at once.
//! - The properties port `reference/session-llm.md` §9.9 and the properties of the brief: every prefix
//!   repairs to a valid log, every event round-trips byte for byte, derived history equals a
//!   from-scratch projection after every append, log-only events never change history in any
//!   interleaving, and `export`/`import` round-trip.
//! - Damage (STYLE §5): a cut record or appended garbage is a reported torn tail and the rest loads; a
//!   damaged byte before the last `turn/end` is an error or leaves every event in place, never a
//!   silently shorter log.
//! - The corpus: `tests/fixtures/dsh-logs/*.jsonl` (124 logs written by the original, copied from
//!   `/work/shared/fixtures`) are each imported twice, as written and with the snapshot placeholders
//!   filled, and every outcome is compared with `tests/fixtures/dsh-logs.expected`. After a deliberate
//!   change, regenerate that file with `DSH_BLESS=1 cargo test --test session_format corpus` and review
//!   the diff.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dsh::ids::{MessageId, SessionId};
use dsh::limits::Limits;
use dsh::llm::types::{
    BlockType, ContentBlock, FinishReason, LlmCallConfig, LlmFailure, Message, MessageSource,
    RequestHeader, Role, StreamChunk, TokenUsage, ToolSchema,
};
use dsh::session::event::{
    AssistantChunk, AssistantMessageEvent, CancelCause, Event, EventData, HeaderReason,
    InboxSpliced, InboxTarget, LlmRetry, LlmRetryStarted, RequestContext, RequestHeaderEvent,
    SessionHeader, StepRef, SurfaceOp, ToolCallEvent, ToolErrorInfo, ToolResultEvent, TurnEnd,
    TurnEndReason, TurnStart, is_surface_type,
};
use dsh::session::invariant;
use dsh::session::log::{EventDraft, Session, project};
use dsh::session::repair::interrupted_turn_closers;
use dsh::session::store::jsonl::{
    ImportError, ImportOptions, Imported, export, export_packed, import, import_with,
};
use dsh::session::surface::fold_surface;
use proptest::prelude::*;
use serde_json::json;

fn sid() -> SessionId {
    SessionId::new("s-prop").expect("a valid id")
}

fn header() -> SessionHeader {
    let mut h = SessionHeader::new(sid(), 1_785_000_000_000);
    h.cwd = Some("/work/project".into());
    h
}

// ---------------------------------------------------------------------------------------------------
// The generator
// ---------------------------------------------------------------------------------------------------

/// Builds a valid log from a tape of random numbers, the way the runtime writes one.
struct Gen<'t> {
    tape: &'t [u32],
    pos: usize,
    session: Session,
    time: i64,
    turn: u64,
    n_ids: u64,
    header_logged: bool,
}

impl Gen<'_> {
    /// The next random choice in `0..n` (0 once the tape is used up, which closes what is open).
    fn pick(&mut self, n: u32) -> u32 {
        let v = self.tape.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        v % n.max(1)
    }

    fn exhausted(&self) -> bool {
        self.pos >= self.tape.len()
    }

    fn id(&mut self, prefix: &str) -> String {
        self.n_ids += 1;
        format!("{prefix}-{}", self.n_ids)
    }

    /// Appends a draft; time usually moves on, sometimes steps back (clocks do).
    fn push(&mut self, draft: EventDraft) -> u64 {
        match self.pick(16) {
            0 => self.time -= 3,
            n => self.time += i64::from(n),
        }
        let kind = draft.data.kind().to_string();
        match self.session.append(draft, self.time) {
            Ok(e) => e.seq,
            Err(e) => panic!("the generator wrote an invalid {kind}: {e}"),
        }
    }

    fn log(&mut self, data: EventData) -> u64 {
        self.push(EventDraft::log(data))
    }

    fn user_message(&mut self, source: MessageSource) -> Arc<Message> {
        let id = self.id("m");
        let text = format!("text of {id}");
        Arc::new(Message {
            id: MessageId::new(&id).expect("a valid id"),
            role: Role::User,
            content: vec![ContentBlock::text(text)],
            source,
        })
    }

    fn splice(&mut self, target: InboxTarget, removed: Option<u64>, inserted: Vec<Arc<Message>>) {
        self.log(EventData::InboxSpliced(InboxSpliced {
            target,
            start: 0,
            removed_count: removed,
            inserted,
            outcome: None,
        }));
    }

    fn chunk(&mut self, step: u64, chunk: StreamChunk) -> u64 {
        self.log(EventData::AssistantChunk(std::sync::Arc::new(
            AssistantChunk {
                turn: self.turn,
                step,
                chunk,
            },
        )))
    }

    fn run(mut self) -> Vec<Event> {
        while !self.exhausted() {
            match self.pick(9) {
                0 => {
                    // Idle context appended between turns.
                    let m = self.user_message(MessageSource::plugin("@dsh/context"));
                    self.push(EventDraft::append(EventData::UserMessage(m), None));
                }
                1 => {
                    let m = self.user_message(MessageSource::user());
                    self.splice(InboxTarget::NextTurn, None, vec![m]);
                }
                2 => {
                    let title = format!("title {}", self.pick(100));
                    self.log(EventData::Other {
                        kind: "session/title".into(),
                        data: json!({"title": title, "source": {"kind": "fallback"}}),
                    });
                }
                3 => self.compaction(),
                _ => self.turn(),
            }
        }
        self.session.into_events()
    }

    /// Replaces a range of the current surface with a summary, citing every shadowed node.
    fn compaction(&mut self) {
        let nodes = self.session.surface().nodes.clone();
        if nodes.is_empty() {
            return;
        }
        let start_idx = self.pick(nodes.len() as u32) as usize;
        let end_idx = start_idx + self.pick((nodes.len() - start_idx) as u32) as usize;
        let shadowed = nodes[start_idx..=end_idx].to_vec();
        let summary = self.user_message(MessageSource::plugin("@dsh/compaction"));
        self.push(EventDraft {
            data: EventData::UserMessage(summary),
            source_event_seqs: Some(shadowed),
            surface_op: Some(SurfaceOp::Replace {
                start: nodes[start_idx],
                end: nodes[end_idx],
            }),
        });
    }

    fn turn(&mut self) {
        self.turn += 1;
        let turn = self.turn;
        self.log(EventData::TurnStart(TurnStart { turn }));
        if self.pick(10) == 0 {
            let reason = if self.pick(2) == 0 {
                TurnEndReason::Blocked
            } else {
                TurnEndReason::Completed
            };
            self.log(EventData::TurnEnd(Box::new(TurnEnd { turn, reason })));
            return;
        }
        let mut step = 0;
        let reason = loop {
            step += 1;
            match self.step(step) {
                StepOutcome::Continue if step < 4 => {}
                StepOutcome::Continue => break TurnEndReason::Completed,
                StepOutcome::End(reason) => break reason,
            }
        };
        self.log(EventData::TurnEnd(Box::new(TurnEnd { turn, reason })));
    }

    fn step(&mut self, step: u64) -> StepOutcome {
        let turn = self.turn;
        if self.pick(3) == 0 {
            self.splice(InboxTarget::NextStep, Some(1), vec![]);
        }
        self.log(EventData::StepStart(StepRef { turn, step }));
        for _ in 0..self.pick(3) {
            let m = self.user_message(MessageSource::user());
            self.push(EventDraft::append(EventData::UserMessage(m), None));
        }
        if !self.header_logged || self.pick(5) == 0 {
            let reason = match (self.header_logged, self.pick(2)) {
                (false, _) => HeaderReason::Initial,
                (true, 0) => HeaderReason::Change,
                (true, _) => HeaderReason::Resume,
            };
            self.header_logged = true;
            let tools = (0..self.pick(3))
                .map(|i| ToolSchema {
                    name: format!("tool{i}"),
                    description: "a tool".into(),
                    parameters: json!({"type": "object", "properties": {}}),
                })
                .collect();
            let header = RequestHeader {
                config: LlmCallConfig {
                    provider: "sim".into(),
                    model: format!("model-{}", self.pick(2)),
                    ..LlmCallConfig::default()
                },
                adapter_defaults: None,
                system: Some("be brief".into()),
                tools: Some(tools),
            };
            self.log(EventData::RequestHeader(Box::new(RequestHeaderEvent {
                header,
                reason,
            })));
            if self.pick(2) == 0 {
                self.log(EventData::RequestContext(RequestContext {
                    provider: "sim".into(),
                    model: "model-0".into(),
                    context_window: Some(128_000),
                }));
            }
        }
        if self.pick(5) == 0 {
            self.log(EventData::Other {
                kind: "todo/write".into(),
                data: json!({"todos": [{"content": "x", "status": "pending"}]}),
            });
        }
        // Failed attempts: chunks ending in an error finish, then a scheduled retry.
        for retry in 1..=u64::from(self.pick(4) == 0) * u64::from(1 + self.pick(2)) {
            self.chunk(
                step,
                StreamChunk::BlockStart {
                    index: 0,
                    block_type: BlockType::Text,
                },
            );
            self.chunk(
                step,
                StreamChunk::TextDelta {
                    index: 0,
                    text: "par".into(),
                },
            );
            let failure = LlmFailure::new("RATE_LIMIT", "slow down");
            self.chunk(
                step,
                StreamChunk::finish(FinishReason::Error {
                    failure: failure.clone(),
                }),
            );
            let retry_id = self.id("retry");
            self.log(EventData::LlmRetry(Box::new(LlmRetry {
                retry_id: retry_id.clone(),
                turn,
                step,
                provider: "sim".into(),
                mode: "normal".into(),
                policy_key: "default".into(),
                retry,
                max_retries: Some(3),
                delay_ms: 250.into(),
                failure,
            })));
            self.log(EventData::LlmRetryStarted(LlmRetryStarted {
                retry_id,
                turn,
                step,
                retry,
            }));
        }
        // A cancellation mid-stream keeps the visible prefix as an interrupted message.
        if self.pick(12) == 0 {
            let mut seqs = vec![self.chunk(
                step,
                StreamChunk::BlockStart {
                    index: 0,
                    block_type: BlockType::Text,
                },
            )];
            let n = self.pick(3);
            for _ in 0..n {
                seqs.push(self.chunk(
                    step,
                    StreamChunk::TextDelta {
                        index: 0,
                        text: "wor".into(),
                    },
                ));
            }
            if n > 0 {
                self.assistant(
                    step,
                    vec![ContentBlock::text("wor".repeat(n as usize))],
                    seqs,
                    None,
                    true,
                );
            }
            self.log(EventData::StepEnd(StepRef { turn, step }));
            return StepOutcome::End(TurnEndReason::Aborted {
                reason: CancelCause::User,
            });
        }
        // The successful attempt.
        let mut seqs = Vec::new();
        let mut content = Vec::new();
        let mut index = 0;
        if self.pick(3) == 0 {
            seqs.push(self.chunk(
                step,
                StreamChunk::BlockStart {
                    index,
                    block_type: BlockType::Reasoning,
                },
            ));
            seqs.push(self.chunk(
                step,
                StreamChunk::ReasoningDelta {
                    index,
                    text: "hmm".into(),
                },
            ));
            seqs.push(self.chunk(
                step,
                StreamChunk::BlockEnd {
                    index,
                    block: ContentBlock::Reasoning { text: "hmm".into() },
                },
            ));
            content.push(ContentBlock::Reasoning { text: "hmm".into() });
            index += 1;
        }
        if self.pick(4) != 0 {
            seqs.push(self.chunk(
                step,
                StreamChunk::BlockStart {
                    index,
                    block_type: BlockType::Text,
                },
            ));
            let n = 1 + self.pick(5);
            let mut text = String::new();
            for i in 0..n {
                let delta = format!("t{i} ");
                text.push_str(&delta);
                seqs.push(self.chunk(step, StreamChunk::TextDelta { index, text: delta }));
            }
            seqs.push(self.chunk(
                step,
                StreamChunk::BlockEnd {
                    index,
                    block: ContentBlock::text(text.clone()),
                },
            ));
            content.push(ContentBlock::text(text));
            index += 1;
        }
        let mut calls = Vec::new();
        for _ in 0..self.pick(4) {
            let id = self.id("call");
            let name = format!("tool{}", self.pick(2));
            seqs.push(self.chunk(
                step,
                StreamChunk::BlockStart {
                    index,
                    block_type: BlockType::ToolCall,
                },
            ));
            seqs.push(self.chunk(
                step,
                StreamChunk::ToolCallDelta {
                    index,
                    id: id.clone(),
                    name: Some(name.clone()),
                    arguments_delta: "{\"a\":".into(),
                },
            ));
            seqs.push(self.chunk(
                step,
                StreamChunk::ToolCallDelta {
                    index,
                    id: id.clone(),
                    name: None,
                    arguments_delta: "1}".into(),
                },
            ));
            let block = ContentBlock::ToolCall {
                id: id.clone(),
                name: name.clone(),
                arguments: "{\"a\":1}".into(),
            };
            seqs.push(self.chunk(
                step,
                StreamChunk::BlockEnd {
                    index,
                    block: block.clone(),
                },
            ));
            content.push(block);
            calls.push((id, name));
            index += 1;
        }
        seqs.push(self.chunk(
            step,
            StreamChunk::Usage {
                usage: TokenUsage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..TokenUsage::default()
                },
            },
        ));
        let max_tokens = self.pick(8) == 0;
        let finish = match (max_tokens, calls.is_empty()) {
            (true, _) => FinishReason::MaxTokens,
            (false, true) => FinishReason::Stop,
            (false, false) => FinishReason::ToolCalls,
        };
        seqs.push(self.chunk(step, StreamChunk::finish(finish)));
        if max_tokens {
            // The assembler drops tool calls of a truncated response; the message may be empty.
            content.retain(|b| !matches!(b, ContentBlock::ToolCall { .. }));
            calls.clear();
        }
        let usage = TokenUsage {
            input_tokens: 10,
            output_tokens: 5,
            ..TokenUsage::default()
        };
        self.assistant(step, content, seqs, Some(usage), false);
        // Tools: logged when they start, results committed in model order.
        let abort_at = (self.pick(6) == 0).then(|| self.pick(calls.len().max(1) as u32) as usize);
        let mut started = Vec::new();
        for (i, (id, name)) in calls.iter().enumerate() {
            if abort_at == Some(i) {
                break;
            }
            if self.pick(6) == 0 {
                let m = self.user_message(MessageSource::plugin("@dsh/tool-context"));
                self.splice(InboxTarget::NextStep, None, vec![m]);
            }
            let seq = self.log(EventData::ToolCall(Box::new(ToolCallEvent {
                turn,
                step,
                call_id: id.clone(),
                name: name.clone(),
                arguments: "{\"a\":1}".into(),
            })));
            started.push((id.clone(), seq));
        }
        for (id, call_seq) in &started {
            let is_error = self.pick(5) == 0;
            self.tool_result(
                step,
                id,
                &format!("result of {id}"),
                is_error,
                None,
                Some(vec![*call_seq]),
                SurfaceOp::Append,
            );
        }
        if let Some(at) = abort_at {
            // Calls never started get a synthetic pair each, then the step and turn close.
            for (id, name) in &calls[at.min(calls.len())..] {
                let seq = self.log(EventData::ToolCall(Box::new(ToolCallEvent {
                    turn,
                    step,
                    call_id: id.clone(),
                    name: name.clone(),
                    arguments: "{\"a\":1}".into(),
                })));
                let error = ToolErrorInfo {
                    name: "AbortError".into(),
                    code: "ABORTED_BEFORE_DISPATCH".into(),
                };
                self.tool_result(
                    step,
                    id,
                    "Error: tool call aborted before dispatch",
                    true,
                    Some(error),
                    Some(vec![seq]),
                    SurfaceOp::Append,
                );
            }
            self.log(EventData::StepEnd(StepRef { turn, step }));
            return StepOutcome::End(TurnEndReason::Aborted {
                reason: CancelCause::Hook {
                    reason: "stop".into(),
                },
            });
        }
        if self.pick(6) == 0 {
            self.prune(step);
        }
        self.log(EventData::StepEnd(StepRef { turn, step }));
        if calls.is_empty() || self.pick(5) == 0 {
            let reason = match (max_tokens, self.pick(6)) {
                (true, _) => TurnEndReason::MaxTokens,
                (false, 0) => TurnEndReason::Error {
                    error: LlmFailure::new("SERVER", "upstream failed"),
                },
                _ => TurnEndReason::Completed,
            };
            return StepOutcome::End(reason);
        }
        StepOutcome::Continue
    }

    fn assistant(
        &mut self,
        step: u64,
        content: Vec<ContentBlock>,
        seqs: Vec<u64>,
        usage: Option<TokenUsage>,
        interrupted: bool,
    ) {
        let id = self.id("a");
        let message = Arc::new(Message {
            id: MessageId::new(&id).expect("a valid id"),
            role: Role::Assistant,
            content,
            source: MessageSource::model("sim", "model-0"),
        });
        self.push(EventDraft::append(
            EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                turn: self.turn,
                step,
                message,
                usage,
                interrupted: interrupted.then_some(true),
            })),
            Some(seqs),
        ));
    }

    #[allow(clippy::too_many_arguments)]
    fn tool_result(
        &mut self,
        step: u64,
        call_id: &str,
        text: &str,
        is_error: bool,
        error: Option<ToolErrorInfo>,
        sources: Option<Vec<u64>>,
        op: SurfaceOp,
    ) {
        let id = format!("r-{call_id}");
        let message = Arc::new(Message {
            id: MessageId::new(&id).expect("a valid id"),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: call_id.into(),
                content: vec![ContentBlock::text(text)],
                is_error: Some(is_error),
            }],
            source: MessageSource::tool(call_id),
        });
        self.push(EventDraft {
            data: EventData::ToolResult(Box::new(ToolResultEvent {
                turn: self.turn,
                step,
                message,
                error,
                meta: None,
            })),
            source_event_seqs: sources,
            surface_op: Some(op),
        });
    }

    /// Rewrites one current tool result's content (tool-result pruning): same identity, new content.
    fn prune(&mut self, _step: u64) {
        let events = self.session.events();
        let targets: Vec<(u64, ToolResultEvent)> = self
            .session
            .surface()
            .nodes
            .iter()
            .filter_map(|&seq| match &events[seq as usize].data {
                EventData::ToolResult(r) => Some((seq, (**r).clone())),
                _ => None,
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        let (seq, old) = targets[self.pick(targets.len() as u32) as usize].clone();
        let mut message = (*old.message).clone();
        for block in &mut message.content {
            if let ContentBlock::ToolResult { content, .. } = block {
                *content = vec![ContentBlock::text("[pruned]")];
            }
        }
        self.push(EventDraft {
            data: EventData::ToolResult(Box::new(ToolResultEvent {
                message: Arc::new(message),
                ..old
            })),
            source_event_seqs: Some(vec![seq]),
            surface_op: Some(SurfaceOp::Replace {
                start: seq,
                end: seq,
            }),
        });
    }
}

enum StepOutcome {
    Continue,
    End(TurnEndReason),
}

/// A valid log built from `tape`.
fn generate(tape: &[u32]) -> Vec<Event> {
    Gen {
        tape,
        pos: 0,
        session: Session::new(sid()),
        time: 1_785_000_000_000,
        turn: 0,
        n_ids: 0,
        header_logged: false,
    }
    .run()
}

/// A fixed pseudo-random tape (xorshift), for deterministic tests.
fn seeded_tape(seed: u32, len: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        })
        .collect()
}

/// The generator covers the whole grammar: across a few hundred tapes, every event type the runtime
/// writes appears, and so do replacements, rewrites, interrupted messages, and every turn-end reason.
#[test]
fn generator_covers_the_grammar() {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for seed in 0..300 {
        for e in generate(&seeded_tape(seed, 220)) {
            *seen.entry(e.kind().to_string()).or_default() += 1;
            let mut note = |what: &str| *seen.entry(what.to_string()).or_default() += 1;
            match (&e.data, e.surface_op) {
                (EventData::UserMessage(_), Some(SurfaceOp::Replace { .. })) => note("compaction"),
                (EventData::ToolResult(_), Some(SurfaceOp::Replace { .. })) => note("pruning"),
                (EventData::AssistantMessage(a), _) if a.interrupted == Some(true) => {
                    note("interrupted")
                }
                (EventData::AssistantMessage(a), _) if a.message.content.is_empty() => {
                    note("empty assistant")
                }
                (EventData::ToolResult(r), _) if r.error.is_some() => {
                    note("aborted before dispatch")
                }
                (EventData::TurnEnd(t), _) => note(&format!("turn/end {}", t.reason.kind())),
                (EventData::InboxSpliced(s), _) if s.removed_count.is_some() => note("claim"),
                _ => {}
            }
        }
    }
    for kind in [
        "agent/inbox/spliced",
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "user/message",
        "request/header",
        "request/context",
        "assistant/chunk",
        "assistant/message",
        "tool/call",
        "tool/result",
        "llm/retry",
        "llm/retry-started",
        "session/title",
        "todo/write",
        "compaction",
        "pruning",
        "interrupted",
        "empty assistant",
        "aborted before dispatch",
        "claim",
        "turn/end completed",
        "turn/end max-tokens",
        "turn/end blocked",
        "turn/end aborted",
        "turn/end error",
    ] {
        assert!(
            seen.get(kind).copied().unwrap_or(0) > 0,
            "{kind} never generated: {seen:?}"
        );
    }
}

fn tape() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(any::<u32>(), 0..220)
}

/// The from-scratch derivation: fold the surface offline and project each node.
fn scratch(events: &[Event]) -> Vec<Arc<Message>> {
    let folded = fold_surface(events).expect("a valid log folds");
    folded
        .nodes
        .iter()
        .filter_map(|&s| project(&events[s as usize]).cloned())
        .collect()
}

fn draft_of(e: &Event) -> EventDraft {
    EventDraft {
        data: e.data.clone(),
        source_event_seqs: e.source_event_seqs.clone(),
        surface_op: e.surface_op,
    }
}

fn export_bytes(header: &SessionHeader, events: &[Event]) -> Vec<u8> {
    let mut out = Vec::new();
    export(header, events, &mut out).expect("writing to a Vec cannot fail");
    out
}

fn import_bytes(bytes: &[u8]) -> Result<Imported, ImportError> {
    import(&mut &bytes[..], &Limits::DEFAULT)
}

// ---------------------------------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every prefix of a log the runtime writes — a crash can cut it anywhere — is repaired by
    /// `interrupted_turn_closers` into a balanced log that the loader and the invariant checker
    /// accept; a prefix that is already balanced needs no closers.
    #[test]
    fn every_prefix_repairs_to_a_valid_log(tape in tape()) {
        let events = generate(&tape);
        prop_assert_eq!(invariant::check(&events), Ok(()));
        for cut in 0..=events.len() {
            let prefix = &events[..cut];
            let closers = interrupted_turn_closers(prefix);
            prop_assert_eq!(closers.is_empty(), invariant::is_balanced(prefix), "cut {}", cut);
            let mut repaired = prefix.to_vec();
            repaired.extend(closers);
            prop_assert_eq!(invariant::check(&repaired), Ok(()), "cut {}", cut);
            prop_assert!(invariant::is_balanced(&repaired));
            let loaded = Session::from_events(sid(), repaired);
            prop_assert!(loaded.is_ok(), "cut {}: {:?}", cut, loaded.err());
        }
    }

    /// Serialize → parse → serialize is byte-identical for every event, and parsing gives the event.
    #[test]
    fn every_event_round_trips_byte_for_byte(tape in tape()) {
        for event in generate(&tape) {
            let json = event.to_json();
            let parsed = Event::from_json(&json);
            prop_assert_eq!(parsed.as_ref(), Ok(&event));
            prop_assert_eq!(parsed.map(|e| e.to_json()), Ok(json));
        }
    }

    /// §9.4 1, §9.9 1, 2, 5 and 6: after every append the incremental history equals a from-scratch
    /// projection; a log-only event never changes it; seqs are contiguous from 0; every derived
    /// message is a user or assistant message; deriving twice gives the same history.
    #[test]
    fn derived_history_matches_scratch_after_every_append(tape in tape()) {
        let events = generate(&tape);
        let mut session = Session::new(sid());
        for (i, event) in events.iter().enumerate() {
            let before = session.derive_messages();
            let appended = session.append(draft_of(event), event.time).map(|e| e.seq);
            prop_assert_eq!(appended, Ok(i as u64));
            let now = session.derive_messages();
            prop_assert_eq!(&now, &scratch(session.events()), "after seq {}", i);
            if !is_surface_type(event.kind()) {
                prop_assert_eq!(&before, &now, "log-only {} changed history", event.kind());
            }
            prop_assert!(now.iter().all(|m| matches!(m.role, Role::User | Role::Assistant)));
            prop_assert_eq!(&now, &session.derive_messages());
        }
        prop_assert_eq!(session.events(), &events[..]);
    }

    /// §9.9 5: log-only events inserted anywhere — every seq after them shifts, and the citations
    /// with it — never change derived history.
    #[test]
    fn log_only_events_never_change_history_in_any_interleaving(tape in tape(), positions in prop::collection::vec(any::<prop::sample::Index>(), 0..12)) {
        let events = generate(&tape);
        let mut at: Vec<usize> = positions.iter().map(|p| p.index(events.len() + 1)).collect();
        at.sort_unstable();
        let mut map = Vec::with_capacity(events.len());
        let mut widened = Vec::new();
        let mut inserted = at.iter().peekable();
        for (i, event) in events.iter().enumerate() {
            while inserted.next_if(|&&p| p == i).is_some() {
                let seq = widened.len() as u64;
                widened.push(Event {
                    seq,
                    time: event.time,
                    data: EventData::Other { kind: "session/title".into(), data: json!({"title": seq}) },
                    ignorable: false,
                    source_event_seqs: None,
                    surface_op: None,
                    raw_data: None,
                });
            }
            map.push(widened.len() as u64);
            let mut moved = event.clone();
            moved.seq = widened.len() as u64;
            moved.source_event_seqs = moved.source_event_seqs.map(|s| s.iter().map(|&x| map[x as usize]).collect());
            moved.surface_op = moved.surface_op.map(|op| match op {
                SurfaceOp::Append => SurfaceOp::Append,
                SurfaceOp::Replace { start, end } => SurfaceOp::Replace { start: map[start as usize], end: map[end as usize] },
            });
            widened.push(moved);
        }
        let original = Session::from_events(sid(), events).map(|s| s.derive_messages());
        let interleaved = Session::from_events(sid(), widened).map(|s| s.derive_messages());
        prop_assert!(original.is_ok());
        prop_assert_eq!(original, interleaved);
    }

    /// §9.9 3 (the part with a Rust analogue): a log read back derives the same history as the live
    /// session that wrote it.
    #[test]
    fn replay_reproduces_the_derivation(tape in tape()) {
        let events = generate(&tape);
        let mut live = Session::new(sid());
        for e in &events {
            live.append(draft_of(e), e.time).expect("valid");
        }
        let replayed = Session::from_events(sid(), events.clone()).expect("valid");
        prop_assert_eq!(replayed.derive_messages(), live.derive_messages());
        prop_assert_eq!(replayed.request_header(), live.request_header());
        prop_assert_eq!(replayed.last_turn(), live.last_turn());
    }

    /// `export(import(x)) == x` for every log we write, the open tail of a crashed turn included;
    /// the packed layout imports to the same events.
    #[test]
    fn export_import_round_trips(tape in tape(), cut in any::<prop::sample::Index>()) {
        let events = generate(&tape);
        let prefix = &events[..cut.index(events.len() + 1)];
        for log in [&events[..], prefix] {
            let bytes = export_bytes(&header(), log);
            let imported = import_bytes(&bytes).expect("our own export imports");
            prop_assert_eq!(&imported.header, &header());
            prop_assert_eq!(&imported.events[..], log);
            prop_assert!(imported.conversions.is_empty());
            prop_assert_eq!(&imported.torn_tail, &None);
            prop_assert_eq!(export_bytes(&imported.header, &imported.events), bytes);
            let mut packed = Vec::new();
            export_packed(&header(), log, &mut packed).expect("writing to a Vec cannot fail");
            prop_assert!(packed.len() <= export_bytes(&header(), log).len());
            prop_assert_eq!(&import_bytes(&packed).expect("packed imports").events[..], log);
        }
    }

    /// Issue 14: import → export → import is the identity on bytes, for logs the runtime writes and
    /// for the same logs with keys the runtime does not know inserted anywhere in the payloads (where
    /// the original keeps them), at any position among the known keys.
    #[test]
    fn import_export_import_is_the_identity_on_bytes(
        tape in tape(),
        picks in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0..UNKNOWN_VALUES.len()), 0..16),
    ) {
        let events = generate(&tape);
        let text = String::from_utf8(export_bytes(&header(), &events)).expect("UTF-8");
        let text = with_unknown_keys(&text, &picks);
        // (The typed view is not compared: where a payload part is kept verbatim — a plugin event's
        // data, a message source, a plugin block, `meta` — the unknown key is part of it.)
        let imported = import_bytes(text.as_bytes()).expect("a log with unknown keys imports");
        prop_assert_eq!(imported.events.len(), events.len());
        let exported = export_bytes(&imported.header, &imported.events);
        prop_assert_eq!(std::str::from_utf8(&exported).expect("UTF-8"), text.as_str());
        let again = import_bytes(&exported).expect("the export imports");
        prop_assert_eq!(export_bytes(&again.header, &again.events), exported);
    }

    /// The same identity on the logs the original wrote (every corpus log that loads unconverted),
    /// with unknown keys inserted.
    #[test]
    fn corpus_logs_with_unknown_keys_round_trip_on_bytes(
        file in any::<prop::sample::Index>(),
        picks in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<prop::sample::Index>(), 0..UNKNOWN_VALUES.len()), 1..16),
    ) {
        let logs = unconverted_corpus_logs();
        let (text, options) = &logs[file.index(logs.len())];
        let text = with_unknown_keys(text, &picks);
        let imported = import_with(&mut text.as_bytes(), &Limits::DEFAULT, options).expect("imports");
        let exported = export_bytes(&imported.header, &imported.events);
        let exported = String::from_utf8(exported).expect("UTF-8");
        let body = |t: &str| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>();
        prop_assert_eq!(body(&exported), body(&text));
        let again = import_bytes(exported.as_bytes()).expect("the export imports");
        prop_assert_eq!(export_bytes(&again.header, &again.events), exported.into_bytes());
    }

    /// A record cut anywhere (a crash mid-write) loses only that record: the complete lines before it
    /// load, and the cut is reported.
    #[test]
    fn a_cut_record_is_a_reported_torn_tail(tape in tape(), at in any::<prop::sample::Index>()) {
        let events = generate(&tape);
        let bytes = export_bytes(&header(), &events);
        let header_len = bytes.iter().position(|&b| b == b'\n').expect("a header line") + 1;
        let cut = header_len + at.index(bytes.len() - header_len + 1);
        let kept = &bytes[..cut];
        let complete = kept[header_len..].iter().filter(|&&b| b == b'\n').count();
        let imported = import_bytes(kept).expect("a cut log loads");
        prop_assert_eq!(&imported.events[..], &events[..complete]);
        prop_assert_eq!(imported.torn_tail.is_some(), kept.last() != Some(&b'\n'));
    }

    /// Garbage appended to a log is cut and reported; the log loads whole.
    #[test]
    fn appended_garbage_is_cut(tape in tape(), garbage in prop::collection::vec(any::<u8>(), 0..200)) {
        let events = generate(&tape);
        let mut bytes = export_bytes(&header(), &events);
        bytes.extend_from_slice(&garbage);
        let imported = import_bytes(&bytes).expect("garbage after the log is a torn tail");
        prop_assert_eq!(&imported.events, &events);
        prop_assert_eq!(imported.torn_tail.is_some(), !garbage.is_empty());
    }

    /// A damaged byte before the last `turn/end` is never silence: the import fails, or (when the
    /// byte lies inside a string or a number, which the format has no checksum to detect) every event
    /// is still there and nothing is reported cut.
    #[test]
    fn a_damaged_byte_before_the_last_turn_end_is_never_silent(tape in tape(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let events = generate(&tape);
        let bytes = export_bytes(&header(), &events);
        if let Some(range) = damageable(&bytes) {
            let pos = range.start + at.index(range.len());
            let mut damaged = bytes.clone();
            damaged[pos] = if byte == bytes[pos] { byte.wrapping_add(1) } else { byte };
            assert_damage_is_loud(&damaged, events.len(), pos);
        }
    }
}

/// The byte positions of the event lines that end before the last `turn/end` line, except the
/// newline right before it: damaging that newline merges two lines, one of them the last `turn/end`
/// itself, which leaves no later `turn/end` to prove the damage is inside the committed log.
fn damageable(bytes: &[u8]) -> Option<std::ops::Range<usize>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let header_len = text.find('\n')? + 1;
    let last_end = text.rfind("\n{\"type\":\"turn/end\"")?;
    (last_end > header_len).then_some(header_len..last_end)
}

fn assert_damage_is_loud(damaged: &[u8], n_events: usize, pos: usize) {
    match import_bytes(damaged) {
        Err(_) => {}
        Ok(imported) => {
            assert_eq!(
                imported.events.len(),
                n_events,
                "damage at byte {pos} lost events silently"
            );
            assert_eq!(
                imported.torn_tail, None,
                "damage at byte {pos} was cut as a torn tail"
            );
        }
    }
}

/// For each byte of `bytes`, whether it lies inside a JSON string (quotes excluded). Lines are
/// independent records, so the state resets at every newline.
fn inside_strings(bytes: &[u8]) -> Vec<bool> {
    let (mut in_string, mut escaped) = (false, false);
    bytes
        .iter()
        .map(|&b| {
            if b == b'\n' {
                (in_string, escaped) = (false, false);
                return false;
            }
            if in_string {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    in_string = false;
                    return false;
                }
                return true;
            }
            if b == b'"' {
                in_string = true;
            }
            false
        })
        .collect()
}

/// The bytes of a small log before its last `turn/end`, damaged in turn: a newline anywhere, or a
/// `#` anywhere outside a string (never valid JSON there), always fails the import. A digit may turn
/// into another number and a string byte into other text — the format has no checksum to notice —
/// but then every event is still there and nothing is reported cut.
#[test]
fn every_structural_byte_before_the_last_turn_end_fails_the_import() {
    let events = generate(&seeded_tape(24, 40));
    assert!(events.iter().filter(|e| e.kind() == "turn/end").count() >= 2);
    let bytes = export_bytes(&header(), &events);
    let inside = inside_strings(&bytes);
    let range = damageable(&bytes).expect("the log has two turns");
    let (mut n_refused, mut n_unnoticed) = (0, 0);
    // Every byte outside strings; every fifth inside them (string bytes can only be content).
    for pos in range.filter(|&p| !inside[p] || p % 5 == 0) {
        for replacement in [b'#', b'\n', b'9'] {
            if bytes[pos] == replacement {
                continue;
            }
            let mut damaged = bytes.clone();
            damaged[pos] = replacement;
            let must_fail = replacement == b'\n' || (replacement == b'#' && !inside[pos]);
            match import_bytes(&damaged) {
                Err(_) => n_refused += 1,
                Ok(imported) => {
                    assert!(
                        !must_fail,
                        "byte {pos} ({:?}) damaged to {:?} went unnoticed",
                        bytes[pos] as char, replacement as char
                    );
                    assert_eq!(imported.events.len(), events.len(), "byte {pos}");
                    assert_eq!(imported.torn_tail, None, "byte {pos}");
                    n_unnoticed += 1;
                }
            }
        }
    }
    assert!(
        n_refused > 0 && n_unnoticed > 0,
        "{n_refused} refused, {n_unnoticed} unnoticed"
    );
}

// ---------------------------------------------------------------------------------------------------
// The corpus of the original's logs
// ---------------------------------------------------------------------------------------------------

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dsh-logs")
}

fn expectation_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dsh-logs.expected")
}

/// Values an unknown key may hold in `with_unknown_keys`.
const UNKNOWN_VALUES: &[&str] = &["null", "1.5", "\"x\"", "{\"a\":[1,{}]}", "[]", "true"];

/// Inserts unknown keys into the payloads of a log's event lines: for each pick, an event line, an
/// object inside its `data` and a position among that object's keys. Chunk objects and
/// `adapterDefaults` are left alone (their key sets are closed, as in the original), and so are
/// `turn/start` payloads (a `trigger` there is the original's obsolete field, converted).
fn with_unknown_keys(
    text: &str,
    picks: &[(
        prop::sample::Index,
        prop::sample::Index,
        prop::sample::Index,
        usize,
    )],
) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    if lines.len() < 2 {
        return text.to_string();
    }
    for (n, (line, object, position, value)) in picks.iter().enumerate() {
        let i = 1 + line.index(lines.len() - 1);
        let mut event: serde_json::Value = serde_json::from_str(&lines[i]).expect("an event line");
        if event["type"] == "turn/start"
            || event["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("-chunks"))
        {
            continue;
        }
        let mut pointers = Vec::new();
        object_pointers(&event["data"], "/data".to_string(), &mut pointers);
        // A tool/result replacement may change only the result's content: a key added to the
        // verbatim parts (`source`, `meta`) of one side only would be a real change, refused.
        if event["type"] == "tool/result" {
            pointers
                .retain(|p| !p.starts_with("/data/message/source") && !p.starts_with("/data/meta"));
        }
        if pointers.is_empty() {
            continue;
        }
        let pointer = &pointers[object.index(pointers.len())];
        let Some(serde_json::Value::Object(map)) = event.pointer_mut(pointer) else {
            continue;
        };
        let at = position.index(map.len() + 1);
        let v: serde_json::Value = serde_json::from_str(UNKNOWN_VALUES[*value]).expect("JSON");
        map.shift_insert(at, format!("x-unknown-{n}"), v);
        lines[i] = event.to_string();
    }
    let mut out = lines.join("\n");
    out.push('\n');
    out
}

/// JSON pointers of every object inside `v` (itself included) where an unknown key may go.
fn object_pointers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            out.push(at.clone());
            for (k, child) in map {
                if k == "chunk" || k == "adapterDefaults" {
                    continue;
                }
                let key = k.replace('~', "~0").replace('/', "~1");
                object_pointers(child, format!("{at}/{key}"), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                object_pointers(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Every corpus log (placeholders filled) that loads without a conversion, one event per line.
fn unconverted_corpus_logs() -> Vec<(String, ImportOptions)> {
    let mut names: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("the corpus directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    names.sort();
    names
        .iter()
        .filter_map(|name| {
            let text = std::fs::read_to_string(corpus_dir().join(name)).ok()?;
            let (filled, options) = fill_placeholders(&text);
            let imported = import_with(&mut filled.as_bytes(), &Limits::DEFAULT, &options).ok()?;
            let packed = filled.lines().any(|l| {
                l.contains(r#""type":"text-chunks""#)
                    || l.contains(r#""type":"reasoning-chunks""#)
                    || l.contains(r#""type":"tool-call-chunks""#)
            });
            (imported.conversions.is_empty() && imported.torn_tail.is_none() && !packed)
                .then_some((filled, options))
        })
        .collect()
}

/// What the test substitutes for the snapshot placeholders of the original's test harness: the id
/// (through `ImportOptions`, as `dsh import --id` would), `{{cwd}}` in the header cwd (likewise), and
/// the one placeholder that stands where a structure belongs, `"tools":"{{tools}}"`, by an empty tool
/// list. Placeholders inside strings (`{{system}}`, `{{rpcId}}`, `{{messageId}}`, …) are valid data
/// and stay.
fn fill_placeholders(text: &str) -> (String, ImportOptions) {
    let mut options = ImportOptions::default();
    let header: serde_json::Value = text
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    if let Some(id) = header.get("id").and_then(|v| v.as_str())
        && SessionId::new(id).is_err()
    {
        options.session_id = Some(SessionId::new("fixture-session").expect("a valid id"));
    }
    if let Some(cwd) = header.get("cwd").and_then(|v| v.as_str())
        && cwd.contains("{{cwd}}")
    {
        options.cwd = Some(cwd.replace("{{cwd}}", "/fixture"));
    }
    (
        text.replace("\"tools\":\"{{tools}}\"", "\"tools\":[]"),
        options,
    )
}

/// One line describing an import's outcome, checking what must hold for every loaded log on the way.
/// `input` is the text imported: where the original wrote one event per line and nothing was
/// converted or cut, our export of the import must give its event lines back byte for byte.
fn outcome(input: &str, result: Result<Imported, ImportError>) -> String {
    let imported = match result {
        Err(e) => return format!("rejected: {e}"),
        Ok(i) => i,
    };
    // Our export of it imports to the same events, and exporting again is byte-identical.
    let exported = export_bytes(&imported.header, &imported.events);
    let again = import_bytes(&exported).expect("an exported import imports");
    assert_eq!(again.events, imported.events);
    assert!(again.conversions.is_empty());
    assert_eq!(export_bytes(&again.header, &again.events), exported);
    // An open tail turn repairs to a valid, balanced log.
    let closers = interrupted_turn_closers(&imported.events);
    let mut repaired = imported.events.clone();
    repaired.extend(closers.iter().cloned());
    assert_eq!(invariant::check(&repaired), Ok(()));
    assert!(Session::from_events(imported.header.id.clone(), repaired).is_ok());

    let n_turns = imported
        .events
        .iter()
        .filter(|e| e.kind() == "turn/start")
        .count();
    let plural = if n_turns == 1 { "" } else { "s" };
    let mut line = format!(
        "loaded {} events, {n_turns} turn{plural}",
        imported.events.len()
    );
    if !closers.is_empty() {
        let _ = write!(line, ", open tail turn ({} closers on load)", closers.len());
    }
    // Conversions, grouped by what was converted, in first-seen order.
    let mut counts: Vec<(String, usize)> = Vec::new();
    for c in &imported.conversions {
        let what = c
            .split_once("): ")
            .map_or_else(|| c.split_once(": ").map_or(c.as_str(), |x| x.1), |x| x.1);
        match counts.iter_mut().find(|(w, _)| w == what) {
            Some((_, n)) => *n += 1,
            None => counts.push((what.to_string(), 1)),
        }
    }
    if !counts.is_empty() {
        let list: Vec<String> = counts.iter().map(|(w, n)| format!("{w} ×{n}")).collect();
        let _ = write!(line, "; converted: {}", list.join("; "));
    }
    if let Some(torn) = &imported.torn_tail {
        let _ = write!(
            line,
            "; torn tail cut at line {}: {}",
            torn.line, torn.reason
        );
    }
    let packed = input.lines().skip(1).any(|l| {
        l.starts_with(r#"{"type":"text-chunks""#)
            || l.starts_with(r#"{"type":"reasoning-chunks""#)
            || l.starts_with(r#"{"type":"tool-call-chunks""#)
    });
    if imported.conversions.is_empty() && imported.torn_tail.is_none() {
        let exported = if packed {
            let mut out = Vec::new();
            export_packed(&imported.header, &imported.events, &mut out).expect("a Vec");
            out
        } else {
            exported
        };
        let exported = String::from_utf8(exported).expect("an export is UTF-8");
        let ours: Vec<&str> = exported.lines().skip(1).collect();
        let theirs: Vec<&str> = input.lines().skip(1).collect();
        if !packed {
            assert_eq!(
                ours, theirs,
                "export of an unconverted log is byte-identical"
            );
            line.push_str("; exported byte for byte");
        } else if ours == theirs {
            line.push_str("; exported (packed) byte for byte");
        }
    }
    line
}

#[test]
fn corpus() {
    let mut names: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("the corpus directory")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".jsonl"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 124, "the corpus holds the original's 124 logs");
    let mut report = String::from(
        "# Outcome of importing each log of tests/fixtures/dsh-logs, as written and with the snapshot\n\
         # placeholders filled (see `fill_placeholders` in tests/session_format.rs).\n\
         # Regenerate: DSH_BLESS=1 cargo test --test session_format corpus\n",
    );
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    for name in &names {
        let text = std::fs::read_to_string(corpus_dir().join(name)).expect("a fixture");
        let as_written = outcome(&text, import(&mut text.as_bytes(), &Limits::DEFAULT));
        let (filled, options) = fill_placeholders(&text);
        let filled_outcome = outcome(
            &filled,
            import_with(&mut filled.as_bytes(), &Limits::DEFAULT, &options),
        );
        // The same log in the original's default zstd layout (the header alone in frame 1, the
        // records in a second frame) reads to the same outcome.
        let mut compressed = zstd::stream::encode_all(
            filled
                .split_inclusive('\n')
                .next()
                .unwrap_or_default()
                .as_bytes(),
            0,
        )
        .expect("compress");
        let rest: String = filled.split_inclusive('\n').skip(1).collect();
        compressed.extend(zstd::stream::encode_all(rest.as_bytes(), 0).expect("compress"));
        let from_zstd = import_with(&mut &compressed[..], &Limits::DEFAULT, &options);
        assert_eq!(
            from_zstd.map(|i| i.events).map_err(|e| e.to_string()),
            import_with(&mut filled.as_bytes(), &Limits::DEFAULT, &options)
                .map(|i| i.events)
                .map_err(|e| e.to_string()),
            "{name} read from zstd"
        );
        let filled = filled_outcome;
        *tally
            .entry(if as_written.starts_with("loaded") {
                "as written: loaded"
            } else {
                "as written: rejected"
            })
            .or_default() += 1;
        *tally
            .entry(if filled.starts_with("loaded") {
                "filled: loaded"
            } else {
                "filled: rejected"
            })
            .or_default() += 1;
        let _ = write!(
            report,
            "\n{name}\n  as written: {as_written}\n  filled:     {filled}\n"
        );
    }
    let _ = write!(report, "\n# totals: {tally:?}\n");
    if std::env::var_os("DSH_BLESS").is_some() {
        std::fs::write(expectation_path(), &report).expect("write the expectation file");
        return;
    }
    let expected = std::fs::read_to_string(expectation_path()).unwrap_or_default();
    for (i, (want, got)) in expected.lines().zip(report.lines()).enumerate() {
        assert_eq!(
            got,
            want,
            "line {} of {} differs (actual left, expected right); DSH_BLESS=1 regenerates it",
            i + 1,
            expectation_path().display()
        );
    }
    assert_eq!(
        report.lines().count(),
        expected.lines().count(),
        "the expectation file has a different length"
    );
}

/// The original's derivation, re-implemented on the raw JSON of a log (§2.2, §2.5): fold the
/// surface ops over the seqs, then project each node to its message (a content-less assistant
/// message projects to none).
fn original_derived_messages(text: &str) -> Vec<serde_json::Value> {
    let events: Vec<serde_json::Value> = text
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).expect("an event line"))
        .collect();
    let mut nodes: Vec<u64> = Vec::new();
    for e in &events {
        let seq = e["seq"].as_u64().expect("a seq");
        match &e["surfaceOp"] {
            serde_json::Value::String(s) if s == "append" => nodes.push(seq),
            serde_json::Value::Object(op) => {
                let at = |k: &str| {
                    let want = op[k].as_u64().expect("a seq");
                    nodes.iter().position(|&n| n == want).expect("a node")
                };
                let (start, end) = (at("start"), at("end"));
                nodes.splice(start..=end, [seq]);
            }
            _ => {}
        }
    }
    nodes
        .iter()
        .filter_map(|&seq| {
            let e = &events[seq as usize];
            match e["type"].as_str() {
                Some("user/message") => Some(e["data"].clone()),
                Some("assistant/message")
                    if e["data"]["message"]["content"]
                        .as_array()
                        .is_some_and(|c| !c.is_empty()) =>
                {
                    Some(e["data"]["message"].clone())
                }
                Some("tool/result") => Some(e["data"]["message"].clone()),
                _ => None,
            }
        })
        .collect()
}

/// SPEC §15 / §17: every compacted log of the original's corpus loads, passes the §8.5 rules, and
/// derives the same messages as the original's fold (the checkpoint in place of the shadowed span).
#[test]
fn compacted_corpus_logs_derive_the_originals_messages() {
    let mut n_compacted = 0;
    for entry in std::fs::read_dir(corpus_dir()).expect("the corpus directory") {
        let path = entry.expect("an entry").path();
        let text = std::fs::read_to_string(&path).expect("a corpus file");
        if !text.contains(r#""type":"compaction/"#) {
            continue;
        }
        n_compacted += 1;
        let (filled, options) = fill_placeholders(&text);
        let imported = import_with(&mut filled.as_bytes(), &Limits::DEFAULT, &options)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        invariant::check(&imported.events).unwrap_or_else(|v| panic!("{}: {v}", path.display()));
        let session = Session::from_events(sid(), imported.events).expect("a valid log");
        let ours: Vec<serde_json::Value> = session
            .messages()
            .iter()
            .map(|m| serde_json::to_value(&**m).expect("JSON"))
            .collect();
        let want = original_derived_messages(&filled);
        assert_eq!(ours, want, "{}", path.display());
        assert!(
            session.surface().replace_generation > 0,
            "{}: a compaction replaced part of the surface",
            path.display()
        );
        let first = want[0]["content"][0]["text"].as_str().unwrap_or_default();
        assert!(
            first.starts_with(dsh::session::compaction::PREAMBLE),
            "{}: the checkpoint leads the history",
            path.display()
        );
    }
    assert!(n_compacted >= 1, "the corpus holds a compacted log");
}
