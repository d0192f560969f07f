//! History completeness: which records a generation's documents derive from,
//! and whether the broker still retains them.
//!
//! For each partition Herald records the first offset a generation needs:
//! where the live group first started consuming (generation 1), where a
//! rebuild's replay started, or the positions of the snapshot it loaded. A
//! partition without a row needs offset 0 — a generation whose start was
//! never recorded may hold facts from the very first record. A rebuild
//! replays from the earliest retained offset (low watermark); if that is
//! past what the active generation needs, records it was built from are gone
//! and a replay would silently lose their documents: the rebuild refuses,
//! naming the gap, unless a snapshot covers it.

use std::collections::BTreeMap;
use std::fmt;

use herald_consumer::Subscription;
use herald_store::{Db, StoreError, Tx, now_ms};
use serde::Serialize;
use sqlx::Row;

use crate::RebuildError;

/// Records retention removed that the active generation was built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gap {
    pub topic: String,
    pub partition: i32,
    /// First offset the active generation's documents derive from.
    pub needed: i64,
    /// Earliest offset the broker still retains (low watermark).
    pub earliest_retained: i64,
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} partition {}: needs offset {}, earliest retained is {} ({} record(s) gone)",
            self.topic,
            self.partition,
            self.needed,
            self.earliest_retained,
            self.earliest_retained - self.needed
        )
    }
}

/// First needed offset per partition of `generation` on `topic`.
pub async fn needed(db: &Db, projection: &str, generation: i64, topic: &str) -> Result<BTreeMap<i32, i64>, StoreError> {
    let rows = sqlx::query(
        "SELECT kafka_partition, first_offset FROM projection_history WHERE projection = $1 AND generation = $2 AND topic = $3",
    )
    .bind(projection)
    .bind(generation)
    .bind(topic)
    .fetch_all(db.pool())
    .await?;
    rows.iter()
        .map(|r| Ok((r.try_get("kafka_partition")?, r.try_get("first_offset")?)))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// The gaps between what is needed and what is retained (`low` per
/// partition); empty when history is complete.
pub fn gaps(topic: &str, needed: &BTreeMap<i32, i64>, low: &[(i32, i64)]) -> Vec<Gap> {
    low.iter()
        .filter_map(|&(partition, earliest_retained)| {
            let needed = needed.get(&partition).copied().unwrap_or(0);
            (earliest_retained > needed).then(|| Gap { topic: topic.to_owned(), partition, needed, earliest_retained })
        })
        .collect()
}

/// Records where `generation` starts on each partition, unless recorded
/// before (the first start is the one that counts).
pub async fn record(tx: &mut Tx<'_>, projection: &str, generation: i64, topic: &str, starts: &[(i32, i64)]) -> Result<(), StoreError> {
    let now = now_ms();
    for (partition, first_offset) in starts {
        sqlx::query(
            "INSERT INTO projection_history (projection, generation, topic, kafka_partition, first_offset, recorded_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (projection, generation, topic, kafka_partition) DO NOTHING",
        )
        .bind(projection)
        .bind(generation)
        .bind(topic)
        .bind(*partition)
        .bind(*first_offset)
        .bind(now)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A projection's live subscription `sub` is about to join its group: where
/// the group has no committed offset it starts at the earliest retained
/// record, the first one its generations need. Recorded per partition
/// before it starts (see [`record_live_start`]).
pub async fn record_group_start(db: &Db, sub: &Subscription) -> Result<(), RebuildError> {
    for topic in &sub.topics {
        let states = herald_kafka::offsets::partition_states(&sub.kafka, &sub.group, topic).await?;
        let starts: Vec<(i32, i64)> = states.iter().filter(|s| s.committed.is_none()).map(|s| (s.partition, s.low)).collect();
        record_live_start(db, &sub.name, topic, &starts).await?;
    }
    Ok(())
}

/// The live subscription is about to start on partitions where its group has
/// no committed offset: it will read them from `low` (earliest), so that is
/// the first offset every generation it writes needs from them.
pub async fn record_live_start(db: &Db, projection: &str, topic: &str, starts: &[(i32, i64)]) -> Result<(), StoreError> {
    if starts.is_empty() {
        return Ok(());
    }
    let mut tx = db.begin().await?;
    let sql =
        format!("SELECT generation FROM projection_generations WHERE projection = $1 AND {}", herald_store::generations::live_states_sql());
    let live: Vec<i64> = sqlx::query(&sql)
        .bind(projection)
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| r.try_get("generation"))
        .collect::<Result<_, sqlx::Error>>()?;
    for generation in live {
        record(&mut tx, projection, generation, topic, starts).await?;
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_is_retention_past_what_is_needed() {
        let needed = BTreeMap::from([(0, 0), (1, 40)]);
        let gaps = gaps("t", &needed, &[(0, 12), (1, 40), (2, 0), (3, 5)]);
        assert_eq!(gaps.len(), 2, "{gaps:?}");
        assert_eq!(gaps[0], Gap { topic: "t".into(), partition: 0, needed: 0, earliest_retained: 12 });
        assert_eq!(gaps[1].partition, 3, "a partition without a record needs offset 0");
        assert!(gaps[0].to_string().contains("partition 0: needs offset 0, earliest retained is 12"));
    }
}
