//! `baseline/actor_shape`: the message topology of one text turn of `dsh/agent` (memory store),
//! with no work in it — the floor the actor shape of SPEC §7 puts under an agent's turn, whatever
//! the turn machine, the encoding and the store cost.
//!
//! A text turn of the real agent, counted with callgrind (`history --only N --runtime one`, turns
//! 100–1,000 by difference): 8 mailbox messages (the `followup` and `when_idle` requests, two
//! `Append`s to the session writer, the two `Durable`s it sends back — the memory store takes an
//! append at once, so the writer answers from its handler, with no task and no `Flushed` (until
//! the twelfth session: two append tasks and two `Flushed`s more) — one `Chunks` and one
//! `StreamEnded` from the stream actor) and one child actor spawned and stopped (the LLM stream,
//! linked: its end also reaches the agent as a supervision event). This skeleton does exactly
//! that, with payloads of the same counts (the writer gets the turn's 7 opening and 25 closing
//! events as `u64`s, the stream's 24 chunks go in one message) and nothing else: no turn machine,
//! no JSON, no store.

use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::sync::oneshot;

/// Events the agent writes before its request (splices, `turn/start`, `step/start`, the user
/// message, the request's header and context).
const OPENING_EVENTS: u64 = 7;
/// Chunks the looping text model streams, in one `Chunks` message.
const CHUNKS: u64 = 24;
/// Events after the chunks (`assistant/message`, `step/end`, `turn/end`).
const CLOSING_EVENTS: u64 = 3;

pub enum ShapeMsg {
    Followup(oneshot::Sender<u64>),
    WhenIdle(oneshot::Sender<()>),
    Durable(u64),
    Chunks(Vec<u64>),
    StreamEnded,
}

enum WriterMsg {
    Append(Vec<u64>),
}

/// The agent's turn, reduced to where it waits.
#[derive(PartialEq)]
enum Phase {
    Idle,
    /// The opening events are on their way to the store; the request waits for them.
    Checkpoint,
    Streaming,
    /// The closing events are on their way.
    Ending,
}

pub struct ShapeAgent;

pub struct AgentState {
    writer: ActorRef<WriterMsg>,
    phase: Phase,
    next_seq: u64,
    durable: u64,
    held: Vec<u64>,
    followup: Option<(u64, oneshot::Sender<u64>)>,
    idle_waiters: Vec<oneshot::Sender<()>>,
}

impl ShapeAgent {
    fn events(state: &mut AgentState, n: u64) -> Vec<u64> {
        let first = state.next_seq;
        state.next_seq += n;
        (first..state.next_seq).collect()
    }
}

impl Actor for ShapeAgent {
    type Msg = ShapeMsg;
    type State = AgentState;
    type Arguments = ();

    async fn pre_start(
        &self,
        myself: ActorRef<ShapeMsg>,
        (): (),
    ) -> Result<AgentState, ActorProcessingErr> {
        let (writer, _) =
            Actor::spawn_linked(None, ShapeWriter, myself.clone(), myself.get_cell()).await?;
        Ok(AgentState {
            writer,
            phase: Phase::Idle,
            next_seq: 0,
            durable: 0,
            held: Vec::new(),
            followup: None,
            idle_waiters: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ShapeMsg>,
        msg: ShapeMsg,
        state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ShapeMsg::Followup(reply) => {
                let batch = Self::events(state, OPENING_EVENTS);
                state.followup = Some((batch[0], reply));
                state.phase = Phase::Checkpoint;
                state.writer.cast(WriterMsg::Append(batch))?;
            }
            ShapeMsg::WhenIdle(reply) => state.idle_waiters.push(reply),
            ShapeMsg::Durable(through) => {
                state.durable = through;
                if let Some((seq, _)) = &state.followup
                    && *seq < through
                    && let Some((seq, reply)) = state.followup.take()
                {
                    let _ = reply.send(seq);
                }
                if state.phase == Phase::Checkpoint && through == state.next_seq {
                    state.phase = Phase::Streaming;
                    Actor::spawn_linked(None, ShapeStream, myself.clone(), myself.get_cell())
                        .await?;
                }
            }
            ShapeMsg::Chunks(chunks) => {
                state.next_seq += chunks.len() as u64;
                state.held = chunks;
            }
            ShapeMsg::StreamEnded => {
                let mut batch = std::mem::take(&mut state.held);
                batch.extend(Self::events(state, CLOSING_EVENTS));
                state.phase = Phase::Ending;
                state.writer.cast(WriterMsg::Append(batch))?;
            }
        }
        if state.phase == Phase::Ending && state.durable == state.next_seq {
            state.phase = Phase::Idle;
        }
        if state.phase == Phase::Idle {
            for w in state.idle_waiters.drain(..) {
                let _ = w.send(());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<ShapeMsg>,
        _event: SupervisionEvent,
        _state: &mut AgentState,
    ) -> Result<(), ActorProcessingErr> {
        Ok(())
    }
}

/// The session writer over a store that takes an append at once: it reports each batch durable
/// from its handler.
struct ShapeWriter;

struct WriterState {
    agent: ActorRef<ShapeMsg>,
}

impl Actor for ShapeWriter {
    type Msg = WriterMsg;
    type State = WriterState;
    type Arguments = ActorRef<ShapeMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<WriterMsg>,
        agent: ActorRef<ShapeMsg>,
    ) -> Result<WriterState, ActorProcessingErr> {
        Ok(WriterState { agent })
    }

    async fn handle(
        &self,
        _myself: ActorRef<WriterMsg>,
        msg: WriterMsg,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        let WriterMsg::Append(batch) = msg;
        let through = batch.last().map_or(0, |s| s + 1);
        drop(batch);
        state.agent.cast(ShapeMsg::Durable(through))?;
        Ok(())
    }
}

/// The LLM stream of one attempt: its chunks in one message, its end, and it stops.
struct ShapeStream;

impl Actor for ShapeStream {
    type Msg = ();
    type State = ActorRef<ShapeMsg>;
    type Arguments = ActorRef<ShapeMsg>;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        agent: ActorRef<ShapeMsg>,
    ) -> Result<ActorRef<ShapeMsg>, ActorProcessingErr> {
        Ok(agent)
    }

    async fn post_start(
        &self,
        myself: ActorRef<()>,
        agent: &mut ActorRef<ShapeMsg>,
    ) -> Result<(), ActorProcessingErr> {
        agent.cast(ShapeMsg::Chunks((0..CHUNKS).collect()))?;
        agent.cast(ShapeMsg::StreamEnded)?;
        myself.stop(None);
        Ok(())
    }
}

/// Runs `iters` skeleton turns on one skeleton agent, driven as `dsh/agent` is (`followup`, then
/// `when_idle`), and returns the time they took.
pub async fn timed_shape_turns(iters: u64) -> Duration {
    let (agent, handle) = Actor::spawn(None, ShapeAgent, ())
        .await
        .expect("the skeleton agent starts");
    let started = std::time::Instant::now();
    for _ in 0..iters {
        let (reply, acked) = oneshot::channel();
        agent.cast(ShapeMsg::Followup(reply)).expect("followup");
        acked.await.expect("acknowledged");
        let (reply, idle) = oneshot::channel();
        agent.cast(ShapeMsg::WhenIdle(reply)).expect("when_idle");
        idle.await.expect("idle");
    }
    let elapsed = started.elapsed();
    agent.stop(None);
    handle.await.expect("the skeleton agent stops");
    elapsed
}
