//! The job lifecycle as rules, free of IO: which command starts an attempt,
//! how long leases last, when a failure is retried and when the job fails.
//! The database applies these rules with conditional updates, so a race
//! between processes is decided there, once.
//!
//! ```text
//! pending ──start (generation+1)──► running ──complete (same generation)──► succeeded
//!    ▲                                 │ └──failure, budget left──► pending (retry at)
//!    └──takeover (generation+1)────────┘ └──failure, budget spent──► failed
//!
//! pending | succeeded | failed ──delete (owner, version+1)──► deleted
//! ```
//!
//! A running job cannot be deleted (its attempt holds a lease and may be
//! writing the artifact): the owner retries after it finished.

use std::time::Duration;

pub const PENDING: &str = "pending";
pub const RUNNING: &str = "running";
pub const SUCCEEDED: &str = "succeeded";
pub const FAILED: &str = "failed";
/// Deleted by its owner: final; its search document is gone and its artifact
/// is removed by cleanup.
pub const DELETED: &str = "deleted";

/// States a job may be deleted from.
pub const DELETABLE: [&str; 3] = [PENDING, SUCCEEDED, FAILED];

/// Whether a status is final: nothing changes a terminal job again.
pub fn is_terminal(status: &str) -> bool {
    status == SUCCEEDED || status == FAILED || status == DELETED
}

/// Timings and budgets of attempts.
#[derive(Debug, Clone)]
pub struct LeasePolicy {
    /// How long an attempt may go without renewing before it may be taken over.
    pub lease: Duration,
    /// How long a pending job may wait for a worker before its command is
    /// issued again (the first one may have been dropped while a lease lived).
    pub dispatch_timeout: Duration,
    /// Failed attempts a job may spend before it fails for good.
    pub attempt_budget: i32,
    /// First retry delay; doubles per failure up to `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy {
            lease: Duration::from_secs(30),
            dispatch_timeout: Duration::from_secs(120),
            attempt_budget: 5,
            base_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// What to do after an attempt failed with a temporary error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Back to pending; the scanner re-issues the command at `retry_at_ms`.
    Retry { retry_at_ms: i64 },
    /// The budget is spent: the job fails and says so in an event.
    Fail,
}

impl LeasePolicy {
    pub fn lease_ms(&self) -> i64 {
        millis(self.lease)
    }

    pub fn dispatch_timeout_ms(&self) -> i64 {
        millis(self.dispatch_timeout)
    }

    /// `failures` counts this failure too. `jitter` in [0, 1) spreads retries
    /// of many jobs that failed together (the caller supplies randomness so
    /// the rule stays deterministic to test).
    pub fn after_failure(&self, failures: i32, now_ms: i64, jitter: f64) -> AfterFailure {
        if failures >= self.attempt_budget {
            return AfterFailure::Fail;
        }
        let exponent = u32::try_from(failures.saturating_sub(1)).unwrap_or(0).min(20);
        let delay = millis(self.base_backoff).saturating_mul(1 << exponent).min(millis(self.max_backoff));
        let spread = (delay as f64 * jitter.clamp(0.0, 1.0) * 0.5) as i64;
        AfterFailure::Retry { retry_at_ms: now_ms + delay + spread }
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> LeasePolicy {
        LeasePolicy {
            lease: Duration::from_secs(10),
            dispatch_timeout: Duration::from_secs(60),
            attempt_budget: 3,
            base_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(3),
        }
    }

    #[test]
    fn given_budget_left_when_an_attempt_fails_then_retry_later_with_growing_backoff() {
        assert_eq!(policy().after_failure(1, 1_000, 0.0), AfterFailure::Retry { retry_at_ms: 2_000 });
        assert_eq!(policy().after_failure(2, 1_000, 0.0), AfterFailure::Retry { retry_at_ms: 3_000 });
    }

    #[test]
    fn given_a_long_streak_then_backoff_is_capped_and_jitter_only_adds() {
        let p = LeasePolicy { attempt_budget: 100, ..policy() };
        assert_eq!(p.after_failure(30, 0, 0.0), AfterFailure::Retry { retry_at_ms: 3_000 });
        let AfterFailure::Retry { retry_at_ms } = p.after_failure(30, 0, 0.99) else { panic!() };
        assert!((3_000..4_500).contains(&retry_at_ms), "{retry_at_ms}");
    }

    #[test]
    fn given_the_budget_is_spent_when_an_attempt_fails_then_the_job_fails() {
        assert_eq!(policy().after_failure(3, 0, 0.0), AfterFailure::Fail);
    }

    #[test]
    fn terminal_states_are_final() {
        assert!(is_terminal(SUCCEEDED) && is_terminal(FAILED) && is_terminal(DELETED));
        assert!(!DELETABLE.contains(&RUNNING) && !DELETABLE.contains(&DELETED));
        assert!(!is_terminal(PENDING) && !is_terminal(RUNNING));
    }
}
