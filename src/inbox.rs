//! PLACEHOLDER with the contract signatures; replaced by the pure-core branch.
use std::collections::VecDeque;
use std::sync::Arc;

use crate::ids::MessageId;
use crate::limits::Limits;
use crate::llm::types::Message;
use crate::session::event::{Event, InboxSpliced, InboxTarget};

#[derive(Debug, Clone, Default)]
pub struct Inbox {
    next_turn: VecDeque<Arc<Message>>,
    next_step: VecDeque<Arc<Message>>,
}
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error("x")]
    X,
}
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InboxError {
    #[error("x")]
    X,
}
impl Inbox {
    pub fn new() -> Inbox { Inbox::default() }
    pub fn rebuild(_events: &[Event], _from_seq: u64) -> Result<Inbox, InboxError> { todo!() }
    pub fn next_turn(&self) -> &VecDeque<Arc<Message>> { &self.next_turn }
    pub fn next_step(&self) -> &VecDeque<Arc<Message>> { &self.next_step }
    pub fn has_pending(&self) -> bool { todo!() }
    pub fn n_pending(&self) -> usize { todo!() }
    pub fn locate(&self, _id: &MessageId) -> Option<(InboxTarget, usize)> { todo!() }
    pub fn admit(_msg: &Message, _limits: &Limits) -> Result<(), AdmitError> { todo!() }
    pub fn plan_append(&self, _t: InboxTarget, _m: Arc<Message>, _l: &Limits) -> Result<InboxSpliced, AdmitError> { todo!() }
    pub fn plan_remove(&self, _id: &MessageId) -> Option<InboxSpliced> { todo!() }
    pub fn plan_replace(&self, _id: &MessageId, _m: Arc<Message>, _l: &Limits) -> Result<Option<InboxSpliced>, AdmitError> { todo!() }
    pub fn plan_clear(&self) -> Vec<InboxSpliced> { todo!() }
    pub fn plan_claim(&self, _at_turn_start: bool) -> (Vec<InboxSpliced>, Vec<Arc<Message>>) { todo!() }
    pub fn apply(&mut self, _s: &InboxSpliced) -> Result<Vec<Arc<Message>>, InboxError> { todo!() }
}
