//! Reconciliation of intents whose outcome nobody knows, and operators'
//! redrives. A provider that can be asked is asked; otherwise a person
//! decides, and the decision is recorded as theirs (`resolved_by`) — never as
//! a provider receipt.

use herald_store::{Db, StoreError, now_ms};
use serde::Serialize;
use sqlx::Row;

use crate::claims::db_now;
use crate::provider::{Capabilities, ProviderClient};
use crate::rules::{self, CONFLICT, DEAD, FAILED, PENDING, QueryVerdict, SENT, UNKNOWN};

/// An intent that needs attention.
#[derive(Debug, Clone, Serialize)]
pub struct Open {
    pub idempotency_key: String,
    pub recipient: String,
    pub status: String,
    pub attempts: i32,
    pub first_attempt_at_ms: Option<i64>,
    pub last_error: Option<String>,
    /// Resending may execute it twice at the provider: it has no keys, or it
    /// may have forgotten this one.
    pub resend_may_duplicate: bool,
}

/// `unknown` and `dead` intents, oldest first.
pub async fn open(db: &Db, caps: &Capabilities) -> Result<Vec<Open>, StoreError> {
    let now = db_now(db).await?;
    let rows = sqlx::query(
        "SELECT idempotency_key, recipient, status, attempts, first_attempt_at_ms, last_error FROM notification_intents \
         WHERE status IN ($1, $2) ORDER BY created_at_ms",
    )
    .bind(UNKNOWN)
    .bind(DEAD)
    .fetch_all(db.pool())
    .await?;
    rows.iter()
        .map(|r| {
            let status: String = r.try_get("status")?;
            let first: Option<i64> = r.try_get("first_attempt_at_ms")?;
            let remembered = first.is_some_and(|first| rules::inside_retention(caps, first, now));
            Ok(Open {
                idempotency_key: r.try_get("idempotency_key")?,
                recipient: r.try_get("recipient")?,
                resend_may_duplicate: status == UNKNOWN && !remembered,
                status,
                attempts: r.try_get("attempts")?,
                first_attempt_at_ms: first,
                last_error: r.try_get("last_error")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(StoreError::from)
}

/// What asking the provider settled.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Settled {
    pub confirmed_sent: usize,
    /// The provider never accepted the key, and would remember it if it had:
    /// safe to send again.
    pub requeued: usize,
    /// Not found, but past the key's retention: proves nothing; stays `unknown`.
    pub past_retention: usize,
    pub still_open: usize,
}

/// Asks a queryable, keyed provider about every `unknown` intent.
pub async fn ask_provider(db: &Db, client: &ProviderClient, caps: &Capabilities) -> Result<Settled, StoreError> {
    let mut settled = Settled::default();
    for intent in open(db, caps).await?.into_iter().filter(|i| i.status == UNKNOWN) {
        if !caps.queryable {
            settled.still_open += 1;
            continue;
        }
        let Ok(answer) = client.status(&intent.idempotency_key).await else {
            settled.still_open += 1;
            continue;
        };
        let key = intent.idempotency_key.as_str();
        match rules::after_query(answer, caps, intent.first_attempt_at_ms, db_now(db).await?) {
            QueryVerdict::Sent { receipt } => {
                settle(db, key, SENT, Some(&receipt)).await?;
                settled.confirmed_sent += 1;
            }
            QueryVerdict::Requeue => {
                settle(db, key, PENDING, None).await?;
                settled.requeued += 1;
            }
            QueryVerdict::PastRetention { reason } => {
                note_reason(db, key, &reason).await?;
                settled.past_retention += 1;
            }
            QueryVerdict::StaysUnknown { reason } => {
                note_reason(db, key, &reason).await?;
                settled.still_open += 1;
            }
        }
    }
    Ok(settled)
}

/// Records what the provider's answer settled. A requeue clears
/// `may_have_executed`: inside retention, not found proves it never ran.
async fn settle(db: &Db, key: &str, status: &str, receipt: Option<&str>) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE notification_intents SET status = $1, receipt = $2, resolved_by = 'provider-query', next_attempt_at_ms = 0, \
         may_have_executed = 0, updated_at_ms = $3 WHERE idempotency_key = $4 AND status = $5",
    )
    .bind(status)
    .bind(receipt)
    .bind(now_ms())
    .bind(key)
    .bind(UNKNOWN)
    .execute(db.pool())
    .await?;
    Ok(())
}

/// Why an `unknown` intent stays so after asking, for the operator.
async fn note_reason(db: &Db, key: &str, reason: &str) -> Result<(), StoreError> {
    sqlx::query("UPDATE notification_intents SET last_error = $1, updated_at_ms = $2 WHERE idempotency_key = $3 AND status = $4")
        .bind(reason)
        .bind(now_ms())
        .bind(key)
        .bind(UNKNOWN)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// An operator's decision on one intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The operator has evidence it was delivered.
    MarkSent,
    /// Send again, accepting the risk `resend_may_duplicate` describes.
    Resend,
}

/// Applies an operator's decision to an `unknown` or `dead` intent. `false`:
/// no such open intent. A resend is the operator's acceptance of the
/// duplicate risk, so the intent is sent as if nothing had executed.
pub async fn decide(db: &Db, key: &str, decision: Decision, operator: &str) -> Result<bool, StoreError> {
    let by = format!("operator:{operator}");
    let (status, receipt) = match decision {
        Decision::MarkSent => (SENT, Some(by.as_str())),
        Decision::Resend => (PENDING, None),
    };
    let done = sqlx::query(
        "UPDATE notification_intents SET status = $1, receipt = $2, resolved_by = $3, next_attempt_at_ms = 0, \
         may_have_executed = 0, claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL, updated_at_ms = $4 \
         WHERE idempotency_key = $5 AND status IN ($6, $7)",
    )
    .bind(status)
    .bind(receipt)
    .bind(&by)
    .bind(now_ms())
    .bind(key)
    .bind(UNKNOWN)
    .bind(DEAD)
    .execute(db.pool())
    .await?;
    Ok(done.rows_affected() == 1)
}

/// What `herald notify redrive` requeues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redrive {
    /// One `failed` or `conflict` intent.
    Key(String),
    /// Every intent in `failed`.
    Failed,
    /// Every intent in `conflict`.
    Conflict,
}

/// Requeues `failed` and `conflict` intents after their cause was fixed, as
/// the operator's act (`resolved_by`); returns the keys requeued. The next
/// attempt follows the usual rules, so an intent that may have executed
/// before is still resent only inside the key's retention.
pub async fn redrive(db: &Db, what: &Redrive, operator: &str) -> Result<Vec<String>, StoreError> {
    let (filter, value) = match what {
        Redrive::Key(key) => ("idempotency_key = $6", key.as_str()),
        Redrive::Failed => ("status = $6", FAILED),
        Redrive::Conflict => ("status = $6", CONFLICT),
    };
    let sql = format!(
        "UPDATE notification_intents SET status = $1, resolved_by = $2, next_attempt_at_ms = 0, updated_at_ms = $3 \
         WHERE status IN ($4, $5) AND {filter} RETURNING idempotency_key"
    );
    let rows = sqlx::query(&sql)
        .bind(PENDING)
        .bind(format!("operator:{operator}"))
        .bind(now_ms())
        .bind(FAILED)
        .bind(CONFLICT)
        .bind(value)
        .fetch_all(db.pool())
        .await?;
    rows.iter().map(|r| Ok(r.try_get("idempotency_key")?)).collect()
}
