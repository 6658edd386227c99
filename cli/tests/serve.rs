//! `dsh serve` over real HTTP on 127.0.0.1 (SPEC §13): the built binary with the `sim` provider and
//! no key, in a temporary directory. Each route and status is checked with its exact body; event
//! streams are read as a client reads them; the drain is driven by a real SIGTERM.

mod serve_support;

use serde_json::{Value, json};
use serve_support::{FAST_SIM, SLOW_SIM, Server, kinds, serve_command};

fn error(code: &str) -> impl Fn(&Value) -> bool + '_ {
    move |v: &Value| v["error"]["code"] == code
}

fn message(v: &Value) -> &str {
    v["error"]["message"].as_str().unwrap_or("")
}

#[tokio::test]
async fn sessions_are_created_listed_and_got() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    assert_eq!(
        s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
            .await,
        (201, json!({"id": "a"}))
    );
    let (status, body) = s
        .call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    assert_eq!(status, 409);
    assert!(error("session_exists")(&body), "{body}");
    assert_eq!(message(&body), "session a already exists");
    let (status, minted) = s.call("POST", "/v1/sessions", None).await;
    assert_eq!(status, 201);
    let minted = minted["id"].as_str().expect("a minted id").to_string();
    assert!(minted.starts_with("s-"), "{minted}");

    for (body, field) in [
        (json!({"id": "a/b"}), "field `id`"),
        (json!({"idd": "x"}), "unknown field `idd`"),
        (json!({"provider": "openai"}), "field `provider`"),
        (json!({"max_tokens": "ten"}), "field `max_tokens`"),
        (json!({"max_tokens": 0}), "field `max_tokens`"),
    ] {
        let (status, answer) = s.call("POST", "/v1/sessions", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}");
        assert!(error("bad_request")(&answer), "{answer}");
        assert!(message(&answer).contains(field), "{body} → {answer}");
    }

    let (status, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        info,
        json!({"id": "a", "status": "idle", "events": 0, "pending": {"next_turn": 0, "next_step": 0}})
    );
    let (status, body) = s.call("GET", "/v1/sessions/nope", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    assert_eq!(message(&body), "session nope not found");

    let (status, list) = s.call("GET", "/v1/sessions", None).await;
    assert_eq!(status, 200);
    let mut ids: Vec<&str> = list["sessions"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r["id"].as_str().expect("id"))
        .collect();
    ids.sort();
    let mut want = vec!["a", minted.as_str()];
    want.sort();
    assert_eq!(ids, want);
    assert!(list.get("next").is_none(), "{list}");
    let (status, page) = s.call("GET", "/v1/sessions?limit=1", None).await;
    assert_eq!(status, 200);
    assert_eq!(page["sessions"].as_array().map(Vec::len), Some(1));
    let next = page["next"].as_str().expect("a next cursor");
    let (_, page2) = s
        .call("GET", &format!("/v1/sessions?limit=1&after={next}"), None)
        .await;
    assert_eq!(page2["sessions"].as_array().map(Vec::len), Some(1));
    assert_ne!(page2["sessions"][0]["id"], page["sessions"][0]["id"]);
    assert!(page2.get("next").is_none(), "{page2}");
    let (status, body) = s.call("GET", "/v1/sessions?limit=0", None).await;
    assert_eq!(status, 400);
    assert!(message(&body).contains("field `limit`"), "{body}");
    let (status, body) = s.call("GET", "/v1/nothing", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    assert!(s.stop().success());
}

#[tokio::test]
async fn a_followup_is_acknowledged_once_durable_and_never_applied_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    let first = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"id": "m1", "text": "hi"})),
        )
        .await;
    assert_eq!(first, (202, json!({"message_id": "m1", "seq": 0})));
    // The same id while it may still be pending or running: the first answer, 200.
    let again = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"id": "m1", "text": "hi"})),
        )
        .await;
    assert_eq!(again, (200, json!({"message_id": "m1", "seq": 0})));
    let mut stream = s.events("/v1/sessions/a/events", None).await;
    let events = stream.until("turn/end").await;
    assert_eq!(events[0].event, "agent/inbox/spliced");
    assert_eq!(
        events
            .last()
            .map(|e| e.data["data"]["reason"]["kind"].clone()),
        Some(json!("completed"))
    );
    // After it was consumed, still the first answer, and no second turn.
    let again = s
        .call(
            "POST",
            "/v1/sessions/a/steer",
            Some(json!({"id": "m1", "text": "other"})),
        )
        .await;
    assert_eq!(again, (200, json!({"message_id": "m1", "seq": 0})));
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    let n_events = info["events"].as_u64().expect("events");
    assert!(s.stop().success());

    // After a restart the log still answers for the id.
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    let again = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"id": "m1", "text": "hi"})),
        )
        .await;
    assert_eq!(again, (200, json!({"message_id": "m1", "seq": 0})));
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["status"], "idle");
    // Nothing was applied: after the first server's events the resumed agent wrote at most its
    // `session/end-seed`.
    let after = s
        .events(
            &format!("/v1/sessions/a/events?follow=false&after={}", n_events - 1),
            None,
        )
        .await
        .rest()
        .await;
    assert!(
        kinds(&after).iter().all(|k| *k == "session/end-seed"),
        "{:?}",
        kinds(&after)
    );
    // A new id is applied: its seq is that of its splice (after the `session/end-seed` the
    // resumed agent writes first).
    let (status, ack) = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"id": "m2", "text": "more"})),
        )
        .await;
    assert_eq!(status, 202);
    let seq = ack["seq"].as_u64().expect("a seq");
    assert!(seq >= n_events, "{ack}");
    let splice = s
        .events(
            &format!("/v1/sessions/a/events?follow=false&after={}", seq - 1),
            None,
        )
        .await
        .next()
        .await
        .expect("the splice");
    assert_eq!(
        (splice.id, splice.event.as_str()),
        (Some(seq), "agent/inbox/spliced")
    );
    assert_eq!(splice.data["data"]["inserted"][0]["id"], "m2");
    assert!(s.stop().success());
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    for (body, status, code, needle) in [
        (json!({}), 400, "bad_request", "field `text`"),
        (
            json!({"text": "a", "message": {"id": "x", "role": "user", "content": [], "source": {"kind": "user"}}}),
            400,
            "bad_request",
            "field `text`",
        ),
        (
            json!({"text": 5}),
            400,
            "bad_request",
            "field `text`: invalid type",
        ),
        (
            json!({"text": "a", "id": ""}),
            400,
            "bad_request",
            "field `id`",
        ),
        (
            json!({"message": {"id": "x", "role": "assistant", "content": [{"type": "text", "text": "a"}], "source": {"kind": "user"}}}),
            400,
            "bad_request",
            "field `message`",
        ),
        (
            // A message's own keys are strict (server input is not a log): the unknown key is named.
            json!({"message": {"id": "x", "role": "user", "content": [{"type": "text", "text": "a"}], "source": {"kind": "user"}, "metadata": {}}}),
            400,
            "bad_request",
            "field `message`: unknown field `metadata`",
        ),
        (
            json!({"text": "x".repeat(1_100_000)}),
            413,
            "too_large",
            "field `message`",
        ),
    ] {
        let (got, answer) = s
            .call("POST", "/v1/sessions/a/followup", Some(body.clone()))
            .await;
        assert_eq!(got, status, "{answer}");
        assert!(error(code)(&answer), "{answer}");
        assert!(message(&answer).contains(needle), "{needle}: {answer}");
    }
    let (got, answer) = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"text": "x".repeat(3 << 20)})),
        )
        .await;
    assert_eq!(got, 413, "{answer}");
    assert!(error("too_large")(&answer), "{answer}");
    // The overflowing body was left unread, so the server must not keep that connection for another
    // request: a client that reused it could see it closed under its next request.
    let resp = s
        .client
        .post(s.url("/v1/sessions/a/followup"))
        .json(&json!({"text": "x".repeat(3 << 20)}))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 413);
    assert_eq!(
        resp.headers()
            .get("connection")
            .and_then(|v| v.to_str().ok()),
        Some("close")
    );
    let resp = s
        .client
        .post(s.url("/v1/sessions/a/followup"))
        .body("{not json")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 400);
    let answer: Value = resp.json_value().await;
    assert!(message(&answer).starts_with("body: "), "{answer}");
    let (got, answer) = s
        .call(
            "POST",
            "/v1/sessions/nope/followup",
            Some(json!({"text": "a"})),
        )
        .await;
    assert_eq!(
        (got, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (got, answer) = s
        .call(
            "POST",
            "/v1/sessions/bad%2Fid/followup",
            Some(json!({"text": "a"})),
        )
        .await;
    assert_eq!(got, 400, "{answer}");
    // Nothing was written by any refusal.
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["events"], 0);
    let (got, answer) = s.call("POST", "/v1/sessions/a/compact", None).await;
    assert_eq!(
        (got, answer["error"]["code"].as_str()),
        (409, Some("nothing_to_compact"))
    );
    let (got, answer) = s.call("POST", "/v1/sessions/nope/compact", None).await;
    assert_eq!(
        (got, answer["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["events"], 0, "a refused compaction writes nothing");
    assert!(s.stop().success());
}

#[tokio::test]
async fn a_full_inbox_is_429_with_retry_after() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    for i in 0..1024 {
        let (status, _) = s
            .call(
                "POST",
                "/v1/sessions/a/inject",
                Some(json!({"text": format!("m{i}")})),
            )
            .await;
        assert_eq!(status, 202, "inject {i}");
    }
    let resp = s
        .client
        .post(s.url("/v1/sessions/a/inject"))
        .header("content-type", "application/json")
        .body(json!({"text": "one too many"}).to_string())
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json_value().await;
    assert!(error("inbox_full")(&body), "{body}");
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["pending"], json!({"next_turn": 0, "next_step": 1024}));
    assert!(s.stop().success());
}

#[tokio::test]
async fn pending_input_is_removed_replaced_and_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    assert_eq!(
        s.call(
            "POST",
            "/v1/sessions/a/inject",
            Some(json!({"id": "m1", "text": "one"}))
        )
        .await,
        (202, json!({"message_id": "m1", "seq": 0}))
    );
    assert_eq!(
        s.call(
            "POST",
            "/v1/sessions/a/inject",
            Some(json!({"id": "m2", "text": "two"}))
        )
        .await,
        (202, json!({"message_id": "m2", "seq": 1}))
    );
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["pending"], json!({"next_turn": 0, "next_step": 2}));
    assert_eq!(
        s.call(
            "PUT",
            "/v1/sessions/a/inbox/m1",
            Some(json!({"id": "m3", "text": "three"}))
        )
        .await,
        (200, json!({"message_id": "m1", "replaced_by": "m3"}))
    );
    assert_eq!(
        s.call("DELETE", "/v1/sessions/a/inbox/m2", None).await,
        (200, json!({"message_id": "m2"}))
    );
    let (status, body) = s.call("DELETE", "/v1/sessions/a/inbox/m2", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_pending"))
    );
    let (status, body) = s
        .call("PUT", "/v1/sessions/a/inbox/m1", Some(json!({"text": "x"})))
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_pending"))
    );
    let (status, body) = s
        .call("PUT", "/v1/sessions/a/inbox/m3", Some(json!({"txt": "x"})))
        .await;
    assert_eq!(status, 400);
    assert!(message(&body).contains("unknown field `txt`"), "{body}");
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["pending"], json!({"next_turn": 0, "next_step": 1}));
    assert_eq!(
        s.call(
            "POST",
            "/v1/sessions/a/cancel",
            Some(json!({"keep_inbox": true}))
        )
        .await,
        (202, json!({"cancelled": true}))
    );
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["pending"], json!({"next_turn": 0, "next_step": 1}));
    assert_eq!(
        s.call("POST", "/v1/sessions/a/cancel", None).await,
        (202, json!({"cancelled": true}))
    );
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["pending"], json!({"next_turn": 0, "next_step": 0}));
    let (status, _) = s.call("POST", "/v1/sessions/nope/cancel", None).await;
    assert_eq!(status, 404);
    let (status, _) = s.call("DELETE", "/v1/sessions/nope/inbox/m1", None).await;
    assert_eq!(status, 404);
    assert!(s.stop().success());
}

#[tokio::test]
async fn a_running_turn_is_steered_and_cancelled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), SLOW_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    let mut stream = s.events("/v1/sessions/a/events", None).await;
    s.call(
        "POST",
        "/v1/sessions/a/followup",
        Some(json!({"id": "m1", "text": "go"})),
    )
    .await;
    stream.until("assistant/chunk").await;
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["status"], "running");
    let (status, ack) = s
        .call(
            "POST",
            "/v1/sessions/a/steer",
            Some(json!({"id": "m2", "text": "faster"})),
        )
        .await;
    assert_eq!(status, 202);
    assert_eq!(ack["message_id"], "m2");
    assert_eq!(
        s.call("POST", "/v1/sessions/a/cancel", Some(json!({})))
            .await,
        (202, json!({"cancelled": true}))
    );
    let events = stream.until("turn/end").await;
    let end = events.last().expect("turn/end");
    assert_eq!(
        end.data["data"]["reason"],
        json!({"kind": "aborted", "reason": {"kind": "user"}})
    );
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["status"], "idle");
    assert!(s.stop().success());
}

#[tokio::test]
async fn messages_export_and_import() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    s.call(
        "POST",
        "/v1/sessions/a/followup",
        Some(json!({"id": "m1", "text": "hello"})),
    )
    .await;
    s.events("/v1/sessions/a/events", None)
        .await
        .until("turn/end")
        .await;
    let (status, messages) = s.call("GET", "/v1/sessions/a/messages", None).await;
    assert_eq!(status, 200);
    let messages = messages["messages"].as_array().expect("messages");
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert_eq!(messages[0]["id"], "m1");
    assert_eq!(
        messages[0]["content"],
        json!([{"type": "text", "text": "hello"}])
    );
    assert_eq!(messages[1]["role"], "assistant");

    let resp = s
        .client
        .get(s.url("/v1/sessions/a/export"))
        .send()
        .await
        .expect("export");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "application/x-ndjson");
    let exported = resp.text().await.expect("body");
    let lines: Vec<Value> = exported
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(lines[0]["id"], "a");
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(
        lines.len() as u64 - 1,
        info["events"].as_u64().expect("events")
    );

    let import = |q: &'static str, body: String| {
        let s = &s;
        async move {
            let resp = s
                .client
                .post(s.url(&format!("/v1/sessions/import{q}")))
                .body(body)
                .send()
                .await
                .expect("import");
            let status = resp.status().as_u16();
            (status, resp.json_value().await)
        }
    };
    let n = lines.len() - 1;
    assert_eq!(
        import("?id=b", exported.clone()).await,
        (201, json!({"id": "b", "events": n}))
    );
    let (status, body) = import("?id=b", exported.clone()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("session_exists"))
    );
    let (status, body) = import("", exported.clone()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("session_exists"))
    );
    let (status, body) = import("", "not json\n".into()).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("bad_request"))
    );
    let (status, body) = import("?id=a%2Fb", exported.clone()).await;
    assert_eq!(status, 400, "{body}");
    let (status, b_messages) = s.call("GET", "/v1/sessions/b/messages", None).await;
    assert_eq!(status, 200);
    assert_eq!(b_messages["messages"].as_array().map(Vec::len), Some(2));
    let (status, _) = s.call("GET", "/v1/sessions/nope/export", None).await;
    assert_eq!(status, 404);
    assert!(s.stop().success());
}

#[tokio::test]
async fn event_streams_replay_resume_and_end() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &["--keep-alive-ms", "20"]);
    s.create_with_followup("a", "one").await;
    let mut live = s.events("/v1/sessions/a/events", None).await;
    let first = live.until("turn/end").await;
    let n = first.len() as u64;
    let ids: Vec<Option<u64>> = first.iter().map(|e| e.id).collect();
    assert_eq!(ids, (0..n).map(Some).collect::<Vec<_>>());
    for e in &first {
        assert_eq!(e.data["seq"].as_u64(), e.id);
        assert_eq!(e.data["type"].as_str(), Some(e.event.as_str()));
    }
    // Idle: keep-alive comments flow.
    live.keep_alive().await;

    // follow=false ends at the last durable event; `after` and Last-Event-ID resume after a seq.
    let all = s
        .events("/v1/sessions/a/events?follow=false", None)
        .await
        .rest()
        .await;
    assert_eq!(all, first);
    let tail = s
        .events("/v1/sessions/a/events?follow=false&after=2", None)
        .await
        .rest()
        .await;
    assert_eq!(tail, first[3..].to_vec());
    let tail = s
        .events("/v1/sessions/a/events?follow=false&after=0", Some(4))
        .await
        .rest()
        .await;
    assert_eq!(tail, first[5..].to_vec());
    let none = s
        .events(
            &format!("/v1/sessions/a/events?follow=false&after={}", n - 1),
            None,
        )
        .await
        .rest()
        .await;
    assert_eq!(none, vec![]);

    // A second turn reaches the live stream with the next seqs.
    s.call(
        "POST",
        "/v1/sessions/a/followup",
        Some(json!({"text": "two"})),
    )
    .await;
    let second = live.until("turn/end").await;
    assert_eq!(second[0].id, Some(n), "{second:?}");
    let resp = s
        .client
        .get(s.url("/v1/sessions/a/events"))
        .header("last-event-id", "x")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 400);
    let (status, _) = s
        .call("GET", "/v1/sessions/a/events?follow=maybe", None)
        .await;
    assert_eq!(status, 400);
    let (status, _) = s.call("GET", "/v1/sessions/nope/events", None).await;
    assert_eq!(status, 404);
    assert!(s.stop().success());
}

#[tokio::test]
async fn a_stream_resumed_while_a_turn_runs_has_no_gap_and_no_duplicate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), SLOW_SIM, &[]);
    s.create_with_followup("a", "go").await;
    let mut seen = Vec::new();
    let mut last = None;
    // Three reconnects, each after a few chunks, each resuming from the last id received.
    for _ in 0..3 {
        let mut stream = s.events("/v1/sessions/a/events", last).await;
        let mut chunks = 0;
        while chunks < 3 {
            let Some(ev) = stream.next().await else {
                panic!("the stream ended: {:?}", kinds(&seen))
            };
            chunks += usize::from(ev.event == "assistant/chunk");
            last = ev.id;
            seen.push(ev);
        }
    }
    s.call("POST", "/v1/sessions/a/cancel", None).await;
    let mut stream = s.events("/v1/sessions/a/events", last).await;
    seen.extend(stream.until("turn/end").await);
    let ids: Vec<u64> = seen.iter().map(|e| e.id.expect("an id")).collect();
    assert_eq!(ids, (0..ids.len() as u64).collect::<Vec<_>>());
    let all = s
        .events("/v1/sessions/a/events?follow=false", None)
        .await
        .rest()
        .await;
    assert_eq!(all, seen);
    assert!(kinds(&seen).contains(&"assistant/message"));
    assert!(s.stop().success());
}

#[tokio::test]
async fn a_token_guards_every_v1_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("token"), "s3cret\n").expect("token file");
    let s = Server::start(dir.path(), FAST_SIM, &["--token-file", "token"]);
    let (status, body) = s.call("GET", "/v1/sessions", None).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    for auth in [
        "Bearer wrong",
        "Bearer s3cre",
        "Bearer s3cret2",
        "s3cret",
        "Basic s3cret",
    ] {
        let resp = s
            .client
            .get(s.url("/v1/sessions"))
            .header("authorization", auth)
            .send()
            .await
            .expect("send");
        assert_eq!(resp.status().as_u16(), 401, "{auth}");
    }
    let resp = s
        .client
        .post(s.url("/v1/sessions"))
        .header("authorization", "Bearer s3cret")
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 201);
    let resp = s.client.get(s.url("/healthz")).send().await.expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    assert!(s.stop().success());

    // DSH_TOKEN works too.
    let mut cmd = serve_command(dir.path(), FAST_SIM, &["--listen", "127.0.0.1:0"]);
    cmd.env("DSH_TOKEN", "t0k");
    let s = Server::start_with(cmd);
    let resp = s
        .client
        .get(s.url("/v1/sessions"))
        .header("authorization", "Bearer t0k")
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    let (status, _) = s.call("GET", "/v1/sessions", None).await;
    assert_eq!(status, 401);
    assert!(s.stop().success());
}

#[test]
fn a_public_address_without_a_token_and_an_unknown_store_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (args, want) in [
        (
            vec!["--listen", "0.0.0.0:0"],
            "dsh: refusing to listen on non-loopback 0.0.0.0:0 without a token: set --token-file or DSH_TOKEN\n",
        ),
        (
            vec!["--store", "mysql:x"],
            "dsh: --store: `mysql:x` is not a store URL: expected sqlite:DIR or postgres://…\n",
        ),
        (
            vec!["--listen", "localhost"],
            "dsh: --listen localhost: invalid socket address syntax (expected IP:PORT)\n",
        ),
    ] {
        let out = serve_command(dir.path(), FAST_SIM, &args)
            .output()
            .expect("run dsh serve");
        assert_eq!(String::from_utf8_lossy(&out.stderr), want);
        assert_eq!(out.status.code(), Some(64));
        assert!(!dir.path().join(".dsh").exists(), "nothing written");
    }
}

#[tokio::test]
async fn health_and_readiness() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &["--store", "sqlite:store"]);
    let resp = s.client.get(s.url("/healthz")).send().await.expect("send");
    assert_eq!(
        (resp.status().as_u16(), resp.text().await.expect("body")),
        (200, "ok\n".into())
    );
    let resp = s.client.get(s.url("/readyz")).send().await.expect("send");
    assert_eq!(
        (resp.status().as_u16(), resp.text().await.expect("body")),
        (200, "ready\n".into())
    );
    assert!(dir.path().join("store").is_dir());
    assert!(s.stop().success());
}

#[tokio::test]
async fn sigterm_drains_refusing_input_and_cancelling_turns_at_the_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A long drain timeout: the running turn is ended by a cancel sent during the drain.
    let s = Server::start(dir.path(), SLOW_SIM, &["--drain-timeout", "600"]);
    s.create_with_followup("a", "go").await;
    let mut stream = s.events("/v1/sessions/a/events", None).await;
    stream.until("assistant/chunk").await;
    s.terminate();
    s.wait_stderr("dsh serve: draining");
    let (status, body) = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"text": "late"})),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("draining"))
    );
    let resp = s.client.get(s.url("/readyz")).send().await.expect("send");
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(s.call("POST", "/v1/sessions/a/cancel", None).await.0, 202);
    let rest = stream.rest().await;
    assert_eq!(rest.last().map(|e| e.event.as_str()), Some("turn/end"));
    let mut s = s;
    assert!(s.child.wait().expect("exit").success());
    drop(s);

    // Drain timeout 0: the running turn is cancelled by the drain itself; the stream ends.
    let s = Server::start(dir.path(), SLOW_SIM, &["--drain-timeout", "0"]);
    s.call(
        "POST",
        "/v1/sessions/a/followup",
        Some(json!({"text": "again"})),
    )
    .await;
    let mut stream = s.events("/v1/sessions/a/events", None).await;
    // The new turn (the log holds the first one too): its second turn/start, then a chunk.
    stream.until("turn/start").await;
    stream.until("turn/start").await;
    stream.until("assistant/chunk").await;
    s.terminate();
    let rest = stream.rest().await;
    let end = rest.last().expect("events after SIGTERM");
    assert_eq!(end.event, "turn/end");
    assert_eq!(
        end.data["data"]["reason"],
        json!({"kind": "aborted", "reason": {"kind": "disposed"}})
    );
    let mut s = s;
    assert!(s.child.wait().expect("exit").success());
}

/// `Response::json` without reqwest's `json` feature.
trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        let text = self.text().await.expect("a body");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }
}

#[tokio::test]
async fn metrics_are_prometheus_text() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    s.create_with_followup("a", "one").await;
    s.call(
        "POST",
        "/v1/sessions/a/inject",
        Some(json!({"text": "two"})),
    )
    .await;
    let mut stream = s.events("/v1/sessions/a/events", None).await;
    stream.until("turn/end").await;
    let resp = s.client.get(s.url("/metrics")).send().await.expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .starts_with("application/openmetrics-text")
    );
    let text = resp.text().await.expect("body");
    for line in [
        "dsh_inputs_total{kind=\"followup\"} 1",
        "dsh_inputs_total{kind=\"inject\"} 1",
        "dsh_input_ack_seconds_count 2",
        "dsh_sse_subscribers 1",
        "dsh_agents{state=\"live\"} 1",
        "dsh_agents{state=\"hibernated\"} 0",
        "dsh_turns_total{reason=\"completed\"} 1",
        "dsh_input_locks 0",
        "# TYPE dsh_turns counter",
        "# TYPE dsh_store_commit_seconds histogram",
        "# TYPE dsh_events_appended counter",
        "# TYPE dsh_store_commits counter",
        "# EOF",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(
        !text.contains("dsh_provider_failures_total{"),
        "no failure yet:\n{text}"
    );
    // Every durable append was timed: the histogram counts as many commits as the store ran
    // append requests, and at least the turn's.
    let commits = metric(&text, "dsh_store_commit_seconds_count");
    assert_eq!(commits, metric(&text, "dsh_store_appends_total"), "{text}");
    assert!(commits >= 1, "{text}");
    assert!(s.stop().success());
}

/// The value of the sample `name` (without labels) in Prometheus text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
}

/// A provider that refuses every request with 401: a TCP server on 127.0.0.1 that reads one
/// request and answers it. Returns its base URL.
async fn refusing_provider() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read the head and as much body as it announces, then answer.
                loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let len = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.eq_ignore_ascii_case("content-length")
                                    .then(|| v.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if buf.len() >= end + 4 + len {
                            break;
                        }
                    }
                }
                let body = r#"{"error":{"message":"bad key","type":"invalid_request_error"}}"#;
                let answer = format!(
                    "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn provider_failures_and_turn_ends_are_counted_by_code_and_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = refusing_provider().await;
    let config = format!("provider = \"openai\"\nbase_url = \"{base}\"\nmodel = \"m\"\n");
    let mut cmd = serve_command(dir.path(), &config, &["--listen", "127.0.0.1:0"]);
    cmd.env("OPENAI_API_KEY", "sk-test");
    let s = Server::start_with(cmd);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    let mut stream = s.events("/v1/sessions/a/events", None).await;
    let (status, _) = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"text": "hi"})),
        )
        .await;
    assert_eq!(status, 202);
    let seen = stream.until("turn/end").await;
    let end = seen.last().expect("a turn/end");
    assert_eq!(end.data["data"]["reason"]["kind"], "error");
    assert_eq!(end.data["data"]["reason"]["error"]["code"], "AUTH");
    let (status, _) = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"text": "again"})),
        )
        .await;
    assert_eq!(status, 202);
    stream.until("turn/end").await;
    let text = s
        .client
        .get(s.url("/metrics"))
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("body");
    for line in [
        "dsh_turns_total{reason=\"error\"} 2",
        "dsh_provider_failures_total{code=\"AUTH\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(!text.contains("reason=\"completed\""), "{text}");
    assert!(s.stop().success());
}

#[tokio::test]
async fn event_streams_are_bounded_503_with_retry_after_past_the_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &["--max-streams", "1"]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    let _open = s.events("/v1/sessions/a/events", None).await;
    let resp = s
        .client
        .get(s.url("/v1/sessions/a/events?follow=false"))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json_value().await;
    assert!(error("too_many_streams")(&body), "{body}");
    assert_eq!(
        message(&body),
        "1 event streams are open, the most this server keeps; retry later"
    );
    let (status, body) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!((status, &body["id"]), (200, &json!("a")));
    assert!(s.stop().success());
}

/// `line` without its ANSI colour sequences (`ESC [ … m`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test]
async fn a_request_span_names_its_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = serve_command(dir.path(), FAST_SIM, &["--listen", "127.0.0.1:0"]);
    cmd.env("DSH_LOG", "dsh_cli=debug");
    let s = Server::start_with(cmd);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    let (status, _) = s
        .call(
            "POST",
            "/v1/sessions/a/followup",
            Some(json!({"text": "one"})),
        )
        .await;
    assert_eq!(status, 202);
    let line = without_colours(&s.wait_stderr("input acknowledged"));
    assert!(
        line.contains("method=POST path=/v1/sessions/a/followup session=a}"),
        "{line}"
    );
    assert!(s.stop().success());
}

#[tokio::test]
async fn a_session_resumed_after_a_restart_keeps_its_model_and_system_prompt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    let (status, _) = s
        .call(
            "POST",
            "/v1/sessions",
            Some(json!({"id": "a", "model": "mine", "system": "be brief", "max_tokens": 77})),
        )
        .await;
    assert_eq!(status, 201);
    let mut stream = s.events("/v1/sessions/a/events", None).await;
    s.call(
        "POST",
        "/v1/sessions/a/followup",
        Some(json!({"text": "one"})),
    )
    .await;
    stream.until("turn/end").await;
    drop(stream);
    assert!(s.stop().success());

    let s = Server::start(dir.path(), FAST_SIM, &[]);
    let mut stream = s.events("/v1/sessions/a/events?after=0", None).await;
    s.call(
        "POST",
        "/v1/sessions/a/followup",
        Some(json!({"text": "two"})),
    )
    .await;
    let mut headers = Vec::new();
    let mut ends = 0;
    while ends < 2 {
        let ev = stream.next().await.expect("an event");
        match ev.event.as_str() {
            "request/header" => headers.push(ev.data["data"]["header"].clone()),
            "turn/end" => ends += 1,
            _ => {}
        }
    }
    // The resumed agent asks with the recorded envelope, not the server's defaults.
    assert_eq!(headers.len(), 2, "{headers:?}");
    assert_eq!(headers[0], headers[1]);
    assert_eq!(
        headers[1]["config"],
        json!({"provider": "sim", "model": "mine", "maxTokens": 77})
    );
    assert_eq!(headers[1]["system"], "be brief");
    assert!(s.stop().success());
}

/// Every request of SPEC §13, as `METHOD PATH`.
const SPEC_ROUTES: [&str; 19] = [
    "GET /",
    "GET /healthz",
    "GET /metrics",
    "GET /readyz",
    "GET /v1/openapi.json",
    "GET /v1/sessions",
    "POST /v1/sessions",
    "POST /v1/sessions/import",
    "GET /v1/sessions/{id}",
    "POST /v1/sessions/{id}/cancel",
    "POST /v1/sessions/{id}/compact",
    "GET /v1/sessions/{id}/events",
    "GET /v1/sessions/{id}/export",
    "POST /v1/sessions/{id}/followup",
    "DELETE /v1/sessions/{id}/inbox/{message_id}",
    "PUT /v1/sessions/{id}/inbox/{message_id}",
    "POST /v1/sessions/{id}/inject",
    "GET /v1/sessions/{id}/messages",
    "POST /v1/sessions/{id}/steer",
];

#[tokio::test]
async fn the_openapi_document_matches_the_router() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    let (status, doc) = s.call("GET", "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    assert!(
        doc["openapi"]
            .as_str()
            .expect("a version")
            .starts_with("3.1"),
        "{}",
        doc["openapi"]
    );
    let paths = doc["paths"].as_object().expect("paths");
    let mut documented = Vec::new();
    for (path, item) in paths {
        for (method, op) in item.as_object().expect("a path item") {
            let statuses: Vec<u16> = op["responses"]
                .as_object()
                .expect("responses")
                .keys()
                .map(|k| k.parse().expect("a numeric status"))
                .collect();
            documented.push((method.to_uppercase(), path.clone(), statuses));
        }
    }
    let mut names: Vec<String> = documented
        .iter()
        .map(|(m, p, _)| format!("{m} {p}"))
        .collect();
    names.sort();
    let mut want: Vec<String> = SPEC_ROUTES.iter().map(ToString::to_string).collect();
    want.sort();
    assert_eq!(
        names, want,
        "the document names every request of SPEC §13, and no other"
    );

    // Each documented route exists in the router with that method, answers with a documented
    // status, and (for the statuses we can provoke here) gives them.
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    for (method, path, statuses) in &documented {
        for (id, message_id) in [("a", "m"), ("nope", "m"), ("bad%2Fid", "m")] {
            let mut url = path.replace("{id}", id).replace("{message_id}", message_id);
            if url.ends_with("/events") {
                url.push_str("?follow=false");
            }
            let m = reqwest::Method::from_bytes(method.as_bytes()).expect("a method");
            let mut req = s.client.request(m, s.url(&url));
            if method == "POST" || method == "PUT" {
                req = req.header("content-type", "application/json").body(
                    if url.ends_with("/import") {
                        "x".to_string()
                    } else {
                        "{\"text\": \"x\"}".to_string()
                    },
                );
            }
            let resp = req.send().await.expect("send");
            let got = resp.status().as_u16();
            let body = resp.text().await.expect("body");
            assert!(
                !body.contains("no such route"),
                "{method} {url}: not routed"
            );
            assert_ne!(got, 405, "{method} {url}: method not routed");
            assert!(
                statuses.contains(&got),
                "{method} {url}: {got} is not documented ({statuses:?}): {body}"
            );
        }
    }
    assert!(s.stop().success());
}

#[tokio::test]
async fn the_web_page_is_served_from_the_binary() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    let resp = s.client.get(s.url("/")).send().await.expect("send");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(resp.headers()["content-type"], "text/html; charset=utf-8");
    let html = resp.text().await.expect("body");
    assert!(html.starts_with("<!doctype html>"), "{}", &html[..40]);
    for needle in [
        "/v1/sessions",
        "/followup",
        "/steer",
        "/cancel",
        "/events",
        "Last-Event-ID",
    ] {
        assert!(html.contains(needle), "{needle}");
    }
    assert!(s.stop().success());
}

/// A sim model with long instant replies: many events fast.
const FLOOD_SIM: &str = "provider = \"sim\"\n[sim]\nseed = 1\nttft_ms = 0\ntokens_per_sec = 0\nreply_tokens_min = 2000\nreply_tokens_max = 2000\ntool_call_probability = 0.0\n";

#[tokio::test]
async fn a_client_that_falls_behind_is_told_to_resume_and_loses_nothing() {
    const TURNS: usize = 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FLOOD_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    // A stream that is opened and then not read while the agent writes ~40,000 events (~8 MB,
    // far more than the socket buffers, the bounded subscriber buffer and the stream's channel).
    let mut slow = s.events("/v1/sessions/a/events", None).await;
    for i in 0..TURNS {
        let (status, _) = s
            .call(
                "POST",
                "/v1/sessions/a/followup",
                Some(json!({"text": format!("q{i}")})),
            )
            .await;
        assert_eq!(status, 202);
    }
    // Wait for the last turn by reading another stream, resuming it whenever it is told to.
    let mut last = None;
    let mut turns = 0;
    while turns < TURNS {
        let mut stream = s.events("/v1/sessions/a/events", last).await;
        while let Some(ev) = stream.next().await {
            if ev.event == "resume" {
                break;
            }
            last = ev.id;
            turns += usize::from(ev.event == "turn/end");
            if turns == TURNS {
                break;
            }
        }
    }
    // The slow stream: contiguous from 0, then a final `resume` naming the last seq it sent.
    let mut seen = Vec::new();
    let resume = loop {
        let ev = slow
            .next()
            .await
            .expect("the slow stream ends with a resume event");
        if ev.event == "resume" {
            break ev;
        }
        seen.push(ev.id.expect("an id"));
    };
    assert_eq!(seen, (0..seen.len() as u64).collect::<Vec<_>>());
    assert!(
        (seen.len() as u64) < last.expect("events") + 1,
        "the slow stream fell behind"
    );
    assert_eq!(resume.id, None);
    assert_eq!(
        resume.data,
        json!({"reason": "lagged", "last_event_id": seen.last()})
    );
    assert!(
        slow.next().await.is_none(),
        "the stream ends after the resume event"
    );
    // Resuming from its Last-Event-ID replays the rest from the store: no gap, no duplicate.
    let rest = s
        .events("/v1/sessions/a/events?follow=false", seen.last().copied())
        .await
        .rest()
        .await;
    let ids: Vec<u64> = seen
        .iter()
        .copied()
        .chain(rest.iter().map(|e| e.id.expect("an id")))
        .collect();
    assert_eq!(ids, (0..ids.len() as u64).collect::<Vec<_>>());
    assert_eq!(ids.last().copied(), last);
    assert!(s.stop().success());
}

#[tokio::test]
async fn a_replacement_id_repeated_answers_with_the_replacing_splice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Server::start(dir.path(), FAST_SIM, &[]);
    s.call("POST", "/v1/sessions", Some(json!({"id": "a"})))
        .await;
    let (status, first) = s
        .call(
            "POST",
            "/v1/sessions/a/inject",
            Some(json!({"text": "x", "id": "p1"})),
        )
        .await;
    assert_eq!(status, 202);
    let seq = first["seq"].as_u64().expect("a seq");
    let (status, replaced) = s
        .call(
            "PUT",
            "/v1/sessions/a/inbox/p1",
            Some(json!({"text": "y", "id": "p2"})),
        )
        .await;
    assert_eq!(
        (status, replaced),
        (200, json!({"message_id": "p1", "replaced_by": "p2"}))
    );
    // The replacement's id was applied by the replacing splice, the event after the inject's.
    let again = s
        .call(
            "POST",
            "/v1/sessions/a/inject",
            Some(json!({"text": "y", "id": "p2"})),
        )
        .await;
    assert_eq!(again, (200, json!({"message_id": "p2", "seq": seq + 1})));
    let again = s
        .call(
            "POST",
            "/v1/sessions/a/inject",
            Some(json!({"text": "x", "id": "p1"})),
        )
        .await;
    assert_eq!(again, (200, json!({"message_id": "p1", "seq": seq})));
    let (_, info) = s.call("GET", "/v1/sessions/a", None).await;
    assert_eq!(info["pending"], json!({"next_turn": 0, "next_step": 1}));
    assert!(s.stop().success());
}
