//! Where the notify subscription starts when its group has no position.
//!
//! A consumer group without committed offsets starts at the earliest
//! retained record (`auto.offset.reset=earliest`), which is right for
//! projections — they are rebuilt from history — and wrong for
//! notifications: a fresh deployment pointed at old history would notify
//! people about every export still retained. So the notify subscription
//! refuses to start from history. Rule, per partition of the events topic
//! without a committed offset for the notify group:
//!
//! - the partition holds no records (low == high watermark): no history, so
//!   nothing to refuse — the group's offset is committed at the high
//!   watermark and it starts there (a fresh, empty deployment just works);
//! - it holds records and the operator passed `--start-at latest`: the
//!   group's offset is committed at the high watermark read now (records
//!   appended from then on are notified; nothing retained before);
//! - `--start-at <RFC3339 time>`: committed at the first record at or after
//!   that time (the high watermark if none is that recent);
//! - otherwise: refused, naming the partitions and how many records they hold.
//!
//! Partitions with a committed offset keep it: `--start-at` never moves a
//! group that already has a position (a rewind is for `herald dlq`/rebuild
//! decisions, not a start flag).
//!
//! A decision is recorded in the database (`start_positions`) before its
//! offsets are committed to Kafka. A process that dies in between (on a
//! fresh cluster the commit waits for the group coordinator to come up)
//! leaves its decision behind, and the next start commits those positions
//! instead of deciding again on a topic that has gained records meanwhile,
//! which it would have to refuse for good.

use std::fmt;

use chrono::DateTime;
use herald_consumer::Subscription;
use herald_kafka::offsets::{self, PartitionState};
use herald_store::{Db, StoreError, start_positions};
use rdkafka::error::KafkaError;
use thiserror::Error;
use tracing::{info, warn};

/// `--start-at`: where a notify group without a position begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    /// After everything retained now.
    Latest,
    /// At the first record at or after this time (epoch ms).
    Time(i64),
}

/// clap value parser: `latest` or an RFC 3339 timestamp.
pub fn parse_start_at(value: &str) -> Result<StartAt, String> {
    if value == "latest" {
        return Ok(StartAt::Latest);
    }
    DateTime::parse_from_rfc3339(value)
        .map(|t| StartAt::Time(t.timestamp_millis()))
        .map_err(|e| format!("`{value}`: expected `latest` or an RFC 3339 timestamp such as 2026-11-29T12:00:00Z ({e})"))
}

/// The notify subscription would start from history: the operator decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub group: String,
    pub topic: String,
    /// (partition, low watermark, high watermark) of each partition with
    /// history and no committed offset.
    pub partitions: Vec<(i32, i64, i64)>,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held: i64 = self.partitions.iter().map(|(_, low, high)| high - low).sum();
        let list: Vec<String> = self.partitions.iter().map(|(p, low, high)| format!("{p} (offsets {low}..{high})")).collect();
        write!(
            f,
            "refusing to start notifications from history: consumer group `{}` has no committed offset on {} and the topic holds \
             {held} retained record(s) there (partitions {}), which would all be notified again. Pass --start-at latest to \
             notify only what is appended from now on, or --start-at <RFC3339 time> to start at that time \
             (herald serve: --notify-start-at)",
            self.group,
            self.topic,
            list.join(", ")
        )
    }
}

impl std::error::Error for Refused {}

/// Why the notify subscription did not get a start position.
#[derive(Debug, Error)]
pub enum StartError {
    /// It would start from history: the operator decides (`--start-at`).
    #[error(transparent)]
    Refused(#[from] Refused),
    /// The database failed reading or recording the decision: retry the start.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker failed reading watermarks or committing the position:
    /// retry the start (a recorded decision is committed then).
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
}

/// Gives the notify group a position where it has none, by the rule above,
/// or refuses. Run before the subscription joins its group.
pub async fn prepare(db: &Db, sub: &Subscription, start_at: Option<StartAt>) -> Result<(), StartError> {
    for topic in &sub.topics {
        let states = offsets::partition_states(&sub.kafka, &sub.group, topic).await?;
        let unpositioned: Vec<PartitionState> = states.into_iter().filter(|s| s.committed.is_none()).collect();
        if unpositioned.is_empty() {
            if start_at.is_some() {
                warn!(group = %sub.group, topic, "--start-at ignored: the group already has committed offsets");
            }
            continue;
        }
        let recorded = start_positions::recorded(db, &sub.group, topic).await?;
        let decided: Vec<(i32, i64)> = recorded.iter().copied().filter(|(p, _)| unpositioned.iter().any(|s| s.partition == *p)).collect();
        if decided.len() == unpositioned.len() {
            info!(group = %sub.group, topic, ?decided, "committing the start position decided before a restart");
            offsets::commit(&sub.kafka, &sub.group, topic, &decided).await?;
            continue;
        }
        let with_history: Vec<&PartitionState> = unpositioned.iter().filter(|s| s.has_records()).collect();
        let commit: Vec<(i32, i64)> = match start_at {
            None if !with_history.is_empty() => {
                return Err(Refused {
                    group: sub.group.clone(),
                    topic: topic.clone(),
                    partitions: with_history.iter().map(|s| (s.partition, s.low, s.high)).collect(),
                }
                .into());
            }
            None | Some(StartAt::Latest) => unpositioned.iter().map(|s| (s.partition, s.high)).collect(),
            Some(StartAt::Time(ms)) => offsets::offsets_for_time(&sub.kafka, topic, &unpositioned, ms).await?,
        };
        start_positions::record(db, &sub.group, topic, &commit).await?;
        match offsets::commit(&sub.kafka, &sub.group, topic, &commit).await {
            Ok(()) => info!(group = %sub.group, topic, ?commit, "notify start position committed"),
            // Without history the position is a convenience (the group starts
            // at the same place by itself); a chosen start must hold.
            Err(e) if start_at.is_none() => {
                warn!(group = %sub.group, topic, error = %e, "could not commit the start position of an empty topic")
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_at_parses_latest_and_rfc3339_only() {
        assert_eq!(parse_start_at("latest"), Ok(StartAt::Latest));
        assert_eq!(parse_start_at("1970-01-01T00:00:01Z"), Ok(StartAt::Time(1000)));
        assert!(parse_start_at("earliest").is_err());
        assert!(parse_start_at("yesterday").unwrap_err().contains("RFC 3339"));
    }
}
