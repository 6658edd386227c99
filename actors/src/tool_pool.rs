//! `ToolPoolActor`: the supervisor of one agent's running tool calls, and `ToolCallActor`, one linked
//! actor per running call.
//!
//! The agent's core decides which call runs when (cap, barriers, model-order commit); the pool only
//! runs what it is told and reports each outcome as `AgentMsg::ToolFinished`. Every way a call can end
//! becomes a result the model sees: the tool's own output, a timeout error, a panic (`ActorFailed` of
//! the call actor) as an error, and — after a cancel — a kill once the grace period is over, reported
//! as an aborted result.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dsh::tools::{Tool, ToolInvocation, ToolOutput};
use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio_util::sync::CancellationToken;

use crate::agent::msg::AgentMsg;

pub(crate) enum PoolMsg {
    /// Run one call's body.
    Run {
        ticket: u64,
        idx: usize,
        invocation: ToolInvocation,
        tool: Arc<dyn Tool>,
        cancel: CancellationToken,
    },
    /// Signal every running call of batch `ticket`; kill the rest after the grace period.
    Cancel {
        ticket: u64,
    },
    GraceExpired {
        ticket: u64,
    },
    /// Test-only: make the pool fail as a bug would.
    #[cfg(feature = "fault-injection")]
    Panic,
    /// A call actor finished its body.
    Done {
        ticket: u64,
        idx: usize,
        output: ToolOutput,
    },
}

pub(crate) struct ToolPoolActor;

pub(crate) struct ToolPoolArgs {
    pub(crate) agent: ActorRef<AgentMsg>,
    pub(crate) grace: Duration,
    pub(crate) timeout: Duration,
}

struct Running {
    ticket: u64,
    idx: usize,
    actor: ActorRef<()>,
    cancel: CancellationToken,
}

pub(crate) struct PoolState {
    args: ToolPoolArgs,
    /// Invariant: a call is here until exactly one outcome was reported for it.
    running: HashMap<ActorId, Running>,
}

impl PoolState {
    fn report(&mut self, id: ActorId, output: ToolOutput) {
        if let Some(call) = self.running.remove(&id) {
            let _ = self.args.agent.cast(AgentMsg::ToolFinished {
                ticket: call.ticket,
                idx: call.idx,
                output,
            });
        }
    }
}

impl Actor for ToolPoolActor {
    type Msg = PoolMsg;
    type State = PoolState;
    type Arguments = ToolPoolArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<PoolMsg>,
        args: ToolPoolArgs,
    ) -> Result<PoolState, ActorProcessingErr> {
        Ok(PoolState {
            args,
            running: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<PoolMsg>,
        msg: PoolMsg,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            PoolMsg::Run {
                ticket,
                idx,
                invocation,
                tool,
                cancel,
            } => {
                let args = ToolCallArgs {
                    ticket,
                    idx,
                    invocation,
                    tool,
                    cancel: cancel.clone(),
                    pool: myself.clone(),
                    timeout: state.args.timeout,
                };
                let (actor, _) =
                    Actor::spawn_linked(None, ToolCallActor, args, myself.get_cell()).await?;
                state.running.insert(
                    actor.get_id(),
                    Running {
                        ticket,
                        idx,
                        actor,
                        cancel,
                    },
                );
            }
            PoolMsg::Cancel { ticket } => {
                let mut any = false;
                for call in state.running.values().filter(|c| c.ticket == ticket) {
                    call.cancel.cancel();
                    any = true;
                }
                if any {
                    myself.send_after(state.args.grace, move || PoolMsg::GraceExpired { ticket });
                }
            }
            PoolMsg::GraceExpired { ticket } => {
                let late: Vec<ActorId> = state
                    .running
                    .iter()
                    .filter(|(_, c)| c.ticket == ticket)
                    .map(|(id, _)| *id)
                    .collect();
                for id in late {
                    if let Some(call) = state.running.get(&id) {
                        call.actor.kill();
                    }
                    state.report(
                        id,
                        ToolOutput::aborted(Some(
                            "it did not stop within the grace period and was killed",
                        )),
                    );
                }
            }
            #[cfg(feature = "fault-injection")]
            PoolMsg::Panic => panic!("tool pool: injected fault"),
            PoolMsg::Done {
                ticket,
                idx,
                output,
            } => {
                let id = state
                    .running
                    .iter()
                    .find(|(_, c)| c.ticket == ticket && c.idx == idx)
                    .map(|(id, _)| *id);
                if let Some(id) = id {
                    state.report(id, output);
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<PoolMsg>,
        event: SupervisionEvent,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        // Never stop the pool because a call ended (ractor's default would).
        match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                state.report(cell.get_id(), ToolOutput::panicked(err));
            }
            SupervisionEvent::ActorTerminated(cell, _, Some(reason)) if reason == "killed" => {
                state.report(cell.get_id(), ToolOutput::aborted(None));
            }
            // A normal stop follows the call's `Done`, which may still be queued behind this
            // (supervision events overtake messages): nothing to report here.
            _ => {}
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<PoolMsg>,
        state: &mut PoolState,
    ) -> Result<(), ActorProcessingErr> {
        for call in state.running.values() {
            call.cancel.cancel();
            call.actor.kill();
        }
        Ok(())
    }
}

struct ToolCallActor;

struct ToolCallArgs {
    ticket: u64,
    idx: usize,
    invocation: ToolInvocation,
    tool: Arc<dyn Tool>,
    cancel: CancellationToken,
    pool: ActorRef<PoolMsg>,
    timeout: Duration,
}

impl Actor for ToolCallActor {
    type Msg = ();
    type State = Option<ToolCallArgs>;
    type Arguments = ToolCallArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<()>,
        args: ToolCallArgs,
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
        let ToolCallArgs {
            ticket,
            idx,
            invocation,
            tool,
            cancel,
            pool,
            timeout,
        } = args;
        // A panic in the body fails this actor; the pool turns it into an error result.
        let output =
            match tokio::time::timeout(timeout, tool.execute(invocation, cancel.clone())).await {
                Ok(output) => output,
                Err(_) => {
                    cancel.cancel();
                    ToolOutput::timed_out(timeout.as_millis())
                }
            };
        let _ = pool.cast(PoolMsg::Done {
            ticket,
            idx,
            output,
        });
        myself.stop(None);
        Ok(())
    }
}
