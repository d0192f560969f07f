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
