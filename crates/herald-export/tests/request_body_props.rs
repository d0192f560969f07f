//! The body of `POST /v1/exports` is untrusted input: no body panics, and a
//! rejected one is told which field is wrong. Fuzzed longer under `fuzz/`.

use herald_export::{ExportError, ExportRequest};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_parse_or_fail_typed(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        match ExportRequest::from_json(&bytes) {
            Ok(request) => { let _ = request.fingerprint(); }
            Err(ExportError::Invalid(reason)) => prop_assert!(!reason.is_empty()),
            Err(other) => prop_assert!(false, "not a validation error: {other}"),
        }
    }

    #[test]
    fn a_wrong_field_is_named(format in "[a-z]{0,6}", query in "\\PC{0,10}", number in any::<i64>(), pick in 0..5u8) {
        let body = match pick {
            0 => serde_json::json!({"format": format, "query": "q"}),
            1 => serde_json::json!({"format": "csv", "query": query, "extra": 1}),
            2 => serde_json::json!({"format": number, "query": query}),
            3 => serde_json::json!({"format": "csv", "query": number}),
            _ => serde_json::json!({"format": "csv"}),
        };
        if let Err(ExportError::Invalid(reason)) = ExportRequest::from_json(body.to_string().as_bytes()) {
            let named = match pick { 0 | 2 => "format", 1 => "extra", _ => "query" };
            prop_assert!(reason.starts_with(named), "{reason}");
        } else {
            prop_assert!(pick == 0 && (format == "csv" || format == "json"), "accepted {body}");
        }
    }
}
