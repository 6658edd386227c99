//! Provider conformance: the `openai` provider against a real HTTP server on 127.0.0.1
//! (`support::fake_server`), the §7.6 reference behaviours and §9.29 adapter cases, byte-boundary
//! splitting of every valid stream, the API-key canary, base URLs with a query or with userinfo
//! (sent as HTTP Basic, shown nowhere: not in chunks, errors, TRACE logs or session events), the
//! provider registry, and an opt-in live DeepSeek round trip.
//!
//! Every scenario is an `async fn` that asserts exact chunks and returns what it saw, so the canary
//! test can run the whole catalogue again under a TRACE-level log capture and search everything for
//! the key.

mod support {
    pub mod fake_server;
}

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use dsh::ids::{MessageId, SessionId};
use dsh::limits::Limits;
use dsh::llm::openai::ChunkDecoder;
use dsh::llm::openai::{ApiKey, OpenAiConfig, OpenAiProvider};
use dsh::llm::script::{Gates, ScriptEntry, ScriptProvider};
use dsh::llm::sim::{SimConfig, SimProvider};
use dsh::llm::types::{
    ContentBlock, FinishReason, LlmCallConfig, LlmFailure, LlmRequest, Message, MessageSource,
    Role, StreamChunk, ToolSchema,
};
use dsh::llm::{Provider, ProviderRegistry};
use futures::StreamExt;
use serde_json::{Value, json};
use support::fake_server::{Behaviour, Ending, FakeServer, Step};
use tokio_util::sync::CancellationToken;

/// The key every provider in this binary uses: random per run, so a leak cannot hide behind a
/// string some test happens to expect.
fn canary() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(|| format!("sk-canary-{:016x}", rand::random::<u64>()))
}

fn provider(
    server: &FakeServer,
    key: &str,
    edit: impl FnOnce(&mut OpenAiConfig),
) -> OpenAiProvider {
    let mut config = OpenAiConfig {
        base_url: server.base_url(),
        api_key: Some(ApiKey::new(key).expect("canary key is valid")),
        connect_timeout_ms: 5_000,
        idle_timeout_ms: 10_000,
        ..OpenAiConfig::default()
    };
    edit(&mut config);
    OpenAiProvider::new(config).expect("valid config")
}

fn user(text: &str) -> Arc<Message> {
    Arc::new(Message::user_text(MessageId::new("m1").expect("id"), text))
}

fn request(text: &str) -> LlmRequest {
    LlmRequest {
        config: LlmCallConfig {
            provider: "openai".into(),
            model: "deepseek-v4-flash".into(),
            ..LlmCallConfig::default()
        },
        system: Some("be brief".into()),
        tools: vec![],
        messages: vec![user(text)].into(),
        session_id: Some(SessionId::new("s1").expect("id")),
        purpose: None,
    }
}

async fn collect(p: &dyn Provider, r: LlmRequest) -> Vec<StreamChunk> {
    p.stream(r, CancellationToken::new()).collect().await
}

fn sse(payloads: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for p in payloads {
        out.extend_from_slice(format!("data: {p}\n\n").as_bytes());
    }
    out
}

fn sse_done(payloads: &[Value]) -> Vec<u8> {
    let mut out = sse(payloads);
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

fn chunks(v: Value) -> Vec<StreamChunk> {
    serde_json::from_value(v).expect("valid chunk json")
}

fn error_chunk(failure: LlmFailure) -> StreamChunk {
    StreamChunk::finish(FinishReason::Error { failure })
}

fn failure_of(chunks: &[StreamChunk]) -> LlmFailure {
    match chunks.last() {
        Some(StreamChunk::Finish {
            reason: FinishReason::Error { failure } | FinishReason::Aborted { failure },
            ..
        }) => failure.clone(),
        other => panic!("expected an error finish, got {other:?}"),
    }
}

fn text_body() -> Vec<u8> {
    sse_done(&[
        json!({"choices":[{"delta":{"role":"assistant","content":null,"reasoning_content":""}}]}),
        json!({"choices":[{"delta":{"content":"hello"}}]}),
        json!({"choices":[{"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}),
    ])
}

fn text_chunks() -> Vec<StreamChunk> {
    chunks(json!([
        {"type":"block-start","index":0,"blockType":"text"},
        {"type":"text-delta","index":0,"text":"hello"},
        {"type":"block-end","index":0,"block":{"type":"text","text":"hello"}},
        {"type":"usage","usage":{"inputTokens":3,"outputTokens":1}},
        {"type":"finish","reason":{"kind":"stop"}}
    ]))
}

fn reasoning_body() -> Vec<u8> {
    sse_done(&[
        json!({"choices":[{"delta":{"role":"assistant","content":null,"reasoning_content":""}}]}),
        json!({"choices":[{"delta":{"reasoning_content":"let me "}}]}),
        json!({"choices":[{"delta":{"reasoning_content":"think"}}]}),
        json!({"choices":[{"delta":{"content":"Hi"}}]}),
        json!({"choices":[{"delta":{"content":"!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":3}}}),
    ])
}

fn tools_body() -> Vec<u8> {
    sse_done(&[
        json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_00_a","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":1,"id":"call_01_b","type":"function","function":{"name":"get_time","arguments":"{\"tz\""}}]}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\""}}]}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":1,"function":{"arguments":": \"UTC\"}"}}]}}]}),
        json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":": \"Paris\"}"}}]}}]}),
        json!({"choices":[{"delta":{"content":""},"finish_reason":"tool_calls"}],"usage":null}),
        json!({"choices":[],"usage":{"prompt_tokens":28,"completion_tokens":12}}),
    ])
}

fn usage_body() -> Vec<u8> {
    sse_done(&[
        json!({"choices":[{"delta":{"content":"ok"}}]}),
        json!({"choices":[{"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":283,"completion_tokens":69,"prompt_cache_hit_tokens":256,"prompt_cache_miss_tokens":27,"prompt_tokens_details":{"cached_tokens":256},"completion_tokens_details":{"reasoning_tokens":24}}}),
    ])
}

// ---------------------------------------------------------------------------------------------------
// Scenarios

/// §7.6 minimal stream, §9.29.1: exact chunks and exactly the request §7.2 describes.
async fn scenario_text(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![Behaviour::sse(text_body())]).await;
    let p = provider(&server, key, |_| {});
    let out = collect(&p, request("hi")).await;
    assert_eq!(out, text_chunks());
    let reqs = server.requests();
    assert_eq!(reqs.len(), 1, "exactly one HTTP request per stream()");
    let r = &reqs[0];
    assert_eq!(
        (r.method.as_str(), r.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(
        r.header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("accept"), Some("text/event-stream"));
    assert!(
        r.header("user-agent")
            .is_some_and(|ua| ua.starts_with("dsh-rs/"))
    );
    assert_eq!(
        String::from_utf8(r.body.clone()).expect("utf8"),
        r#"{"model":"deepseek-v4-flash","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#
    );
    out
}

/// §9.27.4 over HTTP.
async fn scenario_reasoning(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![Behaviour::sse(reasoning_body())]).await;
    let out = collect(&provider(&server, key, |_| {}), request("hi")).await;
    assert_eq!(
        out,
        chunks(json!([
            {"type":"block-start","index":0,"blockType":"reasoning"},
            {"type":"reasoning-delta","index":0,"text":"let me "},
            {"type":"reasoning-delta","index":0,"text":"think"},
            {"type":"block-start","index":1,"blockType":"text"},
            {"type":"text-delta","index":1,"text":"Hi"},
            {"type":"text-delta","index":1,"text":"!"},
            {"type":"block-end","index":0,"block":{"type":"reasoning","text":"let me think"}},
            {"type":"block-end","index":1,"block":{"type":"text","text":"Hi!"}},
            {"type":"usage","usage":{"inputTokens":4,"outputTokens":5,"reasoningTokens":3}},
            {"type":"finish","reason":{"kind":"stop"}}
        ]))
    );
    out
}

/// §9.27.6–7: two calls whose argument deltas interleave by wire index; the tools reach the wire.
async fn scenario_parallel_tools(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![Behaviour::sse(tools_body())]).await;
    let mut r = request("weather and time?");
    r.tools = vec![ToolSchema {
        name: "get_weather".into(),
        description: "weather for a city".into(),
        parameters: json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}),
    }];
    let out = collect(&provider(&server, key, |_| {}), r).await;
    assert_eq!(
        out,
        chunks(json!([
            {"type":"block-start","index":0,"blockType":"tool-call"},
            {"type":"tool-call-delta","index":0,"id":"call_00_a","name":"get_weather","argumentsDelta":""},
            {"type":"block-start","index":1,"blockType":"tool-call"},
            {"type":"tool-call-delta","index":1,"id":"call_01_b","name":"get_time","argumentsDelta":"{\"tz\""},
            {"type":"tool-call-delta","index":0,"id":"call_00_a","name":"get_weather","argumentsDelta":"{\"city\""},
            {"type":"tool-call-delta","index":1,"id":"call_01_b","name":"get_time","argumentsDelta":": \"UTC\"}"},
            {"type":"tool-call-delta","index":0,"id":"call_00_a","name":"get_weather","argumentsDelta":": \"Paris\"}"},
            {"type":"block-end","index":0,"block":{"type":"tool-call","id":"call_00_a","name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},
            {"type":"block-end","index":1,"block":{"type":"tool-call","id":"call_01_b","name":"get_time","arguments":"{\"tz\": \"UTC\"}"}},
            {"type":"usage","usage":{"inputTokens":28,"outputTokens":12}},
            {"type":"finish","reason":{"kind":"tool-calls"}}
        ]))
    );
    assert_eq!(
        server.requests()[0].json()["tools"],
        json!([{"type":"function","function":{"name":"get_weather","description":"weather for a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])
    );
    out
}

/// §9.27.21: the live-capture usage shape, cache hits subtracted from input.
async fn scenario_usage(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![Behaviour::sse(usage_body())]).await;
    let out = collect(&provider(&server, key, |_| {}), request("hi")).await;
    assert_eq!(
        out[3],
        chunks(
            json!([{"type":"usage","usage":{"inputTokens":27,"outputTokens":69,"cacheReadTokens":256,"reasoningTokens":24}}])
        )[0]
    );
    out
}

/// §9.29.13–14, 18–22: each error status with its body.
async fn scenario_error_statuses(key: &str) -> Vec<StreamChunk> {
    let err = |m: &str, code: Option<&str>, kind: Option<&str>| {
        let mut e = json!({"message": m});
        if let Some(c) = code {
            e["code"] = json!(c);
        }
        if let Some(t) = kind {
            e["type"] = json!(t);
        }
        json!({ "error": e }).to_string()
    };
    let cases: Vec<(u16, String, &str, &str)> = vec![
        (
            401,
            err("Authentication Fails", None, Some("authentication_error")),
            "AUTH",
            "Authentication Fails",
        ),
        (403, err("forbidden", None, None), "AUTH", "forbidden"),
        (
            429,
            err("Rate limit reached for requests", None, None),
            "RATE_LIMIT",
            "Rate limit reached for requests",
        ),
        (
            429,
            err(
                "You exceeded your current quota",
                Some("insufficient_quota"),
                None,
            ),
            "QUOTA",
            "You exceeded your current quota",
        ),
        (
            402,
            err("Insufficient Balance", Some("invalid_request_error"), None),
            "QUOTA",
            "Insufficient Balance",
        ),
        (
            400,
            err("bad field", None, Some("invalid_request_error")),
            "INVALID_REQUEST",
            "bad field",
        ),
        (
            400,
            err(
                "This request exceeds the model context window",
                Some("context_length_exceeded"),
                None,
            ),
            "CONTEXT_WINDOW_EXCEEDED",
            "This request exceeds the model context window",
        ),
        (
            413,
            err("This request exceeds the model context window", None, None),
            "INVALID_REQUEST",
            "This request exceeds the model context window",
        ),
        (500, err("internal", None, None), "SERVER", "internal"),
        (503, err("overloaded", None, None), "SERVER", "overloaded"),
        (
            500,
            "{\"error\":{}}".into(),
            "SERVER",
            "API error (HTTP 500)",
        ),
        (502, "Bad Gateway".into(), "SERVER", "API error (HTTP 502)"),
        (418, err("teapot", None, None), "HTTP_418", "teapot"),
    ];
    let server = FakeServer::start(
        cases
            .iter()
            .map(|(s, body, _, _)| Behaviour::status(*s, body, &[]))
            .collect(),
    )
    .await;
    let p = provider(&server, key, |_| {});
    let mut all = Vec::new();
    for (status, _, code, message) in &cases {
        let out = collect(&p, request("hi")).await;
        let mut want = LlmFailure::new(code, *message);
        want.status = Some(*status);
        assert_eq!(out, vec![error_chunk(want)], "HTTP {status}");
        all.extend(out);
    }
    assert_eq!(server.requests().len(), cases.len(), "no retries");
    all
}

/// §9.29.15–16: Retry-After seconds or date, request ids.
async fn scenario_retry_after(key: &str) -> Vec<StreamChunk> {
    let date = httpdate_in(Duration::from_secs(30));
    let body = r#"{"error":{"message":"slow down","type":"rate_limit"}}"#;
    let server = FakeServer::start(vec![
        Behaviour::status(
            429,
            body,
            &[("retry-after", "2"), ("x-request-id", "req-1")],
        ),
        Behaviour::status(
            429,
            body,
            &[("retry-after", &date), ("x-deepseek-request-id", "ds-2")],
        ),
        Behaviour::status(429, body, &[("retry-after", "0")]),
    ])
    .await;
    let p = provider(&server, key, |_| {});
    let first = failure_of(&collect(&p, request("hi")).await);
    assert_eq!(
        first,
        LlmFailure {
            message: "slow down".into(),
            code: "RATE_LIMIT".into(),
            status: Some(429),
            provider_retry_after_ms: Some(2000),
            request_id: Some("req-1".into()),
        }
    );
    let second = failure_of(&collect(&p, request("hi")).await);
    assert_eq!(second.request_id.as_deref(), Some("ds-2"));
    let ms = second
        .provider_retry_after_ms
        .expect("a future date gives a delay");
    // The date has one-second resolution and "now" moves on: 30 s minus at most the test's runtime.
    assert!((1..=30_000).contains(&ms), "{ms}");
    let third = failure_of(&collect(&p, request("hi")).await);
    assert_eq!(third.provider_retry_after_ms, None);
    [first, second, third]
        .into_iter()
        .map(error_chunk)
        .collect()
}

/// A server that echoes the key in its error message never gets it into the failure.
async fn scenario_echoed_key(key: &str) -> Vec<StreamChunk> {
    let body =
        json!({"error":{"message": format!("Incorrect API key provided: {key}.")}}).to_string();
    let server = FakeServer::start(vec![Behaviour::status(401, &body, &[])]).await;
    let out = collect(&provider(&server, key, |_| {}), request("hi")).await;
    assert_eq!(
        failure_of(&out).message,
        "Incorrect API key provided: <redacted>."
    );
    out
}

/// §9.27.17: a malformed data line after valid ones: what was valid streams, then the error.
async fn scenario_malformed(key: &str) -> Vec<StreamChunk> {
    let mut body = sse(&[json!({"choices":[{"delta":{"content":"par"}}]})]);
    body.extend_from_slice(b"data: {not-json\n\ndata: [DONE]\n\n");
    let server = FakeServer::start(vec![Behaviour::sse(body)]).await;
    let out = collect(&provider(&server, key, |_| {}), request("hi")).await;
    let mut want = chunks(json!([
        {"type":"block-start","index":0,"blockType":"text"},
        {"type":"text-delta","index":0,"text":"par"}
    ]));
    want.push(error_chunk(LlmFailure::new(
        "MALFORMED_RESPONSE",
        "malformed SSE payload: {not-json",
    )));
    assert_eq!(out, want);
    out
}

/// An oversized line is refused at the bound, not buffered.
async fn scenario_oversized_line(key: &str) -> Vec<StreamChunk> {
    let mut body = b"data: ".to_vec();
    body.extend(std::iter::repeat_n(b'x', 8192));
    body.extend_from_slice(b"\n\n");
    let server = FakeServer::start(vec![Behaviour::Stream {
        steps: vec![Step::Write(body)],
        ending: Ending::Stall,
    }])
    .await;
    let p = provider(&server, key, |c| {
        c.limits = Limits {
            sse_line_bytes_max: 1024,
            ..Limits::DEFAULT
        }
    });
    let out = collect(&p, request("hi")).await;
    let failure = failure_of(&out);
    assert_eq!(failure.code, "MALFORMED_RESPONSE");
    assert!(
        failure.message.starts_with("sse line is at least "),
        "{failure:?}"
    );
    assert!(
        failure.message.ends_with("bytes, the limit is 1024"),
        "{failure:?}"
    );
    // The stream ended at the breach and the connection was dropped.
    server.wait_closed_by_client(1).await;
    out
}

/// §9.29.26: the body breaks off after k events: the k events' chunks, then TRANSPORT.
async fn scenario_disconnect(key: &str) -> Vec<StreamChunk> {
    let events = [
        json!({"choices":[{"delta":{"content":"a"}}]}),
        json!({"choices":[{"delta":{"content":"b"}}]}),
    ];
    let server = FakeServer::start(vec![Behaviour::Stream {
        steps: events
            .iter()
            .map(|e| Step::Write(sse(std::slice::from_ref(e))))
            .collect(),
        ending: Ending::Disconnect,
    }])
    .await;
    let out = collect(&provider(&server, key, |_| {}), request("hi")).await;
    assert_eq!(
        out[..3],
        chunks(json!([
            {"type":"block-start","index":0,"blockType":"text"},
            {"type":"text-delta","index":0,"text":"a"},
            {"type":"text-delta","index":0,"text":"b"}
        ]))[..]
    );
    assert_eq!(out.len(), 4);
    let failure = failure_of(&out);
    assert_eq!(failure.code, "TRANSPORT");
    let prefix = format!("API stream from {} failed: ", server.base_url());
    assert!(failure.message.starts_with(&prefix), "{failure:?}");
    out
}

/// §9.29.30: a stall past the idle timeout — after headers, and before them.
async fn scenario_stalls(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![
        Behaviour::Stream {
            steps: vec![Step::Write(sse(&[
                json!({"choices":[{"delta":{"content":"a"}}]}),
            ]))],
            ending: Ending::Stall,
        },
        Behaviour::StallBeforeHeaders,
    ])
    .await;
    let p = provider(&server, key, |c| c.idle_timeout_ms = 300);
    let after_headers = collect(&p, request("hi")).await;
    assert_eq!(after_headers.len(), 3);
    assert_eq!(
        after_headers[2],
        error_chunk(LlmFailure::new(
            "TIMEOUT",
            "idle timeout after 300ms waiting for the stream"
        ))
    );
    let before_headers = collect(&p, request("hi")).await;
    assert_eq!(
        before_headers,
        vec![error_chunk(LlmFailure::new(
            "TIMEOUT",
            "idle timeout after 300ms waiting for response headers"
        ))]
    );
    // Both stalled connections were abandoned by the client.
    server.wait_closed_by_client(2).await;
    [after_headers, before_headers].concat()
}

/// §9.29.31: comments keep an otherwise idle stream alive past the idle timeout.
async fn scenario_keep_alive(key: &str) -> Vec<StreamChunk> {
    let mut steps = vec![];
    for _ in 0..8 {
        steps.push(Step::Write(b": keep-alive\n\n".to_vec()));
        steps.push(Step::Sleep(Duration::from_millis(100)));
    }
    steps.push(Step::Write(text_body()));
    let server = FakeServer::start(vec![Behaviour::Stream {
        steps,
        ending: Ending::Clean,
    }])
    .await;
    let out = collect(
        &provider(&server, key, |c| c.idle_timeout_ms = 500),
        request("hi"),
    )
    .await;
    assert_eq!(out, text_chunks());
    out
}

/// §9.26.4, §7.6 `stream_eof`/`empty_body`: a clean end without `[DONE]`.
async fn scenario_no_done(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![
        Behaviour::sse(sse(&[json!({"choices":[{"delta":{"content":"a"}}]})])),
        Behaviour::sse(Vec::new()),
        Behaviour::sse(b"data: [DONE]\n".to_vec()),
    ])
    .await;
    let p = provider(&server, key, |_| {});
    let closed = error_chunk(LlmFailure::new(
        "STREAM_CLOSED",
        "SSE stream ended without [DONE]",
    ));
    let partial = collect(&p, request("hi")).await;
    assert_eq!(partial.len(), 3);
    assert_eq!(partial[2], closed);
    assert_eq!(collect(&p, request("hi")).await, vec![closed.clone()]);
    assert_eq!(collect(&p, request("hi")).await, vec![closed.clone()]);
    partial
}

/// §7.6 `empty`: a content-less stop is EMPTY_RESPONSE, after usage.
async fn scenario_empty(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![Behaviour::sse(sse_done(&[
        json!({"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":0}}),
    ]))])
    .await;
    let out = collect(&provider(&server, key, |_| {}), request("hi")).await;
    assert_eq!(
        out,
        chunks(json!([
            {"type":"usage","usage":{"inputTokens":3,"outputTokens":0}},
            {"type":"finish","reason":{"kind":"error","failure":{"message":"model returned a completed response with no content","code":"EMPTY_RESPONSE"}}}
        ]))
    );
    out
}

/// §9.29.27: cancelling mid-stream ends with `finish{aborted}` and the server sees the connection
/// close; dropping the stream closes it too.
async fn scenario_cancel(key: &str) -> Vec<StreamChunk> {
    let first = sse(&[json!({"choices":[{"delta":{"content":"a"}}]})]);
    let held = || Behaviour::Stream {
        steps: vec![Step::Write(first.clone())],
        ending: Ending::Stall,
    };
    let server = FakeServer::start(vec![held(), held()]).await;
    let p = provider(&server, key, |_| {});
    let cancel = CancellationToken::new();
    let mut s = p.stream(request("hi"), cancel.clone());
    let mut out = vec![
        s.next().await.expect("block-start"),
        s.next().await.expect("text-delta"),
    ];
    assert_eq!(out, text_chunks_prefix("a"));
    let waiter = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cancel.cancel();
        }
    });
    let aborted = s.next().await.expect("the aborted finish");
    waiter.await.expect("canceller");
    assert_eq!(
        aborted,
        StreamChunk::finish(FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "request aborted by caller")
        })
    );
    assert_eq!(s.next().await, None);
    out.push(aborted);
    server.wait_closed_by_client(1).await;

    let mut dropped = p.stream(request("hi"), CancellationToken::new());
    assert!(dropped.next().await.is_some());
    drop(dropped);
    server.wait_closed_by_client(2).await;
    out
}

fn text_chunks_prefix(text: &str) -> Vec<StreamChunk> {
    chunks(json!([
        {"type":"block-start","index":0,"blockType":"text"},
        {"type":"text-delta","index":0,"text":text}
    ]))
}

/// §9.29.23, §7.5: a refused connection is TRANSPORT naming the endpoint, and a connection dropped
/// before headers is TRANSPORT too.
async fn scenario_transport(key: &str) -> Vec<StreamChunk> {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let p = OpenAiProvider::new(OpenAiConfig {
        base_url: format!("http://127.0.0.1:{port}"),
        api_key: Some(ApiKey::new(key).expect("valid")),
        ..OpenAiConfig::default()
    })
    .expect("valid");
    let refused = collect(&p, request("hi")).await;
    let failure = failure_of(&refused);
    assert_eq!(failure.code, "TRANSPORT");
    let prefix = format!("API request to http://127.0.0.1:{port} failed: ");
    assert!(failure.message.starts_with(&prefix), "{failure:?}");

    let server = FakeServer::start(vec![Behaviour::DropBeforeHeaders]).await;
    let dropped = collect(&provider(&server, key, |_| {}), request("hi")).await;
    assert_eq!(failure_of(&dropped).code, "TRANSPORT");
    [refused, dropped].concat()
}

/// The same valid stream written one byte per HTTP chunk decodes to the same chunks.
async fn scenario_byte_per_frame(key: &str) -> Vec<StreamChunk> {
    let mut body = b"\xEF\xBB\xBF".to_vec();
    body.extend(
        String::from_utf8(reasoning_body())
            .expect("utf8")
            .replace('\n', "\r\n")
            .into_bytes(),
    );
    let server = FakeServer::start(vec![Behaviour::Stream {
        steps: body.iter().map(|b| Step::Write(vec![*b])).collect(),
        ending: Ending::Clean,
    }])
    .await;
    let out = collect(&provider(&server, key, |_| {}), request("hi")).await;
    assert_eq!(out, decode_whole(&reasoning_body()));
    out
}

/// §9.29.55: no key → MISSING_CREDENTIAL before any I/O.
async fn scenario_missing_key() -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![Behaviour::sse(text_body())]).await;
    let p = OpenAiProvider::new(OpenAiConfig {
        base_url: server.base_url(),
        api_key: None,
        ..OpenAiConfig::default()
    })
    .expect("valid");
    let out = collect(&p, request("hi")).await;
    let failure = failure_of(&out);
    assert_eq!(failure.code, "MISSING_CREDENTIAL");
    assert!(failure.message.contains("DEEPSEEK_API_KEY"), "{failure:?}");
    assert_eq!(server.requests().len(), 0);
    out
}

/// The password a base URL carries in the userinfo tests, as it appears in the URL and decoded.
const URL_PASSWORD_ENCODED: &str = "s3cret%2Fpw-9f2c";
const URL_PASSWORD: &str = "s3cret/pw-9f2c";
/// `base64("us@er:s3cret/pw-9f2c")`: the Basic credentials that userinfo stands for.
const URL_BASIC: &str = "Basic dXNAZXI6czNjcmV0L3B3LTlmMmM=";

/// `server`'s base URL with userinfo: a percent-encoded `@` in the user, `/` in the password.
fn base_url_with_userinfo(server: &FakeServer) -> String {
    format!(
        "http://us%40er:{URL_PASSWORD_ENCODED}@{}/v1?api-version=2024-06-01",
        server.addr
    )
}

/// A base URL's query stays a query: the path is joined before it, and every request carries it.
async fn scenario_base_url_query(key: &str) -> Vec<StreamChunk> {
    let server = FakeServer::start(vec![Behaviour::sse(text_body())]).await;
    let p = provider(&server, key, |c| {
        c.base_url = format!(
            "{}/?api-version=2024-06-01&deployment=a%2Fb",
            server.base_url()
        );
    });
    let out = collect(&p, request("hi")).await;
    assert_eq!(out, text_chunks());
    let reqs = server.requests();
    assert_eq!(
        reqs.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
        ["/v1/chat/completions?api-version=2024-06-01&deployment=a%2Fb"]
    );
    assert_eq!(
        reqs[0].header("authorization"),
        Some(format!("Bearer {key}").as_str())
    );
    out
}

/// Userinfo in the base URL: sent as HTTP Basic in place of the key, and absent from every failure
/// message, which names the base URL without it — a transport failure's as much as a server's that
/// echoes the password back.
async fn scenario_userinfo(key: &str) -> Vec<StreamChunk> {
    let echo = json!({"error":{"message": format!("proxy refused {URL_PASSWORD} ({URL_PASSWORD_ENCODED})")}})
        .to_string();
    let server = FakeServer::start(vec![
        Behaviour::sse(text_body()),
        Behaviour::DropBeforeHeaders,
        Behaviour::status(503, &echo, &[]),
    ])
    .await;
    let p = provider(&server, key, |c| {
        c.base_url = base_url_with_userinfo(&server)
    });
    let ok = collect(&p, request("hi")).await;
    assert_eq!(ok, text_chunks());
    let dropped = collect(&p, request("hi")).await;
    let failure = failure_of(&dropped);
    assert_eq!(failure.code, "TRANSPORT");
    let prefix = format!(
        "API request to http://{}/v1?api-version=2024-06-01 failed: ",
        server.addr
    );
    assert!(failure.message.starts_with(&prefix), "{failure:?}");
    let echoed = collect(&p, request("hi")).await;
    assert_eq!(
        (
            failure_of(&echoed).code.as_str(),
            failure_of(&echoed).message.as_str()
        ),
        ("SERVER", "proxy refused <redacted> (<redacted>)")
    );
    let reqs = server.requests();
    assert_eq!(reqs.len(), 3);
    for r in &reqs {
        assert_eq!(r.path, "/v1/chat/completions?api-version=2024-06-01");
        assert_eq!(
            r.header("authorization"),
            Some(URL_BASIC),
            "the URL's credentials win"
        );
        assert_eq!(
            r.headers
                .iter()
                .filter(|(k, _)| k == "authorization")
                .count(),
            1
        );
    }
    [ok, dropped, echoed].concat()
}

/// Every text a user may see about a provider whose base URL has userinfo: `Debug` of the
/// configuration and the provider, and the error for such a URL that does not parse.
fn userinfo_texts(base_url: &str) -> Vec<String> {
    let config = OpenAiConfig {
        base_url: base_url.to_owned(),
        ..OpenAiConfig::default()
    };
    let provider = OpenAiProvider::new(config.clone()).expect("valid");
    let unparsable = OpenAiProvider::new(OpenAiConfig {
        base_url: base_url.replace("/v1", ":99999/v1"),
        ..OpenAiConfig::default()
    })
    .expect_err("port out of range");
    vec![
        format!("{config:?}"),
        format!("{provider:?}"),
        unparsable.to_string(),
    ]
}

fn httpdate_in(d: Duration) -> String {
    let at = std::time::SystemTime::now() + d;
    let secs = at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after epoch")
        .as_secs();
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant), for the test's own date formatting.
    let z = days as i64 + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    format!(
        "{}, {day:02} {} {year} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------------------------------
// Tests

#[tokio::test]
async fn text_stream_and_exact_request() {
    scenario_text(canary()).await;
}

#[tokio::test]
async fn reasoning_then_text() {
    scenario_reasoning(canary()).await;
}

#[tokio::test]
async fn two_parallel_tool_calls_with_interleaved_deltas() {
    scenario_parallel_tools(canary()).await;
}

#[tokio::test]
async fn usage_with_cache_hits() {
    scenario_usage(canary()).await;
}

#[tokio::test]
async fn each_error_status_with_its_body() {
    scenario_error_statuses(canary()).await;
}

#[tokio::test]
async fn rate_limit_with_retry_after_and_request_id() {
    scenario_retry_after(canary()).await;
}

#[tokio::test]
async fn a_key_echoed_by_the_server_is_scrubbed() {
    scenario_echoed_key(canary()).await;
}

#[tokio::test]
async fn malformed_json_data_line() {
    scenario_malformed(canary()).await;
}

#[tokio::test]
async fn oversized_line() {
    scenario_oversized_line(canary()).await;
}

#[tokio::test]
async fn disconnect_after_k_events() {
    scenario_disconnect(canary()).await;
}

#[tokio::test]
async fn stall_past_the_idle_timeout() {
    scenario_stalls(canary()).await;
}

#[tokio::test]
async fn comments_keep_an_idle_stream_alive() {
    scenario_keep_alive(canary()).await;
}

#[tokio::test]
async fn stream_without_done() {
    scenario_no_done(canary()).await;
}

#[tokio::test]
async fn content_less_stop_is_empty_response() {
    scenario_empty(canary()).await;
}

#[tokio::test]
async fn cancellation_mid_stream_closes_the_connection() {
    scenario_cancel(canary()).await;
}

#[tokio::test]
async fn transport_failures() {
    scenario_transport(canary()).await;
}

#[tokio::test]
async fn one_byte_per_http_chunk() {
    scenario_byte_per_frame(canary()).await;
}

/// §9.29.25: a 2xx without a body is EMPTY_RESPONSE; §9.29.24: a request cancelled before it starts
/// ends `aborted` without any I/O.
#[tokio::test]
async fn no_content_and_pre_cancelled_requests() {
    let server = FakeServer::start(vec![Behaviour::status(204, "", &[])]).await;
    let p = provider(&server, canary(), |_| {});
    assert_eq!(
        collect(&p, request("hi")).await,
        vec![error_chunk(LlmFailure::new(
            "EMPTY_RESPONSE",
            "API returned no response body"
        ))]
    );
    let cancel = CancellationToken::new();
    cancel.cancel();
    let out: Vec<StreamChunk> = p.stream(request("hi"), cancel).collect().await;
    assert_eq!(
        out,
        vec![StreamChunk::finish(FinishReason::Aborted {
            failure: LlmFailure::new("ABORTED", "request aborted by caller")
        })]
    );
    assert_eq!(
        server.requests().len(),
        1,
        "the cancelled request was never sent"
    );
}

/// A stream that ended with `[DONE]` hands its connection back: the next request reuses it.
#[tokio::test]
async fn a_finished_stream_leaves_its_connection_reusable() {
    let server = FakeServer::start_keep_alive(vec![
        Behaviour::sse(text_body()),
        Behaviour::sse(text_body()),
    ])
    .await;
    let p = provider(&server, canary(), |_| {});
    assert_eq!(collect(&p, request("hi")).await, text_chunks());
    assert_eq!(collect(&p, request("hi")).await, text_chunks());
    assert_eq!(server.requests().len(), 2);
    assert_eq!(
        server.n_connections(),
        1,
        "the second request reused the first connection"
    );
}

#[tokio::test]
async fn a_base_url_query_is_kept_after_the_joined_path() {
    scenario_base_url_query(canary()).await;
}

#[tokio::test]
async fn base_url_userinfo_is_basic_auth_and_never_shown() {
    let seen = scenario_userinfo(canary()).await;
    let json = serde_json::to_string(&seen).expect("serializable");
    assert!(!json.contains(URL_PASSWORD), "{json}");
    assert!(!json.contains(URL_PASSWORD_ENCODED), "{json}");
    for text in userinfo_texts("http://us%40er:s3cret%2Fpw-9f2c@127.0.0.1:9/v1") {
        assert!(!text.contains(URL_PASSWORD_ENCODED), "{text}");
        assert!(!text.contains(URL_PASSWORD), "{text}");
        assert!(!text.contains("us%40er"), "{text}");
    }
}

/// With userinfo and no API key there is still a credential: requests are sent, as Basic.
#[tokio::test]
async fn base_url_userinfo_needs_no_api_key() {
    let server = FakeServer::start(vec![Behaviour::sse(text_body())]).await;
    let config = OpenAiConfig {
        base_url: base_url_with_userinfo(&server),
        api_key: None,
        ..OpenAiConfig::default()
    };
    assert!(config.has_credential());
    assert!(!OpenAiConfig::default().has_credential());
    let p = OpenAiProvider::new(config).expect("valid");
    assert_eq!(collect(&p, request("hi")).await, text_chunks());
    assert_eq!(
        server.requests()[0].header("authorization"),
        Some(URL_BASIC)
    );
}

/// The session log of an agent whose provider's base URL has userinfo: the failures it records
/// (every retry's, the turn's end) name the endpoint without the password.
#[tokio::test]
async fn no_session_event_carries_base_url_credentials() {
    use dsh::llm::retry::{Backoff, RetryHook, RetryPolicy};
    use dsh::session::store::memory::MemoryStore;
    use dsh::turn::AgentConfig;
    use dsh_actors::{AgentSpec, Host};

    let echo = json!({"error":{"message": format!("bad password {URL_PASSWORD}")}}).to_string();
    let server = FakeServer::start(vec![
        Behaviour::DropBeforeHeaders,
        Behaviour::status(500, &echo, &[]),
        Behaviour::DropBeforeHeaders,
    ])
    .await;
    let p = provider(&server, canary(), |c| {
        c.base_url = base_url_with_userinfo(&server)
    });
    let mut providers = ProviderRegistry::new();
    providers.register(Arc::new(p));
    let fast = RetryPolicy {
        backoff: Backoff {
            initial_delay_ms: 1,
            max_delay_ms: 1,
            jitter_ratio: 0.0,
        },
        ..RetryPolicy::default()
    }
    .with_max_retries(2);
    let mut hooks = dsh::hooks::Hooks::new();
    hooks
        .request_error
        .push(Arc::new(RetryHook::with_policy(fast)));
    let host = Host::builder(Arc::new(MemoryStore::new()))
        .providers(providers)
        .hooks(hooks)
        .start()
        .await
        .expect("host");
    let agent = host
        .create(AgentSpec::new(AgentConfig::new(
            "openai",
            "deepseek-v4-flash",
        )))
        .await
        .expect("agent");
    agent
        .followup(Message::user_text(MessageId::new("m1").expect("id"), "hi"))
        .await
        .expect("durable");
    agent.when_idle().await.expect("idle");
    let log: Vec<String> = agent
        .log()
        .await
        .expect("log")
        .iter()
        .map(|e| e.to_json())
        .collect();
    host.shutdown().await;
    assert_eq!(server.requests().len(), 3, "one attempt and two retries");
    let shown = format!("http://{}/v1?api-version=2024-06-01", server.addr);
    let n_naming_endpoint = log.iter().filter(|e| e.contains(&shown)).count();
    assert!(n_naming_endpoint >= 3, "{log:#?}");
    for event in &log {
        assert!(!event.contains(URL_PASSWORD), "{event}");
        assert!(!event.contains(URL_PASSWORD_ENCODED), "{event}");
        assert!(!event.contains("us%40er"), "{event}");
    }
    let end = log
        .iter()
        .find(|e| e.contains("\"turn/end\""))
        .expect("turn/end");
    assert!(
        end.contains(&format!("API request to {shown} failed: ")),
        "{end}"
    );
}

#[tokio::test]
async fn missing_key_fails_before_io() {
    scenario_missing_key().await;
}

fn decode_whole(body: &[u8]) -> Vec<StreamChunk> {
    let mut d = ChunkDecoder::new(&Limits::DEFAULT);
    let mut out = Vec::new();
    d.feed(body, &mut out).expect("valid stream");
    d.finish().expect("done");
    out
}

/// Every valid stream of this suite, cut at every byte boundary (in two, and also at every boundary
/// at once), decodes to the same chunks as the whole body.
#[test]
fn every_valid_stream_split_at_every_byte_boundary() {
    let crlf = String::from_utf8(tools_body())
        .expect("utf8")
        .replace('\n', "\r\n")
        .into_bytes();
    let cr = String::from_utf8(usage_body())
        .expect("utf8")
        .replace('\n', "\r")
        .into_bytes();
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(text_body());
    let mut unicode = sse(&[json!({"choices":[{"delta":{"content":"héllo 🌍 — ok"}}]})]);
    unicode.extend_from_slice(b": keep-alive\n\ndata: [DONE]\n\n");
    for body in [
        text_body(),
        reasoning_body(),
        tools_body(),
        usage_body(),
        crlf,
        cr,
        bom,
        unicode,
    ] {
        let whole = decode_whole(&body);
        assert!(whole.last().is_some_and(StreamChunk::is_finish));
        for cut in 0..=body.len() {
            let mut d = ChunkDecoder::new(&Limits::DEFAULT);
            let mut out = Vec::new();
            d.feed(&body[..cut], &mut out).expect("valid prefix");
            d.feed(&body[cut..], &mut out).expect("valid suffix");
            d.finish().expect("done");
            assert_eq!(out, whole, "cut at byte {cut}");
        }
        let mut d = ChunkDecoder::new(&Limits::DEFAULT);
        let mut out = Vec::new();
        for b in &body {
            d.feed(std::slice::from_ref(b), &mut out)
                .expect("valid byte");
        }
        d.finish().expect("done");
        assert_eq!(out, whole, "one byte at a time");
    }
}

/// A `Write` into a shared buffer, for capturing tracing output.
#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("capture lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The canary: the whole catalogue again, on one thread under a TRACE-level capture (ours, reqwest's
/// and hyper's events), then every log line, chunk, failure, error and `Debug` searched for the key.
#[test]
fn the_api_key_appears_nowhere() {
    let key = canary();
    let buf = Arc::new(Mutex::new(Vec::new()));
    let writer = Capture(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The global default, not a scoped one: with a single registered dispatcher, tracing computes a
    // new callsite's interest from the registering thread's default, so a callsite first hit by a
    // concurrent test would be cached as disabled. Globally, every thread's events (the concurrent
    // tests use the same key) are captured too.
    tracing::subscriber::set_global_default(subscriber)
        .expect("only this test installs a global subscriber");
    let seen: Vec<StreamChunk> = {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let mut all = Vec::new();
            all.extend(scenario_text(key).await);
            all.extend(scenario_reasoning(key).await);
            all.extend(scenario_parallel_tools(key).await);
            all.extend(scenario_usage(key).await);
            all.extend(scenario_error_statuses(key).await);
            all.extend(scenario_retry_after(key).await);
            all.extend(scenario_echoed_key(key).await);
            all.extend(scenario_malformed(key).await);
            all.extend(scenario_oversized_line(key).await);
            all.extend(scenario_disconnect(key).await);
            all.extend(scenario_stalls(key).await);
            all.extend(scenario_no_done(key).await);
            all.extend(scenario_empty(key).await);
            all.extend(scenario_cancel(key).await);
            all.extend(scenario_transport(key).await);
            all.extend(scenario_base_url_query(key).await);
            all.extend(scenario_userinfo(key).await);
            all
        })
    };
    let log = String::from_utf8(buf.lock().expect("lock").clone()).expect("utf8 log");
    assert!(
        log.contains("openai request"),
        "the capture must see the provider's own events"
    );
    assert!(
        log.contains("hyper_util"),
        "the capture must see the HTTP stack's TRACE events"
    );
    assert!(!log.contains(key), "the key leaked into the log");
    let basic_token = URL_BASIC.trim_start_matches("Basic ");
    for secret in [URL_PASSWORD, URL_PASSWORD_ENCODED, basic_token] {
        assert!(
            !log.contains(secret),
            "the base URL's password leaked into the log"
        );
    }
    let json = serde_json::to_string(&seen).expect("serializable");
    assert!(json.contains("Incorrect API key provided: <redacted>."));
    assert!(
        !json.contains(key),
        "the key leaked into a chunk or failure"
    );

    let config = OpenAiConfig {
        api_key: Some(ApiKey::new(key).expect("valid")),
        ..OpenAiConfig::default()
    };
    let provider = OpenAiProvider::new(config.clone()).expect("valid");
    let mut texts = vec![
        format!("{config:?}"),
        format!("{provider:?}"),
        format!("{:?}", config.api_key),
        ApiKey::from_source(&format!("{key} with spaces"), "DEEPSEEK_API_KEY")
            .expect_err("spaces are invalid")
            .to_string(),
    ];
    let lookup = |name: &str| (name == "DEEPSEEK_API_KEY").then(|| format!("{key}\u{7f}"));
    texts.push(
        OpenAiConfig::from_lookup(lookup)
            .expect_err("DEL is invalid")
            .to_string(),
    );
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        panic!("provider failed: {provider:?}")
    }))
    .expect_err("panics");
    texts.push(
        panic
            .downcast_ref::<String>()
            .cloned()
            .expect("formatted panic message"),
    );
    for text in &texts {
        assert!(!text.contains(key), "the key leaked: {text}");
    }
    assert!(texts[0].contains("ApiKey(<redacted>)"));
}

#[tokio::test]
async fn providers_register_by_route_name() {
    let server = FakeServer::start(vec![Behaviour::sse(text_body())]).await;
    let mut registry = ProviderRegistry::new();
    registry.register(Arc::new(provider(&server, canary(), |c| {
        c.route = "deepseek".into()
    })));
    registry.register(Arc::new(
        SimProvider::new(SimConfig::instant(1)).expect("valid"),
    ));
    registry.register(Arc::new(ScriptProvider::new(
        [ScriptEntry::text("ok")],
        Gates::new(),
    )));
    assert_eq!(
        registry.names().collect::<Vec<_>>(),
        ["deepseek", "script", "sim"]
    );
    let deepseek = registry.get("deepseek").expect("registered");
    assert_eq!(
        collect(deepseek.as_ref(), request("hi")).await,
        text_chunks()
    );
    let script = registry.get("script").expect("registered");
    let out = collect(script.as_ref(), request("hi")).await;
    assert_eq!(out.last(), Some(&StreamChunk::finish(FinishReason::Stop)));
}

/// Opt-in: one streamed tool round trip against the real DeepSeek API. Skipped (with a note) unless
/// `DEEPSEEK_API_KEY` is set.
#[tokio::test]
async fn live_deepseek_tool_round_trip() {
    if std::env::var("DEEPSEEK_API_KEY").map_or(true, |k| k.trim().is_empty()) {
        println!("skipped live_deepseek_tool_round_trip: DEEPSEEK_API_KEY is not set");
        return;
    }
    let config = OpenAiConfig::from_env().expect("usable environment");
    let model = config.model.clone();
    let p = OpenAiProvider::new(config).expect("valid config");
    let tool = ToolSchema {
        name: "get_weather".into(),
        description: "Current weather for a city.".into(),
        parameters: json!({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}),
    };
    let mut r = LlmRequest {
        config: LlmCallConfig {
            provider: "openai".into(),
            model: model.clone(),
            max_tokens: Some(512),
            ..LlmCallConfig::default()
        },
        system: Some(
            "Use the get_weather tool to answer weather questions. Answer in one sentence.".into(),
        ),
        tools: vec![tool],
        messages: vec![user("What is the weather in Paris right now?")].into(),
        session_id: None,
        purpose: None,
    };
    let first = collect(&p, r.clone()).await;
    assert_eq!(
        first.last(),
        Some(&StreamChunk::finish(FinishReason::ToolCalls)),
        "{first:?}"
    );
    let blocks: Vec<ContentBlock> = first
        .iter()
        .filter_map(|c| match c {
            StreamChunk::BlockEnd { block, .. } => Some(block.clone()),
            _ => None,
        })
        .collect();
    let call_id = blocks
        .iter()
        .find_map(|b| match b {
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
            } => {
                assert_eq!(name, "get_weather");
                let args: Value = serde_json::from_str(arguments).expect("JSON arguments");
                assert!(
                    args["city"].as_str().is_some_and(|c| c.contains("Paris")),
                    "{args}"
                );
                Some(id.clone())
            }
            _ => None,
        })
        .expect("a tool call");
    r.messages.push(Arc::new(Message {
        id: MessageId::new("a1").expect("id"),
        role: Role::Assistant,
        content: blocks,
        source: MessageSource::model("openai", &model),
    }));
    r.messages.push(Arc::new(Message {
        id: MessageId::new("r1").expect("id"),
        role: Role::User,
        content: vec![ContentBlock::ToolResult {
            tool_call_id: call_id.clone(),
            content: vec![ContentBlock::text("18 degrees Celsius, light rain")],
            is_error: None,
        }],
        source: MessageSource::tool(&call_id),
    }));
    let second = collect(&p, r).await;
    assert_eq!(
        second.last(),
        Some(&StreamChunk::finish(FinishReason::Stop)),
        "{second:?}"
    );
    let text: String = second
        .iter()
        .filter_map(|c| match c {
            StreamChunk::TextDelta { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert!(text.contains("18"), "{text}");
}
