//! Recovery: a job whose deadline passed — a running attempt that stopped
//! renewing its lease, or a pending job no worker picked up — is taken over
//! with a conditional update that bumps its generation (fencing any attempt
//! still alive somewhere), and its command is issued again through the
//! outbox in the same transaction.

use std::time::Duration;

use herald_kafka::Topics;
use herald_store::{Db, StoreError, now_ms};
use sqlx::Row;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ExportError;
use crate::jobs::{JOB_COLUMNS, append_command, row_to_job};
use crate::lifecycle::{LeasePolicy, PENDING, RUNNING};

/// Jobs examined per scan.
const SCAN_LIMIT: i64 = 100;

/// Takes over every open job whose deadline is before `now`. Returns how many
/// it took over (a job another scanner took first is not counted).
pub async fn take_over_expired(db: &Db, topics: &Topics, policy: &LeasePolicy, now: i64) -> Result<usize, ExportError> {
    let ids: Vec<(String, i64)> = sqlx::query(
        "SELECT job_id, generation FROM export_jobs WHERE status IN ($1, $2) AND lease_expires_at_ms < $3 \
         ORDER BY lease_expires_at_ms LIMIT $4",
    )
    .bind(PENDING)
    .bind(RUNNING)
    .bind(now)
    .bind(SCAN_LIMIT)
    .fetch_all(db.pool())
    .await
    .map_err(StoreError::from)?
    .iter()
    .map(|r| Ok((r.try_get("job_id")?, r.try_get("generation")?)))
    .collect::<Result<_, sqlx::Error>>()
    .map_err(StoreError::from)?;
    let mut taken = 0;
    for (job_id, generation) in ids {
        if take_over(db, topics, policy, &job_id, generation, now).await? {
            taken += 1;
        }
    }
    Ok(taken)
}

async fn take_over(db: &Db, topics: &Topics, policy: &LeasePolicy, job_id: &str, generation: i64, now: i64) -> Result<bool, ExportError> {
    let mut tx = db.begin().await?;
    let sql = format!(
        "UPDATE export_jobs SET status = $1, generation = generation + 1, lease_owner = NULL, \
         lease_expires_at_ms = $2, updated_at_ms = $3 \
         WHERE job_id = $4 AND generation = $5 AND status IN ($1, $6) AND lease_expires_at_ms < $3 \
         RETURNING {JOB_COLUMNS}"
    );
    let row = sqlx::query(&sql)
        .bind(PENDING)
        .bind(now + policy.dispatch_timeout_ms())
        .bind(now)
        .bind(job_id)
        .bind(generation)
        .bind(RUNNING)
        .fetch_optional(&mut *tx)
        .await
        .map_err(StoreError::from)?;
    let Some(row) = row else {
        tx.rollback().await.map_err(StoreError::from)?;
        return Ok(false);
    };
    let job = row_to_job(&row)?;
    append_command(&mut tx, topics, &job).await?;
    tx.commit().await.map_err(StoreError::from)?;
    info!(job_id, from_generation = generation, to_generation = job.generation, "job taken over; command re-issued");
    Ok(true)
}

/// Scans every `interval` until `shutdown`.
pub async fn run(db: Db, topics: Topics, policy: LeasePolicy, interval: Duration, shutdown: CancellationToken) {
    loop {
        if let Err(e) = take_over_expired(&db, &topics, &policy, now_ms()).await {
            warn!(error = %e, "recovery scan failed; will retry");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
