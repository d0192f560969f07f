//! What an attempt's outcome means for the intent, as rules without IO.
//!
//! The two promises: never mark `sent` without a receipt, and never resend on
//! our own to a provider that cannot collapse duplicates after an attempt that
//! may have reached it.

use std::time::Duration;

use crate::provider::{Capabilities, SendOutcome};

pub const PENDING: &str = "pending";
pub const SENT: &str = "sent";
pub const UNKNOWN: &str = "unknown";
pub const CONFLICT: &str = "conflict";
pub const FAILED: &str = "failed";
pub const DEAD: &str = "dead";

/// Where an intent goes after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Sent { receipt: String },
    /// Try again at `at_ms` with the same key and body.
    Retry { at_ms: i64, reason: String },
    /// Nobody knows whether the provider executed it: reconciliation.
    Unknown { reason: String },
    Conflict { detail: String },
    Failed { detail: String },
    /// Retries exhausted while the provider kept not taking it.
    Dead { reason: String },
}

impl Transition {
    pub fn status(&self) -> &'static str {
        match self {
            Transition::Sent { .. } => SENT,
            Transition::Retry { .. } => PENDING,
            Transition::Unknown { .. } => UNKNOWN,
            Transition::Conflict { .. } => CONFLICT,
            Transition::Failed { .. } => FAILED,
            Transition::Dead { .. } => DEAD,
        }
    }
}

/// Retry timing and budget.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub max_attempts: i32,
    pub base_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_attempts: 20, base_backoff: Duration::from_millis(500), max_backoff: Duration::from_secs(300) }
    }
}

impl RetryPolicy {
    fn delay_ms(&self, attempts: i32) -> i64 {
        let base = i64::try_from(self.base_backoff.as_millis()).unwrap_or(i64::MAX);
        let cap = i64::try_from(self.max_backoff.as_millis()).unwrap_or(i64::MAX);
        let exponent = u32::try_from(attempts.saturating_sub(1)).unwrap_or(0).min(20);
        base.saturating_mul(1 << exponent).min(cap)
    }
}

/// An attempt as the rules need to see it.
#[derive(Debug, Clone, Copy)]
pub struct AttemptFacts {
    /// Attempts made, this one included.
    pub attempts: i32,
    /// When the first attempt went out; key retention counts from there.
    pub first_attempt_at_ms: i64,
    pub now_ms: i64,
}

pub fn after_attempt(outcome: SendOutcome, caps: &Capabilities, policy: &RetryPolicy, facts: AttemptFacts) -> Transition {
    match outcome {
        SendOutcome::Accepted { receipt } => Transition::Sent { receipt },
        SendOutcome::Conflict { detail } => Transition::Conflict { detail },
        SendOutcome::Rejected { status, detail } => Transition::Failed { detail: format!("{status}: {detail}") },
        SendOutcome::NotSent { reason } if facts.attempts >= policy.max_attempts => Transition::Dead { reason },
        SendOutcome::NotSent { reason } => Transition::Retry { at_ms: facts.now_ms + policy.delay_ms(facts.attempts), reason },
        SendOutcome::Unknown { reason } => maybe_delivered(reason, caps, policy, facts),
    }
}

/// An attempt that may have reached the provider. Resending is safe only to a
/// provider that collapses the key, and only while it still remembers it.
pub fn maybe_delivered(reason: String, caps: &Capabilities, policy: &RetryPolicy, facts: AttemptFacts) -> Transition {
    let retention_ms = i64::try_from(caps.key_retention.as_millis()).unwrap_or(i64::MAX);
    let next = facts.now_ms + policy.delay_ms(facts.attempts);
    let inside_retention = next < facts.first_attempt_at_ms.saturating_add(retention_ms);
    if caps.honours_keys && inside_retention && facts.attempts < policy.max_attempts {
        Transition::Retry { at_ms: next, reason }
    } else {
        Transition::Unknown { reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(attempts: i32) -> AttemptFacts {
        AttemptFacts { attempts, first_attempt_at_ms: 0, now_ms: 1_000 }
    }

    fn unknown() -> SendOutcome {
        SendOutcome::Unknown { reason: "timeout".into() }
    }

    #[test]
    fn given_a_receipt_then_sent_and_nothing_else_is_sent() {
        let caps = Capabilities::keyed(Duration::from_secs(3600));
        let p = RetryPolicy::default();
        assert_eq!(after_attempt(SendOutcome::Accepted { receipt: "r".into() }, &caps, &p, facts(1)).status(), SENT);
        for outcome in [unknown(), SendOutcome::NotSent { reason: "refused".into() }] {
            assert_ne!(after_attempt(outcome, &caps, &p, facts(1)).status(), SENT);
        }
    }

    #[test]
    fn given_a_keyed_provider_when_the_answer_is_lost_then_retry_inside_retention_only() {
        let p = RetryPolicy::default();
        let long = Capabilities::keyed(Duration::from_secs(3600));
        assert!(matches!(after_attempt(unknown(), &long, &p, facts(1)), Transition::Retry { .. }));
        let short = Capabilities::keyed(Duration::from_millis(1_200));
        assert_eq!(after_attempt(unknown(), &short, &p, facts(1)).status(), UNKNOWN, "retry would land past retention");
    }

    #[test]
    fn given_an_unkeyed_provider_when_the_answer_is_lost_then_never_resend() {
        let t = after_attempt(unknown(), &Capabilities::unkeyed(), &RetryPolicy::default(), facts(1));
        assert_eq!(t.status(), UNKNOWN);
    }

    #[test]
    fn given_conflict_or_rejection_then_no_success_and_no_retry() {
        let caps = Capabilities::keyed(Duration::from_secs(60));
        let p = RetryPolicy::default();
        assert_eq!(after_attempt(SendOutcome::Conflict { detail: "x".into() }, &caps, &p, facts(1)).status(), CONFLICT);
        assert_eq!(after_attempt(SendOutcome::Rejected { status: 400, detail: "x".into() }, &caps, &p, facts(1)).status(), FAILED);
    }

    #[test]
    fn given_the_provider_keeps_refusing_then_dead_after_the_budget() {
        let p = RetryPolicy { max_attempts: 3, ..RetryPolicy::default() };
        let caps = Capabilities::unkeyed();
        let refused = || SendOutcome::NotSent { reason: "refused".into() };
        assert!(matches!(after_attempt(refused(), &caps, &p, facts(2)), Transition::Retry { at_ms: 2_000, .. }));
        assert_eq!(after_attempt(refused(), &caps, &p, facts(3)).status(), DEAD);
    }
}
