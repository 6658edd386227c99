//! libFuzzer target `sse_chunks`: see `dsh_fuzz::sse_chunks`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::sse_chunks(data));
