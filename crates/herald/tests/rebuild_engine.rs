//! The projection engine's rebuilds on the shared Apache Kafka cluster, on
//! both databases:
//!
//! - records appended and applied live while a rebuild opens its generation
//!   (a gate holds the rebuild between reading the topic's ends and opening)
//!   are not lost: the rebuild verifies and switches, search and stats;
//!   before generations owned records by offset, the new generation missed
//!   them and verification failed the rebuild;
//! - a relayed duplicate in history counts once in a stats rebuild, and one
//!   arriving after the boundary once in both generations;
//! - an offline rebuild with the live subscription stopped 10,000 events
//!   behind replays to the end, verifies against the jobs table and
//!   switches; the live subscription, resumed, writes only what the new
//!   generation does not own, and both generations end equal.

use std::sync::Arc;
use std::time::Duration;

use herald::bench::workload;
use herald::pipeline::{self, RoleOptions, Roles, Wiring};
use herald_api::Tokens;
use herald_envelope::OutboxEvent;
use herald_fault::{Action, Hook, Point};
use herald_kafka::KafkaConfig;
use herald_kafka::Topics;
use herald_projections::{search, stats};
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, Projection, RebuildOptions, RebuildReport, Search, Stats, verify};
use herald_store::{Backend, Db};
use herald_testkit::{TestDb, unique, wait_until};
use rdkafka::producer::FutureProducer;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(120);

struct Quiet;

impl Progress for Quiet {
    fn phase(&mut self, _: &str) {}
    fn replayed(&mut self, _: ReplayProgress) {}
}

struct Bed {
    db: Db,
    wiring: Wiring,
    producer: FutureProducer,
    run: String,
    _test_db: TestDb,
}

async fn bed(test_db: TestDb, partitions: i32) -> anyhow::Result<Bed> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let topics = Topics::with_prefix(&unique("eng"));
    let brokers = herald_testkit::real_broker()?;
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(partitions)).await?;
    let wiring = Wiring {
        db: db.clone(),
        kafka: KafkaConfig::new(brokers.as_str()),
        topics,
        group_prefix: unique("herald"),
        artifacts: tempfile::tempdir()?.path().display().to_string(),
        tokens: Tokens::single("t", "alice"),
    };
    Ok(Bed { db, producer: workload::producer(&KafkaConfig::new(&brokers))?, wiring, run: unique("run"), _test_db: test_db })
}

impl Bed {
    fn subscriptions(&self) -> impl std::future::Future<Output = anyhow::Result<pipeline::Running>> {
        let roles = Roles { api: None, relay: false, worker: false, subscriptions: true, dispatcher: false };
        pipeline::start_roles(self.wiring.clone(), roles, RoleOptions::default())
    }

    fn options(&self) -> RebuildOptions {
        RebuildOptions {
            kafka: self.wiring.kafka.clone(),
            topic: self.wiring.topics.events.clone(),
            batch: 50,
            ..RebuildOptions::default()
        }
    }

    async fn rebuild<P: Projection>(&self, projection: &P, options: &RebuildOptions) -> anyhow::Result<RebuildReport> {
        Ok(herald_rebuild::rebuild::rebuild(&self.db, projection, options, &mut Quiet, &CancellationToken::new()).await?)
    }

    async fn total_exports(&self, generation: i64) -> anyhow::Result<i64> {
        let row = sqlx::query("SELECT CAST(COALESCE(SUM(exports), 0) AS BIGINT) AS n FROM stats_counters WHERE generation = $1")
            .bind(generation)
            .fetch_one(self.db.pool())
            .await?;
        Ok(row.try_get("n")?)
    }

    async fn wait_live(&self, documents: i64, exports: i64) -> anyhow::Result<()> {
        let db = self.db.clone();
        wait_until("live search and stats to apply", WAIT, || {
            let db = db.clone();
            async move { Ok(search::count_active(&db).await? == documents && stats::total_exports(&db).await? == exports) }
        })
        .await
    }
}

/// The gate: inside the window, more records are appended and applied live.
async fn window_is_closed(test_db: TestDb) -> anyhow::Result<()> {
    let bed = Arc::new(bed(test_db, 3).await?);
    let running = bed.subscriptions().await?;
    let all = workload::completions(&bed.wiring.topics.events, &bed.run, 40)?;
    workload::publish(&bed.producer, &all[..20]).await?;
    // A relayed duplicate: the same event at a second offset.
    workload::publish(&bed.producer, &all[..1]).await?;
    bed.wait_live(20, 20).await?;

    for (projection, appended) in [("search", 20..30), ("stats", 30..40)] {
        let inside = bed.clone();
        let events: Vec<OutboxEvent> = all[appended.clone()].to_vec();
        let mut options = bed.options();
        options.faults = Hook::new(move |site| {
            let (bed, events) = (inside.clone(), events.clone());
            async move {
                if site.point == Point::BeforeOpen {
                    workload::publish(&bed.producer, &events).await.expect("publish inside the window");
                    let n = i64::try_from(appended_end(&events, &bed.run)).expect("small");
                    bed.wait_live(n, n).await.expect("live applies the window's records");
                }
                Action::Continue
            }
        });
        let report = match projection {
            "search" => bed.rebuild(&Search, &options).await?,
            _ => bed.rebuild(&Stats, &options).await?,
        };
        assert!(report.switched && report.state == "active", "{projection}: {report:?}");
    }
    let (one, two) = verify::fingerprints(&bed.db, &Search, 1, 2).await?;
    assert_eq!((one.clone(), two.rows), (two.clone(), 40), "search");
    assert_eq!(bed.total_exports(2).await?, 40, "stats generation 2 counts each completion once, the duplicate too");

    // A duplicate after the boundary: live traffic's, counted by neither twice.
    workload::publish(&bed.producer, &all[5..6]).await?;
    workload::publish(&bed.producer, &all[..1]).await?;
    let extra = workload::completions(&bed.wiring.topics.events, &unique("late"), 1)?;
    workload::publish(&bed.producer, &extra).await?;
    wait_until("the late completion in both stats generations", WAIT, || async {
        Ok(bed.total_exports(1).await? == 41 && bed.total_exports(2).await? == 41)
    })
    .await?;
    let (one, two) = verify::fingerprints(&bed.db, &Stats, 1, 2).await?;
    assert_eq!(one, two, "stats generations agree");
    if bed.db.backend() == Backend::Postgres {
        // Search generation 2 was loaded into its own partition, and live
        // traffic now writes it there by name.
        let storage: Option<String> =
            sqlx::query("SELECT storage FROM projection_generations WHERE projection = 'search' AND generation = 2")
                .fetch_one(bed.db.pool())
                .await?
                .try_get("storage")?;
        assert_eq!(storage.as_deref(), Some("search_documents_g2"));
        wait_until("the late completion in search generation 2's partition", WAIT, || async {
            Ok(sqlx::query("SELECT COUNT(*) AS n FROM search_documents_g2").fetch_one(bed.db.pool()).await?.try_get::<i64, _>("n")? == 41)
        })
        .await?;
    }
    running.stop().await
}

/// How many completions of run `run` exist once `events` (the last ones
/// appended) are in: their highest index + 1.
fn appended_end(events: &[OutboxEvent], run: &str) -> usize {
    events.iter().filter_map(|e| e.subject.strip_prefix(&format!("{run}-job-"))?.parse::<usize>().ok()).max().map_or(0, |i| i + 1)
}

#[tokio::test(flavor = "multi_thread")]
async fn records_appended_while_a_rebuild_opens_are_not_lost_postgres() -> anyhow::Result<()> {
    window_is_closed(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn records_appended_while_a_rebuild_opens_are_not_lost_sqlite() -> anyhow::Result<()> {
    window_is_closed(herald_testkit::sqlite_db()?).await
}

/// The jobs and outbox rows behind `events`, delivered: the source of truth
/// an offline search rebuild verifies against.
async fn seed_jobs(db: &Db, events: &[OutboxEvent], run: &str) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    herald_store::outbox::append_many(&mut tx, events).await?;
    for (i, chunk) in events.chunks(500).enumerate() {
        for (j, _) in chunk.iter().enumerate() {
            let data = workload::completion(run, i * 500 + j);
            sqlx::query(
                "INSERT INTO export_jobs (job_id, caller, format, query, status, version, result_id, result_size, result_sha256, \
                 created_at_ms, updated_at_ms, completed_at_ms) VALUES ($1, $2, $3, $4, 'succeeded', 2, $5, $6, $7, 0, 0, 0)",
            )
            .bind(&data.job_id)
            .bind(&data.caller)
            .bind(&data.format)
            .bind(&data.query)
            .bind(&data.result_id)
            .bind(data.size_bytes)
            .bind(&data.sha256)
            .execute(&mut *tx)
            .await?;
        }
    }
    sqlx::query("UPDATE outbox SET status = 'delivered', delivered_at_ms = 0").execute(&mut *tx).await?;
    tx.commit().await?;
    Ok(())
}

async fn offline(test_db: TestDb) -> anyhow::Result<()> {
    const BEHIND: usize = 10_000;
    let bed = bed(test_db, 4).await?;
    let all = workload::completions(&bed.wiring.topics.events, &bed.run, 100 + BEHIND)?;
    seed_jobs(&bed.db, &all, &bed.run).await?;
    let running = bed.subscriptions().await?;
    workload::publish(&bed.producer, &all[..100]).await?;
    bed.wait_live(100, 100).await?;
    running.stop().await?;
    // The live subscription is stopped; history grows 10,000 events past it.
    workload::publish(&bed.producer, &all[100..]).await?;

    let mut options = bed.options();
    options.offline = true;
    options.batch = 2_000;
    let report = bed.rebuild(&Search, &options).await?;
    assert!(report.switched && report.offline && report.documents == Some(10_100), "{report:?}");
    assert_eq!(search::count_active(&bed.db).await?, 10_100, "reads see everything at once");
    let stats_report = bed.rebuild(&Stats, &options).await?;
    assert_eq!(
        (stats_report.state.as_str(), stats_report.switched),
        ("ready", false),
        "stats declares no source of truth: {stats_report:?}"
    );
    assert!(stats_report.detail.as_deref().is_some_and(|d| d.contains("no source of truth")), "{stats_report:?}");

    // Live traffic resumes: generation 1 catches up, generation 2 gets
    // nothing twice, and they end equal.
    let running = bed.subscriptions().await?;
    let db = bed.db.clone();
    wait_until("generation 1 to catch up", WAIT, || {
        let db = db.clone();
        async move {
            let (one, _) = verify::fingerprints(&db, &Search, 1, 2).await?;
            Ok(one.rows == 10_100)
        }
    })
    .await?;
    let (one, two) = verify::fingerprints(&bed.db, &Search, 1, 2).await?;
    assert_eq!(one, two);
    wait_until("stats generation 1 to catch up", WAIT, || async { Ok(bed.total_exports(1).await? == 10_100) }).await?;
    assert_eq!(bed.total_exports(2).await?, 10_100, "the offline stats generation counted each completion once");
    running.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn offline_rebuild_10k_behind_postgres() -> anyhow::Result<()> {
    offline(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn offline_rebuild_10k_behind_sqlite() -> anyhow::Result<()> {
    offline(herald_testkit::sqlite_db()?).await
}
