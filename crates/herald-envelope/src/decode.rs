//! Kafka record → validated Herald event. Every byte on a topic is untrusted.

use std::collections::BTreeMap;
use std::sync::Arc;

use apache_avro::Schema;
use chrono::{DateTime, Utc};
use rdkafka::message::Message;

use crate::binary::{self, Attributes};
use crate::event::{AVRO_CONTENT_TYPE, JSON_CONTENT_TYPE};
use crate::event::{TRACEPARENT, TRACESTATE};
use crate::{EnvelopeError, EventData, EventKey, Registry, TraceContext, schema};

/// A CloudEvent read from Kafka whose attributes Herald has checked.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedEvent {
    pub key: EventKey,
    pub event_type: String,
    pub subject: Option<String>,
    pub time: Option<DateTime<Utc>>,
    /// File under `schemas/` the writer used (its `dataschema`); empty for
    /// JSON data.
    pub schema_file: String,
    /// That file's schema, from the registry the record was decoded with;
    /// `None` for JSON data (`application/json`), which needs none.
    pub writer: Option<Arc<Schema>>,
    pub data: Vec<u8>,
    /// The trace the event was written in (`ce_traceparent`); `None` when
    /// absent or malformed.
    pub trace: Option<TraceContext>,
    /// Its other CloudEvents extension attributes, as text.
    pub extensions: BTreeMap<String, String>,
}

impl DecodedEvent {
    /// The data as `T`: Avro resolved from the writer's schema into `T`'s,
    /// or JSON deserialized.
    pub fn data_as<T: EventData>(&self) -> Result<T, EnvelopeError> {
        match &self.writer {
            Some(writer) => T::from_avro_with(writer, &self.schema_file, &self.data),
            None => self.json_as(),
        }
    }

    /// The data as JSON whatever its encoding: Avro decoded with the
    /// writer's schema (records become objects), JSON as is. What
    /// configuration (notification templates) reads fields from.
    pub fn data_json(&self) -> Result<serde_json::Value, EnvelopeError> {
        let Some(writer) = &self.writer else { return self.json_as() };
        crate::data::bound_allocations();
        let err = |reason: String| EnvelopeError::Data { schema: self.schema_file.clone(), reason };
        let reader = crate::data::datum_reader(writer, None).map_err(|e| err(e.to_string()))?;
        let value = reader.read_value(&mut &self.data[..]).map_err(|e| err(e.to_string()))?;
        serde_json::Value::try_from(value).map_err(|e| err(e.to_string()))
    }

    /// JSON data (`application/json`) as any deserializable `T`: what an
    /// application's own event types use, with no schema in Herald.
    pub fn json_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, EnvelopeError> {
        if self.writer.is_some() {
            return Err(invalid("datacontenttype", format!("`{AVRO_CONTENT_TYPE}`, expected `{JSON_CONTENT_TYPE}`")));
        }
        serde_json::from_slice(&self.data).map_err(|e| EnvelopeError::Data { schema: JSON_CONTENT_TYPE.to_owned(), reason: e.to_string() })
    }
}

/// Decodes a Kafka record in CloudEvents binary mode, knowing the schemas
/// compiled into this build.
pub fn decode_record(msg: &impl Message) -> Result<DecodedEvent, EnvelopeError> {
    decode_record_with(msg, &Registry::embedded())
}

/// Decodes a Kafka record in CloudEvents binary mode; its `dataschema` must
/// name a schema of `registry`, or the error is `unknown schema <file>`.
pub fn decode_record_with(msg: &impl Message, registry: &Registry) -> Result<DecodedEvent, EnvelopeError> {
    validate(binary::attributes(msg)?, msg.payload(), registry)
}

fn validate(attributes: Attributes<'_>, payload: Option<&[u8]>, registry: &Registry) -> Result<DecodedEvent, EnvelopeError> {
    let id = non_empty("id", attributes.id)?;
    let source = non_empty("source", attributes.source)?;
    let event_type = non_empty("type", attributes.ty)?;
    let (schema_file, writer, data) = match attributes.datacontenttype {
        Some(AVRO_CONTENT_TYPE) => {
            let dataschema = attributes.dataschema.as_deref().ok_or(EnvelopeError::MissingAttribute("dataschema"))?;
            let schema_file = schema::file_of_dataschema(dataschema)?.to_owned();
            let writer = registry.get(&schema_file)?.clone();
            let data = payload.ok_or(EnvelopeError::MissingAttribute("data"))?.to_vec();
            (schema_file, Some(writer), data)
        }
        Some(JSON_CONTENT_TYPE) => (String::new(), None, json_data(payload)?),
        Some(other) => {
            return Err(invalid("datacontenttype", format!("`{other}`, expected `{AVRO_CONTENT_TYPE}` or `{JSON_CONTENT_TYPE}`")));
        }
        None => return Err(EnvelopeError::MissingAttribute("datacontenttype")),
    };
    let extension = |name: &str| attributes.extensions.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    let trace = extension(TRACEPARENT).and_then(|parent| TraceContext::parse(parent, extension(TRACESTATE)));
    let extensions = attributes
        .extensions
        .iter()
        .filter(|(name, _)| *name != TRACEPARENT && *name != TRACESTATE)
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    Ok(DecodedEvent {
        key: EventKey { source, id },
        event_type,
        subject: attributes.subject.map(str::to_owned),
        time: attributes.time,
        schema_file,
        writer,
        data,
        trace,
        extensions,
    })
}

/// The bytes of JSON data, checked to be one JSON value (a record whose
/// data is not what its content type says is refused, like bad Avro).
fn json_data(payload: Option<&[u8]>) -> Result<Vec<u8>, EnvelopeError> {
    let bytes = payload.ok_or(EnvelopeError::MissingAttribute("data"))?;
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(|e| invalid("data", format!("not JSON: {e}")))?;
    Ok(bytes.to_vec())
}

fn non_empty(name: &'static str, value: Option<&str>) -> Result<String, EnvelopeError> {
    match value {
        Some(text) if !text.is_empty() => Ok(text.to_owned()),
        _ => Err(EnvelopeError::MissingAttribute(name)),
    }
}

fn invalid(name: &'static str, reason: String) -> EnvelopeError {
    EnvelopeError::InvalidAttribute { name, reason }
}

#[cfg(test)]
mod sdk_reference;

#[cfg(test)]
pub(crate) mod tests {
    use chrono::TimeZone;
    use rdkafka::message::{Headers, OwnedMessage, Timestamp};

    use super::*;
    use crate::{ExportCompleted, OutboxEvent};

    pub(crate) fn completed() -> ExportCompleted {
        ExportCompleted {
            job_id: "job-1".into(),
            caller: "alice".into(),
            format: "json".into(),
            query: "q".into(),
            result_id: "r".into(),
            size_bytes: 3,
            sha256: "00".into(),
            completed_at_ms: 5,
            version: 2,
            content_type: "application/json".into(),
        }
    }

    /// What a consumer would receive for `event`, built without a broker
    /// through the binding's own producer path.
    fn received(event: &OutboxEvent) -> OwnedMessage {
        use cloudevents::binding::rdkafka::FutureRecordExt;
        let record = event.to_kafka_record().unwrap();
        let produced = rdkafka::producer::FutureRecord::<str, Vec<u8>>::to("t").message_record(&record);
        OwnedMessage::new(
            produced.payload.cloned(),
            Some(b"job-1".to_vec()),
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            produced.headers.clone(),
        )
    }

    pub(crate) fn event() -> OutboxEvent {
        let time = Utc.with_ymd_and_hms(2026, 11, 29, 8, 0, 0).unwrap();
        OutboxEvent::new("export.events", "job-1", &completed(), time).unwrap()
    }

    #[test]
    fn binary_mode_round_trip_keeps_identity_and_data() {
        let event = event();
        let decoded = decode_record(&received(&event)).unwrap();
        assert_eq!(decoded.key, event.key());
        assert_eq!(decoded.event_type, "herald.export.completed");
        assert_eq!(decoded.subject.as_deref(), Some("job-1"));
        assert_eq!(decoded.time, Some(event.time));
        assert_eq!(decoded.data_as::<ExportCompleted>().unwrap(), completed());
    }

    /// An application's JSON event (the outbox contract): no schema, its
    /// extensions kept, its data read as the application's own type; data
    /// that is not JSON is refused.
    #[test]
    fn json_data_round_trips_and_non_json_is_refused() {
        #[derive(Debug, PartialEq, serde::Deserialize)]
        struct Placed {
            order_id: String,
            total_cents: i64,
        }
        let avro = event();
        let mut event = avro.clone();
        event.source = "/shop/orders".into();
        event.event_type = "shop.order.placed".into();
        event.schema_file = String::new();
        event.content_type = JSON_CONTENT_TYPE.into();
        event.extensions.insert("tenant".into(), "acme".into());
        event.data = br#"{"order_id":"o-1","total_cents":4200}"#.to_vec();
        let msg = received(&event);
        let header = |name: &str| msg.headers().unwrap().iter().find(|h| h.key == name).and_then(|h| h.value).map(<[u8]>::to_vec);
        assert_eq!(header("ce_tenant").as_deref(), Some(&b"acme"[..]));
        assert_eq!(header("ce_dataschema"), None);
        let decoded = decode_record(&msg).unwrap();
        assert_eq!(decoded.json_as::<Placed>().unwrap(), Placed { order_id: "o-1".into(), total_cents: 4200 });
        assert_eq!(decoded.extensions.get("tenant").map(String::as_str), Some("acme"));
        assert_eq!(decoded.data_json().unwrap()["total_cents"], 4200);
        let avro_json = decode_record(&received(&avro)).unwrap().data_json().unwrap();
        assert_eq!((avro_json["caller"].as_str(), avro_json["size_bytes"].as_i64()), (Some("alice"), Some(3)));
        assert!(decoded.writer.is_none() && decoded.schema_file.is_empty());
        assert!(decode_record(&received(&avro)).unwrap().json_as::<Placed>().is_err(), "Avro is not JSON");

        event.data = b"{not json".to_vec();
        let err = decode_record(&received(&event)).unwrap_err();
        assert!(err.to_string().contains("not JSON"), "{err}");
    }

    #[test]
    fn headers_are_ce_prefixed_binary_mode() {
        let msg = received(&event());
        let headers = msg.headers().unwrap();
        let names: Vec<&str> = headers.iter().map(|h| h.key).collect();
        for expected in ["ce_id", "ce_source", "ce_type", "ce_specversion", "ce_subject", "ce_time", "ce_dataschema", "content-type"] {
            assert!(names.contains(&expected), "{expected} missing from {names:?}");
        }
    }

    #[test]
    fn trace_context_travels_as_ce_traceparent_and_back() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = event().with_trace(TraceContext::parse(parent, Some("vendor=x")));
        let msg = received(&traced);
        let header = |name: &str| msg.headers().unwrap().iter().find(|h| h.key == name).and_then(|h| h.value).map(<[u8]>::to_vec);
        assert_eq!(header("ce_traceparent").as_deref(), Some(parent.as_bytes()));
        assert_eq!(header("ce_tracestate").as_deref(), Some(&b"vendor=x"[..]));
        assert_eq!(decode_record(&msg).unwrap().trace, traced.trace);
        assert_eq!(decode_record(&received(&event())).unwrap().trace, None, "no context, no headers");
    }

    #[test]
    fn a_malformed_ce_traceparent_is_ignored_not_refused() {
        let mut untraced = received(&event());
        let mut headers = rdkafka::message::OwnedHeaders::new();
        for h in untraced.headers().unwrap().iter() {
            headers = headers.insert(rdkafka::message::Header { key: h.key, value: h.value });
        }
        headers = headers.insert(rdkafka::message::Header { key: "ce_traceparent", value: Some(&b"00-nope"[..]) });
        untraced = untraced.replace_headers(Some(headers));
        let decoded = decode_record(&untraced).expect("the event is still valid");
        assert_eq!(decoded.trace, None);
    }

    fn with_headers(headers: &[(&str, Option<&[u8]>)], value: Option<Vec<u8>>) -> OwnedMessage {
        let mut owned = rdkafka::message::OwnedHeaders::new();
        for (key, value) in headers {
            owned = owned.insert(rdkafka::message::Header { key, value: *value });
        }
        OwnedMessage::new(value, None, "t".into(), Timestamp::NotAvailable, 0, 0, Some(owned))
    }

    /// Regression (proptest, `headers = [(0, "", None)]`): the binding
    /// unwrapped the missing value and panicked.
    #[test]
    fn header_without_value_is_a_typed_error_not_a_panic() {
        let msg = with_headers(&[("ce_id", None)], None);
        let err = decode_record(&msg).unwrap_err();
        assert_eq!(err.to_string(), "not a CloudEvent in Kafka binary mode: header `ce_id` has no value");
    }

    /// Regression: a structured-mode content type without a value made the
    /// binding unwrap the missing payload.
    #[test]
    fn structured_mode_is_refused_naming_content_type() {
        let msg = with_headers(&[("ce_specversion", Some(b"1.0")), ("content-type", Some(b"application/cloudevents+json"))], None);
        assert!(matches!(decode_record(&msg), Err(EnvelopeError::InvalidAttribute { name: "content-type", .. })));
    }

    #[test]
    fn record_without_headers_is_not_a_cloudevent() {
        let msg = OwnedMessage::new(Some(b"{}".to_vec()), None, "t".into(), Timestamp::NotAvailable, 0, 0, None);
        assert!(matches!(decode_record(&msg), Err(EnvelopeError::NotCloudEvent(_))));
    }
}
