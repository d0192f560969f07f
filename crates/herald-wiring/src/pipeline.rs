//! Herald's roles wired together. `herald serve` runs them all in one
//! process; `herald worker` (and later others) run a subset. Each role is a
//! task that takes the shared shutdown token and drains before it returns.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use herald_api::observe::Access;
use herald_api::ready::{Readiness, track};
use herald_api::{AppState, Tokens};
use herald_consumer::{Metrics, Subscription, SubscriptionOptions};
use herald_envelope::Registry;
use herald_export::artifact::ArtifactStore;
use herald_export::worker::{self, ExportWorker};
use herald_export::{IntakeConfig, LeasePolicy, cleanup, scanner};
use herald_fault::Hook;
use herald_kafka::{BrokerPing, KafkaConfig, Topics};
use herald_notify::dispatcher::{Dispatcher, DispatcherConfig};
use herald_notify::provider::ProviderClient;
use herald_notify::start::StartAt;
use herald_relay::{Relay, RelayConfig, RelayCounters};
use herald_status::{KafkaProbe, Monitor, MonitorConfig};
use herald_store::Db;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::subscriptions;

/// What every role needs to reach.
#[derive(Clone)]
pub struct Wiring {
    pub db: Db,
    pub kafka: KafkaConfig,
    pub topics: Topics,
    /// Consumer groups are `<group_prefix>.<subscription>`.
    pub group_prefix: String,
    /// Artifact location: a directory or `s3://bucket/prefix`.
    pub artifacts: String,
    pub tokens: Tokens,
}

/// Which roles this process runs.
#[derive(Debug, Clone)]
pub struct Roles {
    /// HTTP API on this address (port 0 picks one).
    pub api: Option<String>,
    pub relay: bool,
    /// Export worker plus its recovery scanner and orphan cleanup.
    pub worker: bool,
    /// The search, stats and notify subscriptions.
    pub subscriptions: bool,
    /// The notification dispatcher; needs `RoleOptions::dispatch`.
    pub dispatcher: bool,
}

impl Roles {
    pub fn all(listen: &str) -> Roles {
        Roles { api: Some(listen.to_owned()), relay: true, worker: true, subscriptions: true, dispatcher: true }
    }
}

/// Tunables of the job lifecycle.
#[derive(Debug, Clone)]
pub struct RoleOptions {
    pub policy: LeasePolicy,
    /// Unfinished jobs one caller may have.
    pub quota: i64,
    /// Fault injection at every role's points (`HERALD_FAULT`, tests).
    pub faults: Hook,
    pub scan_interval: Duration,
    /// Age before an unselectable candidate artifact is removed.
    pub orphan_grace: Duration,
    /// The notification provider, for the dispatcher role.
    pub dispatch: Option<Dispatch>,
    /// Where the notify subscription starts if its group has no committed
    /// offset and the events topic holds history (`--notify-start-at`).
    pub notify_start_at: Option<StartAt>,
    /// Schemas the subscriptions decode and the sources they accept
    /// (`--accept-source`).
    pub registry: Registry,
    /// The notify subscription's handler (its `--notify-rules`).
    pub notify: herald_notify::intents::NotifyHandler,
    /// The relay role's routes (default: every unnamed row to Herald's
    /// events topic) and `dataschema` base.
    pub routes: Option<herald_relay::Routes>,
    pub dataschema_base: Option<String>,
    /// What callers may ask of the API at once.
    pub api_limits: herald_api::limits::Limits,
    /// Where `/metrics`, `/status` and `/status.json` are served.
    pub observe: Observe,
    /// How often the status figures are taken (by one process for all).
    pub status_interval: Duration,
    /// Pruning on a schedule (`--prune-older-than-days`); off when `None`.
    pub prune: Option<crate::prune::Schedule>,
}

/// Where the observation endpoints are served.
#[derive(Debug, Clone)]
pub enum Observe {
    /// On the API's listener, to whom `Access` lets in.
    OnApi(Access),
    /// On a listener of their own at this address, open to whoever reaches it.
    Listener(String),
}

/// What the dispatcher role needs.
#[derive(Debug, Clone)]
pub struct Dispatch {
    pub client: ProviderClient,
    pub config: DispatcherConfig,
}

impl Default for RoleOptions {
    fn default() -> Self {
        RoleOptions {
            policy: LeasePolicy::default(),
            quota: 1000,
            faults: Hook::none(),
            scan_interval: Duration::from_secs(1),
            orphan_grace: Duration::from_secs(600),
            dispatch: None,
            notify_start_at: None,
            registry: Registry::embedded(),
            notify: herald_notify::intents::NotifyHandler::default(),
            routes: None,
            dataschema_base: None,
            api_limits: herald_api::limits::Limits::default(),
            observe: Observe::OnApi(Access::Open),
            status_interval: Duration::from_secs(1),
            prune: None,
        }
    }
}

/// Connections of the HTTP API's own pool (PostgreSQL): requests beyond
/// them queue, while the relay and subscriptions keep theirs.
pub const API_CONNECTIONS: u32 = 8;
/// Longest an API statement runs (and a request waits for a connection)
/// before it answers 503.
pub const API_STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// Roles running in this process.
pub struct Running {
    pub api_addr: Option<SocketAddr>,
    /// The observation listener, when it is not the API's.
    pub observe_addr: Option<SocketAddr>,
    /// The figures behind `/metrics` and `/status`, when the API role runs.
    pub monitor: Option<Arc<Monitor>>,
    /// What `/readyz` answers: the dependencies and every role started here.
    pub readiness: Readiness,
    pub shutdown: CancellationToken,
    tasks: JoinSet<anyhow::Result<()>>,
}

impl Running {
    /// Signals every role to stop and waits for each to drain.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let mut first_error = None;
        while let Some(joined) = self.tasks.join_next().await {
            if let Err(e) = joined.context("role panicked").and_then(|r| r) {
                error!(error = %e, "role failed");
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Drops every role where it stands, as a killed process would: no drain,
    /// no lease release, no offset commit. For demos and drills.
    pub async fn crash(mut self) {
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
    }

    /// Waits until a role fails or `shutdown` is cancelled from outside.
    pub async fn until_stopped(mut self) -> anyhow::Result<()> {
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            Some(joined) = self.tasks.join_next() => {
                joined.context("role panicked")??;
            }
        }
        self.stop().await
    }
}

/// Starts API, relay, export worker and the search, stats and notify
/// subscriptions.
/// (The dispatcher needs a provider, so it is started by `start_roles` with
/// `RoleOptions::dispatch`, as `herald serve` does.)
pub async fn start(wiring: Wiring, listen: &str) -> anyhow::Result<Running> {
    start_roles(wiring, Roles { dispatcher: false, ..Roles::all(listen) }, RoleOptions::default()).await
}

pub async fn start_roles(wiring: Wiring, roles: Roles, options: RoleOptions) -> anyhow::Result<Running> {
    if roles.subscriptions {
        // Before any role runs: a refusal is the operator's decision to make,
        // not a role failure discovered later.
        let notify = subscriptions::Name::Notify.subscription(&wiring.group_prefix, &wiring.kafka, &wiring.topics.events);
        subscriptions::prepare_notify(&wiring.db, &notify, options.notify_start_at).await?;
    }
    let shutdown = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let readiness = readiness(&wiring)?;
    let artifacts = ArtifactStore::from_location(&wiring.artifacts)?;
    let mut api_addr = None;
    let mut observe_addr = None;
    let mut monitor = None;
    if let Some(listen) = &roles.api {
        let listener = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
        api_addr = Some(listener.local_addr()?);
        let intake = IntakeConfig {
            topics: wiring.topics.clone(),
            quota: options.quota,
            policy: options.policy.clone(),
            faults: options.faults.clone(),
        };
        let api_db = wiring.db.api_pool(API_CONNECTIONS, API_STATEMENT_TIMEOUT).await?;
        let searches = herald_api::limits::SearchSlots::new(options.api_limits.search_concurrency);
        let state = AppState { db: api_db, intake, artifacts: artifacts.clone(), tokens: wiring.tokens.clone(), searches };
        let figures = start_monitor(&wiring, options.status_interval)?;
        let limited = herald_api::limits::apply(herald_api::router(state), options.api_limits, wiring.tokens.clone())
            .merge(herald_api::ready::routes(readiness.clone()))
            .merge(herald_api::schemas::routes(options.registry.clone()));
        let app = match &options.observe {
            Observe::OnApi(access) => limited.merge(herald_api::observe::routes(figures.clone(), access.clone())),
            Observe::Listener(listen) => {
                let observer = TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
                observe_addr = Some(observer.local_addr()?);
                let observed = api(observer, herald_api::observe::routes(figures.clone(), Access::Open), shutdown.clone());
                tasks.spawn(track(readiness.role("observe"), observed));
                limited
            }
        };
        tasks.spawn(track(readiness.role("api"), api(listener, app, shutdown.clone())));
        tasks.spawn(track(readiness.role("status"), {
            let (figures, shutdown) = (figures.clone(), shutdown.clone());
            async move {
                figures.run(shutdown).await;
                Ok(())
            }
        }));
        monitor = Some(figures);
    }
    if roles.relay {
        let relay = Relay::new(
            wiring.db.clone(),
            &wiring.kafka,
            RelayConfig {
                faults: options.faults.clone(),
                routes: options.routes.clone().unwrap_or_else(|| herald_relay::Routes::to(&wiring.topics.events)),
                dataschema_base: options.dataschema_base.clone(),
                ..RelayConfig::default()
            },
        )?;
        if let Some(monitor) = &monitor {
            publish_relay_counters(monitor, relay.counters());
        }
        let shutdown = shutdown.clone();
        tasks.spawn(track(readiness.role("relay"), async move {
            relay.run(shutdown).await;
            Ok(())
        }));
    }
    if roles.worker {
        spawn_worker_roles(&mut tasks, &readiness, &wiring, &options, artifacts, &shutdown);
    }
    if roles.subscriptions {
        for name in subscriptions::Name::ALL {
            let metrics = Arc::new(Metrics::default());
            if let Some(monitor) = &monitor {
                publish_subscription_counters(monitor, name.as_str(), &metrics);
            }
            let subscription_options = SubscriptionOptions { registry: options.registry.clone(), ..SubscriptionOptions::default() };
            let run = subscription(
                name,
                wiring.clone(),
                subscription_options,
                metrics,
                options.notify_start_at,
                options.notify.clone(),
                shutdown.clone(),
            );
            tasks.spawn(track(readiness.role(name.as_str()), run));
        }
    }
    if let Some(schedule) = options.prune.clone() {
        let (db, shutdown) = (wiring.db.clone(), shutdown.clone());
        tasks.spawn(track(readiness.role("prune"), async move {
            crate::prune::run_every(db, schedule.options, schedule.every, shutdown).await;
            Ok(())
        }));
    }
    if roles.dispatcher {
        let dispatch = options.dispatch.clone().context("the dispatcher role needs a notification provider")?;
        let dispatcher = Dispatcher::new(wiring.db.clone(), dispatch.client, dispatch.config, options.faults.clone());
        let shutdown = shutdown.clone();
        tasks.spawn(track(readiness.role("dispatcher"), async move {
            dispatcher.run(shutdown).await;
            Ok(())
        }));
    }
    Ok(Running { api_addr, observe_addr, monitor, readiness, shutdown, tasks })
}

/// Readiness needs the database and the broker to answer (a long-lived
/// client, so a probe is one metadata request).
fn readiness(wiring: &Wiring) -> anyhow::Result<Readiness> {
    let readiness = Readiness::new();
    let db = wiring.db.clone();
    readiness.depends_on(
        "database",
        Arc::new(move || {
            let db = db.clone();
            Box::pin(async move { db.ping().await.map_err(|e| e.to_string()) })
        }),
    );
    let broker = BrokerPing::new(&wiring.kafka).context("a Kafka client for readiness")?;
    readiness.depends_on(
        "broker",
        Arc::new(move || {
            let broker = broker.clone();
            Box::pin(async move { broker.answers(herald_api::ready::CHECK_TIMEOUT).await })
        }),
    );
    Ok(readiness)
}

async fn api(listener: TcpListener, app: axum::Router, shutdown: CancellationToken) -> anyhow::Result<()> {
    herald_api::serve_router(listener, app, shutdown).await.context("http server")
}

/// The status figures of this deployment, refreshed every second for
/// `/metrics` and `/status`.
fn start_monitor(wiring: &Wiring, interval: Duration) -> anyhow::Result<Arc<Monitor>> {
    let names: Vec<&str> = subscriptions::Name::ALL.iter().map(|n| n.as_str()).collect();
    let probe = KafkaProbe::new(&wiring.kafka, &wiring.topics, &wiring.group_prefix, &names, Duration::from_secs(5))?;
    Ok(Monitor::new(wiring.db.clone(), Some(probe), MonitorConfig { interval, ..MonitorConfig::new(&names) })?)
}

/// One counter of a runtime's counters struct.
type Field<T> = fn(&T) -> &AtomicU64;

/// The relay's own counters (this process's relay only) as Prometheus counters.
fn publish_relay_counters(monitor: &Monitor, stats: Arc<RelayCounters>) {
    let counters: [(&'static str, Field<RelayCounters>); 5] = [
        ("herald_relay_records_sent_total", |s| &s.sent),
        ("herald_relay_rows_delivered_total", |s| &s.delivered),
        ("herald_relay_rows_retried_total", |s| &s.retried),
        ("herald_relay_rows_set_aside_total", |s| &s.set_aside),
        ("herald_relay_progress_fenced_total", |s| &s.fenced),
    ];
    for (name, field) in counters {
        let stats = stats.clone();
        monitor.register_counter(name, &[], move || field(&stats).load(Ordering::Relaxed));
    }
}

/// A subscription's counters in this process, labelled with its name.
fn publish_subscription_counters(monitor: &Monitor, name: &str, metrics: &Arc<Metrics>) {
    let counters: [(&'static str, Field<Metrics>); 6] = [
        ("herald_consumer_events_applied_total", |m| &m.applied),
        ("herald_consumer_duplicates_total", |m| &m.duplicates),
        ("herald_consumer_dead_lettered_total", |m| &m.dead_lettered),
        ("herald_consumer_parked_total", |m| &m.parked),
        ("herald_consumer_batches_total", |m| &m.batches),
        ("herald_consumer_retries_total", |m| &m.retries),
    ];
    for (counter, field) in counters {
        let metrics = metrics.clone();
        monitor.register_counter(counter, &[("subscription", name)], move || field(&metrics).load(Ordering::Relaxed));
    }
}

fn spawn_worker_roles(
    tasks: &mut JoinSet<anyhow::Result<()>>,
    readiness: &Readiness,
    wiring: &Wiring,
    options: &RoleOptions,
    artifacts: ArtifactStore,
    shutdown: &CancellationToken,
) {
    let (db, topics, policy) = (wiring.db.clone(), wiring.topics.clone(), options.policy.clone());
    let scan = scanner::run(db.clone(), topics.clone(), policy.clone(), options.scan_interval, shutdown.clone());
    tasks.spawn(track(readiness.role("scanner"), async move {
        scan.await;
        Ok(())
    }));
    let clean = cleanup::run(db.clone(), artifacts.clone(), options.orphan_grace, options.scan_interval * 10, shutdown.clone());
    tasks.spawn(track(readiness.role("artifact-cleanup"), async move {
        clean.await;
        Ok(())
    }));
    let subscription = Subscription::new(worker::SUBSCRIPTION, &wiring.group_prefix, &wiring.kafka, &[&topics.commands]);
    let worker = ExportWorker::new(db.clone(), topics, artifacts, policy, options.faults.clone());
    let shutdown = shutdown.clone();
    tasks.spawn(track(readiness.role("export-worker"), async move {
        herald_consumer::run(&subscription, &db, &worker, shutdown).await?;
        Ok(())
    }));
}

/// One subscription of the events topic; each is its own consumer group, so
/// a slow or stopped one holds none of the others back.
async fn subscription(
    name: subscriptions::Name,
    wiring: Wiring,
    options: SubscriptionOptions,
    metrics: Arc<Metrics>,
    start_at: Option<StartAt>,
    notify: herald_notify::intents::NotifyHandler,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let sub = name.subscription(&wiring.group_prefix, &wiring.kafka, &wiring.topics.events);
    subscriptions::run_from(name, &wiring.db, &sub, &options, &metrics, start_at, &notify, shutdown).await?;
    Ok(())
}
