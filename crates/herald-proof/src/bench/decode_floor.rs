//! What decoding a replayed record costs, with nothing else running: the
//! replay's own decode (CloudEvents attributes through `herald-envelope`,
//! the Avro data resolved into the projection's fact) and the least any
//! reader of these records must do (`floor`): read the four attribute
//! headers it needs as text and read the Avro datum into its type through
//! apache-avro, the design's Avro library, the cheapest way it offers (a
//! `GenericDatumReader` built once, `read_deser`). One thread, the records
//! built in memory as the broker delivers them (the relay's headers and
//! value), so no receiving is timed.
//!
//! Added to the receive and write floors of the same run, the `floor`
//! bounds any replay of these records here from above.

use std::time::Instant;

use anyhow::Context;
use apache_avro::reader::datum::GenericDatumReader;
use herald_consumer::Projection;
use herald_envelope::{EventData, ExportCompleted, OutboxEvent, Registry, decode_any_with, schema};
use herald_projections::search::Search;
use rdkafka::Timestamp;
use rdkafka::message::{Headers, Message, OwnedMessage};

/// Microseconds of one thread's CPU time per record, both ways.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecodeCost {
    /// The replay's decode, as its reader threads run it.
    pub(crate) herald_us: f64,
    /// The least any reader does (see the module's comment).
    pub(crate) floor_us: f64,
}

/// The attribute headers a reader needs: identity, type and which schema.
const NEEDED: [&str; 4] = ["ce_id", "ce_source", "ce_type", "ce_dataschema"];

/// Decodes `events` both ways, each several times, and keeps each way's
/// fastest pass (the machine is noisy; neither can be faster than it is).
pub(crate) fn decode_cost(events: &[OutboxEvent]) -> anyhow::Result<DecodeCost> {
    let messages = events.iter().enumerate().map(|(i, e)| as_delivered(e, i)).collect::<anyhow::Result<Vec<_>>>()?;
    let registry = Registry::embedded();
    let writer = schema::by_file(ExportCompleted::SCHEMA_FILE)?;
    let reader = GenericDatumReader::builder(writer).build()?;
    let (mut herald_us, mut floor_us) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..PASSES {
        herald_us = herald_us.min(per_record(&messages, |m| herald_decode(m, &registry))?);
        floor_us = floor_us.min(per_record(&messages, |m| least_decode(m, &reader))?);
    }
    Ok(DecodeCost { herald_us, floor_us })
}

const PASSES: usize = 3;

fn per_record(messages: &[OwnedMessage], decode: impl Fn(&OwnedMessage) -> anyhow::Result<usize>) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut sink = 0usize;
    for msg in messages {
        sink = sink.wrapping_add(decode(msg)?);
    }
    let secs = started.elapsed().as_secs_f64();
    std::hint::black_box(sink);
    Ok(secs * 1e6 / messages.len().max(1) as f64)
}

/// What a replay's reader thread does with a record (`herald_consumer::replay`).
fn herald_decode(msg: &OwnedMessage, registry: &Registry) -> anyhow::Result<usize> {
    let event = decode_any_with(msg, registry)?;
    anyhow::ensure!(Search::handles(&event.event_type), "search does not handle {}", event.event_type);
    let fact = Search::fact(&event).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(fact.job_id().len() + event.key.id.len())
}

/// The least any reader of the record does: its needed headers as text and
/// the datum read into its type with the writer's schema resolved once.
fn least_decode(msg: &OwnedMessage, reader: &GenericDatumReader<'_>) -> anyhow::Result<usize> {
    let headers = msg.headers().context("no headers")?;
    let mut found = 0;
    for header in headers.iter() {
        if NEEDED.contains(&header.key) {
            found += std::str::from_utf8(header.value.context("empty header")?)?.len();
        }
    }
    let mut payload = msg.payload().context("no value")?;
    let data: ExportCompleted = reader.read_deser(&mut payload)?;
    Ok(found + data.job_id.len())
}

/// `event` as a consumer receives it: the relay's headers and value.
fn as_delivered(event: &OutboxEvent, offset: usize) -> anyhow::Result<OwnedMessage> {
    Ok(OwnedMessage::new(
        Some(event.data.clone()),
        Some(event.partition_key.clone().into_bytes()),
        event.topic.clone(),
        Timestamp::NotAvailable,
        0,
        offset as i64,
        Some(event.to_kafka_headers_under(None)?),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::workload;

    #[test]
    fn both_ways_decode_the_relays_records_and_refuse_a_record_without_its_value() {
        let events = workload::completions("t", "decode", 50).unwrap();
        let cost = decode_cost(&events).unwrap();
        assert!(cost.herald_us > 0.0 && cost.floor_us > 0.0, "{cost:?}");
        let bare = as_delivered(&events[0], 0).unwrap().set_payload(None);
        let reader = GenericDatumReader::builder(schema::by_file(ExportCompleted::SCHEMA_FILE).unwrap()).build().unwrap();
        assert!(least_decode(&bare, &reader).is_err());
        assert!(herald_decode(&bare, &Registry::embedded()).is_err());
    }
}
