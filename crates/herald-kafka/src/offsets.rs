//! Where a consumer group stands on a topic, and moving it there on purpose:
//! committed offsets next to the partitions' watermarks, committing chosen
//! offsets for a group that is not running, and finding the first offset at
//! or after a time. Blocking librdkafka calls run on the blocking pool.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::KafkaConfig;

const TIMEOUT: Duration = Duration::from_secs(30);

/// One partition as a group sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionState {
    pub partition: i32,
    /// The group's committed offset; `None` when it never committed one.
    pub committed: Option<i64>,
    /// Earliest retained offset (low watermark).
    pub low: i64,
    /// Offset the next record will get (high watermark).
    pub high: i64,
}

impl PartitionState {
    /// The partition holds records (retained history).
    pub fn has_records(&self) -> bool {
        self.high > self.low
    }
}

fn client(kafka: &KafkaConfig, group: &str) -> Result<BaseConsumer, KafkaError> {
    kafka.group_admin(group).create()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, KafkaError> + Send + 'static) -> Result<T, KafkaError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| KafkaError::ClientCreation(format!("offsets thread: {e}")))?
}

/// Retries `op` while the cluster is moving under it: the group's
/// coordinator not ready (being elected, loading its partition of
/// `__consumer_offsets`, or that topic still being created on a fresh
/// cluster), a partition's leadership moving after a broker died, a
/// connection to a broker that just went away. Within [`TIMEOUT`]. These
/// answers mean "ask again soon", not "no offsets": a caller that gave up on
/// them would take a fresh deployment's first start for a failure and, by
/// the time it tried again, find history it must refuse to notify.
fn while_cluster_moves<T>(mut op: impl FnMut() -> Result<T, KafkaError>) -> Result<T, KafkaError> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut pause = Duration::from_millis(100);
    loop {
        match op() {
            Err(e) if cluster_moving(&e) && std::time::Instant::now() + pause < deadline => {
                tracing::debug!(error = %e, "the cluster is moving; asking again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            other => return other,
        }
    }
}

fn cluster_moving(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorNotAvailable
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
                | RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::DestroyBroker
        )
    )
}

/// Every partition of `topic`: `group`'s committed offset and the watermarks.
pub async fn partition_states(kafka: &KafkaConfig, group: &str, topic: &str) -> Result<Vec<PartitionState>, KafkaError> {
    let (kafka, group, topic) = (kafka.clone(), group.to_owned(), topic.to_owned());
    blocking(move || {
        let client = client(&kafka, &group)?;
        while_cluster_moves(|| states(&client, &topic))
    })
    .await
}

fn states(client: &BaseConsumer, topic: &str) -> Result<Vec<PartitionState>, KafkaError> {
    let marks = fetch_watermarks(client, topic, TIMEOUT)?;
    let mut tpl = TopicPartitionList::new();
    for m in &marks {
        tpl.add_partition(topic, m.partition);
    }
    let committed = client.committed_offsets(tpl, TIMEOUT)?;
    let out = marks
        .into_iter()
        .map(|m| {
            let committed = match committed.find_partition(topic, m.partition).map(|e| e.offset()) {
                Some(Offset::Offset(n)) => Some(n),
                _ => None,
            };
            PartitionState { partition: m.partition, committed, low: m.low, high: m.high }
        })
        .collect();
    Ok(out)
}

/// One partition's retained range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermarks {
    pub partition: i32,
    /// Earliest retained offset.
    pub low: i64,
    /// Offset the next record will get.
    pub high: i64,
}

/// Every partition of `topic` with its watermarks, in partition order; empty
/// when the topic does not exist.
pub async fn watermarks(kafka: &KafkaConfig, topic: &str) -> Result<Vec<Watermarks>, KafkaError> {
    let (kafka, topic) = (kafka.clone(), topic.to_owned());
    blocking(move || {
        let client: BaseConsumer = kafka.reader().create()?;
        while_cluster_moves(|| fetch_watermarks(&client, &topic, TIMEOUT))
    })
    .await
}

/// [`watermarks`] through a client the caller already has (blocking).
pub fn fetch_watermarks(client: &BaseConsumer, topic: &str, timeout: Duration) -> Result<Vec<Watermarks>, KafkaError> {
    let metadata = client.fetch_metadata(Some(topic), timeout)?;
    let mut out = Vec::new();
    for p in metadata.topics().iter().flat_map(|t| t.partitions()) {
        let (low, high) = client.fetch_watermarks(topic, p.id(), timeout)?;
        out.push(Watermarks { partition: p.id(), low, high });
    }
    out.sort_by_key(|m| m.partition);
    Ok(out)
}

/// Commits `offsets` (partition, next offset to read) for `group`, which must
/// not be running: the commit is made outside any group generation.
pub async fn commit(kafka: &KafkaConfig, group: &str, topic: &str, offsets: &[(i32, i64)]) -> Result<(), KafkaError> {
    let (kafka, group, topic, offsets) = (kafka.clone(), group.to_owned(), topic.to_owned(), offsets.to_vec());
    blocking(move || {
        if offsets.is_empty() {
            return Ok(());
        }
        let client = client(&kafka, &group)?;
        let mut tpl = TopicPartitionList::new();
        for (p, offset) in &offsets {
            tpl.add_partition_offset(&topic, *p, Offset::Offset(*offset))?;
        }
        while_cluster_moves(|| client.commit(&tpl, CommitMode::Sync))
    })
    .await
}

/// Per partition, the first offset whose record time is at or after
/// `time_ms`; the high watermark where no record is that recent.
pub async fn offsets_for_time(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: &[PartitionState],
    time_ms: i64,
) -> Result<Vec<(i32, i64)>, KafkaError> {
    let (kafka, topic, partitions) = (kafka.clone(), topic.to_owned(), partitions.to_vec());
    blocking(move || {
        let client = client(&kafka, "herald.offsets-for-time")?;
        let mut tpl = TopicPartitionList::new();
        for p in &partitions {
            tpl.add_partition_offset(&topic, p.partition, Offset::Offset(time_ms))?;
        }
        let found = client.offsets_for_times(tpl, TIMEOUT)?;
        // "No record that recent" comes back as the end offset (-1).
        Ok(partitions
            .iter()
            .map(|p| match found.find_partition(&topic, p.partition).map(|e| e.offset()) {
                Some(Offset::Offset(n)) if n >= 0 && n < p.high => (p.partition, n),
                _ => (p.partition, p.high),
            })
            .collect())
    })
    .await
}
