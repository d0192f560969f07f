//! Rebalance handling: before partitions are released, the offsets of every
//! batch already applied are committed; records of revoked partitions that
//! were received but not yet applied are dropped (their new owner receives
//! them again from the committed offset).
//!
//! Why this is enough: librdkafka runs rebalance callbacks only inside a
//! poll, i.e. inside `recv()`, and the runtime never polls while a batch is
//! in its database transaction. So a revocation always falls between two
//! batches: the in-flight batch has finished and stored its offsets by then,
//! and the synchronous commit here publishes them before the partitions go.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaErrorCode;
use tracing::{info, warn};

/// Consumer context of a subscription.
pub struct SubscriptionContext {
    subscription: String,
    revoked: Mutex<HashSet<(String, i32)>>,
    assigned: Arc<AtomicU64>,
}

impl SubscriptionContext {
    /// `assigned` is kept equal to the number of partitions held.
    pub fn new(subscription: &str, assigned: Arc<AtomicU64>) -> Self {
        SubscriptionContext { subscription: subscription.to_owned(), revoked: Mutex::new(HashSet::new()), assigned }
    }

    /// Partitions revoked since the last call.
    pub fn take_revoked(&self) -> HashSet<(String, i32)> {
        std::mem::take(&mut *self.revoked.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

fn describe(tpl: &TopicPartitionList) -> String {
    tpl.elements().iter().map(|e| format!("{}/{}", e.topic(), e.partition())).collect::<Vec<_>>().join(",")
}

impl ClientContext for SubscriptionContext {}

impl ConsumerContext for SubscriptionContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            match consumer.commit_consumer_state(CommitMode::Sync) {
                Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
                // The partitions' next owner redelivers from the last
                // committed offset; its inbox absorbs what we applied.
                Err(e) => warn!(subscription = %self.subscription, error = %e, "commit before revocation failed"),
            }
            // Eager protocol: a revocation takes every partition.
            self.assigned.store(0, Ordering::Relaxed);
            let mut revoked = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
            revoked.extend(tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())));
            info!(subscription = %self.subscription, partitions = %describe(tpl), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                self.assigned.store(tpl.count() as u64, Ordering::Relaxed);
                info!(subscription = %self.subscription, partitions = %describe(tpl), "partitions assigned");
            }
            Rebalance::Error(e) => warn!(subscription = %self.subscription, error = %e, "rebalance error"),
            Rebalance::Revoke(_) => {}
        }
    }
}
