//! Notification intents: one per (event, recipient), status `pending`, keyed
//! by an idempotency key derived from the event's identity and the recipient.
//!
//! Two guards stand between a redelivered completion and a second intent:
//! the `notify` inbox (the effect is applied once per (`source`, `id`)) and
//! the intent's own key (`ON CONFLICT DO NOTHING`), which also holds for a
//! fact that reaches this table by another path, e.g. a redrive.

use std::sync::Arc;

use herald_consumer::{Handler, HandlerError, Record};
use herald_envelope::{DecodedEvent, EventKey};
use herald_store::{Db, StoreError, Tx, now_ms};
use sha2::{Digest, Sha256};
use sqlx::Row;

/// Subscription name, and so consumer group `herald.notify`.
pub const SUBSCRIPTION: &str = "notify";
/// Intent status until a dispatcher claims it.
pub const PENDING: &str = "pending";
/// Kind of notification a completion creates.
pub const KIND_EXPORT_COMPLETED: &str = "export.completed";

use crate::templates::{self, NotifyRules, Rendered};

/// Creates intents from the events its rules take ([`NotifyRules`]; by
/// default Herald's own: a completed export tells its caller).
#[derive(Debug, Clone)]
pub struct NotifyHandler {
    rules: Arc<NotifyRules>,
}

impl Default for NotifyHandler {
    fn default() -> Self {
        NotifyHandler::new(NotifyRules::exports())
    }
}

impl NotifyHandler {
    pub fn new(rules: NotifyRules) -> NotifyHandler {
        NotifyHandler { rules: Arc::new(rules) }
    }
}

/// The intent's idempotency key: the same event and recipient give the same
/// key in every process and on every delivery, so the provider can collapse
/// retries of the same notification.
pub fn idempotency_key(event: &EventKey, recipient: &str) -> String {
    let mut hash = Sha256::new();
    for part in [event.source.as_str(), event.id.as_str(), recipient] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("ntf_{}", &digest[..32])
}

impl Handler for NotifyHandler {
    fn handles(&self, event_type: &str) -> bool {
        self.rules.handles(event_type)
    }

    async fn apply(&self, tx: &mut Tx<'_>, records: &[Record<'_>]) -> Result<(), HandlerError> {
        let mut rows = Vec::with_capacity(records.len());
        for record in records {
            if let Some(rendered) = self.render(record.event)? {
                rows.push((record.event, rendered));
            }
        }
        insert(tx, &rows).await?;
        Ok(())
    }
}

impl NotifyHandler {
    /// The intent `event` creates; an event its rule cannot render is
    /// rejected (dead-lettered, naming the field).
    fn render(&self, event: &DecodedEvent) -> Result<Option<Rendered>, HandlerError> {
        let ext = serde_json::to_value(&event.extensions).map_err(|e| HandlerError::Reject(e.to_string()))?;
        let time = event.time.map(|t| t.to_rfc3339());
        let view =
            templates::view(&event.key.id, &event.key.source, &event.event_type, event.subject.as_deref(), time, event.data_json()?, ext);
        self.rules.render(&event.event_type, &view).map_err(|e| HandlerError::Reject(e.to_string()))
    }
}

async fn insert(tx: &mut Tx<'_>, rows: &[(&DecodedEvent, Rendered)]) -> Result<(), StoreError> {
    let now = now_ms();
    for chunk in herald_store::outbox::statement_chunks(rows) {
        let values: Vec<String> = (0..chunk.len()).map(|i| format!("({})", herald_store::outbox::placeholders(i * 12 + 1, 12))).collect();
        let sql = format!(
            "INSERT INTO notification_intents (idempotency_key, source, event_id, recipient, kind, job_id, body, \
             status, created_at_ms, updated_at_ms, traceparent, tracestate) VALUES {} ON CONFLICT DO NOTHING",
            values.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for (event, rendered) in chunk {
            let recipient = &rendered.recipient;
            query = query
                .bind(idempotency_key(&event.key, recipient))
                .bind(&event.key.source)
                .bind(&event.key.id)
                .bind(recipient)
                .bind(&rendered.kind)
                .bind(&rendered.reference)
                .bind(rendered.body.to_string())
                .bind(PENDING)
                .bind(now)
                .bind(now)
                // The provider call joins the trace of the event behind it.
                .bind(event.trace.as_ref().map(|t| t.traceparent.as_str()))
                .bind(event.trace.as_ref().and_then(|t| t.tracestate.as_deref()));
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Intents in `status`, for reports and tests.
pub async fn count(db: &Db, status: &str) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT COUNT(*) AS n FROM notification_intents WHERE status = $1").bind(status).fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}

/// Statuses an intent never leaves by itself: a prune may remove them once
/// old. `unknown` and `pending` are not among them: one waits for an
/// operator's reconcile, the other for its dispatch.
pub const SETTLED: [&str; 4] = [crate::rules::SENT, crate::rules::CONFLICT, crate::rules::FAILED, crate::rules::DEAD];

/// Up to `limit` settled intents last changed before `before_ms`.
pub async fn prune(db: &Db, before_ms: i64, limit: i64) -> Result<herald_store::prune::Batch, StoreError> {
    let done = sqlx::query(
        "DELETE FROM notification_intents WHERE idempotency_key IN (SELECT idempotency_key FROM notification_intents \
         WHERE status IN ($1, $2, $3, $4) AND created_at_ms < $5 AND updated_at_ms < $5 LIMIT $6)",
    )
    .bind(SETTLED[0])
    .bind(SETTLED[1])
    .bind(SETTLED[2])
    .bind(SETTLED[3])
    .bind(before_ms)
    .bind(limit)
    .execute(db.pool())
    .await?;
    Ok(herald_store::prune::Batch::limited(done.rows_affected(), limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_stable_and_separates_its_parts() {
        let e = EventKey { source: "/herald/exports".into(), id: "1".into() };
        assert_eq!(idempotency_key(&e, "alice"), idempotency_key(&e.clone(), "alice"));
        assert_ne!(idempotency_key(&e, "alice"), idempotency_key(&e, "bob"));
        let shifted = EventKey { source: "/herald/exports1".into(), id: String::new() };
        assert_ne!(idempotency_key(&e, "alice"), idempotency_key(&shifted, "alice"));
        assert!(idempotency_key(&e, "alice").starts_with("ntf_"));
    }
}
