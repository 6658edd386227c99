//! `AgentSlot`: the registry entry of one agent, shared by the host, the agent's actor and every
//! handle; `SlotState`, where the agent's current actor is; `SlotHost`, what a slot may ask of the
//! host that registered it.
//!
//! The slot outlives actors: a restart or a wake points it at a new actor, and handles reach the
//! agent through it. A hibernated agent is *dormant*: its actor has stopped and its compact core
//! waits in `AgentSlot::dormant` until a caller takes it out and asks the host to spawn an actor over
//! it (`SlotHost::wake`).
//!
//! The slot reaches its host through the `SlotHost` trait (implemented by the host's registry), so
//! this module and the handle never name the host: the dependencies run host → handle → slot, one
//! way.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use dsh::SessionId;
use dsh::session::Event;
use dsh::turn::AgentCore;
use futures::future::BoxFuture;
use ractor::{ActorId, ActorRef};
use tokio::sync::watch;

use crate::agent::msg::AgentMsg;
use crate::observe::Channel;
use crate::session_writer::WriteFence;

/// Where an agent's current actor is.
#[derive(Clone, Debug)]
pub(crate) enum SlotState {
    /// An actor runs the agent; the flag is set by that actor (and no other) before it passivates.
    Live(ActorRef<AgentMsg>, Arc<AtomicBool>),
    /// Hibernated without an actor: the core is in `AgentSlot::dormant`.
    Dormant,
    /// A caller took the dormant core and the host is spawning its actor.
    Waking,
    /// The host is (re)starting the agent's actor from its log; callers wait for `Live`.
    Restarting,
    /// The agent refuses all input, for the reason given (store failure, restart intensity).
    Failed(String),
    /// Disposed, or its host shut down.
    Disposed,
}

/// What a slot asks of the host that registered it. The host's registry implements it; the slot
/// holds it weakly, so a handle that outlives its host finds it gone instead of keeping it alive.
pub(crate) trait SlotHost: Send + Sync {
    /// Spawns an actor over `core`, the dormant core the caller took from `slot`.
    ///
    /// # Errors
    /// Why the actor could not start, as text (the caller marks the agent failed with it).
    fn wake<'a>(
        &'a self,
        slot: &'a Arc<AgentSlot>,
        core: AgentCore,
    ) -> BoxFuture<'a, Result<(), String>>;

    /// The durable log of agent `id`, read straight from the store without repair.
    ///
    /// # Errors
    /// The store's failure, as text.
    fn read_log<'a>(&'a self, id: &'a SessionId) -> BoxFuture<'a, Result<Vec<Event>, String>>;

    /// The runtime of the host's agent thread `i` (`HostConfig::agent_threads`), if it has one.
    fn agent_thread(&self, i: usize) -> Option<tokio::runtime::Handle>;
}

/// The registry entry of one agent, shared by the host, its actor and every handle.
pub(crate) struct AgentSlot {
    /// The agent's id; never changes.
    pub(crate) id: SessionId,
    /// Where the agent's actor is. Written by the host (restart, dispose), by the actor (`Live` in
    /// its `pre_start`, `Failed`) and by the dormant-core hand-over below; handles watch it.
    pub(crate) state: watch::Sender<SlotState>,
    /// Observers of this agent; outlives restarts.
    pub(crate) observers: Channel,
    /// Held by the session writer while an append is in flight; a restart seals it before it reads
    /// the log back, so no write of the previous actor lands after that.
    pub(crate) write_fence: Arc<WriteFence>,
    /// The core of a dormant agent.
    ///
    /// Inline rather than boxed: a core boxed at passivation would be a fresh allocation made
    /// among the freed memory of the turns that just ran, and keep those pages resident (after a
    /// burst of 10,000 turns, that was most of a hibernated agent's RSS). Inline, the dormant core
    /// lives in the slot, which was allocated when the agent was created.
    ///
    /// Invariant: `Some` exactly while `state` is `Dormant`; both change under this lock.
    dormant: Mutex<Option<AgentCore>>,
    /// The host that spawns this agent's actors.
    pub(crate) host: Weak<dyn SlotHost>,
    /// The host thread the agent's last actor was spawned on, plus one; 0 when it runs on the
    /// caller's runtime (no `HostConfig::agent_threads`) or has not started yet. Read and written
    /// through `home_thread` and `set_home_thread`.
    home: AtomicU32,
}

impl std::fmt::Debug for AgentSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSlot")
            .field("id", &self.id)
            .field("state", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl AgentSlot {
    /// A slot for agent `id`, `Restarting` until its first actor publishes itself `Live`.
    pub(crate) fn new(
        id: SessionId,
        subscriber_buffer_max: usize,
        host: Weak<dyn SlotHost>,
    ) -> AgentSlot {
        AgentSlot {
            id,
            state: watch::Sender::new(SlotState::Restarting),
            observers: Channel::new(subscriber_buffer_max),
            write_fence: Arc::new(WriteFence::default()),
            dormant: Mutex::new(None),
            host,
            home: AtomicU32::new(0),
        }
    }

    /// The host thread the agent's last actor was spawned on, if any.
    pub(crate) fn home_thread(&self) -> Option<usize> {
        let home = self.home.load(Ordering::Relaxed);
        usize::try_from(home).ok()?.checked_sub(1)
    }

    /// Records the host thread the agent's actor is spawned on.
    pub(crate) fn set_home_thread(&self, thread: usize) {
        let home = u32::try_from(thread).map_or(0, |t| t.saturating_add(1));
        self.home.store(home, Ordering::Relaxed);
    }

    /// Replaces the state and wakes every handle waiting on it.
    pub(crate) fn set(&self, state: SlotState) {
        self.state.send_replace(state);
    }

    /// The state now.
    pub(crate) fn current(&self) -> SlotState {
        self.state.borrow().clone()
    }

    fn dormant_lock(&self) -> MutexGuard<'_, Option<AgentCore>> {
        // Only moves of a box happen under this lock; a panic cannot leave it half-updated.
        self.dormant.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The actor `me` hands over its hibernated core and stops: the agent is dormant. Returns false
    /// (and drops the core) when the slot no longer names `me` as `Live`: a restart took the agent
    /// over, reads it back from the log and must not find a stale core beside its new actor.
    /// `counted` runs under the lock before the core is visible, so whoever sees the agent dormant
    /// (a `status`, a wake) also sees it counted.
    pub(crate) fn passivate(&self, me: ActorId, core: AgentCore, counted: impl FnOnce()) -> bool {
        let mut dormant = self.dormant_lock();
        let still_mine = matches!(&*self.state.borrow(), SlotState::Live(a, _) if a.get_id() == me);
        if still_mine {
            counted();
            *dormant = Some(core);
            self.set(SlotState::Dormant);
        }
        still_mine
    }

    /// Moves a `Live` agent whose actor is `actor` to `Restarting`, under the lock `passivate` takes,
    /// so an actor passivating at that moment either finished (the slot is `Dormant`) or gives up.
    /// Returns whether the slot was still that actor's.
    pub(crate) fn begin_restart(&self, actor: ActorId) -> bool {
        let _dormant = self.dormant_lock();
        let live = matches!(&*self.state.borrow(), SlotState::Live(a, _) if a.get_id() == actor);
        if live {
            self.set(SlotState::Restarting);
        }
        live
    }

    /// Takes the dormant core (the caller then spawns its actor), or `None` if another caller did.
    pub(crate) fn take_dormant(&self) -> Option<AgentCore> {
        let mut dormant = self.dormant_lock();
        let core = dormant.take();
        if core.is_some() {
            self.set(SlotState::Waking);
        }
        core
    }

    /// Reads the dormant core, if the agent is dormant.
    pub(crate) fn with_dormant<T>(&self, f: impl FnOnce(&AgentCore) -> T) -> Option<T> {
        self.dormant_lock().as_ref().map(f)
    }
}
