//! The tool-pool rules (`reference/agent-loop.md` §8.2–§8.3, §8.7) as a pure bookkeeping machine.
//!
//! One `ToolSchedule` covers the tool calls of one step, in model order. It answers three questions
//! the turn machine asks: which call may start preparing now, which result may be committed now, and
//! which calls never started (they get synthetic aborted pairs after a cancel). It never runs anything.
//!
//! Rules:
//! - Calls start in model order, one *prepare* at a time (the `tool/call` event, the `pre_execute`
//!   hooks, the durability checkpoint). A prepared call is dispatched (its body runs) and the next call
//!   may start preparing.
//! - A call's execution mode is decided when it is about to start (a live classification). A parallel
//!   call starts when fewer than `cap` bodies are running and no exclusive call before it is still
//!   uncommitted. An exclusive call (a barrier) starts only when every call before it is committed,
//!   and nothing after it starts until it is committed.
//! - Results commit in model order: call `i` commits only after `0..i` committed.
//! - After `abort`, nothing new starts; started calls still resolve and commit.

use crate::tools::ExecutionMode;

/// One call the model asked for, in model order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedCall {
    /// The model's call id.
    pub call_id: String,
    /// The tool called.
    pub name: String,
    /// The raw argument string.
    pub arguments: String,
}

/// Where one call is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Not started; no `tool/call` logged.
    Waiting,
    /// Started (its `tool/call` is logged); hooks or the checkpoint are pending.
    Preparing,
    /// Its body is running.
    Running,
    /// Its result is known and waits for its turn to commit.
    Ready,
    /// Its `tool/result` is logged.
    Committed,
}

/// The schedule of one step's tool calls.
#[derive(Clone, Debug)]
pub struct ToolSchedule {
    calls: Vec<PlannedCall>,
    states: Vec<SlotState>,
    /// The mode each started call was classified as.
    modes: Vec<Option<ExecutionMode>>,
    /// Invariant: `cap >= 1`.
    cap: usize,
    /// Invariant: `states[..committed]` are all `Committed` and `states[committed]` is not.
    committed: usize,
    /// Invariant: `states[next..]` are all `Waiting`; every call before `next` has started.
    next: usize,
    n_running: usize,
    /// The call in `Preparing`, if any. Invariant: at most one call prepares at a time.
    preparing: Option<usize>,
    aborted: bool,
}

impl ToolSchedule {
    /// A schedule for `calls` with at most `cap` bodies running at once (`cap` 0 is treated as 1).
    pub fn new(calls: Vec<PlannedCall>, cap: usize) -> ToolSchedule {
        let n = calls.len();
        ToolSchedule {
            calls,
            states: vec![SlotState::Waiting; n],
            modes: vec![None; n],
            cap: cap.max(1),
            committed: 0,
            next: 0,
            n_running: 0,
            preparing: None,
            aborted: false,
        }
    }

    /// Every call, in model order.
    pub fn calls(&self) -> &[PlannedCall] {
        &self.calls
    }

    /// Call `idx`.
    pub fn call(&self, idx: usize) -> &PlannedCall {
        &self.calls[idx]
    }

    /// Where call `idx` is.
    pub fn state(&self, idx: usize) -> SlotState {
        self.states[idx]
    }

    /// How many calls the batch has.
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    /// The batch has no call.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The batch was aborted: nothing new starts.
    pub fn is_aborted(&self) -> bool {
        self.aborted
    }

    /// Number of bodies running.
    pub fn n_running(&self) -> usize {
        self.n_running
    }

    /// The call currently preparing, if any (at most one).
    pub fn preparing(&self) -> Option<usize> {
        self.preparing
    }

    /// The next call that may start preparing now, marked `Preparing`; `None` when the rules say wait
    /// (or everything started, or the schedule was aborted). `classify` decides the candidate's mode.
    pub fn next_start(
        &mut self,
        classify: impl FnOnce(&PlannedCall) -> ExecutionMode,
    ) -> Option<usize> {
        let i = self.next;
        if self.aborted || i >= self.calls.len() || self.preparing.is_some() {
            return None;
        }
        let after_uncommitted_barrier =
            i > 0 && self.modes[i - 1] == Some(ExecutionMode::Exclusive) && self.committed < i;
        if after_uncommitted_barrier {
            return None;
        }
        let mode = classify(&self.calls[i]);
        let may_start = match mode {
            ExecutionMode::Exclusive => self.committed == i,
            ExecutionMode::Parallel => self.n_running < self.cap,
        };
        if !may_start {
            return None;
        }
        self.states[i] = SlotState::Preparing;
        self.preparing = Some(i);
        self.modes[i] = Some(mode);
        self.next += 1;
        Some(i)
    }

    /// A preparing call's body was dispatched.
    ///
    /// # Panics
    /// If `idx` is not preparing (a bug in the caller).
    pub fn dispatched(&mut self, idx: usize) {
        assert_eq!(
            self.states[idx],
            SlotState::Preparing,
            "dispatch of call {idx}"
        );
        self.preparing = None;
        self.states[idx] = SlotState::Running;
        self.n_running += 1;
    }

    /// A preparing or running call's result is known.
    ///
    /// # Panics
    /// If `idx` is neither preparing nor running (a bug in the caller).
    pub fn resolved(&mut self, idx: usize) {
        match self.states[idx] {
            SlotState::Running => self.n_running -= 1,
            SlotState::Preparing => self.preparing = None,
            other => panic!("resolve of call {idx} in state {other:?}"),
        }
        self.states[idx] = SlotState::Ready;
    }

    /// The call whose result may be committed now (the first uncommitted one, if ready).
    pub fn next_commit(&self) -> Option<usize> {
        (self.states.get(self.committed) == Some(&SlotState::Ready)).then_some(self.committed)
    }

    /// The result of `next_commit()` was logged.
    ///
    /// # Panics
    /// If `idx` is not the next commit (a bug in the caller).
    pub fn committed(&mut self, idx: usize) {
        assert_eq!(self.next_commit(), Some(idx), "commit out of model order");
        self.states[idx] = SlotState::Committed;
        self.committed += 1;
    }

    /// Stops starting calls. Started calls still resolve and commit.
    pub fn abort(&mut self) {
        self.aborted = true;
    }

    /// Calls that never started (no `tool/call` logged), in model order.
    pub fn never_started(&self) -> impl Iterator<Item = usize> + '_ {
        (self.next..self.calls.len()).filter(|i| self.states[*i] == SlotState::Waiting)
    }

    /// Every started call is committed and nothing more will start.
    pub fn is_settled(&self) -> bool {
        self.committed == self.next && (self.aborted || self.next == self.calls.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ExecutionMode::{Exclusive, Parallel};

    fn calls(n: usize) -> Vec<PlannedCall> {
        (1..=n)
            .map(|i| PlannedCall {
                call_id: format!("c{i}"),
                name: "t".into(),
                arguments: "{}".into(),
            })
            .collect()
    }

    fn start(s: &mut ToolSchedule, mode: ExecutionMode) -> Option<usize> {
        s.next_start(|_| mode)
    }

    #[test]
    fn rolling_pool_respects_the_cap_and_commits_in_model_order() {
        // Cap 2 with 4 parallel calls: c1, c2 start; c2 finishing first commits nothing; c1 finishing
        // lets c1 and c2 commit and c3 start.
        let mut s = ToolSchedule::new(calls(4), 2);
        assert_eq!(start(&mut s, Parallel), Some(0));
        assert_eq!(start(&mut s, Parallel), None, "one prepare at a time");
        s.dispatched(0);
        assert_eq!(start(&mut s, Parallel), Some(1));
        s.dispatched(1);
        assert_eq!(start(&mut s, Parallel), None, "cap reached");
        s.resolved(1);
        assert_eq!(s.next_commit(), None, "c2 waits for c1");
        assert_eq!(start(&mut s, Parallel), Some(2), "c2 left the pool");
        s.dispatched(2);
        s.resolved(0);
        assert_eq!(s.next_commit(), Some(0));
        s.committed(0);
        assert_eq!(s.next_commit(), Some(1));
        s.committed(1);
        assert_eq!(start(&mut s, Parallel), Some(3));
    }

    #[test]
    fn an_exclusive_call_is_a_barrier() {
        // r-A1 (parallel), w-A2 (exclusive), r-A3 (parallel): strictly sequential.
        let modes = [Parallel, Exclusive, Parallel];
        let mut s = ToolSchedule::new(calls(3), 10);
        assert_eq!(s.next_start(|_| modes[0]), Some(0));
        s.dispatched(0);
        assert_eq!(s.next_start(|_| modes[1]), None, "waits for A1 to commit");
        s.resolved(0);
        s.committed(0);
        assert_eq!(s.next_start(|_| modes[1]), Some(1));
        s.dispatched(1);
        assert_eq!(
            s.next_start(|_| modes[2]),
            None,
            "nothing passes an uncommitted barrier"
        );
        s.resolved(1);
        s.committed(1);
        assert_eq!(s.next_start(|_| modes[2]), Some(2));
        s.dispatched(2);
        s.resolved(2);
        s.committed(2);
        assert!(s.is_settled());
    }

    #[test]
    fn cap_one_is_fully_serial() {
        let mut s = ToolSchedule::new(calls(2), 1);
        assert_eq!(start(&mut s, Parallel), Some(0));
        s.dispatched(0);
        assert_eq!(start(&mut s, Parallel), None);
        s.resolved(0);
        assert_eq!(start(&mut s, Parallel), Some(1));
    }

    #[test]
    fn abort_stops_starting_and_lists_the_rest() {
        let mut s = ToolSchedule::new(calls(4), 2);
        assert_eq!(start(&mut s, Parallel), Some(0));
        s.dispatched(0);
        assert_eq!(start(&mut s, Parallel), Some(1));
        s.dispatched(1);
        s.abort();
        assert_eq!(start(&mut s, Parallel), None);
        assert!(!s.is_settled());
        s.resolved(0);
        s.resolved(1);
        s.committed(0);
        s.committed(1);
        assert!(s.is_settled());
        assert_eq!(s.never_started().collect::<Vec<_>>(), [2, 3]);
    }

    #[test]
    fn a_call_resolved_while_preparing_never_occupies_the_pool() {
        let mut s = ToolSchedule::new(calls(3), 1);
        assert_eq!(start(&mut s, Parallel), Some(0));
        s.resolved(0); // e.g. denied by a pre_execute hook
        assert_eq!(start(&mut s, Parallel), Some(1));
        s.dispatched(1);
        assert_eq!(s.n_running(), 1);
    }
}
