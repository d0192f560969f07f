use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use thiserror::Error;

/// Why topics could not be made ready.
#[derive(Debug, Error)]
pub enum TopicError {
    /// The broker did not answer or refused for now: retry at startup.
    #[error("could not create topic {topic}: {source}")]
    Create { topic: String, source: KafkaError },
    /// The client could not even be built: fix the broker address.
    #[error("kafka client configuration: {0}")]
    Config(KafkaError),
}

/// Creates each topic that does not exist yet; an existing topic is left as
/// it is (its partition count is not changed behind an operator's back).
/// Topics that already exist are not asked for at all, so this also works
/// against brokers without CreateTopics (the mock cluster) once they exist.
pub async fn ensure_topics(brokers: &str, topics: &[&str], partitions: i32) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(TopicError::Config)?;
    let existing = existing_topics(brokers)
        .await
        .map_err(|source| TopicError::Create { topic: topics.join(","), source })?;
    let new: Vec<NewTopic> = topics
        .iter()
        .filter(|t| !existing.iter().any(|e| e == *t))
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(&new, &options)
        .await
        .map_err(|source| TopicError::Create { topic: topics.join(","), source })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => {
                return Err(TopicError::Create { topic, source: KafkaError::AdminOp(code) });
            }
        }
    }
    Ok(())
}

/// Names of the topics the cluster has. Metadata requests block in
/// librdkafka, so they run off the async threads.
pub async fn existing_topics(brokers: &str) -> Result<Vec<String>, KafkaError> {
    let brokers = brokers.to_owned();
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &brokers).create()?;
        let metadata = client.fetch_metadata(None, Duration::from_secs(30))?;
        Ok(metadata.topics().iter().filter(|t| t.error().is_none()).map(|t| t.name().to_owned()).collect())
    })
    .await
    // A panicked metadata thread is reported like a failed fetch.
    .unwrap_or(Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail)))
}
