//! `LlmStreamActor`: runs one request attempt and forwards its chunks to the agent.
//!
//! One actor per attempt, linked to its agent. It pulls the provider's stream and casts each chunk as
//! `AgentMsg::Chunk` — or, when the provider already has more chunks ready, up to `CHUNK_BATCH_MAX`
//! of them as one `AgentMsg::Chunks`, which the agent handles exactly like that many `Chunk`s but
//! for one mailbox trip and one hand-off to its writer (a fast stream costs a message per burst,
//! not per token) — then `StreamEnded`, and stops. The agent holds chunks back from its writer while
//! the stream runs (they join the next commit that must be durable); when the provider makes the
//! actor wait, it tells the agent to hand over what it holds (`FlushChunks`) at most `linger` after
//! the first chunk it sent since the last such flush, so observers still see a slow stream live. Cancelling its token closes the stream at once
//! (the provider drops the connection); a panic in provider code reaches the agent as a supervision
//! event and becomes a failure offered to `request_error`. A route with no registered provider gets
//! no actor at all: the core resolves the provider and decides `NO_ADAPTER` itself.

use std::sync::Arc;

use dsh::llm::provider::Provider;
use dsh::llm::types::LlmRequest;
use futures::{FutureExt, StreamExt};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::msg::AgentMsg;

/// Chunks forwarded in one message at most. 64: a 20-token reply (24 chunks) in one trip, while a
/// long burst still reaches the agent in pieces it can interleave with a steer or a cancel.
const CHUNK_BATCH_MAX: usize = 64;

/// The room a batch of ready chunks is given when a second one is ready: a short reply's chunks in
/// one allocation (a longer burst grows from there, up to `CHUNK_BATCH_MAX`).
const CHUNK_BURST_ROOM: usize = 32;

pub(crate) struct LlmStreamActor;

pub(crate) struct LlmStreamArgs {
    pub(crate) ticket: u64,
    pub(crate) provider: Arc<dyn Provider>,
    pub(crate) provider_name: String,
    pub(crate) request: LlmRequest,
    pub(crate) cancel: CancellationToken,
    pub(crate) agent: ActorRef<AgentMsg>,
    /// The longest the agent holds a forwarded chunk back from its writer (`HostConfig::chunk_linger`).
    pub(crate) linger: std::time::Duration,
}

impl Actor for LlmStreamActor {
    type Msg = ();
    type State = Option<LlmStreamArgs>;
    type Arguments = LlmStreamArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        args: LlmStreamArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(Some(args))
    }

    async fn post_start(
        &self,
        myself: ActorRef<()>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let Some(args) = state.take() else {
            return Ok(());
        };
        let LlmStreamArgs {
            ticket,
            provider,
            provider_name,
            request,
            cancel,
            agent,
            linger,
        } = args;
        let span = tracing::debug_span!(
            "llm_stream",
            agent = ?request.session_id,
            provider = %provider_name,
            ticket
        );
        let forwarder = agent.clone();
        async move {
            let mut stream = provider.stream(request, cancel.clone());
            // When the first chunk forwarded since the agent last flushed went out.
            let mut held_since: Option<tokio::time::Instant> = None;
            loop {
                let next = match held_since {
                    Some(since) => tokio::select! {
                        biased;
                        () = cancel.cancelled() => break,
                        next = stream.next() => next,
                        () = tokio::time::sleep_until(since + linger) => {
                            held_since = None;
                            if forwarder.cast(AgentMsg::FlushChunks { ticket }).is_err() {
                                break;
                            }
                            continue;
                        }
                    },
                    None => tokio::select! {
                        biased;
                        () = cancel.cancelled() => break,
                        next = stream.next() => next,
                    },
                };
                let Some(chunk) = next else { break };
                // Take what else is ready without waiting, re-checking the cancellation before
                // each chunk as the loop above does.
                // A lone chunk goes as it is; a burst gets its room at once, on its second ready
                // chunk, rather than growing by doubling from one.
                let mut first = Some(chunk);
                let mut chunks = Vec::new();
                let mut ended = false;
                while chunks.len() < CHUNK_BATCH_MAX && !cancel.is_cancelled() {
                    match stream.next().now_or_never() {
                        Some(Some(chunk)) => {
                            if let Some(first) = first.take() {
                                chunks.reserve_exact(CHUNK_BURST_ROOM);
                                chunks.push(first);
                            }
                            chunks.push(chunk);
                        }
                        Some(None) => {
                            ended = true;
                            break;
                        }
                        None => break,
                    }
                }
                let msg = match first {
                    Some(chunk) => AgentMsg::Chunk { ticket, chunk },
                    None => AgentMsg::Chunks { ticket, chunks },
                };
                if forwarder.cast(msg).is_err() || ended {
                    break;
                }
                if held_since.is_none() && !linger.is_zero() {
                    held_since = Some(tokio::time::Instant::now());
                }
            }
        }
        .instrument(span)
        .await;
        let _ = agent.cast(AgentMsg::StreamEnded { ticket });
        myself.stop(None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsh::llm::provider::ChunkStream;
    use dsh::llm::types::{History, LlmCallConfig, StreamChunk};
    use tokio::sync::mpsc;

    /// A provider whose reply is `n` text deltas, all ready at once.
    struct Ready(usize);

    impl Provider for Ready {
        fn name(&self) -> &str {
            "ready"
        }

        fn stream(&self, _request: LlmRequest, _cancel: CancellationToken) -> ChunkStream {
            Box::pin(futures::stream::iter((0..self.0).map(|i| {
                StreamChunk::TextDelta {
                    index: 0,
                    text: i.to_string(),
                }
            })))
        }
    }

    /// Stands in for the agent: reports what each message carried.
    struct Agent(mpsc::UnboundedSender<String>);

    impl Actor for Agent {
        type Msg = AgentMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            _myself: ActorRef<AgentMsg>,
            (): (),
        ) -> Result<(), ActorProcessingErr> {
            Ok(())
        }

        async fn handle(
            &self,
            _myself: ActorRef<AgentMsg>,
            msg: AgentMsg,
            _state: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            let text = |c: &StreamChunk| match c {
                StreamChunk::TextDelta { text, .. } => text.clone(),
                other => format!("{other:?}"),
            };
            let seen = match msg {
                AgentMsg::Chunk { chunk, .. } => format!("chunk {}", text(&chunk)),
                AgentMsg::Chunks { chunks, .. } => format!(
                    "chunks {}",
                    chunks.iter().map(text).collect::<Vec<_>>().join(",")
                ),
                AgentMsg::StreamEnded { .. } => "ended".to_string(),
                _ => "other".to_string(),
            };
            let _ = self.0.send(seen);
            Ok(())
        }
    }

    /// What the agent receives from a stream of `n` ready chunks.
    async fn forwarded(n: usize) -> Vec<String> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (agent, agent_task) = Actor::spawn(None, Agent(tx), ()).await.expect("agent");
        let request = LlmRequest {
            config: LlmCallConfig::default(),
            system: None,
            tools: Vec::new(),
            messages: History::new(),
            session_id: None,
            purpose: None,
        };
        let args = LlmStreamArgs {
            ticket: 1,
            provider: Arc::new(Ready(n)),
            provider_name: "ready".into(),
            request,
            cancel: CancellationToken::new(),
            agent: agent.clone(),
            linger: std::time::Duration::ZERO,
        };
        let (_stream, stream_task) = Actor::spawn(None, LlmStreamActor, args)
            .await
            .expect("stream");
        stream_task
            .await
            .expect("the stream actor ends with its stream");
        let mut seen = Vec::new();
        while seen.last().is_none_or(|s| s != "ended") {
            seen.push(rx.recv().await.expect("a message"));
        }
        agent.stop(None);
        agent_task.await.expect("agent stopped");
        seen
    }

    fn numbers(range: std::ops::Range<usize>) -> String {
        range.map(|i| i.to_string()).collect::<Vec<_>>().join(",")
    }

    /// A lone ready chunk goes as `Chunk`; ready chunks go as `Chunks` of at most
    /// `CHUNK_BATCH_MAX`, in stream order, past the burst's first room; the end comes last.
    #[tokio::test]
    async fn ready_chunks_are_forwarded_in_order_in_batches() {
        assert_eq!(forwarded(1).await, ["chunk 0", "ended"]);
        assert_eq!(
            forwarded(2).await,
            [format!("chunks {}", numbers(0..2)), "ended".to_string()]
        );
        let n = CHUNK_BATCH_MAX + CHUNK_BURST_ROOM + 3;
        assert_eq!(
            forwarded(n).await,
            [
                format!("chunks {}", numbers(0..CHUNK_BATCH_MAX)),
                format!("chunks {}", numbers(CHUNK_BATCH_MAX..n)),
                "ended".to_string()
            ]
        );
    }
}
