//! `herald drill`: the pipeline as separate `herald` processes against
//! PostgreSQL and a real broker, under load, with processes SIGKILLed and
//! restarted throughout and the broker stopped once; then a drain and the
//! audit. Exit 0 only when the drain settled, every export was answered,
//! the audit found nothing, intake kept its promises and the provider saw no
//! duplicate; 1 otherwise; 2 for bad input. The working directory (process
//! logs, broker storage, artifacts) is kept when the drill fails.

mod broker;
mod drain;
mod load;
mod procs;
mod report;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use herald_audit::Sources;
use herald_export::artifact::ArtifactStore;
use herald_kafka::Topics;
use herald_store::Db;
use tokio_util::sync::CancellationToken;

use broker::Broker;
use procs::{Procs, Spec};

#[derive(Debug, Clone, Args)]
pub struct DrillArgs {
    /// Minutes of chaos before the drain (fractions allowed).
    #[arg(long, default_value_t = 3.0)]
    pub minutes: f64,
    /// Seconds of chaos instead of minutes (for CI).
    #[arg(long, conflicts_with = "minutes")]
    pub seconds: Option<f64>,
    /// A PostgreSQL server; the drill creates a fresh database on it.
    #[arg(long, env = "HERALD_DATABASE_URL")]
    pub database: Option<String>,
    /// Shell command that runs the broker in the foreground, in a directory
    /// the drill gives it, listening on `{port}`.
    #[arg(long, env = "HERALD_DRILL_BROKER_COMMAND")]
    pub broker_command: Option<String>,
    /// Or the tansu binary, started as `scripts/test` starts it.
    #[arg(long, env = "HERALD_TANSU_BIN", conflicts_with = "broker_command")]
    pub tansu: Option<String>,
    /// Export requests per second.
    #[arg(long, default_value_t = 8.0)]
    pub rate: f64,
    /// Mean time between two kills.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub kill_every: Duration,
    /// How long the broker stays down when it is stopped.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub broker_down: Duration,
    /// Give up draining after this long.
    #[arg(long, default_value = "4m", value_parser = humantime::parse_duration)]
    pub drain_timeout: Duration,
    /// Keep the working directory (logs, broker storage, artifacts).
    #[arg(long)]
    pub keep: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
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
    let Some(server) = args.database.as_deref().filter(|u| u.starts_with("postgres")) else {
        return usage("--database (HERALD_DATABASE_URL) must name a PostgreSQL server; the drill creates its own database there");
    };
    let command = match (&args.broker_command, &args.tansu) {
        (Some(command), _) => command.clone(),
        (None, Some(bin)) => broker::tansu_command(bin),
        (None, None) => return usage("--broker-command or --tansu (HERALD_TANSU_BIN) is required: the drill stops and restarts the broker"),
    };
    let work = tempfile::Builder::new().prefix("herald-drill-").tempdir()?;
    let outcome = drill(&args, Duration::from_secs_f64(seconds), server, &command, work.path()).await;
    if args.keep || !matches!(outcome, Ok(true)) {
        let kept = work.keep();
        eprintln!("drill: working directory kept at {} (process logs, broker storage)", kept.display());
    }
    Ok(if outcome? { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The drill itself; `Ok(true)` when it passed.
async fn drill(args: &DrillArgs, chaos: Duration, server: &str, command: &str, work: &std::path::Path) -> anyhow::Result<bool> {
    let url = fresh_database(server).await?;
    let db = Db::connect_and_migrate(&url).await?;
    let mut broker = Broker::new(command, &work.join("broker"), free_port()?)?;
    broker.start().await?;
    let topics = Topics::default();
    create_topics(&broker.address(), &topics).await?;
    let artifacts = work.join("artifacts");
    let (api_port, sim_port) = (free_port()?, free_port()?);
    let (api, sim) = (format!("http://127.0.0.1:{api_port}"), format!("http://127.0.0.1:{sim_port}"));
    let env = vec![
        ("HERALD_DATABASE_URL".to_owned(), url.clone()),
        ("HERALD_KAFKA_BROKERS".to_owned(), broker.address()),
        ("HERALD_ARTIFACTS".to_owned(), artifacts.display().to_string()),
        ("HERALD_API_TOKENS".to_owned(), "drill-token:drill".to_owned()),
        ("HERALD_GROUP_PREFIX".to_owned(), "herald".to_owned()),
    ];
    let mut procs = Procs::new(std::env::current_exe()?, env, work);
    for spec in specs(api_port, &sim, &work.join("provider-ledger.sqlite")) {
        procs.add(spec)?;
    }
    wait_http(&format!("{api}/healthz"), Duration::from_secs(60)).await.context("the API did not come up")?;

    let stop_load = CancellationToken::new();
    let load = tokio::spawn(load::Load::new(&api, "drill-token")?.run(args.rate, stop_load.clone(), args.drain_timeout));
    let started = Instant::now();
    chaos_loop(args, chaos, &mut procs, &mut broker).await?;
    stop_load.cancel();

    let drain_started = Instant::now();
    let (progress, settled) = drain::wait(&db, &mut procs, args.drain_timeout, || load.is_finished()).await?;
    let load = load.await?;
    let drained = drain_started.elapsed();
    let sources = Sources {
        db: &db,
        brokers: &broker.address(),
        topics: &topics,
        artifacts: Some(ArtifactStore::from_location(&artifacts.display().to_string())?),
        provider_url: Some(sim),
        kafka_timeout: Duration::from_secs(120),
    };
    let audited = herald_audit::audit(&sources).await;
    procs.stop_all(Duration::from_secs(10)).await;
    broker.terminate().await?;
    let (audit, evidence) = audited?;
    let outcome = report::Outcome {
        chaos_secs: started.elapsed().as_secs_f64() - drained.as_secs_f64(),
        drain_secs: drained.as_secs_f64(),
        settled,
        progress,
        totals: drain::totals(&db).await?,
        load,
        kills: procs.kills.clone(),
        exits: procs.exits.clone(),
        rejoins: procs.rejoins.clone(),
        broker_stops: broker.stops,
        relays_restarted_with_broker: broker.relays_restarted,
        kafka_records: evidence.kafka.records.len(),
        notification_duplicates: evidence.provider_effects.as_ref().map_or(0, herald_audit::checks::duplicates),
        database: url,
        audit,
    };
    outcome.print(args.json)?;
    Ok(outcome.passed())
}

/// Kills a random running process every `kill_every` (on average) and stops
/// the broker once, halfway; restarts what is down.
async fn chaos_loop(args: &DrillArgs, chaos: Duration, procs: &mut Procs, broker: &mut Broker) -> anyhow::Result<()> {
    let started = Instant::now();
    let next = |from: Instant| from + args.kill_every.mul_f64(0.5 + fastrand::f64());
    let mut next_kill = next(started);
    let mut broker_back_at: Option<Instant> = None;
    while started.elapsed() < chaos {
        let now = Instant::now();
        procs.tick()?;
        if now >= next_kill {
            let running = procs.running();
            if !running.is_empty() {
                let victim = running[fastrand::usize(..running.len())];
                tracing::info!(process = procs.name(victim), "drill: SIGKILL");
                procs.kill(victim).await?;
            }
            next_kill = next(now);
        }
        if broker.stops == 0 && broker_back_at.is_none() && started.elapsed() >= chaos / 2 {
            tracing::info!("drill: stopping the broker");
            broker.stop().await?;
            broker_back_at = Some(Instant::now() + args.broker_down);
        }
        if broker_back_at.is_some_and(|at| Instant::now() >= at) {
            bring_broker_back(procs, broker).await?;
            broker_back_at = None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if broker_back_at.is_some() {
        bring_broker_back(procs, broker).await?;
    }
    Ok(())
}

/// Starts the broker again. The relays are SIGKILLed first and come back
/// after it, with new producer ids: tansu 0.6.0 on SQLite panics in its
/// idempotent-produce check (`lite.rs:503`, "more or less than one row")
/// when a producer id from before its restart sends again, and the panic
/// takes its storage service down for every client. Apache Kafka keeps
/// producer state across restarts; the drill counts these restarts apart
/// from its random kills (`relays_restarted_with_broker`).
async fn bring_broker_back(procs: &mut Procs, broker: &mut Broker) -> anyhow::Result<()> {
    broker.relays_restarted += procs.kill_role("relay").await?;
    tracing::info!("drill: starting the broker again");
    broker.start().await
}

/// Every role as its own process: API, two workers, two relays, each
/// subscription, the dispatcher, the keyed provider simulator.
fn specs(api_port: u16, sim: &str, ledger: &std::path::Path) -> Vec<Spec> {
    let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let worker = ["worker", "--lease-ms", "4000", "--scan-interval-ms", "500", "--dispatch-timeout-ms", "20000", "--attempt-budget", "20"];
    let relay = ["relay", "--lease-ms", "3000"];
    let sim_port = sim.rsplit(':').next().unwrap_or_default();
    vec![
        Spec { role: "api", name: "api".into(), args: args(&["api", "--listen", &format!("127.0.0.1:{api_port}"), "--quota", "1000000"]), consumer: false },
        Spec { role: "worker", name: "worker-1".into(), args: args(&worker), consumer: true },
        Spec { role: "worker", name: "worker-2".into(), args: args(&worker), consumer: true },
        Spec { role: "relay", name: "relay-1".into(), args: args(&relay), consumer: false },
        Spec { role: "relay", name: "relay-2".into(), args: args(&relay), consumer: false },
        Spec { role: "consume-search", name: "consume-search".into(), args: args(&["consume", "search"]), consumer: true },
        Spec { role: "consume-stats", name: "consume-stats".into(), args: args(&["consume", "stats"]), consumer: true },
        Spec { role: "consume-notify", name: "consume-notify".into(), args: args(&["consume", "notify"]), consumer: true },
        Spec {
            role: "dispatch",
            name: "dispatch".into(),
            args: args(&["dispatch", "--notify-url", sim, "--notify-idempotent", "true", "--notify-timeout", "2s", "--notify-lease", "5s"]),
            consumer: false,
        },
        Spec {
            role: "provider-sim",
            name: "provider-sim".into(),
            args: args(&["provider-sim", "--mode", "keyed", "--ledger", &ledger.display().to_string(), "--listen", &format!("127.0.0.1:{sim_port}")]),
            consumer: false,
        },
    ]
}

/// A new, empty database `herald_drill_<uuid>` on the server `server` names.
async fn fresh_database(server: &str) -> anyhow::Result<String> {
    use sqlx::{Connection, Executor};
    let name = format!("herald_drill_{}", uuid::Uuid::new_v4().simple());
    let mut admin = sqlx::PgConnection::connect(server).await.with_context(|| format!("connecting to {server}"))?;
    admin.execute(format!("CREATE DATABASE \"{name}\"").as_str()).await?;
    admin.close().await?;
    let mut url = url::Url::parse(server)?;
    url.set_path(&name);
    Ok(url.into())
}

async fn create_topics(brokers: &str, topics: &Topics) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match herald_kafka::ensure_topics(brokers, &topics.all(), 4).await {
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
