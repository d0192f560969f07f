//! Property tests of every decoder that reads bytes off a topic: no input
//! panics, and a malformed record gets a typed error that names the field.
//! The same decoders are fuzzed under `fuzz/` for longer runs.

use herald_envelope::legacy::{decode_legacy, to_legacy_json};
use herald_envelope::schema::FILES;
use herald_envelope::{
    EnvelopeError, EventData, EventKey, ExportCompleted, ExportCompletedV1, ExportDeleted, ExportFailed, ExportRequested, SOURCE_EXPORTS,
    decode_any,
};
use proptest::prelude::*;
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage, Timestamp};

fn completed(job: String, size: i64, version: i64) -> ExportCompleted {
    ExportCompleted {
        job_id: job,
        caller: "alice".into(),
        format: "csv".into(),
        query: "q".into(),
        result_id: "r".into(),
        size_bytes: size,
        sha256: "00".into(),
        completed_at_ms: 1,
        version,
        content_type: "text/csv".into(),
    }
}

fn field_names(file: &str) -> Vec<String> {
    let text = FILES.iter().find(|(f, _)| *f == file).expect("embedded").1;
    let json: serde_json::Value = serde_json::from_str(text).expect("json");
    json["fields"].as_array().expect("fields").iter().map(|f| f["name"].as_str().expect("name").to_owned()).collect()
}

/// A data error names one of the writer schema's fields, or says the datum
/// had bytes left over.
fn names_a_field(err: &EnvelopeError, file: &str) -> bool {
    let EnvelopeError::Data { reason, .. } = err else { return false };
    reason.contains("trailing bytes") || field_names(file).iter().any(|f| reason.contains(&format!("field `{f}`")))
}

const HEADER_NAMES: &[&str] =
    &["ce_id", "ce_source", "ce_type", "ce_specversion", "ce_subject", "ce_time", "ce_dataschema", "content-type"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_bytes_against_any_schema_decode_or_name_the_field(pick in 0..FILES.len(), bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let file = FILES[pick].0;
        // Every reader type, whatever the writer: never a panic.
        let _ = ExportRequested::from_avro(file, &bytes);
        let _ = ExportCompletedV1::from_avro(file, &bytes);
        let _ = ExportFailed::from_avro(file, &bytes);
        let _ = ExportDeleted::from_avro(file, &bytes);
        if file.starts_with("export.completed") {
            if let Err(e) = ExportCompleted::from_avro(file, &bytes) {
                prop_assert!(names_a_field(&e, file), "{e}");
            }
        }
    }

    #[test]
    fn a_cut_datum_names_the_field_it_was_cut_in(job in "[a-z0-9-]{0,20}", size in any::<i64>(), version in any::<i64>(), cut in 0usize..200) {
        let bytes = completed(job, size, version).to_avro().expect("encode");
        let cut = cut % bytes.len();
        let err = ExportCompleted::from_avro(ExportCompleted::SCHEMA_FILE, &bytes[..cut]).expect_err("truncated");
        prop_assert!(names_a_field(&err, ExportCompleted::SCHEMA_FILE), "{err}");
    }

    #[test]
    fn any_headers_and_value_decode_or_fail_typed(
        headers in proptest::collection::vec((0..HEADER_NAMES.len() + 1, "[ -~]{0,12}", proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24))), 0..10),
        value in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
    ) {
        let mut owned = OwnedHeaders::new();
        for (pick, free, v) in &headers {
            let key = HEADER_NAMES.get(*pick).copied().unwrap_or(free.as_str());
            owned = owned.insert(Header { key, value: v.as_deref() });
        }
        let msg = OwnedMessage::new(value, None, "t".into(), Timestamp::NotAvailable, 0, 0, Some(owned));
        match decode_any(&msg) {
            Ok(event) => { let _ = event.data_as::<ExportCompleted>(); }
            Err(EnvelopeError::MissingAttribute(name)) => prop_assert!(!name.is_empty()),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn any_bytes_as_legacy_envelope_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        let _ = decode_legacy(&bytes);
    }

    #[test]
    fn legacy_envelope_missing_a_data_field_names_it(drop in 0usize..9) {
        let key = EventKey { source: SOURCE_EXPORTS.into(), id: "e-1".into() };
        let body = to_legacy_json(&key, "herald-exports", "job", &completed("job".into(), 1, 1)).expect("legacy");
        let mut json: serde_json::Value = serde_json::from_slice(&body).expect("json");
        // content_type (v2) has a default; the nine v1 fields do not.
        let field = field_names(ExportCompletedV1::SCHEMA_FILE)[drop].clone();
        json["data"].as_object_mut().expect("data").remove(&field);
        let err = decode_legacy(&serde_json::to_vec(&json).expect("json")).expect_err("missing field");
        prop_assert!(matches!(err, EnvelopeError::Data { .. }), "{err}");
        prop_assert!(err.to_string().contains(&format!("`{field}`")), "{err}");
    }
}
