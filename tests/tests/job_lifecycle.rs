//! Invariants 1–4 on PostgreSQL and SQLite, driven directly through the
//! domain's adapters so races are forced with gates and time is injected:
//! one job per key under concurrency, atomic intake, one winner between two
//! processors, a stale attempt refused after takeover, unknown commit
//! outcomes resolved by reading, a retry budget that ends in `failed`, and
//! leases written and judged by the database's clock.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::Database;
use herald_export::artifact::ArtifactStore;
use herald_export::worker::{ExportWorker, Outcome};
use herald_export::{ExportError, ExportRequest, Format, IntakeConfig, LeasePolicy, Submitted, attempts, cleanup, jobs, scanner};
use herald_fault::{Action, Hook, Point};
use herald_kafka::Topics;
use herald_store::{Db, lease, now_ms};
use herald_testkit::{Gate, TestDb};
use tokio::sync::{Notify, oneshot};

struct Env {
    db: Db,
    artifacts: ArtifactStore,
    _dir: tempfile::TempDir,
    _test_db: TestDb,
}

async fn env(database: Database) -> anyhow::Result<Env> {
    let test_db = common::test_db(database).await?;
    let db = Db::connect_and_migrate(&test_db.url).await?;
    let dir = tempfile::tempdir()?;
    Ok(Env { db, artifacts: ArtifactStore::local(dir.path())?, _dir: dir, _test_db: test_db })
}

/// A long lease: no renewal or expiry happens by itself during a test; time
/// moves only where a test moves a lease's expiry relative to the database's
/// clock, or waits for that clock.
fn policy() -> LeasePolicy {
    LeasePolicy { lease: Duration::from_secs(60), attempt_budget: 2, ..LeasePolicy::default() }
}

fn request(query: &str) -> ExportRequest {
    ExportRequest { format: Format::Csv, query: query.to_owned() }
}

fn intake(faults: Hook) -> IntakeConfig {
    IntakeConfig { faults, policy: policy(), ..IntakeConfig::new(Topics::default()) }
}

impl Env {
    fn worker(&self, faults: Hook) -> ExportWorker {
        ExportWorker::new(self.db.clone(), Topics::default(), self.artifacts.clone(), policy(), faults)
    }

    async fn submit(&self, query: &str) -> anyhow::Result<String> {
        Ok(jobs::submit(&self.db, &intake(Hook::none()), "alice", query, &request(query)).await?.job().job_id.clone())
    }

    async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        common::count(&self.db, sql).await
    }

    /// Sets the job's lease (or dispatch deadline) to expire `ms` from the
    /// database's now — the clock the scanner and every take judge it by.
    async fn lease_ends_in(&self, job_id: &str, ms: i64) -> anyhow::Result<()> {
        let sql = format!("UPDATE export_jobs SET lease_expires_at_ms = {} + $1 WHERE job_id = $2", self.db.now_sql());
        sqlx::query(&sql).bind(ms).bind(job_id).execute(self.db.pool()).await?;
        Ok(())
    }

    /// Waits until the database's clock has passed `at_ms`.
    async fn wait_for_db_clock(&self, at_ms: i64) -> anyhow::Result<()> {
        while lease::db_now(&self.db).await? <= at_ms {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    async fn lease_of(&self, job_id: &str) -> anyhow::Result<i64> {
        jobs::get_any(&self.db, job_id).await?.and_then(|j| j.lease_expires_at_ms).ok_or_else(|| anyhow::anyhow!("no lease"))
    }

    async fn completions(&self, job_id: &str) -> anyhow::Result<i64> {
        self.count(&format!("SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.completed' AND subject = '{job_id}'")).await
    }
}

/// A hook that lets `parties` callers through `point` only together.
fn gate_at(point: Point, parties: usize) -> Hook {
    let gate = Arc::new(Gate::new(parties));
    Hook::new(move |site| {
        let gate = gate.clone();
        async move {
            if site.point == point {
                gate.arrive_and_wait().await;
            }
            Action::Continue
        }
    })
}

async fn intake_failure_leaves_nothing(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let fail = Hook::new(|site| async move {
        if site.point == Point::AfterJobInsert { Action::Fail("crash after the job insert".into()) } else { Action::Continue }
    });
    let err = jobs::submit(&env.db, &intake(fail), "alice", "k", &request("q")).await.expect_err("injected fault");
    assert!(matches!(err, ExportError::Injected { point: Point::AfterJobInsert, .. }), "{err}");
    for table in ["export_jobs", "export_intents", "outbox"] {
        assert_eq!(env.count(&format!("SELECT COUNT(*) AS n FROM {table}")).await?, 0, "{table}");
    }
    // The retry with the same key succeeds as if the first never happened.
    let again = jobs::submit(&env.db, &intake(Hook::none()), "alice", "k", &request("q")).await?;
    assert!(matches!(again, Submitted::Created(_)));
    assert_eq!(env.count("SELECT COUNT(*) AS n FROM outbox").await?, 1);
    Ok(())
}

async fn concurrent_identical_requests_make_one_job(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let config = intake(gate_at(Point::IntakeChecked, 20));
    let handles: Vec<_> = (0..20)
        .map(|_| {
            let (db, config) = (env.db.clone(), config.clone());
            tokio::spawn(async move { jobs::submit(&db, &config, "alice", "same-key", &request("same")).await })
        })
        .collect();
    let mut ids = Vec::new();
    let mut created = 0;
    for h in handles {
        let submitted = h.await??;
        created += usize::from(matches!(submitted, Submitted::Created(_)));
        ids.push(submitted.job().job_id.clone());
    }
    ids.dedup();
    assert_eq!((created, ids.len()), (1, 1), "one creator, one job id");
    assert_eq!(env.count("SELECT COUNT(*) AS n FROM export_jobs").await?, 1);
    assert_eq!(env.count("SELECT COUNT(*) AS n FROM outbox").await?, 1);
    Ok(())
}

async fn concurrent_different_bodies_one_wins(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let config = intake(gate_at(Point::IntakeChecked, 10));
    let handles: Vec<_> = (0..10)
        .map(|i| {
            let (db, config) = (env.db.clone(), config.clone());
            tokio::spawn(async move { jobs::submit(&db, &config, "alice", "contested", &request(&format!("body {i}"))).await })
        })
        .collect();
    let (mut won, mut conflicts) = (0, 0);
    for h in handles {
        match h.await? {
            Ok(Submitted::Created(_)) => won += 1,
            Err(ExportError::KeyConflict { .. }) => conflicts += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((won, conflicts), (1, 9));
    assert_eq!(env.count("SELECT COUNT(*) AS n FROM export_jobs").await?, 1);
    Ok(())
}

async fn two_processors_one_transition(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let job_id = env.submit("race").await?;
    let faults = gate_at(Point::BeforeStart, 2);
    let (a, b) = (env.worker(faults.clone()), env.worker(faults));
    let (ra, rb) = tokio::join!(a.handle(&job_id), b.handle(&job_id));
    let outcomes = [ra?, rb?];
    let completed = outcomes.iter().filter(|o| matches!(o, Outcome::Completed { .. })).count();
    let skipped = outcomes.iter().filter(|o| **o == Outcome::Skipped).count();
    assert_eq!((completed, skipped), (1, 1), "{outcomes:?}");
    let job = jobs::get_any(&env.db, &job_id).await?.expect("job");
    assert_eq!((job.attempts, job.generation, job.status.as_str()), (1, 1, "succeeded"));
    assert_eq!(env.completions(&job_id).await?, 1);
    Ok(())
}

async fn stale_attempt_is_refused_after_takeover(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let job_id = env.submit("stale").await?;
    let (arrived_tx, arrived) = oneshot::channel::<()>();
    let arrived_tx = Arc::new(std::sync::Mutex::new(Some(arrived_tx)));
    let release = Arc::new(Notify::new());
    let paused = {
        let release = release.clone();
        Hook::new(move |site| {
            let (arrived_tx, release) = (arrived_tx.clone(), release.clone());
            async move {
                if site.point == Point::ArtifactWritten && site.n == 1 {
                    if let Some(tx) = arrived_tx.lock().expect("lock").take() {
                        let _ = tx.send(());
                    }
                    release.notified().await;
                }
                Action::Continue
            }
        })
    };
    let stale = env.worker(paused);
    let stale_job = job_id.clone();
    let stale_run = tokio::spawn(async move { stale.handle(&stale_job).await });
    arrived.await?;

    // Time passes beyond the stale attempt's lease, made deterministic by
    // moving its expiry behind the database's clock, which judges it.
    env.lease_ends_in(&job_id, -1).await?;
    assert_eq!(scanner::take_over_expired(&env.db, &Topics::default(), &policy()).await?, 1);
    let fresh = env.worker(Hook::none()).handle(&job_id).await?;
    let Outcome::Completed { generation: 3, result_id: selected } = fresh else { panic!("{fresh:?}") };

    release.notify_one();
    let refused = stale_run.await??;
    let Outcome::Refused { generation: 1, orphan } = refused else { panic!("{refused:?}") };
    assert_eq!(env.completions(&job_id).await?, 1, "the stale attempt appended nothing");
    let job = jobs::get_any(&env.db, &job_id).await?.expect("job");
    assert_eq!(job.result_id.as_deref(), Some(selected.as_str()));
    assert!(env.artifacts.exists(&orphan).await?, "candidate left as an orphan");

    // Cleanup removes the orphan after the grace period, never the selected result.
    let grace = Duration::from_secs(600);
    assert!(cleanup::orphans(&env.db, now_ms(), grace).await?.is_empty(), "not before the grace period");
    let after_grace = now_ms() + 601_000;
    assert_eq!(cleanup::orphans(&env.db, after_grace, grace).await?, vec![orphan.clone()]);
    assert_eq!(cleanup::remove_orphans(&env.db, &env.artifacts, after_grace, grace).await?, 1);
    assert!(!env.artifacts.exists(&orphan).await?);
    assert!(env.artifacts.exists(&selected).await?);
    Ok(())
}

async fn unknown_commit_outcome_is_resolved_by_reading(database: Database, lost: Action) -> anyhow::Result<()> {
    let env = env(database).await?;
    let job_id = env.submit("unknown").await?;
    let calls = Arc::new(AtomicUsize::new(0));
    let faults = {
        let calls = calls.clone();
        Hook::new(move |site| {
            let (calls, lost) = (calls.clone(), lost.clone());
            async move {
                // Only the first commit loses its answer.
                if site.point == Point::BeforeCompletionCommit && calls.fetch_add(1, Ordering::SeqCst) == 0 {
                    lost
                } else {
                    Action::Continue
                }
            }
        })
    };
    let outcome = env.worker(faults).handle(&job_id).await?;
    assert!(matches!(outcome, Outcome::Completed { generation: 1, .. }), "{outcome:?}");
    assert_eq!(env.completions(&job_id).await?, 1);
    assert_eq!(jobs::get_any(&env.db, &job_id).await?.expect("job").status, "succeeded");
    assert!(calls.load(Ordering::SeqCst) >= 1, "the fault point was reached");
    Ok(())
}

async fn temporary_errors_retry_then_fail(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let job_id = env.submit("flaky").await?;
    let failing = Hook::new(|site| async move {
        if site.point == Point::ArtifactWritten { Action::Fail("store flaked".into()) } else { Action::Continue }
    });
    let worker = env.worker(failing);
    assert_eq!(worker.handle(&job_id).await?, Outcome::Retrying { generation: 1 });
    let job = jobs::get_any(&env.db, &job_id).await?.expect("job");
    assert_eq!((job.status.as_str(), job.failures), ("pending", 1));
    // Not re-issued before its retry time; re-issued after it.
    assert_eq!(scanner::take_over_expired(&env.db, &Topics::default(), &policy()).await?, 0);
    let retry_at = job.lease_expires_at_ms.expect("retry time");
    env.wait_for_db_clock(retry_at).await?; // the first backoff: about a second
    assert_eq!(scanner::take_over_expired(&env.db, &Topics::default(), &policy()).await?, 1);
    assert_eq!(env.count("SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.requested'").await?, 2);
    assert_eq!(worker.handle(&job_id).await?, Outcome::Failed { generation: 3 });
    let job = jobs::get_any(&env.db, &job_id).await?.expect("job");
    assert_eq!((job.status.as_str(), job.failures), ("failed", 2));
    assert_eq!(env.count("SELECT COUNT(*) AS n FROM outbox WHERE event_type = 'herald.export.failed'").await?, 1);
    assert_eq!(env.completions(&job_id).await?, 0);
    Ok(())
}

/// A dropped attempt (its process or task died) must stop renewing its lease,
/// or the scanner could never take the job over.
async fn dropped_attempt_stops_renewing(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let job_id = env.submit("dropped").await?;
    let (arrived_tx, arrived) = oneshot::channel::<()>();
    let arrived_tx = Arc::new(std::sync::Mutex::new(Some(arrived_tx)));
    let hang = Hook::new(move |site| {
        let arrived_tx = arrived_tx.clone();
        async move {
            if site.point == Point::ArtifactWritten {
                if let Some(tx) = arrived_tx.lock().expect("lock").take() {
                    let _ = tx.send(());
                }
                return std::future::pending().await;
            }
            Action::Continue
        }
    });
    let short = LeasePolicy { lease: Duration::from_millis(60), ..policy() };
    let worker = ExportWorker::new(env.db.clone(), Topics::default(), env.artifacts.clone(), short.clone(), hang);
    let job = job_id.clone();
    let attempt = tokio::spawn(async move { worker.handle(&job).await });
    arrived.await?;
    attempt.abort();
    let _ = attempt.await;
    let lease_at_drop = jobs::get_any(&env.db, &job_id).await?.expect("job").lease_expires_at_ms.expect("lease");
    // Wait out several renewal periods past the lease; a live renewer would move it.
    env.wait_for_db_clock(lease_at_drop + 3 * short.lease_ms()).await?;
    let job = jobs::get_any(&env.db, &job_id).await?.expect("job");
    assert_eq!(job.lease_expires_at_ms, Some(lease_at_drop), "nobody renews a dropped attempt's lease");
    assert_eq!(scanner::take_over_expired(&env.db, &Topics::default(), &short).await?, 1);
    Ok(())
}

/// Export leases are written and judged by the database's clock: intake's
/// dispatch deadline, an attempt's lease and its renewal are the database's
/// now plus a length; a lease ahead of that now is held (no takeover, no
/// second start), one behind it is taken, with the next generation.
async fn leases_follow_the_database_clock(database: Database) -> anyhow::Result<()> {
    let env = env(database).await?;
    let p = policy();
    let within = |before: i64, after: i64, length: i64, at: i64| (before + length..=after + length).contains(&at);

    let before = lease::db_now(&env.db).await?;
    let job_id = env.submit("clock").await?;
    let after = lease::db_now(&env.db).await?;
    let deadline = env.lease_of(&job_id).await?;
    assert!(within(before, after, p.dispatch_timeout_ms(), deadline), "dispatch deadline {deadline} not from {before}..{after}");

    let before = lease::db_now(&env.db).await?;
    let first = attempts::start(&env.db, &job_id, "w1", &p).await?.expect("a pending job starts");
    let after = lease::db_now(&env.db).await?;
    let lease_end = env.lease_of(&job_id).await?;
    assert!(within(before, after, p.lease_ms(), lease_end), "lease {lease_end} not from {before}..{after}");

    // Ahead of the database's now by a little: still held.
    env.lease_ends_in(&job_id, 5_000).await?;
    assert_eq!(scanner::take_over_expired(&env.db, &Topics::default(), &p).await?, 0);
    assert!(attempts::start(&env.db, &job_id, "w2", &p).await?.is_none(), "a held lease is not taken");
    let before = lease::db_now(&env.db).await?;
    assert!(attempts::renew(&env.db, &first, &p).await?);
    let after = lease::db_now(&env.db).await?;
    let renewed = env.lease_of(&job_id).await?;
    assert!(within(before, after, p.lease_ms(), renewed), "renewed lease {renewed} not from {before}..{after}");

    // Just behind it: expired, taken by another worker, the first fenced out.
    env.lease_ends_in(&job_id, -1).await?;
    let second = attempts::start(&env.db, &job_id, "w2", &p).await?.expect("an expired lease is taken");
    assert_eq!(second.generation, first.generation + 1);
    assert!(!attempts::renew(&env.db, &first, &p).await?, "the older generation renews nothing");

    // And the scanner takes over what expired by the database's clock.
    env.lease_ends_in(&job_id, -1).await?;
    let before = lease::db_now(&env.db).await?;
    assert_eq!(scanner::take_over_expired(&env.db, &Topics::default(), &p).await?, 1);
    let after = lease::db_now(&env.db).await?;
    let job = jobs::get_any(&env.db, &job_id).await?.expect("job");
    assert_eq!((job.status.as_str(), job.generation), ("pending", second.generation + 1));
    let owned = format!("SELECT COUNT(*) AS n FROM export_jobs WHERE job_id = '{job_id}' AND lease_owner IS NOT NULL");
    assert_eq!(env.count(&owned).await?, 0, "a takeover leaves the job without an owner");
    let deadline = job.lease_expires_at_ms.expect("deadline");
    assert!(within(before, after, p.dispatch_timeout_ms(), deadline), "new dispatch deadline {deadline} not from {before}..{after}");
    Ok(())
}

macro_rules! on_both {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;
            #[tokio::test(flavor = "multi_thread")]
            async fn postgres() -> anyhow::Result<()> {
                $body(Database::Postgres).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn sqlite() -> anyhow::Result<()> {
                $body(Database::Sqlite).await
            }
        }
    };
}

on_both!(intake_is_atomic, intake_failure_leaves_nothing);
on_both!(twenty_identical_requests, concurrent_identical_requests_make_one_job);
on_both!(one_key_different_bodies, concurrent_different_bodies_one_wins);
on_both!(two_processors, two_processors_one_transition);
on_both!(stale_attempt, stale_attempt_is_refused_after_takeover);
on_both!(retry_budget, temporary_errors_retry_then_fail);
on_both!(dropped_attempt, dropped_attempt_stops_renewing);
on_both!(lease_clock, leases_follow_the_database_clock);
on_both!(commit_answer_lost, commit_answer_lost_after_commit);
on_both!(connection_lost_before_commit, connection_lost_before_the_commit);

async fn commit_answer_lost_after_commit(database: Database) -> anyhow::Result<()> {
    unknown_commit_outcome_is_resolved_by_reading(database, Action::CommitThenLoseAnswer).await
}

async fn connection_lost_before_the_commit(database: Database) -> anyhow::Result<()> {
    unknown_commit_outcome_is_resolved_by_reading(database, Action::DropThenLoseAnswer).await
}
