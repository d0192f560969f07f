//! A real `herald worker` process is SIGKILLed in the middle of an attempt
//! (after writing its candidate, before completing). Its lease expires, the
//! recovery scanner takes the job over, and another worker completes it —
//! exactly once, with exactly one completion event; the dead attempt's
//! candidate is left an orphan. Kafka is the in-process mock cluster of this
//! test process, which the child reaches over loopback.

use std::process::Stdio;
use std::time::{Duration, Instant};

use herald::pipeline::{self, RoleOptions, Roles, Wiring};
use herald_api::Tokens;
use herald_export::artifact::ArtifactStore;
use herald_export::{ExportRequest, Format, IntakeConfig, LeasePolicy, jobs};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::Db;
use herald_testkit::{TestDb, unique};
use sqlx::Row;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const LEASE_MS: u64 = 1_000;

async fn crash_and_takeover(test_db: TestDb) -> anyhow::Result<()> {
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let topic_prefix = unique("crash");
    let topics = Topics::with_prefix(&topic_prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), 2)?;
    let group_prefix = unique("herald");
    let artifacts = tempfile::tempdir()?;

    let request = ExportRequest { format: Format::Csv, query: "crash me".into() };
    let job_id = jobs::submit(&db, &IntakeConfig::new(topics.clone()), "alice", "k1", &request).await?.job().job_id.clone();
    // A relay in this process publishes the command for the child to take.
    let wiring = Wiring {
        db: db.clone(),
        kafka: KafkaConfig::new(kafka.bootstrap_servers()),
        topics: topics.clone(),
        group_prefix: group_prefix.clone(),
        artifacts: artifacts.path().display().to_string(),
        tokens: Tokens::single("t", "alice"),
    };
    let relay = pipeline::start_roles(
        wiring.clone(),
        Roles { api: None, relay: true, worker: false, subscriptions: false, dispatcher: false },
        RoleOptions::default(),
    )
    .await?;

    let mut child = Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["worker", "--lease-ms", &LEASE_MS.to_string(), "--scan-interval-ms", "3600000"])
        .env("HERALD_DATABASE_URL", &test_db.url)
        .env("HERALD_KAFKA_BROKERS", kafka.bootstrap_servers())
        .env("HERALD_TOPIC_PREFIX", &topic_prefix)
        .env("HERALD_GROUP_PREFIX", &group_prefix)
        .env("HERALD_ARTIFACTS", artifacts.path())
        .env("HERALD_FAULT", "hang:artifact-written")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let hung = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            if line.starts_with("herald-fault: hang at artifact-written") {
                return anyhow::Ok(line);
            }
        }
        anyhow::bail!("worker exited before reaching the fault point")
    })
    .await??;
    assert!(hung.contains(&format!("job={job_id} generation=1")), "{hung}");
    child.start_kill()?; // SIGKILL: no drain, no lease release, no offset commit.
    child.wait().await?;

    let store = ArtifactStore::local(artifacts.path())?;
    let candidate = format!("exports/{job_id}/g1.csv");
    assert!(store.exists(&candidate).await?, "the killed attempt had written its candidate");
    let before = jobs::get_any(&db, &job_id).await?.expect("job");
    assert_eq!((before.status.as_str(), before.generation), ("running", 1), "the killed attempt still holds the job");

    // Recovery: scanner + worker in this process, same consumer group.
    let options = RoleOptions {
        policy: LeasePolicy { lease: Duration::from_millis(LEASE_MS), ..LeasePolicy::default() },
        scan_interval: Duration::from_millis(100),
        ..RoleOptions::default()
    };
    let recovery =
        pipeline::start_roles(wiring, Roles { api: None, relay: false, worker: true, subscriptions: false, dispatcher: false }, options)
            .await?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let job = loop {
        let job = jobs::get_any(&db, &job_id).await?.expect("job");
        if job.status == "succeeded" {
            break job;
        }
        anyhow::ensure!(Instant::now() < deadline, "job never completed after the crash: {job:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    recovery.stop().await?;
    relay.stop().await?;

    let completions: i64 = sqlx::query("SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.completed' AND subject = $1")
        .bind(&job_id)
        .fetch_one(db.pool())
        .await?
        .try_get("n")?;
    assert_eq!(completions, 1, "exactly one completion event");
    assert!(job.generation >= 3, "taken over (gen 2) and restarted (gen 3): {job:?}");
    assert_ne!(job.result_id.as_deref(), Some(candidate.as_str()), "the dead attempt's candidate was not selected");
    assert!(store.exists(&candidate).await?, "its candidate is an orphan until cleanup's grace period");
    assert!(store.exists(job.result_id.as_deref().expect("result")).await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_worker_is_taken_over_postgres() -> anyhow::Result<()> {
    crash_and_takeover(herald_testkit::postgres_db().await?).await
}

#[tokio::test(flavor = "multi_thread")]
async fn killed_worker_is_taken_over_sqlite() -> anyhow::Result<()> {
    crash_and_takeover(herald_testkit::sqlite_db()?).await
}
