//! `herald status` as an operator runs it: the table, `--json`, lag and
//! topic durability from the real broker, and a usage error.

use herald_kafka::KafkaConfig;
use std::process::{Command, Output};

use herald_store::Db;

fn herald(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env("HERALD_LOG", "warn")
        .env_remove("HERALD_DATABASE_URL")
        .env_remove("HERALD_KAFKA_BROKERS")
        .output()
        .expect("run herald")
}

async fn seed(db: &Db) -> anyhow::Result<()> {
    let now = herald_store::now_ms();
    for (id, status) in [("j1", "succeeded"), ("j2", "pending")] {
        sqlx::query("INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms, completed_at_ms) VALUES ($1, 'alice', 'csv', 'q', $2, 1, $3, $4, $4)")
            .bind(id)
            .bind(status)
            .bind(now - 3_000)
            .bind(now - 1_000)
            .execute(db.pool())
            .await?;
    }
    for (key, status) in [("n1", "sent"), ("n2", "unknown"), ("n3", "unknown")] {
        sqlx::query(
            "INSERT INTO notification_intents (idempotency_key, source, event_id, recipient, kind, job_id, body, status, created_at_ms, updated_at_ms) \
             VALUES ($1, '/t', $1, 'r', 'export.completed', 'j1', '{}', $2, 0, 0)",
        )
        .bind(key)
        .bind(status)
        .execute(db.pool())
        .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn status_prints_a_table_and_one_json_object() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    seed(&db).await?;
    db.close().await;
    let url = test_db.url.as_str();

    let out = herald(&["status", "--json", "--database", url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout)?;
    assert_eq!(stdout.trim().lines().count(), 1, "one object: {stdout}");
    let status: serde_json::Value = serde_json::from_str(&stdout)?;
    assert_eq!(status["jobs"]["by_status"]["succeeded"], 1);
    assert_eq!(status["jobs"]["open"], 1);
    assert_eq!(status["jobs"]["latency"]["p50_ms"], 2_000);
    assert_eq!(status["notifications"]["unknown"], 2);
    assert_eq!(status["relay"]["slices"], 16);
    assert_eq!(status["subscriptions"].as_array().map(Vec::len), Some(3));
    assert!(status["kafka_error"].as_str().is_some_and(|e| e.contains("--kafka")), "says why lag is missing: {status}");

    let out = herald(&["status", "--database", url]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout)?;
    let unknown = table.lines().find(|l| l.trim_start().starts_with("unknown")).unwrap_or_default();
    assert!(
        unknown.contains('2') && unknown.contains("!!") && unknown.contains("herald notify reconcile"),
        "unknown highlighted:\n{table}"
    );
    for section in ["OUTBOX", "RELAY CLAIMS", "SUBSCRIPTIONS", "TOPICS", "NOTIFICATION INTENTS", "EXPORT JOBS", "PROJECTION GENERATIONS"] {
        assert!(table.contains(section), "{section} missing:\n{table}");
    }
    assert!(table.contains("p50 2.0s"), "latency shown:\n{table}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn status_measures_lag_on_the_real_broker() -> anyhow::Result<()> {
    let brokers = herald_testkit::real_broker()?;
    let prefix = herald_testkit::unique("status-cli");
    let topics = herald_kafka::Topics::with_prefix(&prefix);
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(2)).await?;
    let test_db = herald_testkit::postgres_db().await?;
    Db::connect_and_migrate(&test_db.url).await?.close().await;

    let out = herald(&[
        "status",
        "--json",
        "--database",
        &test_db.url,
        "--kafka",
        &brokers,
        "--topic-prefix",
        &prefix,
        "--group-prefix",
        &prefix,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(status["backend"], "postgres");
    assert!(status["kafka_error"].is_null(), "{status}");
    for sub in status["subscriptions"].as_array().cloned().unwrap_or_default() {
        assert_eq!(sub["lag"], 0, "{sub}");
        assert_eq!(sub["group"], format!("{prefix}.{}", sub["name"].as_str().unwrap_or_default()));
    }
    assert_eq!(status["kafka"]["end_offsets"][&topics.events], 0);
    // Created with the cluster's defaults for three brokers: 3 replicas, 2 in sync.
    let durability = status["kafka"]["topics"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        durability.iter().map(|t| t["topic"].clone()).collect::<Vec<_>>(),
        [topics.commands.as_str(), topics.events.as_str()],
        "{status}"
    );
    for t in &durability {
        assert_eq!(
            (&t["replication_factor"], &t["min_insync_replicas"], &t["unclean_leader_election_enable"]),
            (&3.into(), &2.into(), &false.into()),
            "{t}"
        );
        assert_eq!(t["risks"], serde_json::json!([]), "{t}");
    }
    Ok(())
}

#[test]
fn status_without_a_database_is_a_usage_error() {
    let out = herald(&["status"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database"));
}
