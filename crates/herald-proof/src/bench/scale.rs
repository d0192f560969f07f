//! `herald bench scale`: does adding processes add throughput? Relay
//! throughput with 1, 2 and 4 `herald relay` processes draining one outbox,
//! and consume throughput with 1, 2 and 4 `herald consume search` members
//! of one group, on a topic of 8 partitions of a real cluster (three private
//! nodes unless `--kafka` names one).
//!
//! Each round is a fresh scratch database and topics of its own. The
//! processes start first and the round waits until they have shared the
//! work out — every relay holds its share of the outbox's slices, or the
//! group is `Stable` with every member in it — so what is measured is the
//! throughput of `n` processes, not how fast they join (the relays'
//! rebalancing takes about two seconds, the group's its join round). Then
//! `--events` outbox rows (relay) or completion records (consume, in one
//! Kafka transaction the members read committed) are committed in one
//! transaction, and the round is timed from its commit until the last row
//! is delivered or record applied, polled every 200 ms. Each process
//! reports its own share when it stops (the relay's "relay stopped" and the
//! subscription's "subscription stopped" log lines carry `delivered` and
//! `applied`): on 2 cores the point is that adding processes never lowers
//! the total and none of them starves.

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use herald_kafka::{KafkaConfig, TopicSettings, Topics};
use herald_projections::search;
use herald_secret::SecretUrl;
use herald_store::{Db, inbox, outbox, positions};
use rdkafka::consumer::{BaseConsumer, Consumer};
use serde_json::json;
use sqlx::Row;
use tokio::process::{Child, Command};

use super::broker::RealCluster;
use super::{memory, relay, workload};
use crate::scratch::ScratchDb;

#[derive(Debug, Clone, Args)]
pub struct ScaleBenchArgs {
    /// Outbox rows each relay round drains, and records each consume round applies.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(100..=10_000_000))]
    events: u64,
    /// Process counts, one round each.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 2, 4], value_parser = clap::value_parser!(u32).range(1..=16))]
    processes: Vec<u32>,
    /// Partitions of each round's topics.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(i32).range(1..=64))]
    partitions: i32,
    /// A librdkafka setting for the relays' producers (`herald relay
    /// --producer`), `KEY=VALUE`, repeatable.
    #[arg(long = "relay-producer", value_name = "KEY=VALUE", value_parser = herald_wiring::connection::parse_setting)]
    relay_producer: Vec<(String, String)>,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// A PostgreSQL server; each round creates and drops a database there.
    #[command(flatten)]
    database: herald_wiring::connection::DatabaseArgs,
    /// A Kafka cluster (default: three private nodes from HERALD_KAFKA_HOME).
    #[command(flatten)]
    kafka: herald_wiring::connection::KafkaArgs,
}

/// How often a round's progress is read.
const POLL: Duration = Duration::from_millis(200);
const ROUND_LIMIT: Duration = Duration::from_secs(900);

/// One round: `processes` processes of one role and what each did.
#[derive(Debug, Clone)]
struct Round {
    processes: u32,
    events: u64,
    secs: f64,
    /// Rows delivered (relay) or records applied (consume) by each process,
    /// from its stop line; `None` when a process did not report.
    per_process: Vec<Option<u64>>,
}

impl Round {
    fn eps(&self) -> f64 {
        self.events as f64 / self.secs
    }

    fn to_json(&self, one: f64) -> serde_json::Value {
        json!({"processes": self.processes, "events": self.events, "secs": (self.secs * 100.0).round() / 100.0,
               "eps": self.eps().round(), "vs_one": (self.eps() / one * 100.0).round() / 100.0, "per_process": self.per_process})
    }
}

pub async fn run(args: ScaleBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(server) = args.database.url.clone().filter(|u| u.expose().starts_with("postgres")) else {
        eprintln!("error: `herald bench scale` needs --database postgres://… (or HERALD_DATABASE_URL)");
        return Ok(ExitCode::from(2));
    };
    let cluster = match RealCluster::given_or_started(&args.kafka, "herald bench scale").await? {
        Ok(cluster) => cluster,
        Err(code) => return Ok(code),
    };
    let logs = tempfile::tempdir()?;
    let mut relays = Vec::new();
    for &n in &args.processes {
        relays.push(relay_round(&server, &cluster, &args, n, logs.path()).await?);
    }
    let mut members = Vec::new();
    for &n in &args.processes {
        members.push(consume_round(&server, &cluster, &args, n, logs.path()).await?);
    }
    report(&args, &cluster.describe, &relays, &members)?;
    Ok(ExitCode::SUCCESS)
}

/// `n` relay processes drain `args.events` rows written before they start.
async fn relay_round(server: &SecretUrl, cluster: &RealCluster, args: &ScaleBenchArgs, n: u32, logs: &Path) -> anyhow::Result<Round> {
    let run = run_id();
    let topic = format!("bench.scale-relay-{run}");
    herald_kafka::ensure_topics(&cluster.kafka, &[topic.as_str()], TopicSettings::partitions(args.partitions)).await?;
    let scratch = ScratchDb::create(server, "herald_bench").await?;
    let result = async {
        let db = Db::connect_and_migrate(scratch.url.expose()).await?;
        let url = scratch.url.expose().to_owned();
        let role = |i: u32| -> Vec<String> {
            let owner = format!("scale-{run}-{i}");
            let mut role: Vec<String> =
                ["relay", "--database", &url, "--kafka", &cluster.bootstrap, "--owner", &owner].into_iter().map(str::to_owned).collect();
            role.extend(relay::producer_flags(&args.relay_producer));
            role
        };
        let mut processes = Processes::spawn(n, logs, &format!("relay-{run}"), role)?;
        processes.until("every relay holds its share of the slices", || slices_shared(&db, n)).await?;
        write_backlog(&db, &topic, args.events).await?;
        let started = Instant::now();
        processes.until("every row delivered", || newest_of_each_slice_delivered(&db)).await?;
        let secs = started.elapsed().as_secs_f64();
        let per_process = processes.stop("relay stopped", "delivered").await?;
        let delivered = outbox::count_by_status(&db, outbox::DELIVERED).await?;
        anyhow::ensure!(u64::try_from(delivered)? == args.events, "{delivered} of {} rows delivered", args.events);
        db.close().await;
        Ok(Round { processes: n, events: args.events, secs, per_process })
    }
    .await;
    cleaned_up(result, scratch, &cluster.kafka, &[&topic]).await
}

/// `events` outbox rows in one transaction: the relays see them all at its
/// commit, so a round measures how fast they drain a backlog, not how fast
/// the benchmark writes one (written in ten-thousand-row transactions
/// while the relays ran, the round timed the writer as much as the relays,
/// and on two shared cores more relays slowed the writer).
async fn write_backlog(db: &Db, topic: &str, events: u64) -> anyhow::Result<()> {
    let mut tx = db.begin().await?;
    for start in (0..events).step_by(10_000) {
        outbox::append_many(&mut tx, &relay::events(topic, (events - start).min(10_000))?).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// Whether each slice's last row of the backlog is delivered, asked of
/// those 16 rows alone (one index probe each). Enough here: the backlog is
/// one transaction, whose rows a slice delivers in sequence order. The
/// count over every row that says the same (`outbox::count_by_status`)
/// took 250–490 ms of a PostgreSQL backend on 200,000 rows; polled while
/// the relays drained, it took half a core from them and found the end up
/// to half a second late. The round checks that count once, untimed.
async fn newest_of_each_slice_delivered(db: &Db) -> anyhow::Result<bool> {
    let sql = format!(
        "SELECT COUNT(*) AS owed FROM relay_slices s CROSS JOIN LATERAL \
         (SELECT * FROM outbox WHERE outbox.slice = s.slice ORDER BY xid DESC, seq DESC LIMIT 1) o \
         WHERE {} <> '{}'",
        herald_store::delivered::status_sql(db.backend()),
        outbox::DELIVERED
    );
    let owed: i64 = sqlx::query(&sql).fetch_one(db.pool()).await?.try_get("owed")?;
    Ok(owed == 0)
}

/// `n` members of one group apply `args.events` records committed in one
/// Kafka transaction once the group is stable with all of them.
async fn consume_round(server: &SecretUrl, cluster: &RealCluster, args: &ScaleBenchArgs, n: u32, logs: &Path) -> anyhow::Result<Round> {
    let run = run_id();
    let prefix = format!("bench-scale-{run}");
    let topics = Topics::with_prefix(&prefix);
    herald_kafka::ensure_topics(&cluster.kafka, &topics.all(), TopicSettings::partitions(args.partitions)).await?;
    let scratch = ScratchDb::create(server, "herald_bench").await?;
    let result = async {
        let db = Db::connect_and_migrate(scratch.url.expose()).await?;
        let url = scratch.url.expose().to_owned();
        let group = format!("bench-scale-{run}");
        let role = |_: u32| -> Vec<String> {
            ["consume", "search", "--database", &url, "--kafka", &cluster.bootstrap, "--topic-prefix", &prefix, "--group-prefix", &group]
                .into_iter()
                .map(str::to_owned)
                .collect()
        };
        let mut processes = Processes::spawn(n, logs, &format!("consume-{run}"), role)?;
        let group_id = format!("{group}.{}", search::SUBSCRIPTION);
        processes.until("the group is stable with every member", || group_stable(&cluster.kafka, &group_id, n)).await?;
        // One transaction, committed before the clock starts: the members
        // (read_committed) see nothing of it until then, so the round times
        // them and not the benchmark's producer on the same cores.
        let completions = workload::completions(&topics.events, &format!("{run}c"), usize::try_from(args.events)?)?;
        workload::publish_in_one_transaction(&cluster.kafka, &format!("{prefix}-backlog"), &completions).await?;
        let started = Instant::now();
        // The subscription's positions (a row per partition, advanced in
        // each batch's transaction) say as much as counting the inbox on
        // every poll, which took ~64 ms of PostgreSQL at 200,000 rows: the
        // topics are the round's own, so offsets start at 0.
        let applied = || async {
            let next = positions::read(&db, search::SUBSCRIPTION, &topics.events).await?;
            Ok(u64::try_from(next.values().sum::<i64>())? >= args.events)
        };
        processes.until("every record applied", applied).await?;
        let secs = started.elapsed().as_secs_f64();
        let per_process = processes.stop("subscription stopped", "applied").await?;
        let inboxed = inbox::count(&db, search::SUBSCRIPTION).await?;
        anyhow::ensure!(u64::try_from(inboxed)? == args.events, "{inboxed} of {} records in the inbox", args.events);
        db.close().await;
        Ok(Round { processes: n, events: args.events, secs, per_process })
    }
    .await;
    cleaned_up(result, scratch, &cluster.kafka, &topics.all()).await
}

/// A round's result once its scratch database and its topics are gone; a
/// round that failed reports its own error before any of the cleanup's.
async fn cleaned_up(result: anyhow::Result<Round>, scratch: ScratchDb, kafka: &KafkaConfig, topics: &[&str]) -> anyhow::Result<Round> {
    scratch.drop_db().await;
    let deleted = super::broker::delete_topics(kafka, topics).await;
    let round = result?;
    deleted?;
    Ok(round)
}

/// Every relay holds a live claim and none more than its share of the
/// slices: the relays have finished rebalancing.
async fn slices_shared(db: &Db, n: u32) -> anyhow::Result<bool> {
    let rows = sqlx::query(&format!(
        "SELECT COUNT(*) AS held FROM relay_slices WHERE claim_owner IS NOT NULL AND claim_expires_at_ms > {} GROUP BY claim_owner",
        db.now_sql()
    ))
    .fetch_all(db.pool())
    .await?;
    let held: Vec<i64> = rows.iter().map(|r| r.try_get("held")).collect::<Result<_, _>>()?;
    let share = (i64::from(herald_store::outbox::SLICES) + i64::from(n) - 1) / i64::from(n);
    Ok(held.len() == n as usize && held.iter().all(|h| *h <= share) && held.iter().sum::<i64>() == i64::from(herald_store::outbox::SLICES))
}

/// The group has settled its assignment with all `n` members in it.
async fn group_stable(kafka: &KafkaConfig, group: &str, n: u32) -> anyhow::Result<bool> {
    let (kafka, group) = (kafka.clone(), group.to_owned());
    tokio::task::spawn_blocking(move || {
        let reader: BaseConsumer = kafka.reader().create()?;
        let list = reader.fetch_group_list(Some(&group), Duration::from_secs(10))?;
        Ok(list.groups().iter().any(|g| g.state() == "Stable" && g.members().len() == n as usize))
    })
    .await?
}

/// The processes of one round, each with its log file.
struct Processes {
    name: String,
    children: Vec<(Child, PathBuf)>,
    started: Instant,
}

impl Processes {
    fn spawn(n: u32, logs: &Path, name: &str, role: impl Fn(u32) -> Vec<String>) -> anyhow::Result<Processes> {
        let mut children = Vec::new();
        for i in 0..n {
            let log = logs.join(format!("{name}-{i}.log"));
            children.push((spawn(&role(i), &log)?, log));
        }
        Ok(Processes { name: name.to_owned(), children, started: Instant::now() })
    }

    /// Polls `check` every 200 ms until it holds; fails if a process exits.
    async fn until<F, Fut>(&mut self, what: &str, mut check: F) -> anyhow::Result<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = anyhow::Result<bool>>,
    {
        while !check().await? {
            for (child, log) in &mut self.children {
                if let Some(status) = child.try_wait()? {
                    anyhow::bail!("a process of {} exited ({status}) before {what}; its log: {}", self.name, log.display());
                }
            }
            anyhow::ensure!(self.started.elapsed() < ROUND_LIMIT, "{}: not {what} in {ROUND_LIMIT:?}", self.name);
            tokio::time::sleep(POLL).await;
        }
        Ok(())
    }

    /// Stops every process with SIGTERM and reads each one's `field` from
    /// its last `message` log line.
    async fn stop(self, message: &str, field: &str) -> anyhow::Result<Vec<Option<u64>>> {
        let mut per_process = Vec::new();
        for (mut child, log) in self.children {
            let pid = child.id().context("the process exited before its stop")?;
            memory::stop(&mut child, pid).await?;
            per_process.push(last_field(&log, message, field)?);
        }
        Ok(per_process)
    }
}

/// `herald <args>` with JSON logs to `log`: warnings, and the info lines
/// of the relay's and the subscription's own loops (their stop lines).
fn spawn(args: &[String], log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    Command::new(std::env::current_exe()?)
        .args(args)
        .env("HERALD_LOG", "warn,herald_relay::relay=info,herald_consumer::subscription=info")
        .env("HERALD_LOG_FORMAT", "json")
        .env_remove("HERALD_CONFIG")
        .stdout(Stdio::null())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting herald {}", args.join(" ")))
}

/// `field` of the last JSON line of `log` whose message is `message`.
fn last_field(log: &PathBuf, message: &str, field: &str) -> anyhow::Result<Option<u64>> {
    let text = std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    Ok(field_of_last(&text, message, field))
}

fn field_of_last(text: &str, message: &str, field: &str) -> Option<u64> {
    text.lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line.get("message").and_then(|m| m.as_str()) == Some(message))
        .and_then(|line| line.get(field).and_then(serde_json::Value::as_u64))
}

fn run_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()[20..].to_owned()
}

fn report(args: &ScaleBenchArgs, broker: &str, relays: &[Round], members: &[Round]) -> anyhow::Result<()> {
    let one = |rounds: &[Round]| rounds.iter().find(|r| r.processes == 1).or(rounds.first()).map_or(1.0, Round::eps);
    if args.json {
        let out = json!({
            "broker": broker, "partitions": args.partitions, "events": args.events,
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "relay": relays.iter().map(|r| r.to_json(one(relays))).collect::<Vec<_>>(),
            "consume": members.iter().map(|r| r.to_json(one(members))).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!("broker: {broker}; {} partitions; {} events per round\n", args.partitions, args.events);
    println!("| role | processes | seconds | events/s | vs 1 process | per process |");
    println!("|---|---:|---:|---:|---:|---|");
    for (role, rounds) in [("herald relay", relays), ("herald consume search", members)] {
        for r in rounds {
            let shares = r.per_process.iter().map(|s| s.map_or("?".to_owned(), |n| n.to_string())).collect::<Vec<_>>().join(" / ");
            println!("| {role} | {} | {:.2} | {:.0} | {:.2}x | {shares} |", r.processes, r.secs, r.eps(), r.eps() / one(rounds));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_stop_line_gives_the_share() {
        let log = r#"{"message":"relay started","level":"INFO"}
{"message":"relay stopped","delivered":12,"level":"INFO"}
not json
{"message":"relay stopped","delivered":40,"level":"INFO"}
{"message":"something else","delivered":7}"#;
        assert_eq!(field_of_last(log, "relay stopped", "delivered"), Some(40));
        assert_eq!(field_of_last(log, "subscription stopped", "applied"), None);
    }

    /// The round's end check asks 16 rows, not all of them: it must still
    /// say "not yet" while any slice owes its last row.
    #[tokio::test]
    async fn the_end_waits_for_the_last_row_of_every_slice_postgres() -> anyhow::Result<()> {
        let test_db = herald_testkit::postgres_db().await?;
        let db = Db::connect_and_migrate(&test_db.url).await?;
        write_backlog(&db, "bench-scale-end", 200).await?;
        assert!(!newest_of_each_slice_delivered(&db).await?, "nothing is relayed yet");

        let owing: i32 = sqlx::query("SELECT MAX(slice) AS slice FROM outbox").fetch_one(db.pool()).await?.try_get("slice")?;
        // Every committed row done for every slice but `owing`, as a
        // relay's cursor says it once a whole step is published.
        let pass = "UPDATE relay_slices SET cursor_lo = CAST(pg_current_snapshot() AS TEXT), cursor_hi = NULL WHERE slice <> $1";
        sqlx::query(pass).bind(owing).execute(db.pool()).await?;
        assert!(!newest_of_each_slice_delivered(&db).await?, "slice {owing} still owes its rows");
        assert!(outbox::count_by_status(&db, outbox::DELIVERED).await? < 200);

        sqlx::query("UPDATE relay_slices SET cursor_lo = CAST(pg_current_snapshot() AS TEXT), cursor_hi = NULL").execute(db.pool()).await?;
        assert!(newest_of_each_slice_delivered(&db).await?);
        assert_eq!(outbox::count_by_status(&db, outbox::DELIVERED).await?, 200, "the end check agrees with the full count");
        db.close().await;
        Ok(())
    }
}
