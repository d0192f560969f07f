//! Counts that stay cheap on big tables (issue 19): exact up to a cap; above
//! it PostgreSQL's planner estimate, marked as one, and SQLite's exact count.
//! The loose index scan finds every distinct status.

use herald_status::counting::{self, Count, Reading};
use herald_status::queries;
use herald_store::Db;
use herald_testkit::TestDb;

async fn fill(db: &Db, subscription: &str, rows: i64) -> anyhow::Result<()> {
    // One statement per 500 rows: the SQL subset both backends accept.
    for start in (0..rows).step_by(500) {
        let values: Vec<String> = (start..(start + 500).min(rows))
            .map(|i| format!("({}, '/t', 'e{i}', 'x', 't', 0, {i}, 0)", counting::literal(subscription)))
            .collect();
        let sql = format!(
            "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) VALUES {}",
            values.join(", ")
        );
        sqlx::query(&sql).execute(db.pool()).await?;
    }
    Ok(())
}

async fn capped_counts(test_db: TestDb) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    fill(&db, "search", 3_000).await?;
    fill(&db, "it's", 40).await?;
    fill(&db, "stats", counting::EXACT_UP_TO + 50).await?;
    if test_db.is_postgres() {
        sqlx::query("ANALYZE inbox").execute(db.pool()).await?;
    }
    let mut reading = Reading::begin(&db).await?;
    let search = "subscription = 'search'";
    assert_eq!(counting::count(&mut reading, "inbox", search, 5_000).await?, Count { n: 3_000, estimated: false }, "under the cap: exact");
    let quoted = format!("subscription = {}", counting::literal("it's"));
    assert_eq!(counting::count(&mut reading, "inbox", &quoted, 5_000).await?, Count { n: 40, estimated: false });

    let over = counting::count(&mut reading, "inbox", search, 100).await?;
    if test_db.is_postgres() {
        assert!(over.estimated, "above the cap PostgreSQL estimates: {over:?}");
        // Freshly analysed, the planner's figure is close; never below what was counted.
        assert!((2_500..=3_500).contains(&over.n), "{over:?}");
    } else {
        assert_eq!(over, Count { n: 3_000, estimated: false }, "SQLite keeps no estimate, so it counts");
    }

    // What the monitor shows: a figure above the cap says it is an estimate.
    let figures = queries::subscription_rows(&mut reading, &["stats", "search"], 0).await?;
    let (stats, search) = (&figures[0], &figures[1]);
    assert_eq!((search.inbox_rows, search.estimated.is_empty()), (3_000, true));
    if test_db.is_postgres() {
        assert_eq!(stats.estimated, ["inbox_rows"]);
        assert!(stats.inbox_rows > counting::EXACT_UP_TO, "{stats:?}");
    } else {
        assert_eq!((stats.inbox_rows, stats.estimated.is_empty()), (counting::EXACT_UP_TO + 50, true));
    }

    reading.finish().await?;

    let statuses = ["dead", "pending", "sent", "unknown"];
    for (i, status) in statuses.iter().cycle().take(41).enumerate() {
        sqlx::query(
            "INSERT INTO notification_intents (idempotency_key, source, event_id, recipient, kind, job_id, body, status, created_at_ms, updated_at_ms) \
             VALUES ($1, '/t', $1, 'r', 'export.completed', 'j', '{}', $2, 0, 0)",
        )
        .bind(format!("n{i}"))
        .bind(*status)
        .execute(db.pool())
        .await?;
    }
    let mut reading = Reading::begin(&db).await?;
    assert_eq!(counting::distinct(&mut reading, "notification_intents", "status").await?, statuses);
    assert!(counting::distinct(&mut reading, "export_jobs", "status").await?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn capped_counts_on_postgres() -> anyhow::Result<()> {
    capped_counts(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn capped_counts_on_sqlite() -> anyhow::Result<()> {
    capped_counts(herald_testkit::sqlite_db()?).await
}
