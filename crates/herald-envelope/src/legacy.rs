//! The legacy envelope, and the normalisation that gives a legacy record the
//! same identity as its CloudEvents form.
//!
//! An older producer of ours wrote facts as one JSON object in the record
//! value and no `ce_*` headers:
//!
//! ```json
//! {"event_id": "0193…", "event_source": "herald-exports",
//!  "event_type": "herald.export.completed", "subject": "job-1",
//!  "event_time_ms": 1764403200000, "data": {"job_id": "job-1", …}}
//! ```
//!
//! `data` is the JSON object of the fields of the event type's data (the
//! record of its Avro schema); `subject` and `event_time_ms` are optional.
//! Normalisation: `id` = `event_id` verbatim; `source` = [`SOURCE_ALIASES`]
//! maps the legacy service names to the CloudEvents `source`, and a value that
//! already is an absolute-path URI-reference is kept; anything else is
//! refused (a guess would create a second identity for one fact). The data is
//! re-encoded as the Avro datum of the current schema, so handlers see one
//! shape whichever envelope carried the fact.

use rdkafka::message::{Headers, Message};
use serde::Deserialize;

use crate::{
    DecodedEvent, EnvelopeError, EventData, EventKey, ExportCompleted, ExportDeleted, ExportFailed, ExportRequested, Registry,
    SOURCE_EXPORTS, decode_record_with,
};

/// Legacy `event_source` values and the CloudEvents `source` each stands for.
/// Inbox rows keyed by an alias are rewritten to the canonical source at
/// subscription start (`herald_store::inbox::normalise_legacy_sources`).
pub const SOURCE_ALIASES: &[(&str, &str)] = &[("herald-exports", SOURCE_EXPORTS), ("urn:herald:exports", SOURCE_EXPORTS)];

#[derive(Debug, Deserialize)]
struct LegacyEnvelope {
    event_id: String,
    event_source: String,
    event_type: String,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    event_time_ms: Option<i64>,
    data: serde_json::Value,
}

/// Decodes a record in either envelope: CloudEvents binary mode when it has
/// `ce_*` headers, the legacy JSON envelope otherwise.
pub fn decode_any(msg: &impl Message) -> Result<DecodedEvent, EnvelopeError> {
    decode_any_with(msg, &Registry::embedded())
}

/// [`decode_any`] with the writer schemas of `registry`.
pub fn decode_any_with(msg: &impl Message, registry: &Registry) -> Result<DecodedEvent, EnvelopeError> {
    let has_ce = msg.headers().is_some_and(|h| h.iter().any(|h| h.key.starts_with("ce_")));
    let event = if has_ce {
        decode_record_with(msg, registry)?
    } else {
        let value = msg.payload().ok_or_else(|| EnvelopeError::NotCloudEvent("no ce_* headers and no value".into()))?;
        decode_legacy(value)?
    };
    registry.sources().check(&event.key.source)?;
    Ok(event)
}

/// Decodes and normalises a legacy envelope.
pub fn decode_legacy(value: &[u8]) -> Result<DecodedEvent, EnvelopeError> {
    let legacy: LegacyEnvelope =
        serde_json::from_slice(value).map_err(|e| EnvelopeError::Legacy(format!("no ce_* headers and not a legacy JSON envelope: {e}")))?;
    if legacy.event_id.is_empty() {
        return Err(EnvelopeError::MissingAttribute("event_id"));
    }
    let source = normalise_source(&legacy.event_source)?;
    let (schema_file, data) = avro_of(&legacy.event_type, legacy.data)?;
    // Re-encoded with a schema of this build, so the writer is always known.
    let writer = Registry::embedded().get(schema_file)?.clone();
    Ok(DecodedEvent {
        key: EventKey { source, id: legacy.event_id },
        event_type: legacy.event_type,
        subject: legacy.subject,
        time: legacy.event_time_ms.and_then(chrono::DateTime::from_timestamp_millis),
        schema_file: schema_file.to_owned(),
        writer: Some(writer),
        data,
        // The legacy envelope has no place for trace context or extensions.
        trace: None,
        extensions: Default::default(),
    })
}

/// The CloudEvents `source` of a legacy `event_source`.
pub fn normalise_source(legacy: &str) -> Result<String, EnvelopeError> {
    if let Some((_, canonical)) = SOURCE_ALIASES.iter().find(|(alias, _)| *alias == legacy) {
        return Ok((*canonical).to_owned());
    }
    if legacy.starts_with('/') && legacy.len() > 1 {
        return Ok(legacy.to_owned());
    }
    Err(EnvelopeError::InvalidAttribute { name: "event_source", reason: format!("`{legacy}` has no known CloudEvents source") })
}

fn avro_of(event_type: &str, data: serde_json::Value) -> Result<(&'static str, Vec<u8>), EnvelopeError> {
    match event_type {
        ExportCompleted::EVENT_TYPE => encode::<ExportCompleted>(data),
        ExportRequested::EVENT_TYPE => encode::<ExportRequested>(data),
        ExportFailed::EVENT_TYPE => encode::<ExportFailed>(data),
        ExportDeleted::EVENT_TYPE => encode::<ExportDeleted>(data),
        other => Err(EnvelopeError::Legacy(format!("legacy event type `{other}` is unknown"))),
    }
}

fn encode<T: EventData>(data: serde_json::Value) -> Result<(&'static str, Vec<u8>), EnvelopeError> {
    let typed: T =
        serde_json::from_value(data).map_err(|e| EnvelopeError::Data { schema: T::SCHEMA_FILE.to_owned(), reason: e.to_string() })?;
    Ok((T::SCHEMA_FILE, typed.to_avro()?))
}

/// The legacy envelope of the fact `key.id`, as the older producer wrote it
/// (its `source` spelled `legacy_source`): for tests and tools that must
/// produce the same fact in the old shape.
pub fn to_legacy_json<T: EventData>(key: &EventKey, legacy_source: &str, subject: &str, data: &T) -> Result<Vec<u8>, EnvelopeError> {
    let data = serde_json::to_value(data).map_err(|e| EnvelopeError::Legacy(e.to_string()))?;
    let body = serde_json::json!({
        "event_id": key.id,
        "event_source": legacy_source,
        "event_type": T::EVENT_TYPE,
        "subject": subject,
        "data": data,
    });
    serde_json::to_vec(&body).map_err(|e| EnvelopeError::Legacy(e.to_string()))
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use rdkafka::message::{OwnedMessage, Timestamp};

    use super::*;
    use crate::OutboxEvent;

    fn completed() -> ExportCompleted {
        ExportCompleted {
            job_id: "job-7".into(),
            caller: "alice".into(),
            format: "csv".into(),
            query: "q".into(),
            result_id: "r".into(),
            size_bytes: 9,
            sha256: "00".into(),
            completed_at_ms: 5,
            version: 2,
            content_type: "text/csv".into(),
        }
    }

    fn record(value: Vec<u8>) -> OwnedMessage {
        OwnedMessage::new(Some(value), Some(b"job-7".to_vec()), "t".into(), Timestamp::NotAvailable, 0, 0, None)
    }

    #[test]
    fn legacy_record_normalises_to_the_cloudevent_identity() {
        let event = OutboxEvent::new("t", "job-7", &completed(), Utc::now()).unwrap();
        let value = to_legacy_json(&event.key(), "herald-exports", "job-7", &completed()).unwrap();
        let decoded = decode_any(&record(value)).unwrap();
        assert_eq!(decoded.key, event.key());
        assert_eq!(decoded.event_type, ExportCompleted::EVENT_TYPE);
        assert_eq!(decoded.data, event.data, "same Avro datum as the CloudEvents form");
        assert_eq!(decoded.data_as::<ExportCompleted>().unwrap(), completed());
    }

    #[test]
    fn unknown_legacy_source_is_refused_not_guessed() {
        let key = EventKey { source: SOURCE_EXPORTS.into(), id: "x".into() };
        let value = to_legacy_json(&key, "some-other-service", "job-7", &completed()).unwrap();
        assert!(matches!(decode_any(&record(value)), Err(EnvelopeError::InvalidAttribute { name: "event_source", .. })));
    }

    #[test]
    fn garbage_without_headers_is_a_typed_error() {
        assert!(matches!(decode_any(&record(b"\x00\x01not json".to_vec())), Err(EnvelopeError::Legacy(_))));
        let missing_data =
            br#"{"event_id":"1","event_source":"herald-exports","event_type":"herald.export.completed","data":{"job_id":"j"}}"#;
        assert!(matches!(decode_any(&record(missing_data.to_vec())), Err(EnvelopeError::Data { .. })));
    }
}
