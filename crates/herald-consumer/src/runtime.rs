//! The one-record-at-a-time loop of processors that are not inbox handlers
//! (the export worker, whose dedup is the job's state). A record settles
//! one of three ways before its offset is stored: processed; rejected
//! permanently `REJECTIONS` times and then dead-lettered like a
//! subscription's poison (same table, same `herald dlq`); or, while the
//! failure is retryable, not at all — the loop pauses on it with backoff.

use std::future::Future;

use herald_envelope::decode_record;
use herald_kafka::KafkaConfig;
use herald_store::Db;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::ProcessError;
use crate::letters::{self, Backoff};

/// Tries of a record the processor rejects before it is dead-lettered, as
/// for a subscription's handler (`SubscriptionOptions::max_attempts`).
const REJECTIONS: u32 = 3;

/// What processing one record did, for a redrive to report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Processed {
    /// The record's effect was applied now.
    Applied,
    /// Its effect was applied before (or is in other hands): nothing changed.
    Unchanged,
    /// Not a record this processor acts on.
    Ignored,
}

/// Processes one record. Must be idempotent for redelivered records: the
/// runtime commits offsets after processing, so a crash in between repeats
/// it, and a redrive may hand it a record that was applied meanwhile.
pub trait Processor: Send + Sync {
    fn process(&self, msg: &OwnedMessage) -> impl Future<Output = Result<Processed, ProcessError>> + Send;
}

/// Where a subscription reads from.
#[derive(Debug, Clone)]
pub struct Subscription {
    /// Name of the subscription, which is also its inbox scope.
    pub name: String,
    /// Consumer group; by convention `herald.<name>`.
    pub group: String,
    pub kafka: KafkaConfig,
    pub topics: Vec<String>,
}

impl Subscription {
    /// The conventional subscription: group `<group_prefix>.<name>`.
    pub fn new(name: &str, group_prefix: &str, kafka: &KafkaConfig, topics: &[&str]) -> Subscription {
        Subscription {
            name: name.to_owned(),
            group: format!("{group_prefix}.{name}"),
            kafka: kafka.clone(),
            topics: topics.iter().map(|t| t.to_string()).collect(),
        }
    }
}

/// Consumes until `shutdown`. The record being processed when shutdown comes
/// is finished and its offset committed before returning. Dead letters go to
/// `db` under the subscription's name.
pub async fn run<P: Processor>(subscription: &Subscription, db: &Db, processor: &P, shutdown: CancellationToken) -> Result<(), KafkaError> {
    let consumer: StreamConsumer = subscription.kafka.consumer(&subscription.group).create()?;
    let topics: Vec<&str> = subscription.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    info!(subscription = %subscription.name, ?topics, "subscription started");
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => break,
            msg = consumer.recv() => msg,
        };
        let msg = match msg {
            Ok(msg) => msg.detach(),
            Err(e) => {
                warn!(subscription = %subscription.name, error = %e, "kafka receive error");
                continue;
            }
        };
        if !settle(&subscription.name, db, processor, &msg, &shutdown).await {
            break;
        }
        // After the effect (or the dead letter) committed: a crash before the
        // background commit of this offset redelivers the record, which the
        // processor absorbs and the dead-letter table keeps once.
        consumer.store_offset(msg.topic(), msg.partition(), msg.offset())?;
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

/// Processes `msg` until it settled: done, or dead-lettered after
/// [`REJECTIONS`] rejections. Retryable failures pause and retry and never
/// dead-letter. `false`: shutdown interrupted, the offset must not be stored.
async fn settle<P: Processor>(subscription: &str, db: &Db, processor: &P, msg: &OwnedMessage, shutdown: &CancellationToken) -> bool {
    let mut backoff = Backoff::new();
    let mut rejections = 0;
    loop {
        match processor.process(msg).await {
            Ok(_) => return true,
            Err(ProcessError::Permanent(reason)) => {
                rejections += 1;
                if rejections >= REJECTIONS {
                    return set_aside(subscription, db, msg, &reason, rejections, shutdown).await;
                }
                warn!(subscription, offset = msg.offset(), rejections, %reason, "record rejected; trying again before dead-lettering it");
                tokio::time::sleep(letters::rejection_pause(rejections)).await;
            }
            Err(ProcessError::Retryable(reason)) => {
                warn!(subscription, offset = msg.offset(), %reason, backoff = ?backoff.next(), "record failed, retryable; pausing");
                if !backoff.wait(shutdown).await {
                    return false;
                }
            }
        }
    }
}

/// Dead-letters `msg`, labelled with its CloudEvents identity when it has
/// one, so `herald dlq list` names the event.
async fn set_aside(subscription: &str, db: &Db, msg: &OwnedMessage, reason: &str, attempts: u32, shutdown: &CancellationToken) -> bool {
    let decoded = decode_record(msg).ok();
    let identity = decoded.as_ref().map(|e| (&e.key, e.event_type.as_str()));
    let letter = letters::letter(subscription, msg, identity, reason, attempts);
    letters::keep(db, &letter, shutdown, || {}).await
}
