//! What Herald's SQLite connection promises: a commit it acknowledged
//! survives a power loss (`synchronous = FULL`, not WAL's cheaper NORMAL,
//! which may drop the last commits), and foreign keys are enforced.

use herald_store::Db;
use sqlx::Row;

#[tokio::test]
async fn acknowledged_commits_survive_a_power_loss() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let row = sqlx::query("PRAGMA synchronous").fetch_one(db.pool()).await?;
    // 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA.
    assert_eq!(row.try_get::<i64, _>(0)?, 2, "synchronous must be FULL");
    let row = sqlx::query("PRAGMA journal_mode").fetch_one(db.pool()).await?;
    assert_eq!(row.try_get::<String, _>(0)?, "wal");
    let row = sqlx::query("PRAGMA foreign_keys").fetch_one(db.pool()).await?;
    assert_eq!(row.try_get::<i64, _>(0)?, 1);
    Ok(())
}

/// Two processes on one file: a transaction that reads, then writes after
/// the other process committed a write, must not fail. With SQLite's
/// default deferred `BEGIN` it fails at once ("database is locked", the
/// stale snapshot cannot become a writer, whatever the busy timeout); so
/// `Db::begin` takes the write lock first and the other writer waits.
#[tokio::test]
async fn a_transaction_that_reads_then_writes_survives_another_process_writing() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let (one, other) = (Db::connect_and_migrate(&test_db.url).await?, Db::connect(&test_db.url).await?);
    sqlx::query("CREATE TABLE marks (who TEXT NOT NULL)").execute(one.pool()).await?;

    let mut tx = one.begin().await?;
    let seen: i64 = sqlx::query("SELECT COUNT(*) AS n FROM marks").fetch_one(&mut *tx).await?.try_get("n")?;
    let mut writer = tokio::spawn(async move { sqlx::query("INSERT INTO marks (who) VALUES ('other')").execute(other.pool()).await });
    // With the lock taken at BEGIN the other writer cannot finish while the
    // transaction is open; a deferred BEGIN lets it commit now.
    let finished_early = tokio::time::timeout(std::time::Duration::from_secs(1), &mut writer).await.is_ok();
    sqlx::query("INSERT INTO marks (who) VALUES ('one')").execute(&mut *tx).await?;
    tx.commit().await?;
    writer.await??;
    assert!(!finished_early, "the other process wrote inside the transaction's read-then-write");
    let total: i64 = sqlx::query("SELECT COUNT(*) AS n FROM marks").fetch_one(one.pool()).await?.try_get("n")?;
    assert_eq!((seen, total), (0, 2));
    Ok(())
}
