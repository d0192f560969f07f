use herald_envelope::EnvelopeError;
use herald_store::StoreError;
use thiserror::Error;

/// A handler's verdict on an event it could not apply.
#[derive(Debug, Error)]
pub enum HandlerError {
    /// Infrastructure failed (database down, lock timeout): retry the same
    /// record later; the transaction rolled back so nothing was applied.
    #[error("retryable: {0}")]
    Retryable(String),
    /// The event itself cannot be applied (bad data): retrying gives the same
    /// answer, so the record is set aside and the partition moves on.
    #[error("rejected: {0}")]
    Reject(String),
    /// A plain native write ([`crate::WritePath::Plain`]) met a row already
    /// there: its transaction is lost and nothing of it was applied; apply
    /// the same batch again with [`crate::WritePath::Upsert`]. The engine
    /// does; a handler never needs to return it otherwise.
    #[error("conflict, apply again resolving it: {0}")]
    Conflict(String),
}

impl HandlerError {
    /// The error of a write on the [`crate::WritePath::Plain`] path: a unique
    /// violation is a [`HandlerError::Conflict`], anything else what the store
    /// makes of it.
    pub fn from_plain_write(e: sqlx::Error) -> HandlerError {
        match &e {
            sqlx::Error::Database(db) if db.is_unique_violation() => HandlerError::Conflict(db.message().to_owned()),
            _ => StoreError::from(e).into(),
        }
    }
}

impl From<StoreError> for HandlerError {
    fn from(e: StoreError) -> Self {
        if e.is_retryable() { HandlerError::Retryable(e.to_string()) } else { HandlerError::Reject(e.to_string()) }
    }
}

impl From<EnvelopeError> for HandlerError {
    fn from(e: EnvelopeError) -> Self {
        HandlerError::Reject(e.to_string())
    }
}

/// How processing one record failed, which decides what the runtime does.
#[derive(Debug, Error)]
pub enum ProcessError {
    /// Retry the same record after a backoff; its offset is not committed.
    #[error("retryable: {0}")]
    Retryable(String),
    /// Retrying gives the same answer: after a few tries the record is
    /// dead-lettered (kept, redrivable after a fix) and its offset committed.
    #[error("permanent: {0}")]
    Permanent(String),
}

impl From<HandlerError> for ProcessError {
    fn from(e: HandlerError) -> Self {
        match e {
            HandlerError::Retryable(m) | HandlerError::Conflict(m) => ProcessError::Retryable(m),
            HandlerError::Reject(m) => ProcessError::Permanent(m),
        }
    }
}

impl From<StoreError> for ProcessError {
    fn from(e: StoreError) -> Self {
        HandlerError::from(e).into()
    }
}

/// Why a subscription stopped before its shutdown was requested.
#[derive(Debug, Error)]
pub enum RunError {
    /// The consumer could not be created or subscribed: fix the configuration.
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The database refused the start-up work.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A runtime task failed (a panic while decoding): a defect.
    #[error("internal: {0}")]
    Internal(String),
}

/// Why a replay stopped before it reached its boundary.
#[derive(Debug, Error)]
pub enum ReplayError {
    /// Reading the broker failed: check it and run the rebuild again (it resumes).
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    /// The database failed: run the rebuild again (it resumes).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The projection refused a batch: a defect or bad data, see the reason.
    #[error("projection: {0}")]
    Projection(#[from] HandlerError),
    /// A replay task failed (a panic): a defect.
    #[error("internal: {0}")]
    Internal(String),
}

impl ReplayError {
    /// The failed transaction rolled back and the same work may succeed if
    /// tried again (a deadlock, a serialization failure, a lost connection).
    pub fn is_retryable(&self) -> bool {
        match self {
            ReplayError::Store(e) => e.is_retryable(),
            ReplayError::Projection(HandlerError::Retryable(_) | HandlerError::Conflict(_)) => true,
            _ => false,
        }
    }
}

impl From<sqlx::Error> for ReplayError {
    fn from(e: sqlx::Error) -> Self {
        ReplayError::Store(StoreError::from(e))
    }
}
