//! The replay source of the projection engine: retained history from a
//! generation's own positions up to its boundary, into that generation only.
//! No consumer group: positions live in the database, committed with what
//! they produced.
//!
//! Shape: two lanes, each owning a fixed set of partitions with a reader
//! thread and consumer of its own that receives records and decodes them
//! (CloudEvents, Avro, the projection's fact — the CPU work) and hands
//! batches to the lane, which applies them one transaction each
//! ([`crate::replay_write`]); so both readers' decoding and both lanes'
//! database work overlap. A lane's partitions are its alone, so positions
//! never go backwards and no two lanes touch the same key.

use std::collections::BTreeMap;
use std::time::Duration;

use herald_envelope::{EventKey, Registry, decode_any_with};
use herald_kafka::KafkaConfig;
use herald_store::Db;
use herald_store::generations::{self, Position};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::ReplayError;
use crate::letters::Backoff;
use crate::projection::Projection;
use crate::replay_write::Writer;

/// Records applied per transaction unless told otherwise.
pub const DEFAULT_BATCH: usize = 5_000;
/// Lanes applying batches concurrently.
const LANES: usize = 2;
/// Tries of one batch whose transaction failed retryably (about 25 s of
/// backoff in all) before the replay stops.
const RETRIES: u32 = 9;

/// Where a replay stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
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
pub struct Replayed<F> {
    pub partition: i32,
    pub offset: i64,
    pub content: Content<F>,
}

pub enum Content<F> {
    /// Could not be decoded: skipped (the live subscription dead-letters it).
    Undecodable,
    /// An event the projection does not apply (still moves the position).
    Ignored,
    Fact {
        key: EventKey,
        event_type: String,
        fact: F,
    },
}

/// Replays `topic` into `generation` of `projection` until every partition
/// reached its boundary (or `shutdown`). Calls `on_progress` after every
/// committed batch.
#[allow(clippy::too_many_arguments)]
pub async fn replay<P: Projection>(
    db: &Db,
    projection: &P,
    kafka: &KafkaConfig,
    topic: &str,
    generation: i64,
    batch_size: usize,
    registry: &Registry,
    shutdown: &CancellationToken,
    mut on_progress: impl FnMut(ReplayProgress),
) -> Result<ReplayProgress, ReplayError> {
    let positions = generations::positions(db, P::NAME, generation).await?;
    let total = positions.iter().map(|p| u64::try_from(p.boundary_offset - p.next_offset).unwrap_or(0)).sum();
    let mut progress = ReplayProgress { total, ..Default::default() };
    let open: BTreeMap<i32, Position> = positions.into_iter().filter(|p| !p.done()).map(|p| (p.partition, p)).collect();
    if open.is_empty() {
        return Ok(progress);
    }
    projection.prepare_load(db, generation).await?;
    let writer = Writer::open(db, projection, generation, &dedup_scope::<P>(generation), topic).await?;
    // Each lane its own partitions, reader thread and consumer: receiving
    // and decoding, the replay's CPU work, run on as many cores as lanes.
    let mut shares: Vec<BTreeMap<i32, Position>> = (0..LANES).map(|_| BTreeMap::new()).collect();
    for (i, (partition, position)) in open.into_iter().enumerate() {
        shares[i % LANES].insert(partition, position);
    }
    shares.retain(|share| !share.is_empty());
    let (senders, receivers): (Vec<_>, Vec<_>) = shares.iter().map(|_| mpsc::channel::<Vec<Replayed<P::Fact>>>(2)).unzip();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(u64, u64)>();
    let mut readers = Vec::with_capacity(shares.len());
    for (share, sender) in shares.into_iter().zip(senders) {
        let consumer = reader(kafka, topic, &share)?;
        let (shutdown, registry) = (shutdown.clone(), registry.clone());
        readers
            .push(tokio::task::spawn_blocking(move || read_lane::<P>(&consumer, share, &sender, batch_size.max(1), &registry, &shutdown)));
    }
    let writer = &writer;
    let lanes = futures::future::try_join_all(receivers.into_iter().map(|mut rx| {
        let done_tx = done_tx.clone();
        async move {
            while let Some(batch) = rx.recv().await {
                let skipped = apply_until_settled(writer, &batch, generation, shutdown).await?;
                if skipped > 0 {
                    warn!(skipped, generation, projection = P::NAME, "undecodable records skipped by the replay");
                }
                let _ = done_tx.send((batch.len() as u64, skipped));
            }
            Ok::<(), ReplayError>(())
        }
    }));
    drop(done_tx);
    let report = async {
        while let Some((done, skipped)) = done_rx.recv().await {
            progress.done += done;
            progress.skipped_undecodable += skipped;
            on_progress(progress);
        }
        Ok::<(), ReplayError>(())
    };
    let read = async {
        for reading in readers {
            reading.await.map_err(|e| ReplayError::Internal(format!("replay reader: {e}")))??;
        }
        Ok::<(), ReplayError>(())
    };
    let outcome = tokio::try_join!(lanes, report, read);
    writer.close().await;
    outcome?;
    Ok(progress)
}

/// Applies one batch, trying again while the database says a retry may
/// succeed (a deadlock with the other lane over the projection's own rows, a
/// serialization failure, a dropped connection): the transaction rolled
/// back, so a retry applies the batch exactly once. After
/// [`RETRIES`] tries, or at shutdown, the error stops the replay; a rerun
/// resumes from the stored positions.
async fn apply_until_settled<P: Projection>(
    writer: &Writer<'_, P>,
    batch: &[Replayed<P::Fact>],
    generation: i64,
    shutdown: &CancellationToken,
) -> Result<u64, ReplayError> {
    let mut backoff = Backoff::new();
    let mut tries = 1;
    loop {
        match writer.apply(batch).await {
            Err(e) if e.is_retryable() && tries < RETRIES => {
                warn!(generation, projection = P::NAME, tries, error = %e, backoff = ?backoff.next(), "replay batch failed, retryable; trying again");
                if !backoff.wait(shutdown).await {
                    return Err(e);
                }
                tries += 1;
            }
            outcome => return outcome,
        }
    }
}

fn reader(kafka: &KafkaConfig, topic: &str, open: &BTreeMap<i32, Position>) -> Result<BaseConsumer, ReplayError> {
    let consumer: BaseConsumer = kafka.reader().create()?;
    let mut tpl = TopicPartitionList::new();
    for p in open.values() {
        tpl.add_partition_offset(topic, p.partition, Offset::Offset(p.next_offset))?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

/// A lane's reader thread: receives and decodes batches of its partitions
/// until each reached its boundary, the lane stopped, or `shutdown`.
fn read_lane<P: Projection>(
    consumer: &BaseConsumer,
    mut open: BTreeMap<i32, Position>,
    lane: &mpsc::Sender<Vec<Replayed<P::Fact>>>,
    size: usize,
    registry: &Registry,
    shutdown: &CancellationToken,
) -> Result<(), ReplayError> {
    while !open.is_empty() && !shutdown.is_cancelled() {
        let mut batch = Vec::new();
        while batch.len() < size && !open.is_empty() {
            let wait = Duration::from_millis(if batch.is_empty() { 200 } else { 10 });
            let Some(msg) = consumer.poll(wait) else {
                if batch.is_empty() && !shutdown.is_cancelled() {
                    continue;
                }
                break;
            };
            if let Some(record) = take::<P>(&msg?, &mut open, registry) {
                batch.push(record);
            }
        }
        if !batch.is_empty() && lane.blocking_send(batch).is_err() {
            // The lane failed; its error is what the replay reports.
            return Ok(());
        }
    }
    Ok(())
}

fn take<P: Projection>(msg: &BorrowedMessage<'_>, open: &mut BTreeMap<i32, Position>, registry: &Registry) -> Option<Replayed<P::Fact>> {
    let position = open.get_mut(&msg.partition())?;
    if msg.offset() >= position.boundary_offset {
        open.remove(&msg.partition());
        return None;
    }
    position.next_offset = msg.offset() + 1;
    if position.done() {
        open.remove(&msg.partition());
    }
    let content = match decode_any_with(msg, registry) {
        Err(_) => Content::Undecodable,
        Ok(event) if !P::handles(&event.event_type) => Content::Ignored,
        Ok(event) => match P::fact(&event) {
            Err(_) => Content::Undecodable,
            Ok(fact) => Content::Fact { key: event.key, event_type: event.event_type, fact },
        },
    };
    Some(Replayed { partition: msg.partition(), offset: msg.offset(), content })
}
