//! Replay: retained history from the generation's own positions up to its
//! boundary, into that generation only. No consumer group: positions live in
//! the database, committed with the documents they produced.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use herald_envelope::{DecodedEvent, decode_any};
use herald_projections::search::{self, Fact};
use herald_store::inbox::{self, Delivery, Entry};
use herald_store::{Db, StoreError};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::generations::{self, Position};
use crate::{Projection, RebuildError};

/// Records applied per transaction unless told otherwise.
pub const DEFAULT_BATCH: usize = 2_000;

/// Where a replay stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Records read so far (this run), including skipped ones.
    pub done: u64,
    /// Records between the stored positions and the boundary when this run began.
    pub total: u64,
    pub skipped_undecodable: u64,
}

/// Inbox scope of generation `generation`'s replay: its own dedup scope.
pub fn dedup_scope<P: Projection>(generation: i64) -> String {
    format!("{}@g{generation}", P::NAME)
}

/// Replays `topic` into `generation` until every partition reached its
/// boundary (or `shutdown`). Calls `on_progress` after every batch.
pub async fn replay<P: Projection>(
    db: &Db,
    brokers: &str,
    topic: &str,
    generation: i64,
    batch_size: usize,
    shutdown: &CancellationToken,
    mut on_progress: impl FnMut(ReplayProgress),
) -> Result<ReplayProgress, RebuildError> {
    let positions = generations::positions(db, P::NAME, generation).await?;
    let mut progress = ReplayProgress { total: positions.iter().map(|p| (p.boundary_offset - p.next_offset).max(0) as u64).sum(), ..Default::default() };
    let mut open: BTreeMap<i32, Position> = positions.into_iter().filter(|p| !p.done()).map(|p| (p.partition, p)).collect();
    if open.is_empty() {
        return Ok(progress);
    }
    let consumer = reader(brokers, topic, &open)?;
    let scope = dedup_scope::<P>(generation);
    while !open.is_empty() && !shutdown.is_cancelled() {
        let batch = read_batch(&consumer, &mut open, batch_size.max(1)).await?;
        progress.done += batch.len() as u64;
        progress.skipped_undecodable += apply(db, P::NAME, generation, &scope, topic, &batch).await?;
        on_progress(progress);
        tokio::task::yield_now().await;
    }
    Ok(progress)
}

fn reader(brokers: &str, topic: &str, open: &BTreeMap<i32, Position>) -> Result<StreamConsumer, RebuildError> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        // Required by librdkafka, never used: this consumer assigns partitions
        // itself and never commits.
        .set("group.id", format!("herald.rebuild.{topic}"))
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in open.values() {
        tpl.add_partition_offset(topic, p.partition, Offset::Offset(p.next_offset))?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// One replayed record: where it was and what it said (None: undecodable).
pub struct Replayed {
    partition: i32,
    offset: i64,
    event: Option<DecodedEvent>,
}

/// Reads up to `size` records below their partitions' boundaries; closes
/// partitions that reached theirs.
async fn read_batch(consumer: &StreamConsumer, open: &mut BTreeMap<i32, Position>, size: usize) -> Result<Vec<Replayed>, RebuildError> {
    let mut batch = Vec::new();
    while batch.len() < size && !open.is_empty() {
        let wait = Duration::from_millis(if batch.is_empty() { 500 } else { 20 });
        let Ok(msg) = tokio::time::timeout(wait, consumer.recv()).await else {
            if batch.is_empty() {
                continue;
            }
            break;
        };
        let msg = msg?;
        if let Some(record) = take(&msg, open) {
            batch.push(record);
        }
    }
    Ok(batch)
}

fn take(msg: &BorrowedMessage<'_>, open: &mut BTreeMap<i32, Position>) -> Option<Replayed> {
    let position = open.get_mut(&msg.partition())?;
    if msg.offset() >= position.boundary_offset {
        open.remove(&msg.partition());
        return None;
    }
    position.next_offset = msg.offset() + 1;
    if position.done() {
        open.remove(&msg.partition());
    }
    Some(Replayed { partition: msg.partition(), offset: msg.offset(), event: decode_any(msg).ok() })
}

/// One transaction: inbox rows of the replay's scope, documents of the
/// first-seen events into `generation` only, and the new positions.
/// Returns how many records could not be decoded (skipped; the live
/// subscription dead-letters those).
async fn apply(db: &Db, projection: &str, generation: i64, scope: &str, topic: &str, batch: &[Replayed]) -> Result<u64, StoreError> {
    let skipped = batch.iter().filter(|r| r.event.is_none()).count() as u64;
    if skipped > 0 {
        warn!(skipped, generation, "undecodable records skipped by the replay");
    }
    let relevant: Vec<(&Replayed, &DecodedEvent, Fact)> = batch
        .iter()
        .filter_map(|r| r.event.as_ref().map(|e| (r, e)))
        .filter_map(|(r, e)| Fact::of(e).ok().flatten().map(|f| (r, e, f)))
        .collect();
    let mut tx = db.begin().await?;
    let entries: Vec<Entry<'_>> = relevant
        .iter()
        .map(|(r, e, _)| Entry { key: &e.key, event_type: &e.event_type, delivery: Delivery { topic, partition: r.partition, offset: r.offset } })
        .collect();
    let first: HashSet<_> = inbox::claim_batch(&mut tx, scope, &entries).await?;
    let facts = search::newest_per_job(relevant.into_iter().filter(|(_, e, _)| first.contains(&e.key)).map(|(_, _, f)| f));
    search::write(&mut tx, generation, &facts).await?;
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for r in batch {
        let n = next.entry(r.partition).or_insert(0);
        *n = (*n).max(r.offset + 1);
    }
    for (partition, next_offset) in next {
        generations::advance(&mut tx, projection, generation, partition, next_offset).await?;
    }
    tx.commit().await?;
    Ok(skipped)
}
