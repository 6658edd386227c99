//! libFuzzer target `event_v0`: see `dsh_fuzz::event_v0`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::event_v0(data));
