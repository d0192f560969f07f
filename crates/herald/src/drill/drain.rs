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

/// A consumer role behind and without progress this long is rejoined.
const STALL: Duration = Duration::from_secs(20);

/// Waits (restarting processes that are down) until `done()` and the
/// system settled, or `timeout`. Returns the last progress and whether it
/// settled. A consumer role that is behind and has not moved for [`STALL`]
/// is stopped cleanly and started again (`Procs::rejoin`, counted).
pub async fn wait(db: &Db, procs: &mut Procs, timeout: Duration, mut done: impl FnMut() -> bool) -> anyhow::Result<(Progress, bool)> {
    let deadline = Instant::now() + timeout;
    procs.restart_all_now();
    let mut watch = Stalls::default();
    loop {
        procs.tick()?;
        let now = progress(db).await?;
        if done() && now.settled() && procs.all_up() {
            return Ok((now, true));
        }
        if Instant::now() > deadline {
            return Ok((now, false));
        }
        for role in watch.stalled(&now) {
            tracing::warn!(role, "drill: consumer behind without progress; stopping it cleanly and starting it again");
            procs.rejoin(role).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// When each consumer role last moved, and what it had done then.
#[derive(Default)]
struct Stalls {
    seen: [(i64, Option<Instant>); 4],
}

impl Stalls {
    const ROLES: [&'static str; 4] = ["consume-search", "consume-stats", "consume-notify", "worker"];

    /// Roles behind that have not moved for `STALL`; their clocks restart.
    fn stalled(&mut self, p: &Progress) -> Vec<&'static str> {
        // Workers: open jobs going down is progress (negated so "more" is better).
        let done = [p.applied[0], p.applied[1], p.applied[2], -p.open_jobs];
        let behind = [p.applied[0] < p.completions, p.applied[1] < p.completions, p.applied[2] < p.completions, p.open_jobs > 0];
        let mut stalled = Vec::new();
        for i in 0..4 {
            let (last, since) = &mut self.seen[i];
            if !behind[i] || *last != done[i] || since.is_none() {
                *last = done[i];
                *since = Some(Instant::now());
            } else if since.is_some_and(|t| t.elapsed() > STALL) {
                stalled.push(Self::ROLES[i]);
                *since = Some(Instant::now() + super::procs::CONSUMER_RESTART);
            }
        }
        stalled
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
    pub intents_sent: i64,
    pub intents_unknown: i64,
}

pub async fn totals(db: &Db) -> anyhow::Result<Totals> {
    Ok(Totals {
        jobs: count(db, "SELECT COUNT(*) FROM export_jobs").await?,
        jobs_succeeded: count(db, "SELECT COUNT(*) FROM export_jobs WHERE status = 'succeeded'").await?,
        jobs_failed: count(db, "SELECT COUNT(*) FROM export_jobs WHERE status = 'failed'").await?,
        outbox_rows: count(db, "SELECT COUNT(*) FROM outbox").await?,
        completion_events: count(db, "SELECT COUNT(*) FROM outbox WHERE event_type = 'herald.export.completed'").await?,
        dead_letters: count(db, "SELECT COUNT(*) FROM dead_letters").await?,
        intents_sent: count(db, "SELECT COUNT(*) FROM notification_intents WHERE status = 'sent'").await?,
        intents_unknown: count(db, "SELECT COUNT(*) FROM notification_intents WHERE status = 'unknown'").await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn behind_stats(applied_stats: i64, open_jobs: i64) -> Progress {
        Progress { completions: 10, applied: [10, applied_stats, 10], open_jobs, intents: 10, ..Progress::default() }
    }

    #[test]
    fn only_a_role_behind_and_unmoving_for_the_stall_time_is_named() {
        let mut watch = Stalls::default();
        assert!(watch.stalled(&behind_stats(5, 0)).is_empty(), "first sight starts the clock");
        // Pretend the clocks started long ago.
        for (_, since) in &mut watch.seen {
            *since = Some(Instant::now() - STALL - Duration::from_secs(1));
        }
        assert_eq!(watch.stalled(&behind_stats(5, 0)), vec!["consume-stats"], "caught-up roles and idle workers are not stalled");
        assert!(watch.stalled(&behind_stats(5, 0)).is_empty(), "after a rejoin the role gets time to come back");
        for (_, since) in &mut watch.seen {
            *since = Some(Instant::now() - STALL - Duration::from_secs(1));
        }
        assert!(watch.stalled(&behind_stats(6, 0)).is_empty(), "progress restarts the clock");
        assert!(behind_stats(10, 0).settled() && !behind_stats(9, 0).settled() && !behind_stats(10, 1).settled());
    }
}
