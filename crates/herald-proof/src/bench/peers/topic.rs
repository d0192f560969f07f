//! What lands on a system's topic: created with the broker's clock on every
//! record (`message.timestamp.type=LogAppendTime`), so "first record to last
//! record" is measured by the broker, not by either producer; read back in
//! full to count every record and check per-key order.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use herald_kafka::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::load::Payload;

pub(super) async fn create(kafka: &KafkaConfig, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = kafka.admin().create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(3))
        .set("min.insync.replicas", "2")
        .set("message.timestamp.type", "LogAppendTime");
    for result in admin.create_topics([&new], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)))).await? {
        result.map_err(|(name, code)| anyhow::anyhow!("creating topic {name}: {code}"))?;
    }
    Ok(())
}

/// The records on `topic`: how many, the broker's first and last append
/// time of the backlog's records, and whether each key's sequence arrived
/// in order (a key's numbers have gaps on a topic: the latency phases write
/// to one system's table at a time).
#[derive(Debug, Clone)]
pub(super) struct Drained {
    pub records: u64,
    /// Distinct backlog events (numbered below the backlog size) on the topic.
    pub backlog_records: u64,
    pub first_ms: i64,
    pub last_ms: i64,
    pub out_of_order: u64,
    pub duplicates: u64,
}

impl Drained {
    pub fn eps(&self) -> f64 {
        self.records as f64 / ((self.last_ms - self.first_ms).max(1) as f64 / 1000.0)
    }
}

/// How many records a topic holds: the sum of its partitions' end offsets,
/// read with one long-lived client (progress is polled every 100 ms).
pub(super) struct EndOffsets {
    reader: BaseConsumer,
    topic: String,
    partitions: i32,
}

impl EndOffsets {
    pub fn new(kafka: &KafkaConfig, topic: &str, partitions: i32) -> anyhow::Result<EndOffsets> {
        Ok(EndOffsets { reader: kafka.reader().create()?, topic: topic.to_owned(), partitions })
    }

    pub fn total(&self) -> anyhow::Result<u64> {
        let mut total = 0;
        for p in 0..self.partitions {
            let (_, high) = self.reader.fetch_watermarks(&self.topic, p, Duration::from_secs(10))?;
            total += u64::try_from(high)?;
        }
        Ok(total)
    }
}

/// Reads all of `topic` (blocking): the `expected` records its end offsets
/// count, of which those numbered below `backlog` timed the drain.
pub(super) fn read_all(kafka: &KafkaConfig, topic: &str, partitions: i32, expected: u64, backlog: u64) -> anyhow::Result<Drained> {
    let reader: BaseConsumer = kafka.reader().create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    reader.assign(&tpl)?;
    let (mut records, mut first, mut last) = (0u64, i64::MAX, i64::MIN);
    let (mut out_of_order, mut duplicates) = (0u64, 0u64);
    let mut seq: HashMap<String, u64> = HashMap::new();
    let mut backlog_seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    while records < expected {
        anyhow::ensure!(Instant::now() < deadline, "read {records} of {expected} records of {topic}");
        match reader.poll(Duration::from_secs(1)) {
            None => {}
            Some(Err(e)) => anyhow::bail!("reading {topic}: {e}"),
            Some(Ok(msg)) => {
                records += 1;
                let payload: Payload = serde_json::from_slice(msg.payload().unwrap_or_default())?;
                if payload.n < backlog {
                    backlog_seen.insert(payload.n);
                    let at = msg.timestamp().to_millis().unwrap_or_default();
                    (first, last) = (first.min(at), last.max(at));
                }
                let previous = seq.insert(payload.key, payload.seq).unwrap_or(0);
                if payload.seq == previous {
                    duplicates += 1;
                } else if payload.seq < previous {
                    out_of_order += 1;
                }
            }
        }
    }
    Ok(Drained { records, backlog_records: backlog_seen.len() as u64, first_ms: first, last_ms: last, out_of_order, duplicates })
}

/// Records seen on `topic` from its end onward: each payload's `n` with the
/// instant it was read. Says `ready` once it reads from the current end;
/// runs until `stop`.
fn watch(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
    stop: &AtomicBool,
    ready: mpsc::Sender<()>,
) -> anyhow::Result<Vec<(u64, Instant)>> {
    let reader: BaseConsumer = kafka.reader().set("fetch.wait.max.ms", "5").create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (_, high) = reader.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        tpl.add_partition_offset(topic, p, Offset::Offset(high))?;
    }
    reader.assign(&tpl)?;
    let _ = ready.send(());
    let mut seen = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        if let Some(msg) = reader.poll(Duration::from_millis(50)) {
            let msg = msg?;
            let payload: Payload = serde_json::from_slice(msg.payload().unwrap_or_default())?;
            seen.push((payload.n, Instant::now()));
        }
    }
    Ok(seen)
}

/// [`watch`] on a thread of its own.
pub(super) struct Watcher {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<Vec<(u64, Instant)>>>,
}

impl Watcher {
    /// Returns once the watcher reads from the topic's current end.
    pub fn start(kafka: &KafkaConfig, topic: &str, partitions: i32) -> anyhow::Result<Watcher> {
        let stop = Arc::new(AtomicBool::new(false));
        let (kafka, topic, flag) = (kafka.clone(), topic.to_owned(), stop.clone());
        let (ready, started) = mpsc::channel();
        let thread = std::thread::spawn(move || watch(&kafka, &topic, partitions, &flag, ready));
        if started.recv().is_err() {
            // The thread ended before it was ready: its result says why.
            return Err(thread
                .join()
                .map_err(|_| anyhow::anyhow!("the topic watcher panicked"))?
                .err()
                .unwrap_or_else(|| anyhow::anyhow!("the topic watcher stopped")));
        }
        Ok(Watcher { stop, thread })
    }

    pub fn finish(self) -> anyhow::Result<Vec<(u64, Instant)>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| anyhow::anyhow!("the topic watcher panicked"))?
    }
}
