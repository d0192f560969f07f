//! `DELETE /v1/exports/{id}`: the owner deletes a job, `herald.export.deleted`
//! is appended in the same transaction, the search projection drops the
//! document and keeps a versioned tombstone — so an older `completed`
//! delivered afterwards does not bring it back, live or in a replay — and a
//! rebuild reproduces the deletes (generation 2 equals generation 1).

mod common;

use std::time::{Duration, Instant};

use chrono::Utc;
use common::{ALICE, BOB, Broker, Database, Stack, export_body};
use herald_envelope::{ExportCompleted, OutboxEvent};
use herald_export::deletion::{self, Deletion};
use herald_export::{ExportRequest, Format, IntakeConfig, LeasePolicy, attempts, cleanup, jobs};
use herald_rebuild::replay::ReplayProgress;
use herald_rebuild::{Progress, RebuildOptions, Search, SwitchMode, rebuild, verify};
use herald_store::{now_ms, outbox};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

struct Quiet;

impl Progress for Quiet {
    fn phase(&mut self, _: &str) {}
    fn replayed(&mut self, _: ReplayProgress) {}
}

async fn delete(stack: &Stack, token: &str, id: &str) -> anyhow::Result<(u16, String, Value)> {
    let response = stack.http.delete(format!("{}/v1/exports/{id}", stack.base)).bearer_auth(token).send().await?;
    let status = response.status().as_u16();
    let content_type = response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    Ok((status, content_type, response.json().await.unwrap_or(Value::Null)))
}

async fn wait_for(stack: &Stack, sql: &str, want: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = stack.count(sql).await?;
        if n == want {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "`{sql}` stayed at {n}, wanted {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn delete_then_late_completed_then_rebuild(database: Database) -> anyhow::Result<()> {
    let stack = common::start(database, Broker::Mock).await?;
    let mut ids = Vec::new();
    for i in 0..6 {
        let (status, _, body) = stack.post_export(ALICE, Some(&format!("del-{i}")), &export_body("csv", &format!("deletable {i}"))).await?;
        assert_eq!(status, 202, "{body}");
        ids.push(body["job_id"].as_str().expect("job id").to_owned());
    }
    stack.wait_for_hits(ALICE, "deletable", 6).await?;
    let (victim, other) = (&ids[0], &ids[1]);

    // Only the owner may delete; anyone else learns nothing.
    let (status, content_type, problem) = delete(&stack, BOB, victim).await?;
    assert_eq!((status, content_type.as_str()), (404, "application/problem+json"), "{problem}");
    assert_eq!(stack.count("SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.deleted'").await?, 0);

    let (status, _, _) = delete(&stack, ALICE, victim).await?;
    assert_eq!(status, 204);
    let (status, _, _) = delete(&stack, ALICE, victim).await?;
    assert_eq!(status, 204, "deleting again is harmless");
    let (status, _, _) = delete(&stack, ALICE, other).await?;
    assert_eq!(status, 204);
    assert_eq!(
        stack.count("SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.deleted'").await?,
        2,
        "one event per deleted job, none for the repeat"
    );

    // GET of a deleted job (and of its result) answers 410 Gone to its owner.
    let (status, problem) = stack.get(ALICE, &format!("/v1/exports/{victim}")).await?;
    assert_eq!(status, 410, "{problem}");
    assert_eq!(problem["type"], "/problems/gone");
    let (status, _) = stack.get(ALICE, &format!("/v1/exports/{victim}/result")).await?;
    assert_eq!(status, 410);
    let (status, _) = stack.get(BOB, &format!("/v1/exports/{victim}")).await?;
    assert_eq!(status, 404);

    // Live: the documents go, tombstones with the deleted version stay.
    stack.wait_for_hits(ALICE, "deletable", 4).await?;
    wait_for(&stack, "SELECT COUNT(*) AS n FROM search_documents WHERE generation = 1 AND deleted_at_ms IS NOT NULL", 2).await?;
    let (_, answer) = stack.get(ALICE, "/v1/search?q=deletable").await?;
    let hits: Vec<&str> = answer["hits"].as_array().expect("hits").iter().filter_map(|h| h["job_id"].as_str()).collect();
    assert_eq!(hits.len(), 4, "{answer}");
    assert!(!hits.contains(&victim.as_str()) && !hits.contains(&other.as_str()), "{answer}");

    // An older `completed` of the victim (a late copy under another id, as a
    // lagging partition or a redriven letter would deliver it) arrives after
    // the delete: the tombstone's version keeps it out.
    let job = jobs::get_any(&stack.db, victim).await?.expect("job");
    assert_eq!(job.status, "deleted");

    // Cleanup may now remove the deleted jobs' selected artifacts, and only those.
    let kept = jobs::get_any(&stack.db, &ids[2]).await?.and_then(|j| j.result_id).expect("selected result");
    let orphans = cleanup::orphans(&stack.db, now_ms(), Duration::ZERO).await?;
    assert!(job.result_id.as_ref().is_some_and(|r| orphans.contains(r)), "{orphans:?}");
    assert!(!orphans.contains(&kept), "a live job's result is not an orphan: {orphans:?}");
    let late = ExportCompleted {
        job_id: victim.clone(),
        caller: "alice".into(),
        format: "csv".into(),
        query: "deletable resurrected".into(),
        result_id: "exports/late".into(),
        size_bytes: 1,
        sha256: "00".repeat(32),
        completed_at_ms: now_ms(),
        version: job.version - 1,
        content_type: "text/csv".into(),
    };
    let event = OutboxEvent::new(&stack.wiring.topics.events, victim, &late, Utc::now())?;
    let mut tx = stack.db.begin().await?;
    outbox::append(&mut tx, &event).await?;
    tx.commit().await?;
    wait_for(&stack, &format!("SELECT COUNT(*) AS n FROM inbox WHERE subscription = 'search' AND event_id = '{}'", event.id), 1).await?;
    let (_, answer) = stack.get(ALICE, "/v1/search?q=resurrected").await?;
    assert_eq!(answer["hits"].as_array().map(Vec::len), Some(0), "the late completed resurrected the document: {answer}");
    assert_eq!(stack.count("SELECT COUNT(*) AS n FROM search_documents WHERE generation = 1 AND deleted_at_ms IS NOT NULL").await?, 2);

    // Replay: the same history (completed, deleted, late completed) into
    // generation 2 gives the same table, tombstones included.
    let options = RebuildOptions {
        kafka: stack.wiring.kafka.clone(),
        topic: stack.wiring.topics.events.clone(),
        switch: SwitchMode::Auto,
        dry_run: false,
        batch: 3,
        ..RebuildOptions::default()
    };
    let report = rebuild::rebuild(&stack.db, &Search, &options, &mut Quiet, &CancellationToken::new()).await?;
    assert_eq!((report.generation, report.state.as_str()), (2, "active"), "{report:?}");
    let (one, two) = verify::fingerprints(&stack.db, &Search, 1, 2).await?;
    assert_eq!(one, two);
    assert_eq!((two.rows, two.other), (4, 2));
    let (_, answer) = stack.get(ALICE, "/v1/search?q=deletable").await?;
    assert_eq!((answer["generation"].as_i64(), answer["hits"].as_array().map(Vec::len)), (Some(2), Some(4)), "{answer}");
    stack.stop().await
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_removes_the_document_for_good_postgres() -> anyhow::Result<()> {
    delete_then_late_completed_then_rebuild(Database::Postgres).await
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_removes_the_document_for_good_sqlite() -> anyhow::Result<()> {
    delete_then_late_completed_then_rebuild(Database::Sqlite).await
}

/// The delete's state rules without a pipeline: a running job is refused
/// (nothing written), a pending one is deleted and can no longer start.
async fn delete_rules(database: Database) -> anyhow::Result<()> {
    let test_db = common::test_db(database).await?;
    let db = herald_store::Db::connect_and_migrate(&test_db.url).await?;
    let intake = IntakeConfig::new(herald_kafka::Topics::with_prefix("d"));
    let request = |q: &str| ExportRequest { format: Format::Csv, query: q.to_owned() };
    let running = jobs::submit(&db, &intake, "alice", "k1", &request("running")).await?.job().clone();
    let pending = jobs::submit(&db, &intake, "alice", "k2", &request("pending")).await?.job().clone();
    let policy = LeasePolicy::default();
    attempts::start(&db, &running.job_id, "w1", &policy).await?.expect("started");

    let outcome = deletion::delete(&db, &intake.topics, "alice", &running.job_id).await?;
    assert!(matches!(outcome, Deletion::Running(_)), "{outcome:?}");
    let deleted_events = "SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.deleted'";
    assert_eq!(common::count(&db, deleted_events).await?, 0, "a refused delete writes nothing");

    let Deletion::Deleted(job) = deletion::delete(&db, &intake.topics, "alice", &pending.job_id).await? else {
        panic!("pending jobs can be deleted")
    };
    assert_eq!((job.status.as_str(), job.version), ("deleted", pending.version + 1));
    assert_eq!(common::count(&db, deleted_events).await?, 1);
    assert!(attempts::start(&db, &pending.job_id, "w1", &policy).await?.is_none(), "a deleted job never starts");
    assert_eq!(deletion::delete(&db, &intake.topics, "bob", &pending.job_id).await?, Deletion::NotFound);
    assert!(matches!(deletion::delete(&db, &intake.topics, "alice", &pending.job_id).await?, Deletion::AlreadyDeleted(_)));
    assert_eq!(common::count(&db, deleted_events).await?, 1);
    Ok(())
}

#[tokio::test]
async fn delete_rules_postgres() -> anyhow::Result<()> {
    delete_rules(Database::Postgres).await
}

#[tokio::test]
async fn delete_rules_sqlite() -> anyhow::Result<()> {
    delete_rules(Database::Sqlite).await
}
