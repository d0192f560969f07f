//! The database's figures. Plain reads in the SQL subset both backends
//! accept; nothing here writes.
//!
//! Cost: every figure is a range of an index, so a refresh costs what is
//! actionable (the backlog, set-aside rows, open jobs), not the size of the
//! tables (issue 19: under 50 ms with 10M outbox rows, `herald bench
//! status`). The backlog is what lies after each slice's relay cursor;
//! set-aside rows have their own table; counts of settled rows are exact up
//! to [`counting::EXACT_UP_TO`] and labelled estimates above it.

use std::collections::BTreeMap;

use herald_store::delivered::{self, SliceCursor};
use herald_store::{Backend, Db, StoreError, dead_letter, outbox, parked};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::counting::{self, Count, EXACT_UP_TO, Reading, literal};
use crate::figures::{GenerationFigures, Jobs, Latency, Notifications, Outbox, ParkedKeyFigures, RelayClaims, Status, SubscriptionFigures};

/// Finished jobs the latency percentiles are taken over: the most recent.
pub const LATENCY_SAMPLE: i64 = 10_000;

/// Parked keys shown per subscription: the oldest.
pub const PARKED_KEYS_SHOWN: i64 = 5;

/// Every database figure, with ages measured from `now_ms`.
/// All read in one transaction ([`Reading`]), so they agree with each other.
pub async fn collect(db: &Db, subscriptions: &[&str], now_ms: i64) -> Result<Status, StoreError> {
    let mut reading = Reading::begin(db).await?;
    let status = Status {
        at_ms: now_ms,
        backend: match reading.backend() {
            Backend::Postgres => "postgres".into(),
            Backend::Sqlite => "sqlite".into(),
        },
        outbox: outbox(&mut reading, now_ms).await?,
        relay: relay_claims(&mut reading).await?,
        subscriptions: subscription_rows(&mut reading, subscriptions, now_ms).await?,
        notifications: notifications(&mut reading).await?,
        jobs: jobs(&mut reading, now_ms).await?,
        generations: generations(&mut reading).await?,
        kafka: None,
        kafka_error: None,
    };
    reading.finish().await?;
    Ok(status)
}

async fn rows(reading: &mut Reading, sql: &str) -> Result<Vec<AnyRow>, StoreError> {
    Ok(sqlx::query(sql).fetch_all(reading.conn()).await?)
}

/// `(key, count)` rows of a `SELECT <key> AS k, COUNT(*) AS n … GROUP BY`.
async fn counts(reading: &mut Reading, sql: &str) -> Result<BTreeMap<String, i64>, StoreError> {
    rows(reading, sql).await?.iter().map(|r| Ok((r.try_get("k")?, r.try_get("n")?))).collect()
}

pub async fn outbox(reading: &mut Reading, now_ms: i64) -> Result<Outbox, StoreError> {
    let mut out = Outbox::default();
    let mut oldest: Option<i64> = None;
    let backlog = backlog_sql(reading).await?;
    for r in rows(reading, &backlog).await? {
        let (status, n): (String, i64) = (r.try_get("status")?, r.try_get("n")?);
        oldest = oldest.into_iter().chain(r.try_get::<Option<i64>, _>("oldest")?).min();
        if status == outbox::PENDING { out.pending = n } else { out.retryable_failed = n }
    }
    let set_aside = counts(reading, "SELECT status AS k, COUNT(*) AS n FROM outbox_set_aside GROUP BY status").await?;
    out.failed = set_aside.get(outbox::FAILED).copied().unwrap_or(0);
    out.dead_lettered = set_aside.get(outbox::DEAD_LETTERED).copied().unwrap_or(0);
    out.backlog = out.pending + out.retryable_failed;
    out.oldest_pending_age_ms = oldest.map(|t| (now_ms - t).max(0));
    Ok(out)
}

/// The backlog is what each slice's relay has not read past: every row
/// behind a slice's persisted cursor is delivered or set aside (a cursor
/// never passes a row still to publish; herald-store's `delivered`), so the
/// backlog is the `pending` and `retryable_failed` rows after it — one range scan of the
/// `(slice, xid, seq)` index per slice (SQLite `(slice, seq)`), as long as
/// the backlog, whatever the outbox holds behind it. The cursors go in as
/// literals: with them the planner sees how short each range is (as a join
/// it guesses a third of the table, and PostgreSQL then compiles the query
/// with JIT, which alone costs a quarter of a second). A cursor that moves
/// on meanwhile only makes the range longer than needed, never wrong.
async fn backlog_sql(reading: &mut Reading) -> Result<String, StoreError> {
    let backend = reading.backend();
    let mut ranges = Vec::new();
    for SliceCursor { slice, cursor } in delivered::cursors(reading.conn()).await? {
        let not_passed = delivered::not_passed(backend, &cursor);
        ranges.push(format!(
            "SELECT status, created_at_ms FROM outbox WHERE slice = {slice} AND {not_passed} AND status IN ('pending', 'retryable_failed')"
        ));
    }
    Ok(format!(
        "SELECT status, COUNT(*) AS n, MIN(created_at_ms) AS oldest FROM ({}) AS backlog GROUP BY status",
        ranges.join(" UNION ALL ")
    ))
}

/// Leases compare against the database's clock, as the relays' own claims do.
pub async fn relay_claims(reading: &mut Reading) -> Result<RelayClaims, StoreError> {
    let now = reading.now_sql();
    let slices = counts(reading, "SELECT 'all' AS k, COUNT(*) AS n FROM relay_slices").await?;
    let by_owner = counts(
        reading,
        &format!("SELECT claim_owner AS k, COUNT(*) AS n FROM relay_slices WHERE claim_owner IS NOT NULL AND claim_expires_at_ms > {now} GROUP BY claim_owner"),
    )
    .await?;
    let live = counts(reading, &format!("SELECT 'live' AS k, COUNT(*) AS n FROM relay_members WHERE expires_at_ms > {now}")).await?;
    Ok(RelayClaims { slices: slices.values().sum(), active_claims: by_owner.values().sum(), live_relays: live.values().sum(), by_owner })
}

/// Inbox rows, dead letters and parked keys of each named subscription (its
/// own scope: a rebuild's `search@g<N>` scope is not the live subscription's).
pub async fn subscription_rows(reading: &mut Reading, names: &[&str], now_ms: i64) -> Result<Vec<SubscriptionFigures>, StoreError> {
    let mut figures = Vec::with_capacity(names.len());
    for &name in names {
        let scope = format!("subscription = {}", literal(name));
        let mut estimated = Vec::new();
        let mut figure = |label: &str, count: Count| {
            if count.estimated {
                estimated.push(label.to_owned());
            }
            count.n
        };
        let inbox_rows = figure("inbox_rows", counting::count(reading, "inbox", &scope, EXACT_UP_TO).await?);
        let letters = |status: &str| format!("{scope} AND status = {}", literal(status));
        let dead_letters =
            figure("dead_letters", counting::count(reading, "dead_letters", &letters(dead_letter::DEAD), EXACT_UP_TO).await?);
        let redriven = figure("redriven", counting::count(reading, "dead_letters", &letters(dead_letter::REDRIVEN), EXACT_UP_TO).await?);
        let parked = parked::summary_on(reading.conn(), name, PARKED_KEYS_SHOWN).await?;
        figures.push(SubscriptionFigures {
            name: name.to_owned(),
            group: None,
            lag: None,
            inbox_rows,
            dead_letters,
            redriven,
            parked_records: parked.records,
            parked_keys: parked.keys,
            oldest_parked: parked
                .oldest
                .into_iter()
                .map(|k| ParkedKeyFigures {
                    key: parked::display_key(&k.record_key),
                    topic: k.topic,
                    partition: k.partition,
                    records: k.records,
                    first_offset: k.first_offset,
                    age_ms: (now_ms - k.since_ms).max(0),
                    blocked_by: k.blocked_by,
                })
                .collect(),
            estimated,
        });
    }
    Ok(figures)
}

/// Rows of `table` per distinct value of its (indexed) `status`, and the
/// statuses whose count is an estimate.
async fn by_status(reading: &mut Reading, table: &str) -> Result<(BTreeMap<String, i64>, Vec<String>), StoreError> {
    let (mut counts, mut estimated) = (BTreeMap::new(), Vec::new());
    for status in counting::distinct(reading, table, "status").await? {
        let count = counting::count(reading, table, &format!("status = {}", literal(&status)), EXACT_UP_TO).await?;
        if count.estimated {
            estimated.push(status.clone());
        }
        counts.insert(status, count.n);
    }
    Ok((counts, estimated))
}

pub async fn notifications(reading: &mut Reading) -> Result<Notifications, StoreError> {
    let (by_status, estimated) = by_status(reading, "notification_intents").await?;
    Ok(Notifications { unknown: by_status.get("unknown").copied().unwrap_or(0), by_status, estimated })
}

pub async fn jobs(reading: &mut Reading, now_ms: i64) -> Result<Jobs, StoreError> {
    let (by_status, estimated) = by_status(reading, "export_jobs").await?;
    let open = ["pending", "running"].iter().map(|s| by_status.get(*s).copied().unwrap_or(0)).sum();
    let oldest: Option<i64> =
        match rows(reading, "SELECT MIN(created_at_ms) AS oldest FROM export_jobs WHERE status IN ('pending', 'running')").await?.first() {
            Some(row) => row.try_get("oldest")?,
            None => None,
        };
    // A failed job has no completion time; its last update is when it failed
    // (a terminal row is not updated again). One backward index range per
    // terminal status, the most recent of both kept.
    let mut recent: Vec<(i64, i64)> = Vec::new();
    for status in ["succeeded", "failed"] {
        let sql = format!(
            "SELECT created_at_ms, COALESCE(completed_at_ms, updated_at_ms) AS done_ms FROM export_jobs WHERE status = '{status}' \
             ORDER BY COALESCE(completed_at_ms, updated_at_ms) DESC LIMIT {LATENCY_SAMPLE}"
        );
        for r in rows(reading, &sql).await? {
            recent.push((r.try_get("done_ms")?, r.try_get("created_at_ms")?));
        }
    }
    recent.sort_unstable_by(|a, b| b.cmp(a));
    recent.truncate(LATENCY_SAMPLE as usize);
    let latency = Latency::from_durations(recent.iter().map(|(done, created)| (done - created).max(0)).collect());
    Ok(Jobs { by_status, open, oldest_open_age_ms: oldest.map(|t| (now_ms - t).max(0)), latency, estimated })
}

/// Every generation of every projection, oldest first, and which serves reads.
pub async fn generations(reading: &mut Reading) -> Result<Vec<GenerationFigures>, StoreError> {
    let listed = rows(
        reading,
        "SELECT g.projection, g.generation, g.state, a.generation AS active_generation FROM projection_generations g \
         LEFT JOIN active_generations a ON a.projection = g.projection ORDER BY g.projection, g.generation",
    )
    .await?;
    let mut figures = Vec::with_capacity(listed.len());
    for r in &listed {
        let (projection, generation): (String, i64) = (r.try_get("projection")?, r.try_get("generation")?);
        let active = r.try_get::<Option<i64>, _>("active_generation")? == Some(generation);
        // Rows of Herald's own projections; a user's own report none here.
        let held = match projection.as_str() {
            "search" => Some("search_documents"),
            "stats" => Some("stats_counters"),
            _ => None,
        };
        let count = match held {
            Some(table) => counting::count(reading, table, &format!("generation = {generation}"), EXACT_UP_TO).await?,
            None => Count::default(),
        };
        let estimated = if count.estimated { vec!["documents".to_owned()] } else { Vec::new() };
        figures.push(GenerationFigures { projection, generation, state: r.try_get("state")?, active, documents: count.n, estimated });
    }
    Ok(figures)
}

/// A job that reached a terminal state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub job_id: String,
    pub done_ms: i64,
    pub latency_ms: i64,
}

/// Jobs that finished after `after_ms` (by their own timestamps), for the
/// latency histogram.
pub async fn finished_since(db: &Db, after_ms: i64) -> Result<Vec<Finished>, StoreError> {
    let rows = sqlx::query(
        "SELECT job_id, created_at_ms, COALESCE(completed_at_ms, updated_at_ms) AS done_ms FROM export_jobs \
         WHERE status IN ('succeeded', 'failed') AND COALESCE(completed_at_ms, updated_at_ms) > $1",
    )
    .bind(after_ms)
    .fetch_all(db.pool())
    .await?;
    rows.iter()
        .map(|r| {
            let (created, done): (i64, i64) = (r.try_get("created_at_ms")?, r.try_get("done_ms")?);
            Ok(Finished { job_id: r.try_get("job_id")?, done_ms: done, latency_ms: (done - created).max(0) })
        })
        .collect()
}
