//! Per-subscription inbox: the record that a subscription has applied an
//! event's effect. Written in the same transaction as the effect, so "seen"
//! and "applied" cannot disagree.

use herald_envelope::EventKey;

use crate::{StoreError, Tx, now_ms};

/// Where a record was read from, kept for audits and dead-letter redrives.
#[derive(Debug, Clone)]
pub struct Delivery<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
}

/// Claims `key` for `subscription` inside `tx`. `true` means first sight: the
/// caller applies the effect in the same transaction. `false` means the effect
/// was already applied and must not be applied again.
pub async fn claim(
    tx: &mut Tx<'_>,
    subscription: &str,
    key: &EventKey,
    event_type: &str,
    delivery: &Delivery<'_>,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, \
         kafka_offset, processed_at_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (subscription, source, event_id) DO NOTHING",
    )
    .bind(subscription)
    .bind(&key.source)
    .bind(&key.id)
    .bind(event_type)
    .bind(delivery.topic)
    .bind(delivery.partition)
    .bind(delivery.offset)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}
