//! How far each live subscription has applied each partition
//! (`subscription_positions`). The engine advances it as the first statement
//! of every batch transaction, which also makes it the lock that orders a
//! batch against a rebuild opening a new generation: the batch either
//! commits before the generation opens (and its records fall below the
//! generation's boundary, the replay's) or reads the generation after it
//! opened (and applies its records at or above the boundary to it).

use std::collections::BTreeMap;

use sqlx::Row;

use crate::{Backend, Db, StoreError, Tx};

/// Advances `subscription`'s positions to `next` (partition → offset after
/// the last record), never backwards. Partitions are locked in order, so two
/// transactions cannot deadlock on them.
pub async fn advance(tx: &mut Tx<'_>, subscription: &str, topic: &str, next: &BTreeMap<i32, i64>) -> Result<(), StoreError> {
    for (partition, next_offset) in next {
        sqlx::query(
            "INSERT INTO subscription_positions (subscription, topic, kafka_partition, next_offset) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (subscription, topic, kafka_partition) DO UPDATE SET next_offset = CASE \
             WHEN excluded.next_offset > subscription_positions.next_offset THEN excluded.next_offset \
             ELSE subscription_positions.next_offset END",
        )
        .bind(subscription)
        .bind(topic)
        .bind(partition)
        .bind(next_offset)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// Begins a live batch's transaction on sqlx's native PostgreSQL driver
/// with its first statement, [`advance`] of every partition in `next`
/// (topic → partition → offset after the last record), in one round trip:
/// `BEGIN` and the upsert as one simple query. On a busy machine a round
/// trip costs a batch more than the statement in it (BENCHMARKS.md,
/// "Consume"). A simple query takes no binds, so the values are literals:
/// offsets are integers, names are escaped by [`literal`]. Rows are locked
/// in (topic, partition) order, like the statements of [`advance`].
pub async fn begin_advancing(
    pool: &sqlx::PgPool,
    subscription: &str,
    next: &BTreeMap<&str, BTreeMap<i32, i64>>,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    if subscription.contains('\0') || next.keys().any(|t| t.contains('\0')) {
        return Err(sqlx::Error::Encode("a name with a NUL character cannot be stored in PostgreSQL".into()));
    }
    pool.begin_with(begin_advancing_sql(subscription, next)).await
}

fn begin_advancing_sql(subscription: &str, next: &BTreeMap<&str, BTreeMap<i32, i64>>) -> String {
    let rows: Vec<String> = next
        .iter()
        .flat_map(|(topic, partitions)| {
            partitions
                .iter()
                .map(move |(partition, offset)| format!("({}, {}, {partition}, {offset})", literal(subscription), literal(topic)))
        })
        .collect();
    if rows.is_empty() {
        return "BEGIN".to_owned();
    }
    format!(
        "BEGIN; INSERT INTO subscription_positions (subscription, topic, kafka_partition, next_offset) VALUES {} \
         ON CONFLICT (subscription, topic, kafka_partition) DO UPDATE SET \
         next_offset = GREATEST(subscription_positions.next_offset, excluded.next_offset)",
        rows.join(", ")
    )
}

/// `text` as a PostgreSQL escape string literal (`E'…'`), which means the
/// same whatever `standard_conforming_strings` says: backslashes and quotes
/// escaped, nothing else special (PostgreSQL text holds no NUL:
/// [`begin_advancing`] refuses one).
fn literal(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('\'', "\\'");
    format!("E'{escaped}'")
}

/// Locks one partition's position row until `tx` ends, moving nothing: the
/// lock every batch takes first, taken by a dead letter's redrive or
/// discard so that it and a batch parking records of the same key
/// serialise (`crate::parked`).
pub async fn lock_partition(tx: &mut Tx<'_>, subscription: &str, topic: &str, partition: i32) -> Result<(), StoreError> {
    // A zero never moves a position back, and creates the row to lock.
    advance(tx, subscription, topic, &BTreeMap::from([(partition, 0)])).await
}

/// Reads `subscription`'s positions in `topic` for `partitions` and holds
/// them until `tx` ends: no batch of the subscription can commit on those
/// partitions meanwhile. A partition never applied reads 0.
pub async fn lock(db: &Db, tx: &mut Tx<'_>, subscription: &str, topic: &str, partitions: &[i32]) -> Result<BTreeMap<i32, i64>, StoreError> {
    let zeros: BTreeMap<i32, i64> = partitions.iter().map(|p| (*p, 0)).collect();
    // Rows must exist to be locked; a zero never moves a position back.
    advance(tx, subscription, topic, &zeros).await?;
    let lock = if db.backend() == Backend::Postgres { " FOR UPDATE" } else { "" };
    let rows = sqlx::query(&format!(
        "SELECT kafka_partition, next_offset FROM subscription_positions WHERE subscription = $1 AND topic = $2 \
         ORDER BY kafka_partition{lock}"
    ))
    .bind(subscription)
    .bind(topic)
    .fetch_all(&mut **tx)
    .await?;
    let mut out = zeros;
    for row in rows {
        let partition: i32 = row.try_get("kafka_partition")?;
        if let Some(slot) = out.get_mut(&partition) {
            *slot = row.try_get("next_offset")?;
        }
    }
    Ok(out)
}

/// `subscription`'s positions in `topic`, for status and tests.
pub async fn read(db: &Db, subscription: &str, topic: &str) -> Result<BTreeMap<i32, i64>, StoreError> {
    let rows = sqlx::query("SELECT kafka_partition, next_offset FROM subscription_positions WHERE subscription = $1 AND topic = $2")
        .bind(subscription)
        .bind(topic)
        .fetch_all(db.pool())
        .await?;
    rows.iter().map(|r| Ok((r.try_get("kafka_partition")?, r.try_get("next_offset")?))).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::{begin_advancing_sql, literal};

    #[test]
    fn literals_escape_quotes_and_backslashes() {
        assert_eq!(literal("search"), "E'search'");
        assert_eq!(literal("o'brien\\x"), "E'o\\'brien\\\\x'");
    }

    #[test]
    fn positions_are_upserted_in_topic_then_partition_order() {
        let next = BTreeMap::from([("t2", BTreeMap::from([(1, 5)])), ("t1", BTreeMap::from([(3, 9), (0, 7)]))]);
        let sql = begin_advancing_sql("s", &next);
        let values = sql.split("VALUES ").nth(1).and_then(|v| v.split(" ON CONFLICT").next()).expect("a VALUES list");
        assert_eq!(values, "(E's', E't1', 0, 7), (E's', E't1', 3, 9), (E's', E't2', 1, 5)");
        assert_eq!(begin_advancing_sql("s", &BTreeMap::new()), "BEGIN");
    }
}
