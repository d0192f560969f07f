//! The transactional outbox: rows written in the business transaction, read
//! and marked by the relay only after the broker acknowledged them.
//!
//! A row's `status` says what became of it; who may act on it is a separate
//! matter, decided by the claim on its slice (the relay's, in `herald-relay`,
//! on the lease primitive of [`crate::lease`]). The relay's status writes are
//! here, with the rest of the outbox's SQL, and run inside its fenced
//! progress transaction.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use herald_envelope::{OutboxEvent, TraceContext};
use sqlx::Row;
use sqlx::any::AnyRow;
use tracing::Instrument;

use crate::{Backend, Db, StoreError, Tx, now_ms};

/// Row states. `pending` rows are what the relay still owes the broker.
pub const PENDING: &str = "pending";
/// The broker acknowledged the record (`acks=all`); written only after that.
pub const DELIVERED: &str = "delivered";
/// The last publish failed with an error worth retrying; tried again after
/// `next_attempt_at_ms`, and in the meantime it holds back its slice.
pub const RETRYABLE_FAILED: &str = "retryable_failed";
/// The broker or the client rejected the record for good (too large,
/// invalid): not retried, set aside until an operator redrives it.
pub const FAILED: &str = "failed";
/// Retryable failures went on for the configured number of attempts: set
/// aside until an operator redrives it.
pub const DEAD_LETTERED: &str = "dead_lettered";
/// Every status, for validating operator input.
pub const STATUSES: [&str; 5] = [PENDING, DELIVERED, RETRYABLE_FAILED, FAILED, DEAD_LETTERED];

/// Number of slices. Fixed: a row's slice is computed when it is written,
/// so changing this reorders keys in flight (drain the relays first).
pub const SLICES: i32 = 16;

/// The slice of a partition key: FNV-1a, stable across processes, versions
/// and platforms (unlike `std`'s hasher, which is seeded). Every row of a
/// key is in one slice, so the relay holding that slice alone orders them.
pub fn slice_of(partition_key: &str) -> i32 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in partition_key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    (hash % SLICES as u64) as i32
}

/// A committed outbox row as the relay sees it.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub seq: i64,
    pub attempts: i32,
    /// Set while the row waits out a retry backoff.
    pub next_attempt_at_ms: Option<i64>,
    /// Id of the transaction that wrote it (PostgreSQL, as read by the
    /// relay; 0 otherwise): with `seq`, its place in a relay step.
    pub xid: i64,
    pub event: OutboxEvent,
}

/// Columns every written outbox row sets, in the order [`bind_row`] binds them.
const INSERT_COLUMNS: &str = "event_id, source, event_type, subject, event_time_ms, schema_file, \
     data, topic, partition_key, status, created_at_ms, slice, traceparent, tracestate, content_type, extensions";
const INSERT_COLUMN_COUNT: usize = 16;

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// Binds one row's values: the single place that decides what a new outbox
/// row holds, for single and bulk appends alike.
fn bind_row<'q>(query: AnyQuery<'q>, event: &'q OutboxEvent, trace: Option<&'q TraceContext>, now: i64) -> AnyQuery<'q> {
    query
        .bind(&event.id)
        .bind(&event.source)
        .bind(&event.event_type)
        .bind(&event.subject)
        .bind(event.time.timestamp_millis())
        .bind(&event.schema_file)
        .bind(&event.data)
        .bind(&event.topic)
        .bind(&event.partition_key)
        .bind(PENDING)
        .bind(now)
        .bind(slice_of(&event.partition_key))
        .bind(trace.map(|t| t.traceparent.as_str()))
        .bind(trace.and_then(|t| t.tracestate.as_deref()))
        .bind(&event.content_type)
        .bind(extensions_json(&event.extensions))
}

/// The `extensions` column: a JSON object of strings, NULL when none.
fn extensions_json(extensions: &BTreeMap<String, String>) -> Option<String> {
    (!extensions.is_empty()).then(|| serde_json::to_string(extensions).expect("a map of strings serializes"))
}

fn extensions_from(text: Option<String>) -> Result<BTreeMap<String, String>, StoreError> {
    let Some(text) = text else { return Ok(BTreeMap::new()) };
    serde_json::from_str(&text).map_err(|e| StoreError::Config(format!("outbox row with unreadable extensions {text:?}: {e}")))
}

/// Tells the relay of this process that rows of `partition_keys` committed,
/// so it reads their slices now instead of at its next poll. Call it after
/// the commit of a transaction that appended; on PostgreSQL the outbox
/// trigger's `NOTIFY` does the same for every relay, on SQLite only this
/// does (see [`crate::appended`]).
pub fn announce<'a>(db: &Db, partition_keys: impl IntoIterator<Item = &'a str>) {
    db.appended().announce(partition_keys);
}

/// Appends `event` inside the caller's transaction; returns its sequence.
/// An event without trace context is written in the `outbox.append` span's,
/// a child of the caller's span: the relay and every consumer join it.
pub async fn append(tx: &mut Tx<'_>, event: &OutboxEvent) -> Result<i64, StoreError> {
    let span = tracing::info_span!("outbox.append", event_id = %event.id, event_type = %event.event_type, topic = %event.topic);
    let own = event.trace.is_none().then(|| herald_trace::context_of(&span)).flatten();
    let trace = event.trace.as_ref().or(own.as_ref());
    let row = if tx.backend_name() == "PostgreSQL" {
        contract_call(event, trace).fetch_one(&mut **tx).instrument(span).await?
    } else {
        let sql = format!("INSERT INTO outbox ({INSERT_COLUMNS}) VALUES ({}) RETURNING seq", placeholders(1, INSERT_COLUMN_COUNT));
        bind_row(sqlx::query(&sql), event, trace, now_ms()).fetch_one(&mut **tx).instrument(span).await?
    };
    Ok(row.try_get("seq")?)
}

/// The outbox contract's `herald.append_event` with `event`'s attributes:
/// Herald's own events go in the way any application's do on PostgreSQL
/// (docs/outbox-contract.md), naming their topic.
fn contract_call<'q>(event: &'q OutboxEvent, trace: Option<&'q TraceContext>) -> AnyQuery<'q> {
    sqlx::query(
        "SELECT herald.append_event(source => $1, id => $2, type => $3, subject => $4, partition_key => $5, data => $6, \
         content_type => $7, dataschema => NULLIF($8, ''), extensions => CAST($9 AS JSONB), topic => $10, \
         \"time\" => to_timestamp(CAST($11 AS DOUBLE PRECISION) / 1000), traceparent => $12, tracestate => $13) AS seq",
    )
    .bind(&event.source)
    .bind(&event.id)
    .bind(&event.event_type)
    .bind(&event.subject)
    .bind(&event.partition_key)
    .bind(&event.data)
    .bind(&event.content_type)
    .bind(&event.schema_file)
    .bind(extensions_json(&event.extensions))
    .bind(&event.topic)
    .bind(event.time.timestamp_millis())
    .bind(trace.map(|t| t.traceparent.as_str()))
    .bind(trace.and_then(|t| t.tracestate.as_deref()))
}

/// Columns [`row_to_outbox`] reads, in the order it reads them: every
/// result it reads begins with these (the relay's read adds the row's xid
/// after them, at [`ROW_COLUMN_COUNT`]).
pub const ROW_COLUMNS: &str = "seq, attempts, next_attempt_at_ms, event_id, source, event_type, \
     subject, event_time_ms, schema_file, data, topic, partition_key, traceparent, tracestate, content_type, extensions";

/// How many columns [`ROW_COLUMNS`] names.
pub const ROW_COLUMN_COUNT: usize = 16;

/// Where each of [`ROW_COLUMNS`] is. Read by position: a lookup by name
/// hashes the name for every column of every row, a quarter of the
/// relay's decoding (`tests::ordinals_follow_the_column_list`).
mod at {
    pub const SEQ: usize = 0;
    pub const ATTEMPTS: usize = 1;
    pub const NEXT_ATTEMPT_AT_MS: usize = 2;
    pub const EVENT_ID: usize = 3;
    pub const SOURCE: usize = 4;
    pub const EVENT_TYPE: usize = 5;
    pub const SUBJECT: usize = 6;
    pub const EVENT_TIME_MS: usize = 7;
    pub const SCHEMA_FILE: usize = 8;
    pub const DATA: usize = 9;
    pub const TOPIC: usize = 10;
    pub const PARTITION_KEY: usize = 11;
    pub const TRACEPARENT: usize = 12;
    pub const TRACESTATE: usize = 13;
    pub const CONTENT_TYPE: usize = 14;
    pub const EXTENSIONS: usize = 15;
}

/// An outbox row from a result row of either driver: `Any` (every query of
/// the store) or native PostgreSQL (the relay's read, where `Any`'s copy of
/// every row and of its column list is most of the client's work).
pub fn row_to_outbox<R>(row: &R) -> Result<OutboxRow, StoreError>
where
    R: Row,
    usize: sqlx::ColumnIndex<R>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i32: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Vec<u8>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let time_ms: i64 = row.try_get(at::EVENT_TIME_MS)?;
    let traceparent: Option<String> = row.try_get(at::TRACEPARENT)?;
    let tracestate: Option<String> = row.try_get(at::TRACESTATE)?;
    Ok(OutboxRow {
        seq: row.try_get(at::SEQ)?,
        attempts: row.try_get(at::ATTEMPTS)?,
        next_attempt_at_ms: row.try_get(at::NEXT_ATTEMPT_AT_MS)?,
        xid: 0,
        event: OutboxEvent {
            id: row.try_get(at::EVENT_ID)?,
            source: row.try_get(at::SOURCE)?,
            event_type: row.try_get(at::EVENT_TYPE)?,
            subject: row.try_get(at::SUBJECT)?,
            time: DateTime::<Utc>::from_timestamp_millis(time_ms).unwrap_or_default(),
            schema_file: row.try_get(at::SCHEMA_FILE)?,
            data: row.try_get(at::DATA)?,
            content_type: row.try_get(at::CONTENT_TYPE)?,
            extensions: extensions_from(row.try_get(at::EXTENSIONS)?)?,
            topic: row.try_get(at::TOPIC)?,
            partition_key: row.try_get(at::PARTITION_KEY)?,
            trace: traceparent.and_then(|p| TraceContext::parse(&p, tracestate.as_deref())),
        },
    })
}

/// The stored trace context of a row with `traceparent` and `tracestate`
/// columns (outbox rows, notification intents); a value that is not a W3C
/// traceparent (written by hand) is no context.
pub fn trace_of(row: &AnyRow) -> Result<Option<TraceContext>, StoreError> {
    let parent: Option<String> = row.try_get("traceparent")?;
    let state: Option<String> = row.try_get("tracestate")?;
    Ok(parent.and_then(|p| TraceContext::parse(&p, state.as_deref())))
}

/// What became of a row that was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setback {
    pub seq: i64,
    /// [`RETRYABLE_FAILED`], [`FAILED`] or [`DEAD_LETTERED`].
    pub status: &'static str,
    pub error: String,
    /// For a retryable failure: not before this time.
    pub next_attempt_at_ms: Option<i64>,
}

/// Marks rows delivered, inside the relay's fenced progress transaction:
/// call only with rows whose delivery report succeeded. By primary key, and
/// no indexed column changes: HOT updates, no index churn. PostgreSQL gets
/// the keys as one array literal (one parameter, one cached statement,
/// whatever the batch size); SQLite a list of parameters.
pub async fn mark_delivered(db: &Db, tx: &mut Tx<'_>, seqs: &[i64]) -> Result<(), StoreError> {
    let now = db.now_sql();
    let set = format!("UPDATE outbox SET status = $1, delivered_at_ms = {now}, attempts = attempts + 1, next_attempt_at_ms = NULL");
    if seqs.is_empty() {
        return Ok(());
    }
    if db.backend() == Backend::Postgres {
        let list = seqs.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
        sqlx::query(&format!("{set} WHERE seq = ANY(CAST($2 AS TEXT)::BIGINT[])"))
            .bind(DELIVERED)
            .bind(format!("{{{list}}}"))
            .execute(&mut **tx)
            .await?;
        return Ok(());
    }
    for chunk in seqs.chunks(1000) {
        let sql = format!("{set} WHERE seq IN ({})", placeholders(2, chunk.len()));
        let mut query = sqlx::query(&sql).bind(DELIVERED);
        for seq in chunk {
            query = query.bind(*seq);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Records setbacks, inside the relay's fenced progress transaction. A row
/// set aside for an operator is also listed in `outbox_set_aside`, so that
/// counting and listing them never scans the outbox.
pub async fn set_back(tx: &mut Tx<'_>, setbacks: &[Setback]) -> Result<(), StoreError> {
    for setback in setbacks {
        sqlx::query(
            "UPDATE outbox SET status = $1, attempts = attempts + 1, last_error = $2, \
             next_attempt_at_ms = $3 WHERE seq = $4",
        )
        .bind(setback.status)
        .bind(&setback.error)
        .bind(setback.next_attempt_at_ms)
        .bind(setback.seq)
        .execute(&mut **tx)
        .await?;
        if REDRIVABLE.contains(&setback.status) {
            sqlx::query(
                "INSERT INTO outbox_set_aside (seq, status, created_at_ms) SELECT seq, status, created_at_ms FROM outbox WHERE seq = $1 \
                 ON CONFLICT (seq) DO UPDATE SET status = excluded.status",
            )
            .bind(setback.seq)
            .execute(&mut **tx)
            .await?;
        }
    }
    Ok(())
}

/// Rows per status as an operator means it (see [`crate::delivered`]: a
/// row the relay's cursor passed is delivered), for reports and tests.
pub async fn count_by_status(db: &Db, status: &str) -> Result<i64, StoreError> {
    crate::delivered::count(db, status).await
}

/// `$start, $start+1, …` — sqlx's `Any` driver has no array binds.
pub fn placeholders(start: usize, count: usize) -> String {
    (start..start + count).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// One row as an operator lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub seq: i64,
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub topic: String,
    pub partition_key: String,
    pub status: String,
    pub attempts: i32,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub next_attempt_at_ms: Option<i64>,
}

/// Rows in `status` (as [`crate::delivered`] derives it), oldest first. Not
/// indexed on purpose (an index on the status would cost every relay write
/// more than this costs an operator).
pub async fn list(db: &Db, status: &str, limit: i64) -> Result<Vec<Listed>, StoreError> {
    let derived = crate::delivered::status_sql(db.backend());
    let sql = format!(
        "SELECT * FROM (SELECT o.seq, o.source, o.event_id, o.event_type, o.topic, o.partition_key, {derived} AS status, \
         o.attempts, o.last_error, o.created_at_ms, o.next_attempt_at_ms FROM {}) AS listed WHERE status = $1 ORDER BY seq LIMIT $2",
        crate::delivered::FROM_OUTBOX
    );
    let rows = sqlx::query(&sql).bind(status).bind(limit).fetch_all(db.pool()).await?;
    rows.iter()
        .map(|r| {
            Ok(Listed {
                seq: r.try_get("seq")?,
                source: r.try_get("source")?,
                event_id: r.try_get("event_id")?,
                event_type: r.try_get("event_type")?,
                topic: r.try_get("topic")?,
                partition_key: r.try_get("partition_key")?,
                status: r.try_get("status")?,
                attempts: r.try_get("attempts")?,
                last_error: r.try_get("last_error")?,
                created_at_ms: r.try_get("created_at_ms")?,
                next_attempt_at_ms: r.try_get("next_attempt_at_ms")?,
            })
        })
        .collect()
}

/// Statuses an operator may redrive: rows the relay set aside.
pub const REDRIVABLE: [&str; 2] = [FAILED, DEAD_LETTERED];

/// Puts set-aside rows (`failed`, `dead_lettered`) back in line: each is
/// re-appended as a new `pending` row with the same event (same CloudEvents
/// `source` and `id`) and the old row is removed, in one transaction.
///
/// Re-appending rather than resetting the status is what makes the relay see
/// it: relays read forward, and a redriven row is, for ordering, a fact
/// committed now — it is published after what its key published meanwhile.
/// Returns `(old seq, new seq)` pairs; rows not set aside are left alone.
pub async fn redrive(db: &Db, seqs: &[i64]) -> Result<Vec<(i64, i64)>, StoreError> {
    let mut tx = db.begin().await?;
    let mut moved = Vec::new();
    for &seq in seqs {
        let old =
            sqlx::query(&format!("DELETE FROM outbox WHERE seq = $1 AND status IN ($2, $3) RETURNING {ROW_COLUMNS}, last_error, slice"))
                .bind(seq)
                .bind(FAILED)
                .bind(DEAD_LETTERED)
                .fetch_optional(&mut *tx)
                .await?;
        let Some(old) = old else { continue };
        sqlx::query("DELETE FROM outbox_set_aside WHERE seq = $1").bind(seq).execute(&mut *tx).await?;
        let row = row_to_outbox(&old)?;
        let last_error: Option<String> = old.try_get("last_error")?;
        let new = sqlx::query(
            "INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, \
             data, topic, partition_key, status, created_at_ms, slice, attempts, last_error, traceparent, tracestate, \
             content_type, extensions) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0, $13, $14, $15, $16, $17) RETURNING seq",
        )
        .bind(&row.event.id)
        .bind(&row.event.source)
        .bind(&row.event.event_type)
        .bind(&row.event.subject)
        .bind(row.event.time.timestamp_millis())
        .bind(&row.event.schema_file)
        .bind(&row.event.data)
        .bind(&row.event.topic)
        .bind(&row.event.partition_key)
        .bind(PENDING)
        .bind(now_ms())
        .bind(old.try_get::<i32, _>("slice")?)
        .bind(last_error.map(|e| format!("redriven; before: {e}")))
        .bind(row.event.trace.as_ref().map(|t| t.traceparent.clone()))
        .bind(row.event.trace.as_ref().and_then(|t| t.tracestate.clone()))
        .bind(&row.event.content_type)
        .bind(extensions_json(&row.event.extensions))
        .fetch_one(&mut *tx)
        .await?;
        moved.push((seq, new.try_get("seq")?));
    }
    tx.commit().await?;
    Ok(moved)
}

/// Sequences of every row in `status`, oldest first (for redriving a status).
pub async fn seqs_with_status(db: &Db, status: &str) -> Result<Vec<i64>, StoreError> {
    let rows = sqlx::query("SELECT seq FROM outbox WHERE status = $1 ORDER BY seq").bind(status).fetch_all(db.pool()).await?;
    rows.iter().map(|r| Ok(r.try_get("seq")?)).collect()
}

/// Appends many events inside the caller's transaction, several rows per
/// statement (bulk writers, benchmarks). Same rows as [`append`].
pub async fn append_many(tx: &mut Tx<'_>, events: &[OutboxEvent]) -> Result<(), StoreError> {
    let now = now_ms();
    // Rows in statements of a few fixed sizes: a writer's batches of every
    // size would otherwise each be prepared anew (see STATEMENT_ROWS).
    for chunk in events.chunks(400).flat_map(statement_chunks) {
        let values: Vec<String> =
            (0..chunk.len()).map(|i| format!("({})", placeholders(1 + i * INSERT_COLUMN_COUNT, INSERT_COLUMN_COUNT))).collect();
        let sql = format!("INSERT INTO outbox ({INSERT_COLUMNS}) VALUES {}", values.join(", "));
        let mut query = sqlx::query(&sql);
        for event in chunk {
            query = bind_row(query, event, event.trace.as_ref(), now);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Row counts of multi-row statements. Every distinct row count is a distinct
/// SQL text, and PostgreSQL prepares (parses and plans) each text once per
/// connection: thousands-of-parameters statements of arbitrary sizes would be
/// prepared over and over. Cutting batches into these few sizes keeps the
/// statement cache warm at the cost of a few more round trips for a tail.
const STATEMENT_ROWS: [usize; 10] = [1000, 500, 200, 100, 50, 20, 10, 5, 2, 1];

/// `items` cut into slices whose lengths are all in [`STATEMENT_ROWS`].
pub fn statement_chunks<T>(items: &[T]) -> Vec<&[T]> {
    let mut out = Vec::new();
    let mut rest = items;
    while !rest.is_empty() {
        let size = STATEMENT_ROWS.iter().copied().find(|s| *s <= rest.len()).unwrap_or(1);
        let (head, tail) = rest.split_at(size);
        out.push(head);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_are_stable_and_spread() {
        // Pinned values: a change here reorders every deployed outbox.
        assert_eq!(slice_of(""), (0xcbf2_9ce4_8422_2325u64 % 16) as i32);
        let mut seen = [0usize; SLICES as usize];
        for i in 0..1600 {
            seen[slice_of(&format!("key-{i}")) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
        assert_eq!(slice_of("job-42"), slice_of("job-42"));
    }

    #[test]
    fn statement_chunks_use_few_sizes_and_keep_order() {
        let items: Vec<usize> = (0..2987).collect();
        let chunks = super::statement_chunks(&items);
        assert_eq!(chunks.concat(), items);
        assert!(chunks.iter().all(|c| super::STATEMENT_ROWS.contains(&c.len())));
        assert!(chunks.len() <= 12, "{}", chunks.len());
    }

    #[test]
    fn ordinals_follow_the_column_list() {
        let names: Vec<&str> = ROW_COLUMNS.split(',').map(str::trim).collect();
        let ordinals = [
            ("seq", at::SEQ),
            ("attempts", at::ATTEMPTS),
            ("next_attempt_at_ms", at::NEXT_ATTEMPT_AT_MS),
            ("event_id", at::EVENT_ID),
            ("source", at::SOURCE),
            ("event_type", at::EVENT_TYPE),
            ("subject", at::SUBJECT),
            ("event_time_ms", at::EVENT_TIME_MS),
            ("schema_file", at::SCHEMA_FILE),
            ("data", at::DATA),
            ("topic", at::TOPIC),
            ("partition_key", at::PARTITION_KEY),
            ("traceparent", at::TRACEPARENT),
            ("tracestate", at::TRACESTATE),
            ("content_type", at::CONTENT_TYPE),
            ("extensions", at::EXTENSIONS),
        ];
        assert_eq!(names.len(), ordinals.len());
        assert_eq!(names.len(), ROW_COLUMN_COUNT);
        for (name, at) in ordinals {
            assert_eq!(names[at], name);
        }
    }
}
