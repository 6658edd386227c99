//! libFuzzer target `dsh_toml`: see `dsh_fuzz::dsh_toml`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::dsh_toml(data));
