//! `herald inbox cleanup` keeps the inbox rows a redelivery still needs: a
//! retention below the events topic's retention (read from the broker) plus
//! the redrive window is refused with exit 2, naming both and `--force`, and
//! removes nothing; at or above the floor, or forced, it removes the rows.

use std::process::{Command, Output};

use herald_kafka::Topics;
use herald_store::{Db, inbox};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

const DAY_MS: i64 = 86_400_000;

fn cleanup(database: &str, brokers: Option<&str>, prefix: &str, extra: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
    command
        .args(["inbox", "cleanup", "--database", database, "--topic-prefix", prefix])
        .args(extra)
        .env("HERALD_LOG", "warn")
        .env_remove("HERALD_KAFKA_BROKERS");
    if let Some(brokers) = brokers {
        command.args(["--kafka", brokers]);
    }
    command.output().expect("run herald")
}

/// The events topic of `prefix`, created with `retention_ms`.
async fn events_topic(brokers: &str, prefix: &str, retention_ms: &str) -> anyhow::Result<String> {
    let topic = Topics::with_prefix(prefix).events;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new().set("bootstrap.servers", brokers).create()?;
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(3)).set("retention.ms", retention_ms);
    for result in admin.create_topics([&new], &AdminOptions::new()).await? {
        result.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    Ok(topic)
}

/// An inbox row of `search` processed `age_days` ago.
async fn row(db: &Db, id: &str, age_days: i64) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
         VALUES ('search', '/herald/exports', $1, 'export.completed', 't', 0, 0, $2)",
    )
    .bind(id)
    .bind(herald_store::now_ms() - age_days * DAY_MS)
    .execute(db.pool())
    .await?;
    Ok(())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retention_below_the_topics_plus_the_redrive_window_is_refused_unless_forced() -> anyhow::Result<()> {
    let brokers = herald_testkit::real_broker()?;
    let prefix = herald_testkit::unique("inbox-floor");
    let topic = events_topic(&brokers, &prefix, &DAY_MS.to_string()).await?;
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    row(&db, "old", 20).await?;
    row(&db, "week-old", 5).await?;

    // One day of topic retention + the default 7-day window = 8 days.
    let refused = cleanup(&test_db.url, Some(&brokers), &prefix, &["--older-than-days", "6"]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    for part in [topic.as_str(), "1 day(s)", "8 day(s)", "--force"] {
        assert!(stderr(&refused).contains(part), "{part} in {}", stderr(&refused));
    }
    assert_eq!(inbox::count(&db, "search").await?, 2, "a refusal removes nothing");

    let narrow_window = cleanup(&test_db.url, Some(&brokers), &prefix, &["--older-than-days", "6", "--redrive-window-days", "2"]);
    assert!(narrow_window.status.success(), "1 + 2 days ≤ 6: {}", stderr(&narrow_window));
    assert_eq!(inbox::count(&db, "search").await?, 1, "the 20-day-old row went, the 5-day-old one stayed");

    let forced = cleanup(&test_db.url, Some(&brokers), &prefix, &["--older-than-days", "1", "--force"]);
    assert!(forced.status.success(), "{}", stderr(&forced));
    assert_eq!(inbox::count(&db, "search").await?, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_topic_kept_for_ever_or_an_unreadable_retention_refuses_any_age() -> anyhow::Result<()> {
    let brokers = herald_testkit::real_broker()?;
    let prefix = herald_testkit::unique("inbox-forever");
    events_topic(&brokers, &prefix, "-1").await?;
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    row(&db, "ancient", 5000).await?;

    let for_ever = cleanup(&test_db.url, Some(&brokers), &prefix, &["--older-than-days", "4000"]);
    assert_eq!(for_ever.status.code(), Some(2), "{}", stderr(&for_ever));
    assert!(stderr(&for_ever).contains("for ever"), "{}", stderr(&for_ever));

    let no_kafka = cleanup(&test_db.url, None, &prefix, &["--older-than-days", "4000"]);
    assert_eq!(no_kafka.status.code(), Some(2), "{}", stderr(&no_kafka));
    assert!(stderr(&no_kafka).contains("--kafka") && stderr(&no_kafka).contains("--force"), "{}", stderr(&no_kafka));

    let missing_topic = cleanup(&test_db.url, Some(&brokers), &herald_testkit::unique("no-such"), &["--older-than-days", "4000"]);
    assert_eq!(missing_topic.status.code(), Some(2), "{}", stderr(&missing_topic));
    assert_eq!(inbox::count(&db, "search").await?, 1, "nothing removed by a refusal");
    Ok(())
}
