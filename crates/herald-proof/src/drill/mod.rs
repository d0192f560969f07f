//! `herald drill`: the pipeline as separate `herald` processes against
//! PostgreSQL and a three-node Apache Kafka cluster, under load, with
//! processes and brokers SIGKILLed and restarted throughout (one broker down
//! at a time); then a drain and the audit. Exit 0 only when the drain settled, every export was answered,
//! the audit found nothing, intake kept its promises and the provider saw no
//! duplicate; 1 otherwise; 2 for bad input. The working directory (process
//! logs, broker storage, artifacts) is kept when the drill fails.

mod brokers;
mod drain;
mod load;
mod procs;
mod provider;
mod report;
mod upgrade;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use herald_audit::Sources;
use herald_export::artifact::ArtifactStore;
use herald_kafka::{KafkaConfig, Topics};
use herald_store::Db;
use tokio_util::sync::CancellationToken;

use brokers::Brokers;
use procs::{Procs, Spec};
use provider::ProviderMode;

#[derive(Debug, Clone, Args)]
pub struct DrillArgs {
    /// Minutes of chaos before the drain (fractions allowed).
    #[arg(long, default_value_t = 3.0)]
    pub minutes: f64,
    /// Seconds of chaos instead of minutes (for CI).
    #[arg(long, conflicts_with = "minutes")]
    pub seconds: Option<f64>,
    /// A PostgreSQL server; the drill creates a fresh database on it.
    #[command(flatten)]
    pub database: herald_wiring::connection::DatabaseArgs,
    /// Apache Kafka's jars (scripts/kafka-fetch): the drill starts a cluster
    /// of `--nodes` nodes from them and kills and restarts its brokers.
    #[arg(long, env = "HERALD_KAFKA_HOME")]
    pub kafka_home: Option<std::path::PathBuf>,
    /// Or a running cluster's bootstrap servers: used as it is, no broker
    /// is killed.
    #[arg(long, conflicts_with = "kafka_home")]
    pub brokers: Option<String>,
    /// Nodes of the cluster the drill starts.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=9))]
    pub nodes: u16,
    /// The notification provider the dispatchers face: keyed or unkeyed,
    /// prompt or slow (answers around the call timeout, sometimes after it,
    /// sometimes executes then drops the connection).
    #[arg(long, value_enum, default_value = "keyed")]
    pub provider: ProviderMode,
    /// Export requests per second.
    #[arg(long, default_value_t = 8.0)]
    pub rate: f64,
    /// Mean time between two kills.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub kill_every: Duration,
    /// Mean time between two broker kills (the next waits until the
    /// restarted node has caught up).
    #[arg(long, default_value = "40s", value_parser = humantime::parse_duration)]
    pub broker_kill_every: Duration,
    /// How long a killed broker stays down.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub broker_down: Duration,
    /// Give up draining after this long.
    #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// The API token of the drill's load (caller `drill`); default: a random one.
    #[arg(long, env = "HERALD_DRILL_TOKEN", hide_env_values = true)]
    pub token: Option<herald_secret::Secret>,
    /// Keep the working directory (logs, broker storage, artifacts).
    #[arg(long)]
    pub keep: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// An older release's `herald` binary: a rolling upgrade instead of
    /// random kills. Every role starts on it; this binary migrates beside
    /// them with work in flight, replaces them one at a time, rolls the last
    /// step back and finishes the rebuild the old release left half done.
    #[arg(long, value_name = "HERALD")]
    pub upgrade_from: Option<std::path::PathBuf>,
}

fn usage(message: &str) -> anyhow::Result<ExitCode> {
    eprintln!("error: {message}");
    Ok(ExitCode::from(2))
}

pub async fn run(args: DrillArgs) -> anyhow::Result<ExitCode> {
    let seconds = args.seconds.unwrap_or(args.minutes * 60.0);
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if !positive(seconds) || !positive(args.rate) || args.kill_every.is_zero() {
        return usage("--minutes/--seconds, --rate and --kill-every must be positive");
    }
    let Some(server) = args.database.url.as_ref().filter(|u| u.expose().starts_with("postgres") || u.expose().starts_with("sqlite:"))
    else {
        return usage(
            "--database (HERALD_DATABASE_URL) must name a PostgreSQL server (the drill creates its own database there) \
             or be `sqlite:` (a new file in the drill's working directory, which every role shares)",
        );
    };
    let cluster = match (args.brokers.as_deref(), args.kafka_home.as_deref()) {
        (Some(bootstrap), _) => Cluster::Given(bootstrap),
        (None, Some(home)) => match herald_cluster::check_kafka_home(home) {
            Ok(()) => Cluster::Start(home),
            Err(e) => return usage(&format!("--kafka-home: {e:#}")),
        },
        (None, None) => return usage("--kafka-home (HERALD_KAFKA_HOME, see scripts/kafka-fetch) or --brokers is required"),
    };
    if args.broker_kill_every.is_zero() {
        return usage("--broker-kill-every must be positive");
    }
    if let Some(old) = args.upgrade_from.as_deref().filter(|old| !old.is_file()) {
        return usage(&format!("--upgrade-from {}: no such file", old.display()));
    }
    let work = tempfile::Builder::new().prefix("herald-drill-").tempdir()?;
    let outcome = drill(&args, Duration::from_secs_f64(seconds), server, cluster, work.path()).await;
    if args.keep || !matches!(outcome, Ok(true)) {
        let kept = work.keep();
        eprintln!("drill: working directory kept at {} (process logs, broker storage)", kept.display());
    }
    Ok(if outcome? { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Which Kafka cluster the drill runs on.
enum Cluster<'a> {
    /// Started from these jars, its brokers killed and restarted.
    Start(&'a std::path::Path),
    /// Running already (bootstrap servers), left alone.
    Given(&'a str),
}

/// The drill itself; `Ok(true)` when it passed.
async fn drill(
    args: &DrillArgs,
    chaos: Duration,
    server: &herald_secret::SecretUrl,
    cluster: Cluster<'_>,
    work: &std::path::Path,
) -> anyhow::Result<bool> {
    // Kept after the run: the evidence an operator may want to read.
    let url = if server.expose().starts_with("sqlite:") {
        herald_secret::SecretUrl::new(format!("sqlite://{}?mode=rwc", work.join("herald.db").display()))
    } else {
        crate::scratch::ScratchDb::create(server, "herald_drill").await?.url
    };
    let release = match &args.upgrade_from {
        Some(old) => Some(upgrade::Release { old: old.clone(), new: std::env::current_exe()? }),
        None => None,
    };
    let db = match &release {
        None => Db::connect_and_migrate(url.expose()).await?,
        Some(release) => {
            // The schema the old release migrates to; the new one migrates later.
            let migrated = tokio::process::Command::new(&release.old)
                .arg("migrate")
                .env("HERALD_DATABASE_URL", url.expose())
                .stdout(std::process::Stdio::null())
                .status()
                .await?;
            anyhow::ensure!(migrated.success(), "{} migrate: {migrated}", release.old.display());
            Db::connect(url.expose()).await?
        }
    };
    let mut brokers = match cluster {
        Cluster::Given(bootstrap) => Brokers::given(bootstrap),
        Cluster::Start(home) => {
            Brokers::start(home, &work.join("kafka"), usize::from(args.nodes), args.broker_kill_every, args.broker_down)?
        }
    };
    // Notifications start with the drill: every completion it causes is
    // notified, and a notify consumer that first starts after the first
    // completions were relayed does not take them for history to refuse.
    let notify_from = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let topics = Topics::default();
    let kafka = KafkaConfig::new(brokers.bootstrap());
    create_topics(&kafka, &topics).await?;
    let artifacts = work.join("artifacts");
    let token = args.token.clone().unwrap_or_else(|| herald_secret::Secret::new(format!("drill-{}", uuid::Uuid::new_v4().simple())));
    let (api_port, sim_port) = (free_port()?, free_port()?);
    let (api, sim) = (format!("http://127.0.0.1:{api_port}"), format!("http://127.0.0.1:{sim_port}"));
    let env = vec![
        ("HERALD_DATABASE_URL".to_owned(), url.expose().to_owned()),
        ("HERALD_KAFKA_BROKERS".to_owned(), brokers.bootstrap().to_owned()),
        ("HERALD_ARTIFACTS".to_owned(), artifacts.display().to_string()),
        ("HERALD_API_TOKENS".to_owned(), format!("{}:drill", token.expose())),
        ("HERALD_GROUP_PREFIX".to_owned(), "herald".to_owned()),
        // The processes' logs are evidence on disk, at info unless the
        // operator asked otherwise: a RUST_LOG meant for the drill's own
        // output would slow a dozen processes under load.
        ("HERALD_LOG".to_owned(), std::env::var("HERALD_LOG").unwrap_or_else(|_| "info".to_owned())),
    ];
    let roles_exe = match &release {
        Some(release) => release.old.clone(),
        None => std::env::current_exe()?,
    };
    let mut procs = Procs::new(roles_exe, env, work);
    for spec in specs(args.provider, api_port, &sim, &work.join("provider-ledger.sqlite"), &notify_from) {
        // The simulator stands for the provider: no role of Herald's.
        match spec.role {
            "provider-sim" => procs.add_on(spec, std::env::current_exe()?)?,
            _ => procs.add(spec)?,
        }
    }
    wait_http(&format!("{api}/healthz"), Duration::from_secs(60)).await.context("the API did not come up")?;

    let stop_load = CancellationToken::new();
    let load = tokio::spawn(load::Load::new(&api, token.expose())?.run(args.rate, stop_load.clone(), args.drain_timeout));
    let started = Instant::now();
    let upgrade = match &release {
        Some(release) => Some(upgrade::run(release, &db, &mut procs, &mut brokers, chaos).await?),
        None => {
            chaos_loop(args, chaos, &mut procs, &mut brokers).await?;
            None
        }
    };
    stop_load.cancel();
    brokers.settle()?;

    let drain_started = Instant::now();
    let (progress, settled) = drain::wait(&db, &mut procs, args.drain_timeout, || load.is_finished()).await?;
    let load = load.await?;
    let drained = drain_started.elapsed();
    let sources = Sources {
        db: &db,
        kafka: &kafka,
        topics: &topics,
        artifacts: Some(ArtifactStore::from_location(&artifacts.display().to_string())?),
        provider_url: Some(sim.clone()),
        kafka_timeout: Duration::from_secs(120),
        clock_skew: herald_audit::DEFAULT_CLOCK_SKEW,
    };
    let audited = herald_audit::audit(&sources).await;
    let (audit, evidence) = audited?;
    let duplicates = evidence.provider_effects.as_ref().map_or(0, herald_audit::checks::duplicates);
    // Both ask the simulator, so before it stops.
    let provider = provider::provider_report(&sim, args.provider, duplicates).await;
    let intents = provider::intent_report(&db, &sim).await;
    procs.stop_all(Duration::from_secs(10)).await;
    let (provider, intents) = (provider?, intents?);
    let deaths_of = |role: &str| procs.kills.get(role).copied().unwrap_or(0) + procs.exits.get(role).copied().unwrap_or(0);
    let deaths = provider::Deaths { dispatchers: deaths_of("dispatch"), providers: deaths_of("provider-sim") };
    let outcome = report::Outcome {
        chaos_secs: started.elapsed().as_secs_f64() - drained.as_secs_f64(),
        drain_secs: drained.as_secs_f64(),
        settled,
        progress,
        totals: drain::totals(&db).await?,
        load,
        kills: procs.kills.clone(),
        exits: procs.exits.clone(),
        broker_kills: brokers.kills,
        broker_restarts: brokers.restarts,
        kafka_records: evidence.kafka.records.len(),
        notification_duplicates: duplicates,
        targets: provider::targets(&provider, &intents, deaths),
        provider,
        intents,
        database: url.to_string(),
        audit,
        upgrade,
    };
    outcome.print(args.json)?;
    Ok(outcome.passed())
}

/// Kills a random running process every `kill_every` (on average) and a
/// random broker every `broker_kill_every`; restarts what is down.
async fn chaos_loop(args: &DrillArgs, chaos: Duration, procs: &mut Procs, brokers: &mut Brokers) -> anyhow::Result<()> {
    let started = Instant::now();
    let next = |from: Instant| from + args.kill_every.mul_f64(0.5 + fastrand::f64());
    let mut next_kill = next(started);
    while started.elapsed() < chaos {
        let now = Instant::now();
        procs.tick()?;
        brokers.tick()?;
        if now >= next_kill {
            let running = procs.running();
            if !running.is_empty() {
                let victim = running[fastrand::usize(..running.len())];
                tracing::info!(process = procs.name(victim), "drill: SIGKILL");
                procs.kill(victim).await?;
            }
            next_kill = next(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Every role as its own process: API, two workers, two relays, each
/// subscription, the dispatchers, the provider simulator in `mode`.
fn specs(mode: ProviderMode, api_port: u16, sim: &str, ledger: &std::path::Path, notify_from: &str) -> Vec<Spec> {
    let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let worker = ["worker", "--lease-ms", "4000", "--scan-interval-ms", "500", "--dispatch-timeout-ms", "20000", "--attempt-budget", "20"];
    let relay = ["relay", "--lease-ms", "3000"];
    let sim_port = sim.rsplit(':').next().unwrap_or_default();
    let mut specs = vec![
        Spec { role: "api", name: "api".into(), args: args(&["api", "--listen", &format!("127.0.0.1:{api_port}"), "--quota", "1000000"]) },
        Spec { role: "worker", name: "worker-1".into(), args: args(&worker) },
        Spec { role: "worker", name: "worker-2".into(), args: args(&worker) },
        Spec { role: "relay", name: "relay-1".into(), args: args(&relay) },
        Spec { role: "relay", name: "relay-2".into(), args: args(&relay) },
        Spec { role: "consume-search", name: "consume-search".into(), args: args(&["consume", "search"]) },
        Spec { role: "consume-stats", name: "consume-stats".into(), args: args(&["consume", "stats"]) },
        Spec { role: "consume-notify", name: "consume-notify".into(), args: args(&["consume", "notify", "--start-at", notify_from]) },
    ];
    for i in 1..=provider::DISPATCHERS {
        specs.push(Spec { role: "dispatch", name: format!("dispatch-{i}"), args: mode.dispatch_args(sim) });
    }
    let mut sim_args = args(&["provider-sim", "--ledger", &ledger.display().to_string(), "--listen", &format!("127.0.0.1:{sim_port}")]);
    sim_args.extend(mode.sim_args());
    specs.push(Spec { role: "provider-sim", name: "provider-sim".into(), args: sim_args });
    specs
}

/// Creates Herald's topics, waiting for a cluster that is still electing
/// its controllers.
async fn create_topics(kafka: &KafkaConfig, topics: &Topics) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match herald_kafka::ensure_topics(kafka, &topics.all(), herald_kafka::TopicSettings::partitions(4)).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline => tracing::warn!(error = %e, "creating topics; retrying"),
            Err(e) => return Err(e.into()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_http(url: &str, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if reqwest::get(url).await.is_ok_and(|r| r.status().is_success()) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{url} did not answer within {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
