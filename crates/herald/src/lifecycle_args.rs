//! Flags of the job lifecycle shared by `serve` and `worker`.

use std::num::NonZeroU32;
use std::time::Duration;

use clap::Args;
use herald_api::limits::{self, Limits};
use herald_api::observe::Access;
use herald_export::LeasePolicy;
use herald_secret::Secret;

use crate::pipeline::{Observe, RoleOptions};

#[derive(Debug, Clone, Args)]
pub struct LifecycleArgs {
    /// Lease of an attempt; an attempt silent for longer is taken over.
    #[arg(long, env = "HERALD_LEASE_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub lease_ms: u64,
    /// How long a pending job waits for a worker before its command is re-issued.
    #[arg(long, env = "HERALD_DISPATCH_TIMEOUT_MS", default_value_t = 120_000)]
    pub dispatch_timeout_ms: u64,
    /// Failed attempts before a job fails for good.
    #[arg(long, env = "HERALD_ATTEMPT_BUDGET", default_value_t = 5, value_parser = clap::value_parser!(i32).range(1..))]
    pub attempt_budget: i32,
    /// How often the recovery scanner looks for expired leases.
    #[arg(long, env = "HERALD_SCAN_INTERVAL_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub scan_interval_ms: u64,
    /// Age before an unselectable candidate artifact is removed.
    #[arg(long, env = "HERALD_ORPHAN_GRACE_SECS", default_value_t = 600)]
    pub orphan_grace_secs: u64,
    /// How often the status figures behind `/metrics` and `/status` are
    /// taken; one process (a lease in the database) takes them for all.
    #[arg(long, env = "HERALD_STATUS_INTERVAL_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub status_interval_ms: u64,
    /// Unfinished jobs one caller may have before intake answers 429.
    #[arg(long, env = "HERALD_QUOTA", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
    pub quota: i64,
    /// API requests handled at once; more are answered 429.
    #[arg(long, env = "HERALD_API_CONCURRENCY", default_value_t = limits::DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_concurrency: u32,
    /// API requests per second one caller may make (sustained); more are answered 429.
    #[arg(long, env = "HERALD_API_RATE", default_value_t = limits::DEFAULT_PER_CALLER_PER_SEC, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_rate: u32,
    /// Serve `/metrics`, `/status` and `/status.json` on this address of
    /// their own (guard it by network) instead of on the API's listener.
    #[arg(long, env = "HERALD_OBSERVE_LISTEN")]
    pub observe_listen: Option<String>,
    /// On the API's listener, the bearer token `/metrics` and `/status.json`
    /// require; default: one made at start and printed with the dashboard's
    /// address.
    #[arg(long, env = "HERALD_OBSERVE_TOKEN", hide_env_values = true, conflicts_with = "observe_listen")]
    pub observe_token: Option<Secret>,
    /// API requests one caller may make at once above its rate.
    #[arg(long, env = "HERALD_API_BURST", default_value_t = limits::DEFAULT_PER_CALLER_BURST, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_burst: u32,
    /// Searches run at once by this process; more wait up to a second, then
    /// get 429. Searches are the API's one request whose cost grows with the
    /// data: this bounds their share of the database.
    #[arg(long, env = "HERALD_API_SEARCH_CONCURRENCY", default_value_t = limits::DEFAULT_SEARCH_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..))]
    pub api_search_concurrency: u32,
}

impl LifecycleArgs {
    pub fn options(&self) -> anyhow::Result<RoleOptions> {
        Ok(RoleOptions {
            policy: LeasePolicy {
                lease: Duration::from_millis(self.lease_ms),
                dispatch_timeout: Duration::from_millis(self.dispatch_timeout_ms),
                attempt_budget: self.attempt_budget,
                ..LeasePolicy::default()
            },
            quota: self.quota,
            // `HERALD_FAULT` (like `--accept-source` and the dispatcher) is
            // set by whoever starts the roles.
            scan_interval: Duration::from_millis(self.scan_interval_ms),
            orphan_grace: Duration::from_secs(self.orphan_grace_secs),
            status_interval: Duration::from_millis(self.status_interval_ms),
            api_limits: Limits {
                concurrency: self.api_concurrency as usize,
                per_caller_per_sec: NonZeroU32::new(self.api_rate).unwrap_or(NonZeroU32::MIN),
                per_caller_burst: NonZeroU32::new(self.api_burst).unwrap_or(NonZeroU32::MIN),
                search_concurrency: self.api_search_concurrency as usize,
                ..Limits::default()
            },
            observe: match (&self.observe_listen, &self.observe_token) {
                (Some(listen), _) => Observe::Listener(listen.clone()),
                (None, Some(token)) => Observe::OnApi(Access::Bearer(token.clone())),
                (None, None) => Observe::OnApi(Access::Bearer(Secret::new(format!("observe-{}", uuid::Uuid::new_v4().simple())))),
            },
            ..RoleOptions::default()
        })
    }
}
