//! Rebalance handling. A subscription receives its next poll while the
//! lanes apply the last one, so a revocation can arrive (librdkafka runs
//! rebalance callbacks only inside a poll, i.e. inside `recv()`) while a
//! batch is in its database transaction. Such a revocation is *deferred*:
//! the callback returns without giving the partitions up (librdkafka's
//! group then waits in its "wait for unassign" state, still heartbeating),
//! the lanes finish the batch in flight, store its offsets and start no
//! other, and only then is the revocation served — the offsets of every
//! batch applied are committed synchronously and the assignment dropped.
//! So a rebalance never separates a committed batch from its offsets, and a
//! clean handoff redelivers nothing. A revocation while nothing is being
//! applied is served at once, inside the callback.
//!
//! Records of revoked partitions received but not applied are dropped by
//! the receiving side (their next owner receives them again from the
//! committed offset).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rdkafka::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use tracing::{info, warn};

/// Consumer context of a subscription.
pub struct SubscriptionContext {
    subscription: String,
    handoff: Mutex<Handoff>,
    assigned: Arc<AtomicU64>,
    deferred: Arc<AtomicU64>,
}

#[derive(Default)]
struct Handoff {
    /// Lanes are applying a poll: a revocation now waits for them.
    applying: bool,
    /// A revocation waits to be served (its partitions are still assigned).
    deferred: bool,
    /// Partitions revoked (served or deferred) since the receiver last looked.
    revoked: HashSet<(String, i32)>,
}

impl SubscriptionContext {
    /// `assigned` is kept equal to the number of partitions held;
    /// `deferred` counts the revocations that waited for the lanes.
    pub fn new(subscription: &str, assigned: Arc<AtomicU64>, deferred: Arc<AtomicU64>) -> Self {
        SubscriptionContext { subscription: subscription.to_owned(), handoff: Mutex::new(Handoff::default()), assigned, deferred }
    }

    fn handoff(&self) -> MutexGuard<'_, Handoff> {
        self.handoff.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Partitions revoked since the last call.
    pub fn take_revoked(&self) -> HashSet<(String, i32)> {
        std::mem::take(&mut self.handoff().revoked)
    }

    /// A revocation waits for the batches in flight: apply no other batch.
    pub fn revocation_deferred(&self) -> bool {
        self.handoff().deferred
    }

    /// Lanes start applying a poll: revocations from now on are deferred.
    pub fn applying(&self) {
        self.handoff().applying = true;
    }

    /// Lanes are done and their offsets stored: serves a deferred revocation.
    pub fn applied<C: Consumer<Self>>(&self, consumer: &C) {
        let deferred = {
            let mut handoff = self.handoff();
            handoff.applying = false;
            std::mem::take(&mut handoff.deferred)
        };
        if deferred {
            self.give_up_partitions(consumer);
        }
    }

    /// Commits what was stored, then drops the whole assignment (eager
    /// protocol: a revocation takes every partition).
    fn give_up_partitions<C: Consumer<Self>>(&self, consumer: &C) {
        match consumer.commit_consumer_state(CommitMode::Sync) {
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            // The partitions' next owner redelivers from the last
            // committed offset; its inbox absorbs what we applied.
            Err(e) => warn!(subscription = %self.subscription, error = %e, "commit before revocation failed"),
        }
        if let Err(e) = consumer.unassign() {
            warn!(subscription = %self.subscription, error = %e, "giving up the revoked partitions failed");
        }
        self.assigned.store(0, Ordering::Relaxed);
    }

    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        {
            let mut handoff = self.handoff();
            handoff.revoked.extend(tpl.elements().iter().map(|e| (e.topic().to_owned(), e.partition())));
            if handoff.applying {
                handoff.deferred = true;
                self.deferred.fetch_add(1, Ordering::Relaxed);
                info!(subscription = %self.subscription, partitions = %describe(tpl), "partitions revoked; given up once the batches in flight are stored");
                return;
            }
        }
        self.give_up_partitions(consumer);
        info!(subscription = %self.subscription, partitions = %describe(tpl), "partitions revoked");
    }
}

fn describe(tpl: &TopicPartitionList) -> String {
    tpl.elements().iter().map(|e| format!("{}/{}", e.topic(), e.partition())).collect::<Vec<_>>().join(",")
}

impl ClientContext for SubscriptionContext {}

impl ConsumerContext for SubscriptionContext {
    /// Replaces rdkafka's default, which gives partitions up inside the
    /// callback, so that a revocation can wait for the lanes (the consumer
    /// uses the eager protocol: librdkafka's default assignors).
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                if let Err(e) = consumer.assign(tpl) {
                    warn!(subscription = %self.subscription, error = %e, "taking the assigned partitions failed");
                }
                self.assigned.store(tpl.count() as u64, Ordering::Relaxed);
                info!(subscription = %self.subscription, partitions = %describe(tpl), "partitions assigned");
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.revoke(consumer, tpl),
            other => {
                let code: RDKafkaErrorCode = other.into();
                warn!(subscription = %self.subscription, error = %code, "rebalance error; giving up the assignment");
                self.revoke(consumer, tpl);
            }
        }
    }
}
