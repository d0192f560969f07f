//! Arbitrary bytes as the body of `POST /v1/exports`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(request) = herald_export::ExportRequest::from_json(bytes) {
        // What intake does next with an accepted body.
        let _ = request.fingerprint();
    }
});
