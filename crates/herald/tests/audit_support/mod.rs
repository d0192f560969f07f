//! Shared by the audit tests: a whole pipeline (relay, worker, subscriptions,
//! dispatcher to a keyed simulator) run in this process until it settles, and
//! `herald audit --json` run as a user runs it on what the pipeline left.

use std::process::Command;
use std::time::Duration;

use herald::pipeline::{self, Dispatch, RoleOptions, Roles, Running, Wiring};
use herald_api::Tokens;
use herald_export::{ExportRequest, Format, IntakeConfig, jobs};
use herald_kafka::KafkaConfig;
use herald_kafka::Topics;
use herald_notify::dispatcher::DispatcherConfig;
use herald_notify::provider::{Capabilities, ProviderClient};
use herald_proof::sim::{self, FaultSwitches, Ledger, SimConfig};
use herald_store::Db;
use herald_testkit::unique;
use serde_json::Value;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

/// The caller every export of these runs belongs to.
pub const CALLER: &str = "alice";

/// Where a run's evidence lives, for `herald audit`.
pub struct Ran {
    pub url: String,
    pub brokers: String,
    pub prefix: String,
    pub artifacts: String,
    pub provider: String,
}

impl Ran {
    /// `herald audit --json` with every source: its exit code and report.
    pub fn audit(&self) -> anyhow::Result<(Option<i32>, Value)> {
        self.audit_with(&[])
    }

    /// [`Ran::audit`] with more arguments.
    pub fn audit_with(&self, extra: &[&str]) -> anyhow::Result<(Option<i32>, Value)> {
        let out = Command::new(env!("CARGO_BIN_EXE_herald"))
            .args(["audit", "--json", "--database", &self.url, "--kafka", &self.brokers, "--topic-prefix", &self.prefix])
            .args(["--artifacts", &self.artifacts, "--notify-url", &self.provider])
            .args(extra)
            .env_remove("HERALD_DATABASE_URL")
            .output()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report =
            serde_json::from_str(&stdout).map_err(|e| anyhow::anyhow!("{e}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr)))?;
        Ok((out.status.code(), report))
    }
}

fn violations<'a>(report: &'a Value, check: &str) -> Vec<&'a Value> {
    report["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["check"] == check)
        .flat_map(|c| c["violations"].as_array().into_iter().flatten())
        .collect()
}

/// Whether `check` reported a violation of `kind` whose detail names `needle`.
pub fn named(report: &Value, check: &str, kind: &str, needle: &str) -> bool {
    violations(report, check).iter().any(|v| v["kind"] == kind && v["detail"].as_str().is_some_and(|d| d.contains(needle)))
}

/// Names of the checks that found a violation, in report order.
pub fn failing(report: &Value) -> Vec<String> {
    let checks = report["checks"].as_array().into_iter().flatten();
    checks
        .filter(|c| c["violations"].as_array().is_some_and(|v| !v.is_empty()))
        .filter_map(|c| c["check"].as_str().map(str::to_owned))
        .collect()
}

/// Every check ran and looked at something.
pub fn all_ran(report: &Value, checks: &[&str]) -> anyhow::Result<()> {
    for check in checks {
        let c = report["checks"].as_array().and_then(|cs| cs.iter().find(|c| c["check"] == *check)).cloned().unwrap_or_default();
        anyhow::ensure!(c["ran"] == true && c["checked"].as_u64().unwrap_or(0) > 0, "{check} looked at something: {c}");
    }
    Ok(())
}

/// Every check `herald audit` runs.
pub const CHECKS: [&str; 11] = [
    "intake_once",
    "outbox_in_kafka",
    "key_order",
    "inbox_once",
    "dead_letters_settled",
    "search_matches_jobs",
    "deleted_not_searchable",
    "stats_match_completions",
    "job_completion",
    "intents_once",
    "notify_effects",
];

pub async fn one(db: &Db, sql: &str) -> anyhow::Result<String> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get(0)?)
}

pub async fn count(db: &Db, sql: &str) -> anyhow::Result<i64> {
    Ok(sqlx::query(sql).fetch_one(db.pool()).await?.try_get(0)?)
}

/// The roles of one run and the provider simulator they notify.
pub struct Pipeline {
    pub db: Db,
    pub topics: Topics,
    /// Consumer groups are `<group_prefix>.<subscription>` (for rebuilds).
    #[allow(dead_code)]
    pub group_prefix: String,
    pub provider: String,
    sim_stop: CancellationToken,
    running: Running,
}

impl Pipeline {
    pub async fn start(url: &str, brokers: &str, topics: &Topics, artifacts: &str, ledger: &str) -> anyhow::Result<Pipeline> {
        let db = Db::connect_and_migrate(url).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let provider = format!("http://{}", listener.local_addr()?);
        let sim_stop = CancellationToken::new();
        let config = SimConfig::keyed(Duration::from_secs(3600));
        tokio::spawn(sim::serve(listener, Ledger::open(ledger).await?, config, FaultSwitches::default(), sim_stop.clone()));
        let group_prefix = unique("herald");
        let wiring = Wiring {
            db: db.clone(),
            kafka: KafkaConfig::new(brokers),
            topics: topics.clone(),
            group_prefix: group_prefix.clone(),
            artifacts: artifacts.to_owned(),
            tokens: Tokens::single("t", CALLER),
        };
        let dispatch = Dispatch {
            client: ProviderClient::new(&provider, Duration::from_secs(5))?,
            config: DispatcherConfig {
                idle_wait: Duration::from_millis(50),
                ..DispatcherConfig::new(Capabilities::keyed(Duration::from_secs(3600)))
            },
        };
        let roles = Roles { api: None, relay: true, worker: true, subscriptions: true, dispatcher: true };
        let running = pipeline::start_roles(wiring, roles, RoleOptions { dispatch: Some(dispatch), ..RoleOptions::default() }).await?;
        Ok(Pipeline { db, topics: topics.clone(), group_prefix, provider, sim_stop, running })
    }

    /// Submits one export per query (csv and json in turn), key `k<i>`.
    pub async fn submit(&self, queries: &[String]) -> anyhow::Result<Vec<String>> {
        let intake = IntakeConfig::new(self.topics.clone());
        let mut ids = Vec::new();
        for (i, query) in queries.iter().enumerate() {
            let request = ExportRequest { format: if i % 2 == 0 { Format::Csv } else { Format::Json }, query: query.clone() };
            ids.push(jobs::submit(&self.db, &intake, CALLER, &format!("k{i}"), &request).await?.job().job_id.clone());
        }
        Ok(ids)
    }

    /// Waits until the outbox is delivered and each query counts its number.
    pub async fn settle(&self, expected: &[(&str, i64)]) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
        loop {
            let mut done = herald_store::delivered::count_except(&self.db, herald_store::outbox::DELIVERED).await? == 0;
            for (sql, n) in expected {
                done &= count(&self.db, sql).await? == *n;
            }
            if done {
                return Ok(());
            }
            anyhow::ensure!(tokio::time::Instant::now() < deadline, "pipeline did not settle: {expected:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the roles; the simulator keeps answering the audit until `Ran` is done.
    pub async fn stop(self) -> anyhow::Result<(Db, String, CancellationToken)> {
        self.running.stop().await?;
        Ok((self.db, self.provider, self.sim_stop))
    }
}
