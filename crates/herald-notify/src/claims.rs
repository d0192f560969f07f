//! Claims on intents, as in the relay: an owner, a token and a lease, kept
//! apart from the intent's status, and timed by the database's clock — hosts'
//! clocks may disagree, the database's is the one every dispatcher reads.
//!
//! A batch claim only reserves intents. Each provider call is preceded by
//! [`begin_call`], a conditional renew that succeeds only while the claim is
//! still held and unexpired, and extends it by a whole lease; the dispatcher
//! then starts the call only if that lease outlasts the call's timeout. So a
//! call never runs outside its claim, and since a claim can only be taken
//! once it expired, two dispatchers never call for the same intent at once.
//! Every final write checks the token, so a dispatcher whose claim was taken
//! cannot record anything.

use std::time::{Duration, Instant};

use herald_store::{Backend, Db, StoreError};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::rules::{PENDING, Transition};

/// A reading of the database's clock, and of our monotonic clock when the
/// statement that read it was sent: `now_ms` later never underestimates the
/// database's time, and `elapsed` never underestimates how much of a lease
/// granted by that statement is gone.
#[derive(Debug, Clone, Copy)]
pub struct DbInstant {
    db_ms: i64,
    sent: Instant,
}

impl DbInstant {
    pub fn now_ms(&self) -> i64 {
        self.db_ms.saturating_add(i64::try_from(self.sent.elapsed().as_millis()).unwrap_or(i64::MAX))
    }

    pub fn elapsed(&self) -> Duration {
        self.sent.elapsed()
    }
}

/// A claimed intent: what to send and the token that proves the claim.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub key: String,
    pub body: String,
    pub recipient: String,
    pub token: String,
    /// Attempts made before this claim.
    pub attempts: i32,
    pub first_attempt_at_ms: Option<i64>,
    /// An earlier attempt may have reached the provider without an answer:
    /// its outcome was unknown, or its claim expired while it was calling.
    pub may_have_executed: bool,
    pub claimed_at: DbInstant,
}

/// A call that may start: the claim was renewed for it.
#[derive(Debug, Clone, Copy)]
pub struct CallStart {
    /// Attempts made, this one included.
    pub attempts: i32,
    pub first_attempt_at_ms: i64,
    pub renewed_at: DbInstant,
}

/// Claims up to `limit` due intents for `owner` for `lease_ms`.
pub async fn claim(db: &Db, owner: &str, lease_ms: i64, limit: i64) -> Result<Vec<Claimed>, StoreError> {
    let now = db.now_sql();
    let token = uuid::Uuid::new_v4().to_string();
    // The claim conditions are repeated outside the subquery: on PostgreSQL a
    // row locked by a concurrent claimer is re-checked against them after that
    // claimer commits, so it cannot be claimed twice.
    let lock = if db.backend() == Backend::Postgres { "FOR UPDATE SKIP LOCKED" } else { "" };
    let due = format!("status = $1 AND next_attempt_at_ms <= {now} AND (claim_expires_at_ms IS NULL OR claim_expires_at_ms < {now})");
    // A call started under the claim this one replaces never finished: it may
    // have reached the provider. Set expressions read the row as it was.
    let sql = format!(
        "UPDATE notification_intents SET reclaimed = CASE WHEN call_started_at_ms IS NULL THEN 0 ELSE 1 END, \
         may_have_executed = CASE WHEN call_started_at_ms IS NULL THEN may_have_executed ELSE 1 END, \
         call_started_at_ms = NULL, claim_owner = $2, claim_token = $3, claimed_at_ms = {now}, \
         claim_expires_at_ms = {now} + $4, updated_at_ms = {now} \
         WHERE {due} AND idempotency_key IN (SELECT idempotency_key FROM notification_intents WHERE {due} \
         ORDER BY created_at_ms LIMIT $5 {lock}) \
         RETURNING idempotency_key, body, recipient, claim_token, attempts, first_attempt_at_ms, may_have_executed, {now} AS db_now_ms"
    );
    let sent = Instant::now();
    let rows = sqlx::query(&sql).bind(PENDING).bind(owner).bind(&token).bind(lease_ms).bind(limit).fetch_all(db.pool()).await?;
    rows.iter().map(|row| row_to_claimed(row, sent)).collect()
}

fn row_to_claimed(row: &AnyRow, sent: Instant) -> Result<Claimed, StoreError> {
    Ok(Claimed {
        key: row.try_get("idempotency_key")?,
        body: row.try_get("body")?,
        recipient: row.try_get("recipient")?,
        token: row.try_get("claim_token")?,
        attempts: row.try_get("attempts")?,
        first_attempt_at_ms: row.try_get("first_attempt_at_ms")?,
        may_have_executed: row.try_get::<i32, _>("may_have_executed")? == 1,
        claimed_at: DbInstant { db_ms: row.try_get("db_now_ms")?, sent },
    })
}

/// The conditional renew before a call: extends the claim to a whole lease
/// from now and counts the attempt, only if the claim is still ours and
/// unexpired. `None`: the claim is lost and no call may start.
pub async fn begin_call(db: &Db, claimed: &Claimed, lease_ms: i64) -> Result<Option<CallStart>, StoreError> {
    let now = db.now_sql();
    let sql = format!(
        "UPDATE notification_intents SET claim_expires_at_ms = {now} + $1, attempts = attempts + 1, \
         first_attempt_at_ms = COALESCE(first_attempt_at_ms, {now}), call_started_at_ms = {now}, updated_at_ms = {now} \
         WHERE idempotency_key = $2 AND claim_token = $3 AND claim_expires_at_ms > {now} \
         RETURNING attempts, first_attempt_at_ms, {now} AS db_now_ms"
    );
    let sent = Instant::now();
    let row = sqlx::query(&sql).bind(lease_ms).bind(&claimed.key).bind(&claimed.token).fetch_optional(db.pool()).await?;
    row.map(|row| {
        Ok(CallStart {
            attempts: row.try_get("attempts")?,
            first_attempt_at_ms: row.try_get("first_attempt_at_ms")?,
            renewed_at: DbInstant { db_ms: row.try_get("db_now_ms")?, sent },
        })
    })
    .transpose()
}

/// Records where an attempt left the intent and clears the claim. `false`:
/// the claim was lost (expired and taken), nothing was written.
pub async fn finish(db: &Db, claimed: &Claimed, transition: &Transition, may_have_executed: bool) -> Result<bool, StoreError> {
    let (receipt, error, next_at) = match transition {
        Transition::Sent { receipt } => (Some(receipt.as_str()), None, 0),
        Transition::Retry { at_ms, reason } => (None, Some(reason.as_str()), *at_ms),
        Transition::Unknown { reason } | Transition::Dead { reason } => (None, Some(reason.as_str()), 0),
        Transition::Conflict { detail } | Transition::Failed { detail } => (None, Some(detail.as_str()), 0),
    };
    let sql = format!(
        "UPDATE notification_intents SET status = $1, receipt = $2, last_error = $3, next_attempt_at_ms = $4, \
         may_have_executed = $5, call_started_at_ms = NULL, claim_owner = NULL, claim_token = NULL, \
         claim_expires_at_ms = NULL, updated_at_ms = {} WHERE idempotency_key = $6 AND claim_token = $7",
        db.now_sql()
    );
    let done = sqlx::query(&sql)
        .bind(transition.status())
        .bind(receipt)
        .bind(error)
        .bind(next_at)
        .bind(i32::from(may_have_executed))
        .bind(&claimed.key)
        .bind(&claimed.token)
        .execute(db.pool())
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives a claim back untouched, for intents this dispatcher claimed but never
/// began to call (shutdown, or a pause before their turn): no lease is owed.
pub async fn release_unsent(db: &Db, claimed: &Claimed) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE notification_intents SET claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL \
         WHERE idempotency_key = $1 AND claim_token = $2 AND call_started_at_ms IS NULL",
    )
    .bind(&claimed.key)
    .bind(&claimed.token)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Undoes [`begin_call`] and gives the claim back: the call did not start,
/// or the provider refused Herald itself (401/403) and executed nothing.
pub async fn release_untouched(db: &Db, claimed: &Claimed) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE notification_intents SET attempts = $1, first_attempt_at_ms = $2, call_started_at_ms = NULL, \
         claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL \
         WHERE idempotency_key = $3 AND claim_token = $4",
    )
    .bind(claimed.attempts)
    .bind(claimed.first_attempt_at_ms)
    .bind(&claimed.key)
    .bind(&claimed.token)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// The database's clock, for rules that compare with times it wrote.
pub async fn db_now(db: &Db) -> Result<i64, StoreError> {
    let row = sqlx::query(&format!("SELECT {} AS now_ms", db.now_sql())).fetch_one(db.pool()).await?;
    Ok(row.try_get("now_ms")?)
}

/// Intents per status, for reports, reconcile and tests.
pub async fn count_by_status(db: &Db, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM notification_intents WHERE status = $1").bind(status).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}
