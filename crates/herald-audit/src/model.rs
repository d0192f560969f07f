//! The evidence an audit compares, as plain data. Adapters fill it; checks
//! only read it.

use std::collections::{BTreeMap, BTreeSet};

/// Event types the checks reason about.
pub const COMPLETED: &str = "herald.export.completed";
pub const DELETED: &str = "herald.export.deleted";
/// Job status of a finished, successful export.
pub const SUCCEEDED: &str = "succeeded";
/// Intent status of a notification the provider gave a receipt for.
pub const SENT: &str = "sent";

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
}

/// The history of the topics as read, plus where a partition no longer
/// starts at offset 0 (retention removed its beginning).
#[derive(Debug, Clone, Default)]
pub struct KafkaHistory {
    pub records: Vec<KafkaRecord>,
    /// (topic, partition) → first retained offset, when it is not 0.
    pub truncated: BTreeMap<(String, i32), i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxRow {
    pub subscription: String,
    pub source: String,
    pub event_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub job_id: String,
    pub caller: String,
    pub status: String,
    pub result_id: Option<String>,
}

/// A document of the active search generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDocument {
    pub job_id: String,
    pub caller: String,
    pub result_id: String,
}

/// A registered candidate artifact (`export_artifacts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactRow {
    pub result_id: String,
    pub job_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub key: String,
    pub status: String,
}

/// What the database holds.
#[derive(Debug, Clone, Default)]
pub struct DbEvidence {
    pub outbox: Vec<OutboxRow>,
    pub inbox: Vec<InboxRow>,
    pub jobs: Vec<Job>,
    pub active_generation: i64,
    pub search_documents: Vec<SearchDocument>,
    pub artifacts: Vec<ArtifactRow>,
    pub intents: Vec<Intent>,
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
