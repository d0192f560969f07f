use herald_store::StoreError;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use thiserror::Error;

/// What stopped a relay.
#[derive(Debug, Error)]
pub enum RelayError {
    /// Reading or recording progress failed: retry; rows whose progress was
    /// not recorded are published again (same CloudEvents id).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The producer could not be created: fix the broker configuration.
    #[error("kafka producer: {0}")]
    Producer(KafkaError),
}

/// How a failed publish of one row is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Might succeed later (broker unavailable, authorization not yet
    /// granted, topic not yet created…): back off, try again, dead-letter
    /// after the configured number of attempts.
    Retryable,
    /// Retrying cannot change the outcome (the record itself is rejected):
    /// set the row aside as `failed` now.
    Permanent,
}

/// A row the broker did not acknowledge, and why.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct PublishError {
    pub class: Class,
    pub message: String,
    /// The producer itself is broken and must be replaced.
    pub fatal: bool,
}

impl PublishError {
    pub fn permanent(message: impl Into<String>) -> Self {
        PublishError { class: Class::Permanent, message: message.into(), fatal: false }
    }

    pub fn retryable(message: impl Into<String>) -> Self {
        PublishError { class: Class::Retryable, message: message.into(), fatal: false }
    }

    pub fn from_kafka(error: &KafkaError) -> Self {
        let fatal = error.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal);
        PublishError { class: classify(error), message: error.to_string(), fatal }
    }
}

/// Record-level rejections are permanent; everything else may pass later.
/// Deliberately short: an error missing here is retried and, if it persists,
/// dead-lettered — never counted as delivered.
pub fn classify(error: &KafkaError) -> Class {
    use RDKafkaErrorCode as C;
    match error.rdkafka_error_code() {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::InvalidRecord
            | C::InvalidTopic
            | C::MessageBatchTooLarge
            | C::BadMessage,
        ) => Class::Permanent,
        _ => Class::Retryable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_rejections_are_permanent_the_rest_retryable() {
        let size = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(classify(&size), Class::Permanent);
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::AllBrokersDown,
            RDKafkaErrorCode::QueueFull,
        ] {
            assert_eq!(classify(&KafkaError::MessageProduction(code)), Class::Retryable, "{code:?}");
        }
        assert_eq!(classify(&KafkaError::Canceled), Class::Retryable);
    }
}
