//! A replay's two lanes may deadlock over a projection's own rows: the
//! engine orders the inbox and position rows it writes, but not the rows a
//! user's projection touches. PostgreSQL then aborts one lane's transaction
//! (40P01); the replay must apply that batch again, not stop the rebuild.
//!
//! The deadlock is forced, not hoped for: each partition holds one format,
//! so each lane counts its own format first, then — for the first two
//! batches after the gate is armed — waits at a barrier for the other lane
//! before touching the other format's row. Both lanes then hold one row and
//! want the other's. Before the replay retried, this rebuild failed with
//! "deadlock detected" (seen in CI on `own_projection`, where it happened by
//! chance). PostgreSQL only: SQLite has one writer at a time, so its lanes
//! cannot cross.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use cloudevents::binding::rdkafka::FutureRecordExt;
use herald::bench::workload;
use herald_consumer::{Fingerprint, HandlerError, Live, Metrics, Projection, Subscription, SubscriptionOptions};
use herald_envelope::{DecodedEvent, EventData, ExportCompleted, OutboxEvent};
use herald_kafka::{KafkaConfig, Topics};
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, RebuildOptions, generations, verify};
use herald_store::{Db, StoreError, Tx};
use herald_testkit::{unique, wait_until};
use rdkafka::producer::{FutureProducer, FutureRecord};
use sqlx::Row;
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

/// Holds the first two armed writes until both lanes are inside theirs.
struct Gate {
    armed: AtomicBool,
    passes: AtomicUsize,
    barrier: Barrier,
}

/// Completed exports per format, counting its batch's format first.
struct Crossing {
    gate: Arc<Gate>,
}

fn other(format: &str) -> &'static str {
    if format == "csv" { "json" } else { "csv" }
}

impl Crossing {
    async fn upsert(tx: &mut Tx<'_>, generation: i64, format: &str, n: i64) -> Result<(), HandlerError> {
        sqlx::query(
            "INSERT INTO crossing_counts (generation, format, n) VALUES ($1, $2, $3) \
             ON CONFLICT (generation, format) DO UPDATE SET n = crossing_counts.n + EXCLUDED.n",
        )
        .bind(generation)
        .bind(format)
        .bind(n)
        .execute(&mut **tx)
        .await
        .map_err(StoreError::from)?;
        Ok(())
    }
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
        Self::upsert(tx, generation, mine, own).await?;
        if self.gate.armed.load(Ordering::SeqCst) && self.gate.passes.fetch_add(1, Ordering::SeqCst) < 2 {
            self.gate.barrier.wait().await;
        }
        let theirs = facts.len() as i64 - own;
        Self::upsert(tx, generation, other(mine), theirs).await
    }

    async fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
        let rows = sqlx::query("SELECT format, n FROM crossing_counts WHERE generation = $1 ORDER BY format")
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

/// Publishes `events` to `partition`, keyed as the relay would.
async fn publish_to(producer: &FutureProducer, partition: i32, events: &[OutboxEvent]) -> anyhow::Result<()> {
    for event in events {
        let message = event.to_kafka_record()?;
        let record = FutureRecord::to(&event.topic).partition(partition).key(event.partition_key.as_str()).message_record(&message);
        producer.send(record, Duration::from_secs(30)).await.map_err(|(e, _)| e)?;
    }
    Ok(())
}

async fn counted(db: &Db, generation: i64) -> anyhow::Result<i64> {
    let row = sqlx::query("SELECT CAST(COALESCE(SUM(n), 0) AS BIGINT) AS n FROM crossing_counts WHERE generation = $1")
        .bind(generation)
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get("n")?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_lane_aborted_by_a_deadlock_applies_its_batch_again_postgres() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    sqlx::query(
        "CREATE TABLE crossing_counts (generation BIGINT NOT NULL, format TEXT NOT NULL, n BIGINT NOT NULL, PRIMARY KEY (generation, format))",
    )
    .execute(db.pool())
    .await?;
    generations::register(&db, Crossing::NAME).await?;
    let topics = Topics::with_prefix(&unique("cross"));
    let brokers = herald_testkit::real_broker()?;
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(2)).await?;
    let gate = Arc::new(Gate { armed: AtomicBool::new(false), passes: AtomicUsize::new(0), barrier: Barrier::new(2) });

    let sub = Subscription::new(Crossing::NAME, &unique("herald"), &KafkaConfig::new(&brokers), &[topics.events.as_str()]);
    let stop = CancellationToken::new();
    let live = {
        let (db, sub, stop, topic, gate) = (db.clone(), sub.clone(), stop.clone(), topics.events.clone(), gate.clone());
        tokio::spawn(async move {
            let live = Live::new(Crossing { gate }, &topic);
            herald_consumer::run_subscription(&sub, &db, &live, &SubscriptionOptions::default(), &Metrics::default(), stop).await
        })
    };
    // Even completions are csv, odd ones json: one format per partition.
    let all = workload::completions(&topics.events, &unique("run"), 20)?;
    let (csv, json): (Vec<_>, Vec<_>) = all.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let producer = workload::producer(&KafkaConfig::new(&brokers))?;
    publish_to(&producer, 0, &csv.into_iter().map(|(_, e)| e).collect::<Vec<_>>()).await?;
    publish_to(&producer, 1, &json.into_iter().map(|(_, e)| e).collect::<Vec<_>>()).await?;
    wait_until("20 counted live", Duration::from_secs(90), || async { Ok(counted(&db, 1).await? == 20) }).await?;

    gate.armed.store(true, Ordering::SeqCst);
    let options =
        RebuildOptions { kafka: KafkaConfig::new(brokers), topic: topics.events.clone(), batch: 100, ..RebuildOptions::default() };
    let projection = Crossing { gate: gate.clone() };
    let report = herald_rebuild::rebuild::rebuild(&db, &projection, &options, &mut Quiet, &CancellationToken::new()).await?;
    assert!(gate.passes.load(Ordering::SeqCst) >= 3, "both lanes met at the gate and one applied its batch again");
    assert_eq!((report.generation, report.state.as_str(), report.switched), (2, "active", true), "{report:?}");
    let (one, two) = verify::fingerprints(&db, &projection, 1, 2).await?;
    assert_eq!(one, two);
    assert_eq!(counted(&db, 2).await?, 20);
    stop.cancel();
    live.await??;
    Ok(())
}
