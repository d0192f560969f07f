//! `herald bench status`: how long one status refresh takes on PostgreSQL
//! once the tables are big — by default 10M outbox rows (1,000 of them
//! pending), 1M notification intents, 1M jobs, 3M inbox rows and 1M search
//! documents — in total and per part, over repeated refreshes. Rows are
//! written by `generate_series` (the figures are about reading them), then
//! vacuumed and analysed as a database that has been running would be.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;
use herald_status::counting::Reading;
use herald_status::queries;
use herald_store::Db;
use serde_json::json;

use crate::scratch::on_scratch_postgres;

#[derive(Debug, Clone, Args)]
pub struct StatusBenchArgs {
    /// Outbox rows (all but 1,100 delivered: 1,000 pending, 100 set aside).
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(10_000..=100_000_000))]
    pub outbox: u64,
    /// Notification intents, and as many jobs and search documents (three
    /// inbox rows each, one per subscription).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1_000..=20_000_000))]
    pub intents: u64,
    /// Timed refreshes.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub refreshes: u32,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// A PostgreSQL server; a scratch database is created on it and dropped.
    #[command(flatten)]
    pub database: herald_wiring::connection::DatabaseArgs,
}

/// The refresh time the issue asks for at 10M outbox rows and 1M intents.
const TARGET_MS: f64 = 50.0;
const SUBSCRIPTIONS: [&str; 3] = ["search", "stats", "notify"];
/// Outbox rows still to publish, and rows set aside for an operator.
const BACKLOG: i64 = 1_000;
const SET_ASIDE: i64 = 100;
/// Refreshes the way they were taken before issue 19 (whole-table scans),
/// for the ratio in the same run.
const BASELINE_REFRESHES: usize = 3;
/// The parts of a refresh, in the order `queries::collect` takes them.
const PARTS: [&str; 6] = ["outbox", "relay", "subscriptions", "notifications", "jobs", "generations"];

struct Figures {
    fill_secs: f64,
    /// Whole-table scans, as a refresh was taken before.
    baseline: Vec<Duration>,
    /// Per refresh: each part's time, in `PARTS` order.
    refreshes: Vec<[Duration; 6]>,
}

pub async fn run(args: StatusBenchArgs) -> anyhow::Result<ExitCode> {
    let emit_args = args.clone();
    on_scratch_postgres(args.database.url.clone().as_ref(), |url| measure(args, url), |f| emit(&emit_args, &f)).await
}

async fn measure(args: StatusBenchArgs, url: String) -> anyhow::Result<Figures> {
    let db = Db::connect_and_migrate(&url).await?;
    let started = Instant::now();
    fill(&db, &args).await?;
    let fill_secs = started.elapsed().as_secs_f64();
    let mut refreshes = Vec::with_capacity(args.refreshes as usize);
    for _ in 0..args.refreshes {
        refreshes.push(refresh(&db).await?);
    }
    check(&db, &args).await?;
    let mut baseline = Vec::with_capacity(BASELINE_REFRESHES);
    for _ in 0..BASELINE_REFRESHES {
        baseline.push(whole_table_refresh(&db).await?);
    }
    db.close().await;
    Ok(Figures { fill_secs, baseline, refreshes })
}

/// One refresh's database part, as `queries::collect` takes it (one
/// [`Reading`]), timed per part.
async fn refresh(db: &Db) -> anyhow::Result<[Duration; 6]> {
    let now = herald_store::now_ms();
    let mut times = [Duration::ZERO; 6];
    let mut lap = Instant::now();
    let mut mark = |i: usize| {
        times[i] = lap.elapsed();
        lap = Instant::now();
    };
    let mut reading = Reading::begin(db).await?;
    queries::outbox(&mut reading, now).await?;
    mark(0);
    queries::relay_claims(&mut reading).await?;
    mark(1);
    queries::subscription_rows(&mut reading, &SUBSCRIPTIONS, now).await?;
    mark(2);
    queries::notifications(&mut reading).await?;
    mark(3);
    queries::jobs(&mut reading, now).await?;
    mark(4);
    queries::generations(&mut reading).await?;
    reading.finish().await?;
    mark(5);
    Ok(times)
}

/// The figures a refresh takes are the rows the fill wrote: a fast wrong
/// answer is no answer.
async fn check(db: &Db, args: &StatusBenchArgs) -> anyhow::Result<()> {
    let status = queries::collect(db, &SUBSCRIPTIONS, herald_store::now_ms()).await?;
    let thousandth = args.intents as i64 / 1000;
    let taken = (status.outbox.pending, status.outbox.failed, status.notifications.unknown, status.jobs.open, status.jobs.latency.samples);
    let written =
        (BACKLOG, SET_ASIDE, thousandth, thousandth, (args.intents as usize - thousandth as usize).min(queries::LATENCY_SAMPLE as usize));
    anyhow::ensure!(
        taken == written,
        "the refresh took (pending, set aside, unknown, open jobs, latency samples) = {taken:?}; the fill wrote {written:?}"
    );
    Ok(())
}

/// Rows as a running system leaves them: the delivered rows behind each
/// slice's relay cursor (set to the snapshot after them, as a relay's
/// progress write does), then the backlog and a few rows set aside.
async fn fill(db: &Db, args: &StatusBenchArgs) -> anyhow::Result<()> {
    let (delivered, n) = (args.outbox as i64 - BACKLOG - SET_ASIDE, args.intents as i64);
    let outbox_rows = |from: i64, to: i64, status: &str| {
        format!(
            "INSERT INTO outbox (event_id, source, event_type, subject, event_time_ms, schema_file, data, topic, partition_key, \
             status, created_at_ms, delivered_at_ms, slice) \
             SELECT 'e-' || i, '/herald/exports', 'export.completed', 'job-' || (i % {n}), 0, 'f', '\\x00'::bytea, 'herald.export.events', \
             'job-' || (i % {n}), '{status}', i, CASE WHEN '{status}' = 'delivered' THEN i END, i % 16 FROM generate_series({from}, {to}) AS i"
        )
    };
    let statements = [
        outbox_rows(1, delivered, "delivered"),
        "UPDATE relay_slices SET cursor_lo = CAST(pg_current_snapshot() AS TEXT)".to_owned(),
        outbox_rows(delivered + 1, delivered + BACKLOG, "pending"),
        outbox_rows(delivered + BACKLOG + 1, delivered + BACKLOG + SET_ASIDE, "failed"),
        "INSERT INTO outbox_set_aside (seq, status, created_at_ms) SELECT seq, status, created_at_ms FROM outbox WHERE status = 'failed'"
            .to_owned(),
        format!(
            "INSERT INTO notification_intents (idempotency_key, source, event_id, recipient, kind, job_id, body, status, created_at_ms, updated_at_ms) \
             SELECT 'k-' || i, '/herald/exports', 'e-' || i, 'r', 'export.completed', 'job-' || i, '{{}}', \
             CASE WHEN i % 1000 = 0 THEN 'unknown' WHEN i % 997 = 0 THEN 'pending' ELSE 'sent' END, i, i FROM generate_series(1, {n}) AS i"
        ),
        format!(
            "INSERT INTO export_jobs (job_id, caller, format, query, status, version, created_at_ms, updated_at_ms, completed_at_ms) \
             SELECT 'job-' || i, 'c-' || (i % 100), 'csv', 'q', CASE WHEN i % 1000 = 0 THEN 'running' ELSE 'succeeded' END, 2, i, i + 5, \
             CASE WHEN i % 1000 = 0 THEN NULL ELSE i + 5 END FROM generate_series(1, {n}) AS i"
        ),
        format!(
            "INSERT INTO inbox (subscription, source, event_id, event_type, topic, kafka_partition, kafka_offset, processed_at_ms) \
             SELECT s, '/herald/exports', 'e-' || i, 'export.completed', 'herald.export.events', i % 4, i, i \
             FROM generate_series(1, {n}) AS i, unnest(ARRAY['search', 'stats', 'notify']) AS s"
        ),
        format!(
            "INSERT INTO search_documents (generation, job_id, caller, format, query, result_id, size_bytes, completed_at_ms, version) \
             SELECT 1, 'job-' || i, 'c-' || (i % 100), 'csv', 'q ' || i, 'r', 1, i, 2 FROM generate_series(1, {n}) AS i"
        ),
        "VACUUM ANALYZE".to_owned(),
    ];
    for sql in &statements {
        sqlx::query(sql).execute(db.pool()).await?;
    }
    Ok(())
}

/// The statements a refresh ran before issue 19, each over its whole table:
/// the baseline measured in the same run.
const WHOLE_TABLE_SCANS: [&str; 5] = [
    "SELECT status, COUNT(*) AS n, MIN(created_at_ms) AS oldest FROM outbox WHERE status <> 'delivered' GROUP BY status",
    "SELECT subscription AS k, COUNT(*) AS n FROM inbox GROUP BY subscription",
    "SELECT status AS k, COUNT(*) AS n FROM notification_intents GROUP BY status",
    "SELECT status, COUNT(*) AS n, MIN(created_at_ms) AS oldest FROM export_jobs GROUP BY status",
    "SELECT generation, COUNT(*) AS n FROM search_documents GROUP BY generation",
];

async fn whole_table_refresh(db: &Db) -> anyhow::Result<Duration> {
    let started = Instant::now();
    for sql in WHOLE_TABLE_SCANS {
        sqlx::query(sql).fetch_all(db.pool()).await?;
    }
    Ok(started.elapsed())
}

fn percentile_ms(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn emit(args: &StatusBenchArgs, f: &Figures) -> anyhow::Result<()> {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut totals: Vec<f64> = f.refreshes.iter().map(|parts| parts.iter().copied().map(ms).sum()).collect();
    totals.sort_by(f64::total_cmp);
    let part = |i: usize| {
        let mut v: Vec<f64> = f.refreshes.iter().map(|p| ms(p[i])).collect();
        v.sort_by(f64::total_cmp);
        (percentile_ms(&v, 50.0), percentile_ms(&v, 100.0))
    };
    let mut baseline: Vec<f64> = f.baseline.iter().copied().map(ms).collect();
    baseline.sort_by(f64::total_cmp);
    let baseline_p50 = percentile_ms(&baseline, 50.0);
    if args.json {
        let parts: serde_json::Map<String, serde_json::Value> =
            PARTS.iter().enumerate().map(|(i, name)| ((*name).to_owned(), json!({"p50_ms": part(i).0, "max_ms": part(i).1}))).collect();
        let out = json!({
            "outbox_rows": args.outbox, "intents": args.intents, "figures_checked": true, "refreshes": args.refreshes, "fill_secs": f.fill_secs,
            "refresh_p50_ms": percentile_ms(&totals, 50.0), "refresh_max_ms": percentile_ms(&totals, 100.0), "parts": parts,
            "whole_table_scan_p50_ms": baseline_p50, "speedup": baseline_p50 / percentile_ms(&totals, 50.0),
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }
    println!(
        "{} outbox rows, {} intents, {} jobs, {} inbox rows, {} documents; filled and analysed in {:.0} s\n",
        args.outbox,
        args.intents,
        args.intents,
        args.intents * 3,
        args.intents,
        f.fill_secs
    );
    println!("| part of a status refresh | p50 ms | max ms |\n|---|---:|---:|");
    for (i, name) in PARTS.iter().enumerate() {
        let (p50, max) = part(i);
        println!("| {name} | {p50:.1} | {max:.1} |");
    }
    let (p50, max) = (percentile_ms(&totals, 50.0), percentile_ms(&totals, 100.0));
    println!("| **whole refresh** ({} refreshes) | {p50:.1} | {max:.1} |", f.refreshes.len());
    let baseline_max = percentile_ms(&baseline, 100.0);
    println!(
        "| the same figures by whole-table scans, as before issue 19 ({BASELINE_REFRESHES} runs) | {baseline_p50:.1} | {baseline_max:.1} |\n"
    );
    println!("whole-table scans ÷ refresh: {:.0}× (p50s, same run)", baseline_p50 / p50);
    let verdict = if p50 < TARGET_MS { "meets" } else { "misses" };
    println!("refresh p50 {p50:.1} ms: {verdict} the {TARGET_MS:.0} ms target");
    Ok(())
}
