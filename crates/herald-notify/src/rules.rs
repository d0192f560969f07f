//! What an attempt's outcome means for the intent, as rules without IO.
//!
//! The two promises: never mark `sent` without a receipt, and never resend on
//! our own to a provider that cannot collapse duplicates after an attempt that
//! may have reached it. Times are the database's clock (see `claims`).
//!
//! Status classes ([`status_class`]; ARCHITECTURE.md has the same table):
//!
//! | provider answered | class | the intent |
//! |---|---|---|
//! | 2xx with a receipt | accepted | `sent` |
//! | 409 | conflict | `conflict`: the key's earlier effect stands |
//! | 429, 408, 425 | retry later | not executed: retried with the same key, not before `Retry-After` |
//! | 401, 403 | credentials | untouched; the dispatcher pauses and reports a configuration problem |
//! | other 4xx | refused | `failed`; `herald notify redrive` requeues it |
//! | 5xx | server error | may have executed: keyed → retried with the key inside its retention; unkeyed → `unknown`; declared 5xx-safe → retried |
//! | anything else | unrecognised | may have executed, like a timeout |

use std::time::Duration;

use crate::provider::{Capabilities, KeyStatus, SendOutcome};

pub const PENDING: &str = "pending";
pub const SENT: &str = "sent";
pub const UNKNOWN: &str = "unknown";
pub const CONFLICT: &str = "conflict";
pub const FAILED: &str = "failed";
pub const DEAD: &str = "dead";

/// Where an intent goes after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Sent {
        receipt: String,
    },
    /// Try again at `at_ms` with the same key and body.
    Retry {
        at_ms: i64,
        reason: String,
    },
    /// Nobody knows whether the provider executed it: reconciliation.
    Unknown {
        reason: String,
    },
    Conflict {
        detail: String,
    },
    Failed {
        detail: String,
    },
    /// Retries exhausted while the provider kept not taking it.
    Dead {
        reason: String,
    },
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

/// What the dispatcher does with an attempt's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Record the transition. `may_have_executed`: from now on a resend may
    /// be a second effect unless the provider still remembers the key.
    Record { transition: Transition, may_have_executed: bool },
    /// Leave the intent as it was before the attempt and pause dispatching:
    /// the provider refused Herald itself, not this notification.
    Untouched { reason: String },
}

/// How Herald reads a provider's HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    Accepted,
    Conflict,
    /// Not executed; come back later (429, 408, 425).
    RetryLater,
    /// Herald's credentials were refused (401, 403).
    Credentials,
    /// This request is refused for good (other 4xx).
    Refused,
    /// The provider failed; it may have executed before failing (5xx).
    ServerError,
    /// Nothing Herald can read an outcome from.
    Unrecognised,
}

pub fn status_class(status: u16) -> StatusClass {
    match status {
        200..=299 => StatusClass::Accepted,
        409 => StatusClass::Conflict,
        408 | 425 | 429 => StatusClass::RetryLater,
        401 | 403 => StatusClass::Credentials,
        400..=499 => StatusClass::Refused,
        500..=599 => StatusClass::ServerError,
        _ => StatusClass::Unrecognised,
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
        let base = millis(self.base_backoff);
        let cap = millis(self.max_backoff);
        let exponent = u32::try_from(attempts.saturating_sub(1)).unwrap_or(0).min(20);
        base.saturating_mul(1 << exponent).min(cap)
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// An intent's history as the rules need to see it.
#[derive(Debug, Clone, Copy)]
pub struct AttemptFacts {
    /// Attempts made, the one being judged included.
    pub attempts: i32,
    /// When the first attempt went out; key retention counts from there.
    pub first_attempt_at_ms: i64,
    /// The database's clock.
    pub now_ms: i64,
    /// An earlier attempt may have reached the provider without an answer.
    pub earlier_may_have_executed: bool,
}

/// Whether the provider still remembers a key first sent at `first_attempt_at_ms`.
/// Counting from the first attempt is the cautious end: the provider can
/// only have learnt the key at or after it.
pub fn inside_retention(caps: &Capabilities, first_attempt_at_ms: i64, at_ms: i64) -> bool {
    caps.honours_keys && at_ms < first_attempt_at_ms.saturating_add(millis(caps.key_retention))
}

/// How every `unknown` reason that blames an earlier attempt begins. For a
/// provider without keys it can only be a call whose claim expired while it
/// ran (its dispatcher died): any other ambiguous answer made the intent
/// `unknown` at once.
pub const EARLIER_ATTEMPT: &str = "an earlier attempt may have reached the provider without an answer";

/// Before a call: `Some` when an earlier attempt may have executed and a new
/// call could be a second effect — the intent becomes that instead.
pub fn before_call(caps: &Capabilities, policy: &RetryPolicy, facts: AttemptFacts) -> Option<Transition> {
    if !facts.earlier_may_have_executed {
        return None;
    }
    let reason = EARLIER_ATTEMPT;
    if !caps.honours_keys {
        return Some(Transition::Unknown { reason: format!("{reason}; the provider does not honour keys") });
    }
    if !inside_retention(caps, facts.first_attempt_at_ms, facts.now_ms) {
        return Some(Transition::Unknown { reason: format!("{reason}; the provider's key retention has passed") });
    }
    if facts.attempts >= policy.max_attempts {
        return Some(Transition::Unknown { reason: format!("{reason}; retry budget spent") });
    }
    None
}

pub fn after_attempt(outcome: SendOutcome, caps: &Capabilities, policy: &RetryPolicy, facts: AttemptFacts) -> Verdict {
    let earlier = facts.earlier_may_have_executed;
    let record = |transition| Verdict::Record { transition, may_have_executed: earlier };
    match outcome {
        SendOutcome::Accepted { receipt } => record(Transition::Sent { receipt }),
        SendOutcome::NotSent { reason } => record(not_executed(reason, None, caps, policy, facts)),
        SendOutcome::Unknown { reason } => maybe_delivered(reason, caps, policy, facts),
        SendOutcome::Answered { status, retry_after, detail } => {
            let what = format!("{status}: {detail}");
            match status_class(status) {
                StatusClass::Conflict => record(Transition::Conflict { detail }),
                StatusClass::RetryLater => record(not_executed(what, retry_after, caps, policy, facts)),
                StatusClass::Credentials => Verdict::Untouched { reason: what },
                StatusClass::Refused => record(Transition::Failed { detail: what }),
                StatusClass::ServerError if caps.server_errors_safe => record(not_executed(what, None, caps, policy, facts)),
                // A 2xx reaches here only without a receipt: no evidence either way.
                StatusClass::ServerError | StatusClass::Accepted | StatusClass::Unrecognised => maybe_delivered(what, caps, policy, facts),
            }
        }
    }
}

/// The provider did not execute this attempt: retry, not before `retry_after`
/// — unless an earlier attempt may have executed and the retry would fall
/// past the key's retention, where a resend could be a second effect.
fn not_executed(
    reason: String,
    retry_after: Option<Duration>,
    caps: &Capabilities,
    policy: &RetryPolicy,
    facts: AttemptFacts,
) -> Transition {
    if facts.attempts >= policy.max_attempts {
        return Transition::Dead { reason };
    }
    let delay = policy.delay_ms(facts.attempts).max(retry_after.map_or(0, millis));
    let at_ms = facts.now_ms.saturating_add(delay);
    if facts.earlier_may_have_executed && !inside_retention(caps, facts.first_attempt_at_ms, at_ms) {
        return Transition::Unknown {
            reason: format!("{reason}; an earlier attempt may have executed and a retry would fall past key retention"),
        };
    }
    Transition::Retry { at_ms, reason }
}

/// An attempt that may have reached the provider. Resending is safe only to a
/// provider that collapses the key, and only while it still remembers it.
pub fn maybe_delivered(reason: String, caps: &Capabilities, policy: &RetryPolicy, facts: AttemptFacts) -> Verdict {
    let next = facts.now_ms.saturating_add(policy.delay_ms(facts.attempts));
    let transition = if inside_retention(caps, facts.first_attempt_at_ms, next) && facts.attempts < policy.max_attempts {
        Transition::Retry { at_ms: next, reason }
    } else if caps.honours_keys {
        Transition::Unknown { reason: format!("{reason}; a retry would fall past key retention or the retry budget") }
    } else {
        Transition::Unknown { reason: format!("{reason}; the provider does not honour keys, so it is never resent without an operator") }
    };
    Verdict::Record { transition, may_have_executed: true }
}

/// What a provider's answer about an `unknown` intent's key settles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryVerdict {
    Sent {
        receipt: String,
    },
    /// Provably never executed: send again with the same key.
    Requeue,
    /// Not found, but the provider may have forgotten the key: proves nothing.
    PastRetention {
        reason: String,
    },
    StaysUnknown {
        reason: String,
    },
}

/// A 404 proves "never executed" only while the provider would still
/// remember the key had it executed it.
pub fn after_query(answer: KeyStatus, caps: &Capabilities, first_attempt_at_ms: Option<i64>, now_ms: i64) -> QueryVerdict {
    match (answer, first_attempt_at_ms) {
        (KeyStatus::Accepted { receipt }, _) => QueryVerdict::Sent { receipt },
        (KeyStatus::NotFound, _) if !caps.honours_keys => {
            QueryVerdict::StaysUnknown { reason: "the provider does not honour keys: not found proves nothing".into() }
        }
        (KeyStatus::NotFound, None) => {
            QueryVerdict::StaysUnknown { reason: "no first attempt recorded: retention cannot be checked".into() }
        }
        (KeyStatus::NotFound, Some(first)) if inside_retention(caps, first, now_ms) => QueryVerdict::Requeue,
        (KeyStatus::NotFound, Some(first)) => QueryVerdict::PastRetention {
            reason: format!(
                "provider does not know the key, but its key retention ({:?}) counted from the first attempt ended at {} ms: \
                 not found no longer proves it never executed; a resend may duplicate",
                caps.key_retention,
                first.saturating_add(millis(caps.key_retention))
            ),
        },
    }
}

#[cfg(test)]
mod tests;
