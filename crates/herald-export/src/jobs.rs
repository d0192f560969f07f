//! Job rows and their transactions. Every state change that others must hear
//! about commits together with its outbox row, or not at all.

use chrono::Utc;
use herald_envelope::{ExportCompleted, ExportRequested, OutboxEvent};
use herald_kafka::Topics;
use herald_store::{Db, StoreError, Tx, now_ms, outbox};
use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::artifact::StoredArtifact;
use crate::{ExportError, ExportRequest, OPERATION_CREATE};

pub const PENDING: &str = "pending";
pub const SUCCEEDED: &str = "succeeded";

/// An export job as its owner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Job {
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub query: String,
    pub status: String,
    pub version: i64,
    pub result_id: Option<String>,
    pub result_size: Option<i64>,
    pub result_sha256: Option<String>,
    pub created_at_ms: i64,
    pub completed_at_ms: Option<i64>,
}

/// The outcome of an intake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// This request created the job.
    Created(Job),
    /// The same key and parameters were seen before; this is that job.
    Existing(Job),
}

/// Records intent, pending job and the command to start it, atomically.
/// The same (caller, key) with the same parameters returns the same job; with
/// other parameters it is a conflict and nothing is written.
pub async fn submit(
    db: &Db,
    topics: &Topics,
    caller: &str,
    key: &str,
    request: &ExportRequest,
) -> Result<Submitted, ExportError> {
    let fingerprint = request.fingerprint();
    if let Some(found) = existing(db, caller, key, &fingerprint).await? {
        return Ok(Submitted::Existing(found));
    }
    let mut tx = db.begin().await?;
    let job = insert_job(&mut tx, caller, request).await?;
    if !insert_intent(&mut tx, caller, key, &fingerprint, &job.job_id).await? {
        // Another request with this key committed first: ours is discarded whole.
        tx.rollback().await.map_err(StoreError::from)?;
        return existing(db, caller, key, &fingerprint)
            .await?
            .map(Submitted::Existing)
            .ok_or_else(|| ExportError::Store(StoreError::Config("intent vanished after conflict".into())));
    }
    let data = ExportRequested {
        job_id: job.job_id.clone(),
        caller: caller.to_owned(),
        format: job.format.clone(),
        query: job.query.clone(),
        requested_at_ms: job.created_at_ms,
        version: job.version,
    };
    outbox::append(&mut tx, &OutboxEvent::new(&topics.commands, &job.job_id, &data, Utc::now())?).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Submitted::Created(job))
}

/// The job an earlier request with this key created, if its parameters match.
async fn existing(db: &Db, caller: &str, key: &str, fingerprint: &str) -> Result<Option<Job>, ExportError> {
    let row = sqlx::query(
        "SELECT fingerprint, job_id FROM export_intents WHERE caller = $1 AND operation = $2 AND intent_key = $3",
    )
    .bind(caller)
    .bind(OPERATION_CREATE)
    .bind(key)
    .fetch_optional(db.pool())
    .await
    .map_err(StoreError::from)?;
    let Some(row) = row else { return Ok(None) };
    let job_id: String = row.try_get("job_id").map_err(StoreError::from)?;
    let stored: String = row.try_get("fingerprint").map_err(StoreError::from)?;
    if stored != fingerprint {
        return Err(ExportError::KeyConflict { job_id });
    }
    Ok(get(db, caller, &job_id).await?)
}

async fn insert_job(tx: &mut Tx<'_>, caller: &str, request: &ExportRequest) -> Result<Job, StoreError> {
    let now = now_ms();
    let job = Job {
        job_id: uuid::Uuid::now_v7().to_string(),
        caller: caller.to_owned(),
        format: request.format.as_str().to_owned(),
        query: request.query.clone(),
        status: PENDING.to_owned(),
        version: 1,
        result_id: None,
        result_size: None,
        result_sha256: None,
        created_at_ms: now,
        completed_at_ms: None,
    };
    sqlx::query(
        "INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7)",
    )
    .bind(&job.job_id)
    .bind(&job.caller)
    .bind(&job.format)
    .bind(&job.query)
    .bind(&job.status)
    .bind(job.version)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(job)
}

/// `false` when the key is already taken (by a concurrent or earlier request).
async fn insert_intent(tx: &mut Tx<'_>, caller: &str, key: &str, fingerprint: &str, job_id: &str) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO export_intents (caller, operation, intent_key, fingerprint, job_id, created_at_ms) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (caller, operation, intent_key) DO NOTHING",
    )
    .bind(caller)
    .bind(OPERATION_CREATE)
    .bind(key)
    .bind(fingerprint)
    .bind(job_id)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

const JOB_COLUMNS: &str = "job_id, caller, format, query, status, version, result_id, result_size, \
    result_sha256, created_at_ms, completed_at_ms";

/// The job, if `caller` owns it. Someone else's job is indistinguishable from
/// a missing one.
pub async fn get(db: &Db, caller: &str, job_id: &str) -> Result<Option<Job>, StoreError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM export_jobs WHERE job_id = $1 AND caller = $2");
    let row = sqlx::query(&sql).bind(job_id).bind(caller).fetch_optional(db.pool()).await?;
    row.as_ref().map(row_to_job).transpose()
}

/// The job regardless of owner, for the worker.
pub async fn get_any(db: &Db, job_id: &str) -> Result<Option<Job>, StoreError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM export_jobs WHERE job_id = $1");
    let row = sqlx::query(&sql).bind(job_id).fetch_optional(db.pool()).await?;
    row.as_ref().map(row_to_job).transpose()
}

fn row_to_job(row: &AnyRow) -> Result<Job, StoreError> {
    Ok(Job {
        job_id: row.try_get("job_id")?,
        caller: row.try_get("caller")?,
        format: row.try_get("format")?,
        query: row.try_get("query")?,
        status: row.try_get("status")?,
        version: row.try_get("version")?,
        result_id: row.try_get("result_id")?,
        result_size: row.try_get("result_size")?,
        result_sha256: row.try_get("result_sha256")?,
        created_at_ms: row.try_get("created_at_ms")?,
        completed_at_ms: row.try_get("completed_at_ms")?,
    })
}

/// Selects `artifact` as the job's result, marks it succeeded and appends the
/// completion event — one transaction, conditional on the job not being
/// terminal. `false` means another attempt completed it first: nothing was
/// written and `artifact` is an orphan.
pub async fn complete(db: &Db, topics: &Topics, job: &Job, artifact: &StoredArtifact) -> Result<bool, ExportError> {
    let now = now_ms();
    let version = job.version + 1;
    let mut tx = db.begin().await?;
    let updated = sqlx::query(
        "UPDATE export_jobs SET status = $1, version = $2, result_id = $3, result_size = $4, \
         result_sha256 = $5, updated_at_ms = $6, completed_at_ms = $6 \
         WHERE job_id = $7 AND status = $8 AND version = $9",
    )
    .bind(SUCCEEDED)
    .bind(version)
    .bind(&artifact.result_id)
    .bind(artifact.size_bytes)
    .bind(&artifact.sha256)
    .bind(now)
    .bind(&job.job_id)
    .bind(PENDING)
    .bind(job.version)
    .execute(&mut *tx)
    .await
    .map_err(StoreError::from)?;
    if updated.rows_affected() != 1 {
        tx.rollback().await.map_err(StoreError::from)?;
        return Ok(false);
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
    };
    outbox::append(&mut tx, &OutboxEvent::new(&topics.events, &job.job_id, &data, Utc::now())?).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(true)
}

/// Jobs in `status`, for reports.
pub async fn count_by_status(db: &Db, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM export_jobs WHERE status = $1")
        .bind(status)
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get("n")?)
}
