//! The surface: the ordered list of message-event seqs that forms the model-visible history
//! (`reference/session-llm.md` §2).
//!
//! Only `user/message`, `assistant/message` and `tool/result` events are surface-eligible; each carries
//! `surfaceOp`: `append` pushes its seq at the tail, `{op:"replace",start,end}` removes the nodes from
//! the *position* of `start` through the position of `end` (seqs of current nodes, located in surface
//! order — `start` may be numerically greater than `end`) and puts the new seq there. A replacement
//! must cite every node it shadows in `sourceEventSeqs`; a `tool/result` replacement must rewrite exactly
//! one `tool/result` and change only its inner content.
//!
//! `Surface::plan` validates a candidate without changing anything; `Surface::apply` commits a plan.
//! Both are pure; `fold_surface` replays a whole log offline.

use crate::session::event::{Event, EventData, SurfaceOp, is_surface_type};
use crate::session::log::AppendError;

/// The surface fold of one log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Surface {
    /// Seqs of current surface nodes, in model-visible order (not necessarily ascending).
    pub nodes: Vec<u64>,
    /// Number of committed replacements (starts at 0).
    pub replace_generation: u64,
}

/// A validated change to the surface, ready to apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SurfaceChange {
    /// A log-only event: the surface is unchanged.
    None,
    /// Push the seq at the tail.
    Append,
    /// Replace `nodes[start_idx..=end_idx]` with the seq.
    Replace {
        /// The index in `nodes` of the first node replaced.
        start_idx: usize,
        /// The index in `nodes` of the last node replaced.
        end_idx: usize,
    },
}

/// One replacement found by `fold_surface`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    /// The seq of the replacing event.
    pub seq: u64,
    /// The seq of the first node it replaced.
    pub start: u64,
    /// The seq of the last node it replaced.
    pub end: u64,
    /// The shadowed nodes, in surface order.
    pub shadowed_seqs: Vec<u64>,
}

/// The offline fold of a complete log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldedSurface {
    /// The seqs of the surface nodes at the end of the log, in surface order.
    pub nodes: Vec<u64>,
    /// Every replacement, in log order.
    pub replacements: Vec<Replacement>,
}

impl Surface {
    /// Validates the surface metadata of `event` (whose `seq` is the next seq of `log`) against this
    /// surface. `log` is the log so far, indexed by seq; it is used to check `tool/result` rewrites.
    ///
    /// # Errors
    /// The broken rule; nothing changes.
    pub fn plan(&self, event: &Event, log: &[Event]) -> Result<SurfaceChange, AppendError> {
        let kind = event.kind();
        if !is_surface_type(kind) {
            if event.surface_op.is_some() {
                return Err(AppendError::NotSurfaceEligible {
                    kind: kind.to_string(),
                    field: "surfaceOp",
                });
            }
            if event.source_event_seqs.is_some() {
                return Err(AppendError::NotSurfaceEligible {
                    kind: kind.to_string(),
                    field: "sourceEventSeqs",
                });
            }
            return Ok(SurfaceChange::None);
        }
        let Some(op) = event.surface_op else {
            return Err(AppendError::MissingSurfaceOp {
                kind: kind.to_string(),
            });
        };
        if let Some(sources) = &event.source_event_seqs {
            check_sources(kind, event.seq, sources)?;
        }
        match op {
            SurfaceOp::Append => Ok(SurfaceChange::Append),
            SurfaceOp::Replace { start, end } => {
                let position = |seq: u64, which: &str| {
                    self.nodes.iter().position(|&n| n == seq).ok_or_else(|| {
                        AppendError::BadReplace {
                            reason: format!("{which} seq {seq} not found in surface"),
                        }
                    })
                };
                let start_idx = position(start, "start")?;
                let end_idx = position(end, "end")?;
                if start_idx > end_idx {
                    return Err(AppendError::BadReplace {
                        reason: format!(
                            "start seq {start} (index {start_idx}) is after end seq {end} (index {end_idx})"
                        ),
                    });
                }
                let shadowed = &self.nodes[start_idx..=end_idx];
                let sources = event.source_event_seqs.as_deref().unwrap_or(&[]);
                let missing: Vec<String> = shadowed
                    .iter()
                    .filter(|s| !sources.contains(s))
                    .map(u64::to_string)
                    .collect();
                if !missing.is_empty() {
                    return Err(AppendError::BadSources {
                        reason: format!(
                            "must include every shadowed surface node; missing {}",
                            missing.join(", ")
                        ),
                    });
                }
                if let EventData::ToolResult(new) = &event.data {
                    check_tool_result_rewrite(new, shadowed, log)?;
                }
                Ok(SurfaceChange::Replace { start_idx, end_idx })
            }
        }
    }

    /// Commits a change planned against this surface for the event at `seq`.
    pub fn apply(&mut self, change: &SurfaceChange, seq: u64) {
        match *change {
            SurfaceChange::None => {}
            SurfaceChange::Append => self.nodes.push(seq),
            SurfaceChange::Replace { start_idx, end_idx } => {
                self.nodes.splice(start_idx..=end_idx, std::iter::once(seq));
                self.replace_generation += 1;
            }
        }
    }
}

/// The rules of `sourceEventSeqs` (§2.3): earlier seqs only, no duplicates, non-empty except on
/// `assistant/message` (where `[]` means "known empty provider stream").
fn check_sources(kind: &str, seq: u64, sources: &[u64]) -> Result<(), AppendError> {
    if sources.is_empty() && kind != "assistant/message" {
        return Err(AppendError::BadSources {
            reason: "must not be empty except on assistant/message".into(),
        });
    }
    for (i, &s) in sources.iter().enumerate() {
        if s >= seq {
            return Err(AppendError::BadSources {
                reason: format!("must reference earlier events: {s} >= current seq {seq}"),
            });
        }
        if sources[..i].contains(&s) {
            return Err(AppendError::BadSources {
                reason: "must not contain duplicates".into(),
            });
        }
    }
    Ok(())
}

/// A `tool/result` replacement rewrites exactly one current `tool/result` and may change only the inner
/// content of its single tool-result block (§2.4).
fn check_tool_result_rewrite(
    new: &crate::session::event::ToolResultEvent,
    shadowed: &[u64],
    log: &[Event],
) -> Result<(), AppendError> {
    use crate::llm::types::ContentBlock;
    let bad = |reason: &str| AppendError::BadReplace {
        reason: format!("tool/result surface replacement {reason}"),
    };
    let [target] = shadowed else {
        return Err(bad("must rewrite exactly one current node"));
    };
    let old = match usize::try_from(*target).ok().and_then(|i| log.get(i)) {
        Some(Event {
            data: EventData::ToolResult(old),
            ..
        }) => old,
        _ => return Err(bad("must target a current tool/result")),
    };
    let blank = |m: &crate::llm::types::Message| {
        let mut m = m.clone();
        for block in &mut m.content {
            if let ContentBlock::ToolResult { content, .. } = block {
                content.clear();
            }
        }
        m
    };
    let same = old.turn == new.turn
        && old.step == new.step
        && old.error == new.error
        && old.meta == new.meta
        && blank(&old.message) == blank(&new.message);
    if same {
        Ok(())
    } else {
        Err(bad("may change only content"))
    }
}

/// Replays a complete log from seq 0 with the same validation as `Session::append`.
///
/// # Errors
/// The seq of the first invalid event and why.
pub fn fold_surface(events: &[Event]) -> Result<FoldedSurface, (u64, AppendError)> {
    let mut surface = Surface::default();
    let mut replacements = Vec::new();
    for (i, event) in events.iter().enumerate() {
        let change = surface
            .plan(event, &events[..i])
            .map_err(|e| (event.seq, e))?;
        if let (
            SurfaceChange::Replace { start_idx, end_idx },
            Some(SurfaceOp::Replace { start, end }),
        ) = (&change, event.surface_op)
        {
            replacements.push(Replacement {
                seq: event.seq,
                start,
                end,
                shadowed_seqs: surface.nodes[*start_idx..=*end_idx].to_vec(),
            });
        }
        surface.apply(&change, event.seq);
    }
    Ok(FoldedSurface {
        nodes: surface.nodes,
        replacements,
    })
}

/// The original's surface catalogue (`reference/session-llm.md` §9.2).
///
/// No analogue: 10–12 (folding a window that starts at a high `baseSeq`: a `Session` always holds its
/// whole log, and hibernation reloads it whole), 14 (the incremental `Surface` has no field for
/// replacement history — a type fact), 29/31/39 (snapshotting the caller's `sourceEventSeqs` and
/// `surfaceOp`: an appended draft is moved into the log, so the caller keeps nothing to mutate),
/// 42 (type narrowing of the TypeScript guards). Cases the type system decides at parse time
/// (non-array, sparse, non-number, fractional and negative `sourceEventSeqs`) are tested as parse
/// failures.
#[cfg(test)]
mod catalogue_tests {
    use super::*;
    use crate::ids::SessionId;
    use crate::session::log::{EventDraft, Session};

    /// Parses JSON event lines, giving each the seq of its position (`SEQ` in the text).
    fn log(lines: &[String]) -> Vec<Event> {
        lines
            .iter()
            .enumerate()
            .map(|(i, l)| parse(&l.replace("SEQ", &i.to_string())))
            .collect()
    }

    fn parse(json: &str) -> Event {
        Event::from_json(json).unwrap_or_else(|e| panic!("{json}: {e}"))
    }

    fn session(lines: &[String]) -> Session {
        Session::from_events(SessionId::new("s").unwrap(), log(lines)).unwrap()
    }

    /// Appends `line` (its seq is assigned by the session) and returns the outcome.
    fn append(s: &mut Session, line: &str) -> Result<Event, AppendError> {
        let e = parse(&line.replace("SEQ", &s.next_seq().to_string()));
        let draft = EventDraft {
            data: e.data,
            source_event_seqs: e.source_event_seqs,
            surface_op: e.surface_op,
        };
        s.append(draft, 0).cloned()
    }

    fn user_with(id: &str, text: &str, tail: &str) -> String {
        format!(
            r#"{{"type":"user/message","seq":SEQ,"time":0,"data":{{"id":"{id}","role":"user","content":[{{"type":"text","text":"{text}"}}],"source":{{"kind":"user"}}}}{tail}}}"#
        )
    }
    fn user(id: &str) -> String {
        user_with(id, id, r#","surfaceOp":"append""#)
    }
    fn replace_user(id: &str, start: u64, end: u64, sources: &[u64]) -> String {
        user_with(
            id,
            id,
            &format!(
                r#","sourceEventSeqs":{sources:?},"surfaceOp":{{"op":"replace","start":{start},"end":{end}}}"#
            ),
        )
    }
    fn assistant(id: &str, text: &str, tail: &str) -> String {
        let content = if text.is_empty() {
            String::new()
        } else {
            format!(r#"{{"type":"text","text":"{text}"}}"#)
        };
        format!(
            r#"{{"type":"assistant/message","seq":SEQ,"time":0,"data":{{"turn":1,"step":1,"message":{{"id":"{id}","role":"assistant","content":[{content}],"source":{{"kind":"model","provider":"p","model":"m"}}}}}}{tail}}}"#
        )
    }
    fn result_with(call: &str, text: &str, is_error: bool, meta: &str, tail: &str) -> String {
        format!(
            r#"{{"type":"tool/result","seq":SEQ,"time":0,"data":{{"turn":1,"step":1,"message":{{"id":"r-{call}","role":"user","content":[{{"type":"tool-result","toolCallId":"{call}","content":[{{"type":"text","text":"{text}"}}],"isError":{is_error}}}],"source":{{"kind":"tool","callId":"{call}"}}}}{meta}}}{tail}}}"#
        )
    }
    fn result(call: &str, text: &str) -> String {
        result_with(call, text, false, "", r#","surfaceOp":"append""#)
    }
    fn rewrite_tail(start: u64, end: u64, sources: &[u64]) -> String {
        format!(
            r#","sourceEventSeqs":{sources:?},"surfaceOp":{{"op":"replace","start":{start},"end":{end}}}"#
        )
    }
    fn turn_start() -> String {
        r#"{"type":"turn/start","seq":SEQ,"time":0,"data":{"turn":1}}"#.into()
    }
    fn chunk() -> String {
        r#"{"type":"assistant/chunk","seq":SEQ,"time":0,"data":{"turn":1,"step":1,"chunk":{"type":"text-delta","index":0,"text":"x"}}}"#.into()
    }
    fn texts(s: &Session) -> Vec<String> {
        s.derive_messages().iter().map(|m| m.text()).collect()
    }

    /// Case 1: accepts absent or valid source-event references and complete replacement coverage
    #[test]
    fn accepts_valid_sources_and_complete_coverage() {
        let s = session(&[user("a"), user("b"), replace_user("c", 0, 1, &[0, 1])]);
        assert_eq!(s.surface().nodes, [2]);
    }

    /// Case 2: rejects source-event references on a non-surface event
    #[test]
    fn sources_on_a_log_only_event_are_refused() {
        let mut s = session(&[user("a")]);
        let line =
            r#"{"type":"turn/start","seq":SEQ,"time":0,"data":{"turn":1},"sourceEventSeqs":[0]}"#;
        assert_eq!(
            append(&mut s, line),
            Err(AppendError::NotSurfaceEligible {
                kind: "turn/start".into(),
                field: "sourceEventSeqs"
            })
        );
    }

    /// Case 3: accepts an explicit empty source-event list on an assistant message
    #[test]
    fn empty_sources_are_fine_on_an_assistant_message() {
        let mut s = Session::new(SessionId::new("s").unwrap());
        let e = append(
            &mut s,
            &assistant("a", "hi", r#","sourceEventSeqs":[],"surfaceOp":"append""#),
        )
        .unwrap();
        assert_eq!(e.source_event_seqs, Some(vec![]));
    }

    /// Case 4: rejects malformed sources, self references, non-contiguous seqs and incomplete coverage
    #[test]
    fn rejects_bad_sources() {
        let base = [user("a"), user("b")];
        let cases: [(String, AppendError); 4] = [
            (
                user_with("x", "x", r#","sourceEventSeqs":[],"surfaceOp":"append""#),
                AppendError::BadSources {
                    reason: "must not be empty except on assistant/message".into(),
                },
            ),
            (
                user_with("x", "x", r#","sourceEventSeqs":[0,0],"surfaceOp":"append""#),
                AppendError::BadSources {
                    reason: "must not contain duplicates".into(),
                },
            ),
            (
                user_with("x", "x", r#","sourceEventSeqs":[2],"surfaceOp":"append""#),
                AppendError::BadSources {
                    reason: "must reference earlier events: 2 >= current seq 2".into(),
                },
            ),
            (
                replace_user("x", 0, 1, &[0]),
                AppendError::BadSources {
                    reason: "must include every shadowed surface node; missing 1".into(),
                },
            ),
        ];
        for (line, want) in cases {
            let mut s = session(&base);
            assert_eq!(append(&mut s, &line), Err(want), "{line}");
            assert_eq!(s.next_seq(), 2);
        }
        // Shapes the type system refuses at parse time.
        for sources in [r#""0""#, "[0,,1]", r#"["0"]"#, "[0.5]", "[-1]", "null"] {
            let line = user_with(
                "x",
                "x",
                &format!(r#","sourceEventSeqs":{sources},"surfaceOp":"append""#),
            )
            .replace("SEQ", "2");
            assert!(Event::from_json(&line).is_err(), "{sources} accepted");
        }
        // A stored event whose seq is not its position.
        let mut events = log(&base);
        events.push(parse(&user("c").replace("SEQ", "2")));
        events[2].seq = 2;
        events[1].seq = 2;
        assert_eq!(
            Session::from_events(SessionId::new("s").unwrap(), events).unwrap_err(),
            (
                2,
                AppendError::NotContiguous {
                    seq: 2,
                    expected: 1
                }
            )
        );
    }

    /// Case 5: rejects a replacement spanning multiple current nodes
    #[test]
    fn result_rewrite_over_two_nodes_is_refused() {
        let mut s = session(&[result("c1", "a"), result("c2", "b")]);
        let line = result_with("c1", "short", false, "", &rewrite_tail(0, 1, &[0, 1]));
        assert_eq!(
            append(&mut s, &line),
            Err(AppendError::BadReplace {
                reason: "tool/result surface replacement must rewrite exactly one current node"
                    .into()
            })
        );
    }

    /// Case 6: rejects a replacement targeting a non-result node
    #[test]
    fn result_rewrite_of_a_user_message_is_refused() {
        let mut s = session(&[user("a")]);
        let line = result_with("c1", "short", false, "", &rewrite_tail(0, 0, &[0]));
        assert_eq!(
            append(&mut s, &line),
            Err(AppendError::BadReplace {
                reason: "tool/result surface replacement must target a current tool/result".into()
            })
        );
    }

    /// Case 7 and 8: rejects changes outside tool-result content: another call id or message, a changed
    /// block toolCallId or isError
    #[test]
    fn result_rewrite_may_change_only_content() {
        let refused = AppendError::BadReplace {
            reason: "tool/result surface replacement may change only content".into(),
        };
        let tail = rewrite_tail(0, 0, &[0]);
        let changed_call = result_with("c2", "short", false, "", &tail);
        let changed_error = result_with("c1", "short", true, "", &tail);
        let changed_block_id = result_with("c1", "short", false, "", &tail).replacen(
            r#""toolCallId":"c1""#,
            r#""toolCallId":"c9""#,
            1,
        );
        let changed_message_id =
            result_with("c1", "short", false, "", &tail).replacen("r-c1", "r-other", 1);
        let changed_step =
            result_with("c1", "short", false, "", &tail).replacen(r#""step":1"#, r#""step":2"#, 1);
        for line in [
            changed_call,
            changed_error,
            changed_message_id,
            changed_step,
        ] {
            let mut s = session(&[result("c1", "long")]);
            assert_eq!(append(&mut s, &line), Err(refused.clone()), "{line}");
        }
        // A block whose toolCallId differs from its source is refused by the payload check first.
        let mut s = session(&[result("c1", "long")]);
        assert!(matches!(
            append(&mut s, &changed_block_id),
            Err(AppendError::BadPayload { .. })
        ));
        let mut s = session(&[result("c1", "long")]);
        append(&mut s, &result_with("c1", "short", false, "", &tail)).unwrap();
        assert_eq!(s.surface().nodes, [1]);
        assert_eq!(texts(&s), [""]);
    }

    /// Case 9: compares array-valued rest fields structurally
    #[test]
    fn result_rewrite_compares_meta_structurally() {
        let meta = |m: &str| format!(r#","meta":{m}"#);
        let tail = rewrite_tail(0, 0, &[0]);
        let original = meta(r#"{"lines":[1,2],"k":{"a":1,"b":2}}"#);
        let accepted = [meta(r#"{"lines":[1,2],"k":{"b":2,"a":1}}"#)];
        let refused = [
            meta(r#"{"lines":[1,3],"k":{"a":1,"b":2}}"#),
            meta(r#"{"lines":"1,2","k":{"a":1,"b":2}}"#),
            meta(r#"{"lines":[1,2],"k":{"a":1,"c":2}}"#),
            meta(r#"{"lines":[1,2],"k":{"a":1}}"#),
            String::new(),
        ];
        let base = result_with("c1", "long", false, &original, r#","surfaceOp":"append""#);
        for m in accepted {
            let mut s = session(std::slice::from_ref(&base));
            assert!(
                append(&mut s, &result_with("c1", "s", false, &m, &tail)).is_ok(),
                "{m}"
            );
        }
        for m in refused {
            let mut s = session(std::slice::from_ref(&base));
            assert!(
                matches!(
                    append(&mut s, &result_with("c1", "s", false, &m, &tail)),
                    Err(AppendError::BadReplace { .. })
                ),
                "{m}"
            );
        }
    }

    /// Case 13: shares ordered entries and nested replacement ranges with foldSurface — replace(0..0) then
    /// replace(start 2, end 1) → nodes [3]; replacements [{2,0,0,[0]},{3,2,1,[2,1]}]
    #[test]
    fn fold_surface_reports_nested_replacements() {
        let events = log(&[
            user("a"),
            user("b"),
            replace_user("c", 0, 0, &[0]),
            replace_user("d", 2, 1, &[2, 1]),
        ]);
        let folded = fold_surface(&events).unwrap();
        assert_eq!(folded.nodes, [3]);
        assert_eq!(
            folded.replacements,
            [
                Replacement {
                    seq: 2,
                    start: 0,
                    end: 0,
                    shadowed_seqs: vec![0]
                },
                Replacement {
                    seq: 3,
                    start: 2,
                    end: 1,
                    shadowed_seqs: vec![2, 1]
                },
            ]
        );
        let s = Session::from_events(SessionId::new("s").unwrap(), events).unwrap();
        assert_eq!(s.surface().nodes, folded.nodes);
        assert_eq!(s.surface().replace_generation, 2);
    }

    /// Case 15: foldSurface reports the same invalid replacement failures as the incremental path
    #[test]
    fn fold_and_append_report_the_same_failure() {
        let bad = replace_user("x", 42, 42, &[0]);
        let mut events = log(&[user("a")]);
        events.push(parse(&bad.replace("SEQ", "1")));
        let want = AppendError::BadReplace {
            reason: "start seq 42 not found in surface".into(),
        };
        assert_eq!(fold_surface(&events), Err((1, want.clone())));
        let mut s = session(&[user("a")]);
        assert_eq!(append(&mut s, &bad), Err(want));
    }

    /// Case 16: leaves incremental state unchanged when candidate validation fails
    #[test]
    fn failed_candidate_changes_nothing() {
        let mut s = session(&[user("a"), user("b")]);
        let no_sources = user_with(
            "x",
            "x",
            r#","surfaceOp":{"op":"replace","start":0,"end":0}"#,
        );
        assert_eq!(
            append(&mut s, &no_sources),
            Err(AppendError::BadSources {
                reason: "must include every shadowed surface node; missing 0".into()
            })
        );
        assert_eq!(
            s.surface(),
            &Surface {
                nodes: vec![0, 1],
                replace_generation: 0
            }
        );
        assert_eq!(texts(&s), ["a", "b"]);
        append(&mut s, &user("c")).unwrap();
        assert_eq!(s.surface().nodes, [0, 1, 2]);
    }

    /// Case 17 and 18: foldSurface rejects a surface-eligible event without its marker and a marker on a
    /// log-only event
    #[test]
    fn fold_surface_checks_markers() {
        let unmarked = log(&[user_with("a", "a", "")]);
        assert_eq!(
            fold_surface(&unmarked),
            Err((
                0,
                AppendError::MissingSurfaceOp {
                    kind: "user/message".into()
                }
            ))
        );
        let marked = log(&[
            r#"{"type":"turn/start","seq":SEQ,"time":0,"data":{"turn":1},"surfaceOp":"append"}"#
                .to_string(),
        ]);
        assert_eq!(
            fold_surface(&marked),
            Err((
                0,
                AppendError::NotSurfaceEligible {
                    kind: "turn/start".into(),
                    field: "surfaceOp"
                }
            ))
        );
    }

    /// Case 19, 20 and 21: folds append markers in order, an empty surface without messages, and new
    /// events incrementally
    #[test]
    fn folds_appends_incrementally() {
        let mut s = session(&[turn_start(), user("a"), user("b")]);
        assert_eq!(s.surface().nodes, [1, 2]);
        let empty = session(&[turn_start(), chunk()]);
        assert!(empty.surface().nodes.is_empty());
        assert!(empty.derive_messages().is_empty());
        append(&mut s, &chunk()).unwrap();
        append(&mut s, &result("c1", "r")).unwrap();
        assert_eq!(s.surface().nodes, [1, 2, 4]);
        assert_eq!(s.derive_messages()[2].text(), "");
    }

    /// Case 22: replays identically from a seeded log with surface markers — nodes [1,2,4], same messages
    #[test]
    fn replays_identically() {
        let lines = [
            turn_start(),
            user("a"),
            assistant("x", "b", r#","surfaceOp":"append""#),
            chunk(),
            result("c1", "r"),
        ];
        let live = {
            let mut s = Session::new(SessionId::new("s").unwrap());
            for l in &lines {
                append(&mut s, l).unwrap();
            }
            s
        };
        let replayed = session(&lines);
        assert_eq!(replayed.surface().nodes, [1, 2, 4]);
        assert_eq!(replayed.derive_messages(), live.derive_messages());
        assert_eq!(replayed.events(), live.events());
    }

    /// Case 23, 24, 25 and 30: a replace splices out exactly the shadowed range, in place
    #[test]
    fn replace_splices_the_range_in_place() {
        // 23: shadow 1..2 of [1,2] → [4]
        let s = session(&[
            turn_start(),
            user("a"),
            user("b"),
            chunk(),
            replace_user("c", 1, 2, &[1, 2]),
        ]);
        assert_eq!(s.surface().nodes, [4]);
        // 24: both ends real nodes, a tail node survives → [3,2]
        let s = session(&[
            user("a"),
            user("b"),
            user("c"),
            replace_user("d", 0, 1, &[0, 1]),
        ]);
        assert_eq!(s.surface().nodes, [3, 2]);
        // 25: single node (start == end) → [0,2]
        let s = session(&[user("a"), user("b"), replace_user("c", 1, 1, &[1])]);
        assert_eq!(s.surface().nodes, [0, 2]);
        // 30: a replacement in the middle keeps the surrounding order → [0,3,2]
        let s = session(&[
            user("a"),
            user("b"),
            user("c"),
            replace_user("d", 1, 1, &[1]),
        ]);
        assert_eq!(s.surface().nodes, [0, 3, 2]);
        assert_eq!(texts(&s), ["a", "d", "c"]);
    }

    /// Case 26, 27 and 28: replace ends must be current nodes in order
    #[test]
    fn replace_ends_must_be_current_nodes_in_order() {
        let mut s = session(&[user("a"), user("b")]);
        let cases = [
            (
                replace_user("x", 5, 1, &[0, 1]),
                "start seq 5 not found in surface",
            ),
            (
                replace_user("x", 0, 99, &[0, 1]),
                "end seq 99 not found in surface",
            ),
            (
                replace_user("x", 1, 0, &[0, 1]),
                "start seq 1 (index 1) is after end seq 0 (index 0)",
            ),
        ];
        for (line, reason) in cases {
            assert_eq!(
                append(&mut s, &line),
                Err(AppendError::BadReplace {
                    reason: reason.into()
                })
            );
        }
        // A shadowed node is no longer current.
        append(&mut s, &replace_user("c", 0, 0, &[0])).unwrap();
        assert_eq!(
            append(&mut s, &replace_user("x", 0, 0, &[0])),
            Err(AppendError::BadReplace {
                reason: "start seq 0 not found in surface".into()
            })
        );
    }

    /// Case 32, 33, 34, 35 and 37: history comes from the surface path only: boundaries and chunks are
    /// skipped, replaced nodes are gone, injected context is a user message, an empty assistant
    /// message derives to nothing
    #[test]
    fn derivation_uses_the_surface() {
        let injected = r#"{"type":"user/message","seq":SEQ,"time":0,"data":{"id":"ctx","role":"user","content":[{"type":"text","text":"context"}],"source":{"kind":"plugin","plugin":"p"}},"surfaceOp":"append"}"#;
        let s = session(&[
            turn_start(),
            user("a"),
            chunk(),
            assistant("x", "b", r#","surfaceOp":"append""#),
            injected.to_string(),
        ]);
        assert_eq!(texts(&s), ["a", "b", "context"]);
        let roles: Vec<_> = s.derive_messages().iter().map(|m| m.role).collect();
        use crate::llm::types::Role;
        assert_eq!(roles, [Role::User, Role::Assistant, Role::User]);
        let s = session(&[user("a"), user("b"), replace_user("c", 0, 1, &[0, 1])]);
        assert_eq!(texts(&s), ["c"]);
        let s = session(&[assistant(
            "x",
            "",
            r#","sourceEventSeqs":[],"surfaceOp":"append""#,
        )]);
        assert_eq!(s.surface().nodes, [0]);
        assert!(s.derive_messages().is_empty());
    }

    /// Case 36 and 38: the appended event carries exactly the surface fields it was given, and a log-only
    /// event carries none
    #[test]
    fn surface_fields_are_recorded_on_the_event() {
        let mut s = session(&[user("a"), user("b")]);
        let e = append(
            &mut s,
            &assistant("x", "c", r#","sourceEventSeqs":[0,1],"surfaceOp":"append""#),
        )
        .unwrap();
        assert_eq!(
            (e.source_event_seqs.clone(), e.surface_op),
            (Some(vec![0, 1]), Some(SurfaceOp::Append))
        );
        assert_eq!(s.events()[2], e);
        assert!(
            e.to_json()
                .ends_with(r#""sourceEventSeqs":[0,1],"surfaceOp":"append"}"#)
        );
        let t = append(&mut s, &turn_start()).unwrap();
        assert_eq!((t.source_event_seqs, t.surface_op), (None, None));
    }

    /// Case 40, 41, 43–46: only the three message types are surface-eligible; an eligible type without a
    /// marker is refused rather than treated as log-only; markers split append-origin events from
    /// replacements
    #[test]
    fn eligibility_and_marker_kinds() {
        for kind in ["user/message", "assistant/message", "tool/result"] {
            assert!(is_surface_type(kind), "{kind}");
        }
        for kind in [
            "assistant/chunk",
            "tool/call",
            "turn/start",
            "todo/write",
            "session/end-seed",
            "steering/message",
        ] {
            assert!(!is_surface_type(kind), "{kind}");
        }
        let mut s = session(&[user("a")]);
        assert_eq!(
            append(&mut s, &user_with("u", "u", "")),
            Err(AppendError::MissingSurfaceOp {
                kind: "user/message".into()
            })
        );
        let events = log(&[user("a"), replace_user("b", 0, 0, &[0]), turn_start()]);
        let append_origin: Vec<u64> = events
            .iter()
            .filter(|e| e.surface_op == Some(SurfaceOp::Append))
            .map(|e| e.seq)
            .collect();
        let replacements: Vec<u64> = events
            .iter()
            .filter(|e| matches!(e.surface_op, Some(SurfaceOp::Replace { .. })))
            .map(|e| e.seq)
            .collect();
        assert_eq!((append_origin, replacements), (vec![0], vec![1]));
    }

    /// Case 47: folds the log on access and counts replaces
    #[test]
    fn counts_replacements() {
        let mut s = session(&[user("a")]);
        assert_eq!(s.surface().replace_generation, 0);
        append(&mut s, &replace_user("b", 0, 0, &[0])).unwrap();
        assert_eq!(s.surface().replace_generation, 1);
        assert_eq!(s.surface().nodes, [1]);
    }
}
