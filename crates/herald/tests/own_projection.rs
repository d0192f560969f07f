//! A projection of a user's own, on Herald's engine through the public API
//! alone: its table, the `Projection` trait, `Live` for traffic, and
//! `rebuild` for a new generation — which verifies against the live one and
//! switches, on both databases and the shared Apache Kafka cluster.

use std::time::Duration;

use herald::bench::workload;
use herald_consumer::{Fingerprint, HandlerError, Live, Metrics, Projection, Subscription, SubscriptionOptions};
use herald_envelope::{DecodedEvent, EventData, ExportCompleted};
use herald_kafka::KafkaConfig;
use herald_kafka::Topics;
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, RebuildOptions, generations, verify};
use herald_store::{Db, StoreError, Tx};
use herald_testkit::{TestDb, unique, wait_until};
use sqlx::Row;
use tokio_util::sync::CancellationToken;

/// Completed exports per format.
struct ByFormat;

impl Projection for ByFormat {
    const NAME: &'static str = "by_format";
    const IDEMPOTENT: bool = false;
    type Fact = ExportCompleted;

    fn handles(event_type: &str) -> bool {
        event_type == ExportCompleted::EVENT_TYPE
    }

    fn fact(event: &DecodedEvent) -> Result<ExportCompleted, HandlerError> {
        Ok(event.data_as()?)
    }

    async fn write(&self, tx: &mut Tx<'_>, generation: i64, facts: &[&ExportCompleted]) -> Result<(), HandlerError> {
        for fact in facts {
            sqlx::query(
                "INSERT INTO by_format (generation, format, n) VALUES ($1, $2, 1) \
                 ON CONFLICT (generation, format) DO UPDATE SET n = by_format.n + 1",
            )
            .bind(generation)
            .bind(&fact.format)
            .execute(&mut **tx)
            .await
            .map_err(StoreError::from)?;
        }
        Ok(())
    }

    async fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
        let rows = sqlx::query("SELECT format, n FROM by_format WHERE generation = $1 ORDER BY format")
            .bind(generation)
            .fetch_all(&mut **tx)
            .await?;
        let listed: Vec<String> = rows
            .iter()
            .map(|r| Ok(format!("{}={}", r.try_get::<String, _>("format")?, r.try_get::<i64, _>("n")?)))
            .collect::<Result<_, sqlx::Error>>()?;
        Ok(Fingerprint { rows: rows.len() as i64, other: 0, checksum: listed.join(",") })
    }
}

struct Quiet;

impl Progress for Quiet {
    fn phase(&mut self, _: &str) {}
    fn replayed(&mut self, _: ReplayProgress) {}
}

async fn counted(db: &Db, generation: i64) -> anyhow::Result<i64> {
    let row = sqlx::query("SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n FROM by_format WHERE generation = $1")
        .bind(generation)
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get("n")?)
}

async fn own_projection_rebuilds(test_db: TestDb) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    sqlx::query(
        "CREATE TABLE by_format (generation BIGINT NOT NULL, format TEXT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (generation, format))",
    )
    .execute(db.pool())
    .await?;
    generations::register(&db, ByFormat::NAME).await?;
    let topics = Topics::with_prefix(&unique("own"));
    let brokers = herald_testkit::real_broker()?;
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(2)).await?;

    // Its live subscription bears its name.
    let sub = Subscription::new(ByFormat::NAME, &unique("herald"), &KafkaConfig::new(&brokers), &[topics.events.as_str()]);
    let stop = CancellationToken::new();
    let live = {
        let (db, sub, stop, topic) = (db.clone(), sub.clone(), stop.clone(), topics.events.clone());
        tokio::spawn(async move {
            herald_consumer::run_subscription(
                &sub,
                &db,
                &Live::new(ByFormat, &topic),
                &SubscriptionOptions::default(),
                &Metrics::default(),
                stop,
            )
            .await
        })
    };
    let producer = workload::producer(&KafkaConfig::new(&brokers))?;
    let all = workload::completions(&topics.events, &unique("run"), 30)?;
    workload::publish(&producer, &all).await?;
    wait_until("30 counted live", Duration::from_secs(90), || async { Ok(counted(&db, 1).await? == 30) }).await?;

    let options = RebuildOptions { kafka: KafkaConfig::new(brokers), topic: topics.events.clone(), batch: 7, ..RebuildOptions::default() };
    let report = herald_rebuild::rebuild::rebuild(&db, &ByFormat, &options, &mut Quiet, &CancellationToken::new()).await?;
    assert_eq!((report.generation, report.state.as_str(), report.switched), (2, "active", true), "{report:?}");
    let (one, two) = verify::fingerprints(&db, &ByFormat, 1, 2).await?;
    assert_eq!(one, two);
    assert_eq!(counted(&db, 2).await?, 30);
    stop.cancel();
    live.await??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_projection_of_your_own_rebuilds_postgres() -> anyhow::Result<()> {
    own_projection_rebuilds(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_projection_of_your_own_rebuilds_sqlite() -> anyhow::Result<()> {
    own_projection_rebuilds(herald_testkit::sqlite_db()?).await
}
