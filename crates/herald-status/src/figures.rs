//! The figures as plain data. Everything here is computed from rows and
//! offsets by the collectors; nothing here does IO.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::durability::TopicDurability;

/// One look at the whole system.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// When the figures were taken (epoch ms, this process's clock).
    pub at_ms: i64,
    /// `postgres` or `sqlite`.
    pub backend: String,
    pub outbox: Outbox,
    pub relay: RelayClaims,
    pub subscriptions: Vec<SubscriptionFigures>,
    pub notifications: Notifications,
    pub jobs: Jobs,
    pub generations: Vec<GenerationFigures>,
    /// End offsets and group lag, when the broker answered.
    pub kafka: Option<KafkaFigures>,
    /// Why `kafka` is missing.
    pub kafka_error: Option<String>,
}

/// Rows the relay has not delivered.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Outbox {
    pub pending: i64,
    /// Failed for now, retried after a backoff: still backlog.
    pub retryable_failed: i64,
    /// Set aside for an operator (`herald outbox redrive`): not backlog.
    pub failed: i64,
    pub dead_lettered: i64,
    /// `pending + retryable_failed`: what the relays still have to publish.
    pub backlog: i64,
    /// Age of the oldest row of the backlog; `None` when it is empty.
    pub oldest_pending_age_ms: Option<i64>,
}

/// Who holds which slices of the outbox (`relay_slices`, `relay_members`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RelayClaims {
    pub slices: i64,
    /// Slices whose lease has not expired.
    pub active_claims: i64,
    /// Relay processes whose heartbeat has not expired.
    pub live_relays: i64,
    /// Active claims per relay owner.
    pub by_owner: BTreeMap<String, i64>,
}

/// One subscription of the events topic.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SubscriptionFigures {
    pub name: String,
    /// Its consumer group, when the broker was asked.
    pub group: Option<String>,
    /// Records on the broker the group has not committed past; `None` when
    /// the broker was not asked or did not answer.
    pub lag: Option<i64>,
    /// Events this subscription recorded as applied (its inbox scope).
    pub inbox_rows: i64,
    /// Dead letters waiting for a redrive.
    pub dead_letters: i64,
    /// Dead letters already redriven.
    pub redriven: i64,
    /// Records parked behind dead letters of their key (per-key order):
    /// applied when the letter is redriven or discarded.
    #[serde(default)]
    pub parked_records: i64,
    /// Keys those records belong to.
    #[serde(default)]
    pub parked_keys: i64,
    /// The keys parked longest, at most [`crate::queries::PARKED_KEYS_SHOWN`].
    #[serde(default)]
    pub oldest_parked: Vec<ParkedKeyFigures>,
    /// Figures of this subscription that are the database's estimates
    /// (`inbox_rows`, …): counts above [`crate::counting::EXACT_UP_TO`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<String>,
}

/// One parked key of a subscription.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ParkedKeyFigures {
    pub topic: String,
    pub partition: i32,
    /// The Kafka record key: as text when it is printable, else `0x…`.
    pub key: String,
    pub records: i64,
    /// Offset of its first parked record.
    pub first_offset: i64,
    /// How long its first record has been parked.
    pub age_ms: i64,
    /// The dead letter to redrive or discard (`herald dlq redrive|discard <id>`).
    pub blocked_by: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Notifications {
    pub by_status: BTreeMap<String, i64>,
    /// Intents whose outcome nobody can know: they wait for `herald notify
    /// reconcile`, so they are called out.
    pub unknown: i64,
    /// Statuses whose count is an estimate (above [`crate::counting::EXACT_UP_TO`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Jobs {
    pub by_status: BTreeMap<String, i64>,
    /// Pending or running.
    pub open: i64,
    /// Age of the oldest pending or running job; `None` when there is none.
    pub oldest_open_age_ms: Option<i64>,
    /// Intake to terminal (succeeded or failed) of recent finished jobs.
    pub latency: Latency,
    /// Statuses whose count is an estimate (above [`crate::counting::EXACT_UP_TO`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<String>,
}

/// Nearest-rank percentiles of intake-to-terminal time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// Finished jobs the percentiles were taken over (the most recent ones,
    /// at most [`crate::queries::LATENCY_SAMPLE`]).
    pub samples: usize,
    pub p50_ms: Option<i64>,
    pub p90_ms: Option<i64>,
    pub p99_ms: Option<i64>,
}

impl Latency {
    pub fn from_durations(mut durations_ms: Vec<i64>) -> Latency {
        durations_ms.sort_unstable();
        Latency {
            samples: durations_ms.len(),
            p50_ms: percentile(&durations_ms, 50.0),
            p90_ms: percentile(&durations_ms, 90.0),
            p99_ms: percentile(&durations_ms, 99.0),
        }
    }
}

/// Nearest-rank percentile of ascending `sorted`: the smallest value with at
/// least `p` percent of the values at or below it. An observed value, never
/// an interpolation.
pub fn percentile(sorted: &[i64], p: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// One generation of a projection.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationFigures {
    pub projection: String,
    pub generation: i64,
    pub state: String,
    /// Whether reads are served from it (`active_generations`).
    pub active: bool,
    /// Rows it holds now.
    pub documents: i64,
    /// `["documents"]` when that count is an estimate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimated: Vec<String>,
}

/// What the broker said.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KafkaFigures {
    /// Sum of the end offsets (high watermarks) of each of Herald's topics:
    /// how many records were ever appended, so its growth is events/s.
    pub end_offsets: BTreeMap<String, i64>,
    pub groups: Vec<GroupLag>,
    /// Replication, settings and their risks, per topic (`durability`).
    #[serde(default)]
    pub topics: Vec<TopicDurability>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupLag {
    pub subscription: String,
    pub group: String,
    pub lag: i64,
    pub partitions: Vec<PartitionLag>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PartitionLag {
    pub partition: i32,
    pub low: i64,
    pub end: i64,
    /// `None`: the group never committed here; it starts from `low`.
    pub committed: Option<i64>,
}

impl PartitionLag {
    /// Records between what the group committed (or, never having
    /// committed, where it would start: the low watermark) and the end.
    pub fn lag(&self) -> i64 {
        let from = self.committed.unwrap_or(self.low).max(self.low);
        (self.end - from).max(0)
    }
}

impl Status {
    /// Folds the broker's figures into the per-subscription rows.
    pub fn apply_kafka(&mut self, kafka: KafkaFigures) {
        for sub in &mut self.subscriptions {
            if let Some(g) = kafka.groups.iter().find(|g| g.subscription == sub.name) {
                sub.group = Some(g.group.clone());
                sub.lag = Some(g.lag);
            }
        }
        self.kafka = Some(kafka);
        self.kafka_error = None;
    }

    /// Records appended to all of Herald's topics, when the broker answered.
    pub fn records_appended(&self) -> Option<i64> {
        self.kafka.as_ref().map(|k| k.end_offsets.values().sum())
    }
}

/// One point of the dashboard's plots.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub at_ms: i64,
    pub outbox_backlog: i64,
    /// 0 when the backlog is empty.
    pub outbox_age_ms: i64,
    /// Per subscription; `None` when the broker did not answer.
    pub lag: BTreeMap<String, Option<i64>>,
    /// Records appended to Herald's topics per second since the previous
    /// sample; `None` for the first sample or without the broker.
    pub events_per_sec: Option<f64>,
    pub jobs_open: i64,
}

impl Sample {
    /// The point for `status`, given the previous one's time and appended count.
    pub fn of(status: &Status, previous: Option<(i64, i64)>) -> Sample {
        let appended = status.records_appended();
        let events_per_sec = match (previous, appended) {
            (Some((at, before)), Some(now)) if status.at_ms > at => {
                Some((now - before).max(0) as f64 * 1000.0 / (status.at_ms - at) as f64)
            }
            _ => None,
        };
        Sample {
            at_ms: status.at_ms,
            outbox_backlog: status.outbox.backlog,
            outbox_age_ms: status.outbox.oldest_pending_age_ms.unwrap_or(0),
            lag: status.subscriptions.iter().map(|s| (s.name.clone(), s.lag)).collect(),
            events_per_sec,
            jobs_open: status.jobs.open,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_are_observed_values() {
        let latency = Latency::from_durations((1..=10).rev().map(|i| i * 100).collect());
        assert_eq!((latency.samples, latency.p50_ms, latency.p90_ms, latency.p99_ms), (10, Some(500), Some(900), Some(1000)));
        let one = Latency::from_durations(vec![42]);
        assert_eq!((one.p50_ms, one.p99_ms), (Some(42), Some(42)));
        assert_eq!(Latency::from_durations(vec![]).p50_ms, None);
        // 100 values 1..=100: p99 is the 99th, not the maximum.
        assert_eq!(percentile(&(1..=100).collect::<Vec<_>>(), 99.0), Some(99));
    }

    #[test]
    fn lag_counts_from_the_commit_or_else_the_low_watermark() {
        let p = |low, end, committed| PartitionLag { partition: 0, low, end, committed }.lag();
        assert_eq!(p(0, 10, Some(4)), 6);
        assert_eq!(p(3, 10, None), 7);
        // A commit below a truncated log counts from what still exists.
        assert_eq!(p(5, 10, Some(2)), 5);
        assert_eq!(p(0, 10, Some(10)), 0);
    }

    #[test]
    fn events_per_second_is_the_growth_of_the_end_offsets() {
        let mut status = Status { at_ms: 3_000, ..Status::default() };
        status.kafka = Some(KafkaFigures { end_offsets: [("a".into(), 30), ("b".into(), 10)].into(), groups: vec![], topics: vec![] });
        assert_eq!(Sample::of(&status, Some((1_000, 20))).events_per_sec, Some(10.0));
        assert_eq!(Sample::of(&status, None).events_per_sec, None);
    }
}
