//! SSE parsing plus translation throughput (`openai::ChunkDecoder`), against a same-run baseline that
//! only scans the same bytes for line ends (the least any SSE parser must do).
//!
//! The body is a realistic DeepSeek stream — reasoning deltas, text deltas, two interleaved tool
//! calls, usage and `[DONE]` — delivered in 1,460-byte pieces (one TCP segment each), so line and
//! UTF-8 reassembly across pieces is on the measured path. Throughput is in output chunks; report the
//! ratio `dsh/decode_translate ÷ baseline/scan_line_ends`, never a bare time.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dsh::limits::Limits;
use dsh::llm::openai::ChunkDecoder;
use dsh::llm::sse::SseDecoder;
use serde_json::json;

const SEGMENT_BYTES: usize = 1460;

fn body() -> Vec<u8> {
    let mut out = Vec::new();
    let mut event =
        |v: serde_json::Value| out.extend_from_slice(format!("data: {v}\n\n").as_bytes());
    event(
        json!({"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":""},"finish_reason":null}]}),
    );
    let words = [
        "The", " agent", " reads", " a", " file", " and", " then", " writes", " — ", "é", " 🌍",
    ];
    for i in 0..400 {
        event(
            json!({"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"reasoning_content":words[i % words.len()]},"finish_reason":null}]}),
        );
    }
    for i in 0..1200 {
        event(
            json!({"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":words[i % words.len()]},"finish_reason":null}]}),
        );
    }
    event(
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"read","arguments":""}}]}}]}),
    );
    event(
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_1","type":"function","function":{"name":"grep","arguments":""}}]}}]}),
    );
    for i in 0..200 {
        event(
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":i % 2,"function":{"arguments":"\"path/to/file\","}}]}}]}),
        );
    }
    event(
        json!({"choices":[{"index":0,"delta":{"content":""},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":283,"completion_tokens":69,"prompt_cache_hit_tokens":256,"prompt_tokens_details":{"cached_tokens":256},"completion_tokens_details":{"reasoning_tokens":24}}}),
    );
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

fn decode_translate(pieces: &[&[u8]], out: &mut Vec<dsh::llm::StreamChunk>) -> usize {
    out.clear();
    let mut d = ChunkDecoder::new(&Limits::DEFAULT);
    for piece in pieces {
        d.feed(piece, out).expect("valid stream");
    }
    d.finish().expect("done");
    out.len()
}

fn sse(c: &mut Criterion) {
    let body = body();
    let pieces: Vec<&[u8]> = body.chunks(SEGMENT_BYTES).collect();
    let mut out = Vec::new();
    let n_chunks = decode_translate(&pieces, &mut out);
    eprintln!(
        "sse body: {} bytes in {} pieces -> {n_chunks} chunks",
        body.len(),
        pieces.len()
    );
    let mut g = c.benchmark_group("sse");
    g.throughput(Throughput::Elements(n_chunks as u64));
    g.bench_function("baseline/scan_line_ends", |b| {
        b.iter(|| {
            let mut n_lines = 0usize;
            for piece in &pieces {
                n_lines += memchr::memchr2_iter(b'\n', b'\r', black_box(piece)).count();
            }
            n_lines
        })
    });
    g.bench_function("dsh/decode_only", |b| {
        let mut items = Vec::new();
        b.iter(|| {
            items.clear();
            let mut d = SseDecoder::new(&Limits::DEFAULT);
            for piece in &pieces {
                d.feed_into(black_box(piece), &mut items).expect("valid");
            }
            items.len()
        })
    });
    g.bench_function("dsh/decode_translate", |b| {
        b.iter(|| decode_translate(black_box(&pieces), &mut out))
    });
    g.finish();
}

criterion_group!(benches, sse);
criterion_main!(benches);
