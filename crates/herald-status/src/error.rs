use thiserror::Error;

/// Why figures could not be collected.
#[derive(Debug, Error)]
pub enum StatusError {
    /// The database failed; what to do is in the store error's class
    /// (unavailable: retry on the next refresh; config: fix the URL).
    #[error(transparent)]
    Store(#[from] herald_store::StoreError),
    /// The broker did not answer or the client could not be built: the
    /// database figures still stand; lag is reported as unknown. Retry on
    /// the next refresh.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// A blocking broker call panicked or was cancelled: retry.
    #[error("kafka probe thread: {0}")]
    Probe(String),
    /// The Prometheus recorder could not be built (bad bucket list): a
    /// defect, fix the code.
    #[error("prometheus recorder: {0}")]
    Recorder(String),
}

impl From<sqlx::Error> for StatusError {
    fn from(e: sqlx::Error) -> Self {
        StatusError::Store(e.into())
    }
}
