//! Per-key order past a dead letter (`Order::PerKey`): a record its handler
//! rejects is dead-lettered, the later records of its Kafka key are parked
//! behind it (not applied) while other keys flow on, and redriving or
//! discarding the letter applies them in offset order, once. With `order =
//! none` the same handler gets today's behaviour. On PostgreSQL and SQLite,
//! on the mock cluster, with a handler that logs what it applies in order.

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::Database;
use herald::bench::workload;
use herald_consumer::{
    Discarded, Handler, HandlerError, Metrics, MetricsSnapshot, Order, Record, Released, Subscription, SubscriptionOptions,
};
use herald_envelope::{OutboxEvent, Registry};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_status::queries;
use herald_store::dead_letter::{self, DeadLetter};
use herald_store::{Db, Tx, now_ms};
use herald_testkit::TestDb;
use sqlx::Row;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const SUB: &str = "ordered";
/// The key whose first record is poison.
const KEY: &str = "key-poisoned";

/// Logs each event it applies, in order (`applied_log.n`), and rejects the
/// events in `rejected` until a "fix" takes them out. It needs a key's
/// events in order, so it declares per-key order.
#[derive(Clone, Default)]
struct Ordered {
    rejected: Arc<Mutex<HashSet<String>>>,
}

impl Ordered {
    fn rejecting(ids: &[&str]) -> Ordered {
        Ordered { rejected: Arc::new(Mutex::new(ids.iter().map(|s| s.to_string()).collect())) }
    }

    /// The deployed fix: `id` applies from now on.
    fn fix(&self, id: &str) {
        self.rejected.lock().expect("lock").remove(id);
    }
}

impl Handler for Ordered {
    fn handles(&self, _event_type: &str) -> bool {
        true
    }

    fn order(&self) -> Order {
        Order::PerKey
    }

    async fn apply(&self, tx: &mut Tx<'_>, records: &[Record<'_>]) -> Result<(), HandlerError> {
        let rejected = self.rejected.lock().expect("lock").clone();
        if let Some(bad) = records.iter().find(|r| rejected.contains(&r.event.key.id)) {
            // The defect fails a statement, as a real one would: on PostgreSQL
            // that aborts the transaction, which a release must roll back
            // to its savepoint to go on.
            let failed = sqlx::query("INSERT INTO applied_log (n, event_id, kafka_offset) VALUES (NULL, $1, 0)")
                .bind(&bad.event.key.id)
                .execute(&mut **tx)
                .await;
            let why = failed.err().map_or_else(|| "no error".to_owned(), |e| e.to_string());
            return Err(HandlerError::Reject(format!("event {} refused by defect: {why}", bad.event.key.id)));
        }
        for r in records {
            sqlx::query("INSERT INTO applied_log (n, event_id, kafka_offset) SELECT COALESCE(MAX(n), 0) + 1, $1, $2 FROM applied_log")
                .bind(&r.event.key.id)
                .bind(r.offset)
                .execute(&mut **tx)
                .await
                .map_err(|e| HandlerError::Retryable(e.to_string()))?;
        }
        Ok(())
    }
}

struct Bed {
    db: Db,
    kafka: EmbeddedKafka,
    topics: Topics,
    group_prefix: String,
    run: String,
    _test_db: TestDb,
}

async fn bed(database: Database) -> anyhow::Result<Bed> {
    let test_db = common::test_db(database).await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    sqlx::query("CREATE TABLE applied_log (n BIGINT NOT NULL, event_id TEXT NOT NULL, kafka_offset BIGINT NOT NULL)")
        .execute(db.pool())
        .await?;
    let topics = Topics::with_prefix(&herald_testkit::unique("t"));
    let kafka = EmbeddedKafka::start(1, &topics.all(), 4)?;
    let (group_prefix, run) = (herald_testkit::unique("herald"), herald_testkit::unique("run"));
    Ok(Bed { db, kafka, topics, group_prefix, run, _test_db: test_db })
}

struct Running {
    stop: CancellationToken,
    metrics: Arc<Metrics>,
    task: JoinHandle<anyhow::Result<MetricsSnapshot>>,
}

impl Running {
    /// Stops the subscription; its counters.
    async fn stop(self) -> anyhow::Result<MetricsSnapshot> {
        self.stop.cancel();
        self.task.await?
    }
}

impl Bed {
    fn start(&self, handler: &Ordered, order: Option<Order>) -> Running {
        self.start_in(&self.group_prefix, handler, order)
    }

    /// The subscription (its inbox, letters and parked records) in the
    /// consumer group `<group_prefix>.ordered`: a new group reads the topic
    /// again from the start, as a rewind or a crash before the offset commit
    /// would.
    fn start_in(&self, group_prefix: &str, handler: &Ordered, order: Option<Order>) -> Running {
        let sub = Subscription::new(SUB, group_prefix, &KafkaConfig::new(self.kafka.bootstrap_servers()), &[&self.topics.events]);
        let (stop, metrics) = (CancellationToken::new(), Arc::new(Metrics::default()));
        let (db, handler, token, m) = (self.db.clone(), handler.clone(), stop.clone(), metrics.clone());
        let options = SubscriptionOptions { max_batch: 5, order, ..SubscriptionOptions::default() };
        let task = tokio::spawn(async move { Ok(herald_consumer::run_subscription(&sub, &db, &handler, &options, &m, token).await?) });
        Running { stop, metrics, task }
    }

    /// `n` events from number `from`, all of record key `key`.
    fn events(&self, from: usize, n: usize, key: &str) -> anyhow::Result<Vec<OutboxEvent>> {
        let mut events: Vec<OutboxEvent> =
            workload::completions(&self.topics.events, &self.run, from + n)?.into_iter().skip(from).collect();
        for e in &mut events {
            e.partition_key = key.to_owned();
        }
        Ok(events)
    }

    /// `n` events from number `from`, each of a key of its own.
    fn others(&self, from: usize, n: usize) -> anyhow::Result<Vec<OutboxEvent>> {
        Ok(workload::completions(&self.topics.events, &self.run, from + n)?.into_iter().skip(from).collect())
    }

    async fn publish(&self, events: &[OutboxEvent]) -> anyhow::Result<()> {
        workload::publish(&workload::producer(&KafkaConfig::new(self.kafka.bootstrap_servers()))?, events).await
    }

    /// Event ids in the order the handler applied them.
    async fn applied(&self) -> anyhow::Result<Vec<String>> {
        let rows = sqlx::query("SELECT event_id FROM applied_log ORDER BY n").fetch_all(self.db.pool()).await?;
        Ok(rows.iter().map(|r| r.try_get("event_id")).collect::<Result<_, _>>()?)
    }

    async fn parked(&self) -> anyhow::Result<i64> {
        Ok(herald_store::parked::summary(&self.db, SUB, 5).await?.records)
    }

    async fn letters(&self) -> anyhow::Result<Vec<DeadLetter>> {
        Ok(dead_letter::list(&self.db, Some(SUB), Some(dead_letter::DEAD)).await?)
    }

    /// The poison parked its key behind it: the other keys applied, the
    /// key's records parked (none applied), and status names the key.
    async fn park_behind_poison(
        &self,
        handler: &Ordered,
        key_events: &[OutboxEvent],
        others: &[OutboxEvent],
    ) -> anyhow::Result<(Running, DeadLetter)> {
        // Poison, a record of another key, two of the poisoned key; the third after the subscription has parked those.
        self.publish(&key_events[..1]).await?;
        self.publish(&others[..3]).await?;
        self.publish(&key_events[1..3]).await?;
        let running = self.start(handler, None);
        eventually("the letter and two parked records", || async { Ok(self.letters().await?.len() == 1 && self.parked().await? == 2) })
            .await?;
        self.publish(&others[3..]).await?;
        self.publish(&key_events[3..]).await?;
        let want: HashSet<String> = others.iter().map(|e| e.id.clone()).collect();
        eventually("other keys applied, three records parked", || async {
            Ok(self.applied().await?.into_iter().collect::<HashSet<_>>() == want && self.parked().await? == 3)
        })
        .await?;
        let applied: HashSet<String> = self.applied().await?.into_iter().collect();
        assert!(key_events.iter().all(|e| !applied.contains(&e.id)), "nothing of the poisoned key applied");
        let letter = self.letters().await?.pop().expect("one letter");
        assert_eq!(letter.event_id.as_deref(), Some(key_events[0].id.as_str()));
        assert_eq!(letter.record_key.as_deref(), Some(KEY.as_bytes()));

        let status = queries::collect(&self.db, &[SUB], now_ms()).await?.subscriptions.remove(0);
        assert_eq!((status.dead_letters, status.parked_keys, status.parked_records), (1, 1, 3), "{status:?}");
        let parked = &status.oldest_parked[0];
        assert_eq!((parked.key.as_str(), parked.records, parked.blocked_by), (KEY, 3, Some(letter.id)), "{parked:?}");
        assert!(parked.first_offset > letter.offset, "parked from a record after the poison: {parked:?}");
        let text = herald_status::text::render(&herald_status::Status { subscriptions: vec![status.clone()], ..Default::default() });
        assert!(text.contains(&format!("key {KEY} (")) && text.contains(&format!("behind dead letter {}", letter.id)), "{text}");
        Ok((running, letter))
    }
}

/// Polls `probe` until it returns true, with a deadline.
async fn eventually<F, Fut>(what: &str, mut probe: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    while !probe().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn ids(events: &[OutboxEvent]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// The applied log, each event once, and its tail: what the release applied.
async fn applied_once_ending_with(bed: &Bed, tail: &[String]) -> anyhow::Result<()> {
    let applied = bed.applied().await?;
    assert_eq!(applied.iter().collect::<HashSet<_>>().len(), applied.len(), "each event applied once: {applied:?}");
    assert_eq!(&applied[applied.len() - tail.len()..], tail, "released in offset order, after everything else");
    Ok(())
}

async fn redrive_releases_in_order(database: Database) -> anyhow::Result<()> {
    let bed = bed(database).await?;
    let (key_events, others) = (bed.events(0, 5, KEY)?, bed.others(10, 6)?);
    let handler = Ordered::rejecting(&[&key_events[0].id]);
    let (running, letter) = bed.park_behind_poison(&handler, &key_events[..4], &others).await?;
    let first = running.stop().await?;
    assert_eq!((first.dead_lettered, first.parked), (1, 3), "{first:?}");

    // Everything delivered again (a rewind; a crash before the offset
    // commit): the letter's own record and the parked ones are kept
    // already, the others are in the inbox — nothing applied, parked or
    // dead-lettered twice.
    let before = bed.applied().await?;
    let running = bed.start_in(&herald_testkit::unique("rewound"), &handler, None);
    let m = running.metrics.clone();
    eventually("all ten records delivered again", || {
        let m = m.clone();
        async move { Ok(m.snapshot().duplicates >= 10) }
    })
    .await?;
    let s = m.snapshot();
    assert_eq!((s.applied, s.duplicates, s.dead_lettered, s.parked), (0, 10, 0, 0), "{s:?}");
    assert_eq!((bed.applied().await?, bed.parked().await?, bed.letters().await?.len()), (before, 3, 1));

    // Redriven before the fix: still failing, everything stays parked.
    let early = herald_consumer::redrive_releasing(&bed.db, &handler, &Registry::embedded(), &letter).await?;
    assert!(matches!(early.redriven, herald_consumer::Redriven::Failed(_)), "{early:?}");
    assert_eq!((bed.parked().await?, bed.letters().await?.len()), (3, 1));

    handler.fix(&key_events[0].id);
    let letter = dead_letter::get(&bed.db, letter.id).await?.expect("kept");
    let done = herald_consumer::redrive_releasing(&bed.db, &handler, &Registry::embedded(), &letter).await?;
    assert_eq!(done.redriven, herald_consumer::Redriven::Applied);
    assert_eq!(done.released, Released { applied: 3, ..Released::default() });
    applied_once_ending_with(&bed, &ids(&key_events[..4])).await?;
    assert_eq!(bed.parked().await?, 0);

    // The key is free again: its next record is applied as it comes.
    bed.publish(&key_events[4..]).await?;
    eventually("the key's next record applied", || async { Ok(bed.applied().await?.contains(&key_events[4].id)) }).await?;
    let s = running.stop().await?;
    assert_eq!((s.applied, s.dead_lettered, s.parked), (1, 0, 0), "the key's next record only: {s:?}");
    assert_eq!(bed.parked().await?, 0);
    applied_once_ending_with(&bed, &ids(&key_events)).await?;
    let again = herald_consumer::redrive_releasing(&bed.db, &handler, &Registry::embedded(), &letter).await?;
    assert_eq!(again.redriven, herald_consumer::Redriven::NotDead, "a stale copy applies nothing twice");
    assert_eq!(bed.applied().await?.len(), others.len() + key_events.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn redrive_releases_parked_postgres() -> anyhow::Result<()> {
    redrive_releases_in_order(Database::Postgres).await
}

#[tokio::test(flavor = "multi_thread")]
async fn redrive_releases_parked_sqlite() -> anyhow::Result<()> {
    redrive_releases_in_order(Database::Sqlite).await
}

async fn discard_releases_in_order(database: Database) -> anyhow::Result<()> {
    let bed = bed(database).await?;
    let (key_events, others) = (bed.events(0, 4, KEY)?, bed.others(10, 6)?);
    let handler = Ordered::rejecting(&[&key_events[0].id]);
    let (running, letter) = bed.park_behind_poison(&handler, &key_events, &others).await?;

    let done = herald_consumer::discard(&bed.db, &handler, &Registry::embedded(), &letter).await?;
    assert_eq!(done, Discarded::Discarded(Released { applied: 3, ..Released::default() }));
    applied_once_ending_with(&bed, &ids(&key_events[1..])).await?;
    assert!(!bed.applied().await?.contains(&key_events[0].id), "a discarded record is never applied");
    let discarded = dead_letter::get(&bed.db, letter.id).await?.expect("kept");
    assert_eq!(discarded.status, dead_letter::DISCARDED);
    assert_eq!(herald_consumer::discard(&bed.db, &handler, &Registry::embedded(), &discarded).await?, Discarded::NotDead);
    assert_eq!(herald_consumer::discard(&bed.db, &handler, &Registry::embedded(), &letter).await?, Discarded::NotDead, "stale copy");
    running.stop().await?;
    assert_eq!(bed.parked().await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn discard_releases_parked_postgres() -> anyhow::Result<()> {
    discard_releases_in_order(Database::Postgres).await
}

#[tokio::test(flavor = "multi_thread")]
async fn discard_releases_parked_sqlite() -> anyhow::Result<()> {
    discard_releases_in_order(Database::Sqlite).await
}

/// A parked record that fails when released becomes the key's dead letter,
/// and the records after it stay parked behind it until it is settled too.
async fn release_stops_at_the_next_failure(database: Database) -> anyhow::Result<()> {
    let bed = bed(database).await?;
    let (key_events, others) = (bed.events(0, 4, KEY)?, bed.others(10, 6)?);
    let handler = Ordered::rejecting(&[&key_events[0].id, &key_events[2].id]);
    let (running, letter) = bed.park_behind_poison(&handler, &key_events, &others).await?;

    handler.fix(&key_events[0].id);
    let done = herald_consumer::redrive_releasing(&bed.db, &handler, &Registry::embedded(), &letter).await?;
    let second = bed.letters().await?.pop().expect("the failing parked record is a letter now");
    assert_eq!(second.event_id.as_deref(), Some(key_events[2].id.as_str()));
    assert_eq!(done.released, Released { applied: 1, dead_lettered: Some(second.offset), still_parked: 1, ..Released::default() });
    applied_once_ending_with(&bed, &ids(&key_events[..2])).await?;
    let status = queries::collect(&bed.db, &[SUB], now_ms()).await?.subscriptions.remove(0);
    assert_eq!(status.oldest_parked[0].blocked_by, Some(second.id), "{status:?}");

    handler.fix(&key_events[2].id);
    let done = herald_consumer::redrive_releasing(&bed.db, &handler, &Registry::embedded(), &second).await?;
    assert_eq!(done.released, Released { applied: 1, ..Released::default() });
    applied_once_ending_with(&bed, &ids(&key_events)).await?;
    running.stop().await?;
    assert_eq!((bed.parked().await?, bed.letters().await?.len()), (0, 0));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn release_stops_at_the_next_failure_postgres() -> anyhow::Result<()> {
    release_stops_at_the_next_failure(Database::Postgres).await
}

#[tokio::test(flavor = "multi_thread")]
async fn release_stops_at_the_next_failure_sqlite() -> anyhow::Result<()> {
    release_stops_at_the_next_failure(Database::Sqlite).await
}

/// `order = none` overrides the handler's per-key declaration: the poison
/// is dead-lettered and its key's later records are applied before it.
async fn order_none_applies_past_the_letter(database: Database) -> anyhow::Result<()> {
    let bed = bed(database).await?;
    let (key_events, others) = (bed.events(0, 4, KEY)?, bed.others(10, 3)?);
    let handler = Ordered::rejecting(&[&key_events[0].id]);
    bed.publish(&key_events).await?;
    bed.publish(&others).await?;
    let running = bed.start(&handler, Some(Order::None));
    let want: HashSet<String> = key_events[1..].iter().chain(&others).map(|e| e.id.clone()).collect();
    eventually("everything but the poison applied", || async {
        Ok(bed.applied().await?.into_iter().collect::<HashSet<_>>() == want && bed.letters().await?.len() == 1)
    })
    .await?;
    let s = running.stop().await?;
    assert_eq!((s.dead_lettered, s.parked), (1, 0), "{s:?}");
    assert_eq!(bed.parked().await?, 0);

    handler.fix(&key_events[0].id);
    let letter = bed.letters().await?.pop().expect("the poison");
    let done = herald_consumer::redrive_releasing(&bed.db, &handler, &Registry::embedded(), &letter).await?;
    assert_eq!((done.redriven, done.released), (herald_consumer::Redriven::Applied, Released::default()));
    applied_once_ending_with(&bed, &ids(&key_events[..1])).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn order_none_keeps_todays_behaviour_postgres() -> anyhow::Result<()> {
    order_none_applies_past_the_letter(Database::Postgres).await
}

#[tokio::test(flavor = "multi_thread")]
async fn order_none_keeps_todays_behaviour_sqlite() -> anyhow::Result<()> {
    order_none_applies_past_the_letter(Database::Sqlite).await
}
