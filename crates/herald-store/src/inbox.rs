//! Per-subscription inbox: the record that a subscription has applied an
//! event's effect. Written in the same transaction as the effect, so "seen"
//! and "applied" cannot disagree.

use std::collections::HashSet;

use herald_envelope::EventKey;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{Db, StoreError, Tx, now_ms};

/// Where a record was read from, kept for audits and dead-letter redrives.
#[derive(Debug, Clone)]
pub struct Delivery<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// Admits `key` for `subscription` inside `tx`. `true` means first sight: the
/// caller applies the effect in the same transaction. `false` means the effect
/// was already applied and must not be applied again.
pub async fn admit(
    tx: &mut Tx<'_>,
    subscription: &str,
    key: &EventKey,
    event_type: &str,
    delivery: &Delivery<'_>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, \
         kafka_offset, processed_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (subscription, source, event_id) DO NOTHING",
    )
    .bind(subscription)
    .bind(&key.source)
    .bind(&key.id)
    .bind(event_type)
    .bind(delivery.topic)
    .bind(delivery.partition)
    .bind(delivery.offset)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// One event of a batch to admit.
#[derive(Debug, Clone)]
pub struct Entry<'a> {
    pub key: &'a EventKey,
    pub event_type: &'a str,
    pub delivery: Delivery<'a>,
}

/// Admits many keys for `subscription` inside `tx` and returns those seen for
/// the first time; the caller applies exactly those in the same transaction.
///
/// Entries are admitted in key order so that two transactions admitting
/// overlapping keys (two members of a group during a rebalance handoff) lock
/// rows in the same order and cannot deadlock each other.
///
/// Almost every batch is new to the subscription, and a plain `INSERT` costs
/// PostgreSQL about half of what `ON CONFLICT` does (speculative insertion
/// looks the key up twice). So the batch is first inserted plainly behind a
/// savepoint; only if a key is already there (a redelivery, a rewind, a
/// competing member) is the savepoint rolled back and the batch admitted with
/// `ON CONFLICT DO NOTHING`, which tells which keys were new.
pub async fn admit_batch(tx: &mut Tx<'_>, subscription: &str, entries: &[Entry<'_>]) -> Result<HashSet<EventKey>, StoreError> {
    let mut sorted: Vec<&Entry<'_>> = entries.iter().collect();
    sorted.sort_by(|a, b| a.key.cmp(b.key));
    let now = now_ms();
    sqlx::query("SAVEPOINT inbox_admit").execute(&mut **tx).await?;
    match insert_rows(tx, subscription, &sorted, now, OnConflict::Fail).await {
        Ok(_) => return Ok(sorted.iter().map(|e| e.key.clone()).collect()),
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            sqlx::query("ROLLBACK TO SAVEPOINT inbox_admit").execute(&mut **tx).await?;
        }
        Err(e) => return Err(e.into()),
    }
    let rows = insert_rows(tx, subscription, &sorted, now, OnConflict::Skip).await?;
    rows.iter().map(|row| Ok(EventKey { source: row.try_get("source")?, id: row.try_get("event_id")? })).collect()
}

#[derive(Clone, Copy)]
enum OnConflict {
    /// Fail the statement on a key already admitted.
    Fail,
    /// Skip keys already admitted and return the ones inserted.
    Skip,
}

async fn insert_rows(
    tx: &mut Tx<'_>,
    subscription: &str,
    sorted: &[&Entry<'_>],
    now: i64,
    on_conflict: OnConflict,
) -> Result<Vec<AnyRow>, sqlx::Error> {
    let tail = match on_conflict {
        OnConflict::Fail => "",
        OnConflict::Skip => " ON CONFLICT (subscription, source, event_id) DO NOTHING RETURNING source, event_id",
    };
    let mut inserted = Vec::new();
    for chunk in crate::outbox::statement_chunks(sorted) {
        let values: Vec<String> = (0..chunk.len()).map(|i| format!("({})", crate::outbox::placeholders(i * 8 + 1, 8))).collect();
        let sql = format!(
            "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, \
             kafka_offset, processed_at_ms) VALUES {}{tail}",
            values.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for e in chunk {
            query = query
                .bind(subscription)
                .bind(&e.key.source)
                .bind(&e.key.id)
                .bind(e.event_type)
                .bind(e.delivery.topic)
                .bind(e.delivery.partition)
                .bind(e.delivery.offset)
                .bind(now);
        }
        match on_conflict {
            OnConflict::Fail => {
                query.execute(&mut **tx).await?;
            }
            OnConflict::Skip => inserted.extend(query.fetch_all(&mut **tx).await?),
        }
    }
    Ok(inserted)
}

/// Rewrites `subscription`'s inbox rows keyed by a legacy source alias to the
/// canonical source, so dedup rows written before the legacy mapping existed
/// still match the normalised key. A row whose canonical twin already exists
/// is a duplicate of it and is dropped. Idempotent; run at subscription start.
pub async fn normalise_legacy_sources(db: &Db, subscription: &str, aliases: &[(&str, &str)]) -> Result<u64, StoreError> {
    let mut tx = db.begin().await?;
    let mut changed = 0;
    for (legacy, canonical) in aliases {
        sqlx::query(
            "DELETE FROM inbox WHERE subscription = $1 AND source = $2 AND EXISTS (SELECT 1 FROM inbox c \
             WHERE c.subscription = $1 AND c.source = $3 AND c.event_id = inbox.event_id)",
        )
        .bind(subscription)
        .bind(*legacy)
        .bind(*canonical)
        .execute(&mut *tx)
        .await?;
        changed += sqlx::query("UPDATE inbox SET source = $1 WHERE subscription = $2 AND source = $3")
            .bind(*canonical)
            .bind(subscription)
            .bind(*legacy)
            .execute(&mut *tx)
            .await?
            .rows_affected();
    }
    tx.commit().await?;
    Ok(changed)
}

/// Inbox rows of `subscription`, for reports and tests.
pub async fn count(db: &Db, subscription: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM inbox WHERE subscription = $1").bind(subscription).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}

/// One record admitted on PostgreSQL's native driver (a replay, a live
/// batch's fast path).
#[derive(Debug, Clone, Copy)]
pub struct PgEntry<'a> {
    pub key: &'a EventKey,
    pub event_type: &'a str,
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// Inserts the inbox rows of `entries` plainly on sqlx's native PostgreSQL
/// driver, with array binds: one statement whatever the batch's size
/// (`Any` cannot bind arrays, and multi-row `VALUES` through it spends most
/// of a batch's time in the client, BENCHMARKS.md "Rebuild"). Nearly every
/// batch is new, and this is the cheapest way to record it: no savepoint,
/// no `ON CONFLICT`. A key already there fails the statement with a unique
/// violation, and with it the transaction: start over in a new one with
/// [`admit_batch_pg`].
pub async fn insert_batch_pg(conn: &mut sqlx::PgConnection, scope: &str, entries: &[PgEntry<'_>]) -> Result<(), sqlx::Error> {
    insert_pg(conn, scope, entries, "").await.map(drop)
}

/// Admits `entries` on the native driver whatever is there already
/// (`ON CONFLICT DO NOTHING`) and returns (source, id) of the keys seen for
/// the first time.
pub async fn admit_batch_pg(conn: &mut sqlx::PgConnection, scope: &str, entries: &[PgEntry<'_>]) -> Result<HashSet<EventKey>, sqlx::Error> {
    let tail = " ON CONFLICT (subscription, source, event_id) DO NOTHING RETURNING source, event_id";
    Ok(insert_pg(conn, scope, entries, tail).await?.into_iter().map(|(source, id)| EventKey { source, id }).collect())
}

async fn insert_pg(
    conn: &mut sqlx::PgConnection,
    scope: &str,
    entries: &[PgEntry<'_>],
    tail: &str,
) -> Result<Vec<(String, String)>, sqlx::Error> {
    let sql = format!(
        "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
         SELECT $1, s, i, t, tp, p, o, $2 FROM UNNEST($3::text[], $4::text[], $5::text[], $6::text[], $7::int4[], $8::int8[]) \
         AS u(s, i, t, tp, p, o){tail}"
    );
    sqlx::query_as::<_, (String, String)>(&sql)
        .bind(scope)
        .bind(now_ms())
        .bind(entries.iter().map(|e| e.key.source.as_str()).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| e.key.id.as_str()).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| e.event_type).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| e.topic).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| e.partition).collect::<Vec<_>>())
        .bind(entries.iter().map(|e| e.offset).collect::<Vec<_>>())
        .fetch_all(&mut *conn)
        .await
}
