//! `fold_consumed_work` (`reference/agent-loop.md` §3.6): which turn last accounted for consumed input,
//! and whether input was dropped unrun after it.
//!
//! OWNER: session helper (issue 2, item 4).
