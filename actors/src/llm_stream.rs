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
                let mut chunks = vec![chunk];
                let mut ended = false;
                while chunks.len() < CHUNK_BATCH_MAX && !cancel.is_cancelled() {
                    match stream.next().now_or_never() {
                        Some(Some(chunk)) => chunks.push(chunk),
                        Some(None) => {
                            ended = true;
                            break;
                        }
                        None => break,
                    }
                }
                let msg = match chunks.pop() {
                    Some(chunk) if chunks.is_empty() => AgentMsg::Chunk { ticket, chunk },
                    last => {
                        chunks.extend(last);
                        AgentMsg::Chunks { ticket, chunks }
                    }
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
