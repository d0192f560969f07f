//! Parked records (`parked_records`): under per-key order, the records of a
//! Kafka record key that came after one of its records was dead-lettered,
//! kept whole in the transaction that would have applied them, until that
//! letter is redriven or discarded. Why a table of its own: see migration
//! `0012_parked.sql`.
//!
//! A key is a record key *in a partition* (Kafka orders a key only there;
//! the partition count is assumed stable). Every transaction that parks or
//! releases records of a partition first takes the partition's lock
//! ([`crate::positions::lock_partition`]), so what it reads about the
//! partition's blocked keys afterwards is current: a record cannot be
//! parked behind a letter whose release has already run.

use std::collections::HashMap;
use std::ops::RangeInclusive;

use sqlx::Row;
use sqlx::any::AnyRow;

use crate::dead_letter::{self, DEAD};
use crate::{Db, StoreError, Tx, now_ms};

/// One record key of one partition, as a subscription reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRef<'a> {
    pub subscription: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub record_key: &'a [u8],
}

/// A record to park.
#[derive(Debug, Clone)]
pub struct NewParked<'a> {
    pub key: KeyRef<'a>,
    pub offset: i64,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub value: Option<&'a [u8]>,
}

/// A stored parked record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parked {
    pub subscription: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub record_key: Vec<u8>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub value: Option<Vec<u8>>,
    pub parked_at_ms: i64,
}

/// Parks `record` inside `tx`. A record parked before (redelivered after a
/// crash before its offset commit) keeps its first row; `false` then.
pub async fn insert(tx: &mut Tx<'_>, record: &NewParked<'_>) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO parked_records (subscription, topic, kafka_partition, kafka_offset, record_key, headers, record_value, parked_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (subscription, topic, kafka_partition, kafka_offset) DO NOTHING",
    )
    .bind(record.key.subscription)
    .bind(record.key.topic)
    .bind(record.key.partition)
    .bind(record.offset)
    .bind(record.key.record_key.to_vec())
    .bind(dead_letter::encode_headers(&record.headers))
    .bind(record.value.map(<[u8]>::to_vec))
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What blocks keys of one partition: the offsets of its `dead` letters
/// that have a record key, and the first parked offset of each key that has
/// parked records. Read after the partition's lock.
#[derive(Debug, Clone, Default)]
pub struct PartitionBlocks {
    pub dead_letters: Vec<(Vec<u8>, i64)>,
    pub first_parked: Vec<(Vec<u8>, i64)>,
}

pub async fn blocks(tx: &mut Tx<'_>, subscription: &str, topic: &str, partition: i32) -> Result<PartitionBlocks, StoreError> {
    let pairs = |rows: Vec<AnyRow>| -> Result<Vec<(Vec<u8>, i64)>, StoreError> {
        rows.iter().map(|r| Ok((r.try_get("record_key")?, r.try_get("o")?))).collect()
    };
    let letters = sqlx::query(
        "SELECT record_key, kafka_offset AS o FROM dead_letters WHERE subscription = $1 AND topic = $2 \
         AND kafka_partition = $3 AND status = $4 AND record_key IS NOT NULL",
    )
    .bind(subscription)
    .bind(topic)
    .bind(partition)
    .bind(DEAD)
    .fetch_all(&mut **tx)
    .await?;
    let parked = sqlx::query(
        "SELECT record_key, MIN(kafka_offset) AS o FROM parked_records WHERE subscription = $1 AND topic = $2 \
         AND kafka_partition = $3 GROUP BY record_key",
    )
    .bind(subscription)
    .bind(topic)
    .bind(partition)
    .fetch_all(&mut **tx)
    .await?;
    Ok(PartitionBlocks { dead_letters: pairs(letters)?, first_parked: pairs(parked)? })
}

/// Offsets of the letters (any status) of one partition within `offsets`.
pub async fn letter_offsets(
    tx: &mut Tx<'_>,
    subscription: &str,
    topic: &str,
    partition: i32,
    offsets: RangeInclusive<i64>,
) -> Result<Vec<i64>, StoreError> {
    let rows = sqlx::query(
        "SELECT kafka_offset FROM dead_letters WHERE subscription = $1 AND topic = $2 AND kafka_partition = $3 \
         AND kafka_offset >= $4 AND kafka_offset <= $5",
    )
    .bind(subscription)
    .bind(topic)
    .bind(partition)
    .bind(*offsets.start())
    .bind(*offsets.end())
    .fetch_all(&mut **tx)
    .await?;
    rows.iter().map(|r| Ok(r.try_get("kafka_offset")?)).collect()
}

/// The offset of `key`'s first `dead` letter, if it has one.
pub async fn first_dead_letter(tx: &mut Tx<'_>, key: &KeyRef<'_>) -> Result<Option<i64>, StoreError> {
    let row = sqlx::query(
        "SELECT MIN(kafka_offset) AS o FROM dead_letters WHERE subscription = $1 AND topic = $2 AND kafka_partition = $3 \
         AND record_key = $4 AND status = $5",
    )
    .bind(key.subscription)
    .bind(key.topic)
    .bind(key.partition)
    .bind(key.record_key.to_vec())
    .bind(DEAD)
    .fetch_one(&mut **tx)
    .await?;
    Ok(row.try_get("o")?)
}

const COLUMNS: &str = "subscription, topic, kafka_partition, kafka_offset, record_key, headers, record_value, parked_at_ms";

/// `key`'s parked record of the lowest offset.
pub async fn first(tx: &mut Tx<'_>, key: &KeyRef<'_>) -> Result<Option<Parked>, StoreError> {
    let row = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM parked_records WHERE subscription = $1 AND topic = $2 AND kafka_partition = $3 \
         AND record_key = $4 ORDER BY kafka_offset LIMIT 1"
    ))
    .bind(key.subscription)
    .bind(key.topic)
    .bind(key.partition)
    .bind(key.record_key.to_vec())
    .fetch_optional(&mut **tx)
    .await?;
    row.as_ref().map(row_to_parked).transpose()
}

/// Removes the parked record at `offset` of `key`'s partition (released).
pub async fn remove(tx: &mut Tx<'_>, key: &KeyRef<'_>, offset: i64) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM parked_records WHERE subscription = $1 AND topic = $2 AND kafka_partition = $3 AND kafka_offset = $4")
        .bind(key.subscription)
        .bind(key.topic)
        .bind(key.partition)
        .bind(offset)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Records still parked under `key`.
pub async fn count_key(tx: &mut Tx<'_>, key: &KeyRef<'_>) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS n FROM parked_records WHERE subscription = $1 AND topic = $2 AND kafka_partition = $3 AND record_key = $4",
    )
    .bind(key.subscription)
    .bind(key.topic)
    .bind(key.partition)
    .bind(key.record_key.to_vec())
    .fetch_one(&mut **tx)
    .await?;
    Ok(row.try_get("n")?)
}

/// Every parked record of `subscription`, in offset order per key.
pub async fn list(db: &Db, subscription: &str) -> Result<Vec<Parked>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {COLUMNS} FROM parked_records WHERE subscription = $1 ORDER BY topic, kafka_partition, record_key, kafka_offset"
    ))
    .bind(subscription)
    .fetch_all(db.pool())
    .await?;
    rows.iter().map(row_to_parked).collect()
}

/// A parked key, for status and `dlq list`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedKey {
    pub topic: String,
    pub partition: i32,
    pub record_key: Vec<u8>,
    pub records: i64,
    pub first_offset: i64,
    pub since_ms: i64,
    /// Its first `dead` letter (the one to redrive or discard).
    pub blocked_by: Option<i64>,
}

/// Parked keys and records of `subscription`, with its `oldest` keys (parked longest).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub keys: i64,
    pub records: i64,
    pub oldest: Vec<ParkedKey>,
}

pub async fn summary(db: &Db, subscription: &str, oldest: i64) -> Result<Summary, StoreError> {
    summary_on(&mut *db.pool().acquire().await?, subscription, oldest).await
}

/// [`summary`] on a connection the caller holds (the status monitor reads
/// every figure in one transaction).
pub async fn summary_on(conn: &mut sqlx::AnyConnection, subscription: &str, oldest: i64) -> Result<Summary, StoreError> {
    let records: i64 = sqlx::query("SELECT COUNT(*) AS n FROM parked_records WHERE subscription = $1")
        .bind(subscription)
        .fetch_one(&mut *conn)
        .await?
        .try_get("n")?;
    if records == 0 {
        return Ok(Summary::default());
    }
    let keys: i64 = sqlx::query(
        "SELECT COUNT(*) AS n FROM (SELECT DISTINCT topic, kafka_partition, record_key FROM parked_records WHERE subscription = $1) AS k",
    )
    .bind(subscription)
    .fetch_one(&mut *conn)
    .await?
    .try_get("n")?;
    let rows = sqlx::query(
        "SELECT p.topic, p.kafka_partition, p.record_key, COUNT(*) AS n, MIN(p.kafka_offset) AS first_offset, \
         MIN(p.parked_at_ms) AS since, (SELECT MIN(d.id) FROM dead_letters d WHERE d.subscription = p.subscription \
         AND d.topic = p.topic AND d.kafka_partition = p.kafka_partition AND d.record_key = p.record_key AND d.status = $2) AS blocked_by \
         FROM parked_records p WHERE p.subscription = $1 GROUP BY p.subscription, p.topic, p.kafka_partition, p.record_key \
         ORDER BY since, p.topic, p.kafka_partition, first_offset LIMIT $3",
    )
    .bind(subscription)
    .bind(DEAD)
    .bind(oldest)
    .fetch_all(&mut *conn)
    .await?;
    let oldest = rows
        .iter()
        .map(|r| {
            Ok(ParkedKey {
                topic: r.try_get("topic")?,
                partition: r.try_get("kafka_partition")?,
                record_key: r.try_get("record_key")?,
                records: r.try_get("n")?,
                first_offset: r.try_get("first_offset")?,
                since_ms: r.try_get("since")?,
                blocked_by: r.try_get("blocked_by")?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Summary { keys, records, oldest })
}

/// Parked records per key of every subscription: (subscription, topic,
/// partition, record key) → records.
pub async fn counts(db: &Db) -> Result<HashMap<(String, String, i32, Vec<u8>), i64>, StoreError> {
    let rows = sqlx::query(
        "SELECT subscription, topic, kafka_partition, record_key, COUNT(*) AS n FROM parked_records \
         GROUP BY subscription, topic, kafka_partition, record_key",
    )
    .fetch_all(db.pool())
    .await?;
    rows.iter()
        .map(|r| {
            let key = (r.try_get("subscription")?, r.try_get("topic")?, r.try_get("kafka_partition")?, r.try_get("record_key")?);
            Ok((key, r.try_get("n")?))
        })
        .collect()
}

/// A record key for people: as text when it is printable UTF-8 (Herald's
/// own keys are), else `0x` and hex.
pub fn display_key(key: &[u8]) -> String {
    match std::str::from_utf8(key) {
        Ok(text) if !text.is_empty() && !text.chars().any(char::is_control) => text.to_owned(),
        _ => format!("0x{}", dead_letter::hex(key)),
    }
}

fn row_to_parked(row: &AnyRow) -> Result<Parked, StoreError> {
    let headers: String = row.try_get("headers")?;
    Ok(Parked {
        subscription: row.try_get("subscription")?,
        topic: row.try_get("topic")?,
        partition: row.try_get("kafka_partition")?,
        offset: row.try_get("kafka_offset")?,
        record_key: row.try_get("record_key")?,
        headers: dead_letter::decode_headers(&headers)?,
        value: row.try_get("record_value")?,
        parked_at_ms: row.try_get("parked_at_ms")?,
    })
}

#[cfg(test)]
mod tests {
    use super::display_key;

    #[test]
    fn keys_read_as_text_when_they_are() {
        assert_eq!(display_key(b"job-42"), "job-42");
        assert_eq!(display_key(&[0, 255]), "0x00ff");
        assert_eq!(display_key(b"a\nb"), "0x610a62");
        assert_eq!(display_key(b""), "0x");
    }
}
