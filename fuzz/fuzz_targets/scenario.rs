//! libFuzzer target `scenario`: see `dsh_fuzz::scenario`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::scenario(data));
