//! The broker's figures: end offsets of Herald's topics and, per
//! subscription, what its consumer group has committed. Lag is the
//! difference; a group counts only what it *committed*, which trails what it
//! applied by up to the auto-commit interval (a second).
//!
//! The same metadata request also gives each partition's replicas, in-sync
//! replicas and leader; with the topics' configs ([`crate::topics`]) they
//! make the durability figures.
//!
//! librdkafka's metadata, watermark and offset calls block, so they run on
//! the blocking pool. The clients are made once and kept: a probe refreshed
//! every second does not open new connections each time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use herald_kafka::{KafkaConfig, Topics};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use crate::StatusError;
use crate::durability::{PartitionReplicas, TopicDurability};
use crate::figures::{GroupLag, KafkaFigures, PartitionLag};
use crate::topics::{ConfigReader, partition_replicas};

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
    configs: ConfigReader,
    timeout: Duration,
}

/// `(partition, low, high)` of one partition.
type Watermarks = (i32, i64, i64);

impl KafkaProbe {
    /// A probe of `topics` and of the groups `<group_prefix>.<subscription>`
    /// on the events topic. Nothing is sent yet; `timeout` bounds each call.
    pub fn new(
        kafka: &KafkaConfig,
        topics: &Topics,
        group_prefix: &str,
        subscriptions: &[&str],
        timeout: Duration,
    ) -> Result<KafkaProbe, KafkaError> {
        // Never joins the group or commits for it: it only asks.
        let client = |group: &str| -> Result<BaseConsumer, KafkaError> { kafka.group_admin(group).create() };
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
            configs: ConfigReader::new(kafka, timeout)?,
            timeout,
        };
        Ok(KafkaProbe { inner: Arc::new(inner) })
    }

    /// End offsets of every topic, the lag of every group and the
    /// durability of every topic. Configs the broker cannot describe are
    /// left unknown; everything else failing fails the whole.
    pub async fn collect(&self) -> Result<KafkaFigures, StatusError> {
        let inner = self.inner.clone();
        let read = tokio::task::spawn_blocking(move || inner.collect()).await.map_err(|e| StatusError::Probe(e.to_string()))??;
        let topics = &self.inner.topics;
        let configs = self.inner.configs.describe(topics, read.broker).await;
        let mut figures = read.figures;
        figures.topics =
            topics.iter().zip(read.replicas).zip(configs).map(|((topic, parts), c)| TopicDurability::of(topic, &parts, c)).collect();
        Ok(figures)
    }
}

/// What the blocking half read.
struct Read {
    /// Everything but the topics' durability.
    figures: KafkaFigures,
    /// Each topic's partitions, in `Inner::topics` order.
    replicas: Vec<Vec<PartitionReplicas>>,
    /// A broker that just answered the metadata request.
    broker: i32,
}

impl Inner {
    fn collect(&self) -> Result<Read, StatusError> {
        let mut end_offsets = BTreeMap::new();
        let mut events = Vec::new();
        let mut replicas = Vec::new();
        let mut broker = -1;
        for topic in &self.topics {
            let (marks, parts, answered_by) = self.partitions(topic)?;
            end_offsets.insert(topic.clone(), marks.iter().map(|(_, _, high)| high).sum());
            replicas.push(parts);
            broker = answered_by;
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
        Ok(Read { figures: KafkaFigures { end_offsets, groups, topics: Vec::new() }, replicas, broker })
    }

    /// Watermarks of every partition of `topic`, sorted, the partitions'
    /// replication as the same metadata answer gives it, and the id of the
    /// broker that answered.
    fn partitions(&self, topic: &str) -> Result<(Vec<Watermarks>, Vec<PartitionReplicas>, i32), StatusError> {
        let metadata = self.reader.fetch_metadata(Some(topic), self.timeout)?;
        let mut marks = Vec::new();
        let mut replicas = Vec::new();
        for t in metadata.topics() {
            if let Some(e) = t.error() {
                return Err(KafkaError::MetadataFetch(e.into()).into());
            }
            for p in t.partitions() {
                let (low, high) = self.reader.fetch_watermarks(topic, p.id(), self.timeout)?;
                marks.push((p.id(), low, high));
            }
            replicas.extend(partition_replicas(t));
        }
        marks.sort_unstable();
        Ok((marks, replicas, metadata.orig_broker_id()))
    }

    fn committed(&self, client: &BaseConsumer, marks: &[Watermarks]) -> Result<Vec<PartitionLag>, StatusError> {
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
