//! Orphan cleanup. A candidate may be removed only when no attempt can ever
//! select it: its generation is older than the job's (completion is fenced on
//! the generation, which never goes back) or the job is finished with another
//! result, or the job was deleted (then its selected result goes too). All
//! three conditions, once true, stay true — so deleting a candidate
//! mid-completion is impossible by construction, not by timing. The grace
//! period only lets a fenced attempt's late write land before its file goes.

use std::time::Duration;

use herald_store::{Db, StoreError, now_ms};
use sqlx::Row;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ExportError;
use crate::artifact::ArtifactStore;
use crate::lifecycle::{DELETED, FAILED, SUCCEEDED};

const BATCH: i64 = 100;

/// Candidates no attempt can select, older than `now - grace`.
pub async fn orphans(db: &Db, now: i64, grace: Duration) -> Result<Vec<String>, StoreError> {
    let cutoff = now - i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let rows = sqlx::query(
        "SELECT a.result_id FROM export_artifacts a JOIN export_jobs j ON j.job_id = a.job_id \
         WHERE a.created_at_ms < $1 AND (j.status = $5 OR ((j.result_id IS NULL OR j.result_id <> a.result_id) \
         AND (j.generation > a.generation OR j.status IN ($2, $3)))) ORDER BY a.created_at_ms LIMIT $4",
    )
    .bind(cutoff)
    .bind(SUCCEEDED)
    .bind(FAILED)
    .bind(BATCH)
    .bind(DELETED)
    .fetch_all(db.pool())
    .await?;
    rows.iter().map(|r| r.try_get("result_id").map_err(StoreError::from)).collect()
}

/// Removes orphaned candidates: file first, then its row, so a crash in
/// between leaves a row whose file is already gone (removed again harmlessly)
/// rather than a file nobody knows about.
pub async fn remove_orphans(db: &Db, artifacts: &ArtifactStore, now: i64, grace: Duration) -> Result<usize, ExportError> {
    let ids = orphans(db, now, grace).await?;
    for result_id in &ids {
        artifacts.delete(result_id).await?;
        sqlx::query("DELETE FROM export_artifacts WHERE result_id = $1")
            .bind(result_id)
            .execute(db.pool())
            .await
            .map_err(StoreError::from)?;
    }
    if !ids.is_empty() {
        info!(removed = ids.len(), "orphan candidates removed");
    }
    Ok(ids.len())
}

/// Cleans every `interval` until `shutdown`.
pub async fn run(db: Db, artifacts: ArtifactStore, grace: Duration, interval: Duration, shutdown: CancellationToken) {
    loop {
        if let Err(e) = remove_orphans(&db, &artifacts, now_ms(), grace).await {
            warn!(error = %e, "orphan cleanup failed; will retry");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}
