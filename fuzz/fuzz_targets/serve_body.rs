//! libFuzzer target `serve_body`: see `dsh_fuzz::serve_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::serve_body(data));
