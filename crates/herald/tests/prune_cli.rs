//! `herald prune` as an operator runs it, while the pipeline runs: the rows
//! that have done their job go, then `herald audit` is clean (the pruned
//! rows below the horizon it names are not reported missing, everything
//! after is checked) and `herald rebuild search` verifies exactly (the
//! tombstones a replay writes back below the horizon do not count). Without
//! the recorded horizons the same state fails both: the test checks that too.
//! And below the retention floor the prune is refused, naming `--force`.

// Shared with the audit tests; this one uses part of it.
#[allow(dead_code)]
mod audit_support;

use std::process::Command;

use audit_support::{CALLER, Pipeline, Ran, count, failing};
use herald_export::deletion;
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_testkit::unique;

const FIRST: i64 = 8;
const SECOND: i64 = 5;

fn herald(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env_remove("HERALD_DATABASE_URL")
        .env_remove("HERALD_KAFKA_BROKERS")
        .output()
        .expect("run herald")
}

async fn prune_then_audit_and_rebuild(url: &str, brokers: &str, topics: &Topics, prefix: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let artifacts = dir.path().join("artifacts").display().to_string();
    let ledger = dir.path().join("ledger.sqlite").display().to_string();
    let pipeline = Pipeline::start(url, brokers, topics, &artifacts, &ledger).await?;
    let first: Vec<String> = (0..FIRST).map(|i| format!("before {i}")).collect();
    let jobs = pipeline.submit(&first).await?;
    let settled = [
        ("SELECT COUNT(*) FROM notification_intents WHERE status = 'sent'", FIRST),
        ("SELECT COUNT(*) FROM inbox WHERE subscription = 'search'", FIRST),
    ];
    pipeline.settle(&settled).await?;
    // Two deletes leave two tombstones, and delete events to be pruned.
    for job in &jobs[..2] {
        deletion::delete(&pipeline.db, topics, CALLER, job).await?;
    }
    pipeline.settle(&[("SELECT COUNT(*) FROM search_documents WHERE deleted_at_ms IS NOT NULL", 2)]).await?;

    // Below the floor: the broker keeps records a week (or, the mock
    // cluster, cannot say how long), so one day is refused.
    let base = ["--database", url, "--kafka", brokers, "--topic-prefix", prefix];
    let refused = herald(&[&["prune", "--older-than-days", "1"][..], &base].concat());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--force") && stderr.contains(&topics.events), "the refusal names the topic and --force: {stderr}");
    assert_eq!(count(&pipeline.db, "SELECT COUNT(*) FROM outbox").await?, 2 * FIRST + 2, "a refused prune removes nothing");

    // Everything settled so far is older than a zero retention; the roles keep running.
    let pruned =
        herald(&[&["prune", "--older-than-days", "0", "--force", "--prune-idle-ratio", "0", "--prune-batch", "3"][..], &base].concat());
    assert_eq!(pruned.status.code(), Some(0), "{}", String::from_utf8_lossy(&pruned.stderr));
    for (sql, left) in [
        ("SELECT COUNT(*) FROM outbox", 0),
        ("SELECT COUNT(*) FROM inbox", 0),
        ("SELECT COUNT(*) FROM notification_intents", 0),
        ("SELECT COUNT(*) FROM search_documents WHERE deleted_at_ms IS NOT NULL", 0),
        ("SELECT COUNT(*) FROM export_intents", 0),
        ("SELECT COUNT(*) FROM search_documents", FIRST - 2),
    ] {
        assert_eq!(count(&pipeline.db, sql).await?, left, "{sql}\n{}", String::from_utf8_lossy(&pruned.stdout));
    }

    // Traffic after the prune: the same intake keys are new keys now.
    let second: Vec<String> = (0..SECOND).map(|i| format!("after {i}")).collect();
    pipeline.submit(&second).await?;
    let settled = [
        ("SELECT COUNT(*) FROM notification_intents WHERE status = 'sent'", SECOND),
        ("SELECT COUNT(*) FROM inbox WHERE subscription = 'stats'", SECOND),
        ("SELECT COUNT(*) FROM search_documents", FIRST - 2 + SECOND),
    ];
    pipeline.settle(&settled).await?;
    let group_prefix = pipeline.group_prefix.clone();
    let (db, provider, sim_stop) = pipeline.stop().await?;

    let ran = Ran { url: url.to_owned(), brokers: brokers.to_owned(), prefix: prefix.to_owned(), artifacts, provider };
    let (code, report) = ran.audit_with(&["--clock-skew", "0s"])?;
    assert_eq!(code, Some(0), "after a prune the audit is clean: {report:#}");
    for kind in ["outbox", "inbox", "intents", "tombstones", "intake_keys"] {
        assert!(report["horizons"][kind].is_string(), "the report says where the {kind} horizon is: {report:#}");
    }
    let checked =
        |name: &str| report["checks"].as_array().and_then(|c| c.iter().find(|c| c["check"] == name)).map(|c| c["checked"].clone());
    assert_eq!(checked("inbox_once"), Some((SECOND * 3).into()), "the completions after the horizon are checked: {report:#}");

    let rebuild = |extra: &[&str]| herald(&[&["rebuild", "search"][..], &base, &["--group-prefix", &group_prefix], extra].concat());
    // The same state without the horizons the prune recorded: missing rows,
    // and a rebuild whose replayed tombstones do not match.
    sqlx::query("DELETE FROM prune_horizons").execute(db.pool()).await?;
    let (code, report) = ran.audit_with(&["--clock-skew", "0s"])?;
    assert_eq!(code, Some(1), "{report:#}");
    assert!(failing(&report).contains(&"outbox_in_kafka".to_owned()), "{report:#}");
    let mismatch = rebuild(&[]);
    assert_ne!(mismatch.status.code(), Some(0), "tombstones the replay brought back count without the horizon");

    // With the horizon recorded again (and the failed generation's tombstones
    // pruned too), the rebuild verifies exactly and switches.
    let again = herald(&[&["prune", "--older-than-days", "0", "--force", "--only", "tombstones"][..], &base].concat());
    assert_eq!(again.status.code(), Some(0), "{}", String::from_utf8_lossy(&again.stderr));
    let rebuilt = rebuild(&[]);
    assert_eq!(rebuilt.status.code(), Some(0), "{}{}", String::from_utf8_lossy(&rebuilt.stdout), String::from_utf8_lossy(&rebuilt.stderr));
    sim_stop.cancel();
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_then_audit_and_rebuild_are_clean_postgres_real_broker() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let brokers = herald_testkit::real_broker()?;
    let prefix = unique("prune");
    let topics = Topics::with_prefix(&prefix);
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(3)).await?;
    prune_then_audit_and_rebuild(&test_db.url, &brokers, &topics, &prefix).await
}

#[tokio::test(flavor = "multi_thread")]
async fn prune_then_audit_and_rebuild_are_clean_sqlite_mock_cluster() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let prefix = unique("prune");
    let topics = Topics::with_prefix(&prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), 3)?;
    prune_then_audit_and_rebuild(&test_db.url, kafka.bootstrap_servers(), &topics, &prefix).await
}

/// `serve`'s schedule checks the same floor at start: the embedded mock
/// cluster cannot say how long it keeps records, so any retention is
/// refused (exit 2) before a role starts, naming the flag and `--force`.
#[tokio::test(flavor = "multi_thread")]
async fn serve_refuses_a_prune_schedule_below_the_floor() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"));
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--prune-older-than-days", "30"])
        .current_dir(dir.path())
        .env_remove("HERALD_DATABASE_URL")
        .env_remove("HERALD_KAFKA_BROKERS")
        .kill_on_drop(true);
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), serve.output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--prune-older-than-days") && stderr.contains("--force"), "{stderr}");
    Ok(())
}
