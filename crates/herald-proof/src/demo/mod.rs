//! `herald demo`: the thin path end to end on the embedded default, then a
//! report of what happened, checked. Exit status 1 when a check fails.

mod client;
mod notify;
mod rebuild;
mod report;
mod takeover;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::json;

use herald_export::LeasePolicy;
use herald_wiring::config::Backends;

use crate::sim::FaultSwitches;
use herald_notify::dispatcher::DispatcherConfig;
use herald_notify::provider::ProviderClient;
use herald_notify::rules::RetryPolicy;

use client::DemoClient;
use herald_wiring::pipeline::{self, Dispatch, RoleOptions, Roles};
use report::{Check, Counts};

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Exports to request.
    #[arg(long, default_value_t = 20)]
    exports: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Give up waiting for the pipeline to settle after this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
}

/// Every `REPEAT_EVERY`-th request is sent twice with the same key.
const REPEAT_EVERY: usize = 10;

pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    if args.exports == 0 {
        eprintln!("error: --exports must be at least 1");
        return Ok(ExitCode::from(2));
    }
    let backends = Backends {
        database: Default::default(),
        kafka: Default::default(),
        topic: herald_wiring::topic_args::TopicArgs { partitions: 4, replication_factor: None, min_insync_replicas: None },
        artifacts: None,
        topic_prefix: None,
        group_prefix: "herald".into(),
        sources: Default::default(),
        tokens: None,
    };
    let env = backends.resolve().await?;
    let token = env.default_token.clone().unwrap_or_default();
    // The receiver loses the answer to one call after committing it: the
    // dispatcher times out, retries with the same key, and the keyed receiver
    // replays instead of executing twice.
    let provider = crate::embedded::start_provider(&env, FaultSwitches { drop_responses: 1, ..FaultSwitches::default() }).await?;
    let provider_url = provider.url;
    let notify_client = ProviderClient::new(&provider_url, Duration::from_secs(1))?;
    let notify_config = DispatcherConfig {
        idle_wait: Duration::from_millis(20),
        lease: Duration::from_secs(3),
        policy: RetryPolicy { base_backoff: Duration::from_millis(100), ..RetryPolicy::default() },
        ..DispatcherConfig::new(provider.caps)
    };
    let options = RoleOptions {
        policy: LeasePolicy { lease: Duration::from_secs(1), ..LeasePolicy::default() },
        scan_interval: Duration::from_millis(200),
        dispatch: Some(Dispatch { client: notify_client, config: notify_config }),
        ..RoleOptions::default()
    };
    let core_roles = Roles { api: Some("127.0.0.1:0".into()), relay: true, worker: false, subscriptions: true, dispatcher: true };
    let running = pipeline::start_roles(env.wiring.clone(), core_roles, options.clone()).await?;
    let (hooks, mut hung_rx) = takeover::hang_first_attempt(2);
    let mut workers = Vec::new();
    for faults in hooks {
        let worker_roles = Roles { api: None, relay: false, worker: true, subscriptions: false, dispatcher: false };
        workers.push(Some(pipeline::start_roles(env.wiring.clone(), worker_roles, RoleOptions { faults, ..options.clone() }).await?));
    }
    let client = DemoClient::new(running.api_addr.context("demo runs the API")?, token);
    let started = Instant::now();

    let mut checks = Vec::new();
    let intake = client.submit_all(args.exports, REPEAT_EVERY).await?;
    checks.extend(intake.checks());
    checks.extend(client.bad_input_checks(&env.wiring.db).await?);
    let timeout = Duration::from_secs(args.timeout_secs);
    let hung = tokio::time::timeout(timeout, hung_rx.recv()).await?.context("no attempt reached the crash point")?;
    if let Some(victim) = workers.get_mut(hung.worker).and_then(Option::take) {
        victim.crash().await;
    }

    let settled = report::wait_settled(&env.wiring.db, args.exports as i64, Duration::from_secs(args.timeout_secs)).await?;
    checks.push(Check::new("pipeline settled", settled, format!("after {:.1}s", started.elapsed().as_secs_f64())));
    let counts = Counts::gather(&env.wiring.db, &env.wiring.kafka, &env.wiring.topics).await?;
    checks.extend(counts.checks(args.exports as i64));
    checks.push(client.search_check(&intake).await?);
    checks.push(takeover::check(&env.wiring.db, &hung, timeout).await?);
    let notified = notify::gather(&env.wiring.db, &provider_url, args.exports as i64, timeout).await?;
    checks.extend(notified.checks(args.exports as i64));
    checks.extend(rebuild::rebuild_and_switch(&env.wiring, &provider_url, args.exports as i64).await?);
    for worker in workers.into_iter().flatten() {
        worker.stop().await?;
    }
    running.stop().await?;
    let audit = audit(&env.wiring, &provider_url).await?;
    checks.extend(audit.checks.iter().map(audit_check));

    let ok = checks.iter().all(|c| c.ok);
    if args.json {
        let mut out = json!({"ok": ok, "checks": checks, "repeated_requests": intake.repeated, "audit": audit});
        for extra in [serde_json::to_value(&counts)?, serde_json::to_value(&notified)?] {
            if let (Some(map), serde_json::Value::Object(fields)) = (out.as_object_mut(), extra) {
                map.extend(fields);
            }
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "notifications: {} intents, {} sent, {} provider effects\n",
            notified.notification_intents, notified.notifications_sent, notified.provider_effects
        );
        report::print_table(&checks, &counts, intake.repeated);
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `herald audit` on what the demo left: database, mock cluster history,
/// artifacts and the simulator's effects.
async fn audit(wiring: &herald_wiring::pipeline::Wiring, provider_url: &str) -> anyhow::Result<herald_audit::Report> {
    let sources = herald_audit::Sources {
        db: &wiring.db,
        kafka: &wiring.kafka,
        topics: &wiring.topics,
        artifacts: Some(herald_export::artifact::ArtifactStore::from_location(&wiring.artifacts)?),
        provider_url: Some(provider_url.to_owned()),
        kafka_timeout: Duration::from_secs(60),
        clock_skew: herald_audit::DEFAULT_CLOCK_SKEW,
    };
    Ok(herald_audit::audit(&sources).await?.0)
}

fn audit_check(c: &herald_audit::CheckReport) -> Check {
    let first = c.violations.first().map(|v| format!(": {} {}", v.kind, v.detail)).unwrap_or_default();
    let detail = format!("{} checked, {} violation(s){first} — invariant {}", c.checked, c.violations.len(), c.invariant);
    Check::new(&format!("audit {}", c.check), c.ran && c.violations.is_empty(), detail)
}
