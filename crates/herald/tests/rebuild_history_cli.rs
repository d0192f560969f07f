//! History completeness with real processes: retention removes the first
//! records of a partition the active search generation was built from;
//! `herald rebuild search` refuses (exit 2) naming the gap; a snapshot taken
//! with `herald snapshot search` covers it and the rebuild from it ends with
//! generation 2 equal to generation 1; an altered snapshot is refused.
//!
//! Runs on the shared Apache Kafka cluster. Retention is played by
//! DeleteRecords, which moves a partition's log start exactly as time or
//! size retention does, at a moment the test chooses.

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use herald::bench::workload;
use herald::pipeline::{self, RoleOptions, Roles, Wiring};
use herald_api::Tokens;
use herald_kafka::KafkaConfig;
use herald_kafka::Topics;
use herald_kafka::offsets::{self, PartitionState};
use herald_projections::search;
use herald_rebuild::verify;
use herald_store::Db;
use herald_testkit::unique;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use sqlx::Row;
use tokio::process::Command;

const PARTITIONS: i32 = 2;

async fn wait_until<F, Fut>(what: &str, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    while !done().await? {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Deletes every record of `topic`/`partition` below its high watermark,
/// as retention would; returns the new earliest retained offset.
async fn truncate(brokers: &str, topic: &str, partition: i32) -> anyhow::Result<i64> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let mut below = TopicPartitionList::new();
    below.add_partition_offset(topic, partition, Offset::End)?;
    let result = admin.delete_records(&below, &AdminOptions::new()).await?;
    let entry = result.find_partition(topic, partition).context("DeleteRecords answered nothing for the partition")?;
    entry.error()?;
    entry.offset().to_raw().context("DeleteRecords answered no log start")
}

fn text(output: &Output) -> String {
    format!("stdout: {}\nstderr: {}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn truncated_history_is_refused_and_a_snapshot_covers_it() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let prefix = unique("hist");
    let topics = Topics::with_prefix(&prefix);
    let brokers = herald_testkit::real_broker()?;
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(PARTITIONS)).await?;
    let wiring = Wiring {
        db: db.clone(),
        kafka: KafkaConfig::new(brokers.as_str()),
        topics: topics.clone(),
        group_prefix: unique("herald"),
        artifacts: tempfile::tempdir()?.path().display().to_string(),
        tokens: Tokens::single("t", "alice"),
    };
    let roles = Roles { api: None, relay: false, worker: false, subscriptions: true, dispatcher: false };
    let running = pipeline::start_roles(wiring.clone(), roles, RoleOptions::default()).await?;
    let live_group = format!("{}.search", wiring.group_prefix);
    let producer = workload::producer(&KafkaConfig::new(&brokers))?;
    let run = unique("run");
    let all = workload::completions(&topics.events, &run, 25)?;
    workload::publish(&producer, &all[..20]).await?;
    wait_until("20 documents", || async { Ok(search::count_active(&db).await? == 20) }).await?;
    let recorded: i64 =
        sqlx::query("SELECT COUNT(*) AS n FROM projection_history WHERE projection = 'search' AND generation = 1 AND first_offset = 0")
            .fetch_one(db.pool())
            .await?
            .try_get("n")?;
    assert_eq!(recorded, i64::from(PARTITIONS), "the live group's first start is recorded per partition");

    let truncated_to = truncate(&brokers, &topics.events, 0).await?;
    let states = offsets::partition_states(&KafkaConfig::new(&brokers), &live_group, &topics.events).await?;
    let low = states[0].low;
    assert!(low > 0 && low == truncated_to && states[1].low == 0, "retention dropped the start of partition 0 only: {states:?}");
    let caught_up = |s: &[PartitionState]| s.iter().all(|p| p.committed == Some(p.high));
    wait_until("the live group to commit its position", || async {
        Ok(caught_up(&offsets::partition_states(&KafkaConfig::new(&brokers), &live_group, &topics.events).await?))
    })
    .await?;

    let herald = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        command
            .args(args)
            .args(["--database", &test_db.url, "--kafka", &brokers, "--topic-prefix", &prefix, "--group-prefix", &wiring.group_prefix])
            .env("HERALD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    };
    let generations = || async {
        Ok::<i64, anyhow::Error>(
            sqlx::query("SELECT COUNT(*) AS n FROM projection_generations WHERE projection = 'search'")
                .fetch_one(db.pool())
                .await?
                .try_get("n")?,
        )
    };

    // 1. No snapshot: refused, naming the gap; nothing created.
    let refused = herald(&["rebuild", "search"]).output().await?;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    let gap = format!("{} partition 0: needs offset 0, earliest retained is {low}", topics.events);
    assert!(stderr.contains("history incomplete") && stderr.contains(&gap) && stderr.contains("--from-snapshot"), "{stderr}");
    assert!(!stderr.contains("partition 1:"), "partition 1 is complete: {stderr}");
    assert_eq!(generations().await?, 1);

    // 2. A snapshot now, then more live traffic after it.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("search.snapshot");
    let taken = herald(&["snapshot", "search", "--out", &file.display().to_string()]).output().await?;
    assert!(taken.status.success(), "{}", text(&taken));
    workload::publish(&producer, &all[20..]).await?;
    wait_until("25 documents", || async { Ok(search::count_active(&db).await? == 25) }).await?;

    // 3. An altered snapshot is refused.
    let original = std::fs::read_to_string(&file)?;
    let altered_file = dir.path().join("altered.snapshot");
    std::fs::write(&altered_file, original.replacen("bench export", "bench exporT", 1))?;
    let altered = herald(&["rebuild", "search", "--from-snapshot", &altered_file.display().to_string()]).output().await?;
    assert_eq!(altered.status.code(), Some(2), "{}", text(&altered));
    assert!(String::from_utf8_lossy(&altered.stderr).contains("checksum mismatch"), "{}", text(&altered));
    assert_eq!(generations().await?, 1);

    // 4. From the snapshot: documents loaded, the rest replayed, verified, switched.
    let rebuilt = herald(&["rebuild", "search", "--from-snapshot", &file.display().to_string()]).output().await?;
    assert!(rebuilt.status.success(), "{}", text(&rebuilt));
    let stdout = String::from_utf8_lossy(&rebuilt.stdout);
    let report: Value = serde_json::from_str(stdout.lines().rev().find(|l| l.starts_with('{')).expect("report"))?;
    assert_eq!((report["generation"].as_i64(), report["state"].as_str()), (Some(2), Some("active")), "{report}");
    assert_eq!(report["replayed"], 5, "only what came after the snapshot is replayed: {report}");
    let (one, two) = verify::fingerprints(&db, &herald_rebuild::Search, 1, 2).await?;
    assert_eq!(one, two);
    assert_eq!(two.rows, 25);
    let starts: Vec<(i32, i64)> = sqlx::query_as("SELECT kafka_partition, first_offset FROM projection_history WHERE projection = 'search' AND generation = 2 ORDER BY kafka_partition")
        .fetch_all(db.pool())
        .await?;
    assert!(starts[0].1 >= low, "generation 2 needs history only from the snapshot on: {starts:?}");

    // History is complete again for the new active generation.
    let plan = herald(&["rebuild", "search", "--dry-run"]).output().await?;
    assert!(plan.status.success(), "{}", text(&plan));
    running.stop().await
}
