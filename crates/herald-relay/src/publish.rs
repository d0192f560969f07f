//! Handing rows to the idempotent producer and collecting the broker's
//! verdict on each.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

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

/// Refuses producer settings librdkafka would refuse (an unknown key, a bad
/// value) without building a client, so `herald relay --producer` can
/// reject them as bad input before it opens anything.
pub fn check_producer_settings(settings: &[(String, String)]) -> Result<(), KafkaError> {
    // Herald's own producer settings under them, as the relay will build it.
    let mut config = producer_config(&KafkaConfig::new("127.0.0.1:9"));
    for (key, value) in settings {
        config.set(key, value);
    }
    config.create_native_config().map(drop)
}

/// How long the backlog producer waits to fill a request. A slice's batch
/// spreads over many partitions, so a full batch alone makes small requests;
/// waiting this long lets the batches of all the slices draining a backlog
/// share requests, and the broker's work per request (replicated to every
/// follower) is what bounds a relay on a real cluster.
const BACKLOG_LINGER_MS: &str = "50";

/// Produce requests each producer keeps out per broker. librdkafka's
/// idempotent producer (2.12) stops sending a partition once five of its
/// *messages* are in flight, whatever this setting allows, and while it
/// waits its broker threads wake again at once: at 1,000 rows/s a relay
/// alone burned half a core, and on two shared cores the brokers then
/// acknowledged later still. One request per broker keeps those threads
/// asleep until the acknowledgement: it halved the live path's wait for
/// acknowledgements in `herald bench latency`, and on the backlog producer
/// too it let four relays sharing two cores with the brokers drain one
/// outbox ~20 % faster (BENCHMARKS.md, "Latency" and "One request per
/// broker"); a lone relay on the mock cluster drains at the same rate
/// either way.
const MAX_IN_FLIGHT_PER_BROKER: &str = "1";

/// Which of the relay's two producers a batch goes through: a full batch
/// (the slice has a backlog) through the one that lingers to fill requests,
/// anything less through the one that sends at once, so a relay that keeps
/// up adds no wait to an event's way to the topic. A slice sends a batch
/// only after every verdict of the previous one, so its records are never
/// in both producers at once and a key's order does not depend on which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Live,
    Backlog,
}

/// The producers, each replaced when librdkafka reports it fatally broken
/// (an idempotent producer that lost track of its sequence numbers refuses
/// every further record).
pub(crate) struct Publisher {
    live: Producer,
    backlog: Producer,
    routes: Routes,
    dataschema_base: Option<String>,
}

struct Producer {
    config: ClientConfig,
    current: Mutex<Arc<FutureProducer>>,
}

impl Producer {
    fn new(config: ClientConfig) -> Result<Producer, KafkaError> {
        let producer = config.create()?;
        Ok(Producer { config, current: Mutex::new(Arc::new(producer)) })
    }

    fn current(&self) -> Arc<FutureProducer> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn replace(&self) {
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(fresh),
            Err(e) => error!(error = %e, "cannot create a new producer; retrying with the next batch"),
        }
    }
}

impl Publisher {
    /// The producers of `relay`'s settings (overrides, routes, schema
    /// base); a `linger.ms` among the overrides applies to both.
    pub(crate) fn new(kafka: &KafkaConfig, relay: &RelayConfig) -> Result<Publisher, KafkaError> {
        let mut live = producer_config(kafka);
        live.set("max.in.flight.requests.per.connection", MAX_IN_FLIGHT_PER_BROKER);
        // The backlog producer is the live one that lingers.
        let mut backlog = live.clone();
        backlog.set("linger.ms", BACKLOG_LINGER_MS);
        for (key, value) in &relay.producer {
            live.set(key, value);
            backlog.set(key, value);
        }
        let (routes, dataschema_base) = (relay.routes.clone(), relay.dataschema_base.clone());
        Ok(Publisher { live: Producer::new(live)?, backlog: Producer::new(backlog)?, routes, dataschema_base })
    }

    fn producer(&self, lane: Lane) -> &Producer {
        match lane {
            Lane::Live => &self.live,
            Lane::Backlog => &self.backlog,
        }
    }

    /// Sends `rows` in order and returns one future per row resolving to the
    /// broker's verdict. Sending in order is what keeps a key's records in
    /// order: the idempotent producer never reorders within a partition.
    pub(crate) async fn send_all(&self, rows: &[OutboxRow], lane: Lane) -> Vec<BoxFuture<'static, Result<(), PublishError>>> {
        let producer = self.producer(lane).current();
        let mut verdicts = Vec::with_capacity(rows.len());
        for row in rows {
            let topic = self.routes.topic_for(&row.event.event_type, &row.event.topic);
            verdicts.push(send(&producer, row, topic, self.dataschema_base.as_deref()).await);
        }
        verdicts
    }

    /// Called with a batch's verdicts: replaces the batch's producer if it
    /// failed fatally.
    pub(crate) fn check_fatal(&self, verdicts: &[Result<(), PublishError>], lane: Lane) {
        if !verdicts.iter().any(|v| v.as_ref().is_err_and(|e| e.fatal)) {
            return;
        }
        error!(?lane, "kafka producer failed fatally; replacing it");
        self.producer(lane).replace();
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

/// Every delivery's verdict, in the rows' order. All are sent already, so
/// awaiting them one after another takes as long as the slowest, without
/// `join_all`'s ordered set of wakers and its result vector grown from
/// empty (both showed in the drain's profile).
pub(crate) async fn in_order(deliveries: Vec<BoxFuture<'static, Result<(), PublishError>>>) -> Vec<Result<(), PublishError>> {
    let mut verdicts = Vec::with_capacity(deliveries.len());
    for delivery in deliveries {
        verdicts.push(delivery.await);
    }
    verdicts
}

async fn send(producer: &FutureProducer, row: &OutboxRow, topic: &str, base: Option<&str>) -> BoxFuture<'static, Result<(), PublishError>> {
    let headers = match row.event.to_kafka_headers_under(base) {
        Ok(headers) => headers,
        Err(e) => return futures::future::ready(Err(PublishError::permanent(e.to_string()))).boxed(),
    };
    let span = publish_span(row, topic);
    let mut record = FutureRecord::to(topic).key(row.event.partition_key.as_str()).payload(&row.event.data).headers(headers);
    loop {
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
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), returned)) => {
                record = returned;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err((e, _)) => return futures::future::ready(Err(PublishError::from_kafka(&e))).boxed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX_IN_FLIGHT: &str = "max.in.flight.requests.per.connection";

    #[test]
    fn producer_settings_librdkafka_refuses_are_refused_up_front() {
        let setting = |key: &str, value: &str| vec![(key.to_owned(), value.to_owned())];
        check_producer_settings(&setting("linger.ms", "0")).expect("a known key and a good value");
        let unknown = check_producer_settings(&setting("linger.mss", "0")).expect_err("an unknown key");
        assert!(unknown.to_string().contains("linger.mss"), "{unknown}");
        check_producer_settings(&setting("linger.ms", "soon")).expect_err("a value that is not a number");
    }

    #[test]
    fn both_producers_keep_one_request_out_unless_told_otherwise() {
        let kafka = KafkaConfig::new("127.0.0.1:9");
        let publisher = Publisher::new(&kafka, &RelayConfig::default()).unwrap();
        assert_eq!(publisher.live.config.get(MAX_IN_FLIGHT), Some(MAX_IN_FLIGHT_PER_BROKER));
        assert_eq!(publisher.backlog.config.get(MAX_IN_FLIGHT), Some(MAX_IN_FLIGHT_PER_BROKER));
        assert_eq!(publisher.backlog.config.get("linger.ms"), Some(BACKLOG_LINGER_MS));

        let relay = RelayConfig { producer: vec![(MAX_IN_FLIGHT.to_owned(), "3".to_owned())], ..RelayConfig::default() };
        let publisher = Publisher::new(&kafka, &relay).unwrap();
        assert_eq!(publisher.live.config.get(MAX_IN_FLIGHT), Some("3"), "a user's override wins");
        assert_eq!(publisher.backlog.config.get(MAX_IN_FLIGHT), Some("3"));
    }
}
