//! `BlockAssembler`: the single algorithm that turns one attempt's chunks into content blocks
//! (`reference/session-llm.md` §6.5), including interrupted prefixes and dropping tool calls on
//! max-tokens. Pure.
//!
//! OWNER: pure-core helper (issue 2, item 5).

use serde_json::Value;

use crate::llm::types::{ContentBlock, FinishReason, StreamChunk, TokenUsage};

/// Why the assembled blocks cannot be produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    #[error("cannot assemble incomplete block of type {block_type:?}")]
    IncompleteBlock { block_type: String },
}

/// Assembles one attempt's chunks.
#[derive(Debug, Default, Clone)]
pub struct BlockAssembler {}

impl BlockAssembler {
    pub fn new() -> BlockAssembler {
        BlockAssembler::default()
    }

    /// Feeds one chunk.
    pub fn push(&mut self, chunk: &StreamChunk) {
        let _ = chunk;
        todo!("pure-core helper")
    }

    /// One block per seen index in first-seen order; tool calls dropped on a max-tokens finish.
    ///
    /// # Errors
    /// An open block of a type the assembler does not know.
    pub fn blocks(&self) -> Result<Vec<ContentBlock>, AssembleError> {
        todo!("pure-core helper")
    }

    /// The visible text/reasoning prefix of an interrupted attempt (non-whitespace blocks only).
    pub fn interrupted_blocks(&self) -> Vec<ContentBlock> {
        todo!("pure-core helper")
    }

    /// The last `usage` chunk, if any.
    pub fn usage(&self) -> Option<&TokenUsage> {
        todo!("pure-core helper")
    }

    /// The last `finish` reason, `stop` when none arrived.
    pub fn finish(&self) -> FinishReason {
        todo!("pure-core helper")
    }

    /// The finish's replay state, pruned to match `blocks()` (dropped when misaligned).
    pub fn replay_state(&self) -> Option<Value> {
        todo!("pure-core helper")
    }
}
