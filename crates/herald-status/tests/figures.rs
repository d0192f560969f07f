//! The status figures against real databases (PostgreSQL and SQLite, rows
//! seeded with known times, so every figure has one right value) and the
//! lag against the real broker (records produced and offsets committed by
//! hand, so the lag of each group is known), and the topics' durability
//! figures against topics created with known settings.

use std::time::Duration;

use herald_kafka::{KafkaConfig, TopicSettings, Topics};
use herald_status::{KafkaProbe, Monitor, MonitorConfig, TopicDurability, queries};
use herald_store::{Db, outbox};
use herald_testkit::TestDb;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

const NOW: i64 = 1_800_000_000_000;
const SUBSCRIPTIONS: [&str; 3] = ["search", "stats", "notify"];

async fn exec(db: &Db, sql: &str) -> anyhow::Result<()> {
    sqlx::query(sql).execute(db.pool()).await?;
    Ok(())
}

/// Rows whose figures are known: see each assertion of `figures_match_the_rows`.
async fn seed(db: &Db) -> anyhow::Result<()> {
    let outbox = [
        ("e1", "pending", 5_000),
        ("e2", "pending", 3_000),
        ("e3", "retryable_failed", 8_000),
        ("e4", "pending", 60_000),
        ("e5", "delivered", 90_000),
        ("e6", "delivered", 1_000),
    ];
    for (id, status, age) in outbox {
        sqlx::query(
            "INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, data, topic, partition_key, status, created_at_ms) \
             VALUES ($1, '/t', 'export.completed', 'k', 0, 'f', $2, 'topic', 'k', $3, $4)",
        )
        .bind(id)
        .bind(b"x".to_vec())
        .bind(status)
        .bind(NOW - age)
        .execute(db.pool())
        .await?;
    }
    // e4 is set aside the way the relay does it (its status and its row in
    // outbox_set_aside, in one transaction).
    let mut tx = db.begin().await?;
    let e4: i64 = sqlx::query_scalar("SELECT seq FROM outbox WHERE event_id = 'e4'").fetch_one(&mut *tx).await?;
    let setback = outbox::Setback { seq: e4, status: outbox::FAILED, error: "too large".into(), next_attempt_at_ms: None };
    outbox::set_back(&mut tx, &[setback]).await?;
    tx.commit().await?;
    // Leases against the database's clock: far future is held, 0 expired.
    let future = herald_store::now_ms() + 3_600_000;
    for (slice, owner, expires) in
        [(0, "relay-a", future), (1, "relay-a", future), (2, "relay-a", future), (3, "relay-b", future), (4, "relay-c", 0)]
    {
        sqlx::query("UPDATE relay_slices SET claim_owner = $1, claim_token = 't', claim_expires_at_ms = $2 WHERE slice = $3")
            .bind(owner)
            .bind(expires)
            .bind(slice)
            .execute(db.pool())
            .await?;
    }
    for (owner, expires) in [("relay-a", future), ("relay-b", future), ("relay-c", 0)] {
        sqlx::query("INSERT INTO relay_members (owner, expires_at_ms) VALUES ($1, $2)")
            .bind(owner)
            .bind(expires)
            .execute(db.pool())
            .await?;
    }
    // A rebuild's scope (search@g2) is not the live subscription's.
    for (i, scope) in ["search", "search", "stats", "search@g2", "search@g2", "search@g2"].iter().enumerate() {
        sqlx::query("INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) VALUES ($1, '/t', $2, 'x', 't', 0, 0, 0)")
            .bind(*scope)
            .bind(format!("i{i}"))
            .execute(db.pool())
            .await?;
    }
    for (offset, (scope, status)) in [("search", "dead"), ("search", "redriven"), ("notify", "dead"), ("notify", "dead")].iter().enumerate()
    {
        sqlx::query(
            "INSERT INTO dead_letters (subscription, topic, kafka_partition, kafka_offset, headers, error, attempts, status, created_at_ms, updated_at_ms) \
             VALUES ($1, 't', 0, $2, '[]', 'bad', 1, $3, 0, 0)",
        )
        .bind(*scope)
        .bind(offset as i64)
        .bind(*status)
        .execute(db.pool())
        .await?;
    }
    // Parked behind stats' letter at offset 4 of key k1 (its id is 5): three
    // records of k1, parked 10 s ago; one of a binary key with no letter, 2 s ago.
    sqlx::query(
        "INSERT INTO dead_letters (subscription, topic, kafka_partition, kafka_offset, record_key, headers, error, attempts, status, created_at_ms, updated_at_ms) \
         VALUES ('stats', 't', 1, 4, $1, '[]', 'bad', 1, 'dead', 0, 0)",
    )
    .bind(b"k1".to_vec())
    .execute(db.pool())
    .await?;
    for (offset, key, age) in [(5, &b"k1"[..], 10_000), (6, b"k1", 9_000), (7, b"k1", 8_000), (9, &[0, 255], 2_000)] {
        sqlx::query(
            "INSERT INTO parked_records (subscription, topic, kafka_partition, kafka_offset, record_key, headers, parked_at_ms) \
             VALUES ('stats', 't', 1, $1, $2, '[]', $3)",
        )
        .bind(offset as i64)
        .bind(key.to_vec())
        .bind(NOW - age)
        .execute(db.pool())
        .await?;
    }
    for (i, status) in ["sent", "sent", "unknown", "pending"].iter().enumerate() {
        sqlx::query(
            "INSERT INTO notification_intents (idempotency_key, source, event_id, recipient, kind, job_id, body, status, created_at_ms, updated_at_ms) \
             VALUES ($1, '/t', $1, 'r', 'export.completed', 'j', '{}', $2, 0, 0)",
        )
        .bind(format!("n{i}"))
        .bind(*status)
        .execute(db.pool())
        .await?;
    }
    // Ten succeeded jobs taking 100 ms … 1 s, one failed after 2 s (no
    // completion time: its last update counts), three open.
    let job = "INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms, completed_at_ms) VALUES ($1, 'alice', 'csv', 'q', $2, 1, $3, $4, $5)";
    for i in 1..=10i64 {
        let created = NOW - 100_000 + i * 1_000;
        sqlx::query(job)
            .bind(format!("s{i}"))
            .bind("succeeded")
            .bind(created)
            .bind(created + i * 100)
            .bind(created + i * 100)
            .execute(db.pool())
            .await?;
    }
    let failed = "INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms) VALUES ($1, 'alice', 'csv', 'q', $2, 1, $3, $4)";
    sqlx::query(failed).bind("f1").bind("failed").bind(NOW - 50_000).bind(NOW - 48_000).execute(db.pool()).await?;
    for (id, status, age) in [("p1", "pending", 7_000), ("p2", "pending", 2_000), ("r1", "running", 9_000)] {
        sqlx::query(failed).bind(id).bind(status).bind(NOW - age).bind(NOW).execute(db.pool()).await?;
    }
    exec(db, "INSERT INTO projection_generations (projection, generation, state, created_at_ms, updated_at_ms) VALUES ('search', 2, 'building', 0, 0)").await?;
    for (generation, job) in [(1, "s1"), (1, "s2"), (1, "s3"), (2, "s1")] {
        sqlx::query("INSERT INTO search_documents (generation, job_id, caller, format, query, result_id, size_bytes, completed_at_ms, version) VALUES ($1, $2, 'alice', 'csv', 'q', 'r', 1, 0, 1)")
            .bind(generation as i64)
            .bind(job)
            .execute(db.pool())
            .await?;
    }
    for (day, caller) in [("2026-11-30", "alice"), ("2026-11-30", "bob")] {
        sqlx::query("INSERT INTO stats_counters (generation, day, caller, format, exports, bytes, updated_at_ms) VALUES (1, $1, $2, 'csv', 1, 1, 0)")
            .bind(day)
            .bind(caller)
            .execute(db.pool())
            .await?;
    }
    Ok(())
}

async fn figures_match_the_rows(test_db: TestDb) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    seed(&db).await?;
    let s = queries::collect(&db, &SUBSCRIPTIONS, NOW).await?;

    assert_eq!(s.backend, if test_db.is_postgres() { "postgres" } else { "sqlite" });
    let o = &s.outbox;
    assert_eq!((o.pending, o.retryable_failed, o.failed, o.dead_lettered, o.backlog), (2, 1, 1, 0, 3));
    assert_eq!(o.oldest_pending_age_ms, Some(8_000), "the retryable row is the oldest of the backlog; the failed one is not backlog");

    let r = &s.relay;
    assert_eq!((r.slices, r.active_claims, r.live_relays), (16, 4, 2));
    assert_eq!(r.by_owner, [("relay-a".to_owned(), 3), ("relay-b".to_owned(), 1)].into());

    let subs: Vec<(&str, i64, i64, i64)> =
        s.subscriptions.iter().map(|x| (x.name.as_str(), x.inbox_rows, x.dead_letters, x.redriven)).collect();
    assert_eq!(subs, [("search", 2, 1, 1), ("stats", 1, 1, 0), ("notify", 0, 2, 0)]);
    let parked: Vec<(i64, i64)> = s.subscriptions.iter().map(|x| (x.parked_keys, x.parked_records)).collect();
    assert_eq!(parked, [(0, 0), (2, 4), (0, 0)]);
    let oldest: Vec<(&str, i64, i64, i64, Option<i64>)> =
        s.subscriptions[1].oldest_parked.iter().map(|k| (k.key.as_str(), k.records, k.first_offset, k.age_ms, k.blocked_by)).collect();
    assert_eq!(oldest, [("k1", 3, 5, 10_000, Some(5)), ("0x00ff", 1, 9, 2_000, None)], "oldest first");
    assert!(s.subscriptions.iter().all(|x| x.lag.is_none()), "no broker asked");

    assert_eq!(s.notifications.unknown, 1);
    assert_eq!(s.notifications.by_status, [("pending".to_owned(), 1), ("sent".to_owned(), 2), ("unknown".to_owned(), 1)].into());

    let j = &s.jobs;
    assert_eq!(
        j.by_status,
        [("failed".to_owned(), 1), ("pending".to_owned(), 2), ("running".to_owned(), 1), ("succeeded".to_owned(), 10)].into()
    );
    assert_eq!((j.open, j.oldest_open_age_ms), (3, Some(9_000)));
    // 100, 200 … 1000 and 2000: nearest rank 6 of 11, 10 of 11, 11 of 11.
    let l = &j.latency;
    assert_eq!((l.samples, l.p50_ms, l.p90_ms, l.p99_ms), (11, Some(600), Some(1_000), Some(2_000)));

    let generations: Vec<(&str, i64, &str, bool, i64)> =
        s.generations.iter().map(|g| (g.projection.as_str(), g.generation, g.state.as_str(), g.active, g.documents)).collect();
    assert_eq!(generations, [("search", 1, "active", true, 3), ("search", 2, "building", false, 1), ("stats", 1, "active", true, 2)]);

    // The histogram's feed: jobs finished after a time, each with its latency.
    let mut recent: Vec<(String, i64)> =
        queries::finished_since(&db, NOW - 91_000).await?.into_iter().map(|f| (f.job_id, f.latency_ms)).collect();
    recent.sort();
    assert_eq!(recent, [("f1".to_owned(), 2_000), ("s10".to_owned(), 1_000), ("s9".to_owned(), 900)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn figures_match_the_rows_on_postgres() -> anyhow::Result<()> {
    figures_match_the_rows(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn figures_match_the_rows_on_sqlite() -> anyhow::Result<()> {
    figures_match_the_rows(herald_testkit::sqlite_db()?).await
}

/// End offsets minus committed offsets, per group, on the real broker: a
/// group that committed part of a partition, one that never committed
/// (counted from the low watermark), one that committed only one partition.
#[tokio::test(flavor = "multi_thread")]
async fn lag_is_end_minus_committed_on_the_real_broker() -> anyhow::Result<()> {
    let brokers = herald_testkit::real_broker()?;
    let topics = Topics::with_prefix(&herald_testkit::unique("status"));
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(2)).await?;
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &brokers).create()?;
    for (topic, partition, n) in [(&topics.events, 0, 5), (&topics.events, 1, 3), (&topics.commands, 0, 2)] {
        for i in 0..n {
            let payload = format!("r{i}");
            producer.send(BaseRecord::to(topic).partition(partition).key("k").payload(&payload)).map_err(|(e, _)| e)?;
        }
    }
    producer.flush(Duration::from_secs(30))?;

    let prefix = herald_testkit::unique("herald");
    let commit = |group: &str, offsets: &[(i32, i64)]| -> anyhow::Result<()> {
        let consumer: BaseConsumer =
            ClientConfig::new().set("bootstrap.servers", &brokers).set("group.id", format!("{prefix}.{group}")).create()?;
        let mut tpl = TopicPartitionList::new();
        for (partition, offset) in offsets {
            tpl.add_partition_offset(&topics.events, *partition, Offset::Offset(*offset))?;
        }
        consumer.commit(&tpl, CommitMode::Sync)?;
        Ok(())
    };
    commit("search", &[(0, 2), (1, 3)])?;
    commit("notify", &[(0, 5)])?;

    let probe = KafkaProbe::new(&KafkaConfig::new(&brokers), &topics, &prefix, &SUBSCRIPTIONS, Duration::from_secs(30))?;
    let kafka = probe.collect().await?;
    assert_eq!(kafka.end_offsets, [(topics.commands.clone(), 2), (topics.events.clone(), 8)].into());
    let lags: Vec<(&str, &str, i64)> = kafka.groups.iter().map(|g| (g.subscription.as_str(), g.group.as_str(), g.lag)).collect();
    let (search, stats, notify) = (format!("{prefix}.search"), format!("{prefix}.stats"), format!("{prefix}.notify"));
    assert_eq!(lags, [("search", search.as_str(), 3), ("stats", stats.as_str(), 8), ("notify", notify.as_str(), 3)]);

    // Folded into the status next to the database's figures.
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let status = herald_status::collect(&db, Some(&probe), &SUBSCRIPTIONS).await?;
    assert_eq!(status.subscriptions.iter().map(|s| s.lag).collect::<Vec<_>>(), [Some(3), Some(8), Some(3)]);
    assert_eq!((status.kafka_error.as_deref(), status.records_appended()), (None, Some(10)));
    Ok(())
}

/// A broker that does not answer costs the lag, not the database figures.
#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_broker_leaves_lag_unknown_and_says_why() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    seed(&db).await?;
    let probe = KafkaProbe::new(&KafkaConfig::new("127.0.0.1:1"), &Topics::default(), "herald", &SUBSCRIPTIONS, Duration::from_secs(1))?;
    let status = herald_status::collect(&db, Some(&probe), &SUBSCRIPTIONS).await?;
    assert!(status.kafka.is_none() && status.subscriptions.iter().all(|s| s.lag.is_none()));
    assert!(status.kafka_error.as_deref().is_some_and(|e| e.starts_with("kafka")), "{:?}", status.kafka_error);
    assert_eq!(status.jobs.by_status.get("succeeded"), Some(&10));
    Ok(())
}

/// The probe's figures once every partition of Herald's topics has a leader:
/// a topic just created may briefly be unknown to a broker or leaderless.
async fn settled_topics(probe: &KafkaProbe) -> anyhow::Result<Vec<TopicDurability>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let last = probe.collect().await;
        match &last {
            Ok(k) if k.topics.iter().all(|t| t.partitions > 0 && t.leaderless_partitions == 0 && t.under_replicated_partitions == 0) => {
                return Ok(k.topics.clone());
            }
            _ if std::time::Instant::now() > deadline => anyhow::bail!("topics never settled: {last:?}"),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

async fn probe_of(settings: TopicSettings) -> anyhow::Result<(Topics, KafkaProbe)> {
    let brokers = herald_testkit::real_broker()?;
    let topics = Topics::with_prefix(&herald_testkit::unique("durability"));
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), settings).await?;
    let probe =
        KafkaProbe::new(&KafkaConfig::new(&brokers), &topics, &herald_testkit::unique("herald"), &SUBSCRIPTIONS, Duration::from_secs(30))?;
    Ok((topics, probe))
}

/// Three replicas, two in sync, clean elections: each topic shows its
/// settings as the real cluster reports them, and no risk.
#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_two_in_sync_show_no_durability_risk() -> anyhow::Result<()> {
    let (topics, probe) = probe_of(TopicSettings { partitions: 2, replication_factor: Some(3), min_insync_replicas: Some(2) }).await?;
    let figures = settled_topics(&probe).await?;
    assert_eq!(figures.iter().map(|t| t.topic.as_str()).collect::<Vec<_>>(), topics.all());
    for t in &figures {
        assert_eq!((t.partitions, t.replication_factor, t.min_insync_replicas), (2, Some(3), Some(2)), "{t:?}");
        assert_eq!((t.unclean_leader_election_enable, t.settings_error.as_deref()), (Some(false), None), "{t:?}");
        assert!(t.retention_ms.is_some_and(|ms| ms == -1 || ms > 0), "{t:?}");
        assert!(t.risks.is_empty(), "{t:?}");
    }
    Ok(())
}

/// One replica: flagged with both reasons in the figures, the table and
/// `/metrics` (through the monitor, as `herald serve` runs it).
#[tokio::test(flavor = "multi_thread")]
async fn one_replica_is_flagged_with_its_reasons() -> anyhow::Result<()> {
    let (topics, probe) = probe_of(TopicSettings { partitions: 1, replication_factor: Some(1), min_insync_replicas: Some(1) }).await?;
    let figures = settled_topics(&probe).await?;
    for t in &figures {
        assert_eq!((t.replication_factor, t.min_insync_replicas), (Some(1), Some(1)), "{t:?}");
        let reasons: Vec<(&str, &str)> = t.risks.iter().map(|r| (r.setting.as_str(), r.reason.as_str())).collect();
        assert_eq!(
            reasons,
            [
                ("replication.factor", "a broker's disk loss can lose acknowledged events"),
                ("min.insync.replicas", "an acks=all write is acknowledged by one replica")
            ]
        );
    }

    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let status = herald_status::collect(&db, Some(&probe), &SUBSCRIPTIONS).await?;
    let table = herald_status::text::render(&status);
    let flag = format!("!! {}: replication.factor 1: a broker's disk loss can lose acknowledged events", topics.events);
    assert!(table.contains(&flag), "missing `{flag}`:\n{table}");

    let monitor = Monitor::new(db, Some(probe), MonitorConfig::new(&SUBSCRIPTIONS))?;
    monitor.refresh().await?;
    let metrics = monitor.prometheus();
    for line in [
        format!("herald_topic_replication_factor{{topic=\"{}\"}} 1", topics.events),
        format!("herald_topic_durability_risks{{topic=\"{}\"}} 2", topics.commands),
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing `{line}`:\n{metrics}");
    }
    Ok(())
}

/// The embedded mock cluster has no DescribeConfigs: the settings are
/// unknown and say why; replication and lag still stand.
#[tokio::test(flavor = "multi_thread")]
async fn the_mock_cluster_leaves_settings_unknown_not_the_status() -> anyhow::Result<()> {
    let topics = Topics::default();
    let kafka = herald_kafka::EmbeddedKafka::start(3, &topics.all(), 2)?;
    let probe = KafkaProbe::new(&KafkaConfig::new(kafka.bootstrap_servers()), &topics, "herald", &SUBSCRIPTIONS, Duration::from_secs(10))?;
    let started = std::time::Instant::now();
    let figures = probe.collect().await?;
    // Refused at once, not waited out: the monitor refreshes every second.
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    assert_eq!(figures.groups.len(), 3);
    for t in &figures.topics {
        assert_eq!((t.partitions, t.replication_factor, t.min_insync_replicas), (2, Some(3), None), "{t:?}");
        assert!(t.settings_error.as_deref().is_some_and(|e| e.contains("not supported")) && t.risks.is_empty(), "{t:?}");
    }
    assert_eq!(figures.topics.len(), 2);
    Ok(())
}
