//! The broker side of the durability figures: replicas, in-sync replicas and
//! leaders from the cluster metadata (read by [`crate::lag`] with the
//! watermarks, one metadata request per topic), and the topics' configs
//! through the admin API's DescribeConfigs.
//!
//! DescribeConfigs is asked separately and its failure stays local: the
//! librdkafka mock cluster (the embedded default broker) does not implement
//! it, and a status that lost its lag figures over a missing config would
//! show less than it knows.

use std::time::{Duration, Instant};

use herald_kafka::KafkaConfig;
use rdkafka::admin::{AdminClient, AdminOptions, ConfigResourceResult, OwnedResourceSpecifier, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::metadata::MetadataTopic;
use tokio::sync::Mutex;

use crate::durability::{PartitionReplicas, TopicConfigs};

/// Replicas, in-sync replicas and leader of each partition of `topic`.
pub(crate) fn partition_replicas(topic: &MetadataTopic) -> Vec<PartitionReplicas> {
    topic
        .partitions()
        .iter()
        .map(|p| PartitionReplicas {
            replicas: p.replicas().len(),
            in_sync: p.isr().len(),
            // The metadata says -1 for a partition no broker leads.
            leader: (p.leader() >= 0).then_some(p.leader()),
        })
        .collect()
}

/// How long an answer about topic configs is reused. `serve` refreshes its
/// figures every second; configs change when an operator changes them, so
/// asking the broker every second would be a request per process per
/// second for nothing. A change shows within this long.
const CONFIGS_FRESH_FOR: Duration = Duration::from_secs(30);

type Answer = Vec<Result<TopicConfigs, String>>;

/// Reads topic configs through one admin client, kept for the probe's life.
pub(crate) struct ConfigReader {
    admin: AdminClient<DefaultClientContext>,
    timeout: Duration,
    last: Mutex<Option<(Instant, Answer)>>,
}

impl ConfigReader {
    pub fn new(kafka: &KafkaConfig, timeout: Duration) -> Result<ConfigReader, KafkaError> {
        let admin = kafka.admin().create()?;
        Ok(ConfigReader { admin, timeout, last: Mutex::new(None) })
    }

    /// The configs of each of `topics`, in order, or why they are unknown.
    ///
    /// Asked of `broker`, one that just answered a metadata request: any
    /// broker serves topic configs (the Java admin client asks the least
    /// loaded one), while librdkafka's default, the controller, is never
    /// named by the mock cluster, so the call would wait out its timeout on
    /// every refresh instead of failing at once as unsupported.
    pub async fn describe(&self, topics: &[String], broker: i32) -> Answer {
        let mut last = self.last.lock().await;
        if let Some((_, answer)) = last.as_ref().filter(|(at, _)| at.elapsed() < CONFIGS_FRESH_FOR) {
            return answer.clone();
        }
        let answer = self.ask(topics, broker).await;
        *last = Some((Instant::now(), answer.clone()));
        answer
    }

    async fn ask(&self, topics: &[String], broker: i32) -> Answer {
        let specifiers: Vec<ResourceSpecifier<'_>> = topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let options = AdminOptions::new().request_timeout(Some(self.timeout)).broker_id((broker >= 0).then_some(broker));
        match self.admin.describe_configs(&specifiers, &options).await {
            Ok(results) => topics.iter().map(|topic| configs_of(&results, topic)).collect(),
            Err(e) => topics.iter().map(|_| Err(format!("describe configs: {e}"))).collect(),
        }
    }
}

/// The configs of `topic` as the cluster answers now: a metadata request
/// names a broker that answers, then DescribeConfigs asks it. Why they are
/// unknown otherwise (unreachable, the mock cluster, no such topic).
pub async fn topic_configs(kafka: &KafkaConfig, topic: &str, timeout: Duration) -> Result<TopicConfigs, String> {
    let reader: BaseConsumer = kafka.reader().create().map_err(|e| format!("kafka client: {e}"))?;
    let name = topic.to_owned();
    let broker = tokio::task::spawn_blocking(move || -> Result<i32, String> {
        let metadata = reader.fetch_metadata(Some(&name), timeout).map_err(|e| format!("metadata: {e}"))?;
        match metadata.topics().iter().find(|t| t.name() == name) {
            Some(t) if t.error().is_none() => Ok(metadata.orig_broker_id()),
            _ => Err(format!("the cluster has no topic {name}")),
        }
    })
    .await
    .map_err(|e| e.to_string())??;
    let reader = ConfigReader::new(kafka, timeout).map_err(|e| format!("kafka admin client: {e}"))?;
    reader.ask(&[topic.to_owned()], broker).await.pop().unwrap_or_else(|| Err(format!("describe configs: no answer for {topic}")))
}

/// The answer for `topic`, matched by name. rdkafka turns a resource the
/// broker refused into one without entries (its error code is dropped), so
/// an empty answer counts as unknown rather than as all defaults.
fn configs_of(results: &[ConfigResourceResult], topic: &str) -> Result<TopicConfigs, String> {
    let resource = results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .find(|r| matches!(&r.specifier, OwnedResourceSpecifier::Topic(name) if name == topic))
        .ok_or_else(|| format!("describe configs: no answer for {topic}"))?;
    if resource.entries.is_empty() {
        return Err(format!("describe configs: the broker gave no configs for {topic}"));
    }
    Ok(TopicConfigs::from_entries(resource.entries.iter().map(|e| (e.name.as_str(), e.value.as_deref()))))
}

#[cfg(test)]
mod tests {
    use rdkafka::admin::{ConfigEntry, ConfigResource, ConfigSource};
    use rdkafka::types::RDKafkaErrorCode;

    use super::*;

    fn resource(topic: &str, entries: &[(&str, &str)]) -> ConfigResourceResult {
        let entry = |(name, value): &(&str, &str)| ConfigEntry {
            name: (*name).to_owned(),
            value: Some((*value).to_owned()),
            source: ConfigSource::DynamicTopic,
            is_read_only: false,
            is_default: false,
            is_sensitive: false,
        };
        Ok(ConfigResource { specifier: OwnedResourceSpecifier::Topic(topic.to_owned()), entries: entries.iter().map(entry).collect() })
    }

    #[test]
    fn answers_are_matched_by_topic_and_empty_ones_are_unknown() {
        let results = [Err(RDKafkaErrorCode::UnknownTopicOrPartition), resource("b", &[]), resource("a", &[("min.insync.replicas", "2")])];
        assert_eq!(configs_of(&results, "a").map(|c| c.min_insync_replicas), Ok(Some(2)));
        assert!(configs_of(&results, "b").is_err_and(|e| e.contains("no configs")));
        assert!(configs_of(&results, "c").is_err_and(|e| e.contains("no answer")));
    }
}
