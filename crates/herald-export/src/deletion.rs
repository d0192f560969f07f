//! Deleting a job: its owner marks it `deleted` and the `herald.export.deleted`
//! fact is appended to the outbox in the same transaction, so downstreams
//! (the search projection) hear of every delete exactly when it happened.
//!
//! The delete is one conditional UPDATE (owner, deletable state), so it races
//! safely with an attempt starting or completing: whichever commits first
//! wins, and the loser's condition no longer holds. It bumps the business
//! version, so the deleted fact orders after every earlier fact of the job
//! (a `completed` is always an older version).

use chrono::Utc;
use herald_envelope::{ExportDeleted, OutboxEvent};
use herald_kafka::Topics;
use herald_store::{Db, StoreError, now_ms, outbox};

use crate::ExportError;
use crate::jobs::{self, JOB_COLUMNS, Job, row_to_job};
use crate::lifecycle::{DELETABLE, DELETED, RUNNING};

/// How a delete request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deletion {
    /// This request deleted the job (the event is in the outbox).
    Deleted(Job),
    /// The job was deleted before: nothing written (a repeat is harmless).
    AlreadyDeleted(Job),
    /// The job is running: nothing written; retry after it finished.
    Running(Job),
    /// No job of this caller by that id (someone else's looks the same).
    NotFound,
}

/// Deletes `caller`'s job `job_id` and appends `herald.export.deleted`, in
/// one transaction.
pub async fn delete(db: &Db, topics: &Topics, caller: &str, job_id: &str) -> Result<Deletion, ExportError> {
    let now = now_ms();
    let mut tx = db.begin().await?;
    let sql = format!(
        "UPDATE export_jobs SET status = $1, version = version + 1, updated_at_ms = $2, lease_owner = NULL, \
         lease_expires_at_ms = NULL WHERE job_id = $3 AND caller = $4 AND status IN ($5, $6, $7) RETURNING {JOB_COLUMNS}"
    );
    let row = sqlx::query(&sql)
        .bind(DELETED)
        .bind(now)
        .bind(job_id)
        .bind(caller)
        .bind(DELETABLE[0])
        .bind(DELETABLE[1])
        .bind(DELETABLE[2])
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    let Some(row) = row else {
        tx.rollback().await.map_err(StoreError::from)?;
        return Ok(match jobs::get(db, caller, job_id).await? {
            None => Deletion::NotFound,
            Some(job) if job.status == DELETED => Deletion::AlreadyDeleted(job),
            Some(job) if job.status == RUNNING => Deletion::Running(job),
            // Changed state between the UPDATE and this read (e.g. a running
            // job that just finished): say "running", the caller retries.
            Some(job) => Deletion::Running(job),
        });
    };
    let job = row_to_job(&row)?;
    let data = ExportDeleted { job_id: job.job_id.clone(), caller: job.caller.clone(), deleted_at_ms: now, version: job.version };
    outbox::append(&mut tx, &OutboxEvent::new(&topics.events, &job.job_id, &data, Utc::now())?).await?;
    tx.commit().await.map_err(StoreError::from)?;
    outbox::announce(db, [job.job_id.as_str()]);
    Ok(Deletion::Deleted(job))
}
