//! Whole-table counts of a pipeline watched from outside: what `herald demo`
//! checks, what `herald drill` waits for while it drains and what it reports.
//! Read-only aggregates in the SQL subset both backends accept, as in
//! [`crate::queries`]. Statuses are grouped, not named: callers look them up
//! with the constants of the crate that owns each status (`herald_export`'s
//! job states, `herald_store::outbox`'s, `herald_notify::rules`'), so no
//! status string is spelled twice.

use std::collections::BTreeMap;

use herald_envelope::{EventData, ExportCompleted};
use herald_store::delivered::{FROM_OUTBOX, status_sql};
use herald_store::{Db, StoreError, outbox};
use serde::Serialize;
use sqlx::Row;

/// Counts of every table a settled pipeline is judged by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Intake keys accepted (`export_intents`).
    pub export_intents: i64,
    /// Export jobs by status.
    pub jobs: Tally,
    /// Outbox rows by status.
    pub outbox: Tally,
    /// The outbox's `herald.export.completed` rows.
    pub completions: Completions,
    /// Inbox rows by subscription, every event type.
    pub inbox: Tally,
    /// Completions applied, by subscription: its inbox rows of
    /// `herald.export.completed`.
    pub completions_applied: Tally,
    /// Notification intents by status.
    pub intents: Tally,
    /// Intents holding a provider receipt, by status.
    pub intents_with_receipt: Tally,
    /// Dead letters of every subscription, in any status.
    pub dead_letters: i64,
}

/// Rows by a key (a status, a subscription); a key without rows counts 0.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Tally(pub BTreeMap<String, i64>);

impl Tally {
    pub fn of(&self, key: &str) -> i64 {
        self.0.get(key).copied().unwrap_or(0)
    }

    pub fn total(&self) -> i64 {
        self.0.values().sum()
    }
}

/// The outbox's `herald.export.completed` rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Completions {
    pub rows: i64,
    /// Rows the relay marked delivered.
    pub delivered: i64,
    /// Rows beyond the first per job (subject): a completion written twice.
    pub beyond_first: i64,
}

/// Every count, each its own statement: a pipeline still moving may shift
/// between them, which is why callers poll until the counts agree.
pub async fn collect(db: &Db) -> Result<Counts, StoreError> {
    let completed = ExportCompleted::EVENT_TYPE;
    let (mut intents, mut intents_with_receipt) = (Tally::default(), Tally::default());
    for r in sqlx::query("SELECT status, COUNT(*) AS n, COUNT(receipt) AS r FROM notification_intents GROUP BY status")
        .fetch_all(db.pool())
        .await?
    {
        let status: String = r.try_get("status")?;
        intents_with_receipt.0.insert(status.clone(), r.try_get("r")?);
        intents.0.insert(status, r.try_get("n")?);
    }
    Ok(Counts {
        export_intents: count(db, "SELECT COUNT(*) AS n FROM export_intents", &[]).await?,
        jobs: grouped(db, "SELECT status AS k, COUNT(*) AS n FROM export_jobs GROUP BY status", &[]).await?,
        outbox: grouped(db, &format!("SELECT {} AS k, COUNT(*) AS n FROM {FROM_OUTBOX} GROUP BY k", status_sql(db.backend())), &[]).await?,
        completions: completions(db).await?,
        inbox: grouped(db, "SELECT subscription AS k, COUNT(*) AS n FROM inbox GROUP BY subscription", &[]).await?,
        completions_applied: grouped(
            db,
            "SELECT subscription AS k, COUNT(*) AS n FROM inbox WHERE event_type = $1 GROUP BY subscription",
            &[completed],
        )
        .await?,
        intents,
        intents_with_receipt,
        dead_letters: count(db, "SELECT COUNT(*) AS n FROM dead_letters", &[]).await?,
    })
}

async fn completions(db: &Db) -> Result<Completions, StoreError> {
    let completed = ExportCompleted::EVENT_TYPE;
    let rows = count(db, "SELECT COUNT(*) AS n FROM outbox WHERE event_type = $1", &[completed]).await?;
    let jobs = count(db, "SELECT COUNT(DISTINCT subject) AS n FROM outbox WHERE event_type = $1", &[completed]).await?;
    let delivered = count(
        db,
        &format!("SELECT COUNT(*) AS n FROM {FROM_OUTBOX} WHERE o.event_type = $1 AND {} = $2", status_sql(db.backend())),
        &[completed, outbox::DELIVERED],
    )
    .await?;
    Ok(Completions { rows, delivered, beyond_first: rows - jobs })
}

/// The outbox's `herald.export.completed` rows of one job.
pub async fn completions_of(db: &Db, job_id: &str) -> Result<i64, StoreError> {
    count(db, "SELECT COUNT(*) AS n FROM outbox WHERE event_type = $1 AND subject = $2", &[ExportCompleted::EVENT_TYPE, job_id]).await
}

/// An intent's key and the reason recorded with its last outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntentReason {
    pub idempotency_key: String,
    pub last_error: Option<String>,
}

/// The intents in `status`, with their reasons, oldest first.
pub async fn intents_in(db: &Db, status: &str) -> Result<Vec<IntentReason>, StoreError> {
    let rows = sqlx::query("SELECT idempotency_key, last_error FROM notification_intents WHERE status = $1 ORDER BY created_at_ms")
        .bind(status)
        .fetch_all(db.pool())
        .await?;
    rows.iter()
        .map(|r| Ok(IntentReason { idempotency_key: r.try_get("idempotency_key")?, last_error: r.try_get("last_error")? }))
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

async fn count(db: &Db, sql: &str, binds: &[&str]) -> Result<i64, StoreError> {
    let row = binds.iter().fold(sqlx::query(sql), |q, b| q.bind(*b)).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}

/// `(key, count)` rows of a `SELECT <key> AS k, COUNT(*) AS n … GROUP BY`.
async fn grouped(db: &Db, sql: &str, binds: &[&str]) -> Result<Tally, StoreError> {
    let rows = binds.iter().fold(sqlx::query(sql), |q, b| q.bind(*b)).fetch_all(db.pool()).await?;
    rows.iter().map(|r| Ok((r.try_get("k")?, r.try_get("n")?))).collect::<Result<_, StoreError>>().map(Tally)
}
