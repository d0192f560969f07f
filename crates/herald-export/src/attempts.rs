//! Attempts: each runs under a processing generation that only it holds.
//! The generation is the token of the job's lease (the store's lease
//! primitive, [`herald_store::lease`], with the lease's expiry by the
//! database's clock). Every write an attempt makes is conditional on (job id,
//! generation, `running`), so once a takeover bumped the generation, the old
//! attempt can change nothing — however late it wakes up.

use chrono::Utc;
use herald_envelope::{ExportCompleted, ExportFailed, OutboxEvent};
use herald_fault::{Action, Hook, Point};
use herald_kafka::Topics;
use herald_store::lease::{self, Held, LeaseTable, Pick, Take, Token, TokenKind, Value, Write};
use herald_store::{Db, StoreError, now_ms, outbox};
use sqlx::Row;

use crate::ExportError;
use crate::artifact::StoredArtifact;
use crate::jobs::{JOB_COLUMNS, Job, row_to_job};
use crate::lifecycle::{AfterFailure, FAILED, LeasePolicy, PENDING, RUNNING, SUCCEEDED};

/// A started attempt: the job as it was when this attempt claimed it.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub job: Job,
    pub generation: i64,
    pub owner: String,
}

/// `export_jobs` as a lease table. The token is the generation: every take
/// (a start or a takeover) bumps it, and every write of an attempt is
/// conditional on its own.
pub(crate) const JOB_LEASE: LeaseTable = LeaseTable {
    table: "export_jobs",
    key: "job_id",
    owner: "lease_owner",
    token: "generation",
    expires_at: "lease_expires_at_ms",
    token_kind: TokenKind::Counter,
    released: "NULL",
};

impl Attempt {
    fn held(&self) -> Held {
        Held { key: Value::from(self.job.job_id.as_str()), token: Token::Counter(self.generation) }
    }
}

/// Claims the job for a new attempt if it is pending, or running under a
/// lease expired by the database's clock. `None`: a live attempt holds it or
/// it is finished — a duplicate command, not a reason to act.
pub async fn start(db: &Db, job_id: &str, owner: &str, policy: &LeasePolicy) -> Result<Option<Attempt>, StoreError> {
    let key = Value::from(job_id);
    let take = Take {
        owner: Some(owner),
        ttl_ms: policy.lease_ms(),
        pick: Pick::Key(&key),
        eligible: Some("status IN ($1, $2)"),
        free: Some("status = $2"),
        set: Some("status = $1, attempts = attempts + 1, updated_at_ms = $3"),
        returning: JOB_COLUMNS,
        binds: 3,
    };
    let statement = JOB_LEASE.take(db, &take);
    let row = statement.query(|q| q.bind(RUNNING).bind(PENDING).bind(now_ms())).fetch_optional(db.pool()).await?;
    let Some(row) = row else { return Ok(None) };
    let job = row_to_job(&row)?;
    Ok(Some(Attempt { generation: job.generation, job, owner: owner.to_owned() }))
}

/// Extends the lease. `false`: the attempt lost the job and must stop.
pub async fn renew(db: &Db, attempt: &Attempt, policy: &LeasePolicy) -> Result<bool, StoreError> {
    let write = Write { extend_ms: Some(policy.lease_ms()), also: Some("status = $1"), binds: 1, ..Write::default() };
    let done = JOB_LEASE.write(db, &attempt.held(), &write).query(|q| q.bind(RUNNING)).execute(db.pool()).await?;
    Ok(done.rows_affected() == 1)
}

/// Records the candidate's key before the file is written, so a crash after
/// the write still leaves a row cleanup can find.
pub async fn register_candidate(db: &Db, attempt: &Attempt, result_id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO export_artifacts (result_id, job_id, generation, created_at_ms) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (result_id) DO NOTHING",
    )
    .bind(result_id)
    .bind(&attempt.job.job_id)
    .bind(attempt.generation)
    .bind(now_ms())
    .execute(db.pool())
    .await?;
    Ok(())
}

/// How a completion ended.
#[derive(Debug)]
pub enum Completion {
    /// This attempt's result is selected and the completion event appended.
    Completed,
    /// A newer generation owns the job (or it is finished): nothing written.
    Refused,
    /// The commit was sent but its answer lost: resolve by reading, never by
    /// guessing.
    Unknown(String),
}

/// Selects `artifact`, marks the job succeeded and appends the one completion
/// event, in one transaction conditional on (job id, generation, `running`).
pub async fn complete(
    db: &Db,
    topics: &Topics,
    attempt: &Attempt,
    artifact: &StoredArtifact,
    faults: &Hook,
) -> Result<Completion, ExportError> {
    let job = &attempt.job;
    let now = now_ms();
    let version = job.version + 1;
    let mut tx = db.begin().await?;
    // Fenced by the generation and the running state, not by the lease's
    // expiry: until a takeover bumped the generation, the attempt is the one.
    let set = "status = $1, version = $2, result_id = $3, result_size = $4, result_sha256 = $5, updated_at_ms = $6, completed_at_ms = $6";
    let statement = JOB_LEASE.release(&attempt.held(), Some(set), Some("status = $7"), 7);
    let updated = statement
        .query(|q| {
            q.bind(SUCCEEDED)
                .bind(version)
                .bind(&artifact.result_id)
                .bind(artifact.size_bytes)
                .bind(&artifact.sha256)
                .bind(now)
                .bind(RUNNING)
        })
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    if updated.rows_affected() != 1 {
        tx.rollback().await.map_err(StoreError::from)?;
        return Ok(Completion::Refused);
    }
    let data = ExportCompleted {
        job_id: job.job_id.clone(),
        caller: job.caller.clone(),
        format: job.format.clone(),
        query: job.query.clone(),
        result_id: artifact.result_id.clone(),
        size_bytes: artifact.size_bytes,
        sha256: artifact.sha256.clone(),
        completed_at_ms: now,
        version,
        content_type: crate::artifact::content_type(&job.format).to_owned(),
    };
    outbox::append(&mut tx, &OutboxEvent::new(&topics.events, &job.job_id, &data, Utc::now())?).await?;
    match crate::fault_at(faults, Point::BeforeCompletionCommit, &job.job_id, attempt.generation).await? {
        Action::CommitThenLoseAnswer => {
            tx.commit().await.map_err(StoreError::from)?;
            outbox::announce(db, [job.job_id.as_str()]);
            return Ok(Completion::Unknown("injected: commit answer lost".into()));
        }
        Action::DropThenLoseAnswer => {
            drop(tx);
            return Ok(Completion::Unknown("injected: connection lost before commit".into()));
        }
        Action::Continue | Action::Fail(_) | Action::LoseAck => {}
    }
    match tx.commit().await.map_err(StoreError::from) {
        Ok(()) => {
            outbox::announce(db, [job.job_id.as_str()]);
            Ok(Completion::Completed)
        }
        // Lost connection during COMMIT: it may or may not have happened.
        Err(e) if e.is_retryable() => Ok(Completion::Unknown(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// What reading the job says about a completion whose outcome was unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    /// The commit happened: the job is succeeded with this attempt's result.
    Committed,
    /// It did not: the job is still this attempt's to complete.
    NotCommitted,
    /// Someone else owns or finished the job; this attempt is stale.
    Stale,
}

/// Reads the job (and its completion events) to learn what an unknown
/// commit did.
pub async fn resolve_unknown(db: &Db, attempt: &Attempt, result_id: &str) -> Result<Resolved, StoreError> {
    let Some(job) = crate::jobs::get_any(db, &attempt.job.job_id).await? else {
        return Ok(Resolved::Stale);
    };
    if job.status == SUCCEEDED && job.generation == attempt.generation && job.result_id.as_deref() == Some(result_id) {
        return Ok(Resolved::Committed);
    }
    if job.status == RUNNING && job.generation == attempt.generation {
        let events: i64 = sqlx::query("SELECT COUNT(*) AS n FROM outbox WHERE subject = $1 AND event_type = $2")
            .bind(&job.job_id)
            .bind("herald.export.completed")
            .fetch_one(db.pool())
            .await?
            .try_get("n")?;
        // Job row and event commit together; a lone event would be a defect.
        return Ok(if events == 0 { Resolved::NotCommitted } else { Resolved::Stale });
    }
    Ok(Resolved::Stale)
}

/// What became of a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureOutcome {
    Retrying {
        retry_at_ms: i64,
    },
    Failed,
    /// The attempt no longer owned the job; nothing recorded.
    Stale,
}

/// Records a temporary failure: back to pending with a retry time, or — with
/// the budget spent — `failed` plus its event, in one transaction.
pub async fn record_failure(
    db: &Db,
    topics: &Topics,
    attempt: &Attempt,
    error: &str,
    policy: &LeasePolicy,
    jitter: f64,
) -> Result<FailureOutcome, ExportError> {
    let now = now_ms();
    let failures = attempt.job.failures + 1;
    // The retry time is a deadline the scanner judges by the database's clock.
    let decision = policy.after_failure(failures, lease::db_now(db).await?, jitter);
    let (status, deadline, version) = match decision {
        AfterFailure::Retry { retry_at_ms } => (PENDING, Some(retry_at_ms), attempt.job.version),
        AfterFailure::Fail => (FAILED, None, attempt.job.version + 1),
    };
    let mut tx = db.begin().await?;
    let set = "status = $1, failures = $2, last_error = $3, lease_owner = NULL, lease_expires_at_ms = $4, version = $5, updated_at_ms = $6";
    let write = Write { set, also: Some("status = $7"), binds: 7, ..Write::default() };
    let statement = JOB_LEASE.write(db, &attempt.held(), &write);
    let updated = statement
        .query(|q| q.bind(status).bind(failures).bind(error).bind(deadline).bind(version).bind(now).bind(RUNNING))
        .execute(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    if updated.rows_affected() != 1 {
        tx.rollback().await.map_err(StoreError::from)?;
        return Ok(FailureOutcome::Stale);
    }
    if decision == AfterFailure::Fail {
        let job = &attempt.job;
        let data = ExportFailed {
            job_id: job.job_id.clone(),
            caller: job.caller.clone(),
            format: job.format.clone(),
            query: job.query.clone(),
            reason: error.to_owned(),
            attempts: i64::from(job.attempts),
            failed_at_ms: now,
            version,
        };
        outbox::append(&mut tx, &OutboxEvent::new(&topics.events, &job.job_id, &data, Utc::now())?).await?;
    }
    tx.commit().await.map_err(StoreError::from)?;
    outbox::announce(db, [attempt.job.job_id.as_str()]);
    Ok(match decision {
        AfterFailure::Retry { retry_at_ms } => FailureOutcome::Retrying { retry_at_ms },
        AfterFailure::Fail => FailureOutcome::Failed,
    })
}
