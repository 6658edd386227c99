//! libFuzzer target `session_id`: see `dsh_fuzz::session_id`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::session_id(data));
