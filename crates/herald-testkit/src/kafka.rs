//! Reading back everything a topic holds, to check what a relay published.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// One record as the tests look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    /// The CloudEvents `id` header (binary content mode).
    pub ce_id: String,
    /// The `ce_traceparent` header (distributed-tracing extension), if any.
    pub ce_traceparent: Option<String>,
    /// Every header, by name (the last one of a name wins).
    pub headers: std::collections::BTreeMap<String, String>,
    pub value: Vec<u8>,
}

/// Every record of `topic` up to the high watermarks at the time of the
/// call, per partition in offset order (partitions one after the other).
pub fn read_all(brokers: &str, topic: &str, partitions: i32) -> anyhow::Result<Vec<Record>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", crate::unique("herald-testkit-reader"))
        .set("enable.auto.commit", "false")
        .create()
        .context("creating a reader")?;
    let mut records = Vec::new();
    for partition in 0..partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, partition, Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{partition}"))?;
        if high == 0 {
            continue;
        }
        let mut assignment = TopicPartitionList::new();
        assignment.add_partition_offset(topic, partition, Offset::Beginning)?;
        consumer.assign(&assignment)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut next = 0;
        let mut last_error = None;
        while next < high {
            anyhow::ensure!(Instant::now() < deadline, "{topic}/{partition}: read {next} of {high} records (last error: {last_error:?})");
            let Some(message) = consumer.poll(Duration::from_millis(200)) else { continue };
            // librdkafka reports a node it cannot reach (one a test killed)
            // through poll as well, and goes on with the others: not the
            // end of the read.
            let message = match message {
                Ok(message) => message,
                Err(e) => {
                    last_error = Some(e);
                    continue;
                }
            };
            next = message.offset() + 1;
            let header = |name: &str| {
                message
                    .headers()
                    .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            let (ce_id, ce_traceparent) = (header("ce_id").unwrap_or_default(), header("ce_traceparent"));
            let key = message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default();
            let headers = message
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_owned(), h.value.map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default()))
                        .collect()
                })
                .unwrap_or_default();
            let value = message.payload().unwrap_or_default().to_vec();
            records.push(Record { partition, offset: message.offset(), key, ce_id, ce_traceparent, headers, value });
        }
    }
    Ok(records)
}

/// The first occurrence of each id, per key, in the order the topic holds
/// them: what an inbox-deduplicating consumer applies.
pub fn first_occurrences_by_key(records: &[Record]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut seen = std::collections::HashSet::new();
    let mut by_key: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for r in records {
        if seen.insert(r.ce_id.clone()) {
            by_key.entry(r.key.clone()).or_default().push(r.ce_id.clone());
        }
    }
    by_key
}

/// The names of the cluster's topics that start with `prefix`, as the
/// metadata says now (a deletion reaches it shortly after it is accepted).
pub fn topics_starting_with(brokers: &str, prefix: &str) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let client: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers).create().context("creating a metadata reader")?;
    let metadata = client.fetch_metadata(None, Duration::from_secs(30)).context("fetching the cluster's metadata")?;
    Ok(metadata.topics().iter().map(|t| t.name().to_owned()).filter(|t| t.starts_with(prefix)).collect())
}
