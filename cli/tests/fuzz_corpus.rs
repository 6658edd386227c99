//! Replays every saved fuzz corpus file (`fuzz/corpus/TARGET/*`, and regression inputs in
//! `fuzz/regressions/TARGET/*`) through the same functions the libFuzzer targets call
//! (`fuzz/src/targets.rs`, compiled here too), on the stable toolchain, so CI checks the corpora
//! without libFuzzer. A panic names the file. See RELIABILITY.md §4.

#[path = "../../fuzz/src/targets.rs"]
mod targets;

use std::path::PathBuf;

fn replay(target: &str, run: fn(&[u8])) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut n = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).expect("a corpus file reads");
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{target}: {} fails", file.display());
            n += 1;
        }
    }
    assert!(n > 0, "{target}: no corpus files under {}", root.display());
}

#[test]
fn event_v0_corpus() {
    replay("event_v0", targets::event_v0);
}

#[test]
fn import_plain_corpus() {
    replay("import_plain", targets::import_plain);
}

#[test]
fn import_zstd_corpus() {
    replay("import_zstd", targets::import_zstd);
}

#[test]
fn sse_chunks_corpus() {
    replay("sse_chunks", targets::sse_chunks);
}

#[test]
fn scenario_corpus() {
    replay("scenario", targets::scenario);
}

#[test]
fn dsh_toml_corpus() {
    replay("dsh_toml", targets::dsh_toml);
}

#[test]
fn session_id_corpus() {
    replay("session_id", targets::session_id);
}

#[test]
fn serve_body_corpus() {
    replay("serve_body", targets::serve_body);
}
