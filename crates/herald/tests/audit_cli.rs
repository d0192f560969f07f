//! `herald audit` as a user runs it, after a real pipeline run: clean data
//! audits clean (exit 0); each tamper the issue names makes it exit 1 and name
//! the violation and the row; bad input exits 2.
//!
//! The tampers, and why the audit must see each:
//! - a search document deleted: the active generation no longer equals the
//!   succeeded jobs (`missing_document`, naming the job);
//! - a second inbox row for one completion in `stats`, written under the
//!   legacy alias `urn:herald:exports` of the canonical source. The primary
//!   key (subscription, source, id) allows it, and it is exactly what a
//!   consumer would leave behind if it claimed a re-enveloped fact as new and
//!   applied its effect twice — consumers map aliases before their inbox
//!   check, so the audit does too and counts two rows for one fact
//!   (`duplicate_inbox_row`, naming the event);
//! - a delivered completion's outbox row deleted: Kafka holds a record the
//!   database no longer has (`no_outbox_row`, naming the id) and the job has
//!   lost its completion event (`missing_completion`).

mod audit_support;

use std::process::Command;

use audit_support::{CHECKS, Pipeline, Ran, all_ran, failing, named, one};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::Db;
use herald_testkit::unique;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

const EXPORTS: i64 = 12;

/// Runs the whole pipeline until every export is searchable, counted and
/// notified, then stops it.
async fn run_pipeline(
    url: &str,
    brokers: &str,
    topics: &Topics,
    artifacts: &str,
    ledger: &str,
) -> anyhow::Result<(Db, String, CancellationToken)> {
    let pipeline = Pipeline::start(url, brokers, topics, artifacts, ledger).await?;
    let queries: Vec<String> = (0..EXPORTS).map(|i| format!("audit {i}")).collect();
    let settled = async {
        pipeline.submit(&queries).await?;
        let each = [
            ("SELECT COUNT(*) FROM search_documents", EXPORTS),
            ("SELECT COUNT(*) FROM notification_intents WHERE status = 'sent'", EXPORTS),
            ("SELECT COUNT(*) FROM inbox WHERE subscription = 'stats'", EXPORTS),
        ];
        pipeline.settle(&each).await
    }
    .await;
    let stopped = pipeline.stop().await?;
    settled?;
    Ok(stopped)
}

async fn audit_then_tamper(url: &str, brokers: &str, topics: &Topics, prefix: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let artifacts = dir.path().join("artifacts").display().to_string();
    let ledger = dir.path().join("ledger.sqlite").display().to_string();
    let (db, provider, sim_stop) = run_pipeline(url, brokers, topics, &artifacts, &ledger).await?;
    let ran = Ran { url: url.to_owned(), brokers: brokers.to_owned(), prefix: prefix.to_owned(), artifacts, provider };

    let (code, report) = ran.audit()?;
    assert_eq!(code, Some(0), "a clean run audits clean: {report:#}");
    assert_eq!(report["violations"], 0);
    assert_eq!(report["checks"].as_array().map(Vec::len), Some(CHECKS.len()));
    all_ran(&report, &CHECKS)?;

    // 1. A search document disappears.
    let doc_job = one(&db, "SELECT MIN(job_id) FROM search_documents").await?;
    sqlx::query("DELETE FROM search_documents WHERE job_id = $1").bind(&doc_job).execute(db.pool()).await?;
    let (code, report) = ran.audit()?;
    assert_eq!(code, Some(1));
    assert!(named(&report, "search_matches_jobs", "missing_document", &doc_job), "{report:#}");
    assert_eq!(report["violations"], 1, "{report:#}");
    assert_eq!(failing(&report), ["search_matches_jobs"]);

    // 2. One completion has two stats inbox rows (the second under a legacy alias).
    let dup_event = one(&db, "SELECT MAX(event_id) FROM inbox WHERE subscription = 'stats'").await?;
    sqlx::query(
        "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
         SELECT subscription, 'urn:herald:exports', event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms \
         FROM inbox WHERE subscription = 'stats' AND event_id = $1",
    )
    .bind(&dup_event)
    .execute(db.pool())
    .await?;
    let (code, report) = ran.audit()?;
    assert_eq!(code, Some(1));
    assert!(named(&report, "inbox_once", "duplicate_inbox_row", &dup_event), "{report:#}");
    assert_eq!(report["violations"], 2, "{report:#}");
    assert_eq!(failing(&report), ["inbox_once", "search_matches_jobs"], "the alias row is one fact to the stats check");

    // 3. A delivered completion's outbox row is deleted.
    let (lost_event, lost_job): (String, String) = {
        let sql = format!(
            "SELECT o.event_id, o.subject FROM {} WHERE o.event_type = 'herald.export.completed' AND {} = 'delivered' \
             AND o.subject <> $1 ORDER BY o.seq LIMIT 1",
            herald_store::delivered::FROM_OUTBOX,
            herald_store::delivered::status_sql(db.backend())
        );
        let row = sqlx::query(&sql).bind(&doc_job).fetch_one(db.pool()).await?;
        (row.try_get("event_id")?, row.try_get("subject")?)
    };
    sqlx::query("DELETE FROM outbox WHERE event_id = $1").bind(&lost_event).execute(db.pool()).await?;
    let (code, report) = ran.audit()?;
    assert_eq!(code, Some(1));
    assert!(named(&report, "outbox_in_kafka", "no_outbox_row", &lost_event), "{report:#}");
    assert!(named(&report, "job_completion", "missing_completion", &lost_job), "{report:#}");
    sim_stop.cancel();
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_is_clean_then_names_each_tamper_postgres_real_broker() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let brokers = herald_testkit::real_broker()?;
    let prefix = unique("audit");
    let topics = Topics::with_prefix(&prefix);
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(3)).await?;
    audit_then_tamper(&test_db.url, &brokers, &topics, &prefix).await
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_is_clean_then_names_each_tamper_sqlite_mock_cluster() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let prefix = unique("audit");
    let topics = Topics::with_prefix(&prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), 3)?;
    audit_then_tamper(&test_db.url, kafka.bootstrap_servers(), &topics, &prefix).await
}

#[test]
fn audit_without_sources_or_with_unreachable_ones_exits_2() {
    let cases: [&[&str]; 3] = [
        &["audit"],
        &["audit", "--database", "sqlite:///nonexistent/dir/x.db", "--kafka", "127.0.0.1:1"],
        &["audit", "--database", "sqlite::memory:", "--kafka", "127.0.0.1:1", "--kafka-timeout", "soon"],
    ];
    for args in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(args)
            .env_remove("HERALD_DATABASE_URL")
            .env_remove("HERALD_KAFKA_BROKERS")
            .output()
            .expect("run herald audit");
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stderr).contains("error"), "{args:?} explains itself");
    }
}
