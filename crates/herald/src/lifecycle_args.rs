//! Flags of the job lifecycle shared by `serve` and `worker`, and the
//! `HERALD_FAULT` hook used by crash drills.

use std::time::Duration;

use clap::Args;
use herald_export::LeasePolicy;
use herald_export::faults::{FaultAction, FaultPoint, Faults};

use crate::pipeline::Options;

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
    /// Unfinished jobs one caller may have before intake answers 429.
    #[arg(long, env = "HERALD_QUOTA", default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..))]
    pub quota: i64,
}

impl LifecycleArgs {
    pub fn options(&self) -> anyhow::Result<Options> {
        Ok(Options {
            policy: LeasePolicy {
                lease: Duration::from_millis(self.lease_ms),
                dispatch_timeout: Duration::from_millis(self.dispatch_timeout_ms),
                attempt_budget: self.attempt_budget,
                ..LeasePolicy::default()
            },
            quota: self.quota,
            faults: faults_from_env()?,
            scan_interval: Duration::from_millis(self.scan_interval_ms),
            orphan_grace: Duration::from_secs(self.orphan_grace_secs),
            dispatch: None,
            notify_start_at: None,
        })
    }
}

/// `HERALD_FAULT=hang:<point>` makes every attempt stop forever at `<point>`
/// after printing `herald-fault: hang at <point> job=<id> generation=<n>` on
/// stdout — how a drill or a test knows the exact moment to SIGKILL the
/// process. `HERALD_FAULT=fail:<point>` fails there instead. For drills and
/// tests only; unset in production.
pub fn faults_from_env() -> anyhow::Result<Faults> {
    let Ok(spec) = std::env::var("HERALD_FAULT") else { return Ok(Faults::none()) };
    let (mode, point) = spec.split_once(':').ok_or_else(|| anyhow::anyhow!("HERALD_FAULT `{spec}` is not mode:point"))?;
    let point = FaultPoint::parse(point).ok_or_else(|| anyhow::anyhow!("HERALD_FAULT: unknown point `{point}`"))?;
    let hang = match mode {
        "hang" => true,
        "fail" => false,
        other => anyhow::bail!("HERALD_FAULT: unknown mode `{other}` (hang or fail)"),
    };
    Ok(Faults::hook(move |ctx| async move {
        if ctx.point != point {
            return FaultAction::Continue;
        }
        if !hang {
            return FaultAction::Fail(format!("HERALD_FAULT at {point}"));
        }
        println!("herald-fault: hang at {point} job={} generation={}", ctx.job_id, ctx.generation);
        use std::io::Write;
        let _ = std::io::stdout().flush();
        std::future::pending::<FaultAction>().await
    }))
}
