//! `herald bench relay`: events per second from an outbox on PostgreSQL to
//! the in-process mock cluster (so the broker is not the bottleneck), or to a
//! real cluster given with `--kafka` (the figures users compare with), for
//!
//! 1. a raw rdkafka producer sending the same records (the ceiling),
//! 2. a naive relay: select one row, publish, await the ack, update, repeat,
//! 3. Herald's relay, progress recorded,
//! 4. the floor under any relay of this outbox (`relay_floor`): one binary
//!    COPY in commit order, each row sent as the raw producer sends it.
//!
//! Each runs against a fresh temporary database created on the server named
//! by `--database`, dropped afterwards.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use clap::Args;
use cloudevents::binding::rdkafka::FutureRecordExt;
use herald_envelope::OutboxEvent;
use herald_kafka::KafkaConfig;
use herald_relay::{Relay, RelayConfig, RelayCounters};
use herald_store::{Backend, Db, outbox};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::json;

use super::broker::BenchBroker;
use super::cpu::{CpuMark, CpuUse};
use super::memory::{self, Memory};
use super::relay_floor;
use crate::scratch::ScratchDb;
use herald_secret::SecretUrl;
use sqlx::Row;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Args)]
pub struct RelayBenchArgs {
    /// Events for the raw producer and Herald's relay.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1000..=10_000_000))]
    events: u64,
    /// Events for the naive relay (it is slow; its rate does not depend on the count).
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    naive_events: u64,
    /// Partitions of the benchmark topic.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(i32).range(1..=64))]
    partitions: i32,
    /// Rows a separate `herald relay` process drains while its resident
    /// memory is sampled (0: skip that measurement).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    memory_events: u64,
    /// Batches of one slice out at once (`herald relay --in-flight`).
    #[arg(long, default_value_t = RelayConfig::default().in_flight as u64, value_parser = clap::value_parser!(u64).range(1..=16))]
    in_flight: u64,
    /// A librdkafka setting for the relay's producers over Herald's
    /// (`herald relay --producer`), `KEY=VALUE`, repeatable.
    #[arg(long = "relay-producer", value_name = "KEY=VALUE", value_parser = herald_wiring::connection::parse_setting)]
    relay_producer: Vec<(String, String)>,
    /// One JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// A PostgreSQL server (any database on it); the benchmark creates and
    /// drops its own databases there.
    #[command(flatten)]
    database: herald_wiring::connection::DatabaseArgs,
    /// A Kafka cluster to publish to instead of the in-process mock; the
    /// benchmark creates a topic of its own there (Herald's durability
    /// defaults: 3 replicas, `min.insync.replicas` 2 on three brokers).
    #[command(flatten)]
    kafka: herald_wiring::connection::KafkaArgs,
}

pub(crate) const TOPIC: &str = "bench.events";
const KEYS: u64 = 1000;

pub async fn run(args: RelayBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(server) = args.database.url.clone().filter(|u| u.expose().starts_with("postgres")) else {
        eprintln!(
            "error: `herald bench relay` needs --database postgres://… (or HERALD_DATABASE_URL): it measures the relay from PostgreSQL"
        );
        return Ok(ExitCode::from(2));
    };
    // A topic of the run's own: a real cluster keeps what earlier runs wrote.
    let topic = format!("{TOPIC}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let broker = BenchBroker::start(&args.kafka, &[&topic], args.partitions).await?;
    let (kafka, bootstrap) = (broker.kafka.clone(), broker.bootstrap.clone());

    let raw = raw_producer(&kafka, &topic, &events(&topic, args.events)?).await?;
    let (scratch, db) = scratch_db(&server).await?;
    let naive = naive_relay(&db, &kafka, &events(&topic, args.naive_events)?).await;
    db.close().await;
    scratch.drop_db().await;
    let (scratch, db) = scratch_db(&server).await?;
    let config = RelayConfig { in_flight: args.in_flight as usize, producer: args.relay_producer.clone(), ..RelayConfig::default() };
    let herald = herald_relay(&db, &kafka, &events(&topic, args.events)?, config).await;
    db.close().await;
    scratch.drop_db().await;
    let (naive, herald) = (naive?, herald?);
    let (scratch, db) = scratch_db(&server).await?;
    insert(&db, &events(&topic, args.events)?).await?;
    let floor = relay_floor::floor_relay(&db, &kafka, args.events).await;
    db.close().await;
    scratch.drop_db().await;
    let floor = floor?;
    let memory = match args.memory_events {
        0 => None,
        n => {
            let (scratch, db) = scratch_db(&server).await?;
            let memory = relay_memory(&db, scratch.url.expose(), &bootstrap, &topic, n, &args.relay_producer).await;
            db.close().await;
            scratch.drop_db().await;
            Some(memory?)
        }
    };
    broker.finish().await?;

    report(&args, Runs { raw, naive, herald, floor }, memory.as_ref())?;
    Ok(ExitCode::SUCCESS)
}

/// Events of about 200 bytes of data over `KEYS` keys, as in the design
/// brief's database measurements.
pub(crate) fn events(topic: &str, n: u64) -> anyhow::Result<Vec<OutboxEvent>> {
    let data = vec![b'x'; 200];
    Ok((0..n)
        .map(|i| {
            let key = format!("bench-key-{}", i % KEYS);
            OutboxEvent {
                id: uuid::Uuid::now_v7().to_string(),
                source: "/herald/bench".to_owned(),
                event_type: "herald.bench.event".to_owned(),
                subject: key.clone(),
                time: Utc::now(),
                schema_file: "bench.avsc".to_owned(),
                data: data.clone(),
                content_type: herald_envelope::AVRO_CONTENT_TYPE.to_owned(),
                extensions: Default::default(),
                topic: topic.to_owned(),
                partition_key: key,
                trace: None,
            }
        })
        .collect())
}

/// A measured run: events and seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) events: u64,
    pub(crate) secs: f64,
    /// Herald's relay only: share of its slices' time spent reading,
    /// awaiting the broker and recording progress.
    split: Option<[f64; 3]>,
    /// CPU from the first send to the last ack (raw producer and Herald's relay).
    cpu: Option<CpuUse>,
}

impl Run {
    pub(crate) fn new(events: u64, secs: f64, cpu: Option<CpuUse>) -> Self {
        Self { events, secs, split: None, cpu }
    }

    pub(crate) fn eps(&self) -> f64 {
        self.events as f64 / self.secs
    }
}

async fn raw_producer(kafka: &KafkaConfig, topic: &str, events: &[OutboxEvent]) -> anyhow::Result<Run> {
    let producer: FutureProducer = herald_relay::producer_config(kafka).create()?;
    let (started, mark) = (Instant::now(), CpuMark::now());
    let mut deliveries = Vec::with_capacity(events.len());
    for event in events {
        // The relay's own encoding, so both sides pay the same for headers.
        let headers = event.to_kafka_headers_under(None)?;
        let record = FutureRecord::to(topic).key(event.partition_key.as_str()).payload(&event.data).headers(headers);
        deliveries.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    for delivery in deliveries {
        delivery.await.context("delivery report dropped")?.map_err(|(e, _)| e)?;
    }
    let cpu = mark.and_then(|m| m.used());
    Ok(Run { events: events.len() as u64, secs: started.elapsed().as_secs_f64(), split: None, cpu })
}

/// Select one row, publish it, await the ack, mark it, repeat. Its producer
/// does not linger (waiting to fill batches only slows a one-at-a-time loop).
async fn naive_relay(db: &Db, kafka: &KafkaConfig, events: &[OutboxEvent]) -> anyhow::Result<Run> {
    insert(db, events).await?;
    let mut config = herald_relay::producer_config(kafka);
    config.set("linger.ms", "0");
    let producer: FutureProducer = config.create()?;
    let started = Instant::now();
    let mut last = 0i64;
    let mut sent = 0u64;
    loop {
        let row = sqlx::query(
            "SELECT seq, event_id, source, event_type, subject, event_time_ms, schema_file, data, topic, partition_key \
             FROM outbox WHERE status = 'pending' AND seq > $1 ORDER BY seq LIMIT 1",
        )
        .bind(last)
        .fetch_optional(db.pool())
        .await?;
        let Some(row) = row else { break };
        let seq: i64 = row.try_get("seq")?;
        let event = OutboxEvent {
            id: row.try_get("event_id")?,
            source: row.try_get("source")?,
            event_type: row.try_get("event_type")?,
            subject: row.try_get("subject")?,
            time: chrono::DateTime::from_timestamp_millis(row.try_get("event_time_ms")?).unwrap_or_default(),
            schema_file: row.try_get("schema_file")?,
            data: row.try_get("data")?,
            content_type: herald_envelope::AVRO_CONTENT_TYPE.to_owned(),
            extensions: Default::default(),
            topic: row.try_get("topic")?,
            partition_key: row.try_get("partition_key")?,
            trace: None,
        };
        let message = event.to_kafka_record()?;
        let record = FutureRecord::to(&event.topic).key(event.partition_key.as_str()).message_record(&message);
        producer.send_result(record).map_err(|(e, _)| e)?.await.context("delivery report dropped")?.map_err(|(e, _)| e)?;
        sqlx::query("UPDATE outbox SET status = 'delivered', delivered_at_ms = $1 WHERE seq = $2")
            .bind(herald_store::now_ms())
            .bind(seq)
            .execute(db.pool())
            .await?;
        last = seq;
        sent += 1;
    }
    anyhow::ensure!(sent == events.len() as u64, "naive relay moved {sent} of {} rows", events.len());
    Ok(Run { events: sent, secs: started.elapsed().as_secs_f64(), split: None, cpu: None })
}

async fn herald_relay(db: &Db, kafka: &KafkaConfig, events: &[OutboxEvent], config: RelayConfig) -> anyhow::Result<Run> {
    insert(db, events).await?;
    let run = drain_with(db, kafka, events.len() as u64, config).await?;
    let delivered = outbox::count_by_status(db, outbox::DELIVERED).await?;
    anyhow::ensure!(delivered == run.events as i64, "{delivered} rows marked delivered, expected {}", run.events);
    Ok(run)
}

/// Runs Herald's relay until it delivered `want` rows (those pending in the
/// outbox), then stops it: the events/s from its start to the last ack.
pub(crate) async fn drain(db: &Db, kafka: &KafkaConfig, want: u64) -> anyhow::Result<Run> {
    drain_with(db, kafka, want, RelayConfig::default()).await
}

async fn drain_with(db: &Db, kafka: &KafkaConfig, want: u64, config: RelayConfig) -> anyhow::Result<Run> {
    let relay = Relay::new(db.clone(), kafka, RelayConfig { owner: "bench".to_owned(), ..config })?;
    let stats = relay.counters();
    let shutdown = CancellationToken::new();
    let (started, mark) = (Instant::now(), CpuMark::now());
    let task = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move { relay.run(shutdown).await })
    };
    let deadline = started + Duration::from_secs(600);
    while RelayCounters::get(&stats.delivered) < want {
        anyhow::ensure!(Instant::now() < deadline, "relay delivered {} of {want}", RelayCounters::get(&stats.delivered));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (secs, cpu) = (started.elapsed().as_secs_f64(), mark.and_then(|m| m.used()));
    shutdown.cancel();
    task.await?;
    let phases = [&stats.read_us, &stats.publish_us, &stats.record_us].map(|c| RelayCounters::get(c) as f64);
    let total: f64 = phases.iter().sum::<f64>().max(1.0);
    Ok(Run { events: want, secs, split: Some(phases.map(|p| p / total)), cpu })
}

/// A backlog of `n` rows drained by a `herald relay` process of its own,
/// its memory sampled throughout. Rows are written in chunks: holding a
/// million events at once is memory this process does not need.
async fn relay_memory(db: &Db, url: &str, bootstrap: &str, topic: &str, n: u64, producer: &[(String, String)]) -> anyhow::Result<Memory> {
    for start in (0..n).step_by(50_000) {
        insert(db, &events(topic, (n - start).min(50_000))?).await?;
    }
    let mut args: Vec<String> = ["relay", "--database", url, "--kafka", bootstrap].into_iter().map(str::to_owned).collect();
    args.extend(producer_flags(producer));
    memory::of_role(&args, n, Duration::from_secs(1800), || async {
        Ok(u64::try_from(outbox::count_by_status(db, outbox::DELIVERED).await?)?)
    })
    .await
}

/// `herald relay` flags giving its producers `settings`.
pub(crate) fn producer_flags(settings: &[(String, String)]) -> Vec<String> {
    settings.iter().flat_map(|(key, value)| ["--producer".to_owned(), format!("{key}={value}")]).collect()
}

pub(crate) async fn insert(db: &Db, events: &[OutboxEvent]) -> anyhow::Result<()> {
    for chunk in events.chunks(10_000) {
        let mut tx = db.begin().await?;
        outbox::append_many(&mut tx, chunk).await?;
        tx.commit().await?;
    }
    // Fresh statistics, as a database that has been running would have.
    sqlx::query("ANALYZE outbox").execute(db.pool()).await?;
    Ok(())
}

/// The four measurements of one run.
struct Runs {
    raw: Run,
    naive: Run,
    herald: Run,
    floor: Run,
}

fn report(args: &RelayBenchArgs, runs: Runs, memory: Option<&Memory>) -> anyhow::Result<()> {
    let Runs { raw, naive, herald, floor } = runs;
    let vs_naive = herald.eps() / naive.eps();
    let vs_raw = herald.eps() / raw.eps();
    let ratio = |x: f64| (x * 100.0).round() / 100.0;
    if args.json {
        let out = json!({
            "raw_producer_eps": raw.eps().round(), "naive_relay_eps": naive.eps().round(), "relay_eps": herald.eps().round(),
            "relay_vs_naive": (vs_naive * 10.0).round() / 10.0, "relay_vs_raw": ratio(vs_raw),
            "floor_relay_eps": floor.eps().round(), "floor_vs_raw": ratio(floor.eps() / raw.eps()),
            "relay_vs_floor": ratio(herald.eps() / floor.eps()),
            "events": herald.events, "naive_events": naive.events, "partitions": args.partitions,
            "broker": args.kafka.brokers.as_deref().unwrap_or("in-process mock cluster"),
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "relay_time_split": herald.split.map(|[r, p, w]| json!({"read": r, "await_broker": p, "record_progress": w})),
            "memory_events": args.memory_events,
            "relay_peak_rss_mb": memory.map(|m| (m.peak_mb * 10.0).round() / 10.0),
            "relay_memory": memory.map(Memory::to_json),
            "raw_cpu": raw.cpu.map(|c| c.to_json(raw.events)),
            "relay_cpu": herald.cpu.map(|c| c.to_json(herald.events)),
            "floor_cpu": floor.cpu.map(|c| c.to_json(floor.events)),
            "relay_vs_raw_cpu_bound": cpu_bound(raw, herald).map(ratio),
            "floor_vs_raw_cpu_bound": cpu_bound(raw, floor).map(ratio),
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!("broker: {}\n", args.kafka.brokers.as_deref().unwrap_or("in-process mock cluster"));
    println!("| run | events | seconds | events/s | vs Herald |");
    println!("|---|---:|---:|---:|---:|");
    for (name, run) in [
        ("raw rdkafka producer (ceiling)", raw),
        ("naive relay (1 row: select, publish, await, update)", naive),
        ("Herald relay (PostgreSQL, progress recorded)", herald),
        ("floor: one binary COPY in commit order, sent as raw (no progress)", floor),
    ] {
        println!("| {name} | {} | {:.2} | {:.0} | {:.2}x |", run.events, run.secs, run.eps(), run.eps() / herald.eps());
    }
    println!();
    println!(
        "Herald / naive = {vs_naive:.1}x; Herald / raw producer = {:.0} %; floor / raw producer = {:.0} %; Herald / floor = {:.0} %",
        vs_raw * 100.0,
        floor.eps() / raw.eps() * 100.0,
        herald.eps() / floor.eps() * 100.0
    );
    if let Some([r, p, w]) = herald.split {
        println!(
            "Herald's slice tasks spent {:.0} % reading batches, {:.0} % awaiting the broker, {:.0} % waiting for progress writes (beyond the next read)",
            r * 100.0,
            p * 100.0,
            w * 100.0
        );
    }
    for (name, run) in [("raw producer", raw), ("Herald relay", herald), ("floor", floor)] {
        if let Some(cpu) = run.cpu {
            println!("{}", cpu.line(name, run.events, "this process", "others: PostgreSQL, brokers not in-process"));
        }
    }
    for (name, run) in [("Herald's relay", herald), ("the floor", floor)] {
        if let Some(bound) = cpu_bound(raw, run) {
            println!("at its CPU per event with every core busy, {name} could reach at most {bound:.2} × the raw producer here");
        }
    }
    if let Some(memory) = memory {
        println!("{}", memory.line(&format!("herald relay draining {} rows", args.memory_events)));
    }
    Ok(())
}
/// The most a relay could reach over the raw producer's measured rate if
/// it kept every core busy at the CPU per event it used: all cores divided
/// by that cost, over raw's rate. A relay below this bound waited on
/// something; at it, only less CPU per event moves it.
fn cpu_bound(raw: Run, relay: Run) -> Option<f64> {
    let cpu = relay.cpu?;
    let most_eps = cpu.cpus as f64 * 1e6 / cpu.us_per_event(relay.events).max(f64::MIN_POSITIVE);
    Some(most_eps / raw.eps())
}

/// A migrated scratch database of the PostgreSQL server `server`.
async fn scratch_db(server: &SecretUrl) -> anyhow::Result<(ScratchDb, Db)> {
    let scratch = ScratchDb::create(server, "herald_bench").await?;
    let db = Db::connect_and_migrate(scratch.url.expose()).await?;
    anyhow::ensure!(db.backend() == Backend::Postgres, "not PostgreSQL");
    Ok((scratch, db))
}
