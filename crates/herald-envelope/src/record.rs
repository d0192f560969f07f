//! The Kafka record headers of an outbox event, in CloudEvents binary
//! content mode, written directly.
//!
//! cloudevents-sdk's rdkafka binding gets there in three steps: build an
//! `Event` (copying every attribute and the data), walk it through its
//! binary serializer into a header list, and clone that list again for
//! every send. In a relay draining a backlog those steps were 17 % of the
//! process's CPU (BENCHMARKS.md, "Headers without the detour"). The relay
//! writes the same headers itself; the tests below pin them to what the
//! binding writes for every kind of event Herald publishes, so a consumer
//! decoding with the SDK (Herald's own `decode` does) sees no difference.

use std::cell::RefCell;
use std::rc::Rc;

use rdkafka::message::{Header, OwnedHeaders};

use crate::event::{TRACEPARENT, TRACESTATE, dataschema_of};
use crate::{EnvelopeError, OutboxEvent};

/// The binding's header for an attribute: `content-type` for the data's
/// media type, `ce_<name>` for everything else (extensions included).
fn header_name(attribute: &str) -> String {
    match attribute {
        "datacontenttype" => "content-type".to_owned(),
        name => format!("ce_{name}"),
    }
}

/// Schema URIs parsed on this thread, by schema file and base. Parsing
/// was a third of the headers' cost, and a relay sends the same few
/// schemas over and over; a writer's own URIs are bounded by
/// [`PARSED_URIS_KEPT`].
struct ParsedUri {
    file: String,
    base: Option<String>,
    uri: Rc<str>,
}

const PARSED_URIS_KEPT: usize = 64;

thread_local! {
    static PARSED_URIS: RefCell<Vec<ParsedUri>> = const { RefCell::new(Vec::new()) };
}

/// The `dataschema` URI of `schema_file` as the SDK's URL parser
/// normalises it (none when empty), or why it is not an absolute URL.
fn parsed_dataschema(schema_file: &str, base: Option<&str>) -> Result<Option<Rc<str>>, EnvelopeError> {
    let known = PARSED_URIS
        .with_borrow(|parsed| parsed.iter().find(|p| p.file == schema_file && p.base.as_deref() == base).map(|p| Rc::clone(&p.uri)));
    if known.is_some() {
        return Ok(known);
    }
    let Some(uri) = dataschema_of(schema_file, base) else { return Ok(None) };
    let parsed: Rc<str> = match url::Url::parse(&uri) {
        Ok(url) => url.as_str().into(),
        Err(e) => return Err(EnvelopeError::NotCloudEvent(format!("attribute dataschema {uri:?}: {e}"))),
    };
    PARSED_URIS.with_borrow_mut(|kept| {
        if kept.len() == PARSED_URIS_KEPT {
            kept.clear();
        }
        kept.push(ParsedUri { file: schema_file.to_owned(), base: base.map(str::to_owned), uri: Rc::clone(&parsed) });
    });
    Ok(Some(parsed))
}

impl OutboxEvent {
    /// The record's headers with `dataschema` under `base` (see
    /// [`OutboxEvent::to_cloudevent_under`]); the record's value is
    /// `self.data` as it is. Refuses what the SDK's builder refuses: an
    /// empty `source`, a `dataschema` that is not an absolute URL.
    pub fn to_kafka_headers_under(&self, base: Option<&str>) -> Result<OwnedHeaders, EnvelopeError> {
        if self.source.is_empty() {
            return Err(EnvelopeError::NotCloudEvent("invalid URI-reference in attribute source".into()));
        }
        let dataschema = parsed_dataschema(&self.schema_file, base)?;
        let time = self.time.to_rfc3339();
        let mut headers = OwnedHeaders::new_with_capacity(8 + self.extensions.len());
        for (name, value) in [
            ("ce_specversion", "1.0"),
            ("ce_id", self.id.as_str()),
            ("ce_type", self.event_type.as_str()),
            ("ce_source", self.source.as_str()),
            ("content-type", self.content_type.as_str()),
        ] {
            headers = headers.insert(Header { key: name, value: Some(value) });
        }
        if let Some(uri) = &dataschema {
            headers = headers.insert(Header { key: "ce_dataschema", value: Some(uri.as_ref()) });
        }
        if !self.subject.is_empty() {
            headers = headers.insert(Header { key: "ce_subject", value: Some(self.subject.as_str()) });
        }
        headers = headers.insert(Header { key: "ce_time", value: Some(&time) });
        for (name, value) in self.extension_attributes() {
            headers = headers.insert(Header { key: &header_name(name), value: Some(value) });
        }
        Ok(headers)
    }

    /// The extension attributes as the SDK's builder keeps them: the trace
    /// first, then the writer's extensions, a writer's value replacing the
    /// trace's under the same name.
    fn extension_attributes(&self) -> impl Iterator<Item = (&str, &str)> {
        let trace = self.trace.iter().flat_map(|trace| {
            [Some((TRACEPARENT, trace.traceparent.as_str())), trace.tracestate.as_deref().map(|state| (TRACESTATE, state))]
        });
        let trace = trace.flatten().filter(|(name, _)| !self.extensions.contains_key(*name));
        trace.chain(self.extensions.iter().map(|(name, value)| (name.as_str(), value.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use cloudevents::binding::rdkafka::FutureRecordExt;
    use rdkafka::message::Headers;
    use rdkafka::producer::FutureRecord;

    use crate::{OutboxEvent, TraceContext};

    type HeaderList = Vec<(String, Option<Vec<u8>>)>;

    fn listed(headers: &impl Headers) -> HeaderList {
        let mut list: HeaderList = headers.iter().map(|h| (h.key.to_owned(), h.value.map(<[u8]>::to_vec))).collect();
        list.sort();
        list
    }

    /// Headers and value the SDK's binding produces for `event`.
    fn through_the_sdk(event: &OutboxEvent, base: Option<&str>) -> (HeaderList, Vec<u8>) {
        let message = event.to_kafka_record_under(base).unwrap();
        let record = FutureRecord::<str, Vec<u8>>::to("t").message_record(&message);
        (listed(record.headers.as_ref().unwrap()), record.payload.cloned().unwrap())
    }

    fn assert_same_as_the_sdk(event: &OutboxEvent, base: Option<&str>) {
        let (headers, value) = through_the_sdk(event, base);
        assert_eq!(listed(&event.to_kafka_headers_under(base).unwrap()), headers, "{event:?}");
        assert_eq!(event.data, value);
    }

    /// decode's event, its time with a fraction of a second (the SDK
    /// writes one in `ce_time`; so must Herald).
    fn completed() -> OutboxEvent {
        let mut event = crate::decode::tests::event();
        event.time += chrono::Duration::microseconds(123_456);
        event
    }

    #[test]
    fn a_herald_event_has_the_sdks_headers_under_either_base() {
        let event = completed();
        assert_same_as_the_sdk(&event, None);
        assert_same_as_the_sdk(&event, Some("https://herald.example/schemas/"));
    }

    /// An application's JSON event through the outbox contract: its own
    /// extensions, a trace, no subject, its own absolute schema URI (which
    /// the URL parser normalises: so must Herald).
    #[test]
    fn an_applications_event_has_the_sdks_headers() {
        let mut event = completed();
        event.content_type = "application/json".into();
        event.data = br#"{"order":7}"#.to_vec();
        event.subject.clear();
        event.schema_file = "HTTPS://Schemas.Example.com/orders/../order.json".into();
        event.extensions = [("tenant".to_owned(), "t-1".to_owned()), ("region".to_owned(), "eu".to_owned())].into();
        event.trace = Some(TraceContext {
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            tracestate: Some("congo=t61rcWkgMzE".into()),
        });
        assert_same_as_the_sdk(&event, None);
        event.schema_file.clear();
        event.trace.as_mut().unwrap().tracestate = None;
        assert_same_as_the_sdk(&event, None);
    }

    /// A row written by hand may name an extension the trace also uses:
    /// the SDK keeps the writer's value, once.
    #[test]
    fn a_writers_extension_replaces_the_traces_of_the_same_name() {
        let mut event = completed();
        event.trace =
            Some(TraceContext { traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(), tracestate: None });
        event.extensions = [("traceparent".to_owned(), "written by hand".to_owned())].into();
        assert_same_as_the_sdk(&event, None);
        let headers = super::OutboxEvent::to_kafka_headers_under(&event, None).unwrap();
        assert_eq!(listed(&headers).iter().filter(|(k, _)| k == "ce_traceparent").count(), 1);
    }

    /// More writers' schema URIs than the thread keeps parsed: each still
    /// gets its own, whether parsed again or found.
    #[test]
    fn many_schema_uris_each_keep_their_own() {
        let mut event = completed();
        for round in 0..2 {
            for writer in 0..super::PARSED_URIS_KEPT + 7 {
                event.schema_file = format!("https://schemas.example/{writer}/order.json");
                assert_same_as_the_sdk(&event, None);
                let headers = listed(&event.to_kafka_headers_under(None).unwrap());
                let uri = headers.iter().find(|(k, _)| k == "ce_dataschema").and_then(|(_, v)| v.clone());
                assert_eq!(uri, Some(event.schema_file.clone().into_bytes()), "round {round}");
            }
        }
    }

    #[test]
    fn what_the_sdk_refuses_is_refused() {
        let mut no_source = completed();
        no_source.source.clear();
        assert!(no_source.to_kafka_record_under(None).is_err());
        assert!(no_source.to_kafka_headers_under(None).is_err());

        let mut bad_schema = completed();
        bad_schema.schema_file = "not a scheme:/x".into();
        assert!(bad_schema.to_kafka_record_under(None).is_err());
        assert!(bad_schema.to_kafka_headers_under(None).is_err());
    }
}
