//! Benches for the pure per-chunk and per-input paths: `BlockAssembler::push` (runs once per streamed
//! chunk of every agent) and the inbox plan/apply cycle (runs once per input call and step boundary).
//!
//! Each group puts a baseline next to the measured code, so results are read as ratios on a noisy
//! machine: the assembler against appending the same deltas to one `String`, the inbox against a bare
//! `VecDeque` push and drain of the same `Arc<Message>`s.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use dsh::inbox::Inbox;
use dsh::llm::assembler::BlockAssembler;
use dsh::llm::types::{BlockType, ContentBlock, FinishReason, Message, StreamChunk};
use dsh::session::event::InboxTarget;
use dsh::{Limits, MessageId};

const N_DELTAS: usize = 4096;
const N_MESSAGES: usize = 64;

/// A typical streamed reply: a reasoning block, a text block and a tool call, one small delta per
/// token, then the closes and the finish.
fn reply_chunks() -> Vec<StreamChunk> {
    let mut chunks = vec![
        StreamChunk::BlockStart {
            index: 0,
            block_type: BlockType::Reasoning,
        },
        StreamChunk::BlockStart {
            index: 1,
            block_type: BlockType::Text,
        },
    ];
    for i in 0..N_DELTAS {
        chunks.push(if i < N_DELTAS / 4 {
            StreamChunk::ReasoningDelta {
                index: 0,
                text: "think ".into(),
            }
        } else {
            StreamChunk::TextDelta {
                index: 1,
                text: "word ".into(),
            }
        });
    }
    chunks.push(StreamChunk::ToolCallDelta {
        index: 2,
        id: "call-1".into(),
        name: Some("read".into()),
        arguments_delta: "{\"path\":\"a\"}".into(),
    });
    chunks.push(StreamChunk::BlockEnd {
        index: 2,
        block: ContentBlock::ToolCall {
            id: "call-1".into(),
            name: "read".into(),
            arguments: "{\"path\":\"a\"}".into(),
        },
    });
    chunks.push(StreamChunk::finish(FinishReason::ToolCalls));
    chunks
}

fn assembler(c: &mut Criterion) {
    let chunks = reply_chunks();
    let mut g = c.benchmark_group("assembler");
    g.throughput(Throughput::Elements(chunks.len() as u64));
    g.bench_function("baseline/string_push", |b| {
        b.iter(|| {
            let mut text = String::new();
            for chunk in &chunks {
                if let StreamChunk::TextDelta { text: t, .. }
                | StreamChunk::ReasoningDelta { text: t, .. } = chunk
                {
                    text.push_str(t);
                }
            }
            black_box(text)
        })
    });
    g.bench_function("dsh/push_and_blocks", |b| {
        b.iter(|| {
            let mut a = BlockAssembler::new();
            for chunk in &chunks {
                a.push(chunk);
            }
            black_box(a.blocks())
        })
    });
    g.finish();
}

fn inbox(c: &mut Criterion) {
    let limits = Limits::DEFAULT;
    let messages: Vec<Arc<Message>> = (0..N_MESSAGES)
        .map(|i| {
            let id = MessageId::new(&format!("m{i}")).expect("valid id");
            Arc::new(Message::user_text(id, format!("steer number {i}")))
        })
        .collect();
    let mut g = c.benchmark_group("inbox");
    g.throughput(Throughput::Elements(N_MESSAGES as u64));
    g.bench_function("baseline/vecdeque_push_drain", |b| {
        b.iter_batched(
            || messages.clone(),
            |messages| {
                let mut queue = VecDeque::new();
                for m in messages {
                    queue.push_back(m);
                }
                black_box(queue.drain(..).collect::<Vec<_>>())
            },
            BatchSize::SmallInput,
        )
    });
    // One steer per step boundary: admit, plan, apply, then claim it.
    g.bench_function("dsh/append_then_claim", |b| {
        b.iter_batched(
            || messages.clone(),
            |messages| {
                let mut inbox = Inbox::new();
                let mut n_claimed = 0;
                for m in messages {
                    let splice = inbox
                        .plan_append(InboxTarget::NextStep, m, &limits)
                        .expect("admitted");
                    inbox.apply(&splice).expect("fresh plan");
                    let (splices, claimed) = inbox.plan_claim(false);
                    for s in &splices {
                        inbox.apply(s).expect("fresh plan");
                    }
                    n_claimed += claimed.len();
                }
                black_box(n_claimed)
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, assembler, inbox);
criterion_main!(benches);
