//! Several processes, one refresh: the monitor holding the lease on the
//! status snapshot takes the figures, the others read what it stored, and
//! when the holder stops refreshing another takes over once its lease ran
//! out. On both databases.

use std::sync::Arc;
use std::time::Duration;

use herald_status::{Monitor, MonitorConfig};
use herald_store::Db;

const NAMES: [&str; 3] = ["search", "stats", "notify"];

fn monitor(db: &Db, interval: Duration) -> anyhow::Result<Arc<Monitor>> {
    Ok(Monitor::new(db.clone(), None, MonitorConfig { interval, ..MonitorConfig::new(&NAMES) })?)
}

async fn succeeded_job(db: &Db, id: &str) -> anyhow::Result<()> {
    let now = herald_store::now_ms();
    sqlx::query(
        "INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms, completed_at_ms) \
         VALUES ($1, 'a', 'csv', 'q', 'succeeded', 1, $2, $2, $2)",
    )
    .bind(id)
    .bind(now)
    .execute(db.pool())
    .await?;
    Ok(())
}

fn succeeded(monitor: &Monitor) -> i64 {
    monitor.json()["status"]["jobs"]["by_status"]["succeeded"].as_i64().unwrap_or(0)
}

async fn one_takes_the_figures_for_all(url: &str) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(url).await?;
    let (holder, reader) = (monitor(&db, Duration::from_secs(60))?, monitor(&db, Duration::from_secs(60))?);
    holder.refresh().await?;
    succeeded_job(&db, "j1").await?;
    reader.refresh().await?;
    assert_eq!((holder.refreshes_taken(), reader.refreshes_taken()), (1, 0), "the reader took nothing itself");
    assert_eq!(succeeded(&reader), 0, "it shows the holder's figures, taken before the job");

    // The holder refreshes on its own schedule; the reader sees its figures.
    holder.refresh().await?;
    reader.refresh().await?;
    assert_eq!((holder.refreshes_taken(), reader.refreshes_taken()), (2, 0));
    assert_eq!((succeeded(&holder), succeeded(&reader)), (1, 1));
    assert_eq!(reader.json()["history"].as_array().map(Vec::len), Some(2), "one sample per snapshot, not per read");
    Ok(())
}

async fn a_stopped_holder_is_taken_over(url: &str) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(url).await?;
    let interval = Duration::from_secs(1);
    let (stopped, survivor) = (monitor(&db, interval)?, monitor(&db, interval)?);
    stopped.refresh().await?;
    succeeded_job(&db, "j1").await?;
    // `stopped` refreshes no more: once its lease (three intervals) ran out,
    // the survivor takes the figures itself.
    herald_testkit::wait_until("the survivor takes over", Duration::from_secs(30), || async {
        survivor.refresh().await?;
        Ok(survivor.refreshes_taken() > 0)
    })
    .await?;
    assert_eq!(succeeded(&survivor), 1);
    // Back again, the old holder reads the new holder's snapshot.
    stopped.refresh().await?;
    assert_eq!(stopped.refreshes_taken(), 1, "the lease is the survivor's now");
    assert_eq!(succeeded(&stopped), 1);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_one_monitor_takes_the_figures_for_all() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    one_takes_the_figures_for_all(&test_db.url).await
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_one_monitor_takes_the_figures_for_all() -> anyhow::Result<()> {
    one_takes_the_figures_for_all(&herald_testkit::postgres_db().await?.url).await
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_a_stopped_holder_is_taken_over() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    a_stopped_holder_is_taken_over(&test_db.url).await
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_a_stopped_holder_is_taken_over() -> anyhow::Result<()> {
    a_stopped_holder_is_taken_over(&herald_testkit::postgres_db().await?.url).await
}
