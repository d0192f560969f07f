//! Reconciliation of intents whose outcome nobody knows. A provider that can
//! be asked is asked; otherwise a person decides, and the decision is
//! recorded as theirs — never as a provider receipt.

use herald_store::{Db, StoreError, now_ms};
use serde::Serialize;
use sqlx::Row;

use crate::provider::{Capabilities, KeyStatus, ProviderClient};
use crate::rules::{DEAD, PENDING, SENT, UNKNOWN};

/// An intent that needs attention.
#[derive(Debug, Clone, Serialize)]
pub struct Open {
    pub idempotency_key: String,
    pub recipient: String,
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    /// Resending may execute it twice at the provider.
    pub resend_may_duplicate: bool,
}

/// `unknown` and `dead` intents, oldest first.
pub async fn open(db: &Db, caps: &Capabilities) -> Result<Vec<Open>, StoreError> {
    let rows = sqlx::query(
        "SELECT idempotency_key, recipient, status, attempts, last_error FROM notification_intents \
         WHERE status IN ($1, $2) ORDER BY created_at_ms",
    )
    .bind(UNKNOWN)
    .bind(DEAD)
    .fetch_all(db.pool())
    .await?;
    rows.iter()
        .map(|r| {
            let status: String = r.try_get("status")?;
            Ok(Open {
                idempotency_key: r.try_get("idempotency_key")?,
                recipient: r.try_get("recipient")?,
                resend_may_duplicate: status == UNKNOWN && !caps.honours_keys,
                status,
                attempts: r.try_get("attempts")?,
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
    /// The provider never accepted the key: safe to send again.
    pub requeued: usize,
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
        match client.status(&intent.idempotency_key).await {
            Ok(KeyStatus::Accepted { receipt }) => {
                settle(db, &intent.idempotency_key, SENT, Some(&receipt), "provider-query").await?;
                settled.confirmed_sent += 1;
            }
            Ok(KeyStatus::NotFound) if caps.honours_keys => {
                settle(db, &intent.idempotency_key, PENDING, None, "provider-query").await?;
                settled.requeued += 1;
            }
            Ok(KeyStatus::NotFound) | Err(_) => settled.still_open += 1,
        }
    }
    Ok(settled)
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
/// no such open intent.
pub async fn decide(db: &Db, key: &str, decision: Decision, operator: &str) -> Result<bool, StoreError> {
    let by = format!("operator:{operator}");
    let (status, receipt) = match decision {
        Decision::MarkSent => (SENT, Some(by.as_str())),
        Decision::Resend => (PENDING, None),
    };
    let done = sqlx::query(
        "UPDATE notification_intents SET status = $1, receipt = $2, resolved_by = $3, next_attempt_at_ms = 0, \
         claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL, updated_at_ms = $4 \
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

async fn settle(db: &Db, key: &str, status: &str, receipt: Option<&str>, by: &str) -> Result<(), StoreError> {
    sqlx::query(
        "UPDATE notification_intents SET status = $1, receipt = $2, resolved_by = $3, next_attempt_at_ms = 0, \
         updated_at_ms = $4 WHERE idempotency_key = $5 AND status = $6",
    )
    .bind(status)
    .bind(receipt)
    .bind(by)
    .bind(now_ms())
    .bind(key)
    .bind(UNKNOWN)
    .execute(db.pool())
    .await?;
    Ok(())
}
