//! Intake and reads of job rows. The intake writes intent, pending job and
//! the command that starts it in one transaction, and answers only after it
//! committed.

use chrono::Utc;
use herald_envelope::{ExportRequested, OutboxEvent};
use herald_kafka::Topics;
use herald_store::{Backend, Db, StoreError, Tx, now_ms, outbox};
use serde::Serialize;
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::lifecycle::{self, LeasePolicy};
use crate::{ExportError, ExportRequest, OPERATION_CREATE};
use herald_fault::{Hook, Point};

pub use crate::lifecycle::{DELETED, FAILED, PENDING, RUNNING, SUCCEEDED};

/// What a caller sees of a failed attempt's error.
pub const ATTEMPT_FAILED: &str = "an attempt failed; it is retried within the attempt budget";

fn attempt_failed<S: serde::Serializer>(error: &Option<String>, serializer: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&error.as_ref().map(|_| ATTEMPT_FAILED), serializer)
}

/// An export job as its owner sees it (`GET /v1/exports/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Job {
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub query: String,
    pub status: String,
    /// Business version: bumped by every change others hear about.
    pub version: i64,
    /// Processing generation: bumped by every attempt start and takeover.
    pub generation: i64,
    pub attempts: i32,
    pub failures: i32,
    /// The last failed attempt's error, as the worker logged it. Shown to
    /// the job's owner only as that an attempt failed: the text is the
    /// database's or the object store's and says things about the
    /// deployment no caller needs (the worker's log line has it whole).
    #[serde(serialize_with = "attempt_failed")]
    pub last_error: Option<String>,
    pub result_id: Option<String>,
    pub result_size: Option<i64>,
    pub result_sha256: Option<String>,
    pub created_at_ms: i64,
    pub completed_at_ms: Option<i64>,
    #[serde(skip)]
    pub lease_expires_at_ms: Option<i64>,
}

/// The outcome of an intake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// This request created the job.
    Created(Job),
    /// The same key and parameters were seen before; this is that job.
    Existing(Job),
}

impl Submitted {
    pub fn job(&self) -> &Job {
        match self {
            Submitted::Created(job) | Submitted::Existing(job) => job,
        }
    }
}

/// What intake needs besides the database.
#[derive(Debug, Clone)]
pub struct IntakeConfig {
    pub topics: Topics,
    /// Most unfinished jobs one caller may have.
    pub quota: i64,
    pub policy: LeasePolicy,
    pub faults: Hook,
}

impl IntakeConfig {
    pub fn new(topics: Topics) -> IntakeConfig {
        IntakeConfig { topics, quota: 1000, policy: LeasePolicy::default(), faults: Hook::none() }
    }
}

/// Records intent, pending job and the command to start it, atomically.
/// The same (caller, key) with the same parameters returns the same job; with
/// other parameters it is a conflict and nothing is written.
pub async fn submit(db: &Db, config: &IntakeConfig, caller: &str, key: &str, request: &ExportRequest) -> Result<Submitted, ExportError> {
    let fingerprint = request.fingerprint();
    if let Some(found) = existing(db, caller, key, &fingerprint).await? {
        return Ok(Submitted::Existing(found));
    }
    crate::fault_at(&config.faults, Point::IntakeChecked, key, 0).await?;
    let mut tx = db.begin().await?;
    check_quota(db.backend(), &mut tx, caller, config.quota).await?;
    let job = insert_job(db, &mut tx, caller, request, config.policy.dispatch_timeout_ms()).await?;
    crate::fault_at(&config.faults, Point::AfterJobInsert, &job.job_id, 0).await?;
    if !insert_intent(&mut tx, caller, key, &fingerprint, &job.job_id).await? {
        // Another request with this key committed first: ours is discarded whole.
        tx.rollback().await.map_err(StoreError::from)?;
        return existing(db, caller, key, &fingerprint)
            .await?
            .map(Submitted::Existing)
            .ok_or_else(|| ExportError::Store(StoreError::Config("intent vanished after conflict".into())));
    }
    append_command(&mut tx, &config.topics, &job).await?;
    tx.commit().await.map_err(StoreError::from)?;
    outbox::announce(db, [job.job_id.as_str()]);
    Ok(Submitted::Created(job))
}

/// The command that asks a worker to run `job`; appended at intake and again
/// by every takeover.
pub(crate) async fn append_command(tx: &mut Tx<'_>, topics: &Topics, job: &Job) -> Result<(), ExportError> {
    let data = ExportRequested {
        job_id: job.job_id.clone(),
        caller: job.caller.clone(),
        format: job.format.clone(),
        query: job.query.clone(),
        requested_at_ms: job.created_at_ms,
        version: job.version,
    };
    outbox::append(tx, &OutboxEvent::new(&topics.commands, &job.job_id, &data, Utc::now())?).await?;
    Ok(())
}

/// Refuses a caller at quota. On Postgres a per-caller advisory lock makes
/// the count and the insert one step for concurrent intakes of that caller;
/// SQLite's single writer does the same by itself.
async fn check_quota(backend: Backend, tx: &mut Tx<'_>, caller: &str, quota: i64) -> Result<(), ExportError> {
    if backend == Backend::Postgres {
        sqlx::query("SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtext($1))) AS locked")
            .bind(caller)
            .execute(&mut **tx)
            .await
            .map_err(StoreError::from)?;
    }
    let open: i64 = sqlx::query("SELECT COUNT(*) AS n FROM export_jobs WHERE caller = $1 AND status IN ($2, $3)")
        .bind(caller)
        .bind(PENDING)
        .bind(RUNNING)
        .fetch_one(&mut **tx)
        .await
        .map_err(StoreError::from)?
        .try_get("n")
        .map_err(StoreError::from)?;
    if open >= quota {
        return Err(ExportError::QuotaExceeded { open, quota, retry_after_secs: 5 });
    }
    Ok(())
}

/// The job an earlier request with this key created, if its parameters match.
async fn existing(db: &Db, caller: &str, key: &str, fingerprint: &str) -> Result<Option<Job>, ExportError> {
    let row = sqlx::query("SELECT fingerprint, job_id FROM export_intents WHERE caller = $1 AND operation = $2 AND intent_key = $3")
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

async fn insert_job(db: &Db, tx: &mut Tx<'_>, caller: &str, request: &ExportRequest, dispatch_timeout_ms: i64) -> Result<Job, StoreError> {
    let now = now_ms();
    let mut job = Job {
        job_id: uuid::Uuid::now_v7().to_string(),
        caller: caller.to_owned(),
        format: request.format.as_str().to_owned(),
        query: request.query.clone(),
        status: PENDING.to_owned(),
        version: 1,
        generation: 0,
        attempts: 0,
        failures: 0,
        last_error: None,
        result_id: None,
        result_size: None,
        result_sha256: None,
        created_at_ms: now,
        completed_at_ms: None,
        lease_expires_at_ms: None,
    };
    // The dispatch deadline is judged by the scanner against the database's
    // clock, so it is written by that clock too.
    let sql = format!(
        "INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms, \
         lease_expires_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $7, {} + $8) RETURNING lease_expires_at_ms",
        db.now_sql()
    );
    let row = sqlx::query(&sql)
        .bind(&job.job_id)
        .bind(&job.caller)
        .bind(&job.format)
        .bind(&job.query)
        .bind(&job.status)
        .bind(job.version)
        .bind(now)
        .bind(dispatch_timeout_ms)
        .fetch_one(&mut **tx)
        .await?;
    job.lease_expires_at_ms = row.try_get("lease_expires_at_ms")?;
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

pub(crate) const JOB_COLUMNS: &str = "job_id, caller, format, query, status, version, generation, attempts, failures, \
    last_error, result_id, result_size, result_sha256, created_at_ms, completed_at_ms, lease_expires_at_ms";

/// The job, if `caller` owns it. Someone else's job is indistinguishable from
/// a missing one.
pub async fn get(db: &Db, caller: &str, job_id: &str) -> Result<Option<Job>, StoreError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM export_jobs WHERE job_id = $1 AND caller = $2");
    let row = sqlx::query(&sql).bind(job_id).bind(caller).fetch_optional(db.pool()).await?;
    row.as_ref().map(row_to_job).transpose()
}

/// The job regardless of owner, for workers and operators.
pub async fn get_any(db: &Db, job_id: &str) -> Result<Option<Job>, StoreError> {
    let sql = format!("SELECT {JOB_COLUMNS} FROM export_jobs WHERE job_id = $1");
    let row = sqlx::query(&sql).bind(job_id).fetch_optional(db.pool()).await?;
    row.as_ref().map(row_to_job).transpose()
}

pub(crate) fn row_to_job(row: &AnyRow) -> Result<Job, StoreError> {
    Ok(Job {
        job_id: row.try_get("job_id")?,
        caller: row.try_get("caller")?,
        format: row.try_get("format")?,
        query: row.try_get("query")?,
        status: row.try_get("status")?,
        version: row.try_get("version")?,
        generation: row.try_get("generation")?,
        attempts: row.try_get("attempts")?,
        failures: row.try_get("failures")?,
        last_error: row.try_get("last_error")?,
        result_id: row.try_get("result_id")?,
        result_size: row.try_get("result_size")?,
        result_sha256: row.try_get("result_sha256")?,
        created_at_ms: row.try_get("created_at_ms")?,
        completed_at_ms: row.try_get("completed_at_ms")?,
        lease_expires_at_ms: row.try_get("lease_expires_at_ms")?,
    })
}

/// Jobs in `status`, for reports.
pub async fn count_by_status(db: &Db, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM export_jobs WHERE status = $1").bind(status).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}

/// Whether the job can still change.
pub fn is_open(job: &Job) -> bool {
    !lifecycle::is_terminal(&job.status)
}

/// Up to `limit` intake keys accepted before `before_ms`. A retry with a
/// pruned key creates a new job: the key's retention is how long a caller
/// may retry a request and get the first answer.
pub async fn prune_intake_keys(db: &Db, before_ms: i64, limit: i64) -> Result<herald_store::prune::Batch, herald_store::StoreError> {
    let done = sqlx::query(
        "DELETE FROM export_intents WHERE (caller, operation, intent_key) IN \
         (SELECT caller, operation, intent_key FROM export_intents WHERE created_at_ms < $1 LIMIT $2)",
    )
    .bind(before_ms)
    .bind(limit)
    .execute(db.pool())
    .await?;
    Ok(herald_store::prune::Batch::limited(done.rows_affected(), limit))
}
