//! The model side: message and chunk types, stream assembly, the retry policy, and the providers.
//!
//! `types` is the vocabulary (also the log's wire format). `assembler` turns a chunk stream into the
//! assistant message (pure). `retry` is the default request-error policy as pure functions.
//! `provider` is the `Provider` trait and registry; `openai` (OpenAI-compatible HTTP: `sse` is the
//! generic server-sent-events framing, `openai` translates the payloads), `sim` (a seeded simulated
//! model) and `script` (scripted replies for tests and scenario files) implement it.

pub mod assembler;
pub mod openai;
pub mod provider;
pub mod retry;
pub mod script;
pub mod sim;
pub mod sse;
pub mod types;

pub use provider::{ChunkStream, ModelInfo, Provider, ProviderRegistry};
pub use types::{
    BlockType, ContentBlock, FinishReason, LlmCallConfig, LlmFailure, LlmRequest, Message,
    MessageSource, RequestHeader, Role, StreamChunk, TokenUsage, ToolSchema, UserMessage,
};
