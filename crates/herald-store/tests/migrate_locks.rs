//! `herald migrate` on a live PostgreSQL: a migration's lock request queues
//! every later query of its table behind it. Behind a transaction that
//! waits, in its process, for one of those queries, nothing would ever move
//! (the rolling-upgrade drill hung so: a v0.12.0 `consume notify` holding a
//! transaction open, 0021's `ALTER TABLE outbox` waiting for it, and the
//! rest of that process queued behind 0021). Each attempt now gives up its
//! lock request after a few seconds and tries again.

use std::time::Duration;

use anyhow::Context;
use herald_store::Db;
use sqlx::Connection;

const LAST: &str = "0022_outbox_contract.sql";

/// Applies every PostgreSQL migration before the last one: `herald migrate`
/// then has `ALTER TABLE outbox` left to do.
async fn migrate_all_but_the_last(url: &str) -> anyhow::Result<()> {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations/postgres");
    let dir = tempfile::tempdir()?;
    for entry in std::fs::read_dir(&shipped)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).context("a UTF-8 name")?.to_owned();
        if name.as_str() < LAST {
            std::fs::copy(&path, dir.path().join(&name))?;
        }
    }
    let earlier = sqlx::migrate::Migrator::new(dir.path()).await?;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    earlier.run(&mut conn).await?;
    Ok(())
}

async fn waiting_for_a_lock(probe: &mut sqlx::PgConnection) -> anyhow::Result<bool> {
    let waiting: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            .fetch_one(probe)
            .await?;
    Ok(waiting > 0)
}

#[tokio::test]
async fn a_migration_never_holds_up_a_table_behind_an_open_transaction() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    migrate_all_but_the_last(&test_db.url).await?;

    // An application's transaction that read the outbox and is not done.
    let mut open = sqlx::PgConnection::connect(&test_db.url).await?;
    let mut open_tx = open.begin().await?;
    sqlx::query("SELECT count(*) FROM outbox").execute(&mut *open_tx).await?;

    let db = Db::connect(&test_db.url).await?;
    let mut probe = sqlx::PgConnection::connect(&test_db.url).await?;
    // Owns the open transaction: however it ends, the transaction ends too
    // (a failure rolls it back), so the migration can finish and the test
    // reports instead of hanging.
    let application = async move {
        let outcome = async {
            let queued = async {
                while !waiting_for_a_lock(&mut probe).await? {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                anyhow::Ok(())
            };
            tokio::time::timeout(Duration::from_secs(30), queued)
                .await
                .context("the migration never waited for the open transaction")??;
            // The same application's next read of the outbox (another
            // connection of its pool): before the fix it queued behind the
            // migration's lock request for as long as the transaction stayed
            // open — here, for ever.
            let next_read = sqlx::query_scalar::<_, i64>("SELECT count(*) FROM outbox").fetch_one(&mut probe);
            tokio::time::timeout(Duration::from_secs(30), next_read)
                .await
                .context("a read of the outbox waited behind the migration for 30 s")??;
            anyhow::Ok(())
        }
        .await;
        // Dropped, a transaction only queues its rollback for the
        // connection's next use; this one has none.
        match outcome {
            Ok(()) => open_tx.commit().await?,
            Err(_) => open_tx.rollback().await?,
        }
        outcome
    };
    let (migrated, application) = tokio::join!(db.migrate(), application);
    application?;
    migrated?;
    let mut probe = sqlx::PgConnection::connect(&test_db.url).await?;
    let columns: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'outbox' AND column_name IN ('content_type', 'extensions')",
    )
    .fetch_one(&mut probe)
    .await?;
    assert_eq!(columns, 2, "the last migration was applied once the transaction ended");
    Ok(())
}
