#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::http1_connection(data));
