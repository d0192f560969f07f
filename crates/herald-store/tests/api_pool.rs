//! The HTTP API's own pool on PostgreSQL: its statements time out, are
//! planned for their parameters, and
//! holding every one of its connections leaves the background roles' pool
//! untouched.

use std::time::{Duration, Instant};

use herald_store::{Db, StoreError};
use sqlx::Row;

#[tokio::test]
async fn api_statements_time_out_and_an_exhausted_api_pool_leaves_the_roles_pool_free() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let api = db.api_pool(2, Duration::from_millis(500)).await?;

    let shown: String = sqlx::query("SHOW statement_timeout").fetch_one(api.pool()).await?.try_get(0)?;
    assert_eq!(shown, "500ms");
    let started = Instant::now();
    let slow = sqlx::query("SELECT pg_sleep(30)").execute(api.pool()).await.map_err(StoreError::from);
    assert!(matches!(&slow, Err(e) if e.is_retryable()), "a timed-out API statement is retryable, got {slow:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "cut at the timeout, not after 30 s");
    let roles: String = sqlx::query("SHOW statement_timeout").fetch_one(db.pool()).await?.try_get(0)?;
    assert_eq!(roles, "0", "the roles' pool has no statement timeout");
    // Search's plan depends on its pattern (BENCHMARKS.md, "Search"): no
    // generic plan for the API's prepared statements.
    let plans: String = sqlx::query("SHOW plan_cache_mode").fetch_one(api.pool()).await?.try_get(0)?;
    assert_eq!(plans, "force_custom_plan");

    // Every API connection busy: the API waits (and gives up), the roles do not.
    let held = (api.pool().acquire().await?, api.pool().acquire().await?);
    assert!(matches!(api.pool().acquire().await, Err(sqlx::Error::PoolTimedOut)));
    let started = Instant::now();
    sqlx::query("SELECT 1").execute(db.pool()).await?;
    assert!(started.elapsed() < Duration::from_millis(400), "the roles' pool answered at once");
    drop(held);
    Ok(())
}

#[tokio::test]
async fn sqlite_shares_its_one_pool() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let api = db.api_pool(2, Duration::from_millis(500)).await?;
    sqlx::query("SELECT 1").execute(api.pool()).await?;
    Ok(())
}
