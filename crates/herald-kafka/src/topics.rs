use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;
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
pub async fn ensure_topics(brokers: &str, topics: &[&str], partitions: i32) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(TopicError::Config)?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
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
