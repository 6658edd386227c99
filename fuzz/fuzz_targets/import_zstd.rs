//! libFuzzer target `import_zstd`: see `dsh_fuzz::import_zstd`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| dsh_fuzz::import_zstd(data));
