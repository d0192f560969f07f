//! The three subscriptions of `export.events` (search, stats, notify) on
//! their own: rewinds, the legacy envelope, a stopped subscription, poison
//! and redrive, a database that fails for a while — on PostgreSQL and SQLite,
//! on the mock cluster and on the real broker.
//!
//! The stats subscription is the sharpest probe of "applied once": its effect
//! is an increment, so any second application shows up as a wrong count.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{Broker, Database};
use herald::bench::workload;
use herald::subscriptions::{self, Name};
use herald_consumer::{Handler, HandlerError, Metrics, MetricsSnapshot, Redriven, SubscriptionOptions};
use herald_consumer::{Live, Record};
use herald_envelope::OutboxEvent;
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_notify::intents;
use herald_projections::search::{self, Search};
use herald_projections::stats::{self, Stats};
use herald_store::{Backend, Db, Tx, dead_letter, inbox};
use herald_testkit::TestDb;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 4;

struct Bed {
    db: Db,
    brokers: String,
    topics: Topics,
    group_prefix: String,
    producer: FutureProducer,
    run: String,
    _test_db: TestDb,
    _kafka: Option<EmbeddedKafka>,
}

/// A subscription running in a task of this test.
struct Running {
    stop: CancellationToken,
    metrics: Arc<Metrics>,
    task: JoinHandle<anyhow::Result<MetricsSnapshot>>,
}

impl Running {
    async fn stop(self) -> anyhow::Result<MetricsSnapshot> {
        self.stop.cancel();
        self.task.await?
    }
}

async fn bed(database: Database, broker: Broker) -> anyhow::Result<Bed> {
    let test_db = common::test_db(database).await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let topics = Topics::with_prefix(&herald_testkit::unique("t"));
    let (brokers, kafka) = match broker {
        Broker::Mock => {
            let kafka = EmbeddedKafka::start(1, &topics.all(), PARTITIONS)?;
            (kafka.bootstrap_servers().to_owned(), Some(kafka))
        }
        Broker::Real => {
            let brokers = herald_testkit::real_broker()?;
            herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(PARTITIONS))
                .await?;
            (brokers, None)
        }
    };
    let producer = workload::producer(&KafkaConfig::new(&brokers))?;
    let run = herald_testkit::unique("run");
    Ok(Bed { db, brokers, topics, group_prefix: herald_testkit::unique("herald"), producer, run, _test_db: test_db, _kafka: kafka })
}

impl Bed {
    fn start(&self, name: Name) -> Running {
        self.start_with(name, SubscriptionOptions { max_batch: 7, ..SubscriptionOptions::default() })
    }

    /// Small batches on purpose: many transactions, many offset stores.
    fn start_with(&self, name: Name, options: SubscriptionOptions) -> Running {
        let stop = CancellationToken::new();
        let metrics = Arc::new(Metrics::default());
        let (db, sub) = (self.db.clone(), name.subscription(&self.group_prefix, &KafkaConfig::new(&self.brokers), &self.topics.events));
        let (token, m) = (stop.clone(), metrics.clone());
        let task = tokio::spawn(async move {
            if name == Name::Notify {
                notify_from_the_first_record(&sub).await?;
            }
            subscriptions::run(name, &db, &sub, &options, &m, token).await
        });
        Running { stop, metrics, task }
    }

    fn events(&self, from: usize, n: usize) -> anyhow::Result<Vec<OutboxEvent>> {
        let all = workload::completions(&self.topics.events, &self.run, from + n)?;
        Ok(all.into_iter().skip(from).collect())
    }

    async fn publish(&self, events: &[OutboxEvent]) -> anyhow::Result<()> {
        workload::publish(&self.producer, events).await
    }

    async fn inbox(&self, name: Name) -> anyhow::Result<i64> {
        Ok(inbox::count(&self.db, name.as_str()).await?)
    }

    /// Rewinds `name`'s committed offsets to the beginning of every partition.
    async fn rewind(&self, name: Name) -> anyhow::Result<()> {
        let group = name.subscription(&self.group_prefix, &KafkaConfig::new(&self.brokers), &self.topics.events).group;
        let (brokers, topic) = (self.brokers.clone(), self.topics.events.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("group.id", &group)
                .set("session.timeout.ms", "6000")
                .set("heartbeat.interval.ms", "500")
                .set("enable.auto.commit", "false")
                .create()?;
            let mut tpl = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(&topic, p, Offset::Offset(0))?;
            }
            if consumer.commit(&tpl, CommitMode::Sync).is_ok() {
                return Ok(());
            }
            // The mock cluster accepts commits only from group members: join
            // (the group is empty, so this member gets every partition) first.
            consumer.subscribe(&[&topic])?;
            let deadline = Instant::now() + Duration::from_secs(60);
            while consumer.assignment()?.count() < PARTITIONS as usize {
                anyhow::ensure!(Instant::now() < deadline, "rewinder never got the partitions");
                let _ = consumer.poll(Duration::from_millis(100));
            }
            consumer.commit(&tpl, CommitMode::Sync)?;
            // Leave before the subscription comes back, or it waits for this
            // member to rejoin.
            consumer.unsubscribe();
            while consumer.assignment()?.count() > 0 {
                anyhow::ensure!(Instant::now() < deadline, "rewinder never released the partitions");
                let _ = consumer.poll(Duration::from_millis(100));
            }
            Ok(())
        })
        .await?
    }
}

/// These tests notify everything the topic holds: the operator's explicit
/// choice the notify subscription requires before it starts from history
/// (what `--start-at` with a time before the first record says; the mock
/// cluster cannot look offsets up by time, so the start is committed
/// directly). A group that already has a position keeps it.
async fn notify_from_the_first_record(sub: &herald_consumer::Subscription) -> anyhow::Result<()> {
    for topic in &sub.topics {
        let states = herald_kafka::offsets::partition_states(&sub.kafka, &sub.group, topic).await?;
        let starts: Vec<(i32, i64)> = states.iter().filter(|s| s.committed.is_none()).map(|s| (s.partition, s.low)).collect();
        herald_kafka::offsets::commit(&sub.kafka, &sub.group, topic, &starts).await?;
    }
    Ok(())
}

/// Polls `probe` until it returns true; the pipeline is asynchronous, so
/// tests watch for the outcome with a deadline instead of sleeping.
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

async fn wait_inbox(bed: &Bed, name: Name, want: i64) -> anyhow::Result<()> {
    eventually(&format!("{} inbox to reach {want}", name.as_str()), || async move { Ok(bed.inbox(name).await? >= want) }).await
}

// --- rewind -------------------------------------------------------------------

async fn rewind_applies_nothing_twice(database: Database, broker: Broker) -> anyhow::Result<()> {
    let bed = bed(database, broker).await?;
    bed.publish(&bed.events(0, 20)?).await?;
    let running: Vec<_> = Name::ALL.iter().map(|n| (*n, bed.start(*n))).collect();
    for name in Name::ALL {
        wait_inbox(&bed, name, 20).await?;
    }
    for (_, r) in running {
        r.stop().await?;
    }
    assert_eq!(stats::total_exports(&bed.db).await?, 20);

    for name in Name::ALL {
        bed.rewind(name).await?;
    }
    let running: Vec<_> = Name::ALL.iter().map(|n| (*n, bed.start(*n))).collect();
    for (name, r) in &running {
        let m = r.metrics.clone();
        eventually(&format!("{} to re-read all 20", name.as_str()), || {
            let m = m.clone();
            async move { Ok(m.snapshot().duplicates >= 20) }
        })
        .await?;
    }
    for (name, r) in running {
        let s = r.stop().await?;
        assert_eq!(s.applied, 0, "{}: the rewind applied nothing", name.as_str());
    }
    assert_eq!(stats::total_exports(&bed.db).await?, 20, "no count twice");
    assert_eq!(intents::count(&bed.db, intents::PENDING).await?, 20, "one intent per completion");
    assert_eq!(search::count_active(&bed.db).await?, 20);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn rewind_postgres_mock_cluster() -> anyhow::Result<()> {
    rewind_applies_nothing_twice(Database::Postgres, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn rewind_sqlite_mock_cluster() -> anyhow::Result<()> {
    rewind_applies_nothing_twice(Database::Sqlite, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn rewind_postgres_real_broker() -> anyhow::Result<()> {
    rewind_applies_nothing_twice(Database::Postgres, Broker::Real).await
}

#[tokio::test(flavor = "multi_thread")]
async fn rewind_sqlite_real_broker() -> anyhow::Result<()> {
    rewind_applies_nothing_twice(Database::Sqlite, Broker::Real).await
}

// --- legacy envelope ------------------------------------------------------------

async fn legacy_and_cloudevent_are_one_fact(database: Database, broker: Broker) -> anyhow::Result<()> {
    let bed = bed(database, broker).await?;
    let events = bed.events(0, 4)?;
    let data: Vec<_> = (0..4).map(|i| workload::completion(&bed.run, i)).collect();
    // An inbox row the old consumer wrote under the legacy source, before the
    // mapping existed: event 3 was applied then.
    sqlx::query(
        "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
         VALUES ('stats', 'herald-exports', $1, 'herald.export.completed', 'old', 0, 0, 0)",
    )
    .bind(&events[3].id)
    .execute(bed.db.pool())
    .await?;
    // Event 0 in both envelopes, 1 only legacy, 2 only CloudEvents, 3 CloudEvents.
    bed.publish(&events[0..1]).await?;
    workload::publish_legacy(&bed.producer, &events[0], &data[0]).await?;
    workload::publish_legacy(&bed.producer, &events[1], &data[1]).await?;
    bed.publish(&events[2..4]).await?;

    let r = bed.start(Name::Stats);
    let m = r.metrics.clone();
    eventually("stats to see all five records", || {
        let m = m.clone();
        async move { Ok(m.snapshot().applied + m.snapshot().duplicates >= 5) }
    })
    .await?;
    let s = r.stop().await?;
    assert_eq!(s.applied, 3, "events 0, 1, 2 applied once each: {s:?}");
    assert_eq!(s.duplicates, 2, "second envelope of 0, and 3 matched the pre-mapping row: {s:?}");
    assert_eq!(s.dead_lettered, 0);
    assert_eq!(stats::total_exports(&bed.db).await?, 3);
    let legacy_rows: i64 = common::count(&bed.db, "SELECT COUNT(*) AS n FROM inbox WHERE source = 'herald-exports'").await?;
    assert_eq!(legacy_rows, 0, "legacy-keyed rows were normalised");
    assert_eq!(bed.inbox(Name::Stats).await?, 4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_envelope_postgres_mock_cluster() -> anyhow::Result<()> {
    legacy_and_cloudevent_are_one_fact(Database::Postgres, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn legacy_envelope_sqlite_real_broker() -> anyhow::Result<()> {
    legacy_and_cloudevent_are_one_fact(Database::Sqlite, Broker::Real).await
}

// --- independence -------------------------------------------------------------

async fn stopped_stats_holds_nobody_back(database: Database, broker: Broker) -> anyhow::Result<()> {
    let bed = bed(database, broker).await?;
    let search_r = bed.start(Name::Search);
    let notify_r = bed.start(Name::Notify);
    let stats_r = bed.start(Name::Stats);
    bed.publish(&bed.events(0, 10)?).await?;
    for name in Name::ALL {
        wait_inbox(&bed, name, 10).await?;
    }
    stats_r.stop().await?;

    bed.publish(&bed.events(10, 10)?).await?;
    wait_inbox(&bed, Name::Search, 20).await?;
    wait_inbox(&bed, Name::Notify, 20).await?;
    assert_eq!(search::count_active(&bed.db).await?, 20, "search is current");
    assert_eq!(intents::count(&bed.db, intents::PENDING).await?, 20, "notify is current");
    assert_eq!(stats::total_exports(&bed.db).await?, 10, "stats stopped at 10");

    let before = (search_r.metrics.snapshot(), notify_r.metrics.snapshot());
    let stats_r = bed.start(Name::Stats);
    wait_inbox(&bed, Name::Stats, 20).await?;
    let caught_up = stats_r.stop().await?;
    assert_eq!(caught_up.applied, 10, "stats caught up on exactly the 10 it missed");
    assert_eq!(stats::total_exports(&bed.db).await?, 20);
    let after = (search_r.stop().await?, notify_r.stop().await?);
    assert_eq!((after.0.applied, after.1.applied), (before.0.applied, before.1.applied), "stats' catch-up touched no other subscription");
    assert_eq!(search::count_active(&bed.db).await?, 20);
    assert_eq!(intents::count(&bed.db, intents::PENDING).await?, 20);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn stopped_stats_sqlite_mock_cluster() -> anyhow::Result<()> {
    stopped_stats_holds_nobody_back(Database::Sqlite, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn stopped_stats_postgres_real_broker() -> anyhow::Result<()> {
    stopped_stats_holds_nobody_back(Database::Postgres, Broker::Real).await
}

// --- poison -------------------------------------------------------------------

/// A defect the "fix" removes: the search table refuses one query text.
async fn install_defect(db: &Db) -> anyhow::Result<()> {
    let statements: &[&str] = match db.backend() {
        Backend::Postgres => &[
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.query = 'poison' THEN RAISE EXCEPTION 'query text refused by defect'; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON search_documents FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
        ],
        Backend::Sqlite => &["CREATE TRIGGER refuse_poison BEFORE INSERT ON search_documents WHEN NEW.query = 'poison' \
             BEGIN SELECT RAISE(ABORT, 'query text refused by defect'); END"],
    };
    for sql in statements {
        sqlx::query(sql).execute(db.pool()).await?;
    }
    Ok(())
}

async fn fix_defect(db: &Db) -> anyhow::Result<()> {
    let sql = match db.backend() {
        Backend::Postgres => "DROP TRIGGER refuse_poison ON search_documents",
        Backend::Sqlite => "DROP TRIGGER refuse_poison",
    };
    sqlx::query(sql).execute(db.pool()).await?;
    Ok(())
}

async fn poison_is_set_aside_and_redriven_once(database: Database, broker: Broker) -> anyhow::Result<()> {
    let bed = bed(database, broker).await?;
    install_defect(&bed.db).await?;
    // One partition key for everything: the good records really come after
    // the poison in the same partition.
    let mut events = bed.events(0, 11)?;
    for e in &mut events {
        e.partition_key = "one-partition".into();
    }
    let mut poison_data = workload::completion(&bed.run, 5);
    poison_data.query = "poison".into();
    events[5] = OutboxEvent::new(&bed.topics.events, "one-partition", &poison_data, chrono::Utc::now())?;
    events[5].partition_key = "one-partition".into();
    bed.publish(&events[..5]).await?;
    workload::publish_raw(&bed.producer, &bed.topics.events, "one-partition", b"\x00garbage, not an event", None).await?;
    bed.publish(&events[5..]).await?;

    let r = bed.start(Name::Search);
    wait_inbox(&bed, Name::Search, 10).await?;
    eventually("two dead letters", || async { Ok(dead_letter::count(&bed.db, "search", dead_letter::DEAD).await? == 2) }).await?;
    let s = r.stop().await?;
    assert_eq!((s.applied, s.dead_lettered), (10, 2), "{s:?}");
    assert_eq!(search::count_active(&bed.db).await?, 10, "records after the poison were applied");

    let letters = dead_letter::list(&bed.db, Some("search"), Some(dead_letter::DEAD)).await?;
    let garbage = letters.iter().find(|l| l.event_id.is_none()).expect("undecodable record kept");
    assert!(garbage.error.contains("not a legacy JSON envelope"), "{}", garbage.error);
    assert_eq!(garbage.value.as_deref(), Some(&b"\x00garbage, not an event"[..]));
    let poison = letters.iter().find(|l| l.event_id.as_deref() == Some(events[5].id.as_str())).expect("poison kept");
    assert!(poison.error.contains("refused by defect"), "{}", poison.error);
    assert_eq!(poison.attempts, 3, "bounded retries before giving up");
    assert_eq!(poison.topic, bed.topics.events);

    // Still broken: the redrive fails and the letter stays dead.
    assert!(matches!(herald_consumer::redrive(&bed.db, &Live::new(Search, &bed.topics.events), poison).await?, Redriven::Failed(_)));
    fix_defect(&bed.db).await?;
    let poison = dead_letter::get(&bed.db, poison.id).await?.expect("still there");
    assert_eq!(herald_consumer::redrive(&bed.db, &Live::new(Search, &bed.topics.events), &poison).await?, Redriven::Applied);
    assert_eq!(search::count_active(&bed.db).await?, 11);
    let again = dead_letter::get(&bed.db, poison.id).await?.expect("kept as redriven");
    assert_eq!(again.status, dead_letter::REDRIVEN);
    assert_eq!(herald_consumer::redrive(&bed.db, &Live::new(Search, &bed.topics.events), &again).await?, Redriven::NotDead);
    // Even a stale copy of the dead row cannot apply twice: the inbox has it.
    assert_eq!(herald_consumer::redrive(&bed.db, &Live::new(Search, &bed.topics.events), &poison).await?, Redriven::NotDead);
    assert_eq!(bed.inbox(Name::Search).await?, 11);
    assert!(matches!(herald_consumer::redrive(&bed.db, &Live::new(Search, &bed.topics.events), garbage).await?, Redriven::Failed(_)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_postgres_mock_cluster() -> anyhow::Result<()> {
    poison_is_set_aside_and_redriven_once(Database::Postgres, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_sqlite_mock_cluster() -> anyhow::Result<()> {
    poison_is_set_aside_and_redriven_once(Database::Sqlite, Broker::Mock).await
}

#[tokio::test(flavor = "multi_thread")]
async fn poison_postgres_real_broker() -> anyhow::Result<()> {
    poison_is_set_aside_and_redriven_once(Database::Postgres, Broker::Real).await
}

// --- retryable failures ---------------------------------------------------------

/// Stats, behind a database that is "down" for the first `fail` calls.
struct Flaky {
    fail: AtomicU32,
    stats: Live<Stats>,
}

impl Handler for Flaky {
    fn handles(&self, event_type: &str) -> bool {
        self.stats.handles(event_type)
    }

    async fn apply(&self, tx: &mut Tx<'_>, records: &[Record<'_>]) -> Result<(), HandlerError> {
        if self.fail.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(HandlerError::Retryable("database unavailable (injected)".into()));
        }
        self.stats.apply(tx, records).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn retryable_failure_pauses_and_never_dead_letters() -> anyhow::Result<()> {
    let bed = bed(Database::Sqlite, Broker::Mock).await?;
    bed.publish(&bed.events(0, 5)?).await?;
    let sub = Name::Stats.subscription(&bed.group_prefix, &KafkaConfig::new(&bed.brokers), &bed.topics.events);
    let (stop, metrics) = (CancellationToken::new(), Metrics::default());
    let handler = Flaky { fail: AtomicU32::new(4), stats: Live::new(Stats, &bed.topics.events) };
    let options = SubscriptionOptions::default();
    let runner = herald_consumer::run_subscription(&sub, &bed.db, &handler, &options, &metrics, stop.clone());
    let watcher = async {
        let result = eventually("stats to count 5", || async { Ok(stats::total_exports(&bed.db).await? == 5) }).await;
        stop.cancel();
        result
    };
    let (ran, watched) = tokio::join!(runner, watcher);
    watched?;
    let s = ran?;
    assert!(s.retries >= 4, "{s:?}");
    assert_eq!(s.dead_lettered, 0);
    assert_eq!(dead_letter::count(&bed.db, "stats", dead_letter::DEAD).await?, 0);
    assert_eq!(s.applied, 5);
    Ok(())
}

// --- rebalance handoff -----------------------------------------------------------

/// A fault hook that holds the `n`th committed batch before its offsets are
/// stored: `paused` is notified when it is held, `release` lets it go.
fn hold_after_commit(n: i64) -> (herald_fault::Hook, Arc<tokio::sync::Notify>, Arc<tokio::sync::Notify>) {
    let paused = Arc::new(tokio::sync::Notify::new());
    let release = Arc::new(tokio::sync::Notify::new());
    let hook = {
        let (paused, release) = (paused.clone(), release.clone());
        herald_fault::Hook::new(move |site| {
            let (paused, release) = (paused.clone(), release.clone());
            async move {
                if site.point == herald_fault::Point::AfterCommit && site.n == n {
                    paused.notify_one();
                    release.notified().await;
                }
                herald_fault::Action::Continue
            }
        })
    };
    (hook, paused, release)
}

/// Waits until both members hold partitions and together hold them all.
async fn both_hold_partitions(a: &Running, b: &Running) -> anyhow::Result<()> {
    let (ma, mb) = (a.metrics.clone(), b.metrics.clone());
    eventually("both members to hold partitions", || {
        let (ma, mb) = (ma.clone(), mb.clone());
        async move {
            let (sa, sb) = (ma.snapshot(), mb.snapshot());
            Ok(sa.assigned > 0 && sb.assigned > 0 && sa.assigned + sb.assigned == PARTITIONS as u64)
        }
    })
    .await
}

/// A second member joins while the first has a batch committed in the
/// database but its offsets not yet stored (held at the fault point). The
/// first finishes, commits before releasing partitions, and the two go on
/// sharing the topic: no event lost, none applied twice.
///
/// On a real broker the commit made during the rebalance is accepted (the
/// generation is still current), so nothing applied is redelivered at all.
/// librdkafka's mock cluster refuses every OffsetCommit while a group is in
/// its JOINING state (`rd_kafka_mock_cgrp_classic_check_state`), so there the
/// handoff redelivers the uncommitted tail, and the inbox absorbs it.
async fn rebalance_mid_stream(database: Database, broker: Broker, redelivery_possible: bool) -> anyhow::Result<()> {
    let bed = bed(database, broker).await?;
    bed.publish(&bed.events(0, 100)?).await?;
    let (hook, paused, release) = hold_after_commit(2);
    let a = bed.start_with(Name::Stats, SubscriptionOptions { max_batch: 10, faults: hook, ..SubscriptionOptions::default() });
    paused.notified().await;
    let b = bed.start_with(Name::Stats, SubscriptionOptions { max_batch: 10, ..SubscriptionOptions::default() });
    release.notify_one();
    both_hold_partitions(&a, &b).await?;
    bed.publish(&bed.events(100, 100)?).await?;
    wait_inbox(&bed, Name::Stats, 200).await?;
    let (sa, sb) = (a.stop().await?, b.stop().await?);
    assert_eq!(sa.applied + sb.applied, 200, "each event applied once: {sa:?} {sb:?}");
    assert_eq!(stats::total_exports(&bed.db).await?, 200, "no count twice, none lost");
    assert!(sb.applied > 0, "the second member took a share: {sb:?}");
    if !redelivery_possible {
        assert_eq!(sa.duplicates + sb.duplicates, 0, "nothing applied was redelivered across the handoff: {sa:?} {sb:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn rebalance_mid_stream_postgres_mock_cluster() -> anyhow::Result<()> {
    rebalance_mid_stream(Database::Postgres, Broker::Mock, true).await
}

#[tokio::test(flavor = "multi_thread")]
async fn rebalance_mid_stream_postgres_real_broker() -> anyhow::Result<()> {
    rebalance_mid_stream(Database::Postgres, Broker::Real, false).await
}

/// A poll received while the lanes are idle goes with what has arrived: a
/// `max_wait` of an hour holds nothing back. (Before, every poll kept
/// receiving for `max_wait` after its first record, and this test timed
/// out waiting for the first five.)
#[tokio::test(flavor = "multi_thread")]
async fn a_poll_with_idle_lanes_does_not_wait_for_company() -> anyhow::Result<()> {
    let bed = bed(Database::Postgres, Broker::Real).await?;
    let patient = SubscriptionOptions { max_wait: Duration::from_secs(3600), ..SubscriptionOptions::default() };
    let running = bed.start_with(Name::Search, patient);
    bed.publish(&bed.events(0, 5)?).await?;
    wait_inbox(&bed, Name::Search, 5).await?;
    bed.publish(&bed.events(5, 5)?).await?;
    wait_inbox(&bed, Name::Search, 10).await?;
    let snapshot = running.stop().await?;
    assert_eq!(snapshot.applied, 10, "{snapshot:?}");
    Ok(())
}

/// The next poll is received while the lanes apply the last one, so a
/// revocation can come while a batch is committed in the database and its
/// offsets not yet stored (held at the fault point). It waits: the lanes
/// store their offsets and start no other batch, then the offsets are
/// committed and the partitions given up — the handoff redelivers nothing.
/// The first member's next receive waits while the batch is held (a
/// `max_wait` longer than the hold keeps a receive going while the lanes
/// are busy), so the revocation is delivered inside that receive; what it
/// received before must not be applied after the handoff.
#[tokio::test(flavor = "multi_thread")]
async fn a_revocation_during_a_batch_waits_for_its_offsets() -> anyhow::Result<()> {
    let bed = bed(Database::Postgres, Broker::Real).await?;
    bed.publish(&bed.events(0, 40)?).await?;
    let (hook, paused, release) = hold_after_commit(2);
    let held = SubscriptionOptions { max_batch: 10, max_wait: Duration::from_secs(3), faults: hook, ..SubscriptionOptions::default() };
    let a = bed.start_with(Name::Stats, held);
    paused.notified().await;
    let b = bed.start_with(Name::Stats, SubscriptionOptions { max_batch: 10, ..SubscriptionOptions::default() });
    let ma = a.metrics.clone();
    eventually("the first member's revocation to wait for its lanes", || {
        let ma = ma.clone();
        async move { Ok(ma.snapshot().revocations_deferred > 0) }
    })
    .await?;
    assert_eq!(a.metrics.snapshot().assigned, PARTITIONS as u64, "partitions are kept while the batch is held");
    release.notify_one();
    both_hold_partitions(&a, &b).await?;
    bed.publish(&bed.events(40, 100)?).await?;
    wait_inbox(&bed, Name::Stats, 140).await?;
    let (sa, sb) = (a.stop().await?, b.stop().await?);
    assert_eq!(sa.applied + sb.applied, 140, "each event applied once: {sa:?} {sb:?}");
    assert_eq!(stats::total_exports(&bed.db).await?, 140, "no count twice, none lost");
    assert_eq!(sa.duplicates + sb.duplicates, 0, "nothing applied was redelivered across the handoff: {sa:?} {sb:?}");
    Ok(())
}
