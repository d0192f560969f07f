//! The audit's checks of intake, intents, dead letters, stats and deletes,
//! each against one tamper. A pipeline run leaves every kind of evidence: one
//! export (`poison`) the search subscription refused until a fix, so its
//! completion was dead-lettered and then redriven with `herald dlq redrive`;
//! one export deleted by its owner, so search holds its tombstone. That run
//! audits clean. Then, one at a time, the database is tampered with, the
//! audit must fail by exactly the one check that owns the broken promise and
//! name the row, and the tamper is undone:
//!
//! - `intake_once`: a job's query rewritten — the parameters a conflicting
//!   request (409) would have written over the key's job (`fingerprint_mismatch`);
//! - `intents_once`: a second intent for one (completion, recipient), under
//!   the legacy alias of the source that the unique key does not catch
//!   (`duplicate_intent`);
//! - `dead_letters_settled`: the redriven letter put back to `dead` while its
//!   fact was applied from its record (`parked_but_applied`);
//! - `stats_match_completions`: one more export counted than the stats inbox
//!   applied (`counter_mismatch`);
//! - `deleted_not_searchable`: the deleted job's tombstone turned back into a
//!   document searches find (`deleted_job_searchable`).
//!
//! Finally the untampered database audits clean again.

mod audit_support;

use std::time::Duration;

use audit_support::{CHECKS, Pipeline, Ran, all_ran, count, failing, named, one};
use herald_export::deletion::{self, Deletion};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::{Db, dead_letter};
use herald_testkit::unique;

const EXPORTS: usize = 12;
const POISON: usize = 3;
const DELETED: usize = 5;

/// What the run left that the tampers aim at.
struct Left {
    db: Db,
    jobs: Vec<String>,
    letter: i64,
}

/// A defect stand-in: the search projection refuses the `poison` document.
async fn refuse_poison(db: &Db, postgres: bool) -> anyhow::Result<()> {
    let statements: &[&str] = if postgres {
        &[
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.query = 'poison' THEN RAISE EXCEPTION 'refused by defect'; END IF; RETURN NEW; END $$",
            "CREATE TRIGGER refuse_poison BEFORE INSERT OR UPDATE ON search_documents FOR EACH ROW EXECUTE FUNCTION refuse_poison()",
        ]
    } else {
        &["CREATE TRIGGER refuse_poison BEFORE INSERT ON search_documents WHEN NEW.query = 'poison' \
           BEGIN SELECT RAISE(ABORT, 'refused by defect'); END"]
    };
    for sql in statements {
        sqlx::query(sql).execute(db.pool()).await?;
    }
    Ok(())
}

async fn fix(db: &Db, postgres: bool) -> anyhow::Result<()> {
    let sql = if postgres { "DROP TRIGGER refuse_poison ON search_documents" } else { "DROP TRIGGER refuse_poison" };
    sqlx::query(sql).execute(db.pool()).await?;
    Ok(())
}

async fn wait_until(what: &str, mut probe: impl AsyncFnMut() -> anyhow::Result<bool>) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !probe().await? {
        anyhow::ensure!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Exports, the poison one dead-lettered by search then redriven after the
/// fix, one deleted; waits until everything is applied.
async fn exercise(pipeline: &Pipeline, url: &str, postgres: bool) -> anyhow::Result<(Vec<String>, i64)> {
    let db = &pipeline.db;
    refuse_poison(db, postgres).await?;
    let queries: Vec<String> = (0..EXPORTS).map(|i| if i == POISON { "poison".to_owned() } else { format!("audit {i}") }).collect();
    let jobs = pipeline.submit(&queries).await?;
    wait_until("search to dead-letter the poison completion", async || Ok(dead_letter::count(db, "search", dead_letter::DEAD).await? == 1))
        .await?;
    fix(db, postgres).await?;
    let letter = dead_letter::list(db, Some("search"), Some(dead_letter::DEAD)).await?.first().map(|l| l.id).unwrap_or_default();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(["dlq", "redrive", &letter.to_string(), "--database", url])
        .output()
        .await?;
    anyhow::ensure!(out.status.success(), "redrive: {}", String::from_utf8_lossy(&out.stdout));

    let live = "SELECT COUNT(*) FROM search_documents WHERE deleted_at_ms IS NULL";
    wait_until("every export searchable", async || Ok(count(db, live).await? == EXPORTS as i64)).await?;
    let deleted = deletion::delete(db, &pipeline.topics, audit_support::CALLER, &jobs[DELETED]).await?;
    anyhow::ensure!(matches!(deleted, Deletion::Deleted(_)), "{deleted:?}");
    let n = EXPORTS as i64;
    pipeline
        .settle(&[
            (live, n - 1),
            ("SELECT COUNT(*) FROM search_documents WHERE deleted_at_ms IS NOT NULL", 1),
            ("SELECT COUNT(*) FROM notification_intents WHERE status = 'sent'", n),
            ("SELECT COUNT(*) FROM inbox WHERE subscription = 'stats'", n),
        ])
        .await?;
    Ok((jobs, letter))
}

async fn run(
    url: &str,
    brokers: &str,
    topics: &Topics,
    ran: &mut Ran,
    postgres: bool,
) -> anyhow::Result<(Left, tokio_util::sync::CancellationToken)> {
    let pipeline = Pipeline::start(url, brokers, topics, &ran.artifacts, &format!("{}.ledger", ran.artifacts)).await?;
    let exercised = exercise(&pipeline, url, postgres).await;
    // Stopped either way: consumers left to a dropped runtime hang the test.
    let (db, provider, sim_stop) = pipeline.stop().await?;
    let (jobs, letter) = exercised?;
    ran.provider = provider;
    Ok((Left { db, jobs, letter }, sim_stop))
}

/// Applies `tamper`, expects exactly `check` to fail naming `needle` with a
/// violation of `kind`, then applies `undo`.
async fn tampered(
    ran: &Ran,
    db: &Db,
    check: &str,
    kind: &str,
    needle: &str,
    tamper: (&str, &str),
    undo: (&str, &str),
) -> anyhow::Result<()> {
    sqlx::query(tamper.0).bind(tamper.1).execute(db.pool()).await?;
    let (code, report) = ran.audit()?;
    sqlx::query(undo.0).bind(undo.1).execute(db.pool()).await?;
    assert_eq!(code, Some(1), "{check}: {report:#}");
    assert_eq!(failing(&report), [check], "only {check} fails: {report:#}");
    assert!(named(&report, check, kind, needle), "{check} names {kind} of {needle}: {report:#}");
    Ok(())
}

async fn each_check_fails_alone(url: &str, brokers: &str, topics: &Topics, prefix: &str, postgres: bool) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let artifacts = dir.path().join("artifacts").display().to_string();
    let mut ran = Ran { url: url.to_owned(), brokers: brokers.to_owned(), prefix: prefix.to_owned(), artifacts, provider: String::new() };
    let (left, sim_stop) = run(url, brokers, topics, &mut ran, postgres).await?;
    let db = &left.db;

    let (code, report) = ran.audit()?;
    assert_eq!(code, Some(0), "the run audits clean, its redriven letter and deleted job included: {report:#}");
    all_ran(&report, &CHECKS)?;

    let job = left.jobs[0].as_str();
    tampered(
        &ran,
        db,
        "intake_once",
        "fingerprint_mismatch",
        job,
        ("UPDATE export_jobs SET query = 'tampered' WHERE job_id = $1", job),
        ("UPDATE export_jobs SET query = 'audit 0' WHERE job_id = $1", job),
    )
    .await?;

    tampered(&ran, db, "intents_once", "duplicate_intent", &format!("(job {job})"),
        ("INSERT INTO notification_intents (idempotency_key, source, event_id, recipient, kind, job_id, body, status, created_at_ms, updated_at_ms) \
          SELECT 'ntf_tampered', 'urn:herald:exports', event_id, recipient, kind, job_id, body, 'pending', created_at_ms, updated_at_ms \
          FROM notification_intents WHERE job_id = $1", job),
        ("DELETE FROM notification_intents WHERE idempotency_key = 'ntf_tampered' AND job_id = $1", job)).await?;

    let letter = left.letter.to_string();
    tampered(
        &ran,
        db,
        "dead_letters_settled",
        "parked_but_applied",
        &format!("dead letter {letter} (search)"),
        ("UPDATE dead_letters SET status = 'dead' WHERE CAST(id AS TEXT) = $1", &letter),
        ("UPDATE dead_letters SET status = 'redriven' WHERE CAST(id AS TEXT) = $1", &letter),
    )
    .await?;

    let caller = audit_support::CALLER;
    tampered(
        &ran,
        db,
        "stats_match_completions",
        "counter_mismatch",
        &format!("{caller} csv"),
        ("UPDATE stats_counters SET exports = exports + 1 WHERE caller = $1 AND format = 'csv'", caller),
        ("UPDATE stats_counters SET exports = exports - 1 WHERE caller = $1 AND format = 'csv'", caller),
    )
    .await?;

    let deleted = left.jobs[DELETED].as_str();
    let was = one(db, &format!("SELECT CAST(deleted_at_ms AS TEXT) FROM search_documents WHERE job_id = '{deleted}'")).await?;
    tampered(
        &ran,
        db,
        "deleted_not_searchable",
        "deleted_job_searchable",
        deleted,
        ("UPDATE search_documents SET deleted_at_ms = NULL WHERE job_id = $1", deleted),
        (&format!("UPDATE search_documents SET deleted_at_ms = {was} WHERE job_id = $1"), deleted),
    )
    .await?;

    let (code, report) = ran.audit()?;
    assert_eq!(code, Some(0), "every tamper undone: {report:#}");
    sim_stop.cancel();
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn each_new_check_fails_alone_on_its_tamper_postgres_real_broker() -> anyhow::Result<()> {
    let test_db = herald_testkit::postgres_db().await?;
    let brokers = herald_testkit::real_broker()?;
    let prefix = unique("tamper");
    let topics = Topics::with_prefix(&prefix);
    herald_kafka::ensure_topics(&KafkaConfig::new(&brokers), &topics.all(), herald_kafka::TopicSettings::partitions(3)).await?;
    each_check_fails_alone(&test_db.url, &brokers, &topics, &prefix, true).await
}

#[tokio::test(flavor = "multi_thread")]
async fn each_new_check_fails_alone_on_its_tamper_sqlite_mock_cluster() -> anyhow::Result<()> {
    let test_db = herald_testkit::sqlite_db()?;
    let prefix = unique("tamper");
    let topics = Topics::with_prefix(&prefix);
    let kafka = EmbeddedKafka::start(1, &topics.all(), 3)?;
    each_check_fails_alone(&test_db.url, kafka.bootstrap_servers(), &topics, &prefix, false).await
}
