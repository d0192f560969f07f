//! Start positions decided for a consumer group that had none: recorded in
//! the database before they are committed to Kafka, so a crash between the
//! two cannot turn into a different decision later (see
//! `migrations/*/0010_start_positions.sql`).

use sqlx::Row;

use crate::{Db, StoreError, now_ms};

/// The positions recorded for `group` on `topic`: (partition, offset).
pub async fn recorded(db: &Db, group: &str, topic: &str) -> Result<Vec<(i32, i64)>, StoreError> {
    let rows = sqlx::query(
        "SELECT kafka_partition, start_offset FROM start_positions WHERE consumer_group = $1 AND topic = $2 ORDER BY kafka_partition",
    )
    .bind(group)
    .bind(topic)
    .fetch_all(db.pool())
    .await?;
    rows.iter().map(|r| Ok((r.try_get::<i32, _>("kafka_partition")?, r.try_get::<i64, _>("start_offset")?))).collect()
}

/// Records `positions` unless a decision for a partition exists already:
/// the first decision stands.
pub async fn record(db: &Db, group: &str, topic: &str, positions: &[(i32, i64)]) -> Result<(), StoreError> {
    let mut tx = db.begin().await?;
    for (partition, offset) in positions {
        sqlx::query(
            "INSERT INTO start_positions (consumer_group, topic, kafka_partition, start_offset, decided_at_ms) \
             VALUES ($1, $2, $3, $4, $5) ON CONFLICT (consumer_group, topic, kafka_partition) DO NOTHING",
        )
        .bind(group)
        .bind(topic)
        .bind(*partition)
        .bind(*offset)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
