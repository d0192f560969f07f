//! Where a consumer group stands on a topic, and moving it there on purpose:
//! committed offsets next to the partitions' watermarks, committing chosen
//! offsets for a group that is not running, and finding the first offset at
//! or after a time. Blocking librdkafka calls run on the blocking pool.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

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

fn client(brokers: &str, group: &str) -> Result<BaseConsumer, KafkaError> {
    ClientConfig::new().set("bootstrap.servers", brokers).set("group.id", group).set("enable.auto.commit", "false").create()
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
pub async fn partition_states(brokers: &str, group: &str, topic: &str) -> Result<Vec<PartitionState>, KafkaError> {
    let (brokers, group, topic) = (brokers.to_owned(), group.to_owned(), topic.to_owned());
    blocking(move || {
        let client = client(&brokers, &group)?;
        while_cluster_moves(|| states(&client, &topic))
    })
    .await
}

fn states(client: &BaseConsumer, topic: &str) -> Result<Vec<PartitionState>, KafkaError> {
    let metadata = client.fetch_metadata(Some(topic), TIMEOUT)?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
    let mut tpl = TopicPartitionList::new();
    for p in &partitions {
        tpl.add_partition(topic, *p);
    }
    let committed = client.committed_offsets(tpl, TIMEOUT)?;
    let mut out = Vec::with_capacity(partitions.len());
    for p in partitions {
        let (low, high) = client.fetch_watermarks(topic, p, TIMEOUT)?;
        let committed = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(n)) => Some(n),
            _ => None,
        };
        out.push(PartitionState { partition: p, committed, low, high });
    }
    out.sort_by_key(|s| s.partition);
    Ok(out)
}

/// Commits `offsets` (partition, next offset to read) for `group`, which must
/// not be running: the commit is made outside any group generation.
pub async fn commit(brokers: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) -> Result<(), KafkaError> {
    let (brokers, group, topic, offsets) = (brokers.to_owned(), group.to_owned(), topic.to_owned(), offsets.to_vec());
    blocking(move || {
        if offsets.is_empty() {
            return Ok(());
        }
        let client = client(&brokers, &group)?;
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
    brokers: &str,
    topic: &str,
    partitions: &[PartitionState],
    time_ms: i64,
) -> Result<Vec<(i32, i64)>, KafkaError> {
    let (brokers, topic, partitions) = (brokers.to_owned(), topic.to_owned(), partitions.to_vec());
    blocking(move || {
        let client = client(&brokers, "herald.offsets-for-time")?;
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
