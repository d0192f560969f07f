//! What the demo counts, from the database (through `herald_status::counts`)
//! and from Kafka itself.

use std::time::{Duration, Instant};

use herald_export::lifecycle::SUCCEEDED;
use herald_kafka::KafkaConfig;
use herald_status::counts;
use herald_store::{Db, outbox};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

impl Check {
    pub fn new(name: &str, ok: bool, detail: String) -> Check {
        Check { name: name.to_owned(), ok, detail }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub exports_requested: i64,
    pub jobs_created: i64,
    pub jobs_succeeded: i64,
    /// Completion rows the relay marked delivered.
    pub completion_events: i64,
    /// Records on the events topic, read from the broker's watermarks.
    pub kafka_event_records: i64,
    pub search_documents: i64,
    pub search_inbox_rows: i64,
    /// Effects applied more than once: extra completion events per job plus
    /// search documents beyond one per succeeded job.
    pub duplicate_effects: i64,
}

impl Counts {
    pub async fn gather(db: &Db, kafka: &KafkaConfig, topics: &herald_kafka::Topics) -> anyhow::Result<Counts> {
        let tables = counts::collect(db).await?;
        let jobs_succeeded = tables.jobs.of(SUCCEEDED);
        let search_documents = herald_projections::search::count_active(db).await?;
        Ok(Counts {
            exports_requested: tables.export_intents,
            jobs_created: tables.jobs.total(),
            jobs_succeeded,
            completion_events: tables.completions.delivered,
            kafka_event_records: kafka_records(kafka, &topics.events).await?,
            search_documents,
            search_inbox_rows: tables.inbox.of(herald_projections::search::SUBSCRIPTION),
            duplicate_effects: tables.completions.beyond_first + (search_documents - jobs_succeeded).max(0),
        })
    }

    pub fn checks(&self, n: i64) -> Vec<Check> {
        let eq = |name: &str, got: i64, want: i64| Check::new(name, got == want, format!("{got} (want {want})"));
        vec![
            eq("jobs created", self.jobs_created, n),
            eq("jobs succeeded", self.jobs_succeeded, n),
            eq("completion events delivered", self.completion_events, n),
            eq("completion records in Kafka", self.kafka_event_records, n),
            eq("search documents", self.search_documents, n),
            eq("search inbox rows", self.search_inbox_rows, n),
            eq("duplicate effects", self.duplicate_effects, 0),
        ]
    }
}

/// Records `topic` retains: the sum of its partitions' high minus low watermarks.
async fn kafka_records(kafka: &KafkaConfig, topic: &str) -> anyhow::Result<i64> {
    Ok(herald_kafka::offsets::watermarks(kafka, topic).await?.iter().map(|m| m.high - m.low).sum())
}

/// Polls until every job succeeded, its event is delivered and its search
/// document exists, or `timeout` passes. Polling is the demo's way to watch
/// an asynchronous pipeline from outside; no correctness depends on it.
pub async fn wait_settled(db: &Db, n: i64, timeout: Duration) -> anyhow::Result<bool> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let tables = counts::collect(db).await?;
        let (succeeded, pending) = (tables.jobs.of(SUCCEEDED), tables.outbox.of(outbox::PENDING));
        let docs = herald_projections::search::count_active(db).await?;
        if succeeded >= n && docs >= n && pending == 0 {
            return Ok(true);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(false)
}

pub fn print_table(checks: &[Check], counts: &Counts, repeated: usize) {
    println!("herald demo — embedded default (SQLite + in-process Kafka)\n");
    println!("  {:<34} {:>8}", "exports requested", counts.exports_requested);
    println!("  {:<34} {:>8}", "repeated requests (same key)", repeated);
    println!("  {:<34} {:>8}", "jobs created", counts.jobs_created);
    println!("  {:<34} {:>8}", "jobs succeeded", counts.jobs_succeeded);
    println!("  {:<34} {:>8}", "completion events published", counts.completion_events);
    println!("  {:<34} {:>8}", "records on export.events", counts.kafka_event_records);
    println!("  {:<34} {:>8}", "search documents", counts.search_documents);
    println!("  {:<34} {:>8}\n", "duplicate effects", counts.duplicate_effects);
    for check in checks {
        println!("  [{}] {:<44} {}", if check.ok { " ok " } else { "FAIL" }, check.name, check.detail);
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    println!("\n{} passed, {} failed", checks.len() - failed, failed);
}
