//! Compaction in the turn machine (SPEC §15, `reference/session-llm.md` §8.2): when it runs, the
//! events it appends, and what continues after it. The decisions — estimates, the split, the pruner's
//! rewrites, the summariser request, what its answer is worth, the checkpoint — are
//! `session::compaction`'s; this file sequences them.
//!
//! Three triggers share one bracket (`compaction/start` … `compaction/end`):
//! - **pressure**: before a step is entered (after the claim, before `step/start`), when the estimate
//!   of the next request passes `threshold_ratio` of the context window. Large tool results are
//!   pruned first; if that is not enough, the head before the retained tail is summarised (up to two
//!   attempts). Whatever happens, the step is entered afterwards.
//! - **overflow**: an attempt failed with `CONTEXT_WINDOW_EXCEEDED` (once per activation, before the
//!   `request_error` hooks): prune, then summarise everything but the newest unit; the attempt is
//!   retried iff the surface changed, else the failure goes on to recovery as usual. Its events land
//!   inside the open step, after the failed attempt's chunks.
//! - **manual** (`compact_now`): only while idle, as maintenance (status stays idle, waking input is
//!   deferred); `turn: null`, no pruning. The caller learns the compaction's id and start seq from
//!   `Effect::CompactionStarted`, or why nothing started.
//!
//! The summariser's stream goes through the same `Effect::StartStream` as a loop request, once
//! `compaction/start` is durable (the model-request checkpoint); its chunks are not logged. A failure
//! (stream error, cut summary, no text, a summary not smaller than what it replaces, a changed
//! surface, a cancel) writes `compaction/end {error}` and changes nothing else.

use std::mem;
use std::sync::Arc;

use crate::llm::assembler::BlockAssembler;
use crate::llm::retry::RetryPolicy;
use crate::llm::types::{LlmFailure, LlmRequest, Message, StreamChunk, codes};
use crate::session::compaction::{
    CompactionEnd, CompactionEvent, CompactionStart, CompactionSummary, SUMMARY_MAX_TOKENS,
    SummaryPlan, checkpoint_message, error_chain, estimate_message, known_context_window, measure,
    plan_head, plan_prunes, replace_one, summary_outcome, summary_request,
};
use crate::session::event::EventData;
use crate::session::log::EventDraft;

use super::{AgentCore, Busy, Effect, Phase, ResolvedProvider, Stage};

/// Summary attempts a pressure compaction makes before the step goes on without one.
const PRESSURE_ATTEMPTS_MAX: u32 = 2;

/// What started a compaction, and so what continues once it ends.
#[derive(Debug)]
pub(super) enum Trigger {
    /// Pressure before step `proposed`; its claimed batch waits to be entered.
    Pressure {
        proposed: u64,
        messages: Vec<Arc<Message>>,
        attempt: u32,
    },
    /// An attempt of the open step failed with `CONTEXT_WINDOW_EXCEEDED`.
    Overflow {
        failure: LlmFailure,
        provider: String,
        retry_policy: Option<RetryPolicy>,
        /// The surface's replace generation before the recovery began.
        generation: u64,
    },
    /// By hand, between turns.
    Manual,
}

/// The summariser's request, waiting for its checkpoint or streaming.
#[derive(Debug)]
enum Summariser {
    Checkpoint {
        through: u64,
        provider: ResolvedProvider,
        request: Box<LlmRequest>,
    },
    Streaming {
        assembler: Box<BlockAssembler>,
        n_bytes: usize,
        finished: bool,
    },
    /// No provider serves the route: the compaction fails at dispatch.
    NoProvider,
}

/// One compaction in progress (between its `compaction/start` and `compaction/end`).
#[derive(Debug)]
pub(super) struct Compaction {
    id: String,
    trigger: Trigger,
    /// The start's `turn`: the open turn, or `None` for a manual compaction.
    turn: Option<u64>,
    start_seq: u64,
    plan: SummaryPlan,
    /// The surface when the compaction started, re-validated before the replacement.
    nodes: Vec<u64>,
    provider: String,
    model: String,
    /// The summariser stream's ticket.
    ticket: u64,
    summariser: Summariser,
}

/// Why a manual compaction did not start (the agent was idle).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CompactRefusal {
    /// The surface is one indivisible unit (or empty): there is no head to summarise.
    #[error("nothing to compact: the history is a single unit")]
    NothingToCompact,
    /// The log could not be read back (the agent was hibernated).
    #[error("the log could not be read back: {0}")]
    LoadFailed(String),
}

/// The answer to `compact_now`, delivered as `Effect::CompactionStarted`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactionStarted {
    /// The compaction's id.
    pub compaction_id: String,
    /// The seq of its `compaction/start`.
    pub seq: u64,
}

impl AgentCore {
    /// Compacts by hand (`/compact`): only while idle, as maintenance. The outcome of the start is
    /// reported as `Effect::CompactionStarted`; the compaction ends (and the agent is idle again)
    /// when its `compaction/end` is written.
    ///
    /// # Errors
    /// `Busy` unless the agent is idle.
    pub fn compact_now(&mut self, now: i64) -> Result<(), Busy> {
        if !self.is_idle() {
            return Err(Busy {
                id: self.id.clone(),
            });
        }
        self.phase = Phase::Maintenance(super::Activity::default());
        self.effects.push(Effect::NewCancelToken);
        if self.is_hibernated() {
            let ticket = self.ticket();
            self.manual_load = Some(ticket);
            self.load_log(ticket, now);
        } else {
            self.start_manual(now);
        }
        Ok(())
    }

    /// The log of a manual compaction was read back: start it, or report why not.
    pub(super) fn on_manual_log_loaded(&mut self, loaded: Result<(), String>, now: i64) {
        match loaded {
            Ok(()) => self.start_manual(now),
            Err(reason) => {
                self.effects.push(Effect::CompactionStarted {
                    result: Err(CompactRefusal::LoadFailed(reason)),
                });
                self.end_maintenance(now);
            }
        }
    }

    fn start_manual(&mut self, now: i64) {
        let retain = self
            .compaction_window()
            .map(|_| self.config.compaction.retain_tokens().unwrap_or_default());
        let Some(plan) = plan_head(self.session_ref(), retain) else {
            self.effects.push(Effect::CompactionStarted {
                result: Err(CompactRefusal::NothingToCompact),
            });
            return self.end_maintenance(now);
        };
        let (compaction_id, seq) = self.begin_compaction(Trigger::Manual, None, plan, now);
        self.effects.push(Effect::CompactionStarted {
            result: Ok(CompactionStarted { compaction_id, seq }),
        });
        self.dispatch_summariser_if_durable(now);
    }

    /// The context window compaction works with: configured, else the table of known models (for
    /// the model of the latest header, else the agent's), else none.
    fn compaction_window(&self) -> Option<u64> {
        self.config.compaction.context_window.or_else(|| {
            let model = self
                .session()
                .and_then(|s| s.request_header())
                .map_or(self.config.model.as_str(), |h| h.config.model.as_str());
            known_context_window(model)
        })
    }

    /// Pressure before step `proposed` (§8.2): prunes and, if still above the threshold, starts a
    /// summarising compaction and returns `None` (the step is entered when it ends). Otherwise
    /// gives `messages` back for the step to be entered now.
    pub(super) fn compact_under_pressure(
        &mut self,
        proposed: u64,
        messages: Vec<Arc<Message>>,
        now: i64,
    ) -> Option<Vec<Arc<Message>>> {
        if !self.config.compaction.auto {
            return Some(messages);
        }
        let Some(window) = self.compaction_window() else {
            return Some(messages);
        };
        let settings = &self.config.compaction;
        let threshold = (window as f64 * settings.threshold_ratio).floor() as u64;
        let retain = (window as f64 * settings.retain_ratio).floor() as u64;
        if measure(self.session_ref()) <= threshold {
            return Some(messages);
        }
        self.prune(now);
        if measure(self.session_ref()) <= threshold {
            return Some(messages);
        }
        let Some(plan) = plan_head(self.session_ref(), Some(retain)) else {
            return Some(messages);
        };
        let turn = self.run_mut().turn;
        let trigger = Trigger::Pressure {
            proposed,
            messages,
            attempt: 1,
        };
        self.begin_compaction(trigger, Some(turn), plan, now);
        self.run_mut().stage = Stage::Compacting;
        self.dispatch_summariser_if_durable(now);
        None
    }

    /// Overflow recovery (§8.2): once per activation, prune and summarise everything but the newest
    /// unit. Returns the failure back when it does not apply or changes nothing.
    pub(super) fn compact_on_overflow(
        &mut self,
        failure: LlmFailure,
        provider: String,
        retry_policy: Option<RetryPolicy>,
        now: i64,
    ) -> Option<(LlmFailure, String, Option<RetryPolicy>)> {
        let run = self.run_mut();
        if failure.code != codes::CONTEXT_WINDOW_EXCEEDED
            || run.overflow_recovered
            || !self.config.compaction.auto
        {
            return Some((failure, provider, retry_policy));
        }
        self.run_mut().overflow_recovered = true;
        let generation = self.session_ref().surface().replace_generation;
        self.prune(now);
        match plan_head(self.session_ref(), None) {
            Some(plan) => {
                let turn = self.run_mut().turn;
                let trigger = Trigger::Overflow {
                    failure,
                    provider,
                    retry_policy,
                    generation,
                };
                self.begin_compaction(trigger, Some(turn), plan, now);
                self.run_mut().stage = Stage::Compacting;
                self.dispatch_summariser_if_durable(now);
                None
            }
            None if self.session_ref().surface().replace_generation > generation => {
                self.start_attempt(now);
                None
            }
            None => Some((failure, provider, retry_policy)),
        }
    }

    /// The model-free pruner (§8.3): one `compaction/prune` and one replacing `tool/result` per
    /// oversized result on the surface, adjacent, inside the open turn.
    fn prune(&mut self, now: i64) {
        for (seq, plan) in plan_prunes(self.session_ref()) {
            self.append(
                EventDraft::log(CompactionEvent::Prune(plan.prune).into_data()),
                now,
            );
            self.append(
                EventDraft {
                    data: EventData::ToolResult(Box::new(plan.replacement)),
                    source_event_seqs: Some(vec![seq]),
                    surface_op: Some(replace_one(seq)),
                },
                now,
            );
        }
    }

    /// Appends `compaction/start` and prepares the summariser request; returns the id and the
    /// start's seq. The request is dispatched once the start is durable.
    fn begin_compaction(
        &mut self,
        trigger: Trigger,
        turn: Option<u64>,
        plan: SummaryPlan,
        now: i64,
    ) -> (String, u64) {
        let id = self.mint_id().to_string();
        let start_seq = self.append(
            EventDraft::log(
                CompactionEvent::Start(CompactionStart {
                    compaction_id: id.clone(),
                    source_command_id: None,
                    turn,
                })
                .into_data(),
            ),
            now,
        );
        let instruction_id = self.mint_id();
        let session = self.session_ref();
        let request = summary_request(
            session,
            &plan,
            (&self.config.provider, &self.config.model),
            instruction_id,
        );
        let nodes = session.surface().nodes.clone();
        let provider = self
            .wiring
            .as_ref()
            .and_then(|w| w.providers.get(&request.config.provider))
            .cloned();
        let ticket = self.ticket();
        let compaction = Compaction {
            id: id.clone(),
            trigger,
            turn,
            start_seq,
            plan,
            nodes,
            provider: request.config.provider.clone(),
            model: request.config.model.clone(),
            ticket,
            summariser: match provider {
                Some(p) => Summariser::Checkpoint {
                    through: start_seq,
                    provider: ResolvedProvider(p),
                    request: Box::new(request),
                },
                None => Summariser::NoProvider,
            },
        };
        self.compaction = Some(Box::new(compaction));
        (id, start_seq)
    }

    /// Dispatches the summariser once `compaction/start` is durable (or fails a compaction whose
    /// route has no provider).
    pub(super) fn dispatch_summariser_if_durable(&mut self, now: i64) {
        let durable = self.durable_seq;
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        if let Summariser::NoProvider = c.summariser {
            let failure = LlmFailure::new(
                codes::NO_ADAPTER,
                format!("no provider registered for route {:?}", c.provider),
            );
            return self.fail_compaction("summary", failure, now);
        }
        let ready =
            matches!(&c.summariser, Summariser::Checkpoint { through, .. } if *through < durable);
        if !ready {
            return;
        }
        let Summariser::Checkpoint {
            provider, request, ..
        } = mem::replace(
            &mut c.summariser,
            Summariser::Streaming {
                assembler: Box::new(BlockAssembler::new()),
                n_bytes: 0,
                finished: false,
            },
        )
        else {
            unreachable!("checked above")
        };
        let ticket = c.ticket;
        self.effects.push(Effect::StartStream {
            ticket,
            provider_name: request.config.provider.clone(),
            provider,
            request: *request,
        });
    }

    /// Whether `ticket` is the summariser's stream.
    pub(super) fn is_summariser(&self, ticket: u64) -> bool {
        self.compaction.as_ref().is_some_and(|c| c.ticket == ticket)
    }

    /// One chunk of the summariser's stream (not logged).
    pub(super) fn on_summary_chunk(&mut self, chunk: StreamChunk, now: i64) {
        let bytes_max = self.config.limits.assistant_bytes_max;
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        let Summariser::Streaming {
            assembler,
            n_bytes,
            finished,
        } = &mut c.summariser
        else {
            return;
        };
        if *finished {
            return;
        }
        *n_bytes += match &chunk {
            StreamChunk::TextDelta { text, .. } | StreamChunk::ReasoningDelta { text, .. } => {
                text.len()
            }
            _ => 0,
        };
        if *n_bytes > bytes_max && !chunk.is_finish() {
            let ticket = c.ticket;
            self.effects.push(Effect::CancelStream { ticket });
            let failure = LlmFailure::new(
                codes::MALFORMED_RESPONSE,
                format!("the summary exceeded {bytes_max} bytes"),
            );
            return self.fail_compaction("summary", failure, now);
        }
        assembler.push(&chunk);
        if chunk.is_finish() {
            *finished = true;
            self.complete_summary(now);
        }
    }

    /// The summariser's stream ended; without a finish chunk that is a failure.
    pub(super) fn on_summary_stream_end(&mut self, now: i64) {
        let unfinished = self.compaction.as_ref().is_some_and(|c| {
            matches!(
                c.summariser,
                Summariser::Streaming {
                    finished: false,
                    ..
                }
            )
        });
        if unfinished {
            let failure = LlmFailure::new(
                codes::STREAM_CLOSED,
                "the summariser stream ended without a finish",
            );
            self.fail_compaction("summary", failure, now);
        }
    }

    /// The summary is complete: validate it, then write the summary, the checkpoint and the end.
    fn complete_summary(&mut self, now: i64) {
        let Some(c) = self.compaction.as_ref() else {
            return;
        };
        let Summariser::Streaming { assembler, .. } = &c.summariser else {
            return;
        };
        let finish = assembler.finish();
        let usage = assembler.usage().cloned();
        let raw = match assembler.blocks() {
            Ok(blocks) => blocks,
            Err(e) => {
                let failure = LlmFailure::new(codes::MALFORMED_RESPONSE, e.to_string());
                return self.fail_compaction("summary", failure, now);
            }
        };
        let summary = match summary_outcome(&finish, raw.clone()) {
            Ok(s) => s,
            Err(failure) => return self.fail_compaction("summary", failure, now),
        };
        let nodes = &self.session_ref().surface().nodes;
        let unchanged = match c.trigger {
            Trigger::Manual => nodes.starts_with(&c.plan.shadowed),
            _ => *nodes == c.nodes,
        };
        if !unchanged {
            let failure = LlmFailure::new("CHANGED", "the surface changed during the compaction");
            return self.fail_compaction("changed", failure, now);
        }
        let checkpoint_id = self.mint_id();
        let Some(c) = self.compaction.take() else {
            return;
        };
        let checkpoint = checkpoint_message(checkpoint_id, &c.id, &summary);
        if !matches!(c.trigger, Trigger::Manual)
            && estimate_message(&checkpoint) >= c.plan.token_count
        {
            self.compaction = Some(c);
            let failure = LlmFailure::new(
                "NOT_SMALLER",
                "the checkpoint is not smaller than the history it would replace",
            );
            return self.fail_compaction("summary", failure, now);
        }
        let range = c.plan.range();
        let summary_seq = self.append(
            EventDraft::log(
                CompactionEvent::Summary(Box::new(CompactionSummary {
                    compaction_id: c.id.clone(),
                    source_command_id: None,
                    summary,
                    raw_output: Some(raw),
                    llm_stream_call: Some(true),
                    shadowed_range: range,
                    shadowed_seqs: c.plan.shadowed.clone(),
                    shadowed_token_count: c.plan.token_count,
                    provider: c.provider.clone(),
                    model: c.model.clone(),
                    max_tokens: Some(SUMMARY_MAX_TOKENS),
                    usage,
                }))
                .into_data(),
            ),
            now,
        );
        let mut sources = vec![c.start_seq, summary_seq];
        sources.extend_from_slice(&c.plan.shadowed);
        self.append(
            EventDraft {
                data: EventData::UserMessage(Arc::new(checkpoint)),
                source_event_seqs: Some(sources),
                surface_op: Some(crate::session::event::SurfaceOp::Replace {
                    start: range.start,
                    end: range.end,
                }),
            },
            now,
        );
        self.end_compaction(*c, None, now);
    }

    /// The compaction failed: `compaction/end {error}`, the surface untouched.
    fn fail_compaction(&mut self, context: &str, failure: LlmFailure, now: i64) {
        let Some(c) = self.compaction.take() else {
            return;
        };
        if let Summariser::Streaming {
            finished: false, ..
        } = c.summariser
        {
            self.effects.push(Effect::CancelStream { ticket: c.ticket });
        }
        tracing::debug!(agent = %self.id, compaction = %c.id, code = %failure.code, "compaction failed");
        self.end_compaction(*c, Some(error_chain(context, &failure)), now);
    }

    /// Writes `compaction/end` and continues what the trigger interrupted.
    fn end_compaction(&mut self, c: Compaction, error: Option<String>, now: i64) {
        let succeeded = error.is_none();
        self.effects
            .push(Effect::CompactionEnded { failed: !succeeded });
        self.append(
            EventDraft::log(
                CompactionEvent::End(CompactionEnd {
                    compaction_id: c.id,
                    source_command_id: None,
                    turn: c.turn,
                    error,
                })
                .into_data(),
            ),
            now,
        );
        match c.trigger {
            Trigger::Manual => self.end_maintenance(now),
            Trigger::Pressure {
                proposed,
                messages,
                attempt,
            } => {
                self.run_mut().stage = Stage::Transition;
                if !succeeded
                    && attempt < PRESSURE_ATTEMPTS_MAX
                    && let Some(plan) =
                        plan_head(self.session_ref(), self.config.compaction.retain_tokens())
                {
                    let turn = self.run_mut().turn;
                    let trigger = Trigger::Pressure {
                        proposed,
                        messages,
                        attempt: attempt + 1,
                    };
                    self.begin_compaction(trigger, Some(turn), plan, now);
                    self.run_mut().stage = Stage::Compacting;
                    return self.dispatch_summariser_if_durable(now);
                }
                self.enter_step(proposed, messages, now);
            }
            Trigger::Overflow {
                failure,
                provider,
                retry_policy,
                generation,
            } => {
                self.run_mut().stage = Stage::Transition;
                if self.session_ref().surface().replace_generation > generation {
                    self.start_attempt(now);
                } else {
                    self.recover(failure, provider, retry_policy, now);
                }
            }
        }
    }

    /// A cancel reached a compaction in progress: close its stream and write its failed end. The
    /// caller ends the turn (or the maintenance) afterwards.
    pub(super) fn abort_compaction(&mut self, now: i64) {
        let Some(c) = self.compaction.take() else {
            return;
        };
        if let Summariser::Streaming {
            finished: false, ..
        } = c.summariser
        {
            self.effects.push(Effect::CancelStream { ticket: c.ticket });
        }
        self.effects.push(Effect::CompactionEnded { failed: true });
        let failure = LlmFailure::new(codes::ABORTED, "the compaction was cancelled");
        let error = Some(error_chain("cancelled", &failure));
        self.append(
            EventDraft::log(
                CompactionEvent::End(CompactionEnd {
                    compaction_id: c.id,
                    source_command_id: None,
                    turn: c.turn,
                    error,
                })
                .into_data(),
            ),
            now,
        );
    }
}
