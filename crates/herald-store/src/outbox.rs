//! The transactional outbox: rows written in the business transaction, read
//! and marked by the relay only after the broker acknowledged them.

use chrono::{DateTime, Utc};
use herald_envelope::OutboxEvent;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Db, StoreError, Tx, now_ms};

/// Row states. `pending` rows are what the relay still owes the broker.
pub const PENDING: &str = "pending";
pub const DELIVERED: &str = "delivered";

/// A committed outbox row as the relay sees it.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub seq: i64,
    pub attempts: i32,
    pub event: OutboxEvent,
}

/// Appends `event` inside the caller's transaction; returns its sequence.
pub async fn append(tx: &mut Tx<'_>, event: &OutboxEvent) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, \
         data, topic, partition_key, status, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING seq",
    )
    .bind(&event.id)
    .bind(&event.source)
    .bind(&event.event_type)
    .bind(&event.subject)
    .bind(event.time.timestamp_millis())
    .bind(&event.schema_file)
    .bind(&event.data)
    .bind(&event.topic)
    .bind(&event.partition_key)
    .bind(PENDING)
    .bind(now_ms())
    .fetch_one(&mut **tx)
    .await?;
    Ok(row.try_get("seq")?)
}

/// The oldest pending rows, in commit-sequence order.
pub async fn pending(db: &Db, limit: i64) -> Result<Vec<OutboxRow>, StoreError> {
    let rows = sqlx::query(
        "SELECT seq, attempts, event_id, source, event_type, subject, event_time_ms, schema_file, \
         data, topic, partition_key FROM outbox WHERE status = $1 ORDER BY seq LIMIT $2",
    )
    .bind(PENDING)
    .bind(limit)
    .fetch_all(db.pool())
    .await?;
    rows.iter().map(row_to_outbox).collect()
}

fn row_to_outbox(row: &AnyRow) -> Result<OutboxRow, StoreError> {
    let time_ms: i64 = row.try_get("event_time_ms")?;
    Ok(OutboxRow {
        seq: row.try_get("seq")?,
        attempts: row.try_get("attempts")?,
        event: OutboxEvent {
            id: row.try_get("event_id")?,
            source: row.try_get("source")?,
            event_type: row.try_get("event_type")?,
            subject: row.try_get("subject")?,
            time: DateTime::<Utc>::from_timestamp_millis(time_ms).unwrap_or_default(),
            schema_file: row.try_get("schema_file")?,
            data: row.try_get("data")?,
            topic: row.try_get("topic")?,
            partition_key: row.try_get("partition_key")?,
        },
    })
}

/// Marks rows delivered. Call only with rows whose delivery the broker
/// acknowledged; a row not still pending is left as it is.
pub async fn mark_delivered(db: &Db, seqs: &[i64]) -> Result<u64, StoreError> {
    if seqs.is_empty() {
        return Ok(0);
    }
    let sql = format!(
        "UPDATE outbox SET status = $1, delivered_at_ms = $2, attempts = attempts + 1 \
         WHERE status = $3 AND seq IN ({})",
        placeholders(4, seqs.len())
    );
    let mut query = sqlx::query(&sql).bind(DELIVERED).bind(now_ms()).bind(PENDING);
    for seq in seqs {
        query = query.bind(*seq);
    }
    Ok(query.execute(db.pool()).await?.rows_affected())
}

/// Records a failed publish; the row stays pending for the next pass.
pub async fn record_failure(db: &Db, seq: i64, error: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE outbox SET attempts = attempts + 1, last_error = $1 WHERE seq = $2 AND status = $3")
        .bind(error)
        .bind(seq)
        .bind(PENDING)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Rows per status, for reports and tests.
pub async fn count_by_status(db: &Db, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM outbox WHERE status = $1")
        .bind(status)
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get("n")?)
}

/// `$start, $start+1, …` — sqlx's `Any` driver has no array binds.
pub fn placeholders(start: usize, count: usize) -> String {
    (start..start + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Row counts of multi-row statements. Every distinct row count is a distinct
/// SQL text, and PostgreSQL prepares (parses and plans) each text once per
/// connection: thousands-of-parameters statements of arbitrary sizes would be
/// prepared over and over. Cutting batches into these few sizes keeps the
/// statement cache warm at the cost of a few more round trips for a tail.
const STATEMENT_ROWS: [usize; 10] = [1000, 500, 200, 100, 50, 20, 10, 5, 2, 1];

/// `items` cut into slices whose lengths are all in [`STATEMENT_ROWS`].
pub fn statement_chunks<T>(items: &[T]) -> Vec<&[T]> {
    let mut out = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        let size = STATEMENT_ROWS.iter().copied().find(|s| *s <= rest.len()).unwrap_or(1);
        let (head, tail) = rest.split_at(size);
        out.push(head);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn statement_chunks_use_few_sizes_and_keep_order() {
        let items: Vec<usize> = (0..2987).collect();
        let chunks = super::statement_chunks(&items);
        assert_eq!(chunks.concat(), items);
        assert!(chunks.iter().all(|c| super::STATEMENT_ROWS.contains(&c.len())));
        assert!(chunks.len() <= 12, "{}", chunks.len());
    }
}
