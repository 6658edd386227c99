//! `BlockAssembler`: the single algorithm that turns one attempt's stream chunks into content blocks
//! (`reference/session-llm.md` §6.5, `reference/agent-loop.md` §7.4), including the visible prefix of
//! an interrupted attempt and the dropping of tool calls on a max-tokens finish.
//!
//! Rules, exactly as the original applies them:
//! - a block exists for every index seen, in first-seen order; a `block-start` for a known index is
//!   ignored;
//! - a delta for an unknown index creates its block implicitly (so delta-only streams work); deltas
//!   append text, a `tool-call-delta` sets the call id (every delta), the name (when present) and
//!   appends the argument text;
//! - the first `block-end` of an index stores the authoritative block; later deltas and block-ends for
//!   that index are ignored;
//! - `usage` and `finish` are last-wins; without a finish the attempt counts as `stop`;
//! - a `max-tokens` finish drops every tool-call block (its arguments may be cut off) and the replay
//!   state's per-block entries at the same positions.
//!
//! The assembler accepts any chunk sequence, valid or not, and never panics: a provider is outside
//! data. The only failure is `blocks()` on an open block of a type it cannot assemble.
//!
//! Who calls this: the runtime feeds it each chunk of one attempt as it is logged, then builds the
//! `assistant/message` from `blocks()` (or `interrupted_blocks()` when the turn was cancelled). Pure.

use std::collections::HashMap;

use serde_json::Value;

use crate::ids::MessageId;
use crate::llm::types::{
    BlockType, ContentBlock, FinishReason, Message, MessageSource, Role, StreamChunk, TokenUsage,
};

/// Why the assembled blocks cannot be produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    /// A block started and never ended.
    #[error("cannot assemble incomplete block of type {block_type:?}")]
    IncompleteBlock {
        /// The block's type.
        block_type: String,
    },
}

/// What the assembler knows about one index.
#[derive(Debug, Clone, PartialEq)]
struct Partial {
    index: u32,
    /// The type the block was first seen with; later chunks of another type do not change it.
    block_type: BlockType,
    /// Text of `text-delta`s and `reasoning-delta`s, whatever the block's type.
    text: String,
    /// The id of the latest `tool-call-delta` that carried a non-empty one.
    tool_call_id: Option<String>,
    /// The latest non-empty name of a `tool-call-delta`.
    tool_call_name: Option<String>,
    tool_call_arguments: String,
    /// The authoritative block of the first `block-end`; once set, the partial is closed.
    block: Option<ContentBlock>,
}

/// The room a block's text is given at its first delta: a short reply's text in one allocation.
const TEXT_ROOM: usize = 256;

impl Partial {
    fn new(index: u32, block_type: BlockType) -> Partial {
        Partial {
            index,
            block_type,
            text: String::new(),
            tool_call_id: None,
            tool_call_name: None,
            tool_call_arguments: String::new(),
            block: None,
        }
    }

    /// Appends a text or reasoning delta. The first gets `TEXT_ROOM` at once rather than growing by
    /// doubling from eight bytes (the buffer is scratch: the block is assembled from a copy).
    fn push_text(&mut self, delta: &str) {
        if self.text.capacity() == 0 {
            self.text.reserve(TEXT_ROOM.max(delta.len()));
        }
        self.text.push_str(delta);
    }

    /// True when the block this partial assembles to is a tool call.
    fn is_tool_call(&self) -> bool {
        match &self.block {
            Some(block) => block.type_tag() == "tool-call",
            None => self.block_type == BlockType::ToolCall,
        }
    }

    fn assemble(&self) -> Result<ContentBlock, AssembleError> {
        if let Some(block) = &self.block {
            return Ok(block.clone());
        }
        match &self.block_type {
            BlockType::Text => Ok(ContentBlock::Text {
                text: self.text.clone(),
            }),
            BlockType::Reasoning => Ok(ContentBlock::Reasoning {
                text: self.text.clone(),
            }),
            BlockType::ToolCall => Ok(ContentBlock::ToolCall {
                id: self
                    .tool_call_id
                    .clone()
                    .unwrap_or_else(|| format!("call-{}", self.index)),
                name: self.tool_call_name.clone().unwrap_or_default(),
                arguments: self.tool_call_arguments.clone(),
            }),
            BlockType::Other(block_type) => Err(AssembleError::IncompleteBlock {
                block_type: block_type.clone(),
            }),
        }
    }

    /// The text/reasoning block a cancelled attempt shows, if it has visible text.
    fn visible(&self) -> Option<ContentBlock> {
        let block = match &self.block {
            Some(block @ (ContentBlock::Text { .. } | ContentBlock::Reasoning { .. })) => {
                block.clone()
            }
            Some(_) => return None,
            None => match self.block_type {
                BlockType::Text => ContentBlock::Text {
                    text: self.text.clone(),
                },
                BlockType::Reasoning => ContentBlock::Reasoning {
                    text: self.text.clone(),
                },
                BlockType::ToolCall | BlockType::Other(_) => return None,
            },
        };
        let (ContentBlock::Text { text } | ContentBlock::Reasoning { text }) = &block else {
            return None;
        };
        // JavaScript's `trim()` also strips the byte-order mark, which Rust does not count as
        // whitespace.
        let blank = text.chars().all(|c| c.is_whitespace() || c == '\u{feff}');
        (!blank).then_some(block)
    }
}

/// The `BlockType` a `block-end` implies for an index first seen at its close.
fn block_type_of(block: &ContentBlock) -> BlockType {
    match block {
        ContentBlock::Text { .. } => BlockType::Text,
        ContentBlock::Reasoning { .. } => BlockType::Reasoning,
        ContentBlock::ToolCall { .. } => BlockType::ToolCall,
        other => BlockType::Other(other.type_tag().to_string()),
    }
}

/// Assembles one attempt's chunks.
#[derive(Debug, Default, Clone)]
pub struct BlockAssembler {
    /// Invariant: exactly one partial per distinct index seen, in first-seen order.
    partials: Vec<Partial>,
    /// Invariant: maps each index in `partials` to its position there, and nothing else.
    positions: HashMap<u32, usize>,
    usage: Option<TokenUsage>,
    finish: Option<FinishReason>,
    /// The replay state of the last `finish` chunk, as sent.
    replay_state: Option<Value>,
}

impl BlockAssembler {
    /// An assembler that has seen nothing.
    pub fn new() -> BlockAssembler {
        BlockAssembler::default()
    }

    /// Feeds one chunk. Any sequence is accepted; chunks the rules ignore change nothing.
    pub fn push(&mut self, chunk: &StreamChunk) {
        match chunk {
            StreamChunk::BlockStart { index, block_type } => {
                self.partial(*index, || block_type.clone());
            }
            StreamChunk::TextDelta { index, text } => {
                let partial = self.partial(*index, || BlockType::Text);
                if partial.block.is_none() {
                    partial.push_text(text);
                }
            }
            StreamChunk::ReasoningDelta { index, text } => {
                let partial = self.partial(*index, || BlockType::Reasoning);
                if partial.block.is_none() {
                    partial.push_text(text);
                }
            }
            StreamChunk::ToolCallDelta {
                index,
                id,
                name,
                arguments_delta,
            } => {
                let partial = self.partial(*index, || BlockType::ToolCall);
                if partial.block.is_none() {
                    // An empty id is how a provider says "no id on this delta"; it must not erase
                    // one an earlier delta gave.
                    if !id.is_empty() {
                        partial.tool_call_id = Some(id.clone());
                    }
                    if let Some(name) = name.as_ref().filter(|n| !n.is_empty()) {
                        partial.tool_call_name = Some(name.clone());
                    }
                    partial.tool_call_arguments.push_str(arguments_delta);
                }
            }
            StreamChunk::BlockEnd { index, block } => {
                let partial = self.partial(*index, || block_type_of(block));
                if partial.block.is_none() {
                    partial.block = Some(block.clone());
                }
            }
            StreamChunk::Usage { usage } => self.usage = Some(usage.clone()),
            StreamChunk::Finish {
                reason,
                replay_state,
            } => {
                self.finish = Some(reason.clone());
                self.replay_state = replay_state.clone();
            }
        }
    }

    /// The partial for `index`, created with `block_type()` when the index is new.
    fn partial(&mut self, index: u32, block_type: impl FnOnce() -> BlockType) -> &mut Partial {
        // Chunks nearly always address the newest block, so look there before hashing.
        let position = match self.partials.last() {
            Some(last) if last.index == index => self.partials.len() - 1,
            _ => match self.positions.get(&index) {
                Some(&position) => position,
                None => {
                    self.partials.push(Partial::new(index, block_type()));
                    let position = self.partials.len() - 1;
                    self.positions.insert(index, position);
                    position
                }
            },
        };
        &mut self.partials[position]
    }

    fn drops_tool_calls(&self) -> bool {
        matches!(self.finish, Some(FinishReason::MaxTokens))
    }

    /// The number of distinct indexes seen (before any max-tokens drop).
    pub fn n_blocks(&self) -> usize {
        self.partials.len()
    }

    /// One block per seen index in first-seen order: the closed block, or the one assembled from the
    /// deltas (an open tool call without an id gets `call-<index>`, without a name `""`). Tool calls
    /// are dropped on a max-tokens finish.
    ///
    /// # Errors
    /// An open block of a type the assembler does not know (`IncompleteBlock`).
    pub fn blocks(&self) -> Result<Vec<ContentBlock>, AssembleError> {
        let drop_tool_calls = self.drops_tool_calls();
        let mut blocks = Vec::with_capacity(self.partials.len());
        for partial in &self.partials {
            let block = partial.assemble()?;
            if !(drop_tool_calls && block.type_tag() == "tool-call") {
                blocks.push(block);
            }
        }
        Ok(blocks)
    }

    /// The assistant message over `blocks()`, with the caller's id and source.
    ///
    /// # Errors
    /// As [`BlockAssembler::blocks`].
    pub fn message(&self, id: MessageId, source: MessageSource) -> Result<Message, AssembleError> {
        Ok(Message {
            id,
            role: Role::Assistant,
            content: self.blocks()?,
            source,
        })
    }

    /// The visible prefix of an interrupted attempt: text and reasoning blocks, closed or open, whose
    /// text is not only whitespace, in order. Tool calls and unknown blocks are left out (the call was
    /// never dispatched).
    pub fn interrupted_blocks(&self) -> Vec<ContentBlock> {
        self.partials.iter().filter_map(Partial::visible).collect()
    }

    /// The last `usage` chunk, if any.
    pub fn usage(&self) -> Option<&TokenUsage> {
        self.usage.as_ref()
    }

    /// The last `finish` reason, `stop` when none arrived.
    pub fn finish(&self) -> FinishReason {
        self.finish.clone().unwrap_or(FinishReason::Stop)
    }

    /// The finish's replay state, kept aligned with `blocks()`: when it has a `blocks` array, that
    /// array must have one entry per seen index (else the whole state is dropped), and on a
    /// max-tokens finish the entries of the dropped tool calls are removed with them.
    pub fn replay_state(&self) -> Option<Value> {
        let state = self.replay_state.as_ref()?;
        let Some(Value::Array(entries)) = state.get("blocks") else {
            return Some(state.clone());
        };
        if entries.len() != self.partials.len() {
            return None;
        }
        if !self.drops_tool_calls() || !self.partials.iter().any(Partial::is_tool_call) {
            return Some(state.clone());
        }
        let kept: Vec<Value> = entries
            .iter()
            .zip(&self.partials)
            .filter(|(_, partial)| !partial.is_tool_call())
            .map(|(entry, _)| entry.clone())
            .collect();
        let mut state = state.clone();
        if let Some(map) = state.as_object_mut() {
            map.insert("blocks".into(), Value::Array(kept));
        }
        Some(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::types::LlmFailure;
    use proptest::prelude::*;
    use serde_json::json;

    fn start(index: u32, block_type: BlockType) -> StreamChunk {
        StreamChunk::BlockStart { index, block_type }
    }

    fn text(index: u32, text: &str) -> StreamChunk {
        StreamChunk::TextDelta {
            index,
            text: text.into(),
        }
    }

    fn reasoning(index: u32, text: &str) -> StreamChunk {
        StreamChunk::ReasoningDelta {
            index,
            text: text.into(),
        }
    }

    fn call(index: u32, id: &str, name: Option<&str>, args: &str) -> StreamChunk {
        StreamChunk::ToolCallDelta {
            index,
            id: id.into(),
            name: name.map(String::from),
            arguments_delta: args.into(),
        }
    }

    fn end(index: u32, block: ContentBlock) -> StreamChunk {
        StreamChunk::BlockEnd { index, block }
    }

    fn usage(input_tokens: u64, output_tokens: u64) -> TokenUsage {
        TokenUsage {
            input_tokens,
            output_tokens,
            ..TokenUsage::default()
        }
    }

    fn tool_call(id: &str, name: &str, arguments: &str) -> ContentBlock {
        ContentBlock::ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn reasoning_block(text: &str) -> ContentBlock {
        ContentBlock::Reasoning { text: text.into() }
    }

    fn finish_with(reason: FinishReason, replay_state: Value) -> StreamChunk {
        StreamChunk::Finish {
            reason,
            replay_state: Some(replay_state),
        }
    }

    fn assembled(chunks: &[StreamChunk]) -> BlockAssembler {
        let mut a = BlockAssembler::new();
        for chunk in chunks {
            a.push(chunk);
        }
        a
    }

    /// text, then tool-call, then reasoning — the layout the replay-state tests use.
    fn three_blocks() -> Vec<StreamChunk> {
        vec![
            start(0, BlockType::Text),
            text(0, "visible"),
            end(0, ContentBlock::text("visible")),
            start(1, BlockType::ToolCall),
            call(1, "c1", Some("echo"), "{\"te"),
            start(2, BlockType::Reasoning),
            reasoning(2, "why"),
        ]
    }

    /// assembler.spec 1: "assembles interleaved text, reasoning, and tool-call deltas".
    #[test]
    fn assembles_interleaved_text_reasoning_and_tool_call_deltas() {
        let a = assembled(&[
            start(0, BlockType::Reasoning),
            start(1, BlockType::Text),
            reasoning(0, "thinking"),
            text(1, "Hello"),
            start(2, BlockType::ToolCall),
            call(2, "call-1", Some("echo"), "{\"text\":"),
            reasoning(0, "…"),
            text(1, " world"),
            call(2, "call-1", None, "\"hi\"}"),
            StreamChunk::Usage {
                usage: usage(10, 5),
            },
            StreamChunk::finish(FinishReason::ToolCalls),
        ]);
        let blocks = vec![
            reasoning_block("thinking…"),
            ContentBlock::text("Hello world"),
            tool_call("call-1", "echo", "{\"text\":\"hi\"}"),
        ];
        assert_eq!(a.blocks(), Ok(blocks.clone()));
        assert_eq!(a.usage(), Some(&usage(10, 5)));
        assert_eq!(a.finish(), FinishReason::ToolCalls);
        let id = MessageId::new("a1").expect("valid");
        let message = a
            .message(id.clone(), MessageSource::model("p", "m"))
            .expect("assembles");
        assert_eq!(
            message,
            Message {
                id,
                role: Role::Assistant,
                content: blocks,
                source: MessageSource::model("p", "m")
            }
        );
    }

    /// assembler.spec 2: "records the completed block from block-end".
    #[test]
    fn records_the_completed_block_from_block_end() {
        let a = assembled(&[
            start(0, BlockType::Text),
            text(0, "draft"),
            end(0, ContentBlock::text("final")),
        ]);
        assert_eq!(a.blocks(), Ok(vec![ContentBlock::text("final")]));
    }

    /// assembler.spec 3 and 4: "tolerates deltas without explicit block-start/end" and "returns
    /// undefined usage when no usage chunk was received".
    #[test]
    fn tolerates_deltas_without_block_start_or_end() {
        let a = assembled(&[text(0, "a"), text(0, "b")]);
        assert_eq!(a.blocks(), Ok(vec![ContentBlock::text("ab")]));
        assert_eq!(a.finish(), FinishReason::Stop);
        assert_eq!(a.usage(), None);
        assert_eq!(a.replay_state(), None);
    }

    /// assembler.spec 5: "reuses an existing partial when ensure() is called with a tracked index" —
    /// deltas of a later index and a return to an earlier one extend the same blocks.
    #[test]
    fn reuses_the_partial_of_a_tracked_index() {
        let a = assembled(&[
            start(0, BlockType::Text),
            text(0, "a"),
            reasoning(1, "r"),
            text(0, "b"),
            reasoning(1, "s"),
        ]);
        assert_eq!(a.n_blocks(), 2);
        assert_eq!(
            a.blocks(),
            Ok(vec![ContentBlock::text("ab"), reasoning_block("rs")])
        );
    }

    /// assembler.spec 6: "throws from assemble() when a partial has an unhandled blockType".
    #[test]
    fn refuses_to_assemble_an_open_block_of_unknown_type() {
        let mut a = assembled(&[start(0, BlockType::Other("video".into())), text(0, "x")]);
        let err = a.blocks().expect_err("open video block");
        assert_eq!(
            err.to_string(),
            "cannot assemble incomplete block of type \"video\""
        );
        // Closing it with an authoritative block makes it assemble.
        let mut video = serde_json::Map::new();
        video.insert("type".into(), json!("video"));
        video.insert("url".into(), json!("u"));
        a.push(&end(0, ContentBlock::Other(video.clone())));
        assert_eq!(a.blocks(), Ok(vec![ContentBlock::Other(video)]));
    }

    /// assembler.spec 8: "ignores duplicate block-start for the same index".
    #[test]
    fn ignores_a_duplicate_block_start() {
        let a = assembled(&[
            start(0, BlockType::Text),
            text(0, "one"),
            start(0, BlockType::Reasoning),
            text(0, " two"),
        ]);
        assert_eq!(a.blocks(), Ok(vec![ContentBlock::text("one two")]));
    }

    /// assembler.spec 9: "ignores tool-call-delta stragglers after block-end".
    #[test]
    fn ignores_tool_call_stragglers_after_block_end() {
        let a = assembled(&[
            start(0, BlockType::ToolCall),
            call(0, "c1", Some("echo"), "{}"),
            end(0, tool_call("c1", "echo", "{}")),
            call(0, "c2", Some("other"), "garbage"),
            text(0, "more"),
        ]);
        assert_eq!(a.blocks(), Ok(vec![tool_call("c1", "echo", "{}")]));
    }

    /// assembler.spec 10: "assembles tool-call with generated id fallback when no id provided"; and a
    /// later delta without an id or name keeps the earlier ones.
    #[test]
    fn assembles_a_tool_call_with_generated_id_fallback() {
        let a = assembled(&[start(0, BlockType::ToolCall), call(0, "", None, "{}")]);
        assert_eq!(a.blocks(), Ok(vec![tool_call("call-0", "", "{}")]));

        let a = assembled(&[
            call(3, "c9", Some("read"), "{\"a\""),
            call(3, "", Some(""), ":1}"),
        ]);
        assert_eq!(a.blocks(), Ok(vec![tool_call("c9", "read", "{\"a\":1}")]));
        // Every delta that carries an id overwrites it.
        let a = assembled(&[call(0, "c1", Some("x"), ""), call(0, "c2", None, "")]);
        assert_eq!(a.blocks(), Ok(vec![tool_call("c2", "x", "")]));
    }

    /// assembler.spec 11: "exposes usage via the getter when a usage chunk was received" (last wins).
    #[test]
    fn exposes_the_last_usage() {
        let mut u = usage(3, 4);
        u.cache_read_tokens = Some(2);
        let a = assembled(&[
            StreamChunk::Usage { usage: usage(1, 1) },
            StreamChunk::Usage { usage: u.clone() },
        ]);
        assert_eq!(a.usage(), Some(&u));
    }

    /// assembler.spec 12: "prunes per-block replay entries with the tool calls a max-tokens finish
    /// drops".
    #[test]
    fn prunes_replay_entries_with_the_dropped_tool_calls() {
        let mut chunks = three_blocks();
        chunks.push(finish_with(
            FinishReason::MaxTokens,
            json!({"response": {"id": "r"}, "blocks": ["meta-0", "meta-1", "meta-2"]}),
        ));
        let a = assembled(&chunks);
        assert_eq!(
            a.blocks(),
            Ok(vec![ContentBlock::text("visible"), reasoning_block("why")])
        );
        assert_eq!(
            a.replay_state(),
            Some(json!({"response": {"id": "r"}, "blocks": ["meta-0", "meta-2"]}))
        );
        assert_eq!(a.finish(), FinishReason::MaxTokens);
    }

    /// assembler.spec 13: "omits replay metadata whose per-block entries misalign with the emitted
    /// blocks".
    #[test]
    fn omits_misaligned_replay_metadata() {
        for reason in [FinishReason::Stop, FinishReason::MaxTokens] {
            let mut chunks = three_blocks();
            chunks.push(finish_with(reason, json!({"blocks": ["meta-0", "meta-1"]})));
            assert_eq!(assembled(&chunks).replay_state(), None);
        }
    }

    /// assembler.spec 14: "passes replay metadata through unchanged when assembly drops nothing".
    #[test]
    fn passes_replay_metadata_through_when_nothing_is_dropped() {
        let state = json!({"response": [1, 2], "blocks": [{"a": 1}, null, "x"]});
        let mut chunks = three_blocks();
        chunks.push(finish_with(FinishReason::ToolCalls, state.clone()));
        assert_eq!(assembled(&chunks).replay_state(), Some(state));
    }

    /// assembler.spec 15: "keeps a max-tokens replay state with no per-block entries across a
    /// tool-call drop".
    #[test]
    fn keeps_a_replay_state_without_per_block_entries() {
        let state = json!({"response": {"id": "r"}});
        let mut chunks = three_blocks();
        chunks.push(finish_with(FinishReason::MaxTokens, state.clone()));
        let a = assembled(&chunks);
        assert_eq!(a.blocks().map(|b| b.len()), Ok(2));
        assert_eq!(a.replay_state(), Some(state));
    }

    /// assembler.spec 16: "keeps a text-only max-tokens response and its replay metadata intact".
    #[test]
    fn keeps_a_text_only_max_tokens_response_intact() {
        let state = json!({"blocks": ["only"]});
        let a = assembled(&[
            text(0, "cut off mid"),
            finish_with(FinishReason::MaxTokens, state.clone()),
        ]);
        assert_eq!(a.blocks(), Ok(vec![ContentBlock::text("cut off mid")]));
        assert_eq!(a.replay_state(), Some(state));
    }

    /// assembler.spec 18, the Rust analogue: a chunk outside the closed `StreamChunk` union cannot
    /// be built, and the decoder refuses one from outside.
    #[test]
    fn chunks_outside_the_union_are_refused_at_the_boundary() {
        for bad in [
            r#"{"type":"video-delta","index":0,"frame":"x"}"#,
            r#"{"type":"text-delta","index":-1,"text":"x"}"#,
            r#"{"type":"text-delta","index":0,"text":"x","extra":1}"#,
        ] {
            assert!(serde_json::from_str::<StreamChunk>(bad).is_err(), "{bad}");
        }
    }

    /// assembler.spec 19: "first block-end wins: a duplicate block-end for a closed index is
    /// ignored".
    #[test]
    fn first_block_end_wins() {
        let a = assembled(&[
            end(0, ContentBlock::text("first")),
            end(0, ContentBlock::text("second")),
        ]);
        assert_eq!(a.blocks(), Ok(vec![ContentBlock::text("first")]));
    }

    /// assembler.spec 20: "keeps closed and open text/reasoning blocks with streamed content, in
    /// order".
    #[test]
    fn interrupted_blocks_keep_closed_and_open_text_in_order() {
        let a = assembled(&[
            reasoning(0, "plan"),
            end(0, reasoning_block("plan")),
            text(1, "Hel"),
        ]);
        assert_eq!(
            a.interrupted_blocks(),
            vec![reasoning_block("plan"), ContentBlock::text("Hel")]
        );
    }

    /// assembler.spec 21: "drops tool calls whether open or closed — interruption precedes
    /// dispatch".
    #[test]
    fn interrupted_blocks_drop_tool_calls() {
        let a = assembled(&[
            text(0, "Let me look."),
            call(1, "c1", Some("read"), "{}"),
            end(1, tool_call("c1", "read", "{}")),
            call(2, "c2", Some("read"), "{\"pa"),
        ]);
        assert_eq!(
            a.interrupted_blocks(),
            vec![ContentBlock::text("Let me look.")]
        );
    }

    /// assembler.spec 22: "drops empty and whitespace-only text/reasoning blocks and unknown open
    /// block types".
    #[test]
    fn interrupted_blocks_drop_blank_and_unknown_blocks() {
        let a = assembled(&[
            start(0, BlockType::Text),
            reasoning(1, " \n\t"),
            end(2, ContentBlock::text("\u{feff} ")),
            start(3, BlockType::Other("video".into())),
            text(3, "not shown"),
            text(4, " kept "),
        ]);
        assert_eq!(a.interrupted_blocks(), vec![ContentBlock::text(" kept ")]);
    }

    #[test]
    fn max_tokens_drops_open_and_closed_tool_calls() {
        let a = assembled(&[
            call(0, "c1", Some("a"), "{}"),
            end(0, tool_call("c1", "a", "{}")),
            text(1, "partial"),
            call(2, "c2", Some("b"), "{\"tru"),
            StreamChunk::finish(FinishReason::MaxTokens),
        ]);
        assert_eq!(a.blocks(), Ok(vec![ContentBlock::text("partial")]));
        // The same stream finishing normally keeps them.
        let mut b = a.clone();
        b.push(&StreamChunk::finish(FinishReason::ToolCalls));
        assert_eq!(b.blocks().map(|v| v.len()), Ok(3));
    }

    // §9.22 properties, over arbitrary chunk sequences (valid and malformed).

    fn block_type() -> impl Strategy<Value = BlockType> {
        prop_oneof![
            Just(BlockType::Text),
            Just(BlockType::Reasoning),
            Just(BlockType::ToolCall),
            Just(BlockType::Other("video".into())),
        ]
    }

    fn content_block() -> impl Strategy<Value = ContentBlock> {
        prop_oneof![
            "[ a-z]{0,3}".prop_map(ContentBlock::text),
            "[ a-z]{0,3}".prop_map(|t| ContentBlock::Reasoning { text: t }),
            ("[a-c]{0,2}", "[a-c]{0,2}", "[{}a]{0,3}")
                .prop_map(|(id, name, args)| tool_call(&id, &name, &args)),
            Just(ContentBlock::Other(
                json!({"type": "image", "ref": 1})
                    .as_object()
                    .cloned()
                    .unwrap_or_default()
            )),
        ]
    }

    fn finish_reason() -> impl Strategy<Value = FinishReason> {
        prop_oneof![
            Just(FinishReason::Stop),
            Just(FinishReason::ToolCalls),
            Just(FinishReason::MaxTokens),
            Just(FinishReason::Error {
                failure: LlmFailure::new("SERVER", "x")
            }),
        ]
    }

    fn chunk() -> impl Strategy<Value = StreamChunk> {
        let index = 0u32..5;
        prop_oneof![
            (index.clone(), block_type()).prop_map(|(i, t)| start(i, t)),
            (index.clone(), "[ a-z]{0,3}").prop_map(|(i, t)| text(i, &t)),
            (index.clone(), "[ a-z]{0,3}").prop_map(|(i, t)| reasoning(i, &t)),
            (
                index.clone(),
                "[a-c]{0,2}",
                proptest::option::of("[a-c]{0,2}"),
                "[{}a]{0,3}"
            )
                .prop_map(|(i, id, name, args)| call(i, &id, name.as_deref(), &args)),
            (index, content_block()).prop_map(|(i, b)| end(i, b)),
            (0u64..9, 0u64..9).prop_map(|(a, b)| StreamChunk::Usage { usage: usage(a, b) }),
            (
                finish_reason(),
                proptest::option::of(prop::collection::vec(0u8..9, 0..6))
            )
                .prop_map(|(reason, entries)| StreamChunk::Finish {
                    reason,
                    replay_state: entries.map(|e| json!({"response": 1, "blocks": e})),
                }),
        ]
    }

    proptest! {
        #[test]
        fn assembly_properties_hold_for_any_chunk_sequence(
            chunks in prop::collection::vec(chunk(), 0..40)
        ) {
            let a = assembled(&chunks);

            // 1. One block per distinct index, no more.
            let mut indexes: Vec<u32> = Vec::new();
            for c in &chunks {
                let index = match c {
                    StreamChunk::BlockStart { index, .. }
                    | StreamChunk::TextDelta { index, .. }
                    | StreamChunk::ReasoningDelta { index, .. }
                    | StreamChunk::ToolCallDelta { index, .. }
                    | StreamChunk::BlockEnd { index, .. } => *index,
                    _ => continue,
                };
                if !indexes.contains(&index) {
                    indexes.push(index);
                }
            }
            prop_assert_eq!(a.n_blocks(), indexes.len());

            // 2. Re-assembly is stable, and the message carries the same content.
            let first = a.blocks();
            prop_assert_eq!(&a.blocks(), &first);
            prop_assert_eq!(&a.clone().blocks(), &first);

            // 3. blocks() fails exactly when an index first seen as an unknown type never closed;
            //    otherwise every block has a valid tag and max-tokens leaves no tool call.
            let open_unknown = indexes.iter().find(|&&i| {
                let first_type = chunks.iter().find_map(|c| match c {
                    StreamChunk::BlockStart { index, block_type } if *index == i => Some(block_type.clone()),
                    StreamChunk::TextDelta { index, .. } if *index == i => Some(BlockType::Text),
                    StreamChunk::ReasoningDelta { index, .. } if *index == i => Some(BlockType::Reasoning),
                    StreamChunk::ToolCallDelta { index, .. } if *index == i => Some(BlockType::ToolCall),
                    StreamChunk::BlockEnd { index, block } if *index == i => Some(block_type_of(block)),
                    _ => None,
                });
                let closed = chunks.iter().any(|c| matches!(c, StreamChunk::BlockEnd { index, .. } if *index == i));
                matches!(first_type, Some(BlockType::Other(_))) && !closed
            });
            let last_finish = chunks.iter().rev().find_map(|c| match c {
                StreamChunk::Finish { reason, .. } => Some(reason.clone()),
                _ => None,
            });
            match (&first, open_unknown) {
                (Err(AssembleError::IncompleteBlock { block_type }), Some(_)) => prop_assert_eq!(block_type.as_str(), "video"),
                (Ok(blocks), None) => {
                    for b in blocks {
                        prop_assert!(["text", "reasoning", "tool-call", "image"].contains(&b.type_tag()));
                    }
                    if last_finish == Some(FinishReason::MaxTokens) {
                        prop_assert!(blocks.iter().all(|b| b.type_tag() != "tool-call"));
                    } else {
                        prop_assert_eq!(blocks.len(), indexes.len());
                    }
                    let id = MessageId::new("m").expect("valid");
                    let message = a.message(id, MessageSource::model("p", "m")).expect("assembles");
                    prop_assert_eq!(&message.content, blocks);
                }
                (got, want) => prop_assert!(false, "blocks() = {:?}, open unknown index {:?}", got, want),
            }

            // 4. finish reflects the last finish chunk, or stop; usage the last usage chunk.
            prop_assert_eq!(a.finish(), last_finish.unwrap_or(FinishReason::Stop));
            let last_usage = chunks.iter().rev().find_map(|c| match c {
                StreamChunk::Usage { usage } => Some(usage),
                _ => None,
            });
            prop_assert_eq!(a.usage(), last_usage);

            // The interrupted prefix is only visible text/reasoning.
            for b in a.interrupted_blocks() {
                match b {
                    ContentBlock::Text { text } | ContentBlock::Reasoning { text } => prop_assert!(!text.trim().is_empty()),
                    other => prop_assert!(false, "interrupted block {:?}", other),
                }
            }

            // A replay state with per-block entries stays aligned with the blocks it describes.
            if let (Some(state), Ok(blocks)) = (a.replay_state(), &first)
                && let Some(Value::Array(entries)) = state.get("blocks")
            {
                prop_assert_eq!(entries.len(), blocks.len());
            }
        }
    }
}
