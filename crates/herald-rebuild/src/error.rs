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
    /// Live traffic did not pass the boundary in time (is the live
    /// subscription running?): rerun later; the generation waits in
    /// `catching_up` and keeps receiving live writes.
    #[error("live subscription is still behind the boundary after {0:?}: {1}")]
    CatchUpTimeout(std::time::Duration, String),
}
