//! The `Provider` trait: stream chunks for one request attempt, cancellable; and the registry of
//! providers by name.
//!
//! Contract for implementations: the stream yields chunks following the grammar of
//! `reference/session-llm.md` §6.4 and always ends with exactly one `finish` chunk. Failures of any
//! kind (HTTP status, transport, malformed data, timeouts) are reported in-band as
//! `finish{error, failure}` (or `finish{aborted}` when cancelled), never by panicking or ending without
//! a finish. Cancelling `cancel` or dropping the stream closes the underlying connection at once.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio_util::sync::CancellationToken;

use crate::llm::retry::RetryPolicy;
use crate::llm::types::{LlmRequest, StreamChunk};

/// A provider's chunk stream for one attempt.
pub type ChunkStream = Pin<Box<dyn Stream<Item = StreamChunk> + Send + 'static>>;

/// What a provider knows about a model.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelInfo {
    /// The model's context window in tokens, logged as `request/context`.
    pub context_window: Option<u64>,
    /// The output cap the provider applies when a request sets none (materialized into the header
    /// with `adapterDefaults.maxTokens`).
    pub default_max_tokens: Option<u64>,
}

/// A model backend.
pub trait Provider: Send + Sync + 'static {
    /// The route name requests use (`openai`, `sim`, `script`, ...).
    fn name(&self) -> &str;

    /// Starts one request attempt. See the module docs for the stream contract.
    fn stream(&self, request: LlmRequest, cancel: CancellationToken) -> ChunkStream;

    /// The retry policy that governs failures of this provider (`None`: never retried by the default
    /// request-error policy).
    fn retry_policy(&self) -> Option<RetryPolicy> {
        Some(RetryPolicy::default())
    }

    /// Capacity facts about `model`.
    fn model_info(&self, model: &str) -> ModelInfo {
        let _ = model;
        ModelInfo::default()
    }
}

/// Providers by route name.
#[derive(Clone, Default)]
pub struct ProviderRegistry {
    by_name: BTreeMap<String, Arc<dyn Provider>>,
}

impl ProviderRegistry {
    /// An empty registry.
    pub fn new() -> ProviderRegistry {
        ProviderRegistry::default()
    }

    /// Registers `provider` under its name, replacing any earlier one of that name.
    pub fn register(&mut self, provider: Arc<dyn Provider>) {
        self.by_name.insert(provider.name().to_string(), provider);
    }

    /// The provider registered under `name` (a request's `provider`), if any.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.by_name.get(name)
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }
}

impl std::fmt::Debug for ProviderRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
    }
}
