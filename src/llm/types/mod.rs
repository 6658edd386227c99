//! The model-facing vocabulary: messages, content blocks, stream chunks, finish reasons, usage,
//! failures, call configuration and the request header.
//!
//! These types are also the wire format of the session log (`reference/session-llm.md` §6), so their
//! serde shapes are fixed: camelCase keys in the order the original writes them, optional keys omitted
//! (never `null`), and anything a plugin may extend (message sources, content blocks of unknown type) is
//! kept verbatim so a log read and written again is unchanged.
//!
//! The parts: `message` (messages, their sources and content blocks), `chunk` (the streamed chunk
//! grammar, finish reasons, token usage), `failure` (`LlmFailure` and the failure `codes`), `history` (`History`, the shared append-only
//! message list a request carries), and
//! `request` (call configuration, the request header, and the request a provider receives).

mod chunk;
mod failure;
mod history;
mod message;
mod request;

pub use chunk::{BlockType, FinishReason, StreamChunk, TokenUsage};
pub use failure::{LlmFailure, codes};
pub use history::{History, Iter as HistoryIter};
pub use message::{ContentBlock, Message, MessageSource, Role, ToolCallBlock, UserMessage};
pub use request::{
    AdapterDefaults, LlmCallConfig, LlmRequest, RequestHeader, RequestPurpose, ToolSchema,
};
