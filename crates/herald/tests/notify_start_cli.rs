//! `herald consume notify` as a real process on a topic that already holds
//! history and a group that has no committed offset: refused (exit 2, a
//! message naming the group, partitions and `--start-at`); `--start-at
//! latest` notifies nothing of the history and everything appended after;
//! `--start-at <time>` starts at the first record at or after that time.
//! The last one runs on Apache Kafka: librdkafka's mock cluster does not
//! implement offset lookup by time.

use std::process::Stdio;
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, TimeZone, Utc};
use cloudevents::binding::rdkafka::FutureRecordExt;
use herald::bench::workload;
use herald_envelope::OutboxEvent;
use herald_kafka::KafkaConfig;
use herald_kafka::offsets;
use herald_kafka::{EmbeddedKafka, Topics};
use herald_store::{Db, inbox};
use herald_testkit::TestDb;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

const PARTITIONS: i32 = 3;

struct Bed {
    db: Db,
    url: String,
    brokers: String,
    topics: Topics,
    prefix: String,
    group_prefix: String,
    producer: FutureProducer,
    run: String,
    _kafka: Option<EmbeddedKafka>,
    _test_db: TestDb,
}

async fn bed(real_broker: bool) -> anyhow::Result<Bed> {
    let test_db = herald_testkit::postgres_db().await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let prefix = herald_testkit::unique("t");
    let topics = Topics::with_prefix(&prefix);
    let (brokers, kafka) = if real_broker {
        let brokers = herald_testkit::real_broker()?;
        herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(PARTITIONS))
            .await?;
        (brokers, None)
    } else {
        let kafka = EmbeddedKafka::start(1, &topics.all(), PARTITIONS)?;
        (kafka.bootstrap_servers().to_owned(), Some(kafka))
    };
    let producer = workload::producer(&KafkaConfig::new(&brokers))?;
    Ok(Bed {
        db,
        url: test_db.url.clone(),
        brokers,
        topics,
        prefix,
        group_prefix: herald_testkit::unique("herald"),
        producer,
        run: herald_testkit::unique("run"),
        _kafka: kafka,
        _test_db: test_db,
    })
}

impl Bed {
    fn consume_notify(&self, extra: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        command
            .args(["consume", "notify", "--database", &self.url, "--kafka", &self.brokers, "--topic-prefix", &self.prefix])
            .args(["--group-prefix", &self.group_prefix])
            .args(extra)
            .env("HERALD_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    fn group(&self) -> String {
        format!("{}.notify", self.group_prefix)
    }

    fn events(&self, from: usize, n: usize) -> anyhow::Result<Vec<OutboxEvent>> {
        Ok(workload::completions(&self.topics.events, &self.run, from + n)?.into_iter().skip(from).collect())
    }

    /// Publishes with an explicit record time (CreateTime).
    async fn publish_at(&self, events: &[OutboxEvent], time_ms: i64) -> anyhow::Result<()> {
        for event in events {
            let message = event.to_kafka_record()?;
            let record = FutureRecord::to(&event.topic).key(event.partition_key.as_str()).message_record(&message).timestamp(time_ms);
            self.producer.send_result(record).map_err(|(e, _)| e)?.await?.map_err(|(e, _)| e)?;
        }
        Ok(())
    }

    /// Waits until the group has a committed offset on every partition: the
    /// process decided where to start.
    async fn wait_positioned(&self) -> anyhow::Result<Vec<offsets::PartitionState>> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let states = offsets::partition_states(&KafkaConfig::new(&self.brokers), &self.group(), &self.topics.events).await?;
            if states.len() == PARTITIONS as usize && states.iter().all(|s| s.committed.is_some()) {
                return Ok(states);
            }
            anyhow::ensure!(Instant::now() < deadline, "the notify group never got a position: {states:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn wait_inbox(&self, n: i64) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while inbox::count(&self.db, "notify").await? < n {
            anyhow::ensure!(Instant::now() < deadline, "notify inbox never reached {n}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Event ids the notify subscription applied.
    async fn applied_ids(&self) -> anyhow::Result<Vec<String>> {
        let rows: Vec<(String,)> =
            sqlx::query_as("SELECT event_id FROM inbox WHERE subscription = 'notify' ORDER BY event_id").fetch_all(self.db.pool()).await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }
}

async fn stop(mut child: Child) -> anyhow::Result<String> {
    let pid = child.id().expect("running").to_string();
    anyhow::ensure!(Command::new("kill").args(["-TERM", &pid]).status().await?.success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await??;
    let mut out = String::new();
    child.stdout.take().expect("stdout").read_to_string(&mut out).await?;
    anyhow::ensure!(status.success(), "herald consume exited with {status}: {out}");
    Ok(out)
}

fn ids(events: &[OutboxEvent]) -> Vec<String> {
    let mut ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread")]
async fn notify_refuses_to_start_from_history() -> anyhow::Result<()> {
    let bed = bed(false).await?;
    workload::publish(&bed.producer, &bed.events(0, 6)?).await?;
    let output = tokio::time::timeout(Duration::from_secs(60), bed.consume_notify(&[]).output()).await??;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refusing to start notifications from history"), "{stderr}");
    assert!(stderr.contains(&bed.group()) && stderr.contains("6 retained record(s)") && stderr.contains("--start-at latest"), "{stderr}");
    assert_eq!(inbox::count(&bed.db, "notify").await?, 0, "nothing was notified");
    let states = offsets::partition_states(&KafkaConfig::new(&bed.brokers), &bed.group(), &bed.topics.events).await?;
    assert!(states.iter().all(|s| s.committed.is_none()), "a refusal leaves the group without a position: {states:?}");

    // `herald serve` starts the notify subscription too: the same refusal,
    // before any role runs.
    let serve = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["serve", "--database", &bed.url, "--kafka", &bed.brokers, "--topic-prefix", &bed.prefix])
            .args(["--group-prefix", &bed.group_prefix, "--listen", "127.0.0.1:0"])
            .env("HERALD_API_TOKENS", "t:alice")
            .env("HERALD_LOG", "warn")
            .output(),
    )
    .await??;
    let stderr = String::from_utf8_lossy(&serve.stderr);
    assert_eq!(serve.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("refusing to start notifications from history") && stderr.contains("--start-at"), "{stderr}");
    assert_eq!(inbox::count(&bed.db, "notify").await?, 0);

    let wrong = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(env!("CARGO_BIN_EXE_herald"))
            .args([
                "consume",
                "search",
                "--database",
                &bed.url,
                "--kafka",
                &bed.brokers,
                "--topic-prefix",
                &bed.prefix,
                "--start-at",
                "latest",
            ])
            .output(),
    )
    .await??;
    assert_eq!(wrong.status.code(), Some(2), "--start-at is for notify only");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn start_at_latest_notifies_nothing_of_history() -> anyhow::Result<()> {
    let bed = bed(false).await?;
    let history = bed.events(0, 6)?;
    workload::publish(&bed.producer, &history).await?;
    let child = bed.consume_notify(&["--start-at", "latest"]).spawn()?;
    let states = bed.wait_positioned().await?;
    assert!(states.iter().all(|s| s.committed == Some(s.high)), "positioned at the end: {states:?}");
    let fresh = bed.events(6, 4)?;
    workload::publish(&bed.producer, &fresh).await?;
    bed.wait_inbox(4).await?;
    let summary = stop(child).await?;
    assert!(summary.contains("\"applied\":4"), "{summary}");
    assert_eq!(bed.applied_ids().await?, ids(&fresh), "only what was appended after the start");

    // Restarted without the flag, the group has a position: it simply resumes.
    let again = bed.consume_notify(&[]).spawn()?;
    let more = bed.events(10, 2)?;
    workload::publish(&bed.producer, &more).await?;
    bed.wait_inbox(6).await?;
    stop(again).await?;
    assert_eq!(inbox::count(&bed.db, "notify").await?, 6);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn start_at_time_starts_there_on_the_real_broker() -> anyhow::Result<()> {
    let bed = bed(true).await?;
    let hour = 3_600_000;
    let t0 = Utc::now().timestamp_millis() - 3 * hour;
    let old = bed.events(0, 5)?;
    // Two recent records over three partitions: at least one partition has
    // none, where the broker must say "nothing that recent" and the
    // partition starts at its end.
    let recent = bed.events(5, 2)?;
    bed.publish_at(&old, t0).await?;
    bed.publish_at(&recent, t0 + 2 * hour).await?;
    let start = Utc.timestamp_millis_opt(t0 + hour).single().expect("time").to_rfc3339_opts(SecondsFormat::Secs, true);
    let child = bed.consume_notify(&["--start-at", &start]).spawn()?;
    bed.wait_positioned().await?;
    bed.wait_inbox(2).await?;
    // Whatever the group was going to read it has read: nothing older hides
    // behind a slow partition.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !offsets::partition_states(&KafkaConfig::new(&bed.brokers), &bed.group(), &bed.topics.events)
        .await?
        .iter()
        .all(|s| s.committed == Some(s.high))
    {
        anyhow::ensure!(Instant::now() < deadline, "the notify group never reached the end of the topic");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop(child).await?;
    assert_eq!(bed.applied_ids().await?, ids(&recent), "started at {start}: the recent records only");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_empty_topic_is_no_history() -> anyhow::Result<()> {
    let bed = bed(false).await?;
    let child = bed.consume_notify(&[]).spawn()?;
    bed.wait_positioned().await?;
    let events = bed.events(0, 3)?;
    workload::publish(&bed.producer, &events).await?;
    bed.wait_inbox(3).await?;
    stop(child).await?;
    assert_eq!(bed.applied_ids().await?, ids(&events));
    Ok(())
}

/// The first start decided (on an empty topic: from the start) and died
/// before committing that to Kafka; records arrived meanwhile. The next
/// start commits the recorded decision and notifies those records, instead
/// of refusing them as history for good. The drill met this window on a
/// fresh Apache Kafka cluster, where the commit waits for the group
/// coordinator to come up.
#[tokio::test(flavor = "multi_thread")]
async fn a_decision_recorded_before_a_crash_is_kept_after_it() -> anyhow::Result<()> {
    let bed = bed(false).await?;
    let positions: Vec<(i32, i64)> = (0..PARTITIONS).map(|p| (p, 0)).collect();
    // What the first process wrote before it died: the decision, not the commit.
    herald_store::start_positions::record(&bed.db, &bed.group(), &bed.topics.events, &positions).await?;
    let states = offsets::partition_states(&KafkaConfig::new(&bed.brokers), &bed.group(), &bed.topics.events).await?;
    assert!(states.iter().all(|s| s.committed.is_none()), "nothing was committed: {states:?}");
    let arrived = bed.events(0, 6)?;
    workload::publish(&bed.producer, &arrived).await?;

    let child = bed.consume_notify(&[]).spawn()?;
    let states = bed.wait_positioned().await?;
    assert!(states.iter().all(|s| s.committed == Some(0) || s.committed == Some(s.high)), "{states:?}");
    bed.wait_inbox(6).await?;
    stop(child).await?;
    assert_eq!(bed.applied_ids().await?, ids(&arrived), "every record appended after the decision is notified");
    Ok(())
}
