//! Handing rows to the idempotent producer and collecting the broker's
//! verdict on each.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use herald_kafka::KafkaConfig;
use herald_store::outbox::{OutboxRow, SLICES};
use rdkafka::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use tracing::field::Empty;
use tracing::{Span, error, info, warn};

use crate::{PublishError, RelayConfig, RelayCounters, Routes};

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

/// How long the backlog producer of a relay holding every slice waits to
/// fill a request. A slice's batch spreads over many partitions, so a full
/// batch alone makes small requests; waiting this long lets the batches of
/// all the slices draining a backlog share requests, and the broker's work
/// per request (replicated to every follower) is what bounds a relay on a
/// real cluster. A relay holding fewer slices waits proportionally longer
/// ([`Publisher::backlog_lane`]).
const BACKLOG_LINGER_MS: f64 = 50.0;

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

/// Which of the relay's producers a batch goes through: a full batch (the
/// slice has a backlog) through one that lingers to fill requests, anything
/// less through the one that sends at once, so a relay that keeps up adds
/// no wait to an event's way to the topic. The lingering producer follows
/// the relay's share of the slices (`held`): when the share changes, the
/// next full batches go through a new one. A slice changes lanes only with
/// nothing out, so its records are never in two producers at once and a
/// key's order does not depend on which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    Live,
    Backlog { held: u8 },
}

/// The producers, each replaced when librdkafka reports it fatally broken
/// (an idempotent producer that lost track of its sequence numbers refuses
/// every further record).
pub(crate) struct Publisher {
    live: Arc<Producer>,
    /// The lingering producer of the share the relay last sent a full batch
    /// for. One it replaces lives on in the batches still out through it.
    backlog: Mutex<Arc<Producer>>,
    /// The backlog producers' settings but their linger, and the linger of a
    /// relay holding every slice (Herald's, or a user's `linger.ms`).
    backlog_base: ClientConfig,
    linger_all_ms: f64,
    routes: Routes,
    dataschema_base: Option<String>,
    counters: Arc<RelayCounters>,
}

struct Producer {
    config: ClientConfig,
    current: Mutex<Arc<FutureProducer>>,
    lane: Lane,
}

impl Producer {
    fn new(config: ClientConfig, lane: Lane) -> Result<Producer, KafkaError> {
        let producer = config.create()?;
        Ok(Producer { config, current: Mutex::new(Arc::new(producer)), lane })
    }

    fn current(&self) -> Arc<FutureProducer> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn replace(&self) {
        match self.config.create::<FutureProducer>() {
            Ok(fresh) => retire(std::mem::replace(&mut *self.current.lock().unwrap_or_else(PoisonError::into_inner), Arc::new(fresh))),
            Err(e) => error!(error = %e, "cannot create a new producer; retrying with the next batch"),
        }
    }
}

/// Drops a producer nothing sends through any more, off the async workers:
/// librdkafka's destroy joins its threads. Batches still out through it keep
/// it alive until their verdicts are in.
fn retire(producer: Arc<FutureProducer>) {
    let Some(producer) = Arc::into_inner(producer) else { return };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => drop(runtime.spawn_blocking(move || drop(producer))),
        Err(_) => drop(producer),
    }
}

/// A linger for a relay holding every slice scaled to one holding `held`,
/// as [`crate::RelayConfig::batch_for`] scales batches: a relay's requests
/// then carry about as many records whatever its share, instead of four
/// relays each sending a request per partition per linger with a quarter of
/// the records (BENCHMARKS.md, "Two batches out: faster alone, not in
/// company").
fn per_share(all_slices_ms: f64, held: u8) -> f64 {
    all_slices_ms * f64::from(SLICES) / f64::from(held.max(1))
}

impl Publisher {
    /// The producers of `relay`'s settings (overrides, routes, schema
    /// base); a `linger.ms` among the overrides applies to the live
    /// producer as given and to the backlog producer of a relay holding
    /// every slice.
    pub(crate) fn new(kafka: &KafkaConfig, relay: &RelayConfig, counters: Arc<RelayCounters>) -> Result<Publisher, KafkaError> {
        let mut live = producer_config(kafka);
        live.set("max.in.flight.requests.per.connection", MAX_IN_FLIGHT_PER_BROKER);
        let mut linger_all_ms = BACKLOG_LINGER_MS;
        for (key, value) in &relay.producer {
            live.set(key, value);
            if key == "linger.ms" {
                linger_all_ms = value.parse().unwrap_or(BACKLOG_LINGER_MS);
            }
        }
        let backlog_base = live.clone();
        let every_slice = Publisher::backlog_lane(usize::MAX);
        let backlog = Producer::new(backlog_config(&backlog_base, linger_all_ms), every_slice)?;
        RelayCounters::set(&counters.backlog_linger_us, micros(linger_all_ms));
        Ok(Publisher {
            live: Arc::new(Producer::new(live, Lane::Live)?),
            backlog: Mutex::new(Arc::new(backlog)),
            backlog_base,
            linger_all_ms,
            routes: relay.routes.clone(),
            dataschema_base: relay.dataschema_base.clone(),
            counters,
        })
    }

    /// The lane of a full batch read while this relay holds `held` slices.
    pub(crate) fn backlog_lane(held: usize) -> Lane {
        let every = usize::try_from(SLICES).unwrap_or(1);
        Lane::Backlog { held: u8::try_from(held.clamp(1, every)).unwrap_or(u8::MAX) }
    }

    /// The producer of `lane`; for a backlog lane of a share other than the
    /// last one, a new producer lingering for that share.
    fn producer(&self, lane: Lane) -> Arc<Producer> {
        let Lane::Backlog { held } = lane else {
            return Arc::clone(&self.live);
        };
        let mut backlog = self.backlog.lock().unwrap_or_else(PoisonError::into_inner);
        if backlog.lane != lane {
            let linger_ms = per_share(self.linger_all_ms, held);
            match Producer::new(backlog_config(&self.backlog_base, linger_ms), lane) {
                Ok(fresh) => {
                    info!(held, linger_ms, "the relay's share of the slices changed; a backlog producer lingering for it");
                    RelayCounters::set(&self.counters.backlog_linger_us, micros(linger_ms));
                    let replaced = std::mem::replace(&mut *backlog, Arc::new(fresh));
                    if let Some(replaced) = Arc::into_inner(replaced) {
                        retire(replaced.current());
                    }
                }
                // Its linger only shapes requests: the last one still delivers.
                Err(e) => warn!(held, error = %e, "cannot create a backlog producer for the relay's share; keeping the last one"),
            }
        }
        Arc::clone(&backlog)
    }

    /// Sends `rows` in order and returns the broker's verdicts on them, in
    /// the rows' order. Sending in order is what keeps a key's records in
    /// order: the idempotent producer never reorders within a partition.
    pub(crate) async fn send_all(&self, rows: &[OutboxRow], lane: Lane) -> BoxFuture<'static, Vec<Result<(), PublishError>>> {
        let producer = self.producer(lane).current();
        let mut deliveries = Vec::with_capacity(rows.len());
        for row in rows {
            let topic = self.routes.topic_for(&row.event.event_type, &row.event.topic);
            deliveries.push(send(&producer, row, topic, self.dataschema_base.as_deref()).await);
        }
        let keep = Retiring(Some(producer));
        async move {
            let verdicts = in_order(deliveries).await;
            drop(keep);
            verdicts
        }
        .boxed()
    }

    /// Called with a batch's verdicts: replaces the batch's producer if it
    /// failed fatally (unless the relay's share has moved on from it).
    pub(crate) fn check_fatal(&self, verdicts: &[Result<(), PublishError>], lane: Lane) {
        if !verdicts.iter().any(|v| v.as_ref().is_err_and(|e| e.fatal)) {
            return;
        }
        let producer = match lane {
            Lane::Live => Arc::clone(&self.live),
            Lane::Backlog { .. } => Arc::clone(&self.backlog.lock().unwrap_or_else(PoisonError::into_inner)),
        };
        if producer.lane == lane {
            error!(?lane, "kafka producer failed fatally; replacing it");
            producer.replace();
        }
    }
}

fn micros(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64
}

/// The backlog producers' settings with the linger of one share.
fn backlog_config(base: &ClientConfig, linger_ms: f64) -> ClientConfig {
    let mut config = base.clone();
    config.set("linger.ms", format!("{linger_ms}"));
    config
}

/// Keeps a producer alive while a batch sent through it awaits its verdicts,
/// and retires it if it was replaced meanwhile.
struct Retiring(Option<Arc<FutureProducer>>);

impl Drop for Retiring {
    fn drop(&mut self) {
        if let Some(producer) = self.0.take() {
            retire(producer);
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
    use herald_envelope::OutboxEvent;

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

    fn backlog_setting(publisher: &Publisher, key: &str) -> Option<String> {
        publisher.backlog.lock().unwrap().config.get(key).map(str::to_owned)
    }

    fn publisher(kafka: &KafkaConfig, relay: &RelayConfig) -> Publisher {
        Publisher::new(kafka, relay, Arc::default()).expect("a publisher")
    }

    #[test]
    fn both_producers_keep_one_request_out_unless_told_otherwise() {
        let kafka = KafkaConfig::new("127.0.0.1:9");
        let publisher = publisher(&kafka, &RelayConfig::default());
        assert_eq!(publisher.live.config.get(MAX_IN_FLIGHT), Some(MAX_IN_FLIGHT_PER_BROKER));
        assert_eq!(backlog_setting(&publisher, MAX_IN_FLIGHT).as_deref(), Some(MAX_IN_FLIGHT_PER_BROKER));

        let relay = RelayConfig { producer: vec![(MAX_IN_FLIGHT.to_owned(), "3".to_owned())], ..RelayConfig::default() };
        let publisher = super::tests::publisher(&kafka, &relay);
        assert_eq!(publisher.live.config.get(MAX_IN_FLIGHT), Some("3"), "a user's override wins");
        assert_eq!(backlog_setting(&publisher, MAX_IN_FLIGHT).as_deref(), Some("3"));
    }

    #[tokio::test]
    async fn the_backlog_linger_follows_the_relays_share_of_the_slices() {
        let kafka = KafkaConfig::new("127.0.0.1:9");
        let publisher = publisher(&kafka, &RelayConfig::default());
        assert_eq!(backlog_setting(&publisher, "linger.ms").as_deref(), Some("50"), "holding every slice");
        assert_eq!(publisher.live.config.get("linger.ms"), Some("5"), "the live producer does not linger for company");
        for (held, linger) in [(4, "200"), (16, "50"), (1, "800"), (0, "800"), (99, "50")] {
            publisher.producer(Publisher::backlog_lane(held));
            assert_eq!(backlog_setting(&publisher, "linger.ms").as_deref(), Some(linger), "holding {held}");
            assert_eq!(RelayCounters::get(&publisher.counters.backlog_linger_us), linger.parse::<u64>().unwrap() * 1000);
        }

        let relay = RelayConfig { producer: vec![("linger.ms".to_owned(), "2.5".to_owned())], ..RelayConfig::default() };
        let publisher = super::tests::publisher(&kafka, &relay);
        assert_eq!(publisher.live.config.get("linger.ms"), Some("2.5"), "a user's linger, as given");
        assert_eq!(backlog_setting(&publisher, "linger.ms").as_deref(), Some("2.5"));
        publisher.producer(Publisher::backlog_lane(8));
        assert_eq!(backlog_setting(&publisher, "linger.ms").as_deref(), Some("5"), "and scaled to the share");
    }

    fn rows(numbers: std::ops::Range<i64>) -> Vec<OutboxRow> {
        let event = |n: i64| OutboxEvent {
            id: format!("event-{n}"),
            source: "/publish-test".to_owned(),
            event_type: "test.happened".to_owned(),
            subject: format!("key-{}", n % 5),
            time: Default::default(),
            schema_file: String::new(),
            data: b"{}".to_vec(),
            content_type: herald_envelope::JSON_CONTENT_TYPE.to_owned(),
            extensions: Default::default(),
            topic: String::new(),
            partition_key: format!("key-{}", n % 5),
            trace: None,
        };
        numbers.map(|seq| OutboxRow { seq, attempts: 0, next_attempt_at_ms: None, xid: 0, event: event(seq) }).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_out_through_a_producer_the_share_replaced_still_gets_its_verdicts() {
        let broker = herald_kafka::EmbeddedKafka::start(1, &["published"], 3).expect("the mock cluster");
        let relay = RelayConfig { routes: Routes::to("published"), ..RelayConfig::default() };
        let publisher = publisher(&KafkaConfig::new(broker.bootstrap_servers()), &relay);

        // Still lingering (50 ms) when the relay's share changes: the next
        // full batch goes through a producer lingering 200 ms.
        let first = publisher.send_all(&rows(0..50), Publisher::backlog_lane(16)).await;
        let second = publisher.send_all(&rows(50..100), Publisher::backlog_lane(4)).await;
        assert_eq!(backlog_setting(&publisher, "linger.ms").as_deref(), Some("200"));

        for (batch, verdicts) in [("first", first.await), ("second", second.await)] {
            let failed: Vec<_> = verdicts.iter().filter_map(|v| v.as_ref().err()).collect();
            assert!(failed.is_empty(), "the {batch} batch: {failed:?}");
            assert_eq!(verdicts.len(), 50);
        }
    }
}
