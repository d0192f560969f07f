//! An outbox row's event and its Kafka record in CloudEvents binary mode.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use cloudevents::binding::rdkafka::MessageRecord;
use cloudevents::{Event, EventBuilder, EventBuilderV10};

use crate::{EnvelopeError, EventData, TraceContext, schema};

/// `source` of every event the export domain emits (a URI-reference).
pub const SOURCE_EXPORTS: &str = "/herald/exports";

/// Content type of event data: one Avro datum in binary encoding.
pub const AVRO_CONTENT_TYPE: &str = "application/avro";
/// Content type of JSON event data (applications' own events, through the
/// outbox contract).
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// Extension attributes of the CloudEvents distributed-tracing extension.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// The identity of a fact, and so the key every inbox deduplicates on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventKey {
    pub source: String,
    pub id: String,
}

/// An event as the outbox stores it. Everything that becomes a CloudEvents
/// attribute is fixed when the row is written, so every publish of the row —
/// first try, retry or another relay's takeover — carries the same identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub id: String,
    pub source: String,
    pub event_type: String,
    pub subject: String,
    pub time: DateTime<Utc>,
    /// The data's schema: a file under `schemas/` (sent as Herald's
    /// `dataschema` URI), an absolute URI (sent as is), or empty (none).
    pub schema_file: String,
    pub data: Vec<u8>,
    /// Media type of `data` (`datacontenttype`).
    pub content_type: String,
    /// CloudEvents extension attributes the writer set (`ce_<name>`).
    pub extensions: BTreeMap<String, String>,
    /// Empty: the relay's routes decide.
    pub topic: String,
    /// Kafka record key; same key, same partition, commit order.
    pub partition_key: String,
    /// The trace the event was written in, sent as the CloudEvents
    /// distributed-tracing extension (`ce_traceparent`, `ce_tracestate`).
    pub trace: Option<TraceContext>,
}

impl OutboxEvent {
    /// A new event with a fresh time-ordered id.
    pub fn new<T: EventData>(topic: &str, subject: &str, data: &T, time: DateTime<Utc>) -> Result<Self, EnvelopeError> {
        Ok(Self {
            id: uuid::Uuid::now_v7().to_string(),
            source: SOURCE_EXPORTS.to_owned(),
            event_type: T::EVENT_TYPE.to_owned(),
            subject: subject.to_owned(),
            time,
            schema_file: T::SCHEMA_FILE.to_owned(),
            data: data.to_avro()?,
            content_type: AVRO_CONTENT_TYPE.to_owned(),
            extensions: BTreeMap::new(),
            topic: topic.to_owned(),
            partition_key: subject.to_owned(),
            trace: None,
        })
    }

    /// The same event, written in the trace `trace` names.
    pub fn with_trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }

    pub fn key(&self) -> EventKey {
        EventKey { source: self.source.clone(), id: self.id.clone() }
    }

    /// The CloudEvents 1.0 form of this event.
    pub fn to_cloudevent(&self) -> Result<Event, EnvelopeError> {
        self.to_cloudevent_under(None)
    }

    /// The CloudEvents form with a Herald schema's `dataschema` under
    /// `base` (an absolute URL ending in `/`) instead of `herald:schemas/`.
    pub fn to_cloudevent_under(&self, base: Option<&str>) -> Result<Event, EnvelopeError> {
        let mut builder = EventBuilderV10::new();
        if let Some(trace) = &self.trace {
            builder = builder.extension(TRACEPARENT, trace.traceparent.as_str());
            if let Some(state) = &trace.tracestate {
                builder = builder.extension(TRACESTATE, state.as_str());
            }
        }
        for (name, value) in &self.extensions {
            builder = builder.extension(name, value.as_str());
        }
        builder = builder.id(&self.id).source(self.source.as_str()).ty(&self.event_type).time(self.time);
        if !self.subject.is_empty() {
            builder = builder.subject(&self.subject);
        }
        builder = match dataschema_of(&self.schema_file, base) {
            Some(uri) => builder.data_with_schema(self.content_type.as_str(), uri.as_str(), self.data.clone()),
            None => builder.data(self.content_type.as_str(), self.data.clone()),
        };
        builder.build().map_err(|e| EnvelopeError::NotCloudEvent(e.to_string()))
    }

    /// The `dataschema` attribute: Herald's URI for a file of its registry,
    /// the writer's own absolute URI as given, none when empty.
    pub fn dataschema(&self) -> Option<String> {
        dataschema_of(&self.schema_file, None)
    }

    /// Headers and value of the Kafka record, in binary content mode.
    pub fn to_kafka_record(&self) -> Result<MessageRecord, EnvelopeError> {
        self.to_kafka_record_under(None)
    }

    /// [`OutboxEvent::to_kafka_record`] with `dataschema` under `base`.
    pub fn to_kafka_record_under(&self, base: Option<&str>) -> Result<MessageRecord, EnvelopeError> {
        MessageRecord::from_event(self.to_cloudevent_under(base)?).map_err(|e| EnvelopeError::NotCloudEvent(e.to_string()))
    }
}

/// The `dataschema` of an event whose schema is `schema_file`: Herald's URI
/// (under `base`) for a file of its registry, the writer's own absolute URI
/// as given, none when empty.
pub(crate) fn dataschema_of(schema_file: &str, base: Option<&str>) -> Option<String> {
    match schema_file {
        "" => None,
        uri if uri.contains(':') => Some(uri.to_owned()),
        file => Some(schema::dataschema_under(base, file)),
    }
}
