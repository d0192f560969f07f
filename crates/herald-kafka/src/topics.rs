use std::time::Duration;

use crate::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
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
    /// Replication settings the cluster cannot honour: reject, fix the flags.
    #[error("topic settings: {0}")]
    Settings(String),
}

/// How the topics Herald creates are laid out. `None` replication settings
/// follow the cluster: replication factor 3 and `min.insync.replicas` 2 on
/// a cluster of three or more brokers, else 1 and 1 with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicSettings {
    pub partitions: i32,
    pub replication_factor: Option<i32>,
    pub min_insync_replicas: Option<i32>,
}

impl TopicSettings {
    /// `partitions` partitions, replication chosen by the cluster's size.
    pub fn partitions(partitions: i32) -> TopicSettings {
        TopicSettings { partitions, replication_factor: None, min_insync_replicas: None }
    }

    /// Replication factor and `min.insync.replicas` for a cluster of
    /// `brokers` brokers, and a warning when they can lose acknowledged
    /// events.
    pub fn replication_for(&self, brokers: usize) -> Result<Replication, TopicError> {
        let brokers = i32::try_from(brokers).unwrap_or(i32::MAX);
        let factor = self.replication_factor.unwrap_or(if brokers >= 3 { 3 } else { 1 });
        let min_insync = self.min_insync_replicas.unwrap_or(if factor >= 3 { 2 } else { 1 });
        if factor < 1 || factor > brokers {
            return Err(TopicError::Settings(format!(
                "replication factor {factor} needs at least {factor} brokers; the cluster has {brokers}"
            )));
        }
        if min_insync < 1 || min_insync > factor {
            return Err(TopicError::Settings(format!(
                "min.insync.replicas {min_insync} must be between 1 and the replication factor {factor}"
            )));
        }
        let warning = (min_insync < 2).then(|| {
            format!(
                "replication factor {factor}, min.insync.replicas {min_insync}: an acknowledged event lives on one broker \
                 until it is copied, and is lost with that broker's disk (use 3 and 2 on a cluster of three or more)"
            )
        });
        Ok(Replication { factor, min_insync, warning })
    }
}

/// Replication chosen for new topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    pub factor: i32,
    pub min_insync: i32,
    pub warning: Option<String>,
}

/// Creates each topic that does not exist yet; an existing topic is left as
/// it is (its partitions and replication are not changed behind an
/// operator's back; `herald status` shows them). Topics that already exist
/// are not asked for at all, so this also works against brokers without
/// CreateTopics (the mock cluster) once they exist.
pub async fn ensure_topics(kafka: &KafkaConfig, topics: &[&str], settings: TopicSettings) -> Result<(), TopicError> {
    let admin: AdminClient<DefaultClientContext> = kafka.admin().create().map_err(TopicError::Config)?;
    let cluster = describe_cluster(kafka).await.map_err(|source| TopicError::Create { topic: topics.join(","), source })?;
    let missing: Vec<&str> = topics.iter().copied().filter(|t| !cluster.topics.iter().any(|e| e == t)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let replication = settings.replication_for(cluster.brokers)?;
    if let Some(warning) = &replication.warning {
        tracing::warn!(topics = %missing.join(","), brokers = cluster.brokers, "{warning}");
    }
    let min_insync = replication.min_insync.to_string();
    let new: Vec<NewTopic> = missing
        .iter()
        .map(|t| NewTopic::new(t, settings.partitions, TopicReplication::Fixed(replication.factor)).set("min.insync.replicas", &min_insync))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(&new, &options).await.map_err(|source| TopicError::Create { topic: topics.join(","), source })?;
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

/// Topic names and broker count, as the metadata says.
struct ClusterView {
    topics: Vec<String>,
    brokers: usize,
}

async fn describe_cluster(kafka: &KafkaConfig) -> Result<ClusterView, KafkaError> {
    let kafka = kafka.clone();
    tokio::task::spawn_blocking(move || {
        let client: BaseConsumer = kafka.reader().create()?;
        let metadata = client.fetch_metadata(None, Duration::from_secs(30))?;
        let topics = metadata.topics().iter().filter(|t| t.error().is_none()).map(|t| t.name().to_owned()).collect();
        Ok(ClusterView { topics, brokers: metadata.brokers().len() })
    })
    .await
    .unwrap_or(Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Fail)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_brokers_default_to_three_replicas_two_in_sync() {
        let r = TopicSettings::partitions(4).replication_for(3).unwrap();
        assert_eq!((r.factor, r.min_insync, r.warning), (3, 2, None));
        let r = TopicSettings::partitions(4).replication_for(5).unwrap();
        assert_eq!((r.factor, r.min_insync), (3, 2));
    }

    #[test]
    fn fewer_brokers_get_one_replica_and_a_warning() {
        let r = TopicSettings::partitions(4).replication_for(1).unwrap();
        assert_eq!((r.factor, r.min_insync), (1, 1));
        assert!(r.warning.unwrap().contains("lost"));
    }

    #[test]
    fn impossible_settings_are_rejected() {
        let mut s = TopicSettings::partitions(4);
        s.replication_factor = Some(3);
        assert!(matches!(s.replication_for(2), Err(TopicError::Settings(m)) if m.contains("3 brokers")));
        s.min_insync_replicas = Some(4);
        assert!(matches!(s.replication_for(3), Err(TopicError::Settings(m)) if m.contains("between 1 and")));
        s.min_insync_replicas = Some(1);
        assert!(s.replication_for(3).unwrap().warning.is_some());
    }
}
