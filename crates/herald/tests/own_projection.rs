//! A projection of a user's own, on Herald's engine through the public API
//! alone: its table, the `Projection` trait, `Live` for traffic, and
//! `rebuild` for a new generation — which verifies against the live one and
//! switches, on both databases and the shared Apache Kafka cluster.
//!
//! And a window of that engine: a replay's two lanes may deadlock over a
//! projection's own rows (the engine orders the inbox and position rows it
//! writes, not the rows a user's projection touches); PostgreSQL then
//! aborts one lane's transaction (40P01), and the replay must apply that
//! batch again, not stop the rebuild. The deadlock is forced, not hoped
//! for: each partition holds one format, so each lane counts its own format
//! first, then — for the first two batches after the gate is armed — waits
//! at a barrier for the other lane before touching the other format's row.
//! Before the replay retried, that rebuild failed with "deadlock detected"
//! (seen in CI on the first test here, where it happened by chance).
//! PostgreSQL only: SQLite has one writer at a time, so its lanes cannot
//! cross.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use cloudevents::binding::rdkafka::FutureRecordExt;
use herald::bench::workload;
use herald_consumer::{Fingerprint, HandlerError, Live, Metrics, Projection, Subscription, SubscriptionOptions};
use herald_envelope::{DecodedEvent, EventData, ExportCompleted, OutboxEvent};
use herald_kafka::{KafkaConfig, Topics};
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, RebuildOptions, RebuildReport, generations, verify};
use herald_store::{Db, StoreError, Tx};
use herald_testkit::{TestDb, unique, wait_until};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::Row;
use tokio::sync::Barrier;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Adds `n` to `format`'s count in `generation` of `table`.
async fn add(tx: &mut Tx<'_>, table: &str, generation: i64, format: &str, n: i64) -> Result<(), HandlerError> {
    sqlx::query(&format!(
        "INSERT INTO {table} (generation, format, n) VALUES ($1, $2, $3) ON CONFLICT (generation, format) DO UPDATE SET n = {table}.n + EXCLUDED.n"
    ))
    .bind(generation)
    .bind(format)
    .bind(n)
    .execute(&mut **tx)
    .await
    .map_err(StoreError::from)?;
    Ok(())
}

/// Every format's count in `generation` of `table`, in one line.
async fn counts(tx: &mut Tx<'_>, table: &str, generation: i64) -> Result<Fingerprint, StoreError> {
    let rows = sqlx::query(&format!("SELECT format, n FROM {table} WHERE generation = $1 ORDER BY format"))
        .bind(generation)
        .fetch_all(&mut **tx)
        .await?;
    let listed: Vec<String> = rows
        .iter()
        .map(|r| Ok(format!("{}={}", r.try_get::<String, _>("format")?, r.try_get::<i64, _>("n")?)))
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(Fingerprint { rows: rows.len() as i64, other: 0, checksum: listed.join(",") })
}

/// Completed exports per format.
#[derive(Clone)]
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
            add(tx, "by_format", generation, &fact.format, 1).await?;
        }
        Ok(())
    }

    async fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
        counts(tx, "by_format", generation).await
    }
}

/// Holds the first two armed writes until both lanes are inside theirs.
struct Gate {
    armed: AtomicBool,
    passes: AtomicUsize,
    barrier: Barrier,
}

/// The same counts, its batch's own format first and then — past the gate —
/// the other format's row.
#[derive(Clone)]
struct Crossing {
    gate: Arc<Gate>,
}

impl Projection for Crossing {
    const NAME: &'static str = "crossing";
    const IDEMPOTENT: bool = false;
    type Fact = ExportCompleted;

    fn handles(event_type: &str) -> bool {
        event_type == ExportCompleted::EVENT_TYPE
    }

    fn fact(event: &DecodedEvent) -> Result<ExportCompleted, HandlerError> {
        Ok(event.data_as()?)
    }

    async fn write(&self, tx: &mut Tx<'_>, generation: i64, facts: &[&ExportCompleted]) -> Result<(), HandlerError> {
        let Some(first) = facts.first() else { return Ok(()) };
        let mine = first.format.as_str();
        let own = facts.iter().filter(|f| f.format == mine).count() as i64;
        add(tx, "crossing", generation, mine, own).await?;
        if self.gate.armed.load(Ordering::SeqCst) && self.gate.passes.fetch_add(1, Ordering::SeqCst) < 2 {
            self.gate.barrier.wait().await;
        }
        let other = if mine == "csv" { "json" } else { "csv" };
        add(tx, "crossing", generation, other, facts.len() as i64 - own).await
    }

    async fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
        counts(tx, "crossing", generation).await
    }
}

struct Quiet;

impl Progress for Quiet {
    fn phase(&mut self, _: &str) {}
    fn replayed(&mut self, _: ReplayProgress) {}
}

/// A database with `P`'s table, a two-partition topic on the shared
/// cluster, and `P`'s live subscription running.
struct Bed {
    db: Db,
    brokers: String,
    topics: Topics,
    stop: CancellationToken,
    live: JoinHandle<Result<herald_consumer::MetricsSnapshot, herald_consumer::RunError>>,
    _test_db: TestDb,
}

impl Bed {
    async fn start<P: Projection + Clone>(test_db: TestDb, projection: &P) -> anyhow::Result<Bed> {
        let db = Db::connect_and_migrate(&test_db.url).await?;
        let table = P::NAME;
        sqlx::query(&format!(
            "CREATE TABLE {table} (generation BIGINT NOT NULL, format TEXT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (generation, format))"
        ))
        .execute(db.pool())
        .await?;
        generations::register(&db, P::NAME).await?;
        let topics = Topics::with_prefix(&unique("own"));
        let brokers = herald_testkit::real_broker()?;
        herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(2)).await?;
        // Its live subscription bears its name.
        let sub = Subscription::new(P::NAME, &unique("herald"), &KafkaConfig::new(&brokers), &[topics.events.as_str()]);
        let stop = CancellationToken::new();
        let live = {
            let (db, stop, live) = (db.clone(), stop.clone(), Live::new(projection.clone(), &topics.events));
            tokio::spawn(async move {
                herald_consumer::run_subscription(&sub, &db, &live, &SubscriptionOptions::default(), &Metrics::default(), stop).await
            })
        };
        Ok(Bed { db, brokers, topics, stop, live, _test_db: test_db })
    }

    async fn counted<P: Projection>(&self, generation: i64) -> anyhow::Result<i64> {
        let sql = format!("SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n FROM {} WHERE generation = $1", P::NAME);
        Ok(sqlx::query(&sql).bind(generation).fetch_one(self.db.pool()).await?.try_get("n")?)
    }

    async fn wait_live<P: Projection>(&self, n: i64) -> anyhow::Result<()> {
        wait_until(&format!("{n} counted live"), Duration::from_secs(90), || async { Ok(self.counted::<P>(1).await? == n) }).await
    }

    /// Rebuilds `projection` into generation 2 and checks it took over
    /// reads, equal to generation 1 and counting `n`.
    async fn rebuild<P: Projection>(&self, projection: &P, batch: usize, n: i64) -> anyhow::Result<RebuildReport> {
        let kafka = KafkaConfig::new(&self.brokers);
        let options = RebuildOptions { kafka, topic: self.topics.events.clone(), batch, ..RebuildOptions::default() };
        let report = herald_rebuild::rebuild::rebuild(&self.db, projection, &options, &mut Quiet, &CancellationToken::new()).await?;
        assert_eq!((report.generation, report.state.as_str(), report.switched), (2, "active", true), "{report:?}");
        let (one, two) = verify::fingerprints(&self.db, projection, 1, 2).await?;
        assert_eq!(one, two);
        assert_eq!(self.counted::<P>(2).await?, n);
        Ok(report)
    }

    async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.live.await??;
        Ok(())
    }
}

async fn own_projection_rebuilds(test_db: TestDb) -> anyhow::Result<()> {
    let bed = Bed::start(test_db, &ByFormat).await?;
    let producer = workload::producer(&KafkaConfig::new(&bed.brokers))?;
    workload::publish(&producer, &workload::completions(&bed.topics.events, &unique("run"), 30)?).await?;
    bed.wait_live::<ByFormat>(30).await?;
    bed.rebuild(&ByFormat, 7, 30).await?;
    bed.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_projection_of_your_own_rebuilds_postgres() -> anyhow::Result<()> {
    own_projection_rebuilds(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_projection_of_your_own_rebuilds_sqlite() -> anyhow::Result<()> {
    own_projection_rebuilds(herald_testkit::sqlite_db()?).await
}

/// Publishes `events` to `partition`, keyed as the relay would.
async fn publish_to(producer: &FutureProducer, partition: i32, events: &[OutboxEvent]) -> anyhow::Result<()> {
    for event in events {
        let message = event.to_kafka_record()?;
        let record = FutureRecord::to(&event.topic).partition(partition).key(event.partition_key.as_str()).message_record(&message);
        producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e)?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_lane_aborted_by_a_deadlock_applies_its_batch_again_postgres() -> anyhow::Result<()> {
    let gate = Arc::new(Gate { armed: AtomicBool::new(false), passes: AtomicUsize::new(0), barrier: Barrier::new(2) });
    let projection = Crossing { gate: gate.clone() };
    let bed = Bed::start(herald_testkit::postgres_db().await?, &projection).await?;
    // Even completions are csv, odd ones json: one format per partition.
    let all = workload::completions(&bed.topics.events, &unique("run"), 20)?;
    let (csv, json): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let producer = workload::producer(&KafkaConfig::new(&bed.brokers))?;
    publish_to(&producer, 0, &csv.into_iter().map(|(_, e)| e).collect::<Vec<_>>()).await?;
    publish_to(&producer, 1, &json.into_iter().map(|(_, e)| e).collect::<Vec<_>>()).await?;
    bed.wait_live::<Crossing>(20).await?;

    gate.armed.store(true, Ordering::SeqCst);
    bed.rebuild(&projection, 100, 20).await?;
    assert!(gate.passes.load(Ordering::SeqCst) >= 3, "both lanes met at the gate and one applied its batch again");
    bed.stop().await
}
