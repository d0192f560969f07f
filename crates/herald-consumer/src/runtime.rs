use std::future::Future;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaErrorCode;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::ProcessError;

/// Processes one record. Must be idempotent for redelivered records: the
/// runtime commits offsets after processing, so a crash in between repeats it.
pub trait Processor: Send + Sync {
    fn process(&self, msg: &BorrowedMessage<'_>) -> impl Future<Output = Result<(), ProcessError>> + Send;
}

/// Where a subscription reads from.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Name of the subscription, which is also its inbox scope.
    pub name: String,
    /// Consumer group; by convention `herald.<name>`.
    pub group: String,
    pub brokers: String,
    pub topics: Vec<String>,
}

impl Subscription {
    /// The conventional subscription: group `<group_prefix>.<name>`.
    pub fn new(name: &str, group_prefix: &str, brokers: &str, topics: &[&str]) -> Subscription {
        Subscription {
            name: name.to_owned(),
            group: format!("{group_prefix}.{name}"),
            brokers: brokers.to_owned(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
        }
    }
}

/// Consumes until `shutdown`. The record being processed when shutdown comes
/// is finished and its offset committed before returning.
pub async fn run<P: Processor>(
    subscription: &Subscription,
    processor: &P,
    shutdown: CancellationToken,
) -> Result<(), KafkaError> {
    let consumer: StreamConsumer =
        herald_kafka::consumer_config(&subscription.brokers, &subscription.group).create()?;
    let topics: Vec<&str> = subscription.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    info!(subscription = %subscription.name, ?topics, "subscription started");
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            msg = consumer.recv() => msg,
        };
        let msg = match msg {
            Ok(msg) => msg,
            Err(e) => {
                warn!(subscription = %subscription.name, error = %e, "kafka receive error");
                continue;
            }
        };
        if !process_until_settled(subscription, processor, &msg, &shutdown).await {
            break;
        }
        // After the effect committed: a crash before the background commit
        // of this offset redelivers the record, which the processor absorbs.
        consumer.store_offset_from_message(&msg)?;
    }
    // Commit what was stored before leaving the group, so a clean stop
    // redelivers nothing.
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => warn!(subscription = %subscription.name, error = %e, "final offset commit failed; records will be redelivered"),
    }
    info!(subscription = %subscription.name, "subscription stopped");
    Ok(())
}

/// Retries a retryable failure with backoff until it settles. Returns `false`
/// if shutdown interrupted the retries (offset must not be committed).
async fn process_until_settled<P: Processor>(
    subscription: &Subscription,
    processor: &P,
    msg: &BorrowedMessage<'_>,
    shutdown: &CancellationToken,
) -> bool {
    let mut backoff = Duration::from_millis(100);
    loop {
        match processor.process(msg).await {
            Ok(()) => return true,
            Err(ProcessError::Permanent(reason)) => {
                error!(subscription = %subscription.name, topic = msg.topic(), partition = msg.partition(),
                    offset = msg.offset(), %reason, "record rejected permanently; skipping");
                return true;
            }
            Err(ProcessError::Retryable(reason)) => {
                warn!(subscription = %subscription.name, offset = msg.offset(), %reason, ?backoff, "retrying record");
                tokio::select! {
                    _ = shutdown.cancelled() => return false,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}
