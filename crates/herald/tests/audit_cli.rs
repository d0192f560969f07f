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

use std::process::Command;
use std::time::Duration;

use herald::pipeline::{self, Dispatch, Options, Roles, Wiring};
use herald_api::Tokens;
use herald_export::{ExportRequest, Format, IntakeConfig, jobs};
use herald_kafka::{EmbeddedKafka, Topics};
use herald_notify::dispatcher::{AfterResponseHook, DispatcherConfig};
use herald_notify::provider::{Capabilities, ProviderClient};
use herald_notify::sim::{self, FaultSwitches, Ledger, Mode, SimConfig};
use herald_store::Db;
use herald_testkit::unique;
use serde_json::Value;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

const EXPORTS: i64 = 12;

struct Ran {
    url: String,
    brokers: String,
    prefix: String,
    artifacts: String,
    provider: String,
}

impl Ran {
    fn audit(&self) -> anyhow::Result<(Option<i32>, Value)> {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["audit", "--json", "--database", &self.url, "--kafka", &self.brokers, "--topic-prefix", &self.prefix])
            .args(["--artifacts", &self.artifacts, "--notify-url", &self.provider])
            .env_remove("HERALD_DATABASE_URL")
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report = serde_json::from_str(&stdout)
            .map_err(|e| anyhow::anyhow!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))?;
        Ok((out.status.code(), report))
    }
}

fn violations<'a>(report: &'a Value, check: &str) -> Vec<&'a Value> {
    report["checks"].as_array().into_iter().flatten().filter(|c| c["check"] == check).flat_map(|c| c["violations"].as_array().into_iter().flatten()).collect()
}

fn named(report: &Value, check: &str, kind: &str, needle: &str) -> bool {
    violations(report, check).iter().any(|v| v["kind"] == kind && v["detail"].as_str().is_some_and(|d| d.contains(needle)))
}

async fn one(db: &Db, sql: &str) -> anyhow::Result<String> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get(0)?)
}

async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get(0)?)
}

/// Runs the whole pipeline (relay, worker, subscriptions, dispatcher to a
/// keyed simulator) until every export is searchable and notified, stops it.
async fn run_pipeline(url: &str, brokers: &str, topics: &Topics, artifacts: &str, ledger: &str) -> anyhow::Result<(Db, String, CancellationToken)> {
    let db = Db::connect_and_migrate(url).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let provider = format!("http://{}", listener.local_addr()?);
    let sim_stop = CancellationToken::new();
    let config = SimConfig { mode: Mode::Keyed, key_retention: Duration::from_secs(3600) };
    tokio::spawn(sim::serve(listener, Ledger::open(ledger).await?, config, FaultSwitches::default(), sim_stop.clone()));
    let wiring = Wiring {
        db: db.clone(),
        brokers: brokers.to_owned(),
        topics: topics.clone(),
        group_prefix: unique("herald"),
        artifacts: artifacts.to_owned(),
        tokens: Tokens::single("t", "alice"),
    };
    let dispatch = Dispatch {
        client: ProviderClient::new(&provider, Duration::from_secs(5))?,
        config: DispatcherConfig { idle_wait: Duration::from_millis(50), ..DispatcherConfig::new(Capabilities::keyed(Duration::from_secs(3600))) },
        hook: AfterResponseHook::default(),
    };
    let roles = Roles { api: None, relay: true, worker: true, subscriptions: true, dispatcher: true };
    let running = pipeline::start_roles(wiring, roles, Options { dispatch: Some(dispatch), ..Options::default() }).await?;
    let intake = IntakeConfig::new(topics.clone());
    for i in 0..EXPORTS {
        let request = ExportRequest { format: if i % 2 == 0 { Format::Csv } else { Format::Json }, query: format!("audit {i}") };
        jobs::submit(&db, &intake, "alice", &format!("k{i}"), &request).await?;
    }
    let settled = [
        "SELECT COUNT(*) FROM search_documents",
        "SELECT COUNT(*) FROM notification_intents WHERE status = 'sent'",
        "SELECT COUNT(*) FROM inbox WHERE subscription = 'stats'",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut done = count(&db, "SELECT COUNT(*) FROM outbox WHERE status <> 'delivered'").await? == 0;
        for sql in settled {
            done &= count(&db, sql).await? == EXPORTS;
        }
        if done {
            break;
        }
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "pipeline did not settle");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.stop().await?;
    Ok((db, provider, sim_stop))
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
    for check in ["outbox_in_kafka", "key_order", "inbox_once", "search_matches_jobs", "job_completion", "notify_effects"] {
        let c = report["checks"].as_array().and_then(|cs| cs.iter().find(|c| c["check"] == check)).cloned().unwrap_or_default();
        assert!(c["ran"] == true && c["checked"].as_u64().unwrap_or(0) > 0, "{check} looked at something: {c}");
    }

    // 1. A search document disappears.
    let doc_job = one(&db, "SELECT MIN(job_id) FROM search_documents").await?;
    sqlx::query("DELETE FROM search_documents WHERE job_id = $1").bind(&doc_job).execute(db.pool()).await?;
    let (code, report) = ran.audit()?;
    assert_eq!(code, Some(1));
    assert!(named(&report, "search_matches_jobs", "missing_document", &doc_job), "{report:#}");
    assert_eq!(report["violations"], 1, "{report:#}");

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

    // 3. A delivered completion's outbox row is deleted.
    let (lost_event, lost_job): (String, String) = {
        let row = sqlx::query("SELECT event_id, subject FROM outbox WHERE event_type = 'herald.export.completed' AND status = 'delivered' AND subject <> $1 ORDER BY seq LIMIT 1")
            .bind(&doc_job)
            .fetch_one(db.pool())
            .await?;
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
    herald_kafka::ensure_topics(&brokers, &topics.all(), herald_kafka::TopicSettings::partitions(3)).await?;
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
