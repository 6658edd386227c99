//! Unit tests of the compaction decisions: estimates, the split, the pruner, the summariser's
//! request and outcome, the checkpoint.

use std::sync::Arc;

use super::*;
use crate::ids::SessionId;
use crate::session::log::EventDraft;

fn msg(id: &str, role: Role, content: Vec<ContentBlock>, source: MessageSource) -> Message {
    Message {
        id: MessageId::new(id).unwrap(),
        role,
        content,
        source,
    }
}

fn user(id: &str, text: &str) -> Message {
    msg(
        id,
        Role::User,
        vec![ContentBlock::text(text)],
        MessageSource::user(),
    )
}

fn session_of(messages: Vec<EventData>) -> Session {
    let mut s = Session::new(SessionId::new("s").unwrap());
    s.append(
        EventDraft::log(EventData::TurnStart(crate::session::event::TurnStart {
            turn: 1,
        })),
        0,
    )
    .unwrap();
    for data in messages {
        s.append(EventDraft::append(data, None), 0).unwrap();
    }
    s
}

fn assistant(id: &str, content: Vec<ContentBlock>) -> EventData {
    EventData::AssistantMessage(Box::new(crate::session::event::AssistantMessageEvent {
        turn: 1,
        step: 1,
        message: Arc::new(msg(
            id,
            Role::Assistant,
            content,
            MessageSource::model("p", "m"),
        )),
        usage: None,
        interrupted: None,
    }))
}

fn result(id: &str, call: &str, text: &str) -> EventData {
    EventData::ToolResult(Box::new(ToolResultEvent {
        turn: 1,
        step: 1,
        message: Arc::new(msg(
            id,
            Role::User,
            vec![ContentBlock::ToolResult {
                tool_call_id: call.into(),
                content: vec![ContentBlock::text(text)],
                is_error: Some(false),
            }],
            MessageSource::tool(call),
        )),
        error: None,
        meta: None,
    }))
}

fn call(id: &str) -> ContentBlock {
    ContentBlock::ToolCall {
        id: id.into(),
        name: "echo".into(),
        arguments: "{}".into(),
    }
}

#[test]
fn estimates_count_code_points_by_fours_plus_a_message_overhead() {
    assert_eq!(estimate_text(""), 0);
    assert_eq!(estimate_text("abcd"), 1);
    assert_eq!(estimate_text("abcde"), 2);
    assert_eq!(estimate_text("ééééé"), 2, "code points, not bytes");
    // The original's snapshot: a 1,031-character prompt is priced 266.
    let prompt = user("u", &"z".repeat(1031));
    assert_eq!(estimate_message(&prompt), 266);
    let a = msg(
        "a",
        Role::Assistant,
        vec![ContentBlock::text("hi"), call("c1")],
        MessageSource::model("p", "m"),
    );
    // 8 + "hi" 1 + "echo" 1 + "{}" 1
    assert_eq!(estimate_message(&a), 11);
}

#[test]
fn the_head_never_splits_a_call_from_its_result_and_keeps_the_newest_unit() {
    let s = session_of(vec![
        EventData::UserMessage(Arc::new(user("u1", "go"))),
        assistant("a1", vec![call("c1"), call("c2")]),
        result("r1", "c1", "one"),
        result("r2", "c2", "two"),
        assistant("a2", vec![ContentBlock::text("done")]),
    ]);
    // Surface seqs 1..=5; units [1], [2,3,4], [5].
    let plan = plan_head(&s, None).unwrap();
    assert_eq!(plan.shadowed, [1, 2, 3, 4]);
    assert_eq!(plan.range(), SeqRange { start: 1, end: 4 });
    // A budget that holds only the newest unit keeps it alone; a larger one keeps the pair too.
    assert_eq!(plan_head(&s, Some(9)).unwrap().shadowed, [1, 2, 3, 4]);
    assert_eq!(plan_head(&s, Some(100)).unwrap().shadowed, [1]);
    let single = session_of(vec![EventData::UserMessage(Arc::new(user("u1", "go")))]);
    assert_eq!(plan_head(&single, None), None);
}

#[test]
fn pruning_keeps_head_and_tail_code_points_and_is_idempotent() {
    let text: String = "é".repeat(5000) + &"b".repeat(5000);
    let cut = prune_text(&text);
    assert_eq!(
        cut,
        format!("{}{PRUNE_MARKER}{}", "é".repeat(4096), "b".repeat(1024))
    );
    assert!(cut.chars().count() <= PRUNE_THRESHOLD_CHARS);
    let s = session_of(vec![
        assistant("a1", vec![call("c1")]),
        result("r1", "c1", &text),
        result("r2", "c2", "small"),
    ]);
    let plans = plan_prunes(&s);
    assert_eq!(plans.len(), 1);
    let (seq, plan) = &plans[0];
    assert_eq!(*seq, 2);
    assert_eq!(plan.prune.shadowed_seqs, [2]);
    assert_eq!(plan.prune.shadowed_token_count, 8 + 2500);
    let mut s = s;
    s.append(
        EventDraft {
            data: EventData::ToolResult(Box::new(plan.replacement.clone())),
            source_event_seqs: Some(vec![2]),
            surface_op: Some(replace_one(2)),
        },
        0,
    )
    .expect("the rewrite changes only the content");
    assert!(plan_prunes(&s).is_empty(), "a second pass finds nothing");
}

#[test]
fn the_summary_keeps_only_non_blank_text() {
    let ok = summary_outcome(
        &FinishReason::Stop,
        vec![
            ContentBlock::Reasoning {
                text: "think".into(),
            },
            ContentBlock::text("sum"),
        ],
    );
    assert_eq!(ok, Ok(vec![ContentBlock::text("sum")]));
    let cut = summary_outcome(&FinishReason::MaxTokens, vec![ContentBlock::text("s")]);
    assert_eq!(cut.unwrap_err().code, "MAX_TOKENS");
    let blank = summary_outcome(&FinishReason::Stop, vec![ContentBlock::text("  ")]);
    assert_eq!(blank.unwrap_err().code, codes::EMPTY_RESPONSE);
}

#[test]
fn compaction_payloads_round_trip_in_the_originals_key_order() {
    let line = r#"{"type":"compaction/summary","seq":20,"time":1,"data":{"compactionId":"338e","summary":[{"type":"text","text":"S"}],"rawOutput":[{"type":"text","text":"S"}],"llmStreamCall":true,"shadowedRange":{"start":4,"end":4},"shadowedSeqs":[4],"shadowedTokenCount":266,"provider":"deepseek-official","model":"deepseek-v4-flash","maxTokens":32,"usage":{"inputTokens":20,"outputTokens":4}}}"#;
    let e = Event::from_json(line).unwrap();
    let Some(Ok(read)) = CompactionEvent::read(&e) else {
        panic!()
    };
    let again = Event {
        data: read.into_data(),
        ..e.clone()
    };
    assert_eq!(again.to_json(), line);
    let start = CompactionEvent::Start(CompactionStart {
        compaction_id: "x".into(),
        source_command_id: None,
        turn: None,
    })
    .into_data();
    let EventData::Other { data, .. } = start else {
        panic!()
    };
    assert_eq!(data.to_string(), r#"{"compactionId":"x","turn":null}"#);
}

#[test]
fn settings_validate_their_ratios() {
    let mut s = CompactionSettings::default();
    assert_eq!(s.validate(), Ok(()));
    s.context_window = Some(1000);
    assert_eq!(s.threshold_tokens(), Some(800));
    assert_eq!(s.retain_tokens(), Some(160));
    s.threshold_ratio = 1.5;
    assert!(s.validate().is_err());
    assert_eq!(known_context_window("deepseek-chat"), Some(128_000));
    assert_eq!(known_context_window("unknown"), None);
}
