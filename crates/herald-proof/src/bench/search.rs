//! `herald bench search`: `GET /v1/search` over a million documents, and
//! what a search flood costs the relay, in one run on PostgreSQL.
//!
//! 1. Loads N documents (default 1,000,000) into the active search
//!    generation of a scratch database, through the migrations' indexes.
//! 2. Serves Herald's API as `herald serve` does (its own PostgreSQL pool
//!    with a statement timeout, the default concurrency, per-caller rate
//!    and search limits) on loopback, and times searches from one client, one after
//!    another, over real HTTP: p50/p99/max per kind of text.
//! 3. Drains outbox backlogs with Herald's relay: quiet, while C clients
//!    (default 20) of C callers search back to back, while C clients of one
//!    caller do, and quiet again. The relay's rate under each flood is
//!    compared with the mean of the two quiet runs of the same run.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use herald_api::limits::{self, Limits, SearchSlots};
use herald_api::{AppState, Tokens};
use herald_export::artifact::ArtifactStore;
use herald_export::jobs::IntakeConfig;
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_store::Db;
use herald_wiring::pipeline::{API_CONNECTIONS, API_STATEMENT_TIMEOUT};
use sqlx::Row;
use tokio_util::sync::CancellationToken;

use super::relay::{self, Run};
use super::search_load::{self, Client, Kind, Outcome, Tally, percentile_ms};
use super::search_report::{self, Figures, FloodRun};
use crate::scratch::on_scratch_postgres;

#[derive(Debug, Clone, Args)]
pub struct SearchBenchArgs {
    /// Search documents in the active generation.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1000..=20_000_000))]
    pub documents: u64,
    /// Callers owning them (round robin); each client searches as one.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub callers: u64,
    /// Timed searches of the one sequential client.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pub searches: u64,
    /// Clients searching back to back during a flooded relay run.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub clients: u64,
    /// Outbox rows each relay run drains (long enough that a caller's
    /// burst allowance is a small part of a run).
    #[arg(long, default_value_t = 500_000, value_parser = clap::value_parser!(u64).range(1000..=10_000_000))]
    pub relay_events: u64,
    /// Partitions of the relay's topic.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=64))]
    pub partitions: i32,
    /// Searches the API runs at once (as `herald serve --api-search-concurrency`).
    #[arg(long, default_value_t = limits::DEFAULT_SEARCH_CONCURRENCY, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub search_concurrency: u32,
    /// One JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// A PostgreSQL server; a scratch database is created on it and dropped.
    #[command(flatten)]
    pub database: herald_wiring::connection::DatabaseArgs,
    /// A Kafka cluster for the relay instead of the in-process mock.
    #[command(flatten)]
    pub kafka: herald_wiring::connection::KafkaArgs,
}

/// Searches sent before timing: connections opened, caches warm.
const WARM_UP: u64 = 100;

pub async fn run(args: SearchBenchArgs) -> anyhow::Result<ExitCode> {
    let emit_args = args.clone();
    on_scratch_postgres(args.database.url.clone().as_ref(), |url| measure(args, url), |figures| search_report::emit(&emit_args, &figures))
        .await
}

async fn measure(args: SearchBenchArgs, url: String) -> anyhow::Result<Figures> {
    let db = Db::connect_and_migrate(&url).await?;
    let generation: i64 = sqlx::query("SELECT generation FROM active_generations WHERE projection = 'search'")
        .fetch_one(db.pool())
        .await?
        .try_get("generation")?;
    let started = Instant::now();
    search_load::load_documents(&db, generation, args.documents, args.callers).await?;
    sqlx::query("ANALYZE search_documents").execute(db.pool()).await?;
    let load_secs = started.elapsed().as_secs_f64();

    let shutdown = CancellationToken::new();
    let base = serve_api(&db, &args, shutdown.clone()).await?;
    let http = reqwest::Client::builder().pool_max_idle_per_host(args.clients as usize * 2).build()?;
    let client = |c: u64| Client { http: http.clone(), base: base.clone(), token: search_load::token(c % args.callers) };

    let sequential = sequential_searches(&client, &args).await;
    let (_mock, kafka, topic) = kafka(&args).await?;
    let floods: [Vec<Client>; 4] =
        [vec![], (0..args.clients).map(client).collect(), (0..args.clients).map(|_| client(0)).collect(), vec![]];
    let mut runs = Vec::with_capacity(floods.len());
    for clients in floods {
        match relay_run(&db, &kafka, &topic, args.relay_events, clients).await {
            Ok(run) => runs.push(run),
            Err(e) => {
                shutdown.cancel();
                return Err(e);
            }
        }
    }
    shutdown.cancel();
    db.close().await;
    Ok(Figures { load_secs, sequential: sequential?, runs })
}

/// Herald's API as `herald serve` runs it on PostgreSQL, one token per
/// caller; its base URL.
async fn serve_api(db: &Db, args: &SearchBenchArgs, shutdown: CancellationToken) -> anyhow::Result<String> {
    let spec: Vec<String> = (0..args.callers).map(|c| format!("{}:{}", search_load::token(c), search_load::caller(c))).collect();
    let tokens = Tokens::parse(&spec.join(",")).map_err(anyhow::Error::msg)?;
    let artifacts = std::env::temp_dir().join(format!("herald-bench-search-{}", std::process::id()));
    let state = AppState {
        db: db.api_pool(API_CONNECTIONS, API_STATEMENT_TIMEOUT).await?,
        intake: IntakeConfig::new(Topics::default()),
        artifacts: ArtifactStore::local(&artifacts)?,
        tokens: tokens.clone(),
        searches: SearchSlots::new(args.search_concurrency as usize),
    };
    let app = limits::apply(herald_api::router(state), Limits::default(), tokens);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = herald_api::routes::local_url(listener.local_addr()?);
    tokio::spawn(herald_api::serve_router(listener, app, shutdown));
    Ok(base)
}

/// One client, one search at a time, kinds and callers in turn; every
/// answer checked. Latencies per kind, sorted.
async fn sequential_searches(client: &impl Fn(u64) -> Client, args: &SearchBenchArgs) -> anyhow::Result<BTreeMap<Kind, Vec<Duration>>> {
    let mut latencies: BTreeMap<Kind, Vec<Duration>> = BTreeMap::new();
    let mut hits: BTreeMap<Kind, usize> = BTreeMap::new();
    for n in 0..WARM_UP + args.searches {
        let kind = Kind::ALL[(n % Kind::ALL.len() as u64) as usize];
        let started = Instant::now();
        // Client `n` searches as caller `n % callers`, who owns the
        // documents `caller + k × callers`.
        let round = n / Kind::ALL.len() as u64;
        let document = n % args.callers + args.callers * (round % (args.documents / args.callers).max(1));
        let Outcome::Answered(found) = client(n).search(&kind.text(round, document), true).await? else {
            anyhow::bail!("a single sequential client was refused (429 or 503)");
        };
        if n >= WARM_UP {
            latencies.entry(kind).or_default().push(started.elapsed());
            *hits.entry(kind).or_default() += found;
        }
    }
    for (kind, expect_hits) in
        [(Kind::Rare, true), (Kind::Common, true), (Kind::ShortCommon, true), (Kind::Missing, false), (Kind::ShortMissing, false)]
    {
        let found = hits.get(&kind).copied().unwrap_or(0);
        anyhow::ensure!((found > 0) == expect_hits, "{}: {found} hits in all", kind.label());
    }
    latencies.values_mut().for_each(|l| l.sort_unstable());
    Ok(latencies)
}

async fn kafka(args: &SearchBenchArgs) -> anyhow::Result<(Option<EmbeddedKafka>, KafkaConfig, String)> {
    Ok(match args.kafka.connect().await? {
        Some(kafka) => {
            let topic = format!("{}-{}", relay::TOPIC, &uuid::Uuid::new_v4().simple().to_string()[..8]);
            herald_kafka::ensure_topics(&kafka, &[&topic], herald_kafka::TopicSettings::partitions(args.partitions)).await?;
            (None, kafka, topic)
        }
        None => {
            let embedded = EmbeddedKafka::start(1, &[relay::TOPIC], args.partitions)?;
            let kafka = KafkaConfig::new(embedded.bootstrap_servers());
            (Some(embedded), kafka, relay::TOPIC.to_owned())
        }
    })
}

/// Appends `events` outbox rows, starts `clients` flooding search, drains
/// the rows with Herald's relay, stops the flood.
async fn relay_run(db: &Db, kafka: &KafkaConfig, topic: &str, events: u64, clients: Vec<Client>) -> anyhow::Result<FloodRun> {
    relay::insert(db, &relay::events(topic, events)?).await?;
    let stop = CancellationToken::new();
    let flood: Vec<_> =
        clients.into_iter().enumerate().map(|(i, client)| tokio::spawn(search_load::flood(client, i as u64 * 7, stop.clone()))).collect();
    let started = Instant::now();
    let relay = relay::drain(db, kafka, events).await;
    let secs = started.elapsed().as_secs_f64();
    stop.cancel();
    let mut tally = Tally::default();
    for task in flood {
        let one = task.await??;
        tally.answered += one.answered;
        tally.limited += one.limited;
        tally.shed += one.shed;
        tally.latencies.extend(one.latencies);
    }
    tally.latencies.sort_unstable();
    let relay: Run = relay?;
    Ok(FloodRun {
        relay_eps: relay.eps(),
        searches_per_sec: tally.answered as f64 / secs,
        limited_per_sec: tally.limited as f64 / secs,
        shed_per_sec: tally.shed as f64 / secs,
        p50_ms: percentile_ms(&tally.latencies, 50.0),
        p99_ms: percentile_ms(&tally.latencies, 99.0),
    })
}
