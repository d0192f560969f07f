//! `herald bench latency`: what a user feels — the time from an outbox
//! append's commit to the search document being readable — at fixed offered
//! loads, through the whole pipeline: outbox on PostgreSQL → Herald's relay →
//! Kafka → the search subscription → a reader.
//!
//! Each load runs for `--seconds` on topics of its own: a writer commits a
//! small transaction of outbox rows every 10 ms (the load spread evenly;
//! after a commit that returned late, everything owed since), and about
//! 200 events per second are probes, whose moments are noted
//! ([`super::probes`]): committed, readable by a plain consumer of the topic,
//! visible to a reader polling the search inbox every 2 ms (the inbox row
//! commits with the document). The reader's poll adds up to 2 ms; the
//! subscription keeps receiving after a poll's first record only while its
//! lanes are busy, for at most 20 ms (`SubscriptionOptions::max_wait`).
//! Without `--kafka`, a private three-node Apache Kafka cluster is started
//! from `HERALD_KAFKA_HOME`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Args;
use herald_consumer::{Metrics, Subscription, SubscriptionOptions};
use herald_envelope::OutboxEvent;
use herald_kafka::{KafkaConfig, TopicSettings, Topics};
use herald_projections::search::{self, Search};
use herald_relay::{Relay, RelayConfig};
use herald_store::{Db, inbox, outbox};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::latency_observer::Observer;
use super::latency_parts::{RelayBatches, SubscriptionBatches, Timed};
use super::latency_reader::{self, READ_EVERY};
use super::probes::{Pace, Probes, Summary, percentiles, round1, stage_json};
use super::workload;
use crate::scratch::on_scratch_postgres;

#[derive(Debug, Clone, Args)]
pub struct LatencyBenchArgs {
    /// Offered loads in events per second, run one after the other.
    #[arg(long, value_delimiter = ',', default_values_t = [1000u32, 10_000], value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub rates: Vec<u32>,
    /// Seconds each load is offered.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub seconds: u64,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(i32).range(1..=64))]
    pub partitions: i32,
    /// Batches of one relay slice out at once (`herald relay --in-flight`).
    #[arg(long, default_value_t = RelayConfig::default().in_flight as u64, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub in_flight: u64,
    /// Seconds of load at the highest rate offered (through the pipeline,
    /// then the raw client, as a measured load), run and discarded before
    /// the measured loads. Brokers just started spend their first two
    /// minutes under load compiling their hot paths (the three JVMs' C2
    /// threads took 54 s of CPU in the first 116 s, then 0.05 of a core):
    /// a load measured then measures the JIT. Default: 60 (two minutes with
    /// the raw client's) when the benchmark starts its own cluster, 0 with
    /// `--kafka`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub warm_up: Option<u64>,
    /// Lanes of the search subscription (`SubscriptionOptions::lanes`).
    #[arg(long, default_value_t = SubscriptionOptions::default().lanes as u64, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub lanes: u64,
    /// A librdkafka setting for the relay's two producers over Herald's
    /// (`RelayConfig::producer`), `KEY=VALUE`, repeatable: e.g.
    /// `linger.ms=0` or `max.in.flight.requests.per.connection=2`.
    #[arg(long = "relay-producer", value_name = "KEY=VALUE", value_parser = herald_wiring::connection::parse_setting)]
    pub relay_producer: Vec<(String, String)>,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A PostgreSQL server; a scratch database is created on it and dropped.
    #[command(flatten)]
    pub database: herald_wiring::connection::DatabaseArgs,
    /// A Kafka cluster (default: three private nodes from HERALD_KAFKA_HOME).
    #[command(flatten)]
    pub kafka: herald_wiring::connection::KafkaArgs,
}

/// Targets of issue 20, item 4: end-to-end p99 per offered load.
const TARGETS_MS: [(u32, f64); 2] = [(1000, 50.0), (10_000, 250.0)];
const PROBES_PER_SEC: u32 = 200;
const TICK: Duration = Duration::from_millis(10);
const DEFAULT_WARM_UP_SECONDS: u64 = 60;

/// The figures of one offered load.
struct Load {
    rate: u32,
    offered_eps: f64,
    appended: usize,
    probes: usize,
    summary: Summary,
    /// The raw rdkafka client at the same load: send → readable.
    raw: Summary,
    relay: RelayBatches,
    subscription: SubscriptionBatches,
    /// How long each of the reader's looks took: a look that returns late
    /// notes the probes it finds late.
    reader_looks: Vec<Duration>,
}

pub async fn run(args: LatencyBenchArgs) -> anyhow::Result<ExitCode> {
    let args = &args;
    let cluster = match super::broker::RealCluster::given_or_started(&args.kafka, "herald bench latency").await? {
        Ok(cluster) => cluster,
        Err(code) => return Ok(code),
    };
    let (kafka, broker) = (cluster.kafka.clone(), cluster.describe.clone());
    let kafka = &kafka;
    let warm_up = warm_up_of(args.warm_up, cluster.started_here());
    on_scratch_postgres(
        args.database.url.as_ref(),
        |url| async move {
            let db = Db::connect_and_migrate(&url).await?;
            if let Some(&rate) = args.rates.iter().max().filter(|_| warm_up > 0) {
                eprintln!("warming the pipeline up: {rate} events/s for {warm_up} s, not measured");
                one_load(&db, &url, kafka, &LatencyBenchArgs { seconds: warm_up, ..args.clone() }, rate).await?;
            }
            let mut loads = Vec::new();
            for &rate in &args.rates {
                loads.push(one_load(&db, &url, kafka, args, rate).await?);
            }
            db.close().await;
            Ok(loads)
        },
        |loads: Vec<Load>| {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&to_json(&loads, &broker, args, warm_up))?);
            } else {
                print(&loads, &broker, args, warm_up);
            }
            Ok(())
        },
    )
    .await
}

/// Offers `rate` events/s for `args.seconds` through a relay and a search
/// subscription of their own; checks every event arrived exactly once.
async fn one_load(db: &Db, url: &str, kafka: &KafkaConfig, args: &LatencyBenchArgs, rate: u32) -> anyhow::Result<Load> {
    let run = &uuid::Uuid::now_v7().simple().to_string()[20..];
    let topics = Topics::with_prefix(&format!("latency-{run}"));
    herald_kafka::ensure_topics(kafka, &topics.all(), TopicSettings::partitions(args.partitions)).await?;
    let stop = CancellationToken::new();
    let probes = Probes::default();
    // The relay and the subscription each get a pool of their own, as
    // processes of their own would; the writer and the reader share one.
    let relay_db = Db::connect(url).await?;
    let relay = Relay::new(
        relay_db.clone(),
        kafka,
        RelayConfig {
            owner: format!("latency-{run}"),
            in_flight: args.in_flight as usize,
            producer: args.relay_producer.clone(),
            ..RelayConfig::default()
        },
    )?;
    let relay_counters = relay.counters();
    let relay = tokio::spawn({
        let stop = stop.clone();
        async move { relay.run(stop).await }
    });
    let sub = Subscription::new(search::SUBSCRIPTION, &format!("latency-{run}"), kafka, &[topics.events.as_str()]);
    let subscription_db = Db::connect(url).await?;
    let metrics = Arc::new(Metrics::default());
    let options = SubscriptionOptions { lanes: args.lanes as usize, ..SubscriptionOptions::default() };
    let subscription = tokio::spawn({
        let (db, stop, metrics, probes) = (subscription_db.clone(), stop.clone(), metrics.clone(), probes.clone());
        async move {
            let handler = Timed { inner: herald_wiring::subscriptions::live(Search, &sub), probes };
            herald_consumer::run_subscription(&sub, &db, &handler, &options, &metrics, stop).await
        }
    });
    let observer = Observer::start(kafka, &topics.events, &probes, &stop)?;
    let reader_pool = latency_reader::pool(db)?;
    let reader = latency_reader::spawn(reader_pool, probes.clone(), stop.clone());

    // One event through before the clock starts: both groups have joined.
    let before = inbox::count(db, search::SUBSCRIPTION).await?;
    append(db, &topics.events, &format!("{run}-warm"), 0, 1).await?;
    wait_for(db, before + 1, Duration::from_secs(120)).await.context("the warm-up event never became visible")?;
    observer.read(1).await?;

    let started = Instant::now();
    let appended = offer(db, &topics.events, run, rate, args.seconds, &probes).await?;
    let offered_eps = appended as f64 / started.elapsed().as_secs_f64();
    let want = before + 1 + appended as i64;
    // The reader's lookups are cheap and already running: the inbox is only
    // counted (a walk over every row of the subscription) once the probes
    // are in, so the count does not compete with the tail it measures.
    let quiet = Instant::now() + Duration::from_secs(120);
    while !probes.outstanding(1).is_empty() && Instant::now() < quiet {
        tokio::time::sleep(READ_EVERY).await;
    }
    wait_for(db, want, Duration::from_secs(120)).await.context("not every event became visible")?;
    stop.cancel();
    relay.await?;
    subscription.await??;
    observer.finish().await?;
    let reader_looks = tokio::task::spawn_blocking(move || reader.join()).await?.map_err(|_| anyhow::anyhow!("the reader panicked"))??;
    relay_db.close().await;
    subscription_db.close().await;
    let applied = inbox::count(db, search::SUBSCRIPTION).await?;
    anyhow::ensure!(applied == want, "the search inbox holds {applied} events, {want} were appended");
    let owed = herald_store::delivered::count_except(db, outbox::DELIVERED).await?;
    anyhow::ensure!(owed == 0, "{owed} outbox rows not delivered");
    super::broker::delete_topics(kafka, &topics.all()).await?;
    let raw = raw_client(kafka, args, rate).await?;
    let (relay, subscription) = (RelayBatches::of(&relay_counters), SubscriptionBatches::of(&metrics));
    Ok(Load { rate, offered_eps, appended, probes: probes.count(), summary: probes.summary(), raw, relay, subscription, reader_looks })
}

/// The floor on this cluster: a plain producer (Herald's settings: acks=all,
/// idempotent, linger 5 ms) sending the same load, and the same observer.
async fn raw_client(kafka: &KafkaConfig, args: &LatencyBenchArgs, rate: u32) -> anyhow::Result<Summary> {
    let topic = format!("latency-raw-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    herald_kafka::ensure_topics(kafka, &[&topic], TopicSettings::partitions(args.partitions)).await?;
    let (probes, stop) = (Probes::default(), CancellationToken::new());
    let observer = Observer::start(kafka, &topic, &probes, &stop)?;
    // One record through before the clock starts: the observer has joined.
    let producer = workload::producer(kafka)?;
    let warm = OutboxEvent::new(&topic, "warm", &workload::completion("warm", 0), Utc::now())?;
    workload::publish(&producer, std::slice::from_ref(&warm)).await?;
    observer.read(1).await?;
    let mut pace = Pace::new(rate, args.seconds, TICK, PROBES_PER_SEC);
    let (mut sent, mut acks) = (0usize, Vec::new());
    while let Some(n) = pace.due().await {
        let events: Vec<OutboxEvent> = (sent..sent + n)
            .map(|i| Ok(OutboxEvent::new(&topic, &format!("raw-{i}"), &workload::completion("raw", i), Utc::now())?))
            .collect::<anyhow::Result<_>>()?;
        probes.committed(&pace.probe_ids(sent, events.iter().map(|e| e.id.as_str())), Instant::now());
        let producer = producer.clone();
        acks.push(tokio::spawn(async move { workload::publish(&producer, &events).await }));
        sent += n;
    }
    for ack in acks {
        ack.await??;
    }
    let quiet = Instant::now() + Duration::from_secs(30);
    while probes.summary().commit_to_topic.len() < probes.count() && Instant::now() < quiet {
        tokio::time::sleep(READ_EVERY).await;
    }
    stop.cancel();
    observer.finish().await?;
    super::broker::delete_topics(kafka, &[&topic]).await?;
    Ok(probes.summary())
}

/// Commits what is due every 10 ms for `seconds`: `rate / 100` events, or
/// everything owed since the last commit when that commit returned late, so
/// the offered load holds.
async fn offer(db: &Db, topic: &str, run: &str, rate: u32, seconds: u64, probes: &Probes) -> anyhow::Result<usize> {
    let mut pace = Pace::new(rate, seconds, TICK, PROBES_PER_SEC);
    let mut appended = 0;
    while let Some(n) = pace.due().await {
        let (ids, at) = append(db, topic, run, appended, n).await?;
        probes.committed(&pace.probe_ids(appended, ids.iter().map(String::as_str)), at);
        appended += n;
    }
    Ok(appended)
}

/// Events `from..from + n` of the run in one transaction: their ids, and
/// when the commit returned.
async fn append(db: &Db, topic: &str, run: &str, from: usize, n: usize) -> anyhow::Result<(Vec<String>, Instant)> {
    let events: Vec<OutboxEvent> = (from..from + n)
        .map(|i| {
            let data = workload::completion(run, i);
            Ok(OutboxEvent::new(topic, &data.job_id, &data, Utc::now())?)
        })
        .collect::<anyhow::Result<_>>()?;
    let mut tx = db.begin().await?;
    outbox::append_many(&mut tx, &events).await?;
    tx.commit().await?;
    Ok((events.into_iter().map(|e| e.id).collect(), Instant::now()))
}

async fn wait_for(db: &Db, applied: i64, within: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    while inbox::count(db, search::SUBSCRIPTION).await? < applied {
        anyhow::ensure!(Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The warm-up given, or by default [`DEFAULT_WARM_UP_SECONDS`] on a
/// cluster the benchmark started itself and none on one it was given.
fn warm_up_of(given: Option<u64>, started_here: bool) -> u64 {
    given.unwrap_or(if started_here { DEFAULT_WARM_UP_SECONDS } else { 0 })
}

fn target_of(rate: u32) -> Option<f64> {
    TARGETS_MS.iter().find(|(r, _)| *r == rate).map(|(_, ms)| *ms)
}

fn to_json(loads: &[Load], broker: &str, args: &LatencyBenchArgs, warm_up: u64) -> serde_json::Value {
    let rates: Vec<serde_json::Value> = loads
        .iter()
        .map(|l| {
            let [p50, p99, max] = percentiles(&l.summary.end_to_end);
            json!({
                "rate": l.rate, "offered_eps": l.offered_eps.round(), "events": l.appended, "probes": l.probes,
                "p50_ms": round1(p50), "p99_ms": round1(p99), "max_ms": round1(max),
                "target_p99_ms": target_of(l.rate),
                "meets_target": target_of(l.rate).map(|t| p99 < t),
                "stages": {
                    "commit_to_topic": stage_json(&l.summary.commit_to_topic),
                    "topic_to_visible": stage_json(&l.summary.topic_to_visible),
                    "topic_to_applying": stage_json(&l.summary.topic_to_applying),
                    "applying_to_visible": stage_json(&l.summary.applying_to_visible),
                    "raw_send_to_readable": stage_json(&l.raw.commit_to_topic),
                },
                "reader_look": stage_json(&l.reader_looks),
                "relay_per_batch": l.relay.to_json(),
                "subscription_per_batch": l.subscription.to_json(),
            })
        })
        .collect();
    json!({ "broker": broker, "seconds": args.seconds, "warm_up_seconds": warm_up, "partitions": args.partitions, "relay_in_flight": args.in_flight,
            "subscription_lanes": args.lanes, "relay_producer": settings(args), "rates": rates })
}

fn print(loads: &[Load], broker: &str, args: &LatencyBenchArgs, warm_up: u64) {
    println!(
        "herald bench latency — {} s per load after {warm_up} s of warm-up, {} partitions, relay in flight {}, subscription lanes {}, relay producer [{}], Kafka: {broker}\n",
        args.seconds,
        args.partitions,
        args.in_flight,
        args.lanes,
        settings(args).join(", ")
    );
    println!("| offered events/s | stage | p50 ms | p99 ms | max ms | samples |");
    println!("|---:|---|---:|---:|---:|---:|");
    for l in loads {
        for (stage, samples) in [
            ("commit → record readable on the topic", &l.summary.commit_to_topic),
            ("record readable → document visible", &l.summary.topic_to_visible),
            ("  of which: readable → handed to the projection", &l.summary.topic_to_applying),
            ("  of which: handed to the projection → visible", &l.summary.applying_to_visible),
            ("end to end: commit → document visible", &l.summary.end_to_end),
            ("raw rdkafka client: send → readable (the floor)", &l.raw.commit_to_topic),
            ("the reader's look at the inbox (each, not per probe)", &l.reader_looks),
        ] {
            let [p50, p99, max] = percentiles(samples);
            println!("| {:.0} | {stage} | {p50:.1} | {p99:.1} | {max:.1} | {} |", l.offered_eps, samples.len());
        }
    }
    println!("\n| offered events/s | relay batches | rows per batch | read ms | awaiting acks ms | awaiting progress write ms |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for l in loads {
        let r = &l.relay;
        println!("| {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.1} |", l.offered_eps, r.batches, r.rows, r.read_ms, r.acks_ms, r.record_ms);
    }
    if let Some(first) = loads.first() {
        let stages: Vec<&str> = first.subscription.stages_ms.iter().map(|(stage, _)| *stage).collect();
        println!("\n| offered events/s | subscription batches | records per batch | {} ms |", stages.join(" ms | "));
        println!("|---:|---:|---:|{}", "---:|".repeat(stages.len()));
    }
    for l in loads {
        let s = &l.subscription;
        let stages: Vec<String> = s.stages_ms.iter().map(|(_, ms)| format!("{ms:.1}")).collect();
        println!("| {:.0} | {} | {:.1} | {} |", l.offered_eps, s.batches, s.records, stages.join(" | "));
    }
    println!();
    for l in loads {
        if let Some(target) = target_of(l.rate) {
            let [_, p99, _] = percentiles(&l.summary.end_to_end);
            println!(
                "{} events/s: end-to-end p99 {p99:.1} ms, target < {target:.0} ms: {}",
                l.rate,
                if p99 < target { "met" } else { "NOT met" }
            );
        }
    }
}

/// The relay producer's overrides as given, `KEY=VALUE`.
fn settings(args: &LatencyBenchArgs) -> Vec<String> {
    args.relay_producer.iter().map(|(key, value)| format!("{key}={value}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_cluster_started_here_is_warmed_up_unless_told() {
        assert_eq!(warm_up_of(None, true), DEFAULT_WARM_UP_SECONDS);
        assert_eq!(warm_up_of(None, false), 0, "a given cluster is measured as it is");
        assert_eq!(warm_up_of(Some(0), true), 0);
        assert_eq!(warm_up_of(Some(5), false), 5);
    }
}
