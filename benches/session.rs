//! What the session log costs per event, against the cheapest thing a log could be: a `Vec<Event>`
//! that each event is pushed onto after `serde_json::to_vec` (the baseline, measured in the same run
//! and the same group, so the ratio survives a noisy machine).
//!
//! - `session_append`: `Session::append` of a realistic event mix (prompts, request headers, streamed
//!   chunks, assistant messages citing them, tool calls and results, turn and step boundaries) — every
//!   validation rule and the surface and history folds included.
//! - `derive_messages`: the model history of a 1,000-event log, as the runtime reads it before each
//!   request (`Session::derive_messages`), and as a from-scratch replay would compute it
//!   (`fold_surface` + projection).
//! - `session_jsonl`: `export` and `import` of the same log (DSH v0 JSON lines).
//!
//! Run: `cargo bench --bench session`. Names are `group/variant/param`; report ratios to the baseline.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use dsh::ids::{MessageId, SessionId};
use dsh::limits::Limits;
use dsh::llm::types::{
    BlockType, ContentBlock, FinishReason, LlmCallConfig, Message, MessageSource, RequestHeader,
    Role, StreamChunk, TokenUsage, ToolSchema,
};
use dsh::session::event::{
    AssistantChunk, AssistantMessageEvent, Event, EventData, HeaderReason, RequestHeaderEvent,
    SessionHeader, StepRef, ToolCallEvent, ToolResultEvent, TurnEnd, TurnEndReason, TurnStart,
};
use dsh::session::log::{EventDraft, Session, project};
use dsh::session::store::jsonl;
use dsh::session::surface::fold_surface;
use serde_json::json;

/// Builds drafts by appending them to a scratch session, so every draft is valid in order.
struct Mix {
    session: Session,
    drafts: Vec<EventDraft>,
    time: i64,
}

impl Mix {
    fn push(&mut self, draft: EventDraft) -> u64 {
        self.time += 1;
        let seq = self
            .session
            .append(draft.clone(), self.time)
            .expect("the mix is valid")
            .seq;
        self.drafts.push(draft);
        seq
    }

    fn log(&mut self, data: EventData) -> u64 {
        self.push(EventDraft::log(data))
    }

    fn chunk(&mut self, turn: u64, step: u64, chunk: StreamChunk) -> u64 {
        self.log(EventData::AssistantChunk(std::sync::Arc::new(
            AssistantChunk { turn, step, chunk },
        )))
    }

    fn message(
        id: String,
        role: Role,
        content: Vec<ContentBlock>,
        source: MessageSource,
    ) -> Arc<Message> {
        Arc::new(Message {
            id: MessageId::new(&id).expect("a valid id"),
            role,
            content,
            source,
        })
    }

    /// One turn: a prompt, a step that streams text and asks for two tools, their results, and a
    /// second step that streams the answer. About 70 events.
    fn turn(&mut self, turn: u64) {
        self.log(EventData::TurnStart(TurnStart { turn }));
        for step in 1..=2u64 {
            self.log(EventData::StepStart(StepRef { turn, step }));
            if step == 1 {
                let prompt = Self::message(
                    format!("prompt-{turn}"),
                    Role::User,
                    vec![ContentBlock::text(
                        "Read both files and summarise the difference.",
                    )],
                    MessageSource::user(),
                );
                self.push(EventDraft::append(EventData::UserMessage(prompt), None));
            }
            if turn == 1 && step == 1 {
                let header = RequestHeader {
                    config: LlmCallConfig {
                        provider: "deepseek".into(),
                        model: "deepseek-chat".into(),
                        ..LlmCallConfig::default()
                    },
                    adapter_defaults: None,
                    system: Some("You are a careful coding agent.".into()),
                    tools: Some(vec![ToolSchema {
                        name: "read".into(),
                        description: "Read a file".into(),
                        parameters: json!({"type":"object","properties":{"path":{"type":"string"}}}),
                    }]),
                };
                self.log(EventData::RequestHeader(Box::new(RequestHeaderEvent {
                    header,
                    reason: HeaderReason::Initial,
                })));
            }
            let mut seqs = vec![self.chunk(
                turn,
                step,
                StreamChunk::BlockStart {
                    index: 0,
                    block_type: BlockType::Text,
                },
            )];
            let mut text = String::new();
            for i in 0..24 {
                let delta = format!("token{i} ");
                text.push_str(&delta);
                seqs.push(self.chunk(
                    turn,
                    step,
                    StreamChunk::TextDelta {
                        index: 0,
                        text: delta,
                    },
                ));
            }
            seqs.push(self.chunk(
                turn,
                step,
                StreamChunk::BlockEnd {
                    index: 0,
                    block: ContentBlock::text(text.clone()),
                },
            ));
            let mut content = vec![ContentBlock::text(text)];
            let calls: Vec<String> = if step == 1 {
                (0..2).map(|i| format!("call-{turn}-{i}")).collect()
            } else {
                Vec::new()
            };
            for (i, id) in calls.iter().enumerate() {
                let index = 1 + i as u32;
                seqs.push(self.chunk(
                    turn,
                    step,
                    StreamChunk::BlockStart {
                        index,
                        block_type: BlockType::ToolCall,
                    },
                ));
                for part in ["{\"path\":", "\"src/lib.rs\"}"] {
                    let name = (part.starts_with('{')).then(|| "read".to_string());
                    seqs.push(self.chunk(
                        turn,
                        step,
                        StreamChunk::ToolCallDelta {
                            index,
                            id: id.clone(),
                            name,
                            arguments_delta: part.into(),
                        },
                    ));
                }
                let block = ContentBlock::ToolCall {
                    id: id.clone(),
                    name: "read".into(),
                    arguments: "{\"path\":\"src/lib.rs\"}".into(),
                };
                seqs.push(self.chunk(
                    turn,
                    step,
                    StreamChunk::BlockEnd {
                        index,
                        block: block.clone(),
                    },
                ));
                content.push(block);
            }
            let usage = TokenUsage {
                input_tokens: 1200,
                output_tokens: 80,
                cache_read_tokens: Some(900),
                ..TokenUsage::default()
            };
            seqs.push(self.chunk(
                turn,
                step,
                StreamChunk::Usage {
                    usage: usage.clone(),
                },
            ));
            let finish = if calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            };
            seqs.push(self.chunk(turn, step, StreamChunk::finish(finish)));
            let reply = Self::message(
                format!("reply-{turn}-{step}"),
                Role::Assistant,
                content,
                MessageSource::model("deepseek", "deepseek-chat"),
            );
            self.push(EventDraft::append(
                EventData::AssistantMessage(Box::new(AssistantMessageEvent {
                    turn,
                    step,
                    message: reply,
                    usage: Some(usage),
                    interrupted: None,
                })),
                Some(seqs),
            ));
            let call_seqs: Vec<(String, u64)> = calls
                .iter()
                .map(|id| {
                    let seq = self.log(EventData::ToolCall(Box::new(ToolCallEvent {
                        turn,
                        step,
                        call_id: id.clone(),
                        name: "read".into(),
                        arguments: "{\"path\":\"src/lib.rs\"}".into(),
                    })));
                    (id.clone(), seq)
                })
                .collect();
            for (id, seq) in call_seqs {
                let result = Self::message(
                    format!("result-{id}"),
                    Role::User,
                    vec![ContentBlock::ToolResult {
                        tool_call_id: id.clone(),
                        content: vec![ContentBlock::text(
                            "pub mod session;\npub mod inbox;\n".repeat(8),
                        )],
                        is_error: Some(false),
                    }],
                    MessageSource::tool(&id),
                );
                self.push(EventDraft::append(
                    EventData::ToolResult(Box::new(ToolResultEvent {
                        turn,
                        step,
                        message: result,
                        error: None,
                        meta: None,
                    })),
                    Some(vec![seq]),
                ));
            }
            self.log(EventData::StepEnd(StepRef { turn, step }));
        }
        self.log(EventData::TurnEnd(Box::new(TurnEnd {
            turn,
            reason: TurnEndReason::Completed,
        })));
    }
}

/// The drafts of a realistic log of at least `n_events` events (whole turns), and the events they
/// became.
fn mix(n_events: usize) -> (Vec<EventDraft>, Vec<Event>) {
    let mut m = Mix {
        session: Session::new(sid()),
        drafts: Vec::new(),
        time: 1_785_000_000_000,
    };
    let mut turn = 0;
    while m.drafts.len() < n_events {
        turn += 1;
        m.turn(turn);
    }
    let events = m.session.into_events();
    (m.drafts, events)
}

fn sid() -> SessionId {
    SessionId::new("bench").expect("a valid id")
}

/// The baseline: keep each event in a `Vec` and encode it, nothing checked, nothing folded.
fn baseline(events: Vec<Event>) -> (Vec<Event>, usize) {
    let mut log = Vec::with_capacity(events.len());
    let mut n_bytes = 0;
    for event in events {
        n_bytes += serde_json::to_vec(&event).expect("events serialize").len();
        log.push(event);
    }
    (log, n_bytes)
}

fn session_append(c: &mut Criterion) {
    let (drafts, events) = mix(1_000);
    let n = drafts.len();
    let mut g = c.benchmark_group("session_append");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_with_input(
        BenchmarkId::new("baseline/vec_push_serde_json_to_vec", n),
        &events,
        |b, events| {
            b.iter_batched(
                || events.clone(),
                |events| black_box(baseline(events)),
                BatchSize::LargeInput,
            );
        },
    );
    g.bench_with_input(
        BenchmarkId::new("dsh/session_append", n),
        &drafts,
        |b, drafts| {
            b.iter_batched(
                || drafts.clone(),
                |drafts| {
                    let mut session = Session::new(sid());
                    for (i, draft) in drafts.into_iter().enumerate() {
                        session.append(draft, i as i64).expect("valid");
                    }
                    black_box(session)
                },
                BatchSize::LargeInput,
            );
        },
    );
    g.finish();
}

fn derive_messages(c: &mut Criterion) {
    let (_, events) = mix(1_000);
    let n = events.len();
    let session = Session::from_events(sid(), events.clone()).expect("valid");
    let mut g = c.benchmark_group("derive_messages");
    g.bench_with_input(
        BenchmarkId::new("baseline/vec_push_serde_json_to_vec", n),
        &events,
        |b, events| {
            b.iter_batched(
                || events.clone(),
                |events| black_box(baseline(events)),
                BatchSize::LargeInput,
            );
        },
    );
    g.bench_with_input(
        BenchmarkId::new("dsh/derive_messages", n),
        &session,
        |b, session| {
            b.iter(|| black_box(session.derive_messages()));
        },
    );
    g.bench_with_input(
        BenchmarkId::new("dsh/fold_surface_from_scratch", n),
        &events,
        |b, events| {
            b.iter(|| {
                let folded = fold_surface(events).expect("valid");
                let messages: Vec<Arc<Message>> = folded
                    .nodes
                    .iter()
                    .filter_map(|&s| project(&events[s as usize]).cloned())
                    .collect();
                black_box(messages)
            });
        },
    );
    g.finish();
}

fn session_jsonl(c: &mut Criterion) {
    let (_, events) = mix(1_000);
    let n = events.len();
    let header = SessionHeader::new(sid(), 1_785_000_000_000);
    let mut exported = Vec::new();
    jsonl::export(&header, &events, &mut exported).expect("writing to a Vec cannot fail");
    let mut g = c.benchmark_group("session_jsonl");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_with_input(
        BenchmarkId::new("baseline/vec_push_serde_json_to_vec", n),
        &events,
        |b, events| {
            b.iter_batched(
                || events.clone(),
                |events| black_box(baseline(events)),
                BatchSize::LargeInput,
            );
        },
    );
    g.bench_with_input(BenchmarkId::new("dsh/export", n), &events, |b, events| {
        b.iter(|| {
            let mut out = Vec::with_capacity(exported.len());
            jsonl::export(&header, events, &mut out).expect("writing to a Vec cannot fail");
            black_box(out)
        });
    });
    g.bench_with_input(BenchmarkId::new("dsh/import", n), &exported, |b, bytes| {
        b.iter(|| black_box(jsonl::import(&mut &bytes[..], &Limits::DEFAULT).expect("valid")));
    });
    g.finish();
}

criterion_group!(benches, session_append, derive_messages, session_jsonl);
criterion_main!(benches);
