//! The fuzz targets' bodies, one function per target (`fuzz_targets/NAME.rs` calls `NAME`). The same
//! file is compiled into the stable test `cli/tests/fuzz_corpus.rs`, which replays every saved corpus
//! file through these functions, so CI checks the corpora without libFuzzer.

#[path = "targets.rs"]
mod targets;

pub use targets::*;
