//! The monitor behind `/metrics` and `/status.json`: samples accumulate up
//! to the history size, finished jobs are observed once, runtime counters
//! are copied, and a failed refresh is shown without losing what was there.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use herald_status::{Monitor, MonitorConfig};
use herald_store::Db;

#[tokio::test(flavor = "multi_thread")]
async fn refreshes_keep_a_bounded_history_and_show_failures() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let config = MonitorConfig { history: 3, ..MonitorConfig::new(&["search", "stats", "notify"]) };
    let monitor = Monitor::new(db.clone(), None, config)?;
    let delivered = Arc::new(AtomicU64::new(0));
    let counter = delivered.clone();
    monitor.register_counter("herald_relay_rows_delivered_total", &[], move || counter.load(Ordering::Relaxed));

    monitor.refresh().await?;
    // A job that finishes after the monitor started is one histogram observation.
    let now = herald_store::now_ms();
    sqlx::query("INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms, completed_at_ms) VALUES ('j1', 'a', 'csv', 'q', 'succeeded', 1, $1, $2, $2)")
        .bind(now - 1_500)
        .bind(now)
        .execute(db.pool())
        .await?;
    delivered.store(7, Ordering::Relaxed);
    for _ in 0..4 {
        monitor.refresh().await?;
    }
    let json = monitor.json();
    assert_eq!(json["history"].as_array().map(Vec::len), Some(3), "bounded: {json}");
    assert_eq!(json["status"]["jobs"]["by_status"]["succeeded"], 1);
    assert!(json["error"].is_null());
    let metrics = monitor.prometheus();
    for line in [
        "herald_relay_rows_delivered_total 7",
        "herald_export_latency_seconds_count 1",
        "herald_export_jobs{status=\"succeeded\"} 1",
        "herald_kafka_up 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}`:\n{metrics}");
    }

    db.close().await;
    assert!(monitor.refresh().await.is_err(), "a closed pool cannot be read");
    let json = monitor.json();
    assert!(json["error"].as_str().is_some_and(|e| !e.is_empty()), "{json}");
    assert_eq!(json["status"]["jobs"]["by_status"]["succeeded"], 1, "the last good figures stay");
    assert!(monitor.prometheus().lines().any(|l| l == "herald_status_refresh_errors_total 1"));
    Ok(())
}
