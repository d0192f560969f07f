//! Recovery: a job whose deadline passed by the database's clock — a running
//! attempt that stopped renewing its lease, or a pending job no worker picked
//! up — is taken over
//! with a conditional update that bumps its generation (fencing any attempt
//! still alive somewhere), and its command is issued again through the
//! outbox in the same transaction.

use std::time::Duration;

use herald_kafka::Topics;
use herald_store::lease::{Pick, Take, Value};
use herald_store::{Db, StoreError, now_ms};
use sqlx::Row;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ExportError;
use crate::attempts::JOB_LEASE;
use crate::jobs::{JOB_COLUMNS, append_command, row_to_job};
use crate::lifecycle::{LeasePolicy, PENDING, RUNNING};

/// Jobs examined per scan.
const SCAN_LIMIT: i64 = 100;

/// Takes over every open job whose deadline passed by the database's clock.
/// Returns how many it took over (a job another scanner took first is not
/// counted).
pub async fn take_over_expired(db: &Db, topics: &Topics, policy: &LeasePolicy) -> Result<usize, ExportError> {
    let sql = format!(
        "SELECT job_id, generation FROM export_jobs WHERE status IN ($1, $2) AND lease_expires_at_ms <= {} \
         ORDER BY lease_expires_at_ms LIMIT $3",
        db.now_sql()
    );
    let ids: Vec<(String, i64)> = sqlx::query(&sql)
        .bind(PENDING)
        .bind(RUNNING)
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
        if take_over(db, topics, policy, &job_id, generation).await? {
            taken += 1;
        }
    }
    Ok(taken)
}

/// A take of the job's lease without an owner: the generation bump fences
/// the attempt that let it expire, and the dispatch deadline becomes the
/// lease the re-issued command has to be picked up in.
async fn take_over(db: &Db, topics: &Topics, policy: &LeasePolicy, job_id: &str, generation: i64) -> Result<bool, ExportError> {
    let mut tx = db.begin().await?;
    let key = Value::from(job_id);
    let take = Take {
        owner: None,
        ttl_ms: policy.dispatch_timeout_ms(),
        pick: Pick::Key(&key),
        eligible: Some("status IN ($1, $2) AND generation = $3"),
        free: None,
        set: Some("status = $1, updated_at_ms = $4"),
        returning: JOB_COLUMNS,
        binds: 4,
    };
    let statement = JOB_LEASE.take(db, &take);
    let row = statement
        .query(|q| q.bind(PENDING).bind(RUNNING).bind(generation).bind(now_ms()))
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
    herald_store::outbox::announce(db, [job.job_id.as_str()]);
    info!(job_id, from_generation = generation, to_generation = job.generation, "job taken over; command re-issued");
    Ok(true)
}

/// Scans every `interval` until `shutdown`.
pub async fn run(db: Db, topics: Topics, policy: LeasePolicy, interval: Duration, shutdown: CancellationToken) {
    loop {
        if let Err(e) = take_over_expired(&db, &topics, &policy).await {
            warn!(error = %e, "recovery scan failed; will retry");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
