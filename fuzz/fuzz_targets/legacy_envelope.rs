//! Arbitrary bytes as the legacy JSON envelope (a record without `ce_*` headers).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(event) = herald_envelope::legacy::decode_legacy(bytes) {
        let _ = event.data_as::<herald_envelope::ExportCompleted>();
    }
});
