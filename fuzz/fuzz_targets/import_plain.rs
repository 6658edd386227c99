//! libFuzzer target `import_plain`: see `dsh_fuzz::import_plain`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::import_plain(data));
