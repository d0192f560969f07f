//! `herald bench prune`: what a prune of a million rows costs the roles
//! that keep running beside it. On a scratch PostgreSQL database and the
//! in-process mock cluster, in one run:
//!
//! 1. the relay drains a backlog alone, then an equal backlog while
//!    `herald prune` removes `--rows` old delivered outbox rows (and as many
//!    old inbox rows) with its default pace;
//! 2. the search subscription applies a batch of records alone, then an
//!    equal batch while a second prune of the same size runs.
//!
//! Each "during" rate is divided by its quiet rate; the target is
//! 0.8. Old rows are written by `generate_series` (the figures are about
//! removing them), then vacuumed and analysed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use herald_consumer::{Subscription, SubscriptionOptions};
use herald_kafka::{EmbeddedKafka, KafkaConfig, Topics};
use herald_projections::search;
use herald_store::Db;
use herald_wiring::prune::{self, PruneOptions, Pruned};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::{consume, relay, workload};
use crate::scratch::on_scratch_postgres;

#[derive(Debug, Clone, Args)]
pub struct PruneBenchArgs {
    /// Old delivered outbox rows (and as many old inbox rows) each prune removes.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=50_000_000))]
    pub rows: u64,
    /// Events the relay drains and the subscription applies, per measurement.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1_000..=10_000_000))]
    pub events: u64,
    /// Partitions of the benchmark topics.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=64))]
    pub partitions: i32,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A PostgreSQL server; a scratch database is created on it and dropped.
    #[command(flatten)]
    pub database: herald_wiring::connection::DatabaseArgs,
}

/// Events the relay drains before it is measured.
const WARM_UP: u64 = 1_000;
/// The share of its quiet rate a role must keep during a prune.
const TARGET: f64 = 0.8;
/// Ages of the rows the first and the second prune remove. Both are written
/// first, so they sit below the backlogs in the outbox as old rows do.
const OLD_DAYS: [u64; 2] = [60, 50];

/// One role's rates, and the prune beside it.
struct Pair {
    quiet_eps: f64,
    during_eps: f64,
    prune_secs: f64,
    removed: u64,
}

impl Pair {
    fn ratio(&self) -> f64 {
        self.during_eps / self.quiet_eps
    }
}

pub async fn run(args: PruneBenchArgs) -> anyhow::Result<ExitCode> {
    let emit_args = args.clone();
    on_scratch_postgres(args.database.url.clone().as_ref(), |url| measure(args, url), |f| emit(&emit_args, &f)).await
}

async fn measure(args: PruneBenchArgs, url: String) -> anyhow::Result<[Pair; 2]> {
    let db = Db::connect_and_migrate(&url).await?;
    let run = uuid::Uuid::now_v7().simple().to_string()[24..].to_owned();
    let topics = Topics::with_prefix(&format!("bench-prune-{run}"));
    let embedded = EmbeddedKafka::start(1, &[relay::TOPIC, topics.events.as_str()], args.partitions)?;
    let kafka = KafkaConfig::new(embedded.bootstrap_servers());

    for days in OLD_DAYS {
        fill_old(&db, args.rows, days).await?;
    }
    // A first pass moves the relay's cursors past the old rows, as a relay
    // that has been running has them: otherwise its first read of each
    // slice, in the quiet run only, steps over two million delivered rows.
    relay::insert(&db, &relay::events(relay::TOPIC, WARM_UP)?).await?;
    relay::drain(&db, &kafka, WARM_UP).await?;
    let n = args.events;
    relay::insert(&db, &relay::events(relay::TOPIC, n)?).await?;
    let quiet = relay::drain(&db, &kafka, n).await?.eps();
    relay::insert(&db, &relay::events(relay::TOPIC, n)?).await?;
    let (during, pruned, prune_secs) = beside_a_prune(&db, OLD_DAYS[0] - 5, relay::drain(&db, &kafka, n)).await?;
    let relay = Pair { quiet_eps: quiet, during_eps: during?.eps(), prune_secs, removed: removed(&pruned) };

    let producer = workload::producer(&kafka)?;
    workload::publish(&producer, &workload::completions(&topics.events, &format!("{run}a"), n as usize)?).await?;
    let quiet = apply(&db, &kafka, &topics.events, n).await?;
    workload::publish(&producer, &workload::completions(&topics.events, &format!("{run}b"), n as usize)?).await?;
    let (during, pruned, prune_secs) = beside_a_prune(&db, OLD_DAYS[1] - 5, apply(&db, &kafka, &topics.events, n)).await?;
    let consume = Pair { quiet_eps: quiet, during_eps: during?, prune_secs, removed: removed(&pruned) };
    for pair in [&relay, &consume] {
        anyhow::ensure!(pair.removed == 2 * args.rows, "a prune removed {} rows, the fill wrote {}", pair.removed, 2 * args.rows);
    }
    db.close().await;
    Ok([relay, consume])
}

/// Runs `work` while a prune with the default pace runs; the prune is
/// waited for after, so its own time is reported too.
async fn beside_a_prune<T>(db: &Db, retention_days: u64, work: impl Future<Output = T>) -> anyhow::Result<(T, Pruned, f64)> {
    let options = PruneOptions { retention: Duration::from_secs(retention_days * 86_400), ..PruneOptions::default() };
    let pruning = {
        let db = db.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let pruned = prune::prune(&db, &options, &CancellationToken::new()).await;
            (pruned, started.elapsed().as_secs_f64())
        })
    };
    let result = work.await;
    let (pruned, secs) = pruning.await?;
    Ok((result, pruned?, secs))
}

fn removed(pruned: &Pruned) -> u64 {
    pruned.removed.values().sum()
}

/// A fresh search subscription group until it applied `n` more records.
async fn apply(db: &Db, kafka: &KafkaConfig, topic: &str, n: u64) -> anyhow::Result<f64> {
    let sub = Subscription::new(search::SUBSCRIPTION, &format!("bench-{}", uuid::Uuid::new_v4()), kafka, &[topic]);
    consume::timed_search_subscription(db, &sub, SubscriptionOptions::default(), n as usize, Duration::from_secs(600)).await
}

/// `rows` delivered outbox rows and `rows` inbox rows, `days` old.
async fn fill_old(db: &Db, rows: u64, days: u64) -> anyhow::Result<()> {
    let old = format!("(CAST(EXTRACT(EPOCH FROM now()) * 1000 AS BIGINT) - CAST({days} AS BIGINT) * 86400000)");
    let rows = i64::try_from(rows)?;
    sqlx::query(&format!(
        "INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, data, topic, partition_key, \
         slice, status, attempts, created_at_ms, delivered_at_ms) \
         SELECT 'old-' || gen_random_uuid(), '/herald/bench-old', 'herald.bench.event', 'k' || (i % 1000), {old}, 'bench.avsc', \
         decode(repeat('78', 200), 'hex'), 'bench.old', 'k' || (i % 1000), (i % 64)::int, 'delivered', 1, {old}, {old} \
         FROM generate_series(1, $1) AS i"
    ))
    .bind(rows)
    .execute(db.pool())
    .await?;
    sqlx::query(&format!(
        "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
         SELECT 'stats', '/herald/bench-old', 'old-' || gen_random_uuid(), 'herald.bench.event', 'bench.old', 0, i, {old} \
         FROM generate_series(1, $1) AS i"
    ))
    .bind(rows)
    .execute(db.pool())
    .await?;
    sqlx::query("VACUUM ANALYZE outbox").execute(db.pool()).await?;
    sqlx::query("VACUUM ANALYZE inbox").execute(db.pool()).await?;
    Ok(())
}

fn emit(args: &PruneBenchArgs, [relay, consume]: &[Pair; 2]) -> anyhow::Result<()> {
    let round = |x: f64| (x * 100.0).round() / 100.0;
    if args.json {
        let out = json!({
            "rows_per_prune": 2 * args.rows, "events": args.events,
            "relay_quiet_eps": relay.quiet_eps.round(), "relay_during_prune_eps": relay.during_eps.round(),
            "relay_during_vs_quiet": round(relay.ratio()), "relay_prune_secs": round(relay.prune_secs),
            "consume_quiet_eps": consume.quiet_eps.round(), "consume_during_prune_eps": consume.during_eps.round(),
            "consume_during_vs_quiet": round(consume.ratio()), "consume_prune_secs": round(consume.prune_secs),
            "target": TARGET,
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!(
        "each prune removes {} old rows ({} outbox + {} inbox); broker: in-process mock cluster\n",
        2 * args.rows,
        args.rows,
        args.rows
    );
    println!("| role | quiet events/s | events/s during a prune | during ÷ quiet | target | prune took (s) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, pair) in [("relay (outbox → Kafka)", relay), ("search subscription (Kafka → inbox + documents)", consume)] {
        let mark = if pair.ratio() >= TARGET { "met" } else { "NOT met" };
        println!(
            "| {name} | {:.0} | {:.0} | {:.2} | ≥ {TARGET} ({mark}) | {:.1} |",
            pair.quiet_eps,
            pair.during_eps,
            pair.ratio(),
            pair.prune_secs
        );
    }
    Ok(())
}
