//! Draining after the chaos: wait until every job is terminal, the outbox is
//! delivered, every subscription applied every completion and no
//! notification is pending. Polling with a deadline: the drill watches an
//! asynchronous system from outside.

use std::time::{Duration, Instant};

use herald_store::Db;
use serde::Serialize;
use sqlx::Row;

use super::procs::Procs;

#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Progress {
    pub open_jobs: i64,
    pub unsent_outbox: i64,
    pub completions: i64,
    /// Completion events applied by search, stats and notify.
    pub applied: [i64; 3],
    pub pending_intents: i64,
    pub intents: i64,
}

impl Progress {
    pub fn settled(&self) -> bool {
        self.open_jobs == 0
            && self.unsent_outbox == 0
            && self.applied.iter().all(|n| *n >= self.completions)
            && self.pending_intents == 0
            && self.intents >= self.completions
    }
}

async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get(0)?)
}

pub async fn progress(db: &Db) -> anyhow::Result<Progress> {
    let applied = |s: &str| format!("SELECT COUNT(*) FROM inbox WHERE subscription = '{s}' AND event_type = 'herald.export.completed'");
    Ok(Progress {
        open_jobs: count(db, "SELECT COUNT(*) FROM export_jobs WHERE status IN ('pending', 'running')").await?,
        unsent_outbox: count(db, "SELECT COUNT(*) FROM outbox WHERE status IN ('pending', 'retryable_failed')").await?,
        completions: count(db, "SELECT COUNT(*) FROM outbox WHERE event_type = 'herald.export.completed' AND status = 'delivered'").await?,
        applied: [count(db, &applied("search")).await?, count(db, &applied("stats")).await?, count(db, &applied("notify")).await?],
        pending_intents: count(db, "SELECT COUNT(*) FROM notification_intents WHERE status = 'pending'").await?,
        intents: count(db, "SELECT COUNT(*) FROM notification_intents").await?,
    })
}

/// Waits (restarting processes that are down) until `done()` and the
/// system settled, or `timeout`. Returns the last progress and whether it
/// settled.
pub async fn wait(db: &Db, procs: &mut Procs, timeout: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<(Progress, bool)> {
    let deadline = Instant::now() + timeout;
    procs.restart_all_now();
    loop {
        procs.tick()?;
        let now = progress(db).await?;
        if done() && now.settled() && procs.all_up() {
            return Ok((now, true));
        }
        if Instant::now() > deadline {
            return Ok((now, false));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Counts for the table, after the drain.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub jobs: i64,
    pub jobs_succeeded: i64,
    pub jobs_failed: i64,
    pub outbox_rows: i64,
    pub completion_events: i64,
    pub dead_letters: i64,
}

pub async fn totals(db: &Db) -> anyhow::Result<Totals> {
    Ok(Totals {
        jobs: count(db, "SELECT COUNT(*) FROM export_jobs").await?,
        jobs_succeeded: count(db, "SELECT COUNT(*) FROM export_jobs WHERE status = 'succeeded'").await?,
        jobs_failed: count(db, "SELECT COUNT(*) FROM export_jobs WHERE status = 'failed'").await?,
        outbox_rows: count(db, "SELECT COUNT(*) FROM outbox").await?,
        completion_events: count(db, "SELECT COUNT(*) FROM outbox WHERE event_type = 'herald.export.completed'").await?,
        dead_letters: count(db, "SELECT COUNT(*) FROM dead_letters").await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn behind_stats(applied_stats: i64, open_jobs: i64) -> Progress {
        Progress { completions: 10, applied: [10, applied_stats, 10], open_jobs, intents: 10, ..Progress::default() }
    }

    #[test]
    fn settled_means_every_subscription_caught_up_and_no_job_open() {
        assert!(behind_stats(10, 0).settled());
        assert!(!behind_stats(9, 0).settled());
        assert!(!behind_stats(10, 1).settled());
    }
}
