//! Mutation pins (issue 16 item 7): one test per mutant that survived `cargo mutants` over the core's
//! safety files — repair's closer ids; the invariant checker's retry and `TOOL_NOT_STARTED` rules,
//! its safe-integer bound and the `Tracker`'s open turn and step; the inbox's splice bounds, room
//! check, block cap and depth fast path; the tool schedule's read-only accessors and its count of
//! running bodies. Each asserts the exact boundary the mutant moved. See RELIABILITY.md §7 (the
//! SQLite writer's pins are unit tests in `writer.rs`, its state being private).

use std::sync::Arc;

use dsh::Limits;
use dsh::inbox::{AdmitError, Inbox, InboxError};
use dsh::llm::types::Message;
use dsh::session::Event;
use dsh::session::event::{InboxSpliced, InboxTarget};
use dsh::session::invariant::{Tracker, check};
use dsh::session::repair::interrupted_turn_closers;
use dsh::tools::ExecutionMode;
use dsh::tools::schedule::{PlannedCall, SlotState, ToolSchedule};

/// Parses JSON event lines, giving each the seq of its position (`SEQ` in the text).
fn log(lines: &[String]) -> Vec<Event> {
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let json = l.replace("SEQ", &i.to_string());
            Event::from_json(&json).unwrap_or_else(|e| panic!("{json}: {e}"))
        })
        .collect()
}

fn ts(turn: u64) -> String {
    format!(r#"{{"type":"turn/start","seq":SEQ,"time":7,"data":{{"turn":{turn}}}}}"#)
}
fn ss(turn: u64, step: u64) -> String {
    format!(r#"{{"type":"step/start","seq":SEQ,"time":7,"data":{{"turn":{turn},"step":{step}}}}}"#)
}
fn se(turn: u64, step: u64) -> String {
    format!(r#"{{"type":"step/end","seq":SEQ,"time":7,"data":{{"turn":{turn},"step":{step}}}}}"#)
}
fn te(turn: u64) -> String {
    format!(
        r#"{{"type":"turn/end","seq":SEQ,"time":7,"data":{{"turn":{turn},"reason":{{"kind":"completed"}}}}}}"#
    )
}
/// An assistant message asking for one call with the JSON-encoded id `call_id_json`.
fn asks(call_id_json: &str) -> String {
    format!(
        r#"{{"type":"assistant/message","seq":SEQ,"time":7,"data":{{"turn":1,"step":1,"message":{{"id":"a","role":"assistant","content":[{{"type":"tool-call","id":{call_id_json},"name":"t","arguments":"{{}}"}}],"source":{{"kind":"model","provider":"p","model":"m"}}}}}},"sourceEventSeqs":[],"surfaceOp":"append"}}"#
    )
}
fn retry(turn: u64, step: u64) -> String {
    format!(
        r#"{{"type":"llm/retry","seq":SEQ,"time":7,"data":{{"retryId":"r1","turn":{turn},"step":{step},"provider":"p","mode":"normal","policyKey":"k","retry":1,"maxRetries":2,"delayMs":1,"failure":{{"message":"m","code":"SERVER"}}}}}}"#
    )
}
fn retry_started(turn: u64, step: u64) -> String {
    format!(
        r#"{{"type":"llm/retry-started","seq":SEQ,"time":7,"data":{{"retryId":"r1","turn":{turn},"step":{step},"retry":1}}}}"#
    )
}
/// An appended `tool/result` with error code `code` and `isError` `is_error` for call `c1`, no call.
fn coded_result(code: &str, is_error: bool) -> String {
    format!(
        r#"{{"type":"tool/result","seq":SEQ,"time":7,"data":{{"turn":1,"step":1,"message":{{"id":"r","role":"user","content":[{{"type":"tool-result","toolCallId":"c1","content":[],"isError":{is_error}}}],"source":{{"kind":"tool","callId":"c1"}}}},"error":{{"name":"E","code":"{code}"}}}},"surfaceOp":"append"}}"#
    )
}

/// The id of the first closer repair computes for a turn whose one call has id `call_id`.
fn closer_id(call_id: &str) -> String {
    let json = serde_json::to_string(call_id).unwrap();
    let events = log(&[ts(1), ss(1, 1), asks(&json)]);
    let closers = interrupted_turn_closers(&events);
    let mut all = events.clone();
    all.extend(closers.iter().cloned());
    assert_eq!(check(&all), Ok(()), "the repaired log is valid");
    closers[0]
        .data
        .message()
        .map(|m| m.id.to_string())
        .expect("the first closer is a tool result")
}

const PREFIX: &str = "interrupted-tool-result-";
/// Room left for the call id in a 256-byte message id: prefix (24) and `-3` (2) taken.
const ROOM: usize = 256 - 24 - 2;

#[test]
fn repair_closer_id_keeps_a_call_id_that_fits_exactly() {
    let fits = "c".repeat(ROOM);
    assert_eq!(closer_id(&fits), format!("{PREFIX}{fits}-3"));
    assert_eq!(closer_id(&fits).len(), 256);
}

#[test]
fn repair_closer_id_cuts_a_long_call_id_at_exactly_the_room() {
    let long = "c".repeat(ROOM + 1);
    assert_eq!(closer_id(&long), format!("{PREFIX}{}-3", "c".repeat(ROOM)));
    let much_longer = "d".repeat(1000);
    assert_eq!(
        closer_id(&much_longer),
        format!("{PREFIX}{}-3", "d".repeat(ROOM))
    );
}

#[test]
fn repair_closer_id_cuts_multi_byte_characters_whole() {
    // 230 bytes of room: 115 two-byte characters fit exactly; 76 three-byte characters (228 bytes)
    // fit and the 77th would pass the room.
    let two = "é".repeat(200);
    assert_eq!(closer_id(&two), format!("{PREFIX}{}-3", "é".repeat(115)));
    let three = "€".repeat(100);
    let id = closer_id(&three);
    assert_eq!(id, format!("{PREFIX}{}-3", "€".repeat(76)));
    assert_eq!(id.len(), 254);
    // A multi-byte character straddling the end of the room is dropped whole, the ASCII before kept.
    let straddle = format!("{}€", "c".repeat(ROOM - 1));
    assert_eq!(
        closer_id(&straddle),
        format!("{PREFIX}{}-3", "c".repeat(ROOM - 1))
    );
    // Control characters are dropped and do not use room.
    let controls = format!("\u{1}{}", "c".repeat(ROOM));
    assert_eq!(
        closer_id(&controls),
        format!("{PREFIX}{}-3", "c".repeat(ROOM))
    );
}

#[test]
fn checker_llm_retry_must_name_the_open_step() {
    for event in [retry as fn(u64, u64) -> String, retry_started] {
        assert_eq!(check(&log(&[ts(1), ss(1, 1), event(1, 1)])), Ok(()));
        let wrong_step = check(&log(&[ts(1), ss(1, 1), event(1, 2)])).unwrap_err();
        assert_eq!(wrong_step.seq, 2);
        assert!(
            wrong_step
                .reason
                .ends_with("names turn 1/step 2, open is turn 1/step 1"),
            "{}",
            wrong_step.reason
        );
        let wrong_turn = check(&log(&[ts(1), ss(1, 1), event(2, 1)])).unwrap_err();
        assert_eq!(wrong_turn.seq, 2);
        let no_step = check(&log(&[ts(1), ss(1, 1), se(1, 1), event(1, 1)])).unwrap_err();
        assert_eq!(no_step.seq, 3);
        assert!(
            no_step
                .reason
                .ends_with("for turn 1/step 1 with no open step"),
            "{}",
            no_step.reason
        );
        assert!(check(&log(&[event(1, 1)])).is_err());
    }
}

#[test]
fn checker_not_started_exemption_needs_is_error_true() {
    let ok = log(&[ts(1), ss(1, 1), coded_result("TOOL_NOT_STARTED", true)]);
    assert_eq!(check(&ok), Ok(()));
    let not_error = log(&[ts(1), ss(1, 1), coded_result("TOOL_NOT_STARTED", false)]);
    let v = check(&not_error).unwrap_err();
    assert_eq!(v.seq, 2);
    assert_eq!(
        v.reason,
        "tool/result for call \"c1\" has no prior tool/call in this step"
    );
}

#[test]
fn checker_tracker_reports_the_open_turn_and_step() {
    let events = log(&[
        ts(1),
        te(1),
        ts(2),
        ss(2, 1),
        se(2, 1),
        ss(2, 2),
        se(2, 2),
        te(2),
    ]);
    let mut tracker = Tracker::new();
    let mut seen = vec![(tracker.open_turn(), tracker.open_step())];
    for event in &events {
        tracker.push(event).unwrap();
        seen.push((tracker.open_turn(), tracker.open_step()));
    }
    assert_eq!(
        seen,
        [
            (None, None),
            (Some(1), None),
            (None, None),
            (Some(2), None),
            (Some(2), Some(1)),
            (Some(2), None),
            (Some(2), Some(2)),
            (Some(2), None),
            (None, None),
        ]
    );
}

/// A manual compaction bracket whose summary claims `token_count` shadowed tokens.
fn compaction_claiming(token_count: u64) -> Vec<Event> {
    log(&[
        r#"{"type":"user/message","seq":SEQ,"time":7,"data":{"id":"u","role":"user","content":[],"source":{"kind":"user"}},"surfaceOp":"append"}"#.to_string(),
        r#"{"type":"compaction/start","seq":SEQ,"time":7,"data":{"compactionId":"a","turn":null}}"#.to_string(),
        format!(
            r#"{{"type":"compaction/summary","seq":SEQ,"time":7,"data":{{"compactionId":"a","summary":[{{"type":"text","text":"s"}}],"shadowedRange":{{"start":0,"end":0}},"shadowedSeqs":[0],"shadowedTokenCount":{token_count},"provider":"p","model":"m"}}}}"#
        ),
        r#"{"type":"compaction/end","seq":SEQ,"time":7,"data":{"compactionId":"a","turn":null,"error":"x"}}"#.to_string(),
    ])
}

#[test]
fn checker_shadowed_token_count_is_a_safe_integer_up_to_exactly_2_pow_53_minus_1() {
    let max = (1u64 << 53) - 1;
    assert_eq!(check(&compaction_claiming(max)), Ok(()));
    let v = check(&compaction_claiming(max + 1)).unwrap_err();
    assert_eq!(v.seq, 2);
    assert_eq!(
        v.reason,
        "compaction/summary shadowedTokenCount 9007199254740992 is not a safe integer"
    );
}

fn user(id: &str, n_blocks: usize) -> Arc<Message> {
    let blocks: Vec<String> = (0..n_blocks)
        .map(|i| format!(r#"{{"type":"text","text":"b{i}"}}"#))
        .collect();
    let json = format!(
        r#"{{"id":"{id}","role":"user","content":[{}],"source":{{"kind":"user"}}}}"#,
        blocks.join(",")
    );
    Arc::new(serde_json::from_str(&json).unwrap())
}

/// An inbox holding `n` next-turn messages `m0..`, built under the default limits.
fn inbox_with(n: usize) -> Inbox {
    let mut inbox = Inbox::new();
    for i in 0..n {
        let splice = inbox
            .plan_append(
                InboxTarget::NextTurn,
                user(&format!("m{i}"), 1),
                &Limits::DEFAULT,
            )
            .unwrap();
        inbox.apply(&splice).unwrap();
    }
    inbox
}

fn removal(start: u64, n: u64) -> InboxSpliced {
    InboxSpliced {
        target: InboxTarget::NextTurn,
        start,
        removed_count: Some(n),
        inserted: Vec::new(),
        outcome: None,
    }
}

#[test]
fn inbox_splice_overrunning_from_a_non_zero_start_is_refused() {
    let mut inbox = inbox_with(3);
    let before = inbox.clone();
    assert_eq!(
        inbox.apply(&removal(2, 2)),
        Err(InboxError::RemovedOutOfRange {
            target: InboxTarget::NextTurn,
            start: 2,
            n_removed: 2,
            len: 3,
        })
    );
    assert_eq!(
        inbox.apply(&removal(1, 3)),
        Err(InboxError::RemovedOutOfRange {
            target: InboxTarget::NextTurn,
            start: 1,
            n_removed: 3,
            len: 3,
        })
    );
    assert_eq!(inbox, before, "a refused splice changes nothing");
    // Up to the end exactly is fine.
    let removed = inbox.apply(&removal(1, 2)).unwrap();
    let ids: Vec<String> = removed.iter().map(|m| m.id.to_string()).collect();
    assert_eq!(ids, ["m1", "m2"]);
    assert_eq!(inbox.n_pending(), 1);
}

#[test]
fn inbox_check_room_for_a_splice_that_removes_some_and_inserts_more() {
    let limits = Limits {
        pending_inputs_max: 5,
        ..Limits::DEFAULT
    };
    // 4 pending, remove 1 and insert 2: 5 after, exactly the cap.
    let inbox = inbox_with(4);
    let planned = inbox
        .plan_splice(
            InboxTarget::NextTurn,
            0,
            1,
            vec![user("n1", 1), user("n2", 1)],
            &limits,
        )
        .unwrap();
    assert!(planned.is_some());
    // 5 pending, remove 1 and insert 2: 6 after, one past the cap.
    let inbox = inbox_with(5);
    assert_eq!(
        inbox.plan_splice(
            InboxTarget::NextTurn,
            1,
            1,
            vec![user("n1", 1), user("n2", 1)],
            &limits,
        ),
        Err(AdmitError::InboxFull {
            n_pending: 5,
            n_inserted: 2,
            pending_max: 5,
        })
    );
}

#[test]
fn inbox_check_room_for_an_inbox_already_above_a_lowered_limit() {
    let lowered = Limits {
        pending_inputs_max: 3,
        ..Limits::DEFAULT
    };
    let inbox = inbox_with(5);
    // A splice that shrinks or keeps the size still fits, so the inbox can be drained.
    for (removed, inserted) in [(2, 1), (1, 1), (1, 0)] {
        let msgs = (0..inserted).map(|i| user(&format!("n{i}"), 1)).collect();
        assert!(
            inbox
                .plan_splice(InboxTarget::NextTurn, 0, removed, msgs, &lowered)
                .unwrap()
                .is_some(),
            "remove {removed}, insert {inserted}"
        );
    }
    // Growing it does not.
    assert_eq!(
        inbox.plan_append(InboxTarget::NextStep, user("n", 1), &lowered),
        Err(AdmitError::InboxFull {
            n_pending: 5,
            n_inserted: 1,
            pending_max: 3,
        })
    );
}

#[test]
fn inbox_admits_exactly_content_blocks_max_blocks() {
    let limits = Limits {
        content_blocks_max: 4,
        ..Limits::DEFAULT
    };
    assert_eq!(Inbox::admit(&user("m", 4), &limits), Ok(()));
    assert!(matches!(
        Inbox::admit(&user("m", 5), &limits),
        Err(AdmitError::TooManyBlocks {
            n_blocks: 5,
            blocks_max: 4,
            ..
        })
    ));
}

#[test]
fn inbox_json_depth_fast_path_at_small_bounds() {
    let at = |depth_max: usize| Limits {
        json_depth_max: depth_max,
        ..Limits::DEFAULT
    };
    let too_deep = |r: Result<(), AdmitError>| matches!(r, Err(AdmitError::TooDeep { .. }));
    // A flat prompt with blocks is 3 deep: message, content array, block.
    let flat = user("m", 2);
    assert_eq!(Inbox::admit(&flat, &at(3)), Ok(()));
    assert!(too_deep(Inbox::admit(&flat, &at(2))));
    assert!(too_deep(Inbox::admit(&flat, &at(1))));
    assert!(too_deep(Inbox::admit(&flat, &at(0))));
    // Without blocks it is 2 deep: message and the (empty) content array.
    let empty = user("e", 0);
    assert_eq!(Inbox::admit(&empty, &at(2)), Ok(()));
    assert_eq!(Inbox::admit(&empty, &at(3)), Ok(()));
    assert!(too_deep(Inbox::admit(&empty, &at(1))));
    // A source holding an object leaves the fast path: 3 deep with no blocks.
    let nested: Message = serde_json::from_str(
        r#"{"id":"n","role":"user","content":[],"source":{"kind":"user","meta":{"a":1}}}"#,
    )
    .unwrap();
    assert_eq!(Inbox::admit(&nested, &at(3)), Ok(()));
    assert!(too_deep(Inbox::admit(&nested, &at(2))));
}

fn planned(n: usize) -> Vec<PlannedCall> {
    (0..n)
        .map(|i| PlannedCall {
            call_id: format!("c{i}"),
            name: format!("t{i}"),
            arguments: format!("{{\"i\":{i}}}"),
        })
        .collect()
}

#[test]
fn tool_schedule_accessors_report_the_batch() {
    let empty = ToolSchedule::new(Vec::new(), 2);
    assert!(empty.is_empty());
    assert_eq!(empty.len(), 0);
    assert!(empty.calls().is_empty());
    assert_eq!(empty.preparing(), None);

    let mut s = ToolSchedule::new(planned(3), 2);
    assert!(!s.is_empty());
    assert_eq!(s.calls(), planned(3).as_slice());
    assert_eq!(s.calls()[1].call_id, "c1");
    assert_eq!(s.preparing(), None);
    assert_eq!(s.next_start(|_| ExecutionMode::Parallel), Some(0));
    assert_eq!(s.preparing(), Some(0));
    assert_eq!(s.state(0), SlotState::Preparing);
    // One prepare at a time.
    assert_eq!(s.next_start(|_| ExecutionMode::Parallel), None);
    s.dispatched(0);
    assert_eq!(s.preparing(), None);
    assert_eq!(s.next_start(|_| ExecutionMode::Parallel), Some(1));
    assert_eq!(s.preparing(), Some(1));
    // A call resolved while preparing clears it.
    s.resolved(1);
    assert_eq!(s.preparing(), None);
    assert_eq!(s.calls().len(), 3, "the batch itself never changes");
}

#[test]
fn tool_schedule_n_running_counts_the_bodies_running() {
    let mut s = ToolSchedule::new(planned(3), 3);
    let mut seen = vec![s.n_running()];
    for i in 0..2 {
        assert_eq!(s.next_start(|_| ExecutionMode::Parallel), Some(i));
        // Preparing is not running.
        seen.push(s.n_running());
        s.dispatched(i);
        seen.push(s.n_running());
    }
    s.resolved(0);
    seen.push(s.n_running());
    s.resolved(1);
    seen.push(s.n_running());
    assert_eq!(seen, [0, 0, 1, 1, 2, 1, 0]);
}
