//! `herald bench prune`: what a prune of a million rows costs the roles
//! that keep running beside it. On a scratch PostgreSQL database and the
//! in-process mock cluster, in one run:
//!
//! 1. the relay drains `--events` three times alone, then three times while
//!    `herald prune` removes `--rows` old delivered outbox rows (and as many
//!    old inbox rows) with its default pace;
//! 2. the search subscription applies `--events` records three times alone,
//!    then three times while a second prune of the same size runs. Every
//!    round reads a topic of its own with a fresh group, so each applies
//!    exactly `--events` new records and nothing else.
//!
//! The median "during" round is divided by the median quiet round (one
//! outlier round either way, common on a 2-core machine, moves neither);
//! the target is 0.8. Best against best is shown beside it. Every
//! "during" round must end before its prune does, or the bench fails: a
//! round after the prune would measure nothing.
//! Old rows are written by `generate_series` (the figures are about removing
//! them), then vacuumed and analysed.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use herald_consumer::{Subscription, SubscriptionOptions};
use herald_kafka::{EmbeddedKafka, KafkaConfig};
use herald_projections::search;
use herald_store::Db;
use herald_wiring::prune::{self, PruneOptions, Pruned};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{consume, relay, workload};
use crate::scratch::on_scratch_postgres;

#[derive(Debug, Clone, Args)]
pub struct PruneBenchArgs {
    /// Old delivered outbox rows (and as many old inbox rows) each prune removes.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=50_000_000))]
    pub rows: u64,
    /// Events the relay drains and the subscription applies, per round.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1_000..=10_000_000))]
    pub events: u64,
    /// Partitions of the benchmark topics.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=64))]
    pub partitions: i32,
    /// Rows per prune batch (`herald prune --prune-batch`).
    #[arg(long, default_value_t = PruneOptions::default().batch, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub prune_batch: i64,
    /// Hold each prune at its last kind (intake keys, which the benchmark
    /// does not fill) until the rounds beside it end, instead of failing
    /// when it ends first. For runs too small for their prune to outlast
    /// the rounds (the smoke test): their "during" rounds may then run
    /// partly beside a prune that only waits (`*_prune_reached_hold`).
    #[arg(long)]
    pub hold_prune: bool,
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
/// Measured rounds alone and beside a prune, per role.
const ROUNDS: usize = 3;
/// Ages of the rows the first and the second prune remove. Both are written
/// first, so they sit below the backlogs in the outbox as old rows do.
const OLD_DAYS: [u64; 2] = [60, 50];

/// One role's rounds, and the prune beside the "during" ones.
struct Pair {
    quiet_eps: Vec<f64>,
    during_eps: Vec<f64>,
    prune_secs: f64,
    removed: u64,
    /// With `--hold-prune`: the prune had done all else and waited at the
    /// hold when the last round ended.
    reached_hold: Option<bool>,
}

impl Pair {
    fn best(rounds: &[f64]) -> f64 {
        rounds.iter().copied().fold(0.0, f64::max)
    }

    fn median(rounds: &[f64]) -> f64 {
        let mut sorted = rounds.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
    }

    /// Shown beside the target's figure.
    fn best_ratio(&self) -> f64 {
        Pair::best(&self.during_eps) / Pair::best(&self.quiet_eps)
    }

    /// The figure the target is checked on: median against median.
    fn ratio(&self) -> f64 {
        Pair::median(&self.during_eps) / Pair::median(&self.quiet_eps)
    }
}

pub async fn run(args: PruneBenchArgs) -> anyhow::Result<ExitCode> {
    let emit_args = args.clone();
    on_scratch_postgres(args.database.url.clone().as_ref(), |url| measure(args, url), |f| emit(&emit_args, &f)).await
}

async fn measure(args: PruneBenchArgs, url: String) -> anyhow::Result<[Pair; 2]> {
    let db = Db::connect_and_migrate(&url).await?;
    let run = uuid::Uuid::now_v7().simple().to_string()[24..].to_owned();
    let topics: Vec<String> = (0..2 * ROUNDS).map(|i| format!("bench-prune-{run}.round-{i}")).collect();
    let mut created: Vec<&str> = topics.iter().map(String::as_str).collect();
    created.push(relay::TOPIC);
    let embedded = EmbeddedKafka::start(1, &created, args.partitions)?;
    let kafka = KafkaConfig::new(embedded.bootstrap_servers());

    for days in OLD_DAYS {
        fill_old(&db, args.rows, days).await?;
    }
    // A first pass moves the relay's cursors past the old rows, as a relay
    // that has been running has them: otherwise its first read of each
    // slice, in the first quiet round only, steps over two million rows.
    relay::insert(&db, &relay::events(relay::TOPIC, WARM_UP)?).await?;
    relay::drain(&db, &kafka, WARM_UP).await?;
    let n = args.events;
    let relay_round = || async {
        relay::insert(&db, &relay::events(relay::TOPIC, n)?).await?;
        anyhow::Ok(relay::drain(&db, &kafka, n).await?.eps())
    };
    let relay = measure_pair(&db, pace(&args, OLD_DAYS[0] - 5), args.hold_prune, |_| relay_round()).await?;

    let producer = workload::producer(&kafka)?;
    let consume_round = |round: usize| {
        let (topic, producer, db, kafka, run) = (&topics[round], &producer, &db, &kafka, &run);
        async move {
            workload::publish(producer, &workload::completions(topic, &format!("{run}-{round}"), n as usize)?).await?;
            apply(db, kafka, topic, n).await
        }
    };
    let consume = measure_pair(&db, pace(&args, OLD_DAYS[1] - 5), args.hold_prune, consume_round).await?;
    for pair in [&relay, &consume] {
        anyhow::ensure!(pair.removed == 2 * args.rows, "a prune removed {} rows, the fill wrote {}", pair.removed, 2 * args.rows);
    }
    db.close().await;
    Ok([relay, consume])
}

/// A prune of the rows older than `retention_days`, at the default pace
/// but for the batch size.
fn pace(args: &PruneBenchArgs, retention_days: u64) -> PruneOptions {
    PruneOptions { retention: Duration::from_secs(retention_days * 86_400), batch: args.prune_batch, ..PruneOptions::default() }
}

/// `ROUNDS` rounds alone, then `ROUNDS` beside a prune; the prune is
/// waited for after, so its own time is reported too. `round(i)` runs
/// round `i` and returns its rate. With `hold`, a transaction holds the
/// last table the prune deletes from (`LOCK … IN SHARE MODE` conflicts with
/// its `DELETE`) until the rounds are done: a gate, so the prune cannot end
/// first however fast it is.
async fn measure_pair<F, Fut>(db: &Db, prune: PruneOptions, hold: bool, mut round: F) -> anyhow::Result<Pair>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<f64>>,
{
    let mut quiet_eps = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        quiet_eps.push(round(i).await?);
    }
    let mut gate = if hold { Some(db.begin().await?) } else { None };
    if let Some(gate) = gate.as_mut() {
        sqlx::query(&format!("LOCK TABLE {HELD_TABLE} IN SHARE MODE")).execute(&mut **gate).await?;
    }
    let pruning = start_prune(db, prune);
    let mut during_eps = Vec::with_capacity(ROUNDS);
    for i in ROUNDS..2 * ROUNDS {
        during_eps.push(round(i).await?);
        anyhow::ensure!(!pruning.is_finished(), "the prune ended before round {i} did: raise --rows or lower --events");
    }
    let reached_hold = match gate {
        Some(gate) => {
            let waiting = waiting_on(db, HELD_TABLE).await?;
            gate.commit().await?;
            Some(waiting)
        }
        None => None,
    };
    let (pruned, prune_secs) = pruning.await?;
    Ok(Pair { quiet_eps, during_eps, prune_secs, removed: removed(&pruned?), reached_hold })
}

/// The table of the last kind a prune deletes from (`Kind::IntakeKeys`).
const HELD_TABLE: &str = "export_intents";

/// Whether a session waits for a lock on `table`.
async fn waiting_on(db: &Db, table: &str) -> anyhow::Result<bool> {
    let row = sqlx::query("SELECT COUNT(*) FROM pg_locks WHERE relation = to_regclass($1) AND NOT granted")
        .bind(table)
        .fetch_one(db.pool())
        .await?;
    Ok(sqlx::Row::try_get::<i64, _>(&row, 0)? > 0)
}

fn start_prune(db: &Db, options: PruneOptions) -> JoinHandle<(Result<Pruned, herald_store::StoreError>, f64)> {
    let db = db.clone();
    tokio::spawn(async move {
        let started = Instant::now();
        let pruned = prune::prune(&db, &options, &CancellationToken::new()).await;
        (pruned, started.elapsed().as_secs_f64())
    })
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
    let rounds = |r: &[f64]| r.iter().map(|x| x.round()).collect::<Vec<_>>();
    if args.json {
        let out = json!({
            "rows_per_prune": 2 * args.rows, "events": args.events, "rounds": ROUNDS, "prune_batch": args.prune_batch,
            "relay_quiet_eps": Pair::median(&relay.quiet_eps).round(), "relay_during_prune_eps": Pair::median(&relay.during_eps).round(),
            "relay_quiet_rounds": rounds(&relay.quiet_eps), "relay_during_rounds": rounds(&relay.during_eps),
            "relay_during_vs_quiet": round(relay.ratio()), "relay_best_during_vs_quiet": round(relay.best_ratio()), "relay_prune_secs": round(relay.prune_secs),
            "consume_quiet_eps": Pair::median(&consume.quiet_eps).round(), "consume_during_prune_eps": Pair::median(&consume.during_eps).round(),
            "consume_quiet_rounds": rounds(&consume.quiet_eps), "consume_during_rounds": rounds(&consume.during_eps),
            "consume_during_vs_quiet": round(consume.ratio()), "consume_best_during_vs_quiet": round(consume.best_ratio()), "consume_prune_secs": round(consume.prune_secs),
            "target": TARGET,
            "prune_held": args.hold_prune,
            "relay_prune_reached_hold": relay.reached_hold, "consume_prune_reached_hold": consume.reached_hold,
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!(
        "each prune removes {} old rows ({} outbox + {} inbox); broker: in-process mock cluster; {ROUNDS} rounds of {} events each\n",
        2 * args.rows,
        args.rows,
        args.rows,
        args.events
    );
    let list = |r: &[f64]| r.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" / ");
    println!(
        "| role | quiet rounds (events/s) | rounds during a prune | median during ÷ median quiet | target | best ÷ best | prune took (s) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, pair) in [("relay (outbox → Kafka)", relay), ("search subscription (Kafka → inbox + documents)", consume)] {
        let mark = if pair.ratio() >= TARGET { "met" } else { "NOT met" };
        println!(
            "| {name} | {} | {} | {:.2} | ≥ {TARGET} ({mark}) | {:.2} | {:.1} |",
            list(&pair.quiet_eps),
            list(&pair.during_eps),
            pair.ratio(),
            pair.best_ratio(),
            pair.prune_secs
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use herald_store::prune::Kind;

    #[test]
    fn the_held_table_is_the_last_a_prune_deletes_from() {
        // `--hold-prune` holds the prune's last kind: one before it would
        // stop the prune half way and the rounds would run beside no prune.
        assert_eq!(Kind::ALL.last(), Some(&Kind::IntakeKeys));
        assert_eq!(super::HELD_TABLE, "export_intents");
    }
}
