//! What Herald is doing right now, in figures: outbox backlog and age, relay
//! claims, per-subscription lag, inbox rows and dead letters, notification
//! intents by status, export jobs by status and their intake-to-terminal
//! latency, projection generations.
//!
//! One collector feeds three views: `herald status` (text or JSON),
//! `GET /metrics` (Prometheus text, through the `metrics` crate) and
//! `GET /status` (a self-refreshing dashboard over `GET /status.json`).
//!
//! - [`figures`]: the figures as plain data, and the percentile rule (no IO).
//! - [`queries`]: the database side (sqlx, one SQL path for PostgreSQL and SQLite).
//! - [`counts`]: whole-table counts `herald demo` checks and `herald drill`
//!   drains by, read the same way.
//! - [`lag`]: the broker side (rdkafka): end offsets minus committed offsets.
//! - [`durability`]: each topic's replication and settings, and the rule
//!   naming the settings that can lose acknowledged events (no IO);
//!   `topics` reads them from the broker (metadata, DescribeConfigs).
//! - [`text`]: the human table.
//! - [`monitor`]: a refresh loop for long-running processes, with a ring
//!   buffer of recent samples and the Prometheus registry.
//! - [`shared`]: one process takes the figures for all (a lease on the
//!   `status_snapshot` row), the others read them.

pub mod counting;
pub mod counts;
pub mod durability;
mod error;
pub mod figures;
pub mod lag;
pub mod monitor;
mod prometheus;
pub mod queries;
pub mod shared;
pub mod text;
mod topics;

pub use durability::TopicConfigs;
pub use durability::{Risk, TopicDurability};
pub use error::StatusError;
pub use figures::{Sample, Status};
pub use lag::KafkaProbe;
pub use monitor::{Monitor, MonitorConfig};
pub use topics::topic_configs;

/// The dashboard page served at `GET /status`: self-contained (inline CSS,
/// JS and SVG, nothing fetched from elsewhere), polling `GET /status.json`.
pub const DASHBOARD_HTML: &str = include_str!("dashboard.html");

/// Collects every figure once: the database's, and the broker's when a
/// probe is given (`None`: lag is left out and said so).
pub async fn collect(db: &herald_store::Db, probe: Option<&KafkaProbe>, subscriptions: &[&str]) -> Result<Status, StatusError> {
    let now = herald_store::now_ms();
    let (database, kafka) = tokio::join!(queries::collect(db, subscriptions, now), async {
        match probe {
            Some(p) => Some(p.collect().await),
            None => None,
        }
    });
    let mut status = database?;
    match kafka {
        Some(Ok(kafka)) => status.apply_kafka(kafka),
        Some(Err(e)) => status.kafka_error = Some(e.to_string()),
        None => {
            status.kafka_error = Some("no broker given (--kafka or HERALD_KAFKA_BROKERS): lag and topic durability not measured".into())
        }
    }
    Ok(status)
}
