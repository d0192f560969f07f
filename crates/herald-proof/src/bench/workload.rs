//! Records for benchmarks and tests: completion facts as the relay publishes
//! them (CloudEvents binary mode), in the legacy envelope, or as raw bytes.

use std::time::Duration;

use anyhow::Context;
use chrono::Utc;
use cloudevents::binding::rdkafka::FutureRecordExt;
use herald_envelope::legacy::to_legacy_json;
use herald_envelope::{ExportCompleted, OutboxEvent};
use herald_kafka::KafkaConfig;
use rdkafka::error::KafkaResult;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

/// The `i`-th completion of run `run`: distinct jobs, seven callers, two
/// formats, all completed now.
pub fn completion(run: &str, i: usize) -> ExportCompleted {
    let job_id = format!("{run}-job-{i:07}");
    ExportCompleted {
        result_id: format!("exports/{job_id}/1.csv"),
        job_id,
        caller: format!("caller-{}", i % 7),
        format: if i % 2 == 0 { "csv" } else { "json" }.to_owned(),
        content_type: if i % 2 == 0 { "text/csv" } else { "application/json" }.to_owned(),
        query: format!("bench export {i}"),
        size_bytes: 1000 + i as i64,
        sha256: "ab".repeat(32),
        completed_at_ms: Utc::now().timestamp_millis(),
        version: 2,
    }
}

/// `n` completion events for `topic`, as outbox rows would carry them.
pub fn completions(topic: &str, run: &str, n: usize) -> anyhow::Result<Vec<OutboxEvent>> {
    (0..n)
        .map(|i| {
            let data = completion(run, i);
            Ok(OutboxEvent::new(topic, &data.job_id, &data, Utc::now())?)
        })
        .collect()
}

pub fn producer(kafka: &KafkaConfig) -> anyhow::Result<FutureProducer> {
    Ok(kafka.producer().create()?)
}

/// Publishes `events` in one Kafka transaction and returns once it has
/// committed: a `read_committed` consumer (every Herald subscription) sees
/// none of them before and all of them after, so a benchmark can time
/// consumers from the commit without timing its own writes.
pub async fn publish_in_one_transaction(kafka: &KafkaConfig, transactional_id: &str, events: &[OutboxEvent]) -> anyhow::Result<()> {
    let mut config = kafka.producer();
    config.set("transactional.id", transactional_id);
    let producer: FutureProducer = config.create()?;
    let setup = producer.clone();
    tokio::task::spawn_blocking(move || -> KafkaResult<()> {
        setup.init_transactions(TRANSACTION_CALL_TIMEOUT)?;
        setup.begin_transaction()
    })
    .await??;
    publish(&producer, events).await?;
    tokio::task::spawn_blocking(move || producer.commit_transaction(TRANSACTION_CALL_TIMEOUT)).await??;
    Ok(())
}

const TRANSACTION_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Publishes `events` in CloudEvents binary mode and waits for every ack.
pub async fn publish(producer: &FutureProducer, events: &[OutboxEvent]) -> anyhow::Result<()> {
    for chunk in events.chunks(10_000) {
        let mut pending = Vec::with_capacity(chunk.len());
        for event in chunk {
            let message = event.to_kafka_record()?;
            let record = FutureRecord::to(&event.topic).key(event.partition_key.as_str()).message_record(&message);
            pending.push(producer.send_result(record).map_err(|(e, _)| e)?);
        }
        for delivery in pending {
            delivery.await.context("delivery report dropped")?.map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

/// Publishes `event`'s fact in the legacy JSON envelope (no `ce_*` headers),
/// its source spelled the old way.
pub async fn publish_legacy(producer: &FutureProducer, event: &OutboxEvent, data: &ExportCompleted) -> anyhow::Result<()> {
    let value = to_legacy_json(&event.key(), "herald-exports", &event.subject, data)?;
    publish_raw(producer, &event.topic, &event.partition_key, &value, None).await
}

/// Publishes arbitrary bytes, e.g. a poison record.
pub async fn publish_raw(
    producer: &FutureProducer,
    topic: &str,
    key: &str,
    value: &[u8],
    headers: Option<OwnedHeaders>,
) -> anyhow::Result<()> {
    let mut record = FutureRecord::to(topic).key(key).payload(value);
    if let Some(headers) = headers {
        record = record.headers(headers);
    }
    producer.send_result(record).map_err(|(e, _)| e)?.await.context("delivery report dropped")?.map_err(|(e, _)| e)?;
    Ok(())
}
