//! `herald bench rebuild`: how fast a rebuild replays retained history into a
//! new search generation on PostgreSQL, next to the live search
//! subscription's rate and the raw batched insert rate, all in one run.
//!
//! One run: publish N completions to the in-process mock cluster (or the
//! cluster given with `--kafka`); the live
//! search subscription builds generation 1 from them (timed); the database
//! is vacuumed before each phase that writes it (untimed); `rebuild` then
//! builds generation 2 — replay to the boundary, the live subscription's
//! positions (timed from the start of the replay phase to its end), verify,
//! switch — and the run
//! checks that it switched and holds N documents; last, the same rows as
//! plain multi-row INSERTs (timed), and the same documents written the
//! cheapest way the server can make them searchable (`rebuild_floor`, timed
//! with its CPU: with the raw consume's, the most any replay reaches here).
//! `--duplicate-every K` publishes every K-th event twice, as a relay
//! retrying a batch does, so the replay loads those jobs twice.
//! Topic partitions default to 32 because
//! the mock cluster keeps at most 5 MiB per partition: fewer would let its
//! retention drop history (the rebuild would then refuse, naming the gap).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use chrono::Utc;
use clap::Args;
use herald_consumer::{Subscription, SubscriptionOptions};
use herald_envelope::OutboxEvent;
use herald_kafka::{KafkaConfig, Topics};
use herald_projections::search;
use herald_rebuild::replay::{DEFAULT_BATCH, ReplayProgress};
use herald_rebuild::{Progress, RebuildOptions, Search, SwitchMode, rebuild};
use herald_store::{Db, inbox};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::broker::BenchBroker;
use super::consume::{raw_consume, raw_insert, timed_search_subscription};
use super::cpu::{CpuMark, CpuUse};
use super::decode_floor::{DecodeCost, decode_cost};
use super::rebuild_floor::{WriteFloor, write_floor};
use super::workload;
use crate::scratch::on_scratch_postgres;

#[derive(Debug, Clone, Args)]
pub struct RebuildBenchArgs {
    /// Events to publish, consume live and replay.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u32).range(1000..=5_000_000))]
    pub events: u32,
    /// A PostgreSQL server; a scratch database is created on it and dropped.
    #[command(flatten)]
    pub database: herald_wiring::connection::DatabaseArgs,
    /// Partitions of the benchmark topic.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(i32).range(1..=256))]
    pub partitions: i32,
    /// Records per replay transaction.
    #[arg(long, default_value_t = DEFAULT_BATCH as u32, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub batch: u32,
    /// Publish every K-th event a second time after its chunk, as a relay
    /// does when it sends a batch again after losing its acknowledgement
    /// (0: none). A replay then loads those jobs twice and its seal settles
    /// them (`search::seal`).
    #[arg(long, default_value_t = 0)]
    pub duplicate_every: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A Kafka cluster instead of the in-process mock (topics of the run's own).
    #[command(flatten)]
    pub kafka: herald_wiring::connection::KafkaArgs,
}

/// Events/s a replay of 1M events should reach (issue 20, item 2), beside
/// ≥ 1.5 × the raw batched insert of the same run.
const TARGET_EPS: f64 = 200_000.0;
const TARGET_VS_RAW_INSERT: f64 = 1.5;
/// Events generated and published at a time (bounds the memory of the run).
const CHUNK: usize = 100_000;
/// Records whose decoding is timed apart from any receiving.
const DECODE_SAMPLE: usize = 100_000;

struct Figures {
    /// Records published: the events and their copies (`--duplicate-every`).
    records: usize,
    publish_eps: f64,
    live_consume_eps: f64,
    rebuild_eps: f64,
    /// CPU of the replay phase, the whole machine's and this process's.
    rebuild_cpu: Option<CpuUse>,
    rebuild_total_secs: f64,
    /// Of the replay phase, the seconds spent building the loaded generation's indexes.
    rebuild_index_secs: Option<f64>,
    raw_insert_eps: f64,
    raw_consume_eps: f64,
    /// CPU of the raw consume: what receiving the records costs before any decoding or writing.
    raw_consume_cpu: Option<CpuUse>,
    /// The server's cheapest write of the same documents (`rebuild_floor`).
    write_floor: WriteFloor,
    /// Decoding a record, the replay's way and the least any reader does (`decode_floor`).
    decode: DecodeCost,
    /// Where the records were: the mock cluster or a bootstrap list.
    broker: String,
}

pub async fn run(args: RebuildBenchArgs) -> anyhow::Result<ExitCode> {
    let args = &args;
    on_scratch_postgres(
        args.database.url.as_ref(),
        |url| async move { measure(args, &url).await },
        |f: Figures| {
            if args.json {
                println!("{}", serde_json::to_string_pretty(&f.to_json(args))?);
            } else {
                f.print(args);
            }
            Ok(())
        },
    )
    .await
}

/// Of a chunk of events starting at `from`, the ones published again: every
/// `every`-th event of the run (none when `every` is 0).
fn duplicates(chunk: &[OutboxEvent], from: usize, every: u32) -> Vec<OutboxEvent> {
    let every = every as usize;
    if every == 0 {
        return Vec::new();
    }
    chunk.iter().enumerate().filter(|(i, _)| (from + i) % every == 0).map(|(_, e)| e.clone()).collect()
}

fn events(topic: &str, run: &str, from: usize, to: usize) -> anyhow::Result<Vec<OutboxEvent>> {
    (from..to)
        .map(|i| {
            let data = workload::completion(run, i);
            Ok(OutboxEvent::new(topic, &data.job_id, &data, Utc::now())?)
        })
        .collect()
}

async fn measure(args: &RebuildBenchArgs, url: &str) -> anyhow::Result<Figures> {
    let n = args.events as usize;
    let db = Db::connect_and_migrate(url).await?;
    let run = uuid::Uuid::now_v7().simple().to_string()[24..].to_owned();
    let topics = Topics::with_prefix(&format!("bench-{run}"));
    let broker = BenchBroker::start(&args.kafka, &topics.all(), args.partitions).await?;
    let kafka = broker.kafka.clone();
    let producer = workload::producer(&kafka)?;

    let started = Instant::now();
    let mut records = 0;
    for from in (0..n).step_by(CHUNK) {
        let chunk = events(&topics.events, &run, from, (from + CHUNK).min(n))?;
        let again = duplicates(&chunk, from, args.duplicate_every);
        workload::publish(&producer, &chunk).await?;
        workload::publish(&producer, &again).await?;
        records += chunk.len() + again.len();
    }
    let publish_eps = records as f64 / started.elapsed().as_secs_f64();
    eprintln!("published {n} events, {records} records ({publish_eps:.0}/s)");

    let mark = CpuMark::now();
    let raw_consume_eps = raw_consume(&kafka, &topics.events, records).await?;
    let raw_consume_cpu = mark.and_then(|m| m.used());
    eprintln!("raw consume: {raw_consume_eps:.0}/s");
    let decode = decode_cost(&events(&topics.events, &run, 0, n.min(DECODE_SAMPLE))?)?;
    eprintln!("decode: {:.2} µs/record the replay's way, {:.2} at least", decode.herald_us, decode.floor_us);

    let group_prefix = format!("bench-{run}");
    let live_consume_eps = live_consume(&db, &kafka, &topics.events, &group_prefix, n, records).await?;
    eprintln!("live search subscription: {live_consume_eps:.0}/s");

    settle(&db).await?;
    let Replay { eps: rebuild_eps, cpu: rebuild_cpu, total_secs: rebuild_total_secs, index_secs: rebuild_index_secs } =
        replay(&db, &kafka, &topics.events, args).await?;
    eprintln!("rebuild replay: {rebuild_eps:.0}/s");

    settle(&db).await?;
    let mut raw_secs = 0.0;
    for from in (0..n).step_by(CHUNK) {
        let chunk = events(&topics.events, &run, from, (from + CHUNK).min(n))?;
        let eps = raw_insert(&db, &chunk, &format!("{run}-{from}"), 1000, 2).await?;
        raw_secs += chunk.len() as f64 / eps;
    }
    let raw_insert_eps = n as f64 / raw_secs;
    eprintln!("raw batched insert: {raw_insert_eps:.0}/s");
    let write_floor = write_floor(&db, &format!("{run}-floor"), n).await?;
    eprintln!("write floor: {:.0}/s", n as f64 / write_floor.secs);
    db.close().await;
    let described = broker.describe();
    broker.finish().await?;
    Ok(Figures {
        records,
        publish_eps,
        live_consume_eps,
        rebuild_eps,
        rebuild_cpu,
        rebuild_total_secs,
        rebuild_index_secs,
        raw_insert_eps,
        raw_consume_eps,
        raw_consume_cpu,
        write_floor,
        decode,
        broker: described,
    })
}

/// Vacuums and analyzes the run's database, untimed, so the rows the last
/// phase wrote are not vacuumed during the next one's measurement: the live
/// subscription's million inbox rows and documents during the replay, the
/// replayed generation during the raw insert and the write floor. Left to
/// autovacuum, that work landed in whichever phase was running a minute
/// later (BENCHMARKS.md, "The btrees give the GIN its core").
async fn settle(db: &Db) -> anyhow::Result<()> {
    sqlx::query("VACUUM (ANALYZE)").execute(db.pool()).await?;
    Ok(())
}

/// The live search subscription (defaults: batches of 1000, 2 lanes) until
/// it handled all `records` (`n` events, the rest their copies); timed from
/// its first commit to its last.
async fn live_consume(db: &Db, kafka: &KafkaConfig, topic: &str, group_prefix: &str, n: usize, records: usize) -> anyhow::Result<f64> {
    let sub = Subscription::new(search::SUBSCRIPTION, group_prefix, kafka, &[topic]);
    let eps = timed_search_subscription(db, &sub, SubscriptionOptions::default(), records, Duration::from_secs(3600)).await?;
    let applied = inbox::count(db, search::SUBSCRIPTION).await?;
    anyhow::ensure!(applied == n as i64, "live inbox holds {applied} events, expected {n}");
    Ok(eps)
}

/// Times the replay phase of a real rebuild: from "replaying" to the phase
/// after "indexing" (verifying), so the generation is readable at its end.
#[derive(Default)]
struct Clock {
    replay_started: Option<Instant>,
    replay_ended: Option<Instant>,
    /// When the loaded generation's indexes began to be built: the replay's
    /// wall time splits into loading and indexing.
    indexing_started: Option<Instant>,
    replayed: u64,
    cpu_from: Option<CpuMark>,
    cpu: Option<CpuUse>,
}

impl Progress for Clock {
    fn phase(&mut self, message: &str) {
        if message.contains("replaying") {
            self.replay_started = Some(Instant::now());
            self.cpu_from = CpuMark::now();
        } else if message.contains("indexing") {
            // The loaded generation is not readable before its indexes:
            // their build counts as replay time.
            self.indexing_started = Some(Instant::now());
        } else if self.replay_started.is_some() && self.replay_ended.is_none() {
            self.replay_ended = Some(Instant::now());
            self.cpu = self.cpu_from.and_then(|m| m.used());
        }
    }

    fn replayed(&mut self, progress: ReplayProgress) {
        self.replayed = progress.done;
    }
}

/// The replay phase's events/s, CPU and index build, and the whole rebuild's seconds.
struct Replay {
    eps: f64,
    cpu: Option<CpuUse>,
    total_secs: f64,
    index_secs: Option<f64>,
}

async fn replay(db: &Db, kafka: &KafkaConfig, topic: &str, args: &RebuildBenchArgs) -> anyhow::Result<Replay> {
    let options = RebuildOptions {
        kafka: kafka.clone(),
        topic: topic.to_owned(),
        switch: SwitchMode::Auto,
        batch: args.batch as usize,
        ..RebuildOptions::default()
    };
    let mut clock = Clock::default();
    let started = Instant::now();
    let report = rebuild::rebuild(db, &Search, &options, &mut clock, &CancellationToken::new()).await?;
    let total = started.elapsed().as_secs_f64();
    anyhow::ensure!(report.switched && report.documents == Some(i64::from(args.events)), "rebuild did not end as expected: {report:?}");
    let (Some(t0), Some(t1)) = (clock.replay_started, clock.replay_ended) else { anyhow::bail!("replay phase not seen") };
    Ok(Replay {
        eps: clock.replayed as f64 / (t1 - t0).as_secs_f64(),
        cpu: clock.cpu,
        total_secs: total,
        index_secs: clock.indexing_started.map(|i| (t1 - i).as_secs_f64()),
    })
}

impl Figures {
    fn to_json(&self, args: &RebuildBenchArgs) -> serde_json::Value {
        json!({
            "events": args.events, "partitions": args.partitions, "batch": args.batch, "broker": self.broker,
            "duplicate_every": args.duplicate_every, "records": self.records,
            "rebuild_eps": self.rebuild_eps.round(),
            "raw_consume_eps": self.raw_consume_eps.round(),
            "rebuild_vs_raw_consume": round2(self.rebuild_eps / self.raw_consume_eps),
            "live_consume_eps": self.live_consume_eps.round(),
            "raw_insert_eps": self.raw_insert_eps.round(),
            "publish_eps": self.publish_eps.round(),
            "rebuild_total_secs": (self.rebuild_total_secs * 10.0).round() / 10.0,
            "rebuild_index_secs": self.rebuild_index_secs.map(round2),
            "rebuild_vs_live": round2(self.rebuild_eps / self.live_consume_eps),
            "rebuild_vs_raw_insert": round2(self.rebuild_eps / self.raw_insert_eps),
            "target_eps": TARGET_EPS,
            "meets_target": self.meets_target(),
            "rebuild_cpu": self.rebuild_cpu.map(|c| c.to_json(self.records as u64)),
            "raw_consume_cpu": self.raw_consume_cpu.map(|c| c.to_json(self.records as u64)),
            "write_floor_eps": (f64::from(args.events) / self.write_floor.secs).round(),
            "write_floor_index_secs": round2(self.write_floor.index_secs),
            "write_floor_cpu": self.write_floor.cpu.map(|c| c.to_json(u64::from(args.events))),
            "replay_ceiling_eps": self.replay_ceiling_eps(0.0).map(f64::round),
            "herald_decode_us": round2(self.decode.herald_us),
            "decode_floor_us": round2(self.decode.floor_us),
            "replay_ceiling_decoded_eps": self.replay_ceiling_eps(self.decode.floor_us).map(f64::round),
            "write_floor_copy_us": self.write_floor.copy_cpu.map(|c| round2(c.us_per_event(u64::from(args.events)))),
            "replay_ceiling_in_order_eps": self.replay_ceiling_in_order_eps().map(f64::round),
        })
    }

    fn print(&self, args: &RebuildBenchArgs) {
        println!(
            "herald bench rebuild — {} events, PostgreSQL + Kafka ({}, {} partitions), replay batches of {}\n",
            args.events, self.broker, args.partitions, args.batch
        );
        println!("  {:<72} {:>10} {:>12}", "measurement", "events/s", "÷ raw insert");
        let row = |name: &str, eps: f64| println!("  {:<72} {:>10.0} {:>12.2}", name, eps, eps / self.raw_insert_eps);
        row("raw consume: receive the records, nothing else (raw rdkafka client)", self.raw_consume_eps);
        row("raw batched insert: inbox row + document per event", self.raw_insert_eps);
        row("live search subscription: decode, inbox, document, offsets", self.live_consume_eps);
        row("rebuild replay (engine): read, decode, document, positions", self.rebuild_eps);
        row("write floor: the same documents in one COPY, the seal's indexes built once", f64::from(args.events) / self.write_floor.secs);
        println!(
            "\n  target ≥ {TARGET_EPS:.0} events/s and ≥ {TARGET_VS_RAW_INSERT} × raw insert: {}   (whole rebuild incl. verify and switch: {:.1} s; publish: {:.0} events/s)",
            if self.meets_target() { "met" } else { "NOT met" },
            self.rebuild_total_secs,
            self.publish_eps
        );
        if let Some(secs) = self.rebuild_index_secs {
            println!("  building the indexes took {secs:.2} s of the replay, {:.2} s of the write floor", self.write_floor.index_secs);
        }
        let (records, documents) = (self.records as u64, u64::from(args.events));
        for (name, cpu, per) in [
            ("raw consume", self.raw_consume_cpu, records),
            ("replay", self.rebuild_cpu, records),
            ("write floor", self.write_floor.cpu, documents),
        ] {
            let Some(cpu) = cpu else { continue };
            println!("  {}", cpu.line(name, per, "this process with the mock cluster", "others: PostgreSQL"));
        }
        println!(
            "  decoding one record, one thread: {:.2} µs the replay's way, {:.2} µs at least (headers as text, the Avro datum parsed)",
            self.decode.herald_us, self.decode.floor_us
        );
        if let (Some(ceiling), Some(decoded)) = (self.replay_ceiling_eps(0.0), self.replay_ceiling_eps(self.decode.floor_us)) {
            println!(
                "  receiving and writing at their cheapest with every core busy, a replay could reach at most {ceiling:.0} events/s here; \
                 decoding at its least too, {decoded:.0}"
            );
        }
        if let Some(in_order) = self.replay_ceiling_in_order_eps() {
            println!(
                "  and with the indexes built after the last document, as they must be: at most {in_order:.0} events/s \
                 (receiving, the least decode and the COPY spread over every core, then the write floor's {:.2} s of builds)",
                self.write_floor.index_secs
            );
        }
    }

    fn meets_target(&self) -> bool {
        self.rebuild_eps >= TARGET_EPS && self.rebuild_eps >= TARGET_VS_RAW_INSERT * self.raw_insert_eps
    }

    /// The most any replay could reach on this machine, in records a
    /// second: every core busy on nothing but receiving the records (the raw
    /// consume's CPU per record), `decode_us` per record, and the server's
    /// cheapest write of the documents (the write floor's, spread over the
    /// records: a record's copy need not be written twice).
    fn replay_ceiling_eps(&self, decode_us: f64) -> Option<f64> {
        let (receive, write) = (self.raw_consume_cpu?, self.write_floor.cpu?);
        let records = self.records as u64;
        let per_record = receive.us_per_event(records) + decode_us + write.us_per_event(records);
        Some(write.cpus as f64 * 1e6 / per_record.max(f64::MIN_POSITIVE))
    }

    /// The most any replay could reach here in the order a replay must
    /// work: a generation's indexes are built over all its documents, so
    /// only after the last one is in, and PostgreSQL 15 builds a GIN in one
    /// process. Receiving, the least decode and the COPY (the write floor's
    /// CPU for it) spread over every core, then the write floor's builds
    /// for as long as they took.
    fn replay_ceiling_in_order_eps(&self) -> Option<f64> {
        let (receive, copy) = (self.raw_consume_cpu?, self.write_floor.copy_cpu?);
        let records = self.records as u64;
        let load_us = receive.us_per_event(records) + self.decode.floor_us + copy.us_per_event(records);
        Some(in_order_ceiling_eps(records, copy.cpus, load_us, self.write_floor.index_secs))
    }
}

/// `events` loaded at `load_us` of CPU each with `cpus` cores all busy,
/// then indexes built for `build_secs`: events per second of the whole.
fn in_order_ceiling_eps(events: u64, cpus: usize, load_us: f64, build_secs: f64) -> f64 {
    let load_secs = load_us * events as f64 / 1e6 / cpus.max(1) as f64;
    events as f64 / (load_secs + build_secs).max(f64::MIN_POSITIVE)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::{duplicates, events, in_order_ceiling_eps};

    #[test]
    fn every_kth_event_of_the_run_is_published_again_unchanged() {
        let chunk = events("t", "r", 10, 20).unwrap();
        let again = duplicates(&chunk, 10, 4);
        let ids: Vec<&str> = again.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, [chunk[2].id.as_str(), chunk[6].id.as_str()], "events 12 and 16 of the run");
        assert!(duplicates(&chunk, 10, 0).is_empty());
    }

    #[test]
    fn the_in_order_ceiling_spreads_the_load_over_the_cores_then_adds_the_builds() {
        // 1M events at 4 µs on 2 cores load in 2 s; 3 s of builds after: 5 s.
        assert!((in_order_ceiling_eps(1_000_000, 2, 4.0, 3.0) - 200_000.0).abs() < 1e-6);
        // The builds are not spread: doubling the cores halves the load only.
        assert!((in_order_ceiling_eps(1_000_000, 4, 4.0, 3.0) - 250_000.0).abs() < 1e-6);
    }
}
