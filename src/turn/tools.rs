//! The tool half of a step: the batch of calls one assistant message made, run by the schedule's
//! rules (pool cap, barriers, model-order commit), each call through its `tool/call`, `pre_execute`,
//! durability checkpoint, body, `post_execute` and `tool/result`; and what an abort or a failed pool
//! leaves behind (every logged call gets exactly one result).

use std::mem;
use std::sync::Arc;

use crate::hooks::{HookError, PreExecute};
use crate::llm::types::{ContentBlock, LlmFailure, Message, MessageSource, Role, codes};
use crate::session::event::{
    EventData, InboxTarget, ToolCallEvent, ToolResultEvent, TurnEndReason,
};
use crate::session::log::EventDraft;
use crate::tools::schedule::{PlannedCall, SlotState, ToolSchedule};
use crate::tools::{ToolArgs, ToolInvocation, ToolOutput};

use super::{AgentCore, Effect, HookCall, ResolvedTool, Stage};

/// What `commit_ready_tool` did.
enum Commit {
    /// No result was ready (or one is in `post_execute`).
    Nothing,
    /// A final result (no `post_execute`) was committed.
    Final,
    /// A result was committed with no tool hooks to run.
    Unhooked,
    /// A result went to the `post_execute` hooks.
    ToHooks,
}

/// The tool calls of one assistant message, in model order.
#[derive(Debug)]
pub(super) struct ToolBatch {
    /// Names the batch in effects and answers.
    pub(super) ticket: u64,
    schedule: ToolSchedule,
    /// The seq of each call's `tool/call`, once logged.
    call_seqs: Vec<Option<u64>>,
    /// Each call's result, once resolved and until committed.
    outputs: Vec<Option<ToolOutput>>,
    /// Results that bypass `post_execute` (unknown tool, aborted before dispatch, failed hook).
    final_result: Vec<bool>,
    /// The call whose `pre_execute` hooks run.
    pre_executing: Option<usize>,
    /// A prepared call waiting for its `tool/call` to be durable: (idx, seq, its tool).
    checkpoint: Option<(usize, u64, ResolvedTool)>,
    /// The call whose `post_execute` hooks run, with its un-hooked output (committed as is if the
    /// turn is cancelled meanwhile).
    post_executing: Option<(usize, ToolOutput)>,
    /// A committed result concluded the turn.
    concluded: bool,
}

impl AgentCore {
    /// The `pre_execute` hooks decided about call `idx` (or failed: the call then gets an error
    /// result and its body does not run).
    pub fn on_pre_execute(
        &mut self,
        ticket: u64,
        idx: usize,
        decision: Result<PreExecute, HookError>,
        now: i64,
    ) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        if batch.pre_executing != Some(idx) {
            return;
        }
        batch.pre_executing = None;
        self.decide_pre_execute(idx, decision);
        self.pump_tools(now);
    }

    /// Applies the `pre_execute` decision about call `idx`: resolve it with an error result, dispatch
    /// its body, or hold it at the checkpoint until its `tool/call` is durable.
    fn decide_pre_execute(&mut self, idx: usize, decision: Result<PreExecute, HookError>) {
        let batch = self.current_batch();
        let call = batch.schedule.call(idx).clone();
        let call_seq = batch.call_seqs[idx].expect("a started call has a tool/call seq");
        if batch.schedule.is_aborted() {
            return self.resolve_tool(idx, ToolOutput::aborted_before_dispatch(), true);
        }
        match decision {
            Err(e) => self.resolve_tool(idx, ToolOutput::hook_failed(e), true),
            Ok(PreExecute::Deny { reason }) => {
                self.resolve_tool(idx, ToolOutput::error(reason, None), false);
            }
            Ok(PreExecute::Allow) => {
                let bytes_max = self.config.limits.tool_arguments_bytes_max;
                match self.tools.get(&call.name).cloned() {
                    None => self.resolve_tool(idx, ToolOutput::unknown_tool(&call.name), true),
                    Some(_) if call.arguments.len() > bytes_max => {
                        let out = ToolOutput::error(
                            format!(
                                "tool arguments are {} bytes, the limit is {bytes_max}",
                                call.arguments.len(),
                            ),
                            None,
                        );
                        self.resolve_tool(idx, out, true);
                    }
                    Some(tool) if self.durable_seq > call_seq => {
                        self.dispatch_tool(idx, ResolvedTool(tool));
                    }
                    Some(tool) => {
                        // Checkpoint: the tool/call is durable before the body starts.
                        self.current_batch().checkpoint = Some((idx, call_seq, ResolvedTool(tool)));
                    }
                }
            }
        }
    }

    /// Dispatches the body held at the checkpoint once events below `through_seq` are durable.
    pub(super) fn on_tool_checkpoint(&mut self, through_seq: u64, now: i64) {
        let batch = self.current_batch();
        let Some((idx, seq, tool)) = batch.checkpoint.take() else {
            return;
        };
        if seq >= through_seq {
            batch.checkpoint = Some((idx, seq, tool));
            return;
        }
        self.dispatch_tool(idx, tool);
        self.pump_tools(now);
    }

    /// Tool call `idx`'s body finished (or was killed after the grace period).
    pub fn on_tool_finished(&mut self, ticket: u64, idx: usize, output: ToolOutput, now: i64) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        if batch.schedule.state(idx) != SlotState::Running {
            return;
        }
        let output = if batch.schedule.is_aborted() && !output.is_error {
            // A successful body that finished after the abort does not count as success.
            ToolOutput {
                additional_contexts: output.additional_contexts,
                ..ToolOutput::aborted(None)
            }
        } else {
            output
        };
        self.resolve_tool(idx, output, false);
        self.pump_tools(now);
    }

    /// The `post_execute` hooks produced the output to commit for call `idx` (or failed: an error
    /// result is committed instead).
    pub fn on_post_execute(
        &mut self,
        ticket: u64,
        idx: usize,
        output: Result<ToolOutput, HookError>,
        now: i64,
    ) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        if !matches!(batch.post_executing, Some((i, _)) if i == idx) {
            return;
        }
        batch.post_executing = None;
        let output = output.unwrap_or_else(ToolOutput::hook_failed);
        self.commit_tool(idx, output, now);
        self.pump_tools(now);
    }

    /// The tool pool itself failed (not a tool): every logged call gets a `TOOL_OUTCOME_UNKNOWN`
    /// result, every unstarted call a synthetic pair, and the turn ends `error` (SPEC §3, difference 2).
    pub fn on_tool_pool_failed(&mut self, ticket: u64, reason: String, now: i64) {
        let Some(batch) = self.batch_mut(ticket) else {
            return;
        };
        batch.schedule.abort();
        let Stage::Tools(mut batch) = mem::replace(&mut self.run_mut().stage, Stage::Transition)
        else {
            unreachable!("batch_mut found a batch")
        };
        let unknown = ToolOutput::outcome_unknown(&reason);
        for idx in 0..batch.schedule.len() {
            let state = batch.schedule.state(idx);
            match state {
                SlotState::Committed => {}
                SlotState::Waiting => {
                    let call = batch.schedule.call(idx).clone();
                    self.write_synthetic_pair(&call, ToolOutput::aborted_before_dispatch(), now);
                }
                _ => {
                    let call = batch.schedule.call(idx).clone();
                    let call_seq = batch.call_seqs[idx];
                    self.write_tool_result(&call, call_seq, unknown.clone(), now);
                }
            }
            batch.outputs[idx] = None;
        }
        let failure = LlmFailure::new(codes::UNKNOWN, format!("tool pool failed: {reason}"));
        self.fail_turn(failure, now);
    }

    pub(super) fn start_tools(&mut self, calls: Vec<PlannedCall>, now: i64) {
        let ticket = self.ticket();
        let n = calls.len();
        let batch = ToolBatch {
            ticket,
            schedule: ToolSchedule::new(calls, self.config.max_parallel_tool_calls),
            call_seqs: vec![None; n],
            outputs: vec![None; n],
            final_result: vec![false; n],
            pre_executing: None,
            checkpoint: None,
            post_executing: None,
            concluded: false,
        };
        self.run_mut().stage = Stage::Tools(Box::new(batch));
        self.pump_tools(now);
    }

    fn invocation(&self, call: &PlannedCall) -> ToolInvocation {
        let run = self.running().expect("tools run inside a turn");
        ToolInvocation {
            session_id: self.id.clone(),
            turn: run.turn,
            step: run.step,
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            arguments: ToolArgs::parse(&call.arguments),
        }
    }

    fn current_batch(&mut self) -> &mut ToolBatch {
        match &mut self.run_mut().stage {
            Stage::Tools(b) => b,
            _ => panic!("no tool batch in progress"),
        }
    }

    /// Commits what can commit and starts what can start, until nothing moves; then, when the batch
    /// is settled, closes the step.
    fn pump_tools(&mut self, now: i64) {
        loop {
            let committed = match self.commit_ready_tool(now) {
                // As if `post_execute` had answered at once: its answer commits the next ready
                // result before anything new starts.
                Commit::Unhooked => continue,
                Commit::Final | Commit::ToHooks => true,
                Commit::Nothing => false,
            };
            let started = self.start_next_tool(now);
            if !committed && !started {
                break;
            }
        }
        let batch = self.current_batch();
        let settled = batch.schedule.is_settled()
            && batch.post_executing.is_none()
            && batch.pre_executing.is_none()
            && batch.checkpoint.is_none();
        if settled {
            self.finish_tools(now);
        }
    }

    /// Commits the next result in model order, through the `post_execute` hooks when there are any
    /// and the result is not final. Says what it did.
    fn commit_ready_tool(&mut self, now: i64) -> Commit {
        let hooked = self.hook_points().tool;
        let batch = self.current_batch();
        if batch.post_executing.is_some() {
            return Commit::Nothing;
        }
        let Some(idx) = batch.schedule.next_commit() else {
            return Commit::Nothing;
        };
        let output = batch.outputs[idx]
            .take()
            .expect("a ready call has an output");
        if batch.final_result[idx] || batch.schedule.is_aborted() {
            self.commit_tool(idx, output, now);
            Commit::Final
        } else if !hooked {
            self.commit_tool(idx, output, now);
            Commit::Unhooked
        } else {
            let ticket = batch.ticket;
            batch.post_executing = Some((idx, output.clone()));
            let call = batch.schedule.call(idx).clone();
            let invocation = self.invocation(&call);
            self.effects.push(Effect::RunHooks(HookCall::PostExecute {
                ticket,
                idx,
                invocation,
                output,
            }));
            Commit::ToHooks
        }
    }

    /// Logs the `tool/call` of the next call the schedule allows and puts it to the `pre_execute`
    /// hooks (or allows it at once when there are none). Returns whether anything moved.
    fn start_next_tool(&mut self, now: i64) -> bool {
        let hooked = self.hook_points().tool;
        let tools = self.tools.clone();
        let batch = self.current_batch();
        // A result still in post-execute is part of the ready prefix: the pool refills only after
        // that prefix committed (agent-loop.md 8.3, `commitReady` then `fillPool`), so a new
        // `tool/call` never overtakes a result that was ready before it.
        if batch.pre_executing.is_some()
            || batch.checkpoint.is_some()
            || batch.post_executing.is_some()
        {
            return false;
        }
        let Some(idx) = batch
            .schedule
            .next_start(|c| tools.execution_mode(&c.name, &c.arguments))
        else {
            return false;
        };
        let ticket = batch.ticket;
        let call = batch.schedule.call(idx).clone();
        let seq = self.write_tool_call(&call, now);
        let invocation = self.invocation(&call);
        let batch = self.current_batch();
        batch.call_seqs[idx] = Some(seq);
        if hooked {
            batch.pre_executing = Some(idx);
            self.effects.push(Effect::RunHooks(HookCall::PreExecute {
                ticket,
                idx,
                invocation,
            }));
        } else {
            self.decide_pre_execute(idx, Ok(PreExecute::Allow));
        }
        true
    }

    /// Starts the body of call `idx` on `tool`.
    fn dispatch_tool(&mut self, idx: usize, tool: ResolvedTool) {
        let batch = self.current_batch();
        batch.schedule.dispatched(idx);
        let ticket = batch.ticket;
        let call = batch.schedule.call(idx).clone();
        let invocation = self.invocation(&call);
        self.effects.push(Effect::StartTool {
            ticket,
            idx,
            invocation,
            tool,
        });
    }

    fn resolve_tool(&mut self, idx: usize, output: ToolOutput, final_result: bool) {
        let batch = self.current_batch();
        batch.schedule.resolved(idx);
        batch.outputs[idx] = Some(output);
        batch.final_result[idx] = final_result;
    }

    /// Truncates an oversized result with a notice the model sees.
    fn bounded(&self, mut output: ToolOutput) -> ToolOutput {
        let bytes_max = self.config.limits.tool_result_bytes_max;
        let bytes = serde_json::to_vec(&output.content).map_or(0, |v| v.len());
        if bytes <= bytes_max {
            return output;
        }
        let mut kept = String::new();
        for block in &output.content {
            if let ContentBlock::Text { text } = block {
                kept.push_str(text);
            }
        }
        let mut cut = bytes_max.saturating_sub(200).min(kept.len());
        while !kept.is_char_boundary(cut) {
            cut -= 1;
        }
        kept.truncate(cut);
        kept.push_str(&format!(
            "\n\n[tool result truncated: it was {bytes} bytes, the limit is {bytes_max}]"
        ));
        output.content = vec![ContentBlock::text(kept)];
        output
    }

    fn write_tool_result(
        &mut self,
        call: &PlannedCall,
        call_seq: Option<u64>,
        output: ToolOutput,
        now: i64,
    ) {
        let output = self.bounded(output);
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        let message = Message {
            id: self.mint_id(),
            role: Role::User,
            content: vec![ContentBlock::ToolResult {
                tool_call_id: call.call_id.clone(),
                content: output.content,
                is_error: Some(output.is_error),
            }],
            source: MessageSource::tool(&call.call_id),
        };
        self.append(
            EventDraft::append(
                EventData::ToolResult(Box::new(ToolResultEvent {
                    turn,
                    step,
                    message: Arc::new(message),
                    error: output.error,
                    meta: output.meta,
                })),
                call_seq.map(|s| vec![s]),
            ),
            now,
        );
    }

    /// Logs the start of `call` in the current step; returns the `tool/call` seq.
    fn write_tool_call(&mut self, call: &PlannedCall, now: i64) -> u64 {
        let run = self.run_mut();
        let (turn, step) = (run.turn, run.step);
        self.append(
            EventDraft::log(EventData::ToolCall(Box::new(ToolCallEvent {
                turn,
                step,
                call_id: call.call_id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }))),
            now,
        )
    }

    fn write_synthetic_pair(&mut self, call: &PlannedCall, output: ToolOutput, now: i64) {
        let seq = self.write_tool_call(call, now);
        self.write_tool_result(call, Some(seq), output, now);
    }

    fn commit_tool(&mut self, idx: usize, output: ToolOutput, now: i64) {
        let batch = self.current_batch();
        let call = batch.schedule.call(idx).clone();
        let call_seq = batch.call_seqs[idx];
        batch.schedule.committed(idx);
        batch.concluded |= output.concludes_turn;
        let contexts = output.additional_contexts.clone();
        self.write_tool_result(&call, call_seq, output, now);
        for ctx in contexts {
            match self
                .inbox
                .plan_append(InboxTarget::NextStep, Arc::new(ctx), &self.config.limits)
            {
                Ok(splice) => {
                    self.apply_splice(splice, now);
                }
                Err(e) => {
                    tracing::warn!(agent = %self.id, call = %call.call_id, error = %e, "dropped an invalid additional context");
                }
            }
        }
    }

    fn finish_tools(&mut self, now: i64) {
        let Stage::Tools(batch) = mem::replace(&mut self.run_mut().stage, Stage::Transition) else {
            unreachable!("finishing tools outside a batch")
        };
        if batch.schedule.is_aborted() {
            for idx in batch.schedule.never_started().collect::<Vec<_>>() {
                let call = batch.schedule.call(idx).clone();
                self.write_synthetic_pair(&call, ToolOutput::aborted_before_dispatch(), now);
            }
            let cause = self.abort_cause();
            return self.end_turn(TurnEndReason::Aborted { reason: cause }, false, now);
        }
        let step_end = batch.concluded.then_some(TurnEndReason::Completed);
        self.finish_step(step_end, now);
    }

    /// The turn was aborted during the tool batch: calls not yet dispatched get an aborted result,
    /// a result in `post_execute` commits as it was, and running bodies are told to stop.
    pub(super) fn abort_tools(&mut self, mut batch: Box<ToolBatch>, now: i64) {
        batch.schedule.abort();
        if let Some(idx) = batch.pre_executing.take() {
            batch.schedule.resolved(idx);
            batch.outputs[idx] = Some(ToolOutput::aborted_before_dispatch());
            batch.final_result[idx] = true;
        }
        if let Some((idx, _, _)) = batch.checkpoint.take() {
            // Prepared but never dispatched.
            batch.schedule.resolved(idx);
            batch.outputs[idx] = Some(ToolOutput::aborted_before_dispatch());
            batch.final_result[idx] = true;
        }
        let post = batch.post_executing.take();
        let running = batch.schedule.n_running() > 0;
        let ticket = batch.ticket;
        self.run_mut().stage = Stage::Tools(batch);
        if let Some((idx, output)) = post {
            self.commit_tool(idx, output, now);
        }
        if running {
            self.effects.push(Effect::CancelTools { ticket });
        }
        self.pump_tools(now);
    }
}
