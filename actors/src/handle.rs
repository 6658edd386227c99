//! `AgentHandle`: the public API of one agent.
//!
//! Every input method (`followup`, `steer`, `inject`, `cancel`, `remove`, `replace`) returns only
//! after what it wrote is durable ("acknowledged means durable"). A refused input changes nothing.
//! A handle stays valid across restarts: it reaches the agent through its registry slot, which the
//! host points at the new actor; calls made while the agent restarts wait for it.
//!
//! A hibernated agent is *dormant*: its actor has stopped and its compact core (ids, counters, inbox
//! — no log) waits in the slot (`crate::slot`). The first input wakes it: the caller takes the core out of the slot
//! and the host spawns a new actor over it. `status`, `when_idle`, `log` and `subscribe` answer a
//! dormant agent without waking it. A message that raced the actor's passivation (it reached the
//! mailbox after the actor decided to stop) was never handled; the handle sends it again to the new
//! actor. Each actor incarnation carries a flag it sets before it passivates, which tells that apart
//! from a crash of the very actor the message went to (after which nothing is resent).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dsh::llm::types::Message;
use dsh::session::Event;
use dsh::session::event::CancelCause;
use dsh::{MessageId, SessionId};
use ractor::ActorRef;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

pub use crate::agent::msg::CompactReceipt;
use crate::agent::msg::{AgentMsg, Reply};
use crate::error::InputError;
use crate::observe::{StatusReport, Subscription};
use crate::slot::{AgentSlot, SlotState};

/// A live agent actor and its passivation flag.
type LiveActor = (ActorRef<AgentMsg>, Arc<AtomicBool>);

/// Where an acknowledged input landed in the agent's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InputReceipt {
    /// Seq of the durable `agent/inbox/spliced` event that queued the message.
    pub seq: u64,
}

/// A handle to one agent, from `Host::create`, `resume`, `open` or `get`. Cheap to clone; stays
/// valid across the agent's restarts and hibernation.
#[derive(Clone, Debug)]
pub struct AgentHandle {
    /// The agent's registry entry, which the host points at its current actor.
    slot: Arc<AgentSlot>,
}

impl AgentHandle {
    /// A handle reaching the agent of `slot` (the host makes them).
    pub(crate) fn new(slot: Arc<AgentSlot>) -> AgentHandle {
        AgentHandle { slot }
    }

    /// The agent's id (its session id).
    pub fn id(&self) -> &SessionId {
        &self.slot.id
    }

    /// Spawns `task` beside the agent: on the host thread its actor was last started on when the
    /// host pins agents (`HostConfig::agent_threads`), otherwise with `tokio::spawn` on the
    /// caller's runtime (so it must be called from within one, as `tokio::spawn`).
    ///
    /// For code that talks to one agent turn after turn (a driver, a session's request handler):
    /// its messages to the agent and the agent's answers then stay on one thread, with no thread
    /// woken in between, which on a lone agent is most of a turn's cost on a multi-threaded
    /// runtime (BENCHMARKS.md, **CPU per turn, by where the agent runs**). A hibernated or
    /// restarted agent's new actor starts on the same thread, so a task spawned before stays
    /// beside it.
    pub fn spawn_beside<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let thread = self
            .slot
            .home_thread()
            .and_then(|i| self.slot.host.upgrade()?.agent_thread(i));
        match thread {
            Some(runtime) => runtime.spawn(task),
            None => tokio::spawn(task),
        }
    }

    /// Why a call cannot reach the agent in `state`: failed, disposed, or (otherwise) interrupted.
    fn gone(&self, state: SlotState) -> InputError {
        let id = self.id().clone();
        match state {
            SlotState::Failed(reason) => InputError::Failed { id, reason },
            SlotState::Disposed => InputError::Disposed { id },
            _ => InputError::Interrupted { id },
        }
    }

    /// The live actor and its passivation flag, waking a dormant agent.
    async fn actor(&self) -> Result<LiveActor, InputError> {
        self.live_actor(true).await.map(|live| {
            live.ok_or_else(|| InputError::Interrupted {
                id: self.id().clone(),
            })
        })?
    }

    /// The live actor and its passivation flag; for a dormant agent, woken if `wake`, else `None`.
    async fn live_actor(&self, wake: bool) -> Result<Option<LiveActor>, InputError> {
        let mut rx = self.slot.state.subscribe();
        loop {
            let state = rx.borrow_and_update().clone();
            match state {
                SlotState::Live(actor, passivated) => return Ok(Some((actor, passivated))),
                SlotState::Failed(_) | SlotState::Disposed => {
                    return Err(self.gone(state));
                }
                SlotState::Dormant if !wake => return Ok(None),
                SlotState::Dormant => self.wake().await?,
                SlotState::Waking | SlotState::Restarting => {
                    if rx.changed().await.is_err() {
                        return Err(InputError::Disposed {
                            id: self.id().clone(),
                        });
                    }
                }
            }
        }
    }

    /// Spawns an actor over the dormant core (unless another caller already took it).
    async fn wake(&self) -> Result<(), InputError> {
        let Some(core) = self.slot.take_dormant() else {
            return Ok(());
        };
        let Some(host) = self.slot.host.upgrade() else {
            self.slot.set(SlotState::Disposed);
            return Err(InputError::Disposed {
                id: self.id().clone(),
            });
        };
        host.wake(&self.slot, core).await.map_err(|reason| {
            self.slot.set(SlotState::Failed(reason.clone()));
            InputError::Failed {
                id: self.id().clone(),
                reason,
            }
        })
    }

    async fn request<T>(&self, build: impl Fn(Reply<T>) -> AgentMsg) -> Result<T, InputError> {
        self.request_or_dormant(build, true).await.map(|answer| {
            answer.ok_or_else(|| InputError::Interrupted {
                id: self.id().clone(),
            })
        })?
    }

    /// A question a dormant agent answers from its slot (`status`, `log`, `when_idle`): `None` when
    /// the agent is dormant, now or once the actor asked passivated before it answered. Such a
    /// question never wakes the agent, not even when it races the agent's hibernation.
    async fn ask<T>(&self, build: impl Fn(Reply<T>) -> AgentMsg) -> Result<Option<T>, InputError> {
        self.request_or_dormant(build, false).await
    }

    /// Sends `build`'s message to the live actor and waits for its answer, again to the next actor
    /// when the one asked passivated first; a dormant agent is woken if `wake`, else `None`.
    async fn request_or_dormant<T>(
        &self,
        build: impl Fn(Reply<T>) -> AgentMsg,
        wake: bool,
    ) -> Result<Option<T>, InputError> {
        loop {
            let Some((actor, passivated)) = self.live_actor(wake).await? else {
                return Ok(None);
            };
            let (tx, rx) = oneshot::channel();
            let handled = actor.cast(build(tx)).is_ok();
            if handled && let Ok(answer) = rx.await {
                return Ok(Some(answer));
            }
            // Dropped unanswered. If that actor passivated, it stopped before handling the message
            // (passivation needs every acknowledgement settled; the flag is set before it stops, so
            // before the message is dropped): send it to the actor that wakes the agent.
            if !passivated.load(Ordering::SeqCst) {
                // An agent that failed marks its slot before it stops: say why, not "interrupted".
                return Err(self.gone(self.slot.current()));
            }
            // The flag is set just before the slot turns dormant: wait for that instead of spinning.
            let mut rx = self.slot.state.subscribe();
            while matches!(&*rx.borrow_and_update(), SlotState::Live(a, _) if a.get_id() == actor.get_id())
            {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        }
    }

    /// A prompt for its own turn; wakes the agent. Returns once durable.
    ///
    /// # Errors
    /// `InputError` when the message is refused or the agent cannot take input.
    pub async fn followup(&self, msg: Message) -> Result<(), InputError> {
        self.followup_receipt(msg).await.map(|_| ())
    }

    /// `followup`, answering where the input landed in the log.
    ///
    /// # Errors
    /// As `followup`.
    pub async fn followup_receipt(&self, msg: Message) -> Result<InputReceipt, InputError> {
        let seq = self
            .request(|reply| AgentMsg::Followup {
                msg: msg.clone(),
                reply,
            })
            .await??;
        self.receipt(seq)
    }

    /// Input for the nearest step boundary; wakes the agent. Returns once durable.
    ///
    /// # Errors
    /// `InputError` when the message is refused or the agent cannot take input.
    pub async fn steer(&self, msg: Message) -> Result<(), InputError> {
        self.steer_receipt(msg).await.map(|_| ())
    }

    /// `steer`, answering where the input landed in the log.
    ///
    /// # Errors
    /// As `steer`.
    pub async fn steer_receipt(&self, msg: Message) -> Result<InputReceipt, InputError> {
        let seq = self
            .request(|reply| AgentMsg::Steer {
                msg: msg.clone(),
                reply,
            })
            .await??;
        self.receipt(seq)
    }

    /// Input for the next boundary of whatever turn runs next; does not wake. Returns once durable.
    ///
    /// # Errors
    /// `InputError` when the message is refused or the agent cannot take input.
    pub async fn inject(&self, msg: Message) -> Result<(), InputError> {
        self.inject_receipt(msg).await.map(|_| ())
    }

    /// `inject`, answering where the input landed in the log.
    ///
    /// # Errors
    /// As `inject`.
    pub async fn inject_receipt(&self, msg: Message) -> Result<InputReceipt, InputError> {
        let seq = self
            .request(|reply| AgentMsg::Inject {
                msg: msg.clone(),
                reply,
            })
            .await??;
        self.receipt(seq)
    }

    /// The receipt of an input whose splice is at `seq` (every admitted input writes one).
    fn receipt(&self, seq: Option<u64>) -> Result<InputReceipt, InputError> {
        seq.map(|seq| InputReceipt { seq })
            .ok_or_else(|| InputError::Store {
                id: self.id().clone(),
                reason: "the input was acknowledged without a splice event".into(),
            })
    }

    /// Aborts the active turn with `cause`; without `keep_inbox` durably discards all pending input.
    ///
    /// # Errors
    /// `InputError` when the agent cannot take input.
    pub async fn cancel(&self, cause: CancelCause, keep_inbox: bool) -> Result<(), InputError> {
        self.request(|reply| AgentMsg::Cancel {
            cause: cause.clone(),
            keep_inbox,
            reply,
        })
        .await?
    }

    /// Durably cancels one pending message. Returns whether it was pending.
    ///
    /// # Errors
    /// `InputError` when the agent cannot take input.
    pub async fn remove(&self, id: MessageId) -> Result<bool, InputError> {
        self.request(|reply| AgentMsg::Remove {
            id: id.clone(),
            reply,
        })
        .await?
    }

    /// Replaces one pending message in place. Returns whether it was pending.
    ///
    /// # Errors
    /// `InputError` when the replacement is refused or the agent cannot take input.
    pub async fn replace(&self, id: MessageId, msg: Message) -> Result<bool, InputError> {
        self.request(|reply| AgentMsg::Replace {
            id: id.clone(),
            msg: msg.clone(),
            reply,
        })
        .await?
    }

    /// Resolves when the agent has no activity (including replacement work queued during
    /// convergence) and everything it wrote is durable.
    ///
    /// # Errors
    /// `InputError` when the agent is gone.
    pub async fn when_idle(&self) -> Result<(), InputError> {
        // Dormant (now, or once the actor asked hibernated): idle, everything durable.
        self.ask(|reply| AgentMsg::WhenIdle { reply }).await?;
        Ok(())
    }

    /// Like `when_idle`, giving up after `timeout`. Returns whether the agent became idle.
    ///
    /// # Errors
    /// `InputError` when the agent is gone.
    pub async fn when_idle_for(&self, timeout: Duration) -> Result<bool, InputError> {
        match tokio::time::timeout(timeout, self.when_idle()).await {
            Ok(r) => r.map(|()| true),
            Err(_) => Ok(false),
        }
    }

    /// A snapshot of the agent's state.
    ///
    /// # Errors
    /// `InputError` when the agent is gone.
    pub async fn status(&self) -> Result<StatusReport, InputError> {
        // A dormant agent answers from its core, without waking.
        loop {
            if let Some(report) = self.slot.with_dormant(|core| StatusReport::of(core, None)) {
                return Ok(report);
            }
            if let Some(report) = self.ask(|reply| AgentMsg::Status { reply }).await? {
                return Ok(report);
            }
            // Dormant again; or woken by another caller meanwhile, when the slot's core is gone.
        }
    }

    /// The agent's log as it is now (durable or not).
    ///
    /// # Errors
    /// `InputError` when the agent is gone or its log cannot be read back.
    pub async fn log(&self) -> Result<Vec<Event>, InputError> {
        if let Some(log) = self.ask(|reply| AgentMsg::Log { reply }).await? {
            return log;
        }
        // Dormant: everything is durable, so the store holds the whole log.
        let Some(host) = self.slot.host.upgrade() else {
            return Err(InputError::Disposed {
                id: self.id().clone(),
            });
        };
        host.read_log(self.id())
            .await
            .map_err(|reason| InputError::Store {
                id: self.id().clone(),
                reason,
            })
    }

    /// Observes this agent: durable events (once durable) and live notifications, in a bounded
    /// buffer. The subscription outlives restarts.
    pub fn subscribe(&self) -> Subscription {
        self.slot.observers.subscribe()
    }

    /// Test-only: makes the agent actor panic in its message handler, as a bug would. The host
    /// restarts it from its log (within the restart intensity).
    ///
    /// # Errors
    /// `InputError` when the agent is gone.
    #[cfg(feature = "fault-injection")]
    pub async fn inject_panic(&self) -> Result<(), InputError> {
        let (actor, _) = self.actor().await?;
        actor
            .cast(AgentMsg::Panic)
            .map_err(|_| InputError::Interrupted {
                id: self.id().clone(),
            })
    }

    /// Test-only: makes the agent's tool pool panic, as a bug in it would.
    ///
    /// # Errors
    /// `InputError` when the agent is gone.
    #[cfg(feature = "fault-injection")]
    pub async fn inject_tool_pool_panic(&self) -> Result<(), InputError> {
        let (actor, _) = self.actor().await?;
        actor
            .cast(AgentMsg::PanicToolPool)
            .map_err(|_| InputError::Interrupted {
                id: self.id().clone(),
            })
    }

    /// Compacts the agent's history by hand (SPEC §15, `/compact`): only while it is idle. Returns
    /// once the compaction's `compaction/start` is durable; the summary, the replacing checkpoint
    /// and `compaction/end` follow before the agent is idle again (`when_idle`). A failure is logged
    /// in that `compaction/end` and changes nothing else.
    ///
    /// # Errors
    /// `InputError::Busy` unless the agent is idle; `InputError::NotCompacted` when there is nothing
    /// to compact (or its log cannot be read back); other `InputError`s when it is gone.
    pub async fn compact(&self) -> Result<CompactReceipt, InputError> {
        self.request(|reply| AgentMsg::Compact { reply }).await?
    }

    /// Runs `task` as maintenance: only while the agent is idle; waking input that arrives meanwhile
    /// is deferred and replayed when the task ends. `task` receives the maintenance cancellation
    /// token (a `cancel` fires it).
    ///
    /// # Errors
    /// `InputError::Busy` unless the agent is idle; other `InputError`s when it is gone.
    pub async fn run_maintenance<F, Fut, T>(&self, task: F) -> Result<T, InputError>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        let token = self
            .request(|reply| AgentMsg::BeginMaintenance { reply })
            .await??;
        let out = task(token).await;
        if let Ok((actor, _)) = self.actor().await {
            let _ = actor.cast(AgentMsg::EndMaintenance);
        }
        Ok(out)
    }
}
