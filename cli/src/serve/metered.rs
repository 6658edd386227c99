//! `MeteredStore`: the store the server's host writes through, counting what became durable.
//!
//! It wraps the server's store (SQLite or PostgreSQL) and forwards every call. On the way it times each append (the store's
//! commit latency as a writer sees it: queueing for the group commit plus the transaction and its
//! fsync) and, for each committed batch, counts the `turn/end` events by reason and the provider
//! failures the log records (every `llm/retry`'s failure and every `turn/end` `error`'s final one),
//! by code. Counting what the store acknowledged, rather than what a subscriber saw, makes the
//! figures exact: a subscriber can fall behind and miss items, an acknowledged append cannot. The
//! closers a load appends (a turn left open by a crash ends `interrupted`) are counted the same way.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use dsh::SessionId;
use dsh::session::event::{EventData, SessionHeader};
use dsh::session::store::{
    EncodedEvent, Inspection, LoadedSession, SessionStore, SessionSummary, StoreError,
};
use serde_json::Value;

use super::metrics::StoreFigures;

/// The server's store with its figures kept on every write.
pub struct MeteredStore {
    inner: Arc<dyn SessionStore>,
    figures: StoreFigures,
}

impl MeteredStore {
    /// Wraps `inner`, counting into `figures`.
    pub fn new(inner: Arc<dyn SessionStore>, figures: StoreFigures) -> MeteredStore {
        MeteredStore { inner, figures }
    }

    /// Counts the turn ends and provider failures of one committed batch.
    fn count_batch(&self, events: &[EncodedEvent]) {
        for e in events.iter().filter(|e| counts(e)) {
            let Ok(v) = serde_json::from_slice::<Value>(&e.json) else {
                continue;
            };
            let data = &v["data"];
            if e.kind == "llm/retry" {
                self.figures
                    .provider_failure(json_str(&data["failure"]["code"]));
            } else {
                let reason = json_str(&data["reason"]["kind"]);
                self.figures.turn_end(reason);
                if reason == "error" {
                    self.figures
                        .provider_failure(json_str(&data["reason"]["error"]["code"]));
                }
            }
        }
    }
}

/// Whether the figures count events like `e`.
fn counts(e: &EncodedEvent) -> bool {
    e.kind == "turn/end" || e.kind == "llm/retry"
}

/// A JSON string's text, or `unknown`.
fn json_str(v: &Value) -> &str {
    v.as_str().unwrap_or("unknown")
}

#[async_trait]
impl SessionStore for MeteredStore {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn create(&self, header: &SessionHeader) -> Result<(), StoreError> {
        self.inner.create(header).await
    }

    async fn create_minted(&self, header: &SessionHeader) -> Result<(), StoreError> {
        self.inner.create_minted(header).await
    }

    async fn append(&self, id: &SessionId, events: Vec<EncodedEvent>) -> Result<(), StoreError> {
        let started = Instant::now();
        // Only these kinds are counted; their JSON is shared (`Bytes`), not copied.
        let counted: Vec<EncodedEvent> = events.iter().filter(|e| counts(e)).cloned().collect();
        self.inner.append(id, events).await?;
        self.figures.commit(started.elapsed());
        self.count_batch(&counted);
        Ok(())
    }

    async fn load(&self, id: &SessionId) -> Result<LoadedSession, StoreError> {
        let loaded = self.inner.load(id).await?;
        let closers = loaded.events.len().saturating_sub(loaded.n_repaired);
        for event in &loaded.events[closers..] {
            if let EventData::TurnEnd(end) = &event.data {
                self.figures.turn_end(end.reason.kind());
            }
        }
        Ok(loaded)
    }

    async fn inspect(&self, id: &SessionId) -> Result<Inspection, StoreError> {
        self.inner.inspect(id).await
    }

    async fn list(&self) -> Result<Vec<SessionSummary>, StoreError> {
        self.inner.list().await
    }

    async fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.inner.delete(id).await
    }

    async fn header(&self, id: &SessionId) -> Result<Option<SessionHeader>, StoreError> {
        self.inner.header(id).await
    }

    async fn release(&self, id: &SessionId) -> Result<(), StoreError> {
        self.inner.release(id).await
    }

    fn lease_epoch(&self, id: &SessionId) -> Option<u64> {
        self.inner.lease_epoch(id)
    }

    async fn release_epoch(&self, id: &SessionId, epoch: u64) -> Result<(), StoreError> {
        self.inner.release_epoch(id, epoch).await
    }
}
