//! The latency benchmark's plain consumer of a load's topic: when each
//! probe's record becomes readable.
//!
//! It outlives receive errors. On a cluster just started, a topic created a
//! moment ago may not have reached every broker yet, and the consumer
//! reports `UnknownTopicOrPartition` before it finds the topic; an observer
//! that ended there left the benchmark waiting 120 s for records it would
//! never count, and failing with "read nothing".

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herald_kafka::KafkaConfig;
use rdkafka::Message;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Headers;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::probes::Probes;

/// How long [`Observer::read`] waits for the records it is told of.
const WITHIN: Duration = Duration::from_secs(120);
const CHECK_EVERY: Duration = Duration::from_millis(2);

/// A running observer: a consumer in a group of its own, from the topic's
/// start, until the `stop` it was started with.
pub(super) struct Observer {
    counts: Arc<Counts>,
    task: JoinHandle<anyhow::Result<()>>,
}

#[derive(Default)]
struct Counts {
    records: AtomicU64,
    errors: AtomicU64,
    last_error: Mutex<Option<String>>,
}

impl Observer {
    pub(super) fn start(kafka: &KafkaConfig, topic: &str, probes: &Probes, stop: &CancellationToken) -> anyhow::Result<Observer> {
        let consumer: StreamConsumer = kafka.consumer(&format!("latency-observer-{}", uuid::Uuid::new_v4())).create()?;
        consumer.subscribe(&[topic])?;
        let counts = Arc::new(Counts::default());
        let task = tokio::spawn(observe(consumer, probes.clone(), Arc::clone(&counts), stop.clone()));
        Ok(Observer { counts, task })
    }

    /// Until the observer has read `n` records in all; fails after 120 s, or
    /// at once if the observer ended. It ends only when stopped or when it
    /// panicked (a receive error does not end it; the panic is on stderr),
    /// so the task is not awaited here: awaiting it again in
    /// [`Observer::finish`] would poll a finished handle.
    pub(super) async fn read(&self, n: u64) -> anyhow::Result<()> {
        let deadline = Instant::now() + WITHIN;
        while self.counts.records.load(Ordering::SeqCst) < n {
            anyhow::ensure!(!self.task.is_finished(), "the topic observer ended (stopped or panicked) before reading {n} records");
            if Instant::now() >= deadline {
                let last = self.counts.last_error.lock().map(|e| e.clone()).unwrap_or_default();
                anyhow::bail!(
                    "the topic observer read {} of {n} records in {WITHIN:?} ({} receive errors, the last: {})",
                    self.counts.records.load(Ordering::SeqCst),
                    self.errors(),
                    last.as_deref().unwrap_or("none")
                );
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
        Ok(())
    }

    /// Receive errors seen so far.
    pub(super) fn errors(&self) -> u64 {
        self.counts.errors.load(Ordering::SeqCst)
    }

    /// Once `stop` was cancelled: the observer's end.
    pub(super) async fn finish(self) -> anyhow::Result<()> {
        self.task.await?
    }
}

async fn observe(consumer: StreamConsumer, probes: Probes, counts: Arc<Counts>, stop: CancellationToken) -> anyhow::Result<()> {
    loop {
        let received = tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            received = consumer.recv() => received,
        };
        let message = match received {
            Ok(message) => message,
            Err(e) => {
                warn!(error = %e, "the topic observer's receive failed; receiving on");
                counts.errors.fetch_add(1, Ordering::SeqCst);
                if let Ok(mut last) = counts.last_error.lock() {
                    *last = Some(e.to_string());
                }
                continue;
            }
        };
        let at = Instant::now();
        counts.records.fetch_add(1, Ordering::SeqCst);
        let id = message.headers().and_then(|h| h.iter().find(|h| h.key == "ce_id").and_then(|h| h.value.map(<[u8]>::to_vec)));
        if let Some(id) = id.and_then(|v| String::from_utf8(v).ok()) {
            probes.on_topic(&id, at);
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::Utc;
    use herald_envelope::OutboxEvent;
    use herald_kafka::TopicSettings;

    use super::*;
    use crate::bench::workload;

    /// The window a freshly started cluster opened: the observer subscribed
    /// while its topic was unknown to the broker it asked. Here the topic is
    /// created only after the observer has reported the error, so the
    /// record it must count comes after that error, every time.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_observer_counts_records_after_its_topic_was_unknown_real_broker() -> anyhow::Result<()> {
        let brokers = herald_testkit::real_broker()?;
        // Report an unknown topic at once, and look for it again soon after.
        let kafka =
            KafkaConfig::new(brokers).with("topic.metadata.propagation.max.ms", "0").with("topic.metadata.refresh.interval.ms", "200");
        let topic = herald_testkit::unique("latency-observer");
        let stop = CancellationToken::new();
        let observer = Observer::start(&kafka, &topic, &Probes::default(), &stop)?;
        herald_testkit::wait_until("the observer to report the unknown topic", Duration::from_secs(60), || async {
            Ok(observer.errors() > 0 || observer.task.is_finished())
        })
        .await?;
        herald_kafka::ensure_topics(&kafka, &[&topic], TopicSettings::partitions(1)).await?;
        let producer = workload::producer(&kafka)?;
        let event = OutboxEvent::new(&topic, "after-the-error", &workload::completion("observer", 0), Utc::now())?;
        workload::publish(&producer, std::slice::from_ref(&event)).await?;
        observer.read(1).await?;
        stop.cancel();
        observer.finish().await?;
        super::super::broker::delete_topics(&kafka, &[&topic]).await
    }
}
