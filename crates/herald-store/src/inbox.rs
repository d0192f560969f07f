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

/// Which of `keys` `subscription` has admitted: for a reader that waits on
/// an event's effect (the latency benchmark's, tests), since the inbox row
/// commits with it. Statements per source, each key looked up through the
/// primary key: with the source left out, PostgreSQL walks every row of the
/// subscription for each call (a reader asking every few milliseconds then
/// takes a core for itself once the inbox holds a few hundred thousand rows).
/// Up to 200 keys a statement, each statement planned for its keys.
pub async fn seen_among(db: &Db, subscription: &str, keys: &[EventKey]) -> Result<HashSet<EventKey>, StoreError> {
    let mut by_source: std::collections::BTreeMap<&str, Vec<&str>> = std::collections::BTreeMap::new();
    for key in keys {
        by_source.entry(key.source.as_str()).or_default().push(key.id.as_str());
    }
    let mut seen = HashSet::new();
    for (source, ids) in by_source {
        for chunk in statements_of(&ids) {
            let sql = seen_statement(chunk.len());
            // Planned for each call's keys: a plan cached while the inbox was
            // nearly empty is a scan of the subscription, which the table
            // outgrows (BENCHMARKS.md, "Latency").
            let mut query = sqlx::query(&sql).persistent(false).bind(subscription).bind(source);
            for id in chunk {
                query = query.bind(*id);
            }
            for row in query.fetch_all(db.pool()).await? {
                seen.insert(EventKey { source: source.to_owned(), id: row.try_get("event_id")? });
            }
        }
    }
    Ok(seen)
}

/// Keys per statement of [`seen_among`]: one round trip per 200 keys. Cut
/// into `outbox::statement_chunks`' sizes instead, a reader asking 37 keys
/// sent four statements every poll, and the latency benchmark's reader,
/// asking every 2 ms, took CPU from the subscription it measured
/// (BENCHMARKS.md, "Latency"). No padding to one statement size: the
/// lookup is not kept prepared (see `seen_among`), so sizes cost nothing.
const SEEN_PER_STATEMENT: usize = 200;

/// `ids` as [`seen_among`] asks them, one slice per statement.
fn statements_of<'a, 'b>(ids: &'a [&'b str]) -> std::slice::Chunks<'a, &'b str> {
    ids.chunks(SEEN_PER_STATEMENT)
}

fn seen_statement(ids: usize) -> String {
    let ids = crate::outbox::placeholders(3, ids);
    format!("SELECT event_id FROM inbox WHERE subscription = $1 AND source = $2 AND event_id IN ({ids})")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_go_one_round_trip_per_200() {
        let ids: Vec<String> = (0..437).map(|i| format!("id-{i}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        assert_eq!(statements_of(&ids[..37]).count(), 1, "37 keys, one statement");
        let statements: Vec<&[&str]> = statements_of(&ids).collect();
        assert_eq!(statements.iter().map(|s| s.len()).collect::<Vec<_>>(), [200, 200, 37]);
        let asked: HashSet<&str> = statements.iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(asked, ids.iter().copied().collect::<HashSet<_>>(), "every key asked");
    }

    /// The statement must reach each key through the primary key
    /// (subscription, source, event_id), not walk the subscription's rows
    /// and filter them: the benchmark's reader asked every 2 ms and, without
    /// the source, each ask read the whole subscription (480 ms at 360,000
    /// rows, BENCHMARKS.md "Latency").
    #[tokio::test]
    async fn a_lookup_of_seen_keys_goes_through_the_whole_primary_key_postgres() -> anyhow::Result<()> {
        let test_db = herald_testkit::postgres_db().await?;
        let db = Db::connect_and_migrate(&test_db.url).await?;
        sqlx::query(
            "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
             SELECT 'search', '/test', 'e-' || i, 't', 't', 0, i, 0 FROM generate_series(1, 20000) AS i",
        )
        .execute(db.pool())
        .await?;
        sqlx::query("ANALYZE inbox").execute(db.pool()).await?;
        let sql = format!("EXPLAIN {}", seen_statement(3));
        let mut explain = sqlx::query(&sql).bind("search").bind("/test");
        for id in ["e-7", "e-19999", "absent"] {
            explain = explain.bind(id);
        }
        let plan: Vec<String> = explain.fetch_all(db.pool()).await?.iter().map(|r| r.try_get(0)).collect::<Result<_, _>>()?;
        let conditions: Vec<&String> = plan.iter().filter(|line| line.contains("Index Cond")).collect();
        assert!(conditions.iter().any(|c| c.contains("event_id")), "event_id must be an index condition:\n{}", plan.join("\n"));
        assert!(!plan.iter().any(|line| line.contains("Filter")), "nothing filtered after the index:\n{}", plan.join("\n"));

        let keys = |ids: &[&str]| ids.iter().map(|id| EventKey { source: "/test".into(), id: (*id).into() }).collect::<Vec<_>>();
        let mut asked = keys(&["e-7", "e-19999", "absent"]);
        asked.push(EventKey { source: "/elsewhere".into(), id: "e-7".into() });
        assert_eq!(seen_among(&db, "search", &asked).await?, keys(&["e-7", "e-19999"]).into_iter().collect());
        assert!(seen_among(&db, "other", &asked).await?.is_empty(), "another subscription's inbox is its own");
        Ok(())
    }

    /// The lookup is planned for each call, never kept prepared: a plan
    /// cached while the inbox was nearly empty is a scan of the whole
    /// subscription, and nothing replans it while the table grows until
    /// autovacuum analyzes it (the latency benchmark's reader saw its lookups
    /// take 1-2 s after a minute of load, BENCHMARKS.md "Latency").
    #[tokio::test]
    async fn a_lookup_of_seen_keys_keeps_no_plan_between_calls_postgres() -> anyhow::Result<()> {
        let test_db = herald_testkit::postgres_db().await?;
        let db = Db::connect_and_migrate(&test_db.url).await?;
        // One connection, so the lookups and the check below share a session.
        let session = db.api_pool(1, std::time::Duration::from_secs(10)).await?;
        let asked = [EventKey { source: "/test".into(), id: "e-1".into() }];
        for _ in 0..6 {
            assert!(seen_among(&session, "search", &asked).await?.is_empty());
        }
        let kept: i64 = sqlx::query("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%FROM inbox WHERE subscription%' AND statement NOT LIKE '%pg_prepared%'")
            .fetch_one(session.pool())
            .await?
            .try_get(0)?;
        assert_eq!(kept, 0, "the seen-keys lookup must not stay prepared in the session");
        Ok(())
    }

    #[tokio::test]
    async fn seen_keys_are_those_of_the_subscription_and_source_asked_sqlite() -> anyhow::Result<()> {
        let test_db = herald_testkit::sqlite_db()?;
        let db = Db::connect_and_migrate(&test_db.url).await?;
        let (seen, unseen) = (EventKey { source: "/test".into(), id: "a".into() }, EventKey { source: "/test".into(), id: "b".into() });
        let mut tx = db.begin().await?;
        assert!(admit(&mut tx, "search", &seen, "t", &Delivery { topic: "t", partition: 0, offset: 0 }).await?);
        tx.commit().await?;
        let elsewhere = EventKey { source: "/elsewhere".into(), id: "a".into() };
        let asked = [seen.clone(), unseen, elsewhere];
        assert_eq!(seen_among(&db, "search", &asked).await?, HashSet::from([seen.clone()]));
        assert!(seen_among(&db, "other", &asked).await?.is_empty());
        // 137 keys go as one statement: every one is asked.
        let mut many: Vec<EventKey> = (0..136).map(|i| EventKey { source: "/test".into(), id: format!("x-{i}") }).collect();
        many.push(seen.clone());
        assert_eq!(seen_among(&db, "search", &many).await?, HashSet::from([seen]));
        Ok(())
    }
}
