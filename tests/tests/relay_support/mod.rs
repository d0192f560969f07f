//! A relay under test: its own database, its own mock cluster and topic,
//! rows appended the way business code appends them.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use chrono::Utc;
use herald_envelope::OutboxEvent;
use herald_fault::Hook;
use herald_kafka::EmbeddedKafka;
use herald_kafka::KafkaConfig;
pub use herald_relay::RelayConfig;
use herald_relay::{Relay, RelayCounters};
use herald_store::{Db, outbox};
use herald_testkit::TestDb;
use herald_testkit::kafka::{self, Record};
use sqlx::Row;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const PARTITIONS: i32 = 4;

pub struct Bench {
    pub db: Db,
    pub kafka: EmbeddedKafka,
    pub topic: String,
    pub test_db: TestDb,
}

pub async fn bench(postgres: bool) -> anyhow::Result<Bench> {
    // HERALD_LOG=debug shows what the relays did when a test fails.
    let filter = tracing_subscriber::EnvFilter::try_from_env("HERALD_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    let test_db = if postgres { herald_testkit::postgres_db().await? } else { herald_testkit::sqlite_db()? };
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let topic = herald_testkit::unique("relay");
    let kafka = EmbeddedKafka::start(1, &[&topic], PARTITIONS)?;
    Ok(Bench { db, kafka, topic, test_db })
}

/// A relay config for tests: fast retries, short idle waits.
pub fn config(owner: &str) -> RelayConfig {
    RelayConfig {
        owner: owner.to_owned(),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        idle_max: Duration::from_millis(100),
        ..RelayConfig::default()
    }
}

pub fn with_faults(config: RelayConfig, faults: Hook) -> RelayConfig {
    RelayConfig { faults, ..config }
}

pub struct Running {
    pub stats: std::sync::Arc<RelayCounters>,
    pub stop: CancellationToken,
    pub task: JoinHandle<()>,
}

impl Running {
    pub async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task).await??;
        Ok(())
    }
}

/// A test event for `key` on `topic`.
pub fn event_for(key: &str, topic: &str) -> OutboxEvent {
    OutboxEvent {
        id: uuid::Uuid::now_v7().to_string(),
        source: "/herald/tests".to_owned(),
        event_type: "herald.test.event".to_owned(),
        subject: key.to_owned(),
        time: Utc::now(),
        schema_file: "test.avsc".to_owned(),
        data: b"payload".to_vec(),
        content_type: herald_envelope::AVRO_CONTENT_TYPE.to_owned(),
        extensions: Default::default(),
        topic: topic.to_owned(),
        partition_key: key.to_owned(),
        trace: None,
    }
}

impl Bench {
    pub fn event(&self, key: &str, data: &[u8]) -> OutboxEvent {
        OutboxEvent { data: data.to_vec(), ..event_for(key, &self.topic) }
    }

    /// Appends one event per key, each in its own committed transaction;
    /// returns the event ids in commit order.
    pub async fn append(&self, keys: &[&str]) -> anyhow::Result<Vec<String>> {
        let mut ids = Vec::new();
        for key in keys {
            let event = self.event(key, b"payload");
            let mut tx = self.db.begin().await?;
            outbox::append(&mut tx, &event).await?;
            tx.commit().await?;
            ids.push(event.id);
        }
        Ok(ids)
    }

    pub fn start(&self, config: RelayConfig) -> anyhow::Result<Running> {
        self.start_on(self.db.clone(), config)
    }

    /// A relay on its own pool, as another process would have.
    pub fn start_on(&self, db: Db, config: RelayConfig) -> anyhow::Result<Running> {
        let relay = Relay::new(db, &KafkaConfig::new(self.kafka.bootstrap_servers()), config)?;
        let stats = relay.counters();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(async move { relay.run(token).await });
        Ok(Running { stats, stop, task })
    }

    pub async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query(sql).fetch_one(self.db.pool()).await?.try_get::<i64, _>("n")?)
    }

    /// A row's status as an operator means it (the relay's cursor passing a
    /// row delivers it: `herald_store::delivered`) and its attempts.
    pub async fn status_of(&self, event_id: &str) -> anyhow::Result<(String, i32)> {
        let sql = format!(
            "SELECT {} AS status, o.attempts FROM {} WHERE o.event_id = $1",
            herald_store::delivered::status_sql(self.db.backend()),
            herald_store::delivered::FROM_OUTBOX
        );
        let row = sqlx::query(&sql).bind(event_id).fetch_one(self.db.pool()).await?;
        Ok((row.try_get("status")?, row.try_get("attempts")?))
    }

    /// `COUNT(*) AS n` of the rows delivered, derived from the cursors.
    pub fn delivered(&self) -> String {
        format!(
            "SELECT COUNT(*) AS n FROM {} WHERE {} = 'delivered'",
            herald_store::delivered::FROM_OUTBOX,
            herald_store::delivered::status_sql(self.db.backend())
        )
    }

    /// Polls until `sql` (a `COUNT(*) AS n`) reaches `want`, or fails.
    pub async fn wait_count(&self, sql: &str, want: i64) -> anyhow::Result<()> {
        wait_until(&format!("{sql} = {want}"), || async { Ok(self.count(sql).await? == want) }).await
    }

    pub fn records(&self) -> anyhow::Result<Vec<Record>> {
        kafka::read_all(self.kafka.bootstrap_servers(), &self.topic, PARTITIONS)
    }
}

/// Polls `check` until it holds, with a deadline: the outcome is eventual,
/// the test only decides how long it is willing to wait for it.
pub async fn wait_until<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

pub fn stat(counter: &std::sync::atomic::AtomicU64) -> u64 {
    RelayCounters::get(counter)
}

/// Asserts that every key's first records on the topic are its rows in
/// commit order: `ids[i]` was appended with `keys[i]`.
pub fn assert_commit_order(keys: &[String], ids: &[String], records: &[Record]) {
    let published = kafka::first_occurrences_by_key(records);
    let mut distinct: Vec<&String> = keys.iter().collect();
    distinct.sort();
    distinct.dedup();
    for key in distinct {
        let want: Vec<String> = ids.iter().zip(keys).filter(|(_, k)| *k == key).map(|(id, _)| id.clone()).collect();
        assert_eq!(published.get(key), Some(&want), "{key} in commit order");
    }
}
