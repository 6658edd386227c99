//! The surface: the ordered list of message-event seqs that forms the model-visible history.
//!
//! OWNER: session helper (issue 2, item 3).

/// The surface fold of one log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Surface {
    /// Seqs of current surface nodes, in model-visible order (not necessarily ascending).
    pub nodes: Vec<u64>,
    /// Number of committed replacements (starts at 0).
    pub replace_generation: u64,
}
