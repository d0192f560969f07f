use herald_store::StoreError;
use rdkafka::error::KafkaError;
use thiserror::Error;

/// What stopped a relay pass.
#[derive(Debug, Error)]
pub enum RelayError {
    /// Reading or marking rows failed: retry the pass; unmarked rows are
    /// republished, which the inboxes absorb.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The producer could not be created: fix the broker configuration.
    #[error("kafka producer: {0}")]
    Producer(KafkaError),
}
