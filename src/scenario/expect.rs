//! The `expect` matcher: a log compared with a scenario's `expect` entries, event for event
//! (`whole`) or in order with others between (`subsequence`), each entry matched as a subset of its
//! event's JSON. Pure; on a difference it reports the first one, with both sides.

use std::fmt;

use serde_json::Value;

use super::{ExpectMode, Expectation, compact};
use crate::session::Event;

/// The first difference between a log and a scenario's `expect`.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// The scenario's name (empty from `match_log`, filled in by `Scenario::check`).
    pub scenario: String,
    /// Index into `expect`; equals `expect.len()` when the log holds events past the last expectation.
    pub expect_idx: usize,
    /// Index into the log of the event compared (`None` when the log ended first).
    pub event_idx: Option<usize>,
    /// The expectation as written (`null` past the end of `expect`).
    pub expected: Value,
    /// The event compared, as JSON with `time` 0 (`None` when the log ended first).
    pub actual: Option<Value>,
    /// Where they differ, e.g. `data.reason.kind: expected "completed", got "aborted"`.
    pub detail: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = match self.event_idx {
            Some(i) => format!("event {i}"),
            None => "the end of the log".to_string(),
        };
        writeln!(
            f,
            "scenario {:?}: expect[{}] vs {at}: {}",
            self.scenario, self.expect_idx, self.detail
        )?;
        writeln!(f, "  expected: {}", compact(&self.expected))?;
        match &self.actual {
            Some(a) => write!(f, "  actual:   {}", compact(a)),
            None => write!(f, "  actual:   (none)"),
        }
    }
}

// -------------------------------------------------------------------------------------------------
// The matcher.

/// An event as printed by `dsh scenario run`: its v0 JSON with `time` 0.
pub fn event_json(event: &Event) -> Value {
    let mut e = event.clone();
    e.time = 0;
    serde_json::to_value(&e).unwrap_or(Value::Null)
}

/// Whether `actual` holds `expected`: objects by key (an expected `null` also matches an absent key),
/// arrays element by element with equal lengths, everything else by equality.
///
/// # Errors
/// The first difference, named by its path under `path` (`data.reason.kind: expected ..., got ...`).
pub fn subset_match(expected: &Value, actual: Option<&Value>, path: &str) -> Result<(), String> {
    match (expected, actual) {
        (Value::Null, None | Some(Value::Null)) => Ok(()),
        (_, None) => Err(format!(
            "{path}: expected {}, got nothing",
            compact(expected)
        )),
        (Value::Object(want), Some(Value::Object(have))) => {
            for (key, w) in want {
                subset_match(w, have.get(key), &format!("{path}.{key}"))?;
            }
            Ok(())
        }
        (Value::Array(want), Some(Value::Array(have))) => {
            if want.len() != have.len() {
                return Err(format!(
                    "{path}: expected {} elements, got {}: {}",
                    want.len(),
                    have.len(),
                    compact(&Value::Array(have.clone()))
                ));
            }
            for (idx, (w, h)) in want.iter().zip(have).enumerate() {
                subset_match(w, Some(h), &format!("{path}[{idx}]"))?;
            }
            Ok(())
        }
        (w, Some(h)) => {
            if w == h {
                Ok(())
            } else {
                Err(format!(
                    "{path}: expected {}, got {}",
                    compact(w),
                    compact(h)
                ))
            }
        }
    }
}

fn match_one(expectation: &Expectation, event: &Value) -> Result<(), String> {
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != expectation.kind {
        return Err(format!(
            "type: expected {:?}, got {kind:?}",
            expectation.kind
        ));
    }
    for (key, want) in &expectation.fields {
        let root = key.clone();
        subset_match(want, event.get(key), &root)?;
    }
    Ok(())
}

/// Compares `events` with `expect` in `mode`. The returned mismatch has an empty `scenario`.
///
/// # Errors
/// The first difference: in `Whole` mode the first entry that differs from the event at its index,
/// or the first missing or surplus event; in `Subsequence` mode the first entry no later event
/// matches (with the nearest event of the same type as `actual`).
pub fn match_log(
    expect: &[Expectation],
    mode: ExpectMode,
    events: &[Event],
) -> Result<(), Box<Mismatch>> {
    let json: Vec<Value> = events.iter().map(event_json).collect();
    let mismatch = |expect_idx: usize,
                    event_idx: Option<usize>,
                    expected: Value,
                    detail: String|
     -> Box<Mismatch> {
        Box::new(Mismatch {
            scenario: String::new(),
            expect_idx,
            event_idx,
            expected,
            actual: event_idx.and_then(|i| json.get(i).cloned()),
            detail,
        })
    };
    match mode {
        ExpectMode::Whole => {
            for (i, e) in expect.iter().enumerate() {
                let Some(actual) = json.get(i) else {
                    return Err(mismatch(
                        i,
                        None,
                        e.written.clone(),
                        format!("the log ends after {} events", json.len()),
                    ));
                };
                if let Err(detail) = match_one(e, actual) {
                    return Err(mismatch(i, Some(i), e.written.clone(), detail));
                }
            }
            if json.len() > expect.len() {
                return Err(mismatch(
                    expect.len(),
                    Some(expect.len()),
                    Value::Null,
                    format!(
                        "the log has {} events after the last expected one",
                        json.len() - expect.len()
                    ),
                ));
            }
            Ok(())
        }
        ExpectMode::Subsequence => {
            let mut from = 0;
            for (i, e) in expect.iter().enumerate() {
                match (from..json.len()).find(|&j| match_one(e, &json[j]).is_ok()) {
                    Some(j) => from = j + 1,
                    None => {
                        let nearest = (from..json.len()).find(|&j| {
                            json[j].get("type").and_then(Value::as_str) == Some(e.kind.as_str())
                        });
                        let detail = match nearest {
                            Some(j) => format!(
                                "no event from index {from} on matches; the nearest {} differs: {}",
                                e.kind,
                                match_one(e, &json[j]).err().unwrap_or_default()
                            ),
                            None => format!("no {} event from index {from} on", e.kind),
                        };
                        return Err(mismatch(i, nearest, e.written.clone(), detail));
                    }
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::parse::parse_expect;
    use serde_json::json;

    fn expectation(v: Value) -> Expectation {
        parse_expect(&json!([v])).expect("valid").remove(0)
    }

    #[test]
    fn subset_matches_objects_by_key_and_arrays_by_element() {
        let actual = json!({"a": 1, "b": {"c": [1, {"d": 2, "e": 3}]}, "n": null});
        assert_eq!(
            subset_match(&json!({"b": {"c": [1, {"d": 2}]}}), Some(&actual), "data"),
            Ok(())
        );
        assert_eq!(
            subset_match(&json!({"b": {"c": [1]}}), Some(&actual), "data"),
            Err("data.b.c: expected 1 elements, got 2: [1,{\"d\":2,\"e\":3}]".into())
        );
        assert_eq!(
            subset_match(&json!({"b": {"c": [1, {"d": 5}]}}), Some(&actual), "data"),
            Err("data.b.c[1].d: expected 5, got 2".into())
        );
        assert_eq!(
            subset_match(&json!({"missing": null, "n": null}), Some(&actual), "data"),
            Ok(())
        );
        assert_eq!(
            subset_match(&json!({"x": 1}), Some(&actual), "data"),
            Err("data.x: expected 1, got nothing".into())
        );
    }

    #[test]
    fn whole_mode_reports_the_first_difference_and_surplus_events() {
        use crate::session::event::{EventData, TurnStart};
        let events: Vec<Event> = (1..=2)
            .map(|turn| Event {
                seq: turn - 1,
                time: 77,
                data: EventData::TurnStart(TurnStart { turn }),
                ignorable: false,
                source_event_seqs: None,
                surface_op: None,
            })
            .collect();
        let e1 = expectation(json!({"type": "turn/start", "data": {"turn": 1}}));
        let e2 = expectation(json!({"type": "turn/start", "data": {"turn": 3}}));
        let m = match_log(&[e1.clone(), e2], ExpectMode::Whole, &events).expect_err("differs");
        assert_eq!((m.expect_idx, m.event_idx), (1, Some(1)));
        assert_eq!(m.detail, "data.turn: expected 3, got 2");
        assert_eq!(
            m.actual,
            Some(json!({"type": "turn/start", "seq": 1, "time": 0, "data": {"turn": 2}}))
        );
        let m =
            match_log(std::slice::from_ref(&e1), ExpectMode::Whole, &events).expect_err("surplus");
        assert_eq!((m.expect_idx, m.event_idx), (1, Some(1)));
        assert_eq!(match_log(&[e1], ExpectMode::Subsequence, &events), Ok(()));
    }
}
