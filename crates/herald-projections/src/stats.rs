//! The stats projection: completed exports and bytes by day (UTC), caller and
//! format. Its effect is an increment — not idempotent by itself — so it is
//! exactly the kind of effect the inbox exists for: a redelivered or rewound
//! completion must not count twice.

use std::collections::BTreeMap;

use herald_consumer::{Handler, HandlerError};
use herald_envelope::{DecodedEvent, EventData, ExportCompleted};
use herald_store::{Db, StoreError, Tx, now_ms};
use serde::Serialize;
use sqlx::Row;

/// Subscription name, and so consumer group `herald.stats`.
pub const SUBSCRIPTION: &str = "stats";

/// Counts `herald.export.completed`.
#[derive(Debug, Clone, Default)]
pub struct StatsHandler;

type CounterKey = (String, String, String);

impl Handler for StatsHandler {
    fn handles(&self, event_type: &str) -> bool {
        event_type == ExportCompleted::EVENT_TYPE
    }

    async fn apply(&self, tx: &mut Tx<'_>, event: &DecodedEvent) -> Result<(), HandlerError> {
        self.apply_batch(tx, &[event]).await
    }

    async fn apply_batch(&self, tx: &mut Tx<'_>, events: &[&DecodedEvent]) -> Result<(), HandlerError> {
        // Sorted keys: concurrent batches lock counter rows in one order.
        let mut sums: BTreeMap<CounterKey, (i64, i64)> = BTreeMap::new();
        for event in events {
            let data: ExportCompleted = event.data_as()?;
            let sum = sums.entry((day_of(data.completed_at_ms), data.caller, data.format)).or_default();
            sum.0 += 1;
            sum.1 += data.size_bytes;
        }
        increment(tx, &sums).await?;
        Ok(())
    }
}

/// `YYYY-MM-DD` in UTC.
pub fn day_of(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().format("%Y-%m-%d").to_string()
}

async fn increment(tx: &mut Tx<'_>, sums: &BTreeMap<CounterKey, (i64, i64)>) -> Result<(), StoreError> {
    let now = now_ms();
    let entries: Vec<_> = sums.iter().collect();
    for chunk in herald_store::outbox::statement_chunks(&entries) {
        let values: Vec<String> =
            (0..chunk.len()).map(|i| format!("({})", herald_store::outbox::placeholders(i * 6 + 1, 6))).collect();
        let sql = format!(
            "INSERT INTO stats_counters (day, caller, format, exports, bytes, updated_at_ms) VALUES {} \
             ON CONFLICT (day, caller, format) DO UPDATE SET exports = stats_counters.exports + excluded.exports, \
             bytes = stats_counters.bytes + excluded.bytes, updated_at_ms = excluded.updated_at_ms",
            values.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for ((day, caller, format), (exports, bytes)) in chunk {
            query = query.bind(day).bind(caller).bind(format).bind(*exports).bind(*bytes).bind(now);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counter {
    pub day: String,
    pub caller: String,
    pub format: String,
    pub exports: i64,
    pub bytes: i64,
}

/// Every counter, by day, caller and format.
pub async fn counters(db: &Db) -> Result<Vec<Counter>, StoreError> {
    let rows = sqlx::query("SELECT day, caller, format, exports, bytes FROM stats_counters ORDER BY day, caller, format")
        .fetch_all(db.pool())
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Counter {
                day: r.try_get("day")?,
                caller: r.try_get("caller")?,
                format: r.try_get("format")?,
                exports: r.try_get("exports")?,
                bytes: r.try_get("bytes")?,
            })
        })
        .collect()
}

/// Completed exports counted over all days, callers and formats.
pub async fn total_exports(db: &Db) -> Result<i64, StoreError> {
    let row = sqlx::query("SELECT CAST(COALESCE(SUM(exports), 0) AS BIGINT) AS n FROM stats_counters").fetch_one(db.pool()).await?;
    Ok(row.try_get("n")?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn days_are_utc_dates() {
        assert_eq!(super::day_of(0), "1970-01-01");
        assert_eq!(super::day_of(1_764_403_199_999), "2025-11-29");
    }
}
