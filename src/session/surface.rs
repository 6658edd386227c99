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
    Replace { start_idx: usize, end_idx: usize },
}

/// One replacement found by `fold_surface`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub seq: u64,
    pub start: u64,
    pub end: u64,
    /// The shadowed nodes, in surface order.
    pub shadowed_seqs: Vec<u64>,
}

/// The offline fold of a complete log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FoldedSurface {
    pub nodes: Vec<u64>,
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
