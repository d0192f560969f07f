//! The database's figures. Plain aggregate reads in the SQL subset both
//! backends accept; nothing here writes.
//!
//! Cost: the outbox has no index on `status` by design (ARCHITECTURE.md, "What
//! the database pays"), so the backlog count scans the table; so do the
//! job and intent counts. A refresh every second or two is fine for tables
//! of a few hundred thousand rows; `MonitorConfig::interval` is the knob.

use std::collections::BTreeMap;

use herald_store::{Backend, Db, StoreError, parked};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::figures::{GenerationFigures, Jobs, Latency, Notifications, Outbox, ParkedKeyFigures, RelayClaims, Status, SubscriptionFigures};

/// Finished jobs the latency percentiles are taken over: the most recent.
pub const LATENCY_SAMPLE: i64 = 10_000;

/// Parked keys shown per subscription: the oldest.
pub const PARKED_KEYS_SHOWN: i64 = 5;

/// Every database figure, with ages measured from `now_ms`.
pub async fn collect(db: &Db, subscriptions: &[&str], now_ms: i64) -> Result<Status, StoreError> {
    Ok(Status {
        at_ms: now_ms,
        backend: match db.backend() {
            Backend::Postgres => "postgres".into(),
            Backend::Sqlite => "sqlite".into(),
        },
        outbox: outbox(db, now_ms).await?,
        relay: relay_claims(db).await?,
        subscriptions: subscription_rows(db, subscriptions, now_ms).await?,
        notifications: notifications(db).await?,
        jobs: jobs(db, now_ms).await?,
        generations: generations(db).await?,
        kafka: None,
        kafka_error: None,
    })
}

async fn rows(db: &Db, sql: &str) -> Result<Vec<AnyRow>, StoreError> {
    Ok(sqlx::query(sql).fetch_all(db.pool()).await?)
}

/// `(key, count)` rows of a `SELECT <key> AS k, COUNT(*) AS n … GROUP BY`.
async fn counts(db: &Db, sql: &str) -> Result<BTreeMap<String, i64>, StoreError> {
    rows(db, sql).await?.iter().map(|r| Ok((r.try_get("k")?, r.try_get("n")?))).collect()
}

pub async fn outbox(db: &Db, now_ms: i64) -> Result<Outbox, StoreError> {
    let mut out = Outbox::default();
    let mut oldest: Option<i64> = None;
    for r in rows(db, "SELECT status, COUNT(*) AS n, MIN(created_at_ms) AS oldest FROM outbox WHERE status <> 'delivered' GROUP BY status")
        .await?
    {
        let (status, n): (String, i64) = (r.try_get("status")?, r.try_get("n")?);
        let first: Option<i64> = r.try_get("oldest")?;
        match status.as_str() {
            "pending" | "retryable_failed" => {
                oldest = oldest.into_iter().chain(first).min();
                if status == "pending" { out.pending = n } else { out.retryable_failed = n }
            }
            "failed" => out.failed = n,
            "dead_lettered" => out.dead_lettered = n,
            _ => {}
        }
    }
    out.backlog = out.pending + out.retryable_failed;
    out.oldest_pending_age_ms = oldest.map(|t| (now_ms - t).max(0));
    Ok(out)
}

/// Leases compare against the database's clock, as the relays' own claims do.
pub async fn relay_claims(db: &Db) -> Result<RelayClaims, StoreError> {
    let now = db.now_sql();
    let slices = counts(db, "SELECT 'all' AS k, COUNT(*) AS n FROM relay_slices").await?;
    let by_owner = counts(
        db,
        &format!("SELECT claim_owner AS k, COUNT(*) AS n FROM relay_slices WHERE claim_owner IS NOT NULL AND claim_expires_at_ms > {now} GROUP BY claim_owner"),
    )
    .await?;
    let live = counts(db, &format!("SELECT 'live' AS k, COUNT(*) AS n FROM relay_members WHERE expires_at_ms > {now}")).await?;
    Ok(RelayClaims { slices: slices.values().sum(), active_claims: by_owner.values().sum(), live_relays: live.values().sum(), by_owner })
}

/// Inbox rows, dead letters and parked keys of each named subscription (its
/// own scope: a rebuild's `search@g<N>` scope is not the live subscription's).
pub async fn subscription_rows(db: &Db, names: &[&str], now_ms: i64) -> Result<Vec<SubscriptionFigures>, StoreError> {
    let inbox = counts(db, "SELECT subscription AS k, COUNT(*) AS n FROM inbox GROUP BY subscription").await?;
    let mut letters: BTreeMap<(String, String), i64> = BTreeMap::new();
    for r in rows(db, "SELECT subscription, status, COUNT(*) AS n FROM dead_letters GROUP BY subscription, status").await? {
        letters.insert((r.try_get("subscription")?, r.try_get("status")?), r.try_get("n")?);
    }
    let letter = |name: &str, status: &str| letters.get(&(name.to_owned(), status.to_owned())).copied().unwrap_or(0);
    let mut figures = Vec::with_capacity(names.len());
    for &name in names {
        let parked = parked::summary(db, name, PARKED_KEYS_SHOWN).await?;
        figures.push(SubscriptionFigures {
            name: name.to_owned(),
            group: None,
            lag: None,
            inbox_rows: inbox.get(name).copied().unwrap_or(0),
            dead_letters: letter(name, herald_store::dead_letter::DEAD),
            redriven: letter(name, herald_store::dead_letter::REDRIVEN),
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
        });
    }
    Ok(figures)
}

pub async fn notifications(db: &Db) -> Result<Notifications, StoreError> {
    let by_status = counts(db, "SELECT status AS k, COUNT(*) AS n FROM notification_intents GROUP BY status").await?;
    Ok(Notifications { unknown: by_status.get("unknown").copied().unwrap_or(0), by_status })
}

pub async fn jobs(db: &Db, now_ms: i64) -> Result<Jobs, StoreError> {
    let mut jobs = Jobs::default();
    let mut oldest_open: Option<i64> = None;
    for r in rows(db, "SELECT status, COUNT(*) AS n, MIN(created_at_ms) AS oldest FROM export_jobs GROUP BY status").await? {
        let (status, n): (String, i64) = (r.try_get("status")?, r.try_get("n")?);
        if status == "pending" || status == "running" {
            jobs.open += n;
            oldest_open = oldest_open.into_iter().chain(r.try_get::<Option<i64>, _>("oldest")?).min();
        }
        jobs.by_status.insert(status, n);
    }
    jobs.oldest_open_age_ms = oldest_open.map(|t| (now_ms - t).max(0));
    // A failed job has no completion time; its last update is when it failed
    // (a terminal row is not updated again).
    let sql = format!(
        "SELECT created_at_ms, COALESCE(completed_at_ms, updated_at_ms) AS done_ms FROM export_jobs \
         WHERE status IN ('succeeded', 'failed') ORDER BY done_ms DESC LIMIT {LATENCY_SAMPLE}"
    );
    let durations = rows(db, &sql)
        .await?
        .iter()
        .map(|r| Ok((r.try_get::<i64, _>("done_ms")? - r.try_get::<i64, _>("created_at_ms")?).max(0)))
        .collect::<Result<Vec<i64>, StoreError>>()?;
    jobs.latency = Latency::from_durations(durations);
    Ok(jobs)
}

/// Every generation of every projection, oldest first, and which serves reads.
pub async fn generations(db: &Db) -> Result<Vec<GenerationFigures>, StoreError> {
    let per_generation = |sql: &'static str| async move {
        rows(db, sql)
            .await?
            .iter()
            .map(|r| Ok((r.try_get("generation")?, r.try_get("n")?)))
            .collect::<Result<BTreeMap<i64, i64>, StoreError>>()
    };
    let documents = per_generation("SELECT generation, COUNT(*) AS n FROM search_documents GROUP BY generation").await?;
    let counters = per_generation("SELECT generation, COUNT(*) AS n FROM stats_counters GROUP BY generation").await?;
    rows(
        db,
        "SELECT g.projection, g.generation, g.state, a.generation AS active_generation FROM projection_generations g \
         LEFT JOIN active_generations a ON a.projection = g.projection ORDER BY g.projection, g.generation",
    )
    .await?
    .iter()
    .map(|r| {
        let (projection, generation): (String, i64) = (r.try_get("projection")?, r.try_get("generation")?);
        let active = r.try_get::<Option<i64>, _>("active_generation")? == Some(generation);
        // Rows of Herald's own projections; a user's own report none here.
        let held = match projection.as_str() {
            "search" => &documents,
            "stats" => &counters,
            _ => &BTreeMap::new(),
        };
        let documents = held.get(&generation).copied().unwrap_or(0);
        Ok(GenerationFigures { projection, generation, state: r.try_get("state")?, active, documents })
    })
    .collect()
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
