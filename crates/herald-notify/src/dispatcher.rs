//! The dispatcher: claims due intents and calls the provider for each, with
//! the intent's stable key and stored body, then records what the answer
//! proves. Several dispatchers may run; claims keep them off each other's
//! intents.
//!
//! The claim rule: no call starts unless [`claims::begin_call`] has just
//! renewed the claim on the database's clock, and the renewed lease, minus
//! the time since the renewing statement was sent, still exceeds the call's
//! timeout by [`CALL_SLACK`]. A batch holds no more intents than can be
//! reached within one lease if every call before them takes its full
//! timeout ([`batch_limit`]).

use std::time::Duration;

use herald_fault::{Hook, Point};
use herald_store::{Db, StoreError};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, warn};

use crate::claims::{self, CallStart, Claimed};
use crate::provider::{Capabilities, ProviderClient};
use crate::rules::{self, AttemptFacts, RetryPolicy, Transition, Verdict};

/// What a renewed lease must have left beyond the call's timeout when the
/// call starts: timers fire late by a little.
pub const CALL_SLACK: Duration = Duration::from_millis(100);

/// Time a batch keeps in hand for its database statements.
const BATCH_MARGIN: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub owner: String,
    /// Claim lease; must exceed the provider timeout by [`CALL_SLACK`].
    pub lease: Duration,
    /// Most intents claimed at once; [`batch_limit`] may lower it.
    pub batch: i64,
    pub idle_wait: Duration,
    pub caps: Capabilities,
    pub policy: RetryPolicy,
    /// How long dispatching pauses after the provider refused Herald's
    /// credentials, before it tries again.
    pub credentials_pause: Duration,
}

impl DispatcherConfig {
    pub fn new(caps: Capabilities) -> DispatcherConfig {
        DispatcherConfig {
            owner: format!("dispatcher-{}", uuid::Uuid::new_v4().simple()),
            lease: Duration::from_secs(30),
            batch: 50,
            idle_wait: Duration::from_millis(100),
            caps,
            policy: RetryPolicy::default(),
            credentials_pause: Duration::from_secs(60),
        }
    }
}

/// Intents one batch may claim: the k-th is reached at the latest after
/// k − 1 full call timeouts, and must still be held then. Claiming more
/// would only keep other dispatchers off intents this one cannot reach.
pub fn batch_limit(configured: i64, lease: Duration, timeout: Duration) -> i64 {
    let usable = lease.saturating_sub(BATCH_MARGIN).as_millis();
    let reachable = usable.checked_div(timeout.as_millis()).map_or(1, |n| n.saturating_add(1));
    configured.clamp(1, i64::try_from(reachable).unwrap_or(i64::MAX).max(1))
}

/// Why a dispatch pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The database failed. Nothing was recorded wrongly: retry the pass
    /// after a pause.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider refused Herald itself (401/403): a configuration problem
    /// an operator must fix. Intents are left as they were; dispatching
    /// pauses.
    #[error("the provider refused Herald's credentials ({reason}): fix the provider configuration")]
    CredentialsRefused { reason: String },
}

/// How one claimed intent ended in this pass.
enum Step {
    Recorded,
    /// The claim was lost, or the call could not start safely: nothing sent
    /// or nothing recorded by this dispatcher.
    NotMine,
    /// Shutdown during the call: the claim is kept until its lease expires.
    Cancelled,
    /// The provider refused Herald's credentials; the intent is untouched.
    Paused(String),
}

pub struct Dispatcher {
    db: Db,
    client: ProviderClient,
    config: DispatcherConfig,
    faults: Hook,
}

impl Dispatcher {
    pub fn new(db: Db, client: ProviderClient, config: DispatcherConfig, faults: Hook) -> Dispatcher {
        Dispatcher { db, client, config, faults }
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// Dispatches until `shutdown`: stops claiming, cancels calls in flight
    /// (their leases are kept, see [`Dispatcher::dispatch_once`]) and returns.
    pub async fn run(&self, shutdown: CancellationToken) {
        let caps = &self.config.caps;
        info!(
            owner = %self.config.owner, provider = %self.client.base_url(), honours_keys = caps.honours_keys,
            key_retention = ?caps.key_retention, queryable = caps.queryable, server_errors_safe = caps.server_errors_safe,
            lease = ?self.config.lease, call_timeout = ?self.client.timeout(),
            batch = batch_limit(self.config.batch, self.config.lease, self.client.timeout()),
            "dispatcher started; provider capabilities assumed (configuration, never discovered)"
        );
        while !shutdown.is_cancelled() {
            let wait = match self.dispatch_once(&shutdown).await {
                Ok(0) => self.config.idle_wait,
                Ok(_) => Duration::ZERO,
                Err(DispatchError::CredentialsRefused { reason }) => {
                    error!(%reason, pause = ?self.config.credentials_pause, "configuration problem: the provider refused Herald's credentials; dispatching paused, intents untouched");
                    self.config.credentials_pause
                }
                Err(DispatchError::Store(e)) => {
                    warn!(error = %e, "dispatch pass failed; retrying");
                    self.config.idle_wait * 10
                }
            };
            if !wait.is_zero() {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
        info!(owner = %self.config.owner, "dispatcher stopped");
    }

    /// One pass over due intents. Returns how many attempts were recorded.
    pub async fn dispatch_once(&self, shutdown: &CancellationToken) -> Result<usize, DispatchError> {
        let limit = batch_limit(self.config.batch, self.config.lease, self.client.timeout());
        let batch = claims::claim(&self.db, &self.config.owner, self.lease_ms(), limit).await?;
        let mut recorded = 0;
        for (i, claimed) in batch.iter().enumerate() {
            if shutdown.is_cancelled() {
                // Never begun: give these back now rather than make them wait out a lease.
                release_all(&self.db, &batch[i..]).await?;
                break;
            }
            match self.attempt(claimed, shutdown).await? {
                Step::Recorded => recorded += 1,
                Step::NotMine => {}
                // The request may have reached the provider, so the claim
                // stays until its lease expires; the next holder decides.
                Step::Cancelled => debug!(key = %claimed.key, "call cancelled; lease kept"),
                Step::Paused(reason) => {
                    release_all(&self.db, &batch[i + 1..]).await?;
                    return Err(DispatchError::CredentialsRefused { reason });
                }
            }
        }
        Ok(recorded)
    }

    async fn attempt(&self, claimed: &Claimed, shutdown: &CancellationToken) -> Result<Step, StoreError> {
        let (caps, policy) = (&self.config.caps, &self.config.policy);
        let before = AttemptFacts {
            attempts: claimed.attempts,
            first_attempt_at_ms: claimed.first_attempt_at_ms.unwrap_or(i64::MIN),
            now_ms: claimed.claimed_at.now_ms(),
            earlier_may_have_executed: claimed.may_have_executed,
        };
        if let Some(transition) = rules::before_call(caps, policy, before) {
            return self.record(claimed, &transition, true).await;
        }
        let Some(start) = self.start_call(claimed).await? else { return Ok(Step::NotMine) };
        let call = tracing::info_span!(parent: None, "notify.provider_call", idempotency_key = %claimed.key, recipient = %claimed.recipient, attempt = start.attempts);
        herald_trace::set_parent(&call, claimed.trace.as_ref());
        // The provider hears the call's own span; without ids (no layer), the event's.
        let trace = herald_trace::context_of(&call).or_else(|| claimed.trace.clone());
        let outcome = tokio::select! {
            outcome = self.client.send(&claimed.key, &claimed.body, trace.as_ref()).instrument(call) => outcome,
            _ = shutdown.cancelled() => return Ok(Step::Cancelled),
        };
        // The window where a crash loses the provider's receipt (tests, drills).
        let _ = self.faults.at(Point::AfterProviderResponse, &claimed.key, 0).await;
        let after = AttemptFacts {
            attempts: start.attempts,
            first_attempt_at_ms: start.first_attempt_at_ms,
            now_ms: start.renewed_at.now_ms(),
            earlier_may_have_executed: claimed.may_have_executed,
        };
        match rules::after_attempt(outcome, caps, policy, after) {
            Verdict::Record { transition, may_have_executed } => self.record(claimed, &transition, may_have_executed).await,
            Verdict::Untouched { reason } => {
                claims::release_untouched(&self.db, claimed).await?;
                Ok(Step::Paused(reason))
            }
        }
    }

    /// Renews the claim for a call and checks that the renewed lease outlasts
    /// the call; `None`: no call may start.
    async fn start_call(&self, claimed: &Claimed) -> Result<Option<CallStart>, StoreError> {
        let Some(start) = claims::begin_call(&self.db, claimed, self.lease_ms()).await? else {
            warn!(key = %claimed.key, owner = %self.config.owner, "claim lost before the call; not calling");
            return Ok(None);
        };
        let left = self.config.lease.saturating_sub(start.renewed_at.elapsed());
        if left < self.client.timeout() + CALL_SLACK {
            warn!(key = %claimed.key, left = ?left, call_timeout = ?self.client.timeout(), "renewed lease would not outlast the call (slow database); not calling");
            claims::release_untouched(&self.db, claimed).await?;
            return Ok(None);
        }
        Ok(Some(start))
    }

    async fn record(&self, claimed: &Claimed, transition: &Transition, may_have_executed: bool) -> Result<Step, StoreError> {
        if !claims::finish(&self.db, claimed, transition, may_have_executed).await? {
            warn!(key = %claimed.key, "claim lost before the outcome was recorded; the new holder decides");
            return Ok(Step::NotMine);
        }
        if let Transition::Unknown { reason } = transition {
            warn!(key = %claimed.key, %reason, "provider outcome unknown");
        }
        info!(key = %claimed.key, status = transition.status(), "notification attempt recorded");
        Ok(Step::Recorded)
    }
}

async fn release_all(db: &Db, claims: &[Claimed]) -> Result<(), StoreError> {
    for claimed in claims {
        claims::release_unsent(db, claimed).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn a_batch_holds_only_what_full_timeouts_let_it_reach_within_one_lease() {
        assert_eq!(batch_limit(50, S(30), S(10)), 3, "reached after 0, 10 and 20 s of a 29 s window");
        assert_eq!(batch_limit(50, S(8), S(6)), 2);
        assert_eq!(batch_limit(50, Duration::from_millis(1500), S(1)), 1);
        assert_eq!(batch_limit(2, S(60), S(1)), 2, "never more than configured");
        assert_eq!(batch_limit(50, S(5), Duration::ZERO), 1, "degenerate timeout: one at a time");
        assert_eq!(batch_limit(0, S(30), S(1)), 1);
    }
}
