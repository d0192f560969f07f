//! The failures users meet on Apache Kafka, on a three-node KRaft cluster
//! (replication factor 3, `min.insync.replicas` 2): a partition leader
//! SIGKILLed while the relay publishes, nodes restarted under a live
//! idempotent producer, the whole cluster down for 30 s, and a relay cut off
//! from PostgreSQL (not from Kafka) for longer than its lease.
//!
//! Tests that kill brokers start a private cluster (`herald_testkit::cluster`)
//! and take turns; the cut-off relay runs on the shared cluster, which it
//! does not disturb. Disruptions are triggered at points the test observes
//! (rows delivered, a relay parked at its progress write), never after a
//! sleep meant to make a race likely.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::Utc;
use herald_envelope::OutboxEvent;
use herald_fault::{Action, Hook, Point};
use herald_kafka::KafkaConfig;
use herald_kafka::TopicSettings;
use herald_relay::{Relay, RelayConfig, RelayCounters};
use herald_store::{Db, outbox};
use herald_testkit::kafka::{Record, first_occurrences_by_key, read_all};
use herald_testkit::wait_until;
use sqlx::Row;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const PARTITIONS: i32 = 4;
const KEYS: usize = 40;

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HERALD_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
}

/// Rows the relay's cursor passed (or an older release marked delivered).
async fn delivered(db: &Db) -> anyhow::Result<i64> {
    Ok(herald_store::outbox::count_by_status(db, herald_store::outbox::DELIVERED).await?)
}

async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get::<i64, _>("n")?)
}

/// Each key's event ids in commit order, as the writers committed them.
type Committed = BTreeMap<String, Vec<String>>;

/// Commits `events` events over `KEYS` keys, five per transaction, or until
/// `stop` when `events` is `None`.
async fn write(db: Db, topic: String, events: Option<usize>, stop: CancellationToken) -> anyhow::Result<Committed> {
    let mut order = Committed::new();
    let mut written = 0;
    while events.is_none_or(|n| written < n) && !(events.is_none() && stop.is_cancelled()) {
        let mut tx = db.begin().await?;
        let mut ids = Vec::new();
        for _ in 0..5 {
            let key = format!("key-{:02}", written % KEYS);
            let event = OutboxEvent {
                id: uuid::Uuid::now_v7().to_string(),
                source: "/herald/tests/kafka-failures".to_owned(),
                event_type: "herald.test.event".to_owned(),
                subject: key.clone(),
                time: Utc::now(),
                schema_file: "test.avsc".to_owned(),
                data: vec![b'x'; 200],
                content_type: herald_envelope::AVRO_CONTENT_TYPE.to_owned(),
                extensions: Default::default(),
                topic: topic.clone(),
                partition_key: key.clone(),
                trace: None,
            };
            outbox::append(&mut tx, &event).await?;
            ids.push((key, event.id));
            written += 1;
        }
        tx.commit().await?;
        for (key, id) in ids {
            order.entry(key).or_default().push(id);
        }
        if events.is_none() {
            // An open-ended writer stands for steady business traffic.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(order)
}

struct RunningRelay {
    stats: Arc<RelayCounters>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

fn start_relay(db: Db, brokers: &str, owner: &str, faults: Hook) -> anyhow::Result<RunningRelay> {
    let config = RelayConfig {
        owner: owner.to_owned(),
        backoff_base: Duration::from_millis(50),
        backoff_max: Duration::from_secs(2),
        // Enough attempts to outlast a leader election and a 30 s outage:
        // a row the broker could not take for a while is late, not failed.
        max_attempts: 1000,
        faults,
        ..RelayConfig::default()
    }
    .with_lease(Duration::from_secs(3));
    let relay = Relay::new(db, &KafkaConfig::new(brokers), config)?;
    let stats = relay.counters();
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(async move { relay.run(token).await });
    Ok(RunningRelay { stats, stop, task })
}

impl RunningRelay {
    async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task).await??;
        Ok(())
    }
}

/// The relay's promises, checked against what the topic holds: every
/// committed row delivered and present (none lost, so none was marked
/// delivered without an acknowledgement), first copies per key in commit
/// order, copies beyond the first carrying the same ids.
async fn check_published(db: &Db, brokers: &str, topic: &str, committed: &Committed) -> anyhow::Result<Vec<Record>> {
    let total: usize = committed.values().map(Vec::len).sum();
    assert_eq!(delivered(db).await?, total as i64, "every row delivered");
    let records = read_all(brokers, topic, PARTITIONS)?;
    let ids: BTreeSet<&str> = records.iter().map(|r| r.ce_id.as_str()).collect();
    assert_eq!(ids.len(), total, "each committed event is in the topic, and nothing else");
    let published = first_occurrences_by_key(&records);
    for (key, want) in committed {
        assert_eq!(published.get(key), Some(want), "{key}: first copies in commit order, none missing");
    }
    Ok(records)
}

async fn private_topic(brokers: &str, prefix: &str) -> anyhow::Result<String> {
    let topic = herald_testkit::unique(prefix);
    herald_kafka::ensure_topics(&KafkaConfig::new(brokers), &[&topic], TopicSettings::partitions(PARTITIONS)).await?;
    Ok(topic)
}

#[tokio::test(flavor = "multi_thread")]
async fn leader_killed_while_the_relay_publishes_loses_no_acknowledged_event() -> anyhow::Result<()> {
    init_logs();
    let mut cluster = tokio::task::block_in_place(|| herald_testkit::cluster::start(3))?;
    let brokers = cluster.bootstrap();
    let topic = private_topic(&brokers, "leader").await?;
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let relays = [start_relay(db.clone(), &brokers, "relay-a", Hook::none())?, start_relay(db.clone(), &brokers, "relay-b", Hook::none())?];
    const EVENTS: usize = 4000;
    let writer = tokio::spawn(write(db.clone(), topic.clone(), Some(EVENTS), CancellationToken::new()));

    // The kill lands while the relays are mid-stream: a fifth delivered.
    wait_until("a fifth of the rows delivered", Duration::from_secs(120), || async { Ok(delivered(&db).await? >= EVENTS as i64 / 5) })
        .await?;
    let leader = cluster.leader_of(&topic, 0)?;
    let delivered_at_kill = delivered(&db).await?;
    tokio::task::block_in_place(|| cluster.kill(leader))?;
    println!("SIGKILLed node {leader} (leader of {topic}/0) at {delivered_at_kill} of {EVENTS} delivered");
    let committed = writer.await??;
    wait_until("every row delivered", Duration::from_secs(180), || async { Ok(delivered(&db).await? == EVENTS as i64) }).await?;
    assert!(delivered_at_kill < EVENTS as i64, "the kill fell inside the run");
    for relay in relays {
        relay.stop().await?;
    }
    let new_leader = cluster.leader_of(&topic, 0)?;
    assert_ne!(new_leader, leader, "another replica leads the partition");

    let records = check_published(&db, &brokers, &topic, &committed).await?;
    assert_eq!(herald_store::delivered::count_except(&db, herald_store::outbox::DELIVERED).await?, 0, "nothing set aside");
    println!("{} records for {EVENTS} events after the leader's SIGKILL", records.len());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_restarted_under_a_live_idempotent_producer() -> anyhow::Result<()> {
    init_logs();
    let mut cluster = tokio::task::block_in_place(|| herald_testkit::cluster::start(3))?;
    let brokers = cluster.bootstrap();
    let topic = private_topic(&brokers, "restart").await?;
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let relay = start_relay(db.clone(), &brokers, "relay", Hook::none())?;
    let stop_writing = CancellationToken::new();
    let writer = tokio::spawn(write(db.clone(), topic.clone(), None, stop_writing.clone()));

    // Node 1 crashes and comes back; nodes 2 and 3 are restarted as in a
    // rolling upgrade (SIGTERM: controlled shutdown). The producer keeps
    // its id throughout; each step starts once the previous node caught up.
    for id in 1..=3 {
        let before = delivered(&db).await?;
        wait_until("the relay to move on", Duration::from_secs(120), || async { Ok(delivered(&db).await? > before + 100) }).await?;
        tokio::task::block_in_place(|| -> anyhow::Result<()> {
            if id == 1 {
                cluster.kill(id)?;
            } else {
                cluster.node(id)?.stop(Duration::from_secs(60))?;
            }
            cluster.restart(id)
        })?;
        wait_until("all replicas in sync", Duration::from_secs(120), || async {
            Ok(tokio::task::block_in_place(|| cluster.health(Duration::from_secs(5)))?.under_replicated == 0)
        })
        .await?;
        println!("node {id} restarted at {} delivered", delivered(&db).await?);
    }
    stop_writing.cancel();
    let committed = writer.await??;
    let total: usize = committed.values().map(Vec::len).sum();
    wait_until("every row delivered", Duration::from_secs(180), || async { Ok(delivered(&db).await? == total as i64) }).await?;
    let stats = relay.stats.clone();
    relay.stop().await?;

    let records = check_published(&db, &brokers, &topic, &committed).await?;
    // The idempotent producer does not duplicate across broker restarts; a
    // copy can only come from a row the relay published again after a
    // failed delivery report, at most one per such retry.
    let duplicates = records.len() - total;
    let retried = stats.retried.load(Ordering::Relaxed);
    assert!(duplicates as u64 <= retried, "{duplicates} duplicates for {retried} retried rows");
    println!("{total} events, {duplicates} duplicates, {retried} retried rows across three node restarts");
    Ok(())
}

/// Parks the first batch after it is armed between the broker's ack and the
/// progress write, until released.
struct ParkOnce {
    armed: AtomicBool,
    parked: Notify,
    release: Notify,
}

/// The relay's hook that parks at [`ParkOnce`].
fn park_once(park: Arc<ParkOnce>) -> Hook {
    Hook::new(move |site| {
        let park = park.clone();
        let armed = site.point == Point::BeforeProgress && park.armed.swap(false, Ordering::SeqCst);
        async move {
            if armed {
                park.parked.notify_one();
                park.release.notified().await;
            }
            Action::Continue
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn relay_cut_off_from_postgres_past_its_lease_records_nothing() -> anyhow::Result<()> {
    init_logs();
    let brokers = herald_testkit::real_broker()?;
    let topic = private_topic(&brokers, "cut").await?;
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let mut url = url::Url::parse(&test_db.url)?;
    let target = format!("{}:{}", url.host_str().unwrap_or("127.0.0.1"), url.port().unwrap_or(5432)).parse()?;
    let proxy = herald_testkit::CutProxy::start(target).await?;
    url.set_port(Some(proxy.addr().port())).map_err(|()| anyhow::anyhow!("url without port"))?;
    let cut_db = Db::connect(url.as_str()).await?;

    let mut committed = write(db.clone(), topic.clone(), Some(200), CancellationToken::new()).await?;
    let park = Arc::new(ParkOnce { armed: AtomicBool::new(true), parked: Notify::new(), release: Notify::new() });
    let cut_relay = start_relay(cut_db, &brokers, "cut-off", park_once(park.clone()))?;
    // The cut-off relay has published a batch and the broker acknowledged
    // it; it is about to record that. Now its database goes away.
    park.parked.notified().await;
    proxy.cut();
    let steady = start_relay(db.clone(), &brokers, "steady", Hook::none())?;
    for (key, ids) in write(db.clone(), topic.clone(), Some(200), CancellationToken::new()).await? {
        committed.entry(key).or_default().extend(ids);
    }
    // Delivering all 400 needs every slice, the parked one included: the
    // steady relay got them only after the cut-off relay's lease expired.
    wait_until("the steady relay to deliver everything", Duration::from_secs(120), || async { Ok(delivered(&db).await? == 400) }).await?;
    let fenced_before = cut_relay.stats.fenced.load(Ordering::SeqCst);

    proxy.heal();
    park.release.notify_one();
    wait_until("the cut-off relay's progress write to be refused", Duration::from_secs(60), || async {
        Ok(cut_relay.stats.fenced.load(Ordering::SeqCst) > fenced_before)
    })
    .await?;
    steady.stop().await?;
    cut_relay.stop().await?;

    let records = check_published(&db, &brokers, &topic, &committed).await?;
    assert!(records.len() > 400, "the parked batch went out twice (same ids): {} records", records.len());
    Ok(())
}

/// Runs `herald status --json` against the deployment.
async fn herald_status(db_url: &str, brokers: &str, prefix: &str, group_prefix: &str) -> anyhow::Result<serde_json::Value> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["status", "--json", "--database", db_url, "--kafka", brokers, "--topic-prefix", prefix])
        .args(["--group-prefix", group_prefix, "--kafka-timeout", "3s"])
        .env("HERALD_LOG", "error")
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "herald status: {}", String::from_utf8_lossy(&out.stderr));
    Ok(serde_json::from_slice(&out.stdout)?)
}

async fn post_export(http: &reqwest::Client, base: &str, key: &str) -> anyhow::Result<u16> {
    let response = http
        .post(format!("{base}/v1/exports"))
        .bearer_auth("alice-token")
        .header("idempotency-key", key)
        .json(&serde_json::json!({"format": "csv", "query": format!("outage {key}")}))
        .send()
        .await?;
    Ok(response.status().as_u16())
}

#[tokio::test(flavor = "multi_thread")]
async fn whole_cluster_down_for_30s_then_everything_drains_once() -> anyhow::Result<()> {
    init_logs();
    let mut cluster = tokio::task::block_in_place(|| herald_testkit::cluster::start(3))?;
    let brokers = cluster.bootstrap();
    let prefix = herald_testkit::unique("outage");
    let topics = herald_kafka::Topics::with_prefix(&prefix);
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), TopicSettings::partitions(PARTITIONS)).await?;
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let artifacts = tempfile::tempdir()?;
    let group_prefix = herald_testkit::unique("herald");
    let wiring = herald::pipeline::Wiring {
        db: db.clone(),
        kafka: KafkaConfig::new(brokers.as_str()),
        topics,
        group_prefix: group_prefix.clone(),
        artifacts: artifacts.path().display().to_string(),
        tokens: herald_api::Tokens::parse("alice-token:alice").map_err(anyhow::Error::msg)?,
    };
    let running = herald::pipeline::start(wiring, "127.0.0.1:0").await?;
    let base = format!("http://{}", running.api_addr.expect("api role"));
    let http = reqwest::Client::new();
    let settled = |n: i64| {
        let db = db.clone();
        move || {
            let db = db.clone();
            async move {
                let applied = |s: &str| {
                    format!("SELECT COUNT(*) AS n FROM inbox WHERE subscription = '{s}' AND event_type = 'herald.export.completed'")
                };
                Ok(count(&db, "SELECT COUNT(*) AS n FROM export_jobs WHERE status = 'succeeded'").await? == n
                    && count(&db, &applied("search")).await? == n
                    && count(&db, &applied("stats")).await? == n
                    && count(&db, &applied("notify")).await? == n
                    && herald_store::delivered::count_except(&db, herald_store::outbox::DELIVERED).await? == 0)
            }
        }
    };
    for i in 0..10 {
        assert_eq!(post_export(&http, &base, &format!("before-{i}")).await?, 202);
    }
    wait_until("the first ten exports through every subscription", Duration::from_secs(120), settled(10)).await?;

    tokio::task::block_in_place(|| cluster.kill_all())?;
    let outage = Instant::now();
    for i in 0..20 {
        assert_eq!(post_export(&http, &base, &format!("during-{i}")).await?, 202, "intake needs only the database");
    }
    let status = herald_status(&test_db.url, &brokers, &prefix, &group_prefix).await?;
    assert!(status["outbox"]["backlog"].as_i64() >= Some(20), "the backlog shows: {:#}", status["outbox"]);
    assert!(status["outbox"]["oldest_pending_age_ms"].as_i64().is_some(), "{:#}", status["outbox"]);
    assert!(!status["kafka_error"].is_null(), "status says the cluster does not answer: {status:#}");
    // The outage is the scenario: thirty seconds without any broker.
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(outage.elapsed())).await;
    tokio::task::block_in_place(|| cluster.start_all())?;

    wait_until("all thirty exports through every subscription", Duration::from_secs(240), settled(30)).await?;
    running.stop().await?;
    let status = herald_status(&test_db.url, &brokers, &prefix, &group_prefix).await?;
    assert_eq!(status["outbox"]["backlog"], 0, "{:#}", status["outbox"]);
    // Inbox-guarded effects, once each: one document, one count and one
    // intent per completion, whatever was redelivered after the outage.
    assert_eq!(count(&db, "SELECT COUNT(*) AS n FROM search_documents").await?, 30);
    assert_eq!(count(&db, "SELECT CAST(COALESCE(SUM(exports), 0) AS BIGINT) AS n FROM stats_counters").await?, 30);
    assert_eq!(count(&db, "SELECT COUNT(*) AS n FROM notification_intents").await?, 30);
    assert_eq!(count(&db, "SELECT COUNT(*) AS n FROM dead_letters").await?, 0);
    Ok(())
}
