//! The broker's side of the evidence: every record of Herald's topics, read
//! from the first retained offset to the high watermark at the time of the
//! call. Only headers and keys are kept; the audit compares identities.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use herald_kafka::KafkaConfig;
use herald_kafka::offsets::{self, Watermarks};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::AuditError;
use crate::model::{KafkaHistory, KafkaRecord};

/// Reads `topics` completely; gives up after `within`.
pub async fn read(kafka: &KafkaConfig, topics: &[String], within: Duration) -> Result<KafkaHistory, AuditError> {
    let (kafka, topics) = (kafka.clone(), topics.to_vec());
    tokio::task::spawn_blocking(move || read_blocking(&kafka, &topics, within))
        .await
        .map_err(|e| AuditError::Kafka(format!("reader task: {e}")))?
}

fn read_blocking(kafka: &KafkaConfig, topics: &[String], within: Duration) -> Result<KafkaHistory, AuditError> {
    let err = |what: &str, e: rdkafka::error::KafkaError| AuditError::Kafka(format!("{what}: {e}"));
    // A reader outside every group: the audit must not move any
    // subscription's position.
    let consumer: BaseConsumer = kafka.reader().create().map_err(|e| err("creating a reader", e))?;
    let timeout = Duration::from_secs(10);
    let mut history = KafkaHistory::default();
    let mut remaining: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let marks = offsets::fetch_watermarks(&consumer, topic, timeout).map_err(|e| err(&format!("watermarks of {topic}"), e))?;
        if marks.is_empty() {
            return Err(AuditError::Kafka(format!("topic {topic} does not exist")));
        }
        for Watermarks { partition: p, low, high } in marks {
            if low > 0 {
                history.truncated.insert((topic.clone(), p), low);
            }
            if high > low {
                remaining.insert((topic.clone(), p), high);
                assignment.add_partition_offset(topic, p, Offset::Offset(low)).map_err(|e| err("assignment", e))?;
            }
        }
    }
    if remaining.is_empty() {
        return Ok(history);
    }
    consumer.assign(&assignment).map_err(|e| err("assign", e))?;
    let deadline = Instant::now() + within;
    while !remaining.is_empty() {
        if Instant::now() > deadline {
            return Err(AuditError::Kafka(format!("history not read within {within:?}; still missing {remaining:?}")));
        }
        let Some(message) = consumer.poll(Duration::from_millis(200)) else { continue };
        let message = message.map_err(|e| err("poll", e))?;
        let at = (message.topic().to_owned(), message.partition());
        if remaining.get(&at).is_some_and(|high| message.offset() + 1 >= *high) {
            remaining.remove(&at);
        }
        history.records.push(record(&message));
    }
    Ok(history)
}

fn record<M: Message>(message: &M) -> KafkaRecord {
    let header = |name: &str| {
        message
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == name).and_then(|h| h.value))
            .map(|v| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default()
    };
    KafkaRecord {
        topic: message.topic().to_owned(),
        partition: message.partition(),
        offset: message.offset(),
        key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()).unwrap_or_default(),
        source: header("ce_source"),
        event_id: header("ce_id"),
        timestamp_ms: message.timestamp().to_millis(),
    }
}
