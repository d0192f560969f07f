//! The broker's figures: end offsets of Herald's topics and, per
//! subscription, what its consumer group has committed. Lag is the
//! difference; a group counts only what it *committed*, which trails what it
//! applied by up to the auto-commit interval (a second).
//!
//! librdkafka's metadata, watermark and offset calls block, so they run on
//! the blocking pool. The clients are made once and kept: a probe refreshed
//! every second does not open new connections each time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use herald_kafka::Topics;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::StatusError;
use crate::figures::{GroupLag, KafkaFigures, PartitionLag};

/// Asks one cluster about Herald's topics and subscriptions' groups.
#[derive(Clone)]
pub struct KafkaProbe {
    inner: Arc<Inner>,
}

struct Inner {
    topics: Vec<String>,
    events: String,
    /// Reads metadata and watermarks.
    reader: BaseConsumer,
    /// `(subscription, group, client with that group.id)`: committed offsets
    /// are asked for in the name of the client's own group.
    groups: Vec<(String, String, BaseConsumer)>,
    timeout: Duration,
}

impl KafkaProbe {
    /// A probe of `topics` and of the groups `<group_prefix>.<subscription>`
    /// on the events topic. Nothing is sent yet; `timeout` bounds each call.
    pub fn new(brokers: &str, topics: &Topics, group_prefix: &str, subscriptions: &[&str], timeout: Duration) -> Result<KafkaProbe, KafkaError> {
        let client = |group: &str| -> Result<BaseConsumer, KafkaError> {
            ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .set("group.id", group)
                // Never joins the group or commits for it: it only asks.
                .set("enable.auto.commit", "false")
                .create()
        };
        let groups = subscriptions
            .iter()
            .map(|s| {
                let group = format!("{group_prefix}.{s}");
                Ok(((*s).to_owned(), group.clone(), client(&group)?))
            })
            .collect::<Result<_, KafkaError>>()?;
        let inner = Inner {
            topics: topics.all().iter().map(|t| (*t).to_owned()).collect(),
            events: topics.events.clone(),
            reader: client(&format!("{group_prefix}.status-reader"))?,
            groups,
            timeout,
        };
        Ok(KafkaProbe { inner: Arc::new(inner) })
    }

    /// End offsets of every topic and the lag of every group.
    pub async fn collect(&self) -> Result<KafkaFigures, StatusError> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || inner.collect())
            .await
            .map_err(|e| StatusError::Probe(e.to_string()))?
    }
}

impl Inner {
    fn collect(&self) -> Result<KafkaFigures, StatusError> {
        let mut end_offsets = BTreeMap::new();
        let mut events = Vec::new();
        for topic in &self.topics {
            let marks = self.watermarks(topic)?;
            end_offsets.insert(topic.clone(), marks.iter().map(|(_, _, high)| high).sum());
            if *topic == self.events {
                events = marks;
            }
        }
        let mut groups = Vec::new();
        for (subscription, group, client) in &self.groups {
            let partitions = self.committed(client, &events)?;
            groups.push(GroupLag {
                subscription: subscription.clone(),
                group: group.clone(),
                lag: partitions.iter().map(PartitionLag::lag).sum(),
                partitions,
            });
        }
        Ok(KafkaFigures { end_offsets, groups })
    }

    /// `(partition, low, high)` of every partition of `topic`.
    fn watermarks(&self, topic: &str) -> Result<Vec<(i32, i64, i64)>, StatusError> {
        let metadata = self.reader.fetch_metadata(Some(topic), self.timeout)?;
        let mut out = Vec::new();
        for t in metadata.topics() {
            if let Some(e) = t.error() {
                return Err(KafkaError::MetadataFetch(e.into()).into());
            }
            for p in t.partitions() {
                let (low, high) = self.reader.fetch_watermarks(topic, p.id(), self.timeout)?;
                out.push((p.id(), low, high));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    fn committed(&self, client: &BaseConsumer, marks: &[(i32, i64, i64)]) -> Result<Vec<PartitionLag>, StatusError> {
        let mut tpl = TopicPartitionList::new();
        for (partition, _, _) in marks {
            tpl.add_partition(&self.events, *partition);
        }
        let committed = client.committed_offsets(tpl, self.timeout)?;
        Ok(marks
            .iter()
            .map(|&(partition, low, end)| PartitionLag {
                partition,
                low,
                end,
                committed: match committed.find_partition(&self.events, partition).map(|e| e.offset()) {
                    Some(Offset::Offset(n)) => Some(n),
                    _ => None,
                },
            })
            .collect())
    }
}
