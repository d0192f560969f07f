//! Replay: retained history from the generation's own positions up to its
//! boundary, into that generation only. No consumer group: positions live in
//! the database, committed with the documents they produced.
//!
//! Shape: one reader thread receives records and decodes them (CloudEvents
//! and Avro — the CPU work) and hands batches to two lanes; each lane owns a
//! fixed set of partitions and applies its batches one transaction each
//! (inbox rows of the replay's scope, documents, that lane's positions), so
//! decoding and both lanes' database work overlap. A lane's partitions are
//! its alone, so positions never go backwards and no two lanes touch the same
//! job (a job's facts share a key, hence a partition).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use herald_envelope::{EventKey, decode_any};
use herald_projections::search::Fact;
use herald_store::Db;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::generations::{self, Position};
use crate::write::Writer;
use crate::{Projection, RebuildError};

/// Records applied per transaction unless told otherwise.
pub const DEFAULT_BATCH: usize = 5_000;
/// Lanes applying batches concurrently.
const LANES: usize = 2;

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

/// One replayed record: where it was and what it said.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub partition: i32,
    pub offset: i64,
    pub content: Content,
}

#[derive(Debug, Clone)]
pub enum Content {
    /// Could not be decoded: skipped (the live subscription dead-letters it).
    Undecodable,
    /// An event search does not apply (still moves the position).
    Ignored,
    /// A fact for the search projection.
    Fact { key: EventKey, event_type: String, fact: Box<Fact> },
}

/// Replays `topic` into `generation` until every partition reached its
/// boundary (or `shutdown`). Calls `on_progress` after every committed batch.
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
    let open: BTreeMap<i32, Position> = positions.into_iter().filter(|p| !p.done()).map(|p| (p.partition, p)).collect();
    if open.is_empty() {
        return Ok(progress);
    }
    let writer = Arc::new(Writer::open(db, P::NAME, generation, &dedup_scope::<P>(generation), topic).await?);
    let lane_of: BTreeMap<i32, usize> = open.keys().enumerate().map(|(i, p)| (*p, i % LANES)).collect();
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..LANES).map(|_| mpsc::channel::<Vec<Replayed>>(2)).unzip();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(u64, u64)>();
    let consumer = reader(brokers, topic, &open)?;
    let reading = {
        let shutdown = shutdown.clone();
        tokio::task::spawn_blocking(move || read_all(&consumer, open, &lane_of, senders, batch_size.max(1), &shutdown))
    };
    let lanes = futures::future::try_join_all(receivers.into_iter().map(|mut rx| {
        let (writer, done_tx) = (writer.clone(), done_tx.clone());
        async move {
            while let Some(batch) = rx.recv().await {
                let skipped = writer.apply(&batch).await?;
                if skipped > 0 {
                    warn!(skipped, generation, "undecodable records skipped by the replay");
                }
                let _ = done_tx.send((batch.len() as u64, skipped));
            }
            Ok::<(), RebuildError>(())
        }
    }));
    drop(done_tx);
    let report = async {
        while let Some((done, skipped)) = done_rx.recv().await {
            progress.done += done;
            progress.skipped_undecodable += skipped;
            on_progress(progress);
        }
    };
    let read = async { reading.await.map_err(|e| RebuildError::State(format!("replay reader: {e}")))? };
    let (_, (), ()) = tokio::try_join!(lanes, async { report.await; Ok::<(), RebuildError>(()) }, read)?;
    writer.close().await;
    Ok(progress)
}

fn reader(brokers: &str, topic: &str, open: &BTreeMap<i32, Position>) -> Result<BaseConsumer, RebuildError> {
    let consumer: BaseConsumer = ClientConfig::new()
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

/// The reader thread: receives and decodes batches until every partition
/// reached its boundary, the lanes stopped, or `shutdown`.
fn read_all(
    consumer: &BaseConsumer,
    mut open: BTreeMap<i32, Position>,
    lane_of: &BTreeMap<i32, usize>,
    lanes: Vec<mpsc::Sender<Vec<Replayed>>>,
    size: usize,
    shutdown: &CancellationToken,
) -> Result<(), RebuildError> {
    while !open.is_empty() && !shutdown.is_cancelled() {
        let mut batches: Vec<Vec<Replayed>> = vec![Vec::new(); lanes.len()];
        let mut read = 0;
        while read < size && !open.is_empty() {
            let wait = Duration::from_millis(if read == 0 { 200 } else { 10 });
            let Some(msg) = consumer.poll(wait) else {
                if read == 0 && !shutdown.is_cancelled() {
                    continue;
                }
                break;
            };
            if let Some(record) = take(&msg?, &mut open) {
                batches[lane_of[&record.partition]].push(record);
                read += 1;
            }
        }
        for (lane, batch) in lanes.iter().zip(batches) {
            if !batch.is_empty() && lane.blocking_send(batch).is_err() {
                // A lane failed; its error is what the replay reports.
                return Ok(());
            }
        }
    }
    Ok(())
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
    let content = match decode_any(msg) {
        Err(_) => Content::Undecodable,
        Ok(event) => match Fact::of(&event) {
            Err(_) => Content::Undecodable,
            Ok(None) => Content::Ignored,
            Ok(Some(fact)) => Content::Fact { key: event.key, event_type: event.event_type, fact: Box::new(fact) },
        },
    };
    Some(Replayed { partition: msg.partition(), offset: msg.offset(), content })
}
