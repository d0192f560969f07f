//! `herald bench peers`: Herald's relay beside Debezium's outbox router
//! (PostgreSQL connector + EventRouter in Kafka Connect standalone) on the
//! same PostgreSQL, the same three-node cluster and the same rows, in one
//! run (issue 21).
//!
//! 1. One scratch database with Herald's schema and Debezium's outbox
//!    table; the replication slot and publication are made first, so the
//!    backlog is in the WAL Debezium reads. `--events` rows go to both
//!    tables in the same transactions.
//! 2. Throughput: Herald's relay drains its outbox, then Connect drains its
//!    table, each to a topic of its own created with `LogAppendTime`; the
//!    rate is the broker's first to last append on the topic, every record
//!    counted and per-key order checked when the run ends.
//! 3. Latency: at each offered rate, events are committed to the system's
//!    own table every 10 ms for `--secs`; commit → record read by a consumer
//!    in this process, p50/p99/max. A marker row first proves the system
//!    has caught up with everything written before.
//! 4. Footprint: peak RSS (VmHWM) of each process over its whole run, and
//!    CPU seconds per 100k events while it drained the backlog.

mod connect;
mod load;
mod process;
mod report;
mod topic;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use herald_kafka::KafkaConfig;
use herald_store::Db;
use tokio::process::Command;

use self::load::{Events, Tables};
use self::process::{Measured, POLL};

use self::report::{Latency, System};
use super::broker::RealCluster;
use crate::scratch::ScratchDb;

#[derive(Debug, Clone, Args)]
pub struct PeersBenchArgs {
    /// Events in the backlog both systems drain.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    events: u64,
    /// Distinct partition keys.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    keys: u64,
    /// Bytes of each event's data.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(64..=100_000))]
    size: u64,
    /// Partitions of each system's topic.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(i32).range(1..=64))]
    partitions: i32,
    /// Offered rates (events/s) of the latency phases.
    #[arg(long, value_delimiter = ',', default_values_t = [1_000u64, 5_000])]
    rates: Vec<u64>,
    /// Seconds of each latency phase.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    secs: u64,
    /// Kafka Connect and Debezium's jars (`scripts/bench-peers` fetches them).
    #[arg(long, env = "HERALD_DEBEZIUM_HOME")]
    debezium_home: Option<PathBuf>,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// A PostgreSQL server with `wal_level=logical`; the run creates and drops a database there.
    #[command(flatten)]
    database: herald_wiring::connection::DatabaseArgs,
    /// A Kafka cluster (default: three private nodes from HERALD_KAFKA_HOME).
    #[command(flatten)]
    kafka: herald_wiring::connection::KafkaArgs,
}

/// How long a drain or a catch-up may take before the run fails.
const LIMIT: Duration = Duration::from_secs(1800);
const SLOT: &str = "herald_bench_peers";

pub async fn run(args: PeersBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(server) = args.database.url.clone().filter(|u| u.expose().starts_with("postgres")) else {
        eprintln!("error: `herald bench peers` needs --database postgres://… (or HERALD_DATABASE_URL) with wal_level=logical");
        return Ok(ExitCode::from(2));
    };
    let Some(home) = args.debezium_home.clone().filter(|h| h.join(".complete").exists()) else {
        eprintln!("error: `herald bench peers` needs --debezium-home (HERALD_DEBEZIUM_HOME): the jars scripts/bench-peers fetches");
        return Ok(ExitCode::from(2));
    };
    let cluster = match RealCluster::given_or_started(&args.kafka, "herald bench peers").await? {
        Ok(cluster) => cluster,
        Err(code) => return Ok(code),
    };
    let scratch = ScratchDb::create(&server, "herald_peers").await?;
    let db = Db::connect_and_migrate(scratch.url.expose()).await?;
    let wal_level: String = sqlx::query_scalar("SHOW wal_level").fetch_one(db.pool()).await?;
    if wal_level != "logical" {
        eprintln!("error: Debezium needs wal_level=logical on {server} (it is {wal_level})");
        db.close().await;
        scratch.drop_db().await;
        return Ok(ExitCode::from(2));
    }
    let result = compare(&args, &home, &cluster, &db, scratch.url.expose()).await;
    // The slot pins WAL and blocks dropping the database: end its sender (if
    // Connect's is still going) and drop it.
    let _ =
        sqlx::query("SELECT COUNT(*) FROM (SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL) t")
            .bind(SLOT)
            .execute(db.pool())
            .await;
    if let Err(e) = sqlx::query("SELECT COUNT(*) FROM (SELECT pg_drop_replication_slot($1)) t").bind(SLOT).execute(db.pool()).await {
        eprintln!("warning: could not drop the replication slot {SLOT}: {e}");
    }
    db.close().await;
    scratch.drop_db().await;
    let (herald, debezium, settings) = result?;
    report::print(args.json, &cluster.describe, args.events, &herald, &debezium, &settings)?;
    Ok(ExitCode::SUCCESS)
}

async fn compare(
    args: &PeersBenchArgs,
    home: &std::path::Path,
    cluster: &RealCluster,
    db: &Db,
    url: &str,
) -> anyhow::Result<(System, System, Vec<String>)> {
    let run = uuid::Uuid::now_v7().simple().to_string()[20..].to_owned();
    let (herald_topic, debezium_topic) = (format!("bench.peers-herald-{run}"), format!("bench.peers-debezium-{run}"));
    topic::create(&cluster.kafka, &herald_topic, args.partitions).await?;
    topic::create(&cluster.kafka, &debezium_topic, args.partitions).await?;
    sqlx::query(load::DEBEZIUM_TABLE).execute(db.pool()).await?;
    // Results the Any driver can map: it has no type for a record or void.
    sqlx::query("SELECT 1 FROM pg_create_logical_replication_slot($1, 'pgoutput')").bind(SLOT).execute(db.pool()).await?;
    sqlx::query(&format!("CREATE PUBLICATION {SLOT} FOR TABLE debezium_outbox")).execute(db.pool()).await?;
    let mut events = Events::new(&herald_topic, args.keys, usize::try_from(args.size)?);
    load::fill(db, &mut events, args.events, 5_000).await?;

    let relay = Command::new(std::env::current_exe()?)
        .args(["relay", "--database", url, "--kafka", &cluster.bootstrap])
        // Slow-statement warnings of a saturated database would bury the table.
        .env("HERALD_LOG", "error")
        .env_remove("HERALD_CONFIG")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let herald_side = Side { name: "herald relay", topic: herald_topic.clone(), tables: Tables::Herald };
    let herald = herald_side.measure(args, &cluster.kafka, db, &mut events, Measured::new(relay)?).await?;

    let dir = tempfile::tempdir()?;
    let source = connect::Source::from_url(url, SLOT)?;
    let (worker, connector) = (connect::worker(&cluster.bootstrap, dir.path(), free_port()?), connect::connector(&source, &debezium_topic));
    let started = connect::start(home, dir.path(), &worker, &connector)?;
    let debezium_side = Side { name: "Kafka Connect", topic: debezium_topic.clone(), tables: Tables::Debezium };
    let debezium = debezium_side.measure(args, &cluster.kafka, db, &mut events, Measured::new(started)?).await;
    let debezium = debezium.with_context(|| format!("Debezium's log: {}", dir.path().join("connect.log").display()))?;
    let mut settings = vec![format!("Connect JVM: {}", connect::HEAP)];
    settings.extend(connect::describe(&worker).into_iter().chain(connect::describe(&connector)));
    // Keep the Connect directory when the run is kept for a look.
    if std::env::var_os("HERALD_KEEP_TMP").is_some() {
        eprintln!("Connect's directory: {}", dir.keep().display());
    }
    Ok((herald, debezium, settings))
}

/// One system under test: its topic and the table its events go to.
struct Side {
    name: &'static str,
    topic: String,
    tables: Tables,
}

impl Side {
    /// Drains the backlog, runs the latency phases, stops the process,
    /// then reads the topic back in full.
    async fn measure(
        &self,
        args: &PeersBenchArgs,
        kafka: &KafkaConfig,
        db: &Db,
        events: &mut Events,
        mut process: Measured,
    ) -> anyhow::Result<System> {
        let offsets = topic::EndOffsets::new(kafka, &self.topic, args.partitions)?;
        let (mut first_cpu, mut first_pg, started) = (None, None, Instant::now());
        loop {
            process.alive(self.name)?;
            anyhow::ensure!(started.elapsed() < LIMIT, "{} did not drain {} events in {LIMIT:?}", self.name, args.events);
            let on_topic = offsets.total()?;
            if on_topic > 0 && first_cpu.is_none() {
                (first_cpu, first_pg) = (Some(process.cpu_secs()?), process.postgres_cpu_secs()?);
            }
            if on_topic >= args.events {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        let per_100k = args.events as f64 / 100_000.0;
        let drain_cpu = process.cpu_secs()? - first_cpu.unwrap_or_default();
        let pg_cpu_per_100k = process.postgres_cpu_secs()?.zip(first_pg).map(|(now, first)| (now - first) / per_100k);
        let mut latencies = Vec::new();
        for &rate in &args.rates {
            latencies.push(self.latency(args, kafka, &offsets, db, events, &mut process, rate).await?);
        }
        let peak_rss_mb = process.peak_rss_mb()?;
        process.stop().await?;
        let (kafka, topic, partitions, backlog) = (kafka.clone(), self.topic.clone(), args.partitions, args.events);
        let expected = offsets.total()?;
        let drained = tokio::task::spawn_blocking(move || topic::read_all(&kafka, &topic, partitions, expected, backlog)).await??;
        anyhow::ensure!(drained.records == expected, "{}: read {} records of the {expected} on {}", self.name, drained.records, self.topic);
        anyhow::ensure!(
            drained.backlog_records == backlog,
            "{}: {} of the {backlog} backlog events on {}",
            self.name,
            drained.backlog_records,
            self.topic
        );
        Ok(System { drained, cpu_per_100k: drain_cpu / per_100k, pg_cpu_per_100k, peak_rss_mb, latencies })
    }

    #[allow(clippy::too_many_arguments)]
    async fn latency(
        &self,
        args: &PeersBenchArgs,
        kafka: &KafkaConfig,
        offsets: &topic::EndOffsets,
        db: &Db,
        events: &mut Events,
        process: &mut Measured,
        rate: u64,
    ) -> anyhow::Result<Latency> {
        self.caught_up(offsets, db, events, process).await?;
        let watcher = topic::Watcher::start(kafka, &self.topic, args.partitions)?;
        let before = offsets.total()?;
        let committed = load::paced(db, events, self.tables, rate, args.secs).await?;
        self.until_on_topic(offsets, process, before + committed.len() as u64).await?;
        let seen = watcher.finish()?;
        Ok(Latency::of(rate, &committed, &seen))
    }

    /// Writes one marker event and waits for it on the topic: the system has
    /// read everything written before it.
    async fn caught_up(&self, offsets: &topic::EndOffsets, db: &Db, events: &mut Events, process: &mut Measured) -> anyhow::Result<()> {
        let before = offsets.total()?;
        let marker = events.next_rows(1);
        load::write(db, events, &marker, self.tables).await?;
        self.until_on_topic(offsets, process, before + 1).await
    }

    async fn until_on_topic(&self, offsets: &topic::EndOffsets, process: &mut Measured, want: u64) -> anyhow::Result<()> {
        let started = Instant::now();
        while offsets.total()? < want {
            process.alive(self.name)?;
            anyhow::ensure!(started.elapsed() < LIMIT, "{}: {want} records not on {} in {LIMIT:?}", self.name, self.topic);
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Latency samples: commit → read, by event number.
fn latencies_ms(committed: &HashMap<u64, Instant>, seen: &[(u64, Instant)]) -> Vec<f64> {
    let mut ms: Vec<f64> =
        seen.iter().filter_map(|(n, at)| committed.get(n).map(|c| at.saturating_duration_since(*c).as_secs_f64() * 1000.0)).collect();
    ms.sort_by(f64::total_cmp);
    ms
}
