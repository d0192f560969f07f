//! The search projection's two writers on a batch meeting earlier writes:
//! a job already in the generation sends both paths from the plain insert to
//! the version-guarded upsert; nothing older overwrites anything newer.
//! PostgreSQL's native fast path (what replays use) and the shared `Any`
//! path (live traffic, SQLite), on both databases.

mod common;

use common::completed;
use herald_consumer::{HandlerError, Projection, WritePath};
use herald_projections::search::{Fact, Search};
use herald_store::Db;
use herald_testkit::{TestDb, postgres_db, sqlite_db};
use sqlx::Connection;
use sqlx::Row;

async fn versions(db: &Db) -> anyhow::Result<Vec<(String, i64)>> {
    let rows =
        sqlx::query("SELECT job_id, version FROM search_documents WHERE generation = 7 ORDER BY job_id").fetch_all(db.pool()).await?;
    Ok(rows.iter().map(|r| Ok((r.try_get("job_id")?, r.try_get("version")?))).collect::<Result<_, sqlx::Error>>()?)
}

/// Writes `facts` into generation 7: through the native driver on
/// PostgreSQL as the engine does (plainly; on a conflict, again under the
/// guard in a new transaction), through `Any` elsewhere. True when the
/// plain native write met a conflict.
async fn write(db: &Db, facts: &[Fact], native: bool) -> anyhow::Result<bool> {
    let refs: Vec<&Fact> = facts.iter().collect();
    if !native {
        let mut tx = db.begin().await?;
        Search.write(&mut tx, 7, &refs).await?;
        tx.commit().await?;
        return Ok(false);
    }
    let mut conn = sqlx::PgConnection::connect(db.url()).await?;
    let mut tx = conn.begin().await?;
    match Search.write_pg(&mut tx, 7, None, &refs, WritePath::Plain).await {
        Ok(()) => {
            tx.commit().await?;
            return Ok(false);
        }
        Err(HandlerError::Conflict(_)) => tx.rollback().await?,
        Err(e) => return Err(e.into()),
    }
    let mut tx = conn.begin().await?;
    Search.write_pg(&mut tx, 7, None, &refs, WritePath::Upsert).await?;
    tx.commit().await?;
    Ok(true)
}

async fn earlier_writes_fall_back_and_keep_versions(test_db: TestDb, native: bool) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    assert!(!write(&db, &[completed("a", 2), completed("b", 1)], native).await?, "nothing there yet: no conflict");
    assert_eq!(versions(&db).await?, [("a".to_owned(), 2), ("b".to_owned(), 1)]);
    // a again with an older version, b with a newer one, a twice in the batch.
    let conflict = write(&db, &[completed("a", 2), completed("a", 1), completed("b", 3)], native).await?;
    assert_eq!(conflict, native, "the plain native write meets a and b as a conflict, not a rejection");
    assert_eq!(versions(&db).await?, [("a".to_owned(), 2), ("b".to_owned(), 3)]);
    Ok(())
}

#[tokio::test]
async fn conflicts_fall_back_on_postgres_native() -> anyhow::Result<()> {
    earlier_writes_fall_back_and_keep_versions(postgres_db().await?, true).await
}

#[tokio::test]
async fn conflicts_fall_back_on_postgres_any() -> anyhow::Result<()> {
    earlier_writes_fall_back_and_keep_versions(postgres_db().await?, false).await
}

#[tokio::test]
async fn conflicts_fall_back_on_sqlite() -> anyhow::Result<()> {
    earlier_writes_fall_back_and_keep_versions(sqlite_db()?, false).await
}
