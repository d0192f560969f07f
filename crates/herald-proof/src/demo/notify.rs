//! The demo's notifications: intents created by the notify subscription, sent
//! by the dispatcher to the in-process keyed simulator, and counted on both
//! sides — Herald's receipts and the receiver's own effects.

use std::time::Duration;

use herald_notify::rules::{PENDING, SENT};
use herald_status::counts;
use herald_store::Db;
use serde::Serialize;
use serde_json::Value;

use super::report::Check;

#[derive(Debug, Clone, Serialize)]
pub struct NotifyCounts {
    pub notification_intents: i64,
    pub notifications_sent: i64,
    pub provider_effects: i64,
    pub provider_requests: i64,
}

/// Waits until no intent is pending (or `within` passes), then counts.
pub async fn gather(db: &Db, provider_url: &str, want: i64, within: Duration) -> anyhow::Result<NotifyCounts> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let tables = counts::collect(db).await?;
        if (tables.intents.total() >= want && tables.intents.of(PENDING) == 0) || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let effects: Value = reqwest::get(format!("{provider_url}/effects")).await?.json().await?;
    let tables = counts::collect(db).await?;
    Ok(NotifyCounts {
        notification_intents: tables.intents.total(),
        notifications_sent: tables.intents_with_receipt.of(SENT),
        provider_effects: effects["effects"].as_i64().unwrap_or(-1),
        provider_requests: effects["requests"].as_i64().unwrap_or(-1),
    })
}

impl NotifyCounts {
    pub fn checks(&self, n: i64) -> Vec<Check> {
        vec![
            Check::new(
                "one notification intent per completion",
                self.notification_intents == n,
                format!("{} (want {n})", self.notification_intents),
            ),
            Check::new(
                "every intent sent with a receipt",
                self.notifications_sent == n,
                format!("{} of {}", self.notifications_sent, self.notification_intents),
            ),
            // At least the lost ACK's retry; a slow machine may time out a
            // call or two more, each replayed under its key just the same.
            Check::new(
                "lost ACK retried with the same key, replayed",
                self.provider_requests > self.provider_effects,
                format!("{} requests for {} effects", self.provider_requests, self.provider_effects),
            ),
            Check::new(
                "provider effects = intents (keyed provider)",
                self.provider_effects == self.notification_intents,
                format!("{} effects from {} requests", self.provider_effects, self.provider_requests),
            ),
        ]
    }
}
