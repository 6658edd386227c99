//! `dsh-actors`: the dsh-rs runtime. A `Host` supervises many agents; each agent is an actor whose
//! mailbox is its inbox, with children for the LLM stream, the session writer and the tool pool. The
//! `dsh` binary (`main.rs`, `cli/`) drives it from the command line.
