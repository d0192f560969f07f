//! Claims on intents, as in the relay: an owner, a token and a lease, kept
//! apart from the intent's status. Only the holder of an unexpired claim calls
//! the provider; every final write checks the token, so a dispatcher whose
//! lease expired (and whose intent was reclaimed) cannot record anything.

use herald_store::{Backend, Db, StoreError, now_ms};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::rules::{PENDING, Transition};

/// A claimed intent: what to send and the token that proves the claim.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub key: String,
    pub body: String,
    pub recipient: String,
    pub token: String,
    /// Attempts so far, this one included.
    pub attempts: i32,
    pub first_attempt_at_ms: i64,
    /// The previous claim expired unfinished: its call may have reached the
    /// provider.
    pub previous_attempt_unfinished: bool,
}

/// Claims up to `limit` due intents for `owner` until `now + lease_ms`.
pub async fn claim(db: &Db, owner: &str, lease_ms: i64, limit: i64) -> Result<Vec<Claimed>, StoreError> {
    let now = now_ms();
    let token = uuid::Uuid::new_v4().to_string();
    // The claim conditions are repeated outside the subquery: on PostgreSQL a
    // row locked by a concurrent claimer is re-checked against them after that
    // claimer commits, so it cannot be claimed twice.
    let lock = if db.backend() == Backend::Postgres { "FOR UPDATE SKIP LOCKED" } else { "" };
    let due = "status = $1 AND next_attempt_at_ms <= $2 AND (claim_expires_at_ms IS NULL OR claim_expires_at_ms < $2)";
    let sql = format!(
        "UPDATE notification_intents SET reclaimed = CASE WHEN claim_token IS NULL THEN 0 ELSE 1 END, \
         claim_owner = $3, claim_token = $4, claimed_at_ms = $2, \
         claim_expires_at_ms = $5, attempts = attempts + 1, first_attempt_at_ms = COALESCE(first_attempt_at_ms, $2), \
         updated_at_ms = $2 \
         WHERE {due} AND idempotency_key IN (SELECT idempotency_key FROM notification_intents WHERE {due} \
         ORDER BY created_at_ms LIMIT $6 {lock}) \
         RETURNING idempotency_key, body, recipient, claim_token, attempts, first_attempt_at_ms, reclaimed"
    );
    let rows = sqlx::query(&sql)
        .bind(PENDING)
        .bind(now)
        .bind(owner)
        .bind(&token)
        .bind(now + lease_ms)
        .bind(limit)
        .fetch_all(db.pool())
        .await?;
    rows.iter().map(row_to_claimed).collect()
}

fn row_to_claimed(row: &AnyRow) -> Result<Claimed, StoreError> {
    Ok(Claimed {
        key: row.try_get("idempotency_key")?,
        body: row.try_get("body")?,
        recipient: row.try_get("recipient")?,
        token: row.try_get("claim_token")?,
        attempts: row.try_get("attempts")?,
        first_attempt_at_ms: row.try_get("first_attempt_at_ms")?,
        previous_attempt_unfinished: row.try_get::<i32, _>("reclaimed")? == 1,
    })
}

/// Records where an attempt left the intent and clears the claim. `false`:
/// the claim was lost (expired and taken), nothing was written.
pub async fn finish(db: &Db, claimed: &Claimed, transition: &Transition) -> Result<bool, StoreError> {
    let now = now_ms();
    let (receipt, error, next_at) = match transition {
        Transition::Sent { receipt } => (Some(receipt.as_str()), None, 0),
        Transition::Retry { at_ms, reason } => (None, Some(reason.as_str()), *at_ms),
        Transition::Unknown { reason } | Transition::Dead { reason } => (None, Some(reason.as_str()), 0),
        Transition::Conflict { detail } | Transition::Failed { detail } => (None, Some(detail.as_str()), 0),
    };
    let done = sqlx::query(
        "UPDATE notification_intents SET status = $1, receipt = $2, last_error = $3, next_attempt_at_ms = $4, \
         claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL, updated_at_ms = $5 \
         WHERE idempotency_key = $6 AND claim_token = $7",
    )
    .bind(transition.status())
    .bind(receipt)
    .bind(error)
    .bind(next_at)
    .bind(now)
    .bind(&claimed.key)
    .bind(&claimed.token)
    .execute(db.pool())
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives a claim back untouched, for intents this dispatcher claimed but never
/// sent (shutdown before their turn): no call was made, so no lease is owed.
pub async fn release_unsent(db: &Db, claimed: &Claimed) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE notification_intents SET claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL, \
         attempts = attempts - 1 WHERE idempotency_key = $1 AND claim_token = $2",
    )
    .bind(&claimed.key)
    .bind(&claimed.token)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Intents per status, for reports, reconcile and tests.
pub async fn count_by_status(db: &Db, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM notification_intents WHERE status = $1")
        .bind(status)
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get("n")?)
}
