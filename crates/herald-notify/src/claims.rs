//! Claims on intents: the store's lease primitive
//! ([`herald_store::lease`]) on `notification_intents` — an owner, a token
//! and a lease, kept apart from the intent's status, and timed by the
//! database's clock (hosts' clocks may disagree, the database's is the one
//! every dispatcher reads).
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

use herald_envelope::TraceContext;
use herald_store::lease::{Held, LeaseTable, Pick, Take, Token, TokenKind, Value, Write};
use herald_store::{Db, StoreError};
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
    /// The trace of the event that created the intent.
    pub trace: Option<TraceContext>,
}

/// A call that may start: the claim was renewed for it.
#[derive(Debug, Clone, Copy)]
pub struct CallStart {
    /// Attempts made, this one included.
    pub attempts: i32,
    pub first_attempt_at_ms: i64,
    pub renewed_at: DbInstant,
}

/// `notification_intents` as a lease table: no claim is `NULL` throughout.
const INTENT_LEASE: LeaseTable = LeaseTable {
    table: "notification_intents",
    key: "idempotency_key",
    owner: "claim_owner",
    token: "claim_token",
    expires_at: "claim_expires_at_ms",
    token_kind: TokenKind::Minted,
    released: "NULL",
};

impl Claimed {
    fn held(&self) -> Held {
        Held { key: Value::from(self.key.as_str()), token: Token::Text(self.token.clone()) }
    }
}

/// Claims up to `limit` due intents for `owner` for `lease_ms`.
pub async fn claim(db: &Db, owner: &str, lease_ms: i64, limit: i64) -> Result<Vec<Claimed>, StoreError> {
    let now = db.now_sql();
    let due = format!("status = $1 AND next_attempt_at_ms <= {now}");
    // A call started under the claim this one replaces never finished: it may
    // have reached the provider. Set expressions read the row as it was.
    let set = format!(
        "reclaimed = CASE WHEN call_started_at_ms IS NULL THEN 0 ELSE 1 END, \
         may_have_executed = CASE WHEN call_started_at_ms IS NULL THEN may_have_executed ELSE 1 END, \
         call_started_at_ms = NULL, claimed_at_ms = {now}, updated_at_ms = {now}"
    );
    let returning = format!(
        "idempotency_key, body, recipient, claim_token, attempts, first_attempt_at_ms, may_have_executed, traceparent, tracestate, {now} AS db_now_ms"
    );
    let take = Take {
        owner: Some(owner),
        ttl_ms: lease_ms,
        pick: Pick::First { order_by: "created_at_ms", limit },
        eligible: Some(due.as_str()),
        free: Some("claim_expires_at_ms IS NULL"),
        set: Some(set.as_str()),
        returning: &returning,
        binds: 1,
    };
    let statement = INTENT_LEASE.take(db, &take);
    let sent = Instant::now();
    let rows = statement.query(|q| q.bind(PENDING)).fetch_all(db.pool()).await?;
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
        trace: herald_store::outbox::trace_of(row)?,
    })
}

/// The conditional renew before a call: extends the claim to a whole lease
/// from now and counts the attempt, only if the claim is still ours and
/// unexpired. `None`: the claim is lost and no call may start.
pub async fn begin_call(db: &Db, claimed: &Claimed, lease_ms: i64) -> Result<Option<CallStart>, StoreError> {
    let now = db.now_sql();
    let set = format!(
        "attempts = attempts + 1, first_attempt_at_ms = COALESCE(first_attempt_at_ms, {now}), \
         call_started_at_ms = {now}, updated_at_ms = {now}"
    );
    let returning = format!("attempts, first_attempt_at_ms, {now} AS db_now_ms");
    let write = Write { set: &set, extend_ms: Some(lease_ms), unexpired: true, returning: Some(returning.as_str()), ..Write::default() };
    let statement = INTENT_LEASE.write(db, &claimed.held(), &write);
    let sent = Instant::now();
    let row = statement.plain().fetch_optional(db.pool()).await?;
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
    let set = format!(
        "status = $1, receipt = $2, last_error = $3, next_attempt_at_ms = $4, may_have_executed = $5, \
         call_started_at_ms = NULL, updated_at_ms = {}",
        db.now_sql()
    );
    let statement = INTENT_LEASE.release(&claimed.held(), Some(set.as_str()), None, 5);
    let done = statement
        .query(|q| q.bind(transition.status()).bind(receipt).bind(error).bind(next_at).bind(i32::from(may_have_executed)))
        .execute(db.pool())
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives a claim back untouched, for intents this dispatcher claimed but never
/// began to call (shutdown, or a pause before their turn): no lease is owed.
pub async fn release_unsent(db: &Db, claimed: &Claimed) -> Result<(), StoreError> {
    INTENT_LEASE.release(&claimed.held(), None, Some("call_started_at_ms IS NULL"), 0).plain().execute(db.pool()).await?;
    Ok(())
}

/// Undoes [`begin_call`] and gives the claim back: the call did not start,
/// or the provider refused Herald itself (401/403) and executed nothing.
pub async fn release_untouched(db: &Db, claimed: &Claimed) -> Result<(), StoreError> {
    let set = "attempts = $1, first_attempt_at_ms = $2, call_started_at_ms = NULL";
    let statement = INTENT_LEASE.release(&claimed.held(), Some(set), None, 2);
    statement.query(|q| q.bind(claimed.attempts).bind(claimed.first_attempt_at_ms)).execute(db.pool()).await?;
    Ok(())
}

/// The database's clock, for rules that compare with times it wrote.
pub async fn db_now(db: &Db) -> Result<i64, StoreError> {
    herald_store::lease::db_now(db).await
}

/// Intents per status, for reports, reconcile and tests.
pub async fn count_by_status(db: &Db, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM notification_intents WHERE status = $1").bind(status).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}
