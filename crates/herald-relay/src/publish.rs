//! Handing rows to the idempotent producer and collecting the broker's
//! verdict on each.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cloudevents::binding::rdkafka::FutureRecordExt;
use futures::future::{BoxFuture, FutureExt};
use herald_kafka::KafkaConfig;
use herald_store::outbox::OutboxRow;
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use tracing::field::Empty;
use tracing::{Span, error};

use crate::{PublishError, RelayConfig, Routes};

/// The relay's producer settings: Herald's shared ones (idempotent,
/// `acks=all`) with no message timeout.
///
/// Why no timeout: a message that times out in librdkafka's queue leaves a
/// gap — later records of the same partition may still reach the broker —
/// and republishing the timed-out row afterwards would put it behind its
/// successors. Without a timeout an unreachable broker keeps rows in flight
/// (the relay keeps renewing its lease) and they go out in order when it
/// returns; a relay that stops gives up on them and they are republished.
pub fn producer_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut config = kafka.producer();
    config.set("message.timeout.ms", "0").set("queue.buffering.max.messages", "1000000").set("queue.buffering.max.kbytes", "1048576");
    config
}

/// The producer, replaced when librdkafka reports it fatally broken (an
/// idempotent producer that lost track of its sequence numbers refuses
/// every further record).
pub(crate) struct Publisher {
    config: ClientConfig,
    routes: Routes,
    dataschema_base: Option<String>,
    producer: Mutex<Arc<FutureProducer>>,
}

impl Publisher {
    /// The producer of `relay`'s settings (overrides, routes, schema base).
    pub(crate) fn new(kafka: &KafkaConfig, relay: &RelayConfig) -> Result<Publisher, KafkaError> {
        let mut config = producer_config(kafka);
        for (key, value) in &relay.producer {
            config.set(key, value);
        }
        let producer = config.create()?;
        let (routes, dataschema_base) = (relay.routes.clone(), relay.dataschema_base.clone());
        Ok(Publisher { config, routes, dataschema_base, producer: Mutex::new(Arc::new(producer)) })
    }

    fn current(&self) -> Arc<FutureProducer> {
        self.producer.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Sends `rows` in order and returns one future per row resolving to the
    /// broker's verdict. Sending in order is what keeps a key's records in
    /// order: the idempotent producer never reorders within a partition.
    pub(crate) async fn send_all(&self, rows: &[OutboxRow]) -> Vec<BoxFuture<'static, Result<(), PublishError>>> {
        let producer = self.current();
        let mut verdicts = Vec::with_capacity(rows.len());
        for row in rows {
            let topic = self.routes.topic_for(&row.event.event_type, &row.event.topic);
            verdicts.push(send(&producer, row, topic, self.dataschema_base.as_deref()).await);
        }
        verdicts
    }

    /// Called with a batch's verdicts: replaces a fatally failed producer.
    pub(crate) fn check_fatal(&self, verdicts: &[Result<(), PublishError>]) {
        if !verdicts.iter().any(|v| v.as_ref().is_err_and(|e| e.fatal)) {
            return;
        }
        error!("kafka producer failed fatally; replacing it");
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => *self.producer.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh),
            Err(e) => error!(error = %e, "cannot create a new producer; retrying with the next batch"),
        }
    }
}

/// A delivery without an offset: librdkafka's reading of the broker's
/// DUPLICATE_SEQUENCE_NUMBER. The broker says so when a batch's sequence lies
/// before the first batch it has cached for the producer — which after a
/// leader change can be a batch that was never written (the new leader took
/// a later batch as the producer's first; KIP-360 lets a producer it does
/// not know start at any sequence). So it is not proof of a write: the row
/// goes out again under the same event id, and a duplicate, if it was
/// written after all, is absorbed by the consumers' inboxes.
const UNCONFIRMED: &str = "acknowledged as a duplicate sequence without an offset; not proof of a write";

/// A span per published record, child of the span that appended the row,
/// while spans are exported: it lasts from the send to the broker's verdict.
fn publish_span(row: &OutboxRow, topic: &str) -> Option<Span> {
    if !herald_trace::recording() {
        return None;
    }
    let span = tracing::info_span!(
        parent: None,
        "relay.publish",
        event_id = %row.event.id,
        event_type = %row.event.event_type,
        seq = row.seq,
        "messaging.destination.name" = %topic,
        "messaging.destination.partition.id" = Empty,
        "messaging.kafka.offset" = Empty,
    );
    herald_trace::set_parent(&span, row.event.trace.as_ref());
    Some(span)
}

async fn send(producer: &FutureProducer, row: &OutboxRow, topic: &str, base: Option<&str>) -> BoxFuture<'static, Result<(), PublishError>> {
    let message = match row.event.to_kafka_record_under(base) {
        Ok(message) => message,
        Err(e) => return futures::future::ready(Err(PublishError::permanent(e.to_string()))).boxed(),
    };
    let span = publish_span(row, topic);
    loop {
        let record = FutureRecord::to(topic).key(row.event.partition_key.as_str()).message_record(&message);
        match producer.send_result(record) {
            Ok(delivery) => {
                return async move {
                    let verdict = delivery.await;
                    if let (Some(span), Ok(Ok(delivery))) = (&span, &verdict) {
                        span.record("messaging.destination.partition.id", delivery.partition);
                        span.record("messaging.kafka.offset", delivery.offset);
                    }
                    match verdict {
                        Ok(Ok(delivery)) if delivery.offset >= 0 => Ok(()),
                        Ok(Ok(_)) => Err(PublishError::retryable(UNCONFIRMED)),
                        Ok(Err((e, _))) => Err(PublishError::from_kafka(&e)),
                        Err(_) => Err(PublishError::retryable("producer dropped the delivery report")),
                    }
                }
                .boxed();
            }
            // Backpressure from librdkafka's queue: wait for it to drain.
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => return futures::future::ready(Err(PublishError::from_kafka(&e))).boxed(),
        }
    }
}
