//! Draining after the chaos: wait until every job is terminal, the outbox is
//! delivered, every subscription applied every completion and no
//! notification is pending. Polling with a deadline: the drill watches an
//! asynchronous system from outside.

use std::time::{Duration, Instant};

use herald_export::lifecycle;
use herald_notify::intents;
use herald_notify::rules;
use herald_projections::{search, stats};
use herald_status::counts;
use herald_store::{Db, outbox};
use serde::Serialize;

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

pub async fn progress(db: &Db) -> anyhow::Result<Progress> {
    let now = counts::collect(db).await?;
    Ok(Progress {
        open_jobs: now.jobs.of(lifecycle::PENDING) + now.jobs.of(lifecycle::RUNNING),
        unsent_outbox: now.outbox.of(outbox::PENDING) + now.outbox.of(outbox::RETRYABLE_FAILED),
        completions: now.completions.delivered,
        applied: [search::SUBSCRIPTION, stats::SUBSCRIPTION, intents::SUBSCRIPTION].map(|s| now.completions_applied.of(s)),
        pending_intents: now.intents.of(rules::PENDING),
        intents: now.intents.total(),
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
    let now = counts::collect(db).await?;
    Ok(Totals {
        jobs: now.jobs.total(),
        jobs_succeeded: now.jobs.of(lifecycle::SUCCEEDED),
        jobs_failed: now.jobs.of(lifecycle::FAILED),
        outbox_rows: now.outbox.total(),
        completion_events: now.completions.rows,
        dead_letters: now.dead_letters,
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
