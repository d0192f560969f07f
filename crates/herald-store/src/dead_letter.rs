//! Dead letters: records a subscription gave up on, kept whole (key, headers,
//! value, where they were read) with the reason, so the partition can move
//! on without losing them and an operator can redrive them after a fix.

use herald_envelope::EventKey;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Db, StoreError, Tx, now_ms};

/// Not applied yet; waiting for a fix and a redrive.
pub const DEAD: &str = "dead";
/// Applied (or found already applied) by a redrive.
pub const REDRIVEN: &str = "redriven";
/// Given up on by an operator (`herald dlq discard`): never applied.
pub const DISCARDED: &str = "discarded";

/// A record to set aside.
#[derive(Debug, Clone)]
pub struct NewDeadLetter<'a> {
    pub subscription: &'a str,
    /// Identity and type, when the record decoded far enough to have them.
    pub key: Option<&'a EventKey>,
    pub event_type: Option<&'a str>,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub record_key: Option<&'a [u8]>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub value: Option<&'a [u8]>,
    pub error: &'a str,
    pub attempts: i32,
}

/// A stored dead letter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub id: i64,
    pub subscription: String,
    pub source: Option<String>,
    pub event_id: Option<String>,
    pub event_type: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub record_key: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub value: Option<Vec<u8>>,
    pub error: String,
    pub attempts: i32,
    pub status: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// Stores `letter` inside `tx`. The same record (subscription, topic,
/// partition, offset) dead-lettered again — it was redelivered after a crash
/// before its offset commit — keeps its first row; `false` then.
pub async fn insert(tx: &mut Tx<'_>, letter: &NewDeadLetter<'_>) -> Result<bool, StoreError> {
    let now = now_ms();
    let done = sqlx::query(
        "INSERT INTO dead_letters (subscription, source, event_id, event_type, topic, kafka_partition, \
         kafka_offset, record_key, headers, record_value, error, attempts, status, created_at_ms, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $14) \
         ON CONFLICT (subscription, topic, kafka_partition, kafka_offset) DO NOTHING",
    )
    .bind(letter.subscription)
    .bind(letter.key.map(|k| k.source.clone()))
    .bind(letter.key.map(|k| k.id.clone()))
    .bind(letter.event_type.map(str::to_owned))
    .bind(letter.topic)
    .bind(letter.partition)
    .bind(letter.offset)
    .bind(letter.record_key.map(<[u8]>::to_vec))
    .bind(encode_headers(&letter.headers))
    .bind(letter.value.map(<[u8]>::to_vec))
    .bind(letter.error)
    .bind(letter.attempts)
    .bind(DEAD)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

const COLUMNS: &str = "id, subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, \
    record_key, headers, record_value, error, attempts, status, created_at_ms, updated_at_ms";

/// Dead letters, oldest first, optionally of one subscription and one status.
pub async fn list(db: &Db, subscription: Option<&str>, status: Option<&str>) -> Result<Vec<DeadLetter>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM dead_letters WHERE ($1 = '' OR subscription = $1) AND ($2 = '' OR status = $2) ORDER BY id");
    let rows = sqlx::query(&sql).bind(subscription.unwrap_or("")).bind(status.unwrap_or("")).fetch_all(db.pool()).await?;
    rows.iter().map(row_to_letter).collect()
}

pub async fn get(db: &Db, id: i64) -> Result<Option<DeadLetter>, StoreError> {
    let sql = format!("SELECT {COLUMNS} FROM dead_letters WHERE id = $1");
    let row = sqlx::query(&sql).bind(id).fetch_optional(db.pool()).await?;
    row.as_ref().map(row_to_letter).transpose()
}

/// Marks a dead letter redriven inside the transaction that applies it.
/// `false`: it is no longer dead (another redrive won); apply nothing.
pub async fn mark_redriven(tx: &mut Tx<'_>, id: i64) -> Result<bool, StoreError> {
    leave_dead(tx, id, REDRIVEN).await
}

/// Marks a dead letter discarded, an operator's act recorded like a redrive
/// (status, one more attempt, when). `false`: it is no longer dead.
pub async fn mark_discarded(tx: &mut Tx<'_>, id: i64) -> Result<bool, StoreError> {
    leave_dead(tx, id, DISCARDED).await
}

/// Moves a letter that is still dead to `status`, counting the attempt; the
/// status condition lets exactly one of two racing operators win.
async fn leave_dead(tx: &mut Tx<'_>, id: i64, status: &str) -> Result<bool, StoreError> {
    let done =
        sqlx::query("UPDATE dead_letters SET status = $1, attempts = attempts + 1, updated_at_ms = $2 WHERE id = $3 AND status = $4")
            .bind(status)
            .bind(now_ms())
            .bind(id)
            .bind(DEAD)
            .execute(&mut **tx)
            .await?;
    Ok(done.rows_affected() == 1)
}

/// Records a redrive that failed again; the letter stays dead.
pub async fn record_failed_redrive(db: &Db, id: i64, error: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE dead_letters SET attempts = attempts + 1, error = $1, updated_at_ms = $2 WHERE id = $3 AND status = $4")
        .bind(error)
        .bind(now_ms())
        .bind(id)
        .bind(DEAD)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Dead letters of `subscription` in `status`.
pub async fn count(db: &Db, subscription: &str, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM dead_letters WHERE subscription = $1 AND status = $2")
        .bind(subscription)
        .bind(status)
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get("n")?)
}

fn row_to_letter(row: &AnyRow) -> Result<DeadLetter, StoreError> {
    let headers: String = row.try_get("headers")?;
    Ok(DeadLetter {
        id: row.try_get("id")?,
        subscription: row.try_get("subscription")?,
        source: row.try_get("source")?,
        event_id: row.try_get("event_id")?,
        event_type: row.try_get("event_type")?,
        topic: row.try_get("topic")?,
        partition: row.try_get("kafka_partition")?,
        offset: row.try_get("kafka_offset")?,
        record_key: row.try_get("record_key")?,
        headers: decode_headers(&headers)?,
        value: row.try_get("record_value")?,
        error: row.try_get("error")?,
        attempts: row.try_get("attempts")?,
        status: row.try_get("status")?,
        created_at_ms: row.try_get("created_at_ms")?,
        updated_at_ms: row.try_get("updated_at_ms")?,
    })
}

/// Header values are bytes, not text: hex keeps them exact in a TEXT column
/// that both backends and a human with `psql` can read.
pub(crate) fn encode_headers(headers: &[(String, Option<Vec<u8>>)]) -> String {
    let array: Vec<serde_json::Value> = headers.iter().map(|(k, v)| serde_json::json!([k, v.as_deref().map(hex)])).collect();
    serde_json::Value::Array(array).to_string()
}

/// Record headers as stored: name and raw value, if any.
type Headers = Vec<(String, Option<Vec<u8>>)>;

pub(crate) fn decode_headers(text: &str) -> Result<Headers, StoreError> {
    let bad = |why: &str| StoreError::Config(format!("dead_letters.headers is not the expected JSON: {why}"));
    let parsed: Vec<(String, Option<String>)> = serde_json::from_str(text).map_err(|e| bad(&e.to_string()))?;
    parsed.into_iter().map(|(k, v)| Ok((k, v.map(|h| unhex(&h).ok_or_else(|| bad("bad hex"))).transpose()?))).collect()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_bytes_exactly() {
        let headers =
            vec![("ce_id".to_owned(), Some(b"abc".to_vec())), ("bin".to_owned(), Some(vec![0, 255, 7])), ("none".to_owned(), None)];
        assert_eq!(decode_headers(&encode_headers(&headers)).unwrap(), headers);
    }
}
