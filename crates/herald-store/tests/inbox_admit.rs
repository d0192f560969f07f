//! Admitting a batch whose keys were partly admitted before (a redelivery,
//! a replay resumed after a batch it had committed): on the shared `Any`
//! path (both databases) the plain insert fails on the first known key,
//! the savepoint is rolled back, and the conflict-skipping insert says which
//! keys are new; on the native PostgreSQL path the plain insert fails the
//! transaction (the engine starts over) and `admit_batch_pg` says which.

use std::collections::HashSet;

use herald_envelope::EventKey;
use herald_store::Db;
use herald_store::inbox::{self, Delivery, Entry, PgEntry};
use sqlx::postgres::PgPoolOptions;

fn key(id: &str) -> EventKey {
    EventKey { source: "/test".into(), id: id.into() }
}

fn keys(ids: &[&str]) -> Vec<EventKey> {
    ids.iter().map(|id| key(id)).collect()
}

async fn admit_any(db: &Db, batch: &[EventKey]) -> anyhow::Result<HashSet<EventKey>> {
    let entries: Vec<Entry<'_>> = batch
        .iter()
        .enumerate()
        .map(|(i, key)| Entry { key, event_type: "test.happened", delivery: Delivery { topic: "t", partition: 0, offset: i as i64 } })
        .collect();
    let mut tx = db.begin().await?;
    let first = inbox::admit_batch(&mut tx, "sub", &entries).await?;
    tx.commit().await?;
    Ok(first)
}

async fn partly_known_batch_admits_only_new_keys(postgres: bool) -> anyhow::Result<()> {
    let test_db = if postgres { herald_testkit::postgres_db().await? } else { herald_testkit::sqlite_db()? };
    let db = Db::connect_and_migrate(&test_db.url).await?;
    assert_eq!(admit_any(&db, &keys(&["a", "b"])).await?, keys(&["a", "b"]).into_iter().collect());
    assert_eq!(admit_any(&db, &keys(&["b", "c", "a"])).await?, keys(&["c"]).into_iter().collect());
    assert_eq!(inbox::count(&db, "sub").await?, 3);
    Ok(())
}

#[tokio::test]
async fn partly_known_batch_admits_only_new_keys_postgres() -> anyhow::Result<()> {
    partly_known_batch_admits_only_new_keys(true).await
}

#[tokio::test]
async fn partly_known_batch_admits_only_new_keys_sqlite() -> anyhow::Result<()> {
    partly_known_batch_admits_only_new_keys(false).await
}

async fn admit_native(pool: &sqlx::PgPool, batch: &[EventKey]) -> anyhow::Result<HashSet<EventKey>> {
    let entries: Vec<PgEntry<'_>> = batch
        .iter()
        .enumerate()
        .map(|(i, key)| PgEntry { key, event_type: "test.happened", topic: "t", partition: 0, offset: i as i64 })
        .collect();
    let mut tx = pool.begin().await?;
    let first = inbox::admit_batch_pg(&mut tx, "sub@g2", &entries).await?;
    tx.commit().await?;
    Ok(first)
}

/// A replay resumed after a batch it committed (killed before it could
/// record that it had) admits that batch's keys again.
#[tokio::test]
async fn partly_known_batch_admits_only_new_keys_native_postgres() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let pool = PgPoolOptions::new().max_connections(1).connect(&test_db.url).await?;
    assert_eq!(admit_native(&pool, &keys(&["a", "b"])).await?, keys(&["a", "b"]).into_iter().collect());
    assert_eq!(admit_native(&pool, &keys(&["b", "c", "a"])).await?, keys(&["c"]).into_iter().collect());
    assert_eq!(inbox::count(&db, "sub@g2").await?, 3);
    pool.close().await;
    Ok(())
}

/// The plain native insert nearly every batch takes: a key already there
/// fails it with a unique violation (the engine then starts over in a new
/// transaction with `admit_batch_pg`), and nothing of that batch stays.
#[tokio::test]
async fn plain_native_insert_fails_on_a_known_key() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let pool = PgPoolOptions::new().max_connections(1).connect(&test_db.url).await?;
    let insert = |batch: Vec<EventKey>| {
        let pool = pool.clone();
        async move {
            let entries: Vec<PgEntry<'_>> =
                batch.iter().map(|key| PgEntry { key, event_type: "test.happened", topic: "t", partition: 0, offset: 0 }).collect();
            let mut tx = pool.begin().await?;
            let outcome = inbox::insert_batch_pg(&mut tx, "sub", &entries).await;
            if outcome.is_ok() {
                tx.commit().await?;
            }
            Ok::<_, sqlx::Error>(outcome)
        }
    };
    assert!(insert(keys(&["a"])).await?.is_ok());
    match insert(keys(&["b", "a"])).await? {
        Err(sqlx::Error::Database(e)) => assert!(e.is_unique_violation(), "{e}"),
        other => panic!("a known key must fail the plain insert, got {other:?}"),
    }
    assert_eq!(inbox::count(&db, "sub").await?, 1, "b must not stay behind");
    pool.close().await;
    Ok(())
}
