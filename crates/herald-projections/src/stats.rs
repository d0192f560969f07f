//! The stats projection: completed exports and bytes by day (UTC), caller and
//! format. Its effect is an increment — not idempotent by itself — so it is
//! exactly the kind of effect the inbox exists for: a redelivered or rewound
//! completion must not count twice, and a replay keeps its own dedup scope
//! per generation. Counters live in generations, like search documents, so
//! stats can be rebuilt (`herald rebuild stats`).

use std::collections::BTreeMap;

use herald_consumer::{Fingerprint, HandlerError, Projection};
use herald_envelope::{DecodedEvent, EventData, ExportCompleted};
use herald_store::{Db, StoreError, Tx, now_ms};
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::Row;

/// Subscription name, and so consumer group `herald.stats`.
pub const SUBSCRIPTION: &str = "stats";

/// Counts `herald.export.completed`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats;

type CounterKey = (String, String, String);

impl Projection for Stats {
    const NAME: &'static str = SUBSCRIPTION;
    const IDEMPOTENT: bool = false;
    type Fact = ExportCompleted;

    fn handles(event_type: &str) -> bool {
        event_type == ExportCompleted::EVENT_TYPE
    }

    fn fact(event: &DecodedEvent) -> Result<ExportCompleted, HandlerError> {
        Ok(event.data_as()?)
    }

    async fn write(&self, tx: &mut Tx<'_>, generation: i64, facts: &[&ExportCompleted]) -> Result<(), HandlerError> {
        // Sorted keys: concurrent batches lock counter rows in one order.
        let mut sums: BTreeMap<CounterKey, (i64, i64)> = BTreeMap::new();
        for data in facts {
            let sum = sums.entry((day_of(data.completed_at_ms), data.caller.clone(), data.format.clone())).or_default();
            // Sizes are range-checked when decoded; a batch of them can still
            // overflow in theory, and then the batch is split record by
            // record rather than wrapping or panicking.
            sum.0 += 1;
            sum.1 = sum
                .1
                .checked_add(data.size_bytes)
                .ok_or_else(|| HandlerError::Reject(format!("field `size_bytes`: the sum for {} overflows 64 bits", data.caller)))?;
        }
        increment(tx, generation, &sums).await?;
        Ok(())
    }

    async fn fingerprint(&self, tx: &mut Tx<'_>, generation: i64) -> Result<Fingerprint, StoreError> {
        let rows = sqlx::query(
            "SELECT day, caller, format, exports, bytes FROM stats_counters WHERE generation = $1 ORDER BY day, caller, format",
        )
        .bind(generation)
        .fetch_all(&mut **tx)
        .await?;
        let mut hash = Sha256::new();
        for row in &rows {
            for column in ["day", "caller", "format"] {
                hash.update(row.try_get::<String, _>(column)?.as_bytes());
                hash.update([0]);
            }
            hash.update(row.try_get::<i64, _>("exports")?.to_be_bytes());
            hash.update(row.try_get::<i64, _>("bytes")?.to_be_bytes());
        }
        let checksum = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Ok(Fingerprint { rows: rows.len() as i64, other: 0, checksum })
    }
}

/// `YYYY-MM-DD` in UTC.
pub fn day_of(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).unwrap_or_default().format("%Y-%m-%d").to_string()
}

async fn increment(tx: &mut Tx<'_>, generation: i64, sums: &BTreeMap<CounterKey, (i64, i64)>) -> Result<(), StoreError> {
    let now = now_ms();
    let entries: Vec<_> = sums.iter().collect();
    for chunk in herald_store::outbox::statement_chunks(&entries) {
        let values: Vec<String> = (0..chunk.len()).map(|i| format!("({})", herald_store::outbox::placeholders(i * 7 + 1, 7))).collect();
        let sql = format!(
            "INSERT INTO stats_counters (generation, day, caller, format, exports, bytes, updated_at_ms) VALUES {} \
             ON CONFLICT (generation, day, caller, format) DO UPDATE SET exports = stats_counters.exports + excluded.exports, \
             bytes = stats_counters.bytes + excluded.bytes, updated_at_ms = excluded.updated_at_ms",
            values.join(", ")
        );
        let mut query = sqlx::query(&sql);
        for ((day, caller, format), (exports, bytes)) in chunk {
            query = query.bind(generation).bind(day).bind(caller).bind(format).bind(*exports).bind(*bytes).bind(now);
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

/// Every counter of the active generation, by day, caller and format.
pub async fn counters(db: &Db) -> Result<Vec<Counter>, StoreError> {
    let rows = sqlx::query(
        "SELECT day, caller, format, exports, bytes FROM stats_counters c JOIN active_generations g \
         ON g.projection = $1 AND c.generation = g.generation ORDER BY day, caller, format",
    )
    .bind(SUBSCRIPTION)
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

/// Completed exports counted over all days, callers and formats (active generation).
pub async fn total_exports(db: &Db) -> Result<i64, StoreError> {
    let row = sqlx::query(
        "SELECT CAST(COALESCE(SUM(exports), 0) AS BIGINT) AS n FROM stats_counters c JOIN active_generations g \
         ON g.projection = $1 AND c.generation = g.generation",
    )
    .bind(SUBSCRIPTION)
    .fetch_one(db.pool())
    .await?;
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
