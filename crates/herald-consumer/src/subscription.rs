//! The batching subscription runtime: one consumer group per subscription,
//! many records per database transaction, offsets stored only after that
//! transaction committed (librdkafka commits stored offsets in the background
//! and synchronously before partitions are revoked or the consumer stops).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use herald_envelope::Registry;
use herald_envelope::legacy::SOURCE_ALIASES;
use herald_fault::{Hook, Point};
use herald_store::{Db, inbox};
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::batch::{Applier, Decoded, decode};
use crate::context::SubscriptionContext;
use crate::letters::Backoff;
use crate::metrics::{Metrics, MetricsSnapshot, StageTimes};
use crate::{Handler, Order, RunError, Subscription};

/// Tuning of a subscription.
#[derive(Clone)]
pub struct SubscriptionOptions {
    /// Most records per transaction.
    pub max_batch: usize,
    /// How long a poll keeps receiving after its first record while the
    /// lanes still apply the previous one; with the lanes idle it goes at
    /// once with what has arrived.
    pub max_wait: Duration,
    /// Groups of partitions applied concurrently, each in its own transaction.
    pub lanes: usize,
    /// Batches per lane received in one poll. The next poll is received,
    /// and its lanes' first batches decoded, while the lanes apply this
    /// one; each poll still ends when its slowest lane does, so more
    /// batches per poll means fewer such ends per event, at the cost of
    /// more records received again by a partition's next owner after a
    /// rebalance.
    pub batches_per_poll: usize,
    /// Attempts of a record the handler rejects before it is dead-lettered.
    pub max_attempts: u32,
    /// Per-key order past a dead letter; `None`: what the handler declares
    /// ([`Handler::order`]).
    pub order: Option<Order>,
    /// Fault injection (none in production): [`Point::AfterCommit`], with
    /// the subscription and the batch number, after a batch's transaction
    /// committed and before its offsets are stored — the window a crash
    /// test aims at.
    pub faults: Hook,
    /// Writer schemas this subscription can decode; a record naming another
    /// is dead-lettered as `unknown schema <file>`.
    pub registry: Registry,
}

impl Default for SubscriptionOptions {
    fn default() -> Self {
        SubscriptionOptions {
            max_batch: 1000,
            max_wait: Duration::from_millis(20),
            lanes: 2,
            batches_per_poll: 4,
            max_attempts: 3,
            order: None,
            faults: Hook::none(),
            registry: Registry::embedded(),
        }
    }
}

impl std::fmt::Debug for SubscriptionOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriptionOptions")
            .field("max_batch", &self.max_batch)
            .field("max_wait", &self.max_wait)
            .field("lanes", &self.lanes)
            .field("batches_per_poll", &self.batches_per_poll)
            .field("max_attempts", &self.max_attempts)
            .field("order", &self.order)
            .field("faults", &self.faults)
            .field("schemas", &self.registry.files().collect::<Vec<_>>())
            .finish()
    }
}

/// Runs `handler` as `subscription` until `shutdown`; the batch in flight is
/// finished and its offsets committed before returning.
pub async fn run_subscription<H: Handler>(
    subscription: &Subscription,
    db: &Db,
    handler: &H,
    options: &SubscriptionOptions,
    metrics: &Metrics,
    shutdown: CancellationToken,
) -> Result<MetricsSnapshot, RunError> {
    let Some(rewritten) = normalise_sources_when_reachable(db, &subscription.name, &shutdown).await? else {
        return Ok(metrics.snapshot());
    };
    if rewritten > 0 {
        info!(subscription = %subscription.name, rewritten, "inbox rows of legacy sources normalised");
    }
    let consumer: StreamConsumer<SubscriptionContext> = subscription.kafka.consumer(&subscription.group).create_with_context(
        SubscriptionContext::new(&subscription.name, metrics.assigned.clone(), metrics.revocations_deferred.clone()),
    )?;
    let topics: Vec<&str> = subscription.topics.iter().map(String::as_str).collect();
    consumer.subscribe(&topics)?;
    let order = options.order.unwrap_or_else(|| handler.order());
    info!(subscription = %subscription.name, group = %subscription.group, ?topics, %order, "subscription started");
    // The handler's native path: a connection per lane and a spare.
    let native =
        if handler.applies_pg() { db.native_postgres(u32::try_from(options.lanes).unwrap_or(u32::MAX).saturating_add(1))? } else { None };
    let applier = Applier { db, native: native.as_ref(), subscription: &subscription.name, handler, options, order, metrics };
    let committed = AtomicU64::new(0);
    let idle = CancellationToken::new();
    idle.cancel();
    let mut polled = collect(&consumer, options, &metrics.time, &idle, &shutdown).await.map(|records| plan(records, options));
    while let Some(lanes) = polled.take() {
        // Partitions are independent: their records are split into up to
        // `lanes` groups applied concurrently (on PostgreSQL, in separate
        // transactions on separate connections), each lane a pipeline of
        // batches decoded ahead on the blocking pool. The next poll is
        // received (and its lanes' first batches decoded) meanwhile; a
        // revocation it brings waits until the lanes have stored their
        // offsets (`SubscriptionContext`).
        let runs = lanes.into_iter().map(|planned| lane(&consumer, &applier, planned, &committed, &shutdown));
        let (finished, next) = apply_while_receiving(
            &consumer,
            futures::future::join_all(runs),
            |finished: &Vec<Result<bool, RunError>>| finished.iter().all(|f| matches!(f, Ok(true))),
            options,
            metrics,
            &shutdown,
        )
        .await;
        let mut go_on = true;
        for finished in finished {
            go_on &= finished?;
        }
        if !go_on {
            break;
        }
        polled = next;
    }
    // Commit what was stored before leaving the group, so a clean stop
    // redelivers nothing.
    match consumer.commit_consumer_state(CommitMode::Sync) {
        Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
        Err(e) => warn!(subscription = %subscription.name, error = %e, "final offset commit failed; records will be redelivered"),
    }
    if let Some(pool) = native {
        pool.close().await;
    }
    let snapshot = metrics.snapshot();
    info!(subscription = %subscription.name, applied = snapshot.applied, ?snapshot, "subscription stopped");
    Ok(snapshot)
}

/// The start-up's database work, tried again while the database is
/// unreachable: a subscription started during an outage (a process
/// restarted by its supervisor while the database fails over) waits for it
/// like a running one does, instead of ending and leaving its role stopped
/// in a process that stays up. `None`: shutdown came first.
async fn normalise_sources_when_reachable(db: &Db, subscription: &str, shutdown: &CancellationToken) -> Result<Option<u64>, RunError> {
    let mut backoff = Backoff::new();
    loop {
        match inbox::normalise_legacy_sources(db, subscription, SOURCE_ALIASES).await {
            Ok(rewritten) => return Ok(Some(rewritten)),
            Err(e) if e.is_retryable() => {
                warn!(subscription, error = %e, backoff = ?backoff.next(), "database unreachable at start; waiting for it");
                if !backoff.wait(shutdown).await {
                    return Ok(None);
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Runs the lanes of one poll while receiving the next. Once the lanes are
/// done (offsets stored), a revocation that arrived meanwhile is served;
/// then the receive is finished — unless the lanes stopped or failed, in
/// which case what it received is dropped (nothing of it was applied or
/// stored).
async fn apply_while_receiving<A: Future>(
    consumer: &StreamConsumer<SubscriptionContext>,
    apply: A,
    go_on: impl Fn(&A::Output) -> bool,
    options: &SubscriptionOptions,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> (A::Output, Option<Vec<Lane>>) {
    consumer.context().applying();
    let lanes_idle = CancellationToken::new();
    let receive = collect(consumer, options, &metrics.time, &lanes_idle, shutdown);
    tokio::pin!(apply, receive);
    let mut received = None;
    let finished = loop {
        tokio::select! {
            biased;
            finished = &mut apply => break finished,
            next = &mut receive, if received.is_none() => received = Some(next.map(|records| plan(records, options))),
        }
    };
    lanes_idle.cancel();
    consumer.context().applied(consumer);
    let next = match received {
        Some(next) => next,
        None if go_on(&finished) => receive.await.map(|records| plan(records, options)),
        None => None,
    };
    (finished, next)
}

/// One lane of a poll: its first batch already decoding, the rest waiting.
struct Lane {
    decoding: Decoding,
    rest: std::vec::IntoIter<Vec<OwnedMessage>>,
}

type Decoding = tokio::task::JoinHandle<(Vec<OwnedMessage>, Decoded)>;

/// Splits a poll into lanes and starts decoding each lane's first batch.
fn plan(records: Vec<OwnedMessage>, options: &SubscriptionOptions) -> Vec<Lane> {
    let lanes = split_lanes(records, options.lanes, options.max_batch);
    lanes
        .into_iter()
        .filter_map(|batches| {
            let mut rest = batches.into_iter();
            rest.next().map(|first| Lane { decoding: spawn_decode(first, options.registry.clone()), rest })
        })
        .collect()
}

/// Applies a lane's batches (of partitions no other lane has) one after
/// another, storing each batch's offsets after its commit. `false` on
/// shutdown.
async fn lane<H: Handler>(
    consumer: &StreamConsumer<SubscriptionContext>,
    applier: &Applier<'_, H>,
    planned: Lane,
    committed: &AtomicU64,
    shutdown: &CancellationToken,
) -> Result<bool, RunError> {
    let Lane { decoding, rest: mut batches } = planned;
    let registry = &applier.options.registry;
    let mut next = Some(decoding);
    while let Some(decoding) = next.take() {
        if consumer.context().revocation_deferred() {
            // Its partitions go to their next owner, which receives these
            // records again from the offsets stored so far.
            return Ok(true);
        }
        let mut waiting = std::time::Instant::now();
        let (batch, decoded) = decoding.await.map_err(|e| RunError::Internal(e.to_string()))?;
        StageTimes::lap(&applier.metrics.time.decode_wait_us, &mut waiting);
        next = batches.next().map(|b| spawn_decode(b, registry.clone()));
        if !applier.apply(&batch, decoded, shutdown).await {
            return Ok(false);
        }
        let n = committed.fetch_add(1, Ordering::SeqCst) + 1;
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let _ = applier.options.faults.at(Point::AfterCommit, applier.subscription, n).await;
        store_offsets(consumer, applier.subscription, &batch);
    }
    Ok(true)
}

fn spawn_decode(batch: Vec<OwnedMessage>, registry: Registry) -> Decoding {
    tokio::task::spawn_blocking(move || {
        let decoded = decode(&batch, &registry);
        (batch, decoded)
    })
}

/// Groups records by partition into at most `lanes` lanes (a partition stays
/// in one lane, its records in order), each cut into batches of `size`.
/// The largest partitions are placed first, each in the lane with the
/// fewest records so far: the poll ends when its last lane does, so lanes
/// of equal length idle least (partitions dealt out in turn left one lane
/// with most of a poll whenever their sizes differed).
fn split_lanes(records: Vec<OwnedMessage>, lanes: usize, size: usize) -> Vec<Vec<Vec<OwnedMessage>>> {
    let mut partitions: BTreeMap<(String, i32), Vec<OwnedMessage>> = BTreeMap::new();
    for msg in records {
        partitions.entry((msg.topic().to_owned(), msg.partition())).or_default().push(msg);
    }
    let mut partitions: Vec<Vec<OwnedMessage>> = partitions.into_values().collect();
    partitions.sort_by_key(|msgs| std::cmp::Reverse(msgs.len()));
    let lanes = lanes.max(1);
    let mut by_lane: Vec<Vec<OwnedMessage>> = (0..lanes).map(|_| Vec::new()).collect();
    for msgs in partitions {
        if let Some(lane) = by_lane.iter_mut().min_by_key(|lane| lane.len()) {
            lane.extend(msgs);
        }
    }
    by_lane
        .into_iter()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let mut batches = Vec::new();
            let mut records = l.into_iter().peekable();
            while records.peek().is_some() {
                batches.push(records.by_ref().take(size.max(1)).collect());
            }
            batches
        })
        .collect()
}

/// Receives up to `batches_per_poll × lanes × max_batch` records. After the
/// first, it keeps receiving while the lanes apply the previous poll (at
/// most `max_wait`): records that arrive meanwhile would wait for the lanes
/// anyway, and go in bigger batches. Once `lanes_idle`, it takes what has
/// already arrived and goes: a record never waits for company while nothing
/// else is being done. `None` on shutdown.
///
/// A rebalance can only run inside `recv()`. When one revoked partitions,
/// the records of those partitions received *before* it are dropped: they
/// were not applied, and whoever owns the partition now (maybe this process
/// again) receives them again from the committed offset. Records received
/// after a revocation that was served are kept — they come from the new
/// assignment. A revocation that waits for the lanes ends the receive: the
/// partitions are still assigned, so what comes until it is served is
/// dropped the same way.
///
/// `time.receive_us` counts from the first record on: waiting for traffic
/// is not work.
async fn collect(
    consumer: &StreamConsumer<SubscriptionContext>,
    options: &SubscriptionOptions,
    time: &StageTimes,
    lanes_idle: &CancellationToken,
    shutdown: &CancellationToken,
) -> Option<Vec<OwnedMessage>> {
    let first = tokio::select! {
        _ = shutdown.cancelled() => return None,
        msg = consumer.recv() => msg,
    };
    let mut receiving = std::time::Instant::now();
    // At least two batches per lane: one in the database while the next is decoded.
    let limit = options.max_batch.max(1) * options.lanes.max(1) * options.batches_per_poll.max(2);
    let mut batch = Vec::with_capacity(limit);
    let mut received: Result<_, tokio::time::error::Elapsed> = Ok(first);
    let deadline = Instant::now() + options.max_wait;
    loop {
        let revoked = consumer.context().take_revoked();
        let deferred = consumer.context().revocation_deferred();
        if deferred || !batch.is_empty() {
            drop_revoked(&mut batch, &revoked);
        }
        match received {
            Ok(Ok(msg)) => {
                // After a revocation still waiting, the record is from the old assignment.
                if !(deferred && revoked.contains(&(msg.topic().to_owned(), msg.partition()))) {
                    batch.push(msg.detach());
                }
            }
            Ok(Err(e)) => {
                warn!(error = %e, "kafka receive error");
                break;
            }
            Err(_elapsed) => break,
        }
        if deferred || batch.len() >= limit {
            break;
        }
        received = tokio::select! {
            // A record already there is taken before the lanes' idleness is
            // looked at, so going early drains what has arrived.
            biased;
            received = tokio::time::timeout_at(deadline, consumer.recv()) => received,
            _ = lanes_idle.cancelled() => break,
        };
    }
    // A revocation that came since the last record (inside a receive that
    // returned nothing): what was received before it is the old assignment's.
    drop_revoked(&mut batch, &consumer.context().take_revoked());
    StageTimes::lap(&time.receive_us, &mut receiving);
    Some(batch)
}

/// Drops the records of `revoked` partitions: received before the
/// revocation, they were the old assignment's.
fn drop_revoked(batch: &mut Vec<OwnedMessage>, revoked: &HashSet<(String, i32)>) {
    if !revoked.is_empty() {
        batch.retain(|m| !revoked.contains(&(m.topic().to_owned(), m.partition())));
    }
}

/// Stores, per partition, the offset after the batch's last record.
fn store_offsets(consumer: &StreamConsumer<SubscriptionContext>, subscription: &str, batch: &[OwnedMessage]) {
    let mut last: HashMap<(&str, i32), i64> = HashMap::new();
    for msg in batch {
        let entry = last.entry((msg.topic(), msg.partition())).or_insert(msg.offset());
        *entry = (*entry).max(msg.offset());
    }
    for ((topic, partition), offset) in last {
        // rd_kafka_offset_store stores offset + 1, the next record to read.
        if let Err(e) = consumer.store_offset(topic, partition, offset) {
            // Only when the partition was lost without a rebalance callback
            // (e.g. max.poll.interval exceeded): its next owner redelivers
            // and the inbox absorbs what this batch applied.
            warn!(subscription, topic, partition, offset, error = %e, "offset not stored");
        }
    }
}

#[cfg(test)]
mod tests {
    use rdkafka::Timestamp;

    use super::*;

    fn records(sizes: &[usize]) -> Vec<OwnedMessage> {
        let mut out = Vec::new();
        for offset in 0..sizes.iter().copied().max().unwrap_or(0) {
            for (partition, size) in sizes.iter().enumerate() {
                if offset < *size {
                    out.push(OwnedMessage::new(None, None, "t".into(), Timestamp::NotAvailable, partition as i32, offset as i64, None));
                }
            }
        }
        out
    }

    #[test]
    fn lanes_are_balanced_and_keep_partitions_whole_and_in_order() {
        // Dealt out in turn, partitions 0 and 2 (7 records) and 1 and 3 (5) would make one lane the poll's tail.
        let lanes = split_lanes(records(&[6, 1, 1, 4]), 2, 4);
        let lengths: Vec<usize> = lanes.iter().map(|batches| batches.iter().map(Vec::len).sum()).collect();
        assert_eq!(lengths, vec![6, 6]);
        for lane in &lanes {
            assert!(lane.iter().all(|batch| batch.len() <= 4));
            let records: Vec<&OwnedMessage> = lane.iter().flatten().collect();
            for partition in 0..4 {
                let offsets: Vec<i64> = records.iter().filter(|m| m.partition() == partition).map(|m| m.offset()).collect();
                assert!(offsets.windows(2).all(|w| w[0] < w[1]), "partition {partition} in order: {offsets:?}");
            }
        }
        let holders = |partition: i32| lanes.iter().filter(|lane| lane.iter().flatten().any(|m| m.partition() == partition)).count();
        assert!((0..4).all(|p| holders(p) == 1), "each partition in one lane");
    }
}
