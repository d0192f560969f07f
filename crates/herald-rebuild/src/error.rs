use herald_store::StoreError;
use rdkafka::error::KafkaError;
use thiserror::Error;

/// Why a rebuild stopped. Every variant leaves the stored positions intact:
/// running the rebuild again resumes where it stopped.
#[derive(Debug, Error)]
pub enum RebuildError {
    /// The database failed: rerun to resume.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The broker failed or refused: rerun to resume.
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    /// The operation does not fit the generations' states (e.g. switch with
    /// nothing ready): fix the request.
    #[error("{0}")]
    State(String),
    /// The new generation disagrees with the active one: it is marked failed
    /// and reads stay where they are.
    #[error("generation {generation} does not match generation {active}: {detail}")]
    Mismatch { generation: i64, active: i64, detail: String },
    /// Retention removed records the active generation was built from: the
    /// rebuild would silently lose their documents. Reject; rerun with
    /// `--from-snapshot` (a snapshot covering the gap).
    #[error("history incomplete, refusing to rebuild: {}; pass --from-snapshot FILE (from `herald snapshot search`) covering it", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    HistoryGap(Vec<crate::history::Gap>),
    /// The snapshot file is unreadable, corrupted, altered, of another
    /// projection or topic, or does not cover the gap: reject; nothing written.
    #[error("snapshot refused: {0}")]
    Snapshot(String),
    /// The snapshot file could not be read or written: fix the path.
    #[error("snapshot file: {0}")]
    Io(#[from] std::io::Error),
    /// The replay stopped (broker, database, a projection defect): rerun
    /// to resume from the stored positions.
    #[error("replay: {0}")]
    Replay(#[from] herald_consumer::ReplayError),
}
