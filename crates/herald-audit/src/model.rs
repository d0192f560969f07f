//! The evidence an audit compares, as plain data. Adapters fill it; checks
//! only read it.

use std::collections::{BTreeMap, BTreeSet};

pub use herald_store::prune::{Horizons, Kind};

/// Event types the checks reason about.
pub const COMPLETED: &str = "herald.export.completed";
pub const DELETED: &str = "herald.export.deleted";
pub const REQUESTED: &str = "herald.export.requested";
/// Job status of a finished, successful export.
pub const SUCCEEDED: &str = "succeeded";
/// Job status after its owner deleted it.
pub const JOB_DELETED: &str = "deleted";
/// Intent status of a notification the provider gave a receipt for.
pub const SENT: &str = "sent";
/// Subscription the stats counters belong to.
pub const STATS: &str = "stats";
/// Subscription that writes notification intents.
pub const NOTIFY: &str = "notify";

/// Subscriptions that apply `herald.export.completed`, each with its own
/// inbox scope. Rebuild scopes (`search@g<N>`) are a replay's, not a
/// subscription's, and are not checked here.
pub const COMPLETION_SUBSCRIPTIONS: [&str; 3] = ["search", "stats", "notify"];

/// One outbox row. `commit_rank` orders the rows of the table in commit
/// order as the relay reads it: `(xid, seq)` on PostgreSQL, `seq` on SQLite
/// (whose single writer commits in sequence order; a redrive re-appends).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub seq: i64,
    pub commit_rank: usize,
    pub source: String,
    pub event_id: String,
    pub event_type: String,
    pub subject: String,
    pub topic: String,
    pub partition_key: String,
    pub status: String,
    /// The event's `time`: every row about the event is dated after it,
    /// which is what places the event against a prune horizon.
    pub event_time_ms: i64,
}

impl OutboxRow {
    pub fn delivered(&self) -> bool {
        self.status == "delivered"
    }
}

/// One record of a Herald topic, in the order the partition holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: String,
    /// CloudEvents `source` / `id` headers; empty when the record has none.
    pub source: String,
    pub event_id: String,
    /// The record's timestamp (the relay's clock when it produced it).
    pub timestamp_ms: Option<i64>,
}

/// The history of the topics as read, plus where a partition no longer
/// starts at offset 0 (retention removed its beginning).
#[derive(Debug, Clone, Default)]
pub struct KafkaHistory {
    pub records: Vec<KafkaRecord>,
    /// (topic, partition) → first retained offset, when it is not 0.
    pub truncated: BTreeMap<(String, i32), i64>,
}

/// An inbox row: a fact a subscription applied, and the record (topic,
/// partition, offset) it was applied from — a dead letter's own position
/// when a redrive applied it.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct InboxRow {
    pub subscription: String,
    pub source: String,
    pub event_id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Job {
    pub job_id: String,
    pub caller: String,
    pub status: String,
    pub result_id: Option<String>,
    pub format: String,
    pub query: String,
    pub created_at_ms: i64,
    pub completed_at_ms: Option<i64>,
}

/// An intake key (`export_intents`): the job it created and the fingerprint
/// of the parameters it was accepted with.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct IntakeKey {
    pub caller: String,
    pub operation: String,
    pub key: String,
    pub fingerprint: String,
    pub job_id: String,
}

/// A row of the active search generation: a document, or the tombstone a
/// delete left (which reads skip).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDocument {
    pub job_id: String,
    pub caller: String,
    pub result_id: String,
    pub tombstone: bool,
}

/// A completion event's data, decoded from its outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub source: String,
    pub event_id: String,
    pub job_id: String,
    pub caller: String,
    pub format: String,
    pub completed_at_ms: i64,
    pub size_bytes: i64,
    /// The outbox row's event time.
    pub event_time_ms: i64,
}

/// One row of `stats_counters`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct StatsCounter {
    pub day: String,
    pub caller: String,
    pub format: String,
    pub exports: i64,
    pub bytes: i64,
}

/// A dead letter, without its bytes: whether it still holds a record to
/// redrive is enough for the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    pub id: i64,
    pub subscription: String,
    /// Identity, when the record decoded far enough to have one.
    pub source: Option<String>,
    pub event_id: Option<String>,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub status: String,
    /// A value or headers are kept: there is something to redrive.
    pub holds_record: bool,
    pub created_at_ms: i64,
}

/// A registered candidate artifact (`export_artifacts`).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ArtifactRow {
    pub result_id: String,
    pub job_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Intent {
    pub key: String,
    pub status: String,
    /// The completion it notifies of, and to whom.
    pub source: String,
    pub event_id: String,
    pub recipient: String,
    pub job_id: String,
}

/// What the database holds.
#[derive(Debug, Clone, Default)]
pub struct DbEvidence {
    pub outbox: Vec<OutboxRow>,
    pub inbox: Vec<InboxRow>,
    pub jobs: Vec<Job>,
    pub intake_keys: Vec<IntakeKey>,
    pub active_generation: i64,
    /// The active generation's rows, tombstones included.
    pub search_documents: Vec<SearchDocument>,
    pub artifacts: Vec<ArtifactRow>,
    pub intents: Vec<Intent>,
    /// Every completion event of the outbox whose data decoded.
    pub completions: Vec<Completion>,
    /// Completion rows whose data did not decode: outbox seq and why.
    pub undecodable_completions: Vec<(i64, String)>,
    pub stats_counters: Vec<StatsCounter>,
    pub dead_letters: Vec<DeadLetter>,
    /// How far down a prune may have removed rows (each already widened by
    /// the clock skew the audit allows between hosts): facts below are
    /// not checked.
    pub horizons: Horizons,
}

/// Everything an audit looks at. `None` means that source was not given and
/// the checks that need it say so instead of passing.
#[derive(Debug, Clone, Default)]
pub struct Evidence {
    pub db: DbEvidence,
    pub kafka: KafkaHistory,
    /// Selected result ids the artifact store holds (of those asked about).
    pub stored_artifacts: Option<BTreeSet<String>>,
    /// Effects the provider executed, per idempotency key (`""` for none).
    pub provider_effects: Option<BTreeMap<String, i64>>,
}
