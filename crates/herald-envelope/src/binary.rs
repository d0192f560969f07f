//! CloudEvents' Kafka protocol binding, binary mode, read straight from a
//! record's headers: the attributes are borrowed, not copied.
//!
//! Why not cloudevents-sdk's `record_to_event`: it copies every header into
//! a `HashMap` of owned strings, formats each attribute through `Display`
//! into a new `String`, parses `dataschema` as a URL and copies the value,
//! which Herald then copies again. That was 2.4 µs of the 4.5 µs a record
//! cost to decode, and the decode is the largest part of a replay's own CPU
//! (BENCHMARKS.md, "Reading the headers"). The SDK's binding stays the
//! reference this reader is held to: the property test
//! `decode::sdk_reference` feeds both the same records and requires the
//! same event or a refusal from both (as `record::tests` hold the relay's
//! hand-written headers to the binding's).
//!
//! What the binding does, and so what this does: the last of two headers of
//! one name counts (it collects them into a map); `ce_specversion` must be
//! present; `content-type` is `datacontenttype` unless a
//! `ce_datacontenttype` says otherwise; other `ce_` headers are the v1.0
//! attributes or extensions; the values Herald reads must be UTF-8,
//! `dataschema` a URL and `time` RFC 3339. The one deliberate difference:
//! CloudEvents 0.3 is refused. Herald writes 1.0 only, and its `dataschema`
//! was `schemaurl` in 0.3.

use chrono::{DateTime, Utc};
use rdkafka::message::{Headers, Message};

use crate::EnvelopeError;
use crate::schema::DATASCHEMA_PREFIX;

/// The attribute headers of one record, as text borrowed from the record.
#[derive(Debug, Default)]
pub(crate) struct Attributes<'a> {
    pub(crate) id: Option<&'a str>,
    pub(crate) source: Option<&'a str>,
    pub(crate) ty: Option<&'a str>,
    pub(crate) datacontenttype: Option<&'a str>,
    /// As the SDK's `Url` would print it (see [`normalised_dataschema`]).
    pub(crate) dataschema: Option<String>,
    pub(crate) subject: Option<&'a str>,
    pub(crate) time: Option<DateTime<Utc>>,
    /// Other `ce_` headers, each name once (the last header of it).
    pub(crate) extensions: Vec<(&'a str, &'a str)>,
}

/// Header values before they are checked: the last header of each name.
#[derive(Default)]
struct Raw<'a> {
    specversion: Option<&'a [u8]>,
    content_type: Option<&'a [u8]>,
    /// `ce_` headers other than `ce_specversion`: (name without `ce_`,
    /// value), each name once, where it first appeared. A record has a
    /// handful of headers; a scan beats a map.
    prefixed: Vec<(&'a str, &'a [u8])>,
}

/// The CloudEvents attributes of `msg`, or why it is not a CloudEvent in
/// binary mode.
pub(crate) fn attributes(msg: &impl Message) -> Result<Attributes<'_>, EnvelopeError> {
    let raw = raw_headers(msg)?;
    let specversion = raw.specversion.ok_or_else(|| not_cloudevent("no `ce_specversion` header".to_owned()))?;
    match utf8("specversion", specversion)? {
        "1.0" => {}
        "0.3" => return Err(invalid("specversion", "`0.3`; Herald reads CloudEvents 1.0".to_owned())),
        other => return Err(not_cloudevent(format!("unknown spec version `{other}`"))),
    }
    let mut attributes =
        Attributes { datacontenttype: raw.content_type.map(|v| utf8("content-type", v)).transpose()?, ..Default::default() };
    for (name, value) in raw.prefixed {
        let text = utf8(name, value)?;
        match name {
            "id" => attributes.id = Some(text),
            "source" => attributes.source = Some(text),
            "type" => attributes.ty = Some(text),
            "datacontenttype" => attributes.datacontenttype = Some(text),
            "dataschema" => attributes.dataschema = Some(normalised_dataschema(text)?),
            "subject" => attributes.subject = Some(text),
            "time" => attributes.time = Some(rfc3339(text)?),
            _ => attributes.extensions.push((name, text)),
        }
    }
    Ok(attributes)
}

/// One pass over the headers: refuses what Herald never reads (a header
/// without a value, structured mode) and keeps the last value of each name.
fn raw_headers(msg: &impl Message) -> Result<Raw<'_>, EnvelopeError> {
    let headers = msg.headers().ok_or_else(|| not_cloudevent("no headers".to_owned()))?;
    let mut raw = Raw::default();
    for header in headers.iter() {
        let Some(value) = header.value else {
            return Err(not_cloudevent(format!("header `{}` has no value", header.key)));
        };
        match header.key {
            "ce_specversion" => raw.specversion = Some(value),
            "content-type" if value.starts_with(b"application/cloudevents") => {
                return Err(invalid("content-type", "structured mode; Herald reads binary mode only".to_owned()));
            }
            "content-type" => raw.content_type = Some(value),
            key => {
                if let Some(name) = key.strip_prefix("ce_") {
                    match raw.prefixed.iter_mut().find(|(seen, _)| *seen == name) {
                        Some(slot) => slot.1 = value,
                        None => raw.prefixed.push((name, value)),
                    }
                }
            }
        }
    }
    Ok(raw)
}

/// `dataschema` as `url::Url` prints it, which is what Herald matched schema
/// names against when the SDK parsed it. Herald's own `herald:schemas/<file>`
/// with a plain file name prints as written, so only other values pay for
/// the parse (the URL parser's percent-encoding was 5 % of a decode).
fn normalised_dataschema(text: &str) -> Result<String, EnvelopeError> {
    if prints_as_written(text) {
        return Ok(text.to_owned());
    }
    url::Url::parse(text).map(String::from).map_err(|e| invalid("dataschema", format!("`{text}` is not a URL: {e}")))
}

/// True when `url::Url::parse(text)` succeeds and prints `text` unchanged:
/// `herald:` is a scheme without an authority, so the rest is an opaque
/// path, which WHATWG URL parsing leaves alone apart from percent-encoding
/// controls, spaces and non-ASCII (none of which the name may hold here).
pub(crate) fn prints_as_written(text: &str) -> bool {
    text.strip_prefix(DATASCHEMA_PREFIX)
        .is_some_and(|file| file.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
}

fn rfc3339(text: &str) -> Result<DateTime<Utc>, EnvelopeError> {
    DateTime::parse_from_rfc3339(text).map(|t| t.with_timezone(&Utc)).map_err(|e| invalid("time", format!("`{text}` is not RFC 3339: {e}")))
}

fn utf8<'a>(name: &str, value: &'a [u8]) -> Result<&'a str, EnvelopeError> {
    std::str::from_utf8(value).map_err(|e| not_cloudevent(format!("header of `{name}` is not UTF-8: {e}")))
}

fn not_cloudevent(reason: String) -> EnvelopeError {
    EnvelopeError::NotCloudEvent(reason)
}

fn invalid(name: &'static str, reason: String) -> EnvelopeError {
    EnvelopeError::InvalidAttribute { name, reason }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// The shortcut in `normalised_dataschema` is only taken where the
        /// URL parser would have printed the same text.
        #[test]
        fn what_prints_as_written_parses_to_itself(file in "[A-Za-z0-9._-]{0,30}") {
            let text = format!("{DATASCHEMA_PREFIX}{file}");
            prop_assert!(prints_as_written(&text));
            prop_assert_eq!(url::Url::parse(&text).map(String::from).ok(), Some(text));
        }
    }

    #[test]
    fn other_dataschemas_are_parsed_and_printed_as_urls() {
        assert_eq!(normalised_dataschema("HTTPS://Herald.Example/s/a.v1.avsc").unwrap(), "https://herald.example/s/a.v1.avsc");
        assert_eq!(normalised_dataschema("herald:schemas/é.avsc").unwrap(), "herald:schemas/%C3%A9.avsc");
        assert!(matches!(normalised_dataschema("not a url"), Err(EnvelopeError::InvalidAttribute { name: "dataschema", .. })));
    }

    #[test]
    fn the_last_header_of_a_name_counts() {
        let mut headers = rdkafka::message::OwnedHeaders::new();
        for (key, value) in [("ce_specversion", "1.0"), ("ce_id", "1"), ("ce_tenant", "a"), ("ce_id", "2")] {
            headers = headers.insert(rdkafka::message::Header { key, value: Some(value) });
        }
        let msg = rdkafka::message::OwnedMessage::new(None, None, "t".into(), rdkafka::Timestamp::NotAvailable, 0, 0, Some(headers));
        let read = attributes(&msg).unwrap();
        assert_eq!((read.id, read.extensions), (Some("2"), vec![("tenant", "a")]));
    }
}
