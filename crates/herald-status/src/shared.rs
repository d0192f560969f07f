//! One refresh for all processes. Every `herald serve` or `herald api`
//! process runs a monitor; each taking the figures itself would run the
//! aggregate queries (and the broker probe) once per process per interval.
//! Instead one process holds a lease on the `status_snapshot` row, takes the
//! figures and stores them there; the others read what it stored while it is
//! younger than the interval, and take over when its lease runs out (the
//! holder stopped). Leases are compared with the database's clock.

use std::time::Duration;

use herald_store::{Db, StoreError};
use sqlx::Row;

use crate::StatusError;
use crate::figures::Status;

/// A lease lasts this many intervals: a holder that missed two refreshes
/// has stopped, and another process takes over.
const LEASE_INTERVALS: u32 = 3;

/// Where a refresh's figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Taken by this process, which holds the lease.
    Here,
    /// Read from the snapshot another process took.
    Shared,
}

/// What the snapshot row says.
struct Snapshot {
    figures: Option<String>,
    age_ms: i64,
    held_by_other: bool,
}

async fn read(db: &Db, me: &str) -> Result<Snapshot, StoreError> {
    let now = db.now_sql();
    let row = sqlx::query(&format!(
        "SELECT figures, {now} - taken_at_ms AS age_ms, holder, lease_until_ms > {now} AS leased FROM status_snapshot WHERE id = 1"
    ))
    .fetch_one(db.pool())
    .await?;
    let holder: Option<String> = row.try_get("holder")?;
    // Booleans from an expression come back as integers on SQLite.
    let leased = row.try_get::<bool, _>("leased").or_else(|_| row.try_get::<i32, _>("leased").map(|v| v != 0))?;
    Ok(Snapshot {
        figures: row.try_get("figures")?,
        age_ms: row.try_get("age_ms")?,
        held_by_other: leased && holder.as_deref() != Some(me),
    })
}

/// Takes the lease if it is free, expired or already `me`'s.
async fn claim(db: &Db, me: &str, lease: Duration) -> Result<bool, StoreError> {
    let now = db.now_sql();
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let done = sqlx::query(&format!(
        "UPDATE status_snapshot SET holder = $1, lease_until_ms = {now} + $2 WHERE id = 1 AND (lease_until_ms <= {now} OR holder = $1)"
    ))
    .bind(me)
    .bind(lease_ms)
    .execute(db.pool())
    .await?;
    Ok(done.rows_affected() == 1)
}

async fn store(db: &Db, me: &str, status: &Status) -> Result<(), StatusError> {
    let figures = serde_json::to_string(status).map_err(|e| StatusError::Probe(format!("status snapshot: {e}")))?;
    let now = db.now_sql();
    sqlx::query(&format!("UPDATE status_snapshot SET figures = $1, taken_at_ms = {now} WHERE id = 1 AND holder = $2"))
        .bind(figures)
        .bind(me)
        .execute(db.pool())
        .await
        .map_err(StoreError::from)?;
    Ok(())
}

fn parse(figures: &str) -> Result<Status, StatusError> {
    serde_json::from_str(figures).map_err(|e| StatusError::Probe(format!("status snapshot: {e}")))
}

/// The figures for this refresh: another process's snapshot while it holds
/// the lease and the snapshot is younger than `interval` (or older, while
/// it is still taking the next one); otherwise this process takes the lease
/// and the figures (`take`) and stores them for the others.
pub async fn figures<F>(db: &Db, me: &str, interval: Duration, take: F) -> Result<(Status, Taken), StatusError>
where
    F: Future<Output = Result<Status, StatusError>>,
{
    let snapshot = read(db, me).await?;
    let interval_ms = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
    if let (true, Some(figures)) = (snapshot.held_by_other, snapshot.figures.as_deref()) {
        if snapshot.age_ms < interval_ms || !claim(db, me, interval * LEASE_INTERVALS).await? {
            return Ok((parse(figures)?, Taken::Shared));
        }
    } else if !claim(db, me, interval * LEASE_INTERVALS).await? {
        // Claimed by another process between the read and the claim: its
        // figures, or ours for once when it has stored none yet.
        if let Some(figures) = read(db, me).await?.figures {
            return Ok((parse(&figures)?, Taken::Shared));
        }
        return Ok((take.await?, Taken::Here));
    }
    let status = take.await?;
    store(db, me, &status).await?;
    Ok((status, Taken::Here))
}
