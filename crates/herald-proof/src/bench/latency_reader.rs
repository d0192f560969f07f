//! `herald bench latency`'s reader: it notes when a probe's inbox row (which
//! commits with its search document) became visible, so its own delay is
//! part of every end-to-end figure. It runs on a thread of its own, with its
//! own runtime and connection: on the benchmark's runtime its looks waited
//! for the workers the relay and the subscription kept busy. Each look is
//! one round trip of a statement prepared once, which reaches each key
//! through the inbox's whole primary key whatever the table's statistics
//! say ([`LOOK`]).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use herald_envelope::SOURCE_EXPORTS;
use herald_projections::search;
use herald_store::{Db, PLAN_ONCE};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use super::probes::Probes;

/// How often the reader looks for the oldest outstanding probes.
pub(super) const READ_EVERY: Duration = Duration::from_millis(2);
/// Probes asked per look: the oldest outstanding ones.
const KEYS_PER_LOOK: usize = 200;

/// The reader's one connection, opened lazily (so on the reader's own
/// runtime), planning [`LOOK`] once: PostgreSQL otherwise planned it again
/// on every look (10,425 plans in 20 s at 1,000 events/s, three times the
/// looks' own time), CPU the pipeline it measures shares.
pub(super) fn pool(db: &Db) -> anyhow::Result<PgPool> {
    db.native_postgres_with(1, &[PLAN_ONCE])?.context("the latency benchmark runs on PostgreSQL")
}

/// Starts the reader until `stop`; it returns how long each look took.
pub(super) fn spawn(pool: PgPool, probes: Probes, stop: CancellationToken) -> std::thread::JoinHandle<anyhow::Result<Vec<Duration>>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        runtime.block_on(async move {
            let looks = read_visible(&pool, &probes, &stop).await;
            pool.close().await;
            looks
        })
    })
}

/// Every [`READ_EVERY`], which of the oldest outstanding probes the search
/// inbox shows. Every event of the run comes from `OutboxEvent::new`'s source.
async fn read_visible(pool: &PgPool, probes: &Probes, stop: &CancellationToken) -> anyhow::Result<Vec<Duration>> {
    let mut tick = tokio::time::interval(READ_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut looks = Vec::new();
    while !stop.is_cancelled() {
        tick.tick().await;
        let open = probes.outstanding(KEYS_PER_LOOK);
        if open.is_empty() {
            continue;
        }
        let asked = Instant::now();
        let seen = seen_among(pool, &open).await?;
        let at = Instant::now();
        looks.push(at - asked);
        probes.visible(&seen, at);
    }
    Ok(looks)
}

/// Which of the keys `$3` (of source `$2`) the inbox of subscription `$1`
/// holds. One probe of the primary key per key, written so no plan can do
/// otherwise (the `LIMIT` keeps the subquery from being pulled up into a
/// join the planner may turn around). As `event_id = ANY($3)`, statistics
/// that put few rows under the subscription (taken in the load's first
/// seconds) made PostgreSQL read every row of the subscription through the
/// key's first two columns and filter them: 15 ms a look, most of a core
/// at 1,000 events/s with 30,000 rows (`pg_stat_statements`, 2026-12-06).
const LOOK: &str = "SELECT i.event_id FROM UNNEST($3::text[]) AS k(id), \
     LATERAL (SELECT event_id FROM inbox WHERE subscription = $1 AND source = $2 AND event_id = k.id LIMIT 1) AS i";

/// The ids among `ids` whose search inbox row is there.
async fn seen_among(pool: &PgPool, ids: &[String]) -> anyhow::Result<Vec<String>> {
    Ok(sqlx::query_scalar(LOOK).bind(search::SUBSCRIPTION).bind(SOURCE_EXPORTS).bind(ids).fetch_all(pool).await?)
}

#[cfg(test)]
mod tests {

    use super::*;

    /// Statistics of an inbox that held only another subscription's rows,
    /// then 20,000 rows of search's: the plan a
    /// look gets (generic, as a statement prepared once ends up with) must
    /// still find each key through the whole primary key. It fails with
    /// `event_id = ANY($3)`: "Index Cond" on the subscription and source
    /// only, the keys a filter.
    #[tokio::test]
    async fn a_look_probes_the_primary_key_on_stale_statistics_postgres() -> anyhow::Result<()> {
        let test_db = herald_testkit::postgres_db().await?;
        let db = Db::connect_and_migrate(&test_db.url).await?;
        let insert = |subscription: &str, rows: i32| {
            format!(
                "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
                 SELECT '{subscription}', '{SOURCE_EXPORTS}', 'e-' || i, 't', 't', 0, i, 0 FROM generate_series(1, {rows}) AS i"
            )
        };
        let pool = pool(&db)?;
        // The plan below is the one every look keeps only with this setting.
        let mode: String = sqlx::query_scalar("SHOW plan_cache_mode").fetch_one(&pool).await?;
        assert_eq!(mode, PLAN_ONCE.1, "the reader's connection plans its look once");
        // Analyzed while another subscription's rows were all there was.
        sqlx::query(&insert("stats", 5)).execute(&pool).await?;
        sqlx::query("ANALYZE inbox").execute(&pool).await?;
        sqlx::query(&insert(search::SUBSCRIPTION, 20_000)).execute(&pool).await?;
        let asked: Vec<String> = ["e-7", "e-19999", "absent"].map(String::from).to_vec();
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {LOOK}"))
            .bind(search::SUBSCRIPTION)
            .bind(SOURCE_EXPORTS)
            .bind(&asked)
            .fetch_all(&pool)
            .await?;
        let plan = plan.join("\n");
        assert!(plan.lines().any(|l| l.contains("Index Cond") && l.contains("event_id")), "each key through the primary key:\n{plan}");
        assert!(!plan.contains("Filter"), "nothing read and filtered:\n{plan}");
        let mut seen = seen_among(&pool, &asked).await?;
        seen.sort();
        assert_eq!(seen, ["e-19999", "e-7"]);
        pool.close().await;
        db.close().await;
        Ok(())
    }
}
