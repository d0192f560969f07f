//! The decode as it was through cloudevents-sdk's binding, kept as the
//! reference `binary` is held to: for any record, both give the same event
//! or both refuse it (apart from CloudEvents 0.3, which only the SDK reads).

use cloudevents::binding::rdkafka::record_to_event;
use cloudevents::event::ExtensionValue;
use cloudevents::{AttributesReader, Data, Event};
use proptest::prelude::*;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage, Timestamp};

use super::tests::completed;
use super::*;
use crate::{ExportCompleted, OutboxEvent};

fn sdk_decode(msg: &impl Message, registry: &Registry) -> Result<DecodedEvent, EnvelopeError> {
    // The binding unwraps a header without a value and a structured-mode
    // value; Herald refused both before calling it.
    for h in msg.headers().into_iter().flat_map(|h| h.iter()) {
        let structured = h.key == "content-type" && h.value.is_some_and(|v| v.starts_with(b"application/cloudevents"));
        if h.value.is_none() || structured {
            return Err(EnvelopeError::NotCloudEvent("refused before the binding".into()));
        }
    }
    let event = record_to_event(msg).map_err(|e| EnvelopeError::NotCloudEvent(e.to_string()))?;
    sdk_validate(&event, registry)
}

fn sdk_validate(event: &Event, registry: &Registry) -> Result<DecodedEvent, EnvelopeError> {
    let id = non_empty("id", Some(event.id()))?;
    let source = non_empty("source", Some(event.source().as_str()))?;
    let event_type = non_empty("type", Some(event.ty()))?;
    let payload = match event.data() {
        Some(Data::Binary(bytes)) => Some(&bytes[..]),
        None => None,
        Some(_) => unreachable!("the Kafka binding reads data as bytes"),
    };
    let (schema_file, writer, data) = match event.datacontenttype() {
        Some(AVRO_CONTENT_TYPE) => {
            let dataschema = event.dataschema().ok_or(EnvelopeError::MissingAttribute("dataschema"))?;
            let schema_file = schema::file_of_dataschema(dataschema.as_str())?.to_owned();
            let writer = registry.get(&schema_file)?.clone();
            (schema_file, Some(writer), payload.ok_or(EnvelopeError::MissingAttribute("data"))?.to_vec())
        }
        Some(JSON_CONTENT_TYPE) => (String::new(), None, json_data(payload)?),
        Some(other) => return Err(invalid("datacontenttype", other.to_owned())),
        None => return Err(EnvelopeError::MissingAttribute("datacontenttype")),
    };
    let text = |name| match event.extension(name) {
        Some(ExtensionValue::String(s)) => Some(s.as_str()),
        _ => None,
    };
    Ok(DecodedEvent {
        key: EventKey { source, id },
        event_type,
        subject: event.subject().map(str::to_owned),
        time: event.time().copied(),
        schema_file,
        writer,
        data,
        trace: text(TRACEPARENT).and_then(|parent| TraceContext::parse(parent, text(TRACESTATE))),
        extensions: event
            .iter_extensions()
            .filter(|(name, _)| *name != TRACEPARENT && *name != TRACESTATE)
            .map(|(name, value)| (name.to_owned(), value.to_string()))
            .collect(),
    })
}

/// Header names a record may carry: every attribute, extensions, Herald's
/// trace context, near misses.
const NAMES: &[&str] = &[
    "ce_id",
    "ce_source",
    "ce_type",
    "ce_specversion",
    "ce_subject",
    "ce_time",
    "ce_dataschema",
    "ce_datacontenttype",
    "content-type",
    "ce_traceparent",
    "ce_tracestate",
    "ce_tenant",
    "ce_",
    "ce_ID",
    "traceparent",
    "x-other",
];

/// Values that mean something to some attribute, valid and not.
const VALUES: &[&str] = &[
    "",
    "e-1",
    "/herald/exports",
    "herald.export.completed",
    "1.0",
    "0.3",
    "2.0",
    "2026-11-29T08:00:00Z",
    "2026-11-29T08:00:00.123+02:00",
    "2026-11-29 08:00",
    "herald:schemas/export.completed.v2.avsc",
    "herald:schemas/export.completed.v1.avsc",
    "HERALD:schemas/export.completed.v2.avsc",
    "herald:schemas/export completed.v2.avsc",
    "https://Herald.Example/schemas/export.completed.v2.avsc",
    "https://herald.example/a/../schemas/export.completed.v1.avsc?x#y",
    "herald:schemas/",
    "not a url",
    "application/avro",
    "application/json",
    "text/plain",
    "application/cloudevents+json",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-nope",
    "vendor=x",
];

fn value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        8 => proptest::sample::select(VALUES).prop_map(|v| Some(v.as_bytes().to_vec())),
        2 => proptest::collection::vec(any::<u8>(), 0..8).prop_map(Some),
        1 => Just(None),
    ]
}

fn header() -> impl Strategy<Value = (String, Option<Vec<u8>>)> {
    let name = prop_oneof![9 => proptest::sample::select(NAMES).prop_map(str::to_owned), 1 => "[a-z_-]{0,6}"];
    (name, value())
}

fn payload() -> impl Strategy<Value = Option<Vec<u8>>> {
    let avro = completed().to_avro().expect("encode");
    prop_oneof![
        4 => Just(Some(avro)),
        2 => Just(Some(br#"{"order_id":"o-1"}"#.to_vec())),
        1 => proptest::collection::vec(any::<u8>(), 0..16).prop_map(Some),
        1 => Just(None),
    ]
}

/// The relay's own headers for one event, so that most cases start from a
/// record both readers accept and the changes decide.
fn relay_headers() -> Vec<(String, Option<Vec<u8>>)> {
    let time = chrono::DateTime::from_timestamp_millis(1_764_403_200_123).expect("time");
    let event = OutboxEvent::new("export.events", "job-1", &completed(), time).expect("event");
    let headers = event.to_kafka_headers_under(None).expect("headers");
    headers.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect()
}

fn record(headers: &[(String, Option<Vec<u8>>)], payload: Option<Vec<u8>>) -> OwnedMessage {
    let mut owned = OwnedHeaders::new();
    for (key, value) in headers {
        owned = owned.insert(Header { key: key.as_str(), value: value.as_deref() });
    }
    OwnedMessage::new(payload, None, "t".into(), Timestamp::NotAvailable, 0, 0, Some(owned))
}

fn last_specversion(headers: &[(String, Option<Vec<u8>>)]) -> Option<&[u8]> {
    headers.iter().rev().find(|(k, _)| k == "ce_specversion").and_then(|(_, v)| v.as_deref())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    #[test]
    fn herald_reads_what_the_sdk_reads_and_refuses_what_it_refuses(
        from_relay in any::<bool>(),
        changes in proptest::collection::vec(header(), 0..6),
        payload in payload(),
    ) {
        let mut headers = if from_relay { relay_headers() } else { Vec::new() };
        headers.extend(changes);
        let msg = record(&headers, payload);
        let registry = Registry::embedded();
        let ours = decode_record_with(&msg, &registry);
        if last_specversion(&headers) == Some(b"0.3") {
            prop_assert!(ours.is_err(), "0.3 is refused");
            return Ok(());
        }
        match (ours, sdk_decode(&msg, &registry)) {
            (Ok(ours), Ok(sdk)) => prop_assert_eq!(ours, sdk),
            (Err(_), Err(_)) => {}
            (ours, sdk) => prop_assert!(false, "headers {:?}: ours {:?}, the SDK's {:?}", headers, ours, sdk),
        }
    }
}

#[test]
fn the_relays_record_decodes_the_same_both_ways() {
    let msg = record(&relay_headers(), Some(completed().to_avro().unwrap()));
    let registry = Registry::embedded();
    let ours = decode_record_with(&msg, &registry).unwrap();
    assert_eq!(ours, sdk_decode(&msg, &registry).unwrap());
    assert_eq!(ours.data_as::<ExportCompleted>().unwrap(), completed());
}
