//! The rows both systems publish: one payload per event, written to
//! Herald's outbox and to the table Debezium's outbox router reads.
//!
//! The payload is the record's value on both topics: JSON padded to the
//! event size, with a number unique in the run (`n`, to match a record to
//! its commit) and a sequence per partition key (`seq`, to check per-key
//! order on the topic).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::Utc;
use herald_envelope::OutboxEvent;
use herald_store::{Db, outbox};
use serde::Deserialize;

/// Debezium's outbox table: the columns its EventRouter reads by default.
pub(super) const DEBEZIUM_TABLE: &str = "CREATE TABLE debezium_outbox (
    id text PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload text NOT NULL)";

/// What a record's value says about it.
#[derive(Debug, Deserialize)]
pub(super) struct Payload {
    pub n: u64,
    pub key: String,
    pub seq: u64,
}

/// Numbers events and their per-key sequences across a run's batches.
pub(super) struct Events {
    pub herald_topic: String,
    keys: u64,
    size: usize,
    next: u64,
    seq: HashMap<u64, u64>,
}

/// One event, as both tables get it.
pub(super) struct Row {
    pub n: u64,
    pub id: uuid::Uuid,
    pub key: String,
    pub payload: String,
}

impl Events {
    pub fn new(herald_topic: &str, keys: u64, size: usize) -> Events {
        Events { herald_topic: herald_topic.to_owned(), keys, size, next: 0, seq: HashMap::new() }
    }

    pub fn next_rows(&mut self, count: u64) -> Vec<Row> {
        (0..count)
            .map(|_| {
                let n = self.next;
                self.next += 1;
                let k = n % self.keys;
                let seq = self.seq.entry(k).or_default();
                *seq += 1;
                let key = format!("key-{k}");
                let head = format!(r#"{{"n":{n},"key":"{key}","seq":{seq},"pad":""#);
                let pad = "x".repeat(self.size.saturating_sub(head.len() + 2));
                Row { n, id: uuid::Uuid::now_v7(), key, payload: format!(r#"{head}{pad}"}}"#) }
            })
            .collect()
    }

    fn herald_event(&self, row: &Row) -> OutboxEvent {
        OutboxEvent {
            id: row.id.to_string(),
            source: "/herald/bench/peers".to_owned(),
            event_type: "herald.bench.peer".to_owned(),
            subject: row.key.clone(),
            time: Utc::now(),
            schema_file: "bench.avsc".to_owned(),
            data: row.payload.clone().into_bytes(),
            content_type: herald_envelope::AVRO_CONTENT_TYPE.to_owned(),
            extensions: Default::default(),
            topic: self.herald_topic.clone(),
            partition_key: row.key.clone(),
            trace: None,
        }
    }
}

/// Which tables a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tables {
    Both,
    Herald,
    Debezium,
}

/// Writes `rows` in one transaction to `tables`.
pub(super) async fn write(db: &Db, events: &Events, rows: &[Row], tables: Tables) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    if tables != Tables::Debezium {
        let herald: Vec<OutboxEvent> = rows.iter().map(|r| events.herald_event(r)).collect();
        outbox::append_many(&mut tx, &herald).await?;
    }
    if tables != Tables::Herald {
        // PostgreSQL's numbered placeholders (the Any driver passes them through).
        let values: Vec<String> =
            (0..rows.len()).map(|i| format!("(${}, 'bench', ${}, 'herald.bench.peer', ${})", 3 * i + 1, 3 * i + 2, 3 * i + 3)).collect();
        let sql = format!("INSERT INTO debezium_outbox (id, aggregatetype, aggregateid, type, payload) VALUES {}", values.join(", "));
        let mut query = sqlx::query(&sql);
        for row in rows {
            query = query.bind(row.id.to_string()).bind(row.key.clone()).bind(row.payload.clone());
        }
        query.execute(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Fills both tables with `count` events, in transactions of `batch`.
pub(super) async fn fill(db: &Db, events: &mut Events, count: u64, batch: u64) -> anyhow::Result<()> {
    let mut written = 0;
    while written < count {
        let rows = events.next_rows(batch.min(count - written));
        write(db, events, &rows, Tables::Both).await?;
        written += rows.len() as u64;
    }
    sqlx::query("ANALYZE outbox").execute(db.pool()).await?;
    Ok(())
}

/// Offers `rate` events/s to `tables` for `secs`: every 10 ms a transaction
/// of the events due by then. Returns each event's commit instant, by `n`.
pub(super) async fn paced(db: &Db, events: &mut Events, tables: Tables, rate: u64, secs: u64) -> anyhow::Result<HashMap<u64, Instant>> {
    let (start, total) = (Instant::now(), rate * secs);
    let mut committed = HashMap::with_capacity(usize::try_from(total)?);
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sent = 0u64;
    while sent < total {
        ticks.tick().await;
        let due = ((start.elapsed().as_secs_f64() * rate as f64) as u64).min(total);
        if due <= sent {
            continue;
        }
        let rows = events.next_rows(due - sent);
        write(db, events, &rows, tables).await?;
        let now = Instant::now();
        committed.extend(rows.iter().map(|r| (r.n, now)));
        sent = due;
    }
    Ok(committed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_the_event_size_and_number_keys_in_order() {
        let mut events = Events::new("t", 3, 200);
        let rows = events.next_rows(7);
        for row in &rows {
            assert_eq!(row.payload.len(), 200, "{}", row.payload);
        }
        let parsed: Vec<Payload> = rows.iter().map(|r| serde_json::from_str(&r.payload).expect("JSON")).collect();
        assert_eq!(parsed.iter().map(|p| p.n).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
        let key1: Vec<u64> = parsed.iter().filter(|p| p.key == "key-1").map(|p| p.seq).collect();
        assert_eq!(key1, vec![1, 2]);
    }
}
