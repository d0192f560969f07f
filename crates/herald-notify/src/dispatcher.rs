//! The dispatcher: claims due intents and calls the provider for each, with
//! the intent's stable key and stored body, then records what the answer
//! proves. Several dispatchers may run; claims keep them off each other's
//! intents.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use herald_store::{Db, StoreError, now_ms};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::claims::{self, Claimed};
use crate::provider::{Capabilities, ProviderClient, SendOutcome};
use crate::rules::{self, AttemptFacts, RetryPolicy, Transition};

#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    pub owner: String,
    /// Claim lease; longer than the provider timeout, so a call in flight
    /// never outlives the claim it was made under.
    pub lease: Duration,
    pub batch: i64,
    pub idle_wait: Duration,
    pub caps: Capabilities,
    pub policy: RetryPolicy,
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
        }
    }
}

type Hook = dyn Fn(String) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

impl std::fmt::Debug for AfterResponseHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "AfterResponseHook(set)" } else { "AfterResponseHook(none)" })
    }
}

/// A hook run after the provider answered and before the answer is recorded
/// — the window where a crash loses the receipt. For tests and drills.
#[derive(Clone, Default)]
pub struct AfterResponseHook(Option<Arc<Hook>>);

impl AfterResponseHook {
    pub fn new<F, Fut>(hook: F) -> AfterResponseHook
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        AfterResponseHook(Some(Arc::new(move |key| Box::pin(hook(key)))))
    }
}

pub struct Dispatcher {
    db: Db,
    client: ProviderClient,
    config: DispatcherConfig,
    hook: AfterResponseHook,
}

impl Dispatcher {
    pub fn new(db: Db, client: ProviderClient, config: DispatcherConfig, hook: AfterResponseHook) -> Dispatcher {
        Dispatcher { db, client, config, hook }
    }

    /// Dispatches until `shutdown`: stops claiming, cancels calls in flight
    /// (their leases are kept, see [`Dispatcher::dispatch_once`]) and returns.
    pub async fn run(&self, shutdown: CancellationToken) {
        info!(owner = %self.config.owner, provider = %self.client.base_url(), keyed = self.config.caps.honours_keys, "dispatcher started");
        while !shutdown.is_cancelled() {
            let wait = match self.dispatch_once(&shutdown).await {
                Ok(0) => self.config.idle_wait,
                Ok(_) => Duration::ZERO,
                Err(e) => {
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
    pub async fn dispatch_once(&self, shutdown: &CancellationToken) -> Result<usize, StoreError> {
        let lease_ms = i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX);
        let batch = claims::claim(&self.db, &self.config.owner, lease_ms, self.config.batch).await?;
        let mut recorded = 0;
        for (i, claimed) in batch.iter().enumerate() {
            if shutdown.is_cancelled() {
                // Never sent: give these back now rather than make them wait out a lease.
                for unsent in &batch[i..] {
                    claims::release_unsent(&self.db, unsent).await?;
                }
                break;
            }
            let Some(transition) = self.attempt(claimed, shutdown).await else {
                // Cancelled mid-call: the request may have reached the provider,
                // so the claim stays until its lease expires and another
                // dispatcher retries with the same key.
                debug!(key = %claimed.key, "call cancelled; lease kept");
                continue;
            };
            if claims::finish(&self.db, claimed, &transition).await? {
                recorded += 1;
                info!(key = %claimed.key, status = transition.status(), attempts = claimed.attempts, "notification attempt recorded");
            } else {
                warn!(key = %claimed.key, "claim lost before the outcome was recorded; the new holder decides");
            }
        }
        Ok(recorded)
    }

    /// The transition for one claimed intent; `None` when shutdown cancelled
    /// the call.
    async fn attempt(&self, claimed: &Claimed, shutdown: &CancellationToken) -> Option<Transition> {
        let facts = AttemptFacts { attempts: claimed.attempts, first_attempt_at_ms: claimed.first_attempt_at_ms, now_ms: now_ms() };
        if claimed.previous_attempt_unfinished {
            let reason = "previous attempt was interrupted after it may have reached the provider".to_owned();
            if let Transition::Unknown { reason } = rules::maybe_delivered(reason, &self.config.caps, &self.config.policy, facts) {
                return Some(Transition::Unknown { reason });
            }
        }
        let outcome = tokio::select! {
            outcome = self.client.send(&claimed.key, &claimed.body) => outcome,
            _ = shutdown.cancelled() => return None,
        };
        if let Some(hook) = &self.hook.0 {
            hook(claimed.key.clone()).await;
        }
        if let SendOutcome::Unknown { reason } = &outcome {
            warn!(key = %claimed.key, %reason, "provider outcome unknown");
        }
        Some(rules::after_attempt(outcome, &self.config.caps, &self.config.policy, facts))
    }
}
