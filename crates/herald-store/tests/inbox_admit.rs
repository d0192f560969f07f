//! Admitting a batch whose keys were partly admitted before (a redelivery,
//! a replay resumed after a batch it had committed): the plain insert
//! fails on the first known key, the savepoint is rolled back, and the
//! conflict-skipping insert says which keys are new — on the shared `Any`
//! path on both databases and on the replay's native PostgreSQL path.

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
